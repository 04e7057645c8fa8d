// dea/lm/causal_attention.hpp: causal multi-head self-attention with grouped KV heads (MHA / GQA / MQA), per-head
// qk RMSNorm and rotate-half RoPE, forward, hand-derived backward and a KV cache for incremental decoding.
//
// The attention of the reference's decoder (docs/lm.md; complexity/core/attention/gqa.py). No biases.
//
//   x [N, D], N = B*T rows (b*T + t); H query heads, H_kv KV heads, d_h = D / H, group size G = H / H_kv
//   K = x W_k^T [N, H_kv d_h],  Q = x W_q^T [N, H d_h],  V = x W_v^T [N, H_kv d_h]
//   per token and head: Qn = RMSNorm(Q_h) .* gamma_q,  Kn = RMSNorm(K_g) .* gamma_k   (eps, gains [d_h] shared by heads)
//   Qr = RoPE(Qn), Kr = RoPE(Kn)                         positions 0..T-1 (decoding: + the cache length)
//   query head h reads KV head g = floor(h / G)
//   S_h = Qr_h Kr_g^T / sqrt(d_h), causal (query i sees keys j <= i);  P_h = softmax(S_h);  O_h = P_h V_g
//   y = O W_o^T                                            O = heads merged in column order [N, D]
//
// Parallel work: forward normalises the keys per (b, g) and runs the core per (b, h); backward runs the core per
// (b, h) into per-pair partials of dK and dV, which each (b, g) then sums over its G query heads in head order, so
// the gradient of a shared KV head is reduced in a fixed order. The gain gradients are per-pair partials summed in
// pair order. Results are bitwise identical for any thread count.
#pragma once

#include "../core/bf16.hpp"
#include "../core/param.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "../ops/attention_core.hpp"
#include "../ops/gemm.hpp"
#include "../ops/linear.hpp"
#include "../ops/rms_norm.hpp"
#include "../ops/rope.hpp"
#include "../ops/softmax.hpp"
#include "bf16_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace dea {
namespace lm {

/// Construction options of CausalSelfAttention.
struct CausalAttentionOptions {
  Index d_model = 0;          ///< D
  Index n_heads = 0;          ///< H, D % H == 0, D / H even
  Index n_kv_heads = 0;       ///< H_kv, H % H_kv == 0 (<= 0: H)
  bool use_qk_norm = true;
  double norm_eps = 1e-6;     ///< qk-norm epsilon
  double rope_theta = 10000.0;
};

/// Causal MHA / GQA / MQA. Parameters (state_dict names, relative to `self_attn.`): k_proj.weight [H_kv d_h, D],
/// q_proj.weight [D, D], v_proj.weight [H_kv d_h, D], o_proj.weight [D, D], q_norm.weight and k_norm.weight [d_h]
/// (with use_qk_norm). The constructor leaves the weights zero and the gains 1; the owner draws the init.
/// `Heads` and `DHead` may fix n_heads and the head width d_h at compile time (or be Eigen::Dynamic, as the decoder
/// that reads its sizes from a configuration uses them); a fixed DHead reaches the per-head kernels.
template <class S, int Heads = Eigen::Dynamic, int DHead = Eigen::Dynamic>
class CausalSelfAttention {
  static_assert(Heads == Eigen::Dynamic || Heads > 0, "CausalSelfAttention: Heads must be positive or Dynamic");
  static_assert(DHead == Eigen::Dynamic || (DHead > 0 && DHead % 2 == 0),
                "CausalSelfAttention: a fixed DHead must be positive and even (rotate-half RoPE)");

public:
  using Scalar = S;
  using Options = CausalAttentionOptions;
  static constexpr int HeadsAtCompileTime = Heads;
  static constexpr int DHeadAtCompileTime = DHead;

  /// What forward saves for backward.
  struct Cache {
    Index batch = 0, seq = 0;
    Mat<S> x;                 ///< [N, D] input
    Mat<S> q, k, v;           ///< [N, H d_h], [N, H_kv d_h], [N, H_kv d_h] projections
    Mat<S> qhat, khat;        ///< RMS-normalised Q, K per head (before gain and RoPE), shapes of q, k
    Vec<S> q_rstd, k_rstd;    ///< [B, H, T], [B, H_kv, T] 1 / rms of each (row, head)
    Mat<S> qr, kr;            ///< after qk-norm and RoPE, shapes of q, k
    AlignedVec<S> att;        ///< [B, H, T, T] attention probabilities (zero above the diagonal)
    Mat<S> o;                 ///< [N, D] merged head outputs (before o_proj)
  };

