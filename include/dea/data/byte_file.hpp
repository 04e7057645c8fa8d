// dea/data/byte_file.hpp: a data file read by offset, so that a process holds only the bytes it uses (a training
// rank the windows of its micro-batches), and the index of a text file's lines, so that line k is read alone.
//
//   ByteFile f(path);                        // opened once; its size and modification time recorded
//   f.read(offset, n, out);                  // n bytes at offset (pread), checked against the file as opened
//   Fingerprint fp; f.fingerprint(fp);       // the same value as fp.add(whole file as one string), streamed
//   LineIndex ix(path);                      // one streaming pass: where each line starts
//   ix.line(k);                              // line k (its '\n' and a CR of CRLF removed), read alone
//
// Bad input is a dea::Error naming the file: a missing file or a directory; a read past the end; a file whose size
// or modification time is no longer the one recorded when it was opened (edited or truncated in place since: its
// fingerprint no longer describes it), checked at every read. A file replaced by rename keeps being read as opened
// (the open descriptor holds the old file). A last line without a final newline is a line like the others.
#pragma once

#include "../core/error.hpp"
#include "dalpha.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#else
#include <fstream>
#endif

namespace dea::data {

/// A file read by offset (see the file comment). Movable, not copyable; share it through a std::shared_ptr.
class ByteFile {
public:
  explicit ByteFile(const std::string& path) : path_(path) {
    std::error_code ec;
    check(!std::filesystem::is_directory(path, ec), "'", path, "' is a directory, not a file");
#if defined(__unix__) || defined(__APPLE__)
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd_ >= 0, "cannot open file '", path, "'");
    stamp_ = stamp();
#else
    in_.open(path, std::ios::binary);
    check(static_cast<bool>(in_), "cannot open file '", path, "'");
    stamp_ = stamp();
#endif
  }
  ~ByteFile() {
#if defined(__unix__) || defined(__APPLE__)
    if (fd_ >= 0) ::close(fd_);
#endif
  }
  ByteFile(const ByteFile&) = delete;
  ByteFile& operator=(const ByteFile&) = delete;

  const std::string& path() const { return path_; }
  /// The size when opened.
  std::uint64_t size() const { return stamp_.size; }

  /// n bytes at `offset` into `out` (dea::Error: beyond the end, or the file changed since it was opened).
  void read(std::uint64_t offset, std::size_t n, char* out) const {
    check(offset <= stamp_.size && n <= stamp_.size - offset, "'", path_, "': reading ", n, " bytes at offset ", offset,
          " of a file of ", stamp_.size, " bytes");
    check_unchanged();
    std::size_t got = 0;
#if defined(__unix__) || defined(__APPLE__)
    while (got < n) {
      const ::ssize_t r = ::pread(fd_, out + got, n - got, static_cast<::off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      check(r >= 0, "'", path_, "': read failed at offset ", offset + got, ": ", std::strerror(errno));
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
#else
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(out, static_cast<std::streamsize>(n));
    got = static_cast<std::size_t>(in_.gcount());
#endif
    check(got == n, "'", path_, "': the file ended after ", offset + got, " bytes (", stamp_.size,
          " when opened): it was truncated");
  }
  std::string read(std::uint64_t offset, std::size_t n) const {
    std::string s(n, '\0');
    if (n) read(offset, n, &s[0]);
    return s;
  }

  /// Adds the whole file to `fp` as one field, exactly as fp.add(its contents) does, reading it in blocks.
  Fingerprint& fingerprint(Fingerprint& fp, std::size_t block = std::size_t(1) << 20) const {
    fp.add_u64(stamp_.size);
    std::vector<char> buf(std::max<std::size_t>(1, block));
    for (std::uint64_t at = 0; at < stamp_.size;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), stamp_.size - at));
      read(at, n, buf.data());
      fp.add_bytes(buf.data(), n);
      at += n;
    }
    return fp;
  }

  /// dea::Error when the file's size or modification time differs from when it was opened.
  void check_unchanged() const {
    const Stamp now = stamp();
    check(now.size == stamp_.size && now.mtime_ns == stamp_.mtime_ns, "'", path_, "' changed while in use (",
          stamp_.size, " bytes when opened, ", now.size, " now, or rewritten in place): its fingerprint no longer "
          "describes it");
  }

private:
  struct Stamp {
    std::uint64_t size = 0;
    std::int64_t mtime_ns = 0;
  };
  Stamp stamp() const {
    Stamp s;
#if defined(__unix__) || defined(__APPLE__)
    struct ::stat st;
    check(::fstat(fd_, &st) == 0, "'", path_, "': cannot read its size: ", std::strerror(errno));
    s.size = static_cast<std::uint64_t>(st.st_size);
#if defined(__APPLE__)
    s.mtime_ns = static_cast<std::int64_t>(st.st_mtimespec.tv_sec) * 1000000000 + st.st_mtimespec.tv_nsec;
#else
    s.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
#endif
#else
    std::error_code ec;
    s.size = static_cast<std::uint64_t>(std::filesystem::file_size(path_, ec));
    check(!ec, "'", path_, "': cannot read its size: ", ec.message());
    s.mtime_ns = static_cast<std::int64_t>(std::filesystem::last_write_time(path_, ec).time_since_epoch().count());
#endif
    return s;
  }

  std::string path_;
#if defined(__unix__) || defined(__APPLE__)
  int fd_ = -1;
#else
  mutable std::ifstream in_;
#endif
  Stamp stamp_;
};

/// Where each line of a text file starts (see the file comment), found in one streaming pass; line k is then read
/// alone. A line longer than `max_line` bytes is a dea::Error naming the file and the line.
class LineIndex {
public:
  explicit LineIndex(const std::string& path, std::size_t max_line = std::size_t(1) << 30)
      : file_(std::make_shared<ByteFile>(path)), max_line_(max_line) {
    const std::uint64_t n = file_->size();
    std::vector<char> buf(std::size_t(1) << 20);
    std::uint64_t start = 0;
    for (std::uint64_t at = 0; at < n;) {
      const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), n - at));
      file_->read(at, m, buf.data());
      for (std::size_t i = 0; i < m; ++i)
        if (buf[i] == '\n') {
          add(start, at + i);
          start = at + i + 1;
        }
      at += m;
    }
    if (start < n) add(start, n);  // a last line without its newline
  }

  std::size_t size() const { return starts_.size(); }
  const ByteFile& file() const { return *file_; }

  /// Line k (0-based) without its '\n' or a final CR.
  std::string line(std::size_t k) const {
    check(k < starts_.size(), "'", file_->path(), "': line ", k + 1, " of ", starts_.size());
    std::string s = file_->read(starts_[k], static_cast<std::size_t>(ends_[k] - starts_[k]));
    if (!s.empty() && s.back() == '\r') s.pop_back();
    return s;
  }
  /// Calls f(line, k) for each line k in order, each read alone (one line held at a time).
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t k = 0; k < starts_.size(); ++k) f(line(k), k);
  }

private:
  void add(std::uint64_t start, std::uint64_t end) {
    check(end - start <= max_line_, file_->path(), ":", starts_.size() + 1, ": line longer than ", max_line_, " bytes");
    starts_.push_back(start);
    ends_.push_back(end);
  }

  std::shared_ptr<ByteFile> file_;
  std::size_t max_line_;
  std::vector<std::uint64_t> starts_, ends_;
};

}  // namespace dea::data
