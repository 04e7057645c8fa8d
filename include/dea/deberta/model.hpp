// dea/deberta/model.hpp: Hugging Face's DebertaV2Model (DeBERTa-v2 and v3), forward only (docs/deberta.md).
//
// Shapes (B batch, T tokens, N = B*T rows, row b*T + t; E embedding_size, H hidden, A heads, d = H / A, I
// intermediate, S the attention span, 2S rows of the relative table; m_t in {0, 1} the attention mask):
//   e   = word[id] (+ position[t] if position_biased_input) (+ token_type[tt] if type_vocab_size > 0)   [N, E]
//   e   = e W_proj^T if E != H (no bias)                                               [N, H]
//   x0  = LN_emb(e) * m_t                       (padded positions are exactly zero)    [N, H]
//   Rt  = rel_embeddings (then LN_rel if norm_rel_ebd has layer_norm)                  [2S, H], shared by layers
//   per layer (post-LN):
//     Q, K, V = x W_{q,k,v}^T + b                                                     [N, H]
//     PK = Rt W_pk^T + b_pk, PQ = Rt W_pq^T + b_pq  (the content key / query projections when share_att_key)
//     per (b, a), query i, key j, r = clamp(bucket(i - j) + S, 0, 2S - 1)  (relative.hpp):
//       score_ij = Q_i.K_j / s + [c2p] Q_i.PK_r / s + [p2c] K_j.PQ_r / s,   s = float32 sqrt(d (1 + [c2p] + [p2c]))
//       P_ij = softmax over the keys with m_i m_j = 1; 0 elsewhere (a padded query row is all zeros)
//       C_i = sum_j P_ij V_j                                                           [T, d] per head
//     h1 = LN_1(C W_o^T + b_o + x),  h2 = LN_2(act(h1 W_i^T + b_i) W_2^T + b_2 + h1)
//   last_hidden_state = x_L; hidden_states = (x0, x_1, ..., x_L) when asked.
// The scale is a float32 square root of the float32 number d f, used in the working precision (the reference's
// quirk: a double square root is off by ~4e-8 relative). Only the rows of PK / PQ that the sequence's distances
// reach are projected (a window of at most 2T - 1 rows: the bucket is monotone in the distance).
//
// Parameters under Hugging Face's names (deberta_parameter_shapes lists them in state_dict order):
// embeddings.word_embeddings.weight [V, E], embeddings.position_embeddings.weight [P, E] (position_biased_input),
// embeddings.token_type_embeddings.weight [type_vocab_size, E] (type_vocab_size > 0), embeddings.embed_proj.weight
// [H, E] (E != H), embeddings.LayerNorm.{weight, bias}; per layer encoder.layer.{i}.attention.self.{query_proj,
// key_proj, value_proj}, .pos_key_proj (relative, not shared, c2p), .pos_query_proj (relative, not shared, p2c),
// attention.output.dense, attention.output.LayerNorm, intermediate.dense, output.dense, output.LayerNorm;
// encoder.rel_embeddings.weight [2S, H] (relative_attention), encoder.LayerNorm.{weight, bias} (norm_rel_ebd).
// A model is built with zero weights (LayerNorms 1 / 0) and loaded next (hf_dir.hpp); its parameters carry no
// gradient storage (forward only).
//
// Packed weights: pack_weights() packs the weight of every projection (embed_proj, the attention's, the output
// dense and the feed-forward's) once for the library's product (packed_weights.hpp), which otherwise packs it again
// in every forward; the outputs keep their bits. parameters() gives write access, so it drops the packed copies
// (a later forward packs per product again, pack_weights() packs anew); after pack_weights(true), which frees the
// float values of the packed weights, it refuses (the weights live in the packed copies alone).
//
// Parallel work: the projections are the library's row-blocked products; the attention runs one (b, a) pair per
// task, each on its own copies of its head slices, so results are bitwise the same for every thread count and a
// sequence's results do not depend on the other sequences of its batch.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "../ops/activations.hpp"
#include "../ops/gelu.hpp"
#include "../ops/layer_norm.hpp"
#include "../ops/linear.hpp"
#include "config.hpp"
#include "packed_weights.hpp"
#include "relative.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dea {
namespace deberta {

/// One batch. An optional tensor is absent when default-constructed (dim() == 0).
struct DebertaBatch {
  Tensor<std::int64_t> input_ids;       ///< [B, T] ids in [0, V)
  Tensor<std::uint8_t> attention_mask;  ///< [B, T], non-zero = real token; absent = all real
  Tensor<std::int64_t> token_type_ids;  ///< [B, T]; read only when type_vocab_size > 0; absent = all 0

