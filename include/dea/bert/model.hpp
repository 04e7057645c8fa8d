// dea/bert/model.hpp: Hugging Face's BertModel (the eager path of modeling_bert): embeddings, post-LN encoder
// layers and the pooler, with hand-derived backward passes (docs/bert.md, BertModel).
//
// Shapes (B batch, T tokens, N = B*T rows, row b*T + t; H hidden, V vocab, P positions):
//   E  = word[ids] (or inputs_embeds) + token_type[tt] + position[t]    [N, H]   (tt defaults to 0, t = 0..T-1)
//   x0 = Dropout(LN_emb(E))                                              [N, H]   (embeddings.LayerNorm)
//   x_{l+1} = BertLayer_l(x_l; in)                                       [N, H]   (layer.hpp)
//   last_hidden_state = x_L                                              [N, H]
//   pooler_output = tanh(x_L[b*T + 0] W_p^T + b_p)                       [B, H]   (pooler.dense)
// in: one AttnInputs for the whole forward, key mask = attention_mask (absent: every token real); built here, or
// given by the caller with what its self-attention reads besides the mask (DualExpertBert's oracle and gamma_mix).
// Padded query rows are computed like any other; a sequence with no real token attends uniformly
// (self_attention.hpp).
//
// Backward contract (docs/architecture.md): backward(d_last, d_pooled, cache) adds into every parameter gradient
// the objective reaches and returns dL/dE [N, H], which is the gradient with respect to inputs_embeds (E is
// inputs_embeds plus constants). Either upstream gradient may be absent (a null pointer). The word embedding's
// row pad_token_id receives no gradient (nn.Embedding's padding_idx), as in PyTorch.
//
// Parameters (HF names and state_dict order): embeddings.word_embeddings.weight [V, H],
// embeddings.position_embeddings.weight [P, H], embeddings.token_type_embeddings.weight [type_vocab, H],
// embeddings.LayerNorm.{weight, bias}, encoder.layer.{i}.* (layer.hpp), pooler.dense.{weight, bias}.
// bert_parameter_shapes(cfg) lists the same names and shapes without building a model (the loader checks a file
// against it before allocating anything).
//
// Fresh models (HF init): Linear and Embedding weights N(0, initializer_range^2) (embeddings first, then each layer,
// then the pooler), biases 0, the padding row 0, LayerNorms 1 / 0. A model built without an Rng has zero weights
// (LayerNorms 1 / 0), for loading.
//
// Dropout (hidden_dropout_prob after the embeddings and on both residual branches of every layer;
// attention_probs_dropout_prob on the attention probabilities) is active only when forward is called with
// training = true, drawn from the Rng passed to it.
//
// Inference with bf16 weights (store_bf16_weights, float only): the weight of every matrix product (each layer's
// W_q; W_k; W_v as one [3H, H] matrix, attention.output.dense, intermediate.dense, output.dense, and the pooler) is
// kept once, packed as bf16 (bf16_weights.hpp: 2 bytes a weight instead of 4 for the value and 4 for the gradient);
// the embeddings, LayerNorms and biases stay float, and every gradient is released. Each forward then runs under
// ScopedPrecision(Precision::bf16) and gives the bits of the float model's forward under that precision (rounding a
// weight to bf16 once or at every product is the same number). Training forwards and backward are refused.
#pragma once

#include "../attention/inputs.hpp"
#include "../core/error.hpp"
#include "../core/init.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../nn/attention_traits.hpp"
#include "../nn/dropout.hpp"
#include "../nn/embedding.hpp"
#include "../nn/layer_norm.hpp"
#include "../nn/linear.hpp"
#include "bf16_weights.hpp"
#include "config.hpp"
#include "layer.hpp"
#include "self_attention.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dea {
namespace bert {

/// One batch for BertModel. An optional tensor is absent when default-constructed (dim() == 0).
template <class S>
struct BertBatch {
  Tensor<std::int64_t> input_ids;       ///< [B, T] ids in [0, V); required unless inputs_embeds is given
  Tensor<std::uint8_t> attention_mask;  ///< [B, T], non-zero = real token; absent = all real
  Tensor<std::int64_t> token_type_ids;  ///< [B, T] in [0, type_vocab_size); absent = all 0
  Tensor<S> inputs_embeds;              ///< [B, T, H]: used instead of word_embeddings[input_ids] when present

