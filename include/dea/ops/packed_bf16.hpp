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
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

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

/// Which code computes the bf16 products: the fastest the CPU allows (automatic: the instruction with AVX512_BF16,
/// else its emulation with AVX-512 fused multiply-adds, else with AVX2's, else the scalar model), or one forced (for
/// tests and benchmarks; forcing one the CPU cannot run is an error).
enum class Bf16Path { automatic, instruction, emulated, emulated_avx2, scalar_model };

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

namespace bf16_detail {

using u32 = std::uint32_t;

/// The register tile, the same on every CPU (it fixes the packed layout, not the results): 12 rows by 32 columns,
/// two AVX-512 vectors of 16 float lanes per row, 24 accumulators.
constexpr int MR = 12, NR = 32;

/// The bf16 bits of the float with bits u (to_bf16 without a branch, so that loops over it vectorise).
inline u32 bf16_bits(u32 u) {
  const u32 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r;
}
inline u32 bits_of(float f) { return bf16_bits(float_bits(f)); }
inline u32 bits_of(bf16 h) { return h.bits; }
/// One packed pair: the even element in the lower half, the odd one in the upper half (the instruction's order).
template <class T>
u32 pair(T lo, T hi) {
  return bits_of(lo) | (bits_of(hi) << 16);
}

/// Rows [r0, r0 + rows) of X [., K], pairs of its columns [k0, k1), as a panel [pairs][W] (rows past `rows` and the
/// missing odd element of a block of odd depth are zero). A panel of A is pack_panel<MR>(A, ...), one of B is
/// pack_panel<NR>(B^T, ...).
template <int W, class T>
void pack_panel(View<T> X, Index r0, int rows, Index k0, Index k1, u32* __restrict dst) {
  const Index pairs = (k1 - k0 + 1) / 2, full = (k1 - k0) / 2;
  if (X.rs == 1) {  // the rows of one k are contiguous (a transposed A, a row-major B): read a pair of lines at once
    for (Index p = 0; p < full; ++p) {
      const T* lo = X.p + r0 + (k0 + 2 * p) * X.cs;
      const T* hi = lo + X.cs;
      u32* d = dst + p * W;
      for (int i = 0; i < rows; ++i) d[i] = pair(lo[i], hi[i]);
      for (int i = rows; i < W; ++i) d[i] = 0;
    }
  } else {  // a row of X at a time (B = W^T: a row of the weight, its pairs contiguous when X.cs == 1)
    for (int i = 0; i < rows; ++i) {
      const T* src = X.p + (r0 + i) * X.rs + k0 * X.cs;
      if (X.cs == 1)
        for (Index p = 0; p < full; ++p) dst[p * W + i] = pair(src[2 * p], src[2 * p + 1]);
      else
        for (Index p = 0; p < full; ++p) dst[p * W + i] = pair(src[2 * p * X.cs], src[(2 * p + 1) * X.cs]);
    }
    for (int i = rows; i < W; ++i)
      for (Index p = 0; p < full; ++p) dst[p * W + i] = 0;
  }
  if (pairs > full) {
    u32* d = dst + full * W;
    for (int i = 0; i < rows; ++i) d[i] = bits_of(X.p[(r0 + i) * X.rs + (k1 - 1) * X.cs]);
    for (int i = rows; i < W; ++i) d[i] = 0;
  }
}

/// Columns [n0, n0 + cols) of B, pairs of rows [k0, k1), as a panel [pairs][NR].
template <class T>
void pack_b(View<T> B, Index k0, Index k1, Index n0, int cols, u32* __restrict dst) {
  pack_panel<NR>(B.t(), n0, cols, k0, k1, dst);
}

/// A tile's operands: A either packed ([pairs][MR] dwords, `a`) or read in place from a row-major copy of dwords
/// (`Direct`: row i at a + i * lda), B packed ([pairs][NR], 64-byte aligned), and where its result goes.
struct TileArgs {
  Index pairs;
  const u32* a;
  Index lda;
  const u32* b;
  float* c;
  Index ldc;
  int rows, cols;
  bool init;
  const float* bias;
};

/// c (rows x cols corner of a tile, row stride ldc) = t (+ bias) when init, else c + t: plain float additions,
/// outside any flushing mode (the same code after every kernel).
inline void write_tile(const float* __restrict t, const TileArgs& x) {
  for (int i = 0; i < x.rows; ++i) {
    float* ci = x.c + i * x.ldc;
    const float* ti = t + i * NR;
    if (!x.init)
      for (int j = 0; j < x.cols; ++j) ci[j] = ci[j] + ti[j];
    else if (x.bias)
      for (int j = 0; j < x.cols; ++j) ci[j] = ti[j] + x.bias[j];
    else
      for (int j = 0; j < x.cols; ++j) ci[j] = ti[j];
  }
}

/// Where row i of a tile's A starts: element (i, p) is ar[i][p] in place (Direct), ar[i][p * MR] packed. In place,
/// rows past x.rows read row x.rows - 1 again (their results are discarded), so nothing past A is read.
template <bool Direct>
inline void row_pointers(const TileArgs& x, const u32* (&ar)[MR]) {
  for (int i = 0; i < MR; ++i) ar[i] = Direct ? x.a + (i < x.rows ? i : x.rows - 1) * x.lda : x.a + i;
}

/// Element (i, p) of a tile's A.
template <bool Direct>
inline u32 a_at(const TileArgs& x, int i, Index p) {
  return Direct ? x.a[i * x.lda + p] : x.a[p * MR + i];
}

/// The scalar model on one tile.
template <bool Direct>
void tile_model(const TileArgs& x) {
  alignas(64) float t[MR * NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = 0.0f;
      if (i < x.rows)
        for (Index p = 0; p < x.pairs; ++p) {
          const u32 u = a_at<Direct>(x, i, p), v = x.b[p * NR + j];
          s = bf16_model::dp_step(s, bf16{std::uint16_t(u)}, bf16{std::uint16_t(u >> 16)}, bf16{std::uint16_t(v)},
                                  bf16{std::uint16_t(v >> 16)});
        }
      t[i * NR + j] = s;
    }
  write_tile(t, x);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DEA_BF16_X86 1

/// The accumulators' way out, AVX-512: a whole tile straight to c, a cut one through write_tile.
__attribute__((target("avx512f"))) inline void store_tile(__m512 (&acc)[MR][2], const TileArgs& x) {
  if (x.rows == MR && x.cols == NR) {
    for (int i = 0; i < MR; ++i) {
      float* ci = x.c + i * x.ldc;
      __m512 v0 = acc[i][0], v1 = acc[i][1];
      if (!x.init) {
        v0 = _mm512_add_ps(_mm512_loadu_ps(ci), v0);
        v1 = _mm512_add_ps(_mm512_loadu_ps(ci + 16), v1);
      } else if (x.bias) {
        v0 = _mm512_add_ps(v0, _mm512_loadu_ps(x.bias));
        v1 = _mm512_add_ps(v1, _mm512_loadu_ps(x.bias + 16));
      }
      _mm512_storeu_ps(ci, v0);
      _mm512_storeu_ps(ci + 16, v1);
    }
    return;
  }
  alignas(64) float t[MR * NR];
  for (int i = 0; i < MR; ++i) {
    _mm512_store_ps(t + i * NR, acc[i][0]);
    _mm512_store_ps(t + i * NR + 16, acc[i][1]);
  }
  write_tile(t, x);
}

/// The tile with vdpbf16ps.
template <bool Direct>
__attribute__((target("avx512f,avx512bf16"))) void tile_instruction(const TileArgs& x) {
  const u32* ar[MR];
  row_pointers<Direct>(x, ar);
  const u32* const a0 = x.a;  // packed: element (i, p) at a0[p * MR + i], constant offsets from one register
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const u32* b = x.b;
  for (Index p = 0; p < x.pairs; ++p, b += NR) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int((Direct ? ar[i][p] : a0[p * MR + i])));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
    }
  }
  store_tile(acc, x);
  _mm256_zeroupper();  // (leave no dirty upper register halves to the caller's SSE code)
}

