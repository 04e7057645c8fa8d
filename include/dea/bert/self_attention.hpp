// dea/bert/self_attention.hpp: BERT's self-attention (Hugging Face `attention.self`): the query, key and value
// projections and the per-head scaled dot-product attention, with the semantics of HF's additive mask. It ends
// at the merged heads' context; the output projection is the layer's `attention.output` (layer.hpp), so a layer
// can swap this class for another self-attention that also stops at the context (Dual-Expert attention with no
// output projection, the DualExpertBert of the reference).
//
// Shapes (N = B*T rows, row b*T + t; H = hidden_size = A*d):
//   [Q K V] = x [W_q; W_k; W_v]^T + [b_q, b_k, b_v]            x [N, H], each of Q, K, V [N, H]
//   per (b, a):  S = Q_ba K_ba^T / sqrt(d)                      [T, T]   (head a: columns [a d, (a+1) d))
//                P = softmax_rows(S + M_b)                        M_b = 0 for real keys, finfo.min for padded
//                C_ba = (P .* Drop) V_ba                          [T, d]   (dropout on P, training only)
//   ctx = [C_b0 ... C_b(A-1)]                                     [N, H]
// HF's additive mask adds (1 - mask) * finfo(dtype).min to the scores. So a padded key gets exactly 0 when its row
// has a real key (computed here as the softmax over the real keys: the same numbers), and a row with no real key
// at all has every score equal to min: its P is uniform, 1/T over all T keys. Padded query rows are computed like
// every other row.
// Backward of a uniform row: P does not depend on S there (every score rounds to min), so dS = 0 and the row
// passes no gradient to Q or K; V still gets P^T dC.
//
// Why not DotProductAttention (attention/dot_product.hpp): it applies W_o itself (BERT's output projection sits in
// attention.output, before a dropout, the residual and a LayerNorm, and DualExpertBert keeps that part while it
// replaces this one), a row without real keys gives zeros there instead of HF's uniform row, and its parameters
// are named W_q/W_k/W_v/W_o. Its fused Q/K/V product is reused here, and both run their heads through the one
// softmax-attention core (ops/attention_core.hpp; here with HF's division by sqrt(d) and its uniform empty row).
//
// Parameters (HF state_dict names and order, prefixed "attention.self." by the layer): query.weight [H, H],
// query.bias [H], key.weight, key.bias, value.weight, value.bias. Fresh weights N(0, initializer_range^2), biases 0.
//
// Inference with bf16 weights (store_bf16_weights, float only): W_q; W_k; W_v packed once as one bf16 matrix [3H, H]
// (bf16_weights.hpp), the product [Q K V] then the same bits as the float module's under
// ScopedPrecision(Precision::bf16); the float weights and every gradient are released, and training forwards and
// backward are refused.
//
// Parallel work: one (b, a) pair per task; each writes only its own slices of P, the context, dQ, dK and dV.
// Attention dropout is counter-based (one seed per forward, drawn from the inputs' Rng; element k of pair p is
// ops::counter_dropout_mask(seed, p*T*T + k)), so it does not depend on the thread count either.
#pragma once

#include "../attention/dot_product.hpp"
#include "../attention/inputs.hpp"
#include "../core/error.hpp"
#include "../core/init.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/attention_core.hpp"
#include "../ops/dropout.hpp"
#include "../ops/softmax.hpp"
#include "bf16_weights.hpp"

#include <cmath>
#include <cstdint>
#include <memory>

namespace dea {
namespace bert {

/// Options of BertSelfAttention.
template <class S>
struct BertSelfAttentionOptions {
  S dropout = 0;                    ///< attention_probs_dropout_prob, in [0, 1)
  double initializer_range = 0.02;  ///< std of the fresh weights
};

/// `Heads` and `DHead` may fix the number of heads and the head width at compile time (or be Eigen::Dynamic, as the
/// models that read their sizes from a configuration use them); a fixed DHead reaches the per-head kernels.
template <class S, int Heads = Eigen::Dynamic, int DHead = Eigen::Dynamic>
class BertSelfAttention {
  static_assert(std::is_floating_point<S>::value, "BertSelfAttention: Scalar must be float or double");
  static_assert(Heads == Eigen::Dynamic || Heads > 0, "BertSelfAttention: Heads must be positive or Dynamic");
  static_assert(DHead == Eigen::Dynamic || DHead > 1,
                "BertSelfAttention: a fixed DHead must be > 1 (use Eigen::Dynamic for d_head = 1)");

public:
  using Scalar = S;
  using Options = BertSelfAttentionOptions<S>;
  static constexpr int HeadsAtCompileTime = Heads;
  static constexpr int DHeadAtCompileTime = DHead;

