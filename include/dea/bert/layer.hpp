// dea/bert/layer.hpp: one post-LayerNorm BERT encoder layer (Hugging Face BertLayer), with a pluggable
// self-attention.
//
// Shapes: x [N, H] (N = B*T, row b*T + t) -> y [N, H]; I = intermediate_size:
//   ctx = SelfAttn(x; in)                        [N, H]   attention.self   (stops at the merged heads)
//   o   = ctx W_ao^T + b_ao                      [N, H]   attention.output.dense
//   r1  = x + Dropout(o)                                    (hidden_dropout_prob)
//   h1  = LN1(r1)                                [N, H]   attention.output.LayerNorm (eps = layer_norm_eps)
//   a   = h1 W_i^T + b_i                         [N, I]   intermediate.dense
//   g   = act(a)                                          gelu (erf) | gelu_new (tanh) | relu
//   f   = g W_o^T + b_o                          [N, H]   output.dense
//   r2  = h1 + Dropout(f)
//   y   = LN2(r2)                                [N, H]   output.LayerNorm
// The self-attention is a template argument: any class with the attention classes' shape (nn/attention_traits.hpp:
// forward(x, in, cache) -> [N, H], backward(dy, cache) -> dx, parameters(), Cache, Options) that returns the
// context before an output projection. Its parameters are prefixed "attention.self." (BertSelfAttention's
// query/key/value; a Dual-Expert adapter would bring its own names there), and attention.output, intermediate and
// output stay as they are.
// Parameters (HF order): attention.self.*, attention.output.dense.{weight, bias},
// attention.output.LayerNorm.{weight, bias}, intermediate.dense.{weight, bias}, output.dense.{weight, bias},
// output.LayerNorm.{weight, bias}. Fresh: Linear weights N(0, initializer_range^2), biases 0, LayerNorm 1 / 0.
// Saved for backward: x (inside the attention's cache), ctx, r1, h1, a, r2, the LayerNorm row statistics and the
// dropout masks; g is recomputed from a.
// Inference with bf16 weights (store_bf16_weights, float only): the weights of attention.output.dense,
// intermediate.dense and output.dense (and the self-attention's, when its class stores them) packed once as bf16
// (bf16_weights.hpp); the forward is then the float layer's under ScopedPrecision(Precision::bf16), bit for bit.
#pragma once

#include "../attention/inputs.hpp"
#include "../core/error.hpp"
#include "../core/init.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../nn/attention_traits.hpp"
#include "../nn/dropout.hpp"
#include "../nn/layer_norm.hpp"
#include "../nn/linear.hpp"
#include "../ops/activations.hpp"
#include "../ops/gelu.hpp"
#include "bf16_weights.hpp"
#include "config.hpp"
#include "self_attention.hpp"

#include <memory>
#include <string>
#include <utility>

