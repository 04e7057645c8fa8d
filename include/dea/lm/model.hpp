// dea/lm/model.hpp: the decoder-only causal language model of the reference (ComplexityModel; docs/lm.md),
// forward, hand-derived backward, the causal LM loss and KV-cached incremental decoding.
//
//   h_0 = Emb[t]                                            ids t [B, S] -> [N, D], N = B*S rows (b*S + s)
//   for l in 0..L-1 (pre-norm blocks):
//     a = RMSNorm_in,l(h);    h = h + Attn_l(a, t)          mha | gqa | mqa (CausalSelfAttention), tr_mha |
//                                                            tr_mha_v2 (TokenRoutedAttention, layer_idx = l, ids t),
//                                                            dea (causal DualExpertAttention, RoPE on its experts)
//     m = RMSNorm_post,l(h);  h = h + MLP_l(m, t)           dense SwiGLU (TR-MoE: the MLP slot below)
//   h_f = RMSNorm_final(h);   logits = h_f Emb^T (tied) or h_f W_lm^T (untied)   [N, V]
// RMSNorm: y = gamma .* x / sqrt(mean(x^2) + norm_eps); no embedding scale, no soft-cap, no dropout.
//
// Parameters, under the reference's state_dict names: embed_tokens.weight [V, D]; per layer
// layers.{l}.input_layernorm.weight [D], layers.{l}.self_attn.* (k_proj, q_proj, v_proj, o_proj, q_norm, k_norm; the
// tr_mha adapters), layers.{l}.post_attention_layernorm.weight [D], layers.{l}.mlp.* (gate_proj, up_proj, down_proj);
// norm.weight [D]; lm_head.weight [V, D] only when untied. With a tied head the gradient of embed_tokens.weight is the
// sum of the lookup and the output-projection contributions.
//
// Init (the reference's distribution, not its bits): sigma = initializer_range; embedding, q/k/v, gate/up and
// lm_head N(0, sigma^2); o_proj and down_proj N(0, sigma^2 / (2 L)); every gain 1; the token-routed attention draws its
// own adapters (docs/token_routed.md).
//
// The contract of the library: forward fills a Cache, backward ADDS into the parameter gradients and returns the
// gradient of the embedding output h_0; every kernel is bitwise identical for any thread count.
#pragma once

#include "../attention/inputs.hpp"
#include "../attention/dual_expert.hpp"
#include "../attention/token_routed.hpp"
#include "../core/init.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/linear.hpp"
#include "../ops/packed_gemm.hpp"
#include "../ops/rms_norm.hpp"
#include "bf16_weights.hpp"
#include "causal_attention.hpp"
#include "config.hpp"
#include "dense_mlp.hpp"
#include "loss.hpp"
#include "tr_moe.hpp"

#include <functional>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace dea {
namespace lm {
namespace detail {

/// While `on`, the library's loops and Eigen's products started from the calling thread run on that thread alone
/// (OpenMP's thread count is a per-thread setting: other threads keep theirs).
class ScopedOneThread {
public:
  explicit ScopedOneThread(bool on) {
#ifdef _OPENMP
    if (on) {
      saved_ = omp_get_max_threads();
      if (saved_ > 1) omp_set_num_threads(1);
    }
#else
    (void)on;
#endif
  }
  ~ScopedOneThread() {
#ifdef _OPENMP
    if (saved_ > 1) omp_set_num_threads(saved_);
#endif
  }
  ScopedOneThread(const ScopedOneThread&) = delete;
  ScopedOneThread& operator=(const ScopedOneThread&) = delete;

private:
  int saved_ = 1;
};

}  // namespace detail

template <class S>
class DecoderLM {
public:
  using Scalar = S;
  using IdTensor = Tensor<std::int64_t>;
  using Attn = CausalSelfAttention<S>;
  using TrAttn = TokenRoutedAttention<S>;
  using DeaAttn = DualExpertAttention<S>;

  // ---------------------------------------------------------------------------------------------------------
  // The MLP slot. Every MLP type has the interface
  //   Mat<S> forward(const Mat<S>& x, const std::int64_t* token_ids, Cache&);   x [N, D], ids N entries
  //   Mat<S> backward(const Mat<S>& dy, const Cache&);                          adds into its grads, returns dx
  //   ParamList<S> parameters();                                                names relative to layers.{l}.mlp.
  // and one alternative of each variant below: the dense SwiGLU (dense_deterministic) or the TR-MoE MLP
  // (tr_hash_engine, lm/tr_moe.hpp).
  using MlpImpl = std::variant<DenseSwiGLU<S>, TrMoeMlp<S>>;
  using MlpCache = std::variant<typename DenseSwiGLU<S>::Cache, typename TrMoeMlp<S>::Cache>;

