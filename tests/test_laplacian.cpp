// Tests of dea/attention/laplacian.hpp (First-Spike Laplacian attention) and of the
// ops it is built from: ops/activations.hpp, ops/l1_distance.hpp.
#include <catch2/catch.hpp>

#include "same_results.hpp"
// first: a header that opens dea::ops::detail before l1_distance.hpp, whose helpers live in dea::detail (an
// unqualified detail:: there once resolved to the wrong namespace and did not compile in this order)
#include <dea/ops/gelu.hpp>
#include <dea/attention/laplacian.hpp>
#include <dea/ops/activations.hpp>
#include <dea/ops/l1_distance.hpp>
#include <dea/ops/mse.hpp>
#include <dea/testing/gradcheck.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_laplacian {

using namespace dea;

namespace {

template <class S>
Mat<S> random_input(Index rows, Index cols, std::uint64_t seed, double stddev = 1.0) {
  Rng rng(seed);
  Mat<S> x(rows, cols);
  init::normal(x, rng, 0.0, stddev);
  return x;
}

Tensor<std::uint8_t> make_mask(const std::vector<std::string>& rows) {
  const Index B = static_cast<Index>(rows.size()), T = static_cast<Index>(rows[0].size());
  Tensor<std::uint8_t> m({B, T});
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < T; ++t) m[b * T + t] = rows[static_cast<std::size_t>(b)][static_cast<std::size_t>(t)] == '1';
  return m;
}

double sgn(double x) { return double(x > 0) - double(x < 0); }
double naive_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// Everything the naive reference computes: forward values and the gradients of L = <y, dy>.
struct Reference {
  Mat<double> y;
  std::vector<double> dist;  // [B, H, T, T]
  std::vector<double> p;     // [B, H, T, T]
  Mat<double> dx;
  std::map<std::string, Vec<double>> grad;
};

/// Naive reference from the formulas of laplacian.hpp's file comment (loops, double): no kernel of the library is used.
template <class Att>
Reference reference(Att& att, const Mat<double>& x, Index B, const AttnInputs<double>& in, const Mat<double>& dy) {
  const Index N = x.rows(), D = att.d_model(), H = att.n_heads(), dh = att.d_head(), T = N / B;
  auto params = att.parameters();
  auto has = [&](const std::string& n) {
    for (auto* p : params)
      if (p->name == n) return true;
    return false;
  };
  auto W = [&](const std::string& n, Index o, Index i) { return find_param(params, n + ".weight").value[o * D + i]; };
  auto bias = [&](const std::string& n, Index o) { return has(n + ".bias") ? find_param(params, n + ".bias").value[o] : 0.0; };
  auto lin = [&](const std::string& n, const Mat<double>& in) {
    Mat<double> out(in.rows(), D);
    for (Index r = 0; r < in.rows(); ++r)
      for (Index o = 0; o < D; ++o) {
        double acc = bias(n, o);
        for (Index i = 0; i < D; ++i) acc += in(r, i) * W(n, o, i);
        out(r, o) = acc;
      }
    return out;
  };
  const Vec<double>& theta = find_param(params, "theta").value;
  const Mat<double> Q = lin("q", x), K = lin("k", x), V = lin("v", x);
  Mat<double> U(N, D), Wl(N, D);
  for (Index r = 0; r < N; ++r)
    for (Index c = 0; c < D; ++c) {
      U(r, c) = naive_sigmoid(Q(r, c));
      Wl(r, c) = naive_sigmoid(K(r, c));
    }
  Reference ref;
  ref.dist.assign(static_cast<std::size_t>(B * H * T * T), 0.0);
  ref.p.assign(ref.dist.size(), 0.0);
  Mat<double> O = Mat<double>::Zero(N, D);
  auto idx = [&](Index b, Index h, Index i, Index j) { return static_cast<std::size_t>(((b * H + h) * T + i) * T + j); };
  auto real = [&](Index b, Index i, Index j) {
    return in.key_mask(b)[j] && !(in.causal() && j > i);
  };
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const double s = std::log(1.0 + std::exp(theta[h])) + 1e-6;
      for (Index i = 0; i < T; ++i) {
        double mx = -INFINITY;
        for (Index j = 0; j < T; ++j) {
          double d = 0;
          for (Index c = 0; c < dh; ++c) d += std::abs(U(b * T + i, h * dh + c) - Wl(b * T + j, h * dh + c));
          ref.dist[idx(b, h, i, j)] = d;
          if (real(b, i, j)) mx = std::max(mx, -d / s);
        }
        if (mx == -INFINITY) continue;
        double z = 0;
        for (Index j = 0; j < T; ++j)
          if (real(b, i, j)) z += std::exp(-ref.dist[idx(b, h, i, j)] / s - mx);
        for (Index j = 0; j < T; ++j) {
          const double p = real(b, i, j) ? std::exp(-ref.dist[idx(b, h, i, j)] / s - mx) / z : 0.0;
          ref.p[idx(b, h, i, j)] = p;
          for (Index c = 0; c < dh; ++c) O(b * T + i, h * dh + c) += p * V(b * T + j, h * dh + c);
        }
      }
    }
  ref.y = lin("o", O);

  // Backward of L = <y, dy>.
  auto lin_back = [&](const std::string& n, const Mat<double>& in, const Mat<double>& g) {
    Vec<double> gw = Vec<double>::Zero(D * D), gb = Vec<double>::Zero(D);
    for (Index r = 0; r < in.rows(); ++r)
      for (Index o = 0; o < D; ++o) {
        gb[o] += g(r, o);
        for (Index i = 0; i < D; ++i) gw[o * D + i] += g(r, o) * in(r, i);
      }
    ref.grad[n + ".weight"] = gw;
    if (has(n + ".bias")) ref.grad[n + ".bias"] = gb;
  };
  lin_back("o", O, dy);
  Mat<double> dO = Mat<double>::Zero(N, D);
  for (Index r = 0; r < N; ++r)
    for (Index i = 0; i < D; ++i)
      for (Index o = 0; o < D; ++o) dO(r, i) += dy(r, o) * W("o", o, i);
  Mat<double> dQ = Mat<double>::Zero(N, D), dK = dQ, dV = dQ;
  Vec<double> dtheta = Vec<double>::Zero(H);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      const double s = std::log(1.0 + std::exp(theta[h])) + 1e-6;
      std::vector<double> lam(static_cast<std::size_t>(T * T));
      double sum_lam_d = 0;
      for (Index i = 0; i < T; ++i) {
        // G_ij = <dL/dy_i, v_j> (here dL/dO, per head), Gbar_i = sum_m a_im G_im, Lambda = a (G - Gbar)
        std::vector<double> G(static_cast<std::size_t>(T));
        double gbar = 0;
        for (Index j = 0; j < T; ++j) {
          double g = 0;
          for (Index c = 0; c < dh; ++c) g += dO(b * T + i, h * dh + c) * V(b * T + j, h * dh + c);
          G[j] = g;
          gbar += ref.p[idx(b, h, i, j)] * g;
        }
        for (Index j = 0; j < T; ++j) {
          const double a = ref.p[idx(b, h, i, j)];
          lam[i * T + j] = a * (G[j] - gbar);
          sum_lam_d += lam[i * T + j] * ref.dist[idx(b, h, i, j)];
          for (Index c = 0; c < dh; ++c) dV(b * T + j, h * dh + c) += a * dO(b * T + i, h * dh + c);
        }
      }
      for (Index i = 0; i < T; ++i)
        for (Index c = 0; c < dh; ++c) {
          const double u = U(b * T + i, h * dh + c);
          double acc = 0;
          for (Index j = 0; j < T; ++j) acc += lam[i * T + j] * sgn(u - Wl(b * T + j, h * dh + c));
          dQ(b * T + i, h * dh + c) = -(1.0 / s) * u * (1 - u) * acc;  // dL/dq, the first sgn formula
        }
      for (Index j = 0; j < T; ++j)
        for (Index c = 0; c < dh; ++c) {
          const double w = Wl(b * T + j, h * dh + c);
          double acc = 0;
          for (Index i = 0; i < T; ++i) acc += lam[i * T + j] * sgn(U(b * T + i, h * dh + c) - w);
          dK(b * T + j, h * dh + c) = (1.0 / s) * w * (1 - w) * acc;  // dL/dk, the second sgn formula
        }
      dtheta[h] += naive_sigmoid(theta[h]) / (s * s) * sum_lam_d;  // dL/dtheta
    }
  ref.grad["theta"] = dtheta;
  lin_back("q", x, dQ);
  lin_back("k", x, dK);
  lin_back("v", x, dV);
  ref.dx = Mat<double>::Zero(N, D);
  for (Index r = 0; r < N; ++r)
    for (Index i = 0; i < D; ++i)
      for (Index o = 0; o < D; ++o)
        ref.dx(r, i) += dQ(r, o) * W("q", o, i) + dK(r, o) * W("k", o, i) + dV(r, o) * W("v", o, i);
  return ref;
}

