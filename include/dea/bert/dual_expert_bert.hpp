// dea/bert/dual_expert_bert.hpp: the reference's DualExpertBert (transformer.py DualExpertBert and
// HFDualExpertSelfAttention; docs/bert.md, DualExpertBert): a Hugging Face BERT whose every self-attention is a
// Dual-Expert adapter without output projection, a Dropout + Linear head on the [CLS] position, the task
// cross-entropy and the model-level gate loss, with hand-derived backward passes.
//
// Construction, from a BertModel (loaded from a model directory, or fresh from a configuration):
//   - every layer l: dea = DualExpertAttention(H, A, dropout = attention_probs_dropout_prob, out_proj = false), with
//     the reference's initialisation (core/init.hpp: an orthogonal W_rel per head, Xavier-uniform W_gate rows,
//     c_gate = -0.5), then W_q, W_k, W_v (weight and bias) copied from the layer's query, key and value; the
//     original query / key / value parameters are gone;
//   - everything else of BERT is copied unchanged: embeddings, attention.output (dense + dropout + residual
//     LayerNorm: BERT's own output projection), intermediate, output, and the pooler (kept, unused: its gradient
//     stays zero);
//   - cls_head = Sequential(Dropout(0.1), Linear(H, n_classes)), PyTorch's default Linear initialisation.
// Random draws (the Rng given): each layer's Dual-Expert initialisation in layer order, then cls_head.1 (weight,
// then bias). A model built from a configuration first draws a fresh BertModel (HF init) from the same Rng.
//
// Shapes (B batch, T tokens, N = B*T rows, row b*T + t; H hidden; C = n_classes):
//   x_L = BertModel(ids, token types; in)                           [N, H]   (model.hpp; every layer reads `in`)
//   h0  = x_L[b*T + 0]                                               [B, H]   last_hidden_state[:, 0]
//   logits = Dropout(h0) W_c^T + b_c                                 [B, C]   cls_head.0, cls_head.1
//   task_loss = mean CE(logits, labels)                                       (labels -100 ignored)
//   loss_gate = (sum_l loss_gate_l) / L with an oracle, else 0
//   loss      = task_loss + loss_gate
// in: one AttnInputs for the forward: key mask = attention_mask (HF's additive mask is not used: the adapter masks
// its own keys), the oracle [B, T, T] (NaN = unlabelled), target_idx, gamma_mix, training and the dropout Rng; every
// layer reads it (as the reference pushes the same context into every adapter).
//
// Backward contract (docs/architecture.md, the call contract): every backward adds into the parameter gradients.
//   backward_task(c)        d task_loss through the head, every layer and the embeddings; never W_gate / c_gate
//                           (the scores read alpha-hat as a constant)
//   backward_gate(c)        d loss_gate: each layer's gate backward with scale 1 / L; only W_gate / c_gate (the gate
//                           reads Q, K, E0~, E1~ as constants)
//   backward(c)             both: d(task_loss + loss_gate), the training step's single backward
//   backward_outputs(dlogits, dlast, c)  the task path for any dL/dlogits and dL/d last_hidden_state (either may be
//                           null), for <output, R> objectives; returns dL/dE [N, H] (the embedding sum)
//
// Parameters (the reference's state_dict names and order): bert.embeddings.*,
// bert.encoder.layer.{l}.attention.self.dea.{W_q, W_k, W_v}.{weight, bias}, ...dea.W_rel [A, d, d],
// ...dea.W_gate [A, 2d + 2], ...dea.c_gate [A], bert.encoder.layer.{l}.attention.output.*, ...intermediate.*,
// ...output.*, bert.pooler.dense.*, cls_head.1.{weight, bias}. Groups (optim::is_gate_param_name, the reference's
// build_optimizer): "gate" = every name containing W_gate or c_gate, "main" = the rest.
//
// Dropout: hidden_dropout_prob after the embeddings and on both residual branches, attention_probs_dropout_prob in
// every adapter, 0.1 in the head; active only in training forwards, drawn from the Rng given to forward.
#pragma once