  /// A key mask only (no oracle, no causal masking); P is always in the cache.
  static constexpr AttnSupport kSupport{/*oracle*/ false, /*causal*/ false, /*frozen_alpha_hat*/ false,
                                        /*keep_maps*/ true};

  /// What backward needs, filled by forward, and the backward's work buffers.
  struct Cache {
    Index batch = 0, seq = 0;
    AttnInputs<S> inputs;  ///< the forward's inputs (shared storage): which rows have no real key
    Mat<S> x;              ///< [N, H] the input
    Mat<S> qkv;            ///< [N, 3H] Q | K | V
    Vec<S> p;              ///< [B, A, T, T] attention probabilities (before dropout), pair ba at ba * pair_stride(T)
    Vec<S> drop;           ///< [B, A, T, T] dropout multipliers; empty when dropout was inactive
    Mat<S> w_cat;          ///< [3H, H] W_q; W_k; W_v of this forward
    RowVec<S> b_cat;       ///< [3H]
    Mat<S> work_dqkv, work_dw;
  };

  /// query, key, value: weights N(0, initializer_range^2) in that order, biases 0.
  BertSelfAttention(Index hidden, Index heads, Rng& rng, Options opt = {}) : BertSelfAttention(hidden, heads, opt) {
    for (Proj* p : {&q_, &k_, &v_}) init::normal(p->weight.mat(), rng, 0.0, opt.initializer_range);
  }
  /// Zero weights and biases (for a model whose parameters are loaded next).
  BertSelfAttention(Index hidden, Index heads, Options opt = {})
      : d_model_(hidden),
        n_heads_(heads),
        d_head_(::dea::detail::mha::check_head_sizes<Heads, DHead>("BertSelfAttention", hidden, heads)),
        opt_(opt) {
    ops::check_dropout_probability(opt.dropout, "BertSelfAttention: Options::dropout");
    q_ = Proj("query", hidden, hidden, true);
    k_ = Proj("key", hidden, hidden, true);
    v_ = Proj("value", hidden, hidden, true);
  }

  /// Elements between the starts of two (b, h) pairs' [T, T] maps in Cache::p: T * T rounded up to 64 bytes, so
  /// that every pair's map has the same alignment wherever its sequence sits in the batch (Eigen's vectorised
  /// softmax peels an unaligned head element by element, which would make a row's bits depend on its position).
  static Index pair_stride(Index T) {
    constexpr Index per64 = Index(64 / sizeof(S)) > 0 ? Index(64 / sizeof(S)) : 1;
    return (T * T + per64 - 1) / per64 * per64;
  }

  Index d_model() const { return d_model_; }
  Index n_heads() const { return n_heads_; }
  Index d_head() const { return d_head_; }
  const Options& options() const { return opt_; }

  /// query.weight, query.bias, key.weight, key.bias, value.weight, value.bias.
  ParamList<S> parameters() {
    ParamList<S> list;
    for (Proj* p : {&q_, &k_, &v_}) p->append_to(list);
    return list;
  }
  void zero_grad() {
    for (Proj* p : {&q_, &k_, &v_}) p->zero_grad();
  }

