// dea/attention/dual_expert.hpp: Dual-Expert Attention (DEA) v2.8.3 with hand-derived backward passes.
//
// Al-Hayali, "Learning When to Look Like vs. Work Like: A Dual-Expert Attention with a Graded Alpha Knob"
// (v2.8.3, 2026). Every head scores a (query, key) pair with two experts,
//   E0 = q.k / sqrt(Dh)                      ("looks like")
//   E1 = min(0, -|W_rel q - k|^2 / Dh)        ("works like", lock and key),
// normalises each per query across the real keys, and mixes them with a graded gate
//   alpha_hat = min(0.95, sigmoid(clip(q.w_q + k.w_k + w_E0 E0~ + w_E1 E1~ + c_gate, -10, 10))).
// Training mixes the oracle alpha in with weight gamma_mix and adds the gate loss L_v2.8 (gate_loss.hpp).
//
// Gradient isolation is structural: backward() (the task path) never writes W_gate / c_gate, because the
// scores read alpha_hat as a constant; backward_gate() (the gate loss) writes only W_gate / c_gate, because the
// gate reads Q, K, E0~, E1~ as constants. verify_gradient_isolation() proves it on a batch.
//
// Layout: activations are row-major [B*T, D] (row b*T + t); head h owns feature columns [h*Dh, (h+1)*Dh).
// Per-head score tensors [B, H, Tq, Tk] are flat buffers; the (b, h) slice starts at ((b*H + h)*Tq)*Tk.
// The unit of parallel work is one (b, h) pair; every pair writes only its own slices, and the parameter
// gradients all pairs touch (W_rel, W_gate, c_gate) are reduced from per-pair partials in a fixed order, so
// results are bitwise identical for any thread count.
#pragma once

#include "../core/param.hpp"
#include "../core/parallel.hpp"
#include "../core/init.hpp"
#include "../core/rng.hpp"
#include "../core/workspace.hpp"
#include "../ops/dropout.hpp"
#include "../ops/gemm.hpp"
#include "../ops/linear.hpp"
#include "../ops/softmax.hpp"
#include "context.hpp"
#include "inputs.hpp"
#include "gate_loss.hpp"
#include "gate_stats.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace dea {

/// Which kernel DualExpertAttention runs for the [Tq, Tk] core (the four projections are shared).
///  - reference: the simple kernel. Every [B, H, Tq, Tk] map (E0~, E1~, logit, alpha-hat, alpha_mix, scores,
///    attention, and with an oracle beta / w / d_b / d loss_gate / d logit) is kept in the cache, so eval, plots,
///    interop and the golden tests can read them. Memory O(B H Tq Tk).
///  - tiled: queries are processed in blocks of Options::block_q rows; every [Tq, Tk] quantity exists only for
///    one block in a per-thread scratch. The cache keeps Q, K, V, R, ctx and per-row statistics only, and backward
///    recomputes each block from them. Memory O(B H (Tq + Tk)) besides copies of the caller's oracle (and of the
///    frozen_alpha_hat test hook), which backward needs. The map fields of the cache stay empty, except alpha_hat
///    when the call sets AttnContext::keep_alpha_hat.
/// AttnContext::keep_maps runs the reference kernel for one call whatever the option says (an evaluation forward
/// whose maps the caller reads).
enum class DeaKernel { reference, tiled };

namespace detail {
/// Counter-based attention dropout: a uniform number in [0, 1) that depends only on (seed, cell), where cell is
/// the flat [B, H, Tq, Tk] index ((b H + h) Tq + i) Tk + j (ops::counter_uniform), so a kernel can recompute any
/// cell's mask in backward (the tiled kernel does) and every kernel draws the same mask for the same seed,
/// whatever the thread count or the block size. A cell is dropped when this is < p.
inline double dropout_uniform(std::uint64_t seed, std::uint64_t cell) { return ops::counter_uniform(seed, cell); }

/// Transitional: an AttnContext that points into an AttnInputs (the kernels still read AttnContext).
template <class S>
struct ContextFromInputs {
  Tensor<std::uint8_t> mask;
  AttnContext<S> ctx;
  explicit ContextFromInputs(const AttnInputs<S>& in) {
    if (in.has_key_mask()) {
      mask = Tensor<std::uint8_t>({in.batch(), in.k_len()});
      for (Index b = 0; b < in.batch(); ++b)
        for (Index j = 0; j < in.k_len(); ++j) mask[b * in.k_len() + j] = in.key_mask(b)[j];
      ctx.key_mask = &mask;
    }
    if (in.has_oracle()) ctx.alpha_oracle = &in.oracle();
    if (in.has_targets()) ctx.target_idx = &in.targets();
    if (in.has_frozen_alpha_hat()) ctx.frozen_alpha_hat = &in.frozen_alpha_hat();
    ctx.gamma_mix = in.gamma_mix();
    ctx.causal = in.causal();
    ctx.training = in.training();
    ctx.rng = in.rng();
    ctx.keep_maps = in.keep_maps();
    ctx.keep_alpha_hat = in.keep_alpha_hat();
  }
};
}  // namespace detail

template <class S, int Heads = Dynamic, int DHead = Dynamic>
class DualExpertAttention {
  static_assert(std::is_floating_point<S>::value, "DualExpertAttention: Scalar must be float or double");
  static_assert(Heads == Dynamic || Heads > 0, "Heads must be positive or Eigen::Dynamic");
  static_assert(DHead == Dynamic || DHead > 0, "DHead must be positive or Eigen::Dynamic");

public:
  using Scalar = S;
  /// Per-head [T, Dh] block (column-major so that one column is allowed when Dh = 1).
  using HeadMat = Eigen::Matrix<S, Eigen::Dynamic, DHead>;
  /// Per-head block of the tiled kernel's scratch: row-major, so that copying a head's rows in or out of the
  /// [B*T, D] activations moves contiguous rows of Dh values (column-major when Dh = 1, as Eigen requires).
  using TileMat = Eigen::Matrix<S, Eigen::Dynamic, DHead, (DHead == 1 ? Eigen::ColMajor : Eigen::RowMajor)>;
  /// Per-head [Dh, Dh] matrix.
  using RelMat = Eigen::Matrix<S, DHead, DHead, (DHead == 1 ? Eigen::ColMajor : Eigen::RowMajor)>;

  struct Options {
    S dropout = 0;           ///< attention-probability dropout (training only, inverted scaling)
    bool bias = true;        ///< biases on the four projections
    bool out_proj = true;    ///< false: the output is the concatenated heads (no W_o), as in the BERT adapter
    GateLossParams<S> gate;  ///< lambda_s, tau_s, tau_d, lambda_d
    /// The [Tq, Tk] kernel (see DeaKernel). The reference keeps every map in the cache; the tiled kernel keeps
    /// O(T) memory and is the one for long contexts.
    DeaKernel kernel = DeaKernel::reference;
    /// Tiled kernel: queries per block (0 = automatic: the block's seven [block_q, Tk] buffers in about 4 MiB, between
    /// 32 and 64 rows). The block boundaries depend only on this and Tq, never on the thread count.
    Index block_q = 0;
  };

  /// What forward() keeps for backward() and what callers read after it (eval, plots, interop).
  struct Cache {
    Index B = 0, Tq = 0, Tk = 0;
    bool self = false;          ///< q_in, k_in, v_in were the same tensor
    bool has_oracle = false;
    bool dropout_on = false;
    S gamma_mix = 0;
    Mat<S> q_in, k_in, v_in;    ///< [B*Tq, D], [B*Tk, D], [B*Tk, D] (only q_in when self)
    Mat<S> Q, K, V;             ///< projections (bias included)
    Mat<S> R;                   ///< W_rel[h] Q_i per head, [B*Tq, D]
    Mat<S> ctx;                 ///< concatenated head outputs [B*Tq, D] (input of W_o)
    AlignedVec<std::uint8_t> km;  ///< [B, Tk] real keys
    // [B, H, Tq, Tk]
    AlignedVec<S> e0n, e1n;    ///< normalised experts E0~, E1~ (0 at padded keys)
    AlignedVec<S> logit;       ///< gate logit before the clip
    AlignedVec<S> alpha_hat;   ///< the gate's alpha-hat
    AlignedVec<S> alpha_mix;   ///< the mixing coefficient the scores used (a constant for backward)
    AlignedVec<S> scores;      ///< S_mix (with an oracle) or S~ (without)
    AlignedVec<S> attn;        ///< softmax probabilities (before dropout)
    AlignedVec<S> drop;        ///< dropout multipliers (0 or 1/(1-p)), when dropout was on
    AlignedVec<std::uint8_t> e1_clamped;  ///< 1 where the raw E1 was > 0 (clamped to 0: no gradient)
    // [B, H, Tq]
    AlignedVec<S> sigma0, sigma1;         ///< sigma = sqrt(max(var, 1e-12)) of each row
    AlignedVec<std::uint8_t> floor0, floor1;  ///< 1 where var < 1e-12 (the floor: no gradient through sigma)
    AlignedVec<S> n_real;                 ///< real keys of the row's batch (floored at 1)
    // gate loss (with an oracle)
    S loss_gate = 0;
    GateStats stats;
    AlignedVec<S> dlogit_gate;            ///< d loss_gate / d logit, [B, H, Tq, Tk]
    AlignedVec<S> beta, w, d_b;           ///< per-pair photo-finish values [B, H, Tq, Tk], NaN where not valid
    AlignedVec<std::int64_t> target;      ///< target key per (b, h, i), -1 where the row is inactive
    AlignedVec<S> g_reg, g_spot;           ///< scratch: unnormalised d(reg)/d alpha_hat and d(spot)/d alpha_hat
    AlignedVec<S> oracle_ref;             ///< clamped oracle, NaN where unlabelled [B, H, Tq, Tk]
    // forward scratch, kept between calls: with repeated shapes forward allocates nothing
    std::vector<GateLossSums<S>> sums;    ///< per-(b, h) gate-loss sums [B*H]
    AlignedVec<S> scratch;                ///< per-(b, h) temporaries of the forward kernel (forward_scratch_size)
    // ---- tiled kernel (kernel == DeaKernel::tiled). The [B, H, Tq, Tk] fields above stay empty (e0n, e1n,
    // logit, alpha_hat unless AttnContext::keep_alpha_hat, alpha_mix, scores, attn, drop, e1_clamped, dlogit_gate,
    // beta, w, d_b, g_reg, g_spot, oracle_ref); the cache holds q_in (k_in, v_in), Q, K, V, R, ctx, km, n_real,
    // target, sigma0/1, floor0/1 and:
    DeaKernel kernel = DeaKernel::reference;  ///< the kernel that filled this cache
    Index block_q = 0;                    ///< tiled: queries per block
    AlignedVec<S> mu0, mu1;               ///< tiled: row means of the raw experts [B, H, Tq]
    AlignedVec<S> row_shift, row_sum;     ///< tiled: softmax row maximum (0 for an all-masked row) and row sum [B, H, Tq]
    AlignedVec<S> gate_part;              ///< tiled: per-(b, h) sums of d(reg)/d logit and d(spot)/d logit times the gate
                                          ///< features (w_q, w_k, w_E0, w_E1, c): [B*H, 2, 2 Dh + 3]
    S inv_has = 0, inv_valid = 0;         ///< 1 / n_labelled and 1 / n_decision_pairs (0 when none)
    AlignedVec<S> oracle_copy;            ///< tiled: the caller's alpha_oracle (backward recomputes alpha_mix from it)
    bool oracle_per_head = false;         ///< its shape was [B, H, Tq, Tk]
    AlignedVec<S> frozen_copy;            ///< tiled: the frozen_alpha_hat test hook, when given
    std::uint64_t drop_seed = 0;          ///< seed of the counter-based dropout mask (detail::dropout_uniform)
    AlignedVec<S> tile_scratch;           ///< tiled: per-thread block scratch (tiled_scratch_size each)

