// Tests of causal Dual-Expert attention (AttnInputs::set_causal) and incremental decoding (forward_decode):
// the forward against a reference written here from the formulas (double, query i sees keys j <= i), gate loss
// included; finite-difference checks of every parameter and input (task path, gate path, no oracle); exact
// isolation; invisible cells change nothing; thread-count independence; key masks and the first query; both
// kernels; decoding against the full causal forward; bad input. The same for RoPE (Options::rope_theta), causal
// and not, against a reference that rotates the key by the relative offset j - i only.
#include <catch2/catch.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dea_causal {

using namespace dea;
using DEA = DualExpertAttention<double>;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Case {
  Index B = 2, T = 6, D = 8, H = 2;
  bool mask = false, oracle = false, targets = false;
  bool out_proj = true, bias = true;
  double gamma = 0.5, dropout = 0.0;
  DeaKernel kernel = DeaKernel::reference;
  Index block_q = 0;
  std::uint64_t seed = 31;
  double rope = 0;      // Options::rope_theta
  bool causal = true;   // false: bidirectional (the RoPE cases)
};

struct Inputs {
  Mat<double> x;
  Tensor<std::uint8_t> km;
  Tensor<double> oracle;  // [B, T, T]
  Tensor<std::int64_t> target;  // [B, T]
};

Inputs make_inputs(const Case& cs) {
  Rng rng(cs.seed);
  Inputs in;
  const Index B = cs.B, T = cs.T;
  in.x.resize(B * T, cs.D);
  init::normal(in.x, rng, 0, 1);
  in.km = Tensor<std::uint8_t>({B, T}, 1);
  if (cs.mask) {
    in.km[2] = 0;                      // batch 0: key 2 padded (a hole inside the visible range of later queries)
    in.km[T + T - 1] = 0;              // batch 1: last key padded
    if (B > 1) in.km[T + 0] = 0;       // batch 1: key 0 padded, so that query 0 sees no real key
  }
  in.oracle = Tensor<double>({B, T, T}, kNaN);
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; ++j)  // labels on visible and on invisible cells (j > i: ignored)
        if (rng.uniform() < 0.5) in.oracle[(b * T + i) * T + j] = rng.uniform(-0.1, 1.0);
  in.target = Tensor<std::int64_t>({B, T}, -1);
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < T; ++i) {
      const double u = rng.uniform();
      if (u < 0.2) continue;                     // no target
      if (u > 0.9 && i + 1 < T) {                // a target the query may not see (ignored)
        in.target[b * T + i] = static_cast<std::int64_t>(i + 1);
        continue;
      }
      const Index t = static_cast<Index>(rng.below(static_cast<std::uint64_t>(i + 1)));
      in.target[b * T + i] = static_cast<std::int64_t>(t);
      double& o = in.oracle[(b * T + i) * T + t];
      if (std::isnan(o)) o = 0.3 + 0.5 * rng.uniform();  // most targets labelled: the rows are active
    }
  return in;
}

DEA make_layer(const Case& cs) {
  Rng rng(cs.seed + 100);
  DEA::Options opt;
  opt.out_proj = cs.out_proj;
  opt.bias = cs.bias;
  opt.dropout = cs.dropout;
  opt.kernel = cs.kernel;
  opt.block_q = cs.block_q;
  opt.rope_theta = cs.rope;
  DEA layer(cs.D, cs.H, rng, opt);
  // non-zero biases and a less symmetric gate, so that every path carries signal
  for (Param<double>* p : layer.parameters())
    if (p->name.find("bias") != std::string::npos) init::uniform(p->value, rng, -0.3, 0.3);
  init::uniform(layer.c_gate().value, rng, -0.8, 0.2);
  return layer;
}

AttnInputs<double> make_attn_inputs(const Case& cs, const Inputs& in) {
  AttnInputs<double> ai(cs.B, cs.T);
  ai.set_causal(cs.causal);
  if (cs.mask) ai.set_key_mask(in.km);
  if (cs.oracle) ai.set_oracle(in.oracle);
  if (cs.targets) ai.set_targets(in.target);
  ai.set_gamma_mix(cs.gamma);
  return ai;
}

const Param<double>& param(DEA& layer, const std::string& name) {
  for (Param<double>* p : layer.parameters())
    if (p->name == name) return *p;
  FAIL("no parameter " << name);
  return *layer.parameters().front();
}

// ---- the reference: causal Dual-Expert attention and its gate loss, written from the formulas, cell by cell

/// RoPE written as a relative rotation: rho_d v for an offset d (any sign), the pairs (m, m + Dh/2) turned by
/// d * theta^(-2m/Dh). The layer rotates q (and W_rel q) at i and k at j; rho_i^T rho_j = rho_{j-i}, so the experts
/// must equal q.rho_{j-i}k / sqrt(Dh) and min(0, -|W_rel q - rho_{j-i}k|^2 / Dh).
std::vector<double> rotate(const std::vector<double>& v, double d, double theta) {
  const std::size_t half = v.size() / 2;
  std::vector<double> out(v.size());
  for (std::size_t m = 0; m < half; ++m) {
    const double phi = d * std::pow(theta, -2.0 * double(m) / double(v.size()));
    out[m] = v[m] * std::cos(phi) - v[m + half] * std::sin(phi);
    out[m + half] = v[m + half] * std::cos(phi) + v[m] * std::sin(phi);
  }
  return out;
}

struct Reference {
  Mat<double> y;
  std::vector<double> e0n, e1n, alpha_hat, attn;  // [B, H, T, T]
  double loss_gate = 0;
  Index n_labelled = 0, n_pairs = 0;
};

