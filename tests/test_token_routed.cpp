// Tests of dea/attention/token_routed.hpp (tr_mha v1 / tr_mha_v2) and the ops it brought (rope, rms_norm):
// the reference's nine tests (tests/test_tr_mha.py, at the layer level), finite-difference gradients with the
// routing held fixed, thread-count invariance, bad input, and the public golden cases.
#include <catch2/catch.hpp>
#include <dea/attention/token_routed.hpp>
#include <dea/interop/tr_mha_case.hpp>
#include <dea/testing/gradcheck.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_token_routed {

using namespace dea;

namespace {

using TRA = TokenRoutedAttention<double>;
using IdTensor = Tensor<std::int64_t>;

Mat<double> randn(Index rows, Index cols, Rng& rng, double std = 1.0) {
  Mat<double> m(rows, cols);
  init::normal(m, rng, 0.0, std);
  return m;
}

IdTensor random_ids(Index B, Index T, Rng& rng, std::int64_t vocab = 64) {
  IdTensor t({B, T});
  for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

IdTensor iota_ids(Index B, Index T) {
  IdTensor t({B, T});
  for (Index i = 0; i < t.numel(); ++i) t[i] = i;
  return t;
}

/// The small config of the reference's tests: D = 32, H = 4, E = 4, r = 4, k = 2.
TRA::Options small_options(TrVariant v, TrTargets targets = TrTargets::qv) {
  TRA::Options o;
  o.variant = v;
  o.num_experts = 4;
  o.adapter_rank = 4;
  o.top_k = 2;
  o.targets = targets;
  return o;
}

/// Perturbs every parameter away from its construction values (as the golden cases do), so that every path is live.
template <class Layer = TRA>
void randomise(Layer& layer, Rng& rng, double router_std = 0.5, double adapter_std = 0.1, double bg = 1.0,
               double alpha = 0.5) {
  for (Param<double>* p : layer.parameters()) {
    const std::string& n = p->name;
    if (n == "q_norm.weight" || n == "k_norm.weight") {
      init::normal(p->value, rng, 1.0, 0.1);
    } else if (n == "context_router_weight") {
      init::normal(p->value, rng, 0.0, router_std);
    } else if (n.find("adapter") != std::string::npos && n != "adapter_output_gate") {
      init::normal(p->value, rng, 0.0, adapter_std);
    } else if (n == "verifier_gate_weight") {
      init::normal(p->value, rng, 0.0, 0.1);
    } else if (n == "verifier_gate_bias") {
      p->value[0] = bg;
    } else if (n == "adapter_output_gate") {
      p->value[0] = alpha;
    } else {
      init::normal(p->value, rng, 0.0, 0.15);
    }
  }
}

/// Smallest gap between consecutive sorted z values among the k + 1 largest of every token (v1 top-k margin).
double min_topk_gap(const Mat<double>& z, Index k) {
  double gap = INFINITY;
  for (Index n = 0; n < z.rows(); ++n) {
    std::vector<double> v(z.row(n).data(), z.row(n).data() + z.cols());
    std::sort(v.rbegin(), v.rend());
    for (Index j = 0; j < std::min<Index>(k, z.cols() - 1); ++j)
      gap = std::min(gap, v[static_cast<std::size_t>(j)] - v[static_cast<std::size_t>(j + 1)]);
  }
  return gap;
}

bool bitwise_equal(const Mat<double>& a, const Mat<double>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::equal(a.data(), a.data() + a.size(), b.data(), [](double x, double y) {
           return std::memcmp(&x, &y, sizeof(double)) == 0;
         });
}

/// torch.allclose with its defaults (rtol 1e-5, atol 1e-8).
bool allclose(const Mat<double>& a, const Mat<double>& b, double rtol = 1e-5, double atol = 1e-8) {
  return ((a - b).array().abs() <= atol + rtol * b.array().abs()).all();
}

/// The attention inputs of a self-attention call on x [B*T, D] with nothing optional set.
template <class S>
AttnInputs<S> plain(const Mat<S>& x, Index B) {
  return AttnInputs<S>(B, x.rows() / B);
}

/// Runs the finite-difference check of every parameter and the input x of `layer` on L = <y, R>.
template <class Layer = TRA>
testing::GradCheckReport gradcheck_layer(Layer& layer, Mat<double>& x, Index batch, const IdTensor* ids,
                                         const Tensor<std::uint8_t>* key_mask = nullptr) {
  const Mat<double> R = testing::random_projection(x.rows(), x.cols(), 77);
  Mat<double> dx;
  typename Layer::Cache cache;
  AttnInputs<double> in(batch, x.rows() / batch);
  if (key_mask) in.set_key_mask(*key_mask);
  auto run = [&] { return ids ? layer.forward(x, *ids, in, cache) : layer.forward_plain(x, in, cache); };
  testing::GradCheck gc;
  gc.add(layer.parameters());
  dx = Mat<double>::Zero(x.rows(), x.cols());
  gc.add("x", x.data(), dx.data(), x.size());
  auto objective = [&] { return run().cwiseProduct(R).sum(); };
  auto analytic = [&] {
    layer.zero_grad();
    run();
    const Mat<double> g = layer.backward(R, cache);
    dx = g;  // a copy into the buffer the checker holds (a move would swap it away)
  };
  return gc.run(objective, analytic);
}

}  // namespace

// =====================================================================================================================
// ops: rope and rms_norm
// =====================================================================================================================

TEST_CASE("rope: rotate-half pairing, norm preserved, backward is the transpose", "[token_routed][ops]") {
  const Index d = 8, T = 5;
  ops::RopeTable<double> tab(d, 10000.0);
  tab.reserve(T + 3);
  Rng rng(3);
  Mat<double> x = randn(T, d, rng);
  Mat<double> y = x;
  ops::rope_forward(tab, 3, y);
  for (Index t = 0; t < T; ++t) {
    REQUIRE(std::abs(y.row(t).norm() - x.row(t).norm()) < 1e-12);
    for (Index i = 0; i < d / 2; ++i) {  // out_i = a_i cos - a_{i+h} sin, out_{i+h} = a_{i+h} cos + a_i sin
      const double phi = static_cast<double>(3 + t) * std::pow(10000.0, -2.0 * i / d);
      REQUIRE(y(t, i) == Approx(x(t, i) * std::cos(phi) - x(t, i + d / 2) * std::sin(phi)).epsilon(1e-13));
      REQUIRE(y(t, i + d / 2) == Approx(x(t, i + d / 2) * std::cos(phi) + x(t, i) * std::sin(phi)).epsilon(1e-13));
    }
  }
  // <R(x), g> = <x, R^T g>
  Mat<double> g = randn(T, d, rng), gb = g;
  ops::rope_backward(tab, 3, gb);
  REQUIRE(std::abs(y.cwiseProduct(g).sum() - x.cwiseProduct(gb).sum()) < 1e-12);
  REQUIRE_THROWS_AS(ops::rope_forward(tab, 5, y), Error);  // positions 5..9 exceed the table (8)
  REQUIRE_THROWS_AS(ops::RopeTable<double>(7, 10000.0), Error);
}

TEST_CASE("rms_norm: forward formula and finite-difference backward", "[token_routed][ops]") {
  const Index d = 6, rows = 4;
  Rng rng(4);
  Mat<double> a = randn(rows, d, rng), R = randn(rows, d, rng);
  Vec<double> gamma(d), dgamma(d);
  init::normal(gamma, rng, 1.0, 0.2);
  const double eps = 1e-6;
  auto fwd = [&](Mat<double>& y, Mat<double>& ahat, Vec<double>& rstd) {
    y.resize(rows, d);
    ahat.resize(rows, d);
    rstd.resize(rows);
    ops::rms_norm_forward<double>(a, gamma.data(), eps, y, ahat, rstd.data());
  };
  Mat<double> y, ahat, da;
  Vec<double> rstd;
  fwd(y, ahat, rstd);
  for (Index i = 0; i < rows; ++i) {
    const double rr = 1.0 / std::sqrt(a.row(i).squaredNorm() / d + eps);
    for (Index c = 0; c < d; ++c) REQUIRE(y(i, c) == Approx(a(i, c) * rr * gamma[c]).epsilon(1e-14));
  }
  testing::GradCheck gc;
  da.resize(rows, d);
  gc.add("a", a.data(), da.data(), a.size());
  gc.add("gamma", gamma.data(), dgamma.data(), d);
  auto rep = gc.run(
      [&] {
        Mat<double> yy, hh;
        Vec<double> rs;
        fwd(yy, hh, rs);
        return yy.cwiseProduct(R).sum();
      },
      [&] {
        fwd(y, ahat, rstd);
        dgamma.setZero();
        ops::rms_norm_backward<double>(R, ahat, rstd.data(), gamma.data(), dgamma.data(), da);
      });
  INFO(rep.str());
  REQUIRE(rep.ok);
}

// =====================================================================================================================
// The reference's tests (tests/test_tr_mha.py), at the layer level
// =====================================================================================================================

TEST_CASE("ref 1: one K/V head per query head; shapes", "[token_routed][ref]") {
  // The reference builds a 2-layer model and checks every attention layer; here one layer of that config.
  // (The TR-MoE MLP of that test belongs to the model, not to this layer.)
  Rng rng(1);
  TRA layer(32, 4, rng, small_options(TrVariant::v1));
  REQUIRE(layer.n_heads() == 4);
  REQUIRE(layer.head_dim() == 8);
  REQUIRE(std::string(layer.attention_type()) == "tr_mha");
  // one K/V head per query head: K and V projections are full [D, D] (num_kv_heads == num_heads)
  REQUIRE(find_param(layer.parameters(), "k_proj.weight").shape == Shape{32, 32});
  REQUIRE(find_param(layer.parameters(), "v_proj.weight").shape == Shape{32, 32});
  const Mat<double> x = randn(16, 32, rng);
  TRA::Cache cache;
  const Mat<double> y = layer.forward(x, random_ids(2, 8, rng), plain(x, 2), cache);
  REQUIRE(y.rows() == 16);
  REQUIRE(y.cols() == 32);
  REQUIRE(y.allFinite());
  REQUIRE(layer.capabilities() == std::vector<std::string>{"tr_mha_routing"});
}

TEST_CASE("ref 2: the id prior is balanced and the context verifies it (v1)", "[token_routed][ref]") {
  Rng rng(7);
  TRA layer(32, 4, rng, small_options(TrVariant::v1));
  const Mat<double> xa = randn(64, 32, rng);
  const Mat<double> xb = xa + 3.0 * randn(64, 32, rng);
  const IdTensor ids = iota_ids(1, 64);
  TRA::Cache ca, cb;
  layer.forward(xa, ids, plain(xa, 1), ca);
  layer.forward(xb, ids, plain(xb, 1), cb);
  REQUIRE(ca.route_probs.rows() == 64);
  REQUIRE(ca.route_probs.cols() == 4);
  REQUIRE(ca.route_idx.rows() == 64);
  REQUIRE(ca.route_idx.cols() == 2);
  REQUIRE(ca.route_weights.rows() == 64);
  REQUIRE(ca.route_weights.cols() == 2);
  REQUIRE(ca.gate.size() == 64);
  REQUIRE((ca.route_probs.rowwise().sum().array() - 1.0).abs().maxCoeff() <= 1e-6);
  std::vector<int> count(4, 0);
  for (Index n = 0; n < 64; ++n) ++count[static_cast<std::size_t>(ca.route_idx(n, 0))];
  REQUIRE(count == std::vector<int>{16, 16, 16, 16});
  for (Index n = 0; n < 64; ++n) REQUIRE(ca.route_idx(n, 0) == n % 4);  // the primary wins at init
  REQUIRE_FALSE(allclose(ca.route_probs, cb.route_probs));          // context changes the distribution
}

TEST_CASE("ref 3: the adapters change Q and V, never K (v1)", "[token_routed][ref]") {
  Rng rng(9);
  TRA layer(32, 4, rng, small_options(TrVariant::v1));
  const Mat<double> x = randn(16, 32, rng);
  const IdTensor ids = random_ids(2, 8, rng);
  Param<double>& alpha = find_param(layer.parameters(), "adapter_output_gate");
  TRA::Cache c0, c1;
  alpha.value[0] = 0.0;
  layer.forward(x, ids, plain(x, 2), c0);
  alpha.value[0] = 0.1;
  layer.forward(x, ids, plain(x, 2), c1);
  REQUIRE(bitwise_equal(c0.k, c1.k));
  REQUIRE_FALSE(allclose(c0.q, c1.q));
  REQUIRE_FALSE(allclose(c0.v, c1.v));
}

TEST_CASE("ref 4: the KV cache equals full causal attention (v1 and v2)", "[token_routed][ref]") {
  for (TrVariant v : {TrVariant::v1, TrVariant::v2}) {
    Rng rng(13);
    TRA layer(32, 4, rng, small_options(v));
    randomise(layer, rng);
    const Index B = 2, T = 8;
    const Mat<double> x = randn(B * T, 32, rng);
    const IdTensor ids = random_ids(B, T, rng);
    TRA::Cache cache;
    const Mat<double> full = layer.forward(x, ids, plain(x, B), cache);
    // single-token steps, each with its own token id
    TRA::KVCache kv;
    Mat<double> steps(B * T, 32);
    for (Index t = 0; t < T; ++t) {
      Mat<double> xs(B, 32);
      IdTensor is({B, 1});
      for (Index b = 0; b < B; ++b) {
        xs.row(b) = x.row(b * T + t);
        is[b] = ids[b * T + t];
      }
      const Mat<double> ys = layer.forward_cached(xs, B, is, kv);
      for (Index b = 0; b < B; ++b) steps.row(b * T + t) = ys.row(b);
    }
    REQUIRE(kv.length == T);
    // the reference allows atol 2e-5 / rtol 2e-4 (float32); in double the two paths agree to round-off
    REQUIRE((steps - full).cwiseAbs().maxCoeff() <= 1e-12 * std::max(1.0, full.cwiseAbs().maxCoeff()));
    // a prefix of 3 positions then a chunk of 5
    TRA::KVCache kv2;
    Mat<double> chunks(B * T, 32);
    for (auto [t0, len] : {std::pair<Index, Index>{0, 3}, {3, 5}}) {
      Mat<double> xs(B * len, 32);
      IdTensor is({B, len});
      for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < len; ++t) {
          xs.row(b * len + t) = x.row(b * T + t0 + t);
          is[b * len + t] = ids[b * T + t0 + t];
        }
      const Mat<double> ys = layer.forward_cached(xs, B, is, kv2);
      for (Index b = 0; b < B; ++b) chunks.middleRows(b * T + t0, len) = ys.middleRows(b * len, len);
    }
    REQUIRE((chunks - full).cwiseAbs().maxCoeff() <= 1e-12 * std::max(1.0, full.cwiseAbs().maxCoeff()));
  }
}

