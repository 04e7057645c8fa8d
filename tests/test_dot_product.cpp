// Tests of dea/attention/dot_product.hpp: the multi-head scaled dot-product baseline.
#include <catch2/catch.hpp>

#include "same_results.hpp"
#include <dea/attention/dot_product.hpp>
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dot_product {

using namespace dea;

namespace {

template <class S>
Mat<S> random_input(Index rows, Index cols, std::uint64_t seed, double stddev = 1.0) {
  Rng rng(seed);
  Mat<S> x(rows, cols);
  init::normal(x, rng, 0.0, stddev);
  return x;
}

/// Gives every bias a random value (they start at 0, which would hide a wrong bias gradient path).
template <class Att>
void randomise_biases(Att& att, std::uint64_t seed) {
  Rng rng(seed);
  for (auto* p : att.parameters())
    if (p->name.find(".bias") != std::string::npos) init::normal(p->value, rng, 0.0, 0.5);
}

/// Key mask [B, T] from a pattern string per batch row ('1' real, '0' padded).
Tensor<std::uint8_t> make_mask(const std::vector<std::string>& rows) {
  const Index B = static_cast<Index>(rows.size()), T = static_cast<Index>(rows[0].size());
  Tensor<std::uint8_t> m({B, T});
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) m[b * T + t] = rows[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)] == '1';
  return m;
}

/// Naive reference: loops straight from the formulas, in double, from the parameters by name.
Mat<double> reference_forward(DotProductAttention<double>& att, const Mat<double>& x, Index B,
                              const AttnInputs<double>& in) {
  const Index N = x.rows(), D = att.d_model(), H = att.n_heads(), dh = att.d_head(), T = N / B;
  auto params = att.parameters();
  auto lin = [&](const std::string& name, const Mat<double>& in) {
    const Param<double>& W = find_param(params, name + ".weight");
    Mat<double> out(in.rows(), D);
    for (Index n = 0; n < in.rows(); ++n)
      for (Index o = 0; o < D; ++o) {
        double acc = 0;
        for (Index i = 0; i < D; ++i) acc += in(n, i) * W.value[o * D + i];
        bool has_bias = false;
        for (auto* p : params) has_bias = has_bias || p->name == name + ".bias";
        if (has_bias) acc += find_param(params, name + ".bias").value[o];
        out(n, o) = acc;
      }
    return out;
  };
  const Mat<double> Q = lin("W_q", x), K = lin("W_k", x), V = lin("W_v", x);
  Mat<double> O = Mat<double>::Zero(N, D);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<std::size_t>(T));
        std::vector<bool> real(static_cast<std::size_t>(T));
        double mx = -INFINITY;
        for (Index j = 0; j < T; ++j) {
          double acc = 0;
          for (Index c = 0; c < dh; ++c) acc += Q(b * T + i, h * dh + c) * K(b * T + j, h * dh + c);
          s[j] = acc / std::sqrt(double(dh));
          real[j] = in.key_mask(b)[j] && !(in.causal() && j > i);
          if (real[j]) mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) continue;  // every key masked: zero row
        double z = 0;
        for (Index j = 0; j < T; ++j) z += real[j] ? std::exp(s[j] - mx) : 0.0;
        for (Index j = 0; j < T; ++j) {
          const double p = real[j] ? std::exp(s[j] - mx) / z : 0.0;
          for (Index c = 0; c < dh; ++c) O(b * T + i, h * dh + c) += p * V(b * T + j, h * dh + c);
        }
      }
  return lin("W_o", O);
}

struct Config {
  bool bias = true;
  bool causal = false;
  int mask = 0;  // 0 none, 1 some padded keys, 2 also a fully padded sequence
  double dropout = 0;
};

std::string describe(const Config& c) {
  return "bias=" + std::to_string(c.bias) + " causal=" + std::to_string(c.causal) + " mask=" + std::to_string(c.mask) +
         " dropout=" + std::to_string(c.dropout);
}

