// dea/dist/mpi_comm.hpp: the MPI transport of data-parallel training (dist/comm.hpp's Comm on MPI_COMM_WORLD).
//
// The one header of the library that needs MPI (<mpi.h>; Open MPI from Debian: openmpi-bin, libopenmpi-dev). Nothing
// else includes it: the library stays Eigen-only, and a program that uses it is built with MPI (CMake's dea_mpi
// target: find_package(MPI), DEA_WITH_MPI). The transport only moves bytes (MPI_Allgather, MPI_Alltoall and
// MPI_Bcast of MPI_BYTE); every sum is the caller's, in its fixed order, never MPI_Allreduce's, whose order is MPI's
// choice.
//
//   if (dist::launched_by_mpirun()) comm = std::make_unique<dist::MpiComm>();   // MPI_Init .. MPI_Finalize
//
// MPI is initialised with MPI_THREAD_SERIALIZED: the calls come from one thread at a time, outside parallel regions,
// either the thread that built the MpiComm or the gradient exchange's communication thread (dist/reducer.hpp), never
// both at once. When the library gives less (`provided` below SERIALIZED), any_thread() is false and the exchange
// runs on the building thread after the backward pass. Under Open MPI a rank waiting in MPI yields its core
// (OMPI_MCA_mpi_yield_when_idle=1 unless set): the exchange thread then waits beside the backward pass without
// taking a core from it. A rank that dies ends the job through mpirun (its other ranks are killed); abort() is
// MPI_Abort.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "../core/error.hpp"
#include "comm.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <string>

namespace dea::dist {

class MpiComm final : public Comm {
public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      // Open MPI: a rank waiting in MPI (the exchange thread waiting for a slower rank) yields its core to the
      // computing threads instead of spinning on it (unless the user chose otherwise)
      setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided_) == MPI_SUCCESS,
            "MPI_Init_thread failed");
      owner_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiComm() override {
    if (owner_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, static_cast<std::size_t>(std::max(0, len)));
    const std::size_t cut = s.find_first_of(",\n");
    return "MPI (" + s.substr(0, cut) + ")";
  }

  void allgather_bytes(const void* send, std::size_t bytes, void* recv) override {
    if (bytes == 0) return;
    if (bytes * static_cast<std::size_t>(size_) <= kMaxCount) {
      call(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                         MPI_COMM_WORLD), "MPI_Allgather");
      return;
    }
    // beyond MPI's int counts: every rank's part broadcast from it, in pieces
    char* out = static_cast<char*>(recv);
    for (int r = 0; r < size_; ++r) {
      char* slot = out + static_cast<std::size_t>(r) * bytes;
      if (r == rank_ && slot != send) std::copy(static_cast<const char*>(send), static_cast<const char*>(send) + bytes, slot);
      broadcast_bytes(slot, bytes, r);
    }
  }

  void broadcast_bytes(void* buf, std::size_t bytes, int root) override {
    char* p = static_cast<char*>(buf);
    for (std::size_t off = 0; off < bytes; off += kMaxCount) {
      const std::size_t n = std::min(kMaxCount, bytes - off);
      call(MPI_Bcast(p + off, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  void alltoall_bytes(const void* send, std::size_t bytes, void* recv) override {
    if (bytes == 0) return;
    check(bytes <= kMaxCount, "MpiComm::alltoall_bytes: ", bytes, " bytes per rank, more than ", kMaxCount);
    call(MPI_Alltoall(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                      MPI_COMM_WORLD), "MPI_Alltoall");
  }

  /// MPI_THREAD_SERIALIZED or more was given (see the file comment).
  bool any_thread() const override { return provided_ >= MPI_THREAD_SERIALIZED; }

  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::exit(status);
  }

private:
  static constexpr std::size_t kMaxCount = std::size_t(1) << 30;
  static void call(int rc, const char* what) { check(rc == MPI_SUCCESS, what, " failed (MPI error ", rc, ")"); }
  int rank_ = 0, size_ = 1, provided_ = MPI_THREAD_SINGLE;
  bool owner_ = false;
};

}  // namespace dea::dist