Reference reference(DEA& layer, const Case& cs, const Inputs& in) {
  const Index B = cs.B, T = cs.T, D = cs.D, H = cs.H, Dh = D / H, G = 2 * Dh + 2;
  auto affine = [&](const Mat<double>& a, int k) {  // a W^T + b of projection k
    const char* names[4] = {"W_q", "W_k", "W_v", "W_o"};
    const Param<double>& w = param(layer, std::string(names[k]) + ".weight");
    Mat<double> out = a * Eigen::Map<const Mat<double>>(w.value.data(), D, D).transpose();
    if (cs.bias) {
      const Param<double>& bb = param(layer, std::string(names[k]) + ".bias");
      for (Index r = 0; r < out.rows(); ++r)
        for (Index c = 0; c < D; ++c) out(r, c) += bb.value[c];
    }
    return out;
  };
  const Mat<double> Q = affine(in.x, 0), K = affine(in.x, 1), V = affine(in.x, 2);
  const double* Wrel = layer.W_rel().value.data();
  const double* Wg = layer.W_gate().value.data();
  const double* cg = layer.c_gate().value.data();
  Reference ref;
  const std::size_t cells = static_cast<std::size_t>(B * H * T * T);
  ref.e0n.assign(cells, 0);
  ref.e1n.assign(cells, 0);
  ref.alpha_hat.assign(cells, 0);
  ref.attn.assign(cells, 0);
  Mat<double> ctx = Mat<double>::Zero(B * T, D);
  double reg = 0, spot = 0;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T; ++i) {
        // the keys the query may see: j <= i (j < T when not causal), real
        const Index je = cs.causal ? i + 1 : T;
        std::vector<char> seen(T, 0);
        Index n = 0;
        for (Index j = 0; j < je; ++j) {
          seen[j] = !cs.mask || in.km[b * T + j] != 0;
          n += seen[j];
        }
        const double nf = n < 1 ? 1.0 : double(n);
        std::vector<double> q(Dh), r(Dh, 0.0);
        for (Index d = 0; d < Dh; ++d) q[d] = Q(b * T + i, h * Dh + d);
        for (Index a = 0; a < Dh; ++a)
          for (Index c = 0; c < Dh; ++c) r[a] += Wrel[(h * Dh + a) * Dh + c] * q[c];
        std::vector<double> e0(T, 0.0), e1(T, 0.0);
        for (Index j = 0; j < je; ++j) {
          double qk = 0, rr = 0, kk = 0, rk = 0;
          std::vector<double> kj(Dh);  // the experts' key: k_j, or with RoPE rho_{j-i} k_j
          for (Index d = 0; d < Dh; ++d) kj[d] = K(b * T + j, h * Dh + d);
          if (cs.rope > 0) kj = rotate(kj, double(j - i), cs.rope);
          for (Index d = 0; d < Dh; ++d) {
            const double kd = kj[d];
            qk += q[d] * kd;
            rr += r[d] * r[d];
            kk += kd * kd;
            rk += r[d] * kd;
          }
          e0[j] = qk / std::sqrt(double(Dh));
          e1[j] = std::min(0.0, -(rr + kk - 2 * rk) / double(Dh));
        }
        auto normalise = [&](const std::vector<double>& e) {
          double mu = 0, var = 0;
          for (Index j = 0; j < T; ++j)
            if (seen[j]) mu += e[j];
          mu /= nf;
          for (Index j = 0; j < T; ++j)
            if (seen[j]) var += (e[j] - mu) * (e[j] - mu);
          var /= nf;
          const double sigma = std::sqrt(std::max(var, 1e-12));
          std::vector<double> out(T, 0.0);
          for (Index j = 0; j < T; ++j)
            if (seen[j]) out[j] = (e[j] - mu) / (sigma + 1e-5);
          return out;
        };
        const std::vector<double> n0 = normalise(e0), n1 = normalise(e1);
        std::vector<double> ah(T, 0.0), mix(T, 0.0), a(T, 0.0), sc(T, 0.0);
        std::vector<char> has(T, 0);
        for (Index j = 0; j < je; ++j) {  // the gate reads the unrotated q and k
          double logit = cg[h] + Wg[h * G + 2 * Dh] * n0[j] + Wg[h * G + 2 * Dh + 1] * n1[j];
          for (Index d = 0; d < Dh; ++d)
            logit += q[d] * Wg[h * G + d] + K(b * T + j, h * Dh + d) * Wg[h * G + Dh + d];
          logit = std::max(-10.0, std::min(10.0, logit));
          ah[j] = std::min(0.95, 1.0 / (1.0 + std::exp(-logit)));
          mix[j] = ah[j];
          if (cs.oracle) {
            const double o = in.oracle[(b * T + i) * T + j];
            has[j] = !std::isnan(o) && seen[j];
            a[j] = std::isnan(o) ? 0.0 : std::max(0.0, std::min(0.95, o));
            const double a_eff = has[j] ? a[j] : ah[j];
            mix[j] = cs.gamma * a_eff + (1 - cs.gamma) * ah[j];
          }
          sc[j] = (1 - mix[j]) * n0[j] + mix[j] * n1[j];
        }
        double mx = -std::numeric_limits<double>::infinity(), z = 0;
        for (Index j = 0; j < je; ++j)
          if (seen[j]) mx = std::max(mx, sc[j]);
        std::vector<double> p(T, 0.0);
        for (Index j = 0; j < je; ++j)
          if (seen[j]) z += (p[j] = std::exp(sc[j] - mx));
        for (Index j = 0; j < je; ++j) p[j] = seen[j] ? p[j] / z : 0.0;
        for (Index j = 0; j < je; ++j)
          for (Index d = 0; d < Dh; ++d) ctx(b * T + i, h * Dh + d) += p[j] * V(b * T + j, h * Dh + d);
        for (Index j = 0; j < T; ++j) {
          const std::size_t c = static_cast<std::size_t>(((b * H + h) * T + i) * T + j);
          ref.e0n[c] = n0[j];
          ref.e1n[c] = n1[j];
          ref.alpha_hat[c] = ah[j];
          ref.attn[c] = p[j];
        }
        if (!cs.oracle) continue;
        // gate loss: the dense regression over the labelled visible cells, then the spotlight pairs
        Index row_has = 0;
        for (Index j = 0; j < T; ++j)
          if (has[j]) {
            reg += (ah[j] - a[j]) * (ah[j] - a[j]);
            ++row_has;
          }
        ref.n_labelled += row_has;
        if (row_has == 0) continue;
        Index t = -1;
        if (cs.targets) {
          const std::int64_t tg = in.target[b * T + i];
          if (tg >= 0 && tg < T && has[tg]) t = static_cast<Index>(tg);
        } else {
          double best = -std::numeric_limits<double>::infinity();
          for (Index j = 0; j < T; ++j)
            if (has[j]) {
              const double s = (1 - a[j]) * n0[j] + a[j] * n1[j];
              if (t < 0 || s > best) {
                best = s;
                t = j;
              }
            }
        }
        if (t < 0) continue;
        for (Index pp = 0; pp < T; ++pp) {
          if (!seen[pp] || pp == t) continue;
          const double num = n0[pp] - n0[t];
          const double den = (n1[t] - n0[t]) - (n1[pp] - n0[pp]);
          const double beta = num / (den + (den >= 0 ? 1e-6 : -1e-6));
          if (!(std::abs(den) >= 1e-6 && beta >= 0 && beta <= 1)) continue;
          const double db = std::sqrt((a[t] - beta) * (a[t] - beta) + 1e-4);
          const double w = 1 + 2.0 * std::exp(-db / 0.1);
          const double sb = std::tanh((a[t] - beta) / 0.05);
          const double zz = -sb * (ah[t] - beta) / 0.1;
          const double ldec = zz > 20 ? zz : std::log1p(std::exp(zz));
          spot += w * (ah[t] - a[t]) * (ah[t] - a[t]) + 0.5 * ldec;
          ++ref.n_pairs;
        }
      }
  ref.loss_gate = (ref.n_labelled > 0 ? reg / double(ref.n_labelled) : 0.0) +
                  (ref.n_pairs > 0 ? spot / double(ref.n_pairs) : 0.0);
  ref.y = cs.out_proj ? affine(ctx, 3) : ctx;
  return ref;
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t k = 0; k < a.size(); ++k) m = std::max(m, std::abs(a[k] - b[k]) / (1.0 + std::abs(b[k])));
  return m;
}
double max_rel(const Mat<double>& a, const Mat<double>& b) {
  return ((a - b).cwiseAbs().array() / (1.0 + b.cwiseAbs().array())).maxCoeff();
}

