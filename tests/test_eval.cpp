// Tests of dea/eval: metrics against hand-computed values, the reference's tie-ranking Spearman, bands,
// subsampling, decision side accuracy, and the paired statistics (t-test, sign test, bootstrap).
#include <catch2/catch.hpp>
#include <dea/eval/metrics.hpp>

#include <cmath>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_eval {

using namespace dea;
using namespace dea::eval;

TEST_CASE("accuracy skips ignored labels", "[eval]") {
  // counted: positions 0..2 (label 1, 1, 1); correct: 0 and 2 -> 2/3
  REQUIRE(accuracy({1, 0, 1, 1}, {1, 1, 1, -100}) == Approx(2.0 / 3.0));
  REQUIRE(accuracy({}, {}) == 0.0);
  REQUIRE(accuracy({5}, {-100}) == 0.0);
  REQUIRE_THROWS_AS(accuracy({1, 2}, {1}), Error);
  AccuracyCounter c;
  c.add({1, 1}, {1, 0});   // 1 of 2
  c.add({3, 3, 3}, {3, 3, -100});  // 2 of 2
  REQUIRE(c.correct == 3);
  REQUIRE(c.total == 4);
  REQUIRE(c.value() == Approx(0.75));
}

TEST_CASE("alpha MAE, means and Pearson against hand values", "[eval]") {
  // |0.1-0.2| + |0.5-0.5| + |0.9-0.6| = 0.4, / 3
  REQUIRE(alpha_mae({0.1, 0.5, 0.9}, {0.2, 0.5, 0.6}) == Approx(0.4 / 3.0));
  REQUIRE(std::isnan(alpha_mae({}, {})));
  REQUIRE(mean({1.0, 2.0, 6.0}) == Approx(3.0));
  // x = 1..4, y = 2,4,5,9: sxy = 11, sxx = 5, syy = 26 -> r = 11 / sqrt(130)
  REQUIRE(pearson({1, 2, 3, 4}, {2, 4, 5, 9}) == Approx(11.0 / std::sqrt(130.0)).epsilon(1e-12));
  REQUIRE(pearson({1, 2, 3}, {3, 2, 1}) == Approx(-1.0));
  REQUIRE(std::isnan(pearson({1, 1, 1}, {1, 2, 3})));
  REQUIRE(std::isnan(pearson({1, 2, 3}, {0.5, 0.5, 0.5})));
  REQUIRE(std::isnan(pearson({1}, {2})));
  REQUIRE_THROWS_AS(pearson({1, 2}, {1, 2, 3}), Error);
}

TEST_CASE("Spearman uses argsort ranks without averaging ties", "[eval]") {
  // y ranks: 1->0, 3->2, 2->1, 4->3 = [0,2,1,3]; Pearson([0,1,2,3],[0,2,1,3]) = 4/5
  REQUIRE(spearman({10, 20, 30, 40}, {1, 3, 2, 4}) == Approx(0.8));
  // Ties: x = {1,1,2} ranks [0,1,2] (order of appearance), so perfect correlation with y = {1,2,3}; with
  // averaged ranks ([0.5,0.5,2]) it would be 0.866.
  REQUIRE(ordinal_ranks({1, 1, 2}) == std::vector<double>{0, 1, 2});
  REQUIRE(ordinal_ranks({3, 1, 2, 1}) == std::vector<double>{3, 0, 2, 1});
  REQUIRE(spearman({1, 1, 2}, {1, 2, 3}) == Approx(1.0));
  REQUIRE(spearman({1, 1, 2}, {3, 2, 1}) == Approx(-1.0));
  REQUIRE(std::isnan(spearman({2, 2, 2}, {1, 2, 3})));
  // Monotone transform invariance: Spearman of x and exp(x) is 1.
  REQUIRE(spearman({0.3, -1.0, 2.0, 0.1}, {std::exp(0.3), std::exp(-1.0), std::exp(2.0), std::exp(0.1)}) ==
          Approx(1.0));
}

