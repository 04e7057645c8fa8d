// dea/attention/token_routed.hpp: token-routed multi-head attention adapters (tr_mha = v1, tr_mha_v2 = v2).
//
// A re-implementation, with a hand-derived backward pass, of the attention modules `TokenRoutedMultiHeadAttention`
// (v1) and `TokenRoutedMultiHeadAttentionV2` (v2) of the public complexity-framework (commit 17371ce5,
// complexity/core/attention/token_routed_mha*.py). Its rules, with the derivation of the backward pass, are
// stated in docs/token_routed.md.
//
// The layer is a full causal MHA (no biases, per-head qk RMSNorm with gains shared by the heads, rotate-half RoPE)
// whose Q and/or V projections receive a token-routed low-rank residual:
//
//   K = x W_k^T,  Q = x W_q^T,  V = x W_v^T                                   x [N, D], N = B*T rows (b*T + t)
//   p = (t + l) mod E,  s = (p + 1) mod E                                     t = token id, l = layer index
//   prior_e = c_o + (c_p - c_o)[e = p] + (c_s - c_o)[e = s]
//   c = (x W_r^T) / tau,  g = sigmoid(x w_g^T + b_g),  z = prior + g c        [N, E], [N], [N, E]
//   v1: idx = top-k of z (descending; ties -> lower expert first);  v2: idx = (p, s)
//   w = softmax(z[idx])                                                        [N, k]
//   Delta = sum_j w_j (x A_{idx_j}) B_{idx_j}                                  low-rank expert maps, rank r
//   Q' = Q + alpha Delta^Q,  V' = V + alpha Delta^V                            (targeted projections only)
//   per head: RMSNorm(Q'), RMSNorm(K) (eps 1e-6, gains [d_h]) -> RoPE -> causal softmax(Q K^T / sqrt(d_h)) V'
//   y = O W_o^T
//
// v1 adapts Q and V with separate adapters (q_adapter_*, v_adapter_*) over the top-k of z, which may include
// non-candidate experts. v2 always uses the two candidates (p, s), evaluates only them, shares one down map
// across its targets (q | v | qv) and starts with a zero up map, so at construction its output is bitwise the
// plain MHA output (forward_plain).
//
// Token ids are an extra argument of forward (Tensor<int64_t> [B, T]); the ids -> (p, s) path, the top-k choice and
// the telemetry distribution P = softmax(z) carry no gradient (docs/token_routed.md).
//
// Parallel work: the routing and adapters run over tokens, the attention core over (b, h) pairs; every shared
// parameter gradient is reduced in a fixed order (per-pair or per-expert partials, ops::gemm), so results are
// bitwise identical for any thread count.
#pragma once

#include "../core/init.hpp"
#include "../core/param.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/attention_core.hpp"
#include "../ops/gemm.hpp"
#include "../ops/linear.hpp"
#include "../ops/rms_norm.hpp"
#include "../ops/rope.hpp"
#include "../ops/softmax.hpp"
#include "inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace dea {

/// Which reference module: v1 = `tr_mha` (TokenRoutedMultiHeadAttention), v2 = `tr_mha_v2`.
enum class TrVariant { v1, v2 };

/// Projections the v2 adapter writes to (`tr_mha_targets`); v1 ignores it and always adapts Q and V.
enum class TrTargets { q, v, qv };

inline const char* to_string(TrVariant v) { return v == TrVariant::v1 ? "tr_mha" : "tr_mha_v2"; }
inline const char* to_string(TrTargets t) { return t == TrTargets::q ? "q" : t == TrTargets::v ? "v" : "qv"; }

/// "v1" / "tr_mha" / "token_routed_mha" -> v1; "v2" / "tr_mha_v2" / "token_routed_mha_v2" -> v2.
inline TrVariant parse_tr_variant(const std::string& s) {
  if (s == "v1" || s == "tr_mha" || s == "token_routed_mha") return TrVariant::v1;
  if (s == "v2" || s == "tr_mha_v2" || s == "token_routed_mha_v2") return TrVariant::v2;
  detail::raise("tr_mha variant: expected one of v1, v2, tr_mha, tr_mha_v2, token_routed_mha, "
                "token_routed_mha_v2, got '" + s + "'");
}

/// "q", "v" or "qv".
inline TrTargets parse_tr_targets(const std::string& s) {
  if (s == "q") return TrTargets::q;
  if (s == "v") return TrTargets::v;
  if (s == "qv") return TrTargets::qv;
  detail::raise("tr_mha targets: expected one of q, v, qv, got '" + s + "'");
}

/// Construction options, named after the reference's config fields, with the same defaults.
struct TokenRoutedOptions {
  TrVariant variant = TrVariant::v1;
  Index num_experts = 4;              ///< E (tr_mha_num_experts), > 0
  Index adapter_rank = 8;             ///< r (tr_mha_adapter_rank), > 0
  Index top_k = 2;                    ///< k (tr_mha_top_k), 1 <= k <= E; v2 requires exactly 2
  double adapter_gate_init = 0.1;     ///< initial alpha (tr_mha_adapter_gate_init); v2 needs it non-zero to learn
  double id_primary_logit = 2.0;      ///< c_p
  double id_secondary_logit = 1.0;    ///< c_s
  double id_other_logit = -2.0;       ///< c_o
  double verifier_gate_init = 0.1;    ///< sigmoid(b_g) at init, strictly in (0, 1)
  double verifier_temperature = 1.0;  ///< tau > 0, divides the context score only
  TrTargets targets = TrTargets::qv;  ///< v2 only
  Index layer_idx = 0;                ///< l: cyclic shift of the candidates
  Index num_layers = 1;               ///< L of the host model, for the o_proj init std 0.02 / sqrt(2 L)
  double initializer_range = 0.02;    ///< std of the q/k/v projections (o_proj: / sqrt(2 L))
  bool use_qk_norm = true;            ///< per-head RMSNorm of Q' and K with gains [d_h] shared by the heads
  double qk_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool causal = true;                 ///< the reference is always causal (AttnInputs::causal also turns it on)
  /// When > 0, token ids must lie in [0, vocab_size) (dea::Error otherwise). When 0, any id is accepted and
  /// mapped by floor modulo, as the reference does (negative ids included).
  std::int64_t vocab_size = 0;
};

