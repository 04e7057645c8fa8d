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
// Causal rows (Pair::causal) take every "over the real keys" over the keys [0, i + q_offset] they may see: the
// statistics, the gate, the mixing, the softmax, the gate loss and their backward run over those keys only, the
// block's products over the keys its last row may see, and every buffer holds 0 past a row's last visible key.
// With rotary position embedding (Pair::rope; query row i at position p = i + q_offset, key j at position j,
// rho_p the rotate-half rotation of ops/rope.hpp) the experts read rotated vectors and the gate the plain ones:
//   E0 = (rho_p Q_i).(rho_j K_j) / sqrt(Dh)        E1 = min(0, -|rho_p R_i - rho_j K_j|^2 / Dh),  R_i = W_rel Q_i
//   logit = Q_i.w_q + K_j.w_k + ...  (unrotated)
// so both experts depend on the positions through j - p only (rho_p^T rho_j = rho_{j-p}). Backward takes the
// gradients of the rotated vectors back through rho^T (the rotation is orthogonal).
//
// Four callers run it, each setting its pairs up with make_pair (rows, head parameters, key mask) and a Pair<S, DH>
// of the layer's compile-time head width (DH, or Eigen::Dynamic):
//  - the reference kernel (kernel.hpp, maps kept): the block's [n, Tk] buffers are slices of the cache's
//    [B, H, Tq, Tk] maps (BlockMaps), and backward reads them;
//  - the tiled kernel (kernel.hpp): the buffers live in the thread's scratch, forward saves per-row statistics
//    (RowStats) and backward recomputes the block from them with this same code on the same block shapes, so it
//    sees the bits forward saw;
//  - nn::InferenceModel (forward only, no oracle, no dropout): slices of its workspace laid out as the reference
//    kernel's maps, so its results equal the layer's (of the same DHead) bit for bit (vectorised loops start where
//    the buffer's alignment says, and Eigen's packet exp is not the scalar one bit for bit). It is never causal;
//  - DualExpertAttention::forward_decode (forward only, causal, no oracle): the new queries against the cached keys,
//    the buffers in the scratch as the tiled kernel's.
//
// Contract of the buffers: every pointer of BlockMaps / RowStats is either null (the block uses its scratch) or
// the pair's slice of a buffer laid out [B, H, Tq, Tk] / [B, H, Tq]. The kernel allocates nothing and throws
// nothing (it runs inside parallel regions); the caller validated every input (AttnInputs) beforehand.
#pragma once

#include "../../core/parallel.hpp"
#include "../../core/tensor.hpp"
#include "../../core/workspace.hpp"
#include "../../ops/dropout.hpp"
#include "../../ops/block_product.hpp"
#include "../../ops/rope.hpp"
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
  S *Kh, *Vh, *dKh, *dVh;                 // [Tk, Dh] (dKh, dVh: in the layout of ops::TnAccumulator)
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
    using Rhs = ops::SharedRhs<S>;
    s.pKt = take(Rhs::size(Dh, Tk));  // (sizes 0 without the packed product)
    s.pK = take(Rhs::size(Tk, Dh));
    s.pV = take(Rhs::size(Tk, Dh));
    s.pVt = take(Rhs::size(Dh, Tk));
    const Index kb = std::min(2 * bq, pk::kKcMax);  // the deepest block of k of a product over a block's rows
    s.Ap = take(std::max({ops::product_a_size<S>(2 * bq, Dh), ops::product_a_size<S>(2 * bq, Tk),
                          ops::product_a_size<S>(Dh, kb)}));
    s.Bpan = take(ops::product_panel_size<S>(kb > Dh ? kb : Dh));  // also the small products of K = Dh
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

// ---- the few vectorised primitives the kernel is written with (one instance each per scalar type: every other
// step is a plain loop, which keeps the number of distinct Eigen expressions, and so the compile time, small)

/// The sum of a[0, n).
template <class S>
S sum_of(const S* a, Index n) {
  return Eigen::Map<const RowArr<S>>(a, n).sum();
}
/// sum_k a[k] b[k].
template <class S>
S dot(const S* a, const S* b, Index n) {
  return (Eigen::Map<const RowArr<S>>(a, n) * Eigen::Map<const RowArr<S>>(b, n)).sum();
}
/// The largest of a[0, n), n >= 1.
template <class S>
S max_of(const S* a, Index n) {
  return Eigen::Map<const RowArr<S>>(a, n).maxCoeff();
}
/// a = exp(a), vectorised (Eigen's packet exp; where the loop starts depends on a's alignment).
template <class S>
void exp_in_place(S* a, Index n) {
  Eigen::Map<RowArr<S>> m(a, n);
  m = m.exp();
}
/// Rotates the n rows of x [n, Dh] (row stride ldx), at positions pos0, pos0 + 1, ..., by sign * phi: the
/// arithmetic of ops::rope_forward (sign 1) and ops::rope_backward (sign -1), without their checks (the caller
/// reserved the table for the positions; nothing here may throw).
template <class S>
void rope_rows(const ops::RopeTable<S>& tab, Index pos0, S* x, Index n, Index ldx, S sign) {
  const Index half = tab.head_dim() / 2;
  for (Index r = 0; r < n; ++r) {
    const S* c = tab.cos_row(pos0 + r);
    const S* s = tab.sin_row(pos0 + r);
    S* lo = x + r * ldx;
    S* hi = lo + half;
    for (Index i = 0; i < half; ++i) {
      const S a = lo[i], b = hi[i], sn = sign * s[i];
      lo[i] = a * c[i] - b * sn;
      hi[i] = b * c[i] + a * sn;
    }
  }
}

