// dea/oracle/isotonic.hpp: increasing isotonic regression with bounded outputs, computed as scikit-learn's
// IsotonicRegression(y_min, y_max, increasing=True, out_of_bounds="clip") computes it. The NLI oracle calibrates
// alpha_raw on human labels with it (docs/bert.md, calibration: y_min 0, y_max 0.95).
//
// fit(x, y, w):
//   1. points of weight 0 are dropped (a negative or non-finite weight, and a non-finite x or y, is an error);
//   2. the points are sorted by x, then by y (numpy's lexsort((y, x)), stable);
//   3. ties in x are merged: going up the sorted points, a point joins the current group while its x is less than
//      1e-15 (numpy's finfo(float64).resolution) above the group's FIRST x; a group becomes one point at that first
//      x, with weight sum(w) and y = sum(w y) / sum(w), summed in sorted order (sklearn's _make_unique);
//   4. pool adjacent violators on the merged points (sklearn's _inplace_contiguous_isotonic_regression: equal
//      neighbours are pooled too, and each decreasing run is pooled at once before backtracking): the weighted
//      least-squares non-decreasing fit;
//   5. the fitted values are clipped to [y_min, y_max];
//   6. interior points whose fitted y equals both neighbours' are dropped from the thresholds (they change no
//      prediction): x_thresholds() / y_thresholds() are sklearn's X_thresholds_ / y_thresholds_.
// predict(t): t clipped to [x_min, x_max] (the merged points' range), then linear interpolation between the
//   thresholds as numpy.interp does it (scipy's interp1d hands float64 data to it): exactly y_j at a threshold x_j,
//   otherwise y_j + slope (t - x_j) with slope = (y_{j+1} - y_j) / (x_{j+1} - x_j). One threshold: constant.
//   NaN gives NaN.
//
// Where it departs from scikit-learn: a negative weight is an error here (sklearn silently drops it with the zero
// weights), and so is a fit whose every weight is 0. scikit-learn on SciPy >= 1.12 solves step 4 with
// scipy.optimize.isotonic_regression, which gives the same fit in exact arithmetic; its pooled means can differ
// from these in the last bits.
#pragma once

#include "../core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace dea::eval {

class IsotonicRegression {
public:
  /// Ties in x closer than this to a group's first x are merged (numpy's finfo(float64).resolution).
  static constexpr double kTieResolution = 1e-15;

  /// Outputs bounded to [y_min, y_max] (the oracle's calibrator: [0, 0.95]).
  explicit IsotonicRegression(double y_min = 0.0, double y_max = 0.95) : y_min_(y_min), y_max_(y_max) {
    check(!std::isnan(y_min) && !std::isnan(y_max) && y_min <= y_max, "IsotonicRegression: y_min (", y_min,
          ") must not exceed y_max (", y_max, ")");
  }

