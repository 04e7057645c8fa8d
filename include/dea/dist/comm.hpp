// dea/dist/comm.hpp: what data-parallel training needs of a transport, and the single-process transport.
//
// A Comm joins `size()` processes (ranks 0 .. size()-1); every call below is collective: each rank calls it, in
// the same order, with the same sizes. The transport moves bytes only; every sum is done by the caller in an
// order it fixes (dist/tree_sum.hpp), never by the transport. MpiComm (dist/mpi_comm.hpp, the one header that
// needs MPI) is the transport across processes and machines; SingleProcessComm is the one-rank case, with which
// the same code runs without MPI.
//
// Failures: agree() is the "did anyone fail" exchange. Each rank gives its status (0 = fine, else an exit status)
// and a message; every rank receives the status and message of the lowest failing rank. A training step ends with
// it, so that a NaN loss or a bad input on one rank stops every rank with that rank's message; an uncaught error
// on one rank calls abort(), which ends every rank.
#pragma once

#include "../core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dea::dist {

/// True when this process was started by mpirun / mpiexec (Open MPI, MPICH or a PMIx launcher).
inline bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

/// The number of processes the launcher started (0 when not started by one, or when it does not say).
inline int launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

/// What agree() returns: ok when no rank failed, else the lowest failing rank, its status and its message.
struct Agreement {
  bool ok = true;
  int rank = -1;
  int status = 0;
  std::string message;
};

class Comm {
public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The transport's name ("single process", "MPI (Open MPI 4.1.4)").
  virtual std::string name() const = 0;

  /// recv[r * bytes .. (r+1) * bytes) = rank r's `send` (recv holds size() * bytes).
  virtual void allgather_bytes(const void* send, std::size_t bytes, void* recv) = 0;
  /// `bytes` bytes of rank `root`'s `buf` into every rank's `buf`.
  virtual void broadcast_bytes(void* buf, std::size_t bytes, int root) = 0;
  /// Every rank sends block j of `send` to rank j: recv[r * bytes .. (r+1) * bytes) = rank r's
  /// send[rank() * bytes .. (rank()+1) * bytes) (send and recv hold size() * bytes each). The default builds it
  /// from allgather_bytes (size() times the bytes moved); a transport overrides it with its own.
  virtual void alltoall_bytes(const void* send, std::size_t bytes, void* recv) {
    const std::size_t r = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
    std::vector<unsigned char> all(r * r * bytes);
    allgather_bytes(send, r * bytes, all.data());
    for (std::size_t from = 0; from < r; ++from)
      if (bytes) std::memcpy(static_cast<unsigned char*>(recv) + from * bytes, &all[(from * r + me) * bytes], bytes);
  }
  /// True when the collective calls may come from any one thread at a time (not only the thread that built the
  /// Comm): the gradient exchange then runs on a communication thread beside the backward pass. False: every call
  /// from the building thread (the exchange then waits for the end of the backward pass).
  virtual bool any_thread() const { return true; }
  /// Ends every rank of the job with exit status `status` (after this rank's message is printed by the caller).
  [[noreturn]] virtual void abort(int status) = 0;

  void allgather(const float* send, std::size_t n, float* recv) { allgather_bytes(send, n * sizeof(float), recv); }
  void allgather(const double* send, std::size_t n, double* recv) { allgather_bytes(send, n * sizeof(double), recv); }
  void allgather(const std::uint64_t* send, std::size_t n, std::uint64_t* recv) {
    allgather_bytes(send, n * sizeof(std::uint64_t), recv);
  }

  /// The "did anyone fail" exchange (see the file comment): two allgathers of 16 bytes when every rank is fine,
  /// a broadcast of the message when one is not.
  Agreement agree(int status, const std::string& message = {}) {
    const std::int64_t mine[2] = {status, status ? static_cast<std::int64_t>(message.size()) : 0};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
    allgather_bytes(mine, sizeof mine, all.data());
    Agreement a;
    for (int r = 0; r < size(); ++r)
      if (all[2 * static_cast<std::size_t>(r)] != 0) {
        a.ok = false;
        a.rank = r;
        a.status = static_cast<int>(all[2 * static_cast<std::size_t>(r)]);
        a.message.resize(static_cast<std::size_t>(all[2 * static_cast<std::size_t>(r) + 1]));
        if (r == rank()) a.message = message;
        if (!a.message.empty()) broadcast_bytes(&a.message[0], a.message.size(), r);
        break;
      }
    return a;
  }

  /// Every rank's `value` must equal rank 0's; otherwise a dea::Error on every rank naming `what` and the first
  /// rank that differs.
  void check_same(std::uint64_t value, const std::string& what) {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size()));
    allgather(&value, 1, all.data());
    for (int r = 1; r < size(); ++r)
      check(all[static_cast<std::size_t>(r)] == all[0], what, ": rank ", r, " differs from rank 0 (hash ",
            all[static_cast<std::size_t>(r)], " against ", all[0], ")");
  }
};

/// One rank: allgather, alltoall and broadcast copy, abort exits.
class SingleProcessComm final : public Comm {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  void allgather_bytes(const void* send, std::size_t bytes, void* recv) override {
    if (bytes && send != recv) std::memmove(recv, send, bytes);
  }
  void broadcast_bytes(void*, std::size_t, int root) override {
    check(root == 0, "SingleProcessComm::broadcast_bytes: root ", root, " outside [0, 1)");
  }
  void alltoall_bytes(const void* send, std::size_t bytes, void* recv) override {
    if (bytes && send != recv) std::memmove(recv, send, bytes);
  }
  [[noreturn]] void abort(int status) override { std::exit(status); }
};

/// Raised on every rank when agree() reports that a rank failed: what() is that rank's message, status() the exit
/// status it asked for.
class RankFailed : public Error {
public:
  RankFailed(const Agreement& a)  // NOLINT
      : Error(a.message), status_(a.status), rank_(a.rank) {}
  int status() const { return status_; }
  int rank() const { return rank_; }

private:
  int status_, rank_;
};

/// "rank r of R: " and the error text `what` (its "dea: " dropped): the message a failing rank gives agree().
inline std::string rank_message(const Comm& comm, const std::string& what) {
  return "rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + ": " +
         without_error_prefix(what);
}

/// agree() and, when a rank failed, RankFailed on every rank.
inline void agree_or_throw(Comm& comm, int status, const std::string& message = {}) {
  const Agreement a = comm.agree(status, message);
  if (!a.ok) throw RankFailed(a);
}

}  // namespace dea::dist
