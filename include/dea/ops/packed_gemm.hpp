// dea/ops/packed_gemm.hpp: the library's own matrix product for float and double, C (=|+=) A B.
//
// The classic packed scheme: B is copied once per [kc, nc] block into panels of NR columns that all threads
// share, each thread copies its own rows of A into panels of MR rows, and a register-tiled micro-kernel adds
// kc rank-1 updates into an MR x NR tile held in vector registers. Eigen's product, called on fixed row blocks
// (which the thread-count invariance needs), copied B again for every block; here B is copied once per block
// of k and the row blocks only decide who computes which tile.
//
// Results do not depend on the thread count or on how the rows are split: every element of C is
//   C = C0 + s_1 + s_2 + ...,   s_b = the k-ordered fused multiply-add chain over the b-th block of k,
// and the blocks of k depend on K alone. A tile cut short by the edge of C computes its valid elements with
// exactly the same operations as a full tile (the padding lanes of the packed panels are zero and discarded).
//
// The micro-kernel uses GCC/Clang vector extensions; its shape follows the instruction set the program is
// compiled for (AVX-512: 12 x 32 floats, 28 of the 32 registers; AVX: 6 x 16; otherwise 4 x 8 with 16-byte
// vectors). Other scalar types, and compilers without vector extensions, use Eigen (ops/gemm.hpp decides).
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__GNUC__) || defined(__clang__)
#define DEA_PACKED_GEMM 1
#else
#define DEA_PACKED_GEMM 0
#endif

namespace dea {
namespace ops {
namespace packed {

/// A read-only strided matrix: element (i, j) is p[i * rs + j * cs].
template <class S>
struct View {
  const S* p;
  Index rs, cs;
  /// The transpose, without a copy.
  View t() const { return {p, cs, rs}; }
};

/// True for the scalar types the packed product handles.
template <class S>
constexpr bool supported() {
  return DEA_PACKED_GEMM && (std::is_same<S, float>::value || std::is_same<S, double>::value);
}

/// Products with fewer rows than this go to Eigen (ops/gemm.hpp): packing B would cost more than it saves.
constexpr Index kMinRows = 64;

/// The deepest block of k: a packed panel of A (MR x kKcMax values) lives on the stack of the thread using it.
constexpr Index kKcMax = 512;
/// The depth of the blocks of k for an inner dimension K: the fewest blocks of at most kKcMax, of equal depth
/// (the last may be shorter). A function of K alone, so results never depend on anything else.
constexpr Index k_block(Index K) {
  const Index nb = (K + kKcMax - 1) / kKcMax;
  return nb < 1 ? 0 : (K + nb - 1) / nb;
}

#if DEA_PACKED_GEMM

/// A micro-kernel shape: VB-byte vectors, MR rows of NV vectors each (NR = NV * VB / sizeof(S) columns).
template <class S, int VB, int MR_, int NV>
struct Kernel {
  typedef S V __attribute__((vector_size(VB)));
  static constexpr int L = VB / int(sizeof(S));
  static constexpr int MR = MR_;
  static constexpr int NR = NV * L;

  /// The [rows, cols] corner of the MR x NR tile at c (row stride ldc), rows <= MR, cols <= NR:
  ///   init:  c = acc (+ bias[j] when bias is non-null);   otherwise:  c = c + acc,
  /// with acc = sum over k < kc of a[k * MR + i] * b[k * NR + j] (a and b: packed panels, VB-aligned).
  static void tile(Index kc, const S* __restrict a, const S* __restrict b, S* __restrict c, Index ldc, int rows,
                   int cols, bool init, const S* __restrict bias) {
    tile_impl<false>(kc, a, 0, b, c, ldc, rows, cols, init, bias);
  }