  /// Keys and values of the positions decoded so far (forward_cached; no backward). Per batch row, K after qk-norm
  /// and RoPE and V, each [capacity, H_kv d_h] of which the first `length` rows are valid: float (k, v), or bf16
  /// (k16, v16, row-major) when the sequence started with bf16 weights or under ScopedPrecision(Precision::bf16).
  struct KVCache {
    Index batch = 0;
    Index length = 0;
    Index width = 0;     ///< H_kv d_h
    bool bf16 = false;
    std::vector<Mat<S>> k, v;
    std::vector<std::vector<dea::bf16>> k16, v16;
    void clear() {
      batch = length = width = 0;
      bf16 = false;
      k.clear();
      v.clear();
      k16.clear();
      v16.clear();
    }
    /// Bytes of the valid keys and values (length positions of every batch row).
    std::size_t bytes() const {
      return 2 * static_cast<std::size_t>(batch * length * width) * (bf16 ? sizeof(dea::bf16) : sizeof(S));
    }
  };

  explicit CausalSelfAttention(const Options& opt) : opt_(opt) {
    check(opt.d_model > 0, "CausalSelfAttention: d_model must be positive, got ", opt.d_model);
    check(opt.n_heads > 0, "CausalSelfAttention: n_heads must be positive, got ", opt.n_heads);
    check(Heads == Eigen::Dynamic || opt.n_heads == Heads, "CausalSelfAttention: n_heads: expected ", Heads,
          " (the Heads template argument), got ", opt.n_heads);
    check(opt.d_model % opt.n_heads == 0, "CausalSelfAttention: d_model (", opt.d_model,
          ") must be divisible by n_heads (", opt.n_heads, ")");
    if (opt_.n_kv_heads <= 0) opt_.n_kv_heads = opt.n_heads;
    check(opt.n_heads % opt_.n_kv_heads == 0, "CausalSelfAttention: n_heads (", opt.n_heads,
          ") must be divisible by n_kv_heads (", opt_.n_kv_heads, ")");
    dh_ = opt.d_model / opt.n_heads;
    check(DHead == Eigen::Dynamic || dh_ == DHead, "CausalSelfAttention: d_model / n_heads: expected ", DHead,
          " (the DHead template argument), got ", opt.d_model, " / ", opt.n_heads, " = ", dh_);
    check(dh_ % 2 == 0, "CausalSelfAttention: head dim d_model / n_heads must be even (rotate-half RoPE), got ", dh_);
    check(opt.norm_eps > 0, "CausalSelfAttention: norm_eps must be positive, got ", opt.norm_eps);
    check(opt.rope_theta > 0, "CausalSelfAttention: rope_theta must be positive, got ", opt.rope_theta);
    const Index D = opt.d_model, Dkv = opt_.n_kv_heads * dh_;
    k_proj_ = Param<S>("k_proj.weight", "main", {Dkv, D});
    q_proj_ = Param<S>("q_proj.weight", "main", {D, D});
    v_proj_ = Param<S>("v_proj.weight", "main", {Dkv, D});
    o_proj_ = Param<S>("o_proj.weight", "main", {D, D});
    if (opt.use_qk_norm) {
      q_norm_ = Param<S>("q_norm.weight", "main", {dh_});
      k_norm_ = Param<S>("k_norm.weight", "main", {dh_});
      q_norm_.value.setOnes();
      k_norm_.value.setOnes();
    }
    rope_ = ops::RopeTable<S>(dh_, opt.rope_theta);
  }

  const Options& options() const { return opt_; }
  Index d_model() const { return opt_.d_model; }
  Index n_heads() const { return opt_.n_heads; }
  Index n_kv_heads() const { return opt_.n_kv_heads; }
  Index head_dim() const { return dh_; }

