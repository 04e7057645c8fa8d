// dea/ops/linear.hpp: the affine map of PyTorch's Linear, forward and backward.
//
// Shapes: x [N, in], W [out, in] (PyTorch layout), b [out], y [N, out]. Products go through ops/gemm.hpp, so
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
  check_matrix(y, x.rows(), W.rows(), "linear_forward_into: y");
  check(x.cols() == W.cols(), "linear_forward_into: x has ", x.cols(), " columns, W has ", W.cols());
  // the packed product: y = x W^T + b in one pass, the bias added to each element's first block of k (one rounding)
  if (gemm_impl::try_packed<false, true>(x, W, y, false, b)) return;
  // the bias is added in the product's row blocks, while each block is in cache and in parallel
  for_row_blocks(x.rows(), [&](Index r0, Index nr) {
    auto yb = y.middleRows(r0, nr);
    yb.noalias() = x.middleRows(r0, nr) * W.transpose();
    if (b) yb.rowwise() += Eigen::Map<const RowVec<S>>(b, W.rows());
  });
}

/// y = x W^T + b   (b may be null: no bias; y resized)
template <class S, class DX, class DW>
void linear_forward(const Eigen::MatrixBase<DX>& x, const Eigen::MatrixBase<DW>& W, const S* b, Mat<S>& y) {
  y.resize(x.rows(), W.rows());
  linear_forward_into<S>(x, W, b, y);
}

/// Backward of linear_forward. Adds dW += dy^T x and db += colsum(dy) (db may be null); when dx is non-null,
/// writes dx = dy W, or with `add_dx` adds dx += dy W into a dx that already has [N, in] (the input gradient of a
/// layer whose input feeds several Linears, summed without a temporary: ops/gemm.hpp, gemm_add_into).
template <class S, class DY, class DX, class DW>
void linear_backward(const Eigen::MatrixBase<DY>& dy, const Eigen::MatrixBase<DX>& x, const Eigen::MatrixBase<DW>& W,
                     MatMap<S> dW, S* db, Mat<S>* dx, bool add_dx = false) {
  gemm_tn_add<S>(dy, x, dW);                                                 // y = x W^T  ->  dW += dy^T x
  if (db)                                                                    // y += b     ->  db += sum_n dy
    for_blocks(dy.cols(), gemm_tn_row_blocks(dy.cols()), [&](Index c0, Index nc) {  // column blocks in parallel
      auto block = dy.middleCols(c0, nc);
      Eigen::Map<RowVec<S>> out(db + c0, nc);
      constexpr Index L = Eigen::internal::packet_traits<S>::size;
      if (DY::IsRowMajor && L > 1 && nc % L == 0 && block.rows() > 0) {
        // Eigen's colwise sum of a row-major block reads one packet of columns down all the rows, then the next
        // packet down all the rows again: strided, each cache line fetched twice or more (2.3 ms for [2048, 1024],
        // 6x this loop). Row by row, in the association Eigen uses for whole packets, r0 + ((r1 + r2) + (r3 + r4))
        // + ..., gives its bits (test_packed_gemm compares them); blocks with a partial packet keep Eigen's sum.
        RowVec<S> sum = block.row(0);
        Index n = 1;
        for (; n + 3 < block.rows(); n += 4)
          sum += (block.row(n) + block.row(n + 1)) + (block.row(n + 2) + block.row(n + 3));
        for (; n < block.rows(); ++n) sum += block.row(n);
        out += sum;
      } else {
        out += block.colwise().sum();
      }
    });
  if (!dx) return;
  if (add_dx)
    gemm_add_into(dy, W, *dx);                                               // dx += dy W
  else
    gemm<S>(dy, W, *dx);                                                     // y = x W^T  ->  dx = dy W
}

}  // namespace ops
}  // namespace dea