  /// The same with A read where it is, not packed: acc = sum over k < kc of a[i * lda + k] * b[k * NR + j], for a
  /// row-major A (unit column stride). Rows i >= `rows` read row rows - 1 again (their results are discarded), so
  /// nothing past A is read; the valid rows get exactly the operations, so the bits, of tile on a packed panel.
  static void tile_rows(Index kc, const S* __restrict a, Index lda, const S* __restrict b, S* __restrict c, Index ldc,
                        int rows, int cols, bool init, const S* __restrict bias) {
    tile_impl<true>(kc, a, lda, b, c, ldc, rows, cols, init, bias);
  }

private:
  template <bool Direct>
  static void tile_impl(Index kc, const S* __restrict a, Index lda, const S* __restrict b, S* __restrict c, Index ldc,
                        int rows, int cols, bool init, const S* __restrict bias) {
    const S* ar[MR] = {};
    if constexpr (Direct) {
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) ar[i] = a + (i < rows ? i : rows - 1) * lda;
    }
    V acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = V{};
    for (Index k = 0; k < kc; ++k) {
      V bv[NV];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) bv[j] = *reinterpret_cast<const V*>(b + k * NR + j * L);
      const S* ak = a + k * MR;
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        S av;
        if constexpr (Direct)
          av = ar[i][k];
        else
          av = ak[i];
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
      }
    }
    if (rows == MR && cols == NR) {
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) {
          S* cp = c + i * ldc + j * L;
          V v;
          if (init) {
            v = acc[i][j];
            if (bias) {
              V bb;
              std::memcpy(&bb, bias + j * L, sizeof(V));
              v = v + bb;
            }
          } else {
            std::memcpy(&v, cp, sizeof(V));
            v = v + acc[i][j];
          }
          std::memcpy(cp, &v, sizeof(V));
        }
      return;
    }
    alignas(64) S t[MR * NR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) std::memcpy(t + i * NR + j * L, &acc[i][j], sizeof(V));
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) {
        S& x = c[i * ldc + j];
        const S s = t[i * NR + j];
        x = init ? (bias ? s + bias[j] : s) : x + s;
      }
  }
};

/// The shape compiled for this instruction set.
template <class S>
#if defined(__AVX512F__)
using DefaultKernel = Kernel<S, 64, 12, 2>;
#elif defined(__AVX__)
using DefaultKernel = Kernel<S, 32, 6, 2>;
#else
using DefaultKernel = Kernel<S, 16, 4, 2>;
#endif

/// The alignment in bytes the packed panels of B need (whole_b_size buffers of the caller's).
template <class S>
constexpr std::size_t panel_align() {
  return alignof(typename DefaultKernel<S>::V);
}

/// Bytes of a packed block of B, at most: the [kc, nc] block stays within half of a typical L2.
constexpr Index kBBlockBytes = Index(1) << 20;

/// Columns of B per packed block for inner dimension K and N columns (a multiple of NR).
template <class S, int NR>
constexpr Index n_block(Index K, Index N) {
  const Index kc = k_block(K) < 1 ? 1 : k_block(K);
  Index nc = kBBlockBytes / (kc * Index(sizeof(S))) / NR * NR;
  if (nc < NR) nc = NR;
  const Index whole = (N + NR - 1) / NR * NR;
  return nc < whole ? nc : whole;
}

/// Values of S a product with inner dimension K and N columns packs B into (the one buffer it needs), or, with
/// `max_panels`, the smaller buffer that lets it pack at most that many panels of NR columns at a time (a
/// BufferScope of that size makes the product pack B in narrower blocks: the same results, more passes over A).
template <class S, class Kern = DefaultKernel<S>>
constexpr Index b_pack_size(Index K, Index N, Index max_panels = Index(1) << 40) {
  if (K <= 0 || N <= 0) return 0;
  const Index nc = n_block<S, Kern::NR>(K, N);
  const Index cap = max_panels * Kern::NR;
  return k_block(K) * (nc < cap ? nc : cap);
}

