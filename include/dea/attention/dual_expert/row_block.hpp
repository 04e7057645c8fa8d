// dea/attention/dual_expert/row_block.hpp: the Dual-Expert core of one block of query rows, forward and backward.
//
// The one place the maths of the [Tq, Tk] core is written. For the rows [i0, i0 + n) of one (b, h) pair:
//   E0  = Q K^T / sqrt(Dh)                              E1 = min(0, (2 R.K - |R|^2 - |K|^2) / Dh),  R = Q W_rel^T
//   E~  = m (E - mu) / (sigma + 1e-5) per row over the real keys (m = 1 at a real key; n real keys, floored at 1)
//   logit = Q.w_q + K.w_k + w_E0 E0~ + w_E1 E1~ + c      alpha-hat = min(0.95, sigmoid(clip(logit, -10, 10)))
//   alpha_mix = the detached alpha-hat (or the frozen test hook), with an oracle gamma a_eff + (1 - gamma) of it
//   scores = (1 - alpha_mix) E0~ + alpha_mix E1~         P = softmax over the real keys (zeros for no real key)
//   ctx_h = (P .* dropout) V_h
// and, with an oracle, the gate loss of each row (gate_loss.hpp) and its gradient summed against the gate features.
//
// Three callers run it:
//  - the reference kernel (kernel.hpp, maps kept): the block's [n, Tk] buffers are slices of the cache's
//    [B, H, Tq, Tk] maps (BlockMaps), and backward reads them;
//  - the tiled kernel (kernel.hpp): the buffers live in the thread's scratch, forward saves per-row statistics
//    (RowStats) and backward recomputes the block from them with this same code on the same block shapes, so it
//    sees the bits forward saw;
//  - nn::InferenceModel (forward only, no oracle, no dropout): slices of its workspace laid out as the reference
//    kernel's maps, so its results equal the layer's bit for bit (vectorised loops start where the buffer's
//    alignment says, and Eigen's packet exp is not the scalar one bit for bit).
//
// Contract of the buffers: every pointer of BlockMaps / RowStats is either null (the block uses its scratch) or
// the pair's slice of a buffer laid out [B, H, Tq, Tk] / [B, H, Tq]. The kernel allocates nothing and throws
// nothing (it runs inside parallel regions); the caller validated every input (AttnInputs) beforehand.
#pragma once

#include "../../core/parallel.hpp"
#include "../../core/tensor.hpp"
#include "../../core/workspace.hpp"
#include "../../ops/dropout.hpp"
#include "../../ops/packed_gemm.hpp"
#include "../../ops/softmax.hpp"
#include "../gate_loss.hpp"
#include "../inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dea {
namespace detail {
namespace dex {

template <class S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using ColArr = Eigen::Array<S, Eigen::Dynamic, 1>;
template <class S>
using RowArr = Eigen::Array<S, 1, Eigen::Dynamic>;
template <class S>
using ColVec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;

/// The per-head products run through the library's packed product (ops/packed_gemm.hpp) where it exists, with
/// the pair's K_h and V_h packed once for all its query blocks; elsewhere through Eigen. (The scratch pieces are
/// aligned to kWorkspaceAlign, which must suit the packed panels.)
template <class S>
constexpr bool packed_core() {
  return ops::packed::supported<S>() && kWorkspaceAlign % ops::packed::panel_align<S>() == 0;
}

/// One head's parameters and the layer's options, as the kernel reads them.
template <class S>
struct HeadParams {
  Index Dh = 0;
  const S* W_rel = nullptr;   ///< [Dh, Dh] row-major
  const S* w_gate = nullptr;  ///< [2 Dh + 2]: w_q, w_k, w_E0, w_E1
  S c_gate = 0;
  const GateLossParams<S>* gate = nullptr;
  double dropout = 0;
};

/// The pair's slices of the reference kernel's [B, H, Tq, Tk] maps, each starting at the block's first row
/// (null: not kept). alpha_mix may equal alpha_hat and attn may equal e0n (no oracle: inference keeps three maps).
template <class S>
struct BlockMaps {
  S *e0n = nullptr, *e1n = nullptr, *logit = nullptr, *alpha_hat = nullptr, *alpha_mix = nullptr, *scores = nullptr,
    *attn = nullptr, *drop = nullptr;
  std::uint8_t* e1_clamped = nullptr;
  S *beta = nullptr, *w = nullptr, *d_b = nullptr, *g_reg = nullptr, *g_spot = nullptr, *oracle_ref = nullptr;
  bool any() const { return e0n != nullptr; }
};

/// The pair's per-row statistics [Tq] (null: not kept): the tiled kernel keeps all of them for its recompute,
/// the reference kernel sigma and the floor flags (its backward reads the maps for the rest).
template <class S>
struct RowStats {
  S *mu0 = nullptr, *mu1 = nullptr, *sigma0 = nullptr, *sigma1 = nullptr, *shift = nullptr, *sum = nullptr;
  std::uint8_t *floor0 = nullptr, *floor1 = nullptr;
};

/// Pointers into one thread's scratch.
template <class S>
struct Scratch {
  S *Kh, *Vh, *dKh, *dVh;                 // [Tk, Dh] row-major; packed core: dKh, dVh as [Dh, Tk]
  S *pKt, *pK, *pV, *pVt, *Ap, *Bpan;     // packed K_h^T, K_h, V_h, V_h^T as B operands; packed A; one B panel
  S *kn, *lk, *mrow, *kbias, *col0, *col1, *g_reg, *g_spot, *has, *a;  // [Tk]
  S *Qb, *Rb, *Db, *dQb, *dRb;            // [bq, Dh] row-major
  S *r0, *r1, *r2, *r3;                   // [bq]
  S *E0, *E1, *AM, *P, *dP, *X, *CL;      // [bq, Tk] row-major (CL holds bytes)