/// Telemetry of the last routed forward call, in double (docs/token_routed.md).
struct TokenRoutedTelemetry {
  double gate = 0;               ///< tr_mha_gate: alpha
  double verifier_strength = 0;  ///< tr_mha_verifier_strength: sigmoid(b_g)
  double verifier_use = 0;       ///< tr_mha_verifier_use: mean_n g_n
  double route_entropy = 0;      ///< tr_mha_route_entropy: mean_n -sum_e P_e ln(max(P_e, 1e-9))
  std::vector<double> route_share;  ///< tr_mha_route_{e}: mean_n of the dense route weight of expert e

  /// (key, value) pairs under the reference's telemetry names.
  std::vector<std::pair<std::string, double>> items() const {
    std::vector<std::pair<std::string, double>> out = {{"tr_mha_gate", gate},
                                                        {"tr_mha_verifier_strength", verifier_strength},
                                                        {"tr_mha_verifier_use", verifier_use},
                                                        {"tr_mha_route_entropy", route_entropy}};
    for (std::size_t e = 0; e < route_share.size(); ++e)
      out.emplace_back("tr_mha_route_" + std::to_string(e), route_share[e]);
    return out;
  }
};

/// Token-routed multi-head attention (tr_mha / tr_mha_v2). `Heads` and `DHead` may be compile-time sizes or
/// dea::Dynamic; DHead must be even (rotate-half RoPE).
template <class S, int Heads = Dynamic, int DHead = Dynamic>
class TokenRoutedAttention {
  static_assert(Heads == Dynamic || Heads > 0, "Heads must be positive or Dynamic");
  static_assert(DHead == Dynamic || (DHead > 0 && DHead % 2 == 0), "DHead must be positive and even, or Dynamic");

public:
  using Scalar = S;
  using Options = TokenRoutedOptions;
  using Telemetry = TokenRoutedTelemetry;
  using IndexMat = Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// What forward saves for backward (and exposes for tests and telemetry). N = B*T, layout [N, D] as x.
  struct Cache {
    Index batch = 0, seq = 0;
    bool routed = false;         ///< false after forward_plain (no routing, no adapters)
    bool causal = false;         ///< the forward's causal masking (att is zero above its causal tiles)
    Mat<S> x;                    ///< [N, D] input
    Mat<S> q, k, v;              ///< [N, D] Q' = Q + alpha dQ, K, V' = V + alpha dV (before heads, norm, RoPE)
    Mat<S> delta;                ///< routed deltas before alpha: v1 [N, 2D] = (dQ | dV), v2 [N, T*D] = Delta
    Mat<S> qhat, khat;           ///< [N, D] per-head RMS-normalised Q', K (before gain and RoPE)
    Vec<S> q_rstd, k_rstd;       ///< [B, H, T] 1 / rms of each (row, head)
    Mat<S> qr, kr;               ///< [N, D] after qk-norm and RoPE
    AlignedVec<S> att;          ///< [B, H, T, T] attention probabilities
    Mat<S> o;                    ///< [N, D] merged head outputs (before o_proj)
    // routing and adapters
    IndexMat route_idx;          ///< [N, k] selected experts, slot order
    Mat<S> route_weights;        ///< [N, k] w
    Vec<S> gate;                 ///< [N] g
    Mat<S> context;              ///< [N, E] c = x W_r^T / tau
    Mat<S> joint_logits;         ///< [N, E] z
    Mat<S> route_probs;          ///< [N, E] P = softmax(z), telemetry only
    std::vector<Mat<S>> u;       ///< per adapter [N, k*r]: u_j = x A_{idx_j}
    Telemetry telemetry;
  };

  /// Keys and values of the positions seen so far, for incremental decoding (forward_cached; no backward).
  struct KVCache {
    Index batch = 0;
    Index length = 0;            ///< positions already cached
    std::vector<Mat<S>> k, v;    ///< per batch row: [length, D] K after norm and RoPE, V'
    void clear() { batch = length = 0; k.clear(); v.clear(); }
  };

