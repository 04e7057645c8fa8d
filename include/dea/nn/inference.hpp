// dea/nn/inference.hpp: the embedded profile's model: TransformerModel's inference forward (Dual-Expert attention
// without oracle, cls or mlm head) over parameters it does not own, with every temporary in one workspace.
//
// Parameters are bound by their reference names ("tok_emb.weight", "layers.0.attn.W_q.weight", ...) to arrays
// that the caller keeps: the arrays of a header written by `dea export-c` (compiled in, read-only), or the
// parameters of a live TransformerModel (bind_parameters). Nothing is copied: every tensor is read through an
// Eigen::Map. The workspace is sized once for a maximum batch and sequence length (workspace_size() is
// constexpr, so it can be a static array) and holds the positional table and every activation; forward() then
// allocates nothing, for any batch <= max_batch and length <= max_len.
//
// Sizes: Heads and DHead (as in DualExpertAttention) and Layers may be fixed at compile time (they are checked
// against the configuration; a fixed DHead reaches the attention kernel's head-sized work, as in the layer, and
// with a fixed Layers the layer table is a std::array), or Dynamic.
//
// Forward, for ids [B, T] (row b*T + t), N = B*T, D = d_model (the shapes and names of transformer.hpp):
//   x = tok_emb[ids] sqrt(D) (+ seg_emb[token_types]) + PE[:T]                       [N, D]
//   per layer: h = LN1(x); x += DEA(h) (no oracle: alpha_mix = alpha-hat); h = LN2(x); x += FFN(h)
//   y = ln_f(x);  cls: logits = Linear3(tanh(Linear0(y[b*T + 0])))  [B, C];  mlm: logits = y tok_emb^T + b  [N, V]
// Each step runs the kernel TransformerModel's evaluation forward runs (ops::*_into, and the Dual-Expert row-block
// kernel of attention/dual_expert/row_block.hpp on workspace buffers laid out as the layer cache's maps), so the
// logits agree with the model's bit for bit (a model whose attention has the same DHead; a fixed DHead differs
// from Dynamic by round-off); tests/test_inference.cpp checks it against TransformerModel, dynamic and fixed sizes.
//
// bf16 weights (float models): the weights of the bf16 matrix products (W_v, W_o, ff.0 and ff.3 of every layer,
// cls_head.0 and cls_head.3) may be bound as arrays of dea::bf16 (2 bytes a weight; `dea export-c --type bf16` writes
// them), read in place by ops::packed::gemm_bf16 (bf16 operands, float accumulation). With any of them bound, every
// one of those products runs in bf16 (a float-bound weight and the tied mlm head are rounded as the products read
// them), and everything else stays float, W_q and W_k included (Q and K are the gate's inputs, fp32 products under
// the bf16 policy as in the layer): the logits are then the bits of TransformerModel's evaluation
// forward under ScopedPrecision(Precision::bf16) with the weights those arrays were rounded from. The products
// convert and pack into the workspace (ops::packed::Bf16BufferScope), so forward still allocates nothing.
#pragma once

#include "../attention/dual_expert/row_block.hpp"
#include "../core/bf16.hpp"
#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "../core/workspace.hpp"
#include "../ops/gelu.hpp"
#include "../ops/layer_norm.hpp"
#include "../ops/linear.hpp"
#include "../ops/packed_bf16.hpp"
#include "../ops/softmax.hpp"
#include "positional.hpp"
#include "transformer.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace dea {
namespace nn {

/// The sizes of a model for InferenceModel. A literal type: a generated weights header declares it constexpr.
struct InferenceConfig {
  Index vocab_size = 0;  ///< V
  Index d_model = 0;     ///< D
  Index n_heads = 0;     ///< H (D must be a multiple)
  Index n_layers = 0;    ///< encoder layers (0 allowed)
  Index d_ff = 0;        ///< FFN hidden width
  Index max_len = 0;     ///< longest sequence the model accepts (positional table rows)
  Index n_classes = 2;   ///< cls head width
  Task task = Task::cls;

  /// The inference sizes of a TransformerModel configuration.
  static InferenceConfig from(const ModelConfig& m) {
    InferenceConfig c;
    c.vocab_size = m.vocab_size;
    c.d_model = m.d_model;
    c.n_heads = m.n_heads;
    c.n_layers = m.n_layers;
    c.d_ff = m.d_ff;
    c.max_len = m.max_len;
    c.n_classes = m.n_classes;
    c.task = m.task;
    return c;
  }

