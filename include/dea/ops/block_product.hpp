// dea/ops/block_product.hpp: the small single-threaded products of a kernel that runs inside a parallel region
// (one attention (b, h) pair per thread), written once, whichever product computes them.
//
// Where the library's packed product exists for the scalar type (ops/packed_gemm.hpp, with buffers aligned as its
// panels need), these run it; elsewhere they run Eigen's product on strided maps. The caller writes each product
// once and never sees the choice, nor the layout it implies:
//  - product():      C [M, N] (=|+=) A B for two strided views, A packed into Ap, B streamed panel by panel;
//  - SharedRhs:      a right-hand side B [K, N] that many products share (the keys or values of a head, used by
//                    every query block): packed once, then each product C (=|+=) A[:, 0:k] B[0:k, 0:n] reads it;
//  - TnAccumulator:  an accumulator C [N, D] += X^T Y for a wide X [m, N] and a narrow Y [m, D] (the key and
//                    value gradients of a head): the packed product keeps C transposed, [D, N], so that the narrow
//                    side is its packed A; at() reads an element whatever the layout.
// SharedRhs and TnAccumulator take the width of their narrow side when it is known at compile time (W; an attention
// head's width, DHead): where W is one vector of the instruction set (16 floats or 8 doubles with AVX-512, whose
// default register tile is two vectors wide, so half of it would be padding), the packed product runs a tile of 16
// rows by one vector, which fits the head exactly. The tile decides which elements share registers, not the order
// each element is summed in, so the results are the same bits with either tile.
// Every function allocates nothing and throws nothing (the caller sized the buffers: the *_size functions). The
// bits of each product are those of the packed product (or of Eigen's) on the same operands, so a caller that
// switches to these helpers changes no result.
#pragma once

#include "../core/tensor.hpp"
#include "../core/workspace.hpp"
#include "packed_gemm.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <type_traits>

namespace dea {
namespace ops {

/// True where these products run the packed product (float and double with vector extensions, and buffers
/// aligned to kWorkspaceAlign suit its panels); false: Eigen.
template <class S>
constexpr bool packed_products() {
  return packed::supported<S>() && kWorkspaceAlign % packed::panel_align<S>() == 0;
}

namespace block_product_detail {
#if DEA_PACKED_GEMM && defined(__AVX512F__)
/// The tile for a narrow side of compile-time width W (see the file comment).
template <class S, int W>
using KernelFor = std::conditional_t<W == packed::DefaultKernel<S>::L,
                                     packed::Kernel<S, int(sizeof(typename packed::DefaultKernel<S>::V)), 16, 1>,
                                     packed::DefaultKernel<S>>;
/// The largest packed A of any tile KernelFor picks.
template <class S>
constexpr Index a_size(Index M, Index K) {
  const Index a = packed::whole_a_size<S>(M, K);
  const Index b = packed::whole_a_size<S, KernelFor<S, packed::DefaultKernel<S>::L>>(M, K);
  return a > b ? a : b;
}
#elif DEA_PACKED_GEMM
template <class S, int W>
using KernelFor = packed::DefaultKernel<S>;
template <class S>
constexpr Index a_size(Index M, Index K) {
  return packed::whole_a_size<S>(M, K);
}
#else
template <class S, int W>
using KernelFor = void;  // (never used: packed_products() is false)
template <class S>
constexpr Index a_size(Index M, Index K) {
  return packed::whole_a_size<S>(M, K);
}
#endif

template <class S>
using RowMajorMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Strides = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;

/// C [M, N] (row stride ldc) (=|+=) A [M, K] B [K, N] through Eigen.
template <class S>
void eigen_product(Index M, Index N, Index K, packed::View<S> A, packed::View<S> B, S* C, Index ldc, bool acc) {
  using SMap = Eigen::Map<const RowMajorMat<S>, 0, Strides>;
  Eigen::Map<RowMajorMat<S>, 0, Eigen::OuterStride<>> c(C, M, N, Eigen::OuterStride<>(ldc));
  const SMap a(A.p, M, K, Strides(A.rs, A.cs)), b(B.p, K, N, Strides(B.rs, B.cs));
  if (acc)
    c.noalias() += a * b;
  else
    c.noalias() = a * b;
}
}  // namespace block_product_detail

/// Values of the packed A buffer (Ap) a product of at most M rows and inner dimension K needs (with any tile).
template <class S>
constexpr Index product_a_size(Index M, Index K) {
  return block_product_detail::a_size<S>(M, K);
}
/// Values of the B panel buffer (Bpan) of product() for inner dimension K.
template <class S>
constexpr Index product_panel_size(Index K) {
  return packed::stream_b_size<S>(K);
}

/// C [M, N] (row stride ldc) = A B, or += when `acc`, A [M, K] and B [K, N] strided views (a transpose is free).
/// Ap: product_a_size(M, K) values; Bpan: product_panel_size(K) values, aligned to kWorkspaceAlign.
template <class S>
void product(Index M, Index N, Index K, packed::View<S> A, packed::View<S> B, S* C, Index ldc, bool acc, S* Ap,
             S* Bpan) {
  if constexpr (packed_products<S>())
    packed::gemm_stream_b<S>(M, N, K, A, B, C, ldc, acc, Ap, Bpan);
  else
    block_product_detail::eigen_product<S>(M, N, K, A, B, C, ldc, acc);
}

/// A right-hand side B [K, N] shared by many products: packed once into a buffer of the caller's (packed
/// products), or read where it lies (Eigen). W: N when it is known at compile time (the tile), else Dynamic.
template <class S, int W = Eigen::Dynamic>
class SharedRhs {
  using Kern = block_product_detail::KernelFor<S, W>;

public:
  /// Values of the buffer set() packs a [K, N] B into (0 where nothing is packed); no more than with W Dynamic.
  static constexpr Index size(Index K, Index N) { return packed::whole_b_size<S>(K, N); }