/// Task path: every main parameter and the input, alpha-hat held at its unperturbed value (the scores read it
/// as a constant).
testing::GradCheckReport check_task_path(const Case& cs) {
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  AttnInputs<double> ai = make_attn_inputs(cs, in);
  Rng drop_rng(99);
  if (cs.dropout > 0) ai.set_training(true, &drop_rng);
  {
    AttnInputs<double> keep = ai;
    keep.set_keep_maps(true);
    DEA::Cache cache;
    layer.forward(in.x, keep, cache);
    Tensor<double> frozen({cs.B, cs.H, cs.T, cs.T});
    for (Index k = 0; k < frozen.numel(); ++k) frozen[k] = cache.alpha_hat[static_cast<std::size_t>(k)];
    ai.set_frozen_alpha_hat(frozen);
  }
  const Mat<double> R = testing::random_projection(cs.B * cs.T, cs.D, cs.seed + 7);
  Mat<double> dx = Mat<double>::Zero(in.x.rows(), in.x.cols());
  auto objective = [&] {
    drop_rng.reseed(99);
    DEA::Cache c;
    return layer.forward(in.x, ai, c).cwiseProduct(R).sum();
  };
  auto analytic = [&] {
    drop_rng.reseed(99);
    layer.zero_grad();
    DEA::Cache c;
    layer.forward(in.x, ai, c);
    const Mat<double> g = layer.backward(R, c);
    dx = g;
  };
  testing::GradCheck gc;
  gc.add_except(layer.parameters(), {"W_gate", "c_gate"});
  gc.add("x", in.x.data(), dx.data(), in.x.size());
  auto rep = gc.run(objective, analytic);
  analytic();  // the task backward never writes the gate's parameters
  REQUIRE(layer.W_gate().grad.cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(layer.c_gate().grad.cwiseAbs().maxCoeff() == 0.0);
  return rep;
}

/// Gate path: W_gate and c_gate against loss_gate.
testing::GradCheckReport check_gate_path(const Case& cs) {
  DEA layer = make_layer(cs);
  Inputs in = make_inputs(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  auto objective = [&] {
    DEA::Cache c;
    layer.forward(in.x, ai, c);
    return c.loss_gate;
  };
  auto analytic = [&] {
    layer.zero_grad();
    DEA::Cache c;
    layer.forward(in.x, ai, c);
    layer.backward_gate(c);
    for (Param<double>* p : layer.parameters())
      if (p->group == "main") REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
  };
  testing::GradCheck gc;
  gc.add("W_gate", layer.W_gate().value.data(), layer.W_gate().grad.data(), layer.W_gate().numel());
  gc.add("c_gate", layer.c_gate().value.data(), layer.c_gate().grad.data(), layer.c_gate().numel());
  return gc.run(objective, analytic);
}

template <class S>
std::vector<S> flat(const Mat<S>& m) {
  return std::vector<S>(m.data(), m.data() + m.size());
}
template <class S>
bool same_bits(const std::vector<S>& a, const std::vector<S>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(S)) == 0;
}

}  // namespace

TEST_CASE("causal DEA: forward, maps and gate loss match the reference written from the formulas", "[dea][causal]") {
  std::vector<std::pair<std::string, Case>> cases;
  Case c0;
  cases.push_back({"no oracle", c0});
  Case c1;
  c1.oracle = true;
  c1.targets = true;
  cases.push_back({"oracle + targets (some invisible), gamma 0.5", c1});
  Case c2 = c1;
  c2.mask = true;
  c2.gamma = 1.0;
  cases.push_back({"key mask, gamma 1", c2});
  Case c3 = c1;
  c3.targets = false;
  c3.mask = true;
  c3.gamma = 0.25;
  cases.push_back({"key mask, oracle winner", c3});
  Case c4 = c1;
  c4.T = 11;
  c4.block_q = 4;  // several query blocks
  c4.out_proj = false;
  cases.push_back({"blocks of 4 rows, no out_proj", c4});
  for (auto& [name, base] : cases) {
    for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
      Case cs = base;
      cs.kernel = kernel;
      SECTION(name + (kernel == DeaKernel::tiled ? " (tiled)" : " (reference)")) {
        DEA layer = make_layer(cs);
        const Inputs in = make_inputs(cs);
        AttnInputs<double> ai = make_attn_inputs(cs, in);
        const Reference ref = reference(layer, cs, in);
        DEA::Cache c;
        const Mat<double> y = layer.forward(in.x, ai, c);
        REQUIRE(y.allFinite());
        CHECK(max_rel(y, ref.y) <= 1e-12);
        CHECK(c.loss_gate == Approx(ref.loss_gate).epsilon(1e-12).margin(1e-14));
        if (cs.oracle) {
          CHECK(c.stats.n_labelled == ref.n_labelled);
          CHECK(c.stats.n_decision_pairs == ref.n_pairs);
          CHECK(ref.n_pairs > 0);
        }
        // the maps (a keep_maps forward): 0 at every invisible cell
        ai.set_keep_maps(true);
        DEA::Cache m;
        layer.forward(in.x, ai, m);
        CHECK(max_rel(std::vector<double>(m.e0n.begin(), m.e0n.end()), ref.e0n) <= 1e-12);
        CHECK(max_rel(std::vector<double>(m.e1n.begin(), m.e1n.end()), ref.e1n) <= 1e-12);
        CHECK(max_rel(std::vector<double>(m.alpha_hat.begin(), m.alpha_hat.end()), ref.alpha_hat) <= 1e-12);
        CHECK(max_rel(std::vector<double>(m.attn.begin(), m.attn.end()), ref.attn) <= 1e-12);
        for (Index bh = 0; bh < cs.B * cs.H; ++bh)
          for (Index i = 0; i < cs.T; ++i)
            for (Index j = i + 1; j < cs.T; ++j) {
              const std::size_t k = static_cast<std::size_t>((bh * cs.T + i) * cs.T + j);
              REQUIRE(m.attn[k] == 0.0);
              REQUIRE(m.alpha_mix[k] == 0.0);
              REQUIRE(m.scores[k] == 0.0);
              if (cs.oracle) {
                REQUIRE(std::isnan(m.beta[k]));
                REQUIRE(std::isnan(m.oracle_ref[k]));
                REQUIRE(m.dlogit_gate[k] == 0.0);
              }
            }
      }
    }
  }
}