    Index cell(Index b, Index h, Index i, Index j, Index H) const { return ((b * H + h) * Tq + i) * Tk + j; }
  };

  /// Gradients of the three inputs of cross-attention.
  struct InputGrads {
    Mat<S> dq, dk, dv;
  };

  DualExpertAttention(Index d_model, Index n_heads, Rng& rng, Options opt = {}) : D_(d_model), H_(n_heads), opt_(opt) {
    check(d_model > 0, "DualExpertAttention: d_model must be positive, got ", d_model);
    check(n_heads > 0, "DualExpertAttention: n_heads must be positive, got ", n_heads);
    check(d_model % n_heads == 0, "DualExpertAttention: d_model (", d_model, ") must be divisible by n_heads (",
          n_heads, ")");
    Dh_ = d_model / n_heads;
    check(Heads == Dynamic || Heads == n_heads, "DualExpertAttention: n_heads: expected the compile-time ", Heads,
          ", got ", n_heads);
    check(DHead == Dynamic || DHead == Dh_, "DualExpertAttention: d_model / n_heads: expected the compile-time ",
          DHead, ", got ", Dh_);
    check(opt.dropout >= 0 && opt.dropout < 1, "DualExpertAttention: dropout must be in [0, 1), got ", opt.dropout);
    const char* names[4] = {"W_q", "W_k", "W_v", "W_o"};
    for (int p = 0; p < 4; ++p) {
      weight_[p] = Param<S>(std::string(names[p]) + ".weight", "main", {D_, D_});
      bias_[p] = Param<S>(std::string(names[p]) + ".bias", "main", {D_});
    }
    W_rel_ = Param<S>("W_rel", "main", {H_, Dh_, Dh_});
    W_gate_ = Param<S>("W_gate", "gate", {H_, 2 * Dh_ + 2});
    c_gate_ = Param<S>("c_gate", "gate", {H_});
    reset_parameters(rng);
  }

  /// The reference's initialisation: Xavier-uniform projections with zero bias, an orthogonal W_rel per head,
  /// Xavier-uniform W_gate rows (fan_in 2Dh+2, fan_out 1), c_gate = -0.5.
  void reset_parameters(Rng& rng);

  Index d_model() const { return D_; }
  Index n_heads() const { return H_; }
  Index d_head() const { return Dh_; }
  const Options& options() const { return opt_; }

  /// Parameters under the reference's state_dict names, in its order.
  ParamList<S> parameters() {
    ParamList<S> out;
    const int nproj = opt_.out_proj ? 4 : 3;
    for (int p = 0; p < nproj; ++p) {
      out.push_back(&weight_[p]);
      if (opt_.bias) out.push_back(&bias_[p]);
    }
    out.push_back(&W_rel_);
    out.push_back(&W_gate_);
    out.push_back(&c_gate_);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }

  Param<S>& W_rel() { return W_rel_; }
  Param<S>& W_gate() { return W_gate_; }
  Param<S>& c_gate() { return c_gate_; }

  /// Self-attention: q = k = v = x [B*T, D]. Returns the output [B*T, D].
  Mat<S> forward(const Mat<S>& x, Index batch, const AttnContext<S>& ctx, Cache& cache) {
    Mat<S> y;
    forward_impl(x, x, x, batch, ctx, cache, true, y);
    return y;
  }

  /// Self-attention into `y` [B*T, D] (resized only when its shape differs). The cache keeps every buffer and
  /// temporary between calls, so once a call has run with these shapes (the set-up), an inference call (no
  /// oracle, no dropout) with the same shapes, cache and y allocates nothing.
  void forward(const Mat<S>& x, Index batch, const AttnContext<S>& ctx, Cache& cache, Mat<S>& y) {
    forward_impl(x, x, x, batch, ctx, cache, true, y);
  }

  /// Cross-attention: q_in [B*Tq, D], k_in and v_in [B*Tk, D]. Returns the output [B*Tq, D].
  Mat<S> forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, Index batch, const AttnContext<S>& ctx,
                 Cache& cache) {
    Mat<S> y;
    forward_impl(q_in, k_in, v_in, batch, ctx, cache, false, y);
    return y;
  }

  /// Cross-attention into `y` [B*Tq, D] (as the self-attention overload: no allocation once the shapes repeat).
  void forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, Index batch, const AttnContext<S>& ctx,
               Cache& cache, Mat<S>& y) {
    forward_impl(q_in, k_in, v_in, batch, ctx, cache, false, y);
  }

  /// What this class accepts of AttnInputs (causal masking is refused until causal Dual-Expert attention exists).
  static constexpr AttnSupport kSupport{/*oracle*/ true, /*causal*/ false, /*frozen_alpha_hat*/ true, /*keep_maps*/ true};

  /// Self-attention on x [B*T, D] with the inputs of this forward (B = in.batch()). Returns the output [B*T, D].
  Mat<S> forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache) {
    Mat<S> y;
    forward(x, in, cache, y);
    return y;
  }
  /// Self-attention into `y` [B*T, D] (no allocation once the shapes repeat, as the AttnContext overload).
  void forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache, Mat<S>& y) {
    check(in.batch() > 0 && x.rows() == in.batch() * in.q_len(), "DualExpertAttention::forward: x: expected ",
          in.batch() * in.q_len(), " rows (B*T of the attention inputs), got ", x.rows());
    in.require(kSupport, H_, in.batch(), in.q_len(), in.k_len(), "DualExpertAttention");
    const detail::ContextFromInputs<S> a(in);
    forward_impl(x, x, x, in.batch(), a.ctx, cache, true, y);
  }
  /// Cross-attention: q_in [B*Tq, D], k_in and v_in [B*Tk, D]. Returns the output [B*Tq, D].
  Mat<S> forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, const AttnInputs<S>& in, Cache& cache) {
    Mat<S> y;
    forward(q_in, k_in, v_in, in, cache, y);
    return y;
  }
  void forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, const AttnInputs<S>& in, Cache& cache,
               Mat<S>& y) {
    check(in.batch() > 0 && q_in.rows() == in.batch() * in.q_len() && k_in.rows() == in.batch() * in.k_len(),
          "DualExpertAttention::forward: q_in/k_in: expected ", in.batch() * in.q_len(), " and ", in.batch() * in.k_len(),
          " rows (B*Tq and B*Tk of the attention inputs), got ", q_in.rows(), " and ", k_in.rows());
    in.require(kSupport, H_, in.batch(), in.q_len(), in.k_len(), "DualExpertAttention");
    const detail::ContextFromInputs<S> a(in);
    forward_impl(q_in, k_in, v_in, in.batch(), a.ctx, cache, false, y);
  }

  /// Task backward of a self-attention forward: adds into the gradients of W_q, W_k, W_v, W_o and W_rel (never
  /// W_gate / c_gate) and returns dL/dx.
  Mat<S> backward(const Mat<S>& dy, Cache& cache) {
    check(cache.B > 0, "DualExpertAttention::backward: the cache holds no forward pass");
    check(cache.self, "DualExpertAttention::backward: the forward was cross-attention; use backward_inputs");
    Mat<S> dx;
    backward_impl(dy, cache, nullptr, &dx);
    return dx;
  }

  /// Task backward returning the three input gradients (for cross-attention; for self-attention their sum is
  /// backward's dx, to the bit when D <= 512).
  InputGrads backward_inputs(const Mat<S>& dy, Cache& c) {
    InputGrads g;
    backward_impl(dy, c, &g, nullptr);
    return g;
  }

  /// Gate-loss backward: adds scale * d loss_gate / d(W_gate, c_gate) into their gradients and nothing else.
  /// (No-op when the forward had no oracle: the gate loss was the constant 0.)
  void backward_gate(Cache& c, S scale = S(1));

  /// Gradient isolation check (the reference's verify_gradient_isolation): one forward on x with the given
  /// context (which should carry an oracle); backward of a task stand-in (mean of output^2) must leave W_gate and
  /// c_gate exactly zero and move W_rel; backward of the gate loss alone must leave every other parameter exactly
  /// zero and move W_gate. The layer's gradients are cleared before and after.
  struct IsolationReport {
    double task_gate_grad = 0;   ///< sum |grad| of W_gate, c_gate after the task backward (must be 0)
    double task_rel_grad = 0;    ///< sum |grad| of W_rel after the task backward (> 0)
    double gate_main_grad = 0;   ///< sum |grad| of every main-group parameter after the gate backward (must be 0)
    double gate_gate_grad = 0;   ///< sum |grad| of W_gate, c_gate after the gate backward (> 0)
    bool ok = false;
  };
  IsolationReport verify_gradient_isolation(const Mat<S>& x, Index batch, const AttnContext<S>& ctx);

