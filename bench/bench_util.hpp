// bench/bench_util.hpp: small helpers the benchmark programs share (command-line lists, peak memory).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>

namespace bench_util {

/// Peak resident set size of this process so far, in MiB (getrusage ru_maxrss).
inline double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

/// The non-empty pieces of `s` between separators `sep` ("1,2" -> {"1", "2"}).
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace bench_util