TEST_CASE("ref 5: the router and the adapters get gradients (v1)", "[token_routed][ref]") {
  Rng rng(11);
  for (Index l = 0; l < 2; ++l) {  // both layers of the reference's 2-layer model
    TRA::Options o = small_options(TrVariant::v1);
    o.layer_idx = l;
    TRA layer(32, 4, rng, o);
    const Mat<double> x = randn(16, 32, rng);
    TRA::Cache cache;
    const Mat<double> y = layer.forward(x, random_ids(2, 8, rng), plain(x, 2), cache);
    layer.zero_grad();
    layer.backward(2.0 * y / static_cast<double>(y.size()), cache);  // L = mean(y^2)
    const auto ps = layer.parameters();
    for (const char* n : {"context_router_weight", "q_adapter_up", "v_adapter_up"})
      REQUIRE(find_param(ps, n).grad.cwiseAbs().maxCoeff() > 0);
  }
}

TEST_CASE("v1 with k = 1: w = 1, so the router gets exactly zero gradient", "[token_routed]") {
  Rng rng(15);
  TRA::Options o = small_options(TrVariant::v1);
  o.top_k = 1;
  TRA layer(32, 4, rng, o);
  randomise(layer, rng);
  const Mat<double> x = randn(16, 32, rng);
  TRA::Cache cache;
  layer.forward(x, random_ids(2, 8, rng), plain(x, 2), cache);
  REQUIRE((cache.route_weights.array() == 1.0).all());
  layer.zero_grad();
  layer.backward(randn(16, 32, rng), cache);
  const auto ps = layer.parameters();
  for (const char* n : {"context_router_weight", "verifier_gate_weight", "verifier_gate_bias"})
    REQUIRE(find_param(ps, n).grad.cwiseAbs().maxCoeff() == 0.0);
  for (const char* n : {"q_adapter_up", "v_adapter_down", "adapter_output_gate"})
    REQUIRE(find_param(ps, n).grad.cwiseAbs().maxCoeff() > 0.0);
}

