// tests/thread_comm.hpp: R ranks as R threads of one process, for the tests of what ranks do together (the
// gradient exchange, the evaluation pieces): dist::Comm's byte collectives, each meeting at a barrier where every
// rank posts its buffer and then copies what it needs from the others'.
#pragma once

#include <dea/dist/comm.hpp>

#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dea_tests {

/// The meeting point of R thread ranks: one posted buffer per rank and a reusable barrier.
class ThreadGroup {
public:
  explicit ThreadGroup(int n) : slot_(static_cast<std::size_t>(n)), n_(n) {}
  int size() const { return n_; }
  void barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }
  std::vector<const void*> slot_;

private:
  int n_, count_ = 0;
  std::uint64_t gen_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

/// Rank `rank` of a ThreadGroup as a dist::Comm.
class ThreadComm final : public dea::dist::Comm {
public:
  ThreadComm(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size(); }
  std::string name() const override { return "threads"; }
  void allgather_bytes(const void* send, std::size_t bytes, void* recv) override {
    post(send);
    for (int q = 0; q < size(); ++q) std::memcpy(at(recv, q * bytes), peer(q), bytes);
    g_.barrier();
  }
  void alltoall_bytes(const void* send, std::size_t bytes, void* recv) override {
    post(send);
    for (int q = 0; q < size(); ++q)
      std::memcpy(at(recv, q * bytes), static_cast<const char*>(peer(q)) + static_cast<std::size_t>(rank_) * bytes,
                  bytes);
    g_.barrier();
  }
  void broadcast_bytes(void* buf, std::size_t bytes, int root) override {
    post(buf);
    if (rank_ != root) std::memcpy(buf, peer(root), bytes);
    g_.barrier();
  }
  [[noreturn]] void abort(int) override { std::abort(); }

private:
  void post(const void* p) {
    g_.slot_[static_cast<std::size_t>(rank_)] = p;
    g_.barrier();
  }
  const void* peer(int q) const { return g_.slot_[static_cast<std::size_t>(q)]; }
  static void* at(void* p, std::size_t off) { return static_cast<char*>(p) + off; }
  ThreadGroup& g_;
  int rank_;
};

/// f(comm) on R threads, one rank each; returns when every rank has returned.
inline void run_on_thread_ranks(int ranks, const std::function<void(dea::dist::Comm&)>& f) {
  ThreadGroup g(ranks);
  std::vector<std::thread> t;
  for (int r = 0; r < ranks; ++r)
    t.emplace_back([&g, &f, r] {
      ThreadComm comm(g, r);
      f(comm);
    });
  for (auto& th : t) th.join();
}

}  // namespace dea_tests
