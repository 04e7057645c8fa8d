// dea/ops/softmax.hpp: masked softmax over the last axis of a row block, forward and backward.
//
// Shapes: scores [Tq, Tk]; mask [Tk] (nullptr = every key real). Masked keys act as -inf: they get
// probability 0. A row whose keys are all masked gives a row of zeros (never NaN) and zero gradient.
#pragma once

#include "../core/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

namespace dea {
namespace ops {

/// p = softmax(s) over real keys, in place allowed (p may alias s).
template <class S, class DS, class DP>
void masked_softmax_rows(const Eigen::MatrixBase<DS>& s, const std::uint8_t* mask, Eigen::MatrixBase<DP>& p) {
  const Index tk = s.cols();
  for (Index i = 0; i < s.rows(); ++i) {
    S mx = -std::numeric_limits<S>::infinity();
    for (Index j = 0; j < tk; ++j)
      if (!mask || mask[j]) mx = std::max(mx, s(i, j));
    if (mx == -std::numeric_limits<S>::infinity()) {  // every key masked (or all scores -inf)
      p.row(i).setZero();
      continue;
    }
    S z = 0;
    for (Index j = 0; j < tk; ++j) {
      const S e = (!mask || mask[j]) ? std::exp(s(i, j) - mx) : S(0);
      p(i, j) = e;
      z += e;
    }
    p.row(i) /= z;
  }
}

/// ds = p .* (dp - rowsum(dp .* p)): the backward of masked_softmax_rows (masked keys have p = 0, so ds = 0).
template <class S, class DP, class DDP, class DDS>
void softmax_rows_backward(const Eigen::MatrixBase<DP>& p, const Eigen::MatrixBase<DDP>& dp,
                           Eigen::MatrixBase<DDS>& ds) {
  for (Index i = 0; i < p.rows(); ++i) {
    const S dot = p.row(i).dot(dp.row(i));
    ds.row(i) = p.row(i).cwiseProduct((dp.row(i).array() - dot).matrix());
  }
}

}  // namespace ops
}  // namespace dea
