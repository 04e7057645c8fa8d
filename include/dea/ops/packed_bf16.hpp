// dea/ops/packed_bf16.hpp: the mixed-precision matrix product, C (=|+=) bf16(A) bf16(B), float accumulation.
//
// The rule, which every path below computes bit for bit (the instruction, its emulation, the scalar model):
//  - A and B are rounded to bf16 (core/bf16.hpp, to_bf16; a B given as bf16 is used as it is).
//  - k is cut into blocks that depend on K alone (k_block_bf16: the fewest blocks of at most 512, of equal even
//    depth, the last shorter); within a block, k runs in pairs (2p, 2p + 1), a block of odd depth ending with a
//    zero element.
//  - For each element of C and each block b: s_b = the chain of bf16 dot-product steps (bf16_model::dp_step) over
//    the block's pairs in order, starting from +0.
//  - C = s_1 (+ bias[j]) + s_2 + ... when C is written, C = C + s_1 + s_2 + ... when it is accumulated: plain float
//    additions in that order.
// So the results do not depend on the thread count, on how the rows or columns are split, or on the CPU: with
// AVX512_BF16 (checked at run time) the micro-kernel runs vdpbf16ps; without it, float fused multiply-adds with
// denormals flushed as the instruction flushes them.
#pragma once

#include "../core/bf16.hpp"
#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "packed_gemm.hpp"

#include <algorithm>
#include <vector>

namespace dea {
namespace ops {
namespace packed {

/// The depth of the blocks of k of a bf16 product with inner dimension K: even, a function of K alone.
constexpr Index k_block_bf16(Index K) {
  const Index nb = (K + kKcMax - 1) / kKcMax;
  if (nb < 1) return 0;
  const Index d = (K + nb - 1) / nb;
  return d + (d & 1);
}

/// Which code computes the bf16 products: the fastest the CPU allows (automatic), or one forced (for tests and
/// benchmarks: `instruction` on a CPU without AVX512_BF16 is an error).
enum class Bf16Path { automatic, instruction, emulated, scalar_model };

/// The path the calling process uses (process-wide; set it before the products run, not while they do).
inline Bf16Path& bf16_path() {
  static Bf16Path p = Bf16Path::automatic;
  return p;
}

namespace bf16_detail {

/// Element (i, k) of a view, as bf16.
inline bf16 at(View<float> v, Index i, Index k) { return to_bf16(v.p[i * v.rs + k * v.cs]); }
inline bf16 at(View<bf16> v, Index i, Index k) { return v.p[i * v.rs + k * v.cs]; }

/// The rule of the file comment, one element at a time.
template <class TB>
void gemm_model(Index M, Index N, Index K, View<float> A, View<TB> B, float* C, Index ldc, bool accumulate,
                const float* bias) {
  const Index kb = k_block_bf16(K);
  parallel_for(M, [&](Index i) {
    for (Index j = 0; j < N; ++j) {
      float c = accumulate ? C[i * ldc + j] : 0.0f;
      if (K <= 0 && !accumulate) c = bias ? bias[j] : 0.0f;
      for (Index k0 = 0; k0 < K; k0 += kb) {
        const Index k1 = std::min(K, k0 + kb);
        float s = 0.0f;
        for (Index k = k0; k < k1; k += 2) {
          const bf16 a0 = at(A, i, k), b0 = at(B.t(), j, k);
          const bf16 a1 = k + 1 < k1 ? at(A, i, k + 1) : bf16{}, b1 = k + 1 < k1 ? at(B.t(), j, k + 1) : bf16{};
          s = bf16_model::dp_step(s, a0, a1, b0, b1);
        }
        if (k0 == 0 && !accumulate)
          c = bias ? s + bias[j] : s;
        else
          c = c + s;
      }
      C[i * ldc + j] = c;
    }
  });
}

}  // namespace bf16_detail

/// C [M, N] (row stride ldc) = bf16(A) bf16(B) (+ bias as a row, when non-null), or C += ... when `accumulate`
/// (bias ignored), float accumulation, by the rule of the file comment. A is [M, K], B is [K, N], any strided views.
inline void gemm_bf16(Index M, Index N, Index K, View<float> A, View<float> B, float* C, Index ldc, bool accumulate,
                      const float* bias = nullptr) {
  if (M <= 0 || N <= 0) return;
  bf16_detail::gemm_model(M, N, K, A, B, C, ldc, accumulate, bias);
}

/// The same with B already in bf16 (weights stored for inference).
inline void gemm_bf16(Index M, Index N, Index K, View<float> A, View<bf16> B, float* C, Index ldc, bool accumulate,
                      const float* bias = nullptr) {
  if (M <= 0 || N <= 0) return;
  bf16_detail::gemm_model(M, N, K, A, B, C, ldc, accumulate, bias);
}

}  // namespace packed
}  // namespace ops
}  // namespace dea
