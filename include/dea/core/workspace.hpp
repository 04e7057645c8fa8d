// dea/core/workspace.hpp: carving aligned pieces out of a pre-sized scratch buffer.
//
// Kernels that must not allocate in their hot path take their temporaries from a buffer sized once at set-up
// (a cache member, or caller-owned memory such as a static array on a microcontroller). Every piece starts on
// Eigen's maximal alignment (EIGEN_MAX_ALIGN_BYTES), as a freshly allocated Eigen matrix does, so maps of the
// pieces are declared aligned (Eigen::AlignedMax) and vectorised loops split them exactly as they split a
// temporary matrix: the results are the same bits.
#pragma once

#include "config.hpp"
#include "error.hpp"

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>

namespace dea {

/// Alignment in bytes of every piece handed out by a Workspace (at least alignof(std::max_align_t)).
constexpr std::size_t kWorkspaceAlign =
    EIGEN_MAX_ALIGN_BYTES > alignof(std::max_align_t) ? EIGEN_MAX_ALIGN_BYTES : alignof(std::max_align_t);

/// Number of elements of type T a piece of n elements occupies (n rounded up to the alignment).
template <class T>
constexpr Index aligned_count(Index n) {
  static_assert(kWorkspaceAlign % sizeof(T) == 0 || sizeof(T) % kWorkspaceAlign == 0,
                "aligned_count: the element size must divide the alignment");
  const Index per = sizeof(T) >= kWorkspaceAlign ? 1 : static_cast<Index>(kWorkspaceAlign / sizeof(T));
  return (n + per - 1) / per * per;
}

/// Hands out consecutive aligned pieces of a buffer of `capacity` elements of T. The buffer must itself be
/// aligned to kWorkspaceAlign (AlignedVec and `alignas(dea::kWorkspaceAlign)` arrays are). Taking more than
/// the capacity is a dea::Error (a set-up that sized the buffer too small), never an overrun.
template <class T>
class Workspace {
public:
  Workspace() = default;
  Workspace(T* base, Index capacity) : base_(base), cap_(capacity) {
    check(base != nullptr || capacity == 0, "Workspace: null buffer with capacity ", capacity);
    check(reinterpret_cast<std::uintptr_t>(base) % kWorkspaceAlign == 0, "Workspace: the buffer must be aligned to ",
          kWorkspaceAlign, " bytes");
  }

  /// The next n elements (aligned). Throws dea::Error when the buffer is too small.
  T* take(Index n) {
    const Index need = aligned_count<T>(n);
    check(used_ + need <= cap_, "Workspace: ", need, " more elements needed, only ", cap_ - used_, " of ", cap_,
          " left (the workspace was sized for smaller inputs)");
    T* p = base_ + used_;
    used_ += need;
    return p;
  }

  Index used() const { return used_; }
  Index capacity() const { return cap_; }

private:
  T* base_ = nullptr;
  Index cap_ = 0;
  Index used_ = 0;
};

/// Counts what a sequence of take() calls will need (the set-up's dry run of a kernel's scratch layout).
template <class T>
class WorkspaceSize {
public:
  void take(Index n) { total_ += aligned_count<T>(n); }
  Index total() const { return total_; }

private:
  Index total_ = 0;
};

}  // namespace dea
