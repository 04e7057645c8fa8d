// dea/eval/stats.hpp: paired statistics for comparing two systems on the same items (benchmarks, seeds):
// mean difference, paired t-test with its two-sided p-value from the Student t distribution, the exact
// two-sided sign test, and a seeded paired-bootstrap confidence interval of the mean difference.
//
// The Student t CDF is computed from the regularized incomplete beta function,
//   P(|T| >= |t|) = I_{nu/(nu+t^2)}(nu/2, 1/2),
// evaluated with its continued fraction (modified Lentz), using the symmetry I_x(a,b) = 1 - I_{1-x}(b,a) where
// the fraction converges slowly (x > (a+1)/(a+b+2)).
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace dea::eval {

namespace detail {

/// Continued fraction of I_x(a, b) (Numerical-analysis form: 1/(1+d1/(1+d2/(1+...)))), modified Lentz.
inline double betacf(double a, double b, double x) {
  const double tiny = 1e-300, eps = 1e-16;
  const double qab = a + b, qap = a + 1.0, qam = a - 1.0;
  double c = 1.0;
  double d = 1.0 - qab * x / qap;
  if (std::abs(d) < tiny) d = tiny;
  d = 1.0 / d;
  double h = d;
  for (int m = 1; m <= 10000; ++m) {
    const double m2 = 2.0 * m;
    // even step: d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m))
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1.0 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    h *= d * c;
    // odd step: d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1.0 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::abs(del - 1.0) < eps) return h;
  }
  return h;  // not converged to 1e-16 after 10^4 terms; the value is still accurate to far below test needs
}

}  // namespace detail

/// Regularized incomplete beta I_x(a, b) for a, b > 0 and x in [0, 1].
inline double incomplete_beta(double a, double b, double x) {
  check(a > 0 && b > 0, "incomplete_beta: a and b must be positive, got a=", a, ", b=", b);
  check(x >= 0 && x <= 1, "incomplete_beta: x must be in [0, 1], got ", x);
  if (x == 0.0) return 0.0;
  if (x == 1.0) return 1.0;
  // front = x^a (1-x)^b / (a B(a, b))
  const double lbeta = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b);
  const double front = std::exp(lbeta + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1.0) / (a + b + 2.0)) return front * detail::betacf(a, b, x) / a;
  return 1.0 - front * detail::betacf(b, a, 1.0 - x) / b;
}

/// CDF of Student's t distribution with df > 0 degrees of freedom.
inline double student_t_cdf(double t, double df) {
  check(df > 0, "student_t_cdf: df must be positive, got ", df);
  if (std::isnan(t)) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, df / (df + t * t));  // P(T > |t|)
  return t > 0 ? 1.0 - tail : tail;
}

/// Two-sided p-value P(|T| >= |t|) of Student's t with df degrees of freedom.
inline double student_t_two_sided_p(double t, double df) {
  check(df > 0, "student_t_two_sided_p: df must be positive, got ", df);
  if (std::isnan(t)) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(t)) return 0.0;
  return std::min(1.0, incomplete_beta(0.5 * df, 0.5, df / (df + t * t)));
}

inline void check_paired(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  check(a.size() == b.size(), what, ": the two samples must have the same size, got ", a.size(), " and ", b.size());
  check(!a.empty(), what, ": empty samples");
}

/// Mean of a[i] - b[i].
inline double mean_difference(const std::vector<double>& a, const std::vector<double>& b) {
  check_paired(a, b, "mean_difference");
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] - b[i];
  return s / static_cast<double>(a.size());
}

struct PairedTTest {
  double mean_diff = 0;  ///< mean of d = a - b
  double sd_diff = 0;    ///< sample standard deviation of d (n - 1 in the denominator)
  double t = 0;          ///< mean_diff / (sd_diff / sqrt(n))
  double df = 0;         ///< n - 1
  double p_value = 0;    ///< two-sided
};

