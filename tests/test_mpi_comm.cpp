// The MPI transport of data-parallel training (dist/mpi_comm.hpp), run by ctest under `mpiexec -np 4`: allgather,
// alltoall and broadcast move every rank's bytes, the library gives the thread level the exchange thread needs,
// agree() gives every rank the lowest failing rank's status and message, check_same() names the rank that differs,
// together() turns one rank's exception into the same error on every rank, and GradientReducer over the ranks
// gives the bits of the tree one process computes over the same micro-batches, with either exchange, buckets of
// several sizes and the exchange on its thread during a (simulated) backward.
// Rank 0 prints "mpi comm: all checks passed"; any failed check exits non-zero (mpiexec then fails).
#include <dea/core/rng.hpp>
#include <dea/dist/mpi_comm.hpp>
#include <dea/dist/reducer.hpp>

#include <fmt/core.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

using namespace dea;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what, int rank) {
  if (ok) return;
  ++failures;
  fmt::print(stderr, "rank {}: FAILED: {}\n", rank, what);
}

/// Micro-batch k's gradients: values drawn from Rng(k) over a wide range of magnitudes.
void fill_grads(ParamList<float>& ps, std::int64_t k) {
  Rng rng(1000 + static_cast<std::uint64_t>(k));
  for (Param<float>* p : ps)
    for (Index i = 0; i < p->grad.size(); ++i) p->grad[i] = static_cast<float>(rng.normal() * std::exp(3 * rng.normal()));
}

}  // namespace

