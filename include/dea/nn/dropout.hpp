// dea/nn/dropout.hpp: inverted dropout on activations, its mask kept as one bit per element.
//
// Shapes: x [N, C] (any row-major block of activations), in place.
//   forward (training, p > 0):  x_k *= m_k,  m_k = 1/(1-p) with probability 1-p, else 0   (torch.nn.Dropout)
//   backward:                   g_k *= m_k   (the same mask)
// The forward draws one 64-bit seed from the caller's Rng; mask element k is the counter-based draw
// ops::counter_uniform(seed, k) < p (dropped). So the mask depends on the seed alone (not on the thread count or
// on how the work is split), and chunks are drawn in parallel by a vectorised loop. The forward also keeps the
// mask as bits in the DropoutState (N C / 8 bytes), so backward (and `apply`) multiply without hashing every
// element again: hashing costs about four times as much as applying the bits. A state without the bits (one built
// by hand from a seed) regenerates the mask from the seed: the same values. In evaluation mode (or p = 0) both
// passes are the identity and no random number is drawn.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/dropout.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dea {
namespace nn {

/// What a dropout forward leaves for its backward: whether it was active, the seed of its mask, and the mask as bits
/// (bit k % 32 of kept[k / 32] is 1 when element k was kept; empty for a state made by hand, then the mask is
/// regenerated from the seed).
struct DropoutState {
  bool active = false;
  double p = 0;
  std::uint64_t seed = 0;
  std::vector<std::uint32_t> kept;
};

namespace detail {

constexpr Index kDropoutChunk = 16384;  // elements per parallel task (a multiple of 32; the mask does not depend on it)
static_assert(kDropoutChunk % 32 == 0, "a chunk must own whole words of the bit mask");

/// Runs f(k0, k1) over the parallel chunks of [0, n).
template <class F>
void for_dropout_chunks(Index n, F&& f) {
  const Index nchunk = (n + kDropoutChunk - 1) / kDropoutChunk;
  parallel_for(nchunk, [&](Index ch) {
    const Index k0 = ch * kDropoutChunk;
    f(k0, std::min(n, k0 + kDropoutChunk));
  }, n > kDropoutChunk);
}

/// Multiplies the n values at x by the mask of st: from its bits when they cover n values, else from (seed, p).
template <class S>
void apply_dropout_mask(S* x, Index n, const DropoutState& st) {
  const bool bits = Index(st.kept.size()) * 32 >= n;
  for_dropout_chunks(n, [&](Index k0, Index k1) {
    if (bits)
      ops::dropout_apply_bits(x + k0, k1 - k0, st.kept.data() + k0 / 32, st.p);
    else
      ops::counter_dropout_apply(x + k0, k1 - k0, st.seed, static_cast<std::uint64_t>(k0), st.p);
  });
}

}  // namespace detail

/// Inverted dropout with probability p (in [0, 1)). Stateless apart from p; the per-call state is a DropoutState.
class Dropout {
public:
  explicit Dropout(double p = 0) : p_(p) {
    check(p >= 0 && p < 1, "Dropout: p: expected a probability in [0, 1), got ", p);
  }
  double p() const { return p_; }

  /// In place on x [N, C]. Active when `training` and p > 0; then it needs `rng` (one u64 is drawn).
  template <class S>
  DropoutState forward(Mat<S>& x, bool training, Rng* rng) const {
    DropoutState st;
    forward(x, training, rng, st);
    return st;
  }

  /// The same into `st` (a layer's cache keeps it between steps, so the bit mask's storage is reused).
  template <class S>
  void forward(Mat<S>& x, bool training, Rng* rng, DropoutState& st) const {
    st.active = false;
    st.p = 0;
    st.seed = 0;
    st.kept.clear();
    if (!training || p_ == 0) return;
    check(rng != nullptr, "Dropout::forward: training with p = ", p_, " needs an Rng");
    st.active = true;
    st.p = p_;
    st.seed = rng->next_u64();
    const Index n = x.size();
    st.kept.resize(static_cast<std::size_t>((n + 31) / 32));
    S* xp = x.data();
    std::uint32_t* kp = st.kept.data();
    detail::for_dropout_chunks(n, [&](Index k0, Index k1) {  // x = x .* m, and the bits of m
      ops::counter_dropout_apply_bits(xp + k0, k1 - k0, st.seed, static_cast<std::uint64_t>(k0), st.p, kp + k0 / 32);
    });
  }

  /// In place on g [N, C] = dL/dy  ->  dL/dx = g .* m (the forward's mask; identity when it was inactive).
  template <class S>
  static void backward(Mat<S>& g, const DropoutState& st) {
    if (st.active) detail::apply_dropout_mask(g.data(), g.size(), st);  // y = x .* m  ->  dx = dy .* m
  }

  /// Applies the mask of `st` to another array of the same size (e.g. to recompute a dropped activation).
  template <class S>
  static void apply(Mat<S>& x, const DropoutState& st) {
    if (st.active) detail::apply_dropout_mask(x.data(), x.size(), st);
  }

private:
  double p_;
};

}  // namespace nn
}  // namespace dea