/// The same chains with AVX-512F fused multiply-adds: each pair's odd element first, denormals flushed by the
/// MXCSR's DAZ and FTZ bits, set for the accumulation only.
template <bool Direct>
__attribute__((target("avx512f"))) void tile_emulated(const TileArgs& x) {
  const u32* ar[MR];
  row_pointers<Direct>(x, ar);
  const u32* const a0 = x.a;  // packed: element (i, p) at a0[p * MR + i], constant offsets from one register
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
  const __m512i hi_mask = _mm512_set1_epi32(int(0xffff0000u));
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const u32* b = x.b;
  for (Index p = 0; p < x.pairs; ++p, b += NR) {
    // (the shifts masked: GCC 12 warns of an uninitialised value in the plain form)
    const __m512i w0 = _mm512_load_si512(b), w1 = _mm512_load_si512(b + 16);
    const __m512 b0h = _mm512_castsi512_ps(_mm512_and_si512(w0, hi_mask));
    const __m512 b0l = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, w0, 16));
    const __m512 b1h = _mm512_castsi512_ps(_mm512_and_si512(w1, hi_mask));
    const __m512 b1l = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, w1, 16));
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const u32 w = (Direct ? ar[i][p] : a0[p * MR + i]);
      const __m512 ah = _mm512_set1_ps(bits_float(w & 0xffff0000u));
      const __m512 al = _mm512_set1_ps(bits_float(w << 16));
      acc[i][0] = _mm512_fmadd_ps(al, b0l, _mm512_fmadd_ps(ah, b0h, acc[i][0]));
      acc[i][1] = _mm512_fmadd_ps(al, b1l, _mm512_fmadd_ps(ah, b1h, acc[i][1]));
    }
  }
  _mm_setcsr(csr);
  store_tile(acc, x);
  _mm256_zeroupper();  // (leave no dirty upper register halves to the caller's SSE code)
}