  /// What forward saves for one block.
  struct BlockCache {
    Mat<S> a_hat;                     ///< [N, D] input RMSNorm: normalised rows (before the gain)
    Vec<S> a_rstd;                    ///< [N]
    typename Attn::Cache attn;        ///< mha / gqa / mqa
    typename TrAttn::Cache tr;        ///< tr_mha / tr_mha_v2
    typename DeaAttn::Cache dea;      ///< dea
    Mat<S> m_hat;                     ///< [N, D] post-attention RMSNorm
    Vec<S> m_rstd;                    ///< [N]
    MlpCache mlp;
  };

  /// What forward saves for backward, and the values the golden cases compare.
  struct Cache {
    Index batch = 0, seq = 0;
    bool from_ids = false;            ///< h_0 was looked up from the ids (backward adds the lookup gradient)
    IdTensor ids;                     ///< [B, S] token ids (the routing ids of tr_mha / TR-MoE)
    std::vector<Mat<S>> hidden;       ///< L + 1 matrices [N, D]: h_0, then each block's output (out.hidden_states)
    std::vector<BlockCache> blocks;
    Mat<S> hf_hat;                    ///< [N, D] final RMSNorm: normalised rows
    Vec<S> hf_rstd;                   ///< [N]
    Mat<S> hf;                        ///< [N, D] after the final RMSNorm (out.last_hidden_state)
  };

  /// KV state of incremental decoding (forward_step): the positions seen so far, per layer.
  struct DecodeState {
    Index batch = 0;
    Index length = 0;                                  ///< positions already decoded
    std::vector<typename Attn::KVCache> kv;            ///< per layer (mha / gqa / mqa)
    std::vector<typename TrAttn::KVCache> tr_kv;       ///< per layer (tr_mha / tr_mha_v2)
    std::vector<typename DeaAttn::DecodeCache> dea_kv; ///< per layer (dea)
    void clear() {
      batch = length = 0;
      kv.clear();
      tr_kv.clear();
      dea_kv.clear();
    }
    /// Bytes of the cached keys and values of the mha / gqa / mqa and tr_mha layers (bf16 or float, as held).
    std::size_t kv_bytes() const {
      std::size_t n = 0;
      for (const auto& c : kv) n += c.bytes();
      for (const auto& c : tr_kv)
        for (std::size_t b = 0; b < c.k.size(); ++b)
          n += 2 * static_cast<std::size_t>(c.length * c.k[b].cols()) * sizeof(S);
      return n;
    }
  };

  /// Builds the model and draws the init above from `rng`. Throws dea::Error naming a bad config field.
  DecoderLM(const DecoderConfig& cfg, Rng& rng) : cfg_(cfg) { build_(rng); }
  explicit DecoderLM(const DecoderConfig& cfg, std::uint64_t seed = 0) : cfg_(cfg) {
    Rng rng(seed);
    build_(rng);
  }
  DecoderLM(const DecoderLM&) = delete;  // the parameter lists point into the model
  DecoderLM& operator=(const DecoderLM&) = delete;

  const DecoderConfig& config() const { return cfg_; }
  AttentionType attention_type() const { return attn_type_; }
  Index num_layers() const { return L_; }
  /// The TR-MoE MLP of layer l (its route table, telemetry), or nullptr when the model's MLP is dense.
  TrMoeMlp<S>* tr_moe(Index l) { return std::get_if<TrMoeMlp<S>>(&blocks_.at(static_cast<std::size_t>(l)).mlp); }
  const TrMoeMlp<S>* tr_moe(Index l) const {
    return std::get_if<TrMoeMlp<S>>(&blocks_.at(static_cast<std::size_t>(l)).mlp);
  }
  /// The token-routed attention of layer l (its telemetry), or nullptr when the attention type is not tr_mha /
  /// tr_mha_v2.
  const TrAttn* token_routed(Index l) const {
    const Block& blk = blocks_.at(static_cast<std::size_t>(l));
    return blk.tr ? &*blk.tr : nullptr;
  }
  Index hidden_size() const { return D_; }
  Index vocab_size() const { return V_; }
  Index num_kv_heads() const { return cfg_.kv_heads(); }

