// dea/data/oracle.hpp: tools for the real oracle alpha (spec section 4.2), computed offline from scores that
// frozen NLI / sentence-embedding models produced elsewhere.
//
//  * oracle_alpha: alpha = clamp(sigmoid(Phi - 0.3 Sim), 0, 0.95), Phi = entailment logit of
//    (premise = q_text, hypothesis = k_text), Sim = cosine similarity of the two sentence embeddings.
//  * IsotonicRegression: increasing calibration fitted by pool-adjacent-violators, outputs bounded to
//    [0, 0.95], applied with linear interpolation and x clipped to the fitted range (the reference uses
//    sklearn's IsotonicRegression(y_min=0, y_max=0.95, out_of_bounds="clip")).
//  * AlphaCache: alpha per (premise, hypothesis), the content of an oracle JSONL cache (io/jsonl.hpp reads
//    and writes the files), and attach() that sets the alpha of D_alpha records from it.
#pragma once

#include "../core/error.hpp"
#include "dalpha.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dea::data {

constexpr double kAlphaMax = 0.95;
constexpr double kGammaNli = 0.3;

/// alpha = clamp(sigmoid(phi - gamma_nli * sim), 0, 0.95).
inline double oracle_alpha(double phi, double sim, double gamma_nli = kGammaNli) {
  check(std::isfinite(phi) && std::isfinite(sim), "oracle_alpha: non-finite score (phi=", phi, ", sim=", sim, ")");
  const double z = phi - gamma_nli * sim;
  const double s = z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z));
  return std::min(std::max(s, 0.0), kAlphaMax);
}

/// Increasing isotonic regression with bounded outputs.
///
/// fit(x, y, w): points are sorted by x; points with equal x are merged into their weighted mean (weights
/// summed); pool-adjacent-violators then merges neighbouring blocks while a block's weighted mean exceeds the
/// next one's, giving the weighted least-squares non-decreasing fit; fitted values are clipped to
/// [y_min, y_max]. predict(x) interpolates linearly between the fitted (x, y) points and clips x to
/// [x_min, x_max] first, so outputs always lie in [y_min, y_max].
class IsotonicRegression {
public:
  explicit IsotonicRegression(double y_min = 0.0, double y_max = kAlphaMax) : y_min_(y_min), y_max_(y_max) {
    check(y_min <= y_max, "IsotonicRegression: y_min (", y_min, ") > y_max (", y_max, ")");
  }

  /// Fits on (x, y) with optional positive weights (empty = all 1). Returns *this.
  IsotonicRegression& fit(const std::vector<double>& x, const std::vector<double>& y,
                          const std::vector<double>& w = {}) {
    check(!x.empty(), "IsotonicRegression::fit: no points");
    check(x.size() == y.size(), "IsotonicRegression::fit: x has ", x.size(), " points, y has ", y.size());
    check(w.empty() || w.size() == x.size(), "IsotonicRegression::fit: ", w.size(), " weights for ", x.size(),
          " points");
    for (std::size_t i = 0; i < x.size(); ++i) {
      check(std::isfinite(x[i]) && std::isfinite(y[i]), "IsotonicRegression::fit: non-finite point ", i);
      check(w.empty() || (std::isfinite(w[i]) && w[i] > 0), "IsotonicRegression::fit: weight ", i,
            " must be positive, got ", w.empty() ? 1.0 : w[i]);
    }
    std::vector<std::size_t> order(x.size());
    std::iota(order.begin(), order.end(), std::size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });

    // Merge equal x: xs (unique, increasing), ys (weighted mean), ws (summed weight).
    std::vector<double> xs, ys, ws;
    for (std::size_t k : order) {
      const double wk = w.empty() ? 1.0 : w[k];
      if (!xs.empty() && xs.back() == x[k]) {
        const double tw = ws.back() + wk;
        ys.back() += (y[k] - ys.back()) * wk / tw;
        ws.back() = tw;
      } else {
        xs.push_back(x[k]);
        ys.push_back(y[k]);
        ws.push_back(wk);
      }
    }

