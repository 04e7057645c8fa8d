// dea/attention/dual_expert/kernel.hpp: the two kernels of DualExpertAttention's [Tq, Tk] core and their caches.
//
// Both run the row-block kernel (row_block.hpp) over the (b, h) pairs in parallel and over each pair's query
// blocks in order; they differ in what they keep:
//  - reference: every [B, H, Tq, Tk] map in ReferenceMaps (eval, plots, interop and the golden tests read them);
//    backward reads the maps. Memory O(B H Tq Tk).
//  - tiled: only per-row statistics (TiledRows and the shared sigma / floor rows); backward recomputes each block
//    from them. Memory O(B H (Tq + Tk)) besides the inputs (the oracle is the caller's shared copy, AttnInputs).
// Every pair writes only its own rows and slices, and the parameter gradients all pairs touch (W_rel, W_gate,
// c_gate) are reduced from per-pair partials in a fixed order: results are bitwise identical for any thread count.
// These functions depend on the scalar type and on the compile-time head width (DH, Eigen::Dynamic when the layer
// has none: one instance per scalar type then serves every head shape).
#pragma once

#include "row_block.hpp"

#include "../../core/parallel.hpp"
#include "../gate_stats.hpp"

#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dea {

/// Which kernel DualExpertAttention runs for the [Tq, Tk] core (the four projections are shared).
///  - reference: every [B, H, Tq, Tk] map (E0~, E1~, logit, alpha-hat, alpha_mix, scores, attention, and with an
///    oracle beta / w / d_b / d loss_gate / d logit) is kept in the cache, so eval, plots, interop and the golden
///    tests can read them. Memory O(B H Tq Tk).
///  - tiled: queries are processed in blocks of Options::block_q rows; every [Tq, Tk] quantity exists only for
///    one block in a per-thread scratch. The cache keeps Q, K, V, R, ctx and per-row statistics only, and backward
///    recomputes each block from them. Memory O(B H (Tq + Tk)). The map fields of the cache stay empty, except
///    alpha_hat when the call sets AttnInputs::set_keep_alpha_hat.
/// AttnInputs::set_keep_maps runs the reference kernel for one call whatever the option says (an evaluation
/// forward whose maps the caller reads).
enum class DeaKernel { reference, tiled };

