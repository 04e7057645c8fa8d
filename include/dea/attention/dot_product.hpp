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

/// One head's [T, Dh] slice of a row-major matrix: rows [row0, row0 + T), columns [col0, col0 + Dh).
template <class S, int DHead>
using HeadMat = Eigen::Matrix<S, Eigen::Dynamic, DHead, Eigen::RowMajor>;
template <class S, int DHead>
using HeadMap = Eigen::Map<HeadMat<S, DHead>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S, int DHead>
using ConstHeadMap = Eigen::Map<const HeadMat<S, DHead>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <int DHead, class S>
HeadMap<S, DHead> head(Mat<S>& m, Index row0, Index col0, Index T, Index dh) {
  return {m.data() + row0 * m.cols() + col0, T, dh, Eigen::OuterStride<>(m.cols())};
}
template <int DHead, class S>
ConstHeadMap<S, DHead> head(const Mat<S>& m, Index row0, Index col0, Index T, Index dh) {
  return {m.data() + row0 * m.cols() + col0, T, dh, Eigen::OuterStride<>(m.cols())};
}

/// One (b, h) pair's small product, written without Eigen's general-product machinery (operand packing,
/// zero-filling the result, blocking heuristics), which costs as much as the arithmetic at these sizes:
///   C[r, 0:n] = sum_{k < K} a(r, k) * B[k, 0:n]      r < rows
///   a(r, k) = a[r * a_rs + k * a_ks]  (any strides: A or A^T of a row-major block);  B row k = b + k * ldb
///   (contiguous);  C row r = c + r * ldc (contiguous; written, not accumulated; must not overlap A or B).
/// Each element is the chain acc = pmadd(a_rk, b_kj, acc) over k = 0, 1, ..., K-1 from acc = 0, finished as
/// pmadd(acc, 1, 0): exactly the operations of Eigen's GEBP micro-kernel on a block whose result rows fill
/// whole packets within one depth panel (on AVX-512 the [32, 32] x [32, 32] blocks of a T = 32, d_head = 32
/// model), so there `C.noalias() = A * B` and this give the same bits. Columns beyond the last full group of
/// 32 (and rows beyond the last full row block) take a plain per-element path with the same chain.
template <class S>
void head_product(Index rows, Index n, Index K, const S* a, Index a_rs, Index a_ks, const S* b, Index ldb, S* c,
                  Index ldc) {
  using Packet = typename Eigen::internal::packet_traits<S>::type;
  constexpr int PS = Eigen::internal::packet_traits<S>::size;
  constexpr int CW = 32 >= PS ? 32 : PS;        // columns per register block
  constexpr int NP = CW / PS;                   // packets per row of a register block
  constexpr int RB = NP >= 16 ? 1 : 16 / NP;    // rows per register block: 16 accumulators
  using Eigen::internal::pmadd;
  using Eigen::internal::ploadu;
  using Eigen::internal::pset1;
  using Eigen::internal::pstoreu;
  const Packet zero = pset1<Packet>(S(0)), one = pset1<Packet>(S(1));
  const Index n_full = (PS == 1 || CW % PS != 0) ? 0 : n / CW * CW;
  for (Index j0 = 0; j0 < n_full; j0 += CW) {
    Index r0 = 0;
    for (; r0 + RB <= rows; r0 += RB) {  // RB x CW block in NP * RB accumulators
      Packet acc[RB][NP];
      for (int q = 0; q < RB; ++q)
        for (int p = 0; p < NP; ++p) acc[q][p] = zero;
      const S* ar = a + r0 * a_rs;
      for (Index k = 0; k < K; ++k) {
        const S* bk = b + k * ldb + j0;
        Packet bv[NP];
        for (int p = 0; p < NP; ++p) bv[p] = ploadu<Packet>(bk + p * PS);
        for (int q = 0; q < RB; ++q) {
          const Packet av = pset1<Packet>(ar[q * a_rs + k * a_ks]);
          for (int p = 0; p < NP; ++p) acc[q][p] = pmadd(av, bv[p], acc[q][p]);  // acc += a_rk * B[k, j]
        }
      }
      for (int q = 0; q < RB; ++q)
        for (int p = 0; p < NP; ++p) pstoreu(c + (r0 + q) * ldc + j0 + p * PS, pmadd(acc[q][p], one, zero));
    }
    for (; r0 < rows; ++r0) {  // leftover rows, one at a time
      Packet acc[NP];
      for (int p = 0; p < NP; ++p) acc[p] = zero;
      for (Index k = 0; k < K; ++k) {
        const Packet av = pset1<Packet>(a[r0 * a_rs + k * a_ks]);
        for (int p = 0; p < NP; ++p) acc[p] = pmadd(av, ploadu<Packet>(b + k * ldb + j0 + p * PS), acc[p]);
      }
      for (int p = 0; p < NP; ++p) pstoreu(c + r0 * ldc + j0 + p * PS, pmadd(acc[p], one, zero));
    }
  }
  const Index n_pk = PS == 1 ? n_full : n_full + (n - n_full) / PS * PS;
  for (Index r = 0; r < rows; ++r)  // leftover columns: whole packets, one row at a time
    for (Index j = n_full; j < n_pk; j += PS) {
      Packet acc = zero;
      for (Index k = 0; k < K; ++k)
        acc = pmadd(pset1<Packet>(a[r * a_rs + k * a_ks]), ploadu<Packet>(b + k * ldb + j), acc);
      pstoreu(c + r * ldc + j, pmadd(acc, one, zero));
    }
  for (Index r = 0; r < rows; ++r)  // leftover columns: single ones
    for (Index j = n_pk; j < n; ++j) {
      S acc = S(0);
      for (Index k = 0; k < K; ++k) acc = Eigen::internal::pmadd(a[r * a_rs + k * a_ks], b[k * ldb + j], acc);
      c[r * ldc + j] = acc + S(0);
    }
}