/// The same chains with AVX2 fused multiply-adds (CPUs without AVX-512): the tile in four strips of 8 columns, each
/// a pass over the pairs with 12 accumulators; the bits do not depend on which strip or register an element is in.
template <bool Direct>
__attribute__((target("avx2,fma"))) void tile_emulated_avx2(const TileArgs& x) {
  const u32* ar[MR];
  row_pointers<Direct>(x, ar);
  const u32* const a0 = x.a;  // packed: element (i, p) at a0[p * MR + i], constant offsets from one register
  alignas(64) float t[MR * NR];
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
  const __m256i hi_mask = _mm256_set1_epi32(int(0xffff0000u));
  for (int s = 0; s < NR / 8; ++s) {
    __m256 acc[MR];
    for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
    const u32* b = x.b + s * 8;
    for (Index p = 0; p < x.pairs; ++p, b += NR) {
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
      const __m256 bh = _mm256_castsi256_ps(_mm256_and_si256(w, hi_mask));
      const __m256 bl = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
#pragma GCC unroll 12
      for (int i = 0; i < MR; ++i) {
        const __m256i a = _mm256_set1_epi32(int((Direct ? ar[i][p] : a0[p * MR + i])));
        const __m256 ah = _mm256_castsi256_ps(_mm256_and_si256(a, hi_mask));
        const __m256 al = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
        acc[i] = _mm256_fmadd_ps(al, bl, _mm256_fmadd_ps(ah, bh, acc[i]));
      }
    }
    for (int i = 0; i < MR; ++i) _mm256_store_ps(t + i * NR + s * 8, acc[i]);
  }
  _mm_setcsr(csr);
  write_tile(t, x);
  _mm256_zeroupper();  // (leave no dirty upper register halves to the caller's SSE code)
}

/// Few rows (R <= 4, A read in place): R rows against NP panels at once (2 R NP <= 24 accumulators), so that a
/// product with one row (a decode step) keeps the instruction's pipes busy. x describes the first panel; panel t is
/// at x.b + t * x.pairs * NR and writes columns t * NR onwards; `npv` panels are valid, the others repeat the last
/// valid one and are discarded, and the last valid one has x.cols columns.
template <int R, int NP>
__attribute__((target("avx512f,avx512bf16"))) void wide_instruction(const TileArgs& x, int npv) {
  const u32* bp[NP];
  for (int t = 0; t < NP; ++t) bp[t] = x.b + (t < npv ? t : npv - 1) * x.pairs * NR;
  __m512 acc[R][NP][2];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < NP; ++t) acc[i][t][0] = acc[i][t][1] = _mm512_setzero_ps();
  for (Index p = 0; p < x.pairs; ++p) {
    __m512bh av[R];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) av[i] = (__m512bh)_mm512_set1_epi32(int(x.a[i * x.lda + p]));