  /// dea::Error (or the error handler) naming the first bad field.
  void validate() const {
    check(vocab_size > 0, "InferenceConfig: vocab_size must be positive, got ", vocab_size);
    check(d_model > 0, "InferenceConfig: d_model must be positive, got ", d_model);
    check(n_heads > 0 && d_model % n_heads == 0, "InferenceConfig: n_heads must be positive and divide d_model (",
          d_model, "), got ", n_heads);
    check(n_layers >= 0, "InferenceConfig: n_layers must be >= 0, got ", n_layers);
    check(d_ff > 0, "InferenceConfig: d_ff must be positive, got ", d_ff);
    check(max_len > 0, "InferenceConfig: max_len must be positive, got ", max_len);
    check(n_classes > 0, "InferenceConfig: n_classes must be positive, got ", n_classes);
  }
};

template <class S, int Heads = Dynamic, int DHead = Dynamic, int Layers = Dynamic>
class InferenceModel {
  static_assert(std::is_floating_point<S>::value, "InferenceModel: Scalar must be float or double");
  static_assert(Heads == Dynamic || Heads > 0, "Heads must be positive or Dynamic");
  static_assert(DHead == Dynamic || DHead > 0, "DHead must be positive or Dynamic");
  static_assert(Layers == Dynamic || Layers >= 0, "Layers must be >= 0 or Dynamic");

public:
  using Scalar = S;

  /// The tensors of one encoder layer, in the reference's state_dict order (names after "layers.<i>.").
  enum LayerTensor {
    kWq, kBq, kWk, kBk, kWv, kBv, kWo, kBo, kWrel, kWgate, kCgate,
    kLn1W, kLn1B, kLn2W, kLn2B, kFf0W, kFf0B, kFf3W, kFf3B, kLayerTensors
  };
  /// The tensors outside the layers.
  enum ModelTensor { kTokEmb, kSegEmb, kLnfW, kLnfB, kCls0W, kCls0B, kCls3W, kCls3B, kMlmB, kModelTensors };

  static const char* layer_tensor_name(int k) {
    static const char* const names[kLayerTensors] = {
        "attn.W_q.weight", "attn.W_q.bias", "attn.W_k.weight", "attn.W_k.bias", "attn.W_v.weight",
        "attn.W_v.bias",   "attn.W_o.weight", "attn.W_o.bias", "attn.W_rel",    "attn.W_gate",
        "attn.c_gate",     "ln1.weight",    "ln1.bias",        "ln2.weight",    "ln2.bias",
        "ff.0.weight",     "ff.0.bias",     "ff.3.weight",     "ff.3.bias"};
    return names[k];
  }
  static const char* model_tensor_name(int k) {
    static const char* const names[kModelTensors] = {"tok_emb.weight",    "seg_emb.weight",    "ln_f.weight",
                                                      "ln_f.bias",         "cls_head.0.weight", "cls_head.0.bias",
                                                      "cls_head.3.weight", "cls_head.3.bias",   "mlm_head.bias"};
    return names[k];
  }

  explicit InferenceModel(const InferenceConfig& cfg) : cfg_(cfg) {
    cfg.validate();
    check(Heads == Dynamic || cfg.n_heads == Heads, "InferenceModel: n_heads: expected the compile-time ", Heads,
          ", got ", cfg.n_heads);
    check(DHead == Dynamic || cfg.d_model / cfg.n_heads == DHead,
          "InferenceModel: d_model / n_heads: expected the compile-time ", DHead, ", got ", cfg.d_model / cfg.n_heads);
    check(Layers == Dynamic || cfg.n_layers == Layers, "InferenceModel: n_layers: expected the compile-time ", Layers,
          ", got ", cfg.n_layers);
    if constexpr (Layers == Dynamic) layers_.resize(static_cast<std::size_t>(cfg.n_layers));
  }

  const InferenceConfig& config() const { return cfg_; }

  // ---- parameters ---------------------------------------------------------------------------------------------

  /// Number of values of the tensor `k` of a layer.
  Index layer_tensor_numel(int k) const {
    const Index D = cfg_.d_model, H = cfg_.n_heads, Dh = D / H, F = cfg_.d_ff;
    switch (k) {
      case kWq: case kWk: case kWv: case kWo: return D * D;
      case kWrel: return H * Dh * Dh;
      case kWgate: return H * (2 * Dh + 2);
      case kCgate: return H;
      case kFf0W: case kFf3W: return F * D;
      case kFf0B: return F;
      default: return D;  // the four projection biases, LayerNorm weights and biases, ff.3.bias
    }
  }
  /// Number of values of the model tensor `k`.
  Index model_tensor_numel(int k) const {
    const Index D = cfg_.d_model, V = cfg_.vocab_size, C = cfg_.n_classes;
    switch (k) {
      case kTokEmb: return V * D;
      case kSegEmb: return 2 * D;
      case kCls0W: return D * D;
      case kCls3W: return C * D;
      case kCls3B: return C;
      case kMlmB: return V;
      default: return D;  // ln_f weight and bias, cls_head.0.bias
    }
  }

