// Tests of dea/dist (the MPI-free core of data-parallel training): gradients flattened in parameter order, the
// fixed-order tree sum (any number of ranks dividing M gives the bits of one rank; the tree differs from a naive
// running sum, so the comparison can fail), the accumulator in either leaf order, the single-process Comm, and the
// gradient reducer on R ranks run as threads of this process (an in-process Comm): both exchanges, buckets of any
// size (smaller than R elements, cut inside parameters), the exchange during backward, a NaN on one rank, a rank
// that fails before its last micro-batch; and the trainer's step on R such ranks (the same bits as one process; a
// NaN gradient on one rank stops every rank with the same message).
#include <catch2/catch.hpp>

#include "thread_comm.hpp"
#include <dea/core/rng.hpp>
#include <dea/dist/comm.hpp>
#include <dea/dist/grad_buffer.hpp>
#include <dea/dist/reducer.hpp>
#include <dea/dist/tree_sum.hpp>
#include <dea/optim/adamw.hpp>
#include <dea/train/trainer.hpp>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dist {

using namespace dea;

namespace {

/// M leaves of n floats with a wide spread of magnitudes (so that the order of the additions shows in the bits).
std::vector<std::vector<float>> random_leaves(std::size_t m, std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> leaves(m, std::vector<float>(n));
  for (auto& l : leaves)
    for (float& x : l) x = static_cast<float>(rng.normal() * std::exp(4.0 * rng.normal()));
  return leaves;
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& v, std::size_t a, std::size_t b) {
  std::vector<const float*> p;
  for (std::size_t i = a; i < b; ++i) p.push_back(v[i].data());
  return p;
}

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// What rank r of R computes: its subtree over [r M/R, (r+1) M/R), leaves pushed last to first.
std::vector<float> subtree(const std::vector<std::vector<float>>& leaves, int ranks, int r, bool descending) {
  const std::size_t n = leaves[0].size();
  const dist::LeafRange lr = dist::leaf_range(static_cast<std::int64_t>(leaves.size()), ranks, r);
  dist::TreeAccumulator<float> acc(n);
  for (std::int64_t i = 0; i < lr.size(); ++i) {
    const std::int64_t k = descending ? lr.last - 1 - i : lr.first + i;
    std::copy(leaves[static_cast<std::size_t>(k)].begin(), leaves[static_cast<std::size_t>(k)].end(), acc.leaf());
    acc.push(k);
  }
  return std::vector<float>(acc.result(), acc.result() + n);
}

}  // namespace

TEST_CASE("dist: any rank count dividing M gives the bits of one rank", "[dist]") {
  const std::size_t n = 1000;
  for (std::size_t m : {1, 2, 4, 8, 16}) {
    const auto leaves = random_leaves(m, n, 100 + m);
    std::vector<float> one(n);
    dist::tree_sum(pointers(leaves, 0, m), n, one.data());
    for (int ranks = 1; ranks <= static_cast<int>(m); ranks *= 2)
      for (bool descending : {false, true}) {
        std::vector<std::vector<float>> sums;
        for (int r = 0; r < ranks; ++r) sums.push_back(subtree(leaves, ranks, r, descending));
        std::vector<float> root(n);
        dist::tree_sum(pointers(sums, 0, sums.size()), n, root.data());
        INFO("M " << m << " R " << ranks << (descending ? " descending" : " ascending"));
        CHECK(same_bits(root.data(), one.data(), n));
      }
  }
}

