// Tests of dea/optim: AdamW with groups (against hand arithmetic), per-group clipping, Adam, the γ_mix
// schedule, checkpoint state round trips and the error paths.
#include <catch2/catch.hpp>
#include <dea/core/parallel.hpp>
#include <dea/core/rng.hpp>
#include <dea/optim/adamw.hpp>
#include <dea/optim/schedule.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_optim {

using namespace dea;
using dea::optim::AdamW;
using dea::optim::GroupConfig;

namespace {

template <class S>
std::unique_ptr<Param<S>> make_param(const std::string& name, const std::string& group, Shape shape,
                                     const std::vector<double>& values, const std::vector<double>& grads) {
  auto p = std::make_unique<Param<S>>(name, group, std::move(shape));
  REQUIRE(static_cast<Index>(values.size()) == p->numel());
  REQUIRE(static_cast<Index>(grads.size()) == p->numel());
  for (Index i = 0; i < p->numel(); ++i) {
    p->value[i] = static_cast<S>(values[static_cast<std::size_t>(i)]);
    p->grad[i] = static_cast<S>(grads[static_cast<std::size_t>(i)]);
  }
  return p;
}

// One AdamW step of one scalar, written out from AdamW's formulas (double, straight-line).
void reference_adamw_step(double& p, double& m, double& v, double g, int t, double lr, double wd) {
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  p = p * (1.0 - lr * wd);
  m = beta1 * m + (1.0 - beta1) * g;
  v = beta2 * v + (1.0 - beta2) * g * g;
  const double step_size = lr / (1.0 - std::pow(beta1, t));
  const double denom = std::sqrt(v) / std::sqrt(1.0 - std::pow(beta2, t)) + eps;
  p = p - step_size * m / denom;
}

// Deterministic pseudo-gradients for step k: normal(0, scale) from a seed that depends on k and the parameter.
template <class S>
void fill_grads(const ParamList<S>& params, int k, double scale) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Rng rng(1000 + 17 * static_cast<std::uint64_t>(k) + static_cast<std::uint64_t>(i));
    for (Index j = 0; j < params[i]->numel(); ++j) params[i]->grad[j] = static_cast<S>(rng.normal(0.0, scale));
  }
}

// A small model: two main parameters and two gate parameters (named as the layers name them).
template <class S>
struct Toy {
  std::vector<std::unique_ptr<Param<S>>> owned;
  ParamList<S> list;
  explicit Toy(std::uint64_t seed) {
    owned.push_back(std::make_unique<Param<S>>("layers.0.attn.W_q.weight", "main", Shape{3, 4}));
    owned.push_back(std::make_unique<Param<S>>("layers.0.attn.W_rel", "main", Shape{5}));
    owned.push_back(std::make_unique<Param<S>>("layers.0.attn.W_gate.weight", "gate", Shape{2, 3}));
    owned.push_back(std::make_unique<Param<S>>("layers.0.attn.c_gate", "gate", Shape{}));
    Rng rng(seed);
    for (auto& p : owned) {
      for (Index j = 0; j < p->numel(); ++j) p->value[j] = static_cast<S>(rng.normal(0.0, 1.0));
      list.push_back(p.get());
    }
  }
};

}  // namespace