namespace detail {

template <class S>
struct BBuffer {
  S* p = nullptr;
  Index n = 0;
  bool owned = false;
  ~BBuffer() {
    if (owned) std::free(p);
  }
};

template <class S>
BBuffer<S>& b_buffer() {
  thread_local BBuffer<S> buf;
  return buf;
}

/// Values the buffer of the BufferScope in force holds, or -1 when none is (the heap buffer grows as needed).
template <class S>
Index b_scope_capacity() {
  const BBuffer<S>& buf = b_buffer<S>();
  return buf.owned || buf.p == nullptr ? -1 : buf.n;
}

/// buf's values, grown on the heap (64-byte aligned, the old values dropped) to hold at least n.
template <class S>
S* grown(BBuffer<S>& buf, Index n) {
  if (n <= buf.n) return buf.p;
  std::free(buf.p);
  buf.p = nullptr;
  buf.n = 0;
  const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(S) + 63) / 64 * 64;
  buf.p = static_cast<S*>(std::aligned_alloc(64, bytes));
  check(buf.p != nullptr, "ops::packed::gemm: out of memory for a ", bytes, "-byte packing buffer");
  buf.n = n;
  buf.owned = true;
  return buf.p;
}

/// The calling thread's buffer for packed B, grown (on the heap) to n values unless a BufferScope supplies it.
template <class S>
S* b_scratch(Index n) {
  BBuffer<S>& buf = b_buffer<S>();
  if (n <= buf.n) return buf.p;
  check(buf.owned || buf.p == nullptr, "ops::packed::gemm: the buffer of the BufferScope in force holds ", buf.n,
        " values, the product needs ", n);
  return grown(buf, n);
}

/// The calling thread's buffer for several packed panels of a transposed A (gemm), grown on the heap to n values.
template <class S>
S* a_scratch(Index n) {
  thread_local BBuffer<S> buf;
  return grown(buf, n);
}

}  // namespace detail

/// While alive, the calling thread's products of S pack B into `buffer` (`n` values, aligned as a vector of the
/// kernel: dea::kWorkspaceAlign is enough) instead of a heap buffer: for programs that allocate nothing after their
/// set-up (nn::InferenceModel). A product packs B in blocks narrow enough for n values (results do not change); one
/// whose single panel needs more than n values (b_pack_size(K, N, 1)) is an error.
template <class S>
class BufferScope {
public:
  BufferScope(S* buffer, Index n) {
    check(reinterpret_cast<std::uintptr_t>(buffer) % alignof(typename DefaultKernel<S>::V) == 0,
          "ops::packed::BufferScope: buffer is not aligned to ", alignof(typename DefaultKernel<S>::V), " bytes");
    check(n >= 0, "ops::packed::BufferScope: n must be non-negative, got ", n);
    detail::BBuffer<S>& b = detail::b_buffer<S>();
    saved_p_ = b.p;
    saved_n_ = b.n;
    saved_owned_ = b.owned;
    b.p = buffer;
    b.n = n;
    b.owned = false;
  }
  ~BufferScope() {
    detail::BBuffer<S>& b = detail::b_buffer<S>();
    b.p = saved_p_;
    b.n = saved_n_;
    b.owned = saved_owned_;
  }
  BufferScope(const BufferScope&) = delete;
  BufferScope& operator=(const BufferScope&) = delete;

private:
  S* saved_p_ = nullptr;
  Index saved_n_ = 0;
  bool saved_owned_ = false;
};

