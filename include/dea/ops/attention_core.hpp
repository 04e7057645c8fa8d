// dea/ops/attention_core.hpp: the softmax attention core of one head, with its backward. Every softmax attention of
// the library (dot-product, the decoder's causal MHA / GQA, BERT's self-attention, the token-routed layers) runs its
// (b, h) pairs through these two functions; the Laplacian attention shares the value product and the softmax.
//
// Shapes (one head, self-attention: T queries over the same T keys; d_h = head width, DHead when fixed):
//   q, k, v [T, d_h] (row-major views, rows contiguous)
//   S = q k^T * scale                                         [T, T]   (ScoreScale: times the rounded 1/sqrt(d_h),
//                                                                      or over sqrt(d_h) as Hugging Face's BERT has it)
//   key j is hidden from query i when key_mask[j] == 0 or (causal) j > i; hidden keys get P = 0 exactly
//   P = softmax_rows(S) over the visible keys                 [T, T]   (a row with no visible key: zeros, or 1/T
//                                                                      everywhere with AttentionMask::uniform_if_empty)
//   Pd = P .* M (dropout multipliers M, when given)
//   o = Pd v                                                  [T, d_h]
//
// Causal heads run over row tiles of kCausalTile queries: tile [i0, i1) reads keys [0, i1) only, so the products
// and the softmax skip the masked upper triangle tile by tile (at T = 256, 62.5 % of the square). The stored P keeps
// its [T, T] layout with zeros above the tiles (the caller zero-fills it once). A head that is not causal is one
// tile of T rows.
//
// The products of a tile are one of two kernels, chosen by the caller (both give results that depend on the sizes
// alone, so a caller that gives each head to one thread keeps its results independent of the thread count):
//   HeadProducts::registers  head_product below: register blocks, no packing; the fastest at the encoders' small
//                            heads (T and d_h up to a few dozen), where Eigen's packing costs as much as the arithmetic
//   HeadProducts::eigen      Eigen's GEMM on one thread; faster at the decoder's sizes (T = 256 with d_h = 48 or 64:
//                            about 15 % per head on AVX-512)
// Under ScopedPrecision(Precision::bf16), the float products of HeadProducts::eigen (q k^T, P v and the four of the
// backward) are ops/packed_bf16.hpp's bf16 products (one thread each: the caller is parallel over heads); the
// register kernel, the masks, the softmax and its backward stay float.
// A compile-time DHead reaches both: the head views have DHead columns, and head_product's loops over d_h (the
// depth of q k^T and dO v^T, the width of P v, dS k and dS^T q) have a constant trip count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "gemm.hpp"
#include "softmax.hpp"

namespace dea {
namespace ops {

/// Queries per tile of a causal head.
constexpr Index kCausalTile = 64;

/// The kernel of a head's products (see the file comment).
enum class HeadProducts { registers, eigen };

/// Which keys a query sees.
struct AttentionMask {
  /// nullptr (every key is real) or T bytes, 0 = the key is padding.
  const std::uint8_t* key_mask = nullptr;
  /// Query i sees keys j <= i only.
  bool causal = false;
  /// A row with no visible key becomes 1/T over all T keys (Hugging Face's additive mask, where every score of such
  /// a row is the same finite minimum), and passes no gradient to q and k; otherwise it is zeros. Not with causal.
  bool uniform_if_empty = false;
};

/// The scale of the scores, 1 / sqrt(d_h): a product by its rounded value (the default), or a division by sqrt(d_h)
/// as Hugging Face's BERT writes it (the two differ in the last bit).
template <class S>
class ScoreScale {
public:
  /// S = q k^T * factor
  static ScoreScale times(S factor) { return ScoreScale(factor, false); }
  /// S = q k^T / divisor
  static ScoreScale over(S divisor) { return ScoreScale(divisor, true); }
  /// The scale 1 / sqrt(d_h), applied as a product.
  static ScoreScale inv_sqrt(Index d_head) { return times(S(1) / std::sqrt(static_cast<S>(d_head))); }