namespace dea {
namespace bert {

namespace detail {

/// g = act(a) (g resized).
template <class S>
void activation_forward(HiddenAct act, const Mat<S>& a, Mat<S>& g) {
  switch (act) {
    case HiddenAct::gelu: ops::gelu_forward<S>(a, g); return;
    case HiddenAct::gelu_tanh: ops::gelu_tanh_forward<S>(a, g); return;
    case HiddenAct::relu: ops::relu_forward<S>(a, g); return;
  }
}

/// In place: dg = dL/dg  ->  dL/da = dg .* act'(a).
template <class S>
void activation_backward(HiddenAct act, const Mat<S>& a, Mat<S>& dg) {
  switch (act) {
    case HiddenAct::gelu: ops::gelu_backward_inplace<S>(a, dg); return;
    case HiddenAct::gelu_tanh: ops::gelu_tanh_backward_inplace<S>(a, dg); return;
    case HiddenAct::relu: ops::relu_backward<S>(dg, a, dg); return;
  }
}

/// weight ~ N(0, std^2), bias = 0 (HF's _init_weights for a Linear).
template <class S>
void hf_init_linear(nn::Linear<S>& l, Rng& rng, double stddev) {
  init::normal(l.weight.mat(), rng, 0.0, stddev);
  if (l.has_bias()) l.bias.value.setZero();
}

/// A Linear with zero weight and bias (its values are loaded next).
template <class S>
nn::Linear<S> zero_linear(Index in, Index out) {
  Rng unused(0);
  nn::Linear<S> l(in, out, unused);
  l.weight.value.setZero();
  l.bias.value.setZero();
  return l;
}

}  // namespace detail

/// The self-attention options BertModel gives layer `layer` by default: attention_probs_dropout_prob and
/// initializer_range from the configuration (for BertSelfAttention; other classes get their defaults with the
/// dropout set).
template <class SelfAttention>
typename SelfAttention::Options default_self_attention_options(const BertConfig& cfg, Index layer) {
  using O = typename SelfAttention::Options;
  if constexpr (std::is_same<O, BertSelfAttentionOptions<typename SelfAttention::Scalar>>::value) {
    (void)layer;
    O o;
    o.dropout = static_cast<typename SelfAttention::Scalar>(cfg.attention_probs_dropout_prob);
    o.initializer_range = cfg.initializer_range;
    return o;
  } else {
    return nn::default_attention_options<SelfAttention>(cfg.attention_probs_dropout_prob, layer, cfg.num_hidden_layers);
  }
}

template <class S, class SelfAttention = BertSelfAttention<S>>
class BertLayer {
  static_assert(std::is_same<typename SelfAttention::Scalar, S>::value, "BertLayer: SelfAttention::Scalar must be S");

public:
  using SelfAttentionType = SelfAttention;

  struct Cache {
    Index rows = 0;
    typename SelfAttention::Cache attn;
    Mat<S> ctx;                            ///< [N, H] the attention's context (attention.output.dense input)
    Mat<S> r1;                             ///< [N, H] x + Dropout(o) (LN1 input)
    Mat<S> h1;                             ///< [N, H] LN1 output
    Mat<S> a;                              ///< [N, I] intermediate pre-activation
    Mat<S> r2;                             ///< [N, H] h1 + Dropout(f) (LN2 input)
    typename nn::LayerNorm<S>::Cache ln1, ln2;
    nn::DropoutState drop1, drop2;
  };

  /// Fresh (HF init): the attention with `attn_opt` and `rng`, then attention.output.dense, intermediate.dense,
  /// output.dense N(0, initializer_range^2) in that order.
  BertLayer(const BertConfig& cfg, Rng& rng, typename SelfAttention::Options attn_opt)
      : BertLayer(cfg, SelfAttention(cfg.hidden_size, cfg.num_attention_heads, rng, attn_opt)) {
    for (nn::Linear<S>* l : {&ao_dense_, &i_dense_, &o_dense_}) detail::hf_init_linear(*l, rng, cfg.initializer_range);
  }

  /// Around a given self-attention module; every other parameter zero (LayerNorms 1 / 0), to be loaded next.
  BertLayer(const BertConfig& cfg, SelfAttention attn)
      : act_(cfg.hidden_act),
        attn_(std::move(attn)),
        ao_dense_(detail::zero_linear<S>(cfg.hidden_size, cfg.hidden_size)),
        ao_ln_(cfg.hidden_size, cfg.layer_norm_eps),
        i_dense_(detail::zero_linear<S>(cfg.hidden_size, cfg.intermediate_size)),
        o_dense_(detail::zero_linear<S>(cfg.intermediate_size, cfg.hidden_size)),
        o_ln_(cfg.hidden_size, cfg.layer_norm_eps),
        drop_(cfg.hidden_dropout_prob) {
    prefix_names(attn_.parameters(), "attention.self.");
    prefix_names(ao_dense_.parameters(), "attention.output.dense.");
    prefix_names(ao_ln_.parameters(), "attention.output.LayerNorm.");
    prefix_names(i_dense_.parameters(), "intermediate.dense.");
    prefix_names(o_dense_.parameters(), "output.dense.");
    prefix_names(o_ln_.parameters(), "output.LayerNorm.");
  }

  SelfAttention& self_attention() { return attn_; }
  const SelfAttention& self_attention() const { return attn_; }
  nn::Linear<S>& attention_output_dense() { return ao_dense_; }
  nn::LayerNorm<S>& attention_output_layer_norm() { return ao_ln_; }
  nn::Linear<S>& intermediate_dense() { return i_dense_; }
  nn::Linear<S>& output_dense() { return o_dense_; }
  nn::LayerNorm<S>& output_layer_norm() { return o_ln_; }