  /// Carves the pieces from base (base = nullptr: only counts them) and returns the values taken.
  static constexpr Index carve(Scratch* t, S* base, Index bq, Index Tk, Index Dh) {
    Index used = 0;
    auto take = [&](Index n) {
      S* p = base ? base + used : nullptr;
      used += aligned_count<S>(n);
      return p;
    };
    namespace pk = ops::packed;
    Scratch s{};
    for (S** p : {&s.Kh, &s.Vh, &s.dKh, &s.dVh}) *p = take(Tk * Dh);
    s.pKt = take(pk::whole_b_size<S>(Dh, Tk));  // (sizes 0 without the packed product)
    s.pK = take(pk::whole_b_size<S>(Tk, Dh));
    s.pV = take(pk::whole_b_size<S>(Tk, Dh));
    s.pVt = take(pk::whole_b_size<S>(Dh, Tk));
    const Index kb = std::min(2 * bq, pk::kKcMax);  // the deepest block of k of a product over a block's rows
    s.Ap = take(std::max({pk::whole_a_size<S>(2 * bq, Dh), pk::whole_a_size<S>(2 * bq, Tk), pk::whole_a_size<S>(Dh, kb)}));
    s.Bpan = take(pk::stream_b_size<S>(kb));
    for (S** p : {&s.kn, &s.lk, &s.mrow, &s.kbias, &s.col0, &s.col1, &s.g_reg, &s.g_spot, &s.has, &s.a}) *p = take(Tk);
    for (S** p : {&s.Qb, &s.Rb, &s.Db, &s.dQb, &s.dRb}) *p = take(bq * Dh);
    for (S** p : {&s.r0, &s.r1, &s.r2, &s.r3}) *p = take(bq);
    for (S** p : {&s.E0, &s.E1, &s.P, &s.AM, &s.dP, &s.X, &s.CL}) *p = take(bq * Tk);
    if (t) *t = s;
    return used;
  }
  /// Values one thread's scratch takes for blocks of bq queries against Tk keys.
  static constexpr Index size(Index bq, Index Tk, Index Dh) { return carve(nullptr, nullptr, bq, Tk, Dh); }
  /// An upper bound of size(block_rows(0, T, T), T, Dh) over every T <= max_len (for a workspace sized once):
  /// every piece grows with the block rows (at most 64) and the keys, except the packed A and panel, whose depth
  /// is bounded by kKcMax; they get room for any depth.
  static constexpr Index size_bound(Index max_len, Index Dh) {
    const Index bq = max_len < 64 ? max_len : 64, T = max_len;
    const Index m = 2 * bq > Dh ? 2 * bq : Dh;
    const Index k = T > m ? T : m;
    return carve(nullptr, nullptr, bq, T, Dh) + aligned_count<S>(pack_bound(m, k)) + aligned_count<S>(pack_bound(1, k));
  }
  /// At least the packed A of M rows and the panel of B for any inner dimension up to K.
  static constexpr Index pack_bound(Index M, Index K) {
    const Index mr = 16, nr = 64, kc = K < ops::packed::kKcMax ? K : ops::packed::kKcMax;
    return ((M + mr - 1) / mr * mr) * kc + kc * nr;
  }
  /// The pointers of one block of n rows: the second of each pair (Qb, Rb), (E0, E1), (P, AM), (dQb, dRb) starts
  /// right after the first's n rows, so that each pair is one [2n, *] matrix and one product serves both. The
  /// second pointers are not aligned in general.
  Scratch stacked(Index n, Index Tk, Index Dh) const {
    Scratch t = *this;
    t.Rb = t.Qb + n * Dh;
    t.dRb = t.dQb + n * Dh;
    t.E1 = t.E0 + n * Tk;
    t.AM = t.P + n * Tk;
    return t;
  }
};

/// The query block size for Tq queries and Tk keys (requested: Options::block_q, 0 = automatic: the block's seven
/// [bq, Tk] buffers in about 4 MiB, 32 to 64 rows; fewer rows make the products slow). Depends on nothing else.
template <class S>
Index block_rows(Index requested, Index Tq, Index Tk) {
  Index bq = requested;
  if (bq <= 0) {
    bq = static_cast<Index>((std::size_t(4) << 20) / (7 * std::size_t(Tk) * sizeof(S)));
    bq = bq < 32 ? 32 : (bq > 64 ? 64 : bq / 8 * 8);
  }
  return bq < Tq ? bq : Tq;
}

/// The gate-loss context of a forward with an oracle.
template <class S>
struct GateCtx {
  GateLossSums<S>* sums = nullptr;  ///< the pair's sums
  S* part = nullptr;                ///< the pair's [2, G + 1] partials of d(reg)/d logit and d(spot)/d logit x features
  std::int64_t* target = nullptr;   ///< the pair's target key per row [Tq]
};

/// One (b, h) pair: its inputs, its parameters, its scratch. Set up once per pair (setup), then run per block.
template <class S>
class Pair {
public:
  // ---- what the driver sets
  Index b = 0, h = 0, H = 1, Tq = 0, Tk = 0;
  const HeadParams<S>* hp = nullptr;
  const S* key_row = nullptr;         ///< the sequence's key mask [Tk]: 1 at a real key, else 0
  const S* key_bias = nullptr;        ///< the same as an additive bias: 0 at a real key, else -inf
  Index n_real_keys = 0;              ///< real keys of the sequence
  const AttnInputs<S>* in = nullptr;  ///< oracle, targets, gamma, frozen hook (null: none of them)
  const S* Q = nullptr;               ///< the pair's first row of Q, K, V (row stride ld)
  const S* K = nullptr;
  const S* V = nullptr;
  S* R = nullptr;                     ///< the pair's first row of R = Q W_rel^T (written by forward, read after)
  Index ld = 0;
  bool dropout_on = false;
  std::uint64_t drop_seed = 0;
  Scratch<S> t{};                     ///< the thread's scratch (Scratch::carve for block_q rows)