TEST_CASE("ref 6: v2 is exactly neutral at init", "[token_routed][ref]") {
  Rng rng(17);
  TRA layer(32, 4, rng, small_options(TrVariant::v2));
  Param<double>& up = find_param(layer.parameters(), "qv_adapter_up");
  REQUIRE(up.shape == Shape{4, 4, 64});
  REQUIRE((up.value.array() != 0).count() == 0);
  const Mat<double> x = randn(16, 32, rng);
  const IdTensor ids = random_ids(2, 8, rng);
  TRA::Cache c0, cp, c1;
  const Mat<double> y0 = layer.forward(x, ids, plain(x, 2), c0);
  const Mat<double> yp = layer.forward_plain(x, plain(x, 2), cp);
  REQUIRE(bitwise_equal(y0, yp));  // stronger than the reference: against the plain-MHA computation
  init::normal(up.value, rng, 0.0, 0.02);
  const Mat<double> y1 = layer.forward(x, ids, plain(x, 2), c1);
  REQUIRE(bitwise_equal(c0.k, c1.k));
  REQUIRE_FALSE(allclose(c0.q, c1.q));
  REQUIRE_FALSE(allclose(c0.v, c1.v));
  REQUIRE_FALSE(allclose(y0, y1));
}

TEST_CASE("ref 7: v2 candidates are fixed, the context reweights them", "[token_routed][ref]") {
  Rng rng(19);
  TRA layer(32, 4, rng, small_options(TrVariant::v2));
  init::normal(find_param(layer.parameters(), "context_router_weight").value, rng, 0.0, 0.5);
  find_param(layer.parameters(), "verifier_gate_bias").value[0] = 4.0;
  const Mat<double> xa = randn(32, 32, rng);
  const Mat<double> xb = xa + randn(32, 32, rng);
  const IdTensor ids = iota_ids(1, 32);
  TRA::Cache ca, cb;
  layer.forward(xa, ids, plain(xa, 1), ca);
  layer.forward(xb, ids, plain(xb, 1), cb);
  REQUIRE(ca.route_idx == cb.route_idx);
  for (Index n = 0; n < 32; ++n) {
    REQUIRE(ca.route_idx(n, 0) != ca.route_idx(n, 1));
    REQUIRE(ca.route_idx(n, 0) == n % 4);        // slot 0 is always the primary
    REQUIRE(ca.route_idx(n, 1) == (n + 1) % 4);
  }
  REQUIRE_FALSE(allclose(ca.route_weights, cb.route_weights));
  REQUIRE((ca.route_weights.rowwise().sum().array() - 1.0).abs().maxCoeff() <= 1e-6);
  // closed form (docs/token_routed.md): w_p = sigmoid((c_p - c_s) + g (c[p] - c[s]))
  for (Index n = 0; n < 32; ++n) {
    const double a = 1.0 + ca.gate[n] * (ca.context(n, n % 4) - ca.context(n, (n + 1) % 4));
    REQUIRE(ca.route_weights(n, 0) == Approx(1.0 / (1.0 + std::exp(-a))).epsilon(1e-14));
  }
}

