// dea/nn/encoder_layer.hpp: the pre-LayerNorm encoder layer of the reference (transformer.py EncoderLayer).
//
// Shapes: x [N, D] with N = B*T (row b*T + t) -> y [N, D]:
//   h  = LN1(x)                                    (LayerNorm, eps 1e-5)
//   a  = Attn(h, h, h; in)                         (self-attention; the inputs carry mask, oracle, gamma, ...)
//   x1 = x + Dropout(a)
//   u  = LN2(x1)
//   y  = x1 + Dropout(FFN(u))                      (FFN = Linear -> GELU -> Dropout -> Linear)
// Parameters, in the reference's state_dict order: attn.* (the attention's own names), ln1.weight, ln1.bias,
// ln2.weight, ln2.bias, ff.0.weight, ff.0.bias, ff.3.weight, ff.3.bias.
// Saved for backward: x, x1, the LayerNorm row statistics, the attention's cache, the FFN pre-activation and the
// dropout masks (their seeds, and one bit per element). u is recomputed from x1 in backward.
// The task backward never touches a gate; backward_gate() forwards the gate-loss backward to the attention
// (Dual-Expert: W_gate and c_gate only).
#pragma once

#include "../attention/dual_expert.hpp"
#include "../attention/inputs.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "attention_traits.hpp"
#include "dropout.hpp"
#include "feed_forward.hpp"
#include "layer_norm.hpp"

#include <cstdint>
#include <utility>

namespace dea {
namespace nn {

template <class S, class Attention = DualExpertAttention<S>>
class EncoderLayer {
  static_assert(std::is_same<typename Attention::Scalar, S>::value, "EncoderLayer: Attention::Scalar must be S");

public:
  using AttentionType = Attention;
  static constexpr bool has_gate = traits::has_gate_loss<Attention>::value;

  struct Cache {
    Index batch = 0;
    AttnInputs<S> inputs;                     ///< the attention inputs of the forward (shared storage, not a copy)
    Mat<S> x;                                 ///< [N, D] the layer input (LN1 input)
    Mat<S> x1;                                ///< [N, D] after the attention residual (LN2 input)
    typename LayerNorm<S>::Cache ln1, ln2;    ///< row statistics
    typename Attention::Cache attn;
    typename FeedForward<S>::Cache ff;
    DropoutState drop1, drop2;                ///< residual dropouts
  };

  /// The attention is built first (with `attn_opt`), then the LayerNorms, then the FFN (Linear 0, Linear 3).
  EncoderLayer(Index d_model, Index n_heads, Index d_ff, double dropout, Rng& rng,
               typename Attention::Options attn_opt)
      : attn_(d_model, n_heads, rng, attn_opt), ln1_(d_model), ln2_(d_model), ff_(d_model, d_ff, dropout, rng),
        drop_(dropout) {
    prefix_names(attn_.parameters(), "attn.");
    prefix_names(ln1_.parameters(), "ln1.");
    prefix_names(ln2_.parameters(), "ln2.");
    prefix_names(ff_.parameters(), "ff.");
  }
  /// Attention options by default_attention_options (dropout = the layer's dropout).
  EncoderLayer(Index d_model, Index n_heads, Index d_ff, double dropout, Rng& rng)
      : EncoderLayer(d_model, n_heads, d_ff, dropout, rng, default_attention_options<Attention>(dropout, 0, 1)) {}

  Attention& attention() { return attn_; }
  const Attention& attention() const { return attn_; }
  LayerNorm<S>& ln1() { return ln1_; }
  LayerNorm<S>& ln2() { return ln2_; }
  FeedForward<S>& feed_forward() { return ff_; }
  Index d_model() const { return ln1_.size(); }
  double dropout() const { return drop_.p(); }

