// dea/nn/transformer.hpp: the reference's TransformerModel (transformer.py): embeddings, pre-LN encoder layers
// with a pluggable attention (Dual-Expert by default), final LayerNorm, a cls head and a tied MLM head, the task
// cross-entropy and the model-level gate loss, with hand-derived backward passes.
//
// Shapes (B batch, T tokens, N = B*T rows, row b*T + t; D = d_model; V = vocab_size; C = n_classes):
//   x0 = tok_emb[ids] * sqrt(D) (+ seg_emb[token_type_ids]) + PE[:T]          [N, D]
//   x0 = Dropout(x0)
//   x_{l+1} = EncoderLayer_l(x_l; in_l)                                         [N, D]   (encoder_layer.hpp)
//   y  = ln_f(x_L)                                                              [N, D]
//   cls:  logits = Linear3(Dropout(tanh(Linear0(y[b*T + 0])))                   [B, C]   (cls_head.0, cls_head.3)
//   mlm:  logits = y tok_emb.weight^T + mlm_head.bias                            [N, V]   (weight tied)
//   task_loss = CE(logits, labels), mean; labels [B] (cls) or [B, T] with -100 = ignore (mlm)
//   loss_gate = sum_l loss_gate_l / max(1, n_supervised) with an oracle, else 0
//   loss      = task_loss + loss_gate
// in_l: the one AttnInputs of the forward (built once from the batch: key mask = attention_mask, gamma_mix, the
// oracle [B, T, T] and target_idx, training and rng), given to supervised layers as it is (all layers unless
// ModelConfig::supervise_layers says otherwise) and to the others as in.without_oracle(), which shares its storage.
// (The reference also passes target_idx to unsupervised layers, where it has no effect without an oracle.)
// The cache keeps that AttnInputs until backward, so the model holds one oracle, however many layers read it.
//
// Backward contract (docs/architecture.md, the call contract): every backward *adds* into the parameter gradients.
//   backward_task(cache)   d task_loss: through the heads, ln_f, every layer's task path and the embeddings; it
//                          never writes W_gate / c_gate (the scores read alpha-hat as a constant).
//   backward_gate(cache)   d loss_gate: each supervised layer's gate backward with scale 1 / max(1, n_supervised);
//                          it writes only W_gate / c_gate (the gate reads Q, K, E~ as constants).
//   backward(cache)        both, i.e. d(task_loss + loss_gate).
//   backward_logits(g, c)  the task path for an arbitrary dL/dlogits g (for <logits, R> objectives).
//
// Parameters (the reference's state_dict names and order): tok_emb.weight [V, D], seg_emb.weight [2, D],
// layers.{i}.attn.*, layers.{i}.ln1.*, layers.{i}.ln2.*, layers.{i}.ff.0.*, layers.{i}.ff.3.*, ln_f.weight,
// ln_f.bias, cls_head.0.weight [D, D], cls_head.0.bias, cls_head.3.weight [C, D], cls_head.3.bias,
// mlm_head.bias [V]. Both heads always exist, as in the reference (the unused one gets no gradient);
// mlm_head.weight *is* tok_emb.weight (the reference's state_dict lists it under both names; it is listed once
// here). Groups: W_gate and c_gate "gate", everything else "main".
//
// Initialisation (our Rng, in this order): tok_emb N(0, 1/D) over the whole table including the padding row;
// seg_emb N(0, 1); each layer (attention by its own class, LayerNorms 1 / 0, FFN PyTorch Linear defaults);
// ln_f 1 / 0; cls_head.0, cls_head.3 PyTorch Linear defaults; mlm_head.bias U(+-1/sqrt(D)).
//
// Dropout (p = ModelConfig::dropout) after the embeddings, in every attention (probabilities), on both residual
// branches, in the FFN hidden layer and in the cls head; active only in training mode, drawn from the Rng the
// caller passes to forward (same seed, same masks).
#pragma once