  /// Every parameter under its state_dict name: embed_tokens.weight, then per layer input_layernorm, self_attn.*,
  /// post_attention_layernorm, mlp.*, then norm.weight and (untied) lm_head.weight.
  ParamList<S> parameters() {
    ParamList<S> l = {&embed_};
    for (auto& blk : blocks_) {
      l.push_back(&blk.in_norm);
      for (Param<S>* p : attn_params_(blk)) l.push_back(p);
      l.push_back(&blk.post_norm);
      for (Param<S>* p : std::visit([](auto& m) { return m.parameters(); }, blk.mlp)) l.push_back(p);
    }
    l.push_back(&norm_);
    if (!cfg_.tie_word_embeddings) l.push_back(&lm_head_);
    return l;
  }
  void zero_grad() { dea::zero_grad(parameters()); }
  /// An optional report from the backward pass: f(i) once the gradients of parameters [i, end) of parameters()
  /// are final for this backward (after the head and the final norm, after each layer, last layer first), so that
  /// a data-parallel exchange can start on them (dist/reducer.hpp). Empty (no report) by default.
  void set_grads_final(std::function<void(std::size_t)> f) { grads_final_ = std::move(f); }

  // ---------------------------------------------------------------------------------------------------------
  // Training graph

  /// ids [B, S] (each in [0, V)) -> logits [B*S, V] (rows b*S + s). Fills `cache` for backward.
  Mat<S> forward(const IdTensor& ids, Cache& cache) {
    check(ids.dim() == 2 && ids.size(0) > 0 && ids.size(1) > 0, "DecoderLM::forward: ids expected shape [B, S] with "
          "B, S > 0, got ", shape_str(ids.shape));
    Mat<S> h0;
    embed_lookup_(ids, h0, "DecoderLM::forward");
    cache.from_ids = true;
    return forward_impl_(std::move(h0), ids, cache);
  }

  /// The same graph from given embeddings h_0 [B*S, D] (the reference's inputs_embeds), with `routing_ids` [B, S]
  /// as the ids of tr_mha / TR-MoE routing (the reference routes such inputs with ids 0). backward returns dL/dh_0
  /// and adds no lookup gradient.
  Mat<S> forward_embeds(const Mat<S>& h0, const IdTensor& routing_ids, Cache& cache) {
    check(routing_ids.dim() == 2 && routing_ids.size(0) > 0 && routing_ids.size(1) > 0,
          "DecoderLM::forward_embeds: routing_ids expected shape [B, S] with B, S > 0, got ",
          shape_str(routing_ids.shape));
    check_matrix(h0, routing_ids.numel(), D_, "DecoderLM::forward_embeds h0");
    check_finite(h0, "DecoderLM::forward_embeds h0");
    cache.from_ids = false;
    return forward_impl_(h0, routing_ids, cache);
  }

  /// Backward from d loss / d logits [B*S, V]: ADDS into every parameter gradient (the tied head's two contributions
  /// into embed_tokens.weight) and returns d loss / d h_0 [B*S, D].
  Mat<S> backward(const Mat<S>& dlogits, Cache& cache);

  /// The causal LM loss of logits [B*S, V] against PRE-SHIFTED labels [B, S] (lm/loss.hpp: the last position is
  /// dropped, -100 ignored, label smoothing and z-loss with torch's semantics).
  static CausalLmLossResult<S> loss(const Mat<S>& logits, const IdTensor& labels, const CausalLmLossOptions& opt = {},
                                    bool with_grad = true) {
    check(labels.dim() == 2, "DecoderLM::loss: labels expected shape [B, S], got ", shape_str(labels.shape));
    return causal_lm_loss<S>(logits, labels.ptr(), labels.size(0), labels.size(1), opt, with_grad);
  }