namespace detail {

/// Rows [m0, m0 + rows) and columns [k0, k0 + kc) of A as one panel [kc][MR] (rows past `rows` are zero).
template <int MR, class S>
void pack_a(View<S> A, Index m0, int rows, Index k0, Index kc, S* __restrict dst) {
  if (A.cs == 1) {
    for (int i = 0; i < rows; ++i) {
      const S* src = A.p + (m0 + i) * A.rs + k0;
      for (Index k = 0; k < kc; ++k) dst[k * MR + i] = src[k];
    }
  } else if (A.rs == 1 && rows == MR) {
    // a transposed A (a weight gradient's, or P^T in attention): MR contiguous values per k. The fixed count lets the
    // compiler copy them with a few moves; with a variable count it calls memcpy for every k, which cost more than
    // the copy itself
    for (Index k = 0; k < kc; ++k) {
      const S* src = A.p + m0 + (k0 + k) * A.cs;
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) dst[k * MR + i] = src[i];
    }
  } else {
    for (Index k = 0; k < kc; ++k) {
      const S* src = A.p + m0 * A.rs + (k0 + k) * A.cs;
      for (int i = 0; i < rows; ++i) dst[k * MR + i] = src[i * A.rs];
    }
  }
  if (rows < MR)
    for (Index k = 0; k < kc; ++k)
      for (int i = rows; i < MR; ++i) dst[k * MR + i] = S(0);
}

/// Rows [m0, m0 + rows) and columns [k0, k0 + kc) of a transposed A (unit row stride: the `rows` values of one k
/// are contiguous) as ceil(rows / MR) panels [kc][MR], one after the other (rows past `rows` are zero). One pass
/// over k reads each k's values once, where packing panel after panel read the same lines once per panel (lines
/// one k apart, 1-8 KB, which an L1 cache keeps badly).
template <int MR, class S>
void pack_a_transposed_panels(View<S> A, Index m0, Index rows, Index k0, Index kc, S* __restrict dst) {
  const Index full = rows / MR, rest = rows % MR;
  for (Index k = 0; k < kc; ++k) {
    const S* src = A.p + m0 + (k0 + k) * A.cs;
    for (Index q = 0; q < full; ++q) {
      S* d = dst + q * kc * MR + k * MR;
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) d[i] = src[q * MR + i];
    }
    if (rest) {
      S* d = dst + full * kc * MR + k * MR;
      for (Index i = 0; i < rest; ++i) d[i] = src[full * MR + i];
      for (Index i = rest; i < MR; ++i) d[i] = S(0);
    }
  }
}

/// Rows [k0, k0 + kc) and columns [n0, n0 + cols) of B as one panel [kc][NR] (columns past `cols` are zero).
template <int NR, class S>
void pack_b(View<S> B, Index k0, Index kc, Index n0, int cols, S* __restrict dst) {
  if (B.cs == 1 && cols == NR) {  // a whole panel: a fixed-size copy per k (moves, not a memcpy call)
    for (Index k = 0; k < kc; ++k) {
      const S* src = B.p + (k0 + k) * B.rs + n0;
      S* d = dst + k * NR;
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) d[j] = src[j];
    }
  } else if (B.cs == 1) {
    for (Index k = 0; k < kc; ++k) {
      const S* src = B.p + (k0 + k) * B.rs + n0;
      S* d = dst + k * NR;
      for (int j = 0; j < cols; ++j) d[j] = src[j];
      for (int j = cols; j < NR; ++j) d[j] = S(0);
    }
  } else {
    // a transposed read (B = W^T): the panel is written in order, its NR source lines read side by side (they stay
    // in L1 while 16 of their values are used)
    const S* src = B.p + n0 * B.cs + k0 * B.rs;
    for (Index k = 0; k < kc; ++k) {
      S* d = dst + k * NR;
      const S* sk = src + k * B.rs;
      for (int j = 0; j < cols; ++j) d[j] = sk[j * B.cs];
      for (int j = cols; j < NR; ++j) d[j] = S(0);
    }
  }
}

}  // namespace detail