  ParamList<S> parameters() {
    ParamList<S> out = attn_.parameters();
    for (auto* list : {&ln1_, &ln2_})
      for (Param<S>* p : list->parameters()) out.push_back(p);
    for (Param<S>* p : ff_.parameters()) out.push_back(p);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// y [N, D] from x [N, D] (N = B*T, B = in.batch(); x taken by value: pass an rvalue to avoid a copy; the cache
  /// keeps it). in.training() and in.rng() also drive the layer's own dropouts. `token_ids` [B, T] is passed to
  /// attention classes whose forward takes token ids (required for them), and ignored otherwise.
  Mat<S> forward(Mat<S> x, const AttnInputs<S>& in, Cache& c, const Tensor<std::int64_t>* token_ids = nullptr) {
    check(x.cols() == d_model(), "EncoderLayer::forward: x: expected ", d_model(), " columns, got ", x.cols());
    check(in.batch() > 0, "EncoderLayer::forward: the attention inputs are empty (build them with "
          "AttnInputs(batch, seq_len))");
    c.batch = in.batch();
    c.inputs = in;
    c.x = std::move(x);
    Mat<S> h;
    ln1_.forward(c.x, h, c.ln1);                                   // h = LN1(x)
    Mat<S> a;
    if constexpr (traits::takes_token_ids<Attention>::value) {
      check(token_ids != nullptr, "EncoderLayer::forward: this attention needs token ids");
      a = attn_.forward(h, *token_ids, in, c.attn);                // a = Attn(h)
    } else {
      a = attn_.forward(h, in, c.attn);                            // a = Attn(h)
    }
    const bool training = in.training();
    Rng* rng = in.rng();
    drop_.forward_add(a, c.x, training, rng, c.drop1, c.x1);       // x1 = x + Dropout(a)
    Mat<S> u;
    ln2_.forward(c.x1, u, c.ln2);                                  // u = LN2(x1)
    Mat<S> f = ff_.forward(u, training, rng, c.ff);                // f = FFN(u)
    drop_.forward_add(f, c.x1, training, rng, c.drop2, f);         // y = x1 + Dropout(f)
    return f;
  }

  /// Task backward: dL/dx [N, D] from dy [N, D]; adds into every parameter gradient the task reaches (for
  /// Dual-Expert never W_gate / c_gate).
  Mat<S> backward(const Mat<S>& dy, Cache& c) {
    check(c.batch > 0, "EncoderLayer::backward: the cache holds no forward pass");
    check_matrix(dy, c.x1.rows(), d_model(), "EncoderLayer::backward: dy");
    Mat<S> df;
    Dropout::backward_into(dy, c.drop2, df);                       // f = Dropout(f)  ->  df = dy .* m2
    Mat<S> u;
    typename LayerNorm<S>::Cache scratch;
    ln2_.forward(c.x1, u, scratch);                                // recompute u = LN2(x1)
    const Mat<S> du = ff_.backward(df, u, c.ff);                   // f = FFN(u)
    Mat<S> dx1;
    ln2_.backward(du, c.x1, c.ln2, dx1);                           // u = LN2(x1)
    dx1 += dy;                                                     // y = x1 + f
    Mat<S> da;
    Dropout::backward_into(dx1, c.drop1, da);                      // a = Dropout(a)  ->  da = dx1 .* m1
    const Mat<S> dh = attn_.backward(da, c.attn);                  // a = Attn(h)
    Mat<S> dx;
    ln1_.backward(dh, c.x, c.ln1, dx);                             // h = LN1(x)
    dx += dx1;                                                     // x1 = x + a
    return dx;
  }

  /// Gate-loss backward (scale * d loss_gate): the attention's backward_gate; a no-op for attention classes
  /// without a gate.
  void backward_gate(Cache& c, S scale = S(1)) {
    if constexpr (has_gate) attn_.backward_gate(c.attn, scale);
  }

  /// The attention's gate loss of the last forward with this cache (0 without a gate).
  S loss_gate(const Cache& c) const {
    if constexpr (has_gate)
      return c.attn.loss_gate;
    else
      return S(0);
  }

private:
  Attention attn_;
  LayerNorm<S> ln1_, ln2_;
  FeedForward<S> ff_;
  Dropout drop_;
};

}  // namespace nn
}  // namespace dea
