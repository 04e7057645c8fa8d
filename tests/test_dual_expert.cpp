// Tests of DualExpertAttention: finite-difference checks of every parameter and input (task path and gate
// path separately, since each treats the other's quantities as constants), gradient isolation, the
// accumulation contract, thread-count independence, masks, the gate-loss definitions and bad input.
#include <catch2/catch.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <limits>

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

AttnContext<double> make_ctx(const Case& cs, Inputs& in) {
  AttnContext<double> ctx;
  if (cs.mask) ctx.key_mask = &in.km;
  if (cs.oracle) ctx.alpha_oracle = &in.oracle;
  if (cs.targets) ctx.target_idx = &in.target;
  ctx.gamma_mix = cs.gamma;
  return ctx;
}

Mat<double> run_forward(DEA& layer, const Case& cs, Inputs& in, const AttnContext<double>& ctx, DEA::Cache& cache) {
  return cs.cross ? layer.forward(in.q, in.k, in.v, cs.B, ctx, cache) : layer.forward(in.q, cs.B, ctx, cache);
}

/// Task path: every main parameter and every input, alpha-hat held at its unperturbed value.
testing::GradCheckReport check_task_path(const Case& cs) {
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  AttnContext<double> ctx = make_ctx(cs, in);
  Rng drop_rng(99);
  if (cs.dropout > 0) {
    ctx.training = true;
    ctx.rng = &drop_rng;
  }
  DEA::Cache cache;
  run_forward(layer, cs, in, ctx, cache);
  Tensor<double> frozen({cs.B, cs.H, cs.Tq, cs.Tk});
  for (Index k = 0; k < frozen.numel(); ++k) frozen[k] = cache.alpha_hat[static_cast<std::size_t>(k)];
  ctx.frozen_alpha_hat = &frozen;
  const Mat<double> R = testing::random_projection(cs.B * cs.Tq, cs.D, cs.seed + 7);

  Mat<double> dq = Mat<double>::Zero(in.q.rows(), in.q.cols()), dk, dv;
  if (cs.cross) {
    dk = Mat<double>::Zero(in.k.rows(), in.k.cols());
    dv = Mat<double>::Zero(in.v.rows(), in.v.cols());
  }
  auto objective = [&] {
    drop_rng.reseed(99);
    DEA::Cache c;
    return run_forward(layer, cs, in, ctx, c).cwiseProduct(R).sum();
  };
  auto analytic = [&] {
    drop_rng.reseed(99);
    layer.zero_grad();
    DEA::Cache c;
    run_forward(layer, cs, in, ctx, c);
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
  AttnContext<double> ctx = make_ctx(cs, in);
  auto objective = [&] {
    DEA::Cache c;
    run_forward(layer, cs, in, ctx, c);
    return c.loss_gate;
  };
  auto analytic = [&] {
    layer.zero_grad();
    DEA::Cache c;
    run_forward(layer, cs, in, ctx, c);
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
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.tensors[0].max_abs_grad > 1e-6);
    }
  }
}