TEST_CASE("AdamW: two steps against hand-computed values, decay on main only", "[optim]") {
  // lr 0.1 for both groups, wd 0.1 on main, p0 = 1, g = 0.5 then -0.5.
  // Step 1: m = 0.05, v = 0.00025, step = 0.1/0.1 = 1, denom = sqrt(0.25) + 1e-8 = 0.5 + 1e-8.
  //   main: p = 1·(1 − 0.01) − 0.05/(0.5 + 1e-8) = 0.99 − 0.1(1 − 2e-8) = 0.890000002
  //   gate: p = 1 − 0.1(1 − 2e-8) = 0.900000002
  // Step 2: m = 0.045 − 0.05 = −0.005, v = 0.00024975 + 0.00025 = 0.00049975, 1 − β1² = 0.19,
  //   1 − β2² = 0.001999, v/0.001999 = 0.25, denom = 0.5 + 1e-8, step = 0.1/0.19, m/denom = −0.01(1 − 2e-8)
  //   main: p = 0.890000002·0.99 + (0.1/0.19)·0.01·(1 − 2e-8) = 0.88110000198 + 0.0052631578...
  //   gate: p = 0.900000002 + (0.1/0.19)·0.01·(1 − 2e-8)
  auto w = make_param<double>("enc.W_q.weight", "main", {1}, {1.0}, {0.5});
  auto gw = make_param<double>("enc.attn.W_gate.weight", "gate", {1}, {1.0}, {0.5});
  AdamW<double> opt({w.get(), gw.get()}, {GroupConfig{"main", 0.1, 0.1, 1.0, 0.9, 0.999, 1e-8},
                                          GroupConfig{"gate", 0.1, 0.0, 1.0, 0.9, 0.999, 1e-8}});
  opt.step();
  CHECK(w->value[0] == Approx(0.890000002).margin(1e-13).epsilon(0));
  CHECK(gw->value[0] == Approx(0.900000002).margin(1e-13).epsilon(0));
  CHECK(opt.exp_avg("enc.W_q.weight")[0] == Approx(0.05).margin(1e-16).epsilon(0));
  CHECK(opt.exp_avg_sq("enc.W_q.weight")[0] == Approx(0.00025).margin(1e-18).epsilon(0));
  CHECK(opt.step_count("main") == 1);
  CHECK(opt.step_count("gate") == 1);

  w->grad[0] = -0.5;
  gw->grad[0] = -0.5;
  opt.step();
  const double adam_move = (0.1 / 0.19) * 0.01 * (1 - 2e-8);
  CHECK(w->value[0] == Approx(0.88110000198 + adam_move).margin(1e-13).epsilon(0));
  CHECK(gw->value[0] == Approx(0.900000002 + adam_move).margin(1e-13).epsilon(0));
  CHECK(opt.exp_avg("enc.attn.W_gate.weight")[0] == Approx(-0.005).margin(1e-16).epsilon(0));
  CHECK(opt.exp_avg_sq("enc.attn.W_gate.weight")[0] == Approx(0.00049975).margin(1e-18).epsilon(0));
}

TEMPLATE_TEST_CASE("AdamW: reference groups over several steps match the scalar formulas", "[optim]", float,
                   double) {
  using S = TestType;
  const double tol = std::is_same<S, float>::value ? 2e-6 : 1e-13;
  Toy<S> toy(11);
  AdamW<S> opt = optim::build_optimizer(toy.list);
  REQUIRE(opt.lr("main") == 3e-4);
  REQUIRE(opt.weight_decay("main") == 0.01);
  REQUIRE(opt.lr("gate") == 1e-3);
  REQUIRE(opt.weight_decay("gate") == 0.0);
  REQUIRE(opt.max_grad_norm("main") == 1.0);
  REQUIRE(opt.max_grad_norm("gate") == 1.0);
  REQUIRE(opt.params("main").size() == 2);
  REQUIRE(opt.params("gate").size() == 2);

  // Scalar reference state, one entry per element, in double.
  std::vector<std::vector<double>> p, m, v;
  for (Param<S>* q : toy.list) {
    p.emplace_back(q->value.data(), q->value.data() + q->numel());
    m.emplace_back(q->numel(), 0.0);
    v.emplace_back(q->numel(), 0.0);
  }
  const S* before_first = toy.list[0]->value.data();
  const double p00 = before_first[0];
  const double p30 = toy.list[3]->value[0];

  for (int t = 1; t <= 6; ++t) {
    fill_grads(toy.list, t, 0.05);  // small grads: no clipping involved (step() does not clip anyway)
    for (std::size_t i = 0; i < toy.list.size(); ++i) {
      const bool gate = i >= 2;
      const double lr = gate ? 1e-3 : 3e-4, wd = gate ? 0.0 : 0.01;
      for (Index j = 0; j < toy.list[i]->numel(); ++j) {
        const auto ju = static_cast<std::size_t>(j);
        reference_adamw_step(p[i][ju], m[i][ju], v[i][ju], static_cast<double>(toy.list[i]->grad[j]), t, lr, wd);
      }
    }
    const double g00 = toy.list[0]->grad[0], g30 = toy.list[3]->grad[0];
    opt.step();
    if (t == 1) {
      // After one step Adam moves each element by lr·sign(g) (up to eps): p1 = p0(1 − lr·wd) − lr·sign(g).
      CHECK(toy.list[0]->value[0] == Approx(p00 * (1 - 3e-4 * 0.01) - 3e-4 * (g00 > 0 ? 1 : -1)).margin(1e-6));
      CHECK(toy.list[3]->value[0] == Approx(p30 - 1e-3 * (g30 > 0 ? 1 : -1)).margin(1e-6));
    }
    for (std::size_t i = 0; i < toy.list.size(); ++i)
      for (Index j = 0; j < toy.list[i]->numel(); ++j) {
        const auto ju = static_cast<std::size_t>(j);
        INFO("step " << t << ", parameter " << toy.list[i]->name << ", element " << j);
        CHECK(static_cast<double>(toy.list[i]->value[j]) == Approx(p[i][ju]).margin(tol).epsilon(0));
        CHECK(static_cast<double>(opt.exp_avg(toy.list[i]->name)[j]) ==
              Approx(m[i][ju]).margin(tol * 1e-2).epsilon(0));
        CHECK(static_cast<double>(opt.exp_avg_sq(toy.list[i]->name)[j]) ==
              Approx(v[i][ju]).margin(tol * 1e-3).epsilon(0));
      }
  }
  CHECK(opt.step_count("main") == 6);
  CHECK(opt.step_count("gate") == 6);
}