  /// HF order (see the file comment).
  ParamList<S> parameters() {
    ParamList<S> out = attn_.parameters();
    for (Param<S>* p : ao_dense_.parameters()) out.push_back(p);
    for (Param<S>* p : ao_ln_.parameters()) out.push_back(p);
    for (Param<S>* p : i_dense_.parameters()) out.push_back(p);
    for (Param<S>* p : o_dense_.parameters()) out.push_back(p);
    for (Param<S>* p : o_ln_.parameters()) out.push_back(p);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// Makes the layer an inference layer: the weights of attention.output.dense, intermediate.dense and output.dense
  /// stored once as packed bf16 (bf16_weights.hpp), their float values released, and every gradient of the layer
  /// released; the self-attention stores its own weights when its class can (BertSelfAttention does), and otherwise
  /// keeps them as float (its products then run in bf16 under the model's ScopedPrecision). A training forward and
  /// backward throw afterwards. float only. Returns weight_bytes().
  std::size_t store_bf16_weights() {
    if constexpr (std::is_same<S, float>::value) {
      if (!w16_) {
        if constexpr (detail::stores_bf16_weights<SelfAttention>::value) attn_.store_bf16_weights();
        auto w = std::make_shared<W16>();
        w->ao = detail::pack_linear_bf16(ao_dense_.weight.value.data(), ao_dense_.out_features(), ao_dense_.in_features());
        w->i = detail::pack_linear_bf16(i_dense_.weight.value.data(), i_dense_.out_features(), i_dense_.in_features());
        w->o = detail::pack_linear_bf16(o_dense_.weight.value.data(), o_dense_.out_features(), o_dense_.in_features());
        w16_ = std::move(w);
        for (nn::Linear<S>* l : {&ao_dense_, &i_dense_, &o_dense_}) detail::release_value_and_grad(l->weight);
        for (Param<S>* p : parameters()) p->grad = Vec<S>();
      }
    } else {
      check(false, "BertLayer::store_bf16_weights: float models only (bf16 is a policy of the float path)");
    }
    return weight_bytes();
  }
  /// True after store_bf16_weights.
  bool has_bf16_weights() const { return w16_ != nullptr; }
  /// Bytes of the layer's weights as held: float values (gradients not counted) and bf16 copies.
  std::size_t weight_bytes() const {
    std::size_t n = 0;
    if constexpr (detail::stores_bf16_weights<SelfAttention>::value) {
      n += attn_.weight_bytes();
    } else {
      for (Param<S>* p : const_cast<SelfAttention&>(attn_).parameters()) n += detail::value_bytes(*p);
    }
    for (const nn::Linear<S>* l : {&ao_dense_, &i_dense_, &o_dense_})
      n += detail::value_bytes(l->weight) + detail::value_bytes(l->bias);
    for (const nn::LayerNorm<S>* ln : {&ao_ln_, &o_ln_}) n += detail::value_bytes(ln->weight) + detail::value_bytes(ln->bias);
    if (w16_) n += w16_->ao.bytes() + w16_->i.bytes() + w16_->o.bytes();
    return n;
  }

  /// y [N, H] from x [N, H] (N = in.batch() * in.q_len()); in.training() and in.rng() drive the dropouts too.
  Mat<S> forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& c);

  /// dL/dx [N, H] from dL/dy [N, H]; adds into every parameter gradient.
  Mat<S> backward(const Mat<S>& dy, Cache& c);

private:
  HiddenAct act_;
  SelfAttention attn_;
  nn::Linear<S> ao_dense_;
  nn::LayerNorm<S> ao_ln_;
  nn::Linear<S> i_dense_, o_dense_;
  nn::LayerNorm<S> o_ln_;
  nn::Dropout drop_;
  /// The three dense weights as bf16 (store_bf16_weights), shared by copies of the layer.
  struct W16 {
    ops::packed::Bf16Matrix ao, i, o;
  };
  std::shared_ptr<const W16> w16_;

