// Tests of DualExpertAttention's tiled kernel (Options::kernel = DeaKernel::tiled) against the reference kernel:
// output, every parameter gradient, every input gradient, gate loss and GateStats agree to round-off (blocks of
// 1 and 3 queries, so several blocks and a ragged last block exist; masks including a batch row with one real key
// and one with none; self- and cross-attention; with and without oracle / targets; dropout; fixed and dynamic
// sizes; float and double). Then finite differences of the tiled path itself, 1 vs 2 threads bitwise, dropout
// determinism, gradient isolation, and the O(T) cache.
#include <catch2/catch.hpp>
#include <dea/attention/dual_expert.hpp>
#include "instances/dual_expert_shapes.hpp"
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dea_tiled {

using namespace dea;

namespace {

struct Case {
  Index B = 3, Tq = 7, Tk = 7, D = 8, H = 2;
  bool cross = false, mask = false, oracle = false, oracle_per_head = false, targets = false, targets_per_head = false;
  bool out_proj = true, bias = true, frozen = false;
  double gamma = 0.5, dropout = 0.0;
  Index block = 3;
  std::uint64_t seed = 21;
};

template <class S>
struct Inputs {
  Mat<S> q, k, v;
  Tensor<std::uint8_t> km;
  Tensor<S> oracle;
  Tensor<std::int64_t> target;
};

template <class S>
Inputs<S> make_inputs(const Case& cs) {
  Rng rng(cs.seed);
  Inputs<S> in;
  Mat<double> q(cs.B * cs.Tq, cs.D), k(cs.B * cs.Tk, cs.D), v(cs.B * cs.Tk, cs.D);
  init::normal(q, rng, 0, 1);
  init::normal(k, rng, 0, 1);
  init::normal(v, rng, 0, 1);
  in.q = q.cast<S>();
  if (cs.cross) {
    in.k = k.cast<S>();
    in.v = v.cast<S>();
  }
  in.km = Tensor<std::uint8_t>({cs.B, cs.Tk}, 1);
  if (cs.mask) {
    in.km[cs.Tk - 1] = 0;  // batch 0: last key padded
    if (cs.B > 1)
      for (Index j = 0; j < cs.Tk; ++j) in.km[cs.Tk + j] = j == 2 ? 1 : 0;  // batch 1: one real key (2)
  }
  const Index H = cs.H;
  in.oracle = cs.oracle_per_head ? Tensor<S>({cs.B, H, cs.Tq, cs.Tk}) : Tensor<S>({cs.B, cs.Tq, cs.Tk});
  for (Index i = 0; i < in.oracle.numel(); ++i)
    in.oracle[i] = rng.uniform() < 0.4 ? std::numeric_limits<S>::quiet_NaN() : S(rng.uniform(-0.1, 1.0));
  in.target = cs.targets_per_head ? Tensor<std::int64_t>({cs.B, H, cs.Tq}) : Tensor<std::int64_t>({cs.B, cs.Tq});
  for (Index i = 0; i < in.target.numel(); ++i)
    in.target[i] = rng.uniform() < 0.3 ? -1 : static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(cs.Tk)));
  if (cs.targets)  // most targets on labelled cells, so that rows are active
    for (Index i = 0; i < in.target.numel(); ++i) {
      if (in.target[i] < 0) continue;
      const Index row = i % cs.Tq, b = i / (in.target.numel() / cs.B);
      const Index hh = cs.targets_per_head ? (i / cs.Tq) % H : 0;
      const Index cell = cs.oracle_per_head ? ((b * H + hh) * cs.Tq + row) * cs.Tk + in.target[i]
                                            : (b * cs.Tq + row) * cs.Tk + in.target[i];
      if (std::isnan(in.oracle[cell])) in.oracle[cell] = S(0.3 + 0.5 * rng.uniform());
    }
  return in;
}

template <class L>
L make_layer(const Case& cs, DeaKernel kernel) {
  using S = typename L::Scalar;
  Rng rng(cs.seed + 100);
  typename L::Options opt;
  opt.out_proj = cs.out_proj;
  opt.bias = cs.bias;
  opt.dropout = S(cs.dropout);
  opt.kernel = kernel;
  opt.block_q = cs.block;
  L layer(cs.D, cs.H, rng, opt);
  Rng r2(cs.seed + 200);  // non-zero biases and a less symmetric gate, so that every path carries signal
  for (Param<S>* p : layer.parameters())
    if (p->name.find("bias") != std::string::npos)
      for (Index i = 0; i < p->numel(); ++i) p->value[i] = S(r2.uniform(-0.3, 0.3));
  for (Index i = 0; i < layer.c_gate().numel(); ++i) layer.c_gate().value[i] = S(r2.uniform(-0.8, 0.2));
  return layer;
}