// "big.weight" (main): 70001 values ~ N(0, 1) with gradients ~ N(0, 0.1), drawn from `seed`: five work chunks of
// the optimiser, the last one short.
static std::unique_ptr<Param<float>> big_weight(std::uint64_t seed) {
  std::vector<double> vals(70001), grads(70001);
  Rng rng(seed);
  for (std::size_t i = 0; i < vals.size(); ++i) {
    vals[i] = rng.normal(0.0, 1.0);
    grads[i] = rng.normal(0.0, 0.1);
  }
  return make_param<float>("big.weight", "main", {70001}, vals, grads);
}

TEST_CASE("AdamW: parameters larger than one work chunk give the same bits for 1 and 2 threads", "[optim][threads]") {
  // step() cuts every parameter into chunks and spreads them over the threads; the update is element-wise, so
  // the result must equal the whole-array formula exactly, whatever the thread count.
  auto run = [](int threads) {
    set_num_threads(threads);
    auto w = big_weight(5);
    auto c = make_param<float>("layers.0.attn.c_gate", "gate", {3}, {0.1, 0.2, 0.3}, {1.0, -1.0, 0.5});
    AdamW<float> opt({w.get(), c.get()}, {GroupConfig{"main", 1e-3, 0.01, 1.0, 0.9, 0.999, 1e-8},
                                          GroupConfig{"gate", 1e-2, 0.0, 1.0, 0.9, 0.999, 1e-8}});
    // the whole-array update of the file comment, in float, for comparison
    Eigen::ArrayXf p = w->value.array(), g = w->grad.array(), m = Eigen::ArrayXf::Zero(p.size()), v = m;
    for (int t = 1; t <= 3; ++t) {
      opt.step();
      p *= static_cast<float>(1.0 - 1e-3 * 0.01);
      m = 0.9f * m + static_cast<float>(1.0 - 0.9) * g;
      v = 0.999f * v + static_cast<float>(1.0 - 0.999) * g * g;
      const float step = static_cast<float>(1e-3 / (1.0 - std::pow(0.9, t)));
      const float bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t)));
      p -= step * (m / (v.sqrt() / bc2 + 1e-8f));
    }
    set_num_threads(1);
    REQUIRE((w->value.array() == p).all());
    return std::vector<float>(w->value.data(), w->value.data() + w->numel());
  };
  REQUIRE(run(1) == run(2));
}

