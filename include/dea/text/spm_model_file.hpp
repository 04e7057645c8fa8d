// dea/text/spm_model_file.hpp: what the fast SentencePiece pipeline needs from a model file (spm.model) beyond what
// the sentencepiece library's public API gives: the model type and the normaliser's settings, among them the
// precompiled character map, and a lookup in that map.
//
// Why this reads protobuf itself: Debian's libsentencepiece-dev installs only sentencepiece_processor.h, whose
// SentencePieceProcessor gives the pieces, their scores and types and encodes text, but not the NormalizerSpec (the
// generated protobuf classes are not installed). The fast path must apply the character map in its own way (per
// grapheme cluster, shortest match; text/spm_fast.hpp), so it needs the map's bytes: read_spm_model_info() walks the
// protobuf wire format of the ModelProto just far enough to find them. The library still loads and validates the
// model (text/spm_tokenizer.hpp); this reader only has to be safe on any bytes, and refuses what it cannot read.
//
// The fields read (field numbers of sentencepiece_model.proto):
//   ModelProto      2 trainer_spec (message), 3 normalizer_spec (message); 1 pieces counted
//   TrainerSpec     3 model_type (1 unigram, 2 BPE, 3 word, 4 char; default unigram)
//   NormalizerSpec  1 name, 2 precompiled_charsmap (bytes), 3 add_dummy_prefix (default true),
//                   4 remove_extra_whitespaces (default true), 5 escape_whitespaces (default true)
//
// The precompiled character map: a little-endian u32 N, then N bytes holding N/4 little-endian u32 units of a
// double-array trie (the Darts-clone layout) over UTF-8 byte strings, then a blob of NUL-terminated UTF-8
// replacements; the value a key leads to is the byte offset of its replacement in the blob. An empty map means no
// mapping (the identity rule). Each unit packs: has_leaf = bit 8, value = the low 31 bits, label = unit & 0x800000FF,
// offset = (unit >> 10) << (8 if bit 9 is set, else 0). A prefix search of bytes x0 x1 ... starts at
// p = offset(unit[0]) and for each byte c (stopping at a 0 byte) sets p ^= c, u = unit[p], stops unless label(u) = c,
// sets p ^= offset(u); when has_leaf(u), the prefix ending in c is a key whose value is value(unit[p]). Prefixes come
// out shortest first.
// Standard library only.
#pragma once

#include "../core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dea::text::spm {