  /// Binds the tensor called `name` (a reference state_dict name) to `numel` values at `data`, which must outlive
  /// the model and are never copied or written. Returns false when the model has no tensor of that name (for
  /// example "mlm_head.weight", the tied copy of tok_emb.weight); a wrong size or a layer index out of range is a
  /// dea::Error naming the tensor.
  bool bind(const char* name, const S* data, Index numel) {
    const Slot sl = find_slot_(name);
    if (!sl.f) return false;
    check(data != nullptr, "InferenceModel::bind: ", name, ": null data");
    check(numel == sl.expected, "InferenceModel::bind: ", name, ": expected ", sl.expected, " values, got ", numel);
    *sl.f = data;
    if (*sl.h) --bf16_bound_;
    *sl.h = nullptr;
    return true;
  }

  /// Binds the weight of a bf16 matrix product (see the file comment: W_v, W_o, ff.0.weight, ff.3.weight,
  /// cls_head.0.weight, cls_head.3.weight) to `numel` bf16 values at `data` (row-major [out, in], as the float
  /// tensor), read in place by the products and never copied; it replaces a float binding of the same tensor. float
  /// models only. Returns false when the model has no tensor of that name; any other tensor of the model is a
  /// dea::Error (it stays float).
  bool bind(const char* name, const bf16* data, Index numel) {
    check(std::is_same<S, float>::value, "InferenceModel::bind: ", name, ": bf16 weights are for float models");
    const Slot sl = find_slot_(name);
    if (!sl.f) return false;
    check(sl.product, "InferenceModel::bind: ", name, ": only the weights of bf16 matrix products may be bf16 (W_v, "
          "W_o, ff.0.weight, ff.3.weight, cls_head.0.weight, cls_head.3.weight); this one stays float (W_q and W_k "
          "too: Q and K are the gate's inputs, fp32 products)");
    check(data != nullptr, "InferenceModel::bind: ", name, ": null data");
    check(numel == sl.expected, "InferenceModel::bind: ", name, ": expected ", sl.expected, " values, got ", numel);
    if (!*sl.h) ++bf16_bound_;
    *sl.h = data;
    *sl.f = nullptr;
    return true;
  }

  /// True when `name` is the weight of one of the model's bf16 matrix products (the tensors that may be bound as
  /// bf16): layers.<i>.attn.W_v/W_o.weight, layers.<i>.ff.0.weight, layers.<i>.ff.3.weight, cls_head.0.weight,
  /// cls_head.3.weight (not W_q and W_k, whose products stay fp32).
  static bool is_product_weight(const char* name) {
    if (std::strcmp(name, model_tensor_name(kCls0W)) == 0 || std::strcmp(name, model_tensor_name(kCls3W)) == 0)
      return true;
    if (std::strncmp(name, "layers.", 7) != 0) return false;
    const char* p = name + 7;
    const char* digits = p;
    while (*p >= '0' && *p <= '9') ++p;
    if (p == digits || *p != '.') return false;
    ++p;
    for (int k : {kWv, kWo, kFf0W, kFf3W})
      if (std::strcmp(p, layer_tensor_name(k)) == 0) return true;
    return false;
  }

  /// True when some product weight is bound as bf16 (forward then runs every product in bf16).
  bool has_bf16_weights() const { return bf16_bound_ > 0; }