  bool any_real = false;  ///< the sequence has at least one real key
  S nr = 1;               ///< real keys, floored at 1

  /// K_h, V_h, |K_j|^2, the gate's key term, the mask row and bias, and with the packed product K_h^T and V_h
  /// packed as the B of the block products (for backward also K_h and V_h^T).
  void setup(bool backward) {
    const Index Dh = hp->Dh;
    Eigen::Map<RowMat<S>, Eigen::AlignedMax> Kh(t.Kh, Tk, Dh), Vh(t.Vh, Tk, Dh);
    Kh = Eigen::Map<const RowMat<S>, 0, Eigen::OuterStride<>>(K, Tk, Dh, Eigen::OuterStride<>(ld));
    Vh = Eigen::Map<const RowMat<S>, 0, Eigen::OuterStride<>>(V, Tk, Dh, Eigen::OuterStride<>(ld));
    if constexpr (packed_core<S>()) {
      namespace pk = ops::packed;
      const pk::View<S> k{t.Kh, Dh, 1}, v{t.Vh, Dh, 1};
      pk::pack_b_whole<S>(Dh, Tk, k.t(), t.pKt);  // [E0; E1] = [Q; R] K_h^T
      pk::pack_b_whole<S>(Tk, Dh, v, t.pV);       // ctx = P V_h
      if (backward) {
        pk::pack_b_whole<S>(Tk, Dh, k, t.pK);       // [dQ; dR] = [g0'; g1'] K_h
        pk::pack_b_whole<S>(Dh, Tk, v.t(), t.pVt);  // dP = dctx V_h^T
      }
    }
    Eigen::Map<ColArr<S>, Eigen::AlignedMax>(t.kn, Tk) = Kh.rowwise().squaredNorm().array();
    Eigen::Map<ColVec<S>, Eigen::AlignedMax>(t.lk, Tk).noalias() = Kh * Eigen::Map<const ColVec<S>>(hp->w_gate + Dh, Dh);
    if (key_row != t.mrow) std::copy(key_row, key_row + Tk, t.mrow);  // aligned copies for the vectorised loops
    if (key_bias != t.kbias) std::copy(key_bias, key_bias + Tk, t.kbias);
    const Index n = n_real_keys;
    any_real = n > 0;
    nr = S(n < 1 ? 1 : n);
  }

  /// Forward of rows [i0, i0 + n): E0~, E1~, the gate, alpha_mix, P and ctx rows (ctx: the pair's first row of
  /// the concatenated heads, row stride ld). Saves R's rows and the row statistics rs has room for; writes the
  /// maps `mp` has; with `gate` (an oracle) forms each row's gate loss and adds its gate partials.
  void forward_block(Index i0, Index n, const BlockMaps<S>& mp, const RowStats<S>& rs, const GateCtx<S>* gate,
                     S* ctx) {
    Buffers f = buffers(n, mp);
    load_q(i0, n, f, false);
    experts(n, f, mp.e1_clamped);
    normalise_forward(i0, n, f, rs);
    gate_and_mix(i0, n, f, mp, gate);
    softmax(i0, n, f, rs, false);
    // dropout on the probabilities, then ctx_h = Pd V_h
    const S* pm = f.P;
    if (dropout_on) {
      S* d = mp.drop ? mp.drop : t.dP;
      dropout_mask(i0, n, d);
      S* pd = t.dP;
      for (Index k = 0; k < n * Tk; ++k) pd[k] = d[k] * f.P[k];
      pm = pd;
    }
    const Index Dh = hp->Dh;
    if constexpr (packed_core<S>())
      ops::packed::gemm_whole_b<S>(n, Dh, Tk, {pm, Tk, 1}, t.pV, ctx + i0 * ld, ld, false, t.Ap);
    else
      Eigen::Map<RowMat<S>, 0, Eigen::OuterStride<>>(ctx + i0 * ld, n, Dh, Eigen::OuterStride<>(ld)).noalias() =
          Eigen::Map<const RowMat<S>>(pm, n, Tk) * Eigen::Map<const RowMat<S>, Eigen::AlignedMax>(t.Vh, Tk, Dh);
  }

  /// After the pair's last forward block with an oracle: the w_k partials sum_j (sum_i dl_ij) K_j of both parts.
  void finish_gate(const GateCtx<S>& gate) const {
    const Index Dh = hp->Dh, G = 2 * Dh + 2;
    Eigen::Map<const RowMat<S>, Eigen::AlignedMax> Kh(t.Kh, Tk, Dh);
    for (int part = 0; part < 2; ++part)
      Eigen::Map<RowVec<S>>(gate.part + part * (G + 1) + Dh, Dh).noalias() =
          Eigen::Map<const RowVec<S>>(part == 0 ? t.col0 : t.col1, Tk) * Kh;
  }

