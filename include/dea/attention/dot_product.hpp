// dea/attention/dot_product.hpp: multi-head scaled dot-product attention, the baseline of every comparison.
//
// Vaswani et al., "Attention Is All You Need" (NeurIPS 2017), section 3.2, with a hand-derived backward.
//
// Shapes (self-attention; N = B*T rows, row n = b*T + t; D = d_model = H*Dh):
//   x [N, D] --W_q, W_k, W_v--> Q, K, V [N, D] (one product: [Q K V] = x [W_q; W_k; W_v]^T + b, [N, 3D]);
//   head h owns feature columns [h*Dh, (h+1)*Dh) of each of Q, K, V
//   per (b, h):  S = Q_bh K_bh^T / sqrt(Dh)  [T, T];  masked keys (key_mask = 0, or j > i when causal) get
//                probability exactly 0 (they take no part in the row's max and normaliser)
//                P = softmax_rows(S);  Pd = P .* M (attention dropout, training only);  O_bh = Pd V_bh  [T, Dh]
//   y = O W_o^T + b_o  [N, D]
// A query row whose keys are all masked has P = 0, so its O row is 0 (never NaN) and y = b_o there.
// Each (b, h) pair runs through the softmax-attention core (ops/attention_core.hpp) with its register-blocked head
// products; causal heads go over 64-query tiles.
//
// Parallel work: one (b, h) pair per task (parallel_for over B*H); each pair writes only its own slices of
// P, O, dQ, dK, dV. Projections and their weight gradients use ops::gemm's fixed row blocks. No parameter
// gradient is touched by more than one pair, so every result is bitwise identical for any thread count.
#pragma once

