// dea/nn/dropout.hpp: inverted dropout on activations whose mask is regenerated, never stored.
//
// Shapes: x [N, C] (any row-major block of activations), in place.
//   forward (training, p > 0):  x_k *= m_k,  m_k = 1/(1-p) with probability 1-p, else 0   (torch.nn.Dropout)
//   backward:                   g_k *= m_k   (the same mask)
// The forward draws one 64-bit seed from the caller's Rng; the mask element k comes from block k / 4096, whose
// own generator is seeded from (seed, block). So the mask depends on the seed and the size alone (not on the
// thread count), blocks are drawn in parallel, and backward regenerates the mask from the saved seed: no
// [N, C] mask is kept between forward and backward. In evaluation mode (or p = 0) both passes are the identity
// and no random number is drawn.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"

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

constexpr Index kDropoutBlock = 4096;

/// Multiplies the n values at x by the mask of (seed, p), block by block in parallel.
template <class S>
void apply_dropout_mask(S* x, Index n, const DropoutState& st) {
  const Index nblk = (n + kDropoutBlock - 1) / kDropoutBlock;
  const S keep = S(1) / (S(1) - S(st.p));
  parallel_for(nblk, [&](Index blk) {
    Rng r(st.seed ^ (0xd1b54a32d192ed03ULL * static_cast<std::uint64_t>(blk + 1)));
    const Index k0 = blk * kDropoutBlock, k1 = std::min(n, k0 + kDropoutBlock);
    for (Index k = k0; k < k1; ++k) x[k] = r.uniform() >= st.p ? x[k] * keep : S(0);
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
