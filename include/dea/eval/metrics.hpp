// dea/eval/metrics.hpp: the evaluation metrics of the reference's eval.py (docs/training.md, evaluation).
//
//  accuracy           correct / counted, positions whose label is ignore_index (-100) not counted
//  alpha_mae          mean |alpha_hat - alpha|
//  alpha_pearson      Pearson r; NaN when either side is constant
//  alpha_spearman     Pearson r of the ranks, ranks as the reference computes them: rank[argsort(x)] = 0..n-1,
//                     so ties are NOT averaged. We sort stably, so tied values are ranked in order of appearance
//                     (NumPy's default argsort is not stable; its tie order is an implementation detail).
//                     NaN when either side is constant.
//  band_agreement     fraction with band(alpha_hat) == band(alpha); band 0: x < 0.10, 1: 0.10 <= x < 0.50,
//                     2: x >= 0.50
//  alpha_hat_mean, alpha_oracle_mean
//  decision_side_acc  pair-weighted mean over batches, sum(acc * n_pairs) / sum(n_pairs), and n_decision_pairs
//
// Above max_points (200,000) labelled cells, a random subset of max_points cells is used (seeded; the subset
// keeps the original order of the cells, so tie ranks stay in order of appearance).
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace dea::eval {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kBandLow = 0.10;
constexpr double kBandHigh = 0.50;

/// Fraction of positions with pred == label among those whose label differs from ignore_index; 0 when no
/// position counts (as the reference's n_ok / max(1, n_tot)).
inline double accuracy(const std::vector<std::int64_t>& pred, const std::vector<std::int64_t>& labels,
                       std::int64_t ignore_index = -100) {
  check(pred.size() == labels.size(), "accuracy: predictions and labels differ in size (", pred.size(), " vs ",
        labels.size(), ")");
  std::size_t ok = 0, tot = 0;
  for (std::size_t i = 0; i < pred.size(); ++i) {
    if (labels[i] == ignore_index) continue;
    ++tot;
    ok += pred[i] == labels[i];
  }
  return static_cast<double>(ok) / static_cast<double>(std::max<std::size_t>(1, tot));
}

/// Running accuracy over batches (counts, so the result is exact whatever the batch sizes).
struct AccuracyCounter {
  std::size_t correct = 0;
  std::size_t total = 0;
  void add(const std::vector<std::int64_t>& pred, const std::vector<std::int64_t>& labels,
           std::int64_t ignore_index = -100) {
    check(pred.size() == labels.size(), "AccuracyCounter::add: predictions and labels differ in size");
    for (std::size_t i = 0; i < pred.size(); ++i) {
      if (labels[i] == ignore_index) continue;
      ++total;
      correct += pred[i] == labels[i];
    }
  }
  double value() const { return static_cast<double>(correct) / static_cast<double>(std::max<std::size_t>(1, total)); }
};

inline double mean(const std::vector<double>& x) {
  if (x.empty()) return kNaN;
  double s = 0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

inline void check_same_size(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  check(a.size() == b.size(), what, ": the two inputs differ in size (", a.size(), " vs ", b.size(), ")");
}

/// mean |a - b|; NaN for empty inputs.
inline double alpha_mae(const std::vector<double>& alpha_hat, const std::vector<double>& alpha) {
  check_same_size(alpha_hat, alpha, "alpha_mae");
  if (alpha.empty()) return kNaN;
  double s = 0;
  for (std::size_t i = 0; i < alpha.size(); ++i) s += std::abs(alpha_hat[i] - alpha[i]);
  return s / static_cast<double>(alpha.size());
}

/// True when every element equals the first (standard deviation exactly 0), or the input is empty.
inline bool is_constant(const std::vector<double>& x) {
  for (double v : x)
    if (v != x.front()) return false;
  return true;
}

/// Pearson correlation; NaN when n < 2 or either side is constant.
inline double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  check_same_size(x, y, "pearson");
  if (x.size() < 2 || is_constant(x) || is_constant(y)) return kNaN;
  const double mx = mean(x), my = mean(y);
  double sxy = 0, sxx = 0, syy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double dx = x[i] - mx, dy = y[i] - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  if (sxx == 0 || syy == 0) return kNaN;  // constant up to rounding of the mean
  const double r = sxy / std::sqrt(sxx * syy);
  return std::max(-1.0, std::min(1.0, r));
}

/// Ranks 0..n-1 from a stable argsort: rank[order[k]] = k. Ties are not averaged; tied values get increasing
/// ranks in order of appearance.
inline std::vector<double> ordinal_ranks(const std::vector<double>& x) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  std::vector<double> rank(x.size());
  for (std::size_t k = 0; k < order.size(); ++k) rank[order[k]] = static_cast<double>(k);
  return rank;
}

/// Spearman as the reference computes it: Pearson of ordinal_ranks; NaN when either input is constant.
inline double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  check_same_size(x, y, "spearman");
  if (x.size() < 2 || is_constant(x) || is_constant(y)) return kNaN;
  return pearson(ordinal_ranks(x), ordinal_ranks(y));
}

/// Band index: 0 for x < 0.10, 1 for 0.10 <= x < 0.50, 2 for x >= 0.50.
inline int band(double x) { return x < kBandLow ? 0 : (x < kBandHigh ? 1 : 2); }

