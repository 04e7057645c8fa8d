// dea/ops/gemm.hpp: matrix products whose results do not depend on the thread count.
//
// float and double products of plain (direct-access) matrices run through the library's packed product
// (packed_gemm.hpp): B is packed once and shared by the threads, and every element is summed in an order
// fixed by the inner dimension alone. Anything else (other scalar types, lazy expressions) runs Eigen's
// product on row blocks whose boundaries depend only on the sizes, each block single-threaded (for_blocks), so
// every element is computed by the same sequence of operations for 1 and N threads there too (Eigen's own
// multi-threaded GEMM changes its blocking with the thread count).
#pragma once

#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "packed_bf16.hpp"
#include "packed_gemm.hpp"

#include <type_traits>

namespace dea {
namespace ops {

/// Number of row blocks for a product with `rows` output rows: a function of the size alone.
inline Index gemm_row_blocks(Index rows) {
  constexpr Index kMinRows = 32;
  Index nb = rows / kMinRows;
  if (nb > 16) nb = 16;
  return nb < 1 ? 1 : nb;
}

/// Row blocks of a weight-gradient product C += A^T B: fewer and larger than gemm_row_blocks, because every block
/// packs all of B [N, K] again (N = the batch's rows, the largest dimension there), so 16 blocks would pack it 16
/// times. Still a function of the size alone.
inline Index gemm_tn_row_blocks(Index rows) {
  constexpr Index kMinRows = 128;
  Index nb = rows / kMinRows;
  if (nb > 4) nb = 4;
  return nb < 1 ? 1 : nb;
}

/// Runs f(r0, nr) over `nb` fixed row blocks of [0, rows) (sizes differ by at most one row), in parallel. Each
/// block is one thread's work: Eigen's products inside f run single-threaded also when there is one block and so
/// no parallel region (ScopedSerialEigen), so their bits and speed do not depend on the thread count.
template <class F>
void for_blocks(Index rows, Index nb, F&& f) {
  const Index base = rows / nb, extra = rows % nb;
  parallel_for(nb, [&](Index b) {
    const Index r0 = b * base + (b < extra ? b : extra);
    const Index nr = base + (b < extra ? 1 : 0);
    if (nr > 0) {
      const ScopedSerialEigen serial;
      f(r0, nr);
    }
  });
}

/// Runs f(r0, nr) over the fixed row blocks of [0, rows), in parallel.
template <class F>
void for_row_blocks(Index rows, F&& f) {
  for_blocks(rows, gemm_row_blocks(rows), f);
}

namespace gemm_impl {

/// True when the packed product can read (or write) this expression: float or double with direct access.
template <class D>
constexpr bool packable() {
  return packed::supported<typename D::Scalar>() && (int(D::Flags) & Eigen::DirectAccessBit) != 0;
}

/// The strided view of a direct-access expression.
template <class D>
packed::View<typename D::Scalar> view_of(const Eigen::MatrixBase<D>& m) {
  const D& d = m.derived();
  if (D::IsRowMajor) return {d.data(), Index(d.outerStride()), Index(d.innerStride())};
  return {d.data(), Index(d.innerStride()), Index(d.outerStride())};
}

/// C (=|+=) op(A) op(B) (+ bias as a row, only when C is row-major) with the packed product, op = transpose when
/// TA / TB. False (nothing done) when an operand is not float/double with direct access, when C's elements are not
/// contiguous along a row or a column, or when the product has fewer than packed::kMinRows rows (the choice
/// depends on the types and sizes alone, and on ThreadSettings::batch_invariant_products, which lowers the bound
/// to one row): the caller then runs Eigen.
template <bool TA, bool TB, class DA, class DB, class DC>
bool try_packed(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, Eigen::MatrixBase<DC>& C,
                bool accumulate, const typename DC::Scalar* bias) {
  if constexpr (packable<DA>() && packable<DB>() && packable<DC>()) {
    using S = typename DC::Scalar;
    const Index M = TA ? A.cols() : A.rows(), K = TA ? A.rows() : A.cols(), N = TB ? B.rows() : B.cols();
    const packed::View<S> a = TA ? view_of(A).t() : view_of(A), b = TB ? view_of(B).t() : view_of(B);
    DC& c = C.derived();
    if (c.innerStride() != 1 && M > 1 && N > 1) return false;
    if constexpr (std::is_same<S, float>::value) {
      if (thread_settings().product_precision == Precision::bf16) {  // any row count: one rule for every product
        if (DC::IsRowMajor || M == 1)
          packed::gemm_bf16(M, N, K, a, b, c.data(), DC::IsRowMajor ? Index(c.outerStride()) : N, accumulate, bias);
        else if (bias)
          return false;
        else  // column-major C: C^T = B^T A^T (a bf16 step is symmetric in its two operands: the same bits)
          packed::gemm_bf16(N, M, K, b.t(), a.t(), c.data(), Index(c.outerStride()), accumulate, nullptr);
        return true;
      }
    }
    // a few rows: Eigen is faster (unless the rows must not depend on their batch: ThreadSettings)
    const Index min_rows = thread_settings().batch_invariant_products ? 1 : packed::kMinRows;
    if ((DC::IsRowMajor || M == 1 ? M : N) < min_rows) return false;
    if (DC::IsRowMajor || M == 1) {
      packed::gemm<S>(M, N, K, a, b, c.data(), DC::IsRowMajor ? Index(c.outerStride()) : N, accumulate, bias);
      return true;
    }
    if (bias) return false;
    // column-major C: C^T = B^T A^T is row-major with the same strides
    packed::gemm<S>(N, M, K, b.t(), a.t(), c.data(), Index(c.outerStride()), accumulate, nullptr);
    return true;
  } else {
    return false;
  }
}

}  // namespace gemm_impl

/// C = A * B into a C that already has A.rows() x B.cols() (a matrix or a Map of a workspace: no resize).
template <class DA, class DB, class DC>
void gemm_into(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, Eigen::MatrixBase<DC>& C) {
  check_matrix(C, A.rows(), B.cols(), "gemm_into: C");
  if (gemm_impl::try_packed<false, false>(A, B, C, false, nullptr)) return;
  for_row_blocks(A.rows(), [&](Index r0, Index nr) { C.middleRows(r0, nr).noalias() = A.middleRows(r0, nr) * B; });
}

/// C += A * B into a C that already has A.rows() x B.cols(). With the packed product and an inner dimension of at
/// most packed::kKcMax this gives the same bits as computing T = A * B and then C += T (each element is C + s, s
/// the product's one k-ordered chain), without the temporary and the extra pass over C.
template <class DA, class DB, class DC>
void gemm_add_into(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, Eigen::MatrixBase<DC>& C) {
  check_matrix(C, A.rows(), B.cols(), "gemm_add_into: C");
  if (gemm_impl::try_packed<false, false>(A, B, C, true, nullptr)) return;
  for_row_blocks(A.rows(), [&](Index r0, Index nr) { C.middleRows(r0, nr).noalias() += A.middleRows(r0, nr) * B; });
}

/// C = A * B  (C resized to A.rows() x B.cols()).
template <class S, class DA, class DB>
void gemm(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, Mat<S>& C) {
  C.resize(A.rows(), B.cols());
  gemm_into(A, B, C);
}

/// C += A^T * B, with A [N, M], B [N, K], C [M, K] (a weight gradient: reduction over the N rows).
template <class S, class DA, class DB, class DC>
void gemm_tn_add(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, Eigen::MatrixBase<DC>& C) {
  check_matrix(C, A.cols(), B.cols(), "gemm_tn_add: C");
  if (gemm_impl::try_packed<true, false>(A, B, C, true, nullptr)) return;
  for_blocks(C.rows(), gemm_tn_row_blocks(C.rows()), [&](Index r0, Index nr) {
    C.middleRows(r0, nr).noalias() += A.middleCols(r0, nr).transpose() * B;
  });
}

}  // namespace ops
}  // namespace dea
