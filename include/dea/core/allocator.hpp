// dea/core/allocator.hpp: one process-wide setting of the C allocator for long training runs.
//
// A training step allocates and frees the same large activation and gradient matrices every step. With glibc's
// defaults, blocks above the (adaptive) mmap threshold are mapped and unmapped on every allocation and the top
// of the heap is returned to the system whenever 128 KiB are free there, so each step takes its memory back
// from the kernel page by page: measured at the paper configuration, a quarter of the step's CPU time went to
// page faults. retain_freed_memory() asks malloc to keep freed memory for reuse instead. It changes no result,
// only where memory comes from; the peak resident size stays about the same (the same blocks are reused).
// glibc caps the mmap threshold at 32 MiB, and the paper configuration's [4096, 2048] float activations are
// 32 MiB plus a header, so those were still mapped one by one. By default the setting now also serves every
// block, however large, from the heap (M_MMAP_MAX = 0; glibc still maps memory when the heap cannot grow).
// Measured: a one-thread paper step 11-24 % faster in seven paired runs, and perf's samples in the kernel's
// page-fault path fell from about 200 ms per step to none.
// It is a process-wide choice, so the library never makes it by itself: programs call it (`dea train` and
// bench/bench_train do).
#pragma once

#include <cstddef>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dea {

/// Keeps freed blocks of up to `mmap_threshold` bytes in the heap (glibc caps this at 32 MiB on 64-bit
/// systems) and stops trimming the heap's top below `trim_threshold` bytes; with `large_blocks_too`, larger
/// blocks come from the heap as well instead of being mapped one by one. Returns false (and does nothing more
/// after the first refusal) where the C library is not glibc or refuses a value (AddressSanitizer's allocator
/// refuses every setting).
inline bool retain_freed_memory(std::size_t mmap_threshold = std::size_t(32) << 20,
                                std::size_t trim_threshold = std::size_t(1) << 30, bool large_blocks_too = true) {
#if defined(__GLIBC__)
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) != 1) return false;
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) != 1) return false;
  return !large_blocks_too || mallopt(M_MMAP_MAX, 0) == 1;
#else
  (void)mmap_threshold;
  (void)trim_threshold;
  (void)large_blocks_too;
  return false;
#endif
}

}  // namespace dea