TEST_CASE("bands use thresholds 0.10 and 0.50", "[eval]") {
  REQUIRE(band(0.0) == 0);
  REQUIRE(band(0.0999) == 0);
  REQUIRE(band(0.10) == 1);
  REQUIRE(band(0.4999) == 1);
  REQUIRE(band(0.50) == 2);
  REQUIRE(band(0.95) == 2);
  // bands a: 0,1,2,1; b: 0,2,2,1 -> 3 of 4 agree
  REQUIRE(band_agreement({0.05, 0.2, 0.6, 0.45}, {0.09, 0.6, 0.5, 0.1}) == Approx(0.75));
}

TEST_CASE("alpha_metrics bundles the metrics and subsamples above max_points", "[eval]") {
  const std::vector<double> ah{0.1, 0.5, 0.9, 0.3};
  const std::vector<double> ao{0.2, 0.5, 0.6, 0.0};
  const AlphaMetrics m = alpha_metrics(ah, ao);
  REQUIRE(m.n_points == 4);
  REQUIRE(m.mae == Approx((0.1 + 0.0 + 0.3 + 0.3) / 4));
  REQUIRE(m.alpha_hat_mean == Approx(0.45));
  REQUIRE(m.alpha_oracle_mean == Approx(1.3 / 4));
  // bands ah: 1,2,2,1 ; ao: 1,2,2,0 -> 3/4
  REQUIRE(m.band_agreement == Approx(0.75));
  REQUIRE(m.pearson == Approx(pearson(ah, ao)));
  // ah ranks [0,2,3,1], ao ranks [1,2,3,0] -> dx = -1.5,.5,1.5,-.5 ; dy = -.5,.5,1.5,-1.5 ; sxy = .75+.25+2.25+.75 = 4
  REQUIRE(m.spearman == Approx(0.8));
  REQUIRE(std::isnan(alpha_metrics({0.5}, {0.5}).mae));

  const std::size_t n = 250000;
  std::vector<double> x(n), y(n);
  Rng rng(3);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = rng.uniform();
    y[i] = x[i];
  }
  const AlphaMetrics big = alpha_metrics(x, y, 200000, 0);
  REQUIRE(big.n_points == 200000);
  REQUIRE(big.mae == 0.0);
  REQUIRE(big.pearson == Approx(1.0));
  REQUIRE(big.spearman == Approx(1.0));
  const auto i1 = subsample_indices(n, 200000, 0), i2 = subsample_indices(n, 200000, 0);
  const auto i3 = subsample_indices(n, 200000, 1);
  REQUIRE(i1 == i2);
  REQUIRE(i1 != i3);
  REQUIRE(std::is_sorted(i1.begin(), i1.end()));
  REQUIRE(std::adjacent_find(i1.begin(), i1.end()) == i1.end());  // distinct
  REQUIRE(i1.back() < n);
}

TEST_CASE("decision side accuracy is pair-weighted", "[eval]") {
  DecisionSideAccumulator d;
  REQUIRE(std::isnan(d.value()));
  d.add(0.5, 10);
  d.add(1.0, 30);
  d.add(0.2, 0);  // no pairs: ignored
  REQUIRE(d.n_pairs == 40);
  REQUIRE(d.value() == Approx((0.5 * 10 + 1.0 * 30) / 40));
}