  /// Clears the pair's backward accumulators (call after setup(true)).
  void backward_begin(S* dWr) {
    const Index Dh = hp->Dh;
    std::fill(t.dKh, t.dKh + Tk * Dh, S(0));
    std::fill(t.dVh, t.dVh + Tk * Dh, S(0));
    std::fill(t.col0, t.col0 + Tk, S(0));
    std::fill(dWr, dWr + Dh * Dh, S(0));
  }

  /// Task backward of rows [i0, i0 + n): from dctx rows (the pair's first row, stride ld) into dQ rows (same
  /// layout), the pair's dK_h / dV_h accumulators and dW_rel (dWr [Dh, Dh]). The block's forward values come
  /// from the maps when `mp` has them (reference kernel), else they are recomputed from Q, K, R and rs.
  void backward_block(Index i0, Index n, const BlockMaps<S>& mp, const RowStats<S>& rs, const S* dctx, S* dQ,
                      S* dWr) {
    const Index Dh = hp->Dh;
    const S inv_sqrt = S(1) / std::sqrt(S(Dh)), inv_dh = S(1) / S(Dh);
    const Scratch<S> bp = t.stacked(n, Tk, Dh);
    Buffers f;
    const std::uint8_t* cl;
    if (mp.any()) {  // the reference kernel's maps
      f.E0 = mp.e0n;
      f.E1 = mp.e1n;
      f.M = mp.alpha_mix;
      f.P = mp.attn;
      cl = mp.e1_clamped;
      f.Qb = bp.Qb;
      f.Rb = bp.Rb;
      load_q(i0, n, f, true);
    } else {  // recompute: the same code on the same block shapes as forward
      f = buffers(n, mp);
      load_q(i0, n, f, true);
      experts(n, f, reinterpret_cast<std::uint8_t*>(t.CL));
      normalise_recompute(i0, n, f, rs);
      gate_and_mix(i0, n, f, mp, nullptr);
      softmax(i0, n, f, rs, true);
      cl = reinterpret_cast<const std::uint8_t*>(t.CL);
    }
    Eigen::Map<const RowMat<S>, Eigen::AlignedMax> Kh(t.Kh, Tk, Dh), Vh(t.Vh, Tk, Dh);
    Eigen::Map<RowMat<S>, Eigen::AlignedMax> dKh(t.dKh, Tk, Dh), dVh(t.dVh, Tk, Dh);
    Eigen::Map<const RowMat<S>, Eigen::AlignedMax> Qb(bp.Qb, n, Dh);
    Eigen::Map<const RowMat<S>> Rb(bp.Rb, n, Dh);
    Eigen::Map<RowMat<S>, Eigen::AlignedMax> Db(bp.Db, n, Dh), dQb(bp.dQb, n, Dh);
    Eigen::Map<RowMat<S>> dRb(bp.dRb, n, Dh);
    MatMap<S> dP(bp.dP, n, Tk), X(bp.X, n, Tk), G0(bp.P, n, Tk), G1(bp.AM, n, Tk);
    ConstMatMap<S> E0(f.E0, n, Tk), E1(f.E1, n, Tk), AM(f.M, n, Tk), P(f.P, n, Tk);
    Eigen::Map<ColArr<S>, Eigen::AlignedMax> r0(bp.r0, n), r1(bp.r1, n), r2(bp.r2, n), r3(bp.r3, n);
    Eigen::Map<const RowArr<S>, Eigen::AlignedMax> m(t.mrow, Tk);
    Db = Eigen::Map<const RowMat<S>, 0, Eigen::OuterStride<>>(dctx + i0 * ld, n, Dh, Eigen::OuterStride<>(ld));
    // ctx_h = Pd V_h, Pd = P .* drop  ->  dPd = dctx V_h^T
    if constexpr (packed_core<S>())
      ops::packed::gemm_whole_b<S>(n, Tk, Dh, {bp.Db, Dh, 1}, t.pVt, bp.dP, Tk, false, t.Ap);
    else
      dP.noalias() = Db * Vh.transpose();
    const S* pd = f.P;
    if (dropout_on) {  // the counter-based mask, drawn again
      dropout_mask(i0, n, bp.X);
      dP.array() *= X.array();  // Pd = P .* drop  ->  dP = dPd .* drop
      X.array() *= P.array();
      pd = bp.X;
    }
    // ctx = Pd V  ->  dV += Pd^T dctx   (packed: dV_h^T += dctx^T Pd, Pd read along its rows)
    if constexpr (packed_core<S>())
      ops::packed::gemm_stream_b<S>(Dh, Tk, n, ops::packed::View<S>{bp.Db, Dh, 1}.t(), {pd, Tk, 1}, t.dVh, Tk, true,
                                    t.Ap, t.Bpan);
    else
      dVh.noalias() += Eigen::Map<const Mat<S>>(pd, n, Tk).transpose() * Db;
    // P = softmax(S) over the real keys  ->  dS = P .* (dP - rowsum(P .* dP))   (in dP)
    r0 = (P.array() * dP.array()).rowwise().sum();
    dP.array() = P.array() * (dP.array().colwise() - r0);
    // S = (1 - alpha_mix) E0~ + alpha_mix E1~, alpha_mix constant  ->  g0 (G0), g1 (G1)
    G0.array() = (S(1) - AM.array()) * dP.array();
    G1.array() = AM.array() * dP.array();
    // E~ = norm(E) per row over the real keys:
    //   dE_k = m_k [ (g_k - mean_m(g)) / s  -  [var >= 1e-12] (sum_j g_j E~_j) E~_k / (n sigma) ],  s = sigma + 1e-5
    for (int e = 0; e < 2; ++e) {
      auto Gm = (e == 0 ? G0 : G1).array();
      const auto En = (e == 0 ? E0 : E1).array();
      const S* sg = e == 0 ? rs.sigma0 + i0 : rs.sigma1 + i0;
      const std::uint8_t* fl = e == 0 ? rs.floor0 + i0 : rs.floor1 + i0;
      Gm.rowwise() *= m;
      r0 = Gm.rowwise().sum() / nr;  // mean_m(g)
      r1 = (Gm * En).rowwise().sum();  // sum_j g_j E~_j
      for (Index r = 0; r < n; ++r) {
        r2[r] = fl[r] ? S(0) : r1[r] / (nr * sg[r]);  // the sigma path (none below the floor)
        r3[r] = S(1) / (sg[r] + S(DeaConstants::norm_eps));
      }
      Gm = ((Gm.colwise() - r0).colwise() * r3 - En.colwise() * r2).rowwise() * m;
    }
    // E1 = min(0, E1raw): no gradient where the clamp was active; the experts' scale factors go into the
    // gradients here: g0' = g0 / sqrt(Dh), g1' = (2/Dh) g1
    {
      S* g1 = bp.AM;
      const S two = S(2) * inv_dh;
      for (Index k = 0; k < n * Tk; ++k) g1[k] *= two * (cl[k] ? S(0) : S(1));
    }
    G0 *= inv_sqrt;
    // E0_ij = Q_i.K_j / sqrt(Dh)  ->  dQ = g0' K, dK += g0'^T Q
    // E1raw_ij = -(|R_i|^2 + |K_j|^2 - 2 R_i.K_j) / Dh
    //   dR_i = sum_j g1'_ij K_j - (sum_j g1'_ij) R_i,  dK_j += sum_i g1'_ij R_i - (sum_i g1'_ij) K_j
    // [G0; G1] is one [2n, Tk] matrix and [Qb; Rb], [dQb; dRb] are [2n, Dh]: two products serve all four terms
    r0 = G1.array().rowwise().sum();
    Eigen::Map<RowVec<S>, Eigen::AlignedMax>(t.col0, Tk) += G1.colwise().sum();  // sum_i g1'_ij (applied at the end)
    const MatMap<S> GA(bp.P, 2 * n, Tk);
    if constexpr (packed_core<S>())
      ops::packed::gemm_whole_b<S>(2 * n, Dh, Tk, {bp.P, Tk, 1}, t.pK, bp.dQb, Dh, false, t.Ap);
    else
      Eigen::Map<RowMat<S>, Eigen::AlignedMax>(bp.dQb, 2 * n, Dh).noalias() = GA * Kh;
    dRb.noalias() -= r0.matrix().asDiagonal() * Rb;
    if constexpr (packed_core<S>())  // dK_h^T += [Qb; Rb]^T [g0'; g1']
      ops::packed::gemm_stream_b<S>(Dh, Tk, 2 * n, ops::packed::View<S>{bp.Qb, Dh, 1}.t(), {bp.P, Tk, 1}, t.dKh, Tk,
                                    true, t.Ap, t.Bpan);
    else
      dKh.noalias() += GA.transpose() * Eigen::Map<const RowMat<S>, Eigen::AlignedMax>(bp.Qb, 2 * n, Dh);
    // R = Q W_rel^T  ->  dQ += dR W_rel, dW_rel += dR^T Q
    Eigen::Map<const RowMat<S>> Wr(hp->W_rel, Dh, Dh);
    dQb.noalias() += dRb * Wr;
    Eigen::Map<RowMat<S>>(dWr, Dh, Dh).noalias() += dRb.transpose() * Qb;
    Eigen::Map<RowMat<S>, 0, Eigen::OuterStride<>>(dQ + i0 * ld, n, Dh, Eigen::OuterStride<>(ld)) = dQb;
  }