  /// One training step's gradients: forward, loss, backward (gradients ADDED). Returns the loss (its dlogits kept).
  /// A non-finite loss (a diverged model) returns without the backward pass, no gradient added: the caller stops on
  /// the loss it sees.
  CausalLmLossResult<S> forward_backward(const IdTensor& ids, const IdTensor& labels, Cache& cache,
                                         const CausalLmLossOptions& opt = {}) {
    check(labels.shape == ids.shape, "DecoderLM::forward_backward: labels expected the shape of ids ",
          shape_str(ids.shape), ", got ", shape_str(labels.shape));
    const Mat<S> logits = forward(ids, cache);
    CausalLmLossResult<S> r = loss(logits, labels, opt, true);
    if (!std::isfinite(static_cast<double>(r.loss))) return r;
    backward(r.dlogits, cache);
    return r;
  }

  // ---------------------------------------------------------------------------------------------------------
  // Incremental decoding

  /// Makes this a bf16 inference model: the product weights of the mha / gqa / mqa attention, of the dense or TR-MoE
  /// MLP and of the head are stored once as bf16 (lm/bf16_weights.hpp; the float values and gradients of the
  /// attention and MLP weights, and of an untied head, are freed: 2 bytes a weight instead of 8), and forward_step
  /// then runs every product in bf16 with float accumulation, its KV cache in bf16. The tied embedding stays float
  /// for the lookup (the head reads its bf16 copy); norms, RoPE, softmax, SwiGLU and the residual stream stay float;
  /// tr_mha and dea attention keep their float weights and run their products in bf16 too. The logits are the same
  /// bits as forward_step's under ScopedPrecision(Precision::bf16) on the float model. Afterwards forward and backward
  /// throw (the model is for decoding only) and the freed parameters read as empty. float models only. Returns the
  /// bytes of the weights kept (weight_bytes()).
  std::size_t store_bf16_weights();
  /// True after store_bf16_weights.
  bool has_bf16_weights() const { return bf16_weights_; }
  /// Bytes of the model's weights as held: float values (gradients not counted) and bf16 copies.
  std::size_t weight_bytes() const;

  /// The logits [B*Sn, V] of the Sn new positions `new_ids` [B, Sn] (rows b*Sn + i), at absolute positions
  /// state.length .. state.length + Sn - 1, given the keys and values of the earlier positions in `state` (empty:
  /// a fresh sequence). Appends the new positions to `state`. The same function as forward on the whole prefix, at
  /// O(length) cost per new position. Forward only.
  ///
  /// A step of fewer than kSerialStepRows rows (B*Sn: a decoding step, a short prompt) runs on the calling thread
  /// alone: its products have too few rows to share, and what is left to split (each head's scores against the
  /// cache, the norms) costs less than waking a thread, so more threads only made generation slower. Longer steps
  /// (a long prompt's prefill) use the library's threads. The results are the same bits either way.
  Mat<S> forward_step(const IdTensor& new_ids, DecodeState& state);

  /// Steps with fewer rows than this run on one thread (forward_step): the row count below which the float
  /// products are not split between threads either (ops::packed::kMinRows).
  static constexpr Index kSerialStepRows = ops::packed::kMinRows;

private:
  struct Block {
    Param<S> in_norm, post_norm;
    std::optional<Attn> attn;
    std::optional<TrAttn> tr;
    std::optional<DeaAttn> dea;
    MlpImpl mlp;
    Block(Param<S> a, Param<S> b, MlpImpl m) : in_norm(std::move(a)), post_norm(std::move(b)), mlp(std::move(m)) {}
  };

  static ParamList<S> attn_params_(Block& blk) {
    return blk.attn ? blk.attn->parameters() : blk.tr ? blk.tr->parameters() : blk.dea->parameters();
  }

  template <class C>
  static C& mlp_cache_(MlpCache& c) {
    if (!std::holds_alternative<C>(c)) c.template emplace<C>();
    return std::get<C>(c);
  }
  static Mat<S> mlp_forward_(MlpImpl& m, const Mat<S>& x, const std::int64_t* ids, MlpCache& c) {
    return std::visit([&](auto& impl) -> Mat<S> {
      using C = typename std::decay_t<decltype(impl)>::Cache;
      return impl.forward(x, ids, mlp_cache_<C>(c));
    }, m);
  }
  static Mat<S> mlp_backward_(MlpImpl& m, const Mat<S>& dy, const MlpCache& c) {
    return std::visit([&](auto& impl) -> Mat<S> {
      using C = typename std::decay_t<decltype(impl)>::Cache;
      return impl.backward(dy, std::get<C>(c));
    }, m);
  }

