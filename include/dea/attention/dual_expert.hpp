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
// This file is the layer's interface; the maths of the [Tq, Tk] core is written once, in
// dual_expert/row_block.hpp, and run by the two kernels of dual_expert/kernel.hpp (DeaKernel). The member
// functions are defined in dual_expert/layer_impl.hpp.
//
// Contract:
//  - Layout: activations are row-major [B*T, D] (row b*T + t); head h owns feature columns [h*Dh, (h+1)*Dh).
//    The cache's [B, H, Tq, Tk] maps are flat buffers; the (b, h) slice starts at ((b*H + h)*Tq)*Tk.
//  - forward validates every argument first (a dea::Error naming it); nothing later throws.
//  - Gradient isolation is structural: backward() (the task path) never writes W_gate / c_gate, because the
//    scores read alpha_hat as a constant; backward_gate() (the gate loss) writes only W_gate / c_gate, because
//    the gate reads Q, K, E0~, E1~ as constants. verify_gradient_isolation() proves it on a batch.
//  - Gradients are added into Param::grad (call zero_grad first). Results are bitwise identical for any thread
//    count; once a forward has run with given shapes, an inference forward (no oracle, no dropout) with the same
//    shapes, cache, inputs object and output allocates nothing.
//  - Causal masking (AttnInputs::set_causal, Tq == Tk): query i sees keys j <= i (and of those the real ones).
//    Everything taken "over the real keys" is then taken over the keys the query may see: the per-query
//    normalisation, the softmax, the gate loss (an oracle label or a target on an invisible cell is ignored, as on
//    a padded key). Both kernels run it; every map holds 0 at an invisible cell (beta / w / d_b / oracle_ref NaN),
//    and invisible cells add nothing to any value or gradient. Query 0 sees one key: its E~ is 0 (std 0), never
//    NaN. forward_decode runs new positions against cached keys (incremental decoding, docs/dea_causal.md).
//  - RoPE (Options::rope_theta > 0, docs/dea_causal.md): query row i and key row j are positions i and j (Tq == Tk;
//    forward_decode: cache.length() + r). With rho_p the rotate-half rotation of position p (ops/rope.hpp), both
//    experts read rotated vectors, E0 = (rho_i q).(rho_j k) / sqrt(Dh) and E1 = min(0, -|rho_i W_rel q - rho_j k|^2
//    / Dh): each depends on the positions through j - i only. The gate reads the unrotated q and k. Both kernels
//    and forward_decode run it; rope_theta = 0 (the default) is the layer without it, to the bit.
//  - Mixed precision (ScopedPrecision(Precision::bf16), core/parallel.hpp): the V and output projections and every
//    backward product of the projections follow the product precision. The experts' own products (q.k, W_rel q,
//    P V; ops/block_product.hpp) stay fp32, and so does the gate, inputs included: the Q and K projections it reads
//    are fp32 products whatever the precision, and its logit terms q.w_q, k.w_k, the w_k partials and its gradients
//    are plain float loops (row_block.hpp, kernel.hpp gate_grads), as are the per-query normalisation, the mixing,
//    the softmax and the gate loss.
#pragma once

#include "../core/param.hpp"
#include "../core/init.hpp"
#include "../core/rng.hpp"
#include "dual_expert/kernel.hpp"
#include "gate_loss.hpp"
#include "gate_stats.hpp"
#include "inputs.hpp"

namespace dea {

template <class S, int Heads = Dynamic, int DHead = Dynamic>
class DualExpertAttention {
  static_assert(std::is_floating_point<S>::value, "DualExpertAttention: Scalar must be float or double");
  static_assert(Heads == Dynamic || Heads > 0, "Heads must be positive or Eigen::Dynamic");
  static_assert(DHead == Dynamic || DHead > 0, "DHead must be positive or Eigen::Dynamic");

public:
  using Scalar = S;

