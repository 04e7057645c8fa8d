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

/// Runs f(thread, team) once on each thread of a team of up to n threads (the team's size may be smaller: f must
/// split its work by `team`), or as f(0, 1) on the calling thread without OpenMP, with n <= 1 or inside a parallel
/// region. One region for several phases: between them f calls team_barrier() (every thread the same number of
/// times), which costs less than starting a region per phase. Nothing inside f may throw.
template <class F>
void parallel_team(int n, F&& f) {
#ifdef _OPENMP
  if (n > 1 && !in_parallel()) {
#pragma omp parallel num_threads(n)
    f(omp_get_thread_num(), omp_get_num_threads());
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
