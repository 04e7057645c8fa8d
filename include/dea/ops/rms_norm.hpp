// dea/ops/rms_norm.hpp: RMSNorm over the last axis of a row block, forward and backward.
//
// Shapes: a [rows, d]; gamma [d] (nullptr = no gain); y [rows, d]; ahat [rows, d]; rstd [rows].
//   rstd_i = 1 / sqrt(mean_c(a_ic^2) + eps)      ahat = a * rstd      y = ahat .* gamma
// This is the RMSNorm of LLaMA-style models (and of the token-routed MHA's per-head qk-norm, with d = d_h).
// The outputs may be blocks of larger matrices (pass `m.block(...)`); y may alias a. Rows are split over the threads in
// fixed blocks (ops::for_row_blocks); the gain's gradient sums one partial per block in block order, so the bits do
// not depend on the thread count.
#pragma once

#include "../core/tensor.hpp"
#include "gemm.hpp"

#include <cmath>
#include <vector>

namespace dea {
namespace ops {

namespace detail {
/// The index of the block of ops::for_blocks(rows, nb, ...) that starts at row r0.
inline Index row_block_index(Index rows, Index nb, Index r0) {
  const Index base = rows / nb, extra = rows % nb;
  return r0 < extra * (base + 1) ? r0 / (base + 1) : extra + (r0 - extra * (base + 1)) / base;
}
}  // namespace detail

/// Forward RMSNorm of every row of `a`. Writes y, ahat (the normalised rows before the gain) and rstd.
template <class S, class DA, class DY, class DH>
void rms_norm_forward(const Eigen::MatrixBase<DA>& a, const S* gamma, S eps, const Eigen::MatrixBase<DY>& y_,
                      const Eigen::MatrixBase<DH>& ahat_, S* rstd) {
  auto& y = const_cast<Eigen::MatrixBase<DY>&>(y_);
  auto& ahat = const_cast<Eigen::MatrixBase<DH>&>(ahat_);
  const Index d = a.cols();
  for_row_blocks(a.rows(), [&](Index r0, Index nr) {
    for (Index i = r0; i < r0 + nr; ++i) {
      const S ms = a.row(i).squaredNorm() / static_cast<S>(d);   // mean(a^2)
      const S r = S(1) / std::sqrt(ms + eps);                       // rstd
      rstd[i] = r;
      ahat.row(i) = a.row(i) * r;                                   // ahat = a * rstd
      if (gamma)
        y.row(i) = ahat.row(i).cwiseProduct(Eigen::Map<const RowVec<S>>(gamma, d));  // y = ahat .* gamma
      else
        y.row(i) = ahat.row(i);
    }
  });
}

/// Backward of rms_norm_forward. Writes da (may alias dy); adds dgamma += sum_rows dy .* ahat when both
/// gamma and dgamma are non-null.
///   dahat = dy .* gamma
///   da    = rstd * (dahat - ahat * mean_c(dahat .* ahat))
/// (from d ahat_c / d a_k = rstd (delta_ck - ahat_c ahat_k / d)).
template <class S, class DDY, class DH, class DDA>
void rms_norm_backward(const Eigen::MatrixBase<DDY>& dy, const Eigen::MatrixBase<DH>& ahat, const S* rstd,
                       const S* gamma, S* dgamma, const Eigen::MatrixBase<DDA>& da_) {
  auto& da = const_cast<Eigen::MatrixBase<DDA>&>(da_);
  const Index d = dy.cols(), rows = dy.rows(), nb = gemm_row_blocks(rows);
  const bool with_dgamma = gamma && dgamma;
  // dgamma: one partial sum per fixed row block, added in block order (the same bits for any thread count)
  std::vector<RowVec<S>> part(with_dgamma ? static_cast<std::size_t>(nb) : 0, RowVec<S>::Zero(d));
  for_blocks(rows, nb, [&](Index r0, Index nr) {
    RowVec<S> dahat(d);
    RowVec<S>* acc = with_dgamma ? &part[static_cast<std::size_t>(detail::row_block_index(rows, nb, r0))] : nullptr;
    for (Index i = r0; i < r0 + nr; ++i) {
      if (gamma) {
        const Eigen::Map<const RowVec<S>> g(gamma, d);
        if (acc) *acc += dy.row(i).cwiseProduct(ahat.row(i));  // y = ahat .* gamma
        dahat = dy.row(i).cwiseProduct(g);                     // y = ahat .* gamma
      } else {
        dahat = dy.row(i);
      }
      const S m = dahat.dot(ahat.row(i)) / static_cast<S>(d);
      da.row(i) = rstd[i] * (dahat - ahat.row(i) * m);  // ahat = a * rstd(a)
    }
  });
  if (with_dgamma) {
    Eigen::Map<RowVec<S>> dg(dgamma, d);
    for (const RowVec<S>& p : part) dg += p;
  }
}

}  // namespace ops
}  // namespace dea