TEST_CASE("dist: the tree is not the running sum (the bitwise comparison can fail)", "[dist]") {
  const std::size_t m = 8, n = 1000;
  const auto leaves = random_leaves(m, n, 7);
  std::vector<float> tree(n), naive(leaves[0]);
  dist::tree_sum(pointers(leaves, 0, m), n, tree.data());
  for (std::size_t k = 1; k < m; ++k)
    for (std::size_t i = 0; i < n; ++i) naive[i] += leaves[k][i];
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += tree[i] != naive[i];
  CHECK(differ > 10);
  // and the two agree to round-off
  for (std::size_t i = 0; i < n; ++i) {
    double mag = 0;
    for (std::size_t k = 0; k < m; ++k) mag += std::abs(static_cast<double>(leaves[k][i]));
    CHECK(std::abs(static_cast<double>(tree[i]) - naive[i]) <= 1e-5 * mag);
  }
  // addition commutes: swapping two siblings changes nothing ...
  const std::vector<float> right = subtree(leaves, 2, 1, false), left = subtree(leaves, 2, 0, false);
  std::vector<float> root(n);
  dist::tree_sum(std::vector<const float*>{right.data(), left.data()}, n, root.data());
  CHECK(same_bits(root.data(), tree.data(), n));
  std::vector<float> regrouped(n);  // ... but regrouping does: ((0 + 1) + 2) + 3 against (0 + 1) + (2 + 3)
  for (std::size_t i = 0; i < n; ++i) regrouped[i] = ((leaves[0][i] + leaves[1][i]) + leaves[2][i]) + leaves[3][i];
  std::vector<float> four(n);
  dist::tree_sum(pointers(leaves, 0, 4), n, four.data());
  CHECK_FALSE(same_bits(regrouped.data(), four.data(), n));
}

TEST_CASE("dist: the accumulator refuses leaves that are not one aligned run", "[dist]") {
  dist::TreeAccumulator<float> acc(4);
  acc.leaf()[0] = 1;
  acc.push(1);
  acc.leaf()[0] = 2;
  acc.push(2);
  CHECK_THROWS_WITH(acc.result(), Catch::Contains("not one aligned power-of-two range"));
  acc.leaf();
  CHECK_THROWS_WITH(acc.push(5), Catch::Contains("does not extend the run [1, 3)"));
  acc.clear();
  for (int k = 0; k < 4; ++k) {
    std::fill(acc.leaf(), acc.leaf() + 4, static_cast<float>(k + 1));
    acc.push(k);
  }
  CHECK(acc.result()[3] == 10.0f);
  CHECK_THROWS_WITH(dist::leaf_range(6, 2, 0), Catch::Contains("power of two"));
  CHECK_THROWS_WITH(dist::leaf_range(4, 8, 0), Catch::Contains("8 ranks do not divide 4"));
  CHECK(dist::leaf_range(8, 4, 3).first == 6);
  CHECK(dist::leaf_range(8, 4, 3).last == 8);
  CHECK_THROWS_WITH(dist::tree_sum(std::vector<const float*>(3, nullptr), 1, static_cast<float*>(nullptr)),
                    Catch::Contains("power of two"));
}

TEST_CASE("dist: gradients flatten in parameter order and back", "[dist]") {
  Param<float> a("a", "main", {2, 3}), b("b", "gate", {4}), c("c", "main", {0});
  ParamList<float> ps = {&a, &c, &b};
  for (Index i = 0; i < 6; ++i) a.grad[i] = static_cast<float>(i) + 0.1f;
  for (Index i = 0; i < 4; ++i) b.grad[i] = -static_cast<float>(i) - 0.3f;
  REQUIRE(dist::grad_size(ps) == 10);
  std::vector<float> buf(10), half(10);
  dist::flatten_grads(ps, buf.data());
  CHECK(buf[0] == a.grad[0]);
  CHECK(buf[5] == a.grad[5]);
  CHECK(buf[6] == b.grad[0]);
  CHECK(buf[9] == b.grad[3]);
  dist::flatten_grads(ps, half.data(), 0.25f);
  for (std::size_t i = 0; i < 10; ++i) CHECK(half[i] * 4.0f == buf[i]);  // a power of two scales exactly
  a.zero_grad();
  b.zero_grad();
  dist::unflatten_grads(ps, buf.data());
  CHECK(a.grad[4] == 4.1f);
  CHECK(b.grad[2] == -2.3f);
  const std::uint64_t h = dist::parameter_hash(ps);
  CHECK(dist::parameter_hash(ps) == h);
  b.value[3] = 1e-30f;
  CHECK(dist::parameter_hash(ps) != h);
}