namespace detail {
/// Counter-based attention dropout: a uniform number in [0, 1) that depends only on (seed, cell), where cell is
/// the flat [B, H, Tq, Tk] index ((b H + h) Tq + i) Tk + j (ops::counter_uniform), so a kernel can recompute any
/// cell's mask in backward (the tiled kernel does) and every kernel draws the same mask for the same seed,
/// whatever the thread count or the block size. A cell is dropped when this is < p.
inline double dropout_uniform(std::uint64_t seed, std::uint64_t cell) { return ops::counter_uniform(seed, cell); }

namespace dex {

/// The reference kernel's maps, [B, H, Tq, Tk] each (empty after a tiled forward, except alpha_hat with
/// keep_alpha_hat).
template <class S>
struct ReferenceMaps {
  AlignedVec<S> e0n, e1n;    ///< normalised experts E0~, E1~ (0 at padded keys)
  AlignedVec<S> logit;       ///< gate logit before the clip
  AlignedVec<S> alpha_hat;   ///< the gate's alpha-hat
  AlignedVec<S> alpha_mix;   ///< the mixing coefficient the scores used (a constant for backward)
  AlignedVec<S> scores;      ///< S_mix (with an oracle) or S~ (without)
  AlignedVec<S> attn;        ///< softmax probabilities (before dropout)
  AlignedVec<S> drop;        ///< dropout multipliers (0 or 1/(1-p)), when dropout was on
  AlignedVec<std::uint8_t> e1_clamped;  ///< 1 where the raw E1 was > 0 (clamped to 0: no gradient)
  // with an oracle
  AlignedVec<S> dlogit_gate;            ///< d loss_gate / d logit
  AlignedVec<S> beta, w, d_b;           ///< per-pair photo-finish values, NaN where not valid
  AlignedVec<S> g_reg, g_spot;          ///< unnormalised d(reg)/d alpha_hat and d(spot)/d alpha_hat
  AlignedVec<S> oracle_ref;             ///< clamped oracle, NaN where unlabelled
};

/// The tiled kernel's row statistics, [B, H, Tq] each (besides the shared sigma and floor rows).
template <class S>
struct TiledRows {
  AlignedVec<S> mu0, mu1;            ///< row means of the raw experts
  AlignedVec<S> row_shift, row_sum;  ///< softmax row maximum (0 for an all-masked row) and row sum
};

/// What forward() keeps for backward() and what callers read after it (eval, plots, interop): the fields both
/// kernels fill, plus the reference kernel's maps and the tiled kernel's row statistics (base classes).
template <class S>
struct Cache : ReferenceMaps<S>, TiledRows<S> {
  Index B = 0, Tq = 0, Tk = 0;
  bool self = false;          ///< q_in, k_in, v_in were the same tensor
  bool has_oracle = false;
  bool dropout_on = false;
  S gamma_mix = 0;
  DeaKernel kernel = DeaKernel::reference;  ///< the kernel that filled this cache
  Index block_q = 0;                        ///< queries per block
  AttnInputs<S> in;           ///< the inputs of the forward (a shared copy: mask, oracle, targets, frozen hook)
  Mat<S> q_in, k_in, v_in;    ///< [B*Tq, D], [B*Tk, D], [B*Tk, D] (only q_in when self)
  Mat<S> Q, K, V;             ///< projections (bias included; never rotated: the gate reads Q and K)
  Mat<S> R;                   ///< W_rel[h] Q_i per head, [B*Tq, D] (with RoPE rotated: rho_i W_rel[h] Q_i)
  ops::RopeTable<S> rope;     ///< RoPE: the cos / sin table of positions [0, Tq) (grown, never shrunk)
  Mat<S> ctx;                 ///< concatenated head outputs [B*Tq, D] (input of W_o)
  // [B, H, Tq]
  AlignedVec<S> sigma0, sigma1;             ///< sigma = sqrt(max(var, 1e-12)) of each row
  AlignedVec<std::uint8_t> floor0, floor1;  ///< 1 where var < 1e-12 (the floor: no gradient through sigma)
  // gate loss (with an oracle)
  S loss_gate = 0;
  GateStats stats;
  AlignedVec<std::int64_t> target;  ///< target key per (b, h, i), -1 where the row is inactive
  AlignedVec<S> gate_part;          ///< per-(b, h) sums of d(reg)/d logit and d(spot)/d logit times the gate
                                    ///< features (w_q, w_k, w_E0, w_E1, c): [B*H, 2, 2 Dh + 3]
  S inv_has = 0, inv_valid = 0;     ///< 1 / n_labelled and 1 / n_decision_pairs (0 when none)
  std::uint64_t drop_seed = 0;      ///< seed of the counter-based dropout mask (detail::dropout_uniform)
  // scratch, kept between calls: with repeated shapes forward allocates nothing
  std::vector<GateLossSums<S>> sums;  ///< per-(b, h) gate-loss sums [B*H]
  AlignedVec<S> scratch;              ///< per-thread block scratch (Scratch::size each)

  Index cell(Index b, Index h, Index i, Index j, Index H) const { return ((b * H + h) * Tq + i) * Tk + j; }
};

/// What a pass reads of the layer.
template <class S>
struct LayerView {
  Index D = 0, H = 0, Dh = 0, block_q = 0;
  const S* W_rel = nullptr;   ///< [H, Dh, Dh]
  const S* W_gate = nullptr;  ///< [H, 2 Dh + 2]
  const S* c_gate = nullptr;  ///< [H]
  GateLossParams<S> gate;
  double dropout = 0;
  double rope_theta = 0;      ///< > 0: RoPE on the experts' queries and keys (row_block.hpp)