/// One (b, h) pair: its inputs, its parameters, its scratch. Made by make_pair, set up once (setup), then run per
/// block. DH is the head width when the layer fixes it at compile time (DualExpertAttention's DHead), else Dynamic:
/// with a fixed DH the head-sized work (the copies of the head's slices of Q, K, V, the gate's Q.w_q and K.w_k,
/// |R|^2 and |K|^2 of the lock-and-key expert, R = W_rel Q and its backward, the loops over a head's features)
/// runs on fixed-size Eigen vectors and loops of constant trip count, which the compiler unrolls and keeps in
/// registers; Dynamic runs the same steps at the run-time width. The two differ by round-off (the order of a
/// head's sums), not in what they compute.
template <class S, int DH = Eigen::Dynamic>
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
  /// Causal rows: query row i sees the keys [0, i + q_offset] only (and of those the real ones). The layer's
  /// causal self-attention has q_offset = 0; incremental decoding runs new queries against cached keys with
  /// q_offset = Tk - Tq. (q_offset is also the position of query row 0 for rope, causal or not; key j is at
  /// position j.) Every per-row step (statistics, gate, gate loss, softmax, their backward) runs over the
  /// visible keys; the cells past them hold 0 in every buffer (NaN in beta / w / d_b / oracle_ref), so they add
  /// nothing to any product or sum.
  bool causal = false;
  Index q_offset = 0;
  /// Rotary position embedding of the experts' queries and keys (null: none; the table covers the positions
  /// [0, max(Tk, q_offset + Tq))). Q and K hold the unrotated projections, which the gate reads; the experts read
  /// rho Q, rho R and rho K (the file comment). R is saved rotated.
  const ops::RopeTable<S>* rope = nullptr;
  /// With rope: K already holds the rotated keys rho_j K_j (the decode cache) and key_gate [Tk] the gate's key
  /// terms K_j.w_k of the unrotated keys. Forward only without an oracle (the gate loss reads the unrotated K).
  bool keys_rotated = false;
  const S* key_gate = nullptr;
  Scratch<S> t{};                     ///< the thread's scratch (Scratch::carve for block_q rows)

  bool any_real = false;  ///< the sequence has at least one real key
  S nr = 1;               ///< real keys, floored at 1

  /// The head width: DH where it is fixed (a constant the loops over a head's features see), else hp->Dh.
  Index dh() const {
    if constexpr (DH == Eigen::Dynamic)
      return hp->Dh;
    else
      return DH;
  }
  /// a.b over one head's features: a fixed-size reduction where DH is fixed, else dot().
  S hdot(const S* a, const S* b) const {
    if constexpr (DH == Eigen::Dynamic) {
      return dot(a, b, hp->Dh);
    } else {
      using HeadArr = Eigen::Array<S, 1, DH>;
      return (Eigen::Map<const HeadArr>(a) * Eigen::Map<const HeadArr>(b)).sum();
    }
  }

  /// The keys row i may see: [0, keys(i)) (all Tk unless causal).
  Index keys(Index i) const {
    if (!causal) return Tk;
    const Index e = i + q_offset + 1;
    return e < Tk ? e : Tk;
  }
  /// The keys any row of the block [i0, i0 + n) may see: [0, block_keys(i0, n)) (the products of a causal block
  /// run over these columns only; the columns past them are never read).
  Index block_keys(Index i0, Index n) const { return keys(i0 + n - 1); }
  /// The real keys among the first nk, floored at 1 (nr unless causal).
  S real_keys(Index nk) const {
    if (!causal) return nr;
    const S c = sum_of(t.mrow, nk);  // a sum of 0s and 1s: exact
    return c < S(1) ? S(1) : c;
  }

  /// K_h, V_h, |K_j|^2, the gate's key term, the mask row and bias, and with the packed product K_h^T and V_h
  /// packed as the B of the block products (for backward also K_h and V_h^T).
  void setup(bool backward) {
    const Index Dh = dh();
    copy_rows(K, ld, Tk, Dh, t.Kh);
    if (rope && !keys_rotated) rope_rows(*rope, 0, t.Kh, Tk, Dh, S(1));  // rho_j K_j (the experts' keys)
    copy_rows(V, ld, Tk, Dh, t.Vh);
    const ops::packed::View<S> k{t.Kh, Dh, 1}, v{t.Vh, Dh, 1};
    Kt_.set(Dh, Tk, k.t(), t.pKt);  // [E0; E1] = [Q; R] K_h^T
    V_.set(Tk, Dh, v, t.pV);        // ctx = P V_h
    if (backward) {
      K_.set(Tk, Dh, k, t.pK);        // [dQ; dR] = [g0'; g1'] K_h
      Vt_.set(Dh, Tk, v.t(), t.pVt);  // dP = dctx V_h^T
    }
    const S* wk = hp->w_gate + Dh;
    for (Index j = 0; j < Tk; ++j) {
      const S* kj = t.Kh + j * Dh;
      t.kn[j] = hdot(kj, kj);  // |K_j|^2 (= |rho_j K_j|^2)
      // K_j.w_k, of the unrotated key with rope
      t.lk[j] = !rope ? hdot(kj, wk) : keys_rotated ? key_gate[j] : hdot(K + j * ld, wk);
    }
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
    experts(i0, n, f, mp.e1_clamped);
    normalise(i0, n, f, rs, false);
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
    const Index Dh = dh();
    const Index kb = block_keys(i0, n);  // causal: Pd is 0 past the block's visible keys
    V_.product(n, Dh, kb, {pm, Tk, 1}, ctx + i0 * ld, ld, false, t.Ap);
  }

  /// After the pair's last forward block with an oracle: the w_k partials sum_j (sum_i dl_ij) K_j of both parts.
  void finish_gate(const GateCtx<S>& gate) const {
    const Index Dh = dh(), G = 2 * Dh + 2;
    for (int part = 0; part < 2; ++part) {
      S* out = gate.part + part * (G + 1) + Dh;
      const S* col = part == 0 ? t.col0 : t.col1;
      std::fill(out, out + Dh, S(0));
      for (Index j = 0; j < Tk; ++j) {
        const S cj = col[j];
        const S* kj = rope ? K + j * ld : t.Kh + j * Dh;  // the gate's (unrotated) key
        for (Index d = 0; d < Dh; ++d) out[d] += cj * kj[d];
      }
    }
  }

  /// Clears the pair's backward accumulators (call after setup(true)).
  void backward_begin(S* dWr) {
    const Index Dh = dh();
    dK_acc().clear();
    dV_acc().clear();
    std::fill(t.col0, t.col0 + Tk, S(0));
    std::fill(dWr, dWr + Dh * Dh, S(0));
  }

  /// Task backward of rows [i0, i0 + n): from dctx rows (the pair's first row, stride ld) into dQ rows (same
  /// layout), the pair's dK_h / dV_h accumulators and dW_rel (dWr [Dh, Dh]). The block's forward values come
  /// from the maps when `mp` has them (reference kernel), else they are recomputed from Q, K, R and rs.
  void backward_block(Index i0, Index n, const BlockMaps<S>& mp, const RowStats<S>& rs, const S* dctx, S* dQ,
                      S* dWr) {
    const Index Dh = dh(), nt = n * Tk;
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
      experts(i0, n, f, reinterpret_cast<std::uint8_t*>(t.CL));
      normalise(i0, n, f, rs, true);
      gate_and_mix(i0, n, f, mp, nullptr);
      softmax(i0, n, f, rs, true);
      cl = reinterpret_cast<const std::uint8_t*>(t.CL);
    }
    const S* E0 = f.E0;
    const S* E1 = f.E1;
    const S* AM = f.M;
    const S* P = f.P;
    S* dP = bp.dP;
    S* X = bp.X;
    S* G0 = bp.P;   // g0 and g1: one [2n, Tk] matrix
    S* G1 = bp.AM;
    S* r0 = bp.r0;
    copy_rows(dctx + i0 * ld, ld, n, Dh, bp.Db);
    // causal: the products run over the block's visible keys [0, kb) (P and the gradients are 0 past them)
    const Index kb = block_keys(i0, n);
    // ctx_h = Pd V_h, Pd = P .* drop  ->  dPd = dctx V_h^T
    Vt_.product(n, kb, Dh, {bp.Db, Dh, 1}, dP, Tk, false, t.Ap);
    const S* pd = P;
    if (dropout_on) {  // the counter-based mask, drawn again
      dropout_mask(i0, n, X);
      for (Index k = 0; k < nt; ++k) {
        dP[k] *= X[k];  // Pd = P .* drop  ->  dP = dPd .* drop
        X[k] *= P[k];
      }
      pd = X;
    }
    // ctx = Pd V  ->  dV += Pd^T dctx
    dV_acc().add_tn(kb, n, {pd, Tk, 1}, {bp.Db, Dh, 1}, t.Ap, t.Bpan);
    // P = softmax(S) over the real keys  ->  dS = P .* (dP - rowsum(P .* dP))   (in dP)
    for (Index r = 0; r < n; ++r) {
      const Index nk = keys(i0 + r);  // causal: P = 0 past the visible keys, and so is dS
      const S* p = P + r * Tk;
      S* g = dP + r * Tk;
      const S s = dot(p, g, nk);
      for (Index j = 0; j < nk; ++j) g[j] = p[j] * (g[j] - s);
      std::fill(g + nk, g + Tk, S(0));
    }
    // S = (1 - alpha_mix) E0~ + alpha_mix E1~, alpha_mix constant  ->  g0, g1
    for (Index k = 0; k < nt; ++k) {
      const S a = AM[k], g = dP[k];
      G0[k] = (S(1) - a) * g;
      G1[k] = a * g;
    }
    // E~ = norm(E) per row over the real keys:
    //   dE_k = m_k [ (g_k - mean_m(g)) / s  -  [var >= 1e-12] (sum_j g_j E~_j) E~_k / (n sigma) ],  s = sigma + 1e-5
    const S* m = t.mrow;
    for (int e = 0; e < 2; ++e) {
      S* Gm = e == 0 ? G0 : G1;
      const S* En = e == 0 ? E0 : E1;
      const S* sg = e == 0 ? rs.sigma0 + i0 : rs.sigma1 + i0;
      const std::uint8_t* fl = e == 0 ? rs.floor0 + i0 : rs.floor1 + i0;
      for (Index r = 0; r < n; ++r) {
        S* g = Gm + r * Tk;
        const S* en = En + r * Tk;
        const Index nk = keys(i0 + r);  // causal: the statistics were over the visible keys [0, nk)
        const S nrr = real_keys(nk);
        for (Index j = 0; j < nk; ++j) g[j] *= m[j];  // only real keys carry gradient
        const S mean = sum_of(g, nk) / nrr;            // mean_m(g)
        const S ge = dot(g, en, nk);                   // sum_j g_j E~_j
        const S coef = fl[r] ? S(0) : ge / (nrr * sg[r]);  // the sigma path (none below the floor)
        const S inv_s = S(1) / (sg[r] + S(DeaConstants::norm_eps));
        for (Index j = 0; j < nk; ++j) g[j] = ((g[j] - mean) * inv_s - en[j] * coef) * m[j];
        std::fill(g + nk, g + Tk, S(0));  // invisible keys: no gradient
      }
    }
    // E1 = min(0, E1raw): no gradient where the clamp was active; the experts' scale factors go into the
    // gradients here: g0' = g0 / sqrt(Dh), g1' = (2/Dh) g1
    const S two = S(2) * inv_dh;
    for (Index k = 0; k < nt; ++k) {
      G1[k] *= two * (cl[k] ? S(0) : S(1));
      G0[k] *= inv_sqrt;
    }
    // E0_ij = Q_i.K_j / sqrt(Dh)  ->  dQ = g0' K, dK += g0'^T Q
    // E1raw_ij = -(|R_i|^2 + |K_j|^2 - 2 R_i.K_j) / Dh
    //   dR_i = sum_j g1'_ij K_j - (sum_j g1'_ij) R_i,  dK_j += sum_i g1'_ij R_i - (sum_i g1'_ij) K_j
    // [G0; G1] is one [2n, Tk] matrix and [Qb; Rb], [dQb; dRb] are [2n, Dh]: two products serve all four terms
    S* cs = t.col0;  // sum_i g1'_ij, over all blocks (applied at the end)
    for (Index r = 0; r < n; ++r) {
      const S* g = G1 + r * Tk;
      r0[r] = sum_of(g, Tk);
      for (Index j = 0; j < Tk; ++j) cs[j] += g[j];
    }
    K_.product(2 * n, Dh, kb, {G0, Tk, 1}, bp.dQb, Dh, false, t.Ap);
    for (Index r = 0; r < n; ++r) {
      const S* rr = bp.Rb + r * Dh;
      S* dr = bp.dRb + r * Dh;
      const S c = r0[r];
      for (Index d = 0; d < Dh; ++d) dr[d] -= c * rr[d];
    }
    dK_acc().add_tn(kb, 2 * n, {G0, Tk, 1}, {bp.Qb, Dh, 1}, t.Ap, t.Bpan);  // dK_h += [g0'; g1']^T [Qb; Rb]
    if (rope) {  // the experts read rho_i Q_i and rho_i R_i: back through rho^T, and Qb the unrotated rows again
      rope_rows(*rope, i0 + q_offset, bp.dQb, n, Dh, S(-1));
      rope_rows(*rope, i0 + q_offset, bp.dRb, n, Dh, S(-1));
      copy_rows(Q + i0 * ld, ld, n, Dh, bp.Qb);
    }
    // R = Q W_rel^T  ->  dQ += dR W_rel, dW_rel += dR^T Q
    rel_backward(n, bp.dRb, bp.Qb, bp.dQb, dWr);
    for (Index r = 0; r < n; ++r) std::copy(bp.dQb + r * Dh, bp.dQb + (r + 1) * Dh, dQ + (i0 + r) * ld);
  }

  /// After the pair's last backward block: dK_h and dV_h into the pair's rows of dK, dV (row stride ld).
  void backward_end(S* dK, S* dV) const {
    const Index Dh = dh();
    const S* cs = t.col0;
    const ops::TnAccumulator<S, DH> gk = dK_acc(), gv = dV_acc();
    for (Index j = 0; j < Tk; ++j) {
      S* dk = dK + j * ld;
      S* dv = dV + j * ld;
      const S* kj = t.Kh + j * Dh;
      for (Index d = 0; d < Dh; ++d) {
        dk[d] = gk.at(j, d) - cs[j] * kj[d];  // with the (sum_i g1'_ij) K_j term of dK_j
        dv[d] = gv.at(j, d);
      }
    }
    if (rope) rope_rows(*rope, 0, dK, Tk, ld, S(-1));  // the experts read rho_j K_j: dK = rho_j^T d(rho_j K_j)
  }