TEST_CASE("ref 8: v2's neutral branch can start learning", "[token_routed][ref]") {
  Rng rng(23);
  for (Index l = 0; l < 2; ++l) {
    TRA::Options o = small_options(TrVariant::v2);
    o.layer_idx = l;
    TRA layer(32, 4, rng, o);
    const Mat<double> x = randn(16, 32, rng);
    TRA::Cache cache;
    const Mat<double> y = layer.forward(x, random_ids(2, 8, rng), plain(x, 2), cache);
    layer.zero_grad();
    layer.backward(2.0 * y / static_cast<double>(y.size()), cache);
    const auto ps = layer.parameters();
    REQUIRE(find_param(ps, "qv_adapter_up").grad.cwiseAbs().maxCoeff() > 0);
    // everything else of the branch acts only through Delta = 0, so its gradient is exactly zero
    for (const char* n : {"qv_adapter_down", "context_router_weight", "verifier_gate_weight", "verifier_gate_bias",
                          "adapter_output_gate"})
      REQUIRE(find_param(ps, n).grad.cwiseAbs().maxCoeff() == 0.0);
  }
}

TEST_CASE("ref 9: v2 v-only adapts V alone", "[token_routed][ref]") {
  Rng rng(29);
  TRA layer(32, 4, rng, small_options(TrVariant::v2, TrTargets::v));
  REQUIRE(layer.route_targets() == "v");
  Param<double>& up = find_param(layer.parameters(), "qv_adapter_up");
  REQUIRE(up.shape.back() == 32);
  REQUIRE(layer.capabilities() ==
          std::vector<std::string>{"tr_mha_routing", "tr_mha_v2_routing", "tr_mha_targets_v"});
  const Mat<double> x = randn(16, 32, rng);
  const IdTensor ids = random_ids(2, 8, rng);
  TRA::Cache c0, c1;
  layer.forward(x, ids, plain(x, 2), c0);
  init::normal(up.value, rng, 0.0, 0.02);
  layer.forward(x, ids, plain(x, 2), c1);
  REQUIRE(bitwise_equal(c0.k, c1.k));
  REQUIRE(bitwise_equal(c0.q, c1.q));
  REQUIRE_FALSE(allclose(c0.v, c1.v));
}

// =====================================================================================================================
// Routing details, telemetry, parameter counts
// =====================================================================================================================

TEST_CASE("candidates: floor modulo with the layer shift; negative ids; top-k can leave the candidates",
          "[token_routed]") {
  Rng rng(31);
  TRA::Options o = small_options(TrVariant::v2);
  o.layer_idx = 3;
  TRA layer(32, 4, rng, o);
  const Mat<double> x = randn(6, 32, rng);
  IdTensor ids({1, 6});
  const std::int64_t vals[6] = {0, 1, 5, -1, -6, 1000001};
  for (int i = 0; i < 6; ++i) ids[i] = vals[i];
  TRA::Cache c;
  layer.forward(x, ids, plain(x, 1), c);
  for (Index n = 0; n < 6; ++n) {
    const std::int64_t p = (((vals[n] + 3) % 4) + 4) % 4;
    REQUIRE(c.route_idx(n, 0) == p);
    REQUIRE(c.route_idx(n, 1) == (p + 1) % 4);
    // prior: c_p = 2, c_s = 1, c_o = -2 -> z - g c
    for (Index e = 0; e < 4; ++e) {
      const double prior = e == p ? 2.0 : e == (p + 1) % 4 ? 1.0 : -2.0;
      REQUIRE(c.joint_logits(n, e) - c.gate[n] * c.context(n, e) == Approx(prior).margin(1e-14));
    }
  }
  // v1 with a strong router: some tokens route to a non-candidate expert, slot order follows z
  TRA v1(32, 4, rng, small_options(TrVariant::v1));
  randomise(v1, rng, 2.0, 0.1, 3.0);
  const Mat<double> x2 = randn(64, 32, rng);
  const IdTensor ids2 = random_ids(1, 64, rng);
  TRA::Cache c2;
  v1.forward(x2, ids2, plain(x2, 1), c2);
  int noncand = 0;
  for (Index n = 0; n < 64; ++n) {
    const std::int64_t p = ids2[n] % 4, s = (p + 1) % 4;
    for (Index j = 0; j < 2; ++j) noncand += (c2.route_idx(n, j) != p && c2.route_idx(n, j) != s);
    REQUIRE(c2.joint_logits(n, c2.route_idx(n, 0)) >= c2.joint_logits(n, c2.route_idx(n, 1)));
    for (Index e = 0; e < 4; ++e)
      if (e != c2.route_idx(n, 0) && e != c2.route_idx(n, 1))
        REQUIRE(c2.joint_logits(n, e) <= c2.joint_logits(n, c2.route_idx(n, 1)));
  }
  REQUIRE(noncand > 0);
}

TEST_CASE("telemetry at init: gate, verifier, entropy H(softmax(2,1,-2,...)), balanced shares", "[token_routed]") {
  for (Index E : {4, 8}) {
    Rng rng(41);
    TRA::Options o = small_options(TrVariant::v2);
    o.num_experts = E;
    TRA layer(32, 4, rng, o);
    // inputs shaped like an RMSNorm output (|x| ~ sqrt(D)); ids uniform mod E
    const Mat<double> x = randn(8 * E, 32, rng);
    const IdTensor ids = iota_ids(1, 8 * E);
    TRA::Cache c;
    layer.forward(x, ids, plain(x, 1), c);
    const auto& t = layer.telemetry();
    REQUIRE(t.gate == Approx(0.1).epsilon(1e-15));
    REQUIRE(t.verifier_strength == Approx(0.1).epsilon(1e-12));
    REQUIRE(t.verifier_use == Approx(0.1).epsilon(1e-12));
    REQUIRE(t.route_entropy == Approx(E == 4 ? 0.7059 : 0.9369).margin(2e-3));  // the context adds ~0.004
    double sum = 0;
    for (double s : t.route_share) {
      REQUIRE(s == Approx(1.0 / static_cast<double>(E)).margin(1e-3));
      sum += s;
    }
    REQUIRE(sum == Approx(1.0).epsilon(1e-14));
    REQUIRE(t.items().size() == static_cast<std::size_t>(4 + E));
    REQUIRE(t.items()[4].first == "tr_mha_route_0");
  }
}