TEST_CASE("AdamW: norms, clipping, zeroing and the finiteness test over many chunks, on 1 and 2 threads",
          "[optim][threads]") {
  // The passes before the update also run chunk by chunk on the threads: the norm must be the sum of squares in
  // double (chunk sums added in order), the same bits for any thread count, and a non-finite value far into a
  // large parameter must still be found and named.
  struct Out {
    double norm_main, norm_gate;
    std::vector<float> grad;
  };
  auto run = [](int threads) {
    set_num_threads(threads);
    auto w = big_weight(9);
    auto w2 = make_param<float>("big.bias", "main", {40000}, std::vector<double>(40000, 0.5),
                                std::vector<double>(40000, -0.01));
    auto c = make_param<float>("layers.0.attn.c_gate", "gate", {3}, {0.1, 0.2, 0.3}, {1.0, -1.0, 0.5});
    AdamW<float> opt({w.get(), w2.get(), c.get()}, {GroupConfig{"main", 1e-3, 0.01, 1.0, 0.9, 0.999, 1e-8},
                                                    GroupConfig{"gate", 1e-2, 0.0, 1.0, 0.9, 0.999, 1e-8}});
    double ref = 0;  // element by element, in double
    for (Index i = 0; i < w->grad.size(); ++i) ref += double(w->grad[i]) * double(w->grad[i]);
    for (Index i = 0; i < w2->grad.size(); ++i) ref += double(w2->grad[i]) * double(w2->grad[i]);
    const Vec<float> g0 = w->grad;
    const optim::GradNorms n = opt.clip_grad_norms();
    CHECK(n.at("main") == Approx(std::sqrt(ref)).epsilon(1e-12));
    CHECK(n.at("gate") == Approx(std::sqrt(1.0 + 1.0 + 0.25)).epsilon(1e-12));
    const float coef = static_cast<float>(1.0 / (n.at("main") + 1e-6));
    CHECK(n.at("main") > 10);  // so the clip scaled every chunk
    CHECK((w->grad.array() == g0.array() * coef).all());
    CHECK(opt.grad_norms().at("main") == Approx(1.0).epsilon(1e-5));
    Out o{n.at("main"), n.at("gate"), std::vector<float>(w->grad.data(), w->grad.data() + w->numel())};

    w2->grad[39999] = std::numeric_limits<float>::quiet_NaN();  // in the last chunk of the second parameter
    CHECK_THROWS_WITH(opt.step(), Catch::Contains("'big.bias'") && Catch::Contains("index 39999"));
    w2->grad[39999] = 0;
    for (const Index k : {Index(0), Index(16400), Index(70000)}) {  // +-inf: a chunk's first value, mid-chunk, the tail
      const float saved = w->grad[k];
      w->grad[k] = k == 16400 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
      CHECK_FALSE(std::isfinite(opt.grad_norms().at("main")));
      CHECK_THROWS_WITH(opt.step(), Catch::Contains("'big.weight'") && Catch::Contains("index " + std::to_string(k)));
      w->grad[k] = saved;
    }
    CHECK(opt.step_count("main") == 0);
    opt.zero_grad();
    CHECK(w->grad.isZero(0));
    CHECK(w2->grad.isZero(0));
    CHECK(c->grad.isZero(0));
    set_num_threads(1);
    return o;
  };
  const Out a = run(1), b = run(2);
  CHECK(a.norm_main == b.norm_main);
  CHECK(a.norm_gate == b.norm_gate);
  CHECK(a.grad == b.grad);
}

TEST_CASE("AdamW: weight decay acts on a zero gradient, only in its group", "[optim]") {
  // g = 0: m = v = 0, the Adam term is 0/(0 + eps) = 0, so only the decay p(1 − lr·wd) remains.
  auto a = make_param<double>("x.weight", "main", {2}, {2.0, -4.0}, {0.0, 0.0});
  auto b = make_param<double>("x.c_gate", "gate", {1}, {3.0}, {0.0});
  AdamW<double> opt = optim::build_optimizer<double>({a.get(), b.get()});
  opt.step();
  opt.step();
  const double decay = (1 - 3e-4 * 0.01) * (1 - 3e-4 * 0.01);
  CHECK(a->value[0] == Approx(2.0 * decay).epsilon(1e-15));
  CHECK(a->value[1] == Approx(-4.0 * decay).epsilon(1e-15));
  CHECK(b->value[0] == 3.0);
}

TEST_CASE("build_optimizer groups by name and tied parameters are updated once", "[optim]") {
  Param<double> q("layers.1.attn.W_q.weight", "gate", {2});  // wrong group on purpose: the name rule fixes it
  Param<double> g("layers.1.attn.W_gate.weight", "main", {2});
  Param<double> c("layers.1.attn.c_gate", "main", {1});
  Param<double> emb("tok_emb.weight", "main", {3});
  ParamList<double> list{&q, &g, &c, &emb, &emb};  // emb listed twice, as a tied head would list it
  AdamW<double> opt = optim::build_optimizer(list);
  CHECK(q.group == "main");
  CHECK(g.group == "gate");
  CHECK(c.group == "gate");
  CHECK(opt.params().size() == 4);
  CHECK(opt.params("gate").size() == 2);
  CHECK(optim::is_gate_param_name("layers.0.attn.W_gate.bias"));
  CHECK_FALSE(optim::is_gate_param_name("layers.0.attn.W_rel"));

  emb.value.setConstant(1.0);
  emb.grad.setConstant(0.5);
  opt.step();
  // Updated once: 1·(1 − 3e-6) − 3e-4·0.5/(0.5 + 1e-8)·(0.1/0.1).
  const double once = 1.0 * (1 - 3e-4 * 0.01) - 3e-4 * (1 - 2e-8);
  CHECK(emb.value[0] == Approx(once).margin(1e-15).epsilon(0));
}