/// Finite-difference check of every parameter and of x with L = <y, R>. Returns the worst relative error.
template <class Att>
double gradcheck_attention(const Config& cfg, std::uint64_t seed) {
  const Index B = 2, T = 4, D = 6, H = 2, N = B * T;
  Rng init_rng(seed);
  typename Att::Options opt;
  opt.bias = cfg.bias;
  opt.dropout = cfg.dropout;
  Att att(D, H, init_rng, opt);
  if (cfg.bias) randomise_biases(att, seed + 1);
  Mat<double> x = random_input<double>(N, D, seed + 2);
  const Mat<double> R = testing::random_projection(N, D, seed + 3);
  Tensor<std::uint8_t> mask = cfg.mask == 1 ? make_mask({"1101", "1110"}) : make_mask({"0110", "0000"});
  Rng drop_rng(99);
  AttnInputs<double> in(B, T);
  in.set_causal(cfg.causal);
  if (cfg.mask) in.set_key_mask(mask);
  if (cfg.dropout > 0) in.set_training(true, &drop_rng);
  typename Att::Cache cache;
  Mat<double> dx = Mat<double>::Zero(N, D);
  auto objective = [&] {
    drop_rng.reseed(99);  // the same dropout mask at every evaluation
    const Mat<double> y = att.forward(x, in, cache);
    return (y.array() * R.array()).sum();
  };
  auto analytic = [&] {
    att.zero_grad();
    drop_rng.reseed(99);
    att.forward(x, in, cache);
    const Mat<double> g = att.backward(R, cache);
    dx = g;
  };
  // The key bias adds q_i . b_k to every key of row i: a constant shift that softmax ignores, so its exact
  // gradient is 0 and a relative error would compare rounding with rounding. It is checked on its own below,
  // in absolute terms; everything else must meet the relative tolerance and carry a real gradient.
  testing::GradCheck gc;
  gc.add_except(att.parameters(), {"W_k.bias"});
  gc.add("x", x.data(), dx.data(), x.size());
  const auto rep = gc.run(objective, analytic);
  INFO(describe(cfg) << "\n" << rep.str());
  CHECK(rep.ok);
  for (const auto& t : rep.tensors) CHECK(t.max_abs_grad > 1e-3);  // all-zero tensors would prove nothing
  if (cfg.bias) {
    testing::GradCheck::Options abs_opt;
    abs_opt.floor = 1.0;  // rel_error = absolute error
    testing::GradCheck gk(abs_opt);
    Param<double>& bk = find_param(att.parameters(), "W_k.bias");
    gk.add(bk.name, bk.value.data(), bk.grad.data(), bk.numel());
    const auto rk = gk.run(objective, analytic);
    INFO(rk.str());
    CHECK(rk.ok);
    CHECK(bk.grad.cwiseAbs().maxCoeff() < 1e-13);
  }
  return rep.worst_rel_error;
}

}  // namespace

TEST_CASE("DotProductAttention: sizes, parameter names and initialisation", "[dot_product]") {
  Rng rng(1);
  DotProductAttention<float> att(64, 4, rng);
  REQUIRE(att.d_model() == 64);
  REQUIRE(att.n_heads() == 4);
  REQUIRE(att.d_head() == 16);
  auto params = att.parameters();
  std::vector<std::string> names;
  for (auto* p : params) names.push_back(p->name);
  REQUIRE(names == std::vector<std::string>{"W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight",
                                            "W_v.bias", "W_o.weight", "W_o.bias"});
  const double bound = std::sqrt(6.0 / 128.0);
  for (auto* p : params) {
    REQUIRE(p->group == "main");
    if (p->name.find("bias") != std::string::npos) {
      REQUIRE(p->shape == Shape{64});
      REQUIRE(p->value.cwiseAbs().maxCoeff() == 0.0f);
    } else {
      REQUIRE(p->shape == Shape{64, 64});
      REQUIRE(p->value.cwiseAbs().maxCoeff() <= bound);
      REQUIRE(p->value.cwiseAbs().maxCoeff() > 0.9 * bound);  // fills the Xavier range
    }
  }
  DotProductAttention<float>::Options o;
  o.bias = false;
  DotProductAttention<float> nb(64, 4, rng, o);
  REQUIRE(nb.parameters().size() == 4);
  REQUIRE(count_parameters(nb.parameters()) == 4 * 64 * 64);
  DotProductAttention<double, 4, 16> fixed(64, 4, rng);
  REQUIRE(fixed.d_head() == 16);
}

