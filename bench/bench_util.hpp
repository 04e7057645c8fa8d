// bench/bench_util.hpp: small helpers the benchmark programs share (peak memory, load average, the GEMM
// yardstick).
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <vector>

#include <sys/resource.h>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bench_util {

/// Peak resident set size of this process so far, in MiB (getrusage ru_maxrss).
inline double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

/// 1-minute load average (-1 when /proc/loadavg is not readable).
inline double load1() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  if (f) f >> l;
  return l;
}

/// The machine's compute ceiling measured in the same run: summed GFLOP/s of independent single-thread float
/// 256x256x256 products (Eigen), one per thread on `threads` threads at once; the median of `reps` rounds after one
/// warm-up round.
inline double yardstick_gflops(int threads, int reps = 3) {
  const Eigen::Index n = 256;
  const int iters = 40;
  // Eigen parallelises a product itself outside an active parallel region, and a region of one thread is not
  // active: without this the one-thread yardstick ran Eigen's two-thread product (slow and noisy)
  Eigen::setNbThreads(1);
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; ++r) {
    double total = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
    {
      Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
      c.noalias() = a * b;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        c.noalias() = a * b;
        a(0, 0) += c(1, 1) * 1e-30f;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      total += 2.0 * double(n) * n * n * iters / s / 1e9;
    }
    if (r > 0) rates.push_back(total);
  }
  Eigen::setNbThreads(0);  // Eigen follows OpenMP's per-thread count again (dea::ScopedSerialEigen needs that)
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace bench_util
