// Tests of DualExpertAttention: finite-difference checks of every parameter and input (task path and gate
// path separately, since each treats the other's quantities as constants), gradient isolation, the
// accumulation contract, thread-count independence, masks, the gate-loss definitions and bad input.
#include <catch2/catch.hpp>
#include <dea/attention/dual_expert.hpp>
#include "instances/dual_expert_shapes.hpp"
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <cstring>
#include <limits>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dual_expert {

using namespace dea;
using DEA = DualExpertAttention<double>;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Case {
  Index B = 2, Tq = 5, Tk = 5, D = 8, H = 2;
  bool cross = false, mask = false, oracle = false, oracle_per_head = false, targets = false, targets_per_head = false;
  bool out_proj = true, bias = true;
  double gamma = 0.5, dropout = 0.0;
  std::uint64_t seed = 11;
};

struct Inputs {
  Mat<double> q, k, v;
  Tensor<std::uint8_t> km;
  Tensor<double> oracle;
  Tensor<std::int64_t> target;
};

Inputs make_inputs(const Case& cs) {
  Rng rng(cs.seed);
  Inputs in;
  in.q.resize(cs.B * cs.Tq, cs.D);
  init::normal(in.q, rng, 0, 1);
  if (cs.cross) {
    in.k.resize(cs.B * cs.Tk, cs.D);
    in.v.resize(cs.B * cs.Tk, cs.D);
    init::normal(in.k, rng, 0, 1);
    init::normal(in.v, rng, 0, 1);
  }
  in.km = Tensor<std::uint8_t>({cs.B, cs.Tk}, 1);
  if (cs.mask) {
    in.km[cs.Tk - 1] = 0;                      // batch 0: last key padded
    for (Index j = cs.Tk - 2; j < cs.Tk; ++j) in.km[cs.Tk + j] = 0;  // batch 1: last two padded
  }
  const Index H = cs.H;
  in.oracle = cs.oracle_per_head ? Tensor<double>({cs.B, H, cs.Tq, cs.Tk}) : Tensor<double>({cs.B, cs.Tq, cs.Tk});
  for (Index k = 0; k < in.oracle.numel(); ++k) in.oracle[k] = rng.uniform() < 0.4 ? kNaN : rng.uniform(-0.1, 1.0);
  in.target = cs.targets_per_head ? Tensor<std::int64_t>({cs.B, H, cs.Tq}) : Tensor<std::int64_t>({cs.B, cs.Tq});
  for (Index k = 0; k < in.target.numel(); ++k)
    in.target[k] = rng.uniform() < 0.3 ? -1 : static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(cs.Tk)));
  // make sure most targets are labelled cells so that rows are active
  if (cs.targets) {
    for (Index k = 0; k < in.target.numel(); ++k) {
      if (in.target[k] < 0) continue;
      const Index i = k % cs.Tq, b = k / (in.target.numel() / cs.B);
      const Index hh = cs.targets_per_head ? (k / cs.Tq) % H : 0;
      const Index cell = cs.oracle_per_head ? ((b * H + hh) * cs.Tq + i) * cs.Tk + in.target[k]
                                            : (b * cs.Tq + i) * cs.Tk + in.target[k];
      if (std::isnan(in.oracle[cell])) in.oracle[cell] = 0.3 + 0.5 * rng.uniform();
    }
  }
  return in;
}

DEA make_layer(const Case& cs) {
  Rng rng(cs.seed + 100);
  DEA::Options opt;
  opt.out_proj = cs.out_proj;
  opt.bias = cs.bias;
  opt.dropout = cs.dropout;
  DEA layer(cs.D, cs.H, rng, opt);
  // non-zero biases and a less symmetric gate, so that every path carries signal
  for (Param<double>* p : layer.parameters())
    if (p->name.find("bias") != std::string::npos) init::uniform(p->value, rng, -0.3, 0.3);
  init::uniform(layer.c_gate().value, rng, -0.8, 0.2);
  return layer;
}

AttnInputs<double> make_attn_inputs(const Case& cs, const Inputs& in) {
  AttnInputs<double> ai(cs.B, cs.Tq, cs.Tk);
  if (cs.mask) ai.set_key_mask(in.km);
  if (cs.oracle) ai.set_oracle(in.oracle);
  if (cs.targets) ai.set_targets(in.target);
  ai.set_gamma_mix(cs.gamma);
  return ai;
}