#include "../core/error.hpp"
#include "../core/init.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/attention_core.hpp"
#include "../ops/dropout.hpp"
#include "../ops/gemm.hpp"
#include "../ops/linear.hpp"
#include "../ops/softmax.hpp"
#include "inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace dea {
namespace detail {
namespace mha {

/// Checks d_model and n_heads against each other and against the compile-time sizes; returns d_head.
template <int Heads, int DHead>
Index check_head_sizes(const char* cls, Index d_model, Index n_heads) {
  check(d_model > 0, cls, ": d_model: expected > 0, got ", d_model);
  check(n_heads > 0, cls, ": n_heads: expected > 0, got ", n_heads);
  check(d_model % n_heads == 0, cls, ": d_model: expected a multiple of n_heads = ", n_heads, ", got ", d_model);
  check(Heads == Eigen::Dynamic || n_heads == Heads, cls, ": n_heads: expected ", Heads,
        " (the Heads template argument), got ", n_heads);
  const Index dh = d_model / n_heads;
  check(DHead == Eigen::Dynamic || dh == DHead, cls, ": d_model / n_heads: expected ", DHead,
        " (the DHead template argument), got ", d_model, " / ", n_heads, " = ", dh);
  return dh;
}

/// Throws dea::Error naming `what` and the first bad position if `m` holds NaN or +-inf (a vectorised test
/// first; the element-wise search only runs on failure).
template <class Derived>
void check_all_finite(const Eigen::MatrixBase<Derived>& m, const std::string& what) {
  using S = typename Derived::Scalar;
  // x * 0 is 0 for finite x and NaN for NaN or +-inf; the vectorised sum of those is 0 exactly when all are finite.
  const S probe = (m.array() * S(0)).sum();
  if (!(probe == S(0))) check_finite(m, what.c_str());
}

/// Validates one self-attention forward call of class `cls` (which supports `sup`, has `n_heads` heads and the
/// given dropout): the inputs are built (B = in.batch() sequences of T = in.q_len() tokens, Tk == Tq), every
/// optional input is one the class supports (AttnInputs::require), x is [B*T, d_model] and finite, and in.rng()
/// is set when dropout is active. Returns T.
template <class S>
Index check_self_attention_input(const char* cls, const AttnSupport& sup, const Mat<S>& x, const AttnInputs<S>& in,
                                 Index d_model, Index n_heads, S dropout) {
  check(in.batch() > 0, cls, "::forward: the attention inputs are empty (build them with AttnInputs(batch, seq_len))");
  const Index B = in.batch(), T = in.q_len();
  check(in.k_len() == T, cls, "::forward: self-attention needs as many keys as queries; the attention inputs have Tq = ",
        T, ", Tk = ", in.k_len());
  in.require(sup, n_heads, B, T, T, cls);
  check(x.cols() == d_model, cls, ": x: expected ", d_model, " columns (d_model), got ", x.cols(), " (x is [",
        x.rows(), ", ", x.cols(), "])");
  check(x.rows() == B * T, cls, ": x: expected B*T = ", B * T, " rows (B = ", B, ", T = ", T,
        " of the attention inputs), got ", x.rows());
  check_all_finite(x, std::string(cls) + ": x");
  if (in.training() && dropout > S(0))
    check(in.rng() != nullptr, cls, ": rng: expected a random generator for dropout ", dropout,
          " in training mode (AttnInputs::set_training), got nullptr");
  return T;
}

/// Validates a backward call against the cache its forward filled.
template <class S>
void check_backward_input(const char* cls, const Mat<S>& dy, Index batch, Index seq, Index d_model) {
  check(batch > 0, cls, ": backward: the cache is empty (run forward with it first)");
  check(dy.rows() == batch * seq && dy.cols() == d_model, cls, ": dy: expected shape [", batch * seq, ", ",
        d_model, "], got [", dy.rows(), ", ", dy.cols(), "]");
  check_all_finite(dy, std::string(cls) + ": dy");
}

/// True when Eigen runs products on one thread (inside a parallel region, or with one library thread).
inline bool single_threaded_products() { return in_parallel() || num_threads() == 1; }

/// True when a weight gradient dW [out, in] += dy^T x (dy [N, out], x [N, in]) may be one Eigen call instead
/// of ops::gemm_tn_add's blocks of rows of dW, with the same bits: Eigen runs single-threaded; the blocks are
/// equal and fill whole register panels (multiples of the kernel's nr), so every element takes the same
/// micro-kernel path; and Eigen chooses the same depth blocking (kc) and does not split the `in` side for the
/// whole and for one block, so every element is summed in the same order. One call packs x once instead of
/// once per block.
template <class S>
bool weight_grad_in_one_call(Index n_rows, Index out, Index in) {
  if (!single_threaded_products()) return false;
  constexpr Index nr = Eigen::internal::gebp_traits<S, S>::nr;
  const Index nb = ops::gemm_tn_row_blocks(out), base = out / nb;
  if (out % nb != 0 || base % nr != 0) return false;
  // dW is row-major, so Eigen computes dW^T = x^T dy: m = in, n = out (or one block), depth = N.
  Index k1 = n_rows, m1 = in, n1 = out, k2 = n_rows, m2 = in, n2 = base;
  Eigen::internal::computeProductBlockingSizes<S, S>(k1, m1, n1, Index(1));
  Eigen::internal::computeProductBlockingSizes<S, S>(k2, m2, n2, Index(1));
  return k1 == k2 && m1 == in && m2 == in;
}

/// dW += dy^T x: ops::gemm_tn_add, or one Eigen call when weight_grad_in_one_call allows it for operands the packed
/// product does not take (it packs x once anyway, and one Eigen call would not give its bits).
template <class S, class DY, class DX, class DW>
void weight_grad_add(const Eigen::MatrixBase<DY>& dy, const Eigen::MatrixBase<DX>& x, DW&& dW) {
  constexpr bool packed =
      ops::gemm_impl::packable<DY>() && ops::gemm_impl::packable<DX>() && ops::gemm_impl::packable<std::decay_t<DW>>();
  if (!packed && weight_grad_in_one_call<S>(dy.rows(), dy.cols(), x.cols()))
    dW.noalias() += dy.transpose() * x;
  else
    ops::gemm_tn_add<S>(dy, x, dW);
}

/// y = x W^T + b (y resized to [N, out]), the bias written first and the product added onto it: Eigen's kernel
/// finishes each element as fma(acc, 1, y) = acc + b, the rounding of ops::linear_forward (which zero-fills y,
/// writes acc and then adds b), without the zero fill and the second pass over y. Without a bias it is
/// ops::linear_forward.
template <class S, class DX, class DW>
void linear_forward_bias_first(const Eigen::MatrixBase<DX>& x, const Eigen::MatrixBase<DW>& W, const S* b, Mat<S>& y) {
  if (!b || (ops::gemm_impl::packable<DX>() && ops::gemm_impl::packable<DW>())) {  // the packed product adds b in its pass
    ops::linear_forward<S>(x, W, b, y);
    return;
  }
  y.resize(x.rows(), W.rows());
  const Eigen::Map<const RowVec<S>> bias(b, W.rows());
  ops::for_row_blocks(x.rows(), [&](Index r0, Index nr) {  // ops::gemm's blocks: the same products
    auto yb = y.middleRows(r0, nr);
    yb.rowwise() = bias;                                    // y = b
    yb.noalias() += x.middleRows(r0, nr) * W.transpose();   // y += x W^T
  });
}

/// ops::linear_backward with the weight gradient through weight_grad_add (the same bits): dW += dy^T x,
/// db += colsum(dy) (db may be null), dx = dy W when dx is non-null.
template <class S, class DY, class DX, class DW>
void linear_backward_packed_once(const Eigen::MatrixBase<DY>& dy, const Eigen::MatrixBase<DX>& x,
                                 const Eigen::MatrixBase<DW>& W, MatMap<S> dW, S* db, Mat<S>* dx) {
  weight_grad_add<S>(dy, x, dW);                                             // y = x W^T  ->  dW += dy^T x
  if (db) Eigen::Map<RowVec<S>>(db, W.rows()) += dy.colwise().sum();       // y += b     ->  db += sum_n dy
  if (dx) ops::gemm<S>(dy, W, *dx);                                          // y = x W^T  ->  dx = dy W
}

/// A Linear D_in -> D_out parameter pair in PyTorch layout: weight [out, in], optional bias [out].
template <class S>
struct Projection {
  Param<S> weight;
  Param<S> bias;
  bool has_bias = true;

