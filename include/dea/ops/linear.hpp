// dea/ops/linear.hpp: the affine map of PyTorch's Linear, forward and backward.
//
// Shapes: x [N, in], W [out, in] (PyTorch layout), b [out], y [N, out]. Products go through ops::gemm, so
// results do not depend on the thread count.
#pragma once

#include "../core/param.hpp"
#include "gemm.hpp"

namespace dea {
namespace ops {

/// y = x W^T + b into a y that already has [N, out] (a matrix or a Map of a workspace: no resize).
template <class S, class DX, class DW, class DY>
void linear_forward_into(const Eigen::MatrixBase<DX>& x, const Eigen::MatrixBase<DW>& W, const S* b,
                         Eigen::MatrixBase<DY>& y) {
  gemm_into(x, W.transpose(), y);
  if (b) y.rowwise() += Eigen::Map<const RowVec<S>>(b, W.rows());
}

/// y = x W^T + b   (b may be null: no bias; y resized)
template <class S, class DX, class DW>
void linear_forward(const Eigen::MatrixBase<DX>& x, const Eigen::MatrixBase<DW>& W, const S* b, Mat<S>& y) {
  y.resize(x.rows(), W.rows());
  linear_forward_into<S>(x, W, b, y);
}

/// Backward of linear_forward. Adds dW += dy^T x and db += colsum(dy) (db may be null);
/// writes dx = dy W when dx is non-null.
template <class S, class DY, class DX, class DW>
void linear_backward(const Eigen::MatrixBase<DY>& dy, const Eigen::MatrixBase<DX>& x, const Eigen::MatrixBase<DW>& W,
                     MatMap<S> dW, S* db, Mat<S>* dx) {
  gemm_tn_add<S>(dy, x, dW);                                                 // y = x W^T  ->  dW += dy^T x
  if (db) Eigen::Map<RowVec<S>>(db, W.rows()) += dy.colwise().sum();       // y += b     ->  db += sum_n dy
  if (dx) gemm<S>(dy, W, *dx);                                               // y = x W^T  ->  dx = dy W
}

}  // namespace ops
}  // namespace dea