/// The fields of a model file that the fast pipeline needs (see the file comment).
struct SpmModelInfo {
  std::size_t num_pieces = 0;     ///< entries of ModelProto.pieces
  int model_type = 1;             ///< 1 unigram, 2 BPE, 3 word, 4 char
  std::string normalizer_name;    ///< "nmt_nfkc", "identity", ... (informative)
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

namespace detail {

/// A reader of protobuf's wire format over a byte range; every read is bounds-checked and a malformed message is a
/// dea::Error naming `what`.
class WireReader {
public:
  WireReader(std::string_view bytes, const std::string& what) : s_(bytes), what_(what) {}
  bool done() const { return pos_ >= s_.size(); }

  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      check(pos_ < s_.size(), what_, ": truncated protobuf (a varint runs past the end)");
      const auto b = static_cast<unsigned char>(s_[pos_++]);
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    ::dea::detail::raise(::dea::detail::concat(what_, ": corrupt protobuf (a varint longer than 10 bytes)"));
  }
  std::string_view bytes() {
    const std::uint64_t n = varint();
    check(n <= s_.size() - pos_, what_, ": truncated protobuf (a field of ", n, " bytes with ", s_.size() - pos_,
          " left)");
    const std::string_view out = s_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return out;
  }
  /// Skips a field of wire type `type`.
  void skip(unsigned type) {
    switch (type) {
      case 0: (void)varint(); return;
      case 1: advance(8); return;
      case 2: (void)bytes(); return;
      case 5: advance(4); return;
      default:
        ::dea::detail::raise(::dea::detail::concat(what_, ": corrupt protobuf (wire type ", type, ")"));
    }
  }

private:
  void advance(std::size_t n) {
    check(n <= s_.size() - pos_, what_, ": truncated protobuf (a fixed-size field runs past the end)");
    pos_ += n;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
  const std::string& what_;
};

}  // namespace detail

/// Reads the fields of SpmModelInfo from the serialised ModelProto `bytes`; dea::Error naming `what` when the bytes
/// are not a readable protobuf message.
inline SpmModelInfo read_spm_model_info(std::string_view bytes, const std::string& what) {
  SpmModelInfo info;
  detail::WireReader r(bytes, what);
  while (!r.done()) {
    const std::uint64_t tag = r.varint();
    const unsigned type = static_cast<unsigned>(tag & 7);
    const std::uint64_t field = tag >> 3;
    check(field != 0, what, ": corrupt protobuf (field number 0)");
    if (type != 2 || (field != 1 && field != 2 && field != 3)) {
      r.skip(type);
      continue;
    }
    const std::string_view sub = r.bytes();
    if (field == 1) {  // SentencePiece: 1 piece (string), 2 score, 3 type
      detail::WireReader pr(sub, what);
      while (!pr.done()) {
        const std::uint64_t ptag = pr.varint();
        if ((ptag >> 3) != 1 || (ptag & 7) != 2) {
          pr.skip(static_cast<unsigned>(ptag & 7));
          continue;
        }
        // the library builds a trie of the pieces that throws (and so terminates the program) on an empty piece or
        // one holding a NUL byte
        const std::string_view piece = pr.bytes();
        check(!piece.empty() && piece.find('\0') == std::string_view::npos, what, ": piece ", info.num_pieces,
              piece.empty() ? " is empty" : " holds a NUL byte");
      }
      ++info.num_pieces;
    } else if (field == 2) {  // TrainerSpec
      detail::WireReader t(sub, what);
      while (!t.done()) {
        const std::uint64_t ttag = t.varint();
        if ((ttag >> 3) == 3 && (ttag & 7) == 0) info.model_type = static_cast<int>(t.varint());
        else t.skip(static_cast<unsigned>(ttag & 7));
      }
    } else {  // NormalizerSpec
      detail::WireReader n(sub, what);
      while (!n.done()) {
        const std::uint64_t ntag = n.varint();
        const std::uint64_t nf = ntag >> 3;
        const unsigned nt = static_cast<unsigned>(ntag & 7);
        if (nf == 1 && nt == 2) info.normalizer_name = std::string(n.bytes());
        else if (nf == 2 && nt == 2) info.precompiled_charsmap = std::string(n.bytes());
        else if (nf == 3 && nt == 0) info.add_dummy_prefix = n.varint() != 0;
        else if (nf == 4 && nt == 0) info.remove_extra_whitespaces = n.varint() != 0;
        else if (nf == 5 && nt == 0) info.escape_whitespaces = n.varint() != 0;
        else n.skip(nt);
      }
    }
  }
  return info;
}

/// The precompiled character map of a model (see the file comment): prefix search and replacements.
class Charsmap {
public:
  /// The identity map (no mapping).
  Charsmap() = default;
  /// Parses `bytes` (the map as stored in the model; empty = identity); dea::Error naming `what` when the header or
  /// the trie's size is inconsistent. Lookups stay bounds-checked, so any bytes past this check are safe to search.
  Charsmap(std::string_view bytes, const std::string& what) {
    if (bytes.empty()) return;
    check(bytes.size() >= 4, what, ": precompiled_charsmap of ", bytes.size(), " bytes (at least 4 expected)");
    const std::uint32_t n = load32(bytes.data());
    check(n % 4 == 0 && n >= 4 && n <= bytes.size() - 4, what, ": precompiled_charsmap's trie size ", n,
          " does not fit its ", bytes.size(), " bytes (a multiple of 4, at least 4, at most ", bytes.size() - 4, ")");
    units_.resize(n / 4);
    for (std::size_t i = 0; i < units_.size(); ++i) units_[i] = load32(bytes.data() + 4 + 4 * i);
    blob_ = std::string(bytes.substr(4 + n));
    validate(what);
  }