private:
  void forward_impl(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, Index batch,
                    const AttnContext<S>& ctx, Cache& c, bool self, Mat<S>& y);
  /// The task backward of both entry points: the three input gradients into *g, or (self-attention) their sum
  /// into *dx.
  void backward_impl(const Mat<S>& dy, Cache& c, InputGrads* g, Mat<S>* dx);

  /// Scratch elements one (b, h) pair of forward takes from Cache::scratch: the head blocks Q_h, K_h, V_h, R_h
  /// (copied to contiguous column-major storage, the layout the products below run on), |R_i|^2, |K_j|^2, the
  /// key mask row, the normalisation's mean and variance, the gate's q and k terms, and the softmax's scratch.
  static Index forward_scratch_size(Index Tq, Index Tk, Index Dh) {
    return 2 * aligned_count<S>(Tq * Dh) + 2 * aligned_count<S>(Tk * Dh) + 4 * aligned_count<S>(Tq) +
           3 * aligned_count<S>(Tk) + ops::masked_softmax_scratch<S>(Tq, Tk);
  }

  /// Adds the per-pair sums in a fixed order, forms the loss and the statistics, and turns the row
  /// gradients into d loss_gate / d logit through the 0.95 cap, the sigmoid and the +-10 clip.
  void finish_gate_loss(Cache& c, const std::vector<GateLossSums<S>>& sums) {
    const AlignedVec<S>& g_reg = c.g_reg;
    const AlignedVec<S>& g_spot = c.g_spot;
    finish_gate_totals(c, sums);
    const S inv_has = c.inv_has, inv_valid = c.inv_valid;
    const S amax = S(DeaConstants::alpha_max), clip = S(DeaConstants::logit_clip);
    const Index cells = static_cast<Index>(c.logit.size());
    parallel_for(cells, [&](Index k) {
      const S dah = g_reg[static_cast<std::size_t>(k)] * inv_has + g_spot[static_cast<std::size_t>(k)] * inv_valid;
      const S l = c.logit[static_cast<std::size_t>(k)];
      S& out = c.dlogit_gate[static_cast<std::size_t>(k)];
      out = 0;
      if (dah == 0 || l < -clip || l > clip) return;  // the clip passes gradient only inside [-10, 10]
      const S sg = S(1) / (S(1) + std::exp(-l));
      if (sg > amax) return;  // the 0.95 cap passes gradient only while sigmoid <= 0.95
      out = dah * sg * (S(1) - sg);
    }, double(cells) * 20 > kParallelMinFlops);
  }

  /// Adds the per-pair sums in the fixed order of `sums`, forms the loss and the statistics, and sets
  /// c.inv_has / c.inv_valid (both kernels).
  void finish_gate_totals(Cache& c, const std::vector<GateLossSums<S>>& sums) {
    GateLossSums<S> tot;
    for (const auto& s : sums) tot.add(s);
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

  /// In place: each row of E [Tq, Tk] becomes (E - mu) / (sigma + 1e-5) over the real keys, 0 at padded keys.
  /// mu and the biased variance count only real keys (m [Tk] is 1 for a real key; n real keys, floored at 1);
  /// sigma = sqrt(max(var, 1e-12)). Writes sigma [Tq] and floored [Tq] (1 where var < 1e-12).
  /// mu and var [Tq] are scratch.
  template <class MRow, class Col>
  static void normalise_rows(MatMap<S>& E, const MRow& m, S n, S* sigma, std::uint8_t* floored, Col& mu, Col& var) {
    auto A = E.array();
    mu = (A.rowwise() * m).rowwise().sum() / n;
    A = (A.colwise() - mu).rowwise() * m;                            // E - mu at real keys, 0 at padded keys
    var = A.square().rowwise().sum() / n;
    Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>> sg(sigma, E.rows());
    sg = var.max(S(DeaConstants::var_floor)).sqrt();
    Eigen::Map<Eigen::Array<std::uint8_t, Eigen::Dynamic, 1>>(floored, E.rows()) =
        (var < S(DeaConstants::var_floor)).template cast<std::uint8_t>();
    var = sg + S(DeaConstants::norm_eps);  // var is dead: it holds sigma + 1e-5 (no temporary for the division)
    A.colwise() /= var;
  }

  /// In place: g [Tq, Tk] = dL/dE~  ->  dL/dE, the backward of normalise_rows. With s = sigma + 1e-5 and
  /// E~_j = m_j (E_j - mu) / s:
  ///   dE_k = m_k [ (g_k - mean_m(g)) / s  -  [var >= 1e-12] (sum_j g_j E~_j) E~_k / (n sigma) ]
  /// (the first term is the mu path, the second the sigma path; below the floor sigma is a constant).
  static void norm_backward(Mat<S>& g, const S* en, const S* sigma, const std::uint8_t* floored, S n,
                            const Eigen::Array<S, 1, Eigen::Dynamic>& m) {
    const Index tq = g.rows(), tk = g.cols();
    auto G = g.array();
    Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> e(en, tq, tk);
    G.rowwise() *= m;                                                // only real keys carry gradient
    const Eigen::Array<S, Eigen::Dynamic, 1> gmean = G.rowwise().sum() / n;
    const Eigen::Array<S, Eigen::Dynamic, 1> ge = (G * e).rowwise().sum();
    Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>> sg(sigma, tq);
    const Eigen::Array<S, Eigen::Dynamic, 1> live =
        S(1) - Eigen::Map<const Eigen::Array<std::uint8_t, Eigen::Dynamic, 1>>(floored, tq).template cast<S>();
    const Eigen::Array<S, Eigen::Dynamic, 1> coef = live * ge / (n * sg);
    const Eigen::Array<S, Eigen::Dynamic, 1> inv_s = S(1) / (sg + S(DeaConstants::norm_eps));
    G = ((G.colwise() - gmean).colwise() * inv_s - e.colwise() * coef).rowwise() * m;
  }

  // ============================================================================================================
  // Tiled kernel (Options::kernel == DeaKernel::tiled).
  //
  // The parallel unit is one (b, h) pair (it owns its rows of R, ctx, dQ and its slices of dK, dV, so nothing is
  // shared); inside it the queries are processed in blocks of block_q rows, in order. Every [Tq, Tk] quantity
  // exists only for the current block, in the calling thread's scratch (Cache::tile_scratch, sized once from the
  // shapes): E0~, E1~, alpha-hat / alpha_mix, P, dP and two more. Forward saves per-row statistics (mu, sigma and
  // the floor flag of both experts, the softmax shift and sum); backward recomputes each block's E0~, E1~,
  // alpha_mix and P from Q, K, R and those statistics with the same code on the same block shapes, so it sees the
  // same bits forward saw. The gate loss is formed per row as in the reference (same row kernel, same (b, h)
  // order), and forward also sums d loss / d logit times the gate features per (b, h), split into the regression
  // and the spotlight parts, so backward_gate only scales them by 1/n_labelled and 1/n_valid.
  // Block boundaries depend on block_q and Tq alone, and the per-pair partials (W_rel, W_gate, c_gate) are reduced
  // in a fixed order: the results are bitwise identical for any thread count.
  // ============================================================================================================

  /// The tiled kernel's per-head products run through the library's packed product (ops/packed_gemm.hpp) where it
  /// exists, with the pair's K_h and V_h packed once for all its query blocks (Eigen's product packed them again for
  /// every block); elsewhere through Eigen.
  /// (The thread scratch's pieces are aligned to kWorkspaceAlign, which must suit the packed panels.)
  static constexpr bool kPackedCore =
      ops::packed::supported<S>() && kWorkspaceAlign % ops::packed::panel_align<S>() == 0;

  /// Pointers into one thread's block scratch.
  struct TilePtrs {
    S *Kh, *Vh, *dKh, *dVh;                 // [Tk, Dh] row-major (TileMat); kPackedCore: dKh, dVh as [Dh, Tk]
    S *pKt, *pK, *pV, *pVt, *Ap, *Bpan;     // packed K_h^T, K_h, V_h, V_h^T as B operands; packed A; one B panel
    S *kn, *lk, *mrow, *kbias, *col0, *col1, *g_reg, *g_spot, *has;  // [Tk]; has: 1 at one row's labelled keys
    S *Qb, *Rb, *Db, *dQb, *dRb;            // [bq, Dh] row-major (TileMat)
    S *r0, *r1, *r2, *r3;                   // [bq]
    S *E0, *E1, *AM, *P, *dP, *X, *CL;      // [bq, Tk] row-major
  };
  /// Carves consecutive aligned pieces from base (base = nullptr: only counts them).
  struct Carve {
    S* base;
    Index used = 0;
    S* take(Index n) {
      S* p = base ? base + used : nullptr;
      used += aligned_count<S>(n);
      return p;
    }
  };
  static TilePtrs tiled_take(Carve& cv, Index bq, Index Tk, Index Dh) {
    TilePtrs t;
    for (S** p : {&t.Kh, &t.Vh, &t.dKh, &t.dVh}) *p = cv.take(Tk * Dh);
    namespace pk = ops::packed;
    t.pKt = cv.take(pk::whole_b_size<S>(Dh, Tk));  // (sizes 0 without the packed product)
    t.pK = cv.take(pk::whole_b_size<S>(Tk, Dh));
    t.pV = cv.take(pk::whole_b_size<S>(Tk, Dh));
    t.pVt = cv.take(pk::whole_b_size<S>(Dh, Tk));
    const Index kb = std::min(2 * bq, pk::kKcMax);  // the deepest block of k of a product over a block's rows
    t.Ap = cv.take(std::max({pk::whole_a_size<S>(2 * bq, Dh), pk::whole_a_size<S>(2 * bq, Tk), pk::whole_a_size<S>(Dh, kb)}));
    t.Bpan = cv.take(pk::stream_b_size<S>(kb));
    for (S** p : {&t.kn, &t.lk, &t.mrow, &t.kbias, &t.col0, &t.col1, &t.g_reg, &t.g_spot, &t.has}) *p = cv.take(Tk);
    for (S** p : {&t.Qb, &t.Rb, &t.Db, &t.dQb, &t.dRb}) *p = cv.take(bq * Dh);
    for (S** p : {&t.r0, &t.r1, &t.r2, &t.r3}) *p = cv.take(bq);
    for (S** p : {&t.E0, &t.E1, &t.P, &t.AM, &t.dP, &t.X, &t.CL}) *p = cv.take(bq * Tk);
    return t;
  }
  /// The pointers of one block of n rows: the second of each pair (Qb, Rb), (E0, E1), (P, AM), (dQb, dRb) starts
  /// right after the first's n rows, so that each pair is one [2n, *] matrix and one product serves both (K_h is
  /// packed once). The second pointers are not aligned in general.
  static TilePtrs tiled_stack(TilePtrs t, Index n, Index Tk, Index Dh) {
    t.Rb = t.Qb + n * Dh;
    t.dRb = t.dQb + n * Dh;
    t.E1 = t.E0 + n * Tk;
    t.AM = t.P + n * Tk;
    return t;
  }
  /// Scalars of one thread's block scratch for blocks of bq queries against Tk keys.
  static Index tiled_scratch_size(Index bq, Index Tk, Index Dh) {
    Carve cv{nullptr};
    tiled_take(cv, bq, Tk, Dh);
    return cv.used;
  }
  /// The query block size the tiled kernel uses for Tq queries and Tk keys.
  Index tiled_block_rows(Index Tq, Index Tk) const {
    Index bq = opt_.block_q;
    if (bq <= 0) {  // seven [bq, Tk] buffers in about 4 MiB, 32 to 64 rows (fewer rows make the products slow)
      bq = static_cast<Index>((std::size_t(4) << 20) / (7 * std::size_t(Tk) * sizeof(S)));
      bq = bq < 32 ? 32 : (bq > 64 ? 64 : bq / 8 * 8);
    }
    return bq < Tq ? bq : Tq;
  }
  static int thread_index() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
  }
  template <class V>
  static void release(V& v) {
    if (v.capacity() > 0) V().swap(v);
  }

  /// Recomputes (backward) or computes and saves (forward) one block of rows [i0, i0 + n) of pair (b, h):
  /// Qb, Rb, E0~ (E0), E1~ (E1), alpha_mix (AM), P; in forward also the logit (X) and the row statistics, the
  /// rows of R, the gate loss of each row and its gate partials; in backward the E1 clamp flags (CL).
  /// `gate` (forward with an oracle) points at the pair's [2, G + 1] partials.
  void tiled_block(bool fwd, Cache& c, const TilePtrs& tp_all, Index b, Index h, Index i0, Index n, bool any_real,
                   const AttnContext<S>* ctx, bool target_per_head, GateLossSums<S>* sm, S* gate) {
    const Index Tq = c.Tq, Tk = c.Tk, H = H_, Dh = Dh_, G = 2 * Dh + 2;
    const Index bh = b * H + h, row0 = bh * Tq + i0;
    const S inv_sqrt = S(1) / std::sqrt(S(Dh)), inv_dh = S(1) / S(Dh);
    const S amax = S(DeaConstants::alpha_max), clip = S(DeaConstants::logit_clip);
    const S nr = c.n_real[static_cast<std::size_t>(b)];
    using ColVec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
    using ColArr = Eigen::Array<S, Eigen::Dynamic, 1>;
    using RowArr = Eigen::Array<S, 1, Eigen::Dynamic>;
    const TilePtrs tp = tiled_stack(tp_all, n, Tk, Dh);
    Eigen::Map<TileMat, Eigen::AlignedMax> Qb(tp.Qb, n, Dh);
    Eigen::Map<TileMat> Rb(tp.Rb, n, Dh);
    Eigen::Map<const TileMat, Eigen::AlignedMax> Kh(tp.Kh, Tk, Dh);
    Eigen::Map<const RowArr, Eigen::AlignedMax> m(tp.mrow, Tk), kn(tp.kn, Tk), kbias(tp.kbias, Tk);
    Eigen::Map<const ColVec, Eigen::AlignedMax> lk(tp.lk, Tk);
    Eigen::Map<ColArr, Eigen::AlignedMax> r0(tp.r0, n), r1(tp.r1, n);
    MatMap<S> E0(tp.E0, n, Tk), E1(tp.E1, n, Tk), AM(tp.AM, n, Tk), P(tp.P, n, Tk);

    // 1. Q block and R = Q W_rel^T (forward computes and saves R; backward reads the saved rows: the same bits)
    Qb = c.Q.block(b * Tq + i0, h * Dh, n, Dh);
    if (fwd) {
      Eigen::Map<const RelMat> Wr(W_rel_.value.data() + h * Dh * Dh, Dh, Dh);
      Rb.noalias() = Qb * Wr.transpose();
      c.R.block(b * Tq + i0, h * Dh, n, Dh) = Rb;
    } else {
      Rb = c.R.block(b * Tq + i0, h * Dh, n, Dh);
    }
    // 2. E0 = Q K^T / sqrt(Dh); 3. E1 = min(0, (2 R.K - |R|^2 - |K|^2) / Dh)   (as the reference kernel)
    // (the scale factors are applied after the products: a scaled one-row block would be evaluated into a heap
    // temporary before its matrix-vector product. Forward and backward run this same code, so backward still
    // sees exactly the values forward saw.)
    // both in one product: [E0; E1] = [Qb; Rb] K_h^T
    if constexpr (kPackedCore)
      ops::packed::gemm_whole_b<S>(2 * n, Tk, Dh, {tp.Qb, Dh, 1}, tp.pKt, tp.E0, Tk, false, tp.Ap);
    else
      MatMap<S>(tp.E0, 2 * n, Tk).noalias() = Eigen::Map<const TileMat, Eigen::AlignedMax>(tp.Qb, 2 * n, Dh) * Kh.transpose();
    E0 *= inv_sqrt;
    r0 = Rb.rowwise().squaredNorm();
    for (Index r = 0; r < n; ++r) {  // one pass per row (plain loops, vectorised); backward also marks the clamp
      S* e1 = tp.E1 + r * Tk;
      const S rr = r0[r];
      const S* knp = tp.kn;
      if (fwd) {
        for (Index j = 0; j < Tk; ++j) {
          const S v = (e1[j] * S(2) - rr - knp[j]) * inv_dh;
          e1[j] = v < S(0) ? v : S(0);
        }
      } else {
        S* cl = tp.CL + r * Tk;
        for (Index j = 0; j < Tk; ++j) {
          const S v = (e1[j] * S(2) - rr - knp[j]) * inv_dh;
          cl[j] = v > S(0) ? S(1) : S(0);  // 1 where the clamp is active
          e1[j] = v < S(0) ? v : S(0);
        }
      }
    }
    // 4. per-query normalisation over the real keys, in place (forward: statistics saved per row)
    for (int e = 0; e < 2; ++e) {
      auto A = (e == 0 ? E0 : E1).array();
      Eigen::Map<ColArr> mu((e == 0 ? c.mu0 : c.mu1).data() + row0, n);
      Eigen::Map<ColArr> sg((e == 0 ? c.sigma0 : c.sigma1).data() + row0, n);
      if (fwd) {
        mu.matrix().noalias() = (e == 0 ? E0 : E1) * m.matrix().transpose();  // sum of the real keys (a GEMV)
        mu /= nr;
        A = (A.colwise() - mu).rowwise() * m;
        r1 = A.square().rowwise().sum() / nr;  // biased variance
        sg = r1.max(S(DeaConstants::var_floor)).sqrt();
        Eigen::Map<Eigen::Array<std::uint8_t, Eigen::Dynamic, 1>>((e == 0 ? c.floor0 : c.floor1).data() + row0, n) =
            (r1 < S(DeaConstants::var_floor)).template cast<std::uint8_t>();
      } else {
        A = (A.colwise() - mu).rowwise() * m;
      }
      r1 = S(1) / (sg + S(DeaConstants::norm_eps));  // one division per row, then products
      A.colwise() *= r1;
    }
    // 5.-6. gate: logit = Q.w_q + K.w_k + w_E0 E0~ + w_E1 E1~ + c; alpha_hat = min(0.95, sigmoid(clip(logit)))
    const S* wg = W_gate_.value.data() + h * G;
    Eigen::Map<ColVec, Eigen::AlignedMax> lq(tp.r2, n);
    lq.noalias() = Qb * Eigen::Map<const ColVec>(wg, Dh);
    const S w0 = wg[2 * Dh], w1 = wg[2 * Dh + 1], cg = c_gate_.value[h];
    AM.array() = ((w0 * E0.array() + w1 * E1.array()).colwise() + lq.array()).rowwise() + lk.transpose().array();
    AM.array() += cg;
    const bool gate_loss = fwd && c.has_oracle;
    if (gate_loss) {  // X = d alpha-hat / d logit: sigmoid' inside the +-10 clip and below the 0.95 cap, else 0
      auto Xa = MatMap<S>(tp.X, n, Tk).array();
      Xa = S(1) / (S(1) + (-AM.array()).exp());
      S* xp = tp.X;
      const S* lp = tp.AM;
      for (Index k = 0; k < n * Tk; ++k) {  // a plain loop: Eigen 3.4 evaluates select() one scalar at a time
        const S x = xp[k], l = lp[k];
        xp[k] = (l < -clip || l > clip || x > amax) ? S(0) : x * (S(1) - x);
      }
    }
    AM.array() = (S(1) / (S(1) + (-AM.array().max(-clip).min(clip)).exp())).min(amax);
    if (fwd && !c.alpha_hat.empty())  // AttnContext::keep_alpha_hat: the gate's own alpha-hat of these rows
      std::copy(tp.AM, tp.AM + n * Tk, c.alpha_hat.data() + row0 * Tk);
    // 7.-8. alpha_mix: the detached alpha-hat (or the frozen copy), with an oracle gamma a_eff + (1 - gamma) alpha-hat
    const S gamma = c.gamma_mix;
    const S* km = tp.mrow;  // 1 at the real keys
    S* has = tp.has;
    for (Index r = 0; r < n; ++r) {
      const Index i = i0 + r;
      S* am = tp.AM + r * Tk;
      const S* frozen = c.frozen_copy.empty() ? nullptr : c.frozen_copy.data() + (bh * Tq + i) * Tk;
      if (!c.has_oracle) {
        if (frozen) std::copy(frozen, frozen + Tk, am);
        continue;
      }
      const S* orc = c.oracle_copy.data() + (c.oracle_per_head ? (bh * Tq + i) * Tk : (b * Tq + i) * Tk);
      S* a = tp.dP;  // the row's clamped oracle [Tk]: scratch in dP, which is free until the softmax
      for (Index j = 0; j < Tk; ++j) {  // masks of S, so that the row's loops vectorise at any Tk (gate_loss.hpp)
        const S o = orc[j];
        has[j] = o == o ? km[j] : S(0);
        a[j] = std::isnan(o) ? S(0) : (o < 0 ? S(0) : (o > amax ? amax : o));
      }
      if (gate_loss) {
        // the row's gate loss (the gate's own alpha-hat, never the frozen copy), then its d loss / d logit parts
        std::int64_t tgt = -1;
        if (ctx->target_idx) tgt = (*ctx->target_idx)[target_per_head ? bh * Tq + i : b * Tq + i];
        const S* e0 = tp.E0 + r * Tk;
        const S* e1 = tp.E1 + r * Tk;
        const Index t = detail::gate_loss_row<S>(Tk, e0, e1, am, a, has, km, ctx->target_idx == nullptr, tgt, opt_.gate,
                                                 *sm, tp.g_reg, tp.g_spot, nullptr, nullptr, nullptr);
        c.target[static_cast<std::size_t>(bh * Tq + i)] = t;
        const S* dsig = tp.X + r * Tk;
        for (int part = 0; part < 2; ++part) {
          S* gp = gate + part * (G + 1);
          S* col = part == 0 ? tp.col0 : tp.col1;
          S rsum = 0, s0 = 0, s1 = 0;
          if (part == 0) {  // dl_j = g_reg_j sigmoid'_j at the labelled keys (branch-free, vectorised sums)
            S* dl = tp.g_reg;
            for (Index j = 0; j < Tk; ++j) {
              const S prod = dl[j] * dsig[j];  // unconditional loads: vectorised
              const S v = has[j] != S(0) ? prod : S(0);
              dl[j] = v;
              col[j] += v;
            }
            const Eigen::Map<const RowArr, Eigen::AlignedMax> dla(dl, Tk);
            rsum = dla.sum();
            s0 = (dla * Eigen::Map<const RowArr>(e0, Tk)).sum();
            s1 = (dla * Eigen::Map<const RowArr>(e1, Tk)).sum();
            std::fill(dl, dl + Tk, S(0));
          } else if (t >= 0) {
            const S dl = tp.g_spot[t] * dsig[t];
            rsum = dl;
            col[t] += dl;
            s0 = dl * e0[t];
            s1 = dl * e1[t];
            tp.g_spot[t] = 0;
          }
          for (Index d = 0; d < Dh; ++d) gp[d] += rsum * Qb(r, d);  // w_q: sum_i (sum_j dl_ij) Q_i
          gp[2 * Dh] += s0;                                          // w_E0: sum dl E0~
          gp[2 * Dh + 1] += s1;                                      // w_E1: sum dl E1~
          gp[G] += rsum;                                             // c: sum dl
        }
      }
      for (Index j = 0; j < Tk; ++j) {
        const S det = frozen ? frozen[j] : am[j];
        const S a_eff = has[j] != S(0) ? a[j] : det;
        am[j] = gamma * a_eff + (S(1) - gamma) * det;
      }
    }
    // 7.-9. scores S = (1 - alpha_mix) E0~ + alpha_mix E1~ and the masked softmax (forward saves shift and sum)
    P = (S(1) - AM.array()).matrix().cwiseProduct(E0) + AM.cwiseProduct(E1);
    Eigen::Map<ColArr> shift(c.row_shift.data() + row0, n), z(c.row_sum.data() + row0, n);
    if (!any_real) {  // every key of the batch row masked: zeros, never NaN
      P.setZero();
      if (fwd) {
        shift.setZero();
        z.setOnes();
      }
      return;
    }
    auto PA = P.array();
    PA = PA.rowwise() + kbias;
    if (fwd) {
      shift = PA.rowwise().maxCoeff();
      shift = (shift == -std::numeric_limits<S>::infinity()).select(S(0), shift);
    }
    for (Index r = 0; r < n; ++r) {  // per row: vectorised (see ops/softmax.hpp); masked keys exactly 0
      PA.row(r) = (PA.row(r) - shift[r]).exp();
      ops::flush_exp_underflow(tp.P + r * Tk, Tk);
    }
    if (fwd) {
      z = PA.rowwise().sum();
      z = (z > S(0)).select(z, S(1));
    }
    Eigen::Map<ColArr, Eigen::AlignedMax> zinv(tp.r3, n);
    zinv = S(1) / z;
    PA.colwise() *= zinv;
  }

  /// Dropout multipliers (0 or 1/(1-p)) of rows [i0, i0 + n) of pair bh into D [n, Tk].
  void tiled_dropout(const Cache& c, Index bh, Index i0, Index n, S* D) const {
    ops::counter_dropout_mask(D, n * c.Tk, c.drop_seed, static_cast<std::uint64_t>((bh * c.Tq + i0) * c.Tk),
                              static_cast<double>(opt_.dropout));
  }

  /// Grows (never shrinks) the per-thread block scratch to one slice per thread; returns a slice's size.
  Index tiled_scratch_reserve(Cache& c, Index bq) const {
    const int nt = num_threads() < 1 ? 1 : num_threads();
    const Index per = tiled_scratch_size(bq, c.Tk, Dh_);
    if (c.tile_scratch.size() < static_cast<std::size_t>(nt * per)) c.tile_scratch.resize(static_cast<std::size_t>(nt * per));
    return per;
  }

  /// One (b, h) task of either tiled pass: the calling thread's scratch and the pair's set-up.
  struct TiledTask {
    Index b, h;
    TilePtrs tp;
    bool any_real;  ///< the sequence has at least one real key
  };
  TiledTask tiled_task_begin(Cache& c, Index bh, Index per, bool backward) const {
    const int th = thread_index();
    Carve cv{c.tile_scratch.data() + th * per};
    TiledTask t{bh / H_, bh % H_, tiled_take(cv, c.block_q, c.Tk, Dh_), false};
    tiled_pair_setup(c, t.tp, t.b, t.h, t.any_real, backward);
    return t;
  }

  /// Per-pair set-up shared by forward and backward: K_h, V_h, |K_j|^2, the gate's key term, the mask row, and with
  /// the packed product K_h^T and V_h packed as the B of the block products (backward: also K_h and V_h^T).
  void tiled_pair_setup(const Cache& c, const TilePtrs& tp, Index b, Index h, bool& any_real, bool backward) const {
    const Index Tk = c.Tk, Dh = Dh_, G = 2 * Dh + 2;
    using ColVec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
    Eigen::Map<TileMat, Eigen::AlignedMax> Kh(tp.Kh, Tk, Dh), Vh(tp.Vh, Tk, Dh);
    Kh = c.K.block(b * Tk, h * Dh, Tk, Dh);
    Vh = c.V.block(b * Tk, h * Dh, Tk, Dh);
    if constexpr (kPackedCore) {
      namespace pk = ops::packed;
      const pk::View<S> k{tp.Kh, Dh, 1}, v{tp.Vh, Dh, 1};
      pk::pack_b_whole<S>(Dh, Tk, k.t(), tp.pKt);  // E = [Q; R] K_h^T
      pk::pack_b_whole<S>(Tk, Dh, v, tp.pV);       // ctx = P V_h
      if (backward) {
        pk::pack_b_whole<S>(Tk, Dh, k, tp.pK);       // [dQ; dR] = [g0'; g1'] K_h
        pk::pack_b_whole<S>(Dh, Tk, v.t(), tp.pVt);  // dP = dctx V_h^T
      }
    }
    Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>, Eigen::AlignedMax>(tp.kn, Tk) = Kh.rowwise().squaredNorm().array();
    Eigen::Map<ColVec, Eigen::AlignedMax>(tp.lk, Tk).noalias() =
        Kh * Eigen::Map<const ColVec>(W_gate_.value.data() + h * G + Dh, Dh);
    any_real = false;
    for (Index j = 0; j < Tk; ++j) {
      const bool real = c.km[static_cast<std::size_t>(b * Tk + j)] != 0;
      tp.mrow[j] = real ? S(1) : S(0);
      tp.kbias[j] = real ? S(0) : -std::numeric_limits<S>::infinity();
      any_real = any_real || real;
    }
  }

  void forward_tiled(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, const AttnContext<S>& ctx, Cache& c,
                     bool self, Mat<S>& y, bool oracle_per_head, bool target_per_head) {
    const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = H_, Dh = Dh_, G = 2 * Dh + 2;
    const bool has_oracle = c.has_oracle;
    const Index bq = tiled_block_rows(Tq, Tk);
    c.block_q = bq;
    // the maps of the reference kernel are not produced: free them (a cache may have served that kernel before)
    for (auto* v : {&c.e0n, &c.e1n, &c.logit, &c.alpha_mix, &c.scores, &c.attn, &c.drop, &c.dlogit_gate, &c.beta, &c.w,
                    &c.d_b, &c.g_reg, &c.g_spot, &c.oracle_ref, &c.scratch})
      release(*v);
    if (ctx.keep_alpha_hat)  // every cell is written by its block below
      c.alpha_hat.resize(static_cast<std::size_t>(B * H * Tq * Tk));
    else
      release(c.alpha_hat);
    release(c.e1_clamped);
    const std::size_t rows = static_cast<std::size_t>(B * H * Tq);
    for (auto* v : {&c.sigma0, &c.sigma1, &c.mu0, &c.mu1, &c.row_shift, &c.row_sum}) v->resize(rows);
    c.floor0.resize(rows);
    c.floor1.resize(rows);
    c.oracle_per_head = oracle_per_head;
    if (has_oracle) {
      c.target.resize(rows);
      c.gate_part.assign(static_cast<std::size_t>(B * H * 2 * (G + 1)), S(0));
      c.oracle_copy.assign(ctx.alpha_oracle->ptr(), ctx.alpha_oracle->ptr() + ctx.alpha_oracle->numel());
    } else {
      c.target.clear();
      c.gate_part.clear();
      release(c.oracle_copy);
    }
    if (ctx.frozen_alpha_hat)
      c.frozen_copy.assign(ctx.frozen_alpha_hat->ptr(), ctx.frozen_alpha_hat->ptr() + ctx.frozen_alpha_hat->numel());
    else
      release(c.frozen_copy);
    c.drop_seed = c.dropout_on ? ctx.rng->next_u64() : 0;

    input_projections(q_in, k_in, v_in, self, c);
    c.R.resize(B * Tq, D_);
    c.ctx.resize(B * Tq, D_);

    const auto sizes = tiled_scratch_reserve(c, bq);
    c.sums.assign(static_cast<std::size_t>(B * H), GateLossSums<S>());
    const bool par = double(B * H) * double(Tq) * double(Tk) * double(4 * Dh + 20) > kParallelMinFlops;
    parallel_for(B * H, [&](Index bh) {
      const TiledTask t = tiled_task_begin(c, bh, sizes, false);
      const Index b = t.b, h = t.h;
      const TilePtrs& tp = t.tp;
      const bool any_real = t.any_real;
      S* gate = has_oracle ? c.gate_part.data() + bh * 2 * (G + 1) : nullptr;
      if (has_oracle)
        for (S* p : {tp.col0, tp.col1, tp.g_reg, tp.g_spot}) std::fill(p, p + Tk, S(0));
      Eigen::Map<const TileMat, Eigen::AlignedMax> Vh(tp.Vh, Tk, Dh);
      for (Index i0 = 0; i0 < Tq; i0 += bq) {
        const Index n = std::min(bq, Tq - i0);
        tiled_block(true, c, tp, b, h, i0, n, any_real, &ctx, target_per_head, &c.sums[static_cast<std::size_t>(bh)],
                    gate);
        // 10. dropout on the probabilities, then ctx_h = P V_h
        MatMap<S> P(tp.P, n, Tk);
        const S* pm = tp.P;
        if (c.dropout_on) {
          MatMap<S> Pd(tp.dP, n, Tk);
          tiled_dropout(c, bh, i0, n, tp.dP);
          Pd.array() *= P.array();
          pm = tp.dP;
        }
        if constexpr (kPackedCore)
          ops::packed::gemm_whole_b<S>(n, Dh, Tk, {pm, Tk, 1}, tp.pV, c.ctx.data() + (b * Tq + i0) * D_ + h * Dh, D_,
                                       false, tp.Ap);
        else
          c.ctx.block(b * Tq + i0, h * Dh, n, Dh).noalias() = Eigen::Map<const Mat<S>>(pm, n, Tk) * Vh;
      }
      if (has_oracle) {  // w_k: sum_j (sum_i dl_ij) K_j, for both parts
        Eigen::Map<const TileMat, Eigen::AlignedMax> Kh(tp.Kh, Tk, Dh);
        for (int part = 0; part < 2; ++part)
          Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>(gate + part * (G + 1) + Dh, Dh).noalias() =
              Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(part == 0 ? tp.col0 : tp.col1, Tk) * Kh;
      }
    }, par);

    if (has_oracle) finish_gate_totals(c, c.sums);
    output_projection(c, y);  // 11.
  }

  /// Both kernels: Q = q_in W_q^T + b_q, K = k_in W_k^T + b_k, V = v_in W_v^T + b_v (k_in = v_in = q_in when self).
  void input_projections(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, bool self, Cache& c) const {
    ops::linear_forward<S>(q_in, weight_[0].mat(), opt_.bias ? bias_[0].value.data() : nullptr, c.Q);
    ops::linear_forward<S>(self ? q_in : k_in, weight_[1].mat(), opt_.bias ? bias_[1].value.data() : nullptr, c.K);
    ops::linear_forward<S>(self ? q_in : v_in, weight_[2].mat(), opt_.bias ? bias_[2].value.data() : nullptr, c.V);
  }

  /// Both kernels: y = ctx W_o^T + b_o, or the concatenated heads themselves without an output projection.
  void output_projection(const Cache& c, Mat<S>& y) const {
    if (!opt_.out_proj) {
      y = c.ctx;
      return;
    }
    ops::linear_forward<S>(c.ctx, weight_[3].mat(), opt_.bias ? bias_[3].value.data() : nullptr, y);
  }

  /// Task backward of the tiled kernel: dctx [B*Tq, D] -> dQ, dK, dV and the per-pair W_rel partials.
  void tiled_backward_core(const Mat<S>& dctx, Cache& c, Mat<S>& dQ, Mat<S>& dK, Mat<S>& dV, Vec<S>& dwrel_part) {
    const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = H_, Dh = Dh_;
    const Index bq = c.block_q;
    const S inv_sqrt = S(1) / std::sqrt(S(Dh)), inv_dh = S(1) / S(Dh);
    const auto sizes = tiled_scratch_reserve(c, bq);
    using ColArr = Eigen::Array<S, Eigen::Dynamic, 1>;
    using RowArr = Eigen::Array<S, 1, Eigen::Dynamic>;
    parallel_for(B * H, [&](Index bh) {
      const TiledTask t = tiled_task_begin(c, bh, sizes, true);
      const Index b = t.b, h = t.h;
      const TilePtrs& tp = t.tp;
      const bool any_real = t.any_real;
      Eigen::Map<const TileMat, Eigen::AlignedMax> Kh(tp.Kh, Tk, Dh), Vh(tp.Vh, Tk, Dh);
      Eigen::Map<TileMat, Eigen::AlignedMax> dKh(tp.dKh, Tk, Dh), dVh(tp.dVh, Tk, Dh);
      dKh.setZero();
      dVh.setZero();
      Eigen::Map<RelMat> dWr(dwrel_part.data() + bh * Dh * Dh, Dh, Dh);
      dWr.setZero();
      Eigen::Map<const RelMat> Wr(W_rel_.value.data() + h * Dh * Dh, Dh, Dh);
      Eigen::Map<const RowArr, Eigen::AlignedMax> m(tp.mrow, Tk);
      const S nr = c.n_real[static_cast<std::size_t>(b)];
      Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>, Eigen::AlignedMax> cs(tp.col0, Tk);
      cs.setZero();
      for (Index i0 = 0; i0 < Tq; i0 += bq) {
        const Index n = std::min(bq, Tq - i0);
        const Index row0 = bh * Tq + i0;
        tiled_block(false, c, t.tp, b, h, i0, n, any_real, nullptr, false, nullptr, nullptr);
        const TilePtrs bp = tiled_stack(t.tp, n, Tk, Dh);
        Eigen::Map<const TileMat, Eigen::AlignedMax> Qb(bp.Qb, n, Dh);
        Eigen::Map<const TileMat> Rb(bp.Rb, n, Dh);
        Eigen::Map<TileMat, Eigen::AlignedMax> Db(bp.Db, n, Dh), dQb(bp.dQb, n, Dh);
        Eigen::Map<TileMat> dRb(bp.dRb, n, Dh);
        MatMap<S> E0(bp.E0, n, Tk), E1(bp.E1, n, Tk), AM(bp.AM, n, Tk), P(bp.P, n, Tk), dP(bp.dP, n, Tk),
            X(bp.X, n, Tk), CL(bp.CL, n, Tk);
        Eigen::Map<ColArr, Eigen::AlignedMax> r0(bp.r0, n), r1(bp.r1, n), r2(bp.r2, n), r3(bp.r3, n);
        Db = dctx.block(b * Tq + i0, h * Dh, n, Dh);
        // ctx_h = Pd V_h, Pd = P .* drop
        if constexpr (kPackedCore)                                 // ctx = Pd V  ->  dPd = dctx V^T
          ops::packed::gemm_whole_b<S>(n, Tk, Dh, {bp.Db, Dh, 1}, tp.pVt, bp.dP, Tk, false, tp.Ap);
        else
          dP.noalias() = Db * Vh.transpose();
        const S* pd = bp.P;
        if (c.dropout_on) {
          tiled_dropout(c, bh, i0, n, bp.X);
          dP.array() *= X.array();                                 // Pd = P .* drop  ->  dP = dPd .* drop
          X.array() *= P.array();
          pd = bp.X;
        }
        // ctx = Pd V  ->  dV += Pd^T dctx   (packed: dV_h^T += dctx^T Pd, Pd read along its rows)
        if constexpr (kPackedCore)
          ops::packed::gemm_stream_b<S>(Dh, Tk, n, ops::packed::View<S>{bp.Db, Dh, 1}.t(), {pd, Tk, 1}, tp.dVh, Tk, true,
                                        tp.Ap, tp.Bpan);
        else
          dVh.noalias() += Eigen::Map<const Mat<S>>(pd, n, Tk).transpose() * Db;
        // P = softmax(S) over real keys  ->  dS = P .* (dP - rowsum(P .* dP))   (in dP)
        r0 = (P.array() * dP.array()).rowwise().sum();
        dP.array() = P.array() * (dP.array().colwise() - r0);
        // S = (1 - alpha_mix) E0~ + alpha_mix E1~, alpha_mix constant  ->  g0 (in P), g1 (in AM)
        P.array() = (S(1) - AM.array()) * dP.array();
        AM.array() *= dP.array();
        // E~ = norm(E) per row over the real keys:
        //   dE_k = m_k [ (g_k - mean_m(g)) / s  -  [var >= 1e-12] (sum_j g_j E~_j) E~_k / (n sigma) ],  s = sigma + 1e-5
        for (int e = 0; e < 2; ++e) {
          auto Gm = (e == 0 ? P : AM).array();
          const auto En = (e == 0 ? E0 : E1).array();
          Eigen::Map<const ColArr> sg((e == 0 ? c.sigma0 : c.sigma1).data() + row0, n);
          const std::uint8_t* fl = (e == 0 ? c.floor0 : c.floor1).data() + row0;
          Gm.rowwise() *= m;
          r0 = Gm.rowwise().sum() / nr;                            // mean_m(g)
          r1 = (Gm * En).rowwise().sum();                          // sum_j g_j E~_j
          for (Index r = 0; r < n; ++r) {
            r2[r] = fl[r] ? S(0) : r1[r] / (nr * sg[r]);           // sigma path (none below the floor)
            r3[r] = S(1) / (sg[r] + S(DeaConstants::norm_eps));
          }
          Gm = ((Gm.colwise() - r0).colwise() * r3 - En.colwise() * r2).rowwise() * m;
        }
        // E1 = min(0, E1raw): no gradient where the clamp was active; the scale factors of both experts go into
        // the gradients here: g0' = g0 / sqrt(Dh), g1' = (2/Dh) g1
        AM.array() *= (S(2) * inv_dh) * (S(1) - CL.array());
        P *= inv_sqrt;
        // E0_ij = Q_i.K_j / sqrt(Dh)  ->  dQ = g0' K, dK += g0'^T Q
        // E1raw_ij = -(|R_i|^2 + |K_j|^2 - 2 R_i.K_j) / Dh
        //   dR_i = sum_j g1'_ij K_j - (sum_j g1'_ij) R_i,  dK_j += sum_i g1'_ij R_i - (sum_i g1'_ij) K_j
        // [P; AM] is one [2n, Tk] matrix and [Qb; Rb], [dQb; dRb] are [2n, Dh]: two products serve all four terms
        r0 = AM.array().rowwise().sum();
        cs += AM.colwise().sum();                                  // sum_i g1'_ij, over all blocks (applied below)
        const MatMap<S> PA(bp.P, 2 * n, Tk);
        if constexpr (kPackedCore)
          ops::packed::gemm_whole_b<S>(2 * n, Dh, Tk, {bp.P, Tk, 1}, tp.pK, bp.dQb, Dh, false, tp.Ap);
        else
          Eigen::Map<TileMat, Eigen::AlignedMax>(bp.dQb, 2 * n, Dh).noalias() = PA * Kh;
        dRb.noalias() -= r0.matrix().asDiagonal() * Rb;
        if constexpr (kPackedCore)  // dK_h^T += [Qb; Rb]^T [g0'; g1']
          ops::packed::gemm_stream_b<S>(Dh, Tk, 2 * n, ops::packed::View<S>{bp.Qb, Dh, 1}.t(), {bp.P, Tk, 1}, tp.dKh, Tk,
                                        true, tp.Ap, tp.Bpan);
        else
          dKh.noalias() += PA.transpose() * Eigen::Map<const TileMat, Eigen::AlignedMax>(bp.Qb, 2 * n, Dh);
        // R = Q W_rel^T  ->  dQ += dR W_rel, dW_rel += dR^T Q
        dQb.noalias() += dRb * Wr;
        dWr.noalias() += dRb.transpose() * Qb;
        dQ.block(b * Tq + i0, h * Dh, n, Dh) = dQb;
      }
      if constexpr (kPackedCore) {  // dKh and dVh hold dK_h^T and dV_h^T [Dh, Tk]
        const Eigen::Map<const Mat<S>> dKt(tp.dKh, Dh, Tk), dVt(tp.dVh, Dh, Tk);
        dK.block(b * Tk, h * Dh, Tk, Dh) = dKt.transpose() - cs.transpose().asDiagonal() * Kh;  // (sum_i g1'_ij) K_j
        dV.block(b * Tk, h * Dh, Tk, Dh) = dVt.transpose();
      } else {
        dKh -= cs.transpose().asDiagonal() * Kh;  // the (sum_i g1'_ij) K_j term of dK_j
        dK.block(b * Tk, h * Dh, Tk, Dh) = dKh;
        dV.block(b * Tk, h * Dh, Tk, Dh) = dVh;
      }
    }, double(B * H) * double(Tq) * double(Tk) * double(8 * Dh + 20) > kParallelMinFlops);
  }

  Index D_, H_, Dh_ = 0;
  Options opt_;
  Param<S> weight_[4], bias_[4];
  Param<S> W_rel_, W_gate_, c_gate_;
};