#pragma GCC unroll 12
    for (int t = 0; t < NP; ++t) {
      const __m512bh b0 = (__m512bh)_mm512_load_si512(bp[t] + p * NR);
      const __m512bh b1 = (__m512bh)_mm512_load_si512(bp[t] + p * NR + 16);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        acc[i][t][0] = _mm512_dpbf16_ps(acc[i][t][0], av[i], b0);
        acc[i][t][1] = _mm512_dpbf16_ps(acc[i][t][1], av[i], b1);
      }
    }
  }
  alignas(64) float t_[MR * NR];
  for (int t = 0; t < npv; ++t) {
    for (int i = 0; i < R; ++i) {
      _mm512_store_ps(t_ + i * NR, acc[i][t][0]);
      _mm512_store_ps(t_ + i * NR + 16, acc[i][t][1]);
    }
    TileArgs y = x;
    y.c = x.c + t * NR;
    y.rows = R;
    y.cols = t == npv - 1 ? x.cols : NR;
    y.bias = x.bias ? x.bias + t * NR : nullptr;
    write_tile(t_, y);
  }
  _mm256_zeroupper();  // (leave no dirty upper register halves to the caller's SSE code)
}

/// The CPU's features, read once.
inline bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return has;
}
inline bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}
inline bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
#define DEA_BF16_X86 0
inline bool cpu_has_bf16_dot() { return false; }
inline bool cpu_has_avx512() { return false; }
inline bool cpu_has_avx2_fma() { return false; }
#endif

/// The tile kernels the process uses, for a packed and for an in-place A.
struct Kernels {
  void (*packed)(const TileArgs&);
  void (*direct)(const TileArgs&);
  /// wide[R - 1]: R rows against up to wide_panels(R) panels (null: this path has none)
  void (*wide[4])(const TileArgs&, int);
};
/// Panels a wide kernel of R rows takes at once.
constexpr int wide_panels(int R) { return 12 / R; }
inline Kernels tile_kernels() {
  Bf16Path path = bf16_path();
#if DEA_BF16_X86
  if (path == Bf16Path::automatic)
    path = cpu_has_bf16_dot()   ? Bf16Path::instruction
           : cpu_has_avx512()   ? Bf16Path::emulated
           : cpu_has_avx2_fma() ? Bf16Path::emulated_avx2
                                : Bf16Path::scalar_model;
  if (path == Bf16Path::instruction) {
    check(cpu_has_bf16_dot(), "ops::packed::gemm_bf16: the instruction path was forced on a CPU without AVX512_BF16");
    return {tile_instruction<false>,
            tile_instruction<true>,
            {wide_instruction<1, 12>, wide_instruction<2, 6>, wide_instruction<3, 4>, wide_instruction<4, 3>}};
  }
  if (path == Bf16Path::emulated) {
    check(cpu_has_avx512(), "ops::packed::gemm_bf16: the emulated path was forced on a CPU without AVX-512");
    return {tile_emulated<false>, tile_emulated<true>, {}};
  }
  if (path == Bf16Path::emulated_avx2) {
    check(cpu_has_avx2_fma(), "ops::packed::gemm_bf16: the AVX2 path was forced on a CPU without AVX2 and FMA");
    return {tile_emulated_avx2<false>, tile_emulated_avx2<true>, {}};
  }
#else
  check(path == Bf16Path::automatic || path == Bf16Path::scalar_model,
        "ops::packed::gemm_bf16: only the scalar model is available on this CPU");
#endif
  return {tile_model<false>, tile_model<true>, {}};
}

/// dst[i] = the pair (lo[i], hi[i]) for i < n.
inline void convert_pairs(const float* __restrict lo, const float* __restrict hi, Index n, u32* __restrict dst) {
  for (Index i = 0; i < n; ++i) dst[i] = pair(lo[i], hi[i]);
}

