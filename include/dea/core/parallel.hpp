// dea/core/parallel.hpp: thread control and the parallel loop used by the kernels.
//
// OpenMP is optional: without it every loop runs serially and the results are the same bits. Kernels
// parallelise over independent work items (one (batch, head) pair for attention) whose writes are disjoint;
// anything shared is reduced afterwards in a fixed order, so results never depend on the thread count.
#pragma once

#include "config.hpp"

#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dea {

/// Number of threads the library's parallel loops use.
inline int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Sets the threads for the library's loops and for Eigen's own products (n >= 1). Eigen sizes its team by
/// OpenMP's per-thread count (omp_get_max_threads) unless Eigen::setNbThreads was given a positive count, so this
/// leaves Eigen's own setting alone: ScopedSerialEigen below relies on it.
inline void set_num_threads(int n) {
  if (n < 1) n = 1;
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

/// True inside a parallel region (Eigen then runs its products single-threaded).
inline bool in_parallel() {
#ifdef _OPENMP
  return omp_in_parallel() != 0;
#else
  return false;
#endif
}

/// The precision of float matrix products: fp32, or bf16 operands with float accumulation.
enum class Precision { fp32, bf16 };

/// "fp32" or "bf16".
inline const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

/// Per-thread settings that the library's parallel loops (parallel_for, parallel_team) carry from the calling
/// thread into their worker threads for the duration of the loop.
struct ThreadSettings {
  /// Every matrix product of ops/gemm.hpp with at least one row takes the library's packed path, which computes
  /// each row of C with the same operations whatever the number of rows. A row's bits then do not depend on the
  /// other rows of its batch (a sequence gives the same numbers alone and in any batch of sequences). Off by
  /// default: below ops::packed::kMinRows rows Eigen's own product is faster, and its bits depend on the row count.
  bool batch_invariant_products = false;
  /// The precision of the matrix products of ops/gemm.hpp on float operands: Precision::bf16 rounds both operands
  /// to bf16 and accumulates in float (ops/packed_bf16.hpp); fp32 (the default) multiplies the floats themselves.
  /// Double products ignore it. The training and inference policies set it around the products they cover.
  Precision product_precision = Precision::fp32;
};

/// This thread's settings.
inline ThreadSettings& thread_settings() {
  thread_local ThreadSettings s;
  return s;
}

/// Turns ThreadSettings::batch_invariant_products on for the calling thread (and the library's loops it starts)
/// until the end of the scope.
class ScopedBatchInvariantProducts {
public:
  ScopedBatchInvariantProducts() : saved_(thread_settings().batch_invariant_products) {
    thread_settings().batch_invariant_products = true;
  }
  ~ScopedBatchInvariantProducts() { thread_settings().batch_invariant_products = saved_; }
  ScopedBatchInvariantProducts(const ScopedBatchInvariantProducts&) = delete;
  ScopedBatchInvariantProducts& operator=(const ScopedBatchInvariantProducts&) = delete;

private:
  bool saved_;
};

/// Sets ThreadSettings::product_precision for the calling thread (and the library's loops it starts) until the end
/// of the scope.
class ScopedPrecision {
public:
  explicit ScopedPrecision(Precision p) : saved_(thread_settings().product_precision) {
    thread_settings().product_precision = p;
  }
  ~ScopedPrecision() { thread_settings().product_precision = saved_; }
  ScopedPrecision(const ScopedPrecision&) = delete;
  ScopedPrecision& operator=(const ScopedPrecision&) = delete;

private:
  Precision saved_;
};

/// Eigen's own products on the calling thread run single-threaded until the end of the scope. The library's
/// fallback products (too few rows for the packed product) run Eigen's product; outside a parallel region Eigen
/// would start its own multi-threaded GEMM, whose blocking depends on the thread count (different bits) and whose
/// spinning made a two-thread prefill of a 16-token prompt ten times slower than one thread. OpenMP's thread count
/// is a per-thread setting, so this affects no other thread. It has no effect after Eigen::setNbThreads(n > 0).
class ScopedSerialEigen {
public:
  ScopedSerialEigen() {
#ifdef _OPENMP
    saved_ = omp_get_max_threads();
    if (saved_ > 1) omp_set_num_threads(1);
#endif
  }
  ~ScopedSerialEigen() {
#ifdef _OPENMP
    if (saved_ > 1) omp_set_num_threads(saved_);
#endif
  }
  ScopedSerialEigen(const ScopedSerialEigen&) = delete;
  ScopedSerialEigen& operator=(const ScopedSerialEigen&) = delete;

private:
  int saved_ = 1;
};

namespace detail {
/// Installs `s` on the current thread for the scope (a worker thread of a library loop), restoring its own after.
class AdoptThreadSettings {
public:
  explicit AdoptThreadSettings(const ThreadSettings& s) : saved_(thread_settings()) { thread_settings() = s; }
  ~AdoptThreadSettings() { thread_settings() = saved_; }
  AdoptThreadSettings(const AdoptThreadSettings&) = delete;
  AdoptThreadSettings& operator=(const AdoptThreadSettings&) = delete;

private:
  ThreadSettings saved_;
};
}  // namespace detail

/// Runs f(i) for i in [0, n), statically scheduled over the library's threads. With `worth_it` false (too
/// little work to pay for waking threads) the loop runs serially; the results are the same either way. The
/// workers run with the calling thread's ThreadSettings.
template <class F>
void parallel_for(Index n, F&& f, bool worth_it = true) {
#ifdef _OPENMP
  if (!(worth_it && n > 1) || in_parallel()) {
    for (Index i = 0; i < n; ++i) f(i);
    return;
  }
  const ThreadSettings settings = thread_settings();
#pragma omp parallel
  {
    const detail::AdoptThreadSettings adopt(settings);
#pragma omp for schedule(static)
    for (Index i = 0; i < n; ++i) f(i);
  }
#else
  (void)worth_it;
  for (Index i = 0; i < n; ++i) f(i);
#endif
}

/// Runs f(thread, team) once on each thread of a team of up to n threads (the team's size may be smaller: f must
/// split its work by `team`), or as f(0, 1) on the calling thread without OpenMP, with n <= 1 or inside a parallel
/// region. One region for several phases: between them f calls team_barrier() (every thread the same number of
/// times), which costs less than starting a region per phase. Nothing inside f may throw.
template <class F>
void parallel_team(int n, F&& f) {
#ifdef _OPENMP
  if (n > 1 && !in_parallel()) {
    const ThreadSettings settings = thread_settings();
#pragma omp parallel num_threads(n)
    {
      const detail::AdoptThreadSettings adopt(settings);
      f(omp_get_thread_num(), omp_get_num_threads());
    }
    return;
  }
#endif
  (void)n;
  f(0, 1);
}

/// Waits until every thread of the team running parallel_team's function has reached it (team > 1).
inline void team_barrier() {
#ifdef _OPENMP
#pragma omp barrier
#endif
}

/// Below this many floating-point operations a loop is not worth spreading over threads.
constexpr double kParallelMinFlops = 2e5;

}  // namespace dea
