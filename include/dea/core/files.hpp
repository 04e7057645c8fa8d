// dea/core/files.hpp: plain file reading and atomic writing (standard library and POSIX only).
//
// Reading loads a whole file (data files here are small: vocabularies, task files, caches), after checking its
// size against a maximum, and splits it into lines; every error names the file. Writing goes to a temporary
// file that is flushed to disk and renamed over the target, so a crash never leaves a half-written file under
// the real name.
#pragma once

#include "atomic_file.hpp"
#include "error.hpp"

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>


namespace dea {

/// Largest file read_file loads by default (2 GiB); callers that know their format pass a smaller limit.
constexpr std::size_t kMaxFileBytes = std::size_t(1) << 31;

/// Reads a whole file as bytes; throws dea::Error naming the file when it cannot be opened or read, or when
/// it is larger than `max_bytes` (checked against the file's size before anything is allocated).
inline std::string read_file(const std::string& path, std::size_t max_bytes = kMaxFileBytes) {
  std::error_code ec;
  check(!std::filesystem::is_directory(path, ec), "'", path, "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "cannot open file '", path, "'");
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0, std::ios::beg);
  if (in && end >= 0) {
    // A regular file: its size is known, so the limit is checked before allocating.
    check(static_cast<std::uint64_t>(end) <= max_bytes, "file '", path, "' is ", static_cast<std::uint64_t>(end),
          " bytes, more than the maximum of ", max_bytes, " for this kind of file");
    std::string out(static_cast<std::size_t>(end), '\0');
    in.read(out.data(), static_cast<std::streamsize>(out.size()));
    check(!in.bad() && static_cast<std::size_t>(in.gcount()) == out.size(), "error while reading file '", path,
          "' (", in.gcount(), " of ", out.size(), " bytes read; truncated while reading?)");
    return out;
  }
  // Not seekable (a pipe): read in blocks up to the limit.
  in.clear();
  std::string out;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out.append(buf, static_cast<std::size_t>(in.gcount()));
    check(out.size() <= max_bytes, "file '", path, "' is more than the maximum of ", max_bytes,
          " bytes for this kind of file");
  }
  check(!in.bad(), "error while reading file '", path, "'");
  return out;
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

/// Writes `content` to `path` atomically (core/atomic_file.hpp: temporary file, fsync, rename); a crash at any
/// point leaves either the old or the new complete file under `path`. On failure `path` is untouched.
inline void write_file_atomic(const std::string& path, std::string_view content) {
  check(!path.empty(), "write_file_atomic: empty path");
  write_file_atomic_with(path, [&](auto&& write) { write(content.data(), content.size()); });
}

/// Removes leading and trailing ASCII whitespace.
inline std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n\v\f";
  const std::size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const std::size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

}  // namespace dea