  /// Builds the layer and draws its initial parameters (docs/token_routed.md). Throws dea::Error on a bad argument.
  TokenRoutedAttention(Index d_model, Index n_heads, Rng& rng, Options opt = {}) : opt_(opt), D_(d_model), H_(n_heads) {
    check(d_model > 0, "TokenRoutedAttention: d_model must be positive, got ", d_model);
    check(n_heads > 0, "TokenRoutedAttention: n_heads must be positive, got ", n_heads);
    check(Heads == Dynamic || n_heads == Heads, "TokenRoutedAttention: n_heads expected ", Heads,
          " (the Heads template argument), got ", n_heads);
    check(d_model % n_heads == 0, "TokenRoutedAttention: d_model (", d_model, ") must be divisible by n_heads (",
          n_heads, ")");
    dh_ = d_model / n_heads;
    check(DHead == Dynamic || dh_ == DHead, "TokenRoutedAttention: head dim d_model / n_heads expected ", DHead,
          " (the DHead template argument), got ", dh_);
    check(dh_ % 2 == 0, "TokenRoutedAttention: head dim d_model / n_heads must be even for rotate-half RoPE, got ",
          dh_);
    check(opt.num_experts > 0, "TokenRoutedAttention: num_experts must be > 0, got ", opt.num_experts);
    check(opt.adapter_rank > 0, "TokenRoutedAttention: adapter_rank must be > 0, got ", opt.adapter_rank);
    check(opt.top_k >= 1 && opt.top_k <= opt.num_experts, "TokenRoutedAttention: top_k must be in [1, num_experts = ",
          opt.num_experts, "], got ", opt.top_k);
    check(opt.variant == TrVariant::v1 || opt.top_k == 2, "TokenRoutedAttention: tr_mha_v2 requires top_k = 2, got ",
          opt.top_k);
    check(opt.verifier_gate_init > 0 && opt.verifier_gate_init < 1,
          "TokenRoutedAttention: verifier_gate_init must be strictly in (0, 1), got ", opt.verifier_gate_init);
    check(opt.verifier_temperature > 0, "TokenRoutedAttention: verifier_temperature must be > 0, got ",
          opt.verifier_temperature);
    check(opt.layer_idx >= 0, "TokenRoutedAttention: layer_idx must be >= 0, got ", opt.layer_idx);
    check(opt.num_layers >= 1, "TokenRoutedAttention: num_layers must be >= 1, got ", opt.num_layers);
    check(opt.qk_norm_eps > 0, "TokenRoutedAttention: qk_norm_eps must be > 0, got ", opt.qk_norm_eps);
    check(opt.rope_theta > 0, "TokenRoutedAttention: rope_theta must be > 0, got ", opt.rope_theta);
    check(opt.vocab_size >= 0, "TokenRoutedAttention: vocab_size must be >= 0 (0 = unchecked), got ", opt.vocab_size);
    check(std::isfinite(opt.adapter_gate_init) && std::isfinite(opt.id_primary_logit) &&
              std::isfinite(opt.id_secondary_logit) && std::isfinite(opt.id_other_logit),
          "TokenRoutedAttention: adapter_gate_init and the id logits must be finite");

    const Index D = D_, E = opt.num_experts, r = opt.adapter_rank;
    q_proj_ = Param<S>("q_proj.weight", "main", {D, D});
    k_proj_ = Param<S>("k_proj.weight", "main", {D, D});
    v_proj_ = Param<S>("v_proj.weight", "main", {D, D});
    o_proj_ = Param<S>("o_proj.weight", "main", {D, D});
    init::normal(q_proj_.mat(), rng, 0.0, opt.initializer_range);
    init::normal(k_proj_.mat(), rng, 0.0, opt.initializer_range);
    init::normal(v_proj_.mat(), rng, 0.0, opt.initializer_range);
    init::normal(o_proj_.mat(), rng, 0.0, opt.initializer_range / std::sqrt(2.0 * static_cast<double>(opt.num_layers)));
    if (opt.use_qk_norm) {
      q_norm_ = Param<S>("q_norm.weight", "main", {dh_});
      k_norm_ = Param<S>("k_norm.weight", "main", {dh_});
      q_norm_.value.setOnes();
      k_norm_.value.setOnes();
    }
    if (opt.variant == TrVariant::v1) {  // fixed std 0.02; reference draw order q_down, v_down, q_up, v_up
      down_[0] = Param<S>("q_adapter_down", "main", {E, D, r});
      up_[0] = Param<S>("q_adapter_up", "main", {E, r, D});
      down_[1] = Param<S>("v_adapter_down", "main", {E, D, r});
      up_[1] = Param<S>("v_adapter_up", "main", {E, r, D});
      init::normal(down_[0].value, rng, 0.0, 0.02);
      init::normal(down_[1].value, rng, 0.0, 0.02);
      init::normal(up_[0].value, rng, 0.0, 0.02);
      init::normal(up_[1].value, rng, 0.0, 0.02);
    } else {  // shared down map N(0, 0.02^2); up map zero -> exactly neutral at init
      down_[0] = Param<S>("qv_adapter_down", "main", {E, D, r});
      up_[0] = Param<S>("qv_adapter_up", "main", {E, r, n_targets() * D});
      init::normal(down_[0].value, rng, 0.0, 0.02);
    }
    router_ = Param<S>("context_router_weight", "main", {E, D});
    init::normal(router_.mat(), rng, 0.0, 0.002);
    vg_w_ = Param<S>("verifier_gate_weight", "main", {1, D});  // zeros
    vg_b_ = Param<S>("verifier_gate_bias", "main", {});
    const double p0 = std::min(std::max(opt.verifier_gate_init, 1e-6), 1.0 - 1e-6);
    vg_b_.value[0] = static_cast<S>(std::log(p0 / (1.0 - p0)));  // logit(verifier_gate_init)
    alpha_ = Param<S>("adapter_output_gate", "main", {});
    alpha_.value[0] = static_cast<S>(opt.adapter_gate_init);
    rope_ = ops::RopeTable<S>(dh_, opt.rope_theta);
  }

  // ---------------------------------------------------------------------------------------------------------
  // Introspection

  const Options& options() const { return opt_; }
  Index d_model() const { return D_; }
  Index n_heads() const { return H_; }
  Index head_dim() const { return dh_; }
  Index num_experts() const { return opt_.num_experts; }
  Index top_k() const { return opt_.top_k; }
  TrVariant variant() const { return opt_.variant; }
  /// The registry name: "tr_mha" or "tr_mha_v2".
  const char* attention_type() const { return to_string(opt_.variant); }
  /// Targets actually adapted: "qv" for v1 (it ignores Options::targets), Options::targets for v2.
  std::string route_targets() const { return opt_.variant == TrVariant::v1 ? "qv" : to_string(opt_.targets); }
  /// {"tr_mha_routing"} (v1); v2 adds "tr_mha_v2_routing" and "tr_mha_targets_<targets>".
  std::vector<std::string> capabilities() const {
    std::vector<std::string> c = {"tr_mha_routing"};
    if (opt_.variant == TrVariant::v2) {
      c.push_back("tr_mha_v2_routing");
      c.push_back(std::string("tr_mha_targets_") + to_string(opt_.targets));
    }
    return c;
  }
  /// Telemetry of the last routed forward call (forward or forward_cached).
  const Telemetry& telemetry() const { return telemetry_; }

  /// Every parameter under the reference's state_dict names, all in group "main".
  ParamList<S> parameters() {
    ParamList<S> l = {&q_proj_, &k_proj_, &v_proj_, &o_proj_};
    if (opt_.use_qk_norm) {
      l.push_back(&q_norm_);
      l.push_back(&k_norm_);
    }
    for (int a = 0; a < n_adapters(); ++a) {
      l.push_back(&down_[a]);
      l.push_back(&up_[a]);
    }
    l.push_back(&router_);
    l.push_back(&vg_w_);
    l.push_back(&vg_b_);
    l.push_back(&alpha_);
    return l;
  }

  void zero_grad() { dea::zero_grad(parameters()); }

  // ---------------------------------------------------------------------------------------------------------
  // Forward / backward

  /// What this class accepts of AttnInputs: a key mask, causal masking (always on with Options::causal, the
  /// reference's setting) and (always kept) its maps; no oracle, targets or frozen alpha-hat (Dual-Expert inputs).
  /// The training flag and rng are not used (the reference has no attention dropout). Self-attention only.
  static constexpr AttnSupport kSupport{/*oracle*/ false, /*causal*/ true, /*frozen_alpha_hat*/ false,
                                        /*keep_maps: the probabilities are always in the cache*/ true};