/// Smallest |u_ic - w_jc| over the pairs (i, j) of one sequence and the channels c of one head: the distance of
/// the input from the kinks of |.|.
double kink_gap(const Mat<double>& u, const Mat<double>& w, Index B, Index H, Index dh) {
  const Index T = u.rows() / B;
  double gap = INFINITY;
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; ++j)
        for (Index c = 0; c < H * dh; ++c) gap = std::min(gap, std::abs(u(b * T + i, c) - w(b * T + j, c)));
  return gap;
}

struct Config {
  bool bias = true;
  bool causal = false;
  int mask = 0;  // 0 none, 1 some padded keys, 2 also a fully padded sequence
  double dropout = 0;
  double sigma0 = 0.7;
};

std::string describe(const Config& c) {
  return "bias=" + std::to_string(c.bias) + " causal=" + std::to_string(c.causal) + " mask=" + std::to_string(c.mask) +
         " dropout=" + std::to_string(c.dropout) + " sigma0=" + std::to_string(c.sigma0);
}

/// Finite-difference check of every parameter (theta included) and of x with L = <y, R>, on an input whose
/// smallest |u - w| is at least 1e-4 (a step of 1e-6 moves u and w by < 3e-7, so no kink is crossed).
/// Returns the worst relative error.
template <class Att>
double gradcheck_laplacian(const Config& cfg, std::uint64_t seed) {
  const Index B = 2, T = 4, D = 6, H = 2, N = B * T;
  for (int attempt = 0; attempt < 50; ++attempt, seed += 1000) {
    Rng init_rng(seed);
    typename Att::Options opt;
    opt.bias = cfg.bias;
    opt.dropout = cfg.dropout;
    opt.sigma0 = cfg.sigma0;
    Att att(D, H, init_rng, opt);
    Mat<double> x = random_input<double>(N, D, seed + 2, 1.5);
    const Mat<double> R = testing::random_projection(N, D, seed + 3);
    Tensor<std::uint8_t> mask = cfg.mask == 1 ? make_mask({"1101", "1110"}) : make_mask({"0110", "0000"});
    Rng drop_rng(99);
    AttnInputs<double> in(B, T);
    in.set_causal(cfg.causal);
    if (cfg.mask) in.set_key_mask(mask);
    if (cfg.dropout > 0) in.set_training(true, &drop_rng);
    typename Att::Cache cache;
    att.forward(x, in, cache);
    if (kink_gap(cache.u(), cache.w(), B, H, D / H) < 1e-4) continue;  // too close to a kink: draw another input
    Mat<double> dx = Mat<double>::Zero(N, D);
    auto objective = [&] {
      drop_rng.reseed(99);
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
    testing::GradCheck gc;
    gc.add(att.parameters());
    gc.add("x", x.data(), dx.data(), x.size());
    const auto rep = gc.run(objective, analytic);
    INFO(describe(cfg) << " seed " << seed << "\n" << rep.str());
    CHECK(rep.ok);
    for (const auto& t : rep.tensors) CHECK(t.max_abs_grad > 1e-4);  // all-zero tensors would prove nothing
    return rep.worst_rel_error;
  }
  FAIL("no input away from the |x| kinks found");
  return 1;
}

/// Mean row entropy of a [B, H, T, T] probability buffer (rows that are all zero are skipped).
template <class S>
double mean_row_entropy(const Vec<S>& p, Index T) {
  double total = 0;
  Index rows = 0;
  for (Index r = 0; r < p.size() / T; ++r) {
    double e = 0, sum = 0;
    for (Index j = 0; j < T; ++j) {
      const double a = p[r * T + j];
      sum += a;
      if (a > 0) e -= a * std::log(a);
    }
    if (sum > 0) {
      total += e;
      ++rows;
    }
  }
  return total / double(rows);
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------
// ops/activations.hpp

TEST_CASE("activations: sigmoid, softplus and the inverse", "[laplacian][ops]") {
  for (double x : {-800.0, -40.0, -3.0, -1e-3, 0.0, 2e-3, 1.5, 35.0, 800.0}) {
    INFO("x = " << x);
    const double s = ops::sigmoid(x);
    REQUIRE(std::isfinite(s));
    REQUIRE(s >= 0.0);
    REQUIRE(s <= 1.0);
    REQUIRE(std::abs(s - 1.0 / (1.0 + std::exp(-x))) <= 1e-16);
    const double sp = ops::softplus(x);
    REQUIRE(std::isfinite(sp));
    if (std::abs(x) < 30) REQUIRE(std::abs(sp - std::log1p(std::exp(x))) <= 1e-15 * (1 + sp));
    REQUIRE(ops::softplus_grad(x) == ops::sigmoid(x));
  }
  REQUIRE(ops::softplus(800.0) == 800.0);
  REQUIRE(ops::sigmoid(0.0f) == 0.5f);
  REQUIRE(ops::sigmoid_grad_from_output(0.25) == 0.1875);
  // theta0 = log(expm1(sigma0)) for the sweep's sigma0 and ds/dtheta = sigmoid(theta0)
  const double sig[3] = {0.35, 0.70, 1.40}, th[3] = {-0.86972, 0.01366, 1.11685}, dsd[3] = {0.2953, 0.5034, 0.7534};
  for (int k = 0; k < 3; ++k) {
    const double t = ops::softplus_inverse(sig[k]);
    REQUIRE(std::abs(t - th[k]) < 5e-6);
    REQUIRE(std::abs(ops::softplus(t) - sig[k]) < 1e-15);
    REQUIRE(std::abs(ops::sigmoid(t) - dsd[k]) < 5e-5);
    REQUIRE(std::abs(ops::sigmoid(t) - (1 - std::exp(-sig[k]))) < 1e-15);
  }
  REQUIRE(std::abs(ops::softplus(ops::softplus_inverse(50.0)) - 50.0) < 1e-13);
  REQUIRE(std::abs(ops::softplus(ops::softplus_inverse(1e-8)) - 1e-8) < 1e-20);
  REQUIRE_THROWS_WITH(ops::softplus_inverse(0.0, "sigma0"), Catch::Contains("sigma0") && Catch::Contains("> 0"));
  REQUIRE_THROWS_AS(ops::softplus_inverse(-1.0), Error);
  REQUIRE_THROWS_AS(ops::softplus_inverse(std::numeric_limits<double>::infinity()), Error);
}

TEST_CASE("activations: vectorised sigmoid, ReLU; mse", "[laplacian][ops]") {
  Mat<double> x(2, 5);
  x << -1000, -30, -1e-9, 0, 2.5, 1e-3, 17, 40, 1000, -2;
  Mat<double> u(2, 5);
  ops::sigmoid_into(x, u);
  REQUIRE(u.allFinite());
  for (Index k = 0; k < x.size(); ++k) REQUIRE(std::abs(u.data()[k] - ops::sigmoid(x.data()[k])) <= 4e-16);
  REQUIRE(u(0, 0) == 0.0);
  REQUIRE(u(1, 3) == 1.0);
  Mat<float> xf = x.cast<float>();
  ops::sigmoid_into(xf, xf);  // in place
  for (Index k = 0; k < x.size(); ++k) REQUIRE(std::abs(xf.data()[k] - ops::sigmoid(float(x.data()[k]))) <= 3e-7f);
  Mat<double> r, dr;
  ops::relu_forward<double>(x, r);
  REQUIRE(r(0, 0) == 0.0);
  REQUIRE(r(0, 3) == 0.0);
  REQUIRE(r(0, 4) == 2.5);
  const Mat<double> g = Mat<double>::Constant(2, 5, 3.0);
  ops::relu_backward<double>(g, x, dr);
  REQUIRE(dr(0, 3) == 0.0);  // relu'(0) = 0
  REQUIRE(dr(0, 2) == 0.0);
  REQUIRE(dr(0, 4) == 3.0);
  REQUIRE(dr(1, 0) == 3.0);
  // mse = mean squared error; its gradient by finite differences
  Mat<double> pred = random_input<double>(4, 3, 30), target = random_input<double>(4, 3, 31), dp;
  double manual = 0;
  for (Index k = 0; k < 12; ++k) manual += std::pow(pred.data()[k] - target.data()[k], 2) / 12;
  REQUIRE(std::abs(ops::mse_forward(pred, target) - manual) < 1e-15);
  ops::mse_backward<double>(pred, target, dp);
  testing::GradCheck gc;
  gc.add("pred", pred.data(), dp.data(), pred.size());
  const auto rep = gc.run([&] { return ops::mse_forward(pred, target); }, [&] { ops::mse_backward<double>(pred, target, dp); });
  INFO(rep.str());
  REQUIRE(rep.ok);
  REQUIRE_THROWS_WITH(ops::mse_forward(pred, Mat<double>(3, 4)), Catch::Contains("target"));
}

// ------------------------------------------------------------------------------------------------------------
// ops/l1_distance.hpp

TEST_CASE("l1_distance equals the naive triple loop bit for bit", "[laplacian][ops]") {
  const Mat<double> U = random_input<double>(7, 5, 1), W = random_input<double>(9, 5, 2);
  Mat<double> Dst(7, 9);
  ops::l1_distance(U, W, Dst);
  for (Index i = 0; i < 7; ++i)
    for (Index j = 0; j < 9; ++j) {
      double d = 0;
      for (Index c = 0; c < 5; ++c) d += std::abs(U(i, c) - W(j, c));
      REQUIRE(Dst(i, j) == d);
    }
  // fixed channel count and strided head slices (columns 5..9 of a [7, 15] matrix)
  const Mat<float> A = random_input<float>(7, 15, 3), Bm = random_input<float>(9, 15, 4);
  Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, 5, Eigen::RowMajor>, 0, Eigen::OuterStride<>> As(
      A.data() + 5, 7, 5, Eigen::OuterStride<>(15)),
      Bs(Bm.data() + 5, 9, 5, Eigen::OuterStride<>(15));
  Mat<float> Df(7, 9);
  ops::l1_distance<5>(As, Bs, Df);
  for (Index i = 0; i < 7; ++i)
    for (Index j = 0; j < 9; ++j) {
      float d = 0;
      for (Index c = 0; c < 5; ++c) d += std::abs(A(i, 5 + c) - Bm(j, 5 + c));
      REQUIRE(Df(i, j) == d);
    }
  Mat<double> wrong(7, 8);
  REQUIRE_THROWS_WITH(ops::l1_distance(U, W, wrong), Catch::Contains("Dst") && Catch::Contains("[7, 9]"));
}

TEST_CASE("l1_distance_backward matches finite differences away from kinks", "[laplacian][ops][gradcheck]") {
  Mat<double> U = random_input<double>(5, 4, 5), W = random_input<double>(6, 4, 6);
  const Mat<double> G = testing::random_projection(5, 6, 7);
  double gap = INFINITY;
  for (Index i = 0; i < 5; ++i)
    for (Index j = 0; j < 6; ++j)
      for (Index c = 0; c < 4; ++c) gap = std::min(gap, std::abs(U(i, c) - W(j, c)));
  REQUIRE(gap > 1e-4);
  Mat<double> gU(5, 4), gW(6, 4);
  auto objective = [&] {
    Mat<double> Dst(5, 6);
    ops::l1_distance(U, W, Dst);
    return (Dst.array() * G.array()).sum();
  };
  auto analytic = [&] {
    gU.setZero();
    gW.setZero();
    ops::l1_distance_backward(U, W, G, gU, gW);
  };
  testing::GradCheck gc;
  gc.add("U", U.data(), gU.data(), U.size());
  gc.add("W", W.data(), gW.data(), W.size());
  const auto rep = gc.run(objective, analytic);
  INFO(rep.str());
  REQUIRE(rep.ok);
  // ... and it accumulates
  Mat<double> gU2 = gU, gW2 = gW;
  ops::l1_distance_backward(U, W, G, gU2, gW2);
  REQUIRE((gU2 - 2 * gU).cwiseAbs().maxCoeff() < 1e-14);
  REQUIRE((gW2 - 2 * gW).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("l1_distance_backward: the kink convention sgn(0) = 0, on purpose", "[laplacian][ops][kink]") {
  // Exact ties u_ic == w_jc in many channels: rows 0 and 2 of U equal rows 1 and 3 of W, and channel 1 of row 4
  // equals channel 1 of every key.
  Mat<double> U = random_input<double>(5, 4, 8), W = random_input<double>(6, 4, 9);
  U.row(0) = W.row(1);
  U.row(2) = W.row(3);
  for (Index j = 0; j < 6; ++j) W(j, 1) = U(4, 1);
  const Mat<double> G = testing::random_projection(5, 6, 10);
  Mat<double> gU = Mat<double>::Zero(5, 4), gW = Mat<double>::Zero(6, 4);
  ops::l1_distance_backward(U, W, G, gU, gW);
  // The formulas with sgn(0) = 0, and with the other subgradients sgn(0) = +1 / -1.
  auto expect = [&](double sgn0, Mat<double>& eU, Mat<double>& eW) {
    eU.setZero(5, 4);
    eW.setZero(6, 4);
    for (Index i = 0; i < 5; ++i)
      for (Index j = 0; j < 6; ++j)
        for (Index c = 0; c < 4; ++c) {
          const double x = U(i, c) - W(j, c);
          const double sg = x == 0 ? sgn0 : sgn(x);
          eU(i, c) += G(i, j) * sg;
          eW(j, c) -= G(i, j) * sg;
        }
  };
  Mat<double> eU, eW;
  expect(0.0, eU, eW);
  REQUIRE((gU - eU).cwiseAbs().maxCoeff() < 1e-14);
  REQUIRE((gW - eW).cwiseAbs().maxCoeff() < 1e-14);
  for (double other : {1.0, -1.0}) {  // the ties are real: another convention gives another answer
    expect(other, eU, eW);
    REQUIRE((gU - eU).cwiseAbs().maxCoeff() > 0.1);
  }
  // Central differences are symmetric at a kink (|h| - |-h| = 0), so they agree with sgn(0) = 0 exactly there.
  auto objective = [&] {
    Mat<double> Dst(5, 6);
    ops::l1_distance(U, W, Dst);
    return (Dst.array() * G.array()).sum();
  };
  auto analytic = [&] {
    gU.setZero();
    gW.setZero();
    ops::l1_distance_backward(U, W, G, gU, gW);
  };
  testing::GradCheck gc;
  gc.add("U", U.data(), gU.data(), U.size());
  gc.add("W", W.data(), gW.data(), W.size());
  const auto rep = gc.run(objective, analytic);
  INFO(rep.str());
  REQUIRE(rep.ok);
}

// ------------------------------------------------------------------------------------------------------------
// LaplacianAttention

TEST_CASE("LaplacianAttention: parameter names, PyTorch default init, theta = log(expm1(sigma0))", "[laplacian]") {
  Rng rng(1);
  LaplacianAttention<double>::Options opt;
  opt.sigma0 = 0.35;
  LaplacianAttention<double> att(64, 2, rng, opt);
  REQUIRE(att.d_head() == 32);
  std::vector<std::string> names;
  for (auto* p : att.parameters()) names.push_back(p->name);
  REQUIRE(names == std::vector<std::string>{"q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias",
                                            "o.weight", "o.bias", "theta"});
  REQUIRE(count_parameters(att.parameters()) == 4 * (64 * 64 + 64) + 2);
  const double bound = 1.0 / 8.0;  // 1/sqrt(fan_in)
  for (auto* p : att.parameters()) {
    INFO(p->name);
    REQUIRE(p->group == "main");
    if (p->name == "theta") {
      REQUIRE(p->shape == Shape{2});
      REQUIRE(p->value[0] == std::log(std::expm1(0.35)));
      REQUIRE(p->value[1] == p->value[0]);
      continue;
    }
    REQUIRE(p->value.cwiseAbs().maxCoeff() <= bound);
    REQUIRE(p->value.cwiseAbs().maxCoeff() > 0.8 * bound);  // biases are drawn too, not zero
  }
  REQUIRE(std::abs(att.bandwidth(0) - (0.35 + 1e-6)) < 1e-15);
  REQUIRE_THROWS_WITH(att.bandwidth(2), Catch::Contains("h"));
  // theta is a constant fill: it consumes no random numbers, so the generator ends where 4 Linear layers leave it
  Rng a(5), b(5);
  LaplacianAttention<double> l(16, 2, a);
  for (int k = 0; k < 4 * (16 * 16 + 16); ++k) b.uniform();
  REQUIRE(a.next_u64() == b.next_u64());
  LaplacianAttention<float, 2, 8>::Options nb;
  nb.bias = false;
  LaplacianAttention<float, 2, 8> fixed(16, 2, rng, nb);
  REQUIRE(fixed.parameters().size() == 5);
}

TEST_CASE("LaplacianAttention: forward equals the naive reference, logits are -D/s", "[laplacian]") {
  const Index B = 3, T = 5, D = 8, H = 2;
  Rng rng(2);
  LaplacianAttention<double> att(D, H, rng);
  find_param(att.parameters(), "theta").value << -0.3, 0.9;  // two different bandwidths
  const Mat<double> x = random_input<double>(B * T, D, 4, 2.0);
  const Mat<double> dy = testing::random_projection(B * T, D, 5);
  Tensor<std::uint8_t> mask = make_mask({"11111", "11010", "00000"});
  for (int variant = 0; variant < 4; ++variant) {
    AttnInputs<double> in(B, T);
    in.set_causal(variant & 1);
    if (variant & 2) in.set_key_mask(mask);
    LaplacianAttention<double>::Cache cache;
    const Mat<double> y = att.forward(x, in, cache);
    const Reference ref = reference(att, x, B, in, dy);
    INFO("variant " << variant);
    REQUIRE((y - ref.y).cwiseAbs().maxCoeff() < 1e-12);
    for (std::size_t k = 0; k < ref.dist.size(); ++k) {
      REQUIRE(cache.dist[static_cast<Index>(k)] == Approx(ref.dist[k]).epsilon(1e-14));
      REQUIRE(std::abs(cache.p[static_cast<Index>(k)] - ref.p[k]) < 1e-14);
      REQUIRE(ref.dist[k] >= 0.0);
      REQUIRE(ref.dist[k] < double(D / H));
    }
    REQUIRE(cache.s[0] == std::log1p(std::exp(-0.3)) + 1e-6);
    // the backward follows the formulas (naive loops with sgn(0) = 0) to rounding
    att.zero_grad();
    const Mat<double> dx = att.backward(dy, cache);
    REQUIRE((dx - ref.dx).cwiseAbs().maxCoeff() < 1e-12 * (1 + ref.dx.cwiseAbs().maxCoeff()));
    for (auto* p : att.parameters()) {
      INFO(p->name);
      const Vec<double>& e = ref.grad.at(p->name);
      REQUIRE((p->grad - e).cwiseAbs().maxCoeff() < 1e-12 * (1 + e.cwiseAbs().maxCoeff()));
    }
  }
}

TEST_CASE("LaplacianAttention: gradients match finite differences", "[laplacian][gradcheck]") {
  double worst = 0;
  std::uint64_t seed = 100;
  for (bool bias : {true, false})
    for (bool causal : {false, true})
      for (int mask : {0, 1, 2}) {
        Config c;
        c.bias = bias;
        c.causal = causal;
        c.mask = mask;
        worst = std::max(worst, gradcheck_laplacian<LaplacianAttention<double>>(c, seed++));
        worst = std::max(worst, gradcheck_laplacian<LaplacianAttention<double, 2, 3>>(c, seed++));
        worst = std::max(worst, gradcheck_laplacian<LaplacianAttention<double, Eigen::Dynamic, 3>>(c, seed++));
      }
  for (double sigma0 : {0.35, 1.40}) {
    Config c;
    c.sigma0 = sigma0;
    c.mask = 1;
    worst = std::max(worst, gradcheck_laplacian<LaplacianAttention<double>>(c, seed++));
  }
  WARN("LaplacianAttention worst gradient-check relative error: " << worst);
}

TEST_CASE("LaplacianAttention: gradients with attention dropout", "[laplacian][gradcheck]") {
  Config c;
  c.dropout = 0.3;
  c.mask = 1;
  gradcheck_laplacian<LaplacianAttention<double>>(c, 300);
  c.causal = true;
  gradcheck_laplacian<LaplacianAttention<double, 2, 3>>(c, 301);
}

TEST_CASE("LaplacianAttention: exact ties u = w follow sgn(0) = 0, on purpose", "[laplacian][kink]") {
  // With q = k (same weights and biases) every query ties with its own key in every channel: u_i = w_i.
  const Index B = 2, T = 4, D = 6, H = 2;
  Rng rng(7);
  LaplacianAttention<double> att(D, H, rng);
  auto params = att.parameters();
  find_param(params, "k.weight").value = find_param(params, "q.weight").value;
  find_param(params, "k.bias").value = find_param(params, "q.bias").value;
  Mat<double> x = random_input<double>(B * T, D, 8, 1.5);
  const Mat<double> R = testing::random_projection(B * T, D, 9);
  const AttnInputs<double> in(B, T);
  LaplacianAttention<double>::Cache cache;
  att.forward(x, in, cache);
  REQUIRE(cache.u() == cache.w());  // the ties are exact
  for (Index bh = 0; bh < B * H; ++bh)
    for (Index i = 0; i < T; ++i) REQUIRE(cache.dist[bh * T * T + i * T + i] == 0.0);
  // ... and the only ones: every off-diagonal pair stays away from its kinks
  double gap = INFINITY;
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; ++j)
        for (Index c = 0; c < D; ++c)
          if (i != j) gap = std::min(gap, std::abs(cache.u()(b * T + i, c) - cache.w()(b * T + j, c)));
  REQUIRE(gap > 1e-4);
  // The analytic gradients equal the formulas with sgn(0) = 0 ...
  att.zero_grad();
  const Mat<double> dx = att.backward(R, cache);
  const Reference ref = reference(att, x, B, in, R);
  REQUIRE((dx - ref.dx).cwiseAbs().maxCoeff() < 1e-12);
  for (auto* p : params) REQUIRE((p->grad - ref.grad.at(p->name)).cwiseAbs().maxCoeff() < 1e-12);
  // ... and central differences, which are symmetric at the kink, agree. Perturbing q.weight moves u off the
  // tie in both directions (a one-sided subgradient +-1 would fail here); x and the k side stay smooth.
  Mat<double> gx = Mat<double>::Zero(B * T, D);
  auto objective = [&] { return (att.forward(x, in, cache).array() * R.array()).sum(); };
  auto analytic = [&] {
    att.zero_grad();
    att.forward(x, in, cache);
    const Mat<double> g = att.backward(R, cache);
    gx = g;  // a copy into the registered buffer (assigning the temporary would move a new buffer in)
  };
  testing::GradCheck gc;
  gc.add(params);
  gc.add("x", x.data(), gx.data(), x.size());
  const auto rep = gc.run(objective, analytic);
  INFO(rep.str());
  REQUIRE(rep.ok);
  // The tie is what makes the q.weight gradient: drop the diagonal convention and it changes.
  const Param<double>& wq = find_param(params, "q.weight");
  Vec<double> with_plus = Vec<double>::Zero(wq.numel());
  {
    // recompute dQ with sgn(0) = +1 on the diagonal (naively) and compare: it must differ
    const Mat<double> U = cache.u(), Wl = cache.w(), Vl = cache.v();
    const Index dh = D / H;
    Mat<double> dO = R * find_param(params, "o.weight").mat();
    Mat<double> dQ = Mat<double>::Zero(B * T, D);
    for (Index b = 0; b < B; ++b)
      for (Index h = 0; h < H; ++h) {
        const ConstMatMap<double> P(cache.p.data() + (b * H + h) * T * T, T, T);
        const double s = cache.s[h];
        for (Index i = 0; i < T; ++i) {
          std::vector<double> G(T);
          double gbar = 0;
          for (Index j = 0; j < T; ++j) {
            G[j] = dO.row(b * T + i).segment(h * dh, dh).dot(Vl.row(b * T + j).segment(h * dh, dh));
            gbar += P(i, j) * G[j];
          }
          for (Index c = 0; c < dh; ++c) {
            double acc = 0;
            for (Index j = 0; j < T; ++j) {
              const double diff = U(b * T + i, h * dh + c) - Wl(b * T + j, h * dh + c);
              acc += P(i, j) * (G[j] - gbar) * (diff == 0 ? 1.0 : sgn(diff));
            }
            const double u = U(b * T + i, h * dh + c);
            dQ(b * T + i, h * dh + c) = -(1.0 / s) * u * (1 - u) * acc;
          }
        }
      }
    Eigen::Map<Mat<double>>(with_plus.data(), D, D) = dQ.transpose() * x;
  }
  REQUIRE((with_plus - ref.grad.at("q.weight")).cwiseAbs().maxCoeff() > 1e-3);
}

TEST_CASE("LaplacianAttention: entropy rises with the bandwidth", "[laplacian]") {
  const Index B = 4, T = 16, D = 16, H = 2;
  Rng rng(10);
  LaplacianAttention<double> att(D, H, rng);
  const Mat<double> x = random_input<double>(B * T, D, 11);
  const AttnInputs<double> in(B, T);
  Param<double>& theta = find_param(att.parameters(), "theta");
  double last = 0;
  for (double scale : {0.5, 1.0, 2.0}) {
    theta.value.setConstant(ops::softplus_inverse(0.7 * scale));
    LaplacianAttention<double>::Cache cache;
    att.forward(x, in, cache);
    const double e = mean_row_entropy(cache.p, T);
    REQUIRE(e > last);
    REQUIRE(e < std::log(double(T)));
    last = e;
  }
}

TEST_CASE("LaplacianAttention: fully masked rows give zeros, never NaN", "[laplacian]") {
  const Index B = 2, T = 4, D = 6, H = 3;
  Rng rng(12);
  LaplacianAttention<double>::Options opt;
  opt.bias = false;
  LaplacianAttention<double> att(D, H, rng, opt);
  const Mat<double> x = random_input<double>(B * T, D, 13);
  Tensor<std::uint8_t> mask = make_mask({"0111", "0000"});
  AttnInputs<double> in(B, T);
  in.set_key_mask(mask).set_causal(true);
  LaplacianAttention<double>::Cache cache;
  const Mat<double> y = att.forward(x, in, cache);
  REQUIRE(y.allFinite());
  REQUIRE(y.row(0).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(y.bottomRows(T).cwiseAbs().maxCoeff() == 0.0);
  REQUIRE(y.row(1).cwiseAbs().maxCoeff() > 0.0);
  const Mat<double> dx = att.backward(testing::random_projection(B * T, D, 14), cache);
  REQUIRE(dx.allFinite());
  REQUIRE(dx.bottomRows(T).cwiseAbs().maxCoeff() == 0.0);
  for (auto* p : att.parameters()) REQUIRE(p->grad.allFinite());
  // a sharp kernel (s -> 1e-6) saturates without NaN
  find_param(att.parameters(), "theta").value.setConstant(-60.0);
  LaplacianAttention<double>::Cache c2;
  const Mat<double> y2 = att.forward(x, in, c2);
  REQUIRE(y2.allFinite());
  REQUIRE(att.backward(testing::random_projection(B * T, D, 15), c2).allFinite());
}

TEST_CASE("LaplacianAttention: backward accumulates", "[laplacian]") {
  const Index B = 2, T = 5, D = 8, H = 2;
  Rng rng(16);
  LaplacianAttention<double> att(D, H, rng);
  const Mat<double> x = random_input<double>(B * T, D, 17);
  const Mat<double> dy = testing::random_projection(B * T, D, 18);
  AttnInputs<double> in(B, T);
  in.set_causal(true);
  LaplacianAttention<double>::Cache cache;
  att.forward(x, in, cache);
  att.zero_grad();
  const Mat<double> dx1 = att.backward(dy, cache);
  std::vector<Vec<double>> once;
  for (auto* p : att.parameters()) once.push_back(p->grad);
  const Mat<double> dx2 = att.backward(dy, cache);
  REQUIRE(dx1 == dx2);
  std::size_t k = 0;
  for (auto* p : att.parameters()) {
    INFO(p->name);
    REQUIRE(p->grad.cwiseAbs().maxCoeff() > 0);
    REQUIRE((p->grad - 2.0 * once[k++]).cwiseAbs().maxCoeff() <= 1e-14 * (1 + p->grad.cwiseAbs().maxCoeff()));
  }
  att.zero_grad();
  for (auto* p : att.parameters()) REQUIRE(p->grad.cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("LaplacianAttention: 1 and 2 threads give identical bits", "[laplacian][threads]") {
  const Index B = 7, T = 24, D = 64, H = 2;
  auto run = [&](int threads, Mat<float>& y, Mat<float>& dx, std::vector<Vec<float>>& grads) {
    set_num_threads(threads);
    Rng rng(19);
    LaplacianAttention<float, 2, 32>::Options opt;
    opt.dropout = 0.1f;
    LaplacianAttention<float, 2, 32> att(D, H, rng, opt);
    const Mat<float> x = random_input<float>(B * T, D, 20);
    Tensor<std::uint8_t> mask({B, T}, 1);
    for (Index t = 11; t < T; ++t) mask[3 * T + t] = 0;
    Rng drop(21);
    AttnInputs<float> in(B, T);
    in.set_key_mask(mask).set_causal(true).set_training(true, &drop);
    LaplacianAttention<float, 2, 32>::Cache cache;
    y = att.forward(x, in, cache);
    dx = att.backward(testing::random_projection(B * T, D, 22).cast<float>(), cache);
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

TEST_CASE("LaplacianAttention: float agrees with double on the benchmark's size", "[laplacian]") {
  const Index B = 8, T = 32, D = 64, H = 2;
  Rng r1(23), r2(23);
  LaplacianAttention<double> ad(D, H, r1);
  LaplacianAttention<float, 2, 32> af(D, H, r2);
  const Mat<double> x = random_input<double>(B * T, D, 24);
  const AttnInputs<double> cd(B, T);
  const AttnInputs<float> cf(B, T);
  LaplacianAttention<double>::Cache kd;
  LaplacianAttention<float, 2, 32>::Cache kf;
  const Mat<double> yd = ad.forward(x, cd, kd);
  const Mat<float> yf = af.forward(x.cast<float>(), cf, kf);
  REQUIRE((yd - yf.cast<double>()).cwiseAbs().maxCoeff() < 1e-5 * (1 + yd.cwiseAbs().maxCoeff()));
  const Mat<double> dy = testing::random_projection(B * T, D, 25);
  const Mat<double> dxd = ad.backward(dy, kd);
  const Mat<float> dxf = af.backward(dy.cast<float>(), kf);
  REQUIRE((dxd - dxf.cast<double>()).cwiseAbs().maxCoeff() < 1e-4 * (1 + dxd.cwiseAbs().maxCoeff()));
  const double gd = find_param(ad.parameters(), "theta").grad.cwiseAbs().maxCoeff();
  const double ed = (find_param(ad.parameters(), "theta").grad -
                     find_param(af.parameters(), "theta").grad.cast<double>())
                        .cwiseAbs()
                        .maxCoeff();
  REQUIRE(ed < 1e-3 * (1 + gd));
}

/// Forward and backward of Att (d_model D, H heads) on one batch: y, dx and the parameter gradients.
template <class Att>
std::vector<Mat<float>> run_once(Index B, Index T, Index D, Index H, bool causal, float dropout) {
  Rng rng(71);
  typename Att::Options opt;
  opt.dropout = dropout;
  Att att(D, H, rng, opt);
  Rng brng(72);
  for (auto* p : att.parameters())
    if (p->name.find(".bias") != std::string::npos) init::normal(p->value, brng, 0.0, 0.5);
  const Mat<float> x = random_input<float>(B * T, D, 73);
  Tensor<std::uint8_t> mask({B, T}, 1);
  for (Index t = T - 4; t < T; ++t) mask[t] = 0;
  Rng drop(74);
  AttnInputs<float> in(B, T);
  in.set_key_mask(mask).set_causal(causal);
  if (dropout > 0) in.set_training(true, &drop);
  typename Att::Cache cache;
  std::vector<Mat<float>> out{att.forward(x, in, cache)};
  out.push_back(att.backward(testing::random_projection(B * T, D, 75).cast<float>(), cache));
  for (auto* p : att.parameters()) out.push_back(p->grad);
  return out;
}

TEST_CASE("LaplacianAttention: fixed Heads and DHead give the dynamic instance's bits", "[laplacian][fixed]") {
  // the distances, the softmax and the value products take the same steps with a compile-time head width
  const auto same = dea_tests::require_same_results;
  SECTION("d_model 64, 4 heads of 16, causal, key mask") {
    same(run_once<LaplacianAttention<float, 4, 16>>(2, 40, 64, 4, true, 0.0f),
         run_once<LaplacianAttention<float>>(2, 40, 64, 4, true, 0.0f));
  }
  SECTION("64-wide heads, dropout") {
    same(run_once<LaplacianAttention<float, 2, 64>>(2, 24, 128, 2, false, 0.1f),
         run_once<LaplacianAttention<float>>(2, 24, 128, 2, false, 0.1f));
  }
}

TEST_CASE("LaplacianAttention: bad arguments throw dea::Error naming them", "[laplacian][errors]") {
  Rng rng(26);
  REQUIRE_THROWS_WITH(LaplacianAttention<double>(10, 3, rng), Catch::Contains("d_model"));
  REQUIRE_THROWS_WITH((LaplacianAttention<double, 4>(8, 2, rng)), Catch::Contains("n_heads"));
  REQUIRE_THROWS_WITH((LaplacianAttention<double, 2, 8>(8, 2, rng)), Catch::Contains("DHead"));
  LaplacianAttention<double>::Options bad;
  bad.sigma0 = 0;
  REQUIRE_THROWS_WITH(LaplacianAttention<double>(8, 2, rng, bad), Catch::Contains("sigma0"));
  bad.sigma0 = 0.7;
  bad.dropout = 1.5;
  REQUIRE_THROWS_WITH(LaplacianAttention<double>(8, 2, rng, bad), Catch::Contains("dropout"));

  LaplacianAttention<double> att(8, 2, rng);
  LaplacianAttention<double>::Cache cache;
  const AttnInputs<double> in(2, 3);
  const Mat<double> x = random_input<double>(6, 8, 27);
  REQUIRE_THROWS_WITH(att.backward(x, cache), Catch::Contains("cache is empty"));
  REQUIRE_THROWS_WITH(att.forward(random_input<double>(6, 7, 1), in, cache),
                      Catch::Contains("LaplacianAttention: x") && Catch::Contains("got 7"));
  REQUIRE_THROWS_WITH(att.forward(x, AttnInputs<double>(4, 3), cache), Catch::Contains("x: expected B*T = 12 rows"));
  REQUIRE_THROWS_WITH(att.forward(x, AttnInputs<double>(), cache), Catch::Contains("attention inputs are empty"));
  Mat<double> xn = x;
  xn(2, 5) = -std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_WITH(att.forward(xn, in, cache), Catch::Contains("x") && Catch::Contains("row 2, column 5"));
  // a key mask of the wrong shape is refused where it is set, naming it and its shape
  Tensor<std::uint8_t> mask({3, 2}, 1);
  AttnInputs<double> masked(2, 3);
  REQUIRE_THROWS_WITH(masked.set_key_mask(mask), Catch::Contains("AttnInputs::set_key_mask: key_mask") &&
                                                     Catch::Contains("[3, 2]"));
  find_param(att.parameters(), "theta").value[1] = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(att.forward(x, in, cache), Catch::Contains("theta"));
  find_param(att.parameters(), "theta").value[1] = 0.0;
  att.forward(x, in, cache);
  REQUIRE_THROWS_WITH(att.backward(random_input<double>(3, 8, 2), cache), Catch::Contains("dy"));
}

TEST_CASE("LaplacianAttention: the into-y overload writes the bits of the returning one", "[laplacian]") {
  const Index B = 2, T = 4, D = 8, H = 2;
  Rng rng(28);
  LaplacianAttention<double>::Options opt;
  opt.dropout = 0.2;
  LaplacianAttention<double> att(D, H, rng, opt);
  const Mat<double> x = random_input<double>(B * T, D, 29);
  Tensor<std::uint8_t> mask = make_mask({"1101", "1110"});
  Rng r2(3), r3(3);
  AttnInputs<double> in(B, T);
  in.set_key_mask(mask).set_causal(true).set_training(true, &r2);
  LaplacianAttention<double>::Cache c2, c3;
  const Mat<double> y2 = att.forward(x, in, c2);
  Mat<double> y3;
  in.set_training(true, &r3);
  att.forward(x, in, c3, y3);  // into y
  REQUIRE(y3 == y2);
}

TEST_CASE("LaplacianAttention refuses the inputs it does not support, naming itself and the input",
          "[laplacian][errors]") {
  const Index B = 2, T = 3, D = 8, H = 2;
  Rng rng(30);
  LaplacianAttention<double> att(D, H, rng);
  static_assert(!LaplacianAttention<double>::kSupport.oracle && LaplacianAttention<double>::kSupport.causal,
                "Laplacian attention: causal masking, no oracle");
  LaplacianAttention<double>::Cache cache;
  const Mat<double> x = random_input<double>(B * T, D, 31);
  const Tensor<double> oracle({B, T, T}, 0.5);
  AttnInputs<double> with_oracle(B, T);
  with_oracle.set_oracle(oracle);
  REQUIRE_THROWS_WITH(att.forward(x, with_oracle, cache), Catch::Contains("LaplacianAttention") &&
                                                              Catch::Contains("oracle") && Catch::Contains("not supported"));
  AttnInputs<double> frozen(B, T);
  frozen.set_frozen_alpha_hat(Tensor<double>({B, H, T, T}, 0.5));
  REQUIRE_THROWS_WITH(att.forward(x, frozen, cache), Catch::Contains("LaplacianAttention") &&
                                                         Catch::Contains("frozen_alpha_hat") &&
                                                         Catch::Contains("not supported"));
  AttnInputs<double> ok(B, T);
  ok.set_causal(true).set_keep_maps(true);
  REQUIRE(att.forward(x, ok, cache).allFinite());
}

}  // namespace test_laplacian