  Index batch() const {
    return input_ids.dim() == 2 ? input_ids.size(0) : (inputs_embeds.dim() == 3 ? inputs_embeds.size(0) : 0);
  }
  Index seq_len() const {
    return input_ids.dim() == 2 ? input_ids.size(1) : (inputs_embeds.dim() == 3 ? inputs_embeds.size(1) : 0);
  }
};

/// What BertModel::forward returns.
template <class S>
struct BertOutput {
  Mat<S> last_hidden_state;  ///< [B*T, H], row b*T + t
  Mat<S> pooler_output;      ///< [B, H]
};

/// Every parameter name of a BertModel built from `cfg`, with its shape, in state_dict order.
inline std::vector<std::pair<std::string, Shape>> bert_parameter_shapes(const BertConfig& cfg) {
  const Index H = cfg.hidden_size, I = cfg.intermediate_size;
  std::vector<std::pair<std::string, Shape>> out{
      {"embeddings.word_embeddings.weight", {cfg.vocab_size, H}},
      {"embeddings.position_embeddings.weight", {cfg.max_position_embeddings, H}},
      {"embeddings.token_type_embeddings.weight", {cfg.type_vocab_size, H}},
      {"embeddings.LayerNorm.weight", {H}},
      {"embeddings.LayerNorm.bias", {H}}};
  for (Index l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    for (const char* qkv : {"query", "key", "value"}) {
      out.push_back({p + "attention.self." + qkv + ".weight", {H, H}});
      out.push_back({p + "attention.self." + qkv + ".bias", {H}});
    }
    out.push_back({p + "attention.output.dense.weight", {H, H}});
    out.push_back({p + "attention.output.dense.bias", {H}});
    out.push_back({p + "attention.output.LayerNorm.weight", {H}});
    out.push_back({p + "attention.output.LayerNorm.bias", {H}});
    out.push_back({p + "intermediate.dense.weight", {I, H}});
    out.push_back({p + "intermediate.dense.bias", {I}});
    out.push_back({p + "output.dense.weight", {H, I}});
    out.push_back({p + "output.dense.bias", {H}});
    out.push_back({p + "output.LayerNorm.weight", {H}});
    out.push_back({p + "output.LayerNorm.bias", {H}});
  }
  out.push_back({"pooler.dense.weight", {H, H}});
  out.push_back({"pooler.dense.bias", {H}});
  return out;
}

template <class S, class SelfAttention = BertSelfAttention<S>>
class BertModel {
  static_assert(std::is_floating_point<S>::value, "BertModel: Scalar must be float or double");

public:
  using Scalar = S;
  using Layer = BertLayer<S, SelfAttention>;
  using AttentionOptions = typename SelfAttention::Options;
  /// Builds the self-attention options of layer `l` (default: default_self_attention_options).
  using AttentionOptionsFn = std::function<AttentionOptions(Index layer)>;

  /// Everything backward needs, filled by forward.
  struct Cache {
    Index B = 0, T = 0;
    AttnInputs<S> inputs;                  ///< the attention inputs every layer read
    Tensor<std::int64_t> input_ids;       ///< [B, T] copy (absent when inputs_embeds was given)
    std::vector<std::int64_t> token_types;  ///< [N] (zeros when the batch had none)
    std::vector<std::int64_t> positions;    ///< [N] t of row b*T + t
    Mat<S> e;                              ///< [N, H] the embedding sum (LN_emb input)
    typename nn::LayerNorm<S>::Cache ln;
    nn::DropoutState drop;
    std::vector<typename Layer::Cache> layers;
    Mat<S> first;                          ///< [B, H] x_L at position 0 (pooler input)
    Mat<S> pooled;                         ///< [B, H] pooler output
  };

  /// A fresh model (HF init, see the file comment).
  BertModel(const BertConfig& cfg, Rng& rng, AttentionOptionsFn make_options = {}) : BertModel(cfg, 0) {
    const double sd = cfg.initializer_range;
    for (nn::Embedding<S>* e : {&word_, &pos_, &type_}) e->reset_parameters(rng, sd);
    if (cfg.pad_token_id >= 0) word_.weight.mat().row(cfg.pad_token_id).setZero();
    layers_.reserve(static_cast<std::size_t>(cfg.num_hidden_layers));
    for (Index l = 0; l < cfg.num_hidden_layers; ++l) {
      const AttentionOptions o = make_options ? make_options(l) : default_self_attention_options<SelfAttention>(cfg, l);
      layers_.emplace_back(cfg, rng, o);
      prefix_names(layers_.back().parameters(), "encoder.layer." + std::to_string(l) + ".");
    }
    detail::hf_init_linear(pooler_, rng, sd);
  }