TEST_CASE("parameter counts match the reference's overhead formulas", "[token_routed]") {
  Rng rng(5);
  const Index D = 384, dh = 48;
  auto overhead = [&](TRA::Options o) {
    TRA layer(D, 8, rng, o);
    return count_parameters(layer.parameters()) - (4 * D * D + 2 * dh);
  };
  TRA::Options o;
  o.num_experts = 4;
  o.adapter_rank = 8;
  REQUIRE(overhead(o) == 51074);
  o.adapter_rank = 4;
  REQUIRE(overhead(o) == 26498);
  o.variant = TrVariant::v2;
  o.targets = TrTargets::qv;
  REQUIRE(overhead(o) == 20354);
  o.targets = TrTargets::q;
  REQUIRE(overhead(o) == 14210);
  o.targets = TrTargets::v;
  REQUIRE(overhead(o) == 14210);
}

TEST_CASE("construction: init statistics and names", "[token_routed]") {
  Rng rng(8);
  TRA::Options o = small_options(TrVariant::v1);
  o.num_layers = 8;
  TRA layer(64, 4, rng, o);
  const auto ps = layer.parameters();
  std::set<std::string> names;
  for (auto* p : ps) names.insert(p->name);
  REQUIRE(names == std::set<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                         "q_norm.weight", "k_norm.weight", "q_adapter_down", "q_adapter_up",
                                         "v_adapter_down", "v_adapter_up", "context_router_weight",
                                         "verifier_gate_weight", "verifier_gate_bias", "adapter_output_gate"});
  auto rms = [](const Param<double>& p) { return std::sqrt(p.value.squaredNorm() / static_cast<double>(p.numel())); };
  REQUIRE(rms(find_param(ps, "q_proj.weight")) == Approx(0.02).epsilon(0.05));
  REQUIRE(rms(find_param(ps, "o_proj.weight")) == Approx(0.02 / 4.0).epsilon(0.05));
  REQUIRE(rms(find_param(ps, "q_adapter_up")) == Approx(0.02).epsilon(0.1));
  REQUIRE(rms(find_param(ps, "context_router_weight")) == Approx(0.002).epsilon(0.1));
  REQUIRE(find_param(ps, "verifier_gate_weight").value.cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(find_param(ps, "verifier_gate_bias").value[0] == Approx(std::log(0.1 / 0.9)).epsilon(1e-15));
  REQUIRE(find_param(ps, "adapter_output_gate").value[0] == 0.1);
  REQUIRE((find_param(ps, "q_norm.weight").value.array() == 1.0).all());
}

// =====================================================================================================================
// Finite-difference gradients (double, L = <y, R>, every parameter and x, relative error <= 1e-6)
// =====================================================================================================================

TEST_CASE("gradcheck v1 with context-driven routing (non-candidate experts selected)", "[token_routed][grad]") {
  Rng rng(101);
  TRA layer(16, 2, rng, small_options(TrVariant::v1));
  randomise(layer, rng, 1.0, 0.2, 1.0, 0.7);
  const Index B = 2, T = 5;
  Mat<double> x = randn(B * T, 16, rng);
  const IdTensor ids = random_ids(B, T, rng);
  TRA::Cache c;
  layer.forward(x, ids, plain(x, B), c);
  // routing held fixed: the top-k margin dwarfs what a 1e-6 perturbation can move z by
  REQUIRE(min_topk_gap(c.joint_logits, 2) > 1e-3);
  int noncand = 0;
  for (Index n = 0; n < B * T; ++n) {
    const std::int64_t p = ids[n] % 4;
    for (Index j = 0; j < 2; ++j) noncand += c.route_idx(n, j) != p && c.route_idx(n, j) != (p + 1) % 4;
  }
  INFO("tokens with a non-candidate expert: " << noncand);
  const auto idx0 = c.route_idx;
  auto rep = gradcheck_layer(layer, x, B, &ids);
  INFO(rep.str());
  REQUIRE(rep.ok);
  layer.forward(x, ids, plain(x, B), c);
  REQUIRE(c.route_idx == idx0);
  WARN("v1 gradcheck worst relative error " << rep.worst_rel_error);
}

TEST_CASE("gradcheck v1 with top-3, layer shift, no qk-norm and a key mask", "[token_routed][grad]") {
  Rng rng(102);
  TRA::Options o = small_options(TrVariant::v1);
  o.top_k = 3;
  o.layer_idx = 2;
  o.use_qk_norm = false;
  o.verifier_temperature = 0.7;
  TRA layer(16, 4, rng, o);
  randomise(layer, rng, 0.8, 0.2, 0.5, 0.6);
  const Index B = 2, T = 4;
  Mat<double> x = randn(B * T, 16, rng);
  const IdTensor ids = random_ids(B, T, rng);
  Tensor<std::uint8_t> mask({B, T}, 1);
  mask[1] = 0;  // batch 0, key 1 masked
  AttnInputs<double> in(B, T);
  in.set_key_mask(mask);
  TRA::Cache c;
  layer.forward(x, ids, in, c);
  REQUIRE(min_topk_gap(c.joint_logits, 3) > 1e-3);
  auto rep = gradcheck_layer(layer, x, B, &ids, &mask);
  INFO(rep.str());
  REQUIRE(rep.ok);
}

TEST_CASE("gradcheck v2 for targets qv, q and v", "[token_routed][grad]") {
  for (TrTargets tg : {TrTargets::qv, TrTargets::q, TrTargets::v}) {
    Rng rng(103);
    TRA layer(16, 2, rng, small_options(TrVariant::v2, tg));
    randomise(layer, rng, 0.5, 0.2, 0.0, 0.8);
    const Index B = 2, T = 5;
    Mat<double> x = randn(B * T, 16, rng);
    const IdTensor ids = random_ids(B, T, rng);
    auto rep = gradcheck_layer(layer, x, B, &ids);
    INFO("targets " << to_string(tg) << "\n" << rep.str());
    REQUIRE(rep.ok);
    for (const auto& t : rep.tensors) {  // every parameter (and x) gets a non-zero gradient
      INFO(t.name);
      REQUIRE(t.max_abs_grad > 0);
    }
  }
}

TEST_CASE("gradcheck of the plain path and of v2 at init (zero up map)", "[token_routed][grad]") {
  Rng rng(104);
  TRA layer(16, 2, rng, small_options(TrVariant::v2));
  for (Param<double>* p : layer.parameters())  // scale the projections up so the attention is not uniform
    if (p->name.find("proj") != std::string::npos) p->value *= 7.5;
  const Index B = 2, T = 4;
  Mat<double> x = randn(B * T, 16, rng);
  const IdTensor ids = random_ids(B, T, rng);
  auto rep = gradcheck_layer(layer, x, B, nullptr);
  INFO(rep.str());
  REQUIRE(rep.ok);
  auto rep2 = gradcheck_layer(layer, x, B, &ids);
  INFO(rep2.str());
  REQUIRE(rep2.ok);
}