TEMPLATE_TEST_CASE("clip_grad_norms clips each group separately and returns the pre-clip norms", "[optim]", float,
                   double) {
  using S = TestType;
  // main: grads (3, 4) and (0, 12): norm √(9 + 16 + 144) = 13.   gate: (0.375, 0.5): norm √0.390625 = 0.625.
  auto a = make_param<S>("a.weight", "main", {2}, {0, 0}, {3, 4});
  auto b = make_param<S>("b.weight", "main", {2}, {0, 0}, {0, 12});
  auto g = make_param<S>("attn.W_gate.weight", "gate", {2}, {0, 0}, {0.375, 0.5});
  AdamW<S> opt = optim::build_optimizer<S>({a.get(), b.get(), g.get()});

  const optim::GradNorms before = opt.grad_norms();  // does not change anything
  CHECK(before.at("main") == 13.0);
  CHECK(before.at("gate") == 0.625);
  CHECK(a->grad[0] == S(3));

  const optim::GradNorms norms = opt.clip_grad_norms();
  CHECK(norms.norm.size() == 2);
  CHECK(norms.at("main") == 13.0);
  CHECK(norms.at("gate") == 0.625);
  CHECK(norms.all_finite());
  // main is scaled by 1/(13 + 1e-6); gate (0.625 < 1) is untouched, bit for bit.
  const double coef = 1.0 / (13.0 + 1e-6);
  const double tol = std::is_same<S, float>::value ? 1e-6 : 1e-15;
  CHECK(static_cast<double>(a->grad[0]) == Approx(3 * coef).epsilon(tol));
  CHECK(static_cast<double>(a->grad[1]) == Approx(4 * coef).epsilon(tol));
  CHECK(static_cast<double>(b->grad[0]) == 0.0);
  CHECK(static_cast<double>(b->grad[1]) == Approx(12 * coef).epsilon(tol));
  CHECK(g->grad[0] == S(0.375));
  CHECK(g->grad[1] == S(0.5));
  CHECK(opt.grad_norms().at("main") == Approx(13.0 / (13.0 + 1e-6)).epsilon(tol));
  CHECK_THROWS_WITH(norms.at("gates"), Catch::Contains("'gates'"));

  // Different limits per group: gate clipped to 0.1, main (norm ~1) under a limit of 100 untouched.
  opt.set_max_grad_norm("gate", 0.1);
  opt.set_max_grad_norm("main", 100.0);
  const S a0 = a->grad[0];
  const optim::GradNorms n2 = opt.clip_grad_norms();
  CHECK(n2.at("gate") == 0.625);
  CHECK(a->grad[0] == a0);
  CHECK(static_cast<double>(g->grad[0]) == Approx(0.375 * 0.1 / (0.625 + 1e-6)).epsilon(tol));
  CHECK(static_cast<double>(g->grad[1]) == Approx(0.5 * 0.1 / (0.625 + 1e-6)).epsilon(tol));

  // Infinity disables clipping.
  opt.set_max_grad_norm("gate", std::numeric_limits<double>::infinity());
  const S g0 = g->grad[0];
  opt.clip_grad_norms();
  CHECK(g->grad[0] == g0);
}

TEST_CASE("clip_and_step clips before the update", "[optim]") {
  // g = 30 in a one-element group with clip 1: clipped to 30/(30 + 1e-6); Adam's first step is sign-like,
  // so compare the moments, which see the clipped gradient.
  auto a = make_param<double>("w", "main", {1}, {0.0}, {30.0});
  AdamW<double> opt(ParamList<double>{a.get()}, {optim::main_group_defaults()});
  const optim::GradNorms n = opt.clip_and_step();
  CHECK(n.at("main") == 30.0);
  CHECK(opt.exp_avg("w")[0] == Approx(0.1 * 30.0 / (30.0 + 1e-6)).epsilon(1e-15));
  CHECK(opt.exp_avg_sq("w")[0] == Approx(0.001 * std::pow(30.0 / (30.0 + 1e-6), 2)).epsilon(1e-15));
}