/// Dst [cols, rows] = Src^T for a row-major Src [rows, cols] with row stride lds (Dst contiguous).
template <class S>
void transpose_into(Index rows, Index cols, const S* src, Index lds, S* dst) {
  for (Index r = 0; r < rows; ++r)
    for (Index j = 0; j < cols; ++j) dst[j * rows + r] = src[r * lds + j];
}

/// In place: row i of the [Tq, Tk] score block s becomes softmax over its real keys (km[j] != 0, km may be
/// null; and j <= i when causal); masked keys get exactly 0; a row with no real key becomes all 0.
/// The exponentials are vectorised (Eigen); the max and the normaliser are taken over real keys only.
template <class Derived>
void masked_softmax_inplace(const Eigen::MatrixBase<Derived>& s_, const std::uint8_t* km, bool causal) {
  using S = typename Derived::Scalar;
  auto& s = const_cast<Eigen::MatrixBase<Derived>&>(s_);
  const Index tk = s.cols();
  for (Index i = 0; i < s.rows(); ++i) {
    auto row = s.row(i);
    const Index lim = causal ? std::min(i + 1, tk) : tk;  // keys [0, lim) pass the causal mask
    S mx = -std::numeric_limits<S>::infinity();
    if (km) {
      for (Index j = 0; j < lim; ++j)
        if (km[j]) mx = std::max(mx, row(j));
    } else if (lim > 0) {
      mx = row.head(lim).maxCoeff();
    }
    if (mx == -std::numeric_limits<S>::infinity()) {  // no real key: zeros, never NaN
      row.setZero();
      continue;
    }
    row.array() = (row.array() - mx).exp();                 // P_ij ∝ exp(S_ij - max_j S_ij)
    if (lim < tk) row.tail(tk - lim).setZero();             // causal: keys j > i
    if (km)
      for (Index j = 0; j < lim; ++j)
        if (!km[j]) row(j) = S(0);                          // padded keys
    row /= row.sum();                                       // normalise over real keys
  }
}

/// Scratch of n elements for one (b, h) pair: on the stack up to kLocal elements, on the heap beyond.
template <class S, int kLocal = 1024>
class PairScratch {
public:
  explicit PairScratch(Index n) {
    if (n > kLocal) heap_.resize(n);
  }
  PairScratch(const PairScratch&) = delete;
  PairScratch& operator=(const PairScratch&) = delete;
  S* data() { return heap_.size() > 0 ? heap_.data() : local_; }

private:
  alignas(64) S local_[kLocal];
  Vec<S> heap_;
};

/// O = Pd V for one (b, h) pair, with Pd = P .* M when `drop` (the pair's [T, T] dropout multipliers M) is
/// given and Pd = P otherwise. P [Tq, Tk], V [Tk, Dh], O [Tq, Dh] (row-major, contiguous rows).
template <class S, class DV, class DO>
void attend_values(const ConstMatMap<S>& P, const S* drop, const Eigen::MatrixBase<DV>& V,
                   const Eigen::MatrixBase<DO>& O_) {
  auto& O = const_cast<Eigen::MatrixBase<DO>&>(O_);
  const Index tq = P.rows(), tk = P.cols(), dh = V.cols();
  const S* pd = P.data();
  Mat<S> Pd;
  if (drop) {
    const ConstMatMap<S> M(drop, tq, tk);
    Pd = P.cwiseProduct(M);  // Pd = P .* M
    pd = Pd.data();
  }
  head_product<S>(tq, dh, tk, pd, tk, 1, V.derived().data(), V.outerStride(), O.derived().data(),
                  O.outerStride());  // O = Pd V
}