#include "../attention/dual_expert.hpp"
#include "../attention/gate_stats.hpp"
#include "../attention/inputs.hpp"
#include "../core/error.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../nn/dropout.hpp"
#include "../nn/linear.hpp"
#include "../nn/transformer.hpp"
#include "../ops/cross_entropy.hpp"
#include "../optim/adamw.hpp"
#include "config.hpp"
#include "hf_dir.hpp"
#include "layer.hpp"
#include "model.hpp"

#include <functional>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dea {
namespace bert {

/// What DualExpertBert adds to a BertModel.
struct DualExpertBertOptions {
  Index n_classes = 2;        ///< width of cls_head.1
  double head_dropout = 0.1;  ///< cls_head.0 (the reference's fixed Dropout(0.1)), in [0, 1)
  /// The adapters' [T, T] kernel: reference (every map kept: evaluation, interop, plots) or tiled (O(T) per layer,
  /// for training steps; evaluation forwards still keep the maps, see set_map_policy).
  DeaKernel kernel = DeaKernel::reference;
  Index block_q = 0;          ///< queries per block of the tiled kernel (0 = automatic)
};

/// What DualExpertBert::forward returns (the field names of nn::ModelOutput, plus the encoder's output).
template <class S>
struct DualExpertBertOutput {
  Mat<S> logits;                            ///< [B, n_classes]
  bool has_task_loss = false;               ///< labels were given
  S task_loss = 0;                          ///< mean CE over the labelled rows (0 without labels)
  Index n_targets = 0;                      ///< rows counted by the CE
  S loss_gate = 0;                          ///< (sum_l loss_gate_l) / L with an oracle, else 0
  std::vector<S> layer_loss_gate;           ///< per layer (0 without an oracle)
  std::vector<GateStats> layer_stats;       ///< per layer (default values without an oracle)
  std::vector<std::uint8_t> layer_supervised;  ///< per layer: 1 = read the oracle (every layer, with one)
  Mat<S> last_hidden_state;                 ///< [B*T, H], row b*T + t
  /// task_loss + loss_gate (the training objective).
  S loss() const { return task_loss + loss_gate; }
};

template <class S>
class DualExpertBert {
  static_assert(std::is_floating_point<S>::value, "DualExpertBert: Scalar must be float or double");

public:
  using Scalar = S;
  using Attention = DualExpertAttention<S>;
  using Encoder = BertModel<S, Attention>;
  /// input_ids [B, T], attention_mask [B, T] (absent: all real), token_type_ids [B, T] (absent: all 0, as BERT),
  /// alpha_oracle [B, T, T] or [B, A, T, T] (absent: the inference path), target_idx, labels [B].
  using Batch = nn::ModelBatch<S>;
  using Output = DualExpertBertOutput<S>;
  static constexpr bool has_gate = true;

  /// Everything backward needs, filled by forward; backward reads it and leaves it unchanged. It is the encoder's
  /// cache (B, T, `inputs`: the one AttnInputs every layer read, `layers[l].attn`: layer l's adapter cache, as in
  /// TransformerModel's cache) with the head's part.
  struct Cache : Encoder::Cache {
    Mat<S> head_in;              ///< [B, H] Dropout(last_hidden_state[:, 0]), the input of cls_head.1
    nn::DropoutState head_drop;  ///< cls_head.0
    bool has_task_loss = false;
    Mat<S> dlogits;              ///< d task_loss / d logits (with labels)
    bool has_oracle = false;
  };

  /// The reference's conversion of `base` (a pretrained or fresh BertModel, read and then dropped: pass it with
  /// std::move to avoid a copy): see the file comment. `rng` draws each adapter's initialisation (its W_q, W_k, W_v
  /// then replaced by BERT's) and cls_head.1.
  DualExpertBert(BertModel<S> base, Rng& rng, DualExpertBertOptions opt = {});
  /// A fresh BertModel of `cfg` (HF init, from `rng`), converted as above.
  DualExpertBert(const BertConfig& cfg, Rng& rng, DualExpertBertOptions opt = {})
      : DualExpertBert(BertModel<S>(cfg, rng), rng, opt) {}