  /// y = x W^T + b with the Linear's float weight, or with its bf16 copy W16p after store_bf16_weights.
  static void dense_(const nn::Linear<S>& l, const ops::packed::Bf16Matrix* W16p, const Mat<S>& x, Mat<S>& y) {
    if constexpr (std::is_same<S, float>::value) {
      if (W16p) return detail::linear_bf16(x, *W16p, l.has_bias() ? l.bias.value.data() : nullptr, y);
    }
    l.forward(x, y);
  }
};

template <class S, class SelfAttention>
Mat<S> BertLayer<S, SelfAttention>::forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& c) {
  check(x.cols() == ao_ln_.size(), "BertLayer::forward: x: expected ", ao_ln_.size(), " columns, got ", x.cols());
  const bool training = in.training();
  check(!(training && w16_), "BertLayer::forward: the weights are stored as bf16 for inference (training = false only)");
  c.rows = x.rows();
  Rng* rng = in.rng();
  const W16* w = w16_.get();
  c.ctx = attn_.forward(x, in, c.attn);                        // ctx = SelfAttn(x)
  Mat<S> o;
  dense_(ao_dense_, w ? &w->ao : nullptr, c.ctx, o);           // o = ctx W_ao^T + b_ao
  drop_.forward_add(o, x, training, rng, c.drop1, c.r1);       // r1 = x + Dropout(o)
  ao_ln_.forward(c.r1, c.h1, c.ln1);                           // h1 = LN1(r1)
  dense_(i_dense_, w ? &w->i : nullptr, c.h1, c.a);            // a = h1 W_i^T + b_i
  Mat<S> g;
  detail::activation_forward(act_, c.a, g);                    // g = act(a)
  Mat<S> f;
  dense_(o_dense_, w ? &w->o : nullptr, g, f);                 // f = g W_o^T + b_o
  drop_.forward_add(f, c.h1, training, rng, c.drop2, c.r2);    // r2 = h1 + Dropout(f)
  Mat<S> y;
  o_ln_.forward(c.r2, y, c.ln2);                               // y = LN2(r2)
  return y;
}

template <class S, class SelfAttention>
Mat<S> BertLayer<S, SelfAttention>::backward(const Mat<S>& dy, Cache& c) {
  check(!w16_, "BertLayer::backward: the weights are stored as bf16 for inference");
  check(c.rows > 0, "BertLayer::backward: the cache holds no forward pass");
  check_matrix(dy, c.rows, ao_ln_.size(), "BertLayer::backward: dy");
  Mat<S> dr2;
  o_ln_.backward(dy, c.r2, c.ln2, dr2);                        // y = LN2(r2)
  Mat<S> df;
  nn::Dropout::backward_into(dr2, c.drop2, df);                // r2 = h1 + Dropout(f)  ->  df = dr2 .* m2
  Mat<S> g;
  detail::activation_forward(act_, c.a, g);                    // recompute g = act(a)
  Mat<S> dg;
  o_dense_.backward(df, g, &dg);                               // f = g W_o^T + b_o  ->  dW_o, db_o, dg
  detail::activation_backward(act_, c.a, dg);                  // g = act(a)  ->  da = dg .* act'(a)
  Mat<S> dh1;
  i_dense_.backward(dg, c.h1, &dh1);                           // a = h1 W_i^T + b_i  ->  dW_i, db_i, dh1
  dh1 += dr2;                                                  // r2 = h1 + ...
  Mat<S> dr1;
  ao_ln_.backward(dh1, c.r1, c.ln1, dr1);                      // h1 = LN1(r1)
  Mat<S> dout;
  nn::Dropout::backward_into(dr1, c.drop1, dout);              // r1 = x + Dropout(o)  ->  do = dr1 .* m1
  Mat<S> dctx;
  ao_dense_.backward(dout, c.ctx, &dctx);                      // o = ctx W_ao^T + b_ao  ->  dW_ao, db_ao, dctx
  Mat<S> dx = attn_.backward(dctx, c.attn);                    // ctx = SelfAttn(x)
  dx += dr1;                                                   // r1 = x + ...
  return dx;
}

#ifdef DEA_EXTERN_TEMPLATES
extern template class BertLayer<float>;
extern template class BertLayer<double>;
#endif

}  // namespace bert
}  // namespace dea