/// Row i of a row-major A as dwords of pairs (the last one padded when K is odd): the blocks of k all start at even
/// k, so pair p of block b is dword b * k_block_bf16(K) / 2 + p of the row.
inline void convert_row(const float* __restrict src, Index K, u32* __restrict dst) {
  const Index full = K / 2;
  for (Index p = 0; p < full; ++p) dst[p] = pair(src[2 * p], src[2 * p + 1]);
  if (K & 1) dst[full] = bits_of(src[K - 1]);
}

/// Thread-local growable scratch of dwords (64-byte aligned), or a caller's buffer while a Bf16BufferScope is alive.
struct Scratch {
  u32* p = nullptr;
  Index n = 0;
  bool external = false;  ///< p is a Bf16BufferScope's buffer: never freed, never grown
  ~Scratch() {
    if (!external) std::free(p);
  }
  u32* get(Index want) {
    if (want <= n) return p;
    check(!external, "ops::packed::gemm_bf16: the Bf16BufferScope's buffer holds ", n, " dwords, this product needs ",
          want);
    std::free(p);
    const std::size_t bytes = (static_cast<std::size_t>(want) * 4 + 63) / 64 * 64;
    p = static_cast<u32*>(std::aligned_alloc(64, bytes));
    check(p != nullptr, "ops::packed::gemm_bf16: out of memory for a ", bytes, "-byte packing buffer");
    n = want;
    return p;
  }
};
inline Scratch& a_scratch() {
  thread_local Scratch s;
  return s;
}
inline Scratch& row_scratch() {
  thread_local Scratch s;
  return s;
}
inline Scratch& b_scratch() {
  thread_local Scratch s;
  return s;
}

/// Columns of B per packed block: the [pairs, nc] block of dwords stays within kBBlockBytes.
constexpr Index n_block(Index K, Index N) {
  const Index pairs = k_block_bf16(K) / 2 > 1 ? k_block_bf16(K) / 2 : 1;
  Index nc = kBBlockBytes / (pairs * 4) / NR * NR;
  if (nc < NR) nc = NR;
  const Index whole = (N + NR - 1) / NR * NR;
  return nc < whole ? nc : whole;
}

