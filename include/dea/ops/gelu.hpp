// dea/ops/gelu.hpp: the exact (erf) GELU of PyTorch's nn.GELU() and its tanh form, forward and backward.
//
// Shapes: element-wise on any [rows, cols] block.
//   gelu(x)  = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))
//   gelu'(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// (Hendrycks and Gimpel, "Gaussian Error Linear Units", 2016.)
// The tanh form (Hugging Face's gelu_new / gelu_pytorch_tanh, PyTorch's GELU(approximate='tanh')):
//   gelu_tanh(x)  = 0.5 x (1 + tanh(u)),   u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu_tanh'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),   t = tanh(u)
#pragma once

#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "gemm.hpp"

#include <unsupported/Eigen/SpecialFunctions>

#include <cmath>
#include <type_traits>

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

namespace detail {
/// Rows [r0, r0 + nr) of y = gelu(x). Float runs vectorised on Eigen's packet erf (a rational approximation
/// accurate to a few ulp, as PyTorch's vectorised CPU kernels are), one row at a time, so that which elements of a
/// row fall in packets and which in the scalar tail depends on the row's length alone (a row's bits do not depend
/// on the rows around it); double keeps std::erf element by element.
template <class S, class DX, class DY>
void gelu_rows(const Eigen::MatrixBase<DX>& x, Eigen::MatrixBase<DY>& y, Index r0, Index nr) {
  if constexpr (std::is_same<S, float>::value) {
    for (Index n = r0; n < r0 + nr; ++n) {
      const auto xa = x.row(n).array();
      y.row(n).array() = 0.5f * xa * (1.0f + (xa * 0.70710678118654752440f).erf());  // y = gelu(x)
    }
  } else {
    for (Index n = r0; n < r0 + nr; ++n)
      for (Index c = 0; c < x.cols(); ++c) y(n, c) = gelu<S>(x(n, c));  // y = gelu(x)
  }
}
}  // namespace detail

/// y = gelu(x) element-wise into a y that already has x's shape (y may be x itself: in place).
template <class S, class DX, class DY>
void gelu_forward_into(const Eigen::MatrixBase<DX>& x, Eigen::MatrixBase<DY>& y) {
  check_matrix(y, x.rows(), x.cols(), "gelu_forward_into: y");
  for_row_blocks(x.rows(), [&](Index r0, Index nr) { detail::gelu_rows<S>(x, y, r0, nr); });
}

/// y = gelu(x) element-wise; x and y [N, C] (y resized; may not alias x).
template <class S, class DX>
void gelu_forward(const Eigen::MatrixBase<DX>& x, Mat<S>& y) {
  y.resize(x.rows(), x.cols());
  for_row_blocks(x.rows(), [&](Index r0, Index nr) { detail::gelu_rows<S>(x, y, r0, nr); });
}

/// In place: g [N, C] = dL/dy  ->  dL/dx = g .* gelu'(x), with x the forward input [N, C].
template <class S, class DX>
void gelu_backward_inplace(const Eigen::MatrixBase<DX>& x, Mat<S>& g) {
  check_matrix(g, x.rows(), x.cols(), "gelu_backward: dy");
  for_row_blocks(x.rows(), [&](Index r0, Index nr) {
    if constexpr (std::is_same<S, float>::value) {
      // vectorised: Eigen's packet erf and exp
      const auto xa = x.middleRows(r0, nr).array();
      const float inv_sqrt2 = 0.70710678118654752440f, inv_sqrt_2pi = 0.39894228040143267794f;
      g.middleRows(r0, nr).array() *=
          0.5f * (1.0f + (xa * inv_sqrt2).erf()) + xa * (inv_sqrt_2pi * (-0.5f * xa.square()).exp());
    } else {
      for (Index n = r0; n < r0 + nr; ++n)
        for (Index c = 0; c < x.cols(); ++c) g(n, c) *= gelu_grad<S>(x(n, c));  // y = gelu(x)  ->  dx = dy gelu'(x)
    }
  });
}

/// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class S>
inline S gelu_tanh(S x) {
  const S c = S(0.79788456080286535587989211986876373695);  // sqrt(2 / pi)
  return S(0.5) * x * (S(1) + std::tanh(c * (x + S(0.044715) * x * x * x)));
}

/// gelu_tanh'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <class S>
inline S gelu_tanh_grad(S x) {
  const S c = S(0.79788456080286535587989211986876373695);
  const S t = std::tanh(c * (x + S(0.044715) * x * x * x));
  return S(0.5) * (S(1) + t) + S(0.5) * x * (S(1) - t * t) * c * (S(1) + S(3 * 0.044715) * x * x);
}

/// y = gelu_tanh(x) element-wise; x and y [N, C] (y resized; may not alias x).
template <class S, class DX>
void gelu_tanh_forward(const Eigen::MatrixBase<DX>& x, Mat<S>& y) {
  y.resize(x.rows(), x.cols());
  for_row_blocks(x.rows(), [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n)
      for (Index c = 0; c < x.cols(); ++c) y(n, c) = gelu_tanh<S>(x(n, c));  // y = gelu_tanh(x)
  });
}

/// In place: g [N, C] = dL/dy  ->  dL/dx = g .* gelu_tanh'(x), with x the forward input [N, C].
template <class S, class DX>
void gelu_tanh_backward_inplace(const Eigen::MatrixBase<DX>& x, Mat<S>& g) {
  check_matrix(g, x.rows(), x.cols(), "gelu_tanh_backward: dy");
  for_row_blocks(x.rows(), [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n)
      for (Index c = 0; c < x.cols(); ++c) g(n, c) *= gelu_tanh_grad<S>(x(n, c));  // dx = dy gelu_tanh'(x)
  });
}

}  // namespace ops
}  // namespace dea