  bool divides() const { return divide_; }
  S value() const { return value_; }
  /// m = m * factor, or m = m / divisor
  template <class Derived>
  void apply(const Eigen::MatrixBase<Derived>& m_) const {
    auto& m = const_cast<Eigen::MatrixBase<Derived>&>(m_);
    if (divide_)
      m /= value_;
    else
      m *= value_;
  }

private:
  ScoreScale(S v, bool divide) : value_(v), divide_(divide) {}
  S value_;
  bool divide_;
};

/// One head's [rows, d_h] block of a row-major matrix (d_h = DHead when fixed): a map with the matrix's row stride.
template <class S, int DHead>
using HeadMatrix = Eigen::Matrix<S, Eigen::Dynamic, DHead, Eigen::RowMajor>;
template <class S, int DHead>
using HeadMap = Eigen::Map<HeadMatrix<S, DHead>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class S, int DHead>
using ConstHeadMap = Eigen::Map<const HeadMatrix<S, DHead>, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of m (cols == DHead when DHead is fixed).
template <int DHead, class S>
HeadMap<S, DHead> head_block(Mat<S>& m, Index row0, Index col0, Index rows, Index cols) {
  return {m.data() + row0 * m.cols() + col0, rows, cols, Eigen::OuterStride<>(m.cols())};
}
template <int DHead, class S>
ConstHeadMap<S, DHead> head_block(const Mat<S>& m, Index row0, Index col0, Index rows, Index cols) {
  return {m.data() + row0 * m.cols() + col0, rows, cols, Eigen::OuterStride<>(m.cols())};
}
/// The same view of any row-major expression with direct access and contiguous rows (a block, a Map, a matrix).
template <int DHead, class Derived>
ConstHeadMap<typename Derived::Scalar, DHead> head_view(const Eigen::MatrixBase<Derived>& m) {
  static_assert(bool(Derived::IsRowMajor) && (int(Derived::Flags) & Eigen::DirectAccessBit) != 0,
                "head_view: a row-major expression with direct access");
  eigen_assert(m.derived().innerStride() == 1);
  return {m.derived().data(), m.rows(), m.cols(), Eigen::OuterStride<>(m.derived().outerStride())};
}
template <int DHead, class Derived>
HeadMap<typename Derived::Scalar, DHead> head_view_mut(const Eigen::MatrixBase<Derived>& m_) {
  static_assert(bool(Derived::IsRowMajor) && (int(Derived::Flags) & Eigen::DirectAccessBit) != 0,
                "head_view_mut: a row-major expression with direct access");
  auto& m = const_cast<Eigen::MatrixBase<Derived>&>(m_);
  eigen_assert(m.derived().innerStride() == 1);
  return {m.derived().data(), m.rows(), m.cols(), Eigen::OuterStride<>(m.derived().outerStride())};
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

/// One (b, h) pair's small product, written without Eigen's general-product machinery (operand packing,
/// zero-filling the result, blocking heuristics), which costs as much as the arithmetic at these sizes:
///   C[r, 0:n] (+)= sum_{k < K} a(r, k) * B[k, 0:n]      r < rows
///   a(r, k) = a[r * a_rs + k * a_ks]  (any strides: A or A^T of a row-major block);  B row k = b + k * ldb
///   (contiguous);  C row r = c + r * ldc (contiguous; must not overlap A or B). Written, or added onto C when
///   Accumulate.
/// Each element is the chain acc = pmadd(a_rk, b_kj, acc) over k = 0, 1, ..., K-1 from acc = 0, finished as
/// pmadd(acc, 1, 0) (or pmadd(acc, 1, C) when accumulating): exactly the operations of Eigen's GEBP micro-kernel on
/// a block whose result rows fill whole packets within one depth panel (on AVX-512 the [32, 32] x [32, 32] blocks of
/// a T = 32, d_head = 32 model), so there `C.noalias() = A * B` and this give the same bits. Columns beyond the last
/// full group of 32 (and rows beyond the last full row block) take a plain per-element path with the same chain.
/// KFixed / NFixed: K or n known at compile time (Eigen::Dynamic: given at run time); the arithmetic is the same,
/// the loops over them have a constant trip count.
template <class S, int KFixed = Eigen::Dynamic, int NFixed = Eigen::Dynamic, bool Accumulate = false>
void head_product(Index rows, Index n_, Index K_, const S* a, Index a_rs, Index a_ks, const S* b, Index ldb, S* c,
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
  eigen_assert((KFixed == Eigen::Dynamic || K_ == KFixed) && (NFixed == Eigen::Dynamic || n_ == NFixed));
  const Index K = KFixed == Eigen::Dynamic ? K_ : Index(KFixed);
  const Index n = NFixed == Eigen::Dynamic ? n_ : Index(NFixed);
  const Packet zero = pset1<Packet>(S(0)), one = pset1<Packet>(S(1));
  const auto finish = [&](S* dst, const Packet& acc) {  // C = acc (exact), or C = acc + C
    pstoreu(dst, pmadd(acc, one, Accumulate ? ploadu<Packet>(dst) : zero));
  };
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
        for (int p = 0; p < NP; ++p) finish(c + (r0 + q) * ldc + j0 + p * PS, acc[q][p]);
    }
    for (; r0 < rows; ++r0) {  // leftover rows, one at a time
      Packet acc[NP];
      for (int p = 0; p < NP; ++p) acc[p] = zero;
      for (Index k = 0; k < K; ++k) {
        const Packet av = pset1<Packet>(a[r0 * a_rs + k * a_ks]);
        for (int p = 0; p < NP; ++p) acc[p] = pmadd(av, ploadu<Packet>(b + k * ldb + j0 + p * PS), acc[p]);
      }
      for (int p = 0; p < NP; ++p) finish(c + r0 * ldc + j0 + p * PS, acc[p]);
    }
  }
  const Index n_pk = PS == 1 ? n_full : n_full + (n - n_full) / PS * PS;
  for (Index r = 0; r < rows; ++r)  // leftover columns: whole packets, one row at a time
    for (Index j = n_full; j < n_pk; j += PS) {
      Packet acc = zero;
      for (Index k = 0; k < K; ++k)
        acc = pmadd(pset1<Packet>(a[r * a_rs + k * a_ks]), ploadu<Packet>(b + k * ldb + j), acc);
      finish(c + r * ldc + j, acc);
    }
  for (Index r = 0; r < rows; ++r)  // leftover columns: single ones
    for (Index j = n_pk; j < n; ++j) {
      S acc = S(0);
      for (Index k = 0; k < K; ++k) acc = Eigen::internal::pmadd(a[r * a_rs + k * a_ks], b[k * ldb + j], acc);
      c[r * ldc + j] = Accumulate ? acc + c[r * ldc + j] : acc + S(0);
    }
}

/// Dst [cols, rows] = Src^T for a row-major Src [rows, cols] with row stride lds (Dst contiguous).
template <class S>
void transpose_into(Index rows, Index cols, const S* src, Index lds, S* dst) {
  for (Index r = 0; r < rows; ++r)
    for (Index j = 0; j < cols; ++j) dst[j * rows + r] = src[r * lds + j];
}

/// o = Pd v for one head, with Pd = P .* M when `drop` (the pair's dropout multipliers M, laid out as P) is given and
/// Pd = P otherwise. P [tq, tk] with row stride ldp, v [tk, d_h], o [tq, d_h]: written, or added onto o when
/// Accumulate.
template <int DHead, bool Accumulate = false, class S>
void attend_values(const S* p, Index tq, Index tk, Index ldp, const S* drop, const ConstHeadMap<S, DHead>& v,
                   HeadMap<S, DHead> o) {
  const S* pd = p;
  Index ldpd = ldp;
  Mat<S> Pd;
  if (drop) {
    const Eigen::Map<const Mat<S>, 0, Eigen::OuterStride<>> P(p, tq, tk, Eigen::OuterStride<>(ldp)),
        M(drop, tq, tk, Eigen::OuterStride<>(ldp));
    Pd = P.cwiseProduct(M);  // Pd = P .* M
    pd = Pd.data();
    ldpd = tk;
  }
  head_product<S, Eigen::Dynamic, DHead, Accumulate>(tq, v.cols(), tk, pd, ldpd, 1, v.data(), v.outerStride(),
                                                      o.data(), o.outerStride());  // o = Pd v
}

/// Backward of attend_values (not accumulating): writes g = dL/dP = (dO v^T) .* M (without M when no dropout) into
/// the contiguous [tq, tk] buffer g, and writes dv[0:tk] = Pd^T dO (adds it onto dv when AccumulateDv). vt holds
/// v^T [d_h, ldvt >= tk] (the first tk columns are read).
template <int DHead, bool AccumulateDv, class S>
void attend_values_backward(const S* p, Index tq, Index tk, Index ldp, const S* drop, const S* vt, Index ldvt,
                            const ConstHeadMap<S, DHead>& dO, HeadMap<S, DHead> dv, S* g) {
  const Index dh = dO.cols();
  head_product<S, DHead>(tq, tk, dh, dO.data(), dO.outerStride(), 1, vt, ldvt, g, tk);  // o = Pd v -> dPd = dO v^T
  const S* pd = p;
  Index ldpd = ldp;
  Mat<S> Pd;
  if (drop) {
    const Eigen::Map<const Mat<S>, 0, Eigen::OuterStride<>> P(p, tq, tk, Eigen::OuterStride<>(ldp)),
        M(drop, tq, tk, Eigen::OuterStride<>(ldp));
    Pd = P.cwiseProduct(M);
    pd = Pd.data();
    ldpd = tk;
    MatMap<S>(g, tq, tk).array() *= M.array();  // Pd = P .* M  ->  dP = dPd .* M
  }
  head_product<S, Eigen::Dynamic, DHead, AccumulateDv>(tk, dh, tq, pd, 1, ldpd, dO.data(), dO.outerStride(), dv.data(),
                                                       dv.outerStride());  // o = Pd v  ->  dv (+)= Pd^T dO
}

namespace detail {

/// True when the mask leaves no key at all to any query (a key mask of zeros).
inline bool no_real_key(const AttentionMask& m, Index T) {
  if (!m.key_mask) return T == 0;
  for (Index j = 0; j < T; ++j)
    if (m.key_mask[j]) return false;
  return true;
}

}  // namespace detail

namespace detail {
/// True when a head's HeadProducts::eigen products run in bf16 (float, under ScopedPrecision(Precision::bf16)).
template <class S>
bool bf16_head_products() {
  return std::is_same<S, float>::value && thread_settings().product_precision == Precision::bf16;
}
/// C (row stride ldc) (=|+=) op(A) op(B) in bf16 for a head's float views (op = transpose when TA / TB); nothing
/// for other scalar types (bf16_head_products is false for them).
template <bool TA, bool TB, class DA, class DB, class T>
void bf16_head_product(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, T* C, Index ldc,
                       bool accumulate) {
  if constexpr (std::is_same<T, float>::value) {
    const packed::View<float> a = TA ? gemm_impl::view_of(A).t() : gemm_impl::view_of(A);
    const packed::View<float> b = TB ? gemm_impl::view_of(B).t() : gemm_impl::view_of(B);
    packed::gemm_bf16(TA ? A.cols() : A.rows(), TB ? B.rows() : B.cols(), TA ? A.rows() : A.cols(), a, b, C, ldc,
                      accumulate);
  }
}
}  // namespace detail

/// Forward of one head (see the file comment). q, k, v [T, d_h] (d_h == DHead when fixed); p points at T x T
/// elements (row stride T; zero above the causal tiles when causal, the caller zero-fills it); drop: nullptr or the
/// head's T x T dropout multipliers; o [T, d_h] is written.
template <class S, int DHead = Eigen::Dynamic, class DQ, class DK, class DV, class DO>
void attention_core_forward(const Eigen::MatrixBase<DQ>& q_, const Eigen::MatrixBase<DK>& k_,
                            const Eigen::MatrixBase<DV>& v_, const ScoreScale<S>& scale, const AttentionMask& mask,
                            HeadProducts products, const S* drop, S* p, const Eigen::MatrixBase<DO>& o_) {
  const ScopedSerialEigen serial;  // one head is one thread's work, whoever calls
  const auto q = head_view<DHead>(q_), k = head_view<DHead>(k_), v = head_view<DHead>(v_);
  auto o = head_view_mut<DHead>(o_);
  const Index T = q.rows(), dh = q.cols(), tile = mask.causal ? kCausalTile : T;
  eigen_assert(!(mask.causal && mask.uniform_if_empty));
  MatMap<S> P(p, T, T);
  if (mask.uniform_if_empty && detail::no_real_key(mask, T)) {
    P.setConstant(S(1) / S(T));  // every score is the same: P uniform over all T keys
    attend_values<DHead>(p, T, T, T, drop, v, o);
    return;
  }
  PairScratch<S> kt(products == HeadProducts::registers ? dh * T : 0);  // k^T [d_h, T]
  if (products == HeadProducts::registers) transpose_into<S>(T, dh, k.data(), k.outerStride(), kt.data());
  for (Index i0 = 0; i0 < T; i0 += tile) {
    const Index tb = std::min(tile, T - i0), kc = mask.causal ? i0 + tb : T;
    auto Pt = P.block(i0, 0, tb, kc);
    if (products == HeadProducts::registers) {
      head_product<S, DHead>(tb, kc, dh, q.data() + i0 * q.outerStride(), q.outerStride(), 1, kt.data(), T,
                             p + i0 * T, T);                                     // S = q k^T
      scale.apply(Pt);                                                           //     * scale
    } else if constexpr (std::is_same<S, float>::value) {
      if (detail::bf16_head_products<S>()) {
        detail::bf16_head_product<false, true>(q.middleRows(i0, tb), k.topRows(kc), p + i0 * T, T, false);
        scale.apply(Pt);                                                         // S = q k^T * scale, bf16 product
      } else if (!scale.divides()) {
        Pt.noalias() = (q.middleRows(i0, tb) * k.topRows(kc).transpose()) * scale.value();
      } else {
        Pt.noalias() = q.middleRows(i0, tb) * k.topRows(kc).transpose();
        scale.apply(Pt);
      }
    } else if (!scale.divides()) {
      Pt.noalias() = (q.middleRows(i0, tb) * k.topRows(kc).transpose()) * scale.value();  // S = q k^T * scale
    } else {
      Pt.noalias() = q.middleRows(i0, tb) * k.topRows(kc).transpose();           // S = q k^T
      scale.apply(Pt);                                                           //     / sqrt(d_h)
    }
    masked_softmax_inplace(Pt, mask.key_mask, mask.causal, i0);                  // P = softmax over visible keys
    if (products == HeadProducts::registers || drop)                             // o = (P .* M) v
      attend_values<DHead>(p + i0 * T, tb, kc, T, drop ? drop + i0 * T : nullptr, head_view<DHead>(v.topRows(kc)),
                           head_view_mut<DHead>(o.middleRows(i0, tb)));
    else if (detail::bf16_head_products<S>())
      detail::bf16_head_product<false, false>(Pt, v.topRows(kc), o.data() + i0 * o.outerStride(),
                                              o.outerStride(), false);
    else
      o.middleRows(i0, tb).noalias() = Pt * v.topRows(kc);
  }
}

/// Backward of attention_core_forward, from dO [T, d_h] and the forward's P (and drop): writes dq = dL/dq,
/// dk = dL/dk and dv = dL/dv [T, d_h] (all three overwritten). The mask, scale and products are the forward's.
template <class S, int DHead = Eigen::Dynamic, class DDO, class DQ, class DK, class DV, class GQ, class GK, class GV>
void attention_core_backward(const S* p, const S* drop, const Eigen::MatrixBase<DDO>& dO_,
                             const Eigen::MatrixBase<DQ>& q_, const Eigen::MatrixBase<DK>& k_,
                             const Eigen::MatrixBase<DV>& v_, const ScoreScale<S>& scale, const AttentionMask& mask,
                             HeadProducts products, const Eigen::MatrixBase<GQ>& dq_,
                             const Eigen::MatrixBase<GK>& dk_, const Eigen::MatrixBase<GV>& dv_) {
  const ScopedSerialEigen serial;
  const auto q = head_view<DHead>(q_), k = head_view<DHead>(k_), v = head_view<DHead>(v_), dO = head_view<DHead>(dO_);
  auto dq = head_view_mut<DHead>(dq_), dk = head_view_mut<DHead>(dk_), dv = head_view_mut<DHead>(dv_);
  const Index T = q.rows(), dh = q.cols(), tile = mask.causal ? kCausalTile : T;
  const ConstMatMap<S> P(p, T, T);
  const bool frozen = mask.uniform_if_empty && detail::no_real_key(mask, T);  // P does not depend on S
  const bool regs = products == HeadProducts::registers || drop || frozen;
  // one tile: the register products write dk and dv; otherwise every tile adds its part
  const bool write_dv = tile >= T && regs, write_dk = tile >= T && products == HeadProducts::registers;
  if (!write_dv) dv.setZero();
  if (!write_dk || frozen) dk.setZero();
  PairScratch<S> vt(regs ? dh * T : 0);  // v^T [d_h, T]
  if (regs) transpose_into<S>(T, dh, v.data(), v.outerStride(), vt.data());
  PairScratch<S> scratch(std::min(tile, T) * T);
  for (Index i0 = 0; i0 < T; i0 += tile) {
    const Index tb = std::min(tile, T - i0), kc = mask.causal ? i0 + tb : T;
    const auto Pt = P.block(i0, 0, tb, kc);
    const auto dOt = dO.middleRows(i0, tb);
    MatMap<S> dS(scratch.data(), tb, kc);
    if (regs) {  // o = Pd v  ->  dv (+)= Pd^T dO, dP = (dO v^T) .* M
      const S* dt = drop ? drop + i0 * T : nullptr;
      if (write_dv)
        attend_values_backward<DHead, false>(p + i0 * T, tb, kc, T, dt, vt.data(), T, head_view<DHead>(dOt), dv,
                                             dS.data());
      else
        attend_values_backward<DHead, true>(p + i0 * T, tb, kc, T, dt, vt.data(), T, head_view<DHead>(dOt),
                                            head_view_mut<DHead>(dv.topRows(kc)), dS.data());
    } else if (detail::bf16_head_products<S>()) {                                // the same in bf16
      detail::bf16_head_product<true, false>(Pt, dOt, dv.data(), dv.outerStride(), true);
      detail::bf16_head_product<false, true>(dOt, v.topRows(kc), dS.data(), kc, false);
    } else {
      dv.topRows(kc).noalias() += Pt.transpose() * dOt;                          // o = P v  ->  dv += P^T dO
      dS.noalias() = dOt * v.topRows(kc).transpose();                            //          ->  dP = dO v^T
    }
    if (frozen) continue;                                                        // P uniform: dS = 0
    softmax_rows_backward<S>(Pt, dS, dS);                                        // P = softmax(S) (P = 0 -> 0)
    scale.apply(dS);                                                             // S = q k^T * scale
    if (products == HeadProducts::registers) {
      head_product<S, Eigen::Dynamic, DHead>(tb, dh, kc, dS.data(), kc, 1, k.data(), k.outerStride(),
                                             dq.data() + i0 * dq.outerStride(), dq.outerStride());  // dq = dS k
      if (write_dk)
        head_product<S, Eigen::Dynamic, DHead>(kc, dh, tb, dS.data(), 1, kc, q.data() + i0 * q.outerStride(),
                                               q.outerStride(), dk.data(), dk.outerStride());  // dk = dS^T q
      else
        head_product<S, Eigen::Dynamic, DHead, true>(kc, dh, tb, dS.data(), 1, kc, q.data() + i0 * q.outerStride(),
                                                     q.outerStride(), dk.data(), dk.outerStride());  // dk += dS^T q
    } else if (detail::bf16_head_products<S>()) {                                // the same in bf16
      detail::bf16_head_product<false, false>(dS, k.topRows(kc),
                                              dq.data() + i0 * dq.outerStride(),
                                              dq.outerStride(), false);
      detail::bf16_head_product<true, false>(dS, q.middleRows(i0, tb), dk.data(),
                                             dk.outerStride(), true);
    } else {
      dq.middleRows(i0, tb).noalias() = dS * k.topRows(kc);                      //          ->  dq = dS k
      dk.topRows(kc).noalias() += dS.transpose() * q.middleRows(i0, tb);         //          ->  dk += dS^T q
    }
  }
  if (frozen) dq.setZero();  // and dk, zeroed above
}

}  // namespace ops
}  // namespace dea