// ---- the entry points into the kernels, defined outside the class: not inline, so that an `extern template`
// declaration (below) keeps other translation units from instantiating the kernels behind them ----

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::forward_impl(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in,
                                                       Index batch, const AttnContext<S>& ctx, Cache& c, bool self,
                                                       Mat<S>& y) {
  // ---- validation at the boundary (nothing below may throw inside a parallel region)
  check(batch > 0, "DualExpertAttention::forward: batch must be positive, got ", batch);
  check(q_in.cols() == D_, "DualExpertAttention::forward: x: expected ", D_, " columns (d_model), got ", q_in.cols());
  check(q_in.rows() % batch == 0 && q_in.rows() > 0, "DualExpertAttention::forward: x: expected B*T rows with B = ",
        batch, ", got ", q_in.rows(), " rows");
  const Index B = batch, Tq = q_in.rows() / batch;
  Index Tk = Tq;
  if (!self) {
    check(k_in.cols() == D_ && v_in.cols() == D_, "DualExpertAttention::forward: k_in/v_in: expected ", D_,
          " columns, got ", k_in.cols(), " and ", v_in.cols());
    check(k_in.rows() % batch == 0 && k_in.rows() > 0 && v_in.rows() == k_in.rows(),
          "DualExpertAttention::forward: k_in/v_in: expected the same B*Tk rows with B = ", batch, ", got ",
          k_in.rows(), " and ", v_in.rows());
    Tk = k_in.rows() / batch;
    check_finite(k_in, "DualExpertAttention::forward: k_in");
    check_finite(v_in, "DualExpertAttention::forward: v_in");
  }
  check_finite(q_in, self ? "DualExpertAttention::forward: x" : "DualExpertAttention::forward: q_in");
  const Index H = H_, Dh = Dh_;
  if (ctx.key_mask) check_shape(*ctx.key_mask, {B, Tk}, "DualExpertAttention::forward: key_mask");
  const bool has_oracle = ctx.alpha_oracle != nullptr;
  bool oracle_per_head = false;
  if (has_oracle) {
    const Shape& s = ctx.alpha_oracle->shape;
    oracle_per_head = s.size() == 4;
    check(s == Shape{B, Tq, Tk} || s == Shape{B, H, Tq, Tk}, "DualExpertAttention::forward: alpha_oracle: expected shape ",
          shape_str({B, Tq, Tk}), " or ", shape_str({B, H, Tq, Tk}), ", got ", shape_str(s));
    check(ctx.gamma_mix >= 0 && ctx.gamma_mix <= 1, "DualExpertAttention::forward: gamma_mix must be in [0, 1], got ",
          ctx.gamma_mix);
    // NaN marks an unlabelled cell; an infinite value would turn the mixed scores into NaN.
    for (Index k = 0; k < ctx.alpha_oracle->numel(); ++k)
      check(!std::isinf((*ctx.alpha_oracle)[k]), "DualExpertAttention::forward: alpha_oracle: expected a finite value or "
            "NaN (unlabelled), got ", (*ctx.alpha_oracle)[k], " at flat position ", k);
  }
  bool target_per_head = false;
  if (ctx.target_idx) {
    check(has_oracle, "DualExpertAttention::forward: target_idx was given without alpha_oracle (the gate loss needs both)");
    const Shape& s = ctx.target_idx->shape;
    target_per_head = s.size() == 3;
    check(s == Shape{B, Tq} || s == Shape{B, H, Tq}, "DualExpertAttention::forward: target_idx: expected shape ",
          shape_str({B, Tq}), " or ", shape_str({B, H, Tq}), ", got ", shape_str(s));
    for (Index k = 0; k < ctx.target_idx->numel(); ++k) {
      const std::int64_t t = (*ctx.target_idx)[k];
      check(t >= -1 && t < Tk, "DualExpertAttention::forward: target_idx: expected -1 (none) or a key index in [0, ", Tk,
            "), got ", t, " at flat position ", k);
    }
  }
  if (ctx.frozen_alpha_hat)
    check_shape(*ctx.frozen_alpha_hat, {B, H, Tq, Tk}, "DualExpertAttention::forward: frozen_alpha_hat");
  const bool dropout_on = ctx.training && opt_.dropout > 0;
  check(!dropout_on || ctx.rng != nullptr, "DualExpertAttention::forward: training with dropout ", opt_.dropout,
        " needs ctx.rng");

  // ---- cache set-up: buffers keep their storage from the previous call (no allocation, no page faults when
  // the shapes repeat); every element the kernels read is written below
  c.loss_gate = 0;
  c.stats = GateStats();
  c.B = B;
  c.Tq = Tq;
  c.Tk = Tk;
  c.self = self;
  c.has_oracle = has_oracle;
  c.dropout_on = dropout_on;
  c.gamma_mix = ctx.gamma_mix;
  c.q_in = q_in;
  if (!self) {
    c.k_in = k_in;
    c.v_in = v_in;
  }
  c.km.assign(static_cast<std::size_t>(B * Tk), 1);
  if (ctx.key_mask)
    for (Index k = 0; k < B * Tk; ++k) c.km[static_cast<std::size_t>(k)] = (*ctx.key_mask)[k] ? 1 : 0;
  c.n_real.resize(static_cast<std::size_t>(B));
  for (Index b = 0; b < B; ++b) {
    Index n = 0;
    for (Index j = 0; j < Tk; ++j) n += c.km[static_cast<std::size_t>(b * Tk + j)];
    c.n_real[static_cast<std::size_t>(b)] = S(n < 1 ? 1 : n);
  }
  c.kernel = ctx.keep_maps ? DeaKernel::reference : opt_.kernel;
  if (c.kernel == DeaKernel::tiled) {
    forward_tiled(q_in, k_in, v_in, ctx, c, self, y, oracle_per_head, target_per_head);
    return;
  }
  const std::size_t cells = static_cast<std::size_t>(B * H * Tq * Tk), rows = static_cast<std::size_t>(B * H * Tq);
  c.e0n.resize(cells);
  c.e1n.resize(cells);
  c.logit.resize(cells);
  c.alpha_hat.resize(cells);
  c.alpha_mix.resize(cells);
  c.scores.resize(cells);
  c.attn.resize(cells);
  c.e1_clamped.resize(cells);
  c.sigma0.resize(rows);
  c.sigma1.resize(rows);
  c.floor0.resize(rows);
  c.floor1.resize(rows);
  if (dropout_on) c.drop.resize(cells);
  if (has_oracle) {
    c.dlogit_gate.resize(cells);
    c.beta.resize(cells);
    c.w.resize(cells);
    c.d_b.resize(cells);
    c.target.resize(rows);
    c.oracle_ref.resize(cells);
    c.g_reg.assign(cells, S(0));
    c.g_spot.assign(cells, S(0));
  } else {
    for (auto* v : {&c.dlogit_gate, &c.beta, &c.w, &c.d_b, &c.oracle_ref, &c.g_reg, &c.g_spot}) v->clear();
    c.target.clear();
  }

  input_projections(q_in, k_in, v_in, self, c);
  c.R.resize(B * Tq, D_);
  c.ctx.resize(B * Tq, D_);

  const std::uint64_t drop_seed = dropout_on ? ctx.rng->next_u64() : 0;
  c.sums.assign(static_cast<std::size_t>(B * H), GateLossSums<S>());
  const Index pair_scratch = forward_scratch_size(Tq, Tk, Dh);
  c.scratch.resize(static_cast<std::size_t>(B * H * pair_scratch));
  const S inv_sqrt = S(1) / std::sqrt(S(Dh));
  const S inv_dh = S(1) / S(Dh);
  const S amax = S(DeaConstants::alpha_max), clip = S(DeaConstants::logit_clip);
  const S gamma = ctx.gamma_mix;
  const Index G = 2 * Dh + 2;

  const bool par = double(B * H) * double(Tq) * double(Tk) * double(4 * Dh + 20) > kParallelMinFlops;
  parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H;
    const Index off = bh * Tq * Tk;
    const std::uint8_t* km = c.km.data() + b * Tk;
    // the pair's temporaries: aligned pieces of its share of c.scratch (see forward_scratch_size)
    Workspace<S> ws(c.scratch.data() + bh * pair_scratch, pair_scratch);
    using ColVec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
    using ColArr = Eigen::Array<S, Eigen::Dynamic, 1>;
    Eigen::Map<HeadMat, Eigen::AlignedMax> Qh(ws.take(Tq * Dh), Tq, Dh), Kh(ws.take(Tk * Dh), Tk, Dh),
        Vh(ws.take(Tk * Dh), Tk, Dh), Rh(ws.take(Tq * Dh), Tq, Dh);
    Qh = c.Q.block(b * Tq, h * Dh, Tq, Dh);
    Kh = c.K.block(b * Tk, h * Dh, Tk, Dh);
    Vh = c.V.block(b * Tk, h * Dh, Tk, Dh);
    Eigen::Map<const RelMat> Wr(W_rel_.value.data() + h * Dh * Dh, Dh, Dh);

    // 2. E0 = Q K^T / sqrt(Dh)                                  [Tq, Tk]
    MatMap<S> E0(c.e0n.data() + off, Tq, Tk);
    E0.noalias() = inv_sqrt * (Qh * Kh.transpose());
    // 3. R_i = W_rel Q_i; E1 = min(0, -(|R_i|^2 + |K_j|^2 - 2 R_i.K_j) / Dh)   [Tq, Tk]
    Rh.noalias() = Qh * Wr.transpose();
    c.R.block(b * Tq, h * Dh, Tq, Dh) = Rh;
    MatMap<S> E1(c.e1n.data() + off, Tq, Tk);
    E1.noalias() = S(2) * (Rh * Kh.transpose());
    Eigen::Map<ColVec, Eigen::AlignedMax> rn(ws.take(Tq), Tq), kn(ws.take(Tk), Tk);
    rn = Rh.rowwise().squaredNorm();
    kn = Kh.rowwise().squaredNorm();
    {
      auto A = E1.array();
      A = -((A.colwise() - rn.array()).rowwise() - kn.transpose().array()) * (-inv_dh);  // (2 R.K - |R|^2 - |K|^2) / Dh
      Eigen::Map<Eigen::Array<std::uint8_t, Eigen::Dynamic, 1>>(c.e1_clamped.data() + off, Tq * Tk) =
          (Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>(E1.data(), Tq * Tk) > S(0)).template cast<std::uint8_t>();
      A = A.min(S(0));
    }
    // 4. per-query normalisation over the real keys (in place: E -> E~)
    const S n = c.n_real[static_cast<std::size_t>(b)];
    Eigen::Map<Eigen::Array<S, 1, Eigen::Dynamic>, Eigen::AlignedMax> mrow(ws.take(Tk), Tk);
    mrow = Eigen::Map<const Eigen::Array<std::uint8_t, 1, Eigen::Dynamic>>(km, Tk).template cast<S>();
    Eigen::Map<ColArr, Eigen::AlignedMax> mu(ws.take(Tq), Tq), var(ws.take(Tq), Tq);
    normalise_rows(E0, mrow, n, c.sigma0.data() + bh * Tq, c.floor0.data() + bh * Tq, mu, var);
    normalise_rows(E1, mrow, n, c.sigma1.data() + bh * Tq, c.floor1.data() + bh * Tq, mu, var);
    // 5.-6. gate: logit = Q.w_q + K.w_k + w_E0 E0~ + w_E1 E1~ + c; alpha_hat = min(0.95, sigmoid(clip(logit)))
    const S* wg = W_gate_.value.data() + h * G;
    Eigen::Map<ColVec, Eigen::AlignedMax> lq(ws.take(Tq), Tq), lk(ws.take(Tk), Tk);
    lq.noalias() = Qh * Eigen::Map<const ColVec>(wg, Dh);
    lk.noalias() = Kh * Eigen::Map<const ColVec>(wg + Dh, Dh);
    const S w0 = wg[2 * Dh], w1 = wg[2 * Dh + 1], cg = c_gate_.value[h];
    S* logit = c.logit.data() + off;
    S* ahat = c.alpha_hat.data() + off;
    S* amix = c.alpha_mix.data() + off;
    {
      MatMap<S> Lg(logit, Tq, Tk), Ah(ahat, Tq, Tk);
      Lg.array() = ((w0 * E0.array() + w1 * E1.array()).colwise() + lq.array()).rowwise() + lk.transpose().array();
      Lg.array() += cg;
      Ah.array() = (S(1) / (S(1) + (-Lg.array().max(-clip).min(clip)).exp())).min(amax);
    }
    // 7.-8. mixing coefficient: the detached alpha-hat, or with an oracle gamma a_eff + (1 - gamma) alpha-hat
    const S* frozen = ctx.frozen_alpha_hat ? ctx.frozen_alpha_hat->ptr() + off : nullptr;
    std::vector<S> has(static_cast<std::size_t>(has_oracle ? Tk : 0));  // 1 at the row's labelled keys
    std::vector<S> a(static_cast<std::size_t>(has_oracle ? Tk : 0));
    GateLossSums<S>& sm = c.sums[static_cast<std::size_t>(bh)];
    for (Index i = 0; i < Tq; ++i) {
      const S* det = frozen ? frozen + i * Tk : ahat + i * Tk;  // the detached alpha-hat the scores read
      if (!has_oracle) {
        for (Index j = 0; j < Tk; ++j) amix[i * Tk + j] = det[j];
        continue;
      }
      const S* orc = ctx.alpha_oracle->ptr() + (oracle_per_head ? ((b * H + h) * Tq + i) * Tk : (b * Tq + i) * Tk);
      S* oref = c.oracle_ref.data() + off + i * Tk;
      for (Index j = 0; j < Tk; ++j) {
        const S o = orc[j];
        const bool hj = !std::isnan(o) && km[j];
        const S aj = std::isnan(o) ? S(0) : (o < 0 ? S(0) : (o > amax ? amax : o));
        has[static_cast<std::size_t>(j)] = hj ? S(1) : S(0);
        a[static_cast<std::size_t>(j)] = aj;
        oref[j] = hj ? aj : std::numeric_limits<S>::quiet_NaN();
        const S a_eff = hj ? aj : det[j];
        amix[i * Tk + j] = gamma * a_eff + (S(1) - gamma) * det[j];
      }
      // gate loss of the row (reads the gate's own alpha-hat, never the frozen copy)
      std::int64_t tgt = -1;
      if (ctx.target_idx)
        tgt = (*ctx.target_idx)[target_per_head ? (b * H + h) * Tq + i : b * Tq + i];
      const Index t = detail::gate_loss_row<S>(
          Tk, c.e0n.data() + off + i * Tk, c.e1n.data() + off + i * Tk, ahat + i * Tk, a.data(), has.data(), mrow.data(),
          ctx.target_idx == nullptr, tgt, opt_.gate, sm, c.g_reg.data() + off + i * Tk, c.g_spot.data() + off + i * Tk,
          c.beta.data() + off + i * Tk, c.w.data() + off + i * Tk, c.d_b.data() + off + i * Tk);
      c.target[static_cast<std::size_t>(bh * Tq + i)] = t;
    }
    // 7.-9. scores and masked softmax (no extra 1/sqrt(d): E~ is unit scale)
    MatMap<S> Sc(c.scores.data() + off, Tq, Tk);
    ConstMatMap<S> AM(amix, Tq, Tk);
    Sc = (S(1) - AM.array()).matrix().cwiseProduct(E0) + AM.cwiseProduct(E1);
    MatMap<S> P(c.attn.data() + off, Tq, Tk);
    ops::masked_softmax_rows<S>(Sc, km, P, ws.take(ops::masked_softmax_scratch<S>(Tq, Tk)));  // vectorised per row
    // 10. dropout on the probabilities, then ctx_h = P V_h
    if (dropout_on) {
      // counter-based mask of the cell's flat index (detail::dropout_uniform): the tiled kernel draws the same
      MatMap<S> Dm(c.drop.data() + off, Tq, Tk);
      ops::counter_dropout_mask(Dm.data(), Tq * Tk, drop_seed, static_cast<std::uint64_t>(off),
                                static_cast<double>(opt_.dropout));
      if constexpr (DHead == 1)  // a matrix-vector product: Eigen's gemv needs a plain left operand
        c.ctx.block(b * Tq, h * Dh, Tq, Dh).noalias() = P.cwiseProduct(Dm).lazyProduct(Vh);
      else
        c.ctx.block(b * Tq, h * Dh, Tq, Dh).noalias() = P.cwiseProduct(Dm) * Vh;
    } else {
      c.ctx.block(b * Tq, h * Dh, Tq, Dh).noalias() = P * Vh;
    }
  }, par);

  if (has_oracle) finish_gate_loss(c, c.sums);

  output_projection(c, y);  // 11.
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::backward_impl(const Mat<S>& dy, Cache& c, InputGrads* g, Mat<S>* dx) {
  check(c.B > 0, "DualExpertAttention::backward: the cache holds no forward pass");
  check_matrix(dy, c.B * c.Tq, D_, "DualExpertAttention::backward: dy");
  const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = H_, Dh = Dh_;
  const S inv_sqrt = S(1) / std::sqrt(S(Dh));
  const S inv_dh = S(1) / S(Dh);

  // output projection: y = ctx W_o^T + b_o
  Mat<S> dctx;
  if (opt_.out_proj)
    ops::linear_backward<S>(dy, c.ctx, weight_[3].mat(), weight_[3].grad_mat(), opt_.bias ? bias_[3].grad.data() : nullptr,
                            &dctx);
  else
    dctx = dy;

  Mat<S> dQ(B * Tq, D_), dK(B * Tk, D_), dV(B * Tk, D_);
  Vec<S> dwrel_part(B * H * Dh * Dh);  // not zeroed here: both kernels write every element (in parallel)

  if (c.kernel == DeaKernel::tiled)
    tiled_backward_core(dctx, c, dQ, dK, dV, dwrel_part);
  else
  parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H;
    const Index off = bh * Tq * Tk;
    const HeadMat Qh = c.Q.block(b * Tq, h * Dh, Tq, Dh);
    const HeadMat Kh = c.K.block(b * Tk, h * Dh, Tk, Dh);
    const HeadMat Vh = c.V.block(b * Tk, h * Dh, Tk, Dh);
    const HeadMat Rh = c.R.block(b * Tq, h * Dh, Tq, Dh);
    const HeadMat dctx_h = dctx.block(b * Tq, h * Dh, Tq, Dh);
    ConstMatMap<S> P(c.attn.data() + off, Tq, Tk);
    const S* drop = c.dropout_on ? c.drop.data() + off : nullptr;

    // ctx_h = Pd V_h, Pd = P .* drop
    Mat<S> dP = dctx_h * Vh.transpose();                       // ctx = Pd V  ->  dPd = dctx V^T
    if (drop) {
      ConstMatMap<S> Dm(drop, Tq, Tk);
      const Mat<S> Pd = P.cwiseProduct(Dm);
      dV.block(b * Tk, h * Dh, Tk, Dh).noalias() = Pd.transpose() * dctx_h;  // ctx = Pd V  ->  dV = Pd^T dctx
      dP = dP.cwiseProduct(Dm);                                // Pd = P .* drop  ->  dP = dPd .* drop
    } else {
      dV.block(b * Tk, h * Dh, Tk, Dh).noalias() = P.transpose() * dctx_h;
    }
    // P = softmax(S) over real keys
    Mat<S> dS(Tq, Tk);
    ops::softmax_rows_backward<S>(P, dP, dS);
    // S = (1 - alpha_mix) E0~ + alpha_mix E1~, alpha_mix constant
    ConstMatMap<S> AM(c.alpha_mix.data() + off, Tq, Tk);
    Mat<S> g0 = (S(1) - AM.array()).matrix().cwiseProduct(dS);
    Mat<S> g1 = AM.cwiseProduct(dS);
    // E~ = norm(E) per row over the real keys
    const Eigen::Array<S, 1, Eigen::Dynamic> mrow =
        Eigen::Map<const Eigen::Array<std::uint8_t, 1, Eigen::Dynamic>>(c.km.data() + b * Tk, Tk).template cast<S>();
    const Index row0 = bh * Tq;
    const S n = c.n_real[static_cast<std::size_t>(b)];
    norm_backward(g0, c.e0n.data() + off, c.sigma0.data() + row0, c.floor0.data() + row0, n, mrow);
    norm_backward(g1, c.e1n.data() + off, c.sigma1.data() + row0, c.floor1.data() + row0, n, mrow);
    // E1 = min(0, E1raw): no gradient where the clamp was active
    Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>(g1.data(), Tq * Tk) *=
        S(1) - Eigen::Map<const Eigen::Array<std::uint8_t, Eigen::Dynamic, 1>>(c.e1_clamped.data() + off, Tq * Tk)
                   .template cast<S>();
    // E1raw_ij = -(|R_i|^2 + |K_j|^2 - 2 R_i.K_j) / Dh
    //   dR_i = -(2/Dh) (sum_j g1_ij R_i - sum_j g1_ij K_j),  dK_j = -(2/Dh) (sum_i g1_ij K_j - sum_i g1_ij R_i)
    const Eigen::Matrix<S, Eigen::Dynamic, 1> rs = g1.rowwise().sum();
    const Eigen::Matrix<S, 1, Eigen::Dynamic> cs = g1.colwise().sum();
    HeadMat dR = -S(2) * inv_dh * (rs.asDiagonal() * Rh - g1 * Kh);
    HeadMat dKh = -S(2) * inv_dh * (cs.transpose().asDiagonal() * Kh - g1.transpose() * Rh);
    // E0_ij = Q_i.K_j / sqrt(Dh)
    dKh.noalias() += inv_sqrt * (g0.transpose() * Qh);           // dK = g0^T Q / sqrt(Dh)
    // R = Q W_rel^T  ->  dQ = dR W_rel, dW_rel = dR^T Q
    Eigen::Map<const RelMat> Wr(W_rel_.value.data() + h * Dh * Dh, Dh, Dh);
    HeadMat dQh = inv_sqrt * (g0 * Kh);                           // dQ = g0 K / sqrt(Dh)
    dQh.noalias() += dR * Wr;
    Eigen::Map<RelMat>(dwrel_part.data() + bh * Dh * Dh, Dh, Dh).noalias() = dR.transpose() * Qh;
    dQ.block(b * Tq, h * Dh, Tq, Dh) = dQh;
    dK.block(b * Tk, h * Dh, Tk, Dh) = dKh;
  }, double(B * H) * double(Tq) * double(Tk) * double(8 * Dh + 20) > kParallelMinFlops);

  // W_rel gradient: per-pair partials summed in the fixed order b = 0..B-1
  parallel_for(H, [&](Index h) {
    Eigen::Map<Vec<S>> g(W_rel_.grad.data() + h * Dh * Dh, Dh * Dh);
    for (Index b = 0; b < B; ++b) g += Eigen::Map<const Vec<S>>(dwrel_part.data() + (b * H + h) * Dh * Dh, Dh * Dh);
  }, double(B * H) * double(Dh * Dh) > kParallelMinFlops);

  // projections: Q = q_in W_q^T + b_q, etc. Self-attention (dx): dx = dQ W_q, then dx += dK W_k and dx += dV W_v
  // in place, which is (dQ W_q + dK W_k) + dV W_v without two [B*T, D] temporaries and their passes.
  const Mat<S>& kin = c.self ? c.q_in : c.k_in;
  const Mat<S>& vin = c.self ? c.q_in : c.v_in;
  ops::linear_backward<S>(dQ, c.q_in, weight_[0].mat(), weight_[0].grad_mat(), opt_.bias ? bias_[0].grad.data() : nullptr,
                          dx ? dx : &g->dq);
  ops::linear_backward<S>(dK, kin, weight_[1].mat(), weight_[1].grad_mat(), opt_.bias ? bias_[1].grad.data() : nullptr,
                          dx ? dx : &g->dk, dx != nullptr);
  ops::linear_backward<S>(dV, vin, weight_[2].mat(), weight_[2].grad_mat(), opt_.bias ? bias_[2].grad.data() : nullptr,
                          dx ? dx : &g->dv, dx != nullptr);
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::backward_gate(Cache& c, S scale) {
  if (!c.has_oracle) return;
  const Index B = c.B, Tq = c.Tq, Tk = c.Tk, H = H_, Dh = Dh_;
  const Index G = 2 * Dh + 2;
  if (c.kernel == DeaKernel::tiled) {
    // d loss_gate / d logit = (g_reg / n_labelled + g_spot / n_valid) * dalpha_hat/dlogit, so the gradient of a
    // gate weight is inv_has * (sum of g_reg dalpha/dlogit x feature) + inv_valid * (the same with g_spot): forward
    // summed both per (b, h) (gate_part); here they are scaled by the totals and added in the fixed order h, b.
    for (Index h = 0; h < H; ++h)
      for (Index b = 0; b < B; ++b) {
        const S* p = c.gate_part.data() + (b * H + h) * 2 * (G + 1);
        for (Index g = 0; g < G; ++g) W_gate_.grad[h * G + g] += scale * (c.inv_has * p[g] + c.inv_valid * p[G + 1 + g]);
        c_gate_.grad[h] += scale * (c.inv_has * p[G] + c.inv_valid * p[2 * G + 1]);
      }
    return;
  }
  AlignedVec<S> part(static_cast<std::size_t>(B * H * (G + 1)), S(0));
  parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H;
    const Index off = bh * Tq * Tk;
    ConstMatMap<S> dl(c.dlogit_gate.data() + off, Tq, Tk);
    ConstMatMap<S> E0(c.e0n.data() + off, Tq, Tk);
    ConstMatMap<S> E1(c.e1n.data() + off, Tq, Tk);
    S* p = part.data() + bh * (G + 1);
    // logit_ij = Q_i.w_q + K_j.w_k + w_E0 E0~_ij + w_E1 E1~_ij + c
    const Eigen::Matrix<S, Eigen::Dynamic, 1> rsum = dl.rowwise().sum();
    const Eigen::Matrix<S, 1, Eigen::Dynamic> csum = dl.colwise().sum();
    Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>(p, Dh).noalias() =
        rsum.transpose() * c.Q.block(b * Tq, h * Dh, Tq, Dh);     // dw_q = sum_i (sum_j dl_ij) Q_i
    Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>(p + Dh, Dh).noalias() =
        csum * c.K.block(b * Tk, h * Dh, Tk, Dh);                  // dw_k = sum_j (sum_i dl_ij) K_j
    p[2 * Dh] = dl.cwiseProduct(E0).sum();                         // dw_E0 = sum dl E0~
    p[2 * Dh + 1] = dl.cwiseProduct(E1).sum();                     // dw_E1 = sum dl E1~
    p[G] = rsum.sum();                                             // dc = sum dl
  }, double(B * H) * double(Tq) * double(Tk + 2 * Dh) * 4 > kParallelMinFlops);
  for (Index h = 0; h < H; ++h)
    for (Index b = 0; b < B; ++b) {
      const S* p = part.data() + (b * H + h) * (G + 1);
      for (Index g = 0; g < G; ++g) W_gate_.grad[h * G + g] += scale * p[g];
      c_gate_.grad[h] += scale * p[G];
    }
}