  /// B [K, N], a strided view that must stay valid while this is used; `buf` holds size(K, N) values, aligned to
  /// kWorkspaceAlign (unused without packed products).
  void set(Index K, Index N, packed::View<S> B, S* buf) {
    K_ = K;
    N_ = N;
    B_ = B;
    Bp_ = buf;
    if constexpr (packed_products<S>()) packed::pack_b_whole<S, Kern>(K, N, B, buf);
  }

  /// C [M, n] (row stride ldc) = A [M, k] B[0:k, 0:n], or += when `acc`, for the first n <= N columns or the first
  /// k <= K rows of B (one of them whole: n == N or k == K). With k < K the columns [k, K) of A must hold zeros:
  /// a B packed in more than one block of depth is read whole. Ap: product_a_size(M, K) values.
  void product(Index M, Index n, Index k, packed::View<S> A, S* C, Index ldc, bool acc, S* Ap) const {
    if constexpr (packed_products<S>()) {
      if (k == K_)
        packed::gemm_whole_b_cols<S, Kern>(M, n, K_, A, Bp_, N_, C, ldc, acc, Ap);
      else if (K_ <= packed::kKcMax)
        packed::gemm_whole_b_rows<S, Kern>(M, N_, k, A, Bp_, K_, C, ldc, acc, Ap);
      else
        packed::gemm_whole_b<S, Kern>(M, N_, K_, A, Bp_, C, ldc, acc, Ap);
    } else {
      block_product_detail::eigen_product<S>(M, n, k, A, B_, C, ldc, acc);
    }
  }

private:
  Index K_ = 0, N_ = 0;
  packed::View<S> B_{nullptr, 0, 0};
  const S* Bp_ = nullptr;
};

/// An accumulator C [N, D] += X^T Y over products with a wide X [m, N] and a narrow Y [m, D]. Its storage
/// (N * D values of the caller's) is [D, N] (C transposed: the narrow Y^T is the packed product's A) with packed
/// products and [N, D] with Eigen; at() and the functions here are the only readers. W: D when it is known at
/// compile time (the tile), else Dynamic.
template <class S, int W = Eigen::Dynamic>
class TnAccumulator {
  using Kern = block_product_detail::KernelFor<S, W>;

public:
  /// True when the storage is C^T [D, N].
  static constexpr bool transposed = packed_products<S>();

  TnAccumulator(S* c, Index N, Index D) : c_(c), N_(N), D_(D) {}

  /// C = 0.
  void clear() const { std::fill(c_, c_ + N_ * D_, S(0)); }
  /// C[0:n, :] += X^T Y, X [m, n] (columns past n unread), Y [m, D]; Ap: product_a_size(max(D, n), m) values,
  /// Bpan: product_panel_size(m) values.
  void add_tn(Index n, Index m, packed::View<S> X, packed::View<S> Y, S* Ap, S* Bpan) const {
    if constexpr (transposed)  // C^T [D, n] += Y^T X
      packed::gemm_stream_b<S, Kern>(D_, n, m, Y.t(), X, c_, N_, true, Ap, Bpan);
    else  // C [n, D] += X^T Y
      ops::product<S>(n, D_, m, X.t(), Y, c_, D_, true, Ap, Bpan);
  }
  /// C(j, d).
  S at(Index j, Index d) const { return transposed ? c_[d * N_ + j] : c_[j * D_ + d]; }

private:
  S* c_;
  Index N_, D_;
};

}  // namespace ops
}  // namespace dea