  /// After the pair's last backward block: dK_h and dV_h into the pair's rows of dK, dV (row stride ld).
  void backward_end(S* dK, S* dV) const {
    const Index Dh = hp->Dh;
    Eigen::Map<const RowMat<S>, Eigen::AlignedMax> Kh(t.Kh, Tk, Dh);
    Eigen::Map<const RowVec<S>, Eigen::AlignedMax> cs(t.col0, Tk);
    Eigen::Map<RowMat<S>, 0, Eigen::OuterStride<>> dKo(dK, Tk, Dh, Eigen::OuterStride<>(ld)),
        dVo(dV, Tk, Dh, Eigen::OuterStride<>(ld));
    if constexpr (packed_core<S>()) {  // dKh and dVh hold dK_h^T and dV_h^T [Dh, Tk]
      const Eigen::Map<const Mat<S>> dKt(t.dKh, Dh, Tk), dVt(t.dVh, Dh, Tk);
      dKo = dKt.transpose() - cs.transpose().asDiagonal() * Kh;  // the (sum_i g1'_ij) K_j term of dK_j
      dVo = dVt.transpose();
    } else {
      Eigen::Map<RowMat<S>, Eigen::AlignedMax> dKh(t.dKh, Tk, Dh);
      dKh -= cs.transpose().asDiagonal() * Kh;
      dKo = dKh;
      dVo = Eigen::Map<const RowMat<S>, Eigen::AlignedMax>(t.dVh, Tk, Dh);
    }
  }

private:
  /// The block's working buffers: maps where the caller keeps them, else the scratch.
  struct Buffers {
    S *Qb = nullptr, *Rb = nullptr, *E0 = nullptr, *E1 = nullptr, *L = nullptr, *A = nullptr, *M = nullptr,
      *Sc = nullptr, *P = nullptr;
  };
  Buffers buffers(Index n, const BlockMaps<S>& mp) const {
    const Scratch<S> s = t.stacked(n, Tk, hp->Dh);
    Buffers f;
    f.Qb = s.Qb;
    f.Rb = s.Rb;
    f.E0 = mp.e0n ? mp.e0n : s.E0;
    f.E1 = mp.e1n ? mp.e1n : s.E1;
    f.A = mp.alpha_hat ? mp.alpha_hat : s.AM;
    f.M = mp.alpha_mix ? mp.alpha_mix : s.AM;
    f.L = mp.logit ? mp.logit : f.A;
    f.P = mp.attn ? mp.attn : s.P;
    f.Sc = mp.scores ? mp.scores : f.P;
    return f;
  }

