// dea/nn/dropout.hpp: inverted dropout on activations whose mask is regenerated, never stored.
//
// Shapes: x [N, C] (any row-major block of activations), in place.
//   forward (training, p > 0):  x_k *= m_k,  m_k = 1/(1-p) with probability 1-p, else 0   (torch.nn.Dropout)
//   backward:                   g_k *= m_k   (the same mask)
// The forward draws one 64-bit seed from the caller's Rng; mask element k is the counter-based draw
// ops::counter_uniform(seed, k) < p (dropped). So the mask depends on the seed alone (not on the thread count or
// on how the work is split), chunks are drawn in parallel by a vectorised loop, and backward regenerates the mask
// from the saved seed: no [N, C] mask is kept between forward and backward. In evaluation mode (or p = 0) both
// passes are the identity and no random number is drawn.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../ops/dropout.hpp"

#include <algorithm>
#include <cstdint>

namespace dea {
namespace nn {

/// What a dropout forward leaves for its backward: whether it was active, and the seed of its mask.
struct DropoutState {
  bool active = false;
  double p = 0;
  std::uint64_t seed = 0;
};

namespace detail {

constexpr Index kDropoutChunk = 16384;  // elements per parallel task (the mask does not depend on it)

/// Multiplies the n values at x by the mask of (seed, p), in parallel chunks.
template <class S>
void apply_dropout_mask(S* x, Index n, const DropoutState& st) {
  const Index nchunk = (n + kDropoutChunk - 1) / kDropoutChunk;
  parallel_for(nchunk, [&](Index ch) {
    const Index k0 = ch * kDropoutChunk, k1 = std::min(n, k0 + kDropoutChunk);
    ops::counter_dropout_apply(x + k0, k1 - k0, st.seed, static_cast<std::uint64_t>(k0), st.p);
  }, n > kDropoutChunk);
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
    if (!training || p_ == 0) return st;
    check(rng != nullptr, "Dropout::forward: training with p = ", p_, " needs an Rng");
    st.active = true;
    st.p = p_;
    st.seed = rng->next_u64();
    detail::apply_dropout_mask(x.data(), x.size(), st);  // x = x .* m
    return st;
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
