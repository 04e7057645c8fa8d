// dea/ops/mse.hpp: mean squared error, forward and backward (PyTorch's F.mse_loss with reduction 'mean').
//
// Shapes: pred, target [N, F] (any matching shape).
//   L = sum_nf (pred_nf - target_nf)^2 / (N F)          (accumulated in double)
//   dL/dpred = 2 (pred - target) / (N F)
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"

namespace dea {
namespace ops {

/// Mean of (pred - target)^2 over every element; throws dea::Error on a shape mismatch or an empty input.
template <class DP, class DT>
double mse_forward(const Eigen::MatrixBase<DP>& pred, const Eigen::MatrixBase<DT>& target) {
  check(pred.rows() == target.rows() && pred.cols() == target.cols(), "mse: target: expected shape [", pred.rows(),
        ", ", pred.cols(), "], got [", target.rows(), ", ", target.cols(), "]");
  check(pred.size() > 0, "mse: pred is empty");
  double acc = 0;
  for (Index r = 0; r < pred.rows(); ++r)
    for (Index c = 0; c < pred.cols(); ++c) {
      const double e = static_cast<double>(pred(r, c)) - static_cast<double>(target(r, c));
      acc += e * e;
    }
  return acc / static_cast<double>(pred.size());
}

/// dpred = scale * 2 (pred - target) / size  (scale = dL_total/dL, 1 for the loss itself). dpred is resized.
template <class S, class DP, class DT>
void mse_backward(const Eigen::MatrixBase<DP>& pred, const Eigen::MatrixBase<DT>& target, Mat<S>& dpred,
                  S scale = S(1)) {
  check(pred.rows() == target.rows() && pred.cols() == target.cols(), "mse_backward: target: expected shape [",
        pred.rows(), ", ", pred.cols(), "], got [", target.rows(), ", ", target.cols(), "]");
  const S k = scale * S(2) / static_cast<S>(pred.size());
  dpred = (pred - target) * k;  // L = mean((pred - target)^2)  ->  dpred = 2 (pred - target) / size
}

}  // namespace ops
}  // namespace dea
