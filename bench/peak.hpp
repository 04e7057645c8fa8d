// bench/peak.hpp: the peak probe, the machine's arithmetic limit for products measured directly: independent chains
// of fused multiply-adds (FP32, FP64) or of bf16 dot-product steps (vdpbf16ps, fp32 accumulation) on registers
// only, no memory traffic, so nothing but the vector units' throughput bounds them. Product benchmarks divide
// their GFLOP/s by the peak of their precision.
//
// Each probe function is compiled for its instruction set with a target attribute and runs only when the CPU has
// it (__builtin_cpu_supports), so a program built for any x86-64 measures what the CPU it runs on can do. The
// widest available form is used: AVX-512 (24 zmm accumulators, enough independent chains to cover the latency of
// two pipes), else AVX2 + FMA (12 ymm accumulators). The bf16 probe needs AVX512_BF16 and is reported absent
// without it (also on CPUs other than x86-64).
//
// FLOP counted: a vector FMA of w lanes is 2 w; a vdpbf16ps of 16 lanes is 64 (two products and two additions a
// lane).
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DEA_BENCH_PEAK_X86 1
#include <immintrin.h>
#else
#define DEA_BENCH_PEAK_X86 0
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bench_peak {

/// The precision whose peak is measured.
enum class Kind { fp32, fp64, bf16 };

inline const char* kind_name(Kind k) { return k == Kind::fp32 ? "fp32" : k == Kind::fp64 ? "fp64" : "bf16"; }

/// A measured peak: `available` false when the CPU has no instruction for it (gflops 0); `isa` names the form used.
struct Peak {
  bool available = false;
  double gflops = 0;  // summed over the threads
  std::string isa;
};

namespace detail {

#if DEA_BENCH_PEAK_X86

// Each kernel runs `iters` rounds of one operation on each of its accumulators, which are named variables (an
// array would live in memory), and returns a value that depends on all of them (so nothing is optimised away). The
// multiplier is just below 1 and the addend small, so the values stay finite and normal whatever the count.

#define DEA_PEAK_R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DEA_PEAK_R24(X) DEA_PEAK_R12(X) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
// the chains' three parts; the kernel defines PEAK_V (vector type), PEAK_INIT(i), PEAK_OP(acc) and PEAK_ADD
#define DEA_PEAK_DECL(i) PEAK_V acc##i = PEAK_INIT(i);
#define DEA_PEAK_STEP(i) acc##i = PEAK_OP(acc##i);
#define DEA_PEAK_SUM(i) s = PEAK_ADD(s, acc##i);
#define DEA_PEAK_BODY(R)            \
  R(DEA_PEAK_DECL)                  \
  for (long n = 0; n < iters; ++n) { \
    R(DEA_PEAK_STEP)                \
  }                                 \
  PEAK_V s = acc0;                  \
  R(DEA_PEAK_SUM)

__attribute__((target("avx512f"))) inline double fma_avx512_ps(long iters) {
  const __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
#define PEAK_V __m512
#define PEAK_INIT(i) _mm512_set1_ps(1.0f + 0.01f * float(i))
#define PEAK_OP(x) _mm512_fmadd_ps(x, m, a)
#define PEAK_ADD _mm512_add_ps
  DEA_PEAK_BODY(DEA_PEAK_R24)
  return double(_mm512_reduce_add_ps(s));
}

__attribute__((target("avx512f"))) inline double fma_avx512_pd(long iters) {
  const __m512d m = _mm512_set1_pd(0.9999999), a = _mm512_set1_pd(1e-7);
#undef PEAK_V
#undef PEAK_INIT
#undef PEAK_OP
#undef PEAK_ADD
#define PEAK_V __m512d
#define PEAK_INIT(i) _mm512_set1_pd(1.0 + 0.01 * double(i))
#define PEAK_OP(x) _mm512_fmadd_pd(x, m, a)
#define PEAK_ADD _mm512_add_pd
  DEA_PEAK_BODY(DEA_PEAK_R24)
  return _mm512_reduce_add_pd(s);
}

__attribute__((target("avx2,fma"))) inline double fma_avx2_ps(long iters) {
  const __m256 m = _mm256_set1_ps(0.9999999f), a = _mm256_set1_ps(1e-7f);
#undef PEAK_V
#undef PEAK_INIT
#undef PEAK_OP
#undef PEAK_ADD
#define PEAK_V __m256
#define PEAK_INIT(i) _mm256_set1_ps(1.0f + 0.01f * float(i))
#define PEAK_OP(x) _mm256_fmadd_ps(x, m, a)
#define PEAK_ADD _mm256_add_ps
  DEA_PEAK_BODY(DEA_PEAK_R12)
  return double(_mm256_cvtss_f32(s));
}

__attribute__((target("avx2,fma"))) inline double fma_avx2_pd(long iters) {
  const __m256d m = _mm256_set1_pd(0.9999999), a = _mm256_set1_pd(1e-7);
#undef PEAK_V
#undef PEAK_INIT
#undef PEAK_OP
#undef PEAK_ADD
#define PEAK_V __m256d
#define PEAK_INIT(i) _mm256_set1_pd(1.0 + 0.01 * double(i))
#define PEAK_OP(x) _mm256_fmadd_pd(x, m, a)
#define PEAK_ADD _mm256_add_pd
  DEA_PEAK_BODY(DEA_PEAK_R12)
  return _mm256_cvtsd_f64(s);
}

// bf16 dot-product chains: each lane adds x0 y0 + x1 y1 with x = y = (1/64, 1/64), 2^-11 a step (the values do not
// matter for the timing, only that the chains cannot be removed).
__attribute__((target("avx512f,avx512bf16"))) inline double dp_avx512_bf16(long iters) {
  const __m512bh m = (__m512bh)_mm512_set1_epi16(0x3C80);  // bf16 1/64
#undef PEAK_V
#undef PEAK_INIT
#undef PEAK_OP
#undef PEAK_ADD
#define PEAK_V __m512
#define PEAK_INIT(i) _mm512_set1_ps(float(i))
#define PEAK_OP(x) _mm512_dpbf16_ps(x, m, m)
#define PEAK_ADD _mm512_add_ps
  DEA_PEAK_BODY(DEA_PEAK_R24)
  return double(_mm512_reduce_add_ps(s));
}

#undef PEAK_V
#undef PEAK_INIT
#undef PEAK_OP
#undef PEAK_ADD
#undef DEA_PEAK_BODY
#undef DEA_PEAK_DECL
#undef DEA_PEAK_STEP
#undef DEA_PEAK_SUM
#undef DEA_PEAK_R24
#undef DEA_PEAK_R12

#endif  // DEA_BENCH_PEAK_X86

/// The kernel for `kind` on this CPU, its FLOP per iteration and its name; run == nullptr when there is none.
struct Kernel {
  double (*run)(long) = nullptr;
  double flop_per_iter = 0;
  const char* isa = "";
};

inline Kernel pick(Kind kind) {
  Kernel k;
#if DEA_BENCH_PEAK_X86
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (kind == Kind::bf16) {
    if (avx512 && __builtin_cpu_supports("avx512bf16"))
      k = {dp_avx512_bf16, 24.0 * 64.0, "avx512_bf16 zmm vdpbf16ps x24"};
  } else if (kind == Kind::fp32) {
    if (avx512)
      k = {fma_avx512_ps, 24.0 * 32.0, "avx512f zmm fma x24"};
    else if (avx2)
      k = {fma_avx2_ps, 12.0 * 16.0, "avx2 ymm fma x12"};
  } else {
    if (avx512)
      k = {fma_avx512_pd, 24.0 * 16.0, "avx512f zmm fma x24"};
    else if (avx2)
      k = {fma_avx2_pd, 12.0 * 8.0, "avx2 ymm fma x12"};
  }
#else
  (void)kind;
#endif
  return k;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

/// Whether this CPU has an instruction for `kind`'s probe.
inline bool peak_available(Kind kind) { return detail::pick(kind).run != nullptr; }

/// The peak of `kind` on `threads` threads at once (each thread runs its own chains): the best over `reps` rounds
/// of the total FLOP over the wall time of the round (all threads start together and the round ends when the last
/// one does), each round about `seconds` long, after a calibration round. The best, not the median: a round can
/// only be slowed down (another process taking the core for part of it), never sped up, and short rounds make an
/// undisturbed one likely even on a shared machine.
inline Peak measure_peak(Kind kind, int threads, int reps = 10, double seconds = 0.02) {
  const detail::Kernel k = detail::pick(kind);
  Peak p;
  if (!k.run) return p;
  p.available = true;
  p.isa = k.isa;
  // calibration: the iteration count of about `seconds` on one thread
  long iters = 1 << 14;
  volatile double sink = 0;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + k.run(iters);
    const double s = detail::seconds_since(t0);
    if (s >= seconds / 4 || iters >= (1L << 40)) {
      iters = std::max(1L, long(double(iters) * seconds / std::max(s, 1e-9)));
      break;
    }
    iters *= 4;
  }
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    double wall = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
      const auto t0 = std::chrono::steady_clock::now();
      const double v = k.run(iters);
#pragma omp barrier
      const double s = detail::seconds_since(t0);
#pragma omp critical
      {
        wall = std::max(wall, s);
        sink = sink + v;
      }
    }
    const int team = threads;
#else
    const auto t0 = std::chrono::steady_clock::now();
    sink = sink + k.run(iters);
    wall = detail::seconds_since(t0);
    const int team = 1;
#endif
    rates.push_back(double(team) * double(iters) * k.flop_per_iter / wall / 1e9);
  }
  p.gflops = *std::max_element(rates.begin(), rates.end());
  return p;
}

}  // namespace bench_peak
