// dea/ops/dropout.hpp: inverted dropout masks.
//
// Shapes: mask [n] (flat; an attention layer uses [B, H, Tq, Tk]). Each element is 1/(1-p) with probability
// 1-p and 0 with probability p (inverted scaling, as torch.nn.Dropout in training mode), so E[mask] = 1 and
// nothing needs rescaling at inference. The mask is drawn serially in index order from the caller's Rng, so
// it depends on the seed alone, never on the thread count.
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"

#include <cmath>

namespace dea {
namespace ops {

/// Throws dea::Error naming `what` unless 0 <= p < 1.
template <class S>
inline void check_dropout_probability(S p, const char* what) {
  check(p >= S(0) && p < S(1), what, ": expected a dropout probability in [0, 1), got ", p);
}

/// mask[k] = 1/(1-p) if rng.uniform() >= p else 0, for k = 0..n-1 in order.
template <class S>
void dropout_mask(Vec<S>& mask, Index n, S p, Rng& rng) {
  check_dropout_probability(p, "dropout_mask: p");
  mask.resize(n);
  const S keep_scale = S(1) / (S(1) - p);
  const double pd = static_cast<double>(p);
  for (Index k = 0; k < n; ++k) mask[k] = rng.uniform() >= pd ? keep_scale : S(0);
}

}  // namespace ops
}  // namespace dea
