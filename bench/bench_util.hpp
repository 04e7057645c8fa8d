// bench/bench_util.hpp: small helpers the benchmark programs share (peak memory).
#pragma once

#include <sys/resource.h>

namespace bench_util {

/// Peak resident set size of this process so far, in MiB (getrusage ru_maxrss).
inline double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

}  // namespace bench_util
