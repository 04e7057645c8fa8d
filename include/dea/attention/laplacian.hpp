// dea/attention/laplacian.hpp: First-Spike Laplacian attention, forward and backward.
//
// The logits q.k/sqrt(dk) of dot-product attention are replaced by a Laplace (L1 / exponential) kernel in
// "latency space": u = sigmoid(q), w = sigmoid(k) element-wise, D_ij = sum_c |u_ic - w_jc|, and
// logits = -D / s_h with a learned per-head bandwidth s_h = softplus(theta_h) + 1e-6.
//
// Shapes (self-attention; N = B*T rows, row n = b*T + t; D = d_model = H*Dh):
//   x [N, D] --q, k, v--> Q, K, V [N, D] (one product: [Q K V] = x [W_q; W_k; W_v]^T + b, [N, 3D]);
//   head h owns feature columns [h*Dh, (h+1)*Dh) of each of Q, K, V
//   U = sigmoid(Q), W = sigmoid(K)  [N, D]  (element-wise; stored in place of Q and K)
//   per (b, h):  Dist_ij = sum_c |U_ic - W_jc|  [T, T]  (ops::l1_distance: no [T, T, Dh] tensor)
//                L = -Dist / s_h;  masked keys (key_mask = 0, or j > i when causal) get probability 0
//                P = softmax_rows(L);  Pd = P .* M (attention dropout, training only);  O_bh = Pd V_bh  [T, Dh]
//   y = O W_o^T + b_o  [N, D]
//
// Parameters (the seed's state_dict names): q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o.weight,
// o.bias (Linear D -> D, PyTorch's default initialisation: weight and bias U(-1/sqrt(D), 1/sqrt(D)), drawn
// in that order), theta [H] = log(expm1(sigma0)) in every head (a constant fill: it draws no random numbers,
// so the shared weights equal those of a dot-product block built from the same generator state).
//
// Backward (G = dLoss/dP, Lambda = dLoss/dL for the logits L):
//   Lambda_ij = P_ij (G_ij - sum_m P_im G_im)                      (softmax; rows of Lambda sum to 0)
//   dL/dDist_ij = -Lambda_ij / s
//   dL/dq_ic = -(1/s) u_ic (1 - u_ic) sum_j Lambda_ij sgn(u_ic - w_jc)
//   dL/dk_jc = +(1/s) w_jc (1 - w_jc) sum_i Lambda_ij sgn(u_ic - w_jc)     with sgn(0) = 0
//   dL/dtheta_h = (sigmoid(theta_h) / s_h^2) sum_{b,i,j} Lambda_bij Dist_bij
// The theta gradient is reduced from per-(b, h) partials in the fixed order b = 0, 1, ..., so results are
// bitwise identical for any thread count.
#pragma once

#include "../core/error.hpp"
#include "../core/init.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/activations.hpp"
#include "../ops/dropout.hpp"
#include "../ops/l1_distance.hpp"
#include "../ops/softmax.hpp"
#include "inputs.hpp"
#include "dot_product.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace dea {

/// Options of LaplacianAttention.
template <class S>
struct LaplacianAttentionOptions {
  /// Biases on q, k, v and o (the seed's nn.Linear default: true).
  bool bias = true;
  /// Attention-probability dropout p in [0, 1) (training only, inverted scaling; the seed uses none).
  S dropout = 0;
  /// Initial bandwidth sigma0 > 0: theta starts at log(expm1(sigma0)), so softplus(theta) = sigma0.
  S sigma0 = S(0.7);
};

/// First-Spike Laplacian self-attention: a row-normalised Laplace kernel exp(-|sigmoid(q_i) - sigmoid(k_j)|_1 / s_h)
/// with a learned per-head bandwidth. See the file comment for shapes, parameters and the backward; kSupport for
/// the attention inputs it accepts (an oracle, targets or a frozen alpha-hat is an error).
template <class S, int Heads = Eigen::Dynamic, int DHead = Eigen::Dynamic>
class LaplacianAttention {
  static_assert(std::is_floating_point<S>::value, "LaplacianAttention: Scalar must be a floating-point type");
  static_assert(Heads == Eigen::Dynamic || Heads > 0, "LaplacianAttention: Heads must be positive or Dynamic");
  static_assert(DHead == Eigen::Dynamic || DHead > 1,
                "LaplacianAttention: a fixed DHead must be > 1 (use Eigen::Dynamic for d_head = 1)");

public:
  using Scalar = S;
  using Options = LaplacianAttentionOptions<S>;
  static constexpr int HeadsAtCompileTime = Heads;
  static constexpr int DHeadAtCompileTime = DHead;
  /// The epsilon of s = softplus(theta) + eps.
  static constexpr double kBandwidthEps = 1e-6;

