// dea/ops/softmax.hpp: masked softmax over the last axis of a row block, forward and backward.
//
// Shapes: scores [Tq, Tk]; mask [Tk] (nullptr = every key real). Masked keys act as -inf: they get
// probability 0. A row whose keys are all masked (or whose scores are all -inf) gives a row of zeros (never
// NaN) and zero gradient.
#pragma once

#include "../core/tensor.hpp"
#include "../core/workspace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dea {
namespace ops {

/// Sets to 0 every value below the smallest normal number in p[0, n). Eigen 3.4's vectorised exp clamps its
/// argument (SSE/AVX: to about -709 for double, -88 for float) and returns about 1e-308 / 1e-39 even for -inf, so
/// without this a masked key (score -inf) keeps a tiny weight, and a row whose keys are all masked normalises those
/// weights to 1/n instead of giving zeros. The true exp is below the smallest normal there too. A plain loop that
/// the compiler vectorises (Eigen's select() runs one scalar at a time).
template <class S>
inline void flush_exp_underflow(S* p, Index n) {
  const S tiny = std::numeric_limits<S>::min();
  for (Index j = 0; j < n; ++j) p[j] = p[j] < tiny ? S(0) : p[j];
}

/// Scratch elements (of the scalar type S) masked_softmax_rows needs for a [tq, tk] block.
template <class S>
constexpr Index masked_softmax_scratch(Index tq, Index tk) {
  return aligned_count<S>(tk) + 3 * aligned_count<S>(tq);
}

/// p = softmax(s) over real keys, row by row (p may alias s). Vectorised: masked keys get an additive -inf.
/// The temporaries live in `scratch` (masked_softmax_scratch(tq, tk) elements aligned to kWorkspaceAlign), so
/// this overload never allocates.
template <class S, class DS, class DP>
void masked_softmax_rows(const Eigen::MatrixBase<DS>& s, const std::uint8_t* mask, Eigen::MatrixBase<DP>& p,
                         S* scratch) {
  const Index tq = s.rows(), tk = s.cols();
  const S inf = std::numeric_limits<S>::infinity();
  Workspace<S> ws(scratch, masked_softmax_scratch<S>(tq, tk));
  using RowArr = Eigen::Array<S, 1, Eigen::Dynamic>;
  using ColArr = Eigen::Array<S, Eigen::Dynamic, 1>;
  Eigen::Map<RowArr, Eigen::AlignedMax> bias(ws.take(tk), tk);
  bias.setZero();
  bool any_real = mask == nullptr;
  if (mask)
    for (Index j = 0; j < tk; ++j) {
      if (!mask[j]) bias[j] = -inf;
      any_real = any_real || mask[j];
    }
  if (!any_real || tk == 0) {  // every key masked: zeros, never NaN
    p.setZero();
    return;
  }
  auto P = p.array();
  P = s.array().rowwise() + bias;
  // a row whose scores are all -inf (e.g. causal and key masks together) has max -inf: shift it by 0 instead,
  // so exp gives 0 everywhere, and divide by 1: a row of zeros
  Eigen::Map<ColArr, Eigen::AlignedMax> mx(ws.take(tq), tq), shift(ws.take(tq), tq), z(ws.take(tq), tq);
  mx = P.rowwise().maxCoeff();
  shift = (mx == -inf).select(S(0), mx);
  // row by row: Eigen evaluates exp of a column-broadcast expression one scalar at a time (about 19x slower)
  for (Index i = 0; i < tq; ++i) P.row(i) = (P.row(i) - shift[i]).exp();
  // exp(-inf) = 0 exactly (flush_exp_underflow): in place row by row where a row is contiguous
  if constexpr ((int(DP::Flags) & Eigen::DirectAccessBit) != 0 && bool(DP::IsRowMajor)) {
    if (p.derived().innerStride() == 1) {
      for (Index i = 0; i < tq; ++i) flush_exp_underflow(&p.derived().coeffRef(i, 0), tk);
    } else {
      P = (P < std::numeric_limits<S>::min()).select(S(0), P);
    }
  } else {
    P = (P < std::numeric_limits<S>::min()).select(S(0), P);
  }
  z = P.rowwise().sum();
  z = (z > S(0)).select(z, S(1));  // in place, so that the division below needs no temporary
  P.colwise() /= z;
}

/// p = softmax(s) over real keys, row by row (p may alias s), with its temporaries on the heap.
template <class S, class DS, class DP>
void masked_softmax_rows(const Eigen::MatrixBase<DS>& s, const std::uint8_t* mask, Eigen::MatrixBase<DP>& p) {
  AlignedVec<S> scratch(static_cast<std::size_t>(masked_softmax_scratch<S>(s.rows(), s.cols())));
  masked_softmax_rows<S>(s, mask, p, scratch.data());
}

/// In place: row r of the [tq, tk] score block s becomes the softmax over its visible keys, key j being visible when
/// km is null or km[j] != 0 and, when causal, j <= row0 + r (row r is query row0 + r); hidden keys get exactly 0 and
/// a row with no visible key becomes all 0. The attention core's softmax: one pass for the max over the visible keys,
/// one for the (vectorised) exponentials, one for the sum; it gives masked_softmax_rows' numbers without the
/// additive -inf and its scratch.
template <class Derived>
void masked_softmax_inplace(const Eigen::MatrixBase<Derived>& s_, const std::uint8_t* km, bool causal,
                            Index row0 = 0) {
  using S = typename Derived::Scalar;
  auto& s = const_cast<Eigen::MatrixBase<Derived>&>(s_);
  const Index tk = s.cols();
  for (Index i = 0; i < s.rows(); ++i) {
    auto row = s.row(i);
    const Index lim = causal ? std::min(row0 + i + 1, tk) : tk;  // keys [0, lim) pass the causal mask
    S mx = -std::numeric_limits<S>::infinity();
    if (km) {
      for (Index j = 0; j < lim; ++j)
        if (km[j]) mx = std::max(mx, row(j));
    } else if (lim > 0) {
      mx = row.head(lim).maxCoeff();
    }
    if (mx == -std::numeric_limits<S>::infinity()) {  // no visible key: zeros, never NaN
      row.setZero();
      continue;
    }
    row.array() = (row.array() - mx).exp();                 // P_ij ∝ exp(S_ij - max_j S_ij)
    if (lim < tk) row.tail(tk - lim).setZero();             // causal: keys j > row0 + i
    if (km)
      for (Index j = 0; j < lim; ++j)
        if (!km[j]) row(j) = S(0);                          // padded keys
    row /= row.sum();                                       // normalise over the visible keys
  }
}

/// ds = p .* (dp - rowsum(dp .* p)): the backward of masked_softmax_rows and masked_softmax_inplace (masked keys
/// have p = 0, so ds = 0).
template <class S, class DP, class DDP, class DDS>
void softmax_rows_backward(const Eigen::MatrixBase<DP>& p, const Eigen::MatrixBase<DDP>& dp,
                           Eigen::MatrixBase<DDS>& ds) {
  const Eigen::Array<S, Eigen::Dynamic, 1> dot = (p.array() * dp.array()).rowwise().sum();
  ds.array() = p.array() * (dp.array().colwise() - dot);
}

}  // namespace ops
}  // namespace dea