  /// Routed forward. x [B*T, D] (rows b*T + t, B = in.batch(), T = in.q_len()), token_ids [B, T] (or [B*T]) used
  /// for routing only. Reads the key mask of `in` (optional; the reference's fused causal path ignores a caller
  /// mask) and in.causal() (or-ed with Options::causal). Returns y [B*T, D] and fills `cache` for backward.
  Mat<S> forward(const Mat<S>& x, const Tensor<std::int64_t>& token_ids, const AttnInputs<S>& in, Cache& cache) {
    validate_input_(x, in);
    validate_ids_(token_ids, in.batch(), in.q_len());
    return forward_impl_(x, &token_ids, in, cache);
  }

  /// The same module's plain-MHA computation: the shared path with no routing and no adapter delta (the
  /// reference's MultiHeadAttention with these weights). Backward works on its cache too.
  Mat<S> forward_plain(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache) {
    validate_input_(x, in);
    return forward_impl_(x, nullptr, in, cache);
  }

  /// Backward of forward / forward_plain: dy [B*T, D]. ADDS into every parameter gradient, returns dx [B*T, D].
  Mat<S> backward(const Mat<S>& dy, Cache& cache);

  /// Incremental (KV-cached) inference, forward only: x holds the S new positions of every batch row
  /// ([B*S, D]), at absolute positions kv.length .. kv.length + S - 1; query i sees cached keys and new keys
  /// j <= i. Appends the new K (after norm and RoPE) and V' to kv. Updates telemetry() with the new tokens.
  Mat<S> forward_cached(const Mat<S>& x, Index batch, const Tensor<std::int64_t>& token_ids, KVCache& kv);

private:
  using HeadMat = ops::HeadMatrix<S, DHead>;
  /// Rows [row0, row0 + rows) of the head whose columns start at col0 (d_h wide; DHead when fixed).
  ops::HeadMap<S, DHead> hb(Mat<S>& m, Index row0, Index col0, Index rows) const {
    return ops::head_block<DHead>(m, row0, col0, rows, dh_);
  }
  ops::ConstHeadMap<S, DHead> hb(const Mat<S>& m, Index row0, Index col0, Index rows) const {
    return ops::head_block<DHead>(m, row0, col0, rows, dh_);
  }

  int n_adapters() const { return opt_.variant == TrVariant::v1 ? 2 : 1; }
  Index n_targets() const { return opt_.targets == TrTargets::qv ? 2 : 1; }

  /// The projections adapter a writes its output chunks (width D each) to, in chunk order: 0 = Q, 1 = V.
  struct Chunks {
    int n = 0;
    int target[2] = {0, 0};
    std::size_t size() const { return static_cast<std::size_t>(n); }
    int operator[](std::size_t i) const { return target[i]; }
  };
  Chunks chunk_targets_(int a) const {
    Chunks c;
    if (opt_.variant == TrVariant::v1) {  // q adapter -> Q, v adapter -> V
      c.n = 1;
      c.target[0] = a;
      return c;
    }
    switch (opt_.targets) {  // "qv": columns [0, D) -> Q, [D, 2D) -> V
      case TrTargets::q: c.n = 1; c.target[0] = 0; break;
      case TrTargets::v: c.n = 1; c.target[0] = 1; break;
      default: c.n = 2; c.target[0] = 0; c.target[1] = 1; break;
    }
    return c;
  }

  static std::int64_t floor_mod(std::int64_t a, std::int64_t m) {
    std::int64_t r = a % m;
    return r < 0 ? r + m : r;
  }

  static S sigmoid(S a) {
    if (a >= 0) return S(1) / (S(1) + std::exp(-a));
    const S e = std::exp(a);
    return e / (S(1) + e);
  }

  /// x [batch*T, D] with T >= 1, finite.
  void validate_x_(const Mat<S>& x, Index batch) const {
    check(batch > 0, "TokenRoutedAttention: batch must be positive, got ", batch);
    check(x.cols() == D_, "TokenRoutedAttention: x expected ", D_, " columns (d_model), got shape [", x.rows(), ", ",
          x.cols(), "]");
    check(x.rows() > 0 && x.rows() % batch == 0, "TokenRoutedAttention: x rows expected a positive multiple of batch = ",
          batch, " (B*T), got ", x.rows());
    check_finite(x, "TokenRoutedAttention: x");
  }

  /// The inputs fit this class (AttnInputs::require) and x is [B*T, D] for their B and T.
  void validate_input_(const Mat<S>& x, const AttnInputs<S>& in) const {
    check(in.batch() > 0, "TokenRoutedAttention::forward: the attention inputs are empty (build them with "
          "AttnInputs(batch, seq_len))");
    const Index B = in.batch(), T = in.q_len();
    check(in.k_len() == T, "TokenRoutedAttention::forward: self-attention needs as many keys as queries; the "
          "attention inputs have Tq = ", T, ", Tk = ", in.k_len());
    in.require(kSupport, H_, B, T, T, "TokenRoutedAttention");
    check(x.rows() == B * T, "TokenRoutedAttention: x: expected B*T = ", B * T, " rows (B = ", B, ", T = ", T,
          " of the attention inputs), got ", x.rows());
    validate_x_(x, B);
  }

  void validate_ids_(const Tensor<std::int64_t>& ids, Index batch, Index T) const {
    check(ids.shape == Shape{batch, T} || ids.shape == Shape{batch * T},
          "TokenRoutedAttention: token_ids expected shape [", batch, ", ", T, "] (or [", batch * T, "]), got ",
          shape_str(ids.shape));
    if (opt_.vocab_size > 0)
      for (Index n = 0; n < ids.numel(); ++n)
        check(ids[n] >= 0 && ids[n] < opt_.vocab_size, "TokenRoutedAttention: token_ids[", n, "] expected in [0, ",
              opt_.vocab_size, ") (vocab_size), got ", ids[n]);
  }

  Mat<S> forward_impl_(const Mat<S>& x, const Tensor<std::int64_t>* ids, const AttnInputs<S>& in, Cache& cache);

  /// K, Q', V' of x (with the routed deltas when ids is non-null) into cache.k/q/v, plus the routing state.
  /// Cached inference: one head's new query or key rows, RMS-normalised with `gain` (when use_qk_norm) and rotated
  /// from absolute position p0, in place.
  void norm_rotate_(HeadMat& z, const Param<S>& gain, Index p0) const {
    if (opt_.use_qk_norm) {
      HeadMat scratch(z.rows(), z.cols());
      Vec<S> rs(z.rows());
      ops::rms_norm_forward<S>(z, gain.value.data(), static_cast<S>(opt_.qk_norm_eps), z, scratch, rs.data());
    }
    ops::rope_forward(rope_, p0, z);
  }

