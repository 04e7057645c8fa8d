// dea/ops/swiglu.hpp: the SwiGLU product silu(g) .* u, forward and backward, element-wise.
//
// Shapes: g, u, h [rows, w] (g = x W_g, u = x W_u: the gate and up projections of a SwiGLU MLP).
//   silu(z) = z sigmoid(z)            h = silu(g) .* u
//   silu'(z) = s (1 + z (1 - s)),  s = sigmoid(z)
// The backward recomputes sigmoid(g) from g, so the forward keeps nothing but its inputs. Both run row by row on
// Eigen's vectorised exp, the rows split over the threads (inside a parallel region: on the calling thread).
// Used by the decoder LM's dense SwiGLU MLP and by every expert of the TR-MoE MLP.
#pragma once

#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "activations.hpp"
#include "gemm.hpp"

namespace dea {
namespace ops {

/// silu(z) = z sigmoid(z), stable for either sign of z.
template <class S>
inline S silu(S z) {
  return z * sigmoid(z);
}

namespace detail {
/// Rows [r0, r0 + nr) of h = silu(g) .* u, one row at a time on Eigen's packet exp (sigmoid(z) = 1 / (1 + exp(-z)):
/// exp(-z) = inf gives 0, exp(-z) = 0 gives 1, so either sign is safe), so a row's bits do not depend on how the rows
/// are split between threads.
template <class DG, class DU, class DH>
void swiglu_rows(const Eigen::MatrixBase<DG>& g, const Eigen::MatrixBase<DU>& u, Eigen::MatrixBase<DH>& h, Index r0,
                 Index nr) {
  using S = typename DH::Scalar;
  for (Index i = r0; i < r0 + nr; ++i) {
    const auto z = g.row(i).array();
    h.row(i).array() = z / (S(1) + (-z).exp()) * u.row(i).array();  // h = silu(g) .* u
  }
}

/// Rows [r0, r0 + nr) of the backward (see swiglu_backward); `s`, `d` are scratch rows of the width.
template <class DDH, class DG, class DU, class DDG, class DDU, class Row>
void swiglu_backward_rows(const Eigen::MatrixBase<DDH>& dh, const Eigen::MatrixBase<DG>& g,
                          const Eigen::MatrixBase<DU>& u, Eigen::MatrixBase<DDG>& dg, Eigen::MatrixBase<DDU>& du,
                          Row& s, Row& d, Index r0, Index nr) {
  using S = typename DDG::Scalar;
  for (Index i = r0; i < r0 + nr; ++i) {
    const auto z = g.row(i).array();
    s = S(1) / (S(1) + (-z).exp());                              // s = sigmoid(g)
    d = dh.row(i).array();                                       // (dg or du may alias dh)
    dg.row(i).array() = d * u.row(i).array() * s * (S(1) + z * (S(1) - s));  // h = silu(g) .* u   (d/dg)
    du.row(i).array() = d * z * s;                                           // h = silu(g) .* u   (d/du)
  }
}
}  // namespace detail

/// h = silu(g) .* u, element-wise, rows split over the threads. h may be a block of a larger matrix; it may alias
/// g or u.
template <class DG, class DU, class DH>
void swiglu_forward(const Eigen::MatrixBase<DG>& g, const Eigen::MatrixBase<DU>& u, const Eigen::MatrixBase<DH>& h_) {
  auto& h = const_cast<Eigen::MatrixBase<DH>&>(h_);
  for_row_blocks(g.rows(), [&](Index r0, Index nr) { detail::swiglu_rows(g, u, h, r0, nr); });
}

/// Backward of swiglu_forward: dg = dh .* u .* silu'(g), du = dh .* silu(g). dg or du may alias dh (each row of dh is
/// read before either is written).
template <class DDH, class DG, class DU, class DDG, class DDU>
void swiglu_backward(const Eigen::MatrixBase<DDH>& dh, const Eigen::MatrixBase<DG>& g, const Eigen::MatrixBase<DU>& u,
                     const Eigen::MatrixBase<DDG>& dg_, const Eigen::MatrixBase<DDU>& du_) {
  using S = typename DDG::Scalar;
  auto& dg = const_cast<Eigen::MatrixBase<DDG>&>(dg_);
  auto& du = const_cast<Eigen::MatrixBase<DDU>&>(du_);
  for_row_blocks(g.rows(), [&](Index r0, Index nr) {
    Eigen::Array<S, 1, Eigen::Dynamic> s(g.cols()), d(g.cols());
    detail::swiglu_backward_rows(dh, g, u, dg, du, s, d, r0, nr);
  });
}

}  // namespace ops
}  // namespace dea