  /// Fits on (x, y) with optional non-negative weights (empty = all 1); see the file comment. Returns *this.
  IsotonicRegression& fit(const std::vector<double>& x, const std::vector<double>& y,
                          const std::vector<double>& w = {}) {
    check(x.size() == y.size(), "IsotonicRegression::fit: x has ", x.size(), " points, y has ", y.size());
    check(w.empty() || w.size() == x.size(), "IsotonicRegression::fit: ", w.size(), " weights for ", x.size(),
          " points");
    check(!x.empty(), "IsotonicRegression::fit: no points");
    std::vector<std::size_t> order;
    order.reserve(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      check(std::isfinite(x[i]) && std::isfinite(y[i]), "IsotonicRegression::fit: point ", i, " is not finite (x = ",
            x[i], ", y = ", y[i], ")");
      const double wi = w.empty() ? 1.0 : w[i];
      check(std::isfinite(wi) && wi >= 0, "IsotonicRegression::fit: weight ", i, " must be finite and >= 0, got ", wi);
      if (wi > 0) order.push_back(i);  // 1. weight 0: dropped
    }
    check(!order.empty(), "IsotonicRegression::fit: every weight is 0");
    // 2. sort by x, then y (stable)
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return x[a] < x[b] || (x[a] == x[b] && y[a] < y[b]);
    });

    // 3. merge ties: group = points within kTieResolution of the group's first x
    std::vector<double> xs, ys, ws;
    double cur_x = x[order[0]], cur_wy = 0, cur_w = 0;
    for (std::size_t k : order) {
      const double wk = w.empty() ? 1.0 : w[k];
      if (x[k] - cur_x >= kTieResolution) {
        xs.push_back(cur_x);
        ws.push_back(cur_w);
        ys.push_back(cur_wy / cur_w);
        cur_x = x[k];
        cur_w = wk;
        cur_wy = y[k] * wk;
      } else {
        cur_w += wk;
        cur_wy += y[k] * wk;
      }
    }
    xs.push_back(cur_x);
    ws.push_back(cur_w);
    ys.push_back(cur_wy / cur_w);

    // 4. pool adjacent violators, in place. Blocks [i, j]: target[i] = j and target[j] = i; at a block start i,
    // ws[i] is the block's weight and ys[i] its weighted mean.
    const std::size_t n = ys.size();
    std::vector<std::size_t> target(n);
    std::iota(target.begin(), target.end(), std::size_t(0));
    std::size_t i = 0;
    while (i < n) {
      std::size_t k = target[i] + 1;
      if (k == n) break;
      if (ys[i] < ys[k]) {  // increasing: move on
        i = k;
        continue;
      }
      double sum_wy = ws[i] * ys[i], sum_w = ws[i];
      while (true) {  // pool the whole non-increasing run that starts at block i
        const double prev_y = ys[k];
        sum_wy += ws[k] * ys[k];
        sum_w += ws[k];
        k = target[k] + 1;
        if (k == n || prev_y < ys[k]) {
          ys[i] = sum_wy / sum_w;
          ws[i] = sum_w;
          target[i] = k - 1;
          target[k - 1] = i;
          if (i > 0) i = target[i - 1];  // back to the previous block's start: it may violate now
          break;
        }
      }
    }
    for (i = 0; i < n;) {  // every point takes its block's mean
      const std::size_t k = target[i] + 1;
      for (std::size_t j = i + 1; j < k; ++j) ys[j] = ys[i];
      i = k;
    }

    // 5. clip, 6. drop interior points equal to both neighbours
    for (double& v : ys) v = std::min(std::max(v, y_min_), y_max_);
    x_min_ = xs.front();
    x_max_ = xs.back();
    x_.clear();
    y_.clear();
    for (std::size_t j = 0; j < n; ++j) {
      if (j > 0 && j + 1 < n && ys[j] == ys[j - 1] && ys[j] == ys[j + 1]) continue;
      x_.push_back(xs[j]);
      y_.push_back(ys[j]);
    }
    return *this;
  }

  bool fitted() const { return !x_.empty(); }

  /// The calibrated value of t (see the file comment); NaN stays NaN.
  double predict(double t) const {
    check(fitted(), "IsotonicRegression::predict: not fitted");
    if (std::isnan(t)) return t;
    t = std::min(std::max(t, x_min_), x_max_);  // out_of_bounds = "clip"
    const std::size_t n = x_.size();
    if (n == 1) return y_[0];
    if (t >= x_[n - 1]) return y_[n - 1];
    if (t <= x_[0]) return y_[0];
    // j with x_j <= t < x_{j+1}
    const std::size_t j = static_cast<std::size_t>(std::upper_bound(x_.begin(), x_.end(), t) - x_.begin()) - 1;
    if (t == x_[j]) return y_[j];
    const double slope = (y_[j + 1] - y_[j]) / (x_[j + 1] - x_[j]);
    double r = slope * (t - x_[j]) + y_[j];
    if (std::isnan(r)) {  // numpy.interp's fallbacks for an infinite slope
      r = slope * (t - x_[j + 1]) + y_[j + 1];
      if (std::isnan(r) && y_[j] == y_[j + 1]) r = y_[j];
    }
    return r;
  }

  std::vector<double> predict(const std::vector<double>& t) const {
    std::vector<double> out;
    out.reserve(t.size());
    for (double v : t) out.push_back(predict(v));
    return out;
  }

  /// The thresholds the predictions interpolate (sklearn's X_thresholds_, y_thresholds_).
  const std::vector<double>& x_thresholds() const { return x_; }
  const std::vector<double>& y_thresholds() const { return y_; }
  /// The range predict clips its input to (sklearn's X_min_, X_max_).
  double x_min() const { return x_min_; }
  double x_max() const { return x_max_; }
  double y_min() const { return y_min_; }
  double y_max() const { return y_max_; }

  /// A fitted model from its thresholds (x strictly increasing, y non-decreasing within [y_min, y_max]), as
  /// x_thresholds() / y_thresholds() give them; predictions clip to [x.front(), x.back()].
  static IsotonicRegression from_thresholds(std::vector<double> x, std::vector<double> y, double y_min = 0.0,
                                            double y_max = 0.95) {
    IsotonicRegression r(y_min, y_max);
    check(!x.empty() && x.size() == y.size(), "IsotonicRegression::from_thresholds: need as many x as y (", x.size(),
          " and ", y.size(), "), at least one");
    for (std::size_t i = 0; i < x.size(); ++i) {
      check(std::isfinite(x[i]) && std::isfinite(y[i]), "IsotonicRegression::from_thresholds: point ", i,
            " is not finite");
      check(y[i] >= y_min && y[i] <= y_max, "IsotonicRegression::from_thresholds: y[", i, "] = ", y[i], " outside [",
            y_min, ", ", y_max, "]");
      check(i == 0 || (x[i] > x[i - 1] && y[i] >= y[i - 1]), "IsotonicRegression::from_thresholds: point ", i,
            " breaks the order (x strictly increasing, y non-decreasing)");
    }
    r.x_min_ = x.front();
    r.x_max_ = x.back();
    r.x_ = std::move(x);
    r.y_ = std::move(y);
    return r;
  }

private:
  double y_min_, y_max_;
  double x_min_ = 0, x_max_ = 0;
  std::vector<double> x_, y_;
};

}  // namespace dea::eval