template <class S>
AttnInputs<S> make_attn_inputs(const Case& cs, const Inputs<S>& in) {
  AttnInputs<S> ai(cs.B, cs.Tq, cs.Tk);
  if (cs.mask) ai.set_key_mask(in.km);
  if (cs.oracle) ai.set_oracle(in.oracle);
  if (cs.targets) ai.set_targets(in.target);
  ai.set_gamma_mix(S(cs.gamma));
  return ai;
}

/// Everything a forward + task backward + gate backward produces.
template <class S>
struct Result {
  Mat<S> y, dq, dk, dv;
  std::vector<Vec<S>> grads;  // task gradients, then gate gradients, per parameter
  std::vector<std::string> names;
  S loss_gate = 0;
  GateStats stats;
  AlignedVec<std::int64_t> target;
};

template <class L>
Result<typename L::Scalar> run(L& layer, const Case& cs, Inputs<typename L::Scalar>& in, const Mat<double>& Rd,
                               const Tensor<typename L::Scalar>* frozen = nullptr) {
  using S = typename L::Scalar;
  AttnInputs<S> ai = make_attn_inputs(cs, in);
  Rng drop_rng(99);
  if (cs.dropout > 0) ai.set_training(true, &drop_rng);
  if (frozen) ai.set_frozen_alpha_hat(*frozen);
  typename L::Cache c;
  Result<S> r;
  r.y = cs.cross ? layer.forward(in.q, in.k, in.v, ai, c) : layer.forward(in.q, ai, c);
  const Mat<S> R = Rd.cast<S>();
  layer.zero_grad();
  auto g = layer.backward_inputs(R, c);
  r.dq = g.dq;
  r.dk = g.dk;
  r.dv = g.dv;
  for (Param<S>* p : layer.parameters()) {
    r.grads.push_back(p->grad);
    r.names.push_back(p->name + " (task)");
  }
  layer.zero_grad();
  layer.backward_gate(c);
  for (Param<S>* p : layer.parameters()) {
    r.grads.push_back(p->grad);
    r.names.push_back(p->name + " (gate)");
  }
  r.loss_gate = c.loss_gate;
  r.stats = c.stats;
  r.target = c.target;
  return r;
}

/// max |a - b| / max(max |b|, tiny): the error relative to the tensor's scale.
template <class A, class B>
double rel_diff(const A& a, const B& b) {
  if (b.size() == 0) return a.size() == 0 ? 0.0 : 1.0;
  const double scale = std::max(double(b.cwiseAbs().maxCoeff()), 1e-30);
  return double((a - b).cwiseAbs().maxCoeff()) / scale;
}