TEST_CASE("gradcheck of compile-time sizes (Heads 2, DHead 8): v1 causal with a key mask, v2", "[token_routed][grad]") {
  for (TrVariant v : {TrVariant::v1, TrVariant::v2}) {
    INFO("variant " << to_string(v));
    Rng rng(107);
    TRA::Options o = small_options(v);
    o.causal = true;
    TokenRoutedAttention<double, 2, 8> layer(16, 2, rng, o);
    randomise(layer, rng, 1.0, 0.2, 1.0, 0.7);
    const Index B = 2, T = 5;
    Mat<double> x = randn(B * T, 16, rng);
    const IdTensor ids = random_ids(B, T, rng);
    Tensor<std::uint8_t> mask({B, T}, 1);
    mask[T + 2] = 0;  // batch 1, key 2 masked
    AttnInputs<double> in(B, T);
    in.set_key_mask(mask);
    decltype(layer)::Cache c;
    layer.forward(x, ids, in, c);
    if (v == TrVariant::v1) REQUIRE(min_topk_gap(c.joint_logits, 2) > 1e-3);  // routing held under the perturbations
    auto rep = gradcheck_layer(layer, x, B, &ids, &mask);
    INFO(rep.str());
    REQUIRE(rep.ok);
    for (const auto& t : rep.tensors) {
      INFO(t.name);
      CHECK(t.max_abs_grad > 0);
    }
  }
}

TEST_CASE("gradients accumulate over backward calls; compile-time sizes give the same bits", "[token_routed]") {
  Rng rng(105);
  TRA layer(32, 4, rng, small_options(TrVariant::v1));
  randomise(layer, rng);
  Rng rng2(105);
  TokenRoutedAttention<double, 4, 8> fixed(32, 4, rng2, small_options(TrVariant::v1));
  const auto pd = layer.parameters(), pf = fixed.parameters();
  for (std::size_t i = 0; i < pd.size(); ++i) pf[i]->value = pd[i]->value;
  const Mat<double> x = randn(16, 32, rng), dy = randn(16, 32, rng);
  const IdTensor ids = random_ids(2, 8, rng);
  TRA::Cache c;
  layer.zero_grad();
  const Mat<double> y = layer.forward(x, ids, plain(x, 2), c);
  const Mat<double> dx = layer.backward(dy, c);
  std::vector<Vec<double>> g1;
  for (auto* p : pd) g1.push_back(p->grad);
  layer.backward(dy, c);
  for (std::size_t i = 0; i < pd.size(); ++i) REQUIRE(pd[i]->grad.isApprox(2.0 * g1[i], 1e-14));

  decltype(fixed)::Cache cf;
  fixed.zero_grad();
  const Mat<double> yf = fixed.forward(x, ids, plain(x, 2), cf);
  const Mat<double> dxf = fixed.backward(dy, cf);
  REQUIRE((yf - y).cwiseAbs().maxCoeff() <= 1e-14);
  REQUIRE((dxf - dx).cwiseAbs().maxCoeff() <= 1e-13);
  for (std::size_t i = 0; i < pd.size(); ++i) REQUIRE((pf[i]->grad - g1[i]).cwiseAbs().maxCoeff() <= 1e-13);
  decltype(fixed)::KVCache kv;  // the cached path with compile-time sizes
  const Mat<double> yc = fixed.forward_cached(x, 2, ids, kv);
  REQUIRE((yc - y).cwiseAbs().maxCoeff() <= 1e-13);
}

TEST_CASE("1 and 2 threads give identical bits", "[token_routed][threads]") {
  for (TrVariant v : {TrVariant::v1, TrVariant::v2}) {
    Rng rng(106);
    TRA::Options o = small_options(v);
    o.adapter_rank = 8;
    TRA layer(64, 4, rng, o);
    randomise(layer, rng, 0.3, 0.05, 0.0, 0.5);
    const Index B = 3, T = 40;  // 120 rows: several GEMM row blocks, 12 (b, h) pairs
    const Mat<double> x = randn(B * T, 64, rng), dy = randn(B * T, 64, rng);
    const IdTensor ids = random_ids(B, T, rng);
    auto run = [&](int threads, Mat<double>& y, Mat<double>& dx, std::vector<Vec<double>>& g) {
      set_num_threads(threads);
      TRA::Cache c;
      layer.zero_grad();
      y = layer.forward(x, ids, plain(x, B), c);
      dx = layer.backward(dy, c);
      g.clear();
      for (auto* p : layer.parameters()) g.push_back(p->grad);
    };
    Mat<double> y1, dx1, y2, dx2;
    std::vector<Vec<double>> g1, g2;
    run(1, y1, dx1, g1);
    run(2, y2, dx2, g2);
    set_num_threads(2);
#ifdef _OPENMP
    REQUIRE(num_threads() == 2);  // the comparison is between really different thread counts
#endif
    REQUIRE(bitwise_equal(y1, y2));
    REQUIRE(bitwise_equal(dx1, dx2));
    for (std::size_t i = 0; i < g1.size(); ++i) {
      INFO(layer.parameters()[i]->name);
      REQUIRE(std::memcmp(g1[i].data(), g2[i].data(), sizeof(double) * static_cast<std::size_t>(g1[i].size())) == 0);
    }
  }
}

TEST_CASE("float smoke test at a realistic size agrees with double", "[token_routed][float]") {
  Rng rng(107);
  const Index B = 2, T = 64, D = 128, H = 4;
  TRA::Options o;  // defaults: v1, E = 4, r = 8, k = 2
  TRA ld(D, H, rng, o);
  randomise(ld, rng, 0.1, 0.05, 0.0, 0.5);
  Rng rng2(1);
  TokenRoutedAttention<float> lf(D, H, rng2, o);
  const auto pd = ld.parameters();
  const auto pf = lf.parameters();
  for (std::size_t i = 0; i < pd.size(); ++i) pf[i]->value = pd[i]->value.cast<float>();
  const Mat<double> x = randn(B * T, D, rng), dy = randn(B * T, D, rng);
  const IdTensor ids = random_ids(B, T, rng, 1000);
  TRA::Cache cd;
  TokenRoutedAttention<float>::Cache cf;
  const Mat<double> yd = ld.forward(x, ids, plain(x, B), cd);
  const Mat<float> xf = x.cast<float>();
  const Mat<float> yf = lf.forward(xf, ids, plain(xf, B), cf);
  REQUIRE(cd.route_idx == cf.route_idx);
  ld.zero_grad();
  lf.zero_grad();
  const Mat<double> dxd = ld.backward(dy, cd);
  const Mat<float> dxf = lf.backward(dy.cast<float>(), cf);
  auto rel = [](const auto& a, const auto& b) {
    return (a.template cast<double>() - b).cwiseAbs().maxCoeff() / std::max(1e-30, b.cwiseAbs().maxCoeff());
  };
  REQUIRE(rel(yf, yd) < 1e-4);
  REQUIRE(rel(dxf, dxd) < 1e-4);
  for (std::size_t i = 0; i < pd.size(); ++i) {
    INFO(pd[i]->name);
    REQUIRE(rel(pf[i]->grad, pd[i]->grad) < 1e-3);
  }
}