  /// A model with zero weights (LayerNorms 1 / 0) around the given self-attention modules, one per layer (their
  /// parameters keep their values and get the prefix "encoder.layer.{l}.attention.self."), whose other values are
  /// loaded or copied next. Builds no Rng stream. (DualExpertBert builds its Dual-Expert layers this way.)
  BertModel(const BertConfig& cfg, std::vector<SelfAttention> attention) : BertModel(cfg, 0) {
    check(static_cast<Index>(attention.size()) == cfg.num_hidden_layers, "BertModel: expected ",
          cfg.num_hidden_layers, " self-attention modules (num_hidden_layers), got ", attention.size());
    layers_.reserve(attention.size());
    for (Index l = 0; l < cfg.num_hidden_layers; ++l) {
      layers_.emplace_back(cfg, std::move(attention[static_cast<std::size_t>(l)]));
      prefix_names(layers_.back().parameters(), "encoder.layer." + std::to_string(l) + ".");
    }
  }

  /// A model with zero weights (LayerNorms 1 / 0) and BertSelfAttention layers, whose values are loaded next
  /// (hf_dir.hpp). Builds no Rng stream.
  template <class SA = SelfAttention, std::enable_if_t<std::is_same<SA, BertSelfAttention<S>>::value, int> = 0>
  explicit BertModel(const BertConfig& cfg) : BertModel(cfg, 0) {
    layers_.reserve(static_cast<std::size_t>(cfg.num_hidden_layers));
    for (Index l = 0; l < cfg.num_hidden_layers; ++l) {
      layers_.emplace_back(cfg, SelfAttention(cfg.hidden_size, cfg.num_attention_heads,
                                              default_self_attention_options<SelfAttention>(cfg, l)));
      prefix_names(layers_.back().parameters(), "encoder.layer." + std::to_string(l) + ".");
    }
  }

  const BertConfig& config() const { return cfg_; }
  Index n_layers() const { return static_cast<Index>(layers_.size()); }
  Layer& layer(Index l) { return layers_.at(static_cast<std::size_t>(l)); }
  nn::Embedding<S>& word_embeddings() { return word_; }
  nn::Embedding<S>& position_embeddings() { return pos_; }
  nn::Embedding<S>& token_type_embeddings() { return type_; }
  nn::LayerNorm<S>& embeddings_layer_norm() { return emb_ln_; }
  nn::Linear<S>& pooler_dense() { return pooler_; }

  /// Every parameter under its HF name, in state_dict order (bert_parameter_shapes lists the same).
  ParamList<S> parameters() {
    ParamList<S> out{&word_.weight, &pos_.weight, &type_.weight, &emb_ln_.weight, &emb_ln_.bias};
    for (Layer& L : layers_)
      for (Param<S>* p : L.parameters()) out.push_back(p);
    for (Param<S>* p : pooler_.parameters()) out.push_back(p);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }
  /// An optional report from the backward pass: f(i) once the gradients of parameters [i, end) of parameters()
  /// are final for this backward (after the pooler, after each layer, last layer first), so that a data-parallel
  /// exchange can start on them (dist/reducer.hpp). Empty (no report) by default.
  void set_grads_final(std::function<void(std::size_t)> f) { grads_final_ = std::move(f); }

  /// Makes this a bf16 inference model (see the file comment): the product weights packed once as bf16, their float
  /// values and every gradient released. A self-attention class that cannot store its weights (Dual-Expert
  /// attention) keeps them as float and runs its products in bf16. parameters() still lists every parameter, the
  /// stored ones with empty values. Afterwards forward runs its products in bf16 (training = false only) and
  /// backward throws. float models only. Returns weight_bytes().
  std::size_t store_bf16_weights();
  /// True after store_bf16_weights.
  bool has_bf16_weights() const { return pooler16_ != nullptr; }
  /// Bytes of the model's weights as held: float values (gradients not counted) and bf16 copies.
  std::size_t weight_bytes() const;

  /// Adjusts, for layer `layer` alone, a copy of the forward's attention inputs (the copy shares their storage).
  using LayerInputsFn = std::function<void(Index layer, AttnInputs<S>& inputs)>;

