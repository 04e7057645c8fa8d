// dea/ops/l1_distance.hpp: pairwise L1 (Manhattan) distances between two sets of row vectors, and the
// backward with the sign convention sgn(0) = 0.
//
// Shapes: U [Tq, d], W [Tk, d], Dst [Tq, Tk] with Dst_ij = sum_c |U_ic - W_jc|.
// No [Tq, Tk, d] difference tensor is ever formed: the forward sweeps (i, c) and accumulates rows of Dst over
// j at once (vectorised over keys, no horizontal reductions; a few query rows by 32 keys kept in registers,
// W transposed into a stack buffer for a 32 x 32 head); the backward sweeps (i, j) and
// accumulates the sign vector of one pair into rows of both gradients (vectorised over channels).
// Summation over c runs in order c = 0, 1, ..., d-1 for every (i, j), so Dst equals a naive triple loop bit
// for bit.
//
// Every matrix must be row-major with contiguous rows (inner stride 1): a Mat, a row block of one, or a Map
// with an outer stride (a head's column slice of a [rows, D] activation).
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"

#include <cmath>

// The kernels' inner loops write one buffer and read others that never overlap it; this tells the compiler so
// (no run-time alias checks inside the (i, j) loops).
#if defined(__clang__)
#define DEA_L1_NO_ALIAS _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define DEA_L1_NO_ALIAS _Pragma("GCC ivdep")
#else
#define DEA_L1_NO_ALIAS
#endif

