// dea/deberta/packed_weights.hpp: a weight of y = x W^T + b packed once for the library's float / double product.
//
// The packed product (ops/packed_gemm.hpp) copies B = W^T into panels of NR columns at every call: for a frozen
// model that copy is the same in every forward (about a tenth of the product time of a DeBERTa-base forward).
// PackedWeight holds that copy made once (ops::packed::pack_b_whole's layout, the blocks of k of the product), and
// linear_packed runs the product's own loop on it: the same micro-kernel, the same blocks of k, the same bias rule,
// so every element gets the operations, hence the bits, of ops::linear_forward(x, W, b, y). Where linear_forward
// would not take the packed path (fewer than ops::packed::kMinRows rows outside batch-invariant products, bf16
// products, a compiler without vector extensions) linear_packed calls it on the float weight, or on a weight
// unpacked from the copy when the float values were released (the same values, so the same bits).
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "../ops/linear.hpp"
#include "../ops/packed_gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

namespace dea {
namespace deberta {

/// A weight W [out, in] (nn.Linear layout) packed as B = W^T [in, out] for the packed product. Empty when
/// default-constructed (or when the packed product is not available: then nothing is packed).
template <class S>
class PackedWeight {
public:
  PackedWeight() = default;
  /// Packs W [out, in] (row-major).
  PackedWeight(const S* W, Index out, Index in) : out_(out), in_(in) {
#if DEA_PACKED_GEMM
    if constexpr (ops::packed::supported<S>()) {
      const Index n = ops::packed::whole_b_size<S>(in, out);
      const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(S) + 63) / 64 * 64;
      S* p = static_cast<S*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
      check(p != nullptr, "deberta::PackedWeight: out of memory for a ", bytes, "-byte packed weight");
      data_.reset(p);
      values_ = n;
      ops::packed::pack_b_whole<S>(in, out, ops::packed::View<S>{W, 1, in}, p);
    }
#endif
  }

  bool empty() const { return values_ == 0; }
  Index out() const { return out_; }
  Index in() const { return in_; }
  const S* data() const { return data_.get(); }
  /// Bytes of the packed copy (its last panel padded to NR columns).
  std::size_t bytes() const { return static_cast<std::size_t>(values_) * sizeof(S); }

  /// W [out, in] as it was packed (every value read back from the copy).
  Mat<S> unpacked() const {
    Mat<S> W(out_, in_);
#if DEA_PACKED_GEMM
    if constexpr (ops::packed::supported<S>()) {
      constexpr Index NR = ops::packed::DefaultKernel<S>::NR;
      const Index K = in_, N = out_, kc_max = ops::packed::k_block(K), Np = (N + NR - 1) / NR * NR;
      for (Index pc = 0; pc < K; pc += kc_max) {
        const Index kc = std::min(kc_max, K - pc);
        for (Index n0 = 0; n0 < N; n0 += NR) {
          const S* panel = data_.get() + pc * Np + n0 * kc;  // [kc][NR]
          for (Index k = 0; k < kc; ++k)
            for (Index j = 0; j < std::min<Index>(NR, N - n0); ++j) W(n0 + j, pc + k) = panel[k * NR + j];
        }
      }
    }
#endif
    return W;
  }

private:
  struct Free {
    void operator()(S* p) const { std::free(p); }
  };
  std::unique_ptr<S, Free> data_;
  Index values_ = 0, out_ = 0, in_ = 0;
};

namespace detail {

/// True when ops::linear_forward on x with `rows` rows takes the packed path (ops/gemm.hpp, try_packed).
template <class S>
bool packed_path(Index rows) {
  if (!ops::packed::supported<S>()) return false;
  if (std::is_same<S, float>::value && thread_settings().product_precision == Precision::bf16) return false;
  const Index min_rows = thread_settings().batch_invariant_products ? 1 : ops::packed::kMinRows;
  return rows >= min_rows;
}

#if DEA_PACKED_GEMM
/// C [M, N] (row stride ldc) = A B + bias for a row-major A [M, K] (row stride lda) and B packed whole in Bp: the loop
/// of ops::packed::gemm without its packing of B. Each thread keeps the same tiles for every block of k of a block of
/// columns (the shares depend on the tile count alone), so no barrier is needed and every element is
/// bias + s_1 + s_2 + ..., its k-ordered chains in the product's blocks of k: gemm's bits.
template <class S>
void gemm_prepacked(Index M, Index N, Index K, const S* A, Index lda, const S* Bp, S* C, Index ldc, const S* bias) {
  using Kern = ops::packed::DefaultKernel<S>;
  constexpr int MR = Kern::MR, NR = Kern::NR;
  if (M <= 0 || N <= 0) return;
  const Index kc_max = ops::packed::k_block(K), nc = ops::packed::n_block<S, NR>(K, N);
  const Index Np = (N + NR - 1) / NR * NR, panels_m = (M + MR - 1) / MR;
  const bool par = !in_parallel() && 2.0 * double(M) * double(N) * double(K) > 4 * kParallelMinFlops;
  parallel_team(par ? num_threads() : 1, [&](int tid, int team) {
    for (Index jc = 0; jc < N; jc += nc) {
      const Index np = (std::min(nc, N - jc) + NR - 1) / NR;
      const Index tiles = panels_m * np, u0 = tiles * tid / team, u1 = tiles * (tid + 1) / team;
      for (Index pc = 0; pc < K; pc += kc_max) {
        const Index kc = std::min(kc_max, K - pc);
        const S* const Bblk = Bp + pc * Np + jc * kc;  // the block of k at pc * Np, panel n0 at n0 * kc
        for (Index u = u0; u < u1; ++u) {
          const Index q = u / np, p = u % np, m0 = q * MR, n0 = jc + p * NR;
          Kern::tile_rows(kc, A + m0 * lda + pc, lda, Bblk + p * kc * NR, C + m0 * ldc + n0, ldc,
                          int(std::min<Index>(MR, M - m0)), int(std::min<Index>(NR, N - n0)), pc == 0,
                          bias ? bias + n0 : nullptr);
        }
      }
    }
  });
}
#endif

}  // namespace detail

/// y = x W^T + b (b may be null; y resized) with W's packed copy `pw` when there is one and the product would be
/// packed, else ops::linear_forward on the float weight `w` (or, when its values were released, on pw unpacked):
/// in every case the bits of ops::linear_forward(x, w, b, y).
template <class S, class DX>
void linear_packed(const Eigen::MatrixBase<DX>& x, const Param<S>& w, const PackedWeight<S>& pw, const S* b,
                   Mat<S>& y) {
#if DEA_PACKED_GEMM
  if (!pw.empty() && detail::packed_path<S>(x.rows()) && x.derived().innerStride() == 1 && x.cols() > 0) {
    check(x.cols() == pw.in(), "deberta::linear_packed: x has ", x.cols(), " columns, the weight expects ", pw.in());
    y.resize(x.rows(), pw.out());
    detail::gemm_prepacked<S>(x.rows(), pw.out(), pw.in(), x.derived().data(), Index(x.derived().outerStride()),
                              pw.data(), y.data(), Index(y.outerStride()), b);
    return;
  }
#endif
  if (w.value.size() > 0) {
    ops::linear_forward<S>(x, w.mat(), b, y);
    return;
  }
  check(!pw.empty(), "deberta::linear_packed: ", w.name, " has neither float values nor a packed copy");
  const Mat<S> W = pw.unpacked();
  ops::linear_forward<S>(x, ConstMatMap<S>(W.data(), W.rows(), W.cols()), b, y);
}

}  // namespace deberta
}  // namespace dea