TEST_CASE("dist: the single-process Comm", "[dist]") {
  dist::SingleProcessComm comm;
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  const double x[2] = {1.5, -2};
  double y[2] = {0, 0};
  comm.allgather(x, 2, y);
  CHECK(y[1] == -2);
  CHECK(comm.agree(0).ok);
  const dist::Agreement bad = comm.agree(2, "--text 'x': cannot open");
  CHECK_FALSE(bad.ok);
  CHECK(bad.rank == 0);
  CHECK(bad.status == 2);
  CHECK(bad.message == "--text 'x': cannot open");
  CHECK_THROWS_WITH(dist::agree_or_throw(comm, 1, "non-finite loss"), "non-finite loss");
  CHECK_NOTHROW(comm.check_same(42, "the initial parameters"));
}

namespace {

/// f(comm) on R threads, one rank each.
void on_ranks(int ranks, const std::function<void(dist::Comm&)>& f) { dea_tests::run_on_thread_ranks(ranks, f); }

/// A model's parameters (sizes chosen so that buckets cut them anywhere; one is empty).
struct Params {
  std::vector<std::unique_ptr<Param<float>>> own;
  ParamList<float> list;
  Params() {
    for (Index n : {7, 1, 0, 13, 5, 30, 2})
      own.push_back(std::make_unique<Param<float>>("p" + std::to_string(own.size()), "main", Shape{n}));
    for (auto& p : own) list.push_back(p.get());
  }
};

/// Micro-batch k's gradient of parameter i (wide magnitudes, so that the order of the additions shows).
float grad_value(std::int64_t k, std::size_t i, Index j) {
  Rng rng(1000 + static_cast<std::uint64_t>(k) * 97 + i * 13 + static_cast<std::uint64_t>(j));
  return static_cast<float>(rng.normal() * std::exp(4.0 * rng.normal()));
}

/// One rank's step: its micro-batches last to first; the last one written parameter by parameter from the end,
/// reporting final gradients as a backward pass does (when `hooks`). Returns the flat gradient of finish().
struct RankRun {
  std::vector<float> grad;
  dist::ExchangeStats stats;
};
RankRun run_rank(dist::Comm& comm, std::int64_t M, dist::ExchangeOptions opt, bool hooks,
                 const std::function<void(Params&, std::int64_t k)>& tweak = nullptr) {
  Params ps;
  dist::GradientReducer<float> red(ps.list, comm, M, opt);
  red.begin();
  for (const std::int64_t k : red.local_order()) {
    for (Param<float>* p : ps.list) p->zero_grad();
    if (hooks) red.start(k, 0.125f);
    for (std::size_t i = ps.list.size(); i-- > 0;) {
      for (Index j = 0; j < ps.list[i]->grad.size(); ++j) ps.list[i]->grad[j] = grad_value(k, i, j);
      if (tweak) tweak(ps, k);
      if (hooks) red.grads_final(i);
    }
    red.add(k, 0.125f);
  }
  red.complete();
  red.finish();
  RankRun out;
  out.grad.resize(red.size());
  dist::flatten_grads(ps.list, out.grad.data());
  out.stats = red.stats();
  return out;
}

}  // namespace