// =====================================================================================================================
// Bad input
// =====================================================================================================================

TEST_CASE("bad arguments throw dea::Error naming the argument, expected and actual", "[token_routed][errors]") {
  Rng rng(9);
  auto ctor = [&](Index D, Index H, TRA::Options o) { TRA l(D, H, rng, o); };
  TRA::Options o = small_options(TrVariant::v1);
  REQUIRE_THROWS_WITH(ctor(30, 4, o), Catch::Contains("d_model (30)") && Catch::Contains("n_heads (4)"));
  REQUIRE_THROWS_WITH(ctor(12, 4, o), Catch::Contains("even") && Catch::Contains("got 3"));
  o.top_k = 5;
  REQUIRE_THROWS_WITH(ctor(32, 4, o), Catch::Contains("top_k") && Catch::Contains("got 5"));
  o = small_options(TrVariant::v2);
  o.top_k = 1;
  REQUIRE_THROWS_WITH(ctor(32, 4, o), Catch::Contains("requires top_k = 2") && Catch::Contains("got 1"));
  o = small_options(TrVariant::v1);
  o.verifier_gate_init = 1.0;
  REQUIRE_THROWS_WITH(ctor(32, 4, o), Catch::Contains("verifier_gate_init"));
  o = small_options(TrVariant::v1);
  o.verifier_temperature = 0;
  REQUIRE_THROWS_WITH(ctor(32, 4, o), Catch::Contains("verifier_temperature"));
  o.verifier_temperature = 1;
  o.num_experts = 0;
  REQUIRE_THROWS_WITH(ctor(32, 4, o), Catch::Contains("num_experts"));
  REQUIRE_THROWS_WITH((TokenRoutedAttention<double, 8, Dynamic>(32, 4, rng, small_options(TrVariant::v1))),
                      Catch::Contains("n_heads expected 8") && Catch::Contains("got 4"));
  REQUIRE_THROWS_WITH((TokenRoutedAttention<double, 4, 16>(32, 4, rng, small_options(TrVariant::v1))),
                      Catch::Contains("TokenRoutedAttention") && Catch::Contains("DHead") && Catch::Contains("got 8"));
  REQUIRE_THROWS_WITH(parse_tr_targets("k"), Catch::Contains("got 'k'"));
  REQUIRE_THROWS_WITH(parse_tr_variant("v3"), Catch::Contains("got 'v3'"));
  REQUIRE(parse_tr_variant("token_routed_mha_v2") == TrVariant::v2);

  o = small_options(TrVariant::v1);
  o.vocab_size = 64;
  TRA layer(32, 4, rng, o);
  TRA::Cache c;
  const Mat<double> x = randn(12, 32, rng);
  const IdTensor ids = random_ids(2, 6, rng);
  const Mat<double> x31 = randn(12, 31, rng);
  REQUIRE_THROWS_WITH(layer.forward(x31, ids, plain(x31, 2), c),
                      Catch::Contains("x expected 32 columns") && Catch::Contains("[12, 31]"));
  REQUIRE_THROWS_WITH(layer.forward(x, ids, AttnInputs<double>(5, 6), c),
                      Catch::Contains("x: expected B*T = 30 rows") && Catch::Contains("got 12"));
  REQUIRE_THROWS_WITH(layer.forward(x, ids, AttnInputs<double>(), c), Catch::Contains("attention inputs are empty"));
  REQUIRE_THROWS_WITH(AttnInputs<double>(0, 6), Catch::Contains("batch must be positive"));
  REQUIRE_THROWS_WITH(layer.forward(x, random_ids(3, 4, rng), plain(x, 2), c),
                      Catch::Contains("token_ids expected shape [2, 6]") && Catch::Contains("got [3, 4]"));
  IdTensor bad = ids;
  bad[7] = 64;
  REQUIRE_THROWS_WITH(layer.forward(x, bad, plain(x, 2), c),
                      Catch::Contains("token_ids[7]") && Catch::Contains("[0, 64)") && Catch::Contains("got 64"));
  bad[7] = -1;
  REQUIRE_THROWS_WITH(layer.forward(x, bad, plain(x, 2), c), Catch::Contains("got -1"));
  Mat<double> xn = x;
  xn(4, 9) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(layer.forward(xn, ids, plain(xn, 2), c),
                      Catch::Contains("non-finite") && Catch::Contains("row 4, column 9"));
  xn(4, 9) = INFINITY;
  REQUIRE_THROWS_AS(layer.forward(xn, ids, plain(xn, 2), c), Error);
  Tensor<std::uint8_t> mask({2, 5}, 1);
  AttnInputs<double> masked(2, 6);  // a key mask of the wrong shape is refused where it is set
  REQUIRE_THROWS_WITH(masked.set_key_mask(mask), Catch::Contains("AttnInputs::set_key_mask: key_mask") &&
                                                     Catch::Contains("[2, 6]") && Catch::Contains("[2, 5]"));
  TRA::Cache empty;
  REQUIRE_THROWS_WITH(layer.backward(x, empty), Catch::Contains("run forward first"));
  layer.forward(x, ids, plain(x, 2), c);
  REQUIRE_THROWS_WITH(layer.backward(randn(12, 16, rng), c), Catch::Contains("dy") && Catch::Contains("[12, 32]"));
  Mat<double> dyn = x;
  dyn(0, 0) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(layer.backward(dyn, c), Catch::Contains("non-finite"));
  TRA::KVCache kv;
  layer.forward_cached(x, 2, ids, kv);
  REQUIRE_THROWS_WITH(layer.forward_cached(randn(3, 32, rng), 3, random_ids(3, 1, rng), kv),
                      Catch::Contains("batch expected 2"));
}

TEST_CASE("a query whose keys are all masked gives zeros, never NaN", "[token_routed][errors]") {
  Rng rng(12);
  TRA layer(32, 4, rng, small_options(TrVariant::v1));
  randomise(layer, rng);
  const Mat<double> x = randn(12, 32, rng);
  const IdTensor ids = random_ids(2, 6, rng);
  Tensor<std::uint8_t> mask({2, 6}, 1);
  mask[0] = 0;  // batch 0, key 0: query 0 of batch 0 sees no key under the causal mask
  AttnInputs<double> in(2, 6);
  in.set_key_mask(mask);
  TRA::Cache c;
  const Mat<double> y = layer.forward(x, ids, in, c);
  REQUIRE(y.allFinite());
  REQUIRE(y.row(0).cwiseAbs().maxCoeff() == 0.0);
  const Mat<double> dx = layer.backward(randn(12, 32, rng), c);
  REQUIRE(dx.allFinite());
  for (auto* p : layer.parameters()) REQUIRE(p->grad.allFinite());
}

