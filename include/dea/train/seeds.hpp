// dea/train/seeds.hpp: the random streams of a training run. Everything random in a run is a function of
// (seed, stream, index): the epoch order (kOrderStream, epoch), the dropout masks of a step (kDropoutStream, step),
// the MLM masking of a step (kMaskStream, step) and of an evaluation batch (kEvalMaskStream, batch), the cells the
// training histograms sample (kPlotStream, step; plots only). So a run resumed at step k draws what the
// uninterrupted run draws. A step of M > 1 micro-batches (--micro_batches) draws micro-batch k's dropout and masking
// from micro_stream_seed(seed, stream, step, k): keyed by the micro-batch, never by the rank that computes it.
#pragma once

#include <cstdint>

namespace dea::train {

constexpr std::uint64_t kOrderStream = 1, kDropoutStream = 2, kMaskStream = 3, kEvalMaskStream = 4;
/// Subsampling of the training histograms' cells (plots only; no effect on training).
constexpr std::uint64_t kPlotStream = 5;

/// A 64-bit seed for (seed, stream, index) (splitmix64 finaliser over a mix of the three).
inline std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed) ^ (stream * 0xd1b54a32d192ed03ULL)) ^ index);
}

/// The stream of micro-batch k of a step (stream kDropoutStream or kMaskStream of a step with M > 1 micro-batches).
constexpr std::uint64_t kMicroBatchStream = 6;
inline std::uint64_t micro_stream_seed(std::uint64_t seed, std::uint64_t stream, std::uint64_t step, std::uint64_t k) {
  return stream_seed(stream_seed(seed, stream, step), kMicroBatchStream, k);
}

}  // namespace dea::train