TEST_CASE("causal DEA: task-path gradients match finite differences", "[dea][causal][gradcheck]") {
  std::vector<std::pair<std::string, Case>> cases;
  Case c0;
  cases.push_back({"no oracle (language modelling)", c0});
  Case c1;
  c1.oracle = true;
  c1.targets = true;
  cases.push_back({"oracle + targets, gamma 0.5", c1});
  Case c2 = c1;
  c2.mask = true;
  cases.push_back({"oracle, key mask", c2});
  Case c3 = c0;
  c3.dropout = 0.3;
  c3.mask = true;
  cases.push_back({"dropout 0.3 (fixed mask), key mask", c3});
  Case c4 = c1;
  c4.kernel = DeaKernel::tiled;
  c4.block_q = 4;
  c4.T = 9;
  cases.push_back({"tiled kernel, blocks of 4", c4});
  Case c5 = c0;
  c5.kernel = DeaKernel::tiled;
  c5.out_proj = false;
  c5.bias = false;
  c5.mask = true;
  cases.push_back({"tiled, no out_proj, no bias, key mask", c5});
  for (auto& [name, cs] : cases) {
    SECTION(name) {
      auto rep = check_task_path(cs);
      WARN("causal task path, " << name << ": worst relative error " << rep.worst_rel_error);
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.worst_rel_error <= 1e-6);
    }
  }
}

TEST_CASE("causal DEA: gate-loss gradients match finite differences", "[dea][causal][gradcheck]") {
  for (int variant = 0; variant < 4; ++variant) {
    Case cs;
    cs.oracle = true;
    cs.targets = variant % 2 == 0;
    cs.mask = variant >= 2;
    cs.kernel = variant == 3 ? DeaKernel::tiled : DeaKernel::reference;
    cs.seed = 40 + static_cast<std::uint64_t>(variant);
    SECTION("variant " + std::to_string(variant)) {
      auto rep = check_gate_path(cs);
      WARN("causal gate variant " << variant << ": worst relative error " << rep.worst_rel_error);
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.worst_rel_error <= 1e-6);
      REQUIRE(rep.tensors[0].max_abs_grad > 1e-6);
    }
  }
}

TEST_CASE("causal DEA: a label or target on an invisible cell is ignored", "[dea][causal][gate]") {
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    Case with;
    with.oracle = true;
    with.targets = true;
    with.mask = true;
    with.kernel = kernel;
    Inputs a = make_inputs(with);
    Inputs b = a;
    // the same visible labels, no invisible ones, and the invisible targets removed
    for (Index bb = 0; bb < with.B; ++bb)
      for (Index i = 0; i < with.T; ++i) {
        for (Index j = i + 1; j < with.T; ++j) b.oracle[(bb * with.T + i) * with.T + j] = kNaN;
        if (b.target[bb * with.T + i] > i) b.target[bb * with.T + i] = -1;
      }
    Index invisible = 0;
    for (Index k = 0; k < a.oracle.numel(); ++k) invisible += !std::isnan(a.oracle[k]) && std::isnan(b.oracle[k]);
    REQUIRE(invisible > 0);
    DEA la = make_layer(with), lb = make_layer(with);
    DEA::Cache ca, cb;
    const Mat<double> R = testing::random_projection(with.B * with.T, with.D, 4);
    la.zero_grad();
    lb.zero_grad();
    const Mat<double> ya = la.forward(a.x, make_attn_inputs(with, a), ca);
    const Mat<double> yb = lb.forward(b.x, make_attn_inputs(with, b), cb);
    const Mat<double> dxa = la.backward(R, ca), dxb = lb.backward(R, cb);
    la.backward_gate(ca);
    lb.backward_gate(cb);
    REQUIRE(same_bits(flat(ya), flat(yb)));
    REQUIRE(same_bits(flat(dxa), flat(dxb)));
    REQUIRE(ca.loss_gate == cb.loss_gate);
    REQUIRE(ca.loss_gate > 0);
    const ParamList<double> pa = la.parameters(), pb = lb.parameters();
    for (std::size_t k = 0; k < pa.size(); ++k) {
      INFO(pa[k]->name);
      REQUIRE(std::memcmp(pa[k]->grad.data(), pb[k]->grad.data(), sizeof(double) * pa[k]->numel()) == 0);
    }
  }
}

TEST_CASE("causal DEA: later positions change nothing in earlier rows, values or gradients", "[dea][causal]") {
  // invisible cells contribute exactly nothing: rewriting the input at position T-1 leaves every output row
  // before it the same bits, and a loss on rows before T-1 gives position T-1 an exactly zero gradient
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    Case cs;
    cs.kernel = kernel;
    cs.T = 7;
    cs.mask = true;
    DEA layer = make_layer(cs);
    Inputs in = make_inputs(cs);
    const AttnInputs<double> ai = make_attn_inputs(cs, in);
    DEA::Cache c1, c2;
    const Mat<double> y1 = layer.forward(in.x, ai, c1);
    Inputs moved = in;
    Rng rng(77);
    for (Index b = 0; b < cs.B; ++b)
      for (Index d = 0; d < cs.D; ++d) moved.x(b * cs.T + cs.T - 1, d) += rng.uniform(-2, 2);
    const Mat<double> y2 = layer.forward(moved.x, ai, c2);
    for (Index b = 0; b < cs.B; ++b) {
      for (Index i = 0; i + 1 < cs.T; ++i)
        for (Index d = 0; d < cs.D; ++d) REQUIRE(y1(b * cs.T + i, d) == y2(b * cs.T + i, d));
      CHECK((y1.row(b * cs.T + cs.T - 1) - y2.row(b * cs.T + cs.T - 1)).cwiseAbs().maxCoeff() > 0);
    }
    Mat<double> R = testing::random_projection(cs.B * cs.T, cs.D, 5);
    for (Index b = 0; b < cs.B; ++b) R.row(b * cs.T + cs.T - 1).setZero();
    layer.zero_grad();
    const Mat<double> dx = layer.backward(R, c1);
    for (Index b = 0; b < cs.B; ++b) {
      REQUIRE(dx.row(b * cs.T + cs.T - 1).cwiseAbs().maxCoeff() == 0.0);
      REQUIRE(dx.row(b * cs.T + 1).cwiseAbs().maxCoeff() > 0.0);  // (position 0 of batch 1 is padded: 0 there)
    }
  }
}

