// dea/dist/pieces.hpp: work cut into fixed pieces shared by the ranks, and the pieces' results gathered in piece
// order, so that what is added up from them is added in an order that does not depend on the rank count.
//
//   std::vector<std::string> r = dist::gather_pieces(comm, n, [&](std::size_t k) { return bytes of piece k; });
//   // every rank: r[k] = piece k's bytes, k = 0 .. n-1, whichever rank computed it
//
// The pieces are numbered 0 .. n-1 by the caller independently of the rank count (an evaluation's batches); rank r of
// R computes the contiguous pieces [r n / R, (r+1) n / R). Each piece's result is a byte string (PieceWriter,
// PieceReader pack numbers exactly), the strings are allgathered (Comm::allgather_bytes: the transport moves bytes, it
// never adds), and the caller folds them in piece order on every rank: the same operations in the same order as one
// process folding its own pieces, so the same bits for any R. A piece that throws on one rank stops every rank with
// its message (dist::together), before any rank waits in the gather.
#pragma once

#include "../core/error.hpp"
#include "comm.hpp"
#include "reducer.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <utility>
#include <string>
#include <vector>

namespace dea::dist {

/// The pieces [first, last) of 0 .. n-1 that rank `rank` of `ranks` computes.
struct PieceRange {
  std::size_t first = 0, last = 0;
};
inline PieceRange piece_range(std::size_t n, int rank, int ranks) {
  check(ranks > 0 && rank >= 0 && rank < ranks, "piece_range: rank ", rank, " outside [0, ", ranks, ")");
  const auto at = [&](std::size_t r) {
    // r n / R without overflow for any n
    const std::size_t R = static_cast<std::size_t>(ranks);
    return n / R * r + n % R * r / R;
  };
  return {at(static_cast<std::size_t>(rank)), at(static_cast<std::size_t>(rank) + 1)};
}

/// Every rank's byte string, in rank order, on every rank: the sizes are allgathered first, then the strings padded
/// to the longest.
inline std::vector<std::string> allgather_strings(Comm& comm, const std::string& mine) {
  const std::size_t R = static_cast<std::size_t>(comm.size());
  const std::uint64_t n = mine.size();
  std::vector<std::uint64_t> sizes(R);
  comm.allgather(&n, 1, sizes.data());
  std::uint64_t longest = 0;
  for (std::uint64_t s : sizes) longest = std::max(longest, s);
  std::vector<std::string> out(R);
  if (longest == 0) return out;
  std::string padded(static_cast<std::size_t>(longest), '\0');
  std::memcpy(&padded[0], mine.data(), mine.size());
  std::string all(static_cast<std::size_t>(longest) * R, '\0');
  comm.allgather_bytes(padded.data(), static_cast<std::size_t>(longest), &all[0]);
  for (std::size_t r = 0; r < R; ++r)
    out[r] = all.substr(r * static_cast<std::size_t>(longest), static_cast<std::size_t>(sizes[r]));
  return out;
}

/// Appends numbers and arrays to a piece's byte string (native byte order: the ranks of a job share one).
class PieceWriter {
public:
  PieceWriter& u64(std::uint64_t v) { return raw(&v, sizeof v); }
  PieceWriter& f64(double v) { return raw(&v, sizeof v); }
  PieceWriter& f64s(const std::vector<double>& v) {
    u64(v.size());
    return raw(v.data(), v.size() * sizeof(double));
  }
  /// A byte string as it is (the reader takes it back with its length, known to the caller).
  PieceWriter& append(const std::string& b) { return raw(b.data(), b.size()); }
  const std::string& bytes() const { return s_; }
  std::string take() { return std::move(s_); }

private:
  PieceWriter& raw(const void* p, std::size_t n) {
    if (n) s_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string s_;
};

/// Reads back what PieceWriter wrote, in the same order; reading past the end is a dea::Error.
class PieceReader {
public:
  explicit PieceReader(const std::string& s) : s_(s) {}
  std::uint64_t u64() {
    std::uint64_t v = 0;
    raw(&v, sizeof v);
    return v;
  }
  double f64() {
    double v = 0;
    raw(&v, sizeof v);
    return v;
  }
  std::vector<double> f64s() {
    const std::uint64_t n = u64();
    check(n <= (s_.size() - at_) / sizeof(double), "PieceReader: an array of ", n, " numbers runs past the piece");
    std::vector<double> v(static_cast<std::size_t>(n));
    raw(v.data(), v.size() * sizeof(double));
    return v;
  }
  bool done() const { return at_ == s_.size(); }

private:
  void raw(void* p, std::size_t n) {
    check(n <= s_.size() - at_, "PieceReader: reading ", n, " bytes at ", at_, " of a piece of ", s_.size());
    if (n) std::memcpy(p, s_.data() + at_, n);
    at_ += n;
  }
  const std::string& s_;
  std::size_t at_ = 0;
};

/// Pieces 0 .. n-1 shared by the ranks of `comm` (see the file comment): piece(k) gives piece k's bytes on the rank
/// that owns it. Returns the n results in piece order on every rank. When piece() throws on a rank, every rank throws
/// RankFailed with its message (one rank: the exception itself).
template <class Piece>
std::vector<std::string> gather_pieces(Comm& comm, std::size_t n, Piece&& piece) {
  const PieceRange mine = piece_range(n, comm.rank(), comm.size());
  std::vector<std::string> own;
  own.reserve(mine.last - mine.first);
  together(comm, [&] {
    for (std::size_t k = mine.first; k < mine.last; ++k) own.push_back(piece(k));
  });
  if (comm.size() == 1) return own;
  // one string per rank: its pieces, each prefixed by its length
  PieceWriter w;
  for (const std::string& s : own) {
    w.u64(s.size());
    w.append(s);
  }
  const std::vector<std::string> all = allgather_strings(comm, w.bytes());
  std::vector<std::string> out;
  out.reserve(n);
  for (int r = 0; r < comm.size(); ++r) {
    const PieceRange pr = piece_range(n, r, comm.size());
    const std::string& s = all[static_cast<std::size_t>(r)];
    std::size_t at = 0;
    for (std::size_t k = pr.first; k < pr.last; ++k) {
      std::uint64_t len = 0;
      check(s.size() - at >= sizeof len, "gather_pieces: rank ", r, " sent too few pieces");
      std::memcpy(&len, s.data() + at, sizeof len);
      at += sizeof len;
      check(len <= s.size() - at, "gather_pieces: rank ", r, "'s piece ", k, " runs past its bytes");
      out.push_back(s.substr(at, static_cast<std::size_t>(len)));
      at += static_cast<std::size_t>(len);
    }
    check(at == s.size(), "gather_pieces: rank ", r, " sent more than its pieces");
  }
  return out;
}

}  // namespace dea::dist