  Projection() = default;
  Projection(const std::string& name, Index in, Index out, bool with_bias)
      : weight(name + ".weight", "main", {out, in}), has_bias(with_bias) {
    if (with_bias) bias = Param<S>(name + ".bias", "main", {out});
  }
  void append_to(ParamList<S>& list) {
    list.push_back(&weight);
    if (has_bias) list.push_back(&bias);
  }
  void zero_grad() {
    weight.zero_grad();
    if (has_bias) bias.zero_grad();
  }
  /// y = x W^T + b
  void forward(const Mat<S>& x, Mat<S>& y) const {
    linear_forward_bias_first<S>(x, weight.mat(), has_bias ? bias.value.data() : nullptr, y);
  }
  /// Adds dW += dy^T x, db += colsum(dy); writes dx = dy W when dx is non-null.
  void backward(const Mat<S>& dy, const Mat<S>& x, Mat<S>* dx) {
    linear_backward_packed_once<S>(dy, x, weight.mat(), weight.grad_mat(), has_bias ? bias.grad.data() : nullptr, dx);
  }
};

/// The three input projections of a self-attention layer as one product (one pass over x, one wide GEMM):
///   qkv = x [W_q; W_k; W_v]^T + [b_q, b_k, b_v]      x [N, D], qkv [N, 3D] (Q | K | V column blocks)
/// w_cat [3D, D] and b_cat [3D] are filled here and kept by the caller for the backward.
template <class S>
void qkv_forward(const Mat<S>& x, const Projection<S>& q, const Projection<S>& k, const Projection<S>& v,
                 Mat<S>& w_cat, RowVec<S>& b_cat, Mat<S>& qkv) {
  const Index D = q.weight.rows();
  w_cat.resize(3 * D, q.weight.cols());
  w_cat.topRows(D) = q.weight.mat();
  w_cat.middleRows(D, D) = k.weight.mat();
  w_cat.bottomRows(D) = v.weight.mat();
  if (q.has_bias) {
    b_cat.resize(3 * D);
    b_cat.segment(0, D) = q.bias.value.transpose();
    b_cat.segment(D, D) = k.bias.value.transpose();
    b_cat.segment(2 * D, D) = v.bias.value.transpose();
  }
  linear_forward_bias_first<S>(x, w_cat, q.has_bias ? b_cat.data() : nullptr, qkv);  // [Q K V] = x W_cat^T + b_cat
}

/// Backward of qkv_forward: adds dW_q/dW_k/dW_v (via the scratch dw [3D, D]) and the bias gradients, and
/// writes dx = dqkv W_cat.
template <class S>
void qkv_backward(const Mat<S>& dqkv, const Mat<S>& x, const Mat<S>& w_cat, Projection<S>& q, Projection<S>& k,
                  Projection<S>& v, Mat<S>& dw, Mat<S>& dx) {
  const Index D = q.weight.rows();
  dw.setZero(3 * D, x.cols());
  weight_grad_add<S>(dqkv, x, dw);                   // qkv = x W_cat^T  ->  dW_cat = dqkv^T x
  q.weight.grad_mat() += dw.topRows(D);
  k.weight.grad_mat() += dw.middleRows(D, D);
  v.weight.grad_mat() += dw.bottomRows(D);
  if (q.has_bias) {                                  // qkv += b_cat  ->  db_cat = colsum(dqkv)
    const RowVec<S> db = dqkv.colwise().sum();
    q.bias.grad += db.segment(0, D).transpose();
    k.bias.grad += db.segment(D, D).transpose();
    v.bias.grad += db.segment(2 * D, D).transpose();
  }
  ops::gemm<S>(dqkv, w_cat, dx);                     // qkv = x W_cat^T  ->  dx = dqkv W_cat
}

}  // namespace mha
}  // namespace detail

