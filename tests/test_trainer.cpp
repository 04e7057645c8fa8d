// Tests of the training loop (dea/train/trainer.hpp) with a family of its own, a linear least-squares model: the
// cadence of log lines, evaluations and checkpoints (fresh, resumed, idle), the learning-rate hook, micro-batches
// weighted by their rows (even, uneven, one empty), the non-finite stops and their messages, and the loss fault.
#include <catch2/catch.hpp>
#include <dea/core/rng.hpp>
#include <dea/dist/comm.hpp>
#include <dea/train/trainer.hpp>

#include <fmt/core.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace test_trainer {

using namespace dea;
using Catch::Contains;

/// Rows of (x, y).
struct Rows {
  Mat<double> x;
  Vec<double> y;
};

/// y ~ x w with loss mean_r 0.5 (x_r w - y_r)^2; `poison_grad` makes the gradient NaN (a finite loss).
class LinearFamily {
public:
  using Scalar = double;
  using Batch = Rows;

  Param<double> w{"w", "main", Shape{3}};
  bool poison_grad = false;

  ParamList<double> parameters() { return {&w}; }
  train::Losses forward_backward(const Rows& b, std::int64_t, Rng&) {
    const double n = static_cast<double>(b.x.rows());
    const Vec<double> r = b.x * w.value - b.y;
    w.grad += b.x.transpose() * r / n;
    if (poison_grad) w.grad[1] = std::numeric_limits<double>::quiet_NaN();
    train::Losses l;
    l.task = 0.5 * r.squaredNorm() / n;
    l.extra = 2 * l.task;
    l.count = b.x.rows();
    return l;
  }
  std::string describe(const train::Losses& l) const { return fmt::format("loss {}", l.task); }
  std::string describe(const optim::GradNorms&) const { return std::string(); }
};

using Trainer = train::Trainer<LinearFamily>;

/// 8 rows of data, the same for every step.
Rows data() {
  Rng rng(11);
  Rows d{Mat<double>(8, 3), Vec<double>(8)};
  for (Index i = 0; i < 8; ++i) {
    for (Index j = 0; j < 3; ++j) d.x(i, j) = rng.normal();
    d.y[i] = 0.5 * d.x(i, 0) - d.x(i, 2) + 0.1 * rng.normal();
  }
  return d;
}

Rows rows_of(const Rows& d, Index first, Index n) { return Rows{d.x.middleRows(first, n), d.y.segment(first, n)}; }

optim::AdamW<double> optimizer(LinearFamily& f) { return optim::make_adam(f.parameters(), 0.05); }

std::string temp_dir(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("dea_test_trainer_" + name)).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<std::int64_t> logged_steps(const std::string& dir) {
  std::vector<std::int64_t> steps;
  std::ifstream in(train::log_path(dir));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    CHECK(j.contains("extra"));
    CHECK(j.contains("steps_per_s"));
    steps.push_back(j.at("step").get<std::int64_t>());
  }
  return steps;
}

/// A run of steps first+1 .. steps (log_every 3, eval_every 4), what its hooks saw.
struct Seen {
  std::vector<std::int64_t> stepped;
  std::vector<std::string> events;  // "eval N", "ckpt N" in call order
  std::int64_t done = 0;
  std::vector<std::int64_t> logged;
};

Seen run(const std::string& name, std::int64_t first, std::int64_t steps) {
  const std::string dir = temp_dir(name);
  LinearFamily f;
  auto opt = optimizer(f);
  Trainer t(f, opt, 3);
  const Rows d = data();
  Trainer::Batches batches;
  batches.whole = [&](std::int64_t) { return d; };
  Seen seen;
  train::TrainLog log(dir, 0);
  Trainer::Hooks h;
  h.steps = steps;
  h.log_every = 3;
  h.eval_every = 4;
  h.evaluate_when_idle = true;
  h.log = &log;
  h.on_step = [&](const Trainer::Step& st, const Rows&) { seen.stepped.push_back(st.step); };
  h.log_fields = [](const Trainer::Step& st, const Rows&, nlohmann::json& j) { j["extra"] = st.losses.extra; };
  h.evaluate = [&](std::int64_t s) { seen.events.push_back("eval " + std::to_string(s)); };
  h.checkpoint = [&](std::int64_t s) { seen.events.push_back("ckpt " + std::to_string(s)); };
  seen.done = t.run(first, batches, h);
  seen.logged = logged_steps(dir);
  return seen;
}

TEST_CASE("trainer: log lines at step 1, every log_every steps and the last; evaluation then checkpoint every "
          "eval_every steps and after the last", "[trainer]") {
  using V = std::vector<std::int64_t>;
  using E = std::vector<std::string>;
  const Seen fresh = run("fresh", 0, 7);
  CHECK(fresh.done == 7);
  CHECK(fresh.stepped == V{1, 2, 3, 4, 5, 6, 7});
  CHECK(fresh.logged == V{1, 3, 6, 7});
  CHECK(fresh.events == E{"eval 4", "ckpt 4", "eval 7", "ckpt 7"});
  // resumed after step 2: the logged steps depend on the step number alone
  const Seen resumed = run("resumed", 2, 7);
  CHECK(resumed.done == 5);
  CHECK(resumed.stepped == V{3, 4, 5, 6, 7});
  CHECK(resumed.logged == V{3, 6, 7});
  CHECK(resumed.events == E{"eval 4", "ckpt 4", "eval 7", "ckpt 7"});
  // no step to take: one evaluation and checkpoint at the first step
  const Seen idle = run("idle", 7, 7);
  CHECK(idle.done == 0);
  CHECK(idle.stepped.empty());
  CHECK(idle.logged.empty());
  CHECK(idle.events == E{"eval 7", "ckpt 7"});
}

