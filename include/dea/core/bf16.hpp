// dea/core/bf16.hpp: the bfloat16 storage type, its rounding, and the exact rule of one bf16 dot-product step.
//
// A bf16 value is the upper half of a float: sign, the same 8-bit exponent, 7 stored mantissa bits. The library
// stores weights and activations as bf16 for its mixed-precision products and accumulates in float; everything
// else stays float.
//
// Rounding float -> bf16 (to_bf16): round to nearest, ties to even, on the bit pattern; values beyond the largest
// bf16 become infinities; a NaN stays a NaN with its sign and upper payload bits (made quiet). Denormal floats round
// like any other value (the products below then read a bf16 denormal as zero).
//
// One step of the bf16 dot product (dp_step), the rule of the vdpbf16ps instruction, measured bit for bit on an AMD
// Zen 5 core (tests/test_bf16.cpp checks it again on the machine that runs the tests):
//   acc' = ftz(fma(daz(a1), daz(b1), ftz(daz(acc))))      the odd (upper) element of the pair first,
//   acc'' = ftz(fma(daz(a0), daz(b0), acc'))             then the even (lower) one,
// two fused multiply-adds rounded to nearest even, daz reading a denormal input as a zero of its sign and ftz
// writing a denormal result as a zero of its sign. A bf16 x bf16 product is exact in float unless it underflows or
// overflows, so fma matters only there. A product over pairs of k, k = 2p and 2p + 1, chains these steps in the
// order of p; a K that is odd is padded with a zero element. A NaN result is a NaN: its sign and payload are not
// part of the rule (they follow the operand order of each implementation's multiply-add). Every product of
// ops/packed_bf16.hpp follows this rule, with the instruction or without it, so its results are the same bits on
// every x86-64 CPU and elsewhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace dea {

/// A bfloat16 value (its bits; no arithmetic: convert with to_float).
struct bf16 {
  std::uint16_t bits = 0;
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
  friend bool operator!=(bf16 a, bf16 b) { return a.bits != b.bits; }
};
static_assert(sizeof(bf16) == 2, "bf16 is two bytes");

/// The bits of a float.
inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// The float with these bits.
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// float -> bf16, round to nearest even; NaN kept (quiet), infinities kept, overflow to infinity.
inline bf16 to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((u >> 16) | 0x0040u)};
  return bf16{std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

/// bf16 -> float (exact).
inline float to_float(bf16 h) { return bits_float(std::uint32_t(h.bits) << 16); }

/// f rounded to bf16 and back (the value a bf16 copy of f holds).
inline float round_bf16(float f) { return to_float(to_bf16(f)); }

namespace bf16_model {

/// A denormal as a zero of its sign (the instruction's input and output flushing).
inline float flush(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

/// One bf16 dot-product step on one float lane: acc with the pair (a0, a1) . (b0, b1) added, the odd element first
/// (the header's rule). The scalar model the products are tested against, bit for bit.
inline float dp_step(float acc, bf16 a0, bf16 a1, bf16 b0, bf16 b1) {
  float r = std::fma(flush(to_float(a1)), flush(to_float(b1)), flush(acc));
  r = flush(r);
  r = std::fma(flush(to_float(a0)), flush(to_float(b0)), r);
  return flush(r);
}

}  // namespace bf16_model
}  // namespace dea