  const BertConfig& config() const { return bert_.config(); }
  const DualExpertBertOptions& options() const { return opt_; }
  Index n_layers() const { return bert_.n_layers(); }
  Index n_classes() const { return cls_.out_features(); }
  Encoder& bert() { return bert_; }
  /// The Dual-Expert adapter of layer l.
  Attention& attention(Index l) { return bert_.layer(l).self_attention(); }
  nn::Linear<S>& cls_head() { return cls_; }

  /// Every parameter under its reference name, in state_dict order (see the file comment).
  ParamList<S> parameters() {
    ParamList<S> out = bert_.parameters();
    for (Param<S>* p : cls_.parameters()) out.push_back(p);
    return out;
  }
  /// The parameters of group "main" or "gate", in parameters() order.
  ParamList<S> parameters(const std::string& group);
  void zero_grad() { dea::zero_grad(parameters()); }
  /// An optional report from the backward pass: f(i) once the gradients of parameters [i, end) of parameters()
  /// are final for this backward (after the classifier and the pooler, after each layer, last layer first), so that
  /// a data-parallel exchange can start on them (dist/reducer.hpp). backward() then runs the gate part before the
  /// task part (each writes gradients the other never touches, so the bits are the same). Empty by default.
  void set_grads_final(std::function<void(std::size_t)> f) {
    hooked_ = static_cast<bool>(f);
    bert_.set_grads_final(std::move(f));  // the classifier comes after the encoder's parameters
  }

  /// The reference's two AdamW groups over parameters() (optim::build_optimizer: gate = W_gate / c_gate with
  /// `gate`'s settings, main = the rest with `main`'s). The fine-tuning defaults of the reference's
  /// `--data_source hf` run: lr_main 2e-5, lr_gate 1e-3, weight decay 0.01 on main only, clip 1.0 per group.
  optim::AdamW<S> make_optimizer(optim::GroupConfig main = hf_main_group(),
                                 optim::GroupConfig gate = optim::gate_group_defaults()) {
    return optim::build_optimizer(parameters(), std::move(main), std::move(gate));
  }
  /// optim::main_group_defaults() with the reference's fine-tuning learning rate 2e-5.
  static optim::GroupConfig hf_main_group() {
    optim::GroupConfig g = optim::main_group_defaults();
    g.lr = 2e-5;
    return g;
  }

  /// Forward pass with mixing weight gamma_mix; dropout is active when `training` (then `rng` is required when a
  /// dropout is > 0). The cache holds one copy of the oracle and targets for every layer.
  Output forward(const Batch& batch, S gamma_mix, bool training, Rng* rng, Cache& c) {
    return forward_(batch, Tensor<S>(batch.alpha_oracle), Tensor<std::int64_t>(batch.target_idx), gamma_mix, training,
                    rng, c);
  }
  /// The same on a batch the caller gives away: its oracle and targets are moved into the cache, not copied.
  Output forward(Batch&& batch, S gamma_mix, bool training, Rng* rng, Cache& c) {
    Tensor<S> oracle = std::move(batch.alpha_oracle);
    Tensor<std::int64_t> targets = std::move(batch.target_idx);
    return forward_(batch, std::move(oracle), std::move(targets), gamma_mix, training, rng, c);
  }

  /// Backward of task_loss + loss_gate. Without labels only the gate part runs; without an oracle only the task part.
  void backward(Cache& c) {
    if (hooked_) {  // the gate gradients first: the task pass then reports final gradients layer by layer
      backward_gate(c);
      backward_task(c);
      return;
    }
    backward_task(c);
    backward_gate(c);
  }
  /// Backward of task_loss alone (no-op without labels).
  void backward_task(Cache& c);
  /// Backward of loss_gate alone (no-op without an oracle).
  void backward_gate(Cache& c);
  /// Task-path backward for dL/dlogits = *dlogits [B, n_classes] and dL/d last_hidden_state = *dlast [B*T, H] (either
  /// may be null); returns dL/dE [B*T, H], the gradient of the embedding sum (word + token type + position).
  Mat<S> backward_outputs(const Mat<S>* dlogits, const Mat<S>* dlast, Cache& c);