/// Runs both kernels on the same inputs and parameters and requires agreement within tol.
template <class L>
void compare_kernels(const Case& cs, double tol) {
  using S = typename L::Scalar;
  L ref = make_layer<L>(cs, DeaKernel::reference);
  L til = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<S> in = make_inputs<S>(cs);
  const Mat<double> R = testing::random_projection(cs.B * cs.Tq, cs.D, cs.seed + 7);
  Tensor<S> frozen;
  if (cs.frozen) {  // a frozen alpha-hat unlike the gate's own
    frozen = Tensor<S>({cs.B, cs.H, cs.Tq, cs.Tk});
    Rng fr(5);
    for (Index i = 0; i < frozen.numel(); ++i) frozen[i] = S(fr.uniform(0, 0.95));
  }
  const Result<S> a = run(ref, cs, in, R, cs.frozen ? &frozen : nullptr);
  const Result<S> b = run(til, cs, in, R, cs.frozen ? &frozen : nullptr);
  REQUIRE(b.y.allFinite());
  CHECK(rel_diff(b.y, a.y) <= tol);
  CHECK(rel_diff(b.dq, a.dq) <= tol);
  CHECK(rel_diff(b.dk, a.dk) <= tol);
  CHECK(rel_diff(b.dv, a.dv) <= tol);
  REQUIRE(a.grads.size() == b.grads.size());
  for (std::size_t k = 0; k < a.grads.size(); ++k) {
    INFO(a.names[k]);
    const double amax = a.grads[k].size() ? double(a.grads[k].cwiseAbs().maxCoeff()) : 0.0;
    if (amax == 0.0)
      CHECK(b.grads[k].cwiseAbs().maxCoeff() == S(0));  // exact zeros stay exact (isolation)
    else
      CHECK(rel_diff(b.grads[k], a.grads[k]) <= tol);
  }
  CHECK(std::abs(double(b.loss_gate) - double(a.loss_gate)) <= tol * std::max(1.0, std::abs(double(a.loss_gate))));
  CHECK(b.stats.n_labelled == a.stats.n_labelled);
  CHECK(b.stats.n_decision_pairs == a.stats.n_decision_pairs);
  CHECK(b.stats.loss_reg == Approx(a.stats.loss_reg).epsilon(tol).margin(tol));
  CHECK(b.stats.loss_spot == Approx(a.stats.loss_spot).epsilon(tol).margin(tol));
  CHECK(b.stats.loss_decision == Approx(a.stats.loss_decision).epsilon(tol).margin(tol));
  if (std::isnan(a.stats.decision_side_acc))
    CHECK(std::isnan(b.stats.decision_side_acc));
  else
    CHECK(b.stats.decision_side_acc == a.stats.decision_side_acc);
  CHECK(b.target == a.target);
  if (cs.oracle) {
    CHECK(a.stats.n_labelled > 0);
  }
}

std::vector<std::pair<std::string, Case>> agreement_cases() {
  std::vector<std::pair<std::string, Case>> out;
  Case c0;
  out.push_back({"no oracle, no mask", c0});
  Case c1;
  c1.oracle = c1.targets = c1.mask = true;
  out.push_back({"oracle + targets + mask (a row with one real key)", c1});
  Case c2 = c1;
  c2.targets = false;
  c2.oracle_per_head = true;
  c2.gamma = 1.0;
  out.push_back({"per-head oracle, oracle winner, gamma 1", c2});
  Case c3 = c1;
  c3.targets_per_head = true;
  c3.gamma = 0.0;
  c3.block = 1;
  out.push_back({"per-head targets, gamma 0, block 1", c3});
  Case c4;
  c4.cross = true;
  c4.Tq = 7;
  c4.Tk = 9;
  c4.oracle = c4.mask = true;
  out.push_back({"cross-attention Tq 7, Tk 9", c4});
  Case c5 = c1;
  c5.out_proj = c5.bias = false;
  c5.block = 4;
  out.push_back({"no out_proj, no bias, block 4", c5});
  Case c6 = c1;
  c6.dropout = 0.3;
  out.push_back({"dropout 0.3 (counter-based mask, same in both kernels)", c6});
  Case c7 = c1;
  c7.frozen = true;
  out.push_back({"frozen alpha-hat hook", c7});
  Case c8 = c1;
  c8.block = 0;
  c8.Tq = c8.Tk = 13;
  out.push_back({"automatic block size", c8});
  Case c9 = c1;
  c9.block = 64;
  out.push_back({"one block larger than Tq", c9});
  return out;
}

}  // namespace

TEST_CASE("tiled kernel agrees with the reference kernel (double, dynamic sizes)", "[dea][tiled]") {
  for (const auto& nc : agreement_cases()) {
    SECTION(nc.first) { compare_kernels<DualExpertAttention<double>>(nc.second, 1e-11); }
  }
}

TEST_CASE("tiled kernel agrees with the reference kernel (double, fixed sizes)", "[dea][tiled]") {
  for (const auto& nc : agreement_cases()) {
    SECTION(nc.first) { compare_kernels<DualExpertAttention<double, 2, 4>>(nc.second, 1e-11); }
  }
}

TEST_CASE("tiled kernel agrees with the reference kernel (float)", "[dea][tiled]") {
  // float: the kernels differ in the blocking of their products, so the results differ by float round-off,
  // amplified by the per-row normalisation (division by sigma) and the softmax
  for (const auto& nc : agreement_cases()) {
    SECTION(nc.first + " dynamic") { compare_kernels<DualExpertAttention<float>>(nc.second, 1e-4); }
    // fixed: <float, 2, 8>, the float compile-time shape the tests share, so these cases run at D = 16
    Case wide = nc.second;
    wide.D = 16;
    SECTION(nc.first + " fixed") { compare_kernels<DualExpertAttention<float, 2, 8>>(wide, 1e-4); }
  }
}