  Index batch() const { return input_ids.dim() == 2 ? input_ids.size(0) : 0; }
  Index seq_len() const { return input_ids.dim() == 2 ? input_ids.size(1) : 0; }
};

/// What DebertaV2Model::forward returns.
template <class S>
struct DebertaOutput {
  Mat<S> last_hidden_state;          ///< [B*T, H], row b*T + t
  std::vector<Mat<S>> hidden_states;  ///< (x0, x1, ..., x_L), each [B*T, H]; empty unless asked
  std::vector<std::int64_t> relative_pos;  ///< [2T - 1] bucket of delta = i - j at delta + T - 1 (relative attention)
};

/// Every parameter name of a DebertaV2Model built from `cfg`, with its shape, in state_dict order.
inline std::vector<std::pair<std::string, Shape>> deberta_parameter_shapes(const DebertaConfig& cfg) {
  const Index H = cfg.hidden_size, E = cfg.embed_size(), I = cfg.intermediate_size;
  std::vector<std::pair<std::string, Shape>> out{{"embeddings.word_embeddings.weight", {cfg.vocab_size, E}}};
  if (cfg.position_biased_input) out.push_back({"embeddings.position_embeddings.weight", {cfg.max_position_embeddings, E}});
  if (cfg.type_vocab_size > 0) out.push_back({"embeddings.token_type_embeddings.weight", {cfg.type_vocab_size, E}});
  if (E != H) out.push_back({"embeddings.embed_proj.weight", {H, E}});
  out.push_back({"embeddings.LayerNorm.weight", {H}});
  out.push_back({"embeddings.LayerNorm.bias", {H}});
  for (Index l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    std::vector<const char*> proj{"query_proj", "key_proj", "value_proj"};
    if (cfg.relative_attention && !cfg.share_att_key) {
      if (cfg.c2p) proj.push_back("pos_key_proj");
      if (cfg.p2c) proj.push_back("pos_query_proj");
    }
    for (const char* n : proj) {
      out.push_back({p + "attention.self." + n + ".weight", {H, H}});
      out.push_back({p + "attention.self." + n + ".bias", {H}});
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
  if (cfg.relative_attention) out.push_back({"encoder.rel_embeddings.weight", {2 * cfg.att_span(), H}});
  if (cfg.norm_rel_ebd) {
    out.push_back({"encoder.LayerNorm.weight", {H}});
    out.push_back({"encoder.LayerNorm.bias", {H}});
  }
  return out;
}

namespace detail {

/// A named parameter without gradient storage (forward-only models): zeros, or ones for a LayerNorm weight.
template <class S>
Param<S> inference_param(const std::string& name, Shape shape, bool ones = false) {
  Param<S> p;
  p.name = name;
  p.shape = std::move(shape);
  p.value = ones ? Vec<S>::Ones(shape_numel(p.shape)) : Vec<S>::Zero(shape_numel(p.shape));
  return p;
}

/// y = act(a) element-wise (y resized).
template <class S>
void activation_forward(Activation act, const Mat<S>& a, Mat<S>& y) {
  switch (act) {
    case Activation::gelu: ops::gelu_forward<S>(a, y); return;
    case Activation::gelu_tanh: ops::gelu_tanh_forward<S>(a, y); return;
    case Activation::relu: ops::relu_forward<S>(a, y); return;
    case Activation::tanh: y = a.array().tanh().matrix(); return;
  }
}

/// y = LN(x) with a parameter pair (weight, bias) (y resized; must not alias x).
template <class S>
void layer_norm(const Mat<S>& x, const Param<S>& w, const Param<S>& b, double eps, Mat<S>& y) {
  y.resize(x.rows(), x.cols());
  ops::layer_norm_forward_into<S>(x, w.value.data(), b.value.data(), static_cast<S>(eps), y, nullptr, nullptr);
}

/// y = x W^T + b for a [out, in] weight parameter and an optional bias (y resized).
template <class S, class DX>
void dense(const Eigen::MatrixBase<DX>& x, const Param<S>& w, const Param<S>* b, Mat<S>& y) {
  ops::linear_forward<S>(x, w.mat(), b ? b->value.data() : nullptr, y);
}

}  // namespace detail

template <class S>
class DebertaV2Model {
  static_assert(std::is_floating_point<S>::value, "DebertaV2Model: Scalar must be float or double");

public:
  using Scalar = S;

  /// The parameters of one encoder layer.
  struct Layer {
    Param<S> q_w, q_b, k_w, k_b, v_w, v_b;      ///< attention.self.{query,key,value}_proj
    Param<S> pk_w, pk_b, pq_w, pq_b;            ///< attention.self.pos_{key,query}_proj (empty when absent)
    Param<S> ao_w, ao_b, ao_ln_w, ao_ln_b;      ///< attention.output.dense / .LayerNorm
    Param<S> i_w, i_b, o_w, o_b, o_ln_w, o_ln_b;  ///< intermediate.dense, output.dense / .LayerNorm
  };

  /// A model with zero weights (LayerNorms 1 / 0), loaded next (hf_dir.hpp). Throws on an invalid configuration.
  explicit DebertaV2Model(const DebertaConfig& cfg) : cfg_((cfg.validate(), cfg)) {
    using detail::inference_param;
    const Index H = cfg.hidden_size, E = cfg.embed_size(), I = cfg.intermediate_size;
    word_ = inference_param<S>("embeddings.word_embeddings.weight", {cfg.vocab_size, E});
    if (cfg.position_biased_input)
      pos_ = inference_param<S>("embeddings.position_embeddings.weight", {cfg.max_position_embeddings, E});
    if (cfg.type_vocab_size > 0)
      type_ = inference_param<S>("embeddings.token_type_embeddings.weight", {cfg.type_vocab_size, E});
    if (E != H) proj_ = inference_param<S>("embeddings.embed_proj.weight", {H, E});
    emb_ln_w_ = inference_param<S>("embeddings.LayerNorm.weight", {H}, true);
    emb_ln_b_ = inference_param<S>("embeddings.LayerNorm.bias", {H});
    layers_.resize(static_cast<std::size_t>(cfg.num_hidden_layers));
    for (Index l = 0; l < cfg.num_hidden_layers; ++l) {
      Layer& L = layers_[static_cast<std::size_t>(l)];
      const std::string p = "encoder.layer." + std::to_string(l) + ".";
      const std::string a = p + "attention.self.";
      auto linear = [&](Param<S>& w, Param<S>& b, const std::string& n, Index out, Index in) {
        w = inference_param<S>(n + ".weight", {out, in});
        b = inference_param<S>(n + ".bias", {out});
      };
      linear(L.q_w, L.q_b, a + "query_proj", H, H);
      linear(L.k_w, L.k_b, a + "key_proj", H, H);
      linear(L.v_w, L.v_b, a + "value_proj", H, H);
      if (has_pos_key()) linear(L.pk_w, L.pk_b, a + "pos_key_proj", H, H);
      if (has_pos_query()) linear(L.pq_w, L.pq_b, a + "pos_query_proj", H, H);
      linear(L.ao_w, L.ao_b, p + "attention.output.dense", H, H);
      L.ao_ln_w = inference_param<S>(p + "attention.output.LayerNorm.weight", {H}, true);
      L.ao_ln_b = inference_param<S>(p + "attention.output.LayerNorm.bias", {H});
      linear(L.i_w, L.i_b, p + "intermediate.dense", I, H);
      linear(L.o_w, L.o_b, p + "output.dense", H, I);
      L.o_ln_w = inference_param<S>(p + "output.LayerNorm.weight", {H}, true);
      L.o_ln_b = inference_param<S>(p + "output.LayerNorm.bias", {H});
    }
    if (cfg.relative_attention) rel_ = inference_param<S>("encoder.rel_embeddings.weight", {2 * cfg.att_span(), H});
    if (cfg.norm_rel_ebd) {
      rel_ln_w_ = inference_param<S>("encoder.LayerNorm.weight", {H}, true);
      rel_ln_b_ = inference_param<S>("encoder.LayerNorm.bias", {H});
    }
  }

  const DebertaConfig& config() const { return cfg_; }
  Index n_layers() const { return static_cast<Index>(layers_.size()); }

  /// Every parameter under its HF name, in state_dict order (deberta_parameter_shapes lists the same). Drops the
  /// packed weights (the caller may change the values); refused once pack_weights(true) has freed float values.
  ParamList<S> parameters() {
    check(!released_, "DebertaV2Model::parameters: the projection weights were packed and their float values freed "
          "(pack_weights(true)): they can no longer be read or changed");
    packed_.reset();
    ParamList<S> out{&word_};
    if (cfg_.position_biased_input) out.push_back(&pos_);
    if (cfg_.type_vocab_size > 0) out.push_back(&type_);
    if (cfg_.embed_size() != cfg_.hidden_size) out.push_back(&proj_);
    out.push_back(&emb_ln_w_);
    out.push_back(&emb_ln_b_);
    for (Layer& L : layers_) {
      for (Param<S>* p : {&L.q_w, &L.q_b, &L.k_w, &L.k_b, &L.v_w, &L.v_b}) out.push_back(p);
      if (has_pos_key()) out.insert(out.end(), {&L.pk_w, &L.pk_b});
      if (has_pos_query()) out.insert(out.end(), {&L.pq_w, &L.pq_b});
      for (Param<S>* p : {&L.ao_w, &L.ao_b, &L.ao_ln_w, &L.ao_ln_b, &L.i_w, &L.i_b, &L.o_w, &L.o_b, &L.o_ln_w, &L.o_ln_b})
        out.push_back(p);
    }
    if (cfg_.relative_attention) out.push_back(&rel_);
    if (cfg_.norm_rel_ebd) out.insert(out.end(), {&rel_ln_w_, &rel_ln_b_});
    return out;
  }

  /// Packs the weight of every projection once for the forward's products (the same outputs, bit for bit). With
  /// `release_float`, frees their float values: the packed copies hold the same numbers, and a product that does
  /// not run packed (few rows outside batch-invariant products, bf16 products) reads a weight unpacked from them;
  /// parameters() is refused from then on. Without it, both copies are kept and parameters() drops the packed one.
  void pack_weights(bool release_float = false) {
    // packed already, the float values gone; or no packed product on this compiler
    if (released_ || !ops::packed::supported<S>()) return;
    auto packs = std::make_shared<Packs>();
    // each weight freed as soon as it is packed: the model never holds much more than one copy of its weights
    auto pack = [&](Param<S>& w) {
      PackedWeight<S> pw(w.value.data(), w.shape[0], w.shape[1]);
      if (release_float) release(w);
      return pw;
    };
    if (cfg_.embed_size() != cfg_.hidden_size) packs->proj = pack(proj_);
    for (Layer& L : layers_) {
      LayerPacks lp;
      lp.q = pack(L.q_w);
      lp.k = pack(L.k_w);
      lp.v = pack(L.v_w);
      if (has_pos_key()) lp.pk = pack(L.pk_w);
      if (has_pos_query()) lp.pq = pack(L.pq_w);
      lp.ao = pack(L.ao_w);
      lp.i = pack(L.i_w);
      lp.o = pack(L.o_w);
      packs->layers.push_back(std::move(lp));
    }
    packed_ = std::move(packs);
    released_ = release_float;
  }
  /// True while the projection weights are packed (pack_weights, until parameters()).
  bool weights_packed() const { return packed_ != nullptr; }
  /// True once pack_weights(true) has freed the float values of the projection weights.
  bool float_weights_released() const { return released_; }
  /// Bytes of the packed copies (0 when not packed).
  std::size_t packed_bytes() const {
    if (!packed_) return 0;
    std::size_t n = packed_->proj.bytes();
    for (const LayerPacks& lp : packed_->layers)
      for (const PackedWeight<S>* w : {&lp.q, &lp.k, &lp.v, &lp.pk, &lp.pq, &lp.ao, &lp.i, &lp.o}) n += w->bytes();
    return n;
  }
  /// Bytes of the weights as held: the float values (of every parameter) and the packed copies.
  std::size_t weight_bytes() const {
    std::size_t n = packed_bytes();
    for (const Param<S>* p : {&word_, &pos_, &type_, &proj_, &emb_ln_w_, &emb_ln_b_, &rel_, &rel_ln_w_, &rel_ln_b_})
      n += sizeof(S) * static_cast<std::size_t>(p->value.size());
    for (const Layer& L : layers_)
      for (const Param<S>* p : {&L.q_w, &L.q_b, &L.k_w, &L.k_b, &L.v_w, &L.v_b, &L.pk_w, &L.pk_b, &L.pq_w, &L.pq_b,
                                &L.ao_w, &L.ao_b, &L.ao_ln_w, &L.ao_ln_b, &L.i_w, &L.i_b, &L.o_w, &L.o_b, &L.o_ln_w,
                                &L.o_ln_b})
        n += sizeof(S) * static_cast<std::size_t>(p->value.size());
    return n;
  }

  /// Evaluation-mode forward. With `keep_hidden_states`, the output holds x0 ... x_L.
  DebertaOutput<S> forward(const DebertaBatch& batch, bool keep_hidden_states = false) const;

private:
  bool has_pos_key() const { return cfg_.relative_attention && !cfg_.share_att_key && cfg_.c2p; }
  bool has_pos_query() const { return cfg_.relative_attention && !cfg_.share_att_key && cfg_.p2c; }

  /// The packed weights of one layer (empty members for absent projections), and of the model.
  struct LayerPacks {
    PackedWeight<S> q, k, v, pk, pq, ao, i, o;
  };
  struct Packs {
    PackedWeight<S> proj;
    std::vector<LayerPacks> layers;
  };

  static void release(Param<S>& p) {
    p.value = Vec<S>();
    p.grad = Vec<S>();
  }

  /// The activations of one layer, allocated by the first layer of a forward and reused by the others (fresh
  /// large buffers in every layer cost page faults).
  struct Work {
    Mat<S> q, k, v, pk, pq, ctx, t, h1, a, g;
  };

  /// One layer: x [N, H] -> y [N, H]. `rt` is the window of the (normed) relative table that the sequence's
  /// distances reach, `rows` [2T - 1] the window row of each distance delta (at delta + T - 1).
  void layer_forward(const Layer& L, const LayerPacks* P, const Mat<S>& x, const Mat<S>& rt,
                     const std::vector<Index>& rows,
                     const std::vector<char>& real, Index B, Index T, Work& w, Mat<S>& y) const;

  DebertaConfig cfg_;
  Param<S> word_, pos_, type_, proj_, emb_ln_w_, emb_ln_b_;
  std::vector<Layer> layers_;
  Param<S> rel_, rel_ln_w_, rel_ln_b_;
  std::shared_ptr<const Packs> packed_;  ///< immutable once built: copies of the model share it
  bool released_ = false;
};

// ---- forward, outside the class ----

template <class S>
DebertaOutput<S> DebertaV2Model<S>::forward(const DebertaBatch& batch, bool keep_hidden_states) const {
  const char* fn = "DebertaV2Model::forward";
  check(batch.input_ids.dim() == 2, fn, ": input_ids: expected shape [B, T], got ", shape_str(batch.input_ids.shape));
  const Index B = batch.batch(), T = batch.seq_len(), N = B * T, H = cfg_.hidden_size, E = cfg_.embed_size();
  check(B > 0 && T > 0, fn, ": expected a non-empty batch [B, T], got [", B, ", ", T, "]");
  if (cfg_.position_biased_input)
    check(T <= cfg_.max_position_embeddings, fn, ": sequence length ", T, " exceeds max_position_embeddings ",
          cfg_.max_position_embeddings, " (the model adds absolute position embeddings)");
  const bool has_mask = batch.attention_mask.dim() > 0, has_types = batch.token_type_ids.dim() > 0;
  if (has_mask) check_shape(batch.attention_mask, {B, T}, "DebertaV2Model::forward: attention_mask");
  if (has_types) check_shape(batch.token_type_ids, {B, T}, "DebertaV2Model::forward: token_type_ids");
  const std::int64_t* ids = batch.input_ids.ptr();
  for (Index n = 0; n < N; ++n)
    check(ids[n] >= 0 && ids[n] < cfg_.vocab_size, fn, ": input_ids: id ", ids[n], " at [", n / T, ", ", n % T,
          "] is outside [0, ", cfg_.vocab_size, ")");
  const bool use_types = has_types && cfg_.type_vocab_size > 0;  // type_vocab_size 0: token types are ignored
  if (use_types)
    for (Index n = 0; n < N; ++n) {
      const std::int64_t t = batch.token_type_ids.ptr()[n];
      check(t >= 0 && t < cfg_.type_vocab_size, fn, ": token_type_ids: id ", t, " at [", n / T, ", ", n % T,
            "] is outside [0, ", cfg_.type_vocab_size, ")");
    }
  std::vector<char> real(static_cast<std::size_t>(N), 1);
  if (has_mask)
    for (Index n = 0; n < N; ++n) real[static_cast<std::size_t>(n)] = batch.attention_mask.ptr()[n] != 0;

  // ---- embeddings: e = word[id] (+ position[t]) (+ token_type[tt]); (e W_proj^T); x0 = LN(e) * m
  Mat<S> e(N, E);
  const auto word = word_.mat();
  for (Index n = 0; n < N; ++n) {
    e.row(n) = word.row(ids[n]);                                                   // word[id]
    if (cfg_.position_biased_input) e.row(n) += pos_.mat().row(n % T);             // + position[t]
    if (cfg_.type_vocab_size > 0)                                                  // + token_type[tt] (tt = 0 absent)
      e.row(n) += type_.mat().row(use_types ? batch.token_type_ids.ptr()[n] : 0);
  }
  if (E != H) {
    Mat<S> pe;
    const PackedWeight<S> none;
    linear_packed<S>(e, proj_, packed_ ? packed_->proj : none, nullptr, pe);       // e W_proj^T
    e = std::move(pe);
  }
  Mat<S> x;
  detail::layer_norm<S>(e, emb_ln_w_, emb_ln_b_, cfg_.layer_norm_eps, x);         // LN_emb(e)
  for (Index n = 0; n < N; ++n)
    if (!real[static_cast<std::size_t>(n)]) x.row(n).setZero();                    // * m_t

  // ---- relative positions: bucket of each distance, and the window of the table they reach
  DebertaOutput<S> out;
  Mat<S> rt;
  std::vector<Index> rows;
  if (cfg_.relative_attention) {
    out.relative_pos = relative_buckets(cfg_, T);
    rows = relative_rows(out.relative_pos, cfg_.att_span());
    const Index lo = *std::min_element(rows.begin(), rows.end()), hi = *std::max_element(rows.begin(), rows.end());
    for (Index& r : rows) r -= lo;
    const auto window = rel_.mat().middleRows(lo, hi - lo + 1);
    if (cfg_.norm_rel_ebd) {
      const Mat<S> w = window;
      detail::layer_norm<S>(w, rel_ln_w_, rel_ln_b_, cfg_.layer_norm_eps, rt);    // Rt = LN_rel(rel_embeddings)
    } else {
      rt = window;
    }
  }

  if (keep_hidden_states) out.hidden_states.push_back(x);
  Mat<S> y;
  Work work;
  const std::shared_ptr<const Packs> packs = packed_;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    // x_{l+1} = Layer_l(x_l)
    layer_forward(layers_[l], packs ? &packs->layers[l] : nullptr, x, rt, rows, real, B, T, work, y);
    std::swap(x, y);
    if (keep_hidden_states) out.hidden_states.push_back(x);
  }
  out.last_hidden_state = std::move(x);
  return out;
}

template <class S>
void DebertaV2Model<S>::layer_forward(const Layer& L, const LayerPacks* P, const Mat<S>& x, const Mat<S>& rt,
                                      const std::vector<Index>& rows,
                                      const std::vector<char>& real, Index B, Index T, Work& w,
                                      Mat<S>& y) const {
  const Index H = cfg_.hidden_size, A = cfg_.num_attention_heads, d = cfg_.head_dim(), N = B * T;
  const bool rel = cfg_.relative_attention, c2p = rel && cfg_.c2p, p2c = rel && cfg_.p2c;
  Mat<S>&q = w.q, &k = w.k, &v = w.v, &pk = w.pk, &pq = w.pq;
  // y = x W^T + b, with W's packed copy when the model has one (the same bits)
  const PackedWeight<S> none;
  auto dense = [&](const Mat<S>& in, const Param<S>& wt, const PackedWeight<S> LayerPacks::*pw, const Param<S>& b,
                   Mat<S>& out) { linear_packed<S>(in, wt, P ? P->*pw : none, b.value.data(), out); };
  dense(x, L.q_w, &LayerPacks::q, L.q_b, q);                                       // Q = x W_q^T + b_q
  dense(x, L.k_w, &LayerPacks::k, L.k_b, k);                                       // K = x W_k^T + b_k
  dense(x, L.v_w, &LayerPacks::v, L.v_b, v);                                       // V = x W_v^T + b_v
  if (c2p) {                                                                       // PK = Rt W_pk^T + b_pk
    if (cfg_.share_att_key)
      dense(rt, L.k_w, &LayerPacks::k, L.k_b, pk);
    else
      dense(rt, L.pk_w, &LayerPacks::pk, L.pk_b, pk);
  }
  if (p2c) {                                                                       // PQ = Rt W_pq^T + b_pq
    if (cfg_.share_att_key)
      dense(rt, L.q_w, &LayerPacks::q, L.q_b, pq);
    else
      dense(rt, L.pq_w, &LayerPacks::pq, L.pq_b, pq);
  }
  // s = sqrt(d f) as a float32 square root of the float32 d f, then in the working precision
  const S s = static_cast<S>(std::sqrt(static_cast<float>(d) * static_cast<float>(cfg_.scale_factor())));
  const Index W = rt.rows();
  Mat<S>& ctx = w.ctx;
  ctx.resize(N, H);
  parallel_for(B * A, [&](Index ba) {
    const Index b = ba / A, a = ba % A;
    // the pair's own copies of its head slices: the same arithmetic wherever the sequence sits in the batch
    const Mat<S> qh = q.block(b * T, a * d, T, d), kh = k.block(b * T, a * d, T, d), vh = v.block(b * T, a * d, T, d);
    Mat<S> sc(T, T);
    sc.noalias() = qh * kh.transpose();                                            // Q_i . K_j
    Mat<S> c2p_s, p2c_s;
    if (c2p) {
      const Mat<S> pkh = pk.block(0, a * d, W, d);
      c2p_s.resize(T, W);
      c2p_s.noalias() = qh * pkh.transpose();                                      // Q_i . PK_r
    }
    if (p2c) {
      const Mat<S> pqh = pq.block(0, a * d, W, d);
      p2c_s.resize(T, W);
      p2c_s.noalias() = kh * pqh.transpose();                                      // K_j . PQ_r
    }
    const char* m = real.data() + b * T;
    if (rel && (c2p || p2c))                                                       // + Q_i . PK_r + K_j . PQ_r
      for (Index i = 0; i < T; ++i) {
        const Index* r_i = rows.data() + (i + T - 1);                              // r(i, j) = r_i[-j]
        for (Index j = 0; j < T; ++j) {
          const Index row = r_i[-j];
          S r = S(0);
          if (c2p) r += c2p_s(i, row);
          if (p2c) r += p2c_s(j, row);
          sc(i, j) += r;
        }
      }
    sc.array() /= s;                                                               // score_ij (all terms over s)
    Mat<S>& p = sc;
    const bool every_key = std::all_of(m, m + T, [](char c) { return c != 0; });
    for (Index i = 0; i < T; ++i) {
      auto row = p.row(i);
      if (!m[i]) {                                                                 // padded query: all zeros
        row.setZero();
        continue;
      }
      if (every_key) {                                                             // softmax of the whole row
        const S mx = row.maxCoeff();
        row = (row.array() - mx).exp().matrix();
        row *= S(1) / row.sum();
        continue;
      }
      S mx = -std::numeric_limits<S>::infinity();                                  // softmax over the real keys
      for (Index j = 0; j < T; ++j)
        if (m[j]) mx = std::max(mx, row(j));
      S sum = 0;
      for (Index j = 0; j < T; ++j) {
        row(j) = m[j] ? std::exp(row(j) - mx) : S(0);
        sum += row(j);
      }
      row *= S(1) / sum;                                                           // P_ij, 0 for padded keys
    }
    ctx.block(b * T, a * d, T, d).noalias() = p * vh;                              // C = P V
  }, double(B * A) * double(T) * double(T) * double(4 * d + 10) > kParallelMinFlops);

  Mat<S>&t = w.t, &h1 = w.h1, &a = w.a, &g = w.g;
  dense(ctx, L.ao_w, &LayerPacks::ao, L.ao_b, t);                                  // C W_o^T + b_o
  t += x;                                                                          //   + x
  detail::layer_norm<S>(t, L.ao_ln_w, L.ao_ln_b, cfg_.layer_norm_eps, h1);         // h1 = LN_1(.)
  dense(h1, L.i_w, &LayerPacks::i, L.i_b, a);                                      // a = h1 W_i^T + b_i
  detail::activation_forward<S>(cfg_.hidden_act, a, g);                            // g = act(a)
  dense(g, L.o_w, &LayerPacks::o, L.o_b, t);                                       // g W_2^T + b_2
  t += h1;                                                                         //   + h1
  detail::layer_norm<S>(t, L.o_ln_w, L.o_ln_b, cfg_.layer_norm_eps, y);            // h2 = LN_2(.)
}

}  // namespace deberta
}  // namespace dea
