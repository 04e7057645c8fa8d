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

/// Sets the threads for the library's loops and for Eigen's own products (n >= 1).
inline void set_num_threads(int n) {
  if (n < 1) n = 1;
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  Eigen::setNbThreads(n);
}

/// True inside a parallel region (Eigen then runs its products single-threaded).
inline bool in_parallel() {
#ifdef _OPENMP
  return omp_in_parallel() != 0;
#else
  return false;
#endif
}

/// Runs f(i) for i in [0, n), statically scheduled over the library's threads. With `worth_it` false (too
/// little work to pay for waking threads) the loop runs serially; the results are the same either way.
template <class F>
void parallel_for(Index n, F&& f, bool worth_it = true) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (worth_it && n > 1)
  for (Index i = 0; i < n; ++i) f(i);
#else
  (void)worth_it;
  for (Index i = 0; i < n; ++i) f(i);
#endif
}

/// Below this many floating-point operations a loop is not worth spreading over threads.
constexpr double kParallelMinFlops = 2e5;

}  // namespace dea
