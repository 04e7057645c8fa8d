// tests/test_files.hpp: the file helpers of the tests that build model directories on disk (test_bert,
// test_deberta): a fresh temporary directory per test, a text file written, a file read back whole, and a model
// directory whose weights file was edited, refused by its loader with the expected messages.
#pragma once

#include <catch2/catch.hpp>
#include <dea/core/error.hpp>
#include <dea/io/safetensors.hpp>

#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

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

/// Writes `good` edited by `edit` as `dir`/model.safetensors and requires load(dir) to throw a dea::Error naming that
/// file and containing every one of `msgs`; removes `dir` afterwards.
inline void require_weights_refused(const std::string& dir, const dea::io::SafeTensors& good,
                                    const std::function<void(dea::io::SafeTensors&)>& edit,
                                    const std::function<void(const std::string&)>& load,
                                    const std::vector<std::string>& msgs) {
  dea::io::SafeTensors st = good;
  edit(st);
  st.save(dir + "/model.safetensors");
  try {
    load(dir);
    FAIL("the directory loaded");
  } catch (const dea::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(dir + "/model.safetensors") != std::string::npos);
    for (const std::string& m : msgs) CHECK(what.find(m) != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace dea_tests