/// Fraction of elements with band(a) == band(b); NaN for empty inputs.
inline double band_agreement(const std::vector<double>& a, const std::vector<double>& b) {
  check_same_size(a, b, "band_agreement");
  if (a.empty()) return kNaN;
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += band(a[i]) == band(b[i]);
  return static_cast<double>(same) / static_cast<double>(a.size());
}

/// k distinct indices of [0, n) drawn uniformly with Rng(seed), returned in increasing order (k <= n).
inline std::vector<std::size_t> subsample_indices(std::size_t n, std::size_t k, std::uint64_t seed) {
  check(k <= n, "subsample_indices: k = ", k, " exceeds n = ", n);
  Rng rng(seed);
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), std::size_t(0));
  for (std::size_t i = 0; i < k; ++i) std::swap(idx[i], idx[i + static_cast<std::size_t>(rng.below(n - i))]);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

/// The alpha metrics over the labelled cells of one layer.
struct AlphaMetrics {
  std::size_t n_points = 0;  ///< cells used (after subsampling)
  double mae = kNaN;
  double pearson = kNaN;
  double spearman = kNaN;
  double band_agreement = kNaN;
  double alpha_hat_mean = kNaN;
  double alpha_oracle_mean = kNaN;
};

/// Computes AlphaMetrics from paired alpha_hat / oracle values (labelled cells only: NaN oracle cells must be
/// filtered out by the caller). Above max_points, a seeded subset of max_points cells is used. With fewer than
/// two cells every metric stays NaN (as the reference, which reports them only for more than one point).
inline AlphaMetrics alpha_metrics(const std::vector<double>& alpha_hat, const std::vector<double>& alpha,
                                  std::size_t max_points = 200000, std::uint64_t seed = 0) {
  check_same_size(alpha_hat, alpha, "alpha_metrics");
  AlphaMetrics m;
  const std::vector<double>* ah = &alpha_hat;
  const std::vector<double>* ao = &alpha;
  std::vector<double> sub_h, sub_o;
  if (alpha.size() > max_points) {
    for (std::size_t i : subsample_indices(alpha.size(), max_points, seed)) {
      sub_h.push_back(alpha_hat[i]);
      sub_o.push_back(alpha[i]);
    }
    ah = &sub_h;
    ao = &sub_o;
  }
  m.n_points = ao->size();
  if (m.n_points < 2) return m;
  m.mae = alpha_mae(*ah, *ao);
  m.pearson = pearson(*ah, *ao);
  m.spearman = spearman(*ah, *ao);
  m.band_agreement = band_agreement(*ah, *ao);
  m.alpha_hat_mean = mean(*ah);
  m.alpha_oracle_mean = mean(*ao);
  return m;
}

/// Appends the labelled cells of one layer to (alpha_hat_out, oracle_out), in (b, h, i, j) order, as the
/// reference pools them: alpha_hat [B, H, Tq, Tk]; oracle [B, Tq, Tk] (shared by the heads) or [B, H, Tq, Tk];
/// key_mask [B, Tk] (non-zero = real key) or nullptr. A cell is labelled when its oracle value is not NaN and
/// its key is real; the oracle value is clamped to [0, 0.95] as the layer does before using it.
template <class S>
void collect_labelled_cells(const Tensor<S>& alpha_hat, const Tensor<S>& oracle, const Tensor<std::uint8_t>* key_mask,
                            std::vector<double>& alpha_hat_out, std::vector<double>& oracle_out) {
  check(alpha_hat.dim() == 4, "collect_labelled_cells: alpha_hat must be [B, H, Tq, Tk], got ",
        shape_str(alpha_hat.shape));
  const Index B = alpha_hat.size(0), H = alpha_hat.size(1), Tq = alpha_hat.size(2), Tk = alpha_hat.size(3);
  const bool per_head = oracle.dim() == 4;
  check(oracle.shape == Shape{B, Tq, Tk} || oracle.shape == Shape{B, H, Tq, Tk}, "collect_labelled_cells: oracle ",
        "must be [B, Tq, Tk] = ", shape_str({B, Tq, Tk}), " or [B, H, Tq, Tk], got ", shape_str(oracle.shape));
  if (key_mask) check_shape(*key_mask, {B, Tk}, "collect_labelled_cells: key_mask");
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < Tq; ++i)
        for (Index j = 0; j < Tk; ++j) {
          if (key_mask && !(*key_mask)[b * Tk + j]) continue;
          const Index o = per_head ? ((b * H + h) * Tq + i) * Tk + j : (b * Tq + i) * Tk + j;
          const double a = static_cast<double>(oracle[o]);
          if (std::isnan(a)) continue;
          alpha_hat_out.push_back(static_cast<double>(alpha_hat[((b * H + h) * Tq + i) * Tk + j]));
          oracle_out.push_back(std::min(std::max(a, 0.0), 0.95));
        }
}

/// Pair-weighted decision side accuracy over batches: sum(acc_b * n_b) / sum(n_b); NaN with no pair.
struct DecisionSideAccumulator {
  double weighted = 0;
  std::size_t n_pairs = 0;
  void add(double acc, std::size_t pairs) {
    if (pairs == 0) return;
    weighted += acc * static_cast<double>(pairs);
    n_pairs += pairs;
  }
  double value() const { return n_pairs ? weighted / static_cast<double>(n_pairs) : kNaN; }
};

}  // namespace dea::eval