  /// Stores k_proj, q_proj, v_proj and o_proj as bf16 (lm/bf16_weights.hpp) and frees their float values and
  /// gradients: from then on the module is for inference (forward_cached, whose KV cache is then bf16 too), and
  /// forward / backward throw. float models only. Returns the bytes of the bf16 weights.
  std::size_t store_bf16_weights() {
    if constexpr (std::is_same<S, float>::value) {
      if (!w16_) {
        const Index D = opt_.d_model, Dkv = opt_.n_kv_heads * dh_;
        auto w = std::make_shared<W16>();
        w->k = pack_linear_bf16(k_proj_.value.data(), Dkv, D);
        w->q = pack_linear_bf16(q_proj_.value.data(), D, D);
        w->v = pack_linear_bf16(v_proj_.value.data(), Dkv, D);
        w->o = pack_linear_bf16(o_proj_.value.data(), D, D);
        w16_ = std::move(w);
        for (Param<S>* p : {&k_proj_, &q_proj_, &v_proj_, &o_proj_}) release_float(*p);
      }
      return w16_->k.bytes() + w16_->q.bytes() + w16_->v.bytes() + w16_->o.bytes();
    } else {
      check(false, "CausalSelfAttention::store_bf16_weights: float models only");
      return 0;
    }
  }
  /// True after store_bf16_weights.
  bool has_bf16_weights() const { return w16_ != nullptr; }
  /// Bytes of the weights kept: float values and bf16 copies.
  std::size_t weight_bytes() const {
    std::size_t n = value_bytes(k_proj_) + value_bytes(q_proj_) + value_bytes(v_proj_) + value_bytes(o_proj_) +
                    value_bytes(q_norm_) + value_bytes(k_norm_);
    if (w16_) n += w16_->k.bytes() + w16_->q.bytes() + w16_->v.bytes() + w16_->o.bytes();
    return n;
  }

  /// k_proj, q_proj, v_proj, o_proj, then q_norm, k_norm (with use_qk_norm).
  ParamList<S> parameters() {
    ParamList<S> l = {&k_proj_, &q_proj_, &v_proj_, &o_proj_};
    if (opt_.use_qk_norm) {
      l.push_back(&q_norm_);
      l.push_back(&k_norm_);
    }
    return l;
  }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// x [batch*T, D] -> y [batch*T, D]; fills `cache` for backward.
  Mat<S> forward(const Mat<S>& x, Index batch, Cache& cache);

  /// Backward of forward: ADDS into every parameter gradient, returns dx [N, D].
  Mat<S> backward(const Mat<S>& dy, const Cache& cache);

  /// Incremental decoding: x holds the Sn new positions of every batch row ([batch*Sn, D], rows b*Sn + i) at absolute
  /// positions kv.length .. kv.length + Sn - 1. Appends their K and V to `kv` and returns their outputs
  /// [batch*Sn, D]; query i sees the cached keys and the new keys j <= i. O(length) work per new position.
  Mat<S> forward_cached(const Mat<S>& x, Index batch, KVCache& kv);

private:
  void validate_x_(const Mat<S>& x, Index batch, const char* who) const {
    check(batch > 0, "CausalSelfAttention::", who, ": batch must be positive, got ", batch);
    check(x.cols() == opt_.d_model, "CausalSelfAttention::", who, ": x expected ", opt_.d_model,
          " columns (d_model), got ", x.cols());
    check(x.rows() > 0 && x.rows() % batch == 0, "CausalSelfAttention::", who,
          ": x rows expected a positive multiple of batch = ", batch, ", got ", x.rows());
    check_finite(x, "CausalSelfAttention: x");
  }

  /// dst = RoPE(RMSNorm(src) .* gain) from absolute position pos0 (rows of one head); hat / rstd receive the
  /// normalised rows and 1 / rms (when use_qk_norm).
  template <class DSrc, class DDst, class DHat>
  void norm_rope_(const Eigen::MatrixBase<DSrc>& src, const Param<S>& gain, Index pos0, const Eigen::MatrixBase<DDst>& dst_,
                  const Eigen::MatrixBase<DHat>& hat, S* rstd) const {
    auto& dst = const_cast<Eigen::MatrixBase<DDst>&>(dst_);
    if (opt_.use_qk_norm)
      ops::rms_norm_forward<S>(src, gain.value.data(), static_cast<S>(opt_.norm_eps), dst, hat, rstd);  // Xn
    else
      dst = src;
    ops::rope_forward(rope_, pos0, dst);                                                            // Xr = RoPE(Xn)
  }