/// Paired t-test of H0: E[a - b] = 0. Needs n >= 2. When every difference is equal, sd is 0: t is +-inf with
/// p = 0 if the mean difference is non-zero, and t = p = NaN if it is zero (as SciPy's ttest_rel).
inline PairedTTest paired_t_test(const std::vector<double>& a, const std::vector<double>& b) {
  check_paired(a, b, "paired_t_test");
  check(a.size() >= 2, "paired_t_test: needs at least 2 pairs, got ", a.size());
  const double n = static_cast<double>(a.size());
  PairedTTest r;
  r.mean_diff = mean_difference(a, b);
  double ss = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double e = (a[i] - b[i]) - r.mean_diff;
    ss += e * e;
  }
  r.sd_diff = std::sqrt(ss / (n - 1.0));
  r.df = n - 1.0;
  if (r.sd_diff == 0.0) {
    if (r.mean_diff == 0.0) {
      r.t = r.p_value = std::numeric_limits<double>::quiet_NaN();
    } else {
      r.t = r.mean_diff > 0 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
      r.p_value = 0.0;
    }
    return r;
  }
  r.t = r.mean_diff / (r.sd_diff / std::sqrt(n));
  r.p_value = student_t_two_sided_p(r.t, r.df);
  return r;
}

struct SignTest {
  std::size_t n_pos = 0;   ///< pairs with a > b
  std::size_t n_neg = 0;   ///< pairs with a < b
  std::size_t n_ties = 0;  ///< pairs with a == b (dropped)
  double p_value = 1.0;    ///< exact two-sided: min(1, 2 P(X <= min(n_pos, n_neg))), X ~ Bin(n_pos + n_neg, 1/2)
};

/// Exact two-sided sign test of a against b; ties are dropped. With no untied pair, p = 1.
inline SignTest sign_test(const std::vector<double>& a, const std::vector<double>& b) {
  check_paired(a, b, "sign_test");
  SignTest r;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] > b[i]) ++r.n_pos;
    else if (a[i] < b[i]) ++r.n_neg;
    else ++r.n_ties;
  }
  const std::size_t n = r.n_pos + r.n_neg;
  if (n == 0) return r;
  const std::size_t k = std::min(r.n_pos, r.n_neg);
  // P(X <= k) = sum_{i<=k} C(n, i) 2^-n, summed in log space (stable for any n): log terms then log-sum-exp.
  const double nd = static_cast<double>(n);
  std::vector<double> logs;
  logs.reserve(k + 1);
  for (std::size_t i = 0; i <= k; ++i) {
    const double id = static_cast<double>(i);
    logs.push_back(std::lgamma(nd + 1) - std::lgamma(id + 1) - std::lgamma(nd - id + 1) - nd * std::log(2.0));
  }
  const double mx = *std::max_element(logs.begin(), logs.end());
  double s = 0;
  for (double l : logs) s += std::exp(l - mx);
  r.p_value = std::min(1.0, 2.0 * std::exp(mx + std::log(s)));
  return r;
}

struct BootstrapCI {
  double mean_diff = 0;  ///< mean of a - b on the full sample
  double lo = 0;         ///< lower percentile bound
  double hi = 0;         ///< upper percentile bound
};

/// Percentile bootstrap CI of the mean of a - b: `n_resamples` resamples of the n pairs with replacement
/// (indices from dea::Rng(seed)), the mean difference of each, and the (1-level)/2 and (1+level)/2 quantiles
/// of those means with linear interpolation between order statistics (NumPy's default percentile).
inline BootstrapCI paired_bootstrap_ci(const std::vector<double>& a, const std::vector<double>& b,
                                       std::size_t n_resamples = 10000, std::uint64_t seed = 0, double level = 0.95) {
  check_paired(a, b, "paired_bootstrap_ci");
  check(n_resamples >= 2, "paired_bootstrap_ci: n_resamples must be >= 2, got ", n_resamples);
  check(level > 0 && level < 1, "paired_bootstrap_ci: level must be in (0, 1), got ", level);
  const std::size_t n = a.size();
  std::vector<double> d(n);
  for (std::size_t i = 0; i < n; ++i) d[i] = a[i] - b[i];
  Rng rng(seed);
  std::vector<double> means(n_resamples);
  for (std::size_t r = 0; r < n_resamples; ++r) {
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += d[static_cast<std::size_t>(rng.below(n))];
    means[r] = s / static_cast<double>(n);
  }
  std::sort(means.begin(), means.end());
  auto quantile = [&](double q) {
    const double pos = q * static_cast<double>(n_resamples - 1);
    const auto lo = static_cast<std::size_t>(std::floor(pos));
    const std::size_t hi = std::min(lo + 1, n_resamples - 1);
    const double frac = pos - static_cast<double>(lo);
    return means[lo] + frac * (means[hi] - means[lo]);
  };
  BootstrapCI ci;
  ci.mean_diff = mean_difference(a, b);
  ci.lo = quantile(0.5 * (1.0 - level));
  ci.hi = quantile(0.5 * (1.0 + level));
  return ci;
}

}  // namespace dea::eval