TEST_CASE("DotProductAttention: forward equals the naive reference", "[dot_product]") {
  const Index B = 3, T = 5, D = 8, H = 2;
  Rng rng(2);
  DotProductAttention<double> att(D, H, rng);
  randomise_biases(att, 3);
  const Mat<double> x = random_input<double>(B * T, D, 4, 2.0);
  Tensor<std::uint8_t> mask = make_mask({"11111", "11010", "00000"});
  for (int variant = 0; variant < 4; ++variant) {
    AttnInputs<double> in(B, T);
    in.set_causal(variant & 1);
    if (variant & 2) in.set_key_mask(mask);
    DotProductAttention<double>::Cache cache;
    const Mat<double> y = att.forward(x, in, cache);
    const Mat<double> ref = reference_forward(att, x, B, in);
    INFO("variant " << variant);
    REQUIRE((y - ref).cwiseAbs().maxCoeff() < 1e-12);
    // attention rows sum to 1 (or are 0 when every key is masked), and masked keys get exactly 0
    for (Index bh = 0; bh < B * H; ++bh) {
      const Index b = bh / H;
      const ConstMatMap<double> P(cache.p.data() + bh * T * T, T, T);
      for (Index i = 0; i < T; ++i) {
        bool any = false;
        for (Index j = 0; j < T; ++j) {
          const bool real = (!in.has_key_mask() || mask[b * T + j]) && !(in.causal() && j > i);
          any = any || real;
          if (!real) REQUIRE(P(i, j) == 0.0);
        }
        REQUIRE(std::abs(P.row(i).sum() - (any ? 1.0 : 0.0)) < 1e-12);
      }
    }
  }
}

TEST_CASE("DotProductAttention: gradients match finite differences", "[dot_product][gradcheck]") {
  double worst = 0;
  std::uint64_t seed = 10;
  for (bool bias : {true, false})
    for (bool causal : {false, true})
      for (int mask : {0, 1, 2}) {
        Config c;
        c.bias = bias;
        c.causal = causal;
        c.mask = mask;
        worst = std::max(worst, gradcheck_attention<DotProductAttention<double>>(c, seed++));
        worst = std::max(worst, gradcheck_attention<DotProductAttention<double, 2, 3>>(c, seed++));
        worst = std::max(worst, gradcheck_attention<DotProductAttention<double, 2>>(c, seed++));
      }
  WARN("DotProductAttention worst gradient-check relative error: " << worst);
}

TEST_CASE("DotProductAttention: gradients with attention dropout", "[dot_product][gradcheck]") {
  Config c;
  c.dropout = 0.3;
  c.mask = 1;
  gradcheck_attention<DotProductAttention<double>>(c, 50);
  c.causal = true;
  gradcheck_attention<DotProductAttention<double, 2, 3>>(c, 51);
}

TEST_CASE("DotProductAttention: dropout is inverted, seeded and off in eval", "[dot_product]") {
  const Index B = 4, T = 16, D = 8, H = 2;
  Rng rng(5);
  DotProductAttention<double>::Options opt;
  opt.dropout = 0.25;
  DotProductAttention<double> att(D, H, rng, opt);
  const Mat<double> x = random_input<double>(B * T, D, 6);
  DotProductAttention<double>::Cache c1, c2, c3;
  AttnInputs<double> in(B, T);
  const Mat<double> y_eval = att.forward(x, in, c1);
  REQUIRE(c1.drop.size() == 0);
  Rng r1(7), r2(7);
  in.set_training(true, &r1);
  const Mat<double> ya = att.forward(x, in, c2);
  in.set_training(true, &r2);
  const Mat<double> yb = att.forward(x, in, c3);
  REQUIRE(ya == yb);  // the same seed gives the same mask
  REQUIRE((ya - y_eval).cwiseAbs().maxCoeff() > 1e-3);
  const Index n = c2.drop.size();
  REQUIRE(n == B * H * T * T);
  Index zeros = 0;
  for (Index k = 0; k < n; ++k) {
    REQUIRE((c2.drop[k] == 0.0 || std::abs(c2.drop[k] - 1.0 / 0.75) < 1e-15));
    zeros += c2.drop[k] == 0.0;
  }
  REQUIRE(std::abs(double(zeros) / n - 0.25) < 0.03);
  in.set_training(true, nullptr);
  REQUIRE_THROWS_WITH(att.forward(x, in, c3), Catch::Contains("DotProductAttention: rng") && Catch::Contains("dropout"));
}