TEST_CASE("causal DEA: gradient isolation is exact", "[dea][causal][isolation]") {
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    Case cs;
    cs.oracle = true;
    cs.targets = true;
    cs.mask = true;
    cs.kernel = kernel;
    DEA layer = make_layer(cs);
    const Inputs in = make_inputs(cs);
    const auto rep = layer.verify_gradient_isolation(in.x, make_attn_inputs(cs, in));
    REQUIRE(rep.task_gate_grad == 0.0);
    REQUIRE(rep.gate_main_grad == 0.0);
    REQUIRE(rep.task_rel_grad > 0.0);
    REQUIRE(rep.gate_gate_grad > 0.0);
    REQUIRE(rep.ok);
    // no oracle (language modelling): no gate loss, and the task backward still never writes the gate
    Case lm = cs;
    lm.oracle = lm.targets = false;
    DEA::Cache c;
    layer.zero_grad();
    layer.forward(in.x, make_attn_inputs(lm, in), c);
    REQUIRE(c.loss_gate == 0.0);
    layer.backward(testing::random_projection(cs.B * cs.T, cs.D, 6), c);
    layer.backward_gate(c);
    REQUIRE(layer.W_gate().grad.cwiseAbs().maxCoeff() == 0.0);
    REQUIRE(layer.c_gate().grad.cwiseAbs().maxCoeff() == 0.0);
    REQUIRE(layer.W_rel().grad.cwiseAbs().maxCoeff() > 0.0);
  }
}

TEST_CASE("causal DEA: the first query sees one key and gives no NaN; a query without a visible real key gives "
          "zeros", "[dea][causal][mask]") {
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    Case cs;
    cs.mask = true;  // batch 1: key 0 padded
    cs.oracle = true;
    cs.targets = true;
    cs.kernel = kernel;
    DEA layer = make_layer(cs);
    const Inputs in = make_inputs(cs);
    AttnInputs<double> ai = make_attn_inputs(cs, in);
    DEA::Cache c;
    const Mat<double> y = layer.forward(in.x, ai, c);
    REQUIRE(y.allFinite());
    REQUIRE(std::isfinite(c.loss_gate));
    const Mat<double> dx = layer.backward(testing::random_projection(cs.B * cs.T, cs.D, 8), c);
    layer.backward_gate(c);
    REQUIRE(dx.allFinite());
    for (Param<double>* p : layer.parameters()) REQUIRE(p->grad.allFinite());
    // batch 0, query 0: one visible key, its E~ = 0 (std 0), attention 1 on it; the output is V_0 through W_o
    ai.set_keep_maps(true);
    DEA::Cache m;
    layer.forward(in.x, ai, m);
    for (Index h = 0; h < cs.H; ++h) {
      const std::size_t k = static_cast<std::size_t>((0 * cs.H + h) * cs.T * cs.T);
      REQUIRE(m.e0n[k] == 0.0);
      REQUIRE(m.e1n[k] == 0.0);
      REQUIRE(m.attn[k] == 1.0);
      // batch 1, query 0: key 0 is padded, so the row sees no real key: zeros
      const std::size_t k1 = static_cast<std::size_t>((1 * cs.H + h) * cs.T * cs.T);
      for (Index j = 0; j < cs.T; ++j) REQUIRE(m.attn[k1 + j] == 0.0);
    }
    // the context of batch 1, query 0 is 0, so its output is the output bias
    const Param<double>& bo = param(layer, "W_o.bias");
    for (Index d = 0; d < cs.D; ++d) REQUIRE(y(cs.T, d) == bo.value[d]);
  }
}

/// The bits of a forward, the task backward and the gate backward (and with `decode` a decoding pass: a prompt of 7
/// positions, then single positions) of a B=3, T=40, D=32, H=4 layer with an oracle and a key mask, on `threads`
/// threads; the layer and its inputs are drawn from Rng(5), so every call sees the same ones.
template <class S>
std::vector<S> thread_run_bits(DeaKernel kernel, bool causal, double rope_theta, bool decode, int threads) {
  using L = DualExpertAttention<S>;
  const Index B = 3, T = 40, H = 4, D = 32;
  Rng rng(5);
  typename L::Options opt;
  opt.kernel = kernel;
  opt.block_q = 16;
  opt.rope_theta = rope_theta;
  L layer(D, H, rng, opt);
  Mat<S> x(B * T, D);
  init::normal(x, rng, 0, 1);
  Tensor<S> oracle({B, T, T}, std::numeric_limits<S>::quiet_NaN());
  for (Index b = 0; b < B; ++b)
    for (Index i = 1; i < T; ++i)
      for (Index j = 0; j < T; j += 3) oracle[(b * T + i) * T + j] = S(rng.uniform(0, 0.95));
  Tensor<std::uint8_t> km({B, T}, 1);
  for (Index j = 36; j < T; ++j) km[T + j] = 0;
  AttnInputs<S> in(B, T);
  in.set_oracle(oracle).set_key_mask(km).set_gamma_mix(S(0.5)).set_causal(causal);
  Mat<S> dy(B * T, D);
  init::normal(dy, rng, 0, 1);
  set_num_threads(threads);
  typename L::Cache c;
  layer.zero_grad();
  Mat<S> y = layer.forward(x, in, c);
  Mat<S> dx = layer.backward(dy, c);
  layer.backward_gate(c);
  std::vector<S> all(y.data(), y.data() + y.size());
  all.insert(all.end(), dx.data(), dx.data() + dx.size());
  for (Param<S>* p : layer.parameters()) all.insert(all.end(), p->grad.data(), p->grad.data() + p->numel());
  all.push_back(c.loss_gate);
  if (decode) {
    typename L::DecodeCache dc(B);
    for (Index t0 = 0; t0 < T;) {
      const Index tn = t0 == 0 ? 7 : 1;
      Mat<S> xn(B * tn, D);
      for (Index b = 0; b < B; ++b) xn.middleRows(b * tn, tn) = x.middleRows(b * T + t0, tn);
      const Mat<S> yn = layer.forward_decode(xn, dc);
      all.insert(all.end(), yn.data(), yn.data() + yn.size());
      t0 += tn;
    }
  }
  set_num_threads(2);
  return all;
}

TEMPLATE_TEST_CASE("causal DEA: results are bitwise identical for 1 and 2 threads", "[dea][causal][threads]", float,
                   double) {
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled})
    REQUIRE(same_bits(thread_run_bits<TestType>(kernel, true, 0, false, 1),
                      thread_run_bits<TestType>(kernel, true, 0, false, 2)));
}

TEST_CASE("causal DEA: the tiled kernel agrees with the reference kernel", "[dea][causal][tiled]") {
  Case cs;
  cs.T = 13;
  cs.oracle = true;
  cs.targets = true;
  cs.mask = true;
  cs.block_q = 5;
  cs.dropout = 0.2;
  auto run = [&](DeaKernel kernel) {
    Case k = cs;
    k.kernel = kernel;
    DEA layer = make_layer(k);
    Inputs in = make_inputs(k);
    AttnInputs<double> ai = make_attn_inputs(k, in);
    Rng drop(3);
    ai.set_training(true, &drop);
    DEA::Cache c;
    layer.zero_grad();
    std::vector<double> all = flat(layer.forward(in.x, ai, c));
    const std::vector<double> dx = flat(layer.backward(testing::random_projection(k.B * k.T, k.D, 9), c));
    layer.backward_gate(c);
    all.insert(all.end(), dx.begin(), dx.end());
    for (Param<double>* p : layer.parameters()) all.insert(all.end(), p->grad.data(), p->grad.data() + p->numel());
    all.push_back(c.loss_gate);
    return all;
  };
  const std::vector<double> a = run(DeaKernel::reference), b = run(DeaKernel::tiled);
  REQUIRE(max_rel(b, a) <= 1e-11);
}