TEST_CASE("tiled kernel: a batch row with every key masked gives zeros, never NaN", "[dea][tiled][mask]") {
  Case cs;
  cs.oracle = true;
  cs.mask = true;
  using L = DualExpertAttention<double>;
  L ref = make_layer<L>(cs, DeaKernel::reference), til = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<double> in = make_inputs<double>(cs);
  for (Index j = 0; j < cs.Tk; ++j) in.km[2 * cs.Tk + j] = 0;  // batch 2: every key padded
  const Mat<double> R = testing::random_projection(cs.B * cs.Tq, cs.D, 3);
  const auto a = run(ref, cs, in, R), b = run(til, cs, in, R);
  REQUIRE(b.y.allFinite());
  REQUIRE(b.dq.allFinite());
  REQUIRE(rel_diff(b.y, a.y) <= 1e-11);
  REQUIRE(rel_diff(b.dq, a.dq) <= 1e-11);
  for (std::size_t k = 0; k < a.grads.size(); ++k) {
    INFO(a.names[k]);
    REQUIRE(b.grads[k].allFinite());
    if (a.grads[k].cwiseAbs().maxCoeff() > 0) REQUIRE(rel_diff(b.grads[k], a.grads[k]) <= 1e-11);
  }
}

namespace {

/// Task path of the tiled kernel by finite differences: every main parameter and every input, alpha-hat held
/// at its unperturbed value through the frozen_alpha_hat hook (taken from the reference kernel's cache).
testing::GradCheckReport tiled_task_gradcheck(const Case& cs) {
  using L = DualExpertAttention<double>;
  L layer = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<double> in = make_inputs<double>(cs);
  AttnInputs<double> ai = make_attn_inputs(cs, in);
  Rng drop_rng(99);
  if (cs.dropout > 0) ai.set_training(true, &drop_rng);
  Tensor<double> frozen({cs.B, cs.H, cs.Tq, cs.Tk});
  {
    L ref = make_layer<L>(cs, DeaKernel::reference);
    L::Cache c;
    drop_rng.reseed(99);
    cs.cross ? ref.forward(in.q, in.k, in.v, ai, c) : ref.forward(in.q, ai, c);
    for (Index i = 0; i < frozen.numel(); ++i) frozen[i] = c.alpha_hat[static_cast<std::size_t>(i)];
  }
  ai.set_frozen_alpha_hat(frozen);
  const Mat<double> R = testing::random_projection(cs.B * cs.Tq, cs.D, cs.seed + 7);
  Mat<double> dq = Mat<double>::Zero(in.q.rows(), in.q.cols()), dk, dv;
  if (cs.cross) {
    dk = Mat<double>::Zero(in.k.rows(), in.k.cols());
    dv = Mat<double>::Zero(in.v.rows(), in.v.cols());
  }
  auto fwd = [&](L::Cache& c) {
    drop_rng.reseed(99);
    return cs.cross ? layer.forward(in.q, in.k, in.v, ai, c) : layer.forward(in.q, ai, c);
  };
  auto objective = [&] {
    L::Cache c;
    return fwd(c).cwiseProduct(R).sum();
  };
  auto analytic = [&] {
    layer.zero_grad();
    L::Cache c;
    fwd(c);
    REQUIRE(c.kernel == DeaKernel::tiled);
    const auto g = layer.backward_inputs(R, c);
    dq = g.dq;
    if (cs.cross) {
      dk = g.dk;
      dv = g.dv;
    } else {
      dq += g.dk;
      dq += g.dv;
    }
  };
  testing::GradCheck gc;
  gc.add_except(layer.parameters(), {"W_gate", "c_gate"});
  gc.add(cs.cross ? "q_in" : "x", in.q.data(), dq.data(), in.q.size());
  if (cs.cross) {
    gc.add("k_in", in.k.data(), dk.data(), in.k.size());
    gc.add("v_in", in.v.data(), dv.data(), in.v.size());
  }
  auto rep = gc.run(objective, analytic);
  analytic();
  REQUIRE(layer.W_gate().grad.cwiseAbs().maxCoeff() == 0.0);  // the task backward never writes the gate
  REQUIRE(layer.c_gate().grad.cwiseAbs().maxCoeff() == 0.0);
  return rep;
}

/// Gate path of the tiled kernel: W_gate and c_gate against loss_gate.
testing::GradCheckReport tiled_gate_gradcheck(const Case& cs) {
  using L = DualExpertAttention<double>;
  L layer = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<double> in = make_inputs<double>(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  auto fwd = [&](L::Cache& c) {
    cs.cross ? layer.forward(in.q, in.k, in.v, ai, c) : layer.forward(in.q, ai, c);
  };
  auto objective = [&] {
    L::Cache c;
    fwd(c);
    return c.loss_gate;
  };
  auto analytic = [&] {
    layer.zero_grad();
    L::Cache c;
    fwd(c);
    layer.backward_gate(c);
    for (Param<double>* p : layer.parameters())
      if (p->group == "main") REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
  };
  testing::GradCheck gc;
  gc.add("W_gate", layer.W_gate().value.data(), layer.W_gate().grad.data(), layer.W_gate().numel());
  gc.add("c_gate", layer.c_gate().value.data(), layer.c_gate().grad.data(), layer.c_gate().numel());
  return gc.run(objective, analytic);
}

}  // namespace

TEST_CASE("tiled kernel: task-path gradients match finite differences", "[dea][tiled][gradcheck]") {
  std::vector<std::pair<std::string, Case>> cases;
  Case c0;
  cases.push_back({"no oracle", c0});
  Case c1;
  c1.oracle = c1.targets = c1.mask = true;
  cases.push_back({"oracle + targets + mask, block 3", c1});
  Case c2;
  c2.cross = true;
  c2.Tk = 9;
  c2.oracle = c2.mask = true;
  c2.block = 2;
  cases.push_back({"cross-attention, block 2", c2});
  Case c3 = c1;
  c3.dropout = 0.3;
  cases.push_back({"dropout 0.3", c3});
  for (const auto& nc : cases) {
    SECTION(nc.first) {
      const auto rep = tiled_task_gradcheck(nc.second);
      INFO(rep.str());
      REQUIRE(rep.ok);
    }
  }
}

TEST_CASE("tiled kernel: gate-loss gradients match finite differences", "[dea][tiled][gradcheck]") {
  std::vector<std::pair<std::string, Case>> cases;
  Case c1;
  c1.oracle = c1.targets = c1.mask = true;
  cases.push_back({"targets + mask", c1});
  Case c2 = c1;
  c2.targets = false;
  c2.oracle_per_head = true;
  cases.push_back({"per-head oracle, oracle winner", c2});
  Case c3;
  c3.cross = true;
  c3.Tk = 9;
  c3.oracle = c3.mask = true;
  c3.block = 2;
  cases.push_back({"cross-attention", c3});
  for (const auto& nc : cases) {
    SECTION(nc.first) {
      const auto rep = tiled_gate_gradcheck(nc.second);
      INFO(rep.str());
      REQUIRE(rep.ok);
    }
  }
}

namespace {
/// The case of the thread-count tests: 40 queries in ragged blocks of 7, 4 heads, mask, oracle and dropout (the
/// caller sets B and D).
Case threads_case() {
  Case cs;
  cs.Tq = cs.Tk = 40;
  cs.H = 4;
  cs.oracle = cs.mask = true;
  cs.dropout = 0.2;
  cs.block = 7;
  return cs;
}
}  // namespace

TEMPLATE_TEST_CASE("tiled kernel: results are bitwise identical for 1 and 2 threads", "[dea][tiled][threads]", float,
                   double) {
  using L = DualExpertAttention<TestType>;
  Case cs = threads_case();
  cs.B = 3;
  cs.D = GENERATE(16, 64);
  L layer = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<TestType> in = make_inputs<TestType>(cs);
  const Mat<double> R = testing::random_projection(cs.B * cs.Tq, cs.D, 4);
  auto all = [&](int threads) {
    set_num_threads(threads);
    const auto r = run(layer, cs, in, R);
    std::vector<TestType> v(r.y.data(), r.y.data() + r.y.size());
    for (const Mat<TestType>* m : {&r.dq, &r.dk, &r.dv}) v.insert(v.end(), m->data(), m->data() + m->size());
    for (const auto& g : r.grads) v.insert(v.end(), g.data(), g.data() + g.size());
    v.push_back(r.loss_gate);
    return v;
  };
  const auto one = all(1);
  const auto two = all(2);
  std::vector<char> pad(1000 + 24 * static_cast<std::size_t>(cs.D));  // shifts the heap before the next run
  const auto again = all(1);
  set_num_threads(2);
  REQUIRE(one.size() == two.size());
  REQUIRE(std::memcmp(one.data(), two.data(), one.size() * sizeof(TestType)) == 0);
  REQUIRE(std::memcmp(one.data(), again.data(), one.size() * sizeof(TestType)) == 0);
}

TEMPLATE_TEST_CASE("self-attention backward: dx is the sum of backward_inputs' three gradients",
                   "[dea][tiled][threads]", float, double) {
  // backward() accumulates dK W_k and dV W_v into dQ W_q in place; with the packed product (>= 64 rows) and
  // D <= 512 that is (dQ W_q + dK W_k) + dV W_v to the bit, and the same for 1 and 2 threads. Fewer rows run
  // Eigen's products: the sum agrees to round-off there.
  using L = DualExpertAttention<TestType>;
  using S = TestType;
  Case cs = threads_case();
  cs.B = GENERATE(1, 3);
  cs.D = GENERATE(16, 64);
  const DeaKernel kernel = GENERATE(DeaKernel::tiled, DeaKernel::reference);
  CAPTURE(cs.B, cs.D, static_cast<int>(kernel));
  L layer = make_layer<L>(cs, kernel);
  Inputs<S> in = make_inputs<S>(cs);
  const Mat<S> R = testing::random_projection(cs.B * cs.Tq, cs.D, 4).cast<S>();
  auto forward = [&](typename L::Cache& c) {
    Rng drop_rng(99);
    AttnInputs<S> ai = make_attn_inputs(cs, in);
    ai.set_training(true, &drop_rng);
    layer.forward(in.q, ai, c);
  };
  auto grads = [&] {
    std::vector<S> v;
    for (Param<S>* p : layer.parameters()) v.insert(v.end(), p->grad.data(), p->grad.data() + p->grad.size());
    return v;
  };
  typename L::Cache c;
  layer.zero_grad();
  forward(c);
  const auto g = layer.backward_inputs(R, c);
  Mat<S> sum = g.dq;
  sum += g.dk;
  sum += g.dv;
  const auto pg_inputs = grads();
  auto self_dx = [&](int threads) {
    set_num_threads(threads);
    typename L::Cache c2;
    layer.zero_grad();
    forward(c2);
    Mat<S> dx = layer.backward(R, c2);
    set_num_threads(2);
    return dx;
  };
  const Mat<S> dx1 = self_dx(1);
  const auto pg_self = grads();
  const Mat<S> dx2 = self_dx(2);
  REQUIRE(dx1.rows() == sum.rows());
  REQUIRE(dx1.cols() == sum.cols());
  REQUIRE(std::memcmp(dx1.data(), dx2.data(), sizeof(S) * std::size_t(dx1.size())) == 0);
  REQUIRE(pg_self.size() == pg_inputs.size());
  REQUIRE(std::memcmp(pg_self.data(), pg_inputs.data(), sizeof(S) * pg_self.size()) == 0);
  if (cs.B * cs.Tq >= ops::packed::kMinRows) {
    REQUIRE(std::memcmp(dx1.data(), sum.data(), sizeof(S) * std::size_t(dx1.size())) == 0);
  } else {
    const double tol = std::is_same<S, float>::value ? 1e-5 : 1e-13;
    REQUIRE(double((dx1 - sum).cwiseAbs().maxCoeff()) <= tol * (1.0 + double(sum.cwiseAbs().maxCoeff())));
  }
}

TEST_CASE("tiled kernel: dropout masks are deterministic and depend on the seed only", "[dea][tiled][dropout]") {
  using L = DualExpertAttention<double>;
  Case cs;
  cs.dropout = 0.4;
  cs.oracle = true;
  L layer = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<double> in = make_inputs<double>(cs);
  AttnInputs<double> ai = make_attn_inputs(cs, in);
  Rng rng(5);
  ai.set_training(true, &rng);
  L::Cache c;
  const Mat<double> y1 = layer.forward(in.q, ai, c);
  rng.reseed(5);
  const Mat<double> y2 = layer.forward(in.q, ai, c);
  const Mat<double> y3 = layer.forward(in.q, ai, c);  // the next seed
  ai.set_training(false);
  const Mat<double> y_eval = layer.forward(in.q, ai, c);
  REQUIRE((y1 - y2).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE((y1 - y3).cwiseAbs().maxCoeff() > 1e-6);
  REQUIRE((y1 - y_eval).cwiseAbs().maxCoeff() > 1e-6);
  // the block size does not change the mask (it is a function of the cell's flat index)
  Case c2 = cs;
  c2.block = 2;
  L other = make_layer<L>(c2, DeaKernel::tiled);
  ai.set_training(true, &rng);
  rng.reseed(5);
  L::Cache c3;
  REQUIRE((other.forward(in.q, ai, c3) - y1).cwiseAbs().maxCoeff() <= 1e-13);
  // the fraction of dropped cells is p
  std::size_t dropped = 0, n = 200000;
  for (std::size_t k = 0; k < n; ++k) dropped += detail::dropout_uniform(77, k) < 0.4;
  REQUIRE(double(dropped) / double(n) == Approx(0.4).margin(0.005));
}

TEST_CASE("tiled kernel: gradient isolation is exact", "[dea][tiled][isolation]") {
  Case cs;
  cs.oracle = cs.targets = cs.mask = true;
  using L = DualExpertAttention<double>;
  L layer = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<double> in = make_inputs<double>(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  const auto rep = layer.verify_gradient_isolation(in.q, ai);
  REQUIRE(rep.task_gate_grad == 0.0);
  REQUIRE(rep.gate_main_grad == 0.0);
  REQUIRE(rep.task_rel_grad > 0.0);
  REQUIRE(rep.gate_gate_grad > 0.0);
  REQUIRE(rep.ok);
}

TEST_CASE("tiled kernel: the cache holds no [Tq, Tk] map", "[dea][tiled][memory]") {
  using L = DualExpertAttention<double>;
  Case cs;
  cs.B = 1;
  cs.H = 2;
  cs.D = 8;
  cs.Tq = cs.Tk = 256;
  cs.oracle = cs.mask = true;
  cs.block = 8;
  L layer = make_layer<L>(cs, DeaKernel::tiled);
  Inputs<double> in = make_inputs<double>(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  L::Cache c;
  layer.forward(in.q, ai, c);
  for (auto* v : {&c.e0n, &c.e1n, &c.logit, &c.alpha_hat, &c.alpha_mix, &c.scores, &c.attn, &c.drop, &c.dlogit_gate,
                  &c.beta, &c.w, &c.d_b, &c.g_reg, &c.g_spot, &c.oracle_ref})
    REQUIRE(v->empty());
  REQUIRE(c.e1_clamped.empty());
  const std::size_t cells = static_cast<std::size_t>(cs.B * cs.H * cs.Tq * cs.Tk);
  // per-thread block scratch: a few [block_q, Tk] buffers and the packed K_h, V_h of one pair per thread, far below
  // one [B, H, Tq, Tk] map. One slice per thread: the bound is per slice. (The packed panels round Dh = 4 up to the
  // kernel's NR columns, 16 doubles with AVX-512, so a slice is 37K values there; two slices exceeded cells / 2.)
  const std::size_t threads = static_cast<std::size_t>(num_threads() < 1 ? 1 : num_threads());
  REQUIRE(c.scratch.size() / threads < cells / 2);
  // the cache shares the caller's oracle through its AttnInputs (backward recomputes alpha_mix from it): one
  // [B, Tq, Tk] tensor, not a copy per layer
  REQUIRE(c.in.has_oracle());
  REQUIRE(c.in.oracle().numel() == in.oracle.numel());
  // the cache's map fields of the reference kernel are released when a cache switches kernels
  L ref = make_layer<L>(cs, DeaKernel::reference);
  L::Cache shared;
  ref.forward(in.q, ai, shared);
  REQUIRE(shared.e0n.size() == cells);
  layer.forward(in.q, ai, shared);
  REQUIRE(shared.e0n.capacity() == 0);
}

}  // namespace test_dea_tiled