TEST_CASE("dist: the bucketed exchange gives the bits of one process for any ranks and bucket size", "[dist]") {
  const std::int64_t M = 8;
  dist::SingleProcessComm one;
  const std::vector<float> expected = run_rank(one, M, {}, false).grad;
  REQUIRE(expected.size() == 58);
  // one process against the plain running sum: the tree's bits differ, so the comparisons below can fail
  bool differs = false;
  for (std::size_t e = 0, i = 0; i < 7; ++i) {
    const Index n = Params().list[i]->grad.size();
    for (Index j = 0; j < n; ++j, ++e) {
      float run = 0;
      for (std::int64_t k = 0; k < M; ++k) run += 0.125f * grad_value(k, i, j);
      differs = differs || run != expected[e];
    }
  }
  CHECK(differs);
  for (int ranks : {1, 2, 4, 8})
    for (double mb : {1e-6, 8e-6, 20e-6, 92e-6, 4.0})  // buckets of 1, 2, 5 and 23 floats, and one of 58
      for (bool hooks : {false, true})
        for (bool overlap : {false, true})
          for (auto ex : {dist::Exchange::reduce_scatter, dist::Exchange::allgather}) {
            if (ex == dist::Exchange::allgather && (mb != 4.0 || hooks || !overlap)) continue;
            dist::ExchangeOptions opt;
            opt.exchange = ex;
            opt.bucket_mb = mb;
            opt.overlap = overlap;
            std::vector<RankRun> got(static_cast<std::size_t>(ranks));
            on_ranks(ranks,
                     [&](dist::Comm& c) { got[static_cast<std::size_t>(c.rank())] = run_rank(c, M, opt, hooks); });
            INFO("ranks " << ranks << ", bucket_mb " << mb << ", hooks " << hooks << ", overlap " << overlap << ", "
                          << dist::exchange_name(ex));
            for (const RankRun& g : got) CHECK(same_bits(g.grad.data(), expected.data(), expected.size()));
            // bytes: 2 ceil(L/R) floats per bucket of L floats for reduce_scatter, (R-1) 58 for allgather
            const std::size_t per = std::max<std::size_t>(1, static_cast<std::size_t>(mb * 1e6 / 4));
            std::uint64_t bytes = 0;
            const std::size_t R = static_cast<std::size_t>(ranks);
            if (ranks > 1) {
              if (ex == dist::Exchange::allgather) {
                bytes = (R - 1) * 58 * 4;
              } else {
                for (std::size_t hi = 58; hi > 0; hi -= std::min(hi, per)) {
                  const std::size_t len = std::min(hi, per);
                  bytes += 2 * (R - 1) * ((len + R - 1) / R) * 4;
                }
              }
            }
            CHECK(got[0].stats.bytes_sent == bytes);
            CHECK(got[0].stats.bytes_received == bytes);
            CHECK(got[0].stats.overlapped == (ranks > 1 && overlap && ex == dist::Exchange::reduce_scatter));
          }
}

TEST_CASE("dist: the buckets run from the end of the gradient to its start", "[dist]") {
  Params ps;
  dist::SingleProcessComm one;
  dist::ExchangeOptions opt;
  opt.bucket_mb = 20e-6;  // 5 floats
  dist::GradientReducer<float> red(ps.list, one, 1, opt);
  const auto& b = red.buckets();
  REQUIRE(b.size() == 12);
  CHECK(b.front() == std::make_pair(std::size_t(53), std::size_t(58)));
  CHECK(b[1] == std::make_pair(std::size_t(48), std::size_t(53)));
  CHECK(b.back() == std::make_pair(std::size_t(0), std::size_t(3)));
  CHECK_THROWS_AS(dist::parse_exchange("ring"), Error);
  CHECK(dist::parse_exchange("allgather") == dist::Exchange::allgather);
}

TEST_CASE("dist: a NaN in one rank's bucket reaches every rank with the same bits", "[dist]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int ranks : {2, 4}) {
    std::vector<RankRun> got(static_cast<std::size_t>(ranks));
    dist::ExchangeOptions opt;
    opt.bucket_mb = 8e-6;
    on_ranks(ranks, [&](dist::Comm& c) {
      got[static_cast<std::size_t>(c.rank())] = run_rank(c, 8, opt, true, [&](Params& ps, std::int64_t k) {
        if (c.rank() == 1 && k == 8 / ranks) ps.list[5]->grad[3] = nan;  // rank 1's last micro-batch
      });
    });
    for (const RankRun& g : got) {
      CHECK(std::isnan(g.grad[26 + 3]));
      CHECK(same_bits(g.grad.data(), got[0].grad.data(), g.grad.size()));
      double sq = 0;
      for (float x : g.grad) sq += static_cast<double>(x) * x;
      CHECK_FALSE(std::isfinite(sq));  // the gradient norm on every rank: non-finite
    }
  }
}