  /// Q rows of the block into Qb; R = Q W_rel^T into Rb (forward: computed and saved; backward: read back).
  void load_q(Index i0, Index n, Buffers& f, bool saved_r) {
    const Index Dh = hp->Dh;
    using Strided = Eigen::Map<RowMat<S>, 0, Eigen::OuterStride<>>;
    Eigen::Map<RowMat<S>, Eigen::AlignedMax> Qb(f.Qb, n, Dh);
    Eigen::Map<RowMat<S>> Rb(f.Rb, n, Dh);
    Qb = Eigen::Map<const RowMat<S>, 0, Eigen::OuterStride<>>(Q + i0 * ld, n, Dh, Eigen::OuterStride<>(ld));
    Strided Rg(R + i0 * ld, n, Dh, Eigen::OuterStride<>(ld));
    if (saved_r) {
      Rb = Rg;
    } else {
      Rb.noalias() = Qb * Eigen::Map<const RowMat<S>>(hp->W_rel, Dh, Dh).transpose();
      Rg = Rb;
    }
  }

  /// E0 = Q K^T / sqrt(Dh), E1 = min(0, (2 R.K - |R|^2 - |K|^2) / Dh); cl (when given): 1 where the clamp is active.
  /// (The scale factors are applied after the products, so forward and backward run the same operations.)
  void experts(Index n, const Buffers& f, std::uint8_t* cl) {
    const Index Dh = hp->Dh;
    const S inv_sqrt = S(1) / std::sqrt(S(Dh)), inv_dh = S(1) / S(Dh);
    if (f.E1 == f.E0 + n * Tk && f.Rb == f.Qb + n * Dh) {  // both in one product: [E0; E1] = [Qb; Rb] K_h^T
      product_kt(2 * n, f.Qb, f.E0);
    } else {
      product_kt(n, f.Qb, f.E0);
      product_kt(n, f.Rb, f.E1);
    }
    for (Index k = 0; k < n * Tk; ++k) f.E0[k] *= inv_sqrt;
    Eigen::Map<ColArr<S>, Eigen::AlignedMax> r0(t.r0, n);
    r0 = Eigen::Map<const RowMat<S>>(f.Rb, n, Dh).rowwise().squaredNorm();
    for (Index r = 0; r < n; ++r) {  // one pass per row (plain loops, vectorised)
      S* e1 = f.E1 + r * Tk;
      const S rr = r0[r];
      const S* knp = t.kn;
      if (cl) {
        std::uint8_t* c = cl + r * Tk;
        for (Index j = 0; j < Tk; ++j) {
          const S v = (e1[j] * S(2) - rr - knp[j]) * inv_dh;
          c[j] = v > S(0) ? 1 : 0;
          e1[j] = v < S(0) ? v : S(0);
        }
      } else {
        for (Index j = 0; j < Tk; ++j) {
          const S v = (e1[j] * S(2) - rr - knp[j]) * inv_dh;
          e1[j] = v < S(0) ? v : S(0);
        }
      }
    }
  }
  /// C [rows, Tk] = A [rows, Dh] K_h^T.
  void product_kt(Index rows, const S* A, S* C) {
    const Index Dh = hp->Dh;
    if constexpr (packed_core<S>())
      ops::packed::gemm_whole_b<S>(rows, Tk, Dh, {A, Dh, 1}, t.pKt, C, Tk, false, t.Ap);
    else
      MatMap<S>(C, rows, Tk).noalias() =
          Eigen::Map<const RowMat<S>>(A, rows, Dh) * Eigen::Map<const RowMat<S>, Eigen::AlignedMax>(t.Kh, Tk, Dh).transpose();
  }