  /// Bytes of the parameters forward reads, as bound (4 or 8 a float or double value, 2 a bf16 weight): the tensors
  /// parameter_count() counts (seg_emb when bound).
  std::size_t parameter_bytes() const {
    std::size_t n = 0;
    auto add = [&](const S* f, const bf16* h, Index numel) {
      if (f) n += static_cast<std::size_t>(numel) * sizeof(S);
      if (h) n += static_cast<std::size_t>(numel) * sizeof(bf16);
    };
    for (int k = 0; k < kModelTensors; ++k) {
      const bool cls_part = k == kCls0W || k == kCls0B || k == kCls3W || k == kCls3B;
      if ((cls_part && cfg_.task != Task::cls) || (k == kMlmB && cfg_.task != Task::mlm)) continue;
      add(model_[k], model16_[k], model_tensor_numel(k));
    }
    for (Index l = 0; l < cfg_.n_layers; ++l)
      for (int k = 0; k < kLayerTensors; ++k)
        add(layers_[static_cast<std::size_t>(l)].t[k], layers_[static_cast<std::size_t>(l)].h[k], layer_tensor_numel(k));
    return n;
  }

private:
  /// Where the tensor called `name` is bound: its float and bf16 pointers (null f: no such tensor).
  struct Slot {
    const S** f = nullptr;
    const bf16** h = nullptr;
    Index expected = 0;
    bool product = false;  ///< a matrix product's weight (may be bf16)
  };
  Slot find_slot_(const char* name) {
    Slot sl;
    if (std::strncmp(name, "layers.", 7) == 0) {
      const char* p = name + 7;
      Index l = 0;
      bool digits = false;
      for (; *p >= '0' && *p <= '9'; ++p) {
        l = l * 10 + (*p - '0');
        digits = true;
        if (l > 1000000) break;
      }
      if (!digits || *p != '.') return sl;
      ++p;
      for (int k = 0; k < kLayerTensors; ++k)
        if (std::strcmp(p, layer_tensor_name(k)) == 0) {
          check(l < cfg_.n_layers, "InferenceModel::bind: ", name, ": the model has ", cfg_.n_layers, " layers");
          sl.f = &layers_[static_cast<std::size_t>(l)].t[k];
          sl.h = &layers_[static_cast<std::size_t>(l)].h[k];
          sl.expected = layer_tensor_numel(k);
          sl.product = k == kWv || k == kWo || k == kFf0W || k == kFf3W;  // not W_q, W_k: fp32 products
        }
    } else {
      for (int k = 0; k < kModelTensors; ++k)
        if (std::strcmp(name, model_tensor_name(k)) == 0) {
          sl.f = &model_[k];
          sl.h = &model16_[k];
          sl.expected = model_tensor_numel(k);
          sl.product = k == kCls0W || k == kCls3W;
        }
    }
    return sl;
  }

public:

  /// Binds every parameter of a model with the reference's names (a TransformerModel<S, Attention>), without copying:
  /// the model must outlive this one, and a change of its parameters shows here.
  /// A model whose attention has RoPE (DualExpertAttention's Options::rope_theta > 0) is refused: this kernel
  /// has none, and would compute another function.
  template <class Model>
  void bind_parameters(Model& model) {
    for (Index l = 0; l < model.n_layers(); ++l) {
      const double theta = attention_rope_theta(model.layer(l).attention(), 0);
      check(theta == 0, "InferenceModel::bind_parameters: layer ", l, "'s attention has rope_theta ", theta,
            " (RoPE), which the inference kernel does not run");
    }
    for (Param<S>* p : model.parameters())
      check(bind(p->name.c_str(), p->value.data(), p->numel()), "InferenceModel::bind_parameters: the model's '",
            p->name, "' is not a tensor of this model");
    check_bound();
  }

  /// dea::Error naming the first tensor forward needs that is not bound (seg_emb.weight is needed only when
  /// forward is given token types; the head's tensors only for the configured task).
  void check_bound() const {
    for (int k = 0; k < kModelTensors; ++k) {
      if (k == kSegEmb) continue;
      const bool cls_part = k == kCls0W || k == kCls0B || k == kCls3W || k == kCls3B;
      if ((cls_part && cfg_.task != Task::cls) || (k == kMlmB && cfg_.task != Task::mlm)) continue;
      check(model_[k] != nullptr || model16_[k] != nullptr, "InferenceModel: '", model_tensor_name(k), "' is not bound");
    }
    for (Index l = 0; l < cfg_.n_layers; ++l)
      for (int k = 0; k < kLayerTensors; ++k)
        check(layers_[static_cast<std::size_t>(l)].t[k] != nullptr || layers_[static_cast<std::size_t>(l)].h[k] != nullptr,
              "InferenceModel: 'layers.", l, ".", layer_tensor_name(k), "' is not bound");
  }

  /// Number of parameter values forward reads (the bound tensors the configured task needs, seg_emb included).
  Index parameter_count() const {
    Index n = 0;
    for (int k = 0; k < kModelTensors; ++k) {
      const bool cls_part = k == kCls0W || k == kCls0B || k == kCls3W || k == kCls3B;
      if ((cls_part && cfg_.task != Task::cls) || (k == kMlmB && cfg_.task != Task::mlm)) continue;
      n += model_tensor_numel(k);
    }
    for (int k = 0; k < kLayerTensors; ++k) n += cfg_.n_layers * layer_tensor_numel(k);
    return n;
  }

  // ---- workspace ----------------------------------------------------------------------------------------------

  /// Elements of S the workspace needs for batches of up to max_batch sequences of up to max_len tokens; with `bf16`
  /// (float models with bf16 product weights), also the bf16 products' conversion and packing buffers.
  static constexpr Index workspace_size(const InferenceConfig& c, Index max_batch, Index max_len, bool bf16 = false) {
    return aligned_count<S>(max_len * c.d_model) + activations_size(c, max_batch, max_len) +
           (bf16 ? bf16_buffers_size(c, max_batch * max_len) : 0);
  }

