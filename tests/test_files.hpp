// tests/test_files.hpp: the file helpers of the tests that build model directories on disk (test_bert,
// test_deberta): a fresh temporary directory per test, a text file written, a file read back whole.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>

namespace dea_tests {

/// A fresh, empty directory under the system's temporary directory, named by the test file (`area`), the process
/// and `name`.
inline std::string fresh_dir(const std::string& area, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / ("dea_test_" + area + "_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  REQUIRE(f.good());
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace dea_tests