  /// Per-query normalisation over the real keys, in place; saves mu / sigma / the floor flag where rs has room.
  void normalise_forward(Index i0, Index n, const Buffers& f, const RowStats<S>& rs) {
    Eigen::Map<const RowArr<S>, Eigen::AlignedMax> m(t.mrow, Tk);
    Eigen::Map<ColArr<S>, Eigen::AlignedMax> r1(t.r1, n);
    for (int e = 0; e < 2; ++e) {
      MatMap<S> E(e == 0 ? f.E0 : f.E1, n, Tk);
      auto A = E.array();
      S* mup = e == 0 ? rs.mu0 : rs.mu1;
      S* sgp = e == 0 ? rs.sigma0 : rs.sigma1;
      std::uint8_t* flp = e == 0 ? rs.floor0 : rs.floor1;
      Eigen::Map<ColArr<S>> mu(mup ? mup + i0 : t.r0, n), sg(sgp ? sgp + i0 : t.r3, n);
      mu.matrix().noalias() = E * m.matrix().transpose();  // the sum over the real keys (a GEMV)
      mu /= nr;
      A = (A.colwise() - mu).rowwise() * m;
      r1 = A.square().rowwise().sum() / nr;  // biased variance
      sg = r1.max(S(DeaConstants::var_floor)).sqrt();
      if (flp)
        for (Index r = 0; r < n; ++r) flp[i0 + r] = r1[r] < S(DeaConstants::var_floor) ? 1 : 0;
      r1 = S(1) / (sg + S(DeaConstants::norm_eps));  // one division per row, then products
      A.colwise() *= r1;
    }
  }
  /// The same normalisation from the saved mu and sigma.
  void normalise_recompute(Index i0, Index n, const Buffers& f, const RowStats<S>& rs) {
    Eigen::Map<const RowArr<S>, Eigen::AlignedMax> m(t.mrow, Tk);
    Eigen::Map<ColArr<S>, Eigen::AlignedMax> r1(t.r1, n);
    for (int e = 0; e < 2; ++e) {
      auto A = MatMap<S>(e == 0 ? f.E0 : f.E1, n, Tk).array();
      Eigen::Map<const ColArr<S>> mu((e == 0 ? rs.mu0 : rs.mu1) + i0, n), sg((e == 0 ? rs.sigma0 : rs.sigma1) + i0, n);
      A = (A.colwise() - mu).rowwise() * m;
      r1 = S(1) / (sg + S(DeaConstants::norm_eps));
      A.colwise() *= r1;
    }
  }

  /// The gate (logit L, alpha-hat A) and the mixing coefficient M; with `gate` the rows' gate loss.
  void gate_and_mix(Index i0, Index n, const Buffers& f, const BlockMaps<S>& mp, const GateCtx<S>* gate) {
    const Index Dh = hp->Dh;
    const S amax = S(DeaConstants::alpha_max), clip = S(DeaConstants::logit_clip);
    const S* wg = hp->w_gate;
    Eigen::Map<ColVec<S>, Eigen::AlignedMax> lq(t.r2, n);
    lq.noalias() = Eigen::Map<const RowMat<S>, Eigen::AlignedMax>(f.Qb, n, Dh) * Eigen::Map<const ColVec<S>>(wg, Dh);
    const S w0 = wg[2 * Dh], w1 = wg[2 * Dh + 1], cg = hp->c_gate;
    MatMap<S> L(f.L, n, Tk), A(f.A, n, Tk);
    L.array() = ((w0 * MatMap<S>(f.E0, n, Tk).array() + w1 * MatMap<S>(f.E1, n, Tk).array()).colwise() + lq.array())
                    .rowwise() +
                Eigen::Map<const RowArr<S>, Eigen::AlignedMax>(t.lk, Tk);
    L.array() += cg;
    if (gate) {  // X = d alpha-hat / d logit: sigmoid' inside the +-10 clip and below the 0.95 cap, else 0
      MatMap<S>(t.X, n, Tk).array() = S(1) / (S(1) + (-L.array()).exp());
      S* xp = t.X;
      const S* lp = f.L;
      for (Index k = 0; k < n * Tk; ++k) {  // a plain loop: Eigen 3.4 evaluates select() one scalar at a time
        const S x = xp[k], l = lp[k];
        xp[k] = (l < -clip || l > clip || x > amax) ? S(0) : x * (S(1) - x);
      }
    }
    A.array() = (S(1) / (S(1) + (-L.array().max(-clip).min(clip)).exp())).min(amax);
    // alpha_mix: the detached alpha-hat (or the frozen copy), with an oracle gamma a_eff + (1 - gamma) alpha-hat
    const bool oracle = in && in->has_oracle();
    const bool frozen = in && in->has_frozen_alpha_hat();
    if (!oracle && !frozen) {
      if (f.M != f.A) std::copy(f.A, f.A + n * Tk, f.M);
      return;
    }
    const S gamma = in->gamma_mix();
    const S* km = t.mrow;
    S* has = t.has;
    S* a = t.a;
    for (Index r = 0; r < n; ++r) {
      const Index i = i0 + r;
      const S* am = f.A + r * Tk;
      S* mix = f.M + r * Tk;
      const S* fz = frozen ? in->frozen_alpha_hat().ptr() + (((b * H + h) * Tq) + i) * Tk : nullptr;
      if (!oracle) {
        std::copy(fz, fz + Tk, mix);
        continue;
      }
      const S* orc = in->oracle_row(b, h, i);
      S* oref = mp.oracle_ref ? mp.oracle_ref + r * Tk : nullptr;
      for (Index j = 0; j < Tk; ++j) {  // masks of S, so that the row's loops vectorise at any Tk (gate_loss.hpp)
        const S o = orc[j];
        has[j] = o == o ? km[j] : S(0);
        a[j] = std::isnan(o) ? S(0) : (o < 0 ? S(0) : (o > amax ? amax : o));
      }
      if (oref)
        for (Index j = 0; j < Tk; ++j) oref[j] = has[j] != S(0) ? a[j] : std::numeric_limits<S>::quiet_NaN();
      if (gate) gate_row(r, i, f, mp, *gate);
      for (Index j = 0; j < Tk; ++j) {
        const S det = fz ? fz[j] : am[j];
        const S a_eff = has[j] != S(0) ? a[j] : det;
        mix[j] = gamma * a_eff + (S(1) - gamma) * det;
      }
    }
  }