TEST_CASE("dist: a rank that fails before its last micro-batch still takes part in every bucket", "[dist]") {
  Params probe;
  for (int ranks : {2, 4}) {
    std::vector<int> finished(static_cast<std::size_t>(ranks), 0);
    std::vector<int> failed_seen(static_cast<std::size_t>(ranks), 0);
    on_ranks(ranks, [&](dist::Comm& c) {
      Params ps;
      dist::ExchangeOptions opt;
      opt.bucket_mb = 8e-6;
      dist::GradientReducer<float> red(ps.list, c, 8, opt);
      red.begin();
      int status = 0;
      for (const std::int64_t k : red.local_order()) {
        if (c.rank() == ranks - 1 && k == red.local().first) {  // this rank's last micro-batch fails mid-backward
          red.start(k, 0.125f);
          red.grads_final(5);
          status = 1;
          break;
        }
        red.start(k, 0.125f);
        red.add(k, 0.125f);
      }
      red.complete();
      const dist::Agreement a = c.agree(status, status ? "rank failed" : "");
      failed_seen[static_cast<std::size_t>(c.rank())] = !a.ok && a.rank == ranks - 1 && a.message == "rank failed";
      finished[static_cast<std::size_t>(c.rank())] = 1;
    });
    for (int r = 0; r < ranks; ++r) {
      CHECK(finished[static_cast<std::size_t>(r)] == 1);
      CHECK(failed_seen[static_cast<std::size_t>(r)] == 1);
    }
  }
  (void)probe;
}

TEST_CASE("dist: a push split into element ranges adds what push adds", "[dist]") {
  const std::size_t n = 300;
  const auto leaves = random_leaves(8, n, 77);
  for (int ranks : {1, 2, 4}) {
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> whole = subtree(leaves, ranks, r, true);
      const dist::LeafRange lr = dist::leaf_range(8, ranks, r);
      dist::TreeAccumulator<float> acc(n);
      for (std::int64_t k = lr.last - 1; k >= lr.first; --k) {
        float* leaf = acc.leaf();
        acc.begin_push(k);
        // the leaf's elements arrive from the end, in uneven ranges, each range added as soon as it is written
        for (std::size_t hi = n; hi > 0;) {
          const std::size_t lo = hi > 37 ? hi - 37 : 0;
          std::copy(leaves[static_cast<std::size_t>(k)].begin() + static_cast<std::ptrdiff_t>(lo),
                    leaves[static_cast<std::size_t>(k)].begin() + static_cast<std::ptrdiff_t>(hi), leaf + lo);
          acc.push_range(lo, hi);
          hi = lo;
        }
        acc.end_push();
      }
      CHECK(same_bits(acc.result(), whole.data(), n));
    }
  }
}

namespace {

/// A family whose micro-batch k's gradient is a fixed function of k, the step and the parameters' values, written
/// parameter by parameter from the last one and reported final as a model's backward does; `poison` = (step, k) gets
/// a NaN gradient element with a finite loss.
class ToyFamily {
public:
  using Scalar = float;
  using Batch = std::int64_t;  // the micro-batch index

  std::int64_t poison_step = -1, poison_micro = -1;
  Params ps;
  std::function<void(std::size_t)> hook;
  int reports = 0;