#include "../attention/dual_expert.hpp"
#include "../attention/inputs.hpp"
#include "../core/error.hpp"
#include "../core/init.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/cross_entropy.hpp"
#include "../ops/linear.hpp"
#include "attention_traits.hpp"
#include "dropout.hpp"
#include "embedding.hpp"
#include "encoder_layer.hpp"
#include "layer_norm.hpp"
#include "linear.hpp"
#include "positional.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dea {
namespace nn {

/// The model's head and loss.
enum class Task { cls, mlm };

inline const char* to_string(Task t) { return t == Task::cls ? "cls" : "mlm"; }

/// "cls" or "mlm"; throws dea::Error otherwise.
inline Task parse_task(const std::string& s) {
  if (s == "cls") return Task::cls;
  if (s == "mlm") return Task::mlm;
  ::dea::detail::raise("task: expected 'cls' or 'mlm', got '" + s + "'");
}

/// The constructor arguments of the reference's TransformerModel (its defaults).
struct ModelConfig {
  Index vocab_size = 0;   ///< V (required)
  Index d_model = 512;    ///< D
  Index n_heads = 8;      ///< H (D must be a multiple)
  Index n_layers = 6;     ///< number of encoder layers (0 allowed: embeddings straight into ln_f)
  Index d_ff = 2048;      ///< FFN hidden width
  Index max_len = 512;    ///< size of the positional table (longest sequence)
  double dropout = 0.1;   ///< every dropout of the model, in [0, 1)
  Index n_classes = 2;    ///< cls head width
  Index pad_id = 0;       ///< padding token: its embedding row gets no lookup gradient (-1: none)
  Task task = Task::cls;
  /// Layers that receive the oracle and whose gate losses are averaged. nullopt = all layers. Entries are
  /// taken modulo n_layers (so -1 is the last layer, as in the reference); duplicates count once.
  std::optional<std::vector<Index>> supervise_layers;

  /// Throws dea::Error naming the first bad field.
  void validate() const {
    check(vocab_size > 0, "ModelConfig: vocab_size must be positive, got ", vocab_size);
    check(d_model > 0, "ModelConfig: d_model must be positive, got ", d_model);
    check(n_heads > 0, "ModelConfig: n_heads must be positive, got ", n_heads);
    check(d_model % n_heads == 0, "ModelConfig: d_model (", d_model, ") must be a multiple of n_heads (", n_heads, ")");
    check(n_layers >= 0, "ModelConfig: n_layers must be >= 0, got ", n_layers);
    check(d_ff > 0, "ModelConfig: d_ff must be positive, got ", d_ff);
    check(max_len > 0, "ModelConfig: max_len must be positive, got ", max_len);
    check(dropout >= 0 && dropout < 1, "ModelConfig: dropout must be in [0, 1), got ", dropout);
    check(n_classes > 0, "ModelConfig: n_classes must be positive, got ", n_classes);
    check(pad_id >= -1 && pad_id < vocab_size, "ModelConfig: pad_id: expected -1 (none) or an id in [0, ", vocab_size,
          "), got ", pad_id);
    check(!supervise_layers || supervise_layers->empty() || n_layers > 0,
          "ModelConfig: supervise_layers given for a model without layers");
  }
};

/// One batch for TransformerModel. An optional tensor is absent when default-constructed (dim() == 0): that is the
/// only spelling of "absent". An oracle that is present but all NaN is an oracle with no labelled cell (the
/// supervised layers run their gate loss, which is 0 on it), not an absent one; data::collate_pairs leaves the
/// oracle absent when no record of the batch is labelled. target_idx needs alpha_oracle (an error otherwise).
/// (data::PairBatch has the same field names, so a collated batch copies over field by field.)
template <class S>
struct ModelBatch {
  Tensor<std::int64_t> input_ids;       ///< [B, T] token ids in [0, vocab_size) (required)
  Tensor<std::uint8_t> attention_mask;  ///< [B, T], non-zero = real token (the key mask); absent = all real
  Tensor<std::int64_t> token_type_ids;  ///< [B, T] in {0, 1}; absent = no segment embedding
  Tensor<S> alpha_oracle;               ///< [B, T, T] (or [B, H, T, T]), NaN = unlabelled; absent = inference path
  Tensor<std::int64_t> target_idx;      ///< [B, T] (or [B, H, T]), -1 = none; absent = the oracle winner (needs the oracle)
  Tensor<std::int64_t> labels;          ///< [B] (cls) or [B, T] with -100 = ignore (mlm); absent = no task loss