Mat<double> run_forward(DEA& layer, const Case& cs, Inputs& in, const AttnInputs<double>& ai, DEA::Cache& cache) {
  return cs.cross ? layer.forward(in.q, in.k, in.v, ai, cache) : layer.forward(in.q, ai, cache);
}

/// Task path: every main parameter and every input, alpha-hat held at its unperturbed value.
testing::GradCheckReport check_task_path(const Case& cs) {
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  AttnInputs<double> ai = make_attn_inputs(cs, in);
  Rng drop_rng(99);
  if (cs.dropout > 0) ai.set_training(true, &drop_rng);
  DEA::Cache cache;
  run_forward(layer, cs, in, ai, cache);
  Tensor<double> frozen({cs.B, cs.H, cs.Tq, cs.Tk});
  for (Index k = 0; k < frozen.numel(); ++k) frozen[k] = cache.alpha_hat[static_cast<std::size_t>(k)];
  ai.set_frozen_alpha_hat(frozen);
  const Mat<double> R = testing::random_projection(cs.B * cs.Tq, cs.D, cs.seed + 7);

  Mat<double> dq = Mat<double>::Zero(in.q.rows(), in.q.cols()), dk, dv;
  if (cs.cross) {
    dk = Mat<double>::Zero(in.k.rows(), in.k.cols());
    dv = Mat<double>::Zero(in.v.rows(), in.v.cols());
  }
  auto objective = [&] {
    drop_rng.reseed(99);
    DEA::Cache c;
    return run_forward(layer, cs, in, ai, c).cwiseProduct(R).sum();
  };
  auto analytic = [&] {
    drop_rng.reseed(99);
    layer.zero_grad();
    DEA::Cache c;
    run_forward(layer, cs, in, ai, c);
    if (cs.cross) {
      // copy into the registered buffers (assigning a temporary would move a new buffer in)
      const auto g = layer.backward_inputs(R, c);
      dq = g.dq;
      dk = g.dk;
      dv = g.dv;
    } else {
      const Mat<double> g = layer.backward(R, c);
      dq = g;
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
  // the task backward never writes the gate's parameters
  analytic();
  REQUIRE(layer.W_gate().grad.cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(layer.c_gate().grad.cwiseAbs().maxCoeff() == 0.0);
  return rep;
}

/// Gate path: W_gate and c_gate against loss_gate (Q, K, E~ are constants of the gate by construction).
testing::GradCheckReport check_gate_path(const Case& cs) {
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  auto objective = [&] {
    DEA::Cache c;
    run_forward(layer, cs, in, ai, c);
    return c.loss_gate;
  };
  auto analytic = [&] {
    layer.zero_grad();
    DEA::Cache c;
    run_forward(layer, cs, in, ai, c);
    layer.backward_gate(c);
    for (Param<double>* p : layer.parameters())
      if (p->group == "main") REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
  };
  testing::GradCheck gc;
  gc.add("W_gate", layer.W_gate().value.data(), layer.W_gate().grad.data(),
         layer.W_gate().numel());
  gc.add("c_gate", layer.c_gate().value.data(), layer.c_gate().grad.data(), layer.c_gate().numel());
  return gc.run(objective, analytic);
}

}  // namespace

TEST_CASE("DEA task-path gradients match finite differences", "[dea][gradcheck]") {
  std::vector<std::pair<std::string, Case>> cases;
  Case c0;
  cases.push_back({"inference path (no oracle)", c0});
  Case c1;
  c1.oracle = true;
  c1.targets = true;
  c1.gamma = 0.5;
  cases.push_back({"oracle + targets, gamma 0.5", c1});
  Case c2 = c1;
  c2.mask = true;
  c2.gamma = 0.0;
  cases.push_back({"mask, gamma 0", c2});
  Case c3 = c1;
  c3.mask = true;
  c3.gamma = 1.0;
  c3.targets = false;
  cases.push_back({"mask, gamma 1, oracle winner", c3});
  Case c4 = c1;
  c4.oracle_per_head = true;
  c4.targets_per_head = true;
  cases.push_back({"per-head oracle and targets", c4});
  Case c5;
  c5.cross = true;
  c5.Tk = 7;
  c5.oracle = true;
  c5.mask = true;
  cases.push_back({"cross-attention Tq != Tk", c5});
  Case c6 = c1;
  c6.out_proj = false;
  c6.bias = false;
  cases.push_back({"no out_proj, no bias", c6});
  Case c7 = c1;
  c7.dropout = 0.3;
  cases.push_back({"dropout 0.3 (fixed mask)", c7});
  Case c8 = c1;
  c8.H = 4;
  c8.D = 8;  // Dh = 2
  c8.B = 3;
  c8.mask = true;
  cases.push_back({"4 heads of size 2", c8});
  for (auto& [name, cs] : cases) {
    SECTION(name) {
      auto rep = check_task_path(cs);
      WARN(name << ": worst relative error " << rep.worst_rel_error);
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.tensors.size() >= 3);
    }
  }
}

TEST_CASE("DEA gate-loss gradients match finite differences", "[dea][gradcheck]") {
  Case base;
  base.oracle = true;
  for (int variant = 0; variant < 4; ++variant) {
    Case cs = base;
    cs.targets = variant % 2 == 0;
    cs.mask = variant >= 2;
    cs.oracle_per_head = variant == 3;
    cs.seed = 20 + static_cast<std::uint64_t>(variant);
    SECTION("variant " + std::to_string(variant)) {
      auto rep = check_gate_path(cs);
      WARN("gate variant " << variant << ": worst relative error " << rep.worst_rel_error);
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.tensors[0].max_abs_grad > 1e-6);
    }
  }
}