  ToyFamily() {
    for (Param<float>* p : ps.list)
      for (Index j = 0; j < p->value.size(); ++j) p->value[j] = 0.1f * static_cast<float>(j % 5) - 0.2f;
  }
  ParamList<float> parameters() { return ps.list; }
  void set_grads_final(std::function<void(std::size_t)> f) { hook = std::move(f); }
  train::Losses forward_backward(const std::int64_t& k, std::int64_t step, Rng&) {
    for (std::size_t i = ps.list.size(); i-- > 0;) {
      Param<float>& p = *ps.list[i];
      for (Index j = 0; j < p.grad.size(); ++j)
        p.grad[j] += grad_value(k + 8 * step, i, j) * (1.0f + p.value[j]);
      if (step == poison_step && k == poison_micro && i == 3) p.grad[2] = std::numeric_limits<float>::quiet_NaN();
      if (hook) {
        hook(i);
        ++reports;
      }
    }
    train::Losses l;
    l.task = 0.5 + 0.01 * static_cast<double>(k);
    l.count = 1;
    return l;
  }
  std::string describe(const train::Losses& l) const { return fmt::format("loss {}", l.task); }
  std::string describe(const optim::GradNorms& n) const { return fmt::format(" (main {})", n.norm.at("main")); }
};

struct TrainerRun {
  std::vector<float> values;
  std::string error;
  int reports = 0;
  bool hook_left = false;
};

/// Three steps of M micro-batches on this rank of `comm`.
TrainerRun train_steps(dist::Comm& comm, std::int64_t M, dist::ExchangeOptions opt, std::int64_t poison_step = -1,
                       std::int64_t poison_micro = -1) {
  ToyFamily f;
  f.poison_step = poison_step;
  f.poison_micro = poison_micro;
  optim::AdamW<float> adam = optim::make_adam(f.parameters(), 0.01);
  TrainerRun out;
  {
    train::Trainer<ToyFamily> t(f, adam, 5);
    t.set_micro_batches(comm, M, opt);
    try {
      for (std::int64_t s = 1; s <= 3; ++s)
        t.step_micro(
            s, [](std::int64_t) { return Index(1); }, [](std::int64_t k) { return k; });
    } catch (const std::exception& e) {
      out.error = e.what();
    }
  }
  out.hook_left = static_cast<bool>(f.hook);  // the trainer took its report back
  for (Param<float>* p : f.ps.list)
    for (Index j = 0; j < p->value.size(); ++j) out.values.push_back(p->value[j]);
  out.reports = f.reports;
  return out;
}

}  // namespace

TEST_CASE("dist: the trainer's step on R ranks gives the bits of one process; a NaN on one rank stops all", "[dist]") {
  dist::SingleProcessComm one;
  const TrainerRun expected = train_steps(one, 4, {});
  REQUIRE(expected.error.empty());
  CHECK(expected.reports == 0);  // one rank: no report asked for
  for (int ranks : {1, 2, 4})
    for (double mb : {8e-6, 4.0})
      for (auto ex : {dist::Exchange::reduce_scatter, dist::Exchange::allgather}) {
        dist::ExchangeOptions opt;
        opt.exchange = ex;
        opt.bucket_mb = mb;
        std::vector<TrainerRun> got(static_cast<std::size_t>(ranks));
        on_ranks(ranks, [&](dist::Comm& c) { got[static_cast<std::size_t>(c.rank())] = train_steps(c, 4, opt); });
        INFO("ranks " << ranks << ", bucket_mb " << mb << ", " << dist::exchange_name(ex));
        for (const TrainerRun& g : got) {
          CHECK(g.error.empty());
          CHECK_FALSE(g.hook_left);
          CHECK(same_bits(g.values.data(), expected.values.data(), expected.values.size()));
          // the family reports final gradients only when the exchange can use them
          CHECK((g.reports > 0) == (ranks > 1 && ex == dist::Exchange::reduce_scatter));
        }
      }
  // a NaN in the gradient of micro-batch 2 at step 2 (rank 1 of 2, rank 2 of 4): every rank stops with one message
  for (int ranks : {2, 4}) {
    std::vector<TrainerRun> got(static_cast<std::size_t>(ranks));
    dist::ExchangeOptions opt;
    opt.bucket_mb = 8e-6;
    on_ranks(ranks, [&](dist::Comm& c) { got[static_cast<std::size_t>(c.rank())] = train_steps(c, 4, opt, 2, 2); });
    for (const TrainerRun& g : got) {
      CHECK_THAT(g.error, Catch::Contains("non-finite gradient norm at step 2"));
      CHECK(g.error == got[0].error);
      CHECK(same_bits(g.values.data(), got[0].values.data(), g.values.size()));  // step 1's parameters, kept
    }
  }
}

}  // namespace test_dist