/// C [M, N] (row stride ldc, unit column stride) = A B (+ bias as a row, when non-null), or C += A B when
/// `accumulate` (bias ignored). A is [M, K], B is [K, N]; either may be any strided view (a transpose is free).
template <class S, class Kern = DefaultKernel<S>>
void gemm(Index M, Index N, Index K, View<S> A, View<S> B, S* C, Index ldc, bool accumulate, const S* bias = nullptr) {
  constexpr int MR = Kern::MR, NR = Kern::NR;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (Index i = 0; i < M; ++i)
        for (Index j = 0; j < N; ++j) C[i * ldc + j] = bias ? bias[j] : S(0);
    return;
  }
  const Index kc_max = k_block(K);
  Index nc = n_block<S, NR>(K, N);
  const Index scope = detail::b_scope_capacity<S>();
  if (scope >= 0) {  // a caller's buffer: narrower blocks of B if need be (the blocks of k, so the bits, stay)
    nc = std::min(nc, scope / kc_max / NR * NR);
    check(nc >= NR, "ops::packed::gemm: the buffer of the BufferScope in force holds ", scope,
          " values, the product needs at least ", kc_max * NR, " (b_pack_size(K, N, 1))");
  }
  // called inside a parallel region (a caller already parallel over its own work) the product runs here, serially
  const bool par = !in_parallel() && 2.0 * double(M) * double(N) * double(K) > 4 * kParallelMinFlops;
  const Index panels_m = (M + MR - 1) / MR;
  const Index n_jc = (N + nc - 1) / nc, n_pc = (K + kc_max - 1) / kc_max, blocks = n_jc * n_pc;
  const int want = par ? num_threads() : 1;
  // Two buffers for B when several threads share several blocks: a thread packs its part of the next block while
  // the others may still read the current one, so one barrier per block suffices (with one buffer, a second one
  // keeps the next block's packing from overwriting panels still in use). A BufferScope's buffer holds one.
  const Index b_vals = kc_max * nc;
  const bool two = want > 1 && blocks > 1 && scope < 0;
  S* const Bbuf = detail::b_scratch<S>(two ? 2 * b_vals : b_vals);
  const bool direct_a = A.cs == 1;
  // a transposed A: a thread packs up to 8 of its panels in one pass over k into a per-thread heap buffer (not under
  // a BufferScope, whose programs allocate nothing after their set-up: there, panel by panel on the stack)
  const bool panels_a = !direct_a && A.rs == 1 && scope < 0;
  constexpr Index kGroup = 8;

  // panels [p0, p1) of the block of B at (row pc, column jc), kc deep, into dst
  auto pack_panels = [&](Index jc, Index pc, Index kc, Index p0, Index p1, S* dst) {
    for (Index p = p0; p < p1; ++p) {
      const Index n0 = jc + p * NR;
      detail::pack_b<NR>(B, pc, kc, n0, int(std::min<Index>(NR, N - n0)), dst + p * kc * NR);
    }
  };
  // a small first block (the only one of most small products) is packed here, before the threads start: waking
  // them twice for a copy of a few microseconds cost more than the copy
  const Index nc0 = std::min(nc, N), kc0 = std::min(kc_max, K);
  const bool pre = kc0 * nc0 < (Index(1) << 16);
  if (pre) pack_panels(0, 0, kc0, 0, (nc0 + NR - 1) / NR, Bbuf);
  // One parallel region for the whole product. Per block of B [kc, nc]: the threads pack its panels, meet at a
  // barrier, then each computes its share of the block's panels_m x np tiles: a contiguous run in (row panel,
  // column panel) order, the shares differing by at most one tile. (Splitting by whole row panels left the
  // threads of a weight gradient, 43 row panels on two threads, 22 against 21 panels apart, and a region per
  // phase cost two region starts per block.) Which thread computes a tile changes no result.
  parallel_team(want, [&](int tid, int team) {
    alignas(64) S Ap[MR * kKcMax];
    Index blk = 0;
    for (Index jc = 0; jc < N; jc += nc) {
      const Index ncur = std::min(nc, N - jc);
      const Index np = (ncur + NR - 1) / NR;
      for (Index pc = 0; pc < K; pc += kc_max, ++blk) {
        const Index kc = std::min(kc_max, K - pc);
        const bool init = !accumulate && pc == 0;
        S* const Bp = Bbuf + (two ? (blk % 2) * b_vals : 0);
        if (blk > 0 || !pre) {
          if (team > 1 && !two && blk > 0) team_barrier();  // the previous block's panels are no longer read
          pack_panels(jc, pc, kc, np * tid / team, np * (tid + 1) / team, Bp);
          if (team > 1) team_barrier();  // every panel of this block is packed
        }
        const Index tiles = panels_m * np;
        const Index u0 = tiles * tid / team, u1 = tiles * (tid + 1) / team;
        if (u0 == u1) continue;
        const Index q_first = u0 / np, q_last = (u1 - 1) / np;
        for (Index g0 = q_first; g0 <= q_last; g0 += kGroup) {
          const Index g1 = std::min(q_last + 1, g0 + kGroup);
          S* Aps = nullptr;
          if (panels_a) {
            Aps = detail::a_scratch<S>(kGroup * MR * kc_max);
            detail::pack_a_transposed_panels<MR>(A, g0 * MR, std::min(M, g1 * MR) - g0 * MR, pc, kc, Aps);
          }
          for (Index q = g0; q < g1; ++q) {
            const Index m0 = q * MR;
            const int rows = int(std::min<Index>(MR, M - m0));
            const S* a;  // a row-major A is read in place (its rows are already contiguous along k), any other packed
            if (direct_a) {
              a = A.p + m0 * A.rs + pc;
            } else if (panels_a) {
              a = Aps + (q - g0) * kc * MR;
            } else {
              detail::pack_a<MR>(A, m0, rows, pc, kc, Ap);
              a = Ap;
            }
            const Index p0 = q == q_first ? u0 % np : 0, p1 = q == q_last ? (u1 - 1) % np + 1 : np;
            for (Index p = p0; p < p1; ++p) {
              const Index n0 = jc + p * NR;
              const int cols = int(std::min<Index>(NR, N - n0));
              const S* bn = bias ? bias + n0 : nullptr;
              if (direct_a)
                Kern::tile_rows(kc, a, A.rs, Bp + p * kc * NR, C + m0 * ldc + n0, ldc, rows, cols, init, bn);
              else
                Kern::tile(kc, a, Bp + p * kc * NR, C + m0 * ldc + n0, ldc, rows, cols, init, bn);
            }
          }
        }
      }
    }
  });
}