  void project_(const Mat<S>& x, Index batch, const Tensor<std::int64_t>* ids, Cache& cache) {
    cache.x = x;
    cache.routed = ids != nullptr;
    ops::linear_forward<S>(x, k_proj_.mat(), nullptr, cache.k);  // K = x W_k^T
    ops::linear_forward<S>(x, q_proj_.mat(), nullptr, cache.q);  // Q = x W_q^T
    ops::linear_forward<S>(x, v_proj_.mat(), nullptr, cache.v);  // V = x W_v^T
    if (ids) {
      route_and_adapt_(*ids, cache);
    } else {  // plain path: no routing state
      cache.delta.resize(0, 0);
      cache.route_idx.resize(0, 0);
      cache.route_weights.resize(0, 0);
      cache.gate.resize(0);
      cache.context.resize(0, 0);
      cache.joint_logits.resize(0, 0);
      cache.route_probs.resize(0, 0);
      cache.u.clear();
      cache.telemetry = Telemetry();
    }
    (void)batch;
  }

  // Routing and adapters. Shapes: x [N, D], c, z, P [N, E], g [N], idx, w [N, k], u [N, k r].
  void route_and_adapt_(const Tensor<std::int64_t>& ids, Cache& cache) {
    const Mat<S>& x = cache.x;
    const Index N = x.rows(), D = D_, E = opt_.num_experts, k = opt_.top_k, r = opt_.adapter_rank;
    const S cp = static_cast<S>(opt_.id_primary_logit), cs = static_cast<S>(opt_.id_secondary_logit),
            co = static_cast<S>(opt_.id_other_logit), tau = static_cast<S>(opt_.verifier_temperature);
    const S alpha = alpha_.value[0], bg = vg_b_.value[0];

    ops::linear_forward<S>(x, router_.mat(), nullptr, cache.context);  // c = x W_r^T ...
    cache.context /= tau;                                               //     ... / tau
    Mat<S> gl;
    ops::linear_forward<S>(x, vg_w_.mat(), nullptr, gl);                // x w_g^T
    cache.gate.resize(N);
    cache.joint_logits.resize(N, E);
    cache.route_probs.resize(N, E);
    cache.route_idx.resize(N, k);
    cache.route_weights.resize(N, k);
    const int na = n_adapters();
    cache.u.assign(static_cast<std::size_t>(na), Mat<S>(N, k * r));
    Index out_w[2];
    for (int a = 0; a < na; ++a) out_w[a] = up_[a].shape[2];
    cache.delta.resize(N, opt_.variant == TrVariant::v1 ? 2 * D : out_w[0]);
    const bool v1 = opt_.variant == TrVariant::v1;
    const std::int64_t El = static_cast<std::int64_t>(E), l = static_cast<std::int64_t>(opt_.layer_idx);

    parallel_for(N, [&](Index n) {
      // candidates and prior
      const std::int64_t p = floor_mod(floor_mod(ids[n], El) + floor_mod(l, El), El), s = (p + 1) % El;
      const S g = sigmoid(gl(n, 0) + bg);                               // g = sigmoid(x w_g^T + b_g)
      cache.gate[n] = g;
      for (Index e = 0; e < E; ++e) {
        const S prior = co + (e == p ? cp - co : S(0)) + (e == s ? cs - co : S(0));
        cache.joint_logits(n, e) = prior + g * cache.context(n, e);    // z = prior + g c
      }
      auto z = cache.joint_logits.row(n);
      {  // P = softmax_E(z), telemetry only
        const S m = z.maxCoeff();
        S sum = 0;
        for (Index e = 0; e < E; ++e) sum += (cache.route_probs(n, e) = std::exp(z(e) - m));
        cache.route_probs.row(n) /= sum;
      }
      // route: v1 top-k of z (descending, ties -> lower expert), v2 the candidates (p, s)
      if (v1) {
        std::vector<Index> order(static_cast<std::size_t>(E));
        for (Index e = 0; e < E; ++e) order[static_cast<std::size_t>(e)] = e;
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](Index a, Index b) { return z(a) > z(b) || (z(a) == z(b) && a < b); });
        for (Index j = 0; j < k; ++j) cache.route_idx(n, j) = order[static_cast<std::size_t>(j)];
      } else {
        cache.route_idx(n, 0) = p;
        cache.route_idx(n, 1) = s;
      }
      {  // w = softmax(z[idx])
        S m = -std::numeric_limits<S>::infinity();
        for (Index j = 0; j < k; ++j) m = std::max(m, z(cache.route_idx(n, j)));
        S sum = 0;
        for (Index j = 0; j < k; ++j) sum += (cache.route_weights(n, j) = std::exp(z(cache.route_idx(n, j)) - m));
        cache.route_weights.row(n) /= sum;
      }
      // deltas: u_j = x A_e, y_j = u_j B_e, Delta = sum_j w_j y_j; Q' += alpha Delta^Q, V' += alpha Delta^V
      for (int a = 0; a < na; ++a) {
        const Index ow = out_w[a];
        RowVec<S> delta = RowVec<S>::Zero(ow);
        for (Index j = 0; j < k; ++j) {
          const Index e = cache.route_idx(n, j);
          ConstMatMap<S> A(down_[a].value.data() + e * D * r, D, r);
          ConstMatMap<S> Bm(up_[a].value.data() + e * r * ow, r, ow);
          auto uj = cache.u[static_cast<std::size_t>(a)].row(n).segment(j * r, r);
          uj.noalias() = x.row(n) * A;                                 // u_j = x A_e
          delta.noalias() += cache.route_weights(n, j) * (uj * Bm);   // Delta += w_j u_j B_e
        }
        if (v1)
          cache.delta.row(n).segment(a * D, D) = delta;
        else
          cache.delta.row(n) = delta;
        const Chunks tg = chunk_targets_(a);
        for (std::size_t ch = 0; ch < tg.size(); ++ch) {
          Mat<S>& dst = tg[ch] == 0 ? cache.q : cache.v;
          dst.row(n) += alpha * delta.segment(static_cast<Index>(ch) * D, D);
        }
      }
    });

    // telemetry, in double
    Telemetry t;
    t.gate = static_cast<double>(alpha);
    t.verifier_strength = 1.0 / (1.0 + std::exp(-static_cast<double>(bg)));
    t.route_share.assign(static_cast<std::size_t>(E), 0.0);
    double use = 0, ent = 0;
    for (Index n = 0; n < N; ++n) {
      use += static_cast<double>(cache.gate[n]);
      for (Index e = 0; e < E; ++e) {
        const double pe = static_cast<double>(cache.route_probs(n, e));
        ent -= pe * std::log(std::max(pe, 1e-9));
      }
      for (Index j = 0; j < k; ++j)
        t.route_share[static_cast<std::size_t>(cache.route_idx(n, j))] += static_cast<double>(cache.route_weights(n, j));
    }
    t.verifier_use = use / static_cast<double>(N);
    t.route_entropy = ent / static_cast<double>(N);
    for (auto& v : t.route_share) v /= static_cast<double>(N);
    cache.telemetry = t;
  }

  // Attention core per (b, h): qk-norm, RoPE, causal (masked) softmax, P V'. Fills qhat/khat, rstd, qr/kr, att, o.
  void attention_forward_(const AttnInputs<S>& in, Cache& cache) {
    const Index B = cache.batch, T = cache.seq, N = B * T, D = D_, H = H_, dh = dh_;
    const auto scale = ops::ScoreScale<S>::inv_sqrt(dh);
    const S eps = static_cast<S>(opt_.qk_norm_eps);
    const bool causal = opt_.causal || in.causal();
    rope_.reserve(T);
    cache.qhat.resize(N, D);
    cache.khat.resize(N, D);
    cache.q_rstd.resize(N * H);
    cache.k_rstd.resize(N * H);
    cache.qr.resize(N, D);
    cache.kr.resize(N, D);
    cache.o.resize(N, D);
    cache.att.assign(static_cast<std::size_t>(B * H * T * T), S(0));
    cache.causal = causal;
    const S* gq = opt_.use_qk_norm ? q_norm_.value.data() : nullptr;
    const S* gk = opt_.use_qk_norm ? k_norm_.value.data() : nullptr;
    parallel_for(B * H, [&](Index bh) {
      const Index b = bh / H, h = bh % H, r0 = b * T, c0 = h * dh;
      HeadMat qn(T, dh), kn(T, dh);
      if (opt_.use_qk_norm) {  // Qn = RMSNorm(Q'_h) .* gamma_q, Kn = RMSNorm(K_h) .* gamma_k
        ops::rms_norm_forward<S>(hb(cache.q, r0, c0, T), gq, eps, qn, hb(cache.qhat, r0, c0, T),
                                 cache.q_rstd.data() + bh * T);
        ops::rms_norm_forward<S>(hb(cache.k, r0, c0, T), gk, eps, kn, hb(cache.khat, r0, c0, T),
                                 cache.k_rstd.data() + bh * T);
      } else {
        qn = hb(cache.q, r0, c0, T);
        kn = hb(cache.k, r0, c0, T);
      }
      ops::rope_forward(rope_, 0, qn);                                  // Qr = RoPE(Qn), positions 0..T-1
      ops::rope_forward(rope_, 0, kn);                                  // Kr = RoPE(Kn)
      hb(cache.qr, r0, c0, T) = qn;
      hb(cache.kr, r0, c0, T) = kn;
      // P = softmax(Qr Kr^T / sqrt(d_h)) over the real keys (j <= i when causal; all-masked row -> 0), O = P V'
      const std::uint8_t* mask = in.has_key_mask() ? in.key_mask(b) : nullptr;
      ops::attention_core_forward<S, DHead>(qn, kn, hb(cache.v, r0, c0, T), scale, ops::AttentionMask{mask, causal},
                                            ops::HeadProducts::eigen, nullptr, cache.att.data() + bh * T * T,
                                            hb(cache.o, r0, c0, T));
    });
  }

  // Backward of the routed part: adapters, slot softmax, router, verifier. GQ = dL/dQ', GV = dL/dV'.
  void routed_backward_(const Mat<S>& GQ, const Mat<S>& GV, const Cache& cache, Mat<S>& dx) {
    const Mat<S>& x = cache.x;
    const Index N = x.rows(), D = D_, E = opt_.num_experts, k = opt_.top_k, r = opt_.adapter_rank;
    const S alpha = alpha_.value[0], tau = static_cast<S>(opt_.verifier_temperature);
    const int na = n_adapters();
    Index out_w[2];
    for (int a = 0; a < na; ++a) out_w[a] = up_[a].shape[2];

    std::vector<Mat<S>> ubar(static_cast<std::size_t>(na), Mat<S>(N, k * r));  // dL/du_j
    Vec<S> dalpha_part(N);                         // per-token terms of dL/dalpha
    Mat<S> dC(N, E);                               // dL/d(x W_r^T) = dc / tau
    Mat<S> da(N, 1);                               // dL/d(x w_g^T + b_g)
    const auto G = [&](int target) -> const Mat<S>& { return target == 0 ? GQ : GV; };

    parallel_for(N, [&](Index n) {
      S dal = 0;
      RowVec<S> dw = RowVec<S>::Zero(k);           // dL/dw_j (v1: q and v contributions summed)
      for (int a = 0; a < na; ++a) {
        const Index ow = out_w[a];
        const Chunks tg = chunk_targets_(a);
        for (Index j = 0; j < k; ++j) {
          const Index e = cache.route_idx(n, j);
          ConstMatMap<S> A(down_[a].value.data() + e * D * r, D, r);
          ConstMatMap<S> Bm(up_[a].value.data() + e * r * ow, r, ow);
          // t = B_e G_n^T (r): <y_j, G_n> = u_j . t, dL/du_j = alpha w_j t
          Vec<S> t = Vec<S>::Zero(r);
          for (std::size_t ch = 0; ch < tg.size(); ++ch)
            t.noalias() += Bm.middleCols(static_cast<Index>(ch) * D, D) * G(tg[ch]).row(n).transpose();
          const auto uj = cache.u[static_cast<std::size_t>(a)].row(n).segment(j * r, r);
          const S yg = uj.dot(t.transpose());                           // <y_j, G_n>
          const S wj = cache.route_weights(n, j);
          dw(j) += alpha * yg;                                          // Q' = Q + alpha sum_j w_j y_j -> dw_j
          dal += wj * yg;                                               //                              -> dalpha
          auto ub = ubar[static_cast<std::size_t>(a)].row(n).segment(j * r, r);
          ub = (alpha * wj) * t.transpose();                            // y_j = u_j B_e -> du_j = ybar B_e^T
          dx.row(n).noalias() += ub * A.transpose();                    // u_j = x A_e   -> dx += du_j A_e^T
        }
      }
      dalpha_part[n] = dal;
      // w = softmax(z[idx]) -> dv_j = w_j (dw_j - sum_i w_i dw_i); scatter to z
      const auto w = cache.route_weights.row(n);
      const S sdw = w.dot(dw);
      RowVec<S> dz = RowVec<S>::Zero(E);
      for (Index j = 0; j < k; ++j) dz(cache.route_idx(n, j)) += w(j) * (dw(j) - sdw);
      // z = prior + g c -> dg = sum_e dz_e c_e, dc = g dz; c = (x W_r^T) / tau
      const S g = cache.gate[n];
      const S dg = dz.dot(cache.context.row(n));
      dC.row(n) = (g / tau) * dz;
      // g = sigmoid(a) -> da = dg g (1 - g); a = x w_g^T + b_g -> dx += da w_g
      da(n, 0) = dg * g * (S(1) - g);
      dx.row(n).noalias() += da(n, 0) * vg_w_.mat().row(0);
    });

    // Shared routing parameters: reductions over tokens in a fixed order.
    {
      S s = 0;
      for (Index n = 0; n < N; ++n) s += dalpha_part[n];
      alpha_.grad[0] += s;                                              // dalpha = sum_n <Delta_n, G_n>
      S sb = 0;
      for (Index n = 0; n < N; ++n) sb += da(n, 0);
      vg_b_.grad[0] += sb;                                              // db_g = sum_n da_n
    }
    auto dWr = router_.grad_mat();
    ops::gemm_tn_add<S>(dC, x, dWr);                                    // dW_r += (dc/tau)^T x
    Mat<S> tmp;
    ops::gemm<S>(dC, router_.mat(), tmp);                               // dx += (dc/tau) W_r
    dx += tmp;
    auto dWg = vg_w_.grad_mat();
    ops::gemm_tn_add<S>(da, x, dWg);                                    // dw_g += sum_n da_n x_n

    // Adapter parameters: each expert owns its slices; its (token, slot) hits are gathered in token order.
    for (int a = 0; a < na; ++a) {
      const Index ow = out_w[a];
      const Chunks tg = chunk_targets_(a);
      parallel_for(E, [&](Index e) {
        std::vector<std::pair<Index, Index>> hits;
        for (Index n = 0; n < N; ++n)
          for (Index j = 0; j < k; ++j)
            if (cache.route_idx(n, j) == e) hits.emplace_back(n, j);
        if (hits.empty()) return;
        const Index m = static_cast<Index>(hits.size());
        Mat<S> U(m, r), Ub(m, r), Xe(m, D), Yb(m, ow);
        for (Index i = 0; i < m; ++i) {
          const Index n = hits[static_cast<std::size_t>(i)].first, j = hits[static_cast<std::size_t>(i)].second;
          U.row(i) = cache.u[static_cast<std::size_t>(a)].row(n).segment(j * r, r);
          Ub.row(i) = ubar[static_cast<std::size_t>(a)].row(n).segment(j * r, r);
          Xe.row(i) = x.row(n);
          const S s = alpha * cache.route_weights(n, j);               // ybar = alpha w_j G_n
          for (std::size_t ch = 0; ch < tg.size(); ++ch)
            Yb.row(i).segment(static_cast<Index>(ch) * D, D) = s * G(tg[ch]).row(n);
        }
        MatMap<S> dA(down_[a].grad.data() + e * D * r, D, r);
        MatMap<S> dB(up_[a].grad.data() + e * r * ow, r, ow);
        dB.noalias() += U.transpose() * Yb;                             // y = u B_e  -> dB_e += u^T ybar
        dA.noalias() += Xe.transpose() * Ub;                            // u = x A_e  -> dA_e += x^T ubar
      });
    }
  }

  Options opt_;
  Index D_ = 0, H_ = 0, dh_ = 0;
  Param<S> q_proj_, k_proj_, v_proj_, o_proj_, q_norm_, k_norm_;
  Param<S> down_[2], up_[2];  ///< v1: [0] = q adapter, [1] = v adapter; v2: [0] = qv adapter
  Param<S> router_, vg_w_, vg_b_, alpha_;
  ops::RopeTable<S> rope_;
  Telemetry telemetry_;
};