/// Options of DotProductAttention.
template <class S>
struct DotProductAttentionOptions {
  /// Biases on W_q, W_k, W_v and W_o.
  bool bias = true;
  /// Attention-probability dropout p in [0, 1) (training only, inverted scaling).
  S dropout = 0;
};

/// Multi-head scaled dot-product self-attention with optional key mask, causal mask and attention dropout
/// (kSupport: an oracle, targets or a frozen alpha-hat in the inputs is an error).
///
/// Parameters (PyTorch state_dict names): W_q.weight, W_q.bias, W_k.weight, W_k.bias, W_v.weight, W_v.bias,
/// W_o.weight, W_o.bias; weights [D, D] Xavier-uniform (bound sqrt(6/(2D))), drawn in that order; biases 0.
/// `Heads` and `DHead` may fix n_heads and d_head at compile time (or be Eigen::Dynamic).
template <class S, int Heads = Eigen::Dynamic, int DHead = Eigen::Dynamic>
class DotProductAttention {
  static_assert(std::is_floating_point<S>::value, "DotProductAttention: Scalar must be a floating-point type");
  static_assert(Heads == Eigen::Dynamic || Heads > 0, "DotProductAttention: Heads must be positive or Dynamic");
  static_assert(DHead == Eigen::Dynamic || DHead > 1,
                "DotProductAttention: a fixed DHead must be > 1 (use Eigen::Dynamic for d_head = 1)");

public:
  using Scalar = S;
  using Options = DotProductAttentionOptions<S>;
  static constexpr int HeadsAtCompileTime = Heads;
  static constexpr int DHeadAtCompileTime = DHead;