/// Values of S that pack_b_whole writes for a [K, N] B: all of it, N rounded up to whole panels.
template <class S, class Kern = DefaultKernel<S>>
constexpr Index whole_b_size(Index K, Index N) {
  return K <= 0 || N <= 0 ? 0 : K * ((N + Kern::NR - 1) / Kern::NR * Kern::NR);
}

/// Values of S that gemm_whole_b packs A into for M rows and inner dimension K (one block of k at a time).
template <class S, class Kern = DefaultKernel<S>>
constexpr Index whole_a_size(Index M, Index K) {
  return M <= 0 || K <= 0 ? 0 : (M + Kern::MR - 1) / Kern::MR * Kern::MR * k_block(K);
}

/// All of B [K, N] packed at once, for a B that many products share (gemm_whole_b). The block of k that starts at
/// k0 (the blocks of gemm) starts at dst + k0 * Np, Np = N rounded up to NR, and holds its panels one after the
/// other ([kc][NR] each). dst: whole_b_size(K, N) values, aligned as a vector of the kernel.
template <class S, class Kern = DefaultKernel<S>>
void pack_b_whole(Index K, Index N, View<S> B, S* dst) {
  constexpr int NR = Kern::NR;
  const Index kc_max = k_block(K), Np = (N + NR - 1) / NR * NR;
  for (Index pc = 0; pc < K; pc += kc_max) {
    const Index kc = std::min(kc_max, K - pc);
    for (Index n0 = 0; n0 < N; n0 += NR)
      detail::pack_b<NR>(B, pc, kc, n0, int(std::min<Index>(NR, N - n0)), dst + pc * Np + n0 * kc);
  }
}