  /// Uses `buffer` (capacity `elems` values of S, aligned to dea::kWorkspaceAlign, e.g. a static array declared
  /// `alignas(dea::kWorkspaceAlign)`) as the workspace for batches up to max_batch and lengths up to max_len
  /// (<= config().max_len), and writes the positional table into it. The buffer must outlive the model's use.
  void set_workspace(S* buffer, Index elems, Index max_batch, Index max_len) {
    check(max_batch > 0, "InferenceModel::set_workspace: max_batch must be positive, got ", max_batch);
    check(max_len > 0 && max_len <= cfg_.max_len, "InferenceModel::set_workspace: max_len must be in [1, ",
          cfg_.max_len, "], got ", max_len);
    const Index need = workspace_size(cfg_, max_batch, max_len);
    check(elems >= need, "InferenceModel::set_workspace: the buffer holds ", elems, " values, ", need,
          " are needed for max_batch ", max_batch, " and max_len ", max_len);
    Workspace<S> check_alignment(buffer, elems);
    (void)check_alignment;
    ws_ = buffer;
    ws_size_ = elems;
    max_batch_ = max_batch;
    max_len_ = max_len;
    SinusoidalPositionalEncoding<S>::fill_table(ws_, max_len, cfg_.d_model);  // PE[:max_len], float32 as the model's
  }

  /// Allocates an owned workspace for batches up to max_batch and lengths up to max_len (once: the set-up; after
  /// binding, so that bf16 weights get their products' buffers too).
  void reserve(Index max_batch, Index max_len) {
    check(max_batch > 0 && max_len > 0, "InferenceModel::reserve: max_batch and max_len must be positive, got ",
          max_batch, " and ", max_len);
    owned_.assign(static_cast<std::size_t>(workspace_size(cfg_, max_batch, max_len, has_bf16_weights())), S(0));
    set_workspace(owned_.data(), static_cast<Index>(owned_.size()), max_batch, max_len);
  }

  Index max_batch() const { return max_batch_; }
  Index max_len() const { return max_len_; }
  /// Bytes of the workspace in use (positional table and activations).
  std::size_t workspace_bytes() const { return static_cast<std::size_t>(ws_size_) * sizeof(S); }

  // ---- forward ------------------------------------------------------------------------------------------------

