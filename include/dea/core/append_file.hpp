// dea/core/append_file.hpp: a file that grows by whole records, each append flushed to disk before it returns
// (standard library and POSIX only). For outputs that a long run writes piece by piece and that an interrupted run
// continues (the oracle's cache, oracle/run.hpp).
//
// AppendFile(path, keep) opens path for appending, creating it when absent, after cutting it to its first `keep`
// bytes (what the caller verified: a torn last record is dropped this way). append(bytes) writes all the bytes with
// write(2) and then fsync(2)s the file, so after it returns they survive a crash; a crash during an append leaves
// the bytes before it and some prefix of the new ones. Without POSIX the fallback writes and flushes a stream.
#pragma once

#include "error.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>
#define DEA_APPEND_FILE_POSIX 1
#endif

namespace dea {

class AppendFile {
public:
  /// Opens `path` for appending after cutting it to `keep` bytes (the file must hold at least that many; 0 with a
  /// missing file creates it).
  AppendFile(const std::string& path, std::uint64_t keep) : path_(path) {
#if defined(DEA_APPEND_FILE_POSIX)
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd_ < 0) fail("cannot open '", path, "' for appending: ");
    const ::off_t end = ::lseek(fd_, 0, SEEK_END);
    if (end < 0) fail("cannot seek in '", path, "': ");
    if (static_cast<std::uint64_t>(end) < keep) {
      ::close(fd_);
      fd_ = -1;
      ::dea::detail::raise(::dea::detail::concat("'", path, "' holds ", static_cast<long long>(end), " bytes, fewer than the ", keep,
                                                 " to keep (it changed while it was read)"));
    }
    if (static_cast<std::uint64_t>(end) > keep) {
      if (::ftruncate(fd_, static_cast<::off_t>(keep)) != 0) fail("cannot cut '", path, "' to its complete records: ");
      if (::fsync(fd_) != 0) fail("fsync of '", path, "' failed: ");
    }
#else
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) std::ofstream(path, std::ios::binary).flush();
    const auto size = std::filesystem::file_size(path, ec);
    check(!ec, "cannot open '", path, "' for appending: ", ec.message());
    check(size >= keep, "'", path, "' holds ", size, " bytes, fewer than the ", keep, " to keep");
    if (size > keep) {
      std::filesystem::resize_file(path, keep, ec);
      check(!ec, "cannot cut '", path, "' to its complete records: ", ec.message());
    }
    out_.open(path, std::ios::binary | std::ios::app);
    check(static_cast<bool>(out_), "cannot open '", path, "' for appending");
#endif
  }

  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  ~AppendFile() {
#if defined(DEA_APPEND_FILE_POSIX)
    if (fd_ >= 0) ::close(fd_);
#endif
  }

  /// Appends `bytes` and flushes them to disk (see the file comment).
  void append(std::string_view bytes) {
#if defined(DEA_APPEND_FILE_POSIX)
    const char* p = bytes.data();
    std::size_t n = bytes.size();
    while (n > 0) {
      const ::ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("write to '", path_, "' failed: ");
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    if (::fsync(fd_) != 0) fail("fsync of '", path_, "' failed: ");
#else
    out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out_.flush();
    check(static_cast<bool>(out_), "write to '", path_, "' failed");
#endif
  }

  const std::string& path() const { return path_; }

private:
#if defined(DEA_APPEND_FILE_POSIX)
  template <class... A>
  [[noreturn]] void fail(const A&... a) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);  // unusable now (and a constructor that throws runs no destructor)
    fd_ = -1;
    ::dea::detail::raise(::dea::detail::concat(a..., why));
  }
  int fd_ = -1;
#else
  std::ofstream out_;
#endif
  std::string path_;
};

}  // namespace dea
