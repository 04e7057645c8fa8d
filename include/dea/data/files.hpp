// dea/data/files.hpp: plain file reading and atomic writing for the data pipeline (standard library only).
//
// Reading loads a whole file (data files here are small: vocabularies, task files, caches) and splits it into
// lines; every error names the file. Writing goes to "<path>.tmp" and is renamed over the target, so a crash
// never leaves a half-written file under the real name.
#pragma once

#include "../core/error.hpp"

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dea::data {

/// Reads a whole file as bytes; throws dea::Error naming the file when it cannot be opened or read.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "cannot open file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  check(!in.bad(), "error while reading file '", path, "'");
  return ss.str();
}

/// Splits text into lines on '\n'; a trailing '\r' is removed from each line (CRLF files), a final empty
/// line after the last '\n' is not reported. Line i of the result is line i+1 of the file.
inline std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.emplace_back(line);
    start = end + 1;
  }
  return lines;
}

/// Reads a file and splits it into lines (see split_lines).
inline std::vector<std::string> read_lines(const std::string& path) { return split_lines(read_file(path)); }

/// Writes `content` to `path` atomically: to "<path>.tmp" first, then renamed over `path`.
inline void write_file_atomic(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    check(static_cast<bool>(out), "cannot open '", tmp, "' for writing");
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      detail::raise("error while writing '" + tmp + "'");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    detail::raise("cannot rename '" + tmp + "' to '" + path + "'");
  }
}

/// Removes leading and trailing ASCII whitespace.
inline std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n\v\f";
  const std::size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const std::size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace dea::data
