// dea/ops/cross_entropy.hpp: mean softmax cross-entropy over rows with an ignore index (F.cross_entropy).
//
// Shapes: logits [N, C], labels [N] (class in [0, C), or ignore_index), dlogits [N, C].
//   lse_n  = log sum_c exp(z_nc)                   (computed around the row maximum)
//   loss   = (1 / M) sum_{n counted} (lse_n - z_n,y_n),   M = number of rows whose label is not ignore_index
//   dloss/dz_nc = (softmax(z_n)_c - [c = y_n]) / M   for counted rows, 0 for ignored rows
// With M = 0 PyTorch returns NaN (0 / 0); here the loss is 0 with a zero gradient and `count` reports M = 0,
// so the caller decides (a batch without targets carries no task signal).
// Row losses are summed in row order, so the result does not depend on the thread count.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "gemm.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace dea {
namespace ops {

/// Result of cross_entropy().
template <class S>
struct CrossEntropyResult {
  S loss = 0;          ///< mean over counted rows (0 when none)
  Index count = 0;     ///< counted rows M
  Mat<S> dlogits;      ///< d loss / d logits [N, C] (filled when requested)
};

/// Mean cross-entropy of `logits` [N, C] against `labels` (N entries). Labels must lie in [0, C) or equal
/// `ignore_index` (dea::Error otherwise, naming the row). With `with_grad`, also d loss / d logits.
template <class S, class DZ>
CrossEntropyResult<S> cross_entropy(const Eigen::MatrixBase<DZ>& logits, const std::int64_t* labels, Index n_labels,
                                    std::int64_t ignore_index = -100, bool with_grad = true) {
  const Index N = logits.rows(), C = logits.cols();
  check(n_labels == N, "cross_entropy: labels: expected ", N, " entries (one per logits row), got ", n_labels);
  check(C > 0, "cross_entropy: logits must have at least one column");
  CrossEntropyResult<S> r;
  for (Index n = 0; n < N; ++n) {
    const std::int64_t y = labels[n];
    check(y == ignore_index || (y >= 0 && y < C), "cross_entropy: labels[", n, "]: expected a class in [0, ", C,
          ") or ", ignore_index, " (ignore), got ", y);
    if (y != ignore_index) ++r.count;
  }
  std::vector<S> row_loss(static_cast<std::size_t>(N), S(0));
  if (with_grad) r.dlogits = Mat<S>::Zero(N, C);
  const S inv_m = r.count > 0 ? S(1) / S(r.count) : S(0);
  for_row_blocks(N, [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n) {
      const std::int64_t y = labels[n];
      if (y == ignore_index) continue;
      const S mx = logits.row(n).maxCoeff();
      const S z = (logits.row(n).array() - mx).exp().sum();
      const S lse = mx + std::log(z);                                 // lse_n
      row_loss[static_cast<std::size_t>(n)] = lse - logits(n, y);     // lse_n - z_n,y
      if (with_grad) {
        // loss = mean_n (lse_n - z_n,y)  ->  dz_n = (softmax(z_n) - onehot(y_n)) / M
        r.dlogits.row(n) = ((logits.row(n).array() - lse).exp() * inv_m).matrix();
        r.dlogits(n, y) -= inv_m;
      }
    }
  });
  S total = 0;
  for (S v : row_loss) total += v;
  r.loss = r.count > 0 ? total / S(r.count) : S(0);
  return r;
}

}  // namespace ops
}  // namespace dea