// ---- forward and backward, defined outside the class: not inline, so that an `extern template` declaration
// (below) keeps other translation units from instantiating them ----

template <class S, int Heads, int DHead>
auto TokenRoutedAttention<S, Heads, DHead>::forward_impl_(const Mat<S>& x, const Tensor<std::int64_t>* ids,
                                                         const AttnInputs<S>& in, Cache& cache) -> Mat<S> {
  const Index batch = in.batch(), T = in.q_len();
  cache.batch = batch;
  cache.seq = T;
  project_(x, batch, ids, cache);
  if (ids) telemetry_ = cache.telemetry;
  attention_forward_(in, cache);
  Mat<S> y;
  ops::linear_forward<S>(cache.o, o_proj_.mat(), nullptr, y);  // y = O W_o^T
  return y;
}

template <class S, int Heads, int DHead>
auto TokenRoutedAttention<S, Heads, DHead>::backward(const Mat<S>& dy, Cache& cache) -> Mat<S> {
  check(cache.batch > 0 && cache.x.rows() > 0, "TokenRoutedAttention::backward: the cache is empty (run forward first)");
  check_matrix(dy, cache.x.rows(), D_, "TokenRoutedAttention::backward dy");
  check_finite(dy, "TokenRoutedAttention::backward dy");
  const Index B = cache.batch, T = cache.seq, N = B * T, D = D_, H = H_, dh = dh_;
  const auto scale = ops::ScoreScale<S>::inv_sqrt(dh);

  // y = O W_o^T  ->  dW_o += dy^T O,  dO = dy W_o
  Mat<S> dO;
  ops::linear_backward<S>(dy, cache.o, o_proj_.mat(), o_proj_.grad_mat(), nullptr, &dO);

  // Attention core per (b, h): each pair owns its row/column block of GQ, GK, GV and one row of the gain partials.
  Mat<S> GQ(N, D), GK(N, D), GV(N, D);
  Mat<S> dgq = Mat<S>::Zero(B * H, dh), dgk = Mat<S>::Zero(B * H, dh);
  const S* gq = opt_.use_qk_norm ? q_norm_.value.data() : nullptr;
  const S* gk = opt_.use_qk_norm ? k_norm_.value.data() : nullptr;
  parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, r0 = b * T, c0 = h * dh;
    HeadMat dq(T, dh), dk(T, dh);
    // O = P V', P = softmax(Qr Kr^T * scale) -> dV', dQr, dKr
    ops::attention_core_backward<S, DHead>(cache.att.data() + bh * T * T, nullptr, hb(dO, r0, c0, T),
                                           hb(cache.qr, r0, c0, T), hb(cache.kr, r0, c0, T), hb(cache.v, r0, c0, T),
                                           scale, ops::AttentionMask{nullptr, cache.causal}, ops::HeadProducts::eigen,
                                           dq, dk, hb(GV, r0, c0, T));
    ops::rope_backward(rope_, 0, dq);                                 // Qr = RoPE(Qn)
    ops::rope_backward(rope_, 0, dk);                                 // Kr = RoPE(Kn)
    if (opt_.use_qk_norm) {                                           // Qn = RMSNorm(Q') .* gamma_q
      ops::rms_norm_backward<S>(dq, hb(cache.qhat, r0, c0, T), cache.q_rstd.data() + bh * T, gq,
                                dgq.data() + bh * dh, hb(GQ, r0, c0, T));
      ops::rms_norm_backward<S>(dk, hb(cache.khat, r0, c0, T), cache.k_rstd.data() + bh * T, gk,
                                dgk.data() + bh * dh, hb(GK, r0, c0, T));
    } else {
      hb(GQ, r0, c0, T) = dq;
      hb(GK, r0, c0, T) = dk;
    }
  });
  if (opt_.use_qk_norm)  // the gains are shared by all pairs: reduce the partials in pair order
    for (Index bh = 0; bh < B * H; ++bh) {
      q_norm_.grad += dgq.row(bh).transpose();
      k_norm_.grad += dgk.row(bh).transpose();
    }

  // Shared projections (Q' = x W_q^T + alpha dQ: the projection sees the full G^Q).
  Mat<S> dx, tmp;
  ops::linear_backward<S>(GQ, cache.x, q_proj_.mat(), q_proj_.grad_mat(), nullptr, &dx);   // dW_q += G^Q^T x
  ops::linear_backward<S>(GK, cache.x, k_proj_.mat(), k_proj_.grad_mat(), nullptr, &tmp);  // dW_k += G^K^T x
  dx += tmp;
  ops::linear_backward<S>(GV, cache.x, v_proj_.mat(), v_proj_.grad_mat(), nullptr, &tmp);  // dW_v += G^V^T x
  dx += tmp;
  if (cache.routed) routed_backward_(GQ, GV, cache, dx);
  return dx;
}