private:
  /// The products' shared right-hand sides, set by setup: K_h^T [Dh, Tk], V_h [Tk, Dh] (forward and backward),
  /// K_h [Tk, Dh], V_h^T [Dh, Tk] (backward); those Dh wide take the compile-time DH for their tile.
  ops::SharedRhs<S> Kt_, Vt_;
  ops::SharedRhs<S, DH> V_, K_;
  /// The accumulators of dK_h and dV_h [Tk, Dh] (their layout is the product helper's).
  ops::TnAccumulator<S, DH> dK_acc() const { return {t.dKh, Tk, dh()}; }
  ops::TnAccumulator<S, DH> dV_acc() const { return {t.dVh, Tk, dh()}; }

  /// The block's working buffers: maps where the caller keeps them, else the scratch.
  struct Buffers {
    S *Qb = nullptr, *Rb = nullptr, *E0 = nullptr, *E1 = nullptr, *L = nullptr, *A = nullptr, *M = nullptr,
      *Sc = nullptr, *P = nullptr;
  };
  Buffers buffers(Index n, const BlockMaps<S>& mp) const {
    const Scratch<S> s = t.stacked(n, Tk, dh());
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

  /// Heads up to this width run R = W_rel Q and its backward row by row on fixed-size Eigen matrices; wider ones
  /// (and Dynamic) as products over the block's rows.
  static constexpr int kRowwiseRelMax = 16;

  /// R = Q W_rel^T for n rows [n, Dh] (R_i = W_rel Q_i).
  void rel_forward(Index n, const S* Qb, S* Rb) {
    if constexpr (DH == Eigen::Dynamic || DH > kRowwiseRelMax) {
      const Index Dh = dh();
      ops::product<S>(n, Dh, Dh, {Qb, Dh, 1}, ops::packed::View<S>{hp->W_rel, Dh, 1}.t(), Rb, Dh, false, t.Ap, t.Bpan);
    } else {
      using HeadMat = Eigen::Matrix<S, DH, DH, Eigen::RowMajor>;
      using HeadVec = Eigen::Matrix<S, DH, 1>;
      const Eigen::Map<const HeadMat> W(hp->W_rel);
      for (Index r = 0; r < n; ++r)
        Eigen::Map<HeadVec>(Rb + r * DH).noalias() = W.lazyProduct(Eigen::Map<const HeadVec>(Qb + r * DH));
    }
  }
  /// Backward of rel_forward: dQ += dR W_rel, dW_rel += dR^T Q (n rows; dWr [Dh, Dh]).
  void rel_backward(Index n, const S* dRb, const S* Qb, S* dQb, S* dWr) {
    if constexpr (DH == Eigen::Dynamic || DH > kRowwiseRelMax) {
      const Index Dh = dh();
      ops::product<S>(n, Dh, Dh, {dRb, Dh, 1}, {hp->W_rel, Dh, 1}, dQb, Dh, true, t.Ap, t.Bpan);
      ops::product<S>(Dh, Dh, n, ops::packed::View<S>{dRb, Dh, 1}.t(), {Qb, Dh, 1}, dWr, Dh, true, t.Ap, t.Bpan);
    } else {
      using HeadMat = Eigen::Matrix<S, DH, DH, Eigen::RowMajor>;
      using HeadVec = Eigen::Matrix<S, DH, 1>;
      const Eigen::Map<const HeadMat> W(hp->W_rel);
      Eigen::Map<HeadMat> dW(dWr);
      for (Index r = 0; r < n; ++r) {
        const Eigen::Map<const HeadVec> dr(dRb + r * DH), q(Qb + r * DH);
        Eigen::Map<HeadVec>(dQb + r * DH).noalias() += W.transpose().lazyProduct(dr);  // dQ_i += W_rel^T dR_i
        dW.noalias() += dr * q.transpose();                                              // dW_rel += dR_i Q_i^T
      }
    }
  }

  /// rows [rows, cols] from src (row stride lds) into dst (contiguous).
  static void copy_rows(const S* src, Index lds, Index rows, Index cols, S* dst) {
    for (Index r = 0; r < rows; ++r) std::copy(src + r * lds, src + r * lds + cols, dst + r * cols);
  }

  /// Q rows of the block into Qb; R = Q W_rel^T into Rb (forward: computed and saved; backward: read back). With
  /// rope both are rotated to the rows' positions (rho_i Q_i, rho_i R_i; R saved rotated).
  void load_q(Index i0, Index n, Buffers& f, bool saved_r) {
    const Index Dh = dh();
    copy_rows(Q + i0 * ld, ld, n, Dh, f.Qb);
    S* Rg = R + i0 * ld;
    if (saved_r) {
      copy_rows(Rg, ld, n, Dh, f.Rb);
    } else {
      rel_forward(n, f.Qb, f.Rb);
      if (rope) rope_rows(*rope, i0 + q_offset, f.Rb, n, Dh, S(1));
      for (Index r = 0; r < n; ++r) std::copy(f.Rb + r * Dh, f.Rb + (r + 1) * Dh, Rg + r * ld);
    }
    if (rope) rope_rows(*rope, i0 + q_offset, f.Qb, n, Dh, S(1));
  }

  /// E0 = Q K^T / sqrt(Dh), E1 = min(0, (2 R.K - |R|^2 - |K|^2) / Dh); cl (when given): 1 where the clamp is active.
  /// (The scale factors are applied after the products, so forward and backward run the same operations.)
  void experts(Index i0, Index n, const Buffers& f, std::uint8_t* cl) {
    const Index Dh = dh();
    const S inv_sqrt = S(1) / std::sqrt(S(Dh)), inv_dh = S(1) / S(Dh);
    const Index kb = block_keys(i0, n);
    if (f.E1 == f.E0 + n * Tk && f.Rb == f.Qb + n * Dh) {  // both in one product: [E0; E1] = [Qb; Rb] K_h^T
      product_kt(2 * n, kb, f.Qb, f.E0);
    } else {
      product_kt(n, kb, f.Qb, f.E0);
      product_kt(n, kb, f.Rb, f.E1);
    }
    for (Index k = 0; k < n * Tk; ++k) f.E0[k] *= inv_sqrt;
    for (Index r = 0; r < n; ++r) {  // one pass per row (plain loops, vectorised)
      const Index nk = keys(i0 + r);
      S* e1 = f.E1 + r * Tk;
      const S* rrow = f.Rb + r * Dh;
      const S rr = hdot(rrow, rrow);
      const S* knp = t.kn;
      if (cl) {
        std::uint8_t* c = cl + r * Tk;
        for (Index j = 0; j < nk; ++j) {
          const S v = (e1[j] * S(2) - rr - knp[j]) * inv_dh;
          c[j] = v > S(0) ? 1 : 0;
          e1[j] = v < S(0) ? v : S(0);
        }
        std::fill(c + nk, c + Tk, std::uint8_t(0));  // causal: the keys past the row's last visible one
      } else {
        for (Index j = 0; j < nk; ++j) {
          const S v = (e1[j] * S(2) - rr - knp[j]) * inv_dh;
          e1[j] = v < S(0) ? v : S(0);
        }
      }
      std::fill(e1 + nk, e1 + Tk, S(0));
    }
  }
  /// C [rows, 0:kb] = A [rows, Dh] K_h[0:kb]^T (row stride Tk; kb = Tk unless causal).
  void product_kt(Index rows, Index kb, const S* A, S* C) {
    const Index Dh = dh();
    Kt_.product(rows, kb, Dh, {A, Dh, 1}, C, Tk, false, t.Ap);
  }

  /// Per-query normalisation over the real keys, in place. Forward computes mu and sigma (saved where rs has room,
  /// with the floor flag); the recompute (saved) reads them.
  void normalise(Index i0, Index n, const Buffers& f, const RowStats<S>& rs, bool saved) {
    const S* m = t.mrow;
    for (int e = 0; e < 2; ++e) {
      S* E = e == 0 ? f.E0 : f.E1;
      S* mup = e == 0 ? rs.mu0 : rs.mu1;
      S* sgp = e == 0 ? rs.sigma0 : rs.sigma1;
      std::uint8_t* flp = e == 0 ? rs.floor0 : rs.floor1;
      for (Index r = 0; r < n; ++r) {
        S* a = E + r * Tk;
        const Index nk = keys(i0 + r);  // causal: the visible keys [0, nk)
        const S nrr = real_keys(nk);
        S mu, sg;
        if (saved) {
          mu = mup[i0 + r];
          sg = sgp[i0 + r];
        } else {
          mu = dot(a, m, nk) / nrr;  // the mean over the real (visible) keys
        }
        for (Index j = 0; j < nk; ++j) a[j] = (a[j] - mu) * m[j];  // E - mu at real keys, 0 at padded keys
        std::fill(a + nk, a + Tk, S(0));                          // and 0 at the invisible keys
        if (!saved) {
          const S var = dot(a, a, nk) / nrr;  // biased variance
          sg = std::sqrt(var > S(DeaConstants::var_floor) ? var : S(DeaConstants::var_floor));
          if (mup) mup[i0 + r] = mu;
          if (sgp) sgp[i0 + r] = sg;
          if (flp) flp[i0 + r] = var < S(DeaConstants::var_floor) ? 1 : 0;
        }
        const S inv = S(1) / (sg + S(DeaConstants::norm_eps));  // one division per row, then products
        for (Index j = 0; j < nk; ++j) a[j] *= inv;
      }
    }
  }

  /// alpha-hat = min(0.95, sigmoid(clip(logit, -10, 10))) of m cells, from their logits lp into ap. (Functions of
  /// their arguments alone, so that their loops vectorise whether or not the compiler inlines them.)
  static void alpha_hat_cells(const S* lp, S* ap, Index m) {
    const S amax = S(DeaConstants::alpha_max), clip = S(DeaConstants::logit_clip);
    for (Index k = 0; k < m; ++k) {
      const S l = lp[k];
      ap[k] = -(l < -clip ? -clip : (l > clip ? clip : l));
    }
    exp_in_place(ap, m);
    for (Index k = 0; k < m; ++k) {
      const S a = S(1) / (S(1) + ap[k]);
      ap[k] = a < amax ? a : amax;
    }
  }
  /// d alpha-hat / d logit of m cells into xp: sigmoid' inside the +-10 clip and below the 0.95 cap, else 0.
  static void sigmoid_slope(const S* lp, S* xp, Index m) {
    const S amax = S(DeaConstants::alpha_max), clip = S(DeaConstants::logit_clip);
    for (Index k = 0; k < m; ++k) xp[k] = -lp[k];
    exp_in_place(xp, m);
    for (Index k = 0; k < m; ++k) {
      const S x = S(1) / (S(1) + xp[k]), l = lp[k];
      xp[k] = (l < -clip || l > clip || x > amax) ? S(0) : x * (S(1) - x);
    }
  }

  /// The gate (logit L, alpha-hat A) and the mixing coefficient M; with `gate` the rows' gate loss.
  void gate_and_mix(Index i0, Index n, const Buffers& f, const BlockMaps<S>& mp, const GateCtx<S>* gate) {
    const Index Dh = dh(), nt = n * Tk;
    const S amax = S(DeaConstants::alpha_max);
    const S* wg = hp->w_gate;
    const S w0 = wg[2 * Dh], w1 = wg[2 * Dh + 1], cg = hp->c_gate;
    for (Index r = 0; r < n; ++r) {  // logit = Q.w_q + K.w_k + w_E0 E0~ + w_E1 E1~ + c
      const Index nk = keys(i0 + r);
      const S lq = hdot(rope ? Q + (i0 + r) * ld : f.Qb + r * Dh, wg);  // the gate's (unrotated) query
      const S* e0 = f.E0 + r * Tk;
      const S* e1 = f.E1 + r * Tk;
      S* l = f.L + r * Tk;
      for (Index j = 0; j < nk; ++j) l[j] = (((w0 * e0[j] + w1 * e1[j]) + lq) + t.lk[j]) + cg;
      std::fill(l + nk, l + Tk, S(0));  // causal: invisible cells hold 0 (logit, alpha-hat, alpha_mix)
    }
    // Causal blocks run the element-wise steps row by row over the visible keys (the exponentials of the other
    // blocks run over the whole block at once: their bits are those of the non-causal reference).
    auto rows = [&](auto&& fn) {  // fn(first cell, cells) over the block's visible cells
      if (!causal) {
        fn(Index(0), nt);
      } else {
        for (Index r = 0; r < n; ++r) fn(r * Tk, keys(i0 + r));
      }
    };
    if (gate) {  // X = d alpha-hat / d logit
      rows([&](Index k0, Index m) { sigmoid_slope(f.L + k0, t.X + k0, m); });
      if (causal)
        for (Index r = 0; r < n; ++r) std::fill(t.X + r * Tk + keys(i0 + r), t.X + (r + 1) * Tk, S(0));
    }
    // alpha_hat = min(0.95, sigmoid(clip(logit, -10, 10)))
    rows([&](Index k0, Index m) { alpha_hat_cells(f.L + k0, f.A + k0, m); });
    if (causal)
      for (Index r = 0; r < n; ++r) std::fill(f.A + r * Tk + keys(i0 + r), f.A + (r + 1) * Tk, S(0));
    // alpha_mix: the detached alpha-hat (or the frozen copy), with an oracle gamma a_eff + (1 - gamma) alpha-hat
    const bool oracle = in && in->has_oracle();
    const bool frozen = in && in->has_frozen_alpha_hat();
    if (!oracle && !frozen) {
      if (f.M != f.A) std::copy(f.A, f.A + nt, f.M);
      return;
    }
    const S gamma = in->gamma_mix();
    const S* km = t.mrow;
    S* has = t.has;
    S* a = t.a;
    for (Index r = 0; r < n; ++r) {
      const Index i = i0 + r;
      const Index nk = keys(i);
      const S* am = f.A + r * Tk;
      S* mix = f.M + r * Tk;
      const S* fz = frozen ? in->frozen_alpha_hat().ptr() + (((b * H + h) * Tq) + i) * Tk : nullptr;
      if (!oracle) {
        std::copy(fz, fz + nk, mix);
        std::fill(mix + nk, mix + Tk, S(0));
        continue;
      }
      const S* orc = in->oracle_row(b, h, i);
      S* oref = mp.oracle_ref ? mp.oracle_ref + r * Tk : nullptr;
      for (Index j = 0; j < Tk; ++j) {  // masks of S, so that the row's loops vectorise at any Tk (gate_loss.hpp)
        const S o = orc[j];
        has[j] = o == o ? km[j] : S(0);
        a[j] = std::isnan(o) ? S(0) : (o < 0 ? S(0) : (o > amax ? amax : o));
      }
      // causal: a label on an invisible cell is ignored (the cell counts as unlabelled, as a padded key does)
      std::fill(has + nk, has + Tk, S(0));
      if (oref)
        for (Index j = 0; j < Tk; ++j) oref[j] = has[j] != S(0) ? a[j] : std::numeric_limits<S>::quiet_NaN();
      if (gate) gate_row(r, i, f, mp, *gate);
      for (Index j = 0; j < nk; ++j) {
        const S det = fz ? fz[j] : am[j];
        const S a_eff = has[j] != S(0) ? a[j] : det;
        mix[j] = gamma * a_eff + (S(1) - gamma) * det;
      }
      std::fill(mix + nk, mix + Tk, S(0));
    }
  }

  /// The gate loss of row r (query i) from the gate's own alpha-hat (never the frozen copy), then its gate
  /// partials: part 0 (regression) sums g_reg sigmoid' over the labelled keys, part 1 (spotlight) the target's.
  void gate_row(Index r, Index i, const Buffers& f, const BlockMaps<S>& mp, const GateCtx<S>& gate) {
    const Index Dh = dh(), G = 2 * Dh + 2;
    const S* e0 = f.E0 + r * Tk;
    const S* e1 = f.E1 + r * Tk;
    const S* am = f.A + r * Tk;
    S* g_reg = mp.g_reg ? mp.g_reg + r * Tk : t.g_reg;  // the reference kernel keeps them per cell
    S* g_spot = mp.g_spot ? mp.g_spot + r * Tk : t.g_spot;
    const bool keep = mp.g_reg != nullptr;
    // causal: the row's loss runs over its visible keys [0, nk) (a target past them is inactive: its cell is
    // unlabelled); the maps' invisible cells read NaN, as a pair that is not valid
    const Index nk = keys(i);
    std::int64_t tgt = in->has_targets() ? in->target(b, h, i) : -1;
    if (tgt >= nk) tgt = -1;
    const Index tk = detail::gate_loss_row<S>(nk, e0, e1, am, t.a, t.has, t.mrow, !in->has_targets(), tgt, *hp->gate,
                                              *gate.sums, g_reg, g_spot, mp.beta ? mp.beta + r * Tk : nullptr,
                                              mp.w ? mp.w + r * Tk : nullptr, mp.d_b ? mp.d_b + r * Tk : nullptr);
    if (mp.beta && nk < Tk) {
      const S nan = std::numeric_limits<S>::quiet_NaN();
      std::fill(mp.beta + r * Tk + nk, mp.beta + (r + 1) * Tk, nan);
      std::fill(mp.w + r * Tk + nk, mp.w + (r + 1) * Tk, nan);
      std::fill(mp.d_b + r * Tk + nk, mp.d_b + (r + 1) * Tk, nan);
    }
    gate.target[i] = tk;
    const S* dsig = t.X + r * Tk;
    const S* qrow = rope ? Q + i * ld : f.Qb + r * Dh;  // the gate's (unrotated) query
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
        rsum = sum_of(dl, Tk);
        s0 = dot(dl, e0, Tk);
        s1 = dot(dl, e1, Tk);
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
    const Index nt = n * Tk;
    for (Index k = 0; k < nt; ++k) {
      const S mk = f.M[k];
      f.Sc[k] = (S(1) - mk) * f.E0[k] + mk * f.E1[k];
    }
    if (!any_real) {  // every key of the sequence masked: zeros, never NaN
      std::fill(f.P, f.P + nt, S(0));
      if (!saved) {
        if (rs.shift) std::fill(rs.shift + i0, rs.shift + i0 + n, S(0));
        if (rs.sum) std::fill(rs.sum + i0, rs.sum + i0 + n, S(1));
      }
      return;
    }
    const S* kb = t.kbias;
    for (Index r = 0; r < n; ++r) {  // per row: vectorised (see ops/softmax.hpp); masked keys exactly 0
      const Index nk = keys(i0 + r);  // causal: the visible keys [0, nk); P = 0 past them
      S* p = f.P + r * Tk;
      const S* sc = f.Sc + r * Tk;
      for (Index j = 0; j < nk; ++j) p[j] = sc[j] + kb[j];
      S shift;
      if (saved) {
        shift = rs.shift[i0 + r];
      } else {
        const S mx = max_of(p, nk);
        shift = mx == -std::numeric_limits<S>::infinity() ? S(0) : mx;  // no visible real key: P = 0
      }
      for (Index j = 0; j < nk; ++j) p[j] -= shift;
      exp_in_place(p, nk);
      ops::flush_exp_underflow(p, nk);
      S z;
      if (saved) {
        z = rs.sum[i0 + r];
      } else {
        z = sum_of(p, nk);
        z = z > S(0) ? z : S(1);
        if (rs.shift) rs.shift[i0 + r] = shift;
        if (rs.sum) rs.sum[i0 + r] = z;
      }
      const S zinv = S(1) / z;
      for (Index j = 0; j < nk; ++j) p[j] *= zinv;
      std::fill(p + nk, p + Tk, S(0));
    }
  }

  /// Dropout multipliers (0 or 1/(1-p)) of rows [i0, i0 + n) into D [n, Tk]: the counter-based mask of the cell's
  /// flat [B, H, Tq, Tk] index (ops::counter_uniform), the same for every kernel, block size and thread count.
  void dropout_mask(Index i0, Index n, S* D) const {
    ops::counter_dropout_mask(D, n * Tk, drop_seed, static_cast<std::uint64_t>(((b * H + h) * Tq + i0) * Tk), hp->dropout);
  }
};