  using HeadMatrix = ops::HeadMatrix<S, DHead>;
  /// Query positions [row0, row0 + rows) of the head whose columns start at col0 (d_h wide; DHead when fixed).
  ops::HeadMap<S, DHead> head(Mat<S>& m, Index row0, Index col0, Index rows) const {
    return ops::head_block<DHead>(m, row0, col0, rows, dh_);
  }
  ops::ConstHeadMap<S, DHead> head(const Mat<S>& m, Index row0, Index col0, Index rows) const {
    return ops::head_block<DHead>(m, row0, col0, rows, dh_);
  }
  static constexpr ops::AttentionMask kCausal{nullptr, /*causal*/ true};

  Options opt_;
  Index dh_ = 0;
  Param<S> k_proj_, q_proj_, v_proj_, o_proj_, q_norm_, k_norm_;
  ops::RopeTable<S> rope_;
  /// The projections as bf16 (store_bf16_weights), shared by copies of the module.
  struct W16 {
    ops::packed::Bf16Matrix k, q, v, o;
  };
  std::shared_ptr<const W16> w16_;

  /// y = x W^T with the float weight, or its bf16 copy after store_bf16_weights.
  void project_(const Mat<S>& x, const Param<S>& W, const ops::packed::Bf16Matrix* W16p, Mat<S>& y) const {
    if constexpr (std::is_same<S, float>::value) {
      if (W16p) return linear_bf16(x, *W16p, y);
    }
    ops::linear_forward<S>(x, W.mat(), nullptr, y);
  }
};

template <class S, int Heads, int DHead>
Mat<S> CausalSelfAttention<S, Heads, DHead>::forward(const Mat<S>& x, Index batch, Cache& c) {
  check(!w16_, "CausalSelfAttention::forward: the weights are stored as bf16 for inference (forward_cached only)");
  validate_x_(x, batch, "forward");
  const Index B = batch, T = x.rows() / batch, H = opt_.n_heads, Hkv = opt_.n_kv_heads, G = H / Hkv, dh = dh_;
  const auto scale = ops::ScoreScale<S>::inv_sqrt(dh);
  c.batch = B;
  c.seq = T;
  c.x = x;
  ops::linear_forward<S>(x, k_proj_.mat(), nullptr, c.k);  // K = x W_k^T
  ops::linear_forward<S>(x, q_proj_.mat(), nullptr, c.q);  // Q = x W_q^T
  ops::linear_forward<S>(x, v_proj_.mat(), nullptr, c.v);  // V = x W_v^T
  c.qhat.resize(c.q.rows(), c.q.cols());
  c.khat.resize(c.k.rows(), c.k.cols());
  c.qr.resize(c.q.rows(), c.q.cols());
  c.kr.resize(c.k.rows(), c.k.cols());
  c.q_rstd.setZero(B * H * T);
  c.k_rstd.setZero(B * Hkv * T);
  c.o.resize(B * T, opt_.d_model);
  c.att.assign(static_cast<std::size_t>(B * H * T * T), S(0));
  rope_.reserve(T);
  const double flops = static_cast<double>(B * H) * static_cast<double>(T * T * dh) * 4.0;
  // keys: one (b, g) pair per work item
  parallel_for(B * Hkv, [&](Index bg) {
    const Index b = bg / Hkv, g = bg % Hkv, r0 = b * T, c0 = g * dh;
    norm_rope_(head(c.k, r0, c0, T), k_norm_, 0, head(c.kr, r0, c0, T), head(c.khat, r0, c0, T),
               c.k_rstd.data() + bg * T);                                    // Kr = RoPE(RMSNorm(K_g) .* gamma_k)
  }, flops > kParallelMinFlops);
  // queries and the attention core: one (b, h) pair per work item
  parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, g = h / G, r0 = b * T, c0 = h * dh, k0 = g * dh;
    norm_rope_(head(c.q, r0, c0, T), q_norm_, 0, head(c.qr, r0, c0, T), head(c.qhat, r0, c0, T),
               c.q_rstd.data() + bh * T);                                    // Qr = RoPE(RMSNorm(Q_h) .* gamma_q)
    // P = softmax(Qr Kr^T / sqrt(d_h)) over keys j <= i, O_h = P V_g
    ops::attention_core_forward<S, DHead>(head(c.qr, r0, c0, T), head(c.kr, r0, k0, T), head(c.v, r0, k0, T),
                                          scale, kCausal, ops::HeadProducts::eigen, nullptr,
                                          c.att.data() + bh * T * T, head(c.o, r0, c0, T));
  }, flops > kParallelMinFlops);
  Mat<S> y;
  ops::linear_forward<S>(c.o, o_proj_.mat(), nullptr, y);                   // y = O W_o^T
  return y;
}