  /// What backward needs, filled by forward, plus reusable work buffers. Reusable across calls; backward
  /// changes only the work buffers, so it may run twice on one forward.
  struct Cache {
    Index batch = 0, seq = 0, d_model = 0;
    bool causal = false;  ///< the forward's causal mask (P is zero above the diagonal)
    Mat<S> x;         ///< [N, D] the input (for the projection weight gradients)
    Mat<S> qkv;       ///< [N, 3D] projections Q | K | V (column blocks of D)
    Mat<S> ctx;       ///< [N, D] heads' outputs concatenated (input of W_o)
    Vec<S> p;         ///< [B, H, T, T] attention probabilities (before dropout; zero above the diagonal when causal)
    Vec<S> drop;      ///< [B, H, T, T] dropout multipliers (0 or 1/(1-p)); empty when dropout was inactive
    Mat<S> w_cat;     ///< [3D, D] W_q; W_k; W_v as used by this forward
    RowVec<S> b_cat;  ///< [3D] their biases
    Mat<S> work_dctx, work_dqkv, work_dw;  ///< backward scratch

    auto q() const { return qkv.leftCols(d_model); }
    auto k() const { return qkv.middleCols(d_model, d_model); }
    auto v() const { return qkv.rightCols(d_model); }
  };

  DotProductAttention(Index d_model, Index n_heads, Rng& rng, Options opt = {})
      : d_model_(d_model),
        n_heads_(n_heads),
        d_head_(detail::mha::check_head_sizes<Heads, DHead>("DotProductAttention", d_model, n_heads)),
        opt_(opt) {
    ops::check_dropout_probability(opt.dropout, "DotProductAttention: Options::dropout");
    q_ = Proj("W_q", d_model, d_model, opt.bias);
    k_ = Proj("W_k", d_model, d_model, opt.bias);
    v_ = Proj("W_v", d_model, d_model, opt.bias);
    o_ = Proj("W_o", d_model, d_model, opt.bias);
    for (Proj* p : {&q_, &k_, &v_, &o_}) init::xavier_uniform(p->weight.mat(), rng, d_model, d_model);
  }

  Index d_model() const { return d_model_; }
  Index n_heads() const { return n_heads_; }
  Index d_head() const { return d_head_; }
  const Options& options() const { return opt_; }

  /// W_q.weight, W_q.bias, W_k.weight, W_k.bias, W_v.weight, W_v.bias, W_o.weight, W_o.bias (no biases
  /// when Options::bias is false).
  ParamList<S> parameters() {
    ParamList<S> list;
    for (Proj* p : {&q_, &k_, &v_, &o_}) p->append_to(list);
    return list;
  }

  void zero_grad() {
    for (Proj* p : {&q_, &k_, &v_, &o_}) p->zero_grad();
  }

