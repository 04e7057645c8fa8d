// dea/attention/inputs.hpp: the attention inputs of one forward pass, validated once and read by every layer.
//
// A model builds one AttnInputs per forward from its batch and hands it to every layer by const reference: the
// key mask in the three forms the kernels read (bytes, a 0/1 row of the scalar type, an additive 0 / -inf bias),
// the per-row count of real keys, the oracle alpha (one copy, rejected once if it holds +-inf), the target keys,
// gamma_mix, the causal and training flags and the dropout source. Each optional input has one spelling of
// "absent": its has_...() is false (no null pointers, no all-NaN or empty tensors).
//
// Copies share storage (the tensors are held by shared pointers to const), so a layer's cache may keep a copy
// until backward at no cost, and an L-layer model holds one oracle, not L. without_oracle() is the view the
// model gives its unsupervised layers.
//
// An attention class states what it supports in an AttnSupport and calls require(); an input it does not
// support is an error that names the class and the input, never silently ignored.
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace dea {

/// The optional inputs an attention class accepts (AttnInputs::require).
struct AttnSupport {
  bool oracle = false;            ///< oracle alpha, targets and gamma_mix (the Dual-Expert gate loss)
  bool causal = false;            ///< causal masking (query i sees keys j <= i, self-attention only)
  bool frozen_alpha_hat = false;  ///< the Dual-Expert test hook
  bool keep_maps = false;         ///< keep every [B, H, Tq, Tk] map of the call
};

template <class S>
class AttnInputs {
public:
  AttnInputs() = default;
  /// Self-attention over B sequences of T tokens.
  AttnInputs(Index batch, Index seq_len) : AttnInputs(batch, seq_len, seq_len) {}
  /// Cross-attention: B sequences of Tq queries against Tk keys.
  AttnInputs(Index batch, Index q_len, Index k_len) : B_(batch), Tq_(q_len), Tk_(k_len) {
    check(batch > 0, "AttnInputs: batch must be positive, got ", batch);
    check(q_len > 0, "AttnInputs: q_len must be positive, got ", q_len);
    check(k_len > 0, "AttnInputs: k_len must be positive, got ", k_len);
    auto m = std::make_shared<Mask>();
    m->bytes.assign(static_cast<std::size_t>(B_ * Tk_), 1);
    m->row.assign(static_cast<std::size_t>(B_ * Tk_), S(1));
    m->bias.assign(static_cast<std::size_t>(B_ * Tk_), S(0));
    m->n_real.assign(static_cast<std::size_t>(B_), Tk_);
    mask_ = std::move(m);
  }

  /// The key mask's rule: key j of a row of n is real when bytes[j] != 0 (every key when bytes is null); writes
  /// row[j] (1 real, 0 padded) and bias[j] (0 real, -inf padded) and returns the number of real keys. (Also for
  /// the kernels that take a mask without an AttnInputs: the inference model, incremental decoding.)
  static Index mask_row(const std::uint8_t* bytes, Index n, S* row, S* bias) {
    Index real_keys = 0;
    for (Index j = 0; j < n; ++j) {
      const bool real = bytes == nullptr || bytes[j] != 0;
      row[j] = real ? S(1) : S(0);
      bias[j] = real ? S(0) : -std::numeric_limits<S>::infinity();
      real_keys += real ? 1 : 0;
    }
    return real_keys;
  }

  // ---- setting (each validates its argument at once; the message names it)

  /// key_mask [B, Tk], non-zero = real key. Without one every key is real.
  AttnInputs& set_key_mask(const Tensor<std::uint8_t>& key_mask) {
    require_sized("set_key_mask");
    check_shape(key_mask, {B_, Tk_}, "AttnInputs::set_key_mask: key_mask");
    auto m = std::make_shared<Mask>();
    m->bytes.resize(static_cast<std::size_t>(B_ * Tk_));
    m->row.resize(m->bytes.size());
    m->bias.resize(m->bytes.size());
    m->n_real.assign(static_cast<std::size_t>(B_), 0);
    const std::uint8_t* km = key_mask.ptr();
    for (std::size_t k = 0; k < m->bytes.size(); ++k) m->bytes[k] = km[k] != 0 ? 1 : 0;
    for (Index b = 0; b < B_; ++b)
      m->n_real[static_cast<std::size_t>(b)] =
          mask_row(km + b * Tk_, Tk_, m->row.data() + b * Tk_, m->bias.data() + b * Tk_);
    mask_ = std::move(m);
    has_mask_ = true;
    return *this;
  }

  /// Oracle alpha [B, Tq, Tk] (shared by the heads) or [B, H, Tq, Tk]; NaN = unlabelled; +-inf is an error.
  /// Kept as one copy for the whole forward and backward (pass an rvalue to move it in).
  AttnInputs& set_oracle(Tensor<S> alpha) {
    require_sized("set_oracle");
    const Shape& s = alpha.shape;
    check((s.size() == 3 && s[0] == B_ && s[1] == Tq_ && s[2] == Tk_) ||
              (s.size() == 4 && s[0] == B_ && s[1] > 0 && s[2] == Tq_ && s[3] == Tk_),
          "AttnInputs::set_oracle: alpha: expected shape ", shape_str({B_, Tq_, Tk_}), " or [", B_, ", H, ", Tq_, ", ",
          Tk_, "], got ", shape_str(s));
    for (Index k = 0; k < alpha.numel(); ++k)
      check(!std::isinf(alpha[k]), "AttnInputs::set_oracle: alpha: expected a finite value or NaN (unlabelled), got ",
            alpha[k], " at flat position ", k);
    oracle_ = std::make_shared<const Tensor<S>>(std::move(alpha));
    return *this;
  }

  /// Target key per query [B, Tq] or [B, H, Tq]: -1 = none, else a key index. Needs an oracle (set it first).
  /// Without targets the gate loss takes the oracle's winner.
  AttnInputs& set_targets(Tensor<std::int64_t> target) {
    require_sized("set_targets");
    check(has_oracle(), "AttnInputs::set_targets: targets were given without an oracle (the gate loss needs both)");
    const Shape& s = target.shape;
    check((s.size() == 2 && s[0] == B_ && s[1] == Tq_) || (s.size() == 3 && s[0] == B_ && s[1] > 0 && s[2] == Tq_),
          "AttnInputs::set_targets: target: expected shape ", shape_str({B_, Tq_}), " or [", B_, ", H, ", Tq_, "], got ",
          shape_str(s));
    for (Index k = 0; k < target.numel(); ++k)
      check(target[k] >= -1 && target[k] < Tk_, "AttnInputs::set_targets: target: expected -1 (none) or a key index "
            "in [0, ", Tk_, "), got ", target[k], " at flat position ", k);
    targets_ = std::make_shared<const Tensor<std::int64_t>>(std::move(target));
    return *this;
  }

  /// Weight of the oracle in the mixing coefficient, in [0, 1] (1 = pure oracle, 0 = the gate's alpha-hat).
  AttnInputs& set_gamma_mix(S gamma) {
    check(gamma >= 0 && gamma <= 1, "AttnInputs::set_gamma_mix: gamma_mix must be in [0, 1], got ", gamma);
    gamma_ = gamma;
    return *this;
  }

  /// Causal masking: query i sees keys j <= i (self-attention: Tq == Tk).
  AttnInputs& set_causal(bool on) {
    check(!on || Tq_ == Tk_, "AttnInputs::set_causal: causal masking needs Tq == Tk, got ", Tq_, " and ", Tk_);
    causal_ = on;
    return *this;
  }

  /// Training mode: dropout is active; rng (required when a layer's dropout > 0) draws the masks.
  AttnInputs& set_training(bool on, Rng* rng = nullptr) {
    training_ = on;
    rng_ = rng;
    return *this;
  }

  /// Dual-Expert test hook: use these alpha-hat values [B, H, Tq, Tk] in the scores instead of the gate's own.
  AttnInputs& set_frozen_alpha_hat(Tensor<S> alpha_hat) {
    require_sized("set_frozen_alpha_hat");
    check(alpha_hat.dim() == 4 && alpha_hat.size(0) == B_ && alpha_hat.size(2) == Tq_ && alpha_hat.size(3) == Tk_,
          "AttnInputs::set_frozen_alpha_hat: alpha_hat: expected shape [", B_, ", H, ", Tq_, ", ", Tk_, "], got ",
          shape_str(alpha_hat.shape));
    frozen_ = std::make_shared<const Tensor<S>>(std::move(alpha_hat));
    return *this;
  }

  /// Dual-Expert: keep every [B, H, Tq, Tk] map of the call in the cache (evaluation metrics, probes, plots).
  AttnInputs& set_keep_maps(bool on) {
    keep_maps_ = on;
    return *this;
  }
  /// Dual-Expert, tiled kernel: also keep the gate's alpha-hat [B, H, Tq, Tk] after a training forward.
  AttnInputs& set_keep_alpha_hat(bool on) {
    keep_alpha_hat_ = on;
    return *this;
  }

  /// The same inputs without oracle and targets (shares the rest).
  AttnInputs without_oracle() const {
    AttnInputs o = *this;
    o.oracle_.reset();
    o.targets_.reset();
    return o;
  }

  // ---- reading

  Index batch() const { return B_; }
  Index q_len() const { return Tq_; }
  Index k_len() const { return Tk_; }

  bool has_key_mask() const { return has_mask_; }
  /// Row b of the mask: bytes (1 = real), the scalar 0/1 row and the additive bias (0 or -inf), each [Tk].
  /// Without a key mask: every key real.
  const std::uint8_t* key_mask(Index b) const { return mask_->bytes.data() + b * Tk_; }
  const S* key_row(Index b) const { return mask_->row.data() + b * Tk_; }
  const S* key_bias(Index b) const { return mask_->bias.data() + b * Tk_; }
  /// Real keys of batch row b (0 when every key is masked).
  Index n_real(Index b) const { return mask_->n_real[static_cast<std::size_t>(b)]; }

  bool has_oracle() const { return oracle_ != nullptr; }
  /// [B, Tq, Tk] or [B, H, Tq, Tk] (has_oracle() must hold).
  const Tensor<S>& oracle() const { return *oracle_; }
  bool oracle_per_head() const { return oracle_ && oracle_->dim() == 4; }
  /// Row (b, h, i) of the oracle [Tk].
  const S* oracle_row(Index b, Index h, Index i) const {
    return oracle_->ptr() + (oracle_per_head() ? ((b * oracle_->size(1) + h) * Tq_ + i) : (b * Tq_ + i)) * Tk_;
  }

  bool has_targets() const { return targets_ != nullptr; }
  const Tensor<std::int64_t>& targets() const { return *targets_; }
  bool targets_per_head() const { return targets_ && targets_->dim() == 3; }
  /// Target key of query (b, h, i), -1 for none (has_targets() must hold).
  std::int64_t target(Index b, Index h, Index i) const {
    return (*targets_)[targets_per_head() ? (b * targets_->size(1) + h) * Tq_ + i : b * Tq_ + i];
  }

  S gamma_mix() const { return gamma_; }
  bool causal() const { return causal_; }
  bool training() const { return training_; }
  Rng* rng() const { return rng_; }

  bool has_frozen_alpha_hat() const { return frozen_ != nullptr; }
  const Tensor<S>& frozen_alpha_hat() const { return *frozen_; }
  bool keep_maps() const { return keep_maps_; }
  bool keep_alpha_hat() const { return keep_alpha_hat_; }

  // ---- checks an attention class makes at its forward

  /// Throws unless these inputs fit a layer of H heads called with B sequences of Tq queries and Tk keys, and
  /// every optional input given is one the class supports. `who` names the class (e.g. "DotProductAttention").
  void require(const AttnSupport& s, Index H, Index B, Index Tq, Index Tk, const char* who) const {
    check(B_ > 0, who, "::forward: the attention inputs are empty (build them with AttnInputs(batch, seq_len))");
    check(B == B_ && Tq == Tq_ && Tk == Tk_, who, "::forward: the attention inputs were built for B = ", B_, ", Tq = ",
          Tq_, ", Tk = ", Tk_, "; the call has B = ", B, ", Tq = ", Tq, ", Tk = ", Tk);
    check(s.causal || !causal_, who, ": causal masking is not supported by this attention class");
    check(s.oracle || !has_oracle(), who, ": the oracle alpha (a Dual-Expert input) is not supported by this attention "
          "class");
    check(s.oracle || !has_targets(), who, ": targets (a Dual-Expert input) are not supported by this attention class");
    check(s.frozen_alpha_hat || !has_frozen_alpha_hat(), who, ": frozen_alpha_hat is not supported by this attention "
          "class");
    check(s.keep_maps || !keep_maps_, who, ": keep_maps is not supported by this attention class");
    if (oracle_per_head())
      check(oracle_->size(1) == H, who, "::forward: alpha_oracle: expected shape ", shape_str({B_, H, Tq_, Tk_}),
            ", got ", shape_str(oracle_->shape));
    if (targets_per_head())
      check(targets_->size(1) == H, who, "::forward: target_idx: expected shape ", shape_str({B_, H, Tq_}), ", got ",
            shape_str(targets_->shape));
    if (frozen_)
      check(frozen_->size(1) == H, who, "::forward: frozen_alpha_hat: expected shape ", shape_str({B_, H, Tq_, Tk_}),
            ", got ", shape_str(frozen_->shape));
  }

private:
  struct Mask {
    std::vector<std::uint8_t> bytes;
    AlignedVec<S> row, bias;  // aligned rows: the kernels read them with aligned maps
    std::vector<Index> n_real;
  };
  void require_sized(const char* what) const {
    check(B_ > 0, "AttnInputs::", what, ": the inputs are empty (construct them with AttnInputs(batch, seq_len))");
  }

  Index B_ = 0, Tq_ = 0, Tk_ = 0;
  std::shared_ptr<const Mask> mask_;
  bool has_mask_ = false;
  std::shared_ptr<const Tensor<S>> oracle_, frozen_;
  std::shared_ptr<const Tensor<std::int64_t>> targets_;
  S gamma_ = 0;
  bool causal_ = false, training_ = false, keep_maps_ = false, keep_alpha_hat_ = false;
  Rng* rng_ = nullptr;
};

}  // namespace dea
