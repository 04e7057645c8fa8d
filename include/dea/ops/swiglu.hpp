// dea/ops/swiglu.hpp: the SwiGLU product silu(g) .* u, forward and backward, element-wise.
//
// Shapes: g, u, h [rows, w] (g = x W_g, u = x W_u: the gate and up projections of a SwiGLU MLP).
//   silu(z) = z sigmoid(z)            h = silu(g) .* u
//   silu'(z) = s (1 + z (1 - s)),  s = sigmoid(z)
// The backward recomputes sigmoid(g) from g, so the forward keeps nothing but its inputs.
// Used by the decoder LM's dense SwiGLU MLP and by every expert of the TR-MoE MLP.
#pragma once

#include "../core/tensor.hpp"
#include "activations.hpp"

namespace dea {
namespace ops {

/// silu(z) = z sigmoid(z), stable for either sign of z.
template <class S>
inline S silu(S z) {
  return z * sigmoid(z);
}

/// h = silu(g) .* u, element-wise. h may be a block of a larger matrix; it may alias g or u.
template <class DG, class DU, class DH>
void swiglu_forward(const Eigen::MatrixBase<DG>& g, const Eigen::MatrixBase<DU>& u, const Eigen::MatrixBase<DH>& h_) {
  using S = typename DH::Scalar;
  auto& h = const_cast<Eigen::MatrixBase<DH>&>(h_);
  for (Index i = 0; i < g.rows(); ++i)
    for (Index c = 0; c < g.cols(); ++c) h(i, c) = silu<S>(g(i, c)) * u(i, c);  // h = silu(g) .* u
}

/// Backward of swiglu_forward: dg = dh .* u .* silu'(g), du = dh .* silu(g). dg and du may alias dh (each
/// element is read before it is written).
template <class DDH, class DG, class DU, class DDG, class DDU>
void swiglu_backward(const Eigen::MatrixBase<DDH>& dh, const Eigen::MatrixBase<DG>& g, const Eigen::MatrixBase<DU>& u,
                     const Eigen::MatrixBase<DDG>& dg_, const Eigen::MatrixBase<DDU>& du_) {
  using S = typename DDG::Scalar;
  auto& dg = const_cast<Eigen::MatrixBase<DDG>&>(dg_);
  auto& du = const_cast<Eigen::MatrixBase<DDU>&>(du_);
  for (Index i = 0; i < g.rows(); ++i)
    for (Index c = 0; c < g.cols(); ++c) {
      const S z = g(i, c), s = sigmoid<S>(z), d = dh(i, c), uu = u(i, c);
      du(i, c) = d * z * s;                                 // h = silu(g) .* u   (d/du)
      dg(i, c) = d * uu * s * (S(1) + z * (S(1) - s));      // h = silu(g) .* u   (d/dg)
    }
}

}  // namespace ops
}  // namespace dea