/// The packed product: A packed whole (every row panel, every block of k) by the team, then, per block of B, its
/// panels packed by the team and its tiles shared out as in ops/packed_gemm.hpp. Which thread computes a tile, and
/// how the blocks of columns are cut, changes no result.
/// With `pre` non-null, B comes packed whole (pack_b_whole's layout) and is read where it is.
template <class TB>
void gemm_fast(Index M, Index N, Index K, View<float> A, View<TB> B, float* C, Index ldc, bool accumulate,
               const float* bias, const u32* pre = nullptr) {
  const Kernels kernels = tile_kernels();
  const Index kb = k_block_bf16(K), nblk = (K + kb - 1) / kb, half = kb / 2;
  const Index P = (nblk - 1) * half + (K - (nblk - 1) * kb + 1) / 2;  // pairs in all
  const Index panels_m = (M + MR - 1) / MR;
  // a row-major A is converted row by row and read in place; any other is packed in panels
  const bool direct = A.cs == 1;
  void (*const wide)(const TileArgs&, int) = direct && M <= 4 ? kernels.wide[M - 1] : nullptr;
  u32* const Ap = a_scratch().get(direct ? M * P : panels_m * P * MR);
  const Index nc = n_block(K, N), b_vals = half * nc;
  const Index n_jc = (N + nc - 1) / nc, blocks = n_jc * nblk;
  const bool par = !in_parallel() && 2.0 * double(M) * double(N) * double(K) > 4 * kParallelMinFlops;
  const int want = par ? num_threads() : 1;
  const bool two = want > 1 && blocks > 1 && !pre;
  u32* const Bbuf = pre ? nullptr : b_scratch().get(two ? 2 * b_vals : b_vals);
  const Index Np = (N + NR - 1) / NR * NR;
  parallel_team(want, [&](int tid, int team) {
    if (direct) {  // A, all of it: row i at Ap + i * P
      for (Index i = M * tid / team; i < M * (tid + 1) / team; ++i) convert_row(A.p + i * A.rs, K, Ap + i * P);
    } else if (A.rs == 1) {  // a transposed A (dy^T): the thread's rows of one pair converted in one pass
      const Index q0 = panels_m * tid / team, q1 = panels_m * (tid + 1) / team;
      const Index r0 = q0 * MR, r1 = std::min(M, q1 * MR);
      u32* const tmp = row_scratch().get(std::max<Index>(1, r1 - r0));
      for (Index b = 0; b < nblk && q0 < q1; ++b) {
        const Index k0 = b * kb, k1 = std::min(K, k0 + kb);
        for (Index p = 0; p < (k1 - k0 + 1) / 2; ++p) {
          const float* lo = A.p + r0 + (k0 + 2 * p) * A.cs;
          if (k0 + 2 * p + 1 < k1)
            convert_pairs(lo, lo + A.cs, r1 - r0, tmp);
          else
            for (Index i = 0; i < r1 - r0; ++i) tmp[i] = bits_of(lo[i]);
          for (Index q = q0; q < q1; ++q) {
            u32* d = Ap + (q * P + b * half + p) * MR;
            const Index rows = std::min<Index>(MR, M - q * MR);
            const u32* src = tmp + (q - q0) * MR;
            if (rows == MR) {
              std::memcpy(d, src, sizeof(u32) * MR);  // a fixed size: a few vector moves
            } else {
              for (Index i = 0; i < rows; ++i) d[i] = src[i];
              for (Index i = rows; i < MR; ++i) d[i] = 0;
            }
          }
        }
      }
    } else {  // A, all of it: panel q, block b at Ap + (q * P + b * half) * MR
      for (Index q = panels_m * tid / team; q < panels_m * (tid + 1) / team; ++q)
        for (Index b = 0; b < nblk; ++b)
          pack_panel<MR>(A, q * MR, int(std::min<Index>(MR, M - q * MR)), b * kb, std::min(K, (b + 1) * kb),
                 Ap + (q * P + b * half) * MR);
    }
    Index blk = 0;
    for (Index jc = 0; jc < N; jc += nc) {
      const Index ncur = std::min(nc, N - jc), np = (ncur + NR - 1) / NR;
      for (Index b = 0; b < nblk; ++b, ++blk) {
        const Index k0 = b * kb, k1 = std::min(K, k0 + kb), pairs = (k1 - k0 + 1) / 2;
        const bool init = !accumulate && b == 0;
        const u32* Bp;
        if (pre) {
          Bp = pre + b * half * Np + jc * pairs;  // the block of k at b * half * Np, panel n0 at n0 * pairs
          if (team > 1 && blk == 0) team_barrier();  // A is packed
        } else {
          u32* const buf = Bbuf + (two ? (blk % 2) * b_vals : 0);
          if (team > 1 && !two && blk > 0) team_barrier();  // the previous block's panels are no longer read
          for (Index p = np * tid / team; p < np * (tid + 1) / team; ++p) {
            const Index n0 = jc + p * NR;
            pack_b(B, k0, k1, n0, int(std::min<Index>(NR, N - n0)), buf + p * pairs * NR);
          }
          if (team > 1) team_barrier();  // A (first block) and every panel of this block are packed
          Bp = buf;
        }
        if (wide) {  // M <= 4: groups of panels, each read once for all the rows
          const int G = wide_panels(int(M));
          const Index groups = (np + G - 1) / G;
          for (Index u = groups * tid / team; u < groups * (tid + 1) / team; ++u) {
            const Index p = u * G, n0 = jc + p * NR;
            const int npv = int(std::min<Index>(G, np - p));
            const Index last = jc + (p + npv - 1) * NR;
            const TileArgs x{pairs, Ap + b * half, P, Bp + p * pairs * NR, C + n0, ldc, int(M),
                             int(std::min<Index>(NR, N - last)), init, bias ? bias + n0 : nullptr};
            wide(x, npv);
          }
          continue;
        }
        const Index tiles = panels_m * np, u0 = tiles * tid / team, u1 = tiles * (tid + 1) / team;
        for (Index u = u0; u < u1; ++u) {
          const Index q = u / np, p = u % np, m0 = q * MR, n0 = jc + p * NR;
          TileArgs x{pairs, nullptr, P, Bp + p * pairs * NR, C + m0 * ldc + n0, ldc,
                     int(std::min<Index>(MR, M - m0)), int(std::min<Index>(NR, N - n0)), init,
                     bias ? bias + n0 : nullptr};
          if (direct) {
            x.a = Ap + m0 * P + b * half;
            kernels.direct(x);
          } else {
            x.a = Ap + (q * P + b * half) * MR;
            kernels.packed(x);
          }
        }
      }
    }
  });
}