  struct Options {
    S dropout = 0;           ///< attention-probability dropout (training only, inverted scaling)
    bool bias = true;        ///< biases on the four projections
    bool out_proj = true;    ///< false: the output is the concatenated heads (no W_o), as in the BERT adapter
    GateLossParams<S> gate;  ///< lambda_s, tau_s, tau_d, lambda_d
    DeaKernel kernel = DeaKernel::reference;  ///< the [Tq, Tk] kernel (DeaKernel)
    /// Queries per block (0 = automatic: the block's seven [block_q, Tk] buffers in about 4 MiB, between 32 and 64
    /// rows). The block boundaries depend only on this and Tq, never on the thread count.
    Index block_q = 0;
    /// Rotary position embedding of the experts' queries and keys, theta of ops::RopeTable (frequencies
    /// theta^(-2m/Dh)); 0 = none (the default). Needs an even head width d_model / n_heads, and Tq == Tk
    /// (self-attention, or cross-attention whose query and key rows are the same positions).
    double rope_theta = 0;
  };
  /// The cache of a forward (dual_expert/kernel.hpp): the reference kernel's maps (e0n, e1n, logit, alpha_hat,
  /// alpha_mix, scores, attn, drop, e1_clamped, dlogit_gate, beta, w, d_b, g_reg, g_spot, oracle_ref), the tiled
  /// kernel's row statistics, and what both keep (Q, K, V, R, ctx, sigma0/1, floor0/1, loss_gate, stats, target).
  using Cache = detail::dex::Cache<S>;
  /// Gradients of the three inputs of cross-attention.
  struct InputGrads {
    Mat<S> dq, dk, dv;
  };
  /// What this class accepts of AttnInputs: all of it (causal masking included).
  static constexpr AttnSupport kSupport{/*oracle*/ true, /*causal*/ true, /*frozen_alpha_hat*/ true, /*keep_maps*/ true};

  /// The state of incremental causal decoding (forward_decode): the projected keys and values (K = x W_k^T + b_k,
  /// V = x W_v^T + b_v, bias included) of the positions decoded so far, for B sequences. The gate's key pieces
  /// (K_j.w_k, |K_j|^2) are formed from K. With RoPE, K holds the rotated keys rho_j K_j and Kw the gate's key terms
  /// K_j.w_k of the unrotated ones. Every key is real (no key mask). Storage grows by doubling.
  struct DecodeCache {
    explicit DecodeCache(Index batch = 1) : B(batch) {
      check(batch > 0, "DualExpertAttention::DecodeCache: batch must be positive, got ", batch);
    }
    /// Forgets the cached positions (the storage is kept; the next call may come from another layer).
    void clear() { len = 0; }
    Index batch() const { return B; }
    /// Positions cached per sequence.
    Index length() const { return len; }

    Index B = 1, len = 0, cap = 0;  ///< sequences, cached positions, rows of storage per sequence
    Mat<S> K, V;                    ///< [B*cap, D]: position t of sequence b at row b*cap + t
    double rope_theta = 0;          ///< the rope_theta of the layer that filled it
    AlignedVec<S> Kw;               ///< RoPE: K_j.w_k of head h's unrotated key, [B, H, cap]
    ops::RopeTable<S> rope;         ///< RoPE: the table of positions [0, len)
    // scratch of a call, kept between calls
    Mat<S> Q, Kn, Vn, R, ctx;
    AlignedVec<S> scratch;
  };

  /// d_model = n_heads * Dh; the compile-time Heads / DHead (when not Dynamic) must match.
  DualExpertAttention(Index d_model, Index n_heads, Rng& rng, Options opt = {});
  /// The reference's initialisation: Xavier-uniform projections with zero bias, an orthogonal W_rel per head,
  /// Xavier-uniform W_gate rows (fan_in 2Dh+2, fan_out 1), c_gate = -0.5.
  void reset_parameters(Rng& rng);

  Index d_model() const { return D_; }
  Index n_heads() const { return H_; }
  Index d_head() const { return Dh_; }
  const Options& options() const { return opt_; }
  /// Parameters under the reference's state_dict names, in its order (W_o only with out_proj, biases with bias).
  ParamList<S> parameters();
  void zero_grad() { dea::zero_grad(parameters()); }
  Param<S>& W_rel() { return W_rel_; }
  Param<S>& W_gate() { return W_gate_; }
  Param<S>& c_gate() { return c_gate_; }