namespace detail {

/// The loop of gemm_whole_b and gemm_stream_b: per block of k, all of A's rows are packed into Ap, then every
/// panel of B (panel(k0, kc, n0, cols) returns it packed) runs against all of them, so a panel is read once.
template <class Kern, class S, class Panel>
void gemm_a_resident(Index M, Index N, Index K, View<S> A, Panel&& panel, S* C, Index ldc, bool accumulate, S* Ap) {
  constexpr int MR = Kern::MR, NR = Kern::NR;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (Index i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, S(0));
    return;
  }
  const Index kc_max = k_block(K), panels_m = (M + MR - 1) / MR;
  for (Index pc = 0; pc < K; pc += kc_max) {
    const Index kc = std::min(kc_max, K - pc);
    const bool init = !accumulate && pc == 0;
    for (Index q = 0; q < panels_m; ++q)
      pack_a<MR>(A, q * MR, int(std::min<Index>(MR, M - q * MR)), pc, kc, Ap + q * kc * MR);
    for (Index n0 = 0; n0 < N; n0 += NR) {
      const int cols = int(std::min<Index>(NR, N - n0));
      const S* bp = panel(pc, kc, n0, cols);
      for (Index q = 0; q < panels_m; ++q)
        Kern::tile(kc, Ap + q * kc * MR, bp, C + q * MR * ldc + n0, ldc, int(std::min<Index>(MR, M - q * MR)), cols,
                   init, nullptr);
    }
  }
}

}  // namespace detail

/// C [M, N] (row stride ldc) = A B, or C += A B when `accumulate`, with B packed by pack_b_whole: the same bits
/// as gemm(M, N, K, A, B, C, ldc, accumulate), for any M (nothing is left to amortise). Single-threaded: for
/// callers that are parallel over their own work. Each block of k packs all of A's rows into Ap
/// (whole_a_size(M, K) values), then runs every panel of B against them.
template <class S, class Kern = DefaultKernel<S>>
void gemm_whole_b(Index M, Index N, Index K, View<S> A, const S* Bp, S* C, Index ldc, bool accumulate, S* Ap) {
  constexpr int NR = Kern::NR;
  const Index Np = (N + NR - 1) / NR * NR;
  detail::gemm_a_resident<Kern>(M, N, K, A, [&](Index pc, Index kc, Index n0, int) { return Bp + pc * Np + n0 * kc; },
                                C, ldc, accumulate, Ap);
}

/// C [M, N] (=|+=) A B[:, 0:N] for the first N <= Nb columns of a B [K, Nb] packed by pack_b_whole (causal
/// attention: a block of queries against the keys it may see). Each element gets the operations, so the bits,
/// of gemm_whole_b on the whole of B.
template <class S, class Kern = DefaultKernel<S>>
void gemm_whole_b_cols(Index M, Index N, Index K, View<S> A, const S* Bp, Index Nb, S* C, Index ldc, bool accumulate,
                       S* Ap) {
  constexpr int NR = Kern::NR;
  const Index Np = (Nb + NR - 1) / NR * NR;
  detail::gemm_a_resident<Kern>(M, N, K, A, [&](Index pc, Index kc, Index n0, int) { return Bp + pc * Np + n0 * kc; },
                                C, ldc, accumulate, Ap);
}