TEST_CASE("causal DEA: incremental decoding equals the rows of the full causal forward", "[dea][causal][decode]") {
  const Index B = 2, T = 23, D = 16, H = 2;
  for (const bool out_proj : {true, false}) {
    Case cs;
    cs.B = B;
    cs.T = T;
    cs.D = D;
    cs.H = H;
    cs.out_proj = out_proj;
    cs.kernel = DeaKernel::tiled;
    cs.block_q = 8;
    DEA layer = make_layer(cs);
    const Inputs in = make_inputs(cs);
    DEA::Cache c;
    const Mat<double> full = layer.forward(in.x, make_attn_inputs(cs, in), c);
    const Reference ref = reference(layer, cs, in);
    REQUIRE(max_rel(full, ref.y) <= 1e-12);
    // a prompt of 9 positions, then one at a time, then the last chunk of 5: rows of x in [B*Tn, D] order
    const std::vector<Index> chunks = {9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5};
    DEA::DecodeCache dc(B);
    Mat<double> dec(B * T, D);
    Index pos = 0;
    for (const Index tn : chunks) {
      Mat<double> xn(B * tn, D);
      for (Index b = 0; b < B; ++b) xn.middleRows(b * tn, tn) = in.x.middleRows(b * T + pos, tn);
      const Mat<double> yn = layer.forward_decode(xn, dc);
      REQUIRE(yn.rows() == B * tn);
      for (Index b = 0; b < B; ++b) dec.middleRows(b * T + pos, tn) = yn.middleRows(b * tn, tn);
      pos += tn;
      REQUIRE(dc.length() == pos);
    }
    REQUIRE(pos == T);
    const double diff = (dec - full).cwiseAbs().maxCoeff();
    WARN("decode vs full causal forward (double, out_proj " << out_proj << "): max |difference| " << diff);
    REQUIRE(diff <= 1e-12 * (1.0 + full.cwiseAbs().maxCoeff()));
    // the whole sequence in one call is the full forward too; clear() starts again
    dc.clear();
    REQUIRE(max_rel(layer.forward_decode(in.x, dc), full) <= 1e-12);  // ([B*T, D] is [B*Tn, D] with Tn = T)
    REQUIRE(dc.length() == T);
  }
}

TEST_CASE("causal DEA: decoding in float agrees with the full forward", "[dea][causal][decode]") {
  using L = DualExpertAttention<float>;
  const Index B = 2, T = 70, D = 32, H = 4;
  Rng rng(12);
  L layer(D, H, rng);
  Mat<float> x(B * T, D);
  init::normal(x, rng, 0, 1);
  AttnInputs<float> in(B, T);
  in.set_causal(true);
  L::Cache c;
  const Mat<float> full = layer.forward(x, in, c);
  L::DecodeCache dc(B);
  Mat<float> dec(B * T, D);
  for (Index t = 0; t < T; ++t) {
    Mat<float> xn(B, D);
    for (Index b = 0; b < B; ++b) xn.row(b) = x.row(b * T + t);
    const Mat<float> yn = layer.forward_decode(xn, dc);
    for (Index b = 0; b < B; ++b) dec.row(b * T + t) = yn.row(b);
  }
  const float diff = (dec - full).cwiseAbs().maxCoeff();
  WARN("decode vs full causal forward (float, one token at a time): max |difference| " << diff);
  REQUIRE(diff <= 1e-5f * (1.0f + full.cwiseAbs().maxCoeff()));
}

TEST_CASE("causal DEA: bad input to forward_decode is a dea::Error naming it", "[dea][causal][errors]") {
  Rng rng(3);
  DEA layer(8, 2, rng);
  DEA::DecodeCache dc(2);
  REQUIRE_THROWS_WITH(layer.forward_decode(Mat<double>::Zero(2, 7), dc), Catch::Contains("x_new") &&
                                                                             Catch::Contains("columns"));
  REQUIRE_THROWS_WITH(layer.forward_decode(Mat<double>::Zero(3, 8), dc), Catch::Contains("x_new") &&
                                                                             Catch::Contains("multiple"));
  Mat<double> bad = Mat<double>::Zero(2, 8);
  bad(1, 3) = kNaN;
  REQUIRE_THROWS_WITH(layer.forward_decode(bad, dc), Catch::Contains("x_new"));
  REQUIRE(dc.length() == 0);  // nothing was appended
  REQUIRE_THROWS_WITH(DEA::DecodeCache(0), Catch::Contains("batch"));
  DEA wider(16, 2, rng);
  layer.forward_decode(Mat<double>::Zero(2, 8), dc);
  REQUIRE_THROWS_WITH(wider.forward_decode(Mat<double>::Zero(2, 16), dc), Catch::Contains("cache"));
  // causal masking needs Tq == Tk (AttnInputs), so a causal cross-attention of different lengths cannot be built
  REQUIRE_THROWS_WITH(AttnInputs<double>(2, 3, 4).set_causal(true), Catch::Contains("Tq == Tk"));
}

// ---- RoPE (Options::rope_theta): theta 20 on head width 4 turns both pairs by a visible angle per position