  /// Makes the module an inference module: W_q; W_k; W_v stored once as one packed bf16 matrix [3H, H] (the product
  /// the forward runs; bf16_weights.hpp), their float values and all six gradients released (the biases keep their
  /// float values). Forward then computes [Q K V] with bf16 products, the same bits as before under
  /// ScopedPrecision(Precision::bf16); a training forward and backward throw. float only. Returns weight_bytes().
  std::size_t store_bf16_weights() {
    if constexpr (std::is_same<S, float>::value) {
      if (!w16_) {
        const Index D = d_model_;
        Mat<S> w_cat(3 * D, D);  // [W_q; W_k; W_v], as the float forward assembles it
        w_cat.topRows(D) = q_.weight.mat();
        w_cat.middleRows(D, D) = k_.weight.mat();
        w_cat.bottomRows(D) = v_.weight.mat();
        w16_ = std::make_shared<const ops::packed::Bf16Matrix>(detail::pack_linear_bf16(w_cat.data(), 3 * D, D));
        for (Proj* p : {&q_, &k_, &v_}) {
          detail::release_value_and_grad(p->weight);
          p->bias.grad = Vec<S>();
        }
      }
    } else {
      check(false, "BertSelfAttention::store_bf16_weights: float models only (bf16 is a policy of the float path)");
    }
    return weight_bytes();
  }
  /// True after store_bf16_weights.
  bool has_bf16_weights() const { return w16_ != nullptr; }
  /// Bytes of the weights as held: float values (gradients not counted) and the bf16 copy.
  std::size_t weight_bytes() const {
    std::size_t n = w16_ ? w16_->bytes() : 0;
    for (const Proj* p : {&q_, &k_, &v_}) n += detail::value_bytes(p->weight) + detail::value_bytes(p->bias);
    return n;
  }

  /// x [B*T, H] -> the merged context [B*T, H] (B = in.batch(), T = in.q_len()). Reads the key mask, training and
  /// rng of `in`. Fills the cache (it keeps a copy of x, except with bf16 weights).
  Mat<S> forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& c) const;

  /// dctx [B*T, H] -> dx [B*T, H]. ADDS into the six parameter gradients; only the work buffers change.
  Mat<S> backward(const Mat<S>& dctx, Cache& c);

private:
  using Proj = ::dea::detail::mha::Projection<S>;
  Index d_model_, n_heads_, d_head_;
  Options opt_;
  Proj q_, k_, v_;
  /// W_q; W_k; W_v packed as bf16 [3H, H] (store_bf16_weights), shared by copies of the module.
  std::shared_ptr<const ops::packed::Bf16Matrix> w16_;
};

// ---- forward and backward, outside the class (not inline: an extern template declaration then keeps other
// translation units from instantiating them) ----

template <class S, int Heads, int DHead>
Mat<S> BertSelfAttention<S, Heads, DHead>::forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& c) const {
  namespace mha = ::dea::detail::mha;
  const char* cls = "BertSelfAttention";
  const Index T = mha::check_self_attention_input(cls, kSupport, x, in, d_model_, n_heads_, opt_.dropout);
  const Index B = in.batch(), A = n_heads_, dh = d_head_, TT = T * T, D = d_model_;
  c.batch = B;
  c.seq = T;
  c.inputs = in;
  if (w16_) {  // bf16 weights: inference only, nothing kept for backward but the attention's own cache
    check(!in.training(), "BertSelfAttention::forward: the weights are stored as bf16 for inference (training = false "
          "only)");
    if constexpr (std::is_same<S, float>::value) {
      c.x.resize(0, D);
      c.w_cat.resize(0, D);
      c.b_cat.resize(3 * D);
      c.b_cat.segment(0, D) = q_.bias.value.transpose();
      c.b_cat.segment(D, D) = k_.bias.value.transpose();
      c.b_cat.segment(2 * D, D) = v_.bias.value.transpose();
      detail::linear_bf16(x, *w16_, c.b_cat.data(), c.qkv);   // [Q K V] = x [W_q; W_k; W_v]^T + b   [N, 3H]
    }
  } else {
    if (&x != &c.x) c.x = x;
    mha::qkv_forward(c.x, q_, k_, v_, c.w_cat, c.b_cat, c.qkv);  // [Q K V] = x [W_q; W_k; W_v]^T + b   [N, 3H]
  }
  const bool dropping = in.training() && opt_.dropout > S(0);
  const std::uint64_t seed = dropping ? in.rng()->next_u64() : 0;
  if (dropping)
    c.drop.resize(B * A * TT);
  else
    c.drop.resize(0);
  const Index TTp = pair_stride(T);
  c.p.resize(B * A * TTp);
  Mat<S> ctx(B * T, D);
  const auto scale = ops::ScoreScale<S>::over(std::sqrt(static_cast<S>(dh)));  // HF: scores / sqrt(d)
  const bool masked = in.has_key_mask();
  const Mat<S>& qkv = c.qkv;
  parallel_for(B * A, [&](Index ba) {
    const Index b = ba / A, a = ba % A;
    S* drop = nullptr;
    if (dropping) {
      drop = c.drop.data() + ba * TT;
      ops::counter_dropout_mask(drop, TT, seed, static_cast<std::uint64_t>(ba * TT), static_cast<double>(opt_.dropout));
    }
    // P = softmax(Q K^T / sqrt(d) + M_b) (uniform when the sequence has no real key), C = (P .* Drop) V
    const ops::AttentionMask mask{masked ? in.key_mask(b) : nullptr, /*causal*/ false, /*uniform_if_empty*/ true};
    ops::attention_core_forward<S, DHead>(
        ops::head_block<DHead>(qkv, b * T, a * dh, T, dh), ops::head_block<DHead>(qkv, b * T, D + a * dh, T, dh),
        ops::head_block<DHead>(qkv, b * T, 2 * D + a * dh, T, dh), scale, mask, ops::HeadProducts::registers, drop,
        c.p.data() + ba * TTp, ops::head_block<DHead>(ctx, b * T, a * dh, T, dh));
  }, double(B * A) * double(TT) * double(4 * dh + 10) > kParallelMinFlops);
  return ctx;
}

