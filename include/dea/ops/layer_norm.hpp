// dea/ops/layer_norm.hpp: LayerNorm over the feature axis (PyTorch's nn.LayerNorm), forward and backward.
//
// Shapes: x [N, D] (row n = one token), weight and bias [D] (either may be null: no affine), y [N, D],
// mean and rstd [N]:
//   mean_n = sum_c x_nc / D
//   var_n  = sum_c (x_nc - mean_n)^2 / D          (biased, as PyTorch)
//   rstd_n = 1 / sqrt(var_n + eps)
//   xhat   = (x - mean) * rstd                     y = xhat .* weight + bias
// Backward (g = dy .* weight = dL/dxhat):
//   dx_n  = rstd_n * (g_n - mean_c(g_n) - xhat_n * mean_c(g_n .* xhat_n))
//   dweight += sum_n dy_n .* xhat_n,   dbias += sum_n dy_n
// The forward saves mean and rstd only; the backward recomputes xhat from x.
// Rows are processed in parallel; dweight and dbias are reduced over rows in row order for every column, so
// results are bitwise identical for any thread count.
#pragma once

#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "gemm.hpp"

#include <cmath>

namespace dea {
namespace ops {

/// The default epsilon of nn.LayerNorm.
constexpr double layer_norm_default_eps = 1e-5;

/// y = LayerNorm(x) row by row into a y that already has x's shape (a matrix or a Map: no resize; y must not
/// alias x). mean [N] and rstd [N] are written when non-null.
template <class S, class DX, class DY>
void layer_norm_forward_into(const Eigen::MatrixBase<DX>& x, const S* weight, const S* bias, S eps,
                             Eigen::MatrixBase<DY>& y, S* mean, S* rstd) {
  const Index N = x.rows(), D = x.cols();
  check(D > 0, "layer_norm_forward: x must have at least one column");
  check_matrix(y, N, D, "layer_norm_forward: y");
  for_row_blocks(N, [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n) {
      const S mu = x.row(n).sum() / S(D);                                      // mean_n
      const S var = (x.row(n).array() - mu).square().sum() / S(D);             // var_n (biased)
      const S rs = S(1) / std::sqrt(var + eps);                                // rstd_n
      if (mean) mean[n] = mu;
      if (rstd) rstd[n] = rs;
      y.row(n) = (x.row(n).array() - mu) * rs;                                 // xhat
      if (weight) y.row(n).array() *= Eigen::Map<const RowVec<S>>(weight, D).array();  // xhat .* weight
      if (bias) y.row(n) += Eigen::Map<const RowVec<S>>(bias, D);                       // + bias
    }
  });
}

/// y = LayerNorm(x) row by row; writes y [N, D] (resized), mean [N] and rstd [N]. y must not alias x.
template <class S, class DX>
void layer_norm_forward(const Eigen::MatrixBase<DX>& x, const S* weight, const S* bias, S eps, Mat<S>& y,
                        Vec<S>& mean, Vec<S>& rstd) {
  check(x.cols() > 0, "layer_norm_forward: x must have at least one column");
  y.resize(x.rows(), x.cols());
  mean.resize(x.rows());
  rstd.resize(x.rows());
  layer_norm_forward_into<S>(x, weight, bias, eps, y, mean.data(), rstd.data());
}

/// Backward of layer_norm_forward. Writes dx [N, D] (resized; must not alias dy or x); adds into dweight and
/// dbias when they are non-null (dweight is used only when weight is non-null).
template <class S, class DDY, class DX>
void layer_norm_backward(const Eigen::MatrixBase<DDY>& dy, const Eigen::MatrixBase<DX>& x, const Vec<S>& mean,
                         const Vec<S>& rstd, const S* weight, S* dweight, S* dbias, Mat<S>& dx) {
  const Index N = x.rows(), D = x.cols();
  check_matrix(dy, N, D, "layer_norm_backward: dy");
  check(mean.size() == N && rstd.size() == N, "layer_norm_backward: mean/rstd: expected ", N, " rows, got ",
        mean.size(), " and ", rstd.size());
  dx.resize(N, D);
  for_row_blocks(N, [&](Index r0, Index nr) {
    RowVec<S> xh(D), g(D);
    for (Index n = r0; n < r0 + nr; ++n) {
      xh = (x.row(n).array() - mean[n]) * rstd[n];                   // xhat = (x - mean) * rstd
      if (weight)
        g = dy.row(n).cwiseProduct(Eigen::Map<const RowVec<S>>(weight, D));  // y = xhat .* w  ->  g = dy .* w
      else
        g = dy.row(n);
      const S gm = g.sum() / S(D);                                   // mean path
      const S gx = g.dot(xh) / S(D);                                 // rstd path
      dx.row(n) = rstd[n] * (g.array() - gm - xh.array() * gx).matrix();
    }
  });
  if (!(weight && dweight) && !dbias) return;
  // parameter gradients: each column block sums its columns over all rows, in row order
  constexpr Index kCols = 64;
  const Index nblk = (D + kCols - 1) / kCols;
  parallel_for(nblk, [&](Index blk) {
    const Index c0 = blk * kCols, nc = std::min(kCols, D - c0);
    RowVec<S> sw = RowVec<S>::Zero(nc), sb = RowVec<S>::Zero(nc);
    for (Index n = 0; n < N; ++n) {
      const auto d = dy.row(n).segment(c0, nc);
      sw.array() += d.array() * ((x.row(n).segment(c0, nc).array() - mean[n]) * rstd[n]);  // y = xhat .* w
      sb += d;                                                                             // y += b
    }
    if (weight && dweight) Eigen::Map<RowVec<S>>(dweight + c0, nc) += sw;
    if (dbias) Eigen::Map<RowVec<S>>(dbias + c0, nc) += sb;
  });
}

}  // namespace ops
}  // namespace dea
