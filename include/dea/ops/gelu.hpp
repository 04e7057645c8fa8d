// dea/ops/gelu.hpp: the exact (erf) GELU of PyTorch's nn.GELU(), forward and backward.
//
// Shapes: element-wise on any [rows, cols] block.
//   gelu(x)  = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))
//   gelu'(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// (Hendrycks and Gimpel, "Gaussian Error Linear Units", 2016; not the tanh approximation.)
#pragma once

#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "gemm.hpp"

#include <cmath>

namespace dea {
namespace ops {

/// gelu(x) = 0.5 x (1 + erf(x / sqrt(2))).
template <class S>
inline S gelu(S x) {
  const S inv_sqrt2 = S(0.70710678118654752440084436210484903928);
  return S(0.5) * x * (S(1) + std::erf(x * inv_sqrt2));
}

/// gelu'(x) = Phi(x) + x phi(x).
template <class S>
inline S gelu_grad(S x) {
  const S inv_sqrt2 = S(0.70710678118654752440084436210484903928);
  const S inv_sqrt_2pi = S(0.39894228040143267793994605993438186848);
  const S cdf = S(0.5) * (S(1) + std::erf(x * inv_sqrt2));  // Phi(x)
  const S pdf = inv_sqrt_2pi * std::exp(S(-0.5) * x * x);   // phi(x)
  return cdf + x * pdf;
}

/// y = gelu(x) element-wise into a y that already has x's shape (y may be x itself: in place).
template <class S, class DX, class DY>
void gelu_forward_into(const Eigen::MatrixBase<DX>& x, Eigen::MatrixBase<DY>& y) {
  check_matrix(y, x.rows(), x.cols(), "gelu_forward_into: y");
  for_row_blocks(x.rows(), [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n)
      for (Index c = 0; c < x.cols(); ++c) y(n, c) = gelu<S>(x(n, c));  // y = gelu(x)
  });
}

/// y = gelu(x) element-wise; x and y [N, C] (y resized; may not alias x).
template <class S, class DX>
void gelu_forward(const Eigen::MatrixBase<DX>& x, Mat<S>& y) {
  y.resize(x.rows(), x.cols());
  for_row_blocks(x.rows(), [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n)
      for (Index c = 0; c < x.cols(); ++c) y(n, c) = gelu<S>(x(n, c));  // y = gelu(x)
  });
}

/// In place: g [N, C] = dL/dy  ->  dL/dx = g .* gelu'(x), with x the forward input [N, C].
template <class S, class DX>
void gelu_backward_inplace(const Eigen::MatrixBase<DX>& x, Mat<S>& g) {
  check_matrix(g, x.rows(), x.cols(), "gelu_backward: dy");
  for_row_blocks(x.rows(), [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n)
      for (Index c = 0; c < x.cols(); ++c) g(n, c) *= gelu_grad<S>(x(n, c));  // y = gelu(x)  ->  dx = dy gelu'(x)
  });
}

}  // namespace ops
}  // namespace dea