  /// Logits for token ids [B, T] (row-major, each in [0, vocab_size)), an optional attention mask [B, T]
  /// (non-zero = real token; nullptr = all real) and optional token types [B, T] in {0, 1} (nullptr = none):
  /// [B, n_classes] (cls) or [B*T, vocab_size] (mlm, row b*T + t). B <= max_batch(), T <= max_len(). The result
  /// is a view into the workspace, valid until the next call. Allocates nothing.
  ConstMatMap<S> forward(const std::int64_t* ids, Index B, Index T, const std::uint8_t* mask = nullptr,
                         const std::int64_t* token_types = nullptr) {
    check(ws_ != nullptr, "InferenceModel::forward: no workspace (call reserve or set_workspace first)");
    check(B >= 1 && B <= max_batch_, "InferenceModel::forward: batch must be in [1, ", max_batch_, "], got ", B);
    check(T >= 1 && T <= max_len_, "InferenceModel::forward: sequence length must be in [1, ", max_len_, "], got ", T);
    check(ids != nullptr, "InferenceModel::forward: ids is null");
    const Index N = B * T, D = cfg_.d_model, F = cfg_.d_ff, V = cfg_.vocab_size;
    for (Index k = 0; k < N; ++k)
      check(ids[k] >= 0 && ids[k] < V, "InferenceModel::forward: ids[", k, "]: expected an id in [0, ", V, "), got ",
            ids[k]);
    if (token_types) {
      check(model_[kSegEmb] != nullptr, "InferenceModel::forward: token types given but 'seg_emb.weight' is not bound");
      for (Index k = 0; k < N; ++k)
        check(token_types[k] == 0 || token_types[k] == 1, "InferenceModel::forward: token_types[", k,
              "]: expected 0 or 1, got ", token_types[k]);
    }
    check_bound();
    // bf16 product weights: every product in bf16, converting and packing into the workspace's last region
    const bool b16 = has_bf16_weights();
    const Index act = activations_size(cfg_, max_batch_, max_len_);
    check(!b16 || ws_size_ >= workspace_size(cfg_, max_batch_, max_len_, true), "InferenceModel::forward: the "
          "workspace has no room for the bf16 products (reserve after binding the bf16 weights, or size the buffer "
          "with workspace_size(config, max_batch, max_len, /*bf16*/ true))");
    const ScopedPrecision precision(b16 ? Precision::bf16 : thread_settings().product_precision);
    std::optional<ops::packed::Bf16BufferScope> bf16_buffers;
    if (b16) {  // (float: one value of S is one dword)
      const ops::packed::Bf16BufferSize bs = bf16_buffer_dwords(cfg_, max_batch_ * max_len_);
      std::uint32_t* const a = align64(reinterpret_cast<std::uint32_t*>(ws_ + pe_size() + act));
      bf16_buffers.emplace(a, bs.a, align64(a + bs.a), bs.b);
    }

    Workspace<S> ws(ws_ + pe_size(), b16 ? act : ws_size_ - pe_size());
    const Index packed_n = pack_size(cfg_, max_batch_ * max_len_);
    const ops::packed::BufferScope<S> packing(ws.take(packed_n), packed_n);  // the products pack into the workspace
    MatMap<S> x(ws.take(N * D), N, D), h(ws.take(N * D), N, D);
    MatMap<S> Q(ws.take(N * D), N, D), K(ws.take(N * D), N, D), V_(ws.take(N * D), N, D), ctx(ws.take(N * D), N, D);
    MatMap<S> f(ws.take(N * F), N, F);

    // x = tok_emb[ids] sqrt(D) (+ seg_emb[token_types]) + PE[:T]
    const S scale = static_cast<S>(std::sqrt(static_cast<double>(D)));
    ConstMatMap<S> tok(model_[kTokEmb], V, D);
    for (Index k = 0; k < N; ++k) x.row(k) = scale * tok.row(ids[k]);
    if (token_types) {
      ConstMatMap<S> seg(model_[kSegEmb], 2, D);
      for (Index k = 0; k < N; ++k) x.row(k) += S(1) * seg.row(token_types[k]);
    }
    ConstMatMap<S> pe(ws_, max_len_, D);
    for (Index b = 0; b < B; ++b) x.middleRows(b * T, T) += pe.topRows(T);

    const S eps = S(ops::layer_norm_default_eps);
    for (Index l = 0; l < cfg_.n_layers; ++l) {
      const S* const* w = layers_[static_cast<std::size_t>(l)].t;
      const bf16* const* w16 = layers_[static_cast<std::size_t>(l)].h;
      ops::layer_norm_forward_into<S>(x, w[kLn1W], w[kLn1B], eps, h, nullptr, nullptr);  // h = LN1(x)
      attention(w, w16, h, Q, K, V_, ctx, B, T, mask, ws);                                // h = DEA(h)
      x += h;                                                                             // x1 = x + a
      ops::layer_norm_forward_into<S>(x, w[kLn2W], w[kLn2B], eps, h, nullptr, nullptr);  // u = LN2(x1)
      product_(h, w[kFf0W], w16[kFf0W], F, D, w[kFf0B], f);                              // a = u W0^T + b0
      ops::gelu_forward_into<S>(f, f);                                                    // g = gelu(a)
      product_(f, w[kFf3W], w16[kFf3W], D, F, w[kFf3B], Q);                              // f = g W3^T + b3
      x += Q;                                                                             // y = x1 + f
    }
    ops::layer_norm_forward_into<S>(x, model_[kLnfW], model_[kLnfB], eps, h, nullptr, nullptr);  // y = ln_f(x_L)

    if (cfg_.task == Task::cls) {
      const Index C = cfg_.n_classes;
      MatMap<S> pooled(ws.take(B * D), B, D), t(ws.take(B * D), B, D), z(ws.take(B * D), B, D);
      MatMap<S> logits(ws.take(B * C), B, C);
      for (Index b = 0; b < B; ++b) pooled.row(b) = h.row(b * T);                          // y[:, 0]
      product_(pooled, model_[kCls0W], model16_[kCls0W], D, D, model_[kCls0B], t);
      z = t.array().tanh().matrix();                                                        // z = tanh(t)
      product_(z, model_[kCls3W], model16_[kCls3W], C, D, model_[kCls3B], logits);
      return ConstMatMap<S>(logits.data(), B, C);
    }
    MatMap<S> logits(ws.take(N * V), N, V);
    ops::linear_forward_into<S>(h, tok, model_[kMlmB], logits);                            // y E^T + b (tied)
    return ConstMatMap<S>(logits.data(), N, V);
  }

private:
  struct LayerPtrs {
    const S* t[kLayerTensors] = {};
    const bf16* h[kLayerTensors] = {};  ///< the product weights bound as bf16 (then t[k] is null)
  };
  using LayerStore = std::conditional_t<Layers == Dynamic, std::vector<LayerPtrs>,
                                        std::array<LayerPtrs, static_cast<std::size_t>(Layers > 0 ? Layers : 1)>>;

  Index pe_size() const { return aligned_count<S>(max_len_ * cfg_.d_model); }

