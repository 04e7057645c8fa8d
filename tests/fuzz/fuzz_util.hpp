// tests/fuzz/fuzz_util.hpp: helpers shared by the libFuzzer targets.
//
// The file loaders take a path, so a target writes its input to a temporary file of its own (one per process,
// named after the target and the process id) and hands the path to the loader under test. Every target
// catches dea::Error (a rejected input is a correct outcome) and lets anything else escape: a crash, a
// sanitizer report, a leak, another exception type or a failed property (fuzz_require) is a finding.
#pragma once

#include <dea/core/error.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <unistd.h>

namespace dea_fuzz {

/// A path in the temporary directory, unique to this process and `tag`, removed at exit.
struct TempPath {
  std::string path;
  explicit TempPath(const std::string& tag)
      : path((std::filesystem::temp_directory_path() / ("dea_fuzz_" + tag + "_" + std::to_string(::getpid())))
                 .string()) {}
  ~TempPath() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

/// This process's temporary path for `tag` (the same path for every call with the same tag).
inline const std::string& temp_path(const std::string& tag) {
  static std::map<std::string, TempPath> paths;
  auto it = paths.find(tag);
  if (it == paths.end()) it = paths.try_emplace(tag, tag).first;
  return it->second.path;
}

/// Writes `size` bytes to this process's temporary file for `tag` and returns its path.
inline const std::string& write_temp(const std::string& tag, const std::uint8_t* data, std::size_t size) {
  const std::string& path = temp_path(tag);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
  return path;
}

/// A property every accepted input must have; a violation aborts, which libFuzzer reports as a crash.
inline void fuzz_require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace dea_fuzz