  /// Layer l's alpha-hat [B, A, T, T] of the forward that filled `c` (kept by the reference kernel, and by the tiled
  /// one for the last layer of a training forward, see set_map_policy; a dea::Error when it was not kept).
  Tensor<S> alpha_hat(const Cache& c, Index l) const;

  /// The reference's verify_gradient_isolation: a training-mode forward at gamma_mix (dropout from Rng(seed)), the
  /// task backward alone, then the gate backward alone. The batch needs labels and an oracle. Every gradient is
  /// cleared before, between and after.
  nn::ModelIsolationReport verify_gradient_isolation(const Batch& batch, S gamma_mix = S(0.5), std::uint64_t seed = 0);

  // ---- test hook: hold alpha-hat fixed in the scores (finite-difference checks of the task path) ----

  /// Per layer, alpha-hat values [B, A, T, T] the scores use instead of the gate's own (an absent tensor leaves that
  /// layer alone). An empty vector clears.
  void set_frozen_alpha_hat(std::vector<Tensor<S>> per_layer) {
    check(per_layer.empty() || static_cast<Index>(per_layer.size()) == n_layers(),
          "DualExpertBert::set_frozen_alpha_hat: expected one tensor per layer (", n_layers(), "), got ",
          per_layer.size());
    frozen_ = std::move(per_layer);
  }
  /// Freezes alpha-hat at the values of the forward that filled `c` (which must have kept them).
  void freeze_alpha_hat(const Cache& c) {
    std::vector<Tensor<S>> f;
    for (Index l = 0; l < n_layers(); ++l) f.push_back(alpha_hat(c, l));
    frozen_ = std::move(f);
  }
  void clear_frozen_alpha_hat() { frozen_.clear(); }

  /// What the adapters keep when options().kernel is tiled (the reference kernel keeps every map):
  ///  - eval_maps (default true): evaluation-mode forwards run the reference kernel, so every layer's maps are in
  ///    the cache (metrics, probes, plots);
  ///  - train_alpha_hat (default true): training forwards keep the last layer's alpha-hat (the training metrics).
  void set_map_policy(bool eval_maps, bool train_alpha_hat) {
    eval_maps_ = eval_maps;
    train_alpha_hat_ = train_alpha_hat;
  }

private:
  Output forward_(const Batch& batch, Tensor<S> oracle, Tensor<std::int64_t> targets, S gamma_mix, bool training,
                  Rng* rng, Cache& c);

  /// The encoder with zero weights around the fresh adapters of the reference (their W_q, W_k, W_v still to copy).
  static Encoder make_encoder(const BertConfig& cfg, Rng& rng, const DualExpertBertOptions& opt);