  Index batch() const { return input_ids.dim() == 2 ? input_ids.size(0) : 0; }
  Index seq_len() const { return input_ids.dim() == 2 ? input_ids.size(1) : 0; }
};

/// What forward returns.
template <class S>
struct ModelOutput {
  Mat<S> logits;                  ///< [B, n_classes] (cls) or [B*T, vocab_size] (mlm, row b*T + t)
  bool has_task_loss = false;     ///< labels were given
  S task_loss = 0;                ///< mean CE (0 without labels, or when every mlm label is -100)
  Index n_targets = 0;            ///< rows counted by the CE
  S loss_gate = 0;                ///< sum of the supervised layers' gate losses / max(1, n_supervised); 0 without oracle
  std::vector<S> layer_loss_gate;           ///< per layer (0 for layers without oracle)
  std::vector<GateStats> layer_stats;       ///< per layer (default values for layers without oracle)
  std::vector<std::uint8_t> layer_supervised;  ///< per layer: 1 = received the oracle
  /// task_loss + loss_gate (the training objective).
  S loss() const { return task_loss + loss_gate; }
};

/// Result of TransformerModel::verify_gradient_isolation (sums of |grad|).
struct ModelIsolationReport {
  double task_gate_grad = 0;   ///< gate group after the task backward (must be exactly 0)
  double task_rel_grad = 0;    ///< every W_rel after the task backward (must be > 0)
  double gate_main_grad = 0;   ///< main group after the gate backward (must be exactly 0)
  double gate_rel_grad = 0;    ///< every W_rel after the gate backward (must be exactly 0; part of gate_main_grad)
  double gate_gate_grad = 0;   ///< gate group after the gate backward (> 0 when some pair is labelled)
  bool ok = false;
};

template <class S, class Attention = DualExpertAttention<S>>
class TransformerModel {
  static_assert(std::is_floating_point<S>::value, "TransformerModel: Scalar must be float or double");

public:
  using Scalar = S;
  using Layer = EncoderLayer<S, Attention>;
  using AttentionOptions = typename Attention::Options;
  /// Builds the attention options of layer `l` (default: default_attention_options, dropout = config.dropout).
  using AttentionOptionsFn = std::function<AttentionOptions(Index layer)>;
  static constexpr bool has_gate = Layer::has_gate;

  /// Everything backward needs, filled by forward. Backward reads it and leaves it unchanged.
  struct Cache {
    Index B = 0, T = 0;
    AttnInputs<S> inputs;                  ///< the attention inputs every layer read (one oracle for all layers)
    Tensor<std::int64_t> input_ids;       ///< [B, T] copy
    Tensor<std::int64_t> token_type_ids;  ///< [B, T] copy (absent: no segment embedding)
    DropoutState drop_emb;
    std::vector<typename Layer::Cache> layers;
    Mat<S> xf;                             ///< [N, D] ln_f input
    typename LayerNorm<S>::Cache lnf;
    Mat<S> pooled;                         ///< cls: [B, D] ln_f output at position 0
    Mat<S> z;                              ///< cls: [B, D] tanh output (before dropout)
    DropoutState drop_cls;
    Mat<S> yf;                             ///< mlm: [N, D] ln_f output
    bool has_task_loss = false;
    Mat<S> dlogits;                        ///< d task_loss / d logits (when labels were given)
    bool has_oracle = false;
    Index n_supervised = 0;
  };

  TransformerModel(const ModelConfig& cfg, Rng& rng) : TransformerModel(cfg, rng, AttentionOptionsFn{}) {}

