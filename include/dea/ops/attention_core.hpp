// dea/ops/attention_core.hpp: the softmax attention core of one head, P = softmax(Qr Kr^T * scale) and O = P V,
// with its backward, for self-attention (T queries over the same T keys), causal or not, with an optional key mask.
//
// Causal heads run over row tiles of kCausalTile queries: tile [i0, i1) reads keys [0, i1) only, so the products
// and the softmax skip the masked upper triangle of P tile by tile (at T = 256, 62.5 % of the square), and the -inf
// fill touches the diagonal tile alone. The stored P keeps its [T, T] layout with zeros above the tiles (the caller
// zero-fills it once). Every element is computed by one fixed sequence of operations that depends on the sizes
// alone, so callers that give each head to one thread keep their results independent of the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "softmax.hpp"

namespace dea {
namespace ops {

/// Queries per tile of the causal attention core.
constexpr Index kCausalTile = 64;

/// Forward of one head. qr [T, d_h] and kr [T, d_h] (rotated, normalised), v [T, d_v]; p points at T x T elements
/// (row-major, zero above the causal tiles when causal), o [T, d_v] is written. key_mask: nullptr or T bytes
/// (0 = the key is padding). A query that sees no real key gets a zero row of P.
template <class S, class DQ, class DK, class DV, class DO>
void attention_core_forward(const Eigen::MatrixBase<DQ>& qr, const Eigen::MatrixBase<DK>& kr,
                            const Eigen::MatrixBase<DV>& v, S scale, bool causal, const std::uint8_t* key_mask, S* p,
                            const Eigen::MatrixBase<DO>& o_) {
  auto& o = const_cast<Eigen::MatrixBase<DO>&>(o_);
  const ScopedSerialEigen serial;  // one head is one thread's work, whoever calls
  const Index T = qr.rows(), tile = causal ? kCausalTile : T;
  MatMap<S> P(p, T, T);
  for (Index i0 = 0; i0 < T; i0 += tile) {
    const Index tb = std::min(tile, T - i0), kc = causal ? i0 + tb : T;
    auto Pt = P.block(i0, 0, tb, kc);
    Pt.noalias() = (qr.middleRows(i0, tb) * kr.topRows(kc).transpose()) * scale;  // S = Qr Kr^T * scale
    if (causal)  // query i0 + r sees keys j <= i0 + r: only the diagonal tile has keys to hide
      for (Index r = 0; r < tb; ++r)
        for (Index j = i0 + r + 1; j < kc; ++j) Pt(r, j) = -std::numeric_limits<S>::infinity();
    masked_softmax_rows<S>(Pt, key_mask, Pt);                                   // P = softmax(S)
    o.middleRows(i0, tb).noalias() = Pt * v.topRows(kc);                        // O = P V
  }
}

/// Backward of attention_core_forward: from dO [T, d_v] and the forward's P, writes dqr = dL/dQr and dkr = dL/dKr
/// [T, d_h] and dv = dL/dV [T, d_v] (all three overwritten). scratch: kCausalTile x T elements (T x T when not
/// causal).
template <class S, class DDO, class DQ, class DK, class DV, class GQ, class GK, class GV>
void attention_core_backward(const S* p, const Eigen::MatrixBase<DDO>& dO, const Eigen::MatrixBase<DQ>& qr,
                             const Eigen::MatrixBase<DK>& kr, const Eigen::MatrixBase<DV>& v, S scale, bool causal,
                             S* scratch, const Eigen::MatrixBase<GQ>& dqr_, const Eigen::MatrixBase<GK>& dkr_,
                             const Eigen::MatrixBase<GV>& dv_) {
  auto& dqr = const_cast<Eigen::MatrixBase<GQ>&>(dqr_);
  auto& dkr = const_cast<Eigen::MatrixBase<GK>&>(dkr_);
  auto& dv = const_cast<Eigen::MatrixBase<GV>&>(dv_);
  const ScopedSerialEigen serial;
  const Index T = qr.rows(), tile = causal ? kCausalTile : T;
  ConstMatMap<S> P(p, T, T);
  dkr.setZero();
  dv.setZero();
  for (Index i0 = 0; i0 < T; i0 += tile) {
    const Index tb = std::min(tile, T - i0), kc = causal ? i0 + tb : T;
    const auto Pt = P.block(i0, 0, tb, kc);
    const auto dOt = dO.middleRows(i0, tb);
    dv.topRows(kc).noalias() += Pt.transpose() * dOt;                          // O = P V   -> dV += P^T dO
    MatMap<S> dS(scratch, tb, kc);
    dS.noalias() = dOt * v.topRows(kc).transpose();                            //           -> dP = dO V^T
    softmax_rows_backward<S>(Pt, dS, dS);                                      // P = softmax(S) (P = 0 -> 0)
    dS *= scale;                                                               // S = Qr Kr^T * scale
    dqr.middleRows(i0, tb).noalias() = dS * kr.topRows(kc);                    //           -> dQr = dS Kr
    dkr.topRows(kc).noalias() += dS.transpose() * qr.middleRows(i0, tb);       //           -> dKr += dS^T Qr
  }
}

/// Scratch elements attention_core_backward needs for T queries.
constexpr Index attention_core_scratch(Index T, bool causal) { return (causal ? std::min(kCausalTile, T) : T) * T; }

}  // namespace ops
}  // namespace dea