  /// The attention's (b, h) pairs are spread over at most kAttnSlots scratch slots (pair bh on slot bh % slots,
  /// slots run in parallel), so that the workspace does not depend on the thread count.
  static constexpr Index kAttnSlots = 8;
  static constexpr Index attn_slots(Index B, Index H) { return B * H < kAttnSlots ? B * H : kAttnSlots; }
  static constexpr Index slot_size(Index T, Index Dh) {
    return aligned_count<S>(::dea::detail::dex::Scratch<S>::size_bound(T, Dh));
  }

  /// Everything after the positional table, for B sequences of T tokens.
  static constexpr Index activations_size(const InferenceConfig& c, Index B, Index T) {
    const Index N = B * T, D = c.d_model, H = c.n_heads, Dh = c.d_model / c.n_heads;
    Index n = 6 * aligned_count<S>(N * D) + aligned_count<S>(N * c.d_ff);
    if (c.n_layers > 0)
      n += 3 * aligned_count<S>(B * H * T * T) + aligned_count<S>(B * H * T) + attn_slots(B, H) * slot_size(T, Dh);
    if (c.task == Task::cls)
      n += 3 * aligned_count<S>(B * D) + aligned_count<S>(B * c.n_classes);
    else
      n += aligned_count<S>(N * c.vocab_size);
    return n + aligned_count<S>(pack_size(c, N));
  }

  /// Values the matrix products pack their right-hand side into (ops/packed_gemm.hpp): for the largest of them,
  /// at most kPackPanels panels of columns at a time (more would only save passes over the few rows of a batch).
  static constexpr Index kPackPanels = 4;
  /// None when no product can have ops::packed::kMinRows rows (max_rows = max_batch * max_len): those use Eigen.
  static constexpr Index pack_size(const InferenceConfig& c, Index max_rows) {
    if (max_rows < ops::packed::kMinRows) return 0;
    const Index D = c.d_model, F = c.d_ff, P = kPackPanels;
    const Index head = c.task == Task::cls ? ops::packed::b_pack_size<S>(D, c.n_classes, P)
                                           : ops::packed::b_pack_size<S>(D, c.vocab_size, P);
    const Index sizes[] = {ops::packed::b_pack_size<S>(D, D, P), ops::packed::b_pack_size<S>(D, F, P),
                           ops::packed::b_pack_size<S>(F, D, P), head};
    Index m = 0;
    for (Index v : sizes) m = v > m ? v : m;
    return m;
  }

  /// y [rows, out] = x W^T + b (W [out, in]): the float weight W through ops::linear_forward_into, or its bf16 copy
  /// W16 (when bound; then W is null) through ops::packed::gemm_bf16, reading it in place. Under the forward's
  /// ScopedPrecision(bf16) both give the same bits for the same bf16 values.
  template <class DX, class DY>
  static void product_(const DX& x, const S* W, const bf16* W16, Index out, Index in, const S* b, DY& y) {
    if constexpr (std::is_same<S, float>::value) {
      if (W16) {
        ops::packed::gemm_bf16(x.rows(), out, in, ops::packed::View<float>{x.data(), Index(x.outerStride()), 1},
                               ops::packed::View<bf16>{W16, 1, in}, y.data(), Index(y.outerStride()), false, b);
        return;
      }
    }
    ops::linear_forward_into<S>(x, ConstMatMap<S>(W, out, in), b, y);
  }

  /// The bf16 products' buffers for products of up to max_rows rows (the largest over the model's products).
  static constexpr ops::packed::Bf16BufferSize bf16_buffer_dwords(const InferenceConfig& c, Index max_rows) {
    const Index D = c.d_model, F = c.d_ff;
    const Index NK[5][2] = {{D, D}, {F, D}, {D, F}, {c.task == Task::cls ? c.n_classes : c.vocab_size, D}, {D, D}};
    ops::packed::Bf16BufferSize m;
    for (const auto& nk : NK) {
      const ops::packed::Bf16BufferSize s = ops::packed::bf16_buffer_size(max_rows, nk[0], nk[1]);
      m.a = s.a > m.a ? s.a : m.a;
      m.b = s.b > m.b ? s.b : m.b;
    }
    return m;
  }
  /// Values of S the bf16 products' buffers take in the workspace (float models; 0 for double).
  static constexpr Index bf16_buffers_size(const InferenceConfig& c, Index max_rows) {
    if (!std::is_same<S, float>::value) return 0;
    const ops::packed::Bf16BufferSize m = bf16_buffer_dwords(c, max_rows);
    return aligned_count<S>(m.a + m.b + 32);  // (and room to start each at a multiple of 64 bytes)
  }
  /// p moved up to the next multiple of 64 bytes.
  static std::uint32_t* align64(std::uint32_t* p) {
    const std::uintptr_t u = reinterpret_cast<std::uintptr_t>(p);
    return reinterpret_cast<std::uint32_t*>((u + 63) / 64 * 64);
  }