  /// What backward needs, filled by forward, plus reusable work buffers. Reusable across calls; backward
  /// changes only the work buffers, so it may run twice on one forward.
  struct Cache {
    Index batch = 0, seq = 0, d_model = 0;
    Mat<S> x;          ///< [N, D] the input
    Mat<S> qkv;        ///< [N, 3D] U = sigmoid(Q) | W = sigmoid(K) | V (column blocks of D)
    Mat<S> ctx;        ///< [N, D] heads' outputs concatenated (input of o)
    Vec<S> dist;       ///< [B, H, T, T] L1 distances D_ij (the logits are -dist / s)
    Vec<S> p;          ///< [B, H, T, T] attention probabilities (before dropout)
    Vec<S> drop;       ///< [B, H, T, T] dropout multipliers; empty when dropout was inactive
    Vec<S> s;          ///< [H] bandwidths softplus(theta) + eps used by this forward
    Vec<S> ds_dtheta;  ///< [H] sigmoid(theta) = ds/dtheta
    Mat<S> w_cat;      ///< [3D, D] q.weight; k.weight; v.weight as used by this forward
    RowVec<S> b_cat;   ///< [3D] their biases
    Mat<S> work_dctx, work_dqkv, work_dw;  ///< backward scratch
    std::vector<S> work_theta;             ///< backward scratch: sum_ij Lambda_ij D_ij per (b, h)

    /// U = sigmoid(Q), W = sigmoid(K) ("latencies") and V, each [N, D].
    auto u() const { return qkv.leftCols(d_model); }
    auto w() const { return qkv.middleCols(d_model, d_model); }
    auto v() const { return qkv.rightCols(d_model); }
  };

  LaplacianAttention(Index d_model, Index n_heads, Rng& rng, Options opt = {})
      : d_model_(d_model),
        n_heads_(n_heads),
        d_head_(detail::mha::check_head_sizes<Heads, DHead>("LaplacianAttention", d_model, n_heads)),
        opt_(opt) {
    ops::check_dropout_probability(opt.dropout, "LaplacianAttention: Options::dropout");
    const S theta0 = ops::softplus_inverse(opt.sigma0, "LaplacianAttention: Options::sigma0");
    q_ = Proj("q", d_model, d_model, opt.bias);
    k_ = Proj("k", d_model, d_model, opt.bias);
    v_ = Proj("v", d_model, d_model, opt.bias);
    o_ = Proj("o", d_model, d_model, opt.bias);
    // PyTorch's nn.Linear default: kaiming_uniform(a = sqrt(5)) for the weight = U(+-1/sqrt(fan_in)), the
    // bias U(+-1/sqrt(fan_in)); weight then bias, module by module.
    const double bound = 1.0 / std::sqrt(static_cast<double>(d_model));
    for (Proj* p : {&q_, &k_, &v_, &o_}) {
      init::uniform(p->weight.mat(), rng, -bound, bound);
      if (p->has_bias) init::uniform(p->bias.mat(), rng, -bound, bound);
    }
    theta_ = Param<S>("theta", "main", {n_heads});
    theta_.value.setConstant(theta0);
  }

  Index d_model() const { return d_model_; }
  Index n_heads() const { return n_heads_; }
  Index d_head() const { return d_head_; }
  const Options& options() const { return opt_; }

  /// q.weight, q.bias, k.weight, k.bias, v.weight, v.bias, o.weight, o.bias, theta (no biases when
  /// Options::bias is false).
  ParamList<S> parameters() {
    ParamList<S> list;
    for (Proj* p : {&q_, &k_, &v_, &o_}) p->append_to(list);
    list.push_back(&theta_);
    return list;
  }

  void zero_grad() {
    for (Proj* p : {&q_, &k_, &v_, &o_}) p->zero_grad();
    theta_.zero_grad();
  }

  /// Current bandwidth of head h: softplus(theta_h) + 1e-6.
  S bandwidth(Index h) const {
    check(h >= 0 && h < n_heads_, "LaplacianAttention::bandwidth: h: expected in [0, ", n_heads_, "), got ", h);
    return ops::softplus(theta_.value[h]) + static_cast<S>(kBandwidthEps);
  }