  /// What this class accepts of AttnInputs: a key mask, causal masking and (always kept) its maps; no oracle,
  /// targets or frozen alpha-hat (Dual-Expert inputs). Self-attention only.
  static constexpr AttnSupport kSupport{/*oracle*/ false, /*causal*/ true, /*frozen_alpha_hat*/ false,
                                        /*keep_maps: P is always in the cache*/ true};

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
    const char* cls = "DotProductAttention";
    const Index T = detail::mha::check_self_attention_input(cls, kSupport, x, in, d_model_, n_heads_, opt_.dropout);
    const Index batch = in.batch();
    const Index H = n_heads_, dh = d_head_, TT = T * T, D = d_model_;
    Cache& c = cache;
    c.batch = batch;
    c.seq = T;
    c.d_model = D;
    if (&x != &c.x) c.x = x;  // x may be cache.x itself (the caller wrote its input there): no copy
    detail::mha::qkv_forward(x, q_, k_, v_, c.w_cat, c.b_cat, c.qkv);  // [Q K V] = x [W_q; W_k; W_v]^T + b  [N, 3D]
    const bool dropping = in.training() && opt_.dropout > S(0);
    if (dropping)
      ops::dropout_mask(c.drop, batch * H * TT, opt_.dropout, *in.rng());
    else
      c.drop.resize(0);
    const bool masked = in.has_key_mask();
    const bool causal = in.causal();
    c.causal = causal;
    if (causal)
      c.p.setZero(batch * H * TT);  // the causal core writes P on and below the diagonal tiles only
    else
      c.p.resize(batch * H * TT);
    c.ctx.resize(x.rows(), D);
    const auto scale = ops::ScoreScale<S>::inv_sqrt(dh);
    const Mat<S>& qkv = c.qkv;
    const ops::HeadProducts regs = ops::HeadProducts::registers;
    parallel_for(batch * H, [&](Index bh) {
      const Index b = bh / H, h = bh % H;
      const ops::AttentionMask mask{masked ? in.key_mask(b) : nullptr, causal};
      // per (b, h): P = softmax(Q K^T / sqrt(Dh)) over the visible keys, O = (P .* M) V
      ops::attention_core_forward<S, DHead>(
          ops::head_block<DHead>(qkv, b * T, h * dh, T, dh), ops::head_block<DHead>(qkv, b * T, D + h * dh, T, dh),
          ops::head_block<DHead>(qkv, b * T, 2 * D + h * dh, T, dh), scale, mask, regs,
          dropping ? c.drop.data() + bh * TT : nullptr, c.p.data() + bh * TT,
          ops::head_block<DHead>(c.ctx, b * T, h * dh, T, dh));
    }, double(batch * H) * double(TT) * double(4 * dh + 10) > kParallelMinFlops);
    o_.forward(c.ctx, y);  // y = O W_o^T + b_o
  }

  /// dy [B*T, D] -> dx [B*T, D]. ADDS into every parameter's grad (two calls accumulate); only the cache's
  /// work buffers change.
  Mat<S> backward(const Mat<S>& dy, Cache& cache) {
    const char* cls = "DotProductAttention";
    detail::mha::check_backward_input(cls, dy, cache.batch, cache.seq, d_model_);
    const Cache& c = cache;
    const Index T = c.seq, H = n_heads_, dh = d_head_, TT = T * T, N = dy.rows(), D = d_model_;
    const bool dropping = c.drop.size() > 0;
    Mat<S>& dctx = cache.work_dctx;
    Mat<S>& dqkv = cache.work_dqkv;
    o_.backward(dy, c.ctx, &dctx);  // y = O W_o^T + b_o  ->  dW_o += dy^T O, db_o += colsum(dy), dO = dy W_o
    dqkv.resize(N, 3 * D);
    const auto scale = ops::ScoreScale<S>::inv_sqrt(dh);
    const Mat<S>& dctx_c = dctx;
    parallel_for(c.batch * H, [&](Index bh) {
      const Index b = bh / H, h = bh % H;
      const ops::AttentionMask mask{nullptr, c.causal};  // the backward reads P: only the causal tiles matter
      // O = (P .* M) V, P = softmax(Q K^T / sqrt(Dh))  ->  dQ, dK, dV of the pair
      ops::attention_core_backward<S, DHead>(
          c.p.data() + bh * TT, dropping ? c.drop.data() + bh * TT : nullptr,
          ops::head_block<DHead>(dctx_c, b * T, h * dh, T, dh), ops::head_block<DHead>(c.qkv, b * T, h * dh, T, dh),
          ops::head_block<DHead>(c.qkv, b * T, D + h * dh, T, dh),
          ops::head_block<DHead>(c.qkv, b * T, 2 * D + h * dh, T, dh), scale, mask, ops::HeadProducts::registers,
          ops::head_block<DHead>(dqkv, b * T, h * dh, T, dh), ops::head_block<DHead>(dqkv, b * T, D + h * dh, T, dh),
          ops::head_block<DHead>(dqkv, b * T, 2 * D + h * dh, T, dh));
    }, double(c.batch * H) * double(TT) * double(8 * dh + 10) > kParallelMinFlops);
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
};

}  // namespace dea