  /// The MLP of layer l (names relative to layers.{l}.mlp.), its init drawn from rng.
  MlpImpl make_mlp_(Index l, Rng& rng) {
    const double sigma = cfg_.initializer_range, sigma_res = sigma / std::sqrt(2.0 * static_cast<double>(L_));
    switch (cfg_.mlp()) {
      case MlpType::dense: {
        DenseSwiGLU<S> m(D_, cfg_.intermediate_size);
        ParamList<S> p = m.parameters();  // gate_proj, up_proj, down_proj
        init::normal(p[0]->mat(), rng, 0.0, sigma);
        init::normal(p[1]->mat(), rng, 0.0, sigma);
        init::normal(p[2]->mat(), rng, 0.0, sigma_res);
        return MlpImpl(std::in_place_type<DenseSwiGLU<S>>, std::move(m));
      }
      case MlpType::tr_hash_engine:
      default: {
        TrMoeOptions o;
        o.num_experts = cfg_.num_experts;
        o.top_k = cfg_.top_k;
        o.intermediate_size = cfg_.intermediate_size;
        o.shared_expert = cfg_.shared_expert;
        o.shared_intermediate_size = cfg_.shared_intermediate_size > 0 ? cfg_.shared_intermediate_size : 0;
        o.top_k_primary_weight = cfg_.top_k_primary_weight;
        o.routing_strategy = cfg_.routing_strategy;
        o.layer_idx = l;
        o.vocab_size = V_;
        // the init: experts and the shared gate/up N(0, sigma^2); expert_down and shared_down N(0, sigma_res^2)
        return MlpImpl(std::in_place_type<TrMoeMlp<S>>, D_, o, rng, sigma, sigma_res);
      }
    }
  }

  void build_(Rng& rng) {
    cfg_.validate();
    attn_type_ = cfg_.attention();
    L_ = cfg_.num_hidden_layers;
    D_ = cfg_.hidden_size;
    V_ = cfg_.vocab_size;
    const double sigma = cfg_.initializer_range, sigma_res = sigma / std::sqrt(2.0 * static_cast<double>(L_));
    embed_ = Param<S>("embed_tokens.weight", "main", {V_, D_});
    init::normal(embed_.mat(), rng, 0.0, sigma);
    blocks_.reserve(static_cast<std::size_t>(L_));
    for (Index l = 0; l < L_; ++l) {
      const std::string pre = "layers." + std::to_string(l) + ".";
      Param<S> in_norm(pre + "input_layernorm.weight", "main", {D_});
      Param<S> post_norm(pre + "post_attention_layernorm.weight", "main", {D_});
      in_norm.value.setOnes();
      post_norm.value.setOnes();
      std::optional<Attn> attn;
      std::optional<TrAttn> tr;
      std::optional<DeaAttn> dea;
      if (attn_type_ == AttentionType::dea) {
        // causal Dual-Expert attention without biases, with its own initialisation (attention/dual_expert.hpp);
        // no oracle: the gate has no loss and alpha-hat alone mixes the experts. RoPE with the other types' theta
        // on both experts (E0 reads rho_i q . rho_j k, E1 rho_i W_rel q - rho_j k: relative positions only); the
        // gate reads the unrotated q and k (docs/dea_causal.md)
        typename DeaAttn::Options o;
        o.bias = false;
        o.rope_theta = cfg_.rope_theta;
        dea.emplace(D_, cfg_.num_attention_heads, rng, o);
      } else if (attn_type_ == AttentionType::tr_mha || attn_type_ == AttentionType::tr_mha_v2) {
        tr.emplace(D_, cfg_.num_attention_heads, rng, cfg_.token_routed_options(l));
      } else {
        CausalAttentionOptions o;
        o.d_model = D_;
        o.n_heads = cfg_.num_attention_heads;
        o.n_kv_heads = cfg_.kv_heads();
        o.use_qk_norm = cfg_.use_qk_norm;
        o.norm_eps = cfg_.norm_eps;
        o.rope_theta = cfg_.rope_theta;
        attn.emplace(o);
        ParamList<S> p = attn->parameters();  // k, q, v, o (then the gains, already 1)
        init::normal(p[0]->mat(), rng, 0.0, sigma);
        init::normal(p[1]->mat(), rng, 0.0, sigma);
        init::normal(p[2]->mat(), rng, 0.0, sigma);
        init::normal(p[3]->mat(), rng, 0.0, sigma_res);
      }
      MlpImpl mlp = make_mlp_(l, rng);
      blocks_.emplace_back(std::move(in_norm), std::move(post_norm), std::move(mlp));
      Block& blk = blocks_.back();
      blk.attn = std::move(attn);
      blk.tr = std::move(tr);
      blk.dea = std::move(dea);
      prefix_names(attn_params_(blk), pre + "self_attn.");
      prefix_names(std::visit([](auto& m) { return m.parameters(); }, blk.mlp), pre + "mlp.");
    }
    norm_ = Param<S>("norm.weight", "main", {D_});
    norm_.value.setOnes();
    if (!cfg_.tie_word_embeddings) {
      lm_head_ = Param<S>("lm_head.weight", "main", {V_, D_});
      init::normal(lm_head_.mat(), rng, 0.0, sigma);
    }
  }

