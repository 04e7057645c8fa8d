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
//
// Two fused forms for a residual block save a pass over the array each: forward_add (out = x + Dropout(a)) and
// backward_into (out = g .* m, g unchanged). Each chunk is masked and then added or copied while it is in the
// cache; the values are those of the separate passes, bit for bit.
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

/// Multiplies x[k0, k1) (a chunk of for_dropout_chunks) by the mask of st: from its bits when `bits`, else from
/// (seed, p).
template <class S>
void apply_dropout_chunk(S* x, Index k0, Index k1, const DropoutState& st, bool bits) {
  if (bits)
    ops::dropout_apply_bits(x + k0, k1 - k0, st.kept.data() + k0 / 32, st.p);
  else
    ops::counter_dropout_apply(x + k0, k1 - k0, st.seed, static_cast<std::uint64_t>(k0), st.p);
}

/// Multiplies the n values at x by the mask of st: from its bits when they cover n values, else from (seed, p).
template <class S>
void apply_dropout_mask(S* x, Index n, const DropoutState& st) {
  const bool bits = Index(st.kept.size()) * 32 >= n;
  for_dropout_chunks(n, [&](Index k0, Index k1) { apply_dropout_chunk(x, k0, k1, st, bits); });
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
    const Index n = x.size();
    if (!start(training, rng, n, st)) return;
    S* xp = x.data();
    std::uint32_t* kp = st.kept.data();
    detail::for_dropout_chunks(n, [&](Index k0, Index k1) {  // x = x .* m, and the bits of m
      ops::counter_dropout_apply_bits(xp + k0, k1 - k0, st.seed, static_cast<std::uint64_t>(k0), st.p, kp + k0 / 32);
    });
  }

  /// out = x + Dropout(a), the add of a residual block in the same pass (a, x, out [N, C]; out is resized and may
  /// be a or x); a is left holding Dropout(a) unless out is a. The same values and state as forward(a, ...) then
  /// out = x + a.
  template <class S>
  void forward_add(Mat<S>& a, const Mat<S>& x, bool training, Rng* rng, DropoutState& st, Mat<S>& out) const {
    check(x.rows() == a.rows() && x.cols() == a.cols(), "Dropout::forward_add: x is [", x.rows(), ", ", x.cols(),
          "], the dropped branch [", a.rows(), ", ", a.cols(), "]");
    const Index n = a.size();
    const bool active = start(training, rng, n, st);
    out.resize(a.rows(), a.cols());  // a no-op when out is a or x
    S* ap = a.data();
    const S* xp = x.data();
    S* op = out.data();
    std::uint32_t* kp = st.kept.data();
    detail::for_dropout_chunks(n, [&](Index k0, Index k1) {
      if (active)
        ops::counter_dropout_apply_bits(ap + k0, k1 - k0, st.seed, static_cast<std::uint64_t>(k0), st.p, kp + k0 / 32);
      for (Index k = k0; k < k1; ++k) op[k] = xp[k] + ap[k];
    });
  }

  /// In place on g [N, C] = dL/dy  ->  dL/dx = g .* m (the forward's mask; identity when it was inactive).
  template <class S>
  static void backward(Mat<S>& g, const DropoutState& st) {
    if (st.active) detail::apply_dropout_mask(g.data(), g.size(), st);  // y = x .* m  ->  dx = dy .* m
  }

  /// out = g .* m (the forward's mask; a copy when it was inactive) with g unchanged: the copy and the mask in one
  /// pass. out is resized; it must not be g.
  template <class S>
  static void backward_into(const Mat<S>& g, const DropoutState& st, Mat<S>& out) {
    check(&out != &g, "Dropout::backward_into: out must not be the gradient it reads");
    out.resize(g.rows(), g.cols());
    const Index n = g.size();
    const bool bits = Index(st.kept.size()) * 32 >= n;
    const S* gp = g.data();
    S* op = out.data();
    detail::for_dropout_chunks(n, [&](Index k0, Index k1) {
      std::copy(gp + k0, gp + k1, op + k0);
      if (st.active) detail::apply_dropout_chunk(op, k0, k1, st, bits);
    });
  }

  /// Applies the mask of `st` to another array of the same size (e.g. to recompute a dropped activation).
  template <class S>
  static void apply(Mat<S>& x, const DropoutState& st) {
    if (st.active) detail::apply_dropout_mask(x.data(), x.size(), st);
  }

private:
  /// Resets st for a pass over n values; when the pass is active (training, p > 0) draws its seed from rng and sizes
  /// the bits. Returns whether it is active.
  bool start(bool training, Rng* rng, Index n, DropoutState& st) const {
    st.active = false;
    st.p = 0;
    st.seed = 0;
    st.kept.clear();
    if (!training || p_ == 0) return false;
    check(rng != nullptr, "Dropout: training with p = ", p_, " needs an Rng");
    st.active = true;
    st.p = p_;
    st.seed = rng->next_u64();
    st.kept.resize(static_cast<std::size_t>((n + 31) / 32));
    return true;
  }

  double p_;
};

}  // namespace nn
}  // namespace dea