template <class S, int Heads, int DHead>
void DualExpertAttention<S, Heads, DHead>::reset_parameters(Rng& rng) {
  for (int p = 0; p < 4; ++p) {
    init::xavier_uniform(weight_[p].mat(), rng, D_, D_);
    bias_[p].value.setZero();
  }
  for (Index h = 0; h < H_; ++h)
    Eigen::Map<Mat<S>>(W_rel_.value.data() + h * Dh_ * Dh_, Dh_, Dh_) = init::orthogonal<S>(Dh_, rng);
  for (Index h = 0; h < H_; ++h) init::xavier_uniform(W_gate_.mat().row(h), rng, 2 * Dh_ + 2, 1);
  c_gate_.value.setConstant(S(DeaConstants::c_gate_init));
}

template <class S, int Heads, int DHead>
auto DualExpertAttention<S, Heads, DHead>::verify_gradient_isolation(const Mat<S>& x, Index batch,
                                                                    const AttnContext<S>& ctx) -> IsolationReport {
  IsolationReport r;
  Cache cache;
  zero_grad();
  const Mat<S> y = forward(x, batch, ctx, cache);
  backward(S(2) / S(y.size()) * y, cache);  // d mean(y^2) / dy
  for (Param<S>* p : parameters()) {
    const double s = static_cast<double>(p->grad.cwiseAbs().sum());
    if (p->group == "gate") r.task_gate_grad += s;
    if (p == &W_rel_) r.task_rel_grad += s;
  }
  zero_grad();
  backward_gate(cache);
  for (Param<S>* p : parameters()) {
    const double s = static_cast<double>(p->grad.cwiseAbs().sum());
    (p->group == "gate" ? r.gate_gate_grad : r.gate_main_grad) += s;
  }
  zero_grad();
  r.ok = r.task_gate_grad == 0 && r.task_rel_grad > 0 && r.gate_main_grad == 0 && r.gate_gate_grad > 0;
  return r;
}

// The project's own programs and tests compile these instances once (cmake/instances.cmake) and define
// DEA_EXTERN_TEMPLATES; everyone else instantiates on use, as with any template. Besides the two dynamic-size
// ones, the tests share three compile-time shapes: each costs g++ over a minute and a half to instantiate.
#ifdef DEA_EXTERN_TEMPLATES
extern template class DualExpertAttention<float>;
extern template class DualExpertAttention<double>;
extern template class DualExpertAttention<float, 2, 8>;
extern template class DualExpertAttention<double, 2, 4>;
extern template class DualExpertAttention<double, 2, 1>;
#endif

}  // namespace dea