template <class S, int Heads, int DHead>
Mat<S> CausalSelfAttention<S, Heads, DHead>::backward(const Mat<S>& dy, const Cache& c) {
  check(c.batch > 0 && c.x.rows() > 0, "CausalSelfAttention::backward: the cache is empty (run forward first)");
  check_matrix(dy, c.x.rows(), opt_.d_model, "CausalSelfAttention::backward dy");
  const Index B = c.batch, T = c.seq, H = opt_.n_heads, Hkv = opt_.n_kv_heads, G = H / Hkv, dh = dh_;
  const auto scale = ops::ScoreScale<S>::inv_sqrt(dh);
  const double flops = static_cast<double>(B * H) * static_cast<double>(T * T * dh) * 8.0;

  Mat<S> dO;
  ops::linear_backward<S>(dy, c.o, o_proj_.mat(), o_proj_.grad_mat(), nullptr, &dO);  // y = O W_o^T

  // core per (b, h): dQ into GQ; dKr and dV into per-pair partials [B*H*T, d_h]
  Mat<S> GQ(c.q.rows(), c.q.cols()), GK(c.k.rows(), c.k.cols()), GV(c.v.rows(), c.v.cols());
  Mat<S> dkr_part(B * H * T, dh), dv_part(B * H * T, dh);
  Mat<S> dgq = Mat<S>::Zero(B * H, dh), dgk = Mat<S>::Zero(B * Hkv, dh);
  const S* gq = opt_.use_qk_norm ? q_norm_.value.data() : nullptr;
  const S* gk = opt_.use_qk_norm ? k_norm_.value.data() : nullptr;
  parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, g = h / G, r0 = b * T, c0 = h * dh, k0 = g * dh;
    HeadMatrix dq(T, dh);
    // O_h = P V_g, P = softmax(Qr Kr^T / sqrt(d_h))  ->  dQr; dKr and dV_g of this query head
    ops::attention_core_backward<S, DHead>(c.att.data() + bh * T * T, nullptr, head(dO, r0, c0, T),
                                           head(c.qr, r0, c0, T), head(c.kr, r0, k0, T), head(c.v, r0, k0, T), scale,
                                           kCausal, ops::HeadProducts::eigen, dq, head(dkr_part, bh * T, 0, T),
                                           head(dv_part, bh * T, 0, T));
    ops::rope_backward(rope_, 0, dq);                                        // Qr = RoPE(Qn)
    if (opt_.use_qk_norm)                                                    // Qn = RMSNorm(Q_h) .* gamma_q
      ops::rms_norm_backward<S>(dq, head(c.qhat, r0, c0, T), c.q_rstd.data() + bh * T, gq, dgq.data() + bh * dh,
                                head(GQ, r0, c0, T));
    else
      head(GQ, r0, c0, T) = dq;
  }, flops > kParallelMinFlops);
  // per (b, g): sum the partials of the group's query heads in head order, then undo RoPE and the k-norm
  parallel_for(B * Hkv, [&](Index bg) {
    const Index b = bg / Hkv, g = bg % Hkv, r0 = b * T, k0 = g * dh;
    HeadMatrix dk = head(dkr_part, (b * H + g * G) * T, 0, T);
    auto dv = head(GV, r0, k0, T);
    dv = head(dv_part, (b * H + g * G) * T, 0, T);
    for (Index j = 1; j < G; ++j) {
      dk += head(dkr_part, (b * H + g * G + j) * T, 0, T);
      dv += head(dv_part, (b * H + g * G + j) * T, 0, T);
    }
    ops::rope_backward(rope_, 0, dk);                                        // Kr = RoPE(Kn)
    if (opt_.use_qk_norm)                                                    // Kn = RMSNorm(K_g) .* gamma_k
      ops::rms_norm_backward<S>(dk, head(c.khat, r0, k0, T), c.k_rstd.data() + bg * T, gk, dgk.data() + bg * dh,
                                head(GK, r0, k0, T));
    else
      head(GK, r0, k0, T) = dk;
  }, flops > kParallelMinFlops);
  if (opt_.use_qk_norm) {  // the gains are shared by all pairs: partials summed in pair order
    for (Index bh = 0; bh < B * H; ++bh) q_norm_.grad += dgq.row(bh).transpose();
    for (Index bg = 0; bg < B * Hkv; ++bg) k_norm_.grad += dgk.row(bg).transpose();
  }
  Mat<S> dx;
  ops::linear_backward<S>(GK, c.x, k_proj_.mat(), k_proj_.grad_mat(), nullptr, &dx);        // K = x W_k^T
  ops::linear_backward<S>(GQ, c.x, q_proj_.mat(), q_proj_.grad_mat(), nullptr, &dx, true);  // Q = x W_q^T
  ops::linear_backward<S>(GV, c.x, v_proj_.mat(), v_proj_.grad_mat(), nullptr, &dx, true);  // V = x W_v^T
  return dx;
}