    // Pool adjacent violators: a stack of blocks (weighted mean, weight, number of unique points).
    struct Block {
      double mean, weight;
      std::size_t count;
    };
    std::vector<Block> blocks;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      blocks.push_back({ys[i], ws[i], 1});
      while (blocks.size() > 1 && blocks[blocks.size() - 2].mean > blocks.back().mean) {
        const Block top = blocks.back();
        blocks.pop_back();
        Block& prev = blocks.back();
        const double tw = prev.weight + top.weight;
        prev.mean = (prev.mean * prev.weight + top.mean * top.weight) / tw;
        prev.weight = tw;
        prev.count += top.count;
      }
    }
    x_ = xs;
    y_.clear();
    for (const Block& b : blocks)
      for (std::size_t c = 0; c < b.count; ++c) y_.push_back(std::min(std::max(b.mean, y_min_), y_max_));
    return *this;
  }

  bool fitted() const { return !x_.empty(); }

  /// Calibrated value of one x (NaN stays NaN).
  double predict(double x) const {
    check(fitted(), "IsotonicRegression::predict: not fitted");
    if (std::isnan(x)) return x;
    if (x <= x_.front()) return y_.front();
    if (x >= x_.back()) return y_.back();
    const std::size_t hi = static_cast<std::size_t>(std::upper_bound(x_.begin(), x_.end(), x) - x_.begin());
    const std::size_t lo = hi - 1;
    const double t = (x - x_[lo]) / (x_[hi] - x_[lo]);
    return y_[lo] + t * (y_[hi] - y_[lo]);
  }

  std::vector<double> predict(const std::vector<double>& x) const {
    std::vector<double> out;
    out.reserve(x.size());
    for (double v : x) out.push_back(predict(v));
    return out;
  }

  /// The fitted points: unique x, increasing, and their fitted values.
  const std::vector<double>& x_thresholds() const { return x_; }
  const std::vector<double>& y_thresholds() const { return y_; }
  double y_min() const { return y_min_; }
  double y_max() const { return y_max_; }

  /// Restores a fitted model from its points (x strictly increasing, y non-decreasing, within the bounds).
  static IsotonicRegression from_points(std::vector<double> x, std::vector<double> y, double y_min = 0.0,
                                        double y_max = kAlphaMax) {
    check(!x.empty() && x.size() == y.size(), "IsotonicRegression::from_points: need equally many x and y (",
          x.size(), " vs ", y.size(), ")");
    for (std::size_t i = 0; i < x.size(); ++i) {
      check(std::isfinite(x[i]) && std::isfinite(y[i]), "IsotonicRegression::from_points: non-finite point ", i);
      check(y[i] >= y_min && y[i] <= y_max, "IsotonicRegression::from_points: y[", i, "] = ", y[i], " outside [",
            y_min, ", ", y_max, "]");
      check(i == 0 || (x[i] > x[i - 1] && y[i] >= y[i - 1]), "IsotonicRegression::from_points: point ", i,
            " breaks the increasing order");
    }
    IsotonicRegression r(y_min, y_max);
    r.x_ = std::move(x);
    r.y_ = std::move(y);
    return r;
  }

private:
  double y_min_, y_max_;
  std::vector<double> x_, y_;
};

/// One cached oracle value.
struct OracleEntry {
  std::string premise;     ///< q_text
  std::string hypothesis;  ///< k_text
  double alpha = 0;        ///< in [0, 0.95]
  std::optional<double> phi;
  std::optional<double> sim;
};

/// alpha per (premise, hypothesis). Adding a pair that is already present replaces its entry.
class AlphaCache {
public:
  void add(OracleEntry e) {
    check(std::isfinite(e.alpha) && e.alpha >= 0 && e.alpha <= kAlphaMax, "AlphaCache::add: alpha ", e.alpha,
          " for ('", e.premise, "', '", e.hypothesis, "') outside [0, 0.95]");
    auto key = std::make_pair(e.premise, e.hypothesis);
    auto it = index_.find(key);
    if (it != index_.end()) {
      entries_[it->second] = std::move(e);
    } else {
      index_.emplace(std::move(key), entries_.size());
      entries_.push_back(std::move(e));
    }
  }

  /// The entry of a pair, or nullptr.
  const OracleEntry* find(const std::string& premise, const std::string& hypothesis) const {
    auto it = index_.find(std::make_pair(premise, hypothesis));
    return it == index_.end() ? nullptr : &entries_[it->second];
  }

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  /// Entries in insertion order.
  const std::vector<OracleEntry>& entries() const { return entries_; }

  /// Sets each record's alpha from the cache (premise = q_text, hypothesis = k_text). With require_all, a
  /// record without a cached value is a dea::Error naming the pair and how many are missing; otherwise such
  /// records keep their alpha. Returns how many records were set.
  std::size_t attach(std::vector<Record>& records, bool require_all = true) const {
    std::size_t set = 0, missing = 0;
    const Record* first_missing = nullptr;
    for (auto& r : records) {
      if (const OracleEntry* e = find(r.q_text, r.k_text)) {
        r.alpha = e->alpha;
        ++set;
      } else if (!first_missing) {
        first_missing = &r;
        ++missing;
      } else {
        ++missing;
      }
    }
    check(!require_all || missing == 0, "AlphaCache::attach: ", missing, " record(s) have no cached alpha, e.g. ('",
          first_missing ? first_missing->q_text : "", "', '", first_missing ? first_missing->k_text : "", "')");
    return set;
  }

private:
  std::vector<OracleEntry> entries_;
  std::map<std::pair<std::string, std::string>, std::size_t> index_;
};

}  // namespace dea::data