TEST_CASE("DEA with RoPE: forward, maps and gate loss match the reference (key rotated by j - i only)",
          "[dea][rope]") {
  std::vector<std::pair<std::string, Case>> cases;
  Case c0;
  c0.rope = 20;
  cases.push_back({"causal, no oracle", c0});
  Case c1 = c0;
  c1.oracle = c1.targets = c1.mask = true;
  cases.push_back({"causal, oracle + targets, key mask", c1});
  Case c2 = c1;
  c2.causal = false;
  cases.push_back({"bidirectional, oracle + targets, key mask", c2});
  Case c3 = c0;
  c3.causal = false;
  c3.T = 11;
  c3.block_q = 4;
  c3.out_proj = false;
  cases.push_back({"bidirectional, blocks of 4 rows, no out_proj", c3});
  Case c4 = c1;
  c4.T = 11;
  c4.block_q = 4;
  c4.gamma = 1.0;
  c4.targets = false;
  cases.push_back({"causal, blocks of 4 rows, oracle winner, gamma 1", c4});
  for (auto& [name, base] : cases) {
    for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
      Case cs = base;
      cs.kernel = kernel;
      SECTION(name + (kernel == DeaKernel::tiled ? " (tiled)" : " (reference)")) {
        DEA layer = make_layer(cs);
        const Inputs in = make_inputs(cs);
        AttnInputs<double> ai = make_attn_inputs(cs, in);
        const Reference ref = reference(layer, cs, in);
        DEA::Cache c;
        const Mat<double> y = layer.forward(in.x, ai, c);
        REQUIRE(y.allFinite());
        CHECK(max_rel(y, ref.y) <= 1e-12);
        CHECK(c.loss_gate == Approx(ref.loss_gate).epsilon(1e-12).margin(1e-14));
        if (cs.oracle) CHECK(c.stats.n_decision_pairs == ref.n_pairs);
        ai.set_keep_maps(true);
        DEA::Cache m;
        layer.forward(in.x, ai, m);
        CHECK(max_rel(std::vector<double>(m.e0n.begin(), m.e0n.end()), ref.e0n) <= 1e-12);
        CHECK(max_rel(std::vector<double>(m.e1n.begin(), m.e1n.end()), ref.e1n) <= 1e-12);
        CHECK(max_rel(std::vector<double>(m.alpha_hat.begin(), m.alpha_hat.end()), ref.alpha_hat) <= 1e-12);
        CHECK(max_rel(std::vector<double>(m.attn.begin(), m.attn.end()), ref.attn) <= 1e-12);
        // the rotation matters: the same layer without it computes something else
        Case off = cs;
        off.rope = 0;
        DEA plain = make_layer(off);
        DEA::Cache cp;
        CHECK(max_rel(plain.forward(in.x, make_attn_inputs(off, in), cp), y) > 1e-3);
      }
    }
  }
}

TEST_CASE("DEA with RoPE: task-path gradients match finite differences, causal and bidirectional",
          "[dea][rope][gradcheck]") {
  std::vector<std::pair<std::string, Case>> cases;
  Case c0;
  c0.rope = 20;
  cases.push_back({"causal, no oracle (language modelling)", c0});
  Case c1 = c0;
  c1.oracle = c1.targets = c1.mask = true;
  cases.push_back({"causal, oracle + targets, key mask", c1});
  Case c2 = c0;
  c2.dropout = 0.3;
  c2.mask = true;
  cases.push_back({"causal, dropout 0.3 (fixed mask), key mask", c2});
  Case c3 = c1;
  c3.kernel = DeaKernel::tiled;
  c3.block_q = 4;
  c3.T = 9;
  cases.push_back({"causal, tiled kernel, blocks of 4", c3});
  Case c4 = c1;
  c4.causal = false;
  cases.push_back({"bidirectional, oracle + targets, key mask", c4});
  Case c5 = c0;
  c5.causal = false;
  c5.kernel = DeaKernel::tiled;
  c5.block_q = 4;
  c5.T = 9;
  c5.out_proj = false;
  c5.bias = false;
  c5.dropout = 0.2;
  cases.push_back({"bidirectional, tiled, blocks of 4, no out_proj, no bias, dropout 0.2", c5});
  for (auto& [name, cs] : cases) {
    SECTION(name) {
      auto rep = check_task_path(cs);
      WARN("RoPE task path, " << name << ": worst relative error " << rep.worst_rel_error);
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.worst_rel_error <= 1e-6);
    }
  }
}

TEST_CASE("DEA with RoPE: gate-loss gradients match finite differences", "[dea][rope][gradcheck]") {
  for (int variant = 0; variant < 4; ++variant) {
    Case cs;
    cs.rope = 20;
    cs.oracle = cs.mask = true;
    cs.targets = variant % 2 == 0;
    cs.causal = variant < 2;
    cs.kernel = variant == 3 ? DeaKernel::tiled : DeaKernel::reference;
    cs.seed = 60 + static_cast<std::uint64_t>(variant);
    SECTION("variant " + std::to_string(variant)) {
      auto rep = check_gate_path(cs);
      WARN("RoPE gate variant " << variant << ": worst relative error " << rep.worst_rel_error);
      INFO(rep.str());
      REQUIRE(rep.ok);
      REQUIRE(rep.worst_rel_error <= 1e-6);
      REQUIRE(rep.tensors[0].max_abs_grad > 1e-6);
    }
  }
}

TEST_CASE("DEA with RoPE: isolation is exact, later positions change nothing, the tiled kernel agrees",
          "[dea][rope]") {
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
    Case cs;
    cs.rope = 20;
    cs.oracle = cs.targets = cs.mask = true;
    cs.kernel = kernel;
    DEA layer = make_layer(cs);
    const Inputs in = make_inputs(cs);
    REQUIRE(layer.verify_gradient_isolation(in.x, make_attn_inputs(cs, in)).ok);
    // causal: rewriting the last position leaves every earlier row the same bits
    DEA::Cache c1, c2;
    const AttnInputs<double> ai = make_attn_inputs(cs, in);
    const Mat<double> y1 = layer.forward(in.x, ai, c1);
    Inputs moved = in;
    for (Index b = 0; b < cs.B; ++b) moved.x.row(b * cs.T + cs.T - 1).array() += 0.7;
    const Mat<double> y2 = layer.forward(moved.x, ai, c2);
    for (Index b = 0; b < cs.B; ++b)
      for (Index i = 0; i + 1 < cs.T; ++i)
        for (Index d = 0; d < cs.D; ++d) REQUIRE(y1(b * cs.T + i, d) == y2(b * cs.T + i, d));
  }
  for (const bool causal : {true, false}) {
    Case cs;
    cs.rope = 20;
    cs.causal = causal;
    cs.T = 13;
    cs.oracle = cs.targets = cs.mask = true;
    cs.block_q = 5;
    auto run = [&](DeaKernel kernel) {
      Case k = cs;
      k.kernel = kernel;
      DEA layer = make_layer(k);
      Inputs in = make_inputs(k);
      AttnInputs<double> ai = make_attn_inputs(k, in);
      Rng drop(3);
      ai.set_training(true, &drop);
      DEA::Cache c;
      layer.zero_grad();
      std::vector<double> all = flat(layer.forward(in.x, ai, c));
      const std::vector<double> dx = flat(layer.backward(testing::random_projection(k.B * k.T, k.D, 9), c));
      layer.backward_gate(c);
      all.insert(all.end(), dx.begin(), dx.end());
      for (Param<double>* p : layer.parameters()) all.insert(all.end(), p->grad.data(), p->grad.data() + p->numel());
      all.push_back(c.loss_gate);
      return all;
    };
    CHECK(max_rel(run(DeaKernel::tiled), run(DeaKernel::reference)) <= 1e-11);
  }
}

