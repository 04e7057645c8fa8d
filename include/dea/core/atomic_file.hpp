// dea/core/atomic_file.hpp: writing a file atomically (standard library and POSIX only).
//
// The bytes go to a fresh temporary file next to the target ("<path>.tmp.<pid>.<n>", created exclusively), are
// flushed to disk (fsync), and the temporary is renamed over the target; then the directory is synced (best
// effort). A crash at any moment leaves either the old or the new complete file under the target's name; a
// failure removes the temporary and leaves the target untouched. Without POSIX the fallback writes, flushes and
// renames (the standard library has no fsync).
#pragma once

#include "error.hpp"

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <unistd.h>
#define DEA_ATOMIC_FILE_POSIX 1
#endif

namespace dea {

/// Writes `path` atomically (see the file comment). `produce(write)` is called once; it emits the content through
/// write(const void* data, std::size_t n), in as many pieces as it likes. Every error is a dea::Error whose
/// message starts with `context` (e.g. "safetensors 'x': ") and names the temporary file and the failed step.
template <class Produce>
void write_file_atomic_with(const std::string& path, Produce&& produce, const std::string& context = "") {
  check(!path.empty(), context, "cannot write to an empty path");
  static std::atomic<unsigned> counter{0};
#if defined(DEA_ATOMIC_FILE_POSIX)
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = ::dea::detail::concat(path, ".tmp.", static_cast<long>(::getpid()), ".", counter.fetch_add(1));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // mode reduced by the umask
    if (fd < 0 && errno != EEXIST)
      ::dea::detail::raise(::dea::detail::concat(context, "cannot create the temporary file '", tmp,
                                                 "' for writing: ", std::strerror(errno)));
  }
  check(fd >= 0, context, "cannot create a temporary file next to '", path, "' (all candidate names exist)");
  auto fail = [&](const char* what) {
    ::dea::detail::raise(::dea::detail::concat(context, what, " '", tmp, "' failed: ", std::strerror(errno)));
  };
  try {
    produce([&](const void* data, std::size_t n) {
      const char* p = static_cast<const char*>(data);
      while (n > 0) {
        const ::ssize_t w = ::write(fd, p, n);
        if (w < 0) {
          if (errno == EINTR) continue;
          fail("write to");
        }
        p += w;
        n -= static_cast<std::size_t>(w);
      }
    });
    if (::fsync(fd) != 0) fail("fsync of");
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) fail("close of");
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename (over the target) of");
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename durable too (best effort: some file systems refuse fsync on a directory).
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
#else
  const std::string tmp = ::dea::detail::concat(path, ".tmp.", counter.fetch_add(1));
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      check(static_cast<bool>(out), context, "cannot create the temporary file '", tmp, "' for writing");
      produce([&](const void* data, std::size_t n) {
        out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
      });
      out.flush();
      check(static_cast<bool>(out), context, "write to '", tmp, "' failed");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    check(!ec, context, "rename (over the target) of '", tmp, "' failed: ", ec.message());
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
#endif
}

}  // namespace dea