  /// Forward pass; dropout is active when `training` (then `rng` is required when a dropout is > 0).
  BertOutput<S> forward(const BertBatch<S>& batch, bool training, Rng* rng, Cache& c) {
    return forward_impl(batch, nullptr, training, rng, c, LayerInputsFn{});
  }
  /// Evaluation-mode forward.
  BertOutput<S> forward(const BertBatch<S>& batch, Cache& c) { return forward(batch, false, nullptr, c); }
  /// Forward with attention inputs the caller built for this batch: AttnInputs(B, T) carrying what the
  /// self-attention reads besides the key mask (a Dual-Expert oracle, targets, gamma_mix) and the training flag and
  /// Rng, which drive every dropout of the model. The key mask is set here from batch.attention_mask (`inputs` must
  /// not hold one). `per_layer`, when set, adjusts a copy of the inputs for each layer (test hooks, what a layer
  /// keeps); every layer reads the same inputs otherwise.
  BertOutput<S> forward(const BertBatch<S>& batch, AttnInputs<S> inputs, Cache& c,
                        const LayerInputsFn& per_layer = LayerInputsFn{}) {
    return forward_impl(batch, &inputs, inputs.training(), inputs.rng(), c, per_layer);
  }

  /// Backward of an objective with dL/d last_hidden_state = *d_last [B*T, H] and dL/d pooler_output = *d_pooled
  /// [B, H] (either may be null); adds into the parameter gradients and returns dL/d inputs_embeds [B*T, H].
  Mat<S> backward(const Mat<S>* d_last, const Mat<S>* d_pooled, Cache& c);

private:
  /// forward with the caller's attention inputs (moved from *given) or, when null, inputs built here.
  BertOutput<S> forward_impl(const BertBatch<S>& batch, AttnInputs<S>* given, bool training, Rng* rng, Cache& c,
                             const LayerInputsFn& per_layer);

  /// Everything but the layers: embeddings, pooler, dropout (zero weights, LayerNorms 1 / 0).
  BertModel(const BertConfig& cfg, int)
      : cfg_((cfg.validate(), cfg)),
        word_(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id),
        pos_(cfg.max_position_embeddings, cfg.hidden_size),
        type_(cfg.type_vocab_size, cfg.hidden_size),
        emb_ln_(cfg.hidden_size, cfg.layer_norm_eps),
        pooler_(detail::zero_linear<S>(cfg.hidden_size, cfg.hidden_size)),
        drop_(cfg.hidden_dropout_prob) {
    prefix_names(word_.parameters(), "embeddings.word_embeddings.");
    prefix_names(pos_.parameters(), "embeddings.position_embeddings.");
    prefix_names(type_.parameters(), "embeddings.token_type_embeddings.");
    prefix_names(emb_ln_.parameters(), "embeddings.LayerNorm.");
    prefix_names(pooler_.parameters(), "pooler.dense.");
  }

