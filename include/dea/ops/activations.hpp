// dea/ops/activations.hpp: element-wise logistic sigmoid, softplus and ReLU with their derivatives.
//
// Scalar functions (any floating type) plus in-place array versions. Both are written in the numerically
// stable forms (no exp of a large positive argument), so they never overflow to inf or produce NaN for finite x.
//
//   sigmoid(x)          = 1 / (1 + e^-x)                 in (0, 1)
//   sigmoid'(x)         = sigmoid(x) (1 - sigmoid(x))    (sigmoid_grad_from_output takes sigmoid(x))
//   softplus(x)         = log(1 + e^x)                   > 0
//   softplus'(x)        = sigmoid(x)
//   softplus_inverse(y) = log(e^y - 1) = log(expm1(y))   for y > 0 (so softplus(softplus_inverse(y)) = y)
//   relu(x)             = max(x, 0);  relu'(x) = [x > 0]
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"

#include <cmath>

namespace dea {
namespace ops {

/// Logistic sigmoid 1 / (1 + e^-x), stable for either sign of x.
template <class S>
inline S sigmoid(S x) {
  if (x >= S(0)) return S(1) / (S(1) + std::exp(-x));
  const S e = std::exp(x);
  return e / (S(1) + e);
}

/// sigmoid'(x) written in terms of u = sigmoid(x): u (1 - u).
template <class S>
inline S sigmoid_grad_from_output(S u) {
  return u * (S(1) - u);
}

/// softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|), stable for every finite x.
template <class S>
inline S softplus(S x) {
  return (x > S(0) ? x : S(0)) + std::log1p(std::exp(-std::abs(x)));
}

/// softplus'(x) = sigmoid(x).
template <class S>
inline S softplus_grad(S x) {
  return sigmoid(x);
}

/// The inverse of softplus: log(expm1(y)) for y > 0; throws dea::Error naming `what` otherwise.
/// For large y it uses y + log(-expm1(-y)) (expm1(y) would overflow).
template <class S>
inline S softplus_inverse(S y, const char* what = "softplus_inverse argument") {
  check(y > S(0) && std::isfinite(static_cast<double>(y)), what, ": expected a finite value > 0, got ", y);
  if (y > S(20)) return y + std::log(-std::expm1(-y));
  return std::log(std::expm1(y));
}

/// out = sigmoid(in), element-wise, vectorised: 1 / (1 + exp(-x)). For x -> -inf, exp(-x) overflows to +inf and
/// the result is +0 (never NaN); for x -> +inf it is 1. `in` and `out` have the same size; `out` may be `in`
/// itself, or a temporary block / Map (Eigen's const-reference idiom for writable expressions).
template <class DI, class DO>
void sigmoid_into(const Eigen::DenseBase<DI>& in, const Eigen::DenseBase<DO>& out_) {
  using S = typename DO::Scalar;
  auto& out = const_cast<Eigen::DenseBase<DO>&>(out_);
  out.derived().array() = (S(1) + (-in.derived().array()).exp()).inverse();
}

/// y = max(x, 0), element-wise (y resized).   Shapes: x, y [N, F].
template <class S, class DX>
void relu_forward(const Eigen::MatrixBase<DX>& x, Mat<S>& y) {
  y = x.cwiseMax(S(0));
}

/// dx = dy .* (x > 0): the backward of relu_forward (the subgradient at 0 is 0, as PyTorch's).
/// `x` is the forward input (or its output: both are > 0 at the same places). dx may alias dy.
template <class S, class DDY, class DX>
void relu_backward(const Eigen::MatrixBase<DDY>& dy, const Eigen::MatrixBase<DX>& x, Mat<S>& dx) {
  dx = (x.array() > S(0)).select(dy.array(), S(0)).matrix();
}

}  // namespace ops
}  // namespace dea