template <class S, int Heads, int DHead>
Mat<S> BertSelfAttention<S, Heads, DHead>::backward(const Mat<S>& dctx, Cache& c) {
  namespace mha = ::dea::detail::mha;
  check(!w16_, "BertSelfAttention::backward: the weights are stored as bf16 for inference");
  mha::check_backward_input("BertSelfAttention", dctx, c.batch, c.seq, d_model_);
  const Index T = c.seq, A = n_heads_, dh = d_head_, TT = T * T, TTp = pair_stride(T), N = dctx.rows(), D = d_model_;
  const bool dropping = c.drop.size() > 0;
  Mat<S>& dqkv = c.work_dqkv;
  dqkv.resize(N, 3 * D);
  const auto scale = ops::ScoreScale<S>::over(std::sqrt(static_cast<S>(dh)));  // HF: scores / sqrt(d)
  const Cache& cc = c;
  const bool masked = cc.inputs.has_key_mask();
  parallel_for(c.batch * A, [&](Index ba) {
    const Index b = ba / A, a = ba % A;
    // C = (P .* Drop) V, P = softmax(S + M)  ->  dQ, dK, dV (a sequence without real keys: P uniform, dQ = dK = 0)
    const ops::AttentionMask mask{masked ? cc.inputs.key_mask(b) : nullptr, /*causal*/ false,
                                  /*uniform_if_empty*/ true};
    ops::attention_core_backward<S, DHead>(
        cc.p.data() + ba * TTp, dropping ? cc.drop.data() + ba * TT : nullptr,
        ops::head_block<DHead>(dctx, b * T, a * dh, T, dh), ops::head_block<DHead>(cc.qkv, b * T, a * dh, T, dh),
        ops::head_block<DHead>(cc.qkv, b * T, D + a * dh, T, dh),
        ops::head_block<DHead>(cc.qkv, b * T, 2 * D + a * dh, T, dh), scale, mask, ops::HeadProducts::registers,
        ops::head_block<DHead>(dqkv, b * T, a * dh, T, dh), ops::head_block<DHead>(dqkv, b * T, D + a * dh, T, dh),
        ops::head_block<DHead>(dqkv, b * T, 2 * D + a * dh, T, dh));
  }, double(c.batch * A) * double(TT) * double(8 * dh + 10) > kParallelMinFlops);
  Mat<S> dx;
  // [Q K V] = x W_cat^T + b_cat  ->  dW_q, dW_k, dW_v, db_q, db_k, db_v, dx = dQKV W_cat
  mha::qkv_backward(dqkv, c.x, c.w_cat, q_, k_, v_, c.work_dw, dx);
  return dx;
}

#ifdef DEA_EXTERN_TEMPLATES
extern template class BertSelfAttention<float>;
extern template class BertSelfAttention<double>;
#endif

}  // namespace bert
}  // namespace dea