  TransformerModel(const ModelConfig& cfg, Rng& rng, AttentionOptionsFn make_options)
      : cfg_((cfg.validate(), cfg)),
        tok_emb_(cfg.vocab_size, cfg.d_model, cfg.pad_id),
        seg_emb_(2, cfg.d_model),
        pos_(cfg.max_len, cfg.d_model),
        ln_f_(cfg.d_model),
        drop_(cfg.dropout) {
    const Index D = cfg.d_model;
    tok_emb_.reset_parameters(rng, 1.0 / std::sqrt(static_cast<double>(D)));
    seg_emb_.reset_parameters(rng, 1.0);
    prefix_names(tok_emb_.parameters(), "tok_emb.");
    prefix_names(seg_emb_.parameters(), "seg_emb.");
    layers_.reserve(static_cast<std::size_t>(cfg.n_layers));
    for (Index l = 0; l < cfg.n_layers; ++l) {
      const AttentionOptions o =
          make_options ? make_options(l) : default_attention_options<Attention>(cfg.dropout, l, cfg.n_layers);
      layers_.emplace_back(D, cfg.n_heads, cfg.d_ff, cfg.dropout, rng, o);
      prefix_names(layers_.back().parameters(), "layers." + std::to_string(l) + ".");
    }
    prefix_names(ln_f_.parameters(), "ln_f.");
    cls0_ = Linear<S>(D, D, rng);
    cls3_ = Linear<S>(D, cfg.n_classes, rng);
    prefix_names(cls0_.parameters(), "cls_head.0.");
    prefix_names(cls3_.parameters(), "cls_head.3.");
    mlm_bias_ = Param<S>("mlm_head.bias", "main", {cfg.vocab_size});
    const double bb = 1.0 / std::sqrt(static_cast<double>(D));
    init::uniform(mlm_bias_.value, rng, -bb, bb);

    supervised_.assign(static_cast<std::size_t>(cfg.n_layers), cfg.supervise_layers ? 0 : 1);
    if (cfg.supervise_layers)
      for (Index l : *cfg.supervise_layers) {
        const Index m = ((l % cfg.n_layers) + cfg.n_layers) % cfg.n_layers;  // Python's i % n_layers
        supervised_[static_cast<std::size_t>(m)] = 1;
      }
    n_supervised_ = 0;
    for (std::uint8_t s : supervised_) n_supervised_ += s;
  }

  const ModelConfig& config() const { return cfg_; }
  Index n_layers() const { return static_cast<Index>(layers_.size()); }
  Layer& layer(Index l) { return layers_.at(static_cast<std::size_t>(l)); }
  Embedding<S>& tok_emb() { return tok_emb_; }
  Embedding<S>& seg_emb() { return seg_emb_; }
  const SinusoidalPositionalEncoding<S>& positional() const { return pos_; }
  SinusoidalPositionalEncoding<S>& positional() { return pos_; }
  LayerNorm<S>& ln_f() { return ln_f_; }
  Linear<S>& cls_head0() { return cls0_; }
  Linear<S>& cls_head3() { return cls3_; }
  Param<S>& mlm_bias() { return mlm_bias_; }
  /// Number of layers that receive the oracle.
  Index n_supervised() const { return n_supervised_; }
  bool is_supervised(Index l) const { return supervised_.at(static_cast<std::size_t>(l)) != 0; }

  /// Every parameter under its state_dict name, in the reference's order.
  ParamList<S> parameters() {
    ParamList<S> out{&tok_emb_.weight, &seg_emb_.weight};
    for (Layer& L : layers_)
      for (Param<S>* p : L.parameters()) out.push_back(p);
    out.push_back(&ln_f_.weight);
    out.push_back(&ln_f_.bias);
    for (Param<S>* p : cls0_.parameters()) out.push_back(p);
    for (Param<S>* p : cls3_.parameters()) out.push_back(p);
    out.push_back(&mlm_bias_);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }
  /// An optional report from the backward pass: f(i) once the gradients of parameters [i, end) of parameters()
  /// are final for this backward (after the heads, after each layer, last layer first), so that a data-parallel
  /// exchange can start on them (dist/reducer.hpp). backward() then runs the gate part before the task part (each
  /// writes gradients the other never touches, so the bits are the same). Empty (no report) by default.
  void set_grads_final(std::function<void(std::size_t)> f) { grads_final_ = std::move(f); }

  /// Forward pass on `batch` with mixing weight gamma_mix. Dropout is active when `training` (then `rng` is
  /// required when dropout > 0). Fills `cache` for the backward passes; the cache holds one copy of the oracle
  /// and targets (Cache::inputs).
  ModelOutput<S> forward(const ModelBatch<S>& batch, S gamma_mix, bool training, Rng* rng, Cache& c) {
    return forward_(batch, Tensor<S>(batch.alpha_oracle), Tensor<std::int64_t>(batch.target_idx), gamma_mix, training,
                    rng, c);
  }
  /// The same on a batch the caller gives away: its oracle and targets are moved into the cache, not copied.
  ModelOutput<S> forward(ModelBatch<S>&& batch, S gamma_mix, bool training, Rng* rng, Cache& c) {
    Tensor<S> oracle = std::move(batch.alpha_oracle);
    Tensor<std::int64_t> targets = std::move(batch.target_idx);
    return forward_(batch, std::move(oracle), std::move(targets), gamma_mix, training, rng, c);
  }

