// dea/deberta/relative.hpp: DeBERTa's relative positions: the log-bucketed distance of a query and a key, and the
// row of the relative embedding table a (query, key) pair reads (docs/deberta.md, relative positions).
//
// For query i and key j, delta = i - j. With k = position_buckets > 0, m = floor(k / 2) and R the relative range:
//   bucket(delta) = delta                                                       if |delta| <= m
//                 = sign(delta) (m + ceil((m - 1) ln(|delta| / m) / ln((R - 1) / m)))   otherwise
// and with k <= 0, bucket(delta) = delta. The logarithmic part is evaluated in IEEE float32 in the order the
// reference evaluates it (q = |delta| / m, u = log q, v = log of (R - 1) / m rounded once from double to float,
// w = (u / v)(m - 1), ceil(w) + m): a logarithm that differs by one ulp can move a distance to the next bucket, and
// the float64 evaluation does disagree at some settings (k = 512, R = 4096, |delta| = 1643). The table row of the
// pair is clamp(bucket + S, 0, 2S - 1), S = att_span().
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dea {
namespace deberta {

/// The bucket of the relative distance `delta` for position_buckets `k` and relative range `R` (see the file
/// comment); k <= 0 gives delta itself.
inline std::int64_t relative_bucket(std::int64_t delta, std::int64_t k, std::int64_t R) {
  if (k <= 0) return delta;
  const std::int64_t m = k / 2;
  const std::int64_t a = delta < 0 ? -delta : delta;
  if (a <= m) return delta;
  // float32, in the reference's order; volatile keeps every intermediate a float (no contraction, no excess precision)
  volatile float q = static_cast<float>(a) / static_cast<float>(m);
  volatile float u = std::log(static_cast<float>(q));
  volatile float v = std::log(static_cast<float>(static_cast<double>(R - 1) / static_cast<double>(m)));
  volatile float w = (u / v) * static_cast<float>(m - 1);
  const float c = std::ceil(static_cast<float>(w)) + static_cast<float>(m);
  const std::int64_t b = static_cast<std::int64_t>(c);
  return delta < 0 ? -b : b;
}

/// The bucketed relative position of every distance of a sequence of length T, indexed by delta + T - 1
/// (delta = -(T - 1) ... T - 1), for the configuration's buckets and range.
inline std::vector<std::int64_t> relative_buckets(const DebertaConfig& cfg, Index T) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(2 * T - 1));
  for (Index d = -(T - 1); d <= T - 1; ++d)
    out[static_cast<std::size_t>(d + T - 1)] = relative_bucket(d, cfg.position_buckets, cfg.relative_range());
  return out;
}

/// The table row clamp(bucket + S, 0, 2S - 1) of each entry of `buckets`.
inline std::vector<Index> relative_rows(const std::vector<std::int64_t>& buckets, Index S) {
  std::vector<Index> out(buckets.size());
  for (std::size_t k = 0; k < buckets.size(); ++k)
    out[k] = static_cast<Index>(std::clamp<std::int64_t>(buckets[k] + S, 0, 2 * S - 1));
  return out;
}

}  // namespace deberta
}  // namespace dea