TEST_CASE("DEA gradient isolation is exact", "[dea][isolation]") {
  Case cs;
  cs.oracle = true;
  cs.targets = true;
  cs.mask = true;
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  const auto rep = layer.verify_gradient_isolation(in.q, ai);
  REQUIRE(rep.task_gate_grad == 0.0);
  REQUIRE(rep.gate_main_grad == 0.0);
  REQUIRE(rep.task_rel_grad > 0.0);
  REQUIRE(rep.gate_gate_grad > 0.0);
  REQUIRE(rep.ok);
  // the check leaves the gradients cleared
  for (Param<double>* p : layer.parameters()) REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("DEA backward accumulates into parameter gradients", "[dea][contract]") {
  Case cs;
  cs.oracle = true;
  cs.mask = true;
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  const Mat<double> R = testing::random_projection(cs.B * cs.Tq, cs.D, 3);
  DEA::Cache c;
  layer.zero_grad();
  layer.forward(in.q, ai, c);
  layer.backward(R, c);
  layer.backward_gate(c);
  std::vector<Vec<double>> once;
  for (Param<double>* p : layer.parameters()) once.push_back(p->grad);
  layer.backward(R, c);
  layer.backward_gate(c);
  std::size_t k = 0;
  for (Param<double>* p : layer.parameters()) {
    INFO(p->name);
    REQUIRE(once[k].cwiseAbs().maxCoeff() > 0);  // every parameter receives a gradient
    REQUIRE((p->grad - 2 * once[k]).cwiseAbs().maxCoeff() <= 1e-12 * once[k].cwiseAbs().maxCoeff());
    ++k;
  }
  layer.zero_grad();
  for (Param<double>* p : layer.parameters()) REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
}

/// One forward, task and gate backward of layer type L at 1, 2 and again 1 thread: every output, gradient and the
/// gate loss must be the same bits.
template <class L>
void require_thread_invariance(Index D, Index H) {
  using TestType = typename L::Scalar;
  const Index B = 3, T = 40;
  Rng rng(5);
  L layer(D, H, rng);
  Mat<TestType> x(B * T, D);
  init::normal(x, rng, 0, 1);
  Tensor<TestType> oracle({B, T, T}, std::numeric_limits<TestType>::quiet_NaN());
  for (Index b = 0; b < B; ++b)
    for (Index i = 1; i < 15; ++i)
      for (Index j = 20; j < 35; ++j) oracle[(b * T + i) * T + j] = TestType(rng.uniform(0, 0.95));
  Tensor<std::uint8_t> km({B, T}, 1);
  for (Index j = 36; j < T; ++j) km[T + j] = 0;
  AttnInputs<TestType> in(B, T);
  in.set_oracle(oracle).set_key_mask(km).set_gamma_mix(TestType(0.5));
  Mat<TestType> dy(B * T, D);
  init::normal(dy, rng, 0, 1);
  auto run = [&](int threads) {
    set_num_threads(threads);
    typename L::Cache c;
    layer.zero_grad();
    Mat<TestType> y = layer.forward(x, in, c);
    Mat<TestType> dx = layer.backward(dy, c);
    layer.backward_gate(c);
    std::vector<TestType> all(y.data(), y.data() + y.size());
    all.insert(all.end(), dx.data(), dx.data() + dx.size());
    for (Param<TestType>* p : layer.parameters()) all.insert(all.end(), p->grad.data(), p->grad.data() + p->numel());
    all.push_back(c.loss_gate);
    return all;
  };
  const auto one = run(1);
  const auto two = run(2);
  std::vector<char> pad(1000 + 24 * static_cast<std::size_t>(D));  // shifts the heap before the next run
  const auto again = run(1);
  set_num_threads(2);
  REQUIRE(one.size() == two.size());
  REQUIRE(std::memcmp(one.data(), two.data(), one.size() * sizeof(TestType)) == 0);
  REQUIRE(std::memcmp(one.data(), again.data(), one.size() * sizeof(TestType)) == 0);
}

TEMPLATE_TEST_CASE("DEA results are bitwise identical for 1 and 2 threads", "[dea][threads]", float, double) {
  const Index D = GENERATE(16, 64);  // head sizes 4 and 16: vector reductions over slices of the cache
  require_thread_invariance<DualExpertAttention<TestType>>(D, 4);
}

TEST_CASE("DEA with compile-time sizes: results are bitwise identical for 1 and 2 threads", "[dea][threads]") {
  // the fixed-size head loops and (a head of one AVX-512 vector of doubles) the narrow product tile
  require_thread_invariance<DualExpertAttention<float, 2, 8>>(16, 2);
  require_thread_invariance<DualExpertAttention<double, 2, 8>>(16, 2);
}

TEST_CASE("DEA masks: padded keys read 0, rows normalised, fully masked rows give zeros", "[dea][mask]") {
  const Index B = 2, T = 6, D = 16, H = 2;
  Rng rng(9);
  DEA layer(D, H, rng);
  Mat<double> x(B * T, D);
  init::normal(x, rng, 0, 1);
  Tensor<std::uint8_t> km({B, T}, 1);
  km[4] = km[5] = 0;                          // batch 0: two padded keys
  for (Index j = 0; j < T; ++j) km[T + j] = 0;  // batch 1: every key padded
  AttnInputs<double> in(B, T);
  in.set_key_mask(km);
  DEA::Cache c;
  const Mat<double> y = layer.forward(x, in, c);
  REQUIRE(y.allFinite());
  for (Index h = 0; h < H; ++h)
    for (Index i = 0; i < T; ++i) {
      const Index base = c.cell(0, h, i, 0, H);
      double m0 = 0, m1 = 0, v0 = 0, v1 = 0, psum = 0;
      for (Index j = 0; j < 4; ++j) {
        m0 += c.e0n[base + j];
        m1 += c.e1n[base + j];
        psum += c.attn[base + j];
      }
      for (Index j = 0; j < 4; ++j) {
        v0 += std::pow(c.e0n[base + j] - m0 / 4, 2);
        v1 += std::pow(c.e1n[base + j] - m1 / 4, 2);
      }
      REQUIRE(std::abs(m0 / 4) < 1e-12);
      REQUIRE(std::abs(m1 / 4) < 1e-12);
      // biased std of E~ = sigma / (sigma + 1e-5)
      const double s0 = c.sigma0[(0 * H + h) * T + i], s1 = c.sigma1[(0 * H + h) * T + i];
      REQUIRE(std::sqrt(v0 / 4) == Approx(s0 / (s0 + 1e-5)).epsilon(1e-10));
      REQUIRE(std::sqrt(v1 / 4) == Approx(s1 / (s1 + 1e-5)).epsilon(1e-10));
      REQUIRE(psum == Approx(1.0).epsilon(1e-12));
      for (Index j = 4; j < T; ++j) {
        REQUIRE(c.e0n[base + j] == 0.0);
        REQUIRE(c.e1n[base + j] == 0.0);
        REQUIRE(c.attn[base + j] == 0.0);
      }
      // batch 1: every key padded -> zero probabilities, zero context
      for (Index j = 0; j < T; ++j) REQUIRE(c.attn[c.cell(1, h, i, j, H)] == 0.0);
    }
  REQUIRE(c.ctx.bottomRows(T).cwiseAbs().maxCoeff() == 0.0);
  const Mat<double> dx = layer.backward(Mat<double>::Ones(B * T, D), c);
  REQUIRE(dx.allFinite());
}

TEST_CASE("DEA gate: alpha-hat <= 0.95, beta is the exact crossing, the loss recomputes from its parts", "[dea][gate]") {
  Case cs;
  cs.oracle = true;
  cs.B = 3;
  cs.Tq = cs.Tk = 8;
  cs.mask = true;
  DEA layer = make_layer(cs);
  layer.c_gate().value[1] = 6.0;  // head 1 saturates: sigmoid > 0.95 everywhere
  Inputs in = make_inputs(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  DEA::Cache c;
  layer.forward(in.q, ai, c);
  const Index H = cs.H, T = cs.Tq;
  double reg = 0, spot = 0;
  Index n_has = 0, n_valid = 0, n_side = 0;
  for (Index b = 0; b < cs.B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T; ++i) {
        const Index t = c.target[static_cast<std::size_t>((b * H + h) * T + i)];
        for (Index j = 0; j < T; ++j) {
          const Index k = c.cell(b, h, i, j, H);
          REQUIRE(c.alpha_hat[k] <= 0.95);
          REQUIRE(c.alpha_hat[k] > 0.0);
          if (h == 1) {
            REQUIRE(c.alpha_hat[k] == 0.95);
            REQUIRE(c.dlogit_gate[k] == 0.0);  // a saturated alpha-hat gets no gate gradient
          }
          if (!std::isnan(c.oracle_ref[k])) {
            reg += std::pow(c.alpha_hat[k] - c.oracle_ref[k], 2);
            ++n_has;
          }
          if (std::isnan(c.beta[k])) continue;
          // a valid pair: beta in [0, 1] where the lines S*_t and S*_p cross
          REQUIRE(t >= 0);
          REQUIRE(j != t);
          REQUIRE(in.km[b * T + j] == 1);
          const double beta = c.beta[k];
          REQUIRE(beta >= 0.0);
          REQUIRE(beta <= 1.0);
          const Index kt = c.cell(b, h, i, t, H);
          const double st = (1 - beta) * c.e0n[kt] + beta * c.e1n[kt];
          const double sp = (1 - beta) * c.e0n[k] + beta * c.e1n[k];
          REQUIRE(std::abs(st - sp) < 1e-5);
          const double a_t = c.oracle_ref[kt], ah_t = c.alpha_hat[kt];
          const double d_b = std::sqrt((a_t - beta) * (a_t - beta) + 1e-4);
          REQUIRE(c.d_b[k] == Approx(d_b).epsilon(1e-14));
          REQUIRE(d_b >= 0.01);
          const double w = 1 + 2 * std::exp(-d_b / 0.1);
          REQUIRE(c.w[k] == Approx(w).epsilon(1e-14));
          REQUIRE(w <= 1 + 2 * std::exp(-0.1) + 1e-15);
          const double sb = std::tanh((a_t - beta) / 0.05);
          spot += w * std::pow(ah_t - a_t, 2) + 0.5 * std::log1p(std::exp(-sb * (ah_t - beta) / 0.1));
          ++n_valid;
          if ((ah_t - beta) * (a_t - beta) > 0) ++n_side;
        }
      }
  REQUIRE(n_has > 0);
  REQUIRE(n_valid > 10);
  REQUIRE(c.stats.n_decision_pairs == n_valid);
  REQUIRE(c.stats.n_labelled == n_has);
  REQUIRE(c.stats.loss_reg == Approx(reg / n_has).epsilon(1e-12));
  REQUIRE(c.stats.loss_spot == Approx(spot / n_valid).epsilon(1e-12));
  REQUIRE(c.loss_gate == Approx(reg / n_has + spot / n_valid).epsilon(1e-12));
  REQUIRE(c.stats.decision_side_acc == Approx(double(n_side) / n_valid).epsilon(1e-12));
}

TEST_CASE("DEA gate: given targets are used where labelled; oracle winner otherwise", "[dea][gate]") {
  Case cs;
  cs.oracle = true;
  cs.targets = true;
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  DEA::Cache c;
  layer.forward(in.q, ai, c);
  const Index H = cs.H, T = cs.Tq;
  Index active = 0;
  for (Index b = 0; b < cs.B; ++b)
    for (Index i = 0; i < T; ++i) {
      const std::int64_t given = in.target[b * T + i];
      const bool labelled = given >= 0 && !std::isnan(in.oracle[(b * T + i) * T + given]);
      for (Index h = 0; h < H; ++h) {
        const std::int64_t t = c.target[static_cast<std::size_t>((b * H + h) * T + i)];
        REQUIRE(t == (labelled ? given : -1));
        active += labelled;
      }
    }
  REQUIRE(active > 0);
  // oracle winner: the labelled key with the largest S* = (1 - a) E0~ + a E1~, per head
  Case no_targets = cs;
  no_targets.targets = false;
  layer.forward(in.q, make_attn_inputs(no_targets, in), c);
  for (Index b = 0; b < cs.B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T; ++i) {
        Index best = -1;
        double bv = -INFINITY;
        for (Index j = 0; j < T; ++j) {
          const double o = in.oracle[(b * T + i) * T + j];
          if (std::isnan(o)) continue;
          const double a = std::min(std::max(o, 0.0), 0.95);
          const Index k = c.cell(b, h, i, j, H);
          const double s = (1 - a) * c.e0n[k] + a * c.e1n[k];
          if (s > bv) {
            bv = s;
            best = j;
          }
        }
        REQUIRE(c.target[static_cast<std::size_t>((b * H + h) * T + i)] == best);
      }
}

TEST_CASE("DEA without an oracle: zero gate loss, scores are S~ and backward_gate is a no-op", "[dea]") {
  Case cs;
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  DEA::Cache c;
  layer.forward(in.q, AttnInputs<double>(cs.B, cs.Tq), c);
  REQUIRE(c.loss_gate == 0.0);
  for (std::size_t k = 0; k < c.scores.size(); ++k)
    REQUIRE(c.scores[k] == Approx((1 - c.alpha_hat[k]) * c.e0n[k] + c.alpha_hat[k] * c.e1n[k]).margin(1e-15));
  layer.zero_grad();
  layer.backward_gate(c);
  REQUIRE(layer.W_gate().grad.cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("DEA gamma 1 with a fully labelled oracle mixes the oracle alone", "[dea]") {
  Case cs;
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  Tensor<double> oracle({cs.B, cs.Tq, cs.Tk});
  Rng r(4);
  for (Index k = 0; k < oracle.numel(); ++k) oracle[k] = r.uniform(-0.2, 1.2);  // clamped to [0, 0.95]
  AttnInputs<double> ai(cs.B, cs.Tq, cs.Tk);
  ai.set_oracle(oracle).set_gamma_mix(1.0);
  DEA::Cache c;
  layer.forward(in.q, ai, c);
  for (Index b = 0; b < cs.B; ++b)
    for (Index h = 0; h < cs.H; ++h)
      for (Index i = 0; i < cs.Tq; ++i)
        for (Index j = 0; j < cs.Tk; ++j) {
          const double a = std::min(std::max(oracle[(b * cs.Tq + i) * cs.Tk + j], 0.0), 0.95);
          REQUIRE(c.alpha_mix[c.cell(b, h, i, j, cs.H)] == Approx(a).margin(1e-15));
        }
}

TEST_CASE("DEA bad input: each is a dea::Error naming the argument, expected and actual", "[dea][errors]") {
  Rng rng(1);
  REQUIRE_THROWS_WITH(DEA(30, 4, rng), Catch::Contains("d_model (30)") && Catch::Contains("n_heads (4)"));
  REQUIRE_THROWS_AS(DEA(0, 1, rng), Error);
  REQUIRE_THROWS_WITH((DualExpertAttention<double, 2, 4>(16, 2, rng)), Catch::Contains("compile-time 4") &&
                                                                          Catch::Contains("got 8"));
  DEA layer(16, 2, rng);
  Mat<double> x = Mat<double>::Zero(2 * 5, 16);
  const AttnInputs<double> plain(2, 5);
  DEA::Cache c;
  Mat<double> bad_cols = Mat<double>::Zero(10, 12);
  REQUIRE_THROWS_WITH(layer.forward(bad_cols, plain, c), Catch::Contains("x") && Catch::Contains("16 columns") &&
                                                             Catch::Contains("got 12"));
  REQUIRE_THROWS_WITH(layer.forward(x, AttnInputs<double>(3, 5), c), Catch::Contains("x: expected 15 rows") &&
                                                                         Catch::Contains("got 10"));
  AttnInputs<double> in(2, 5);
  Tensor<std::uint8_t> km({2, 4}, 1);
  REQUIRE_THROWS_WITH(in.set_key_mask(km), Catch::Contains("AttnInputs::set_key_mask: key_mask") &&
                                               Catch::Contains("[2, 5]") && Catch::Contains("[2, 4]"));
  Tensor<double> oracle({2, 5, 4}, 0.5);
  REQUIRE_THROWS_WITH(in.set_oracle(oracle), Catch::Contains("AttnInputs::set_oracle: alpha") &&
                                                 Catch::Contains("[2, 5, 5]") && Catch::Contains("[2, 5, 4]"));
  Tensor<double> good_oracle({2, 5, 5}, 0.5);
  in.set_oracle(good_oracle);
  Tensor<std::int64_t> target({2, 5}, 0);
  target[3] = 5;
  REQUIRE_THROWS_WITH(in.set_targets(target), Catch::Contains("AttnInputs::set_targets: target") &&
                                                  Catch::Contains("got 5"));
  target[3] = -2;
  REQUIRE_THROWS_WITH(in.set_targets(target), Catch::Contains("AttnInputs::set_targets: target") &&
                                                  Catch::Contains("got -2"));
  target[3] = 1;
  in.set_targets(target);
  REQUIRE_THROWS_WITH(in.set_gamma_mix(1.5), Catch::Contains("gamma_mix"));
  in.set_gamma_mix(0.5);
  REQUIRE_NOTHROW(layer.forward(x, in, c));
  x(7, 3) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(layer.forward(x, in, c), Catch::Contains("x: non-finite") && Catch::Contains("row 7"));
  x(7, 3) = 0;
  Tensor<std::int64_t> t2({2, 5}, 0);
  REQUIRE_THROWS_WITH(AttnInputs<double>(2, 5).set_targets(t2), Catch::Contains("AttnInputs::set_targets") &&
                                                                    Catch::Contains("without an oracle"));
  DEA::Options o;
  o.dropout = 0.2;
  DEA drop_layer(16, 2, rng, o);
  AttnInputs<double> training(2, 5);
  training.set_training(true);
  REQUIRE_THROWS_WITH(drop_layer.forward(x, training, c), Catch::Contains("needs an Rng") &&
                                                              Catch::Contains("AttnInputs::set_training"));
  DEA::Cache empty;
  REQUIRE_THROWS_WITH(layer.backward(x, empty), Catch::Contains("no forward"));
}

/// Runs a layer with compile-time sizes and the dynamic-size layer (same seed, same options) on the same input and
/// oracle, forward with gamma 0.5 (training with its own, equally seeded dropout RNG when dropout > 0), task and
/// gate backward; requires the outputs, input gradients, every parameter gradient and the gate loss to agree.
template <class Fixed>
void require_fixed_matches_dynamic(Index D, Index H, Index T, double dropout, DeaKernel kernel) {
  typename Fixed::Options of;
  DualExpertAttention<double>::Options od;
  of.dropout = od.dropout = dropout;
  of.kernel = od.kernel = kernel;
  Rng r1(3), r2(3);
  Fixed fixed(D, H, r1, of);
  DualExpertAttention<double> dyn(D, H, r2, od);
  Rng rng(8);
  Mat<double> x(2 * T, D);
  init::normal(x, rng, 0, 1);
  Tensor<double> oracle({2, T, T}, 0.3);
  AttnInputs<double> in(2, T);
  in.set_oracle(oracle).set_gamma_mix(0.5);
  Rng d1(21), d2(21);
  typename Fixed::Cache cf;
  DualExpertAttention<double>::Cache cd;
  in.set_training(dropout > 0, &d1);
  const Mat<double> yf = fixed.forward(x, in, cf);
  in.set_training(dropout > 0, &d2);
  const Mat<double> yd = dyn.forward(x, in, cd);
  REQUIRE(yf.allFinite());
  REQUIRE((yf - yd).cwiseAbs().maxCoeff() < 1e-13);
  const Mat<double> gf = fixed.backward(yf, cf), gd = dyn.backward(yd, cd);
  REQUIRE((gf - gd).cwiseAbs().maxCoeff() < 1e-12);
  fixed.backward_gate(cf);
  dyn.backward_gate(cd);
  REQUIRE(cf.loss_gate == Approx(cd.loss_gate).epsilon(1e-13));
  const auto pf = fixed.parameters(), pd = dyn.parameters();
  REQUIRE(pf.size() == pd.size());
  for (std::size_t k = 0; k < pf.size(); ++k) {
    INFO(pf[k]->name);
    REQUIRE((pf[k]->grad - pd[k]->grad).cwiseAbs().maxCoeff() < 1e-12);
  }
}

TEST_CASE("DEA fixed sizes give the same results as dynamic sizes", "[dea]") {
  // <double, 2, 4>: the compile-time shape the tests share (an instance compiled once, cmake/instances.cmake)
  require_fixed_matches_dynamic<DualExpertAttention<double, 2, 4>>(8, 2, 7, 0.0, DeaKernel::reference);
}

TEST_CASE("DEA heads of one AVX-512 vector at fixed size (DHead = 8 doubles) match dynamic sizes", "[dea]") {
  // a fixed head width of one vector runs the per-head products on a tile of 16 rows by one vector
  // (ops/block_product.hpp) where AVX-512 is compiled in; elsewhere on the default tile, as dynamic sizes do
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    CAPTURE(kernel == DeaKernel::tiled ? "tiled" : "reference");
    require_fixed_matches_dynamic<DualExpertAttention<double, 2, 8>>(16, 2, 37, 0.2, kernel);
  }
}

TEST_CASE("DEA one-dimensional heads at fixed size (DHead = 1) match dynamic sizes, with dropout", "[dea]") {
  // DHead = 1, the smallest fixed head width: the kernels' fixed-size head vectors and W_rel products are 1 x 1
  // (Eigen's scalar-like special cases): every kernel path must still compile and agree with the dynamic-size
  // layer, dropout masks included (same seed, same counter-based mask).
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    CAPTURE(kernel == DeaKernel::tiled ? "tiled" : "reference");
    require_fixed_matches_dynamic<DualExpertAttention<double, 2, 1>>(2, 2, 6, 0.3, kernel);
  }
}

TEST_CASE("DEA honours causal masking instead of ignoring it", "[dea]") {
  // (the causal mode itself is tested in test_dea_causal.cpp) the flag changes the result: the first query,
  // which sees only key 0, differs from the bidirectional one
  Rng rng(3);
  DEA layer(8, 2, rng);
  Mat<double> x(2 * 5, 8);
  init::normal(x, rng, 0, 1);
  DEA::Cache c;
  AttnInputs<double> in(2, 5);
  const Mat<double> y_full = layer.forward(x, in, c);
  in.set_causal(true);
  const Mat<double> y_causal = layer.forward(x, in, c);
  REQUIRE((y_causal.row(0) - y_full.row(0)).cwiseAbs().maxCoeff() > 1e-6);
  REQUIRE(y_causal.row(4) == y_full.row(4));  // the last query sees every key either way
}

TEST_CASE("DEA: the cache shares the oracle of the inputs", "[dea]") {
  Rng rng(5);
  const Index B = 2, T = 6;
  Mat<double> x(B * T, 8);
  init::normal(x, rng, 0, 1);
  Tensor<std::uint8_t> km({B, T}, 1);
  km[T - 1] = 0;
  Tensor<double> oracle({B, T, T}, std::numeric_limits<double>::quiet_NaN());
  for (Index k = 0; k < oracle.numel(); k += 3) oracle[k] = 0.1 * double(k % 7);
  AttnInputs<double> in(B, T);
  in.set_key_mask(km).set_oracle(oracle).set_gamma_mix(0.5);
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    CAPTURE(kernel == DeaKernel::tiled ? "tiled" : "reference");
    DEA::Options opt;
    opt.kernel = kernel;
    Rng r1(9);
    DEA l(8, 2, r1, opt);
    DEA::Cache b;
    const Mat<double> yb = l.forward(x, in, b);
    REQUIRE(yb.allFinite());
    // one oracle tensor for the inputs and every cache that read them
    REQUIRE(&b.in.oracle() == &in.oracle());
  }
}

}  // namespace test_dual_expert