/// C = bias (or 0), or left as it is, for an empty inner dimension.
inline void fill_empty(Index M, Index N, float* C, Index ldc, bool accumulate, const float* bias) {
  if (accumulate) return;
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j) C[i * ldc + j] = bias ? bias[j] : 0.0f;
}

}  // namespace bf16_detail

/// Dwords the bf16 products with a row-major A [M, K] (any B, any thread count) take from the calling thread's buffers:
/// {for A's rows, for B's packed blocks}. A Bf16BufferScope of these sizes (the largest over a set of products)
/// makes those products allocate nothing.
struct Bf16BufferSize {
  Index a = 0, b = 0;
};
constexpr Bf16BufferSize bf16_buffer_size(Index M, Index N, Index K) {
  if (M <= 0 || N <= 0 || K <= 0) return Bf16BufferSize{};
  const Index kb = k_block_bf16(K), nblk = (K + kb - 1) / kb, half = kb / 2;
  const Index P = (nblk - 1) * half + (K - (nblk - 1) * kb + 1) / 2;
  const Index nc = bf16_detail::n_block(K, N), blocks = (N + nc - 1) / nc * nblk;
  return Bf16BufferSize{M * P, (blocks > 1 ? 2 : 1) * half * nc};  // (two B blocks when a team double-buffers)
}

/// While alive, the bf16 products of the calling thread whose A is row-major take their buffers from the caller's
/// memory instead of the heap: `a` (a_dwords) for A's rows, `b` (b_dwords) for B's packed blocks, each 64-byte
/// aligned (sizes from bf16_buffer_size). A product that needs more is an error. Scopes do not nest.
class Bf16BufferScope {
public:
  Bf16BufferScope(std::uint32_t* a, Index a_dwords, std::uint32_t* b, Index b_dwords)
      : a_(bf16_detail::a_scratch()), b_(bf16_detail::b_scratch()) {
    check(!a_.external && !b_.external, "ops::packed::Bf16BufferScope: scopes do not nest");
    check(reinterpret_cast<std::uintptr_t>(a) % 64 == 0 && reinterpret_cast<std::uintptr_t>(b) % 64 == 0,
          "ops::packed::Bf16BufferScope: the buffers must be 64-byte aligned");
    saved_a_ = a_.p;
    saved_an_ = a_.n;
    saved_b_ = b_.p;
    saved_bn_ = b_.n;
    a_.p = a;
    a_.n = a_dwords;
    a_.external = true;
    b_.p = b;
    b_.n = b_dwords;
    b_.external = true;
  }
  ~Bf16BufferScope() {  // the thread's own buffers back, as they were
    a_.p = saved_a_;
    a_.n = saved_an_;
    a_.external = false;
    b_.p = saved_b_;
    b_.n = saved_bn_;
    b_.external = false;
  }
  Bf16BufferScope(const Bf16BufferScope&) = delete;
  Bf16BufferScope& operator=(const Bf16BufferScope&) = delete;

private:
  bf16_detail::Scratch& a_;
  bf16_detail::Scratch& b_;
  bf16_detail::u32* saved_a_ = nullptr;
  bf16_detail::u32* saved_b_ = nullptr;
  Index saved_an_ = 0, saved_bn_ = 0;
};

/// True when this CPU runs the bf16 products with the vdpbf16ps instruction (AVX512_BF16); otherwise they are
/// emulated (the same bits, at most the float product's speed).
inline bool bf16_instruction_available() { return bf16_detail::cpu_has_bf16_dot(); }