int main() {
  dist::MpiComm comm;
  const int r = comm.rank(), n = comm.size();
  expect(n >= 2, "run under mpiexec -np 2 or more (got " + std::to_string(n) + ")", r);

  // allgather: rank q's bytes land in slot q
  std::vector<double> mine = {static_cast<double>(r), -0.5 * r};
  std::vector<double> all(2 * static_cast<std::size_t>(n));
  comm.allgather(mine.data(), 2, all.data());
  for (int q = 0; q < n; ++q)
    expect(all[2 * static_cast<std::size_t>(q)] == q && all[2 * static_cast<std::size_t>(q) + 1] == -0.5 * q,
           "allgather slot " + std::to_string(q), r);

  // alltoall: block q of rank p's buffer lands in block p of rank q's
  std::vector<std::int32_t> out(3 * static_cast<std::size_t>(n)), in(3 * static_cast<std::size_t>(n), -1);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 3; ++i)
      out[3 * static_cast<std::size_t>(q) + static_cast<std::size_t>(i)] = 100 * r + 10 * q + i;
  comm.alltoall_bytes(out.data(), 3 * sizeof(std::int32_t), in.data());
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < 3; ++i)
      expect(in[3 * static_cast<std::size_t>(p) + static_cast<std::size_t>(i)] == 100 * p + 10 * r + i,
             "alltoall block " + std::to_string(p), r);
  expect(comm.any_thread(), "MPI gives MPI_THREAD_SERIALIZED (the exchange thread)", r);

  // broadcast from the last rank
  std::string msg = r == n - 1 ? std::string("from the last rank") : std::string(18, '?');
  comm.broadcast_bytes(&msg[0], msg.size(), n - 1);
  expect(msg == "from the last rank", "broadcast: got '" + msg + "'", r);

  // agree: nobody fails; the last rank fails; ranks 1 and n-1 fail (the lowest is reported)
  expect(comm.agree(0).ok, "agree with every rank fine", r);
  dist::Agreement a = comm.agree(r == n - 1 ? 3 : 0, r == n - 1 ? "non-finite loss on the last rank" : "");
  expect(!a.ok && a.rank == n - 1 && a.status == 3 && a.message == "non-finite loss on the last rank",
         "agree with the last rank failing: rank " + std::to_string(a.rank) + " '" + a.message + "'", r);
  a = comm.agree(r == 1 || r == n - 1 ? 2 : 0, "missing file on rank " + std::to_string(r));
  expect(!a.ok && a.rank == 1 && a.status == 2 && a.message == "missing file on rank 1",
         "agree with two ranks failing: rank " + std::to_string(a.rank) + " '" + a.message + "'", r);

  // check_same names the rank that differs
  bool threw = false;
  try {
    comm.check_same(r == n - 1 ? 7 : 5, "the initial parameters");
  } catch (const Error& e) {
    threw = std::string(e.what()).find("rank " + std::to_string(n - 1) + " differs") != std::string::npos;
  }
  expect(threw, "check_same names the rank that differs", r);

  // together: rank 1's exception is every rank's RankFailed
  std::string seen;
  try {
    dist::together(comm, [&] {
      if (r == 1) throw std::runtime_error("--text 'corpus.txt': cannot open file");
    });
  } catch (const dist::RankFailed& e) {
    seen = e.what();
  }
  expect(seen == "rank 1 of " + std::to_string(n) + ": --text 'corpus.txt': cannot open file",
         "together: got '" + seen + "'", r);

  // the reducer over the ranks: the bits of one process's tree over the same micro-batches
  struct Variant {
    dist::Exchange ex;
    double mb;
    bool hooks;
  };
  const Variant variants[] = {{dist::Exchange::allgather, 4, false},
                              {dist::Exchange::reduce_scatter, 4, false},
                              {dist::Exchange::reduce_scatter, 4e-6, true},   // one float a bucket
                              {dist::Exchange::reduce_scatter, 24e-6, true},  // 6 floats: cut inside w
                              {dist::Exchange::reduce_scatter, 24e-6, false}};
  for (const Variant& v : variants) {
    for (std::int64_t M : {static_cast<std::int64_t>(n), static_cast<std::int64_t>(4 * n)}) {
      Param<float> w("w", "main", {7, 5}), b("b", "main", {3});
      ParamList<float> ps = {&w, &b};
      dist::ExchangeOptions opt;
      opt.exchange = v.ex;
      opt.bucket_mb = v.mb;
      dist::GradientReducer<float> red(ps, comm, M, opt);
      red.begin();
      for (std::int64_t k : red.local_order()) {
        if (v.hooks) red.start(k, 1.0f / static_cast<float>(M));
        fill_grads(ps, k);
        if (v.hooks) {  // b final first, then w (as a backward pass reports them)
          red.grads_final(1);
          red.grads_final(0);
        }
        red.add(k, 1.0f / static_cast<float>(M));
      }
      red.complete();
      expect(red.stats().overlapped == (v.ex == dist::Exchange::reduce_scatter), "the exchange thread ran", r);
      red.finish();
      std::vector<float> got(dist::grad_size(ps));
      dist::flatten_grads(ps, got.data());
      // one process: every leaf, the whole tree
      std::vector<std::vector<float>> leaves(static_cast<std::size_t>(M), std::vector<float>(got.size()));
      std::vector<const float*> ptr;
      for (std::int64_t k = 0; k < M; ++k) {
        fill_grads(ps, k);
        dist::flatten_grads(ps, leaves[static_cast<std::size_t>(k)].data(), 1.0f / static_cast<float>(M));
        ptr.push_back(leaves[static_cast<std::size_t>(k)].data());
      }
      std::vector<float> want(got.size());
      dist::tree_sum(ptr, want.size(), want.data());
      expect(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
             "reducer over " + std::to_string(n) + " ranks, M " + std::to_string(M) + ", " + dist::exchange_name(v.ex) +
                 " bucket_mb " + std::to_string(v.mb) + ": bits differ from one process", r);
    }
  }

  const dist::Agreement end = comm.agree(failures ? 1 : 0, "checks failed");
  if (r == 0) fmt::print("{}: {} ranks, mpi comm: {}\n", comm.name(), n, end.ok ? "all checks passed" : "FAILED");
  return end.ok ? 0 : 1;
}