  BertConfig cfg_;
  nn::Embedding<S> word_, pos_, type_;
  nn::LayerNorm<S> emb_ln_;
  std::vector<Layer> layers_;
  nn::Linear<S> pooler_;
  nn::Dropout drop_;
  std::function<void(std::size_t)> grads_final_;
  std::shared_ptr<const ops::packed::Bf16Matrix> pooler16_;  ///< the pooler's weight as bf16 (store_bf16_weights)
};

template <class S, class SelfAttention>
std::size_t BertModel<S, SelfAttention>::store_bf16_weights() {
  if constexpr (std::is_same<S, float>::value) {
    if (!pooler16_) {
      for (Layer& L : layers_) L.store_bf16_weights();
      pooler16_ = std::make_shared<const ops::packed::Bf16Matrix>(
          detail::pack_linear_bf16(pooler_.weight.value.data(), pooler_.out_features(), pooler_.in_features()));
      detail::release_value_and_grad(pooler_.weight);
      for (Param<S>* p : parameters()) p->grad = Vec<S>();
    }
  } else {
    check(false, "BertModel::store_bf16_weights: float models only (bf16 is a policy of the float path)");
  }
  return weight_bytes();
}

template <class S, class SelfAttention>
std::size_t BertModel<S, SelfAttention>::weight_bytes() const {
  std::size_t n = 0;
  for (const Param<S>* p : {&word_.weight, &pos_.weight, &type_.weight, &emb_ln_.weight, &emb_ln_.bias,
                            &pooler_.weight, &pooler_.bias})
    n += detail::value_bytes(*p);
  for (const Layer& L : layers_) n += L.weight_bytes();
  if (pooler16_) n += pooler16_->bytes();
  return n;
}

// ---- forward and backward, outside the class (not inline, so that the extern template declarations below keep
// other translation units from instantiating them) ----

template <class S, class SelfAttention>
BertOutput<S> BertModel<S, SelfAttention>::forward_impl(const BertBatch<S>& batch, AttnInputs<S>* given,
                                                        bool training, Rng* rng, Cache& c,
                                                        const LayerInputsFn& per_layer) {
  const Index H = cfg_.hidden_size;
  const bool has_ids = batch.input_ids.dim() > 0, has_embeds = batch.inputs_embeds.dim() > 0;
  check(has_ids || has_embeds, "BertModel::forward: the batch needs input_ids [B, T] or inputs_embeds [B, T, H]");
  check(!(has_ids && has_embeds), "BertModel::forward: give input_ids or inputs_embeds, not both");
  if (has_ids)
    check(batch.input_ids.dim() == 2, "BertModel::forward: input_ids: expected shape [B, T], got ",
          shape_str(batch.input_ids.shape));
  else
    check(batch.inputs_embeds.dim() == 3 && batch.inputs_embeds.size(2) == H,
          "BertModel::forward: inputs_embeds: expected shape [B, T, ", H, "], got ", shape_str(batch.inputs_embeds.shape));
  const Index B = batch.batch(), T = batch.seq_len(), N = B * T;
  check(B > 0 && T > 0, "BertModel::forward: expected a non-empty batch [B, T], got [", B, ", ", T, "]");
  check(T <= cfg_.max_position_embeddings, "BertModel::forward: sequence length ", T,
        " exceeds max_position_embeddings ", cfg_.max_position_embeddings);
  const bool has_mask = batch.attention_mask.dim() > 0, has_types = batch.token_type_ids.dim() > 0;
  if (has_mask) check_shape(batch.attention_mask, {B, T}, "BertModel::forward: attention_mask");
  if (has_types) {
    check_shape(batch.token_type_ids, {B, T}, "BertModel::forward: token_type_ids");
    type_.check_ids(batch.token_type_ids.ptr(), N, "BertModel::forward: token_type_ids");
  }
  if (has_ids) word_.check_ids(batch.input_ids.ptr(), N, "BertModel::forward: input_ids");
  check(!training || rng != nullptr || (cfg_.hidden_dropout_prob == 0 && cfg_.attention_probs_dropout_prob == 0),
        "BertModel::forward: training with dropout needs an Rng");
  check(!(training && pooler16_), "BertModel::forward: the weights are stored as bf16 for inference (training = "
        "false only)");
  if (given) {
    check(given->batch() == B && given->q_len() == T && given->k_len() == T, "BertModel::forward: the attention "
          "inputs were built for B = ", given->batch(), ", T = ", given->q_len(), " x ", given->k_len(),
          "; the batch is [", B, ", ", T, "]");
    check(!given->has_key_mask(), "BertModel::forward: the attention inputs hold a key mask; the model sets it from "
          "the batch's attention_mask");
  }

  // bf16 weights: every product in bf16 (the attention's own products follow the precision as they would without
  // stored weights)
  const ScopedPrecision precision(pooler16_ ? Precision::bf16 : thread_settings().product_precision);
  c.B = B;
  c.T = T;
  c.input_ids = has_ids ? batch.input_ids : Tensor<std::int64_t>();
  c.token_types.assign(static_cast<std::size_t>(N), 0);
  if (has_types) std::copy(batch.token_type_ids.ptr(), batch.token_type_ids.ptr() + N, c.token_types.begin());
  c.positions.resize(static_cast<std::size_t>(N));
  for (Index n = 0; n < N; ++n) c.positions[static_cast<std::size_t>(n)] = n % T;

  AttnInputs<S>& in = c.inputs;
  if (given) {
    in = std::move(*given);
  } else {
    in = AttnInputs<S>(B, T);
    in.set_training(training, rng);
  }
  if (has_mask) in.set_key_mask(batch.attention_mask);

  // ---- embeddings: E = word[ids] + token_type[tt] + position[t], x0 = Dropout(LN(E))
  if (has_ids) {
    word_.forward(batch.input_ids.ptr(), N, S(1), c.e);                         // E = word[ids]
  } else {
    check_finite(batch.inputs_embeds.matrix(H), "BertModel::forward: inputs_embeds");
    c.e = batch.inputs_embeds.matrix(H);                                         // E = inputs_embeds
  }
  type_.forward(c.token_types.data(), N, S(1), c.e, true);                      //   + token_type[tt]
  pos_.forward(c.positions.data(), N, S(1), c.e, true);                         //   + position[t]
  Mat<S> x;
  emb_ln_.forward(c.e, x, c.ln);                                                 // LN_emb(E)
  drop_.forward(x, training, rng, c.drop);                                       // x0 = Dropout(.)

  // ---- encoder layers
  const std::size_t L = layers_.size();
  c.layers.resize(L);
  for (std::size_t l = 0; l < L; ++l) {
    if (per_layer) {
      AttnInputs<S> var = in;
      per_layer(static_cast<Index>(l), var);
      x = layers_[l].forward(x, var, c.layers[l]);                 // x_{l+1} = Layer_l(x_l)
    } else {
      x = layers_[l].forward(x, in, c.layers[l]);                  // x_{l+1} = Layer_l(x_l)
    }
  }

  // ---- pooler: tanh(x_L[:, 0] W_p^T + b_p)
  BertOutput<S> out;
  c.first.resize(B, H);
  for (Index b = 0; b < B; ++b) c.first.row(b) = x.row(b * T);
  Mat<S> t;
  if constexpr (std::is_same<S, float>::value) {
    if (pooler16_)
      detail::linear_bf16(c.first, *pooler16_, pooler_.bias.value.data(), t);  // t = first W_p^T + b_p
    else
      pooler_.forward(c.first, t);
  } else {
    pooler_.forward(c.first, t);
  }
  c.pooled = t.array().tanh().matrix();
  out.pooler_output = c.pooled;
  out.last_hidden_state = std::move(x);
  return out;
}

template <class S, class SelfAttention>
Mat<S> BertModel<S, SelfAttention>::backward(const Mat<S>* d_last, const Mat<S>* d_pooled, Cache& c) {
  check(!pooler16_, "BertModel::backward: the weights are stored as bf16 for inference");
  check(c.B > 0, "BertModel::backward: the cache holds no forward pass");
  const Index B = c.B, T = c.T, N = B * T, H = cfg_.hidden_size;
  Mat<S> dx;
  if (d_last) {
    check_matrix(*d_last, N, H, "BertModel::backward: d_last_hidden_state");
    dx = *d_last;
  } else {
    dx = Mat<S>::Zero(N, H);
  }
  if (d_pooled) {
    check_matrix(*d_pooled, B, H, "BertModel::backward: d_pooler_output");
    const Mat<S> dt = d_pooled->cwiseProduct((S(1) - c.pooled.array().square()).matrix());  // pooled = tanh(t)
    Mat<S> dfirst;
    pooler_.backward(dt, c.first, &dfirst);                     // t = first W_p^T + b_p
    for (Index b = 0; b < B; ++b) dx.row(b * T) += dfirst.row(b);  // first = x_L[:, 0]
  }
  std::vector<std::size_t> first(layers_.size() + 1, 5);  // parameters() index of layer l: after the embeddings
  if (grads_final_) {
    for (std::size_t l = 0; l < layers_.size(); ++l) first[l + 1] = first[l] + layers_[l].parameters().size();
    grads_final_(first.back());                                 // the pooler (and what a caller lists after it)
  }
  for (std::size_t l = layers_.size(); l-- > 0;) {
    dx = layers_[l].backward(dx, c.layers[l]);                  // x_{l+1} = Layer_l(x_l)
    if (grads_final_) grads_final_(first[l]);
  }
  nn::Dropout::backward(dx, c.drop);                            // x0 = Dropout(.)
  Mat<S> de;
  emb_ln_.backward(dx, c.e, c.ln, de);                          // LN_emb(E)
  // E = word[ids] + token_type[tt] + position[t]
  pos_.backward(de, c.positions.data(), N, S(1));
  type_.backward(de, c.token_types.data(), N, S(1));
  if (c.input_ids.dim() > 0) word_.backward(de, c.input_ids.ptr(), N, S(1));  // padding row: no gradient
  return de;
}

#ifdef DEA_EXTERN_TEMPLATES
extern template class BertModel<float>;
extern template class BertModel<double>;
#endif

}  // namespace bert
}  // namespace dea