namespace dea {
namespace detail {
template <class Derived>
void l1_check_rows_contiguous(const Eigen::DenseBase<Derived>& m, const char* what) {
  static_assert(Derived::IsRowMajor || Derived::ColsAtCompileTime == 1,
                "l1_distance: matrices must be row-major (contiguous rows)");
  check(m.cols() <= 1 || m.innerStride() == 1, what, ": expected contiguous rows (inner stride 1), got inner stride ",
        m.innerStride());
}
/// Pointer to row i of a row-major expression with direct access.
template <class Derived>
auto l1_row_ptr(const Eigen::MatrixBase<Derived>& m, Index i) {
  return m.derived().data() + i * m.outerStride();
}
template <class Derived>
auto l1_row_ptr(Eigen::MatrixBase<Derived>& m, Index i) {
  return m.derived().data() + i * m.outerStride();
}
}  // namespace detail

namespace ops {

/// Dst_ij = sum_c |U_ic - W_jc|.   U [Tq, d], W [Tk, d], Dst [Tq, Tk] (written, not accumulated).
/// `Dc` may give d at compile time (as the attention classes' DHead) so the channel loop is unrolled.
template <int Dc = Eigen::Dynamic, class DU, class DW, class DD>
void l1_distance(const Eigen::MatrixBase<DU>& U, const Eigen::MatrixBase<DW>& W, const Eigen::MatrixBase<DD>& Dst_) {
  using S = typename DD::Scalar;
  auto& Dst = const_cast<Eigen::MatrixBase<DD>&>(Dst_);
  const Index tq = U.rows(), tk = W.rows();
  const Index d = Dc == Eigen::Dynamic ? U.cols() : Index(Dc);
  check(U.cols() == d && W.cols() == d, "l1_distance: U and W need ", d, " columns, got ", U.cols(), " and ",
        W.cols());
  check(Dst.rows() == tq && Dst.cols() == tk, "l1_distance: Dst: expected shape [", tq, ", ", tk, "], got [",
        Dst.rows(), ", ", Dst.cols(), "]");
  dea::detail::l1_check_rows_contiguous(U, "l1_distance: U");
  dea::detail::l1_check_rows_contiguous(Dst, "l1_distance: Dst");
  if (tq == 0 || tk == 0) return;
  // Wt [d, Tk]: W transposed, so that channel c of every key is one contiguous row; acc [Tk]: one row of Dst.
  // Both live on the stack up to kLocal elements (a 32 x 32 head), on the heap beyond.
  constexpr Index kLocal = 1024;
  alignas(64) S wt_local[kLocal];
  alignas(64) S acc_local[256];
  Vec<S> wt_heap, acc_heap;
  S* wt = wt_local;
  S* acc = acc_local;
  if (d * tk > kLocal) {
    wt_heap.resize(d * tk);
    wt = wt_heap.data();
  }
  if (tk > 256) {
    acc_heap.resize(tk);
    acc = acc_heap.data();
  }
  Eigen::Map<Mat<S>>(wt, d, tk) = W.transpose();
  // Register blocks of kRows queries x kKeys keys (whole packets), the running sums kept in registers; the
  // rest (leftover rows and keys) one row at a time through acc. Either way D_ij = ((0 + |u_i0 - w_j0|) +
  // |u_i1 - w_j1|) + ... in channel order, the same bits.
  using Packet = typename Eigen::internal::packet_traits<S>::type;
  constexpr int PS = Eigen::internal::packet_traits<S>::size;
  constexpr int kKeys = 32 >= PS ? 32 : PS, NP = kKeys / PS, kRows = NP >= 8 ? 1 : 8 / NP;
  const Index tk_blk = (PS > 1 && kKeys % PS == 0) ? tk / kKeys * kKeys : 0;
  Index i0 = 0;
  if (tk_blk > 0)
    for (; i0 + kRows <= tq; i0 += kRows)
      for (Index j0 = 0; j0 < tk_blk; j0 += kKeys) {
        Packet a[kRows][NP];
        for (int q = 0; q < kRows; ++q)
          for (int p = 0; p < NP; ++p) a[q][p] = Eigen::internal::pset1<Packet>(S(0));
        for (Index c = 0; c < d; ++c) {
          Packet w[NP];
          for (int p = 0; p < NP; ++p) w[p] = Eigen::internal::ploadu<Packet>(wt + c * tk + j0 + p * PS);
          for (int q = 0; q < kRows; ++q) {
            const Packet u = Eigen::internal::pset1<Packet>(dea::detail::l1_row_ptr(U, i0 + q)[c]);
            for (int p = 0; p < NP; ++p)  // D_ij += |u_ic - w_jc|
              a[q][p] = Eigen::internal::padd(a[q][p], Eigen::internal::pabs(Eigen::internal::psub(u, w[p])));
          }
        }
        for (int q = 0; q < kRows; ++q)
          for (int p = 0; p < NP; ++p) Eigen::internal::pstoreu(dea::detail::l1_row_ptr(Dst, i0 + q) + j0 + p * PS, a[q][p]);
      }
  for (Index i = 0; i < tq; ++i) {
    const Index j_begin = i < i0 ? tk_blk : 0;  // rows of the register blocks: only the leftover keys
    if (j_begin == tk) continue;
    const S* ui = dea::detail::l1_row_ptr(U, i);
    for (Index j = j_begin; j < tk; ++j) acc[j] = S(0);
    for (Index c = 0; c < d; ++c) {
      const S u = ui[c];
      const S* w = wt + c * tk;
      DEA_L1_NO_ALIAS
      for (Index j = j_begin; j < tk; ++j) acc[j] += std::abs(u - w[j]);  // D_ij += |u_ic - w_jc|
    }
    S* out = dea::detail::l1_row_ptr(Dst, i);
    for (Index j = j_begin; j < tk; ++j) out[j] = acc[j];
  }
}

/// Backward of l1_distance. With G = dL/dDst [Tq, Tk] it ADDS
///   gU_ic += sum_j G_ij sgn(U_ic - W_jc)      (dD_ij/du_ic =  sgn(u_ic - w_jc))
///   gW_jc -= sum_i G_ij sgn(U_ic - W_jc)      (dD_ij/dw_jc = -sgn(u_ic - w_jc))
/// with sgn(0) = 0 (PyTorch's abs backward; the minimum-norm subgradient of |x| at 0).
/// gU [Tq, d], gW [Tk, d]. Pairs with G_ij = 0 (masked keys) are skipped: they add nothing.
template <int Dc = Eigen::Dynamic, class DU, class DW, class DG, class DGU, class DGW>
void l1_distance_backward(const Eigen::MatrixBase<DU>& U, const Eigen::MatrixBase<DW>& W,
                          const Eigen::MatrixBase<DG>& G, const Eigen::MatrixBase<DGU>& gU_,
                          const Eigen::MatrixBase<DGW>& gW_) {
  using S = typename DGU::Scalar;
  auto& gU = const_cast<Eigen::MatrixBase<DGU>&>(gU_);
  auto& gW = const_cast<Eigen::MatrixBase<DGW>&>(gW_);
  const Index tq = U.rows(), tk = W.rows();
  const Index d = Dc == Eigen::Dynamic ? U.cols() : Index(Dc);
  check(U.cols() == d && W.cols() == d && gU.cols() == d && gW.cols() == d,
        "l1_distance_backward: U, W, gU and gW need ", d, " columns");
  check(G.rows() == tq && G.cols() == tk && gU.rows() == tq && gW.rows() == tk,
        "l1_distance_backward: G: expected shape [", tq, ", ", tk, "], got [", G.rows(), ", ", G.cols(), "]");
  dea::detail::l1_check_rows_contiguous(U, "l1_distance_backward: U");
  dea::detail::l1_check_rows_contiguous(W, "l1_distance_backward: W");
  dea::detail::l1_check_rows_contiguous(gU, "l1_distance_backward: gU");
  dea::detail::l1_check_rows_contiguous(gW, "l1_distance_backward: gW");
  // acc [d]: the running sum_j G_ij sgn(u_ic - w_jc) of row i (a fixed-size local array when Dc is known).
  constexpr int kAcc = Dc == Eigen::Dynamic ? 1 : Dc;
  S acc_fixed[kAcc];
  Vec<S> acc_dyn(Dc == Eigen::Dynamic ? d : 0);
  S* acc = Dc == Eigen::Dynamic ? acc_dyn.data() : acc_fixed;
  for (Index i = 0; i < tq; ++i) {
    const S* ui = dea::detail::l1_row_ptr(U, i);
    for (Index c = 0; c < d; ++c) acc[c] = S(0);
    for (Index j = 0; j < tk; ++j) {
      const S g = G(i, j);
      if (g == S(0)) continue;
      const S* wj = dea::detail::l1_row_ptr(W, j);
      S* gwj = dea::detail::l1_row_ptr(gW, j);
      DEA_L1_NO_ALIAS
      for (Index c = 0; c < d; ++c) {
        const S x = ui[c] - wj[c];
        const S gs = g * (S(x > S(0)) - S(x < S(0)));  // G_ij sgn(u_ic - w_jc), sgn(0) = 0
        acc[c] += gs;                                   // D_ij = sum_c |u_ic - w_jc|  ->  du_ic
        gwj[c] -= gs;                                   //                              ->  dw_jc
      }
    }
    S* gui = dea::detail::l1_row_ptr(gU, i);
    for (Index c = 0; c < d; ++c) gui[c] += acc[c];
  }
}

}  // namespace ops
}  // namespace dea