  DualExpertBertOptions opt_;
  Encoder bert_;
  nn::Linear<S> cls_;
  nn::Dropout drop_;
  std::vector<Tensor<S>> frozen_;
  bool hooked_ = false;
  bool eval_maps_ = true, train_alpha_hat_ = true;
};

/// Loads the BertModel of a Hugging Face model directory (hf_dir.hpp) and converts it (DualExpertBert's
/// constructor; `rng` draws the fresh parameters).
template <class S>
DualExpertBert<S> load_dual_expert_bert(const std::string& dir, Rng& rng, DualExpertBertOptions opt = {},
                                        HfLoadReport* report = nullptr) {
  return DualExpertBert<S>(load_bert_model<S>(dir, report), rng, opt);
}

// ---- members defined outside the class: not inline, so that the extern template declarations below keep other
// translation units from instantiating them ----

template <class S>
auto DualExpertBert<S>::make_encoder(const BertConfig& cfg, Rng& rng, const DualExpertBertOptions& opt) -> Encoder {
  cfg.validate();
  check(opt.n_classes > 0, "DualExpertBert: n_classes must be positive, got ", opt.n_classes);
  check(opt.head_dropout >= 0 && opt.head_dropout < 1, "DualExpertBert: head_dropout must be in [0, 1), got ",
        opt.head_dropout);
  typename Attention::Options ao;
  ao.dropout = static_cast<S>(cfg.attention_probs_dropout_prob);
  ao.bias = true;
  ao.out_proj = false;  // BERT's attention.output.dense is the output projection
  ao.kernel = opt.kernel;
  ao.block_q = opt.block_q;
  std::vector<Attention> adapters;
  adapters.reserve(static_cast<std::size_t>(cfg.num_hidden_layers));
  for (Index l = 0; l < cfg.num_hidden_layers; ++l) {
    adapters.emplace_back(cfg.hidden_size, cfg.num_attention_heads, rng, ao);  // the reference's init
    prefix_names(adapters.back().parameters(), "dea.");                        // attention.self.dea.*
  }
  return Encoder(cfg, std::move(adapters));
}

template <class S>
DualExpertBert<S>::DualExpertBert(BertModel<S> base, Rng& rng, DualExpertBertOptions opt)
    : opt_(opt), bert_(make_encoder(base.config(), rng, opt)), drop_(opt.head_dropout) {
  cls_ = nn::Linear<S>(base.config().hidden_size, opt.n_classes, rng);  // PyTorch's default init
  // Copy every BERT parameter by name; dea.W_q / W_k / W_v come from query / key / value, W_rel / W_gate / c_gate
  // stay fresh.
  std::map<std::string, Param<S>*> src;
  for (Param<S>* p : base.parameters()) src[p->name] = p;
  std::size_t used = 0;
  for (Param<S>* p : bert_.parameters()) {
    std::string from = p->name;
    const std::string dea = ".attention.self.dea.";
    const std::size_t at = from.find(dea);
    if (at != std::string::npos) {
      const std::string rest = from.substr(at + dea.size());  // "W_q.weight", ..., "W_rel", "W_gate", "c_gate"
      const char* hf = rest.rfind("W_q.", 0) == 0 ? "query" : rest.rfind("W_k.", 0) == 0 ? "key"
                       : rest.rfind("W_v.", 0) == 0 ? "value" : nullptr;
      if (!hf) continue;  // fresh
      from = from.substr(0, at) + ".attention.self." + hf + rest.substr(3);
    }
    const auto it = src.find(from);
    check(it != src.end(), "DualExpertBert: the BertModel has no parameter '", from, "' for '", p->name, "'");
    check(it->second->shape == p->shape, "DualExpertBert: '", from, "' has shape ", shape_str(it->second->shape),
          ", '", p->name, "' needs ", shape_str(p->shape));
    p->value = it->second->value;
    ++used;
  }
  check(used == src.size(), "DualExpertBert: ", src.size() - used, " parameters of the BertModel were not used");
  prefix_names(bert_.parameters(), "bert.");
  prefix_names(cls_.parameters(), "cls_head.1.");
  optim::assign_groups_by_name(parameters());
}

template <class S>
ParamList<S> DualExpertBert<S>::parameters(const std::string& group) {
  check(group == "main" || group == "gate", "DualExpertBert::parameters: group: expected 'main' or 'gate', got '",
        group, "'");
  ParamList<S> out;
  for (Param<S>* p : parameters())
    if (p->group == group) out.push_back(p);
  return out;
}

template <class S>
auto DualExpertBert<S>::forward_(const Batch& batch, Tensor<S> oracle, Tensor<std::int64_t> targets, S gamma_mix,
                                 bool training, Rng* rng, Cache& c) -> Output {
  check(batch.input_ids.dim() == 2, "DualExpertBert::forward: input_ids: expected shape [B, T], got ",
        shape_str(batch.input_ids.shape));
  const Index B = batch.input_ids.size(0), T = batch.input_ids.size(1), H = config().hidden_size;
  check(B > 0 && T > 0, "DualExpertBert::forward: input_ids: expected a non-empty [B, T], got ",
        shape_str(batch.input_ids.shape));
  if (batch.labels.dim() > 0) check_shape(batch.labels, {B}, "DualExpertBert::forward: labels");
  check(gamma_mix >= 0 && gamma_mix <= 1, "DualExpertBert::forward: gamma_mix must be in [0, 1], got ", gamma_mix);
  check(targets.dim() == 0 || oracle.dim() > 0,
        "DualExpertBert::forward: target_idx was given without alpha_oracle (the gate loss needs both)");
  check(!training || rng != nullptr || opt_.head_dropout == 0, "DualExpertBert::forward: training with dropout ",
        opt_.head_dropout, " in the head needs an Rng");
  check(frozen_.empty() || static_cast<Index>(frozen_.size()) == n_layers(),
        "DualExpertBert: frozen alpha-hat: expected one tensor per layer (", n_layers(), "), got ", frozen_.size());

  BertBatch<S> bb;
  bb.input_ids = batch.input_ids;
  bb.attention_mask = batch.attention_mask;
  bb.token_type_ids = batch.token_type_ids;

  // ---- the attention inputs, built and validated once for every layer (the key mask is set by the encoder)
  AttnInputs<S> in(B, T);
  if (oracle.dim() > 0) in.set_oracle(std::move(oracle));  // +-inf rejected here, once
  if (targets.dim() > 0) in.set_targets(std::move(targets));
  in.set_gamma_mix(gamma_mix);
  in.set_training(training, rng);
  const bool tiled = opt_.kernel == DeaKernel::tiled;
  if (tiled) in.set_keep_maps(!training && eval_maps_);
  c.has_oracle = in.has_oracle();
  // per-layer variants (sharing the storage): the last layer of a tiled training forward keeps alpha-hat, and the
  // test hook freezes alpha-hat
  const Index L = n_layers();
  const bool keep_last = tiled && training && train_alpha_hat_;
  typename Encoder::LayerInputsFn per_layer;
  if (keep_last || !frozen_.empty())
    per_layer = [&](Index l, AttnInputs<S>& var) {
      if (keep_last && l + 1 == L) var.set_keep_alpha_hat(true);
      if (!frozen_.empty() && frozen_[static_cast<std::size_t>(l)].dim() > 0)
        var.set_frozen_alpha_hat(frozen_[static_cast<std::size_t>(l)]);
    };

  BertOutput<S> enc = bert_.forward(bb, std::move(in), c, per_layer);  // x_L (fills the encoder's part of c)

  Output out;
  out.layer_loss_gate.assign(static_cast<std::size_t>(L), S(0));
  out.layer_stats.assign(static_cast<std::size_t>(L), GateStats{});
  out.layer_supervised.assign(static_cast<std::size_t>(L), c.has_oracle ? 1 : 0);
  S gsum = 0;
  for (Index l = 0; l < L; ++l) {
    const auto& ac = c.layers[static_cast<std::size_t>(l)].attn;
    out.layer_loss_gate[static_cast<std::size_t>(l)] = ac.loss_gate;
    if (c.has_oracle) out.layer_stats[static_cast<std::size_t>(l)] = ac.stats;
    gsum += ac.loss_gate;
  }
  // loss_gate = sum_l loss_gate_l / L with an oracle (the reference's supervise = every layer); 0 without one
  out.loss_gate = c.has_oracle ? gsum / S(L > 0 ? L : 1) : S(0);

  // ---- head: logits = Dropout(x_L[:, 0]) W_c^T + b_c
  c.head_in.resize(B, H);
  for (Index b = 0; b < B; ++b) c.head_in.row(b) = enc.last_hidden_state.row(b * T);  // h0 = x_L[:, 0]
  drop_.forward(c.head_in, training, rng, c.head_drop);                                 // Dropout(h0)
  cls_.forward(c.head_in, out.logits);                                                  // . W_c^T + b_c

  // ---- task loss
  c.has_task_loss = false;
  if (batch.labels.dim() > 0) {
    auto ce = ops::cross_entropy<S>(out.logits, batch.labels.ptr(), batch.labels.numel(), -100, true);
    out.has_task_loss = true;
    out.task_loss = ce.loss;
    out.n_targets = ce.count;
    c.has_task_loss = true;
    c.dlogits = std::move(ce.dlogits);
  }
  out.last_hidden_state = std::move(enc.last_hidden_state);
  return out;
}

template <class S>
void DualExpertBert<S>::backward_task(Cache& c) {
  check(c.B > 0, "DualExpertBert::backward: the cache holds no forward pass");
  if (c.has_task_loss) backward_outputs(&c.dlogits, nullptr, c);
}

template <class S>
void DualExpertBert<S>::backward_gate(Cache& c) {
  check(c.B > 0, "DualExpertBert::backward_gate: the cache holds no forward pass");
  if (!c.has_oracle) return;
  const Index L = n_layers();
  const S scale = S(1) / S(L > 0 ? L : 1);
  for (Index l = 0; l < L; ++l)  // loss_gate = sum_l loss_gate_l / L
    attention(l).backward_gate(c.layers[static_cast<std::size_t>(l)].attn, scale);
}

template <class S>
Mat<S> DualExpertBert<S>::backward_outputs(const Mat<S>* dlogits, const Mat<S>* dlast, Cache& c) {
  check(c.B > 0, "DualExpertBert::backward: the cache holds no forward pass");
  const Index B = c.B, T = c.T, H = config().hidden_size;
  Mat<S> dx;
  if (dlast) {
    check_matrix(*dlast, B * T, H, "DualExpertBert::backward_outputs: dlast");
    dx = *dlast;
  } else {
    dx = Mat<S>::Zero(B * T, H);
  }
  if (dlogits) {
    check_matrix(*dlogits, B, n_classes(), "DualExpertBert::backward_outputs: dlogits");
    Mat<S> dh;
    cls_.backward(*dlogits, c.head_in, &dh);                    // logits = Dropout(h0) W_c^T + b_c
    nn::Dropout::backward(dh, c.head_drop);                      // Dropout(h0)
    for (Index b = 0; b < B; ++b) dx.row(b * T) += dh.row(b);    // h0 = x_L[:, 0]
  }
  return bert_.backward(&dx, nullptr, c);                        // x_L = BertModel(...); the pooler is not reached
}

template <class S>
Tensor<S> DualExpertBert<S>::alpha_hat(const Cache& c, Index l) const {
  check(c.B > 0, "DualExpertBert::alpha_hat: the cache holds no forward pass");
  check(l >= 0 && l < static_cast<Index>(c.layers.size()), "DualExpertBert::alpha_hat: layer ", l,
        " is out of range [0, ", c.layers.size(), ")");
  const Index A = config().num_attention_heads;
  const auto& ah = c.layers[static_cast<std::size_t>(l)].attn.alpha_hat;
  check(static_cast<Index>(ah.size()) == c.B * A * c.T * c.T, "DualExpertBert::alpha_hat: layer ", l,
        " kept no alpha-hat in this forward (the tiled kernel keeps it only for the last layer of a training "
        "forward, see set_map_policy)");
  Tensor<S> t({c.B, A, c.T, c.T});
  for (Index k = 0; k < t.numel(); ++k) t[k] = ah[static_cast<std::size_t>(k)];
  return t;
}

template <class S>
nn::ModelIsolationReport DualExpertBert<S>::verify_gradient_isolation(const Batch& batch, S gamma_mix,
                                                                      std::uint64_t seed) {
  check(batch.labels.dim() > 0 && batch.alpha_oracle.dim() > 0,
        "DualExpertBert::verify_gradient_isolation: the batch needs labels and alpha_oracle");
  auto is_rel = [](const Param<S>& p) {
    const std::string suffix = "W_rel";
    return p.name.size() >= suffix.size() && p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  nn::ModelIsolationReport r;
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
  return r;
}

// The project's own programs and tests compile these instances once (cmake/instances/bert_*.cpp); the
// Dual-Expert kernels come from the DualExpertAttention instances.
#ifdef DEA_EXTERN_TEMPLATES
extern template class BertLayer<float, DualExpertAttention<float>>;
extern template class BertLayer<double, DualExpertAttention<double>>;
extern template class BertModel<float, DualExpertAttention<float>>;
extern template class BertModel<double, DualExpertAttention<double>>;
extern template class DualExpertBert<float>;
extern template class DualExpertBert<double>;
#endif

}  // namespace bert
}  // namespace dea
