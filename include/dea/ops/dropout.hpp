// dea/ops/dropout.hpp: inverted dropout masks.
//
// Shapes: mask [n] (flat; an attention layer uses [B, H, Tq, Tk]). Each element is 1/(1-p) with probability
// 1-p and 0 with probability p (inverted scaling, as torch.nn.Dropout in training mode), so E[mask] = 1 and
// nothing needs rescaling at inference. The mask is drawn serially in index order from the caller's Rng, so
// it depends on the seed alone, never on the thread count.
//
// Counter-based masks (counter_*): element `cell` of the mask of `seed` is a function of (seed, cell) alone, a
// splitmix64 finaliser of seed + (cell + 1) * phi. Any part of a mask can be generated (or regenerated in
// backward) on its own, in any order and in parallel, with the same bits; the loops vectorise. The keep test is
// done on integers: u = (bits >> 11) 2^-53 < p  <=>  (bits >> 11) < ceil(p 2^53), exactly.
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

/// The 64 random bits of cell `cell` of the counter-based mask of `seed`.
inline std::uint64_t counter_bits(std::uint64_t seed, std::uint64_t cell) {
  std::uint64_t z = seed + (cell + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The uniform number in [0, 1) of (seed, cell): 53 bits of counter_bits.
inline double counter_uniform(std::uint64_t seed, std::uint64_t cell) {
  return static_cast<double>(counter_bits(seed, cell) >> 11) * (1.0 / 9007199254740992.0);
}

/// ceil(p 2^53): counter_uniform(s, c) < p exactly when (counter_bits(s, c) >> 11) < counter_threshold(p).
inline std::uint64_t counter_threshold(double p) { return static_cast<std::uint64_t>(std::ceil(p * 9007199254740992.0)); }

namespace detail {
/// The unsigned integer as wide as S. The counter loops select "x * keep, or +0 when dropped" by masking the bits
/// of x * keep with all ones or 0, instead of branching on a random bit (a branch mispredicts on about every
/// dropped element, and keeps g++ from vectorising the loop on AVX2): the same bits, about twice as fast.
template <class S>
using SameWidthBits = std::conditional_t<sizeof(S) == 4, std::uint32_t, std::uint64_t>;

/// All ones when cell `cell` of the mask of `seed` is kept ((bits >> 11) >= threshold t), 0 when it is dropped.
template <class S>
inline SameWidthBits<S> counter_keep_bits(std::uint64_t seed, std::uint64_t cell, std::uint64_t t) {
  using Bits = SameWidthBits<S>;
  return Bits(0) - static_cast<Bits>((counter_bits(seed, cell) >> 11) >= t);
}

/// x * keep when `mask` is all ones, +0 when it is 0 (selected on the bits, without a branch).
template <class S>
inline S keep_or_zero(S x, S keep, SameWidthBits<S> mask) {
  const S v = x * keep;
  SameWidthBits<S> b;
  std::memcpy(&b, &v, sizeof v);
  b &= mask;
  S out;
  std::memcpy(&out, &b, sizeof b);
  return out;
}
}  // namespace detail

/// m[k] = 0 if cell first + k is dropped (counter_uniform < p), else 1/(1-p); k < n.
template <class S>
void counter_dropout_mask(S* m, Index n, std::uint64_t seed, std::uint64_t first, double p) {
  static_assert(sizeof(S) == 4 || sizeof(S) == 8, "counter_dropout_mask: S must be float or double");
  const std::uint64_t t = counter_threshold(p);
  const S keep = S(1) / (S(1) - static_cast<S>(p));
  detail::SameWidthBits<S> keep_bits;
  std::memcpy(&keep_bits, &keep, sizeof keep);
  for (Index k = 0; k < n; ++k) {
    const auto b = keep_bits & detail::counter_keep_bits<S>(seed, first + static_cast<std::uint64_t>(k), t);
    std::memcpy(m + k, &b, sizeof b);  // keep, or +0 when dropped
  }
}

/// x[k] *= the mask value of cell first + k (0 or 1/(1-p)); k < n. A dropped element becomes +0 (also when x[k] is
/// negative, infinite or NaN).
template <class S>
void counter_dropout_apply(S* x, Index n, std::uint64_t seed, std::uint64_t first, double p) {
  static_assert(sizeof(S) == 4 || sizeof(S) == 8, "counter_dropout_apply: S must be float or double");
  const std::uint64_t t = counter_threshold(p);
  const S keep = S(1) / (S(1) - static_cast<S>(p));
  for (Index k = 0; k < n; ++k)
    x[k] = detail::keep_or_zero(x[k], keep,
                                detail::counter_keep_bits<S>(seed, first + static_cast<std::uint64_t>(k), t));
}

/// counter_dropout_apply (the same values), also writing the mask as bits: bit j of kept[w] is 1 when cell
/// first + 32 w + j is kept, for the ceil(n / 32) words w (unused high bits of the last word are 0). Backward then
/// applies the mask from the bits (dropout_apply_bits) instead of hashing every cell again.
template <class S>
void counter_dropout_apply_bits(S* x, Index n, std::uint64_t seed, std::uint64_t first, double p,
                                std::uint32_t* kept) {
  static_assert(sizeof(S) == 4 || sizeof(S) == 8, "counter_dropout_apply_bits: S must be float or double");
  using Bits = detail::SameWidthBits<S>;
  const std::uint64_t t = counter_threshold(p);
  const S keep = S(1) / (S(1) - static_cast<S>(p));
  for (Index w0 = 0; w0 < n; w0 += 32) {
    const int m = n - w0 < 32 ? int(n - w0) : 32;
    S* xw = x + w0;
    const std::uint64_t c0 = first + static_cast<std::uint64_t>(w0);
    std::uint32_t word = 0;
    for (int j = 0; j < m; ++j) {
      const Bits kb = detail::counter_keep_bits<S>(seed, c0 + static_cast<std::uint64_t>(j), t);
      xw[j] = detail::keep_or_zero(xw[j], keep, kb);
      word |= static_cast<std::uint32_t>(kb & 1u) << j;
    }
    kept[w0 / 32] = word;
  }
}

/// x[k] *= 1/(1-p) when bit k % 32 of kept[k / 32] is set, else x[k] = +0 (also for a negative, infinite or NaN
/// x[k]): with the bits of counter_dropout_apply_bits, the same values as counter_dropout_apply; k < n.
template <class S>
void dropout_apply_bits(S* x, Index n, const std::uint32_t* kept, double p) {
  static_assert(sizeof(S) == 4 || sizeof(S) == 8, "dropout_apply_bits: S must be float or double");
  using Bits = detail::SameWidthBits<S>;
  const S keep = S(1) / (S(1) - static_cast<S>(p));
  for (Index w0 = 0; w0 < n; w0 += 32) {
    const int m = n - w0 < 32 ? int(n - w0) : 32;
    S* xw = x + w0;
    const std::uint32_t word = kept[w0 / 32];
    for (int j = 0; j < m; ++j)
      xw[j] = detail::keep_or_zero(xw[j], keep, Bits(0) - static_cast<Bits>((word >> j) & 1u));
  }
}

}  // namespace ops
}  // namespace dea