  /// Dual-Expert attention of one layer without oracle, in place on h [N, D] (LN1 output in, attention output
  /// out): the row-block kernel of DualExpertAttention's reference kernel, with its maps in `ws` (a copy: every
  /// layer reuses the same region). E0~, E1~ and alpha-hat are [B, H, T, T] buffers with the layer cache's
  /// layout (alpha_mix = alpha-hat without an oracle; the scores and P replace E0~ in place), so every vectorised
  /// loop starts where the layer's does and the results are the same bits.
  void attention(const S* const* w, const bf16* const* w16, MatMap<S>& h, MatMap<S>& Q, MatMap<S>& K, MatMap<S>& V, MatMap<S>& ctx, Index B,
                 Index T, const std::uint8_t* mask, Workspace<S> ws) const {
    namespace dex = ::dea::detail::dex;
    const Index D = cfg_.d_model, H = cfg_.n_heads, Dh = D / H;
    {
      const ScopedPrecision gate_inputs(Precision::fp32);  // Q and K, the gate's inputs, are fp32 products
      product_(h, w[kWq], nullptr, D, D, w[kBq], Q);       // Q = h W_q^T + b_q
      product_(h, w[kWk], nullptr, D, D, w[kBk], K);       // K = h W_k^T + b_k
    }
    product_(h, w[kWv], w16[kWv], D, D, w[kBv], V);  // V = h W_v^T + b_v
    S* e0 = ws.take(B * H * T * T);
    S* e1 = ws.take(B * H * T * T);
    S* ah = ws.take(B * H * T * T);
    S* sigma = ws.take(B * H * T);  // [B, H, T] row sigmas, laid out as the layer cache's sigma0 / sigma1
    const Index slots = attn_slots(B, H), per = slot_size(max_len_, Dh);
    S* scratch = ws.take(slots * per);
    // R is written by the kernel and not read again: it takes the rows of h (h is rewritten by W_o below)
    S* R = h.data();
    const Index bq = dex::block_rows<S>(0, T, T);
    const bool par = double(B * H) * double(T) * double(T) * double(4 * Dh + 20) > kParallelMinFlops;
    const dex::PairRows<S> rows{Q.data(), K.data(), V.data(), R, D, T, T};
    parallel_for(slots, [&](Index slot) {
      for (Index bh = slot; bh < B * H; bh += slots) {
        const Index b = bh / H, hd = bh % H;
        dex::HeadParams<S> hp;
        hp.Dh = Dh;
        hp.W_rel = w[kWrel] + hd * Dh * Dh;
        hp.w_gate = w[kWgate] + hd * (2 * Dh + 2);
        hp.c_gate = w[kCgate][hd];
        // the sequence's key mask by AttnInputs' rule, in the slot's scratch (no oracle: p.in stays null)
        const auto keys = dex::PairKeys<S>::from_bytes(mask ? mask + b * T : nullptr);
        dex::Pair<S, DHead> p = dex::make_pair<S, DHead>(bh, H, T, T, hp, rows, keys, scratch + slot * per, bq);
        p.setup(false);
        dex::RowStats<S> rs;
        rs.sigma0 = rs.sigma1 = sigma + bh * T;
        for (Index i0 = 0; i0 < T; i0 += bq) {
          const Index off = (bh * T + i0) * T;
          dex::BlockMaps<S> mp;
          mp.e0n = mp.attn = e0 + off;
          mp.e1n = e1 + off;
          mp.alpha_hat = mp.alpha_mix = ah + off;
          p.forward_block(i0, std::min(bq, T - i0), mp, rs, nullptr, ctx.data() + b * T * D + hd * Dh);
        }
      }
    }, par);
    product_(ctx, w[kWo], w16[kWo], D, D, w[kBo], h);  // a = ctx W_o^T + b_o
  }

  /// The rope_theta of an attention's options, or 0 for an attention type without that option.
  template <class A>
  static auto attention_rope_theta(const A& a, int) -> decltype(static_cast<double>(a.options().rope_theta)) {
    return static_cast<double>(a.options().rope_theta);
  }
  template <class A>
  static double attention_rope_theta(const A&, long) {
    return 0;
  }

  InferenceConfig cfg_;
  const S* model_[kModelTensors] = {};
  const bf16* model16_[kModelTensors] = {};  ///< cls_head.0 / .3 weights bound as bf16
  LayerStore layers_{};
  int bf16_bound_ = 0;                       ///< tensors bound as bf16
  S* ws_ = nullptr;
  Index ws_size_ = 0, max_batch_ = 0, max_len_ = 0;
  AlignedVec<S> owned_;
};

}  // namespace nn
}  // namespace dea