TEST_CASE("Adam is AdamW with weight decay 0", "[optim]") {
  Toy<double> t1(5), t2(5), t3(5);
  AdamW<double> adam = optim::make_adam(t1.list, 1e-3);
  REQUIRE(adam.group_names() == std::vector<std::string>{"main", "gate"});
  REQUIRE(adam.weight_decay("main") == 0.0);
  AdamW<double> adamw0(t2.list, {GroupConfig{"main", 1e-3, 0.0, 1.0, 0.9, 0.999, 1e-8},
                                 GroupConfig{"gate", 1e-3, 0.0, 1.0, 0.9, 0.999, 1e-8}});
  AdamW<double> adamw(t3.list, {GroupConfig{"main", 1e-3, 0.1, 1.0, 0.9, 0.999, 1e-8},
                                GroupConfig{"gate", 1e-3, 0.0, 1.0, 0.9, 0.999, 1e-8}});
  // Classic Adam by hand for element 0 of the first parameter.
  double p = t1.list[0]->value[0], m = 0, v = 0;
  for (int k = 1; k <= 4; ++k) {
    fill_grads(t1.list, k, 0.3);
    fill_grads(t2.list, k, 0.3);
    fill_grads(t3.list, k, 0.3);
    const double g = t1.list[0]->grad[0];
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double mhat = m / (1 - std::pow(0.9, k)), vhat = v / (1 - std::pow(0.999, k));
    p -= 1e-3 * mhat / (std::sqrt(vhat) + 1e-8);
    adam.step();
    adamw0.step();
    adamw.step();
  }
  CHECK(t1.list[0]->value[0] == Approx(p).margin(1e-14).epsilon(0));
  for (std::size_t i = 0; i < t1.list.size(); ++i) {
    CHECK(t1.list[i]->value == t2.list[i]->value);  // bit for bit
  }
  CHECK(t3.list[0]->value != t1.list[0]->value);  // weight decay on main changes the result
  CHECK(t3.list[2]->value == t1.list[2]->value);  // the gate group has none
}

TEST_CASE("gamma_mix schedule", "[optim][schedule]") {
  using optim::gamma_mix;
  CHECK(gamma_mix(0, 10000) == 1.0);
  CHECK(gamma_mix(5000, 10000) == 0.5);
  CHECK(gamma_mix(2500, 10000) == 0.75);
  CHECK(gamma_mix(10000, 10000) == 0.0);
  CHECK(gamma_mix(10001, 10000) == 0.0);
  CHECK(gamma_mix(12000, 10000) == 0.0);
  CHECK(gamma_mix(1, 10000) == Approx(0.9999).epsilon(1e-15));
  CHECK(gamma_mix<float>(5000, 10000) == 0.5f);
  CHECK(gamma_mix(0, 0) == 0.0);
  CHECK(gamma_mix(7, 0) == 0.0);
  CHECK_THROWS_AS(gamma_mix(0, -1), Error);
  CHECK_THROWS_AS(gamma_mix(-1, 10), Error);

  const optim::GammaMixSchedule sched;  // N = 10000
  CHECK(sched.anneal_steps() == 10000);
  CHECK(sched(0) == 1.0);
  CHECK(sched.at_step(1) == 1.0);         // 1-based step 1 is s = 0
  CHECK(sched.at_step(5001) == 0.5);
  CHECK(sched.at_step(10001) == 0.0);
  CHECK(sched.at<float>(10000) == 0.0f);
  CHECK_THROWS_AS(sched.at_step(0), Error);
  CHECK_THROWS_AS(optim::GammaMixSchedule(-5), Error);
}

TEMPLATE_TEST_CASE("state export / import resumes bit for bit", "[optim][state]", float, double) {
  using S = TestType;
  const int k = 3, total = 8;
  // Uninterrupted run (gradients large enough that clipping is active on most steps).
  Toy<S> full(21);
  AdamW<S> opt_full = optim::build_optimizer(full.list);
  for (int s = 1; s <= total; ++s) {
    fill_grads(full.list, s, 0.6);
    opt_full.clip_and_step();
  }

  // Interrupted run: k steps, export, fresh parameters and optimiser, import, continue.
  Toy<S> first(21);
  AdamW<S> opt_first = optim::build_optimizer(first.list);
  for (int s = 1; s <= k; ++s) {
    fill_grads(first.list, s, 0.6);
    opt_first.clip_and_step();
  }
  const auto st = opt_first.state();
  REQUIRE(st.size() == 2 * first.list.size() + 2);
  REQUIRE(st.count("exp_avg.layers.0.attn.W_q.weight") == 1);
  REQUIRE(st.count("exp_avg_sq.layers.0.attn.c_gate") == 1);
  CHECK(st.at("exp_avg.layers.0.attn.W_q.weight").shape == Shape{3, 4});
  CHECK(st.at("exp_avg_sq.layers.0.attn.c_gate").shape == Shape{});
  CHECK(st.at("step.main").shape == Shape{});
  CHECK(st.at("step.main")[0] == S(k));
  CHECK(st.at("step.gate")[0] == S(k));

  Toy<S> resumed(999);  // different init, overwritten from the "checkpoint"
  for (std::size_t i = 0; i < resumed.list.size(); ++i) resumed.list[i]->value = first.list[i]->value;
  Toy<S> no_state(999);  // same parameters but without the optimiser state: must diverge
  for (std::size_t i = 0; i < no_state.list.size(); ++i) no_state.list[i]->value = first.list[i]->value;

  AdamW<S> opt_resumed = optim::build_optimizer(resumed.list);
  AdamW<S> opt_no_state = optim::build_optimizer(no_state.list);
  opt_resumed.load_state(st);
  CHECK(opt_resumed.step_count("main") == k);
  for (int s = k + 1; s <= total; ++s) {
    fill_grads(resumed.list, s, 0.6);
    opt_resumed.clip_and_step();
    fill_grads(no_state.list, s, 0.6);
    opt_no_state.clip_and_step();
  }
  bool diverged = false;
  for (std::size_t i = 0; i < full.list.size(); ++i) {
    INFO(full.list[i]->name);
    CHECK(resumed.list[i]->value == full.list[i]->value);  // exact equality of every element
    CHECK(opt_resumed.exp_avg(full.list[i]->name) == opt_full.exp_avg(full.list[i]->name));
    CHECK(opt_resumed.exp_avg_sq(full.list[i]->name) == opt_full.exp_avg_sq(full.list[i]->name));
    diverged = diverged || no_state.list[i]->value != full.list[i]->value;
  }
  CHECK(diverged);
  CHECK(opt_resumed.step_count("gate") == total);

  // A prefix lets the state share one map with other tensors.
  auto st2 = opt_full.state("optim.");
  st2.emplace("layers.0.attn.W_rel", Tensor<S>(Shape{5}, S(1)));  // a model weight: ignored
  Toy<S> other(3);
  AdamW<S> opt_other = optim::build_optimizer(other.list);
  opt_other.load_state(st2, "optim.");
  CHECK(opt_other.step_count("main") == total);
  CHECK(opt_other.exp_avg("layers.0.attn.W_gate.weight") == opt_full.exp_avg("layers.0.attn.W_gate.weight"));
}