TEST_CASE("regularized incomplete beta and the Student t CDF", "[eval][stats]") {
  // I_x(1,1) = x ; I_x(2,1) = x^2 ; I_x(1,b) = 1 - (1-x)^b ; I_1/2(a,a) = 1/2
  REQUIRE(incomplete_beta(1, 1, 0.3) == Approx(0.3).epsilon(1e-13));
  REQUIRE(incomplete_beta(2, 1, 0.7) == Approx(0.49).epsilon(1e-13));
  REQUIRE(incomplete_beta(1, 3, 0.2) == Approx(1 - 0.8 * 0.8 * 0.8).epsilon(1e-13));
  REQUIRE(incomplete_beta(4.5, 4.5, 0.5) == Approx(0.5).epsilon(1e-13));
  REQUIRE(incomplete_beta(2, 3, 0.0) == 0.0);
  REQUIRE(incomplete_beta(2, 3, 1.0) == 1.0);
  REQUIRE_THROWS_AS(incomplete_beta(0, 1, 0.5), Error);

  REQUIRE(student_t_cdf(0.0, 5) == Approx(0.5));
  // df = 1 is the Cauchy distribution: P(|T| > 1) = 1/2, CDF(t) = 1/2 + atan(t)/pi
  REQUIRE(student_t_two_sided_p(1.0, 1) == Approx(0.5).epsilon(1e-12));
  REQUIRE(student_t_cdf(3.0, 1) == Approx(0.5 + std::atan(3.0) / M_PI).epsilon(1e-12));
  // df = 2: P(|T| > t) = 1 - t / sqrt(t^2 + 2)
  REQUIRE(student_t_two_sided_p(2.0, 2) == Approx(1 - 2 / std::sqrt(6.0)).epsilon(1e-12));
  REQUIRE(student_t_cdf(-2.0, 2) == Approx(0.5 * (1 - 2 / std::sqrt(6.0))).epsilon(1e-12));
  // Tables: t = 2.0, df = 7 -> two-sided p = 0.0856 (numerical integration of the density: 0.0856193)
  REQUIRE(student_t_two_sided_p(2.0, 7) == Approx(0.0856193).epsilon(1e-5));
  // t(0.975; 10) = 2.228139 -> p = 0.05
  REQUIRE(student_t_two_sided_p(2.228139, 10) == Approx(0.05).epsilon(1e-5));
  REQUIRE(student_t_two_sided_p(std::numeric_limits<double>::infinity(), 3) == 0.0);
}

TEST_CASE("paired t-test on hand-worked differences", "[eval][stats]") {
  // d = 1,2,3,4: mean 2.5, sd = sqrt(5/3), t = 2.5 / (sd / 2) = sqrt(15), df = 3.
  const PairedTTest r = paired_t_test({2, 4, 6, 8}, {1, 2, 3, 4});
  REQUIRE(r.mean_diff == Approx(2.5));
  REQUIRE(r.sd_diff == Approx(std::sqrt(5.0 / 3.0)));
  REQUIRE(r.t == Approx(std::sqrt(15.0)));
  REQUIRE(r.df == 3);
  // df = 3 closed form: P(|T| > t) = 1 - (2/pi) (atan(u) + u / (1 + u^2)), u = t / sqrt(3)
  const double u = std::sqrt(15.0) / std::sqrt(3.0);
  REQUIRE(r.p_value == Approx(1 - 2 / M_PI * (std::atan(u) + u / (1 + u * u))).epsilon(1e-10));
  // Swapping the samples flips t, not p.
  const PairedTTest s = paired_t_test({1, 2, 3, 4}, {2, 4, 6, 8});
  REQUIRE(s.t == Approx(-r.t));
  REQUIRE(s.p_value == Approx(r.p_value));
  // Degenerate: constant non-zero differences -> p = 0; all zero -> NaN.
  REQUIRE(paired_t_test({2, 3}, {1, 2}).p_value == 0.0);
  REQUIRE(std::isnan(paired_t_test({1, 2}, {1, 2}).p_value));
  REQUIRE_THROWS_AS(paired_t_test({1}, {2}), Error);
  REQUIRE(mean_difference({1, 5}, {0, 2}) == Approx(2.0));
}

TEST_CASE("exact sign test", "[eval][stats]") {
  // 8 positive, 2 negative, 1 tie: n = 10, k = 2: p = 2 (C(10,0)+C(10,1)+C(10,2)) / 2^10 = 112/1024
  std::vector<double> a{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 5};
  std::vector<double> b{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 5};
  const SignTest r = sign_test(a, b);
  REQUIRE(r.n_pos == 8);
  REQUIRE(r.n_neg == 2);
  REQUIRE(r.n_ties == 1);
  REQUIRE(r.p_value == Approx(112.0 / 1024.0).epsilon(1e-12));
  // 5 of 5 positive: 2 / 32
  REQUIRE(sign_test({1, 1, 1, 1, 1}, {0, 0, 0, 0, 0}).p_value == Approx(0.0625).epsilon(1e-12));
  // 3 vs 3: 2 (1+6+15+20)/64 > 1 -> 1
  REQUIRE(sign_test({1, 1, 1, 0, 0, 0}, {0, 0, 0, 1, 1, 1}).p_value == 1.0);
  REQUIRE(sign_test({1, 2}, {1, 2}).p_value == 1.0);  // all ties
  // Large n stays finite: 1000 vs 0 -> 2^-999
  std::vector<double> big_a(1000, 1.0), big_b(1000, 0.0);
  const double p = sign_test(big_a, big_b).p_value;
  REQUIRE(p > 0);
  REQUIRE(std::log2(p) == Approx(-999.0).epsilon(1e-9));
}