// =====================================================================================================================
// Golden cases of the reference (tests/data/golden/tr_mha, described in tests/data/golden/README.md)
// =====================================================================================================================

TEST_CASE("golden tr_mha cases reproduce the reference", "[token_routed][golden]") {
  const std::string dir = std::string(DEA_TEST_DATA_DIR) + "/golden/tr_mha/";
  for (const char* name : {"v1_basic", "v2_qv_basic", "v2_v_only", "v2_init_neutral"}) {
    const auto res = interop::run_tr_mha_case<double>(dir + name + ".safetensors");
    INFO(res.str());
    REQUIRE(res.ok);
    WARN(name << ": worst error / tolerance " << res.worst_ratio);
    // every out.* tensor (7 or 6) and every gradient were compared
    std::size_t n_out = 0, n_grad = 0;
    for (const auto& t : res.tensors) (t.name.rfind("out.", 0) == 0 ? n_out : n_grad) += 1;
    REQUIRE(n_out == (std::string(name) == "v2_init_neutral" ? 7u : 6u));
    REQUIRE(n_grad == (std::string(name) == "v1_basic" ? 15u : 13u));
    REQUIRE(res.telemetry.size() == 8u);
    // Sharper: the reference recorded how far a pure-float64 evaluation lies from its numbers (it rounds a few
    // intermediates through float32). Ours is pure float64 too, so its distance must be that same number (to the
    // 4 digits recorded) up to double round-off.
    for (const auto& t : res.tensors) {
      if (t.ref_dev_pure_f64 < 0) continue;
      INFO(t.name << ": ours " << t.max_abs_error << ", pure-f64 reference " << t.ref_dev_pure_f64);
      REQUIRE(std::abs(t.max_abs_error - t.ref_dev_pure_f64) <=
              1e-3 * t.ref_dev_pure_f64 + 1e-13 * std::max(1.0, t.max_abs_ref));
    }
  }
}

TEST_CASE("golden v2_init_neutral: bitwise plain MHA, exact zero routed gradients", "[token_routed][golden]") {
  const auto st = io::SafeTensors::load(std::string(DEA_TEST_DATA_DIR) + "/golden/tr_mha/v2_init_neutral.safetensors");
  const auto opt = interop::tr_mha_options_from_metadata(st.metadata());
  Rng rng(0);
  TRA layer(32, 4, rng, opt);
  for (auto* p : layer.parameters()) st.get_into<double>(p->name, p->value.data(), p->numel());
  Mat<double> x(12, 32), go(12, 32);
  st.get_into<double>("in.x", x.data(), x.size());
  st.get_into<double>("in.grad_output", go.data(), go.size());
  const IdTensor ids = st.get<std::int64_t>("in.token_ids");
  TRA::Cache c, cp;
  const Mat<double> y = layer.forward(x, ids, plain(x, 2), c);
  REQUIRE(bitwise_equal(y, layer.forward_plain(x, plain(x, 2), cp)));
  layer.zero_grad();
  layer.backward(go, c);
  const auto ps = layer.parameters();
  for (const char* n : {"qv_adapter_down", "adapter_output_gate", "context_router_weight", "verifier_gate_weight",
                        "verifier_gate_bias"})
    REQUIRE(find_param(ps, n).grad.cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(find_param(ps, "qv_adapter_up").grad.cwiseAbs().maxCoeff() > 0.0);
}

TEST_CASE("golden cases in float within 1e-4", "[token_routed][golden][float]") {
  const std::string dir = std::string(DEA_TEST_DATA_DIR) + "/golden/tr_mha/";
  for (const char* name : {"v1_basic", "v2_qv_basic", "v2_v_only", "v2_init_neutral"}) {
    const auto res = interop::run_tr_mha_case<float>(dir + name + ".safetensors");
    INFO(res.str());
    REQUIRE(res.ok);
  }
}

TEST_CASE("the golden runner reports a mismatch instead of passing it", "[token_routed][golden]") {
  // A tolerance far below the reference's own float32 rounding must fail: the comparison is live.
  const auto res = interop::run_tr_mha_case<double>(std::string(DEA_TEST_DATA_DIR) + "/golden/tr_mha/v1_basic.safetensors",
                                               {1e-12, 1e-6});
  REQUIRE_FALSE(res.ok);
  REQUIRE_THROWS_AS(interop::run_tr_mha_case<double>(std::string(DEA_TEST_DATA_DIR) + "/golden/tr_mha/missing.safetensors"),
                    Error);
}

TEST_CASE("TokenRoutedAttention refuses the inputs it does not support, naming itself and the input",
          "[token_routed][errors]") {
  static_assert(!TRA::kSupport.oracle && TRA::kSupport.causal, "token-routed attention: causal masking, no oracle");
  Rng rng(13);
  TRA layer(32, 4, rng, small_options(TrVariant::v1));
  const Mat<double> x = randn(12, 32, rng);
  const IdTensor ids = random_ids(2, 6, rng);
  const Tensor<double> oracle({2, 6, 6}, 0.5);
  TRA::Cache c;
  AttnInputs<double> with_oracle(2, 6);
  with_oracle.set_oracle(oracle);
  REQUIRE_THROWS_WITH(layer.forward(x, ids, with_oracle, c), Catch::Contains("TokenRoutedAttention") &&
                                                                 Catch::Contains("oracle") &&
                                                                 Catch::Contains("not supported"));
  REQUIRE_THROWS_WITH(layer.forward_plain(x, with_oracle, c), Catch::Contains("TokenRoutedAttention") &&
                                                                  Catch::Contains("oracle"));
  AttnInputs<double> frozen(2, 6);
  frozen.set_frozen_alpha_hat(Tensor<double>({2, 4, 6, 6}, 0.5));
  REQUIRE_THROWS_WITH(layer.forward(x, ids, frozen, c), Catch::Contains("TokenRoutedAttention") &&
                                                            Catch::Contains("frozen_alpha_hat"));
  // what it supports runs: a key mask, causal masking, keep_maps
  Tensor<std::uint8_t> mask({2, 6}, 1);
  mask[3] = 0;
  AttnInputs<double> in(2, 6);
  in.set_key_mask(mask).set_causal(true).set_keep_maps(true);
  TRA::Cache c2;
  REQUIRE(layer.forward(x, ids, in, c2).allFinite());
  REQUIRE(layer.forward_plain(x, in, c2).allFinite());
}

}  // namespace test_token_routed