  /// Backward of task_loss + loss_gate (adds into the gradients). Without labels only the gate part runs;
  /// without an oracle only the task part.
  void backward(Cache& c) {
    if (grads_final_) {  // the gate gradients first: the task pass then reports final gradients layer by layer
      backward_gate(c);
      backward_task(c);
      return;
    }
    backward_task(c);
    backward_gate(c);
  }

  /// Backward of task_loss alone (no-op without labels).
  void backward_task(Cache& c) {
    check(c.B > 0, "TransformerModel::backward: the cache holds no forward pass");
    if (c.has_task_loss) backward_logits(c.dlogits, c);
  }

  /// Backward of loss_gate alone: scale 1 / max(1, n_supervised) into each supervised layer's gate.
  void backward_gate(Cache& c) {
    check(c.B > 0, "TransformerModel::backward_gate: the cache holds no forward pass");
    if (!c.has_oracle) return;
    const S scale = S(1) / S(n_supervised_ > 0 ? n_supervised_ : 1);
    for (std::size_t l = 0; l < layers_.size(); ++l)
      if (supervised_[l]) layers_[l].backward_gate(c.layers[l], scale);  // loss_gate = sum_l loss_l / n_sup
  }

  /// Task-path backward for dL/dlogits = dlogits ([B, n_classes] or [B*T, vocab_size]).
  void backward_logits(const Mat<S>& dlogits, Cache& c);

  /// The reference's verify_gradient_isolation: one training-mode forward at gamma_mix (dropout drawn from an Rng
  /// seeded with `seed`), the task backward alone, then the gate backward alone. The batch needs labels and an
  /// oracle. Every gradient of the model is cleared before, between and after.
  ModelIsolationReport verify_gradient_isolation(const ModelBatch<S>& batch, S gamma_mix = S(0.5),
                                                 std::uint64_t seed = 0);

  // ---- test hook: hold alpha-hat fixed in the scores (finite-difference checks of the task path) ----

  /// Per layer, alpha-hat values [B, H, T, T] the scores use instead of the gate's own (an absent tensor leaves
  /// that layer alone). Pass an empty vector to clear.
  void set_frozen_alpha_hat(std::vector<Tensor<S>> per_layer) {
    check(per_layer.empty() || per_layer.size() == layers_.size(),
          "TransformerModel::set_frozen_alpha_hat: expected one tensor per layer (", layers_.size(), "), got ",
          per_layer.size());
    frozen_ = std::move(per_layer);
  }
  /// Freezes alpha-hat at the values of the forward pass that filled `c`.
  void freeze_alpha_hat(const Cache& c) {
    if constexpr (has_gate) {
      std::vector<Tensor<S>> f(layers_.size());
      for (std::size_t l = 0; l < layers_.size(); ++l) {
        const auto& ah = c.layers[l].attn.alpha_hat;
        f[l] = Tensor<S>({c.B, layers_[l].attention().n_heads(), c.T, c.T});
        check(f[l].numel() == static_cast<Index>(ah.size()), "TransformerModel::freeze_alpha_hat: cache mismatch");
        for (Index k = 0; k < f[l].numel(); ++k) f[l][k] = ah[static_cast<std::size_t>(k)];
      }
      frozen_ = std::move(f);
    }
  }
  void clear_frozen_alpha_hat() { frozen_.clear(); }

  /// What the attention keeps when the layers' options pick a kernel without maps (DualExpertAttention's tiled
  /// kernel; the reference kernel always keeps every map):
  ///  - eval_maps (default true): evaluation-mode forwards run the reference kernel, so every layer's
  ///    [B, H, T, T] maps are in the cache (evaluation metrics, the Paris probe and plots read them);
  ///  - train_alpha_hat (default true): training forwards keep the last layer's alpha-hat (the training metrics).
  /// Training forwards otherwise keep O(T) per layer.
  void set_map_policy(bool eval_maps, bool train_alpha_hat) {
    eval_maps_ = eval_maps;
    train_alpha_hat_ = train_alpha_hat;
  }

private:
  /// forward with the batch's oracle and targets given apart (moved into the cache's AttnInputs).
  ModelOutput<S> forward_(const ModelBatch<S>& batch, Tensor<S> oracle, Tensor<std::int64_t> targets, S gamma_mix,
                          bool training, Rng* rng, Cache& c);