  bool empty() const { return units_.empty(); }

  /// The shortest key that is a prefix of `s`: (its length in bytes, its replacement), or nothing.
  std::optional<std::pair<std::size_t, std::string_view>> shortest(std::string_view s) const {
    std::optional<std::pair<std::size_t, std::string_view>> out;
    search(s, [&](std::size_t len, std::uint32_t value) {
      out = std::make_pair(len, replacement(value));
      return false;
    });
    return out;
  }
  /// The longest key that is a prefix of `s`: (its length in bytes, its replacement), or nothing.
  std::optional<std::pair<std::size_t, std::string_view>> longest(std::string_view s) const {
    std::optional<std::pair<std::size_t, std::string_view>> out;
    search(s, [&](std::size_t len, std::uint32_t value) {
      out = std::make_pair(len, replacement(value));
      return true;
    });
    return out;
  }

private:
  static std::uint32_t load32(const char* p) {
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
    return v;
  }
  static bool has_leaf(std::uint32_t u) { return (u >> 8) & 1U; }
  static std::uint32_t value(std::uint32_t u) { return u & 0x7FFFFFFFU; }
  static std::uint32_t label(std::uint32_t u) { return u & 0x800000FFU; }
  static std::uint32_t offset(std::uint32_t u) { return (u >> 10) << ((u & (1U << 9)) >> 6); }

  /// Checks that every search stays inside the trie and every value inside the blob: the sentencepiece library
  /// searches the same map without bounds checks, so a map that passes here is safe for it too. A search at node p
  /// reads unit p ^ c for the next byte c (any of 0..255) before it compares labels, so p | 0xFF must be a unit for
  /// every node reachable from the root; a leaf's value unit must exist, and its offset must start a NUL-terminated
  /// string of the blob. Each node is visited once (a corrupt trie may have cycles).
  void validate(const std::string& what) const {
    const std::size_t n = units_.size();
    check(blob_.empty() || blob_.back() == '\0', what,
          ": precompiled_charsmap's replacements do not end in a NUL byte");
    std::vector<std::size_t> todo{offset(units_[0])};
    std::vector<bool> seen(n, false);
    while (!todo.empty()) {
      const std::size_t p = todo.back();
      todo.pop_back();
      check((p | 0xFFU) < n, what, ": precompiled_charsmap's trie reaches unit ", p | 0xFFU, " of ", n);
      if (seen[p]) continue;
      seen[p] = true;
      for (std::size_t c = 1; c < 256; ++c) {
        const std::uint32_t u = units_[p ^ c];
        if (label(u) != c) continue;
        const std::size_t next = (p ^ c) ^ offset(u);
        check(next < n, what, ": precompiled_charsmap's trie reaches unit ", next, " of ", n);
        if (has_leaf(u))
          check(value(units_[next]) < blob_.size(), what, ": precompiled_charsmap's trie has a value ",
                value(units_[next]), " outside its ", blob_.size(), " bytes of replacements");
        todo.push_back(next);
      }
    }
  }

  /// Calls f(prefix length, value) for every key that is a prefix of `s`, shortest first, while f returns true.
  template <class F>
  void search(std::string_view s, F&& f) const {
    if (units_.empty()) return;
    std::size_t p = offset(units_[0]);
    for (std::size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == 0) return;
      p ^= c;
      if (p >= units_.size()) return;
      const std::uint32_t u = units_[p];
      if (label(u) != c) return;
      p ^= offset(u);
      if (p >= units_.size()) return;
      if (has_leaf(u) && !f(i + 1, value(units_[p]))) return;
    }
  }
  /// The NUL-terminated replacement at byte `at` of the blob (empty when `at` is outside it).
  std::string_view replacement(std::uint32_t at) const {
    if (at >= blob_.size()) return {};
    const std::size_t end = blob_.find('\0', at);
    return std::string_view(blob_).substr(at, (end == std::string::npos ? blob_.size() : end) - at);
  }

  std::vector<std::uint32_t> units_;
  std::string blob_;
};

}  // namespace dea::text::spm