  /// The gate loss of row r (query i) from the gate's own alpha-hat (never the frozen copy), then its gate
  /// partials: part 0 (regression) sums g_reg sigmoid' over the labelled keys, part 1 (spotlight) the target's.
  void gate_row(Index r, Index i, const Buffers& f, const BlockMaps<S>& mp, const GateCtx<S>& gate) {
    const Index Dh = hp->Dh, G = 2 * Dh + 2;
    const S* e0 = f.E0 + r * Tk;
    const S* e1 = f.E1 + r * Tk;
    const S* am = f.A + r * Tk;
    S* g_reg = mp.g_reg ? mp.g_reg + r * Tk : t.g_reg;  // the reference kernel keeps them per cell
    S* g_spot = mp.g_spot ? mp.g_spot + r * Tk : t.g_spot;
    const bool keep = mp.g_reg != nullptr;
    const std::int64_t tgt = in->has_targets() ? in->target(b, h, i) : -1;
    const Index tk = detail::gate_loss_row<S>(Tk, e0, e1, am, t.a, t.has, t.mrow, !in->has_targets(), tgt, *hp->gate,
                                              *gate.sums, g_reg, g_spot, mp.beta ? mp.beta + r * Tk : nullptr,
                                              mp.w ? mp.w + r * Tk : nullptr, mp.d_b ? mp.d_b + r * Tk : nullptr);
    gate.target[i] = tk;
    const S* dsig = t.X + r * Tk;
    const S* qrow = f.Qb + r * Dh;
    const S* has = t.has;
    for (int part = 0; part < 2; ++part) {
      S* gp = gate.part + part * (G + 1);
      S* col = part == 0 ? t.col0 : t.col1;
      S rsum = 0, s0 = 0, s1 = 0;
      if (part == 0) {  // dl_j = g_reg_j sigmoid'_j at the labelled keys (branch-free, vectorised sums)
        S* dl = t.dP;     // scratch [Tk]: dP is free until the softmax
        for (Index j = 0; j < Tk; ++j) {
          const S prod = g_reg[j] * dsig[j];  // unconditional loads: vectorised
          const S v = has[j] != S(0) ? prod : S(0);
          dl[j] = v;
          col[j] += v;
        }
        const Eigen::Map<const RowArr<S>, Eigen::AlignedMax> dla(dl, Tk);
        rsum = dla.sum();
        s0 = (dla * Eigen::Map<const RowArr<S>>(e0, Tk)).sum();
        s1 = (dla * Eigen::Map<const RowArr<S>>(e1, Tk)).sum();
        if (!keep) std::fill(g_reg, g_reg + Tk, S(0));
      } else if (tk >= 0) {
        const S dl = g_spot[tk] * dsig[tk];
        rsum = dl;
        col[tk] += dl;
        s0 = dl * e0[tk];
        s1 = dl * e1[tk];
        if (!keep) g_spot[tk] = 0;
      }
      for (Index d = 0; d < Dh; ++d) gp[d] += rsum * qrow[d];  // w_q: sum_i (sum_j dl_ij) Q_i
      gp[2 * Dh] += s0;                                        // w_E0: sum dl E0~
      gp[2 * Dh + 1] += s1;                                    // w_E1: sum dl E1~
      gp[G] += rsum;                                           // c: sum dl
    }
  }

  /// Scores Sc = (1 - M) E0~ + M E1~ and the masked softmax into P (forward saves the row shift and sum where
  /// rs has room; the recompute reads them).
  void softmax(Index i0, Index n, const Buffers& f, const RowStats<S>& rs, bool saved) {
    MatMap<S> Sc(f.Sc, n, Tk), P(f.P, n, Tk);
    ConstMatMap<S> M(f.M, n, Tk), E0(f.E0, n, Tk), E1(f.E1, n, Tk);
    Sc = (S(1) - M.array()).matrix().cwiseProduct(E0) + M.cwiseProduct(E1);
    Eigen::Map<ColArr<S>> shift(rs.shift ? rs.shift + i0 : t.r0, n), z(rs.sum ? rs.sum + i0 : t.r1, n);
    if (!any_real) {  // every key of the sequence masked: zeros, never NaN
      P.setZero();
      if (!saved) {
        shift.setZero();
        z.setOnes();
      }
      return;
    }
    Eigen::Map<const RowArr<S>, Eigen::AlignedMax> kbias(t.kbias, Tk);
    auto PA = P.array();
    if (!saved) {
      for (Index r = 0; r < n; ++r) {
        const S mx = (Sc.array().row(r) + kbias).maxCoeff();
        shift[r] = mx == -std::numeric_limits<S>::infinity() ? S(0) : mx;
      }
    }
    for (Index r = 0; r < n; ++r) {  // per row: vectorised (see ops/softmax.hpp); masked keys exactly 0
      PA.row(r) = (Sc.array().row(r) + kbias - shift[r]).exp();
      ops::flush_exp_underflow(f.P + r * Tk, Tk);
    }
    if (!saved) {
      z = PA.rowwise().sum();
      z = (z > S(0)).select(z, S(1));
    }
    Eigen::Map<ColArr<S>, Eigen::AlignedMax> zinv(t.r3, n);
    zinv = S(1) / z;
    PA.colwise() *= zinv;
  }

  /// Dropout multipliers (0 or 1/(1-p)) of rows [i0, i0 + n) into D [n, Tk]: the counter-based mask of the cell's
  /// flat [B, H, Tq, Tk] index (ops::counter_uniform), the same for every kernel, block size and thread count.
  void dropout_mask(Index i0, Index n, S* D) const {
    ops::counter_dropout_mask(D, n * Tk, drop_seed, static_cast<std::uint64_t>(((b * H + h) * Tq + i0) * Tk), hp->dropout);
  }
};

}  // namespace dex
}  // namespace detail
}  // namespace dea