/// C [M, N] (=|+=) A[:, 0:K] B[0:K, :] for the first K <= Kb rows of a B [Kb, N] packed by pack_b_whole in one block
/// of k (Kb <= kKcMax; causal attention: a block of queries against the keys it may see). Its bits are those of a
/// product of inner dimension K. (Preconditions, not checked: the callers run inside parallel regions.)
template <class S, class Kern = DefaultKernel<S>>
void gemm_whole_b_rows(Index M, Index N, Index K, View<S> A, const S* Bp, Index Kb, S* C, Index ldc, bool accumulate,
                       S* Ap) {
  // one block of k: the panel of columns n0 starts at n0 * Kb and holds [Kb][NR], so its first K rows are [K][NR]
  detail::gemm_a_resident<Kern>(M, N, K, A, [&](Index, Index, Index n0, int) { return Bp + n0 * Kb; }, C, ldc,
                                accumulate, Ap);
}

/// Values of S the panel buffer of gemm_stream_b holds for inner dimension K.
template <class S, class Kern = DefaultKernel<S>>
constexpr Index stream_b_size(Index K) {
  return K <= 0 ? 0 : k_block(K) * Kern::NR;
}

/// C (=|+=) A B for a small A and a wide B used once (e.g. dK_h^T += Q_b^T G in attention): A is packed whole into
/// Ap (whole_a_size(M, K) values) and B one panel at a time into Bpanel (stream_b_size(K) values, aligned as a
/// vector of the kernel), which then serves every row of A. The same bits as gemm; single-threaded.
template <class S, class Kern = DefaultKernel<S>>
void gemm_stream_b(Index M, Index N, Index K, View<S> A, View<S> B, S* C, Index ldc, bool accumulate, S* Ap,
                   S* Bpanel) {
  constexpr int NR = Kern::NR;
  detail::gemm_a_resident<Kern>(M, N, K, A,
                                [&](Index pc, Index kc, Index n0, int cols) {
                                  detail::pack_b<NR>(B, pc, kc, n0, cols, Bpanel);
                                  return static_cast<const S*>(Bpanel);
                                },
                                C, ldc, accumulate, Ap);
}

#else  // without vector extensions: supported() is false, ops/gemm.hpp uses Eigen; these keep callers compiling

template <class S>
void gemm(Index, Index, Index, View<S>, View<S>, S*, Index, bool, const S* = nullptr) {
  dea::detail::raise("ops::packed::gemm: not available with this compiler");
}

template <class S>
constexpr std::size_t panel_align() {
  return 1;
}

template <class S>
constexpr Index whole_b_size(Index, Index) {
  return 0;
}

template <class S>
constexpr Index whole_a_size(Index, Index) {
  return 0;
}

template <class S>
void pack_b_whole(Index, Index, View<S>, S*) {
  dea::detail::raise("ops::packed::pack_b_whole: not available with this compiler");
}

template <class S>
void gemm_whole_b(Index, Index, Index, View<S>, const S*, S*, Index, bool, S*) {
  dea::detail::raise("ops::packed::gemm_whole_b: not available with this compiler");
}

template <class S>
void gemm_whole_b_cols(Index, Index, Index, View<S>, const S*, Index, S*, Index, bool, S*) {
  dea::detail::raise("ops::packed::gemm_whole_b_cols: not available with this compiler");
}

template <class S>
void gemm_whole_b_rows(Index, Index, Index, View<S>, const S*, Index, S*, Index, bool, S*) {
  dea::detail::raise("ops::packed::gemm_whole_b_rows: not available with this compiler");
}

template <class S>
constexpr Index stream_b_size(Index) {
  return 0;
}

template <class S>
void gemm_stream_b(Index, Index, Index, View<S>, View<S>, S*, Index, bool, S*, S*) {
  dea::detail::raise("ops::packed::gemm_stream_b: not available with this compiler");
}

template <class S>
constexpr Index b_pack_size(Index, Index, Index = 0) {
  return 0;
}

template <class S>
class BufferScope {
public:
  BufferScope(S*, Index) {}
};

#endif  // DEA_PACKED_GEMM

}  // namespace packed
}  // namespace ops
}  // namespace dea