  /// h0 [B*S, D] = Emb[ids]; ids must lie in [0, V).
  void embed_lookup_(const IdTensor& ids, Mat<S>& h0, const char* who) const {
    const Index N = ids.numel();
    for (Index n = 0; n < N; ++n)
      check(ids[n] >= 0 && ids[n] < V_, who, ": ids[", n, "] expected a token in [0, ", V_, ") (vocab_size), got ",
            ids[n]);
    h0.resize(N, D_);
    const auto E = embed_.mat();
    for (Index n = 0; n < N; ++n) h0.row(n) = E.row(static_cast<Index>(ids[n]));  // h_0 = Emb[t]
  }

  /// The head: logits = h_f Emb^T (tied) or h_f W_lm^T.
  const Param<S>& head_() const { return cfg_.tie_word_embeddings ? embed_ : lm_head_; }
  Param<S>& head_() { return cfg_.tie_word_embeddings ? embed_ : lm_head_; }

  Mat<S> forward_impl_(Mat<S> h, const IdTensor& ids, Cache& c);

  bool bf16_weights_ = false;                     ///< store_bf16_weights was called
  std::shared_ptr<const ops::packed::Bf16Matrix> head16_;  ///< the head's weight as bf16 (store_bf16_weights)

  DecoderConfig cfg_;
  AttentionType attn_type_ = AttentionType::gqa;
  Index L_ = 0, D_ = 0, V_ = 0;
  Param<S> embed_, norm_, lm_head_;
  std::vector<Block> blocks_;
  std::function<void(std::size_t)> grads_final_;
};

template <class S>
std::size_t DecoderLM<S>::store_bf16_weights() {
  check(std::is_same<S, float>::value, "DecoderLM::store_bf16_weights: float models only");
  if constexpr (std::is_same<S, float>::value) {
    if (!bf16_weights_) {
      for (Block& blk : blocks_) {
        if (blk.attn) blk.attn->store_bf16_weights();
        std::visit([](auto& m) { m.store_bf16_weights(); }, blk.mlp);
      }
      Param<S>& head = head_();
      head16_ = std::make_shared<const ops::packed::Bf16Matrix>(pack_linear_bf16(head.value.data(), V_, D_));
      if (!cfg_.tie_word_embeddings) release_float(lm_head_);
      bf16_weights_ = true;
    }
  }
  return weight_bytes();
}

template <class S>
std::size_t DecoderLM<S>::weight_bytes() const {
  std::size_t n = value_bytes(embed_) + value_bytes(norm_) + value_bytes(lm_head_) + (head16_ ? head16_->bytes() : 0);
  for (const Block& blk : blocks_) {
    n += value_bytes(blk.in_norm) + value_bytes(blk.post_norm);
    if (blk.attn) n += blk.attn->weight_bytes();
    if (blk.tr)
      for (Param<S>* p : const_cast<TrAttn&>(*blk.tr).parameters()) n += value_bytes(*p);
    if (blk.dea)
      for (Param<S>* p : const_cast<DeaAttn&>(*blk.dea).parameters()) n += value_bytes(*p);
    n += std::visit([](const auto& m) { return m.weight_bytes(); }, blk.mlp);
  }
  return n;
}

template <class S>
Mat<S> DecoderLM<S>::forward_impl_(Mat<S> h, const IdTensor& ids, Cache& c) {
  check(!bf16_weights_, "DecoderLM::forward: the weights are stored as bf16 for inference (forward_step only)");
  const Index B = ids.size(0), T = ids.size(1), N = B * T;
  const S eps = static_cast<S>(cfg_.norm_eps);
  c.batch = B;
  c.seq = T;
  c.ids = ids;
  c.hidden.resize(static_cast<std::size_t>(L_ + 1));
  c.blocks.resize(static_cast<std::size_t>(L_));
  c.hidden[0] = std::move(h);                                                 // h_0
  const AttnInputs<S> in(B, T);
  AttnInputs<S> causal_in(B, T);
  causal_in.set_causal(true);
  Mat<S> a(N, D_);
  for (Index l = 0; l < L_; ++l) {
    Block& blk = blocks_[static_cast<std::size_t>(l)];
    BlockCache& bc = c.blocks[static_cast<std::size_t>(l)];
    const Mat<S>& hin = c.hidden[static_cast<std::size_t>(l)];
    bc.a_hat.resize(N, D_);
    bc.a_rstd.resize(N);
    ops::rms_norm_forward<S>(hin, blk.in_norm.value.data(), eps, a, bc.a_hat, bc.a_rstd.data());  // a = RMSNorm_in(h)
    Mat<S> hmid = blk.attn ? blk.attn->forward(a, B, bc.attn)
                  : blk.tr ? blk.tr->forward(a, ids, in, bc.tr)
                           : blk.dea->forward(a, causal_in, bc.dea);
    hmid += hin;                                                              // h = h + Attn(a)
    bc.m_hat.resize(N, D_);
    bc.m_rstd.resize(N);
    ops::rms_norm_forward<S>(hmid, blk.post_norm.value.data(), eps, a, bc.m_hat, bc.m_rstd.data());  // m = RMSNorm_post(h)
    Mat<S> hout = mlp_forward_(blk.mlp, a, ids.ptr(), bc.mlp);
    hout += hmid;                                                             // h = h + MLP(m)
    c.hidden[static_cast<std::size_t>(l + 1)] = std::move(hout);
  }
  c.hf.resize(N, D_);
  c.hf_hat.resize(N, D_);
  c.hf_rstd.resize(N);
  ops::rms_norm_forward<S>(c.hidden.back(), norm_.value.data(), eps, c.hf, c.hf_hat, c.hf_rstd.data());  // h_f
  Mat<S> logits;
  ops::linear_forward<S>(c.hf, head_().mat(), nullptr, logits);             // logits = h_f W_head^T
  return logits;
}

template <class S>
Mat<S> DecoderLM<S>::backward(const Mat<S>& dlogits, Cache& c) {
  check(!bf16_weights_, "DecoderLM::backward: the weights are stored as bf16 for inference");
  check(c.batch > 0 && !c.hidden.empty(), "DecoderLM::backward: the cache is empty (run forward first)");
  const Index N = c.batch * c.seq;
  check_matrix(dlogits, N, V_, "DecoderLM::backward dlogits");
  check_finite(dlogits, "DecoderLM::backward dlogits");
  Param<S>& head = head_();
  Mat<S> dhf;
  ops::linear_backward<S>(dlogits, c.hf, head.mat(), head.grad_mat(), nullptr, &dhf);  // logits = h_f W^T
  Mat<S> dh(N, D_), tmp(N, D_);
  ops::rms_norm_backward<S>(dhf, c.hf_hat, c.hf_rstd.data(), norm_.value.data(), norm_.grad.data(), dh);  // h_f
  std::vector<std::size_t> first(blocks_.size() + 1, 1);  // parameters() index of layer l: after embed_tokens
  if (grads_final_) {
    for (std::size_t l = 0; l < blocks_.size(); ++l)
      first[l + 1] = first[l] + 2 + attn_params_(blocks_[l]).size() +
                     std::visit([](auto& m) { return m.parameters().size(); }, blocks_[l].mlp);
    grads_final_(first.back());  // norm (and the untied lm_head)
  }
  for (Index l = L_ - 1; l >= 0; --l) {
    Block& blk = blocks_[static_cast<std::size_t>(l)];
    BlockCache& bc = c.blocks[static_cast<std::size_t>(l)];
    // h_out = h_mid + MLP(m), m = RMSNorm_post(h_mid)
    const Mat<S> dm = mlp_backward_(blk.mlp, dh, bc.mlp);
    ops::rms_norm_backward<S>(dm, bc.m_hat, bc.m_rstd.data(), blk.post_norm.value.data(), blk.post_norm.grad.data(), tmp);
    dh += tmp;                                                                // dh_mid = dh_out + d(norm) path
    // h_mid = h_in + Attn(a), a = RMSNorm_in(h_in)
    const Mat<S> da = blk.attn ? blk.attn->backward(dh, bc.attn)
                      : blk.tr ? blk.tr->backward(dh, bc.tr)
                               : blk.dea->backward(dh, bc.dea);
    ops::rms_norm_backward<S>(da, bc.a_hat, bc.a_rstd.data(), blk.in_norm.value.data(), blk.in_norm.grad.data(), tmp);
    dh += tmp;                                                                // dh_in = dh_mid + d(norm) path
    if (grads_final_) grads_final_(first[static_cast<std::size_t>(l)]);
  }
  if (c.from_ids) {  // h_0 = Emb[t] -> dEmb[t] += dh_0 rows, in row order
    auto dE = embed_.grad_mat();
    for (Index n = 0; n < N; ++n) dE.row(static_cast<Index>(c.ids[n])) += dh.row(n);
  }
  return dh;
}

template <class S>
Mat<S> DecoderLM<S>::forward_step(const IdTensor& new_ids, DecodeState& st) {
  check(new_ids.dim() == 2 && new_ids.size(0) > 0 && new_ids.size(1) > 0, "DecoderLM::forward_step: new_ids expected "
        "shape [B, Sn] with B, Sn > 0, got ", shape_str(new_ids.shape));
  const Index B = new_ids.size(0), Sn = new_ids.size(1), N = B * Sn;
  if (st.length == 0) {
    st.batch = B;
    st.kv.assign(static_cast<std::size_t>(L_), typename Attn::KVCache());
    st.tr_kv.assign(static_cast<std::size_t>(L_), typename TrAttn::KVCache());
    st.dea_kv.assign(static_cast<std::size_t>(L_), typename DeaAttn::DecodeCache(B));
  }
  check(st.batch == B, "DecoderLM::forward_step: new_ids batch expected ", st.batch, " (the decode state's), got ", B);
  check(st.kv.size() == static_cast<std::size_t>(L_) && st.tr_kv.size() == static_cast<std::size_t>(L_) &&
            st.dea_kv.size() == static_cast<std::size_t>(L_),
        "DecoderLM::forward_step: the decode state holds ", st.kv.size(), " layers, this model has ", L_,
        " (a state of another model?)");
  const detail::ScopedOneThread one_thread(N < kSerialStepRows);
  // bf16 weights: every product in bf16 (the tr_mha / dea attention's float weights too)
  const ScopedPrecision precision(bf16_weights_ ? Precision::bf16 : thread_settings().product_precision);
  const S eps = static_cast<S>(cfg_.norm_eps);
  Mat<S> h;
  embed_lookup_(new_ids, h, "DecoderLM::forward_step");
  Mat<S> a(N, D_), hat(N, D_);
  Vec<S> rs(N);
  for (Index l = 0; l < L_; ++l) {
    Block& blk = blocks_[static_cast<std::size_t>(l)];
    ops::rms_norm_forward<S>(h, blk.in_norm.value.data(), eps, a, hat, rs.data());        // a = RMSNorm_in(h)
    const std::size_t li = static_cast<std::size_t>(l);
    h += blk.attn ? blk.attn->forward_cached(a, B, st.kv[li])
         : blk.tr ? blk.tr->forward_cached(a, B, new_ids, st.tr_kv[li])
                  : blk.dea->forward_decode(a, st.dea_kv[li]);                             // h += Attn(a)
    ops::rms_norm_forward<S>(h, blk.post_norm.value.data(), eps, a, hat, rs.data());      // m = RMSNorm_post(h)
    MlpCache scratch;
    h += mlp_forward_(blk.mlp, a, new_ids.ptr(), scratch);                                 // h += MLP(m)
  }
  ops::rms_norm_forward<S>(h, norm_.value.data(), eps, a, hat, rs.data());                // h_f
  st.length += Sn;
  Mat<S> logits;
  if constexpr (std::is_same<S, float>::value) {
    if (head16_) {
      linear_bf16(a, *head16_, logits);                                                   // logits = h_f W^T
      return logits;
    }
  }
  ops::linear_forward<S>(a, head_().mat(), nullptr, logits);                              // logits = h_f W^T
  return logits;
}

}  // namespace lm
}  // namespace dea