/// Backward of attend_values: writes dV = Pd^T dO and G = dL/dP = (dO V^T) .* M (without M when no dropout).
/// G [Tq, Tk] is a contiguous block (e.g. a Map of the pair's scratch).
template <class S, class DV, class DdO, class DdV>
void attend_values_backward(const ConstMatMap<S>& P, const S* drop, const Eigen::MatrixBase<DV>& V,
                            const Eigen::MatrixBase<DdO>& dO, const Eigen::MatrixBase<DdV>& dV_, MatMap<S> G) {
  auto& dV = const_cast<Eigen::MatrixBase<DdV>&>(dV_);
  const Index tq = P.rows(), tk = P.cols(), dh = V.cols();
  check(G.rows() == tq && G.cols() == tk, "attend_values_backward: G: expected shape [", tq, ", ", tk, "]");
  PairScratch<S> vt(dh * tk);  // V^T [Dh, Tk]
  transpose_into<S>(tk, dh, V.derived().data(), V.outerStride(), vt.data());
  head_product<S>(tq, tk, dh, dO.derived().data(), dO.outerStride(), 1, vt.data(), tk, G.data(),
                  tk);  // O = Pd V  ->  dPd = dO V^T
  const S* pd = P.data();
  Mat<S> Pd;
  if (drop) {
    const ConstMatMap<S> M(drop, tq, tk);
    Pd = P.cwiseProduct(M);
    pd = Pd.data();
    G.array() *= M.array();  // Pd = P .* M  ->  dP = dPd .* M
  }
  head_product<S>(tk, dh, tq, pd, 1, tk, dO.derived().data(), dO.outerStride(), dV.derived().data(),
                  dV.outerStride());  // O = Pd V  ->  dV = Pd^T dO
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
    Mat<S> x;         ///< [N, D] the input (for the projection weight gradients)
    Mat<S> qkv;       ///< [N, 3D] projections Q | K | V (column blocks of D)
    Mat<S> ctx;       ///< [N, D] heads' outputs concatenated (input of W_o)
    Vec<S> p;         ///< [B, H, T, T] attention probabilities (before dropout)
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
    c.p.resize(batch * H * TT);
    c.ctx.resize(x.rows(), D);
    const S scale = S(1) / std::sqrt(static_cast<S>(dh));
    const bool masked = in.has_key_mask();
    const bool causal = in.causal();
    const Mat<S>& qkv = c.qkv;
    parallel_for(batch * H, [&](Index bh) {
      const Index b = bh / H, h = bh % H;
      const auto Q = detail::mha::head<DHead>(qkv, b * T, h * dh, T, dh);          // [T, Dh]
      const auto K = detail::mha::head<DHead>(qkv, b * T, D + h * dh, T, dh);      // [T, Dh]
      const auto V = detail::mha::head<DHead>(qkv, b * T, 2 * D + h * dh, T, dh);  // [T, Dh]
      auto O = detail::mha::head<DHead>(c.ctx, b * T, h * dh, T, dh);              // [T, Dh]
      MatMap<S> P(c.p.data() + bh * TT, T, T);                                      // [T, T]
      detail::mha::PairScratch<S> kt(dh * T);                                                     // K^T [Dh, T]
      detail::mha::transpose_into<S>(T, dh, K.data(), K.outerStride(), kt.data());
      detail::mha::head_product<S>(T, T, dh, Q.data(), Q.outerStride(), 1, kt.data(), T, P.data(), T);  // S = Q K^T
      P *= scale;                                                                    //     / sqrt(Dh)
      detail::mha::masked_softmax_inplace(P, masked ? in.key_mask(b) : nullptr, causal);  // P = softmax over real keys
      detail::mha::attend_values<S>(ConstMatMap<S>(P.data(), T, T), dropping ? c.drop.data() + bh * TT : nullptr,
                                    V, O);                                           // O = (P .* M) V
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
    const S scale = S(1) / std::sqrt(static_cast<S>(dh));
    const Mat<S>& dctx_c = dctx;
    parallel_for(c.batch * H, [&](Index bh) {
      const Index b = bh / H, h = bh % H;
      const auto Q = detail::mha::head<DHead>(c.qkv, b * T, h * dh, T, dh);
      const auto K = detail::mha::head<DHead>(c.qkv, b * T, D + h * dh, T, dh);
      const auto V = detail::mha::head<DHead>(c.qkv, b * T, 2 * D + h * dh, T, dh);
      const auto dO = detail::mha::head<DHead>(dctx_c, b * T, h * dh, T, dh);
      auto dQ = detail::mha::head<DHead>(dqkv, b * T, h * dh, T, dh);
      auto dK = detail::mha::head<DHead>(dqkv, b * T, D + h * dh, T, dh);
      auto dV = detail::mha::head<DHead>(dqkv, b * T, 2 * D + h * dh, T, dh);
      const ConstMatMap<S> P(c.p.data() + bh * TT, T, T);
      detail::mha::PairScratch<S> dp_buf(TT);
      MatMap<S> dP(dp_buf.data(), T, T);
      detail::mha::attend_values_backward<S>(P, dropping ? c.drop.data() + bh * TT : nullptr, V, dO, dV, dP);
      ops::softmax_rows_backward<S>(P, dP, dP);         // P = softmax(S)  ->  dS = P .* (dP - rowsum(dP .* P))
      dP *= scale;                                      // S = Q K^T / sqrt(Dh)  ->  d(Q K^T) = dS / sqrt(Dh)
      detail::mha::head_product<S>(T, dh, T, dP.data(), T, 1, K.data(), K.outerStride(), dQ.data(),
                                   dQ.outerStride());  //                       ->  dQ = dS' K
      detail::mha::head_product<S>(T, dh, T, dP.data(), 1, T, Q.data(), Q.outerStride(), dK.data(),
                                   dK.outerStride());  //                       ->  dK = dS'^T Q
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