TEST_CASE("DotProductAttention: fully masked rows give zeros, never NaN", "[dot_product]") {
  const Index B = 2, T = 4, D = 6, H = 3;
  Rng rng(8);
  DotProductAttention<double>::Options opt;
  opt.bias = false;
  DotProductAttention<double> att(D, H, rng, opt);
  const Mat<double> x = random_input<double>(B * T, D, 9);
  Tensor<std::uint8_t> mask = make_mask({"0111", "0000"});
  AttnInputs<double> in(B, T);
  in.set_key_mask(mask).set_causal(true);  // query 0 of batch 0 sees only key 0, which is padded
  DotProductAttention<double>::Cache cache;
  const Mat<double> y = att.forward(x, in, cache);
  REQUIRE(y.allFinite());
  REQUIRE(y.row(0).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(y.bottomRows(T).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(y.row(1).cwiseAbs().maxCoeff() > 0.0);
  const Mat<double> dy = testing::random_projection(B * T, D, 10);
  const Mat<double> dx = att.backward(dy, cache);
  REQUIRE(dx.allFinite());
  for (auto* p : att.parameters()) REQUIRE(p->grad.allFinite());
  // the fully padded sequence contributes nothing to dx
  REQUIRE(dx.bottomRows(T).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("DotProductAttention: backward accumulates", "[dot_product]") {
  const Index B = 2, T = 5, D = 8, H = 2;
  Rng rng(11);
  DotProductAttention<double> att(D, H, rng);
  randomise_biases(att, 12);
  const Mat<double> x = random_input<double>(B * T, D, 13);
  const Mat<double> dy = testing::random_projection(B * T, D, 14);
  AttnInputs<double> in(B, T);
  in.set_causal(true);
  DotProductAttention<double>::Cache cache;
  att.forward(x, in, cache);
  att.zero_grad();
  const Mat<double> dx1 = att.backward(dy, cache);
  std::vector<Vec<double>> once;
  for (auto* p : att.parameters()) once.push_back(p->grad);
  const Mat<double> dx2 = att.backward(dy, cache);
  REQUIRE(dx1 == dx2);  // the cache is not consumed
  std::size_t k = 0;
  for (auto* p : att.parameters()) {
    INFO(p->name);
    REQUIRE(p->grad.cwiseAbs().maxCoeff() > 0);
    REQUIRE((p->grad - 2.0 * once[k++]).cwiseAbs().maxCoeff() <= 1e-14 * (1 + p->grad.cwiseAbs().maxCoeff()));
  }
  att.zero_grad();
  for (auto* p : att.parameters()) REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("DotProductAttention: 1 and 2 threads give identical bits", "[dot_product][threads]") {
  const Index B = 6, T = 24, D = 64, H = 4;
  auto run = [&](int threads, Mat<float>& y, Mat<float>& dx, std::vector<Vec<float>>& grads) {
    set_num_threads(threads);
    Rng rng(15);
    DotProductAttention<float, 4, 16>::Options opt;
    opt.dropout = 0.1f;
    DotProductAttention<float, 4, 16> att(D, H, rng, opt);
    const Mat<float> x = random_input<float>(B * T, D, 16);
    Tensor<std::uint8_t> mask({B, T}, 1);
    for (Index t = 17; t < T; ++t) mask[2 * T + t] = 0;
    Rng drop(17);
    AttnInputs<float> in(B, T);
    in.set_key_mask(mask).set_training(true, &drop);
    DotProductAttention<float, 4, 16>::Cache cache;
    y = att.forward(x, in, cache);
    dx = att.backward(testing::random_projection(B * T, D, 18).cast<float>(), cache);
    for (auto* p : att.parameters()) grads.push_back(p->grad);
  };
  Mat<float> y1, y2, dx1, dx2;
  std::vector<Vec<float>> g1, g2;
  run(1, y1, dx1, g1);
  run(2, y2, dx2, g2);
  set_num_threads(1);
  REQUIRE(y1 == y2);
  REQUIRE(dx1 == dx2);
  for (std::size_t k = 0; k < g1.size(); ++k) REQUIRE(g1[k] == g2[k]);
}

TEST_CASE("DotProductAttention: float agrees with double on a realistic size", "[dot_product]") {
  const Index B = 4, T = 32, D = 64, H = 2;
  Rng r1(19), r2(19);
  DotProductAttention<double> ad(D, H, r1);
  DotProductAttention<float> af(D, H, r2);
  const Mat<double> x = random_input<double>(B * T, D, 20);
  AttnInputs<double> cd(B, T);
  AttnInputs<float> cf(B, T);
  cd.set_causal(true);
  cf.set_causal(true);
  DotProductAttention<double>::Cache kd;
  DotProductAttention<float>::Cache kf;
  const Mat<double> yd = ad.forward(x, cd, kd);
  const Mat<float> yf = af.forward(x.cast<float>(), cf, kf);
  REQUIRE((yd - yf.cast<double>()).cwiseAbs().maxCoeff() < 1e-5 * (1 + yd.cwiseAbs().maxCoeff()));
  const Mat<double> dy = testing::random_projection(B * T, D, 21);
  const Mat<double> dxd = ad.backward(dy, kd);
  const Mat<float> dxf = af.backward(dy.cast<float>(), kf);
  REQUIRE((dxd - dxf.cast<double>()).cwiseAbs().maxCoeff() < 1e-4 * (1 + dxd.cwiseAbs().maxCoeff()));
}

/// Runs forward and backward of Att (d_model D, H heads) on one batch; returns y, dx and the parameter gradients.
template <class Att>
std::vector<Mat<float>> run_once(Index B, Index T, Index D, Index H, bool causal, float dropout) {
  Rng rng(61);
  typename Att::Options opt;
  opt.dropout = dropout;
  Att att(D, H, rng, opt);
  randomise_biases(att, 62);
  const Mat<float> x = random_input<float>(B * T, D, 63);
  Tensor<std::uint8_t> mask({B, T}, 1);
  for (Index t = T - 5; t < T; ++t) mask[t] = 0;                  // padding at the end of sequence 0
  for (Index t = 0; t < T; ++t) mask[(B - 1) * T + t] = t % 3 != 1;  // holes in the last sequence
  Rng drop(64);
  AttnInputs<float> in(B, T);
  in.set_key_mask(mask).set_causal(causal);
  if (dropout > 0) in.set_training(true, &drop);
  typename Att::Cache cache;
  std::vector<Mat<float>> out{att.forward(x, in, cache)};
  out.push_back(att.backward(testing::random_projection(B * T, D, 65).cast<float>(), cache));
  for (auto* p : att.parameters()) out.push_back(p->grad);
  return out;
}

TEST_CASE("DotProductAttention: fixed Heads and DHead give the dynamic instance's bits", "[dot_product][fixed]") {
  // the per-head products take the same steps with a compile-time head width: every result is bit-identical
  const auto same = dea_tests::require_same_results;
  SECTION("d_model 64, 4 heads of 16, causal over two tiles and a key mask") {
    same(run_once<DotProductAttention<float, 4, 16>>(2, 80, 64, 4, true, 0.0f),
         run_once<DotProductAttention<float>>(2, 80, 64, 4, true, 0.0f));
  }
  SECTION("d_model 128, 8 heads of 16, dropout") {
    same(run_once<DotProductAttention<float, 8, 16>>(3, 20, 128, 8, false, 0.1f),
         run_once<DotProductAttention<float>>(3, 20, 128, 8, false, 0.1f));
  }
  SECTION("64-wide heads") {
    same(run_once<DotProductAttention<float, Dynamic, 64>>(2, 33, 128, 2, false, 0.0f),
         run_once<DotProductAttention<float>>(2, 33, 128, 2, false, 0.0f));
  }
}

TEST_CASE("DotProductAttention: bad arguments throw dea::Error naming them", "[dot_product][errors]") {
  Rng rng(22);
  REQUIRE_THROWS_WITH(DotProductAttention<double>(10, 3, rng), Catch::Contains("d_model") && Catch::Contains("3"));
  REQUIRE_THROWS_WITH(DotProductAttention<double>(0, 1, rng), Catch::Contains("d_model"));
  REQUIRE_THROWS_WITH(DotProductAttention<double>(8, 0, rng), Catch::Contains("n_heads"));
  REQUIRE_THROWS_WITH((DotProductAttention<double, 4>(8, 2, rng)), Catch::Contains("n_heads") && Catch::Contains("4"));
  REQUIRE_THROWS_WITH((DotProductAttention<double, 2, 8>(8, 2, rng)), Catch::Contains("DHead"));
  DotProductAttention<double>::Options bad;
  bad.dropout = 1.0;
  REQUIRE_THROWS_WITH(DotProductAttention<double>(8, 2, rng, bad), Catch::Contains("dropout"));
  bad.dropout = -0.1;
  REQUIRE_THROWS_AS(DotProductAttention<double>(8, 2, rng, bad), Error);

  DotProductAttention<double> att(8, 2, rng);
  DotProductAttention<double>::Cache cache;
  const AttnInputs<double> in(2, 3);
  const Mat<double> x = random_input<double>(6, 8, 23);
  REQUIRE_THROWS_WITH(att.backward(x, cache), Catch::Contains("cache is empty"));
  REQUIRE_THROWS_WITH(att.forward(random_input<double>(6, 7, 1), in, cache),
                      Catch::Contains("x: expected 8 columns") && Catch::Contains("got 7"));
  REQUIRE_THROWS_WITH(att.forward(x, AttnInputs<double>(4, 3), cache),
                      Catch::Contains("x: expected B*T = 12 rows") && Catch::Contains("got 6"));
  REQUIRE_THROWS_WITH(att.forward(x, AttnInputs<double>(), cache), Catch::Contains("attention inputs are empty"));
  REQUIRE_THROWS_WITH(AttnInputs<double>(0, 3), Catch::Contains("batch"));
  REQUIRE_THROWS_WITH(att.forward(x, AttnInputs<double>(2, 3, 4), cache), Catch::Contains("Tq = 3, Tk = 4"));
  Mat<double> xn = x;
  xn(4, 3) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(att.forward(xn, in, cache), Catch::Contains("x") && Catch::Contains("row 4, column 3"));
  xn(4, 3) = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_AS(att.forward(xn, in, cache), Error);
  Tensor<std::uint8_t> mask({2, 4}, 1);
  AttnInputs<double> masked(2, 3);
  REQUIRE_THROWS_WITH(masked.set_key_mask(mask), Catch::Contains("key_mask") && Catch::Contains("[2, 3]") &&
                                                     Catch::Contains("[2, 4]"));
  att.forward(x, in, cache);
  REQUIRE_THROWS_WITH(att.backward(random_input<double>(6, 6, 2), cache),
                      Catch::Contains("dy") && Catch::Contains("[6, 8]") && Catch::Contains("[6, 6]"));
  Mat<double> dyn = x;
  dyn(0, 0) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(att.backward(dyn, cache), Catch::Contains("dy"));
}

TEST_CASE("DotProductAttention: the into-y overload writes the bits of the returning one", "[dot_product]") {
  const Index B = 2, T = 4, D = 8, H = 2;
  Rng rng(24);
  DotProductAttention<double>::Options opt;
  opt.dropout = 0.2;
  DotProductAttention<double> att(D, H, rng, opt);
  const Mat<double> x = random_input<double>(B * T, D, 25);
  Tensor<std::uint8_t> mask = make_mask({"1101", "1110"});
  Rng r2(3), r3(3);
  AttnInputs<double> in(B, T);
  in.set_key_mask(mask).set_causal(true).set_training(true, &r2);
  DotProductAttention<double>::Cache c2, c3;
  const Mat<double> y2 = att.forward(x, in, c2);
  Mat<double> y3;
  in.set_training(true, &r3);
  att.forward(x, in, c3, y3);
  REQUIRE(y3 == y2);
}

TEST_CASE("DotProductAttention refuses the inputs it does not support, naming itself and the input",
          "[dot_product][errors]") {
  const Index B = 2, T = 3, D = 8, H = 2;
  Rng rng(26);
  DotProductAttention<double> att(D, H, rng);
  static_assert(!DotProductAttention<double>::kSupport.oracle && DotProductAttention<double>::kSupport.causal,
                "dot-product attention: causal masking, no oracle");
  DotProductAttention<double>::Cache cache;
  const Mat<double> x = random_input<double>(B * T, D, 27);
  const Tensor<double> oracle({B, T, T}, 0.5);
  auto refuses = [&](const AttnInputs<double>& in, const char* what) {
    REQUIRE_THROWS_WITH(att.forward(x, in, cache), Catch::Contains("DotProductAttention") && Catch::Contains(what) &&
                                                       Catch::Contains("not supported"));
  };
  AttnInputs<double> with_oracle(B, T);
  with_oracle.set_oracle(oracle);
  refuses(with_oracle, "oracle");
  AttnInputs<double> with_targets = with_oracle;
  with_targets.set_targets(Tensor<std::int64_t>({B, T}, 0));
  refuses(with_targets, "oracle");
  refuses(AttnInputs<double>(B, T).set_frozen_alpha_hat(Tensor<double>({B, H, T, T}, 0.5)), "frozen_alpha_hat");
  // what it supports runs: causal masking, keep_maps (its probabilities are always in the cache), training
  AttnInputs<double> ok(B, T);
  ok.set_causal(true).set_keep_maps(true).set_training(true, nullptr);
  REQUIRE(att.forward(x, ok, cache).allFinite());
  REQUIRE(cache.p.size() == B * H * T * T);
}

}  // namespace test_dot_product