TEST_CASE("trainer: the learning-rate hook sets the main group's rate of each step before its optimiser step",
          "[trainer]") {
  LinearFamily f, g;
  auto opt_f = optimizer(f), opt_g = optimizer(g);
  Trainer scheduled(f, opt_f, 3, [](std::int64_t s) { return 0.01 * static_cast<double>(s); });
  Trainer fixed(g, opt_g, 3);
  const Rows d = data();
  for (std::int64_t s = 1; s <= 3; ++s) {
    const auto st = scheduled.step(d, s);
    CHECK(st.lr == 0.01 * static_cast<double>(s));
    CHECK(opt_f.lr("main") == 0.01 * static_cast<double>(s));
    CHECK(fixed.step(d, s).lr == 0);
  }
  CHECK(opt_g.lr("main") == 0.05);
  CHECK((f.w.value.array() != g.w.value.array()).any());
}

TEST_CASE("trainer: micro-batches weighted by their rows give the whole batch's step (even, uneven, one empty)",
          "[trainer]") {
  const Rows d = data();
  LinearFamily whole;
  auto opt_whole = optimizer(whole);
  Trainer tw(whole, opt_whole, 3);
  const auto sw = tw.step(d, 1);
  for (const Index split : {4, 5, 8}) {  // micro-batch 0 holds rows [0, split), micro-batch 1 the rest
    INFO("split " << split);
    LinearFamily f;
    auto opt = optimizer(f);
    dist::SingleProcessComm comm;
    Trainer t(f, opt, 3);
    t.set_micro_batches(comm, 2);
    std::vector<std::int64_t> asked;
    Rows first;
    const auto sm = t.step_micro(
        1, [&](std::int64_t k) { return k == 0 ? split : 8 - split; },
        [&](std::int64_t k) {
          asked.push_back(k);
          return k == 0 ? rows_of(d, 0, split) : rows_of(d, split, 8 - split);
        },
        &first);
    CHECK(sm.losses.task == Approx(sw.losses.task).epsilon(1e-13));
    CHECK(sm.losses.extra == Approx(sw.losses.extra).epsilon(1e-13));
    CHECK(sm.losses.count == 8);
    CHECK(sm.norms.at("main") == Approx(sw.norms.at("main")).epsilon(1e-13));
    for (Index i = 0; i < 3; ++i) CHECK(f.w.value[i] == Approx(whole.w.value[i]).epsilon(1e-12));
    // this rank's micro-batches last to first, an empty one never asked for; `first` is micro-batch 0's
    CHECK(asked == (split == 8 ? std::vector<std::int64_t>{0} : std::vector<std::int64_t>{1, 0}));
    CHECK(first.x.rows() == split);
  }
}

TEST_CASE("trainer: a non-finite loss or gradient norm stops the run naming the step, the micro-batch and the "
          "checkpoint kept; the loss fault sees every micro-batch", "[trainer]") {
  const Rows d = data();
  Trainer::Batches batches;
  batches.whole = [&](std::int64_t) { return d; };
  batches.rows = [](std::int64_t, std::int64_t) { return Index(4); };
  batches.micro = [&](std::int64_t, std::int64_t k) { return rows_of(d, 4 * static_cast<Index>(k), 4); };
  std::vector<std::pair<std::int64_t, std::int64_t>> calls;
  auto fault = [&](double loss, std::int64_t s, std::int64_t k) {
    calls.emplace_back(s, k);
    return s == 3 && k == 1 ? std::nan("") : loss;
  };
  Trainer::Hooks h;
  h.steps = 5;
  h.checkpoint_dir = "DIR";
  std::vector<std::int64_t> checkpoints;
  h.eval_every = 1;
  h.checkpoint = [&](std::int64_t s) { checkpoints.push_back(s); };

  SECTION("one batch a step: the fault at micro-batch 1 never fires; a NaN gradient stops step 1") {
    LinearFamily f;
    auto opt = optimizer(f);
    Trainer t(f, opt, 3, nullptr, fault);
    CHECK(t.run(0, batches, h) == 5);
    CHECK(calls.size() == 5);
    LinearFamily g;
    g.poison_grad = true;
    auto opt_g = optimizer(g);
    Trainer tg(g, opt_g, 3);
    CHECK_THROWS_WITH(tg.run(0, batches, h), "dea: non-finite gradient norm at step 1; stopping. The last good "
                                             "checkpoint in DIR is kept.");
    CHECK((g.w.value.array() == 0).all());  // the optimiser step did not run
  }
  SECTION("micro-batches: the run stops at step 3, micro-batch 1, before its optimiser step") {
    LinearFamily f;
    auto opt = optimizer(f);
    dist::SingleProcessComm comm;
    Trainer t(f, opt, 3, nullptr, fault);
    t.set_micro_batches(comm, 2);
    Vec<double> after_step_2;
    h.on_step = [&](const Trainer::Step& st, const Rows&) {
      if (st.step == 2) after_step_2 = f.w.value;
    };
    CHECK_THROWS_WITH(t.run(0, batches, h), "dea: non-finite loss at step 3, micro-batch 1 of 2 (loss nan); stopping. "
                                            "The last good checkpoint in DIR is kept.");
    CHECK(calls == std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {1, 0}, {2, 1}, {2, 0}, {3, 1}});
    CHECK(checkpoints == std::vector<std::int64_t>{1, 2});
    CHECK((f.w.value.array() == after_step_2.array()).all());
  }
}

}  // namespace test_trainer