  template <class T>
  static bool present(const Tensor<T>& t) {
    return t.dim() > 0;
  }
  static bool is_rel(const Param<S>& p) {
    const std::string suffix = "W_rel";
    return p.name.size() >= suffix.size() && p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }
  S emb_scale() const { return static_cast<S>(std::sqrt(static_cast<double>(cfg_.d_model))); }

  ModelConfig cfg_;
  Embedding<S> tok_emb_, seg_emb_;
  SinusoidalPositionalEncoding<S> pos_;
  std::vector<Layer> layers_;
  LayerNorm<S> ln_f_;
  Linear<S> cls0_, cls3_;
  Param<S> mlm_bias_;
  Dropout drop_;
  std::vector<std::uint8_t> supervised_;
  Index n_supervised_ = 0;
  std::function<void(std::size_t)> grads_final_;
  std::vector<Tensor<S>> frozen_;
  bool eval_maps_ = true;        // set_map_policy
  bool train_alpha_hat_ = true;
};

// ---- forward and backward, defined outside the class: not inline, so that an `extern template` declaration
// (below) keeps other translation units from instantiating the layers behind them ----

template <class S, class Attention>
auto TransformerModel<S, Attention>::forward_(const ModelBatch<S>& batch, Tensor<S> oracle,
                                              Tensor<std::int64_t> targets, S gamma_mix, bool training, Rng* rng,
                                              Cache& c) -> ModelOutput<S> {
  const Index D = cfg_.d_model;
  check(batch.input_ids.dim() == 2, "TransformerModel::forward: input_ids: expected shape [B, T], got ",
        shape_str(batch.input_ids.shape));
  const Index B = batch.input_ids.size(0), T = batch.input_ids.size(1), N = B * T;
  check(B > 0 && T > 0, "TransformerModel::forward: input_ids: expected a non-empty [B, T], got ",
        shape_str(batch.input_ids.shape));
  check(T <= cfg_.max_len, "TransformerModel::forward: sequence length ", T, " exceeds max_len ", cfg_.max_len);
  if (present(batch.attention_mask))
    check_shape(batch.attention_mask, {B, T}, "TransformerModel::forward: attention_mask");
  if (present(batch.token_type_ids))
    check_shape(batch.token_type_ids, {B, T}, "TransformerModel::forward: token_type_ids");
  if (present(batch.labels))
    check_shape(batch.labels, cfg_.task == Task::cls ? Shape{B} : Shape{B, T}, "TransformerModel::forward: labels");
  check(gamma_mix >= 0 && gamma_mix <= 1, "TransformerModel::forward: gamma_mix must be in [0, 1], got ", gamma_mix);
  check(!training || cfg_.dropout == 0 || rng != nullptr, "TransformerModel::forward: training with dropout ",
        cfg_.dropout, " needs an Rng");
  check(!present(targets) || present(oracle),
        "TransformerModel::forward: target_idx was given without alpha_oracle (the gate loss needs both)");
  if (!frozen_.empty())
    check(frozen_.size() == layers_.size(), "TransformerModel: frozen alpha-hat: expected one tensor per layer (",
          layers_.size(), "), got ", frozen_.size());

  c = Cache();
  c.B = B;
  c.T = T;
  c.input_ids = batch.input_ids;
  if (present(batch.token_type_ids)) c.token_type_ids = batch.token_type_ids;
  c.n_supervised = n_supervised_;

  // ---- the attention inputs, built and validated once for every layer
  constexpr AttnSupport support = traits::support<Attention>();
  AttnInputs<S>& in = c.inputs;
  in = AttnInputs<S>(B, T);
  if (present(batch.attention_mask)) in.set_key_mask(batch.attention_mask);
  if (present(oracle)) in.set_oracle(std::move(oracle));          // +-inf rejected here, once
  if (present(targets)) in.set_targets(std::move(targets));
  in.set_gamma_mix(gamma_mix);
  in.set_training(training, rng);
  if (support.keep_maps) in.set_keep_maps(!training && eval_maps_);
  c.has_oracle = in.has_oracle();
  const AttnInputs<S> unsupervised = in.without_oracle();  // shares the mask (and everything but the oracle)

  // ---- embeddings: x = tok_emb[ids] sqrt(D) (+ seg_emb[tt]) + PE[:T], then dropout
  Mat<S> x;
  tok_emb_.forward(batch.input_ids.ptr(), N, emb_scale(), x);
  if (present(c.token_type_ids)) seg_emb_.forward(c.token_type_ids.ptr(), N, S(1), x, true);
  pos_.add_to(x, B);
  drop_.forward(x, training, rng, c.drop_emb);

  // ---- encoder layers
  ModelOutput<S> out;
  const std::size_t L = layers_.size();
  c.layers.resize(L);
  out.layer_loss_gate.assign(L, S(0));
  out.layer_stats.assign(L, GateStats{});
  out.layer_supervised.assign(L, 0);
  for (std::size_t l = 0; l < L; ++l) {
    const bool sup = c.has_oracle && supervised_[l];
    out.layer_supervised[l] = sup ? 1 : 0;
    const AttnInputs<S>& base = sup ? in : unsupervised;
    // the last layer of a training forward keeps alpha-hat (the training metrics); the test hook freezes
    // alpha-hat per layer: both are per-layer variants of the same inputs (a copy shares the storage)
    const bool keep_ah = has_gate && training && train_alpha_hat_ && l + 1 == L;
    const bool frozen = !frozen_.empty() && present(frozen_[l]);
    if (keep_ah || frozen) {
      AttnInputs<S> var = base;
      if (keep_ah) var.set_keep_alpha_hat(true);
      if (frozen) var.set_frozen_alpha_hat(frozen_[l]);
      x = layers_[l].forward(std::move(x), var, c.layers[l], &batch.input_ids);
    } else {
      x = layers_[l].forward(std::move(x), base, c.layers[l], &batch.input_ids);
    }
    out.layer_loss_gate[l] = layers_[l].loss_gate(c.layers[l]);
    if constexpr (traits::has_gate_stats<Attention>::value)
      if (out.layer_supervised[l]) out.layer_stats[l] = c.layers[l].attn.stats;
  }
  // loss_gate = sum_l loss_gate_l / max(1, n_supervised) (with an oracle; the sum is 0 without one)
  S gsum = 0;
  for (S v : out.layer_loss_gate) gsum += v;
  out.loss_gate = c.has_oracle ? gsum / S(n_supervised_ > 0 ? n_supervised_ : 1) : gsum;

  // ---- final LayerNorm and head
  c.xf = std::move(x);
  Mat<S> y;
  ln_f_.forward(c.xf, y, c.lnf);                                  // y = ln_f(x_L)
  if (cfg_.task == Task::cls) {
    c.pooled.resize(B, D);
    for (Index b = 0; b < B; ++b) c.pooled.row(b) = y.row(b * T);  // y[:, 0]
    Mat<S> t;
    cls0_.forward(c.pooled, t);                                   // t = pooled W0^T + b0
    c.z = t.array().tanh().matrix();                              // z = tanh(t)
    Mat<S> zd = c.z;
    drop_.forward(zd, training, rng, c.drop_cls);                // zd = Dropout(z)
    cls3_.forward(zd, out.logits);                                // logits = zd W3^T + b3
  } else {
    c.yf = std::move(y);
    ops::linear_forward<S>(c.yf, tok_emb_.weight.mat(), mlm_bias_.value.data(), out.logits);  // y E^T + b
  }

  // ---- task loss
  if (present(batch.labels)) {
    const auto ce = ops::cross_entropy<S>(out.logits, batch.labels.ptr(), batch.labels.numel(), -100, true);
    out.has_task_loss = true;
    out.task_loss = ce.loss;
    out.n_targets = ce.count;
    c.has_task_loss = true;
    c.dlogits = ce.dlogits;
  }
  return out;
}

template <class S, class Attention>
void TransformerModel<S, Attention>::backward_logits(const Mat<S>& dlogits, Cache& c) {
  check(c.B > 0, "TransformerModel::backward_logits: the cache holds no forward pass");
  const Index B = c.B, T = c.T, N = B * T, D = cfg_.d_model;
  Mat<S> dy;
  if (cfg_.task == Task::cls) {
    check_matrix(dlogits, B, cfg_.n_classes, "TransformerModel::backward_logits: dlogits");
    Mat<S> zd = c.z;
    Dropout::apply(zd, c.drop_cls);                                 // recompute zd = Dropout(z)
    Mat<S> dzd;
    cls3_.backward(dlogits, zd, &dzd);                              // logits = zd W3^T + b3
    Dropout::backward(dzd, c.drop_cls);                             // zd = Dropout(z)
    const Mat<S> dt = dzd.cwiseProduct((S(1) - c.z.array().square()).matrix());  // z = tanh(t)
    Mat<S> dpooled;
    cls0_.backward(dt, c.pooled, &dpooled);                         // t = pooled W0^T + b0
    dy = Mat<S>::Zero(N, D);
    for (Index b = 0; b < B; ++b) dy.row(b * T) = dpooled.row(b);   // pooled = y[:, 0]
  } else {
    check_matrix(dlogits, N, cfg_.vocab_size, "TransformerModel::backward_logits: dlogits");
    // logits = y E^T + b  ->  dE += dlogits^T y (the tied table, padding row included), db, dy = dlogits E
    ops::linear_backward<S>(dlogits, c.yf, tok_emb_.weight.mat(), tok_emb_.weight.grad_mat(), mlm_bias_.grad.data(),
                            &dy);
  }
  Mat<S> dx;
  ln_f_.backward(dy, c.xf, c.lnf, dx);                              // y = ln_f(x_L)
  std::vector<std::size_t> first(layers_.size() + 1, 2);  // parameters() index of layer l: after the two embeddings
  if (grads_final_) {
    for (std::size_t l = 0; l < layers_.size(); ++l) first[l + 1] = first[l] + layers_[l].parameters().size();
    grads_final_(first.back());                                     // ln_f and the heads
  }
  for (std::size_t l = layers_.size(); l-- > 0;) {
    dx = layers_[l].backward(dx, c.layers[l]);
    if (grads_final_) grads_final_(first[l]);                       // layer l
  }
  Dropout::backward(dx, c.drop_emb);                                // x0 = Dropout(.)
  // x0 = tok_emb[ids] sqrt(D) + seg_emb[tt] + PE  (PE is a constant)
  if (present(c.token_type_ids)) seg_emb_.backward(dx, c.token_type_ids.ptr(), N, S(1));
  tok_emb_.backward(dx, c.input_ids.ptr(), N, emb_scale());
}

template <class S, class Attention>
auto TransformerModel<S, Attention>::verify_gradient_isolation(const ModelBatch<S>& batch, S gamma_mix,
                                                               std::uint64_t seed) -> ModelIsolationReport {
  check(present(batch.labels) && present(batch.alpha_oracle),
        "TransformerModel::verify_gradient_isolation: the batch needs labels and alpha_oracle");
  ModelIsolationReport r;
  if constexpr (!has_gate) {
    ::dea::detail::raise("TransformerModel::verify_gradient_isolation: the attention class has no gate");
  } else {
    Rng rng(seed);
    Cache c;
    zero_grad();
    forward(batch, gamma_mix, true, &rng, c);
    backward_task(c);
    for (Param<S>* p : parameters()) {
      const double s = static_cast<double>(p->grad.cwiseAbs().sum());
      if (p->group == "gate") r.task_gate_grad += s;
      if (is_rel(*p)) r.task_rel_grad += s;
    }
    zero_grad();
    backward_gate(c);
    for (Param<S>* p : parameters()) {
      const double s = static_cast<double>(p->grad.cwiseAbs().sum());
      (p->group == "gate" ? r.gate_gate_grad : r.gate_main_grad) += s;
      if (is_rel(*p)) r.gate_rel_grad += s;
    }
    zero_grad();
    r.ok = r.task_gate_grad == 0 && r.task_rel_grad > 0 && r.gate_main_grad == 0 && r.gate_rel_grad == 0 &&
           r.gate_gate_grad > 0;
  }
  return r;
}

// The project's own programs and tests compile these two instances once (cmake/instances.cmake).
#ifdef DEA_EXTERN_TEMPLATES
extern template class TransformerModel<float>;
extern template class TransformerModel<double>;
#endif

}  // namespace nn
}  // namespace dea
