// dea/attention/context.hpp: AttnContext, the raw-pointer form of the attention inputs that the attention
// classes' transitional `forward(x, batch, ctx, cache)` overloads still take. New code builds an AttnInputs
// (inputs.hpp); to_inputs() below converts a context into one.
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "inputs.hpp"

#include <cstdint>
#include <string>

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

/// Transitional: the AttnInputs of a context, for B = batch sequences of Tq queries and Tk keys. Every input the
/// context carries is copied over (and validated as AttnInputs validates it), so a class that does not support
/// one refuses it as it refuses it in AttnInputs. `who` names the caller in the error messages.
template <class S>
AttnInputs<S> to_inputs(const AttnContext<S>& ctx, Index batch, Index q_len, Index k_len, const char* who) {
  check(batch > 0, who, ": batch: expected > 0, got ", batch);
  check(q_len > 0 && k_len > 0, who, ": expected at least one query and one key, got Tq = ", q_len, ", Tk = ", k_len);
  AttnInputs<S> in(batch, q_len, k_len);
  if (ctx.key_mask) {
    check_shape(*ctx.key_mask, {batch, k_len}, (std::string(who) + ": ctx.key_mask").c_str());
    in.set_key_mask(*ctx.key_mask);
  }
  if (ctx.alpha_oracle) in.set_oracle(*ctx.alpha_oracle);
  if (ctx.target_idx) in.set_targets(*ctx.target_idx);
  if (ctx.frozen_alpha_hat) in.set_frozen_alpha_hat(*ctx.frozen_alpha_hat);
  in.set_gamma_mix(ctx.gamma_mix);
  in.set_causal(ctx.causal);
  in.set_training(ctx.training, ctx.rng);
  in.set_keep_maps(ctx.keep_maps);
  in.set_keep_alpha_hat(ctx.keep_alpha_hat);
  return in;
}

}  // namespace dea