TEST_CASE("DEA with RoPE: cross-attention of the same positions equals self-attention", "[dea][rope]") {
  Case cs;
  cs.rope = 20;
  cs.causal = false;
  cs.oracle = cs.targets = cs.mask = true;
  DEA layer = make_layer(cs);
  const Inputs in = make_inputs(cs);
  const AttnInputs<double> ai = make_attn_inputs(cs, in);
  DEA::Cache cs1, cs2;
  const Mat<double> R = testing::random_projection(cs.B * cs.T, cs.D, 10);
  layer.zero_grad();
  const Mat<double> y1 = layer.forward(in.x, ai, cs1);
  const Mat<double> dx = layer.backward(R, cs1);
  const Mat<double> y2 = layer.forward(in.x, in.x, in.x, ai, cs2);
  const DEA::InputGrads g = layer.backward_inputs(R, cs2);
  CHECK(max_rel(y2, y1) <= 1e-14);
  CHECK(max_rel(Mat<double>(g.dq + g.dk + g.dv), dx) <= 1e-13);
}

TEMPLATE_TEST_CASE("DEA with RoPE: results are bitwise identical for 1 and 2 threads", "[dea][rope][threads]", float,
                   double) {
  for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled})
    for (const bool causal : {true, false})
      REQUIRE(same_bits(thread_run_bits<TestType>(kernel, causal, 10000, true, 1),
                        thread_run_bits<TestType>(kernel, causal, 10000, true, 2)));
}

TEST_CASE("DEA with RoPE: incremental decoding equals the rows of the full causal forward", "[dea][rope][decode]") {
  const Index B = 2, T = 23, D = 16, H = 2;
  for (const bool out_proj : {true, false})
    for (const DeaKernel kernel : {DeaKernel::reference, DeaKernel::tiled}) {
      Case cs;
      cs.B = B;
      cs.T = T;
      cs.D = D;
      cs.H = H;
      cs.rope = 20;
      cs.out_proj = out_proj;
      cs.kernel = kernel;
      cs.block_q = 8;
      DEA layer = make_layer(cs);
      const Inputs in = make_inputs(cs);
      DEA::Cache c;
      const Mat<double> full = layer.forward(in.x, make_attn_inputs(cs, in), c);
      REQUIRE(max_rel(full, reference(layer, cs, in).y) <= 1e-12);
      const std::vector<Index> chunks = {9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 5};
      DEA::DecodeCache dc(B);
      Mat<double> dec(B * T, D);
      Index pos = 0;
      for (const Index tn : chunks) {
        Mat<double> xn(B * tn, D);
        for (Index b = 0; b < B; ++b) xn.middleRows(b * tn, tn) = in.x.middleRows(b * T + pos, tn);
        const Mat<double> yn = layer.forward_decode(xn, dc);
        for (Index b = 0; b < B; ++b) dec.middleRows(b * T + pos, tn) = yn.middleRows(b * tn, tn);
        pos += tn;
        REQUIRE(dc.length() == pos);
      }
      const double diff = (dec - full).cwiseAbs().maxCoeff();
      WARN("RoPE decode vs full causal forward (double, out_proj " << out_proj << "): max |difference| " << diff);
      REQUIRE(diff <= 1e-12 * (1.0 + full.cwiseAbs().maxCoeff()));
      // the cache holds the rotated keys: rho_j (x_j W_k^T + b_k) of every head
      Mat<double> K = c.K;
      ops::RopeTable<double> tab(D / H, 20.0);
      tab.reserve(T);
      for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h) ops::rope_forward(tab, 0, K.block(b * T, h * (D / H), T, D / H));
      for (Index b = 0; b < B; ++b)
        REQUIRE((dc.K.middleRows(b * dc.cap, T) - K.middleRows(b * T, T)).cwiseAbs().maxCoeff() <= 1e-12);
      dc.clear();
      REQUIRE(max_rel(layer.forward_decode(in.x, dc), full) <= 1e-12);
    }
}

TEST_CASE("DEA with RoPE: decoding in float agrees with the full forward", "[dea][rope][decode]") {
  using L = DualExpertAttention<float>;
  const Index B = 2, T = 70, D = 32, H = 4;
  Rng rng(12);
  L::Options opt;
  opt.rope_theta = 10000;
  L layer(D, H, rng, opt);
  Mat<float> x(B * T, D);
  init::normal(x, rng, 0, 1);
  AttnInputs<float> in(B, T);
  in.set_causal(true);
  L::Cache c;
  const Mat<float> full = layer.forward(x, in, c);
  L::DecodeCache dc(B);
  Mat<float> dec(B * T, D);
  for (Index t = 0; t < T; ++t) {
    Mat<float> xn(B, D);
    for (Index b = 0; b < B; ++b) xn.row(b) = x.row(b * T + t);
    const Mat<float> yn = layer.forward_decode(xn, dc);
    for (Index b = 0; b < B; ++b) dec.row(b * T + t) = yn.row(b);
  }
  const float diff = (dec - full).cwiseAbs().maxCoeff();
  WARN("RoPE decode vs full causal forward (float, one token at a time): max |difference| " << diff);
  REQUIRE(diff <= 1e-5f * (1.0f + full.cwiseAbs().maxCoeff()));
}

TEST_CASE("DEA with RoPE: bad options and uses are a dea::Error naming rope_theta", "[dea][rope][errors]") {
  Rng rng(3);
  DEA::Options opt;
  opt.rope_theta = 10000;
  REQUIRE_THROWS_WITH(DEA(6, 2, rng, opt), Catch::Contains("rope_theta") && Catch::Contains("even head width") &&
                                               Catch::Contains("got 3"));
  for (const double bad : {-1.0, kNaN, std::numeric_limits<double>::infinity()}) {
    DEA::Options o;
    o.rope_theta = bad;
    REQUIRE_THROWS_WITH(DEA(8, 2, rng, o), Catch::Contains("rope_theta must be finite and >= 0"));
  }
  DEA layer(8, 2, rng, opt);
  // cross-attention of different lengths: query row i and key row i are not one position
  Mat<double> q = Mat<double>::Ones(2 * 3, 8), kv = Mat<double>::Ones(2 * 4, 8);
  DEA::Cache c;
  REQUIRE_THROWS_WITH(layer.forward(q, kv, kv, AttnInputs<double>(2, 3, 4), c),
                      Catch::Contains("rope_theta") && Catch::Contains("Tq == Tk") && Catch::Contains("Tq = 3"));
  // a decode cache filled by a layer without RoPE (unrotated keys) is refused, and the other way round
  DEA plain(8, 2, rng);
  DEA::DecodeCache dc(2);
  plain.forward_decode(Mat<double>::Zero(2, 8), dc);
  REQUIRE_THROWS_WITH(layer.forward_decode(Mat<double>::Zero(2, 8), dc), Catch::Contains("rope_theta"));
  dc.clear();  // a cleared cache serves any layer
  layer.forward_decode(Mat<double>::Zero(2, 8), dc);
  REQUIRE_THROWS_WITH(plain.forward_decode(Mat<double>::Zero(2, 8), dc), Catch::Contains("rope_theta"));
  REQUIRE(dc.length() == 1);
}

}  // namespace test_dea_causal