  /// Self-attention on x [B*T, D] (B = in.batch()): the output [B*T, D], or into y (resized only when its shape
  /// differs).
  Mat<S> forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache);
  void forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache, Mat<S>& y);
  /// Cross-attention: q_in [B*Tq, D], k_in and v_in [B*Tk, D]; the output [B*Tq, D], or into y.
  Mat<S> forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, const AttnInputs<S>& in, Cache& cache);
  void forward(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, const AttnInputs<S>& in, Cache& cache,
               Mat<S>& y);

  /// Incremental causal decoding (inference: no oracle, no dropout, no key mask): x_new [B*Tn, D] holds Tn new
  /// positions of each of the cache's B sequences (row b*Tn + r). Position r of the call is position
  /// cache.length() + r of its sequence and sees every cached key and the new ones up to itself, exactly as row
  /// cache.length() + r of a causal forward over the whole sequence (with RoPE: rotated at that position). Appends
  /// the new keys and values to the cache and returns the output [B*Tn, D]. Cost per new position: O(T D)
  /// (T = positions seen), no [T, T] map.
  Mat<S> forward_decode(const Mat<S>& x_new, DecodeCache& cache) const;

  /// Task backward of a self-attention forward: adds into the gradients of W_q, W_k, W_v, W_o and W_rel (never
  /// W_gate / c_gate) and returns dL/dx.
  Mat<S> backward(const Mat<S>& dy, Cache& cache);
  /// Task backward returning the three input gradients (for cross-attention; for self-attention their sum is
  /// backward's dx, to the bit when D <= 512).
  InputGrads backward_inputs(const Mat<S>& dy, Cache& cache);
  /// Gate-loss backward: adds scale * d loss_gate / d(W_gate, c_gate) into their gradients and nothing else.
  /// (No-op when the forward had no oracle: the gate loss was the constant 0.)
  void backward_gate(Cache& cache, S scale = S(1));

  /// Gradient isolation check (the reference's verify_gradient_isolation): one forward on x with the given inputs
  /// (which should carry an oracle); backward of a task stand-in (mean of output^2) must leave W_gate and c_gate
  /// exactly zero and move W_rel; backward of the gate loss alone must leave every other parameter exactly zero
  /// and move W_gate. The layer's gradients are cleared before and after.
  struct IsolationReport {
    double task_gate_grad = 0;   ///< sum |grad| of W_gate, c_gate after the task backward (must be 0)
    double task_rel_grad = 0;    ///< sum |grad| of W_rel after the task backward (> 0)
    double gate_main_grad = 0;   ///< sum |grad| of every main-group parameter after the gate backward (must be 0)
    double gate_gate_grad = 0;   ///< sum |grad| of W_gate, c_gate after the gate backward (> 0)
    bool ok = false;
  };
  IsolationReport verify_gradient_isolation(const Mat<S>& x, const AttnInputs<S>& in);

private:
  void forward_impl(const Mat<S>& q_in, const Mat<S>& k_in, const Mat<S>& v_in, const AttnInputs<S>& in, Cache& c,
                    bool self, Mat<S>& y);
  void backward_impl(const Mat<S>& dy, Cache& c, InputGrads* g, Mat<S>* dx);
  detail::dex::LayerView<S> view() const;

  Index D_, H_, Dh_ = 0;
  Options opt_;
  Param<S> weight_[4], bias_[4];
  Param<S> W_rel_, W_gate_, c_gate_;
};

}  // namespace dea

#include "dual_expert/layer_impl.hpp"

namespace dea {
// The project's own programs and tests compile these instances once (cmake/instances.cmake) and define
// DEA_EXTERN_TEMPLATES; everyone else instantiates on use, as with any template.
#ifdef DEA_EXTERN_TEMPLATES
extern template class DualExpertAttention<float>;
extern template class DualExpertAttention<double>;
#endif
}  // namespace dea