TEST_CASE("AdamW errors: unknown groups", "[optim][errors]") {
  Toy<double> toy(1);
  AdamW<double> opt = optim::build_optimizer(toy.list);
  CHECK_THROWS_WITH(opt.set_lr("gates", 1e-3), Catch::Contains("'gates'"));
  CHECK_THROWS_AS(opt.set_lr("gates", 1e-3), Error);
  CHECK_THROWS_WITH(opt.lr("encoder"), Catch::Contains("'encoder'"));
  CHECK_THROWS_WITH(opt.step_count("x"), Catch::Contains("'x'"));
  CHECK_THROWS_AS(opt.set_lr("main", -1.0), Error);
  opt.set_lr("gate", 5e-4);
  CHECK(opt.lr("gate") == 5e-4);
  CHECK(opt.lr("main") == 3e-4);
  CHECK_THROWS_WITH(opt.exp_avg("nope"), Catch::Contains("'nope'"));

  // A parameter whose group the optimiser does not have.
  Param<double> p("enc.proj.weight", "head", {2});
  CHECK_THROWS_WITH((AdamW<double>(ParamList<double>{&p}, {optim::main_group_defaults()})),
                    Catch::Contains("'enc.proj.weight'") && Catch::Contains("'head'"));
  // Duplicate parameter names, duplicate groups, bad hyperparameters.
  Param<double> a("w", "main", {1}), b("w", "main", {1});
  CHECK_THROWS_WITH((AdamW<double>(ParamList<double>{&a, &b}, {optim::main_group_defaults()})),
                    Catch::Contains("'w'"));
  CHECK_THROWS_AS((AdamW<double>(ParamList<double>{&a}, {optim::main_group_defaults(), optim::main_group_defaults()})),
                  Error);
  GroupConfig bad = optim::main_group_defaults();
  bad.beta2 = 1.0;
  CHECK_THROWS_AS((AdamW<double>(ParamList<double>{&a}, {bad})), Error);
  bad = optim::main_group_defaults();
  bad.max_grad_norm = 0.0;
  CHECK_THROWS_AS((AdamW<double>(ParamList<double>{&a}, {bad})), Error);
}

