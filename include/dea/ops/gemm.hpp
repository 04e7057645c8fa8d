// dea/ops/gemm.hpp: matrix products split into row blocks over the library's threads.
//
// The block boundaries depend only on the sizes, never on the thread count, and Eigen runs each block's
// product single-threaded (it does not parallelise inside a parallel region). So every element of the result
// is computed by the same sequence of operations whatever the number of threads: results are bitwise
// identical for 1 and N threads (Eigen's own multi-threaded GEMM changes its blocking with the thread count).
#pragma once

#include "../core/parallel.hpp"
#include "../core/tensor.hpp"

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

/// Runs f(r0, nr) over `nb` fixed row blocks of [0, rows) (sizes differ by at most one row), in parallel.
template <class F>
void for_blocks(Index rows, Index nb, F&& f) {
  const Index base = rows / nb, extra = rows % nb;
  parallel_for(nb, [&](Index b) {
    const Index r0 = b * base + (b < extra ? b : extra);
    const Index nr = base + (b < extra ? 1 : 0);
    if (nr > 0) f(r0, nr);
  });
}

/// Runs f(r0, nr) over the fixed row blocks of [0, rows), in parallel.
template <class F>
void for_row_blocks(Index rows, F&& f) {
  for_blocks(rows, gemm_row_blocks(rows), f);
}

/// C = A * B into a C that already has A.rows() x B.cols() (a matrix or a Map of a workspace: no resize).
template <class DA, class DB, class DC>
void gemm_into(const Eigen::MatrixBase<DA>& A, const Eigen::MatrixBase<DB>& B, Eigen::MatrixBase<DC>& C) {
  check_matrix(C, A.rows(), B.cols(), "gemm_into: C");
  for_row_blocks(A.rows(), [&](Index r0, Index nr) { C.middleRows(r0, nr).noalias() = A.middleRows(r0, nr) * B; });
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
  for_blocks(C.rows(), gemm_tn_row_blocks(C.rows()), [&](Index r0, Index nr) {
    C.middleRows(r0, nr).noalias() += A.middleCols(r0, nr).transpose() * B;
  });
}

}  // namespace ops
}  // namespace dea