  HeadParams<S> head(Index h) const {
    HeadParams<S> p;
    p.Dh = Dh;
    p.W_rel = W_rel + h * Dh * Dh;
    p.w_gate = W_gate + h * (2 * Dh + 2);
    p.c_gate = c_gate[h];
    p.gate = &gate;
    p.dropout = dropout;
    return p;
  }
};

inline int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
template <class V>
void release(V& v) {
  if (v.capacity() > 0) V().swap(v);
}

/// The pair bh of a cache, on the calling thread's scratch slice (per values each): the inputs' key mask,
/// oracle and causal flag, the forward's dropout, the cache's RoPE table.
template <class S, int DH>
Pair<S, DH> cache_pair(const LayerView<S>& L, Cache<S>& c, Index bh, Index per, const HeadParams<S>& hp) {
  const PairRows<S> rows{c.Q.data(), c.K.data(), c.V.data(), c.R.data(), L.D, c.Tq, c.Tk};
  Pair<S, DH> p = make_pair<S, DH>(bh, L.H, c.Tq, c.Tk, hp, rows, PairKeys<S>::of(c.in, bh / L.H),
                                   c.scratch.data() + thread_index() * per, c.block_q);
  p.in = &c.in;
  p.dropout_on = c.dropout_on;
  p.drop_seed = c.drop_seed;
  p.causal = c.in.causal();  // query i sees keys j <= i (Tq == Tk: q_offset 0)
  p.rope = L.rope_theta > 0 ? &c.rope : nullptr;  // (query row i and key row i at position i: Tq == Tk)
  return p;
}

/// The reference maps of pair bh from query row i0 on (the maps the kernel filled).
template <class S>
BlockMaps<S> cache_maps(Cache<S>& c, Index bh, Index i0) {
  BlockMaps<S> m;
  const Index off = (bh * c.Tq + i0) * c.Tk;
  auto at = [&](AlignedVec<S>& v) { return v.empty() ? nullptr : v.data() + off; };
  m.e0n = at(c.e0n);
  m.e1n = at(c.e1n);
  m.logit = at(c.logit);
  m.alpha_hat = at(c.alpha_hat);
  m.alpha_mix = at(c.alpha_mix);
  m.scores = at(c.scores);
  m.attn = at(c.attn);
  m.drop = at(c.drop);
  m.e1_clamped = c.e1_clamped.empty() ? nullptr : c.e1_clamped.data() + off;
  m.beta = at(c.beta);
  m.w = at(c.w);
  m.d_b = at(c.d_b);
  m.g_reg = at(c.g_reg);
  m.g_spot = at(c.g_spot);
  m.oracle_ref = at(c.oracle_ref);
  return m;
}

/// The row statistics of pair bh (its first row).
template <class S>
RowStats<S> cache_rows(Cache<S>& c, Index bh) {
  RowStats<S> r;
  const Index off = bh * c.Tq;
  auto at = [&](AlignedVec<S>& v) { return v.empty() ? nullptr : v.data() + off; };
  r.sigma0 = at(c.sigma0);
  r.sigma1 = at(c.sigma1);
  r.floor0 = c.floor0.data() + off;
  r.floor1 = c.floor1.data() + off;
  r.mu0 = at(c.mu0);
  r.mu1 = at(c.mu1);
  r.shift = at(c.row_shift);
  r.sum = at(c.row_sum);
  return r;
}

/// Grows (never shrinks) the per-thread block scratch to one slice per thread; returns a slice's size.
template <class S>
Index reserve_scratch(Cache<S>& c, Index Dh) {
  const int nt = num_threads() < 1 ? 1 : num_threads();
  const Index per = Scratch<S>::size(c.block_q, c.Tk, Dh);
  if (c.scratch.size() < static_cast<std::size_t>(nt * per)) c.scratch.resize(static_cast<std::size_t>(nt * per));
  return per;
}

/// Adds the per-pair sums in the fixed order of c.sums, forms the loss and the statistics, and sets
/// c.inv_has / c.inv_valid.
template <class S>
void finish_gate_totals(Cache<S>& c) {
  GateLossSums<S> tot;
  for (const auto& s : c.sums) tot.add(s);
  const S reg = tot.n_has > 0 ? tot.reg / S(tot.n_has) : S(0);
  const S spot = tot.n_valid > 0 ? tot.spot / S(tot.n_valid) : S(0);
  c.loss_gate = reg + spot;
  c.stats.loss_reg = static_cast<double>(reg);
  c.stats.loss_spot = static_cast<double>(spot);
  c.stats.loss_decision = tot.n_valid > 0 ? static_cast<double>(tot.decision / S(tot.n_valid)) : 0.0;
  c.stats.decision_side_acc = tot.n_valid > 0 ? double(tot.n_side) / double(tot.n_valid)
                                              : std::numeric_limits<double>::quiet_NaN();
  c.stats.n_decision_pairs = tot.n_valid;
  c.stats.n_labelled = tot.n_has;
  c.inv_has = tot.n_has > 0 ? S(1) / S(tot.n_has) : S(0);
  c.inv_valid = tot.n_valid > 0 ? S(1) / S(tot.n_valid) : S(0);
}

/// The reference kernel's d loss_gate / d logit map: the row gradients through the 0.95 cap, the sigmoid and the
/// +-10 clip.
template <class S>
void dlogit_map(Cache<S>& c) {
  const S inv_has = c.inv_has, inv_valid = c.inv_valid;
  const S amax = S(DeaConstants::alpha_max), clip = S(DeaConstants::logit_clip);
  const Index cells = static_cast<Index>(c.logit.size());
  parallel_for(cells, [&](Index k) {
    const std::size_t u = static_cast<std::size_t>(k);
    const S dah = c.g_reg[u] * inv_has + c.g_spot[u] * inv_valid;
    const S l = c.logit[u];
    S& out = c.dlogit_gate[u];
    out = 0;
    if (dah == 0 || l < -clip || l > clip) return;  // the clip passes gradient only inside [-10, 10]
    const S sg = S(1) / (S(1) + std::exp(-l));
    if (sg > amax) return;  // the 0.95 cap passes gradient only while sigmoid <= 0.95
    out = dah * sg * (S(1) - sg);
  }, double(cells) * 20 > kParallelMinFlops);
}

/// The core of forward, after the projections (c.Q, c.K, c.V) and with c.B, Tq, Tk, kernel, in, has_oracle,
/// dropout_on and drop_seed set: R, ctx, the maps or row statistics, and the gate loss. DH: the layer's
/// compile-time head width, or Dynamic (Pair).
template <class S, int DH = Eigen::Dynamic>
void forward_core(const LayerView<S>& L, Cache<S>& c) {
  const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = L.H, G = 2 * L.Dh + 2;
  const bool ref = c.kernel == DeaKernel::reference, oracle = c.has_oracle;
  c.block_q = block_rows<S>(L.block_q, Tq, Tk);
  const std::size_t cells = static_cast<std::size_t>(B * H * Tq * Tk), rows = static_cast<std::size_t>(B * H * Tq);
  // buffers keep their storage from the previous call (no allocation when the shapes repeat); every element
  // read below is written first
  if (ref) {
    for (auto* v : {&c.e0n, &c.e1n, &c.logit, &c.alpha_hat, &c.alpha_mix, &c.scores, &c.attn}) v->resize(cells);
    c.e1_clamped.resize(cells);
    if (c.dropout_on) c.drop.resize(cells); else release(c.drop);
    if (oracle) {
      for (auto* v : {&c.dlogit_gate, &c.beta, &c.w, &c.d_b, &c.oracle_ref}) v->resize(cells);
      c.g_reg.assign(cells, S(0));
      c.g_spot.assign(cells, S(0));
    } else {
      for (auto* v : {&c.dlogit_gate, &c.beta, &c.w, &c.d_b, &c.oracle_ref, &c.g_reg, &c.g_spot}) release(*v);
    }
    for (auto* v : {&c.mu0, &c.mu1, &c.row_shift, &c.row_sum}) release(*v);
  } else {
    for (auto* v : {&c.e0n, &c.e1n, &c.logit, &c.alpha_mix, &c.scores, &c.attn, &c.drop, &c.dlogit_gate, &c.beta, &c.w,
                    &c.d_b, &c.g_reg, &c.g_spot, &c.oracle_ref})
      release(*v);
    release(c.e1_clamped);
    if (c.in.keep_alpha_hat()) c.alpha_hat.resize(cells); else release(c.alpha_hat);
    for (auto* v : {&c.mu0, &c.mu1, &c.row_shift, &c.row_sum}) v->resize(rows);
  }
  c.sigma0.resize(rows);
  c.sigma1.resize(rows);
  c.floor0.resize(rows);
  c.floor1.resize(rows);
  if (oracle) {
    c.target.resize(rows);
    c.gate_part.assign(static_cast<std::size_t>(B * H * 2 * (G + 1)), S(0));
  } else {
    c.target.clear();
    c.gate_part.clear();
  }
  c.sums.assign(static_cast<std::size_t>(B * H), GateLossSums<S>());
  c.R.resize(B * Tq, L.D);
  c.ctx.resize(B * Tq, L.D);
  if (L.rope_theta > 0) {  // the table of this layer's head width and theta, for positions [0, Tq)
    if (c.rope.head_dim() != L.Dh || c.rope.theta() != L.rope_theta) c.rope = ops::RopeTable<S>(L.Dh, L.rope_theta);
    c.rope.reserve(Tq > Tk ? Tq : Tk);
  }
  const Index per = reserve_scratch(c, L.Dh);
  const Index bq = c.block_q;
  const bool par = double(B * H) * double(Tq) * double(Tk) * double(4 * L.Dh + 20) > kParallelMinFlops;
  parallel_for(B * H, [&](Index bh) {
    const HeadParams<S> hp = L.head(bh % H);
    Pair<S, DH> p = cache_pair<S, DH>(L, c, bh, per, hp);
    p.setup(false);
    GateCtx<S> g;
    if (oracle) {
      g.sums = &c.sums[static_cast<std::size_t>(bh)];
      g.part = c.gate_part.data() + bh * 2 * (G + 1);
      g.target = c.target.data() + bh * Tq;
      for (S* q : {p.t.col0, p.t.col1, p.t.g_reg, p.t.g_spot}) std::fill(q, q + Tk, S(0));
    }
    const RowStats<S> rs = cache_rows(c, bh);
    S* ctx = c.ctx.data() + p.b * Tq * L.D + p.h * L.Dh;
    for (Index i0 = 0; i0 < Tq; i0 += bq) {
      BlockMaps<S> mp;
      if (ref || !c.alpha_hat.empty()) mp = cache_maps(c, bh, i0);
      p.forward_block(i0, std::min(bq, Tq - i0), mp, rs, oracle ? &g : nullptr, ctx);
    }
    if (oracle) p.finish_gate(g);
  }, par);
  if (oracle) {
    finish_gate_totals(c);
    if (ref) dlogit_map(c);
  }
}

/// The task backward of the core: dctx [B*Tq, D] -> dQ, dK, dV and the per-pair W_rel partials
/// dwrel_part [B*H, Dh, Dh]. Every element of the outputs is written.
template <class S, int DH = Eigen::Dynamic>
void backward_core(const LayerView<S>& L, Cache<S>& c, const Mat<S>& dctx, Mat<S>& dQ, Mat<S>& dK, Mat<S>& dV,
                   S* dwrel_part) {
  const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = L.H, Dh = L.Dh, D = L.D;
  const bool ref = c.kernel == DeaKernel::reference;
  const Index per = reserve_scratch(c, Dh);
  const Index bq = c.block_q;
  parallel_for(B * H, [&](Index bh) {
    const HeadParams<S> hp = L.head(bh % H);
    Pair<S, DH> p = cache_pair<S, DH>(L, c, bh, per, hp);
    p.setup(true);
    S* dWr = dwrel_part + bh * Dh * Dh;
    p.backward_begin(dWr);
    const RowStats<S> rs = cache_rows(c, bh);
    const Index q0 = p.b * Tq * D + p.h * Dh;
    for (Index i0 = 0; i0 < Tq; i0 += bq) {
      BlockMaps<S> mp;
      if (ref) mp = cache_maps(c, bh, i0);
      p.backward_block(i0, std::min(bq, Tq - i0), mp, rs, dctx.data() + q0, dQ.data() + q0, dWr);
    }
    const Index k0 = p.b * Tk * D + p.h * Dh;
    p.backward_end(dK.data() + k0, dV.data() + k0);
  }, double(B * H) * double(Tq) * double(Tk) * double(8 * Dh + 20) > kParallelMinFlops);
}

/// The gate-loss gradient: adds scale * d loss_gate / d(W_gate, c_gate) (both kernels: forward summed the
/// partials per (b, h); here they are scaled by 1/n_labelled and 1/n_valid and added in the fixed order h, b).
template <class S>
void gate_grads(const LayerView<S>& L, const Cache<S>& c, S scale, S* W_gate_grad, S* c_gate_grad) {
  const Index B = c.B, H = L.H, G = 2 * L.Dh + 2;
  for (Index h = 0; h < H; ++h)
    for (Index b = 0; b < B; ++b) {
      const S* p = c.gate_part.data() + (b * H + h) * 2 * (G + 1);
      for (Index g = 0; g < G; ++g) W_gate_grad[h * G + g] += scale * (c.inv_has * p[g] + c.inv_valid * p[G + 1 + g]);
      c_gate_grad[h] += scale * (c.inv_has * p[G] + c.inv_valid * p[2 * G + 1]);
    }
}

}  // namespace dex
}  // namespace detail
}  // namespace dea