TEMPLATE_TEST_CASE("AdamW errors: a non-finite gradient is detected before any parameter changes", "[optim][errors]",
                   float, double) {
  using S = TestType;
  for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Toy<S> toy(4);
    AdamW<S> opt = optim::build_optimizer(toy.list);
    fill_grads(toy.list, 1, 0.1);
    opt.step();  // a good step first, so the moments are non-zero
    fill_grads(toy.list, 2, 3.0);
    toy.list[1]->grad[2] = static_cast<S>(bad);  // W_rel, second main parameter, after a finite one

    std::vector<Vec<S>> values, ms, vs;
    const Vec<S> main_grad0 = toy.list[0]->grad;
    for (Param<S>* p : toy.list) {
      values.push_back(p->value);
      ms.push_back(opt.exp_avg(p->name));
      vs.push_back(opt.exp_avg_sq(p->name));
    }
    // The clip reports the bad group, leaves it untouched, and still clips the finite group.
    const optim::GradNorms norms = opt.clip_grad_norms();
    CHECK_FALSE(norms.all_finite());
    CHECK_FALSE(std::isfinite(norms.at("main")));
    CHECK(std::isfinite(norms.at("gate")));
    CHECK(norms.nonfinite_groups() == std::vector<std::string>{"main"});
    CHECK(opt.grad_norms().at("gate") < 1.0 + 1e-6);
    CHECK(toy.list[0]->grad == main_grad0);  // the non-finite group is not scaled

    CHECK_THROWS_AS(opt.step(), Error);
    CHECK_THROWS_WITH(opt.step(), Catch::Contains("'layers.0.attn.W_rel'") && Catch::Contains("index 2"));
    CHECK_THROWS_AS(opt.clip_and_step(), Error);
    for (std::size_t i = 0; i < toy.list.size(); ++i) {
      CHECK(toy.list[i]->value == values[i]);
      CHECK(opt.exp_avg(toy.list[i]->name) == ms[i]);
      CHECK(opt.exp_avg_sq(toy.list[i]->name) == vs[i]);
    }
    CHECK(opt.step_count("main") == 1);
    CHECK(opt.step_count("gate") == 1);
  }
}

TEST_CASE("AdamW errors: load_state checks keys, shapes and values, and changes nothing on failure", "[optim][errors]") {
  Param<double> w("enc.W_q.weight", "main", {2, 3});
  Param<double> gw("enc.W_gate.weight", "gate", {3});
  AdamW<double> src = optim::build_optimizer<double>({&w, &gw});
  w.grad.setConstant(0.2);
  gw.grad.setConstant(-0.1);
  src.step();
  const auto good = src.state();

  Param<double> w2("enc.W_q.weight", "main", {3, 2});  // same name and size, transposed shape
  Param<double> gw2("enc.W_gate.weight", "gate", {3});
  AdamW<double> dst = optim::build_optimizer<double>({&w2, &gw2});
  CHECK_THROWS_WITH(dst.load_state(good), Catch::Contains("exp_avg.enc.W_q.weight") && Catch::Contains("[3, 2]") &&
                                              Catch::Contains("[2, 3]"));
  CHECK(dst.step_count("main") == 0);
  CHECK(dst.exp_avg("enc.W_gate.weight").isZero(0));  // nothing was loaded, not even the matching parameter

  Param<double> w3("enc.W_q.weight", "main", {2, 3});
  Param<double> gw3("enc.W_gate.weight", "gate", {3});
  AdamW<double> ok = optim::build_optimizer<double>({&w3, &gw3});

  auto missing = good;
  missing.erase("exp_avg_sq.enc.W_gate.weight");
  CHECK_THROWS_WITH(ok.load_state(missing), Catch::Contains("missing key 'exp_avg_sq.enc.W_gate.weight'"));

  auto unknown = good;
  unknown.emplace("exp_avg.enc.W_k.weight", Tensor<double>(Shape{2, 3}, 0.0));
  CHECK_THROWS_WITH(ok.load_state(unknown), Catch::Contains("exp_avg.enc.W_k.weight"));
  auto unknown_group = good;
  unknown_group.emplace("step.head", Tensor<double>(Shape{}, 1.0));
  CHECK_THROWS_WITH(ok.load_state(unknown_group), Catch::Contains("step.head"));

  auto negative_v = good;
  negative_v.at("exp_avg_sq.enc.W_q.weight")[4] = -1e-9;
  CHECK_THROWS_WITH(ok.load_state(negative_v), Catch::Contains("exp_avg_sq.enc.W_q.weight"));
  auto nan_m = good;
  nan_m.at("exp_avg.enc.W_gate.weight")[0] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(ok.load_state(nan_m), Error);
  auto frac_step = good;
  frac_step.at("step.gate")[0] = 1.5;
  CHECK_THROWS_WITH(ok.load_state(frac_step), Catch::Contains("step.gate"));
  auto bad_step_shape = good;
  bad_step_shape.at("step.main") = Tensor<double>(Shape{2}, 1.0);
  CHECK_THROWS_WITH(ok.load_state(bad_step_shape), Catch::Contains("step.main"));
  CHECK(ok.step_count("main") == 0);
  CHECK(ok.step_count("gate") == 0);

  ok.load_state(good);
  CHECK(ok.step_count("main") == 1);
  CHECK(ok.exp_avg("enc.W_q.weight") == src.exp_avg("enc.W_q.weight"));
}

}  // namespace test_optim
