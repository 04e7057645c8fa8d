// dea/attention/context.hpp: the per-call context every attention class's forward takes.
#pragma once

#include "../core/rng.hpp"
#include "../core/tensor.hpp"

#include <cstdint>

namespace dea {

/// What a forward call needs besides the hidden states. Every pointer is optional (nullptr = absent);
/// the tensors are owned by the caller and must outlive the forward call (not the backward).
template <class S>
struct AttnContext {
  /// [B, Tk], non-zero = real key. Absent: every key is real.
  const Tensor<std::uint8_t>* key_mask = nullptr;
  /// Dual-Expert only: oracle alpha, [B, Tq, Tk] (shared by the heads) or [B, H, Tq, Tk]; NaN = unlabelled.
  const Tensor<S>* alpha_oracle = nullptr;
  /// Dual-Expert only: target key per query, [B, Tq] or [B, H, Tq]; -1 = none. Absent: the oracle winner.
  const Tensor<std::int64_t>* target_idx = nullptr;
  /// Dual-Expert only: weight of the oracle in the mixing coefficient (1 = pure oracle, 0 = the gate's alpha-hat).
  S gamma_mix = 0;
  /// Causal mask (query i sees keys j <= i), for the classes that support it.
  bool causal = false;
  /// Training mode: attention-probability dropout is active (needs rng when the layer's dropout > 0).
  bool training = false;
  /// Random source for dropout masks.
  Rng* rng = nullptr;
  /// Test hook (Dual-Expert): use these alpha-hat values [B, H, Tq, Tk] in the scores instead of the gate's
  /// own. The scores treat alpha-hat as a constant, so finite-difference checks of the task path hold it fixed.
  const Tensor<S>* frozen_alpha_hat = nullptr;
  /// Dual-Expert: run the reference kernel for this call whatever Options::kernel says, so that every
  /// [B, H, Tq, Tk] map is in the cache afterwards (evaluation metrics, probes, plots).
  bool keep_maps = false;
  /// Dual-Expert, tiled kernel: also keep the gate's alpha-hat [B, H, Tq, Tk] in Cache::alpha_hat (the reference
  /// kernel always keeps it). Costs O(B H Tq Tk) memory; for callers that read alpha-hat after a training forward.
  bool keep_alpha_hat = false;
};

}  // namespace dea