template <class S, int Heads, int DHead>
Mat<S> CausalSelfAttention<S, Heads, DHead>::forward_cached(const Mat<S>& x, Index batch, KVCache& kv) {
  validate_x_(x, batch, "forward_cached");
  const Index B = batch, Sn = x.rows() / batch, H = opt_.n_heads, Hkv = opt_.n_kv_heads, G = H / Hkv, dh = dh_;
  const Index Dkv = Hkv * dh;
  // bf16 weights or bf16 products: the cache holds bf16 keys and values, and the head products read them
  const bool b16 = std::is_same<S, float>::value &&
                   (w16_ != nullptr || thread_settings().product_precision == Precision::bf16);
  if (kv.length == 0) {
    kv.batch = B;
    kv.width = Dkv;
    kv.bf16 = b16;
    kv.k.assign(static_cast<std::size_t>(B), Mat<S>());
    kv.v.assign(static_cast<std::size_t>(B), Mat<S>());
    kv.k16.assign(static_cast<std::size_t>(b16 ? B : 0), std::vector<dea::bf16>());
    kv.v16.assign(static_cast<std::size_t>(b16 ? B : 0), std::vector<dea::bf16>());
  }
  check(kv.batch == B, "CausalSelfAttention::forward_cached: batch expected ", kv.batch, " (the KV cache's), got ", B);
  check(kv.bf16 == b16, "CausalSelfAttention::forward_cached: the KV cache holds ", kv.bf16 ? "bf16" : "float",
        " values, this step's products are ", b16 ? "bf16" : "float", " (the precision changed within a sequence)");
  const Index P0 = kv.length, L = P0 + Sn;
  Mat<S> k, q, v;
  const W16* w = w16_.get();
  project_(x, k_proj_, w ? &w->k : nullptr, k);  // K = x W_k^T
  project_(x, q_proj_, w ? &w->q : nullptr, q);  // Q = x W_q^T
  project_(x, v_proj_, w ? &w->v : nullptr, v);  // V = x W_v^T
  rope_.reserve(L);
  Mat<S> kr;  // bf16 cache: the new keys after qk-norm and RoPE, before their rounding into the cache
  if (b16) kr.resize(B * Sn, Dkv);
  for (Index b = 0; b < B; ++b) {  // grow the per-row buffers geometrically: appending stays O(1) amortised
    const std::size_t bi = static_cast<std::size_t>(b);
    if (b16) {
      std::vector<dea::bf16>& K16 = kv.k16[bi];
      std::vector<dea::bf16>& V16 = kv.v16[bi];
      if (static_cast<Index>(K16.size()) < L * Dkv) {
        const Index cap = std::max<Index>(L, 2 * static_cast<Index>(K16.size()) / Dkv);
        K16.resize(static_cast<std::size_t>(cap * Dkv));
        V16.resize(static_cast<std::size_t>(cap * Dkv));
      }
      const S* src = v.data() + b * Sn * Dkv;  // v's rows are Dkv wide
      for (Index i = 0; i < Sn * Dkv; ++i) V16[static_cast<std::size_t>(P0 * Dkv + i)] = to_bf16(static_cast<float>(src[i]));
      continue;
    }
    Mat<S>& Kc = kv.k[bi];
    Mat<S>& Vc = kv.v[bi];
    if (Kc.rows() < L) {
      const Index cap = std::max<Index>(L, 2 * Kc.rows());
      Kc.conservativeResize(cap, Dkv);
      Vc.conservativeResize(cap, Dkv);
    }
    Vc.middleRows(P0, Sn) = v.middleRows(b * Sn, Sn);
  }
  const S scale = S(1) / std::sqrt(static_cast<S>(dh));
  const S ninf = -std::numeric_limits<S>::infinity();
  // new keys into the cache: each (b, g) owns its column block of row b's cache (bf16: of kr, then of the cache)
  parallel_for(B * Hkv, [&](Index bg) {
    const Index b = bg / Hkv, g = bg % Hkv;
    HeadMatrix hat(Sn, dh);
    Vec<S> rs(Sn);
    if (!b16) {
      norm_rope_(head(k, b * Sn, g * dh, Sn), k_norm_, P0, head(kv.k[static_cast<std::size_t>(b)], P0, g * dh, Sn),
                 hat, rs.data());
      return;
    }
    norm_rope_(head(k, b * Sn, g * dh, Sn), k_norm_, P0, head(kr, b * Sn, g * dh, Sn), hat, rs.data());
    std::vector<dea::bf16>& K16 = kv.k16[static_cast<std::size_t>(b)];
    for (Index i = 0; i < Sn; ++i)
      for (Index c = 0; c < dh; ++c)
        K16[static_cast<std::size_t>((P0 + i) * Dkv + g * dh + c)] = to_bf16(static_cast<float>(kr(b * Sn + i, g * dh + c)));
  });
  Mat<S> O(B * Sn, opt_.d_model);
  parallel_for(B * H, [&](Index bh) {
    const Index b = bh / H, h = bh % H, g = h / G;
    HeadMatrix qr(Sn, dh), hat(Sn, dh);
    Vec<S> rs(Sn);
    norm_rope_(head(q, b * Sn, h * dh, Sn), q_norm_, P0, qr, hat, rs.data());
    Mat<S> sc(Sn, L);
    if (b16) {  // the same steps with bf16 products on the bf16 cache (the query and P rounded, float accumulation)
      if constexpr (std::is_same<S, float>::value) {
        using ops::packed::View;
        const dea::bf16* K16 = kv.k16[static_cast<std::size_t>(b)].data() + g * dh;
        const dea::bf16* V16 = kv.v16[static_cast<std::size_t>(b)].data() + g * dh;
        ops::packed::gemm_bf16(Sn, L, dh, View<float>{qr.data(), Index(qr.outerStride()), 1},
                               View<dea::bf16>{K16, Dkv, 1}.t(), sc.data(), L, false);  // S = Qr Kr^T
        sc *= scale;                                                                     //     / sqrt(d_h)
        for (Index i = 0; i < Sn; ++i)
          for (Index j = P0 + i + 1; j < L; ++j) sc(i, j) = ninf;                       // causal: keys j <= P0 + i
        ops::masked_softmax_rows<S>(sc, nullptr, sc);                                    // P = softmax(S)
        ops::packed::gemm_bf16(Sn, dh, L, View<float>{sc.data(), L, 1}, View<dea::bf16>{V16, Dkv, 1},
                               O.data() + b * Sn * O.cols() + h * dh, O.cols(), false);  // O_h = P V_g
      }
      return;
    }
    const Mat<S>& Kc = kv.k[static_cast<std::size_t>(b)];
    const Mat<S>& Vc = kv.v[static_cast<std::size_t>(b)];
    sc.noalias() = (qr * head(Kc, 0, g * dh, L).transpose()) * scale;       // S = Qr Kr^T / sqrt(d_h)
    for (Index i = 0; i < Sn; ++i)
      for (Index j = P0 + i + 1; j < L; ++j) sc(i, j) = ninf;               // causal: keys j <= P0 + i
    ops::masked_softmax_rows<S>(sc, nullptr, sc);                            // P = softmax(S)
    head(O, b * Sn, h * dh, Sn).noalias() = sc * head(Vc, 0, g * dh, L);  // O_h = P V_g
  });
  kv.length = L;
  Mat<S> y;
  project_(O, o_proj_, w ? &w->o : nullptr, y);  // y = O W_o^T
  return y;
}

}  // namespace lm
}  // namespace dea