/// Where the pairs' rows are: Q, K, V and R [rows, D] (row stride ld) hold every sequence, head h at column
/// h * Dh; sequence b's queries (and R) start at row b * q_rows, its keys and values at row b * k_rows.
template <class S>
struct PairRows {
  const S *Q = nullptr, *K = nullptr, *V = nullptr;
  S* R = nullptr;
  Index ld = 0, q_rows = 0, k_rows = 0;
};

/// A sequence's key mask as the kernel reads it: what AttnInputs validated (the 0/1 row, the 0/-inf bias and the
/// count of real keys), or, where there is no AttnInputs (inference, decoding), its bytes [Tk] (null: every key
/// real), which make_pair turns into the row and bias by AttnInputs' own rule (AttnInputs::mask_row).
template <class S>
struct PairKeys {
  const S* row = nullptr;
  const S* bias = nullptr;
  Index n_real = 0;
  const std::uint8_t* bytes = nullptr;

  static PairKeys of(const AttnInputs<S>& in, Index b) {
    return {in.key_row(b), in.key_bias(b), in.n_real(b), nullptr};
  }
  static PairKeys from_bytes(const std::uint8_t* bytes) {
    PairKeys k;
    k.bytes = bytes;
    return k;
  }
};

/// The pair bh = b * H + h of Tq queries against Tk keys, on `scratch` (Scratch::size(bq, Tk, Dh) values) for
/// blocks of bq queries: its rows, parameters and key mask. The caller sets what its pass adds (the inputs' oracle,
/// dropout, causal rows, rope) and then calls setup().
template <class S, int DH = Eigen::Dynamic>
Pair<S, DH> make_pair(Index bh, Index H, Index Tq, Index Tk, const HeadParams<S>& hp, const PairRows<S>& rows,
                      const PairKeys<S>& keys, S* scratch, Index bq) {
  Pair<S, DH> p;
  p.b = bh / H;
  p.h = bh % H;
  p.H = H;
  p.Tq = Tq;
  p.Tk = Tk;
  p.hp = &hp;
  const Index Dh = p.dh(), col = p.h * Dh;
  p.ld = rows.ld;
  p.Q = rows.Q + p.b * rows.q_rows * rows.ld + col;
  p.K = rows.K + p.b * rows.k_rows * rows.ld + col;
  p.V = rows.V + p.b * rows.k_rows * rows.ld + col;
  p.R = rows.R + p.b * rows.q_rows * rows.ld + col;
  Scratch<S>::carve(&p.t, scratch, bq, Tk, Dh);
  if (keys.row) {
    p.key_row = keys.row;
    p.key_bias = keys.bias;
    p.n_real_keys = keys.n_real;
  } else {  // into the scratch (setup would copy them there anyway)
    p.n_real_keys = AttnInputs<S>::mask_row(keys.bytes, Tk, p.t.mrow, p.t.kbias);
    p.key_row = p.t.mrow;
    p.key_bias = p.t.kbias;
  }
  return p;
}

}  // namespace dex
}  // namespace detail
}  // namespace dea