template <class S, int Heads, int DHead>
auto TokenRoutedAttention<S, Heads, DHead>::forward_cached(const Mat<S>& x, Index batch,
                                                          const Tensor<std::int64_t>& token_ids, KVCache& kv) -> Mat<S> {
  validate_x_(x, batch);
  const Index Sn = x.rows() / batch, D = D_, H = H_, dh = dh_;
  validate_ids_(token_ids, batch, Sn);
  if (kv.length == 0) {
    kv.batch = batch;
    kv.k.assign(static_cast<std::size_t>(batch), Mat<S>());
    kv.v.assign(static_cast<std::size_t>(batch), Mat<S>());
  }
  check(kv.batch == batch, "TokenRoutedAttention::forward_cached: batch expected ", kv.batch,
        " (the KV cache's), got ", batch);
  Cache c;
  project_(x, batch, &token_ids, c);
  telemetry_ = c.telemetry;
  const Index P0 = kv.length, L = P0 + Sn;
  rope_.reserve(L);
  for (Index b = 0; b < batch; ++b) {
    kv.k[static_cast<std::size_t>(b)].conservativeResize(L, D);
    kv.v[static_cast<std::size_t>(b)].conservativeResize(L, D);
    kv.v[static_cast<std::size_t>(b)].bottomRows(Sn) = c.v.middleRows(b * Sn, Sn);
  }
  const S scale = S(1) / std::sqrt(static_cast<S>(dh));
  Mat<S> O(batch * Sn, D);
  // Pass 1: new keys into the cache (each pair owns its column block of its row's cache).
  parallel_for(batch * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H;
    HeadMat kn = hb(c.k, b * Sn, h * dh, Sn);
    norm_rotate_(kn, k_norm_, P0);
    hb(kv.k[static_cast<std::size_t>(b)], P0, h * dh, Sn) = kn;
  });
  // Pass 2: queries against every cached key.
  parallel_for(batch * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H;
    HeadMat qn = hb(c.q, b * Sn, h * dh, Sn);
    norm_rotate_(qn, q_norm_, P0);
    const auto& Kc = kv.k[static_cast<std::size_t>(b)];
    const auto& Vc = kv.v[static_cast<std::size_t>(b)];
    Mat<S> sc(Sn, L);
    sc.noalias() = (qn * hb(Kc, 0, h * dh, L).transpose()) * scale;
    for (Index i = 0; i < Sn; ++i)  // causal: query i (absolute P0 + i) sees keys j <= P0 + i
      for (Index j = P0 + i + 1; j < L; ++j) sc(i, j) = -std::numeric_limits<S>::infinity();
    ops::masked_softmax_rows<S>(sc, nullptr, sc);
    hb(O, b * Sn, h * dh, Sn).noalias() = sc * hb(Vc, 0, h * dh, L);
  });
  kv.length = L;
  Mat<S> y;
  ops::linear_forward<S>(O, o_proj_.mat(), nullptr, y);
  return y;
}

// The project's own programs and tests compile these two instances once (cmake/instances.cmake).
#ifdef DEA_EXTERN_TEMPLATES
extern template class TokenRoutedAttention<float>;
extern template class TokenRoutedAttention<double>;
#endif

}  // namespace dea