TEST_CASE("paired bootstrap CI contains the mean and is deterministic", "[eval][stats]") {
  std::vector<double> a, b;
  Rng rng(11);
  for (int i = 0; i < 60; ++i) {
    const double base = rng.uniform();
    a.push_back(base + 0.1 + 0.05 * rng.normal());
    b.push_back(base);
  }
  const BootstrapCI c1 = paired_bootstrap_ci(a, b, 2000, 5);
  const BootstrapCI c2 = paired_bootstrap_ci(a, b, 2000, 5);
  const BootstrapCI c3 = paired_bootstrap_ci(a, b, 2000, 6);
  REQUIRE(c1.mean_diff == Approx(mean_difference(a, b)));
  REQUIRE(c1.lo < c1.mean_diff);
  REQUIRE(c1.mean_diff < c1.hi);
  REQUIRE(c1.lo == c2.lo);
  REQUIRE(c1.hi == c2.hi);
  REQUIRE((c1.lo != c3.lo || c1.hi != c3.hi));
  // The CI width is about 2 * 1.96 * sd / sqrt(n) with sd ~ 0.05: between 0.015 and 0.04.
  REQUIRE(c1.hi - c1.lo > 0.015);
  REQUIRE(c1.hi - c1.lo < 0.04);
  // Constant differences: every resample has the same mean.
  const BootstrapCI k = paired_bootstrap_ci({3, 4, 5}, {1, 2, 3}, 100, 0);
  REQUIRE(k.lo == Approx(2.0));
  REQUIRE(k.hi == Approx(2.0));
}

TEST_CASE("collect_labelled_cells pools labelled cells over heads in (b, h, i, j) order", "[eval]") {
  // B = 1, H = 2, T = 2. Oracle [1, 2, 2]: only (0, 1) and (1, 1) labelled; (1, 1) holds 1.2 -> clamped 0.95.
  Tensor<double> ah({1, 2, 2, 2});
  for (Index k = 0; k < 8; ++k) ah[k] = 0.1 * static_cast<double>(k);  // ah[h, i, j] = 0.1 (4h + 2i + j)
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor<double> orc({1, 2, 2});
  orc[0] = nan;
  orc[1] = 0.5;
  orc[2] = nan;
  orc[3] = 1.2;
  std::vector<double> h, o;
  collect_labelled_cells(ah, orc, nullptr, h, o);
  REQUIRE(h.size() == 4);
  REQUIRE(h[0] == Approx(0.1));  // h0 (0,1)
  REQUIRE(h[1] == Approx(0.3));  // h0 (1,1)
  REQUIRE(h[2] == Approx(0.5));  // h1 (0,1)
  REQUIRE(h[3] == Approx(0.7));  // h1 (1,1)
  REQUIRE(o == std::vector<double>{0.5, 0.95, 0.5, 0.95});
  // Key 1 padded: nothing is labelled any more.
  Tensor<std::uint8_t> km({1, 2});
  km[0] = 1;
  km[1] = 0;
  std::vector<double> h2, o2;
  collect_labelled_cells(ah, orc, &km, h2, o2);
  REQUIRE(h2.empty());
  // Per-head oracle [1, 2, 2, 2]: label only head 1, cell (1, 0).
  Tensor<double> ph({1, 2, 2, 2}, nan);
  ph[4 + 2] = 0.3;
  std::vector<double> h3, o3;
  collect_labelled_cells(ah, ph, nullptr, h3, o3);
  REQUIRE(h3 == std::vector<double>{ah[6]});
  REQUIRE(o3 == std::vector<double>{0.3});
  Tensor<double> wrong({1, 3, 3});
  REQUIRE_THROWS_AS(collect_labelled_cells(ah, wrong, nullptr, h3, o3), Error);
}

}  // namespace test_eval