/// C [M, N] (row stride ldc) = bf16(A) bf16(B) (+ bias as a row, when non-null), or C += ... when `accumulate`
/// (bias ignored), float accumulation, by the rule of the file comment. A is [M, K], B is [K, N], any strided views.
/// Multi-threaded over tiles (run serially inside a parallel region); the results never depend on the threads.
inline void gemm_bf16(Index M, Index N, Index K, View<float> A, View<float> B, float* C, Index ldc, bool accumulate,
                      const float* bias = nullptr) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return bf16_detail::fill_empty(M, N, C, ldc, accumulate, bias);
  bf16_detail::gemm_fast(M, N, K, A, B, C, ldc, accumulate, bias);
}

/// The same with B already in bf16 (weights stored for inference).
inline void gemm_bf16(Index M, Index N, Index K, View<float> A, View<bf16> B, float* C, Index ldc, bool accumulate,
                      const float* bias = nullptr) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return bf16_detail::fill_empty(M, N, C, ldc, accumulate, bias);
  bf16_detail::gemm_fast(M, N, K, A, B, C, ldc, accumulate, bias);
}

/// A right-hand side B [K, N] packed once for bf16 products (the weights of an inference model, B = W^T): the
/// products that use it skip packing, and it holds 2 bytes per weight (plus the padding of the last panel).
class Bf16Matrix {
public:
  Bf16Matrix() = default;
  /// B packed from a float or bf16 view (a weight W [N, K] stored row-major: View{W, 1, K}, i.e. W^T).
  template <class T>
  Bf16Matrix(Index K, Index N, View<T> B) : K_(K), N_(N) {
    check(K >= 0 && N >= 0, "ops::packed::Bf16Matrix: negative shape ", K, " x ", N);
    using namespace bf16_detail;
    const Index kb = k_block_bf16(K), half = kb / 2, Np = (N + NR - 1) / NR * NR;
    const Index P = K == 0 ? 0 : ((K + kb - 1) / kb - 1) * half + (K - ((K + kb - 1) / kb - 1) * kb + 1) / 2;
    data_.reset(static_cast<u32*>(std::aligned_alloc(64, std::size_t((P * Np * 4 + 63) / 64 * 64 + 64))));
    check(data_ != nullptr, "ops::packed::Bf16Matrix: out of memory for ", P * Np * 4, " bytes");
    size_ = P * Np;
    for (Index b = 0; b * kb < K; ++b) {
      const Index k0 = b * kb, k1 = std::min(K, k0 + kb), pairs = (k1 - k0 + 1) / 2;
      for (Index n0 = 0; n0 < N; n0 += NR)
        pack_b(B, k0, k1, n0, int(std::min<Index>(NR, N - n0)), data_.get() + b * half * Np + n0 * pairs);
    }
  }
  Index rows() const { return K_; }
  Index cols() const { return N_; }
  /// Bytes of the packed values.
  std::size_t bytes() const { return std::size_t(size_) * 4; }
  const bf16_detail::u32* data() const { return data_.get(); }

private:
  struct Free {
    void operator()(bf16_detail::u32* p) const { std::free(p); }
  };
  Index K_ = 0, N_ = 0, size_ = 0;
  std::unique_ptr<bf16_detail::u32, Free> data_;
};

/// C [M, N] (row stride ldc) (=|+=) bf16(A) B (+ bias) for a B packed once: the same bits as gemm_bf16 on the view
/// B was packed from.
inline void gemm_bf16(Index M, View<float> A, const Bf16Matrix& B, float* C, Index ldc, bool accumulate,
                      const float* bias = nullptr) {
  const Index N = B.cols(), K = B.rows();
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return bf16_detail::fill_empty(M, N, C, ldc, accumulate, bias);
  bf16_detail::gemm_fast(M, N, K, A, View<float>{nullptr, 0, 0}, C, ldc, accumulate, bias, B.data());
}

/// The rule computed element by element with the scalar model (bf16_model::dp_step), for tests: the same bits as
/// gemm_bf16.
template <class TB>
void gemm_bf16_model(Index M, Index N, Index K, View<float> A, View<TB> B, float* C, Index ldc, bool accumulate,
                     const float* bias = nullptr) {
  if (M <= 0 || N <= 0) return;
  bf16_detail::gemm_model(M, N, K, A, B, C, ldc, accumulate, bias);
}

}  // namespace packed
}  // namespace ops
}  // namespace dea