  /// What this class accepts of AttnInputs: a key mask, causal masking and (always kept) its maps; no oracle,
  /// targets or frozen alpha-hat (Dual-Expert inputs). Self-attention only.
  static constexpr AttnSupport kSupport{/*oracle*/ false, /*causal*/ true, /*frozen_alpha_hat*/ false,
                                        /*keep_maps: dist and P are always in the cache*/ true};

  /// x [B*T, D] (row b*T + t, B = in.batch(), T = in.q_len())  ->  y [B*T, D]. Reads the key mask, causal,
  /// training and rng of `in`. Fills `cache` for backward (it keeps a copy of x in cache.x; a caller may compute x
  /// straight into cache.x and pass that, which saves the copy).
  Mat<S> forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache) const {
    Mat<S> y;
    forward(x, in, cache, y);
    return y;
  }
  /// The same, into y [B*T, D].
  void forward(const Mat<S>& x, const AttnInputs<S>& in, Cache& cache, Mat<S>& y) const {
    const char* cls = "LaplacianAttention";
    const Index T = detail::mha::check_self_attention_input(cls, kSupport, x, in, d_model_, n_heads_, opt_.dropout);
    const Index batch = in.batch();
    detail::mha::check_all_finite(theta_.value, "LaplacianAttention: theta");
    const Index H = n_heads_, dh = d_head_, TT = T * T, D = d_model_;
    Cache& c = cache;
    c.batch = batch;
    c.seq = T;
    c.d_model = D;
    if (&x != &c.x) c.x = x;  // x may be cache.x itself (the caller wrote its input there): no copy
    detail::mha::qkv_forward(x, q_, k_, v_, c.w_cat, c.b_cat, c.qkv);  // [Q K V] = x [W_q; W_k; W_v]^T + b  [N, 3D]
    c.s.resize(H);
    c.ds_dtheta.resize(H);
    for (Index h = 0; h < H; ++h) {
      c.s[h] = ops::softplus(theta_.value[h]) + static_cast<S>(kBandwidthEps);  // s_h = softplus(theta_h) + eps
      c.ds_dtheta[h] = ops::sigmoid(theta_.value[h]);                          // ds/dtheta = sigmoid(theta)
    }
    const bool dropping = in.training() && opt_.dropout > S(0);
    if (dropping)
      ops::dropout_mask(c.drop, batch * H * TT, opt_.dropout, *in.rng());
    else
      c.drop.resize(0);
    c.dist.resize(batch * H * TT);
    c.p.resize(batch * H * TT);
    c.ctx.resize(x.rows(), D);
    const bool masked = in.has_key_mask();
    const bool causal = in.causal();
    parallel_for(batch * H, [&](Index bh) {
      const Index b = bh / H, h = bh % H;
      auto U = ops::head_block<DHead>(c.qkv, b * T, h * dh, T, dh);                  // [T, Dh]
      auto W = ops::head_block<DHead>(c.qkv, b * T, D + h * dh, T, dh);              // [T, Dh]
      ops::sigmoid_into(U, U);                                                          // U = sigmoid(Q)
      ops::sigmoid_into(W, W);                                                          // W = sigmoid(K)
      const auto V = ops::head_block<DHead>(static_cast<const Mat<S>&>(c.qkv), b * T, 2 * D + h * dh, T, dh);
      auto O = ops::head_block<DHead>(c.ctx, b * T, h * dh, T, dh);                  // [T, Dh]
      MatMap<S> Dm(c.dist.data() + bh * TT, T, T);                                      // [T, T]
      MatMap<S> P(c.p.data() + bh * TT, T, T);                                          // [T, T]
      ops::l1_distance<DHead>(U, W, Dm);                                 // Dist_ij = sum_c |U_ic - W_jc|
      P.array() = -Dm.array() / c.s[h];                                  // L = -Dist / s_h
      ops::masked_softmax_inplace(P, masked ? in.key_mask(b) : nullptr, causal);  // P = softmax over real keys
      ops::attend_values<DHead>(P.data(), T, T, T, dropping ? c.drop.data() + bh * TT : nullptr, V,
                                O);                                      // O = (P .* M) V
    }, double(batch * H) * double(TT) * double(5 * dh + 10) > kParallelMinFlops);
    o_.forward(c.ctx, y);  // y = O W_o^T + b_o
  }

  /// dy [B*T, D] -> dx [B*T, D]. ADDS into every parameter's grad (two calls accumulate); only the cache's
  /// work buffers change.
  Mat<S> backward(const Mat<S>& dy, Cache& cache) {
    const char* cls = "LaplacianAttention";
    detail::mha::check_backward_input(cls, dy, cache.batch, cache.seq, d_model_);
    const Cache& c = cache;
    const Index T = c.seq, H = n_heads_, dh = d_head_, TT = T * T, N = dy.rows(), D = d_model_;
    const bool dropping = c.drop.size() > 0;
    Mat<S>& dctx = cache.work_dctx;
    Mat<S>& dqkv = cache.work_dqkv;
    std::vector<S>& theta_part = cache.work_theta;  // sum_ij Lambda_ij Dist_ij per (b, h)
    o_.backward(dy, c.ctx, &dctx);  // y = O W_o^T + b_o  ->  dW_o += dy^T O, db_o += colsum(dy), dO = dy W_o
    dqkv.resize(N, 3 * D);
    theta_part.assign(static_cast<std::size_t>(c.batch * H), S(0));
    const Mat<S>& dctx_c = dctx;
    parallel_for(c.batch * H, [&](Index bh) {
      const Index b = bh / H, h = bh % H;
      const auto U = ops::head_block<DHead>(c.qkv, b * T, h * dh, T, dh);
      const auto W = ops::head_block<DHead>(c.qkv, b * T, D + h * dh, T, dh);
      const auto V = ops::head_block<DHead>(c.qkv, b * T, 2 * D + h * dh, T, dh);
      const auto dO = ops::head_block<DHead>(dctx_c, b * T, h * dh, T, dh);
      auto dQ = ops::head_block<DHead>(dqkv, b * T, h * dh, T, dh);
      auto dK = ops::head_block<DHead>(dqkv, b * T, D + h * dh, T, dh);
      auto dV = ops::head_block<DHead>(dqkv, b * T, 2 * D + h * dh, T, dh);
      const ConstMatMap<S> P(c.p.data() + bh * TT, T, T);
      const ConstMatMap<S> Dm(c.dist.data() + bh * TT, T, T);
      const S s = c.s[h];
      ops::PairScratch<S> g_buf(TT), vt(dh * T);
      MatMap<S> G(g_buf.data(), T, T);                  // G = dL/dP, then Lambda, then dL/dDist
      ops::transpose_into<S>(T, dh, V.data(), V.outerStride(), vt.data());  // V^T [Dh, T]
      // O = (P .* M) V  ->  dV = (P .* M)^T dO, G = (dO V^T) .* M
      ops::attend_values_backward<DHead, false>(P.data(), T, T, T, dropping ? c.drop.data() + bh * TT : nullptr,
                                                vt.data(), T, dO, dV, G.data());
      ops::softmax_rows_backward<S>(P, G, G);           // P = softmax(L)  ->  Lambda = P .* (G - rowsum(G .* P))
      theta_part[static_cast<std::size_t>(bh)] = (G.array() * Dm.array()).sum();  // L = -Dist/s -> dL/ds = sum Lambda Dist / s^2
      G.array() = -G.array() / s;                       // L = -Dist / s  ->  dDist = -Lambda / s
      dQ.setZero();
      dK.setZero();
      ops::l1_distance_backward<DHead>(U, W, G, dQ, dK);  // Dist = sum_c |U - W|  ->  dU, dW (sgn(0) = 0)
      dQ.array() *= U.array() * (S(1) - U.array());       // U = sigmoid(Q)  ->  dQ = dU .* U (1 - U)
      dK.array() *= W.array() * (S(1) - W.array());       // W = sigmoid(K)  ->  dK = dW .* W (1 - W)
    }, double(c.batch * H) * double(TT) * double(10 * dh + 10) > kParallelMinFlops);
    for (Index h = 0; h < H; ++h) {  // fixed-order reduction over the batch
      S acc = 0;
      for (Index b = 0; b < c.batch; ++b) acc += theta_part[static_cast<std::size_t>(b * H + h)];
      // s = softplus(theta) + eps  ->  dtheta = dL/ds * sigmoid(theta) = sigmoid(theta) / s^2 * sum Lambda Dist
      theta_.grad[h] += c.ds_dtheta[h] / (c.s[h] * c.s[h]) * acc;
    }
    Mat<S> dx;
    // [Q K V] = x W_cat^T + b_cat  ->  dW_q, dW_k, dW_v, db_q, db_k, db_v, dx = dQKV W_cat
    detail::mha::qkv_backward(dqkv, c.x, c.w_cat, q_, k_, v_, cache.work_dw, dx);
    return dx;
  }

private:
  using Proj = detail::mha::Projection<S>;
  Index d_model_, n_heads_, d_head_;
  Options opt_;
  Proj q_, k_, v_, o_;
  Param<S> theta_;
};

}  // namespace dea
