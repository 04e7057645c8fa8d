// dea/deberta/seq_cls.hpp: Hugging Face's DebertaV2ForSequenceClassification, forward only (docs/deberta.md): a
// DebertaV2Model, its ContextPooler and a linear classifier.
//
// Shapes (B batch, C = num_labels = len(id2label)):
//   h      = DebertaV2Model(batch).last_hidden_state                [B*T, H]
//   pooled = act(h[b*T + 0] W_p^T + b_p)                            [B, H]   pooler.dense, act = pooler_hidden_act
//   logits = pooled W_c^T + b_c                                     [B, C]   classifier
// (the reference's dropouts before the pooler's dense and before the classifier are off at inference).
// Parameters: "deberta." + the DebertaV2Model names, pooler.dense.{weight [H, H], bias [H]}, classifier.{weight
// [C, H], bias [C]}.
//
// sequence_logits() is what an NLI oracle calls: token ids, token types and attention masks of equal length in,
// one row of logits per sequence out; a sequence gets the same logits alone or in any batch (model.hpp).
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "model.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace dea {
namespace deberta {

/// True when the model's activation rows ([N, H], [N, E] and [N, I]) are whole multiples of 64 bytes: then every row
/// of a sequence has the same alignment at any position in a batch, and the vectorised per-row steps run the same
/// operations on it.
template <class S>
bool rows_batch_invariant(const DebertaConfig& c) {
  for (Index w : {c.hidden_size, c.embed_size(), c.intermediate_size})
    if ((w * Index(sizeof(S))) % 64 != 0) return false;
  return true;
}

/// What DebertaV2ForSequenceClassification::forward returns.
template <class S>
struct DebertaSeqClsOutput {
  Mat<S> logits;              ///< [B, num_labels]
  DebertaOutput<S> deberta;   ///< the encoder's outputs
};

/// The parameter names and shapes of a DebertaV2ForSequenceClassification built from `cfg`, in state_dict order.
inline std::vector<std::pair<std::string, Shape>> deberta_seq_cls_parameter_shapes(const DebertaConfig& cfg) {
  auto out = deberta_parameter_shapes(cfg);
  for (auto& e : out) e.first = "deberta." + e.first;
  const Index H = cfg.hidden_size;
  out.push_back({"pooler.dense.weight", {H, H}});
  out.push_back({"pooler.dense.bias", {H}});
  out.push_back({"classifier.weight", {cfg.num_labels(), H}});
  out.push_back({"classifier.bias", {cfg.num_labels()}});
  return out;
}

template <class S>
class DebertaV2ForSequenceClassification {
public:
  using Scalar = S;
  using Model = DebertaV2Model<S>;

  /// Zero weights (LayerNorms 1 / 0), loaded next (hf_dir.hpp).
  explicit DebertaV2ForSequenceClassification(const DebertaConfig& cfg) : deberta_(cfg) {
    using detail::inference_param;
    const Index H = cfg.hidden_size, C = cfg.num_labels();
    prefix_names(deberta_.parameters(), "deberta.");
    pool_w_ = inference_param<S>("pooler.dense.weight", {H, H});
    pool_b_ = inference_param<S>("pooler.dense.bias", {H});
    cls_w_ = inference_param<S>("classifier.weight", {C, H});
    cls_b_ = inference_param<S>("classifier.bias", {C});
  }

  const DebertaConfig& config() const { return deberta_.config(); }
  Index num_labels() const { return config().num_labels(); }
  const Model& deberta() const { return deberta_; }

  /// deberta.* (state_dict order), pooler.dense.weight, pooler.dense.bias, classifier.weight, classifier.bias.
  /// Drops the packed weights, or is refused after pack_weights(true) (model.hpp).
  ParamList<S> parameters() {
    ParamList<S> out = deberta_.parameters();
    head_.reset();
    out.insert(out.end(), {&pool_w_, &pool_b_, &cls_w_, &cls_b_});
    return out;
  }

  /// Packs the projection weights of the encoder, the pooler and the classifier once (the same outputs, bit for
  /// bit); with `release_float` frees their float values (DebertaV2Model::pack_weights).
  void pack_weights(bool release_float = false) {
    if (deberta_.float_weights_released()) return;
    deberta_.pack_weights(release_float);
    if (!deberta_.weights_packed()) return;  // no packed product on this compiler
    auto head = std::make_shared<HeadPacks>();
    head->pool = PackedWeight<S>(pool_w_.value.data(), pool_w_.shape[0], pool_w_.shape[1]);
    head->cls = PackedWeight<S>(cls_w_.value.data(), cls_w_.shape[0], cls_w_.shape[1]);
    head_ = std::move(head);
    if (!release_float) return;
    for (Param<S>* p : {&pool_w_, &cls_w_}) {
      p->value = Vec<S>();
      p->grad = Vec<S>();
    }
  }
  bool weights_packed() const { return deberta_.weights_packed(); }
  bool float_weights_released() const { return deberta_.float_weights_released(); }
  /// Bytes of the packed copies (0 when not packed).
  std::size_t packed_bytes() const {
    return deberta_.packed_bytes() + (head_ ? head_->pool.bytes() + head_->cls.bytes() : 0);
  }
  /// Bytes of the weights as held: float values and packed copies.
  std::size_t weight_bytes() const {
    std::size_t n = deberta_.weight_bytes() + (head_ ? head_->pool.bytes() + head_->cls.bytes() : 0);
    for (const Param<S>* p : {&pool_w_, &pool_b_, &cls_w_, &cls_b_}) n += sizeof(S) * std::size_t(p->value.size());
    return n;
  }

  /// Evaluation-mode forward (hidden states kept when asked).
  DebertaSeqClsOutput<S> forward(const DebertaBatch& batch, bool keep_hidden_states = false) const {
    DebertaSeqClsOutput<S> out;
    out.deberta = deberta_.forward(batch, keep_hidden_states);
    const Index B = batch.batch(), T = batch.seq_len(), H = config().hidden_size;
    Mat<S> first(B, H), t, pooled;
    for (Index b = 0; b < B; ++b) first.row(b) = out.deberta.last_hidden_state.row(b * T);  // h[b*T + 0]
    const std::shared_ptr<const HeadPacks> head = head_;
    const PackedWeight<S> none;
    linear_packed<S>(first, pool_w_, head ? head->pool : none, pool_b_.value.data(), t);  // . W_p^T + b_p
    detail::activation_forward<S>(config().pooler_hidden_act, t, pooled);          // pooled = act(.)
    linear_packed<S>(pooled, cls_w_, head ? head->cls : none, cls_b_.value.data(), out.logits);  // pooled W_c^T + b_c
    return out;
  }

private:
  Model deberta_;
  Param<S> pool_w_, pool_b_, cls_w_, cls_b_;
  struct HeadPacks {
    PackedWeight<S> pool, cls;
  };
  std::shared_ptr<const HeadPacks> head_;  ///< the packed pooler and classifier weights, shared by copies
};

/// The logits [B, num_labels] of B sequences of one length T: `input_ids`, `token_type_ids` and `attention_mask`
/// hold B rows each, every row of length T (token_type_ids may be empty: all 0; attention_mask may be empty: every
/// token real). A sequence's logits are the same alone or in any batch, and on any number of threads.
template <class S>
Mat<S> sequence_logits(const DebertaV2ForSequenceClassification<S>& model,
                       const std::vector<std::vector<std::int64_t>>& input_ids,
                       const std::vector<std::vector<std::int64_t>>& token_type_ids = {},
                       const std::vector<std::vector<std::int64_t>>& attention_mask = {}) {
  const char* fn = "deberta::sequence_logits";
  const Index B = static_cast<Index>(input_ids.size());
  check(B > 0, fn, ": expected at least one sequence");
  const Index T = static_cast<Index>(input_ids.front().size());
  check(T > 0, fn, ": sequence 0 is empty");
  check(token_type_ids.empty() || static_cast<Index>(token_type_ids.size()) == B, fn, ": token_type_ids: expected ",
        B, " rows (one per sequence) or none, got ", token_type_ids.size());
  check(attention_mask.empty() || static_cast<Index>(attention_mask.size()) == B, fn, ": attention_mask: expected ",
        B, " rows (one per sequence) or none, got ", attention_mask.size());
  DebertaBatch batch;
  batch.input_ids = Tensor<std::int64_t>({B, T});
  if (!token_type_ids.empty()) batch.token_type_ids = Tensor<std::int64_t>({B, T});
  if (!attention_mask.empty()) batch.attention_mask = Tensor<std::uint8_t>({B, T});
  for (Index b = 0; b < B; ++b) {
    const auto r = static_cast<std::size_t>(b);
    check(static_cast<Index>(input_ids[r].size()) == T, fn, ": input_ids: sequence ", b, " has ", input_ids[r].size(),
          " tokens, sequence 0 has ", T, " (a batch holds sequences of one length)");
    for (Index t = 0; t < T; ++t) batch.input_ids.ptr()[b * T + t] = input_ids[r][static_cast<std::size_t>(t)];
    if (!token_type_ids.empty()) {
      check(static_cast<Index>(token_type_ids[r].size()) == T, fn, ": token_type_ids: row ", b, " has ",
            token_type_ids[r].size(), " entries, expected ", T);
      for (Index t = 0; t < T; ++t) batch.token_type_ids.ptr()[b * T + t] = token_type_ids[r][static_cast<std::size_t>(t)];
    }
    if (!attention_mask.empty()) {
      check(static_cast<Index>(attention_mask[r].size()) == T, fn, ": attention_mask: row ", b, " has ",
            attention_mask[r].size(), " entries, expected ", T);
      for (Index t = 0; t < T; ++t) {
        const std::int64_t m = attention_mask[r][static_cast<std::size_t>(t)];
        check(m == 0 || m == 1, fn, ": attention_mask: expected 0 or 1, got ", m, " at [", b, ", ", t, "]");
        batch.attention_mask.ptr()[b * T + t] = static_cast<std::uint8_t>(m);
      }
    }
  }
  // every row of every product computed by the same operations whatever the batch (core/parallel.hpp); the per-row
  // steps (embedding sums, LayerNorm, GELU) vectorise the same way at any position only when rows are whole
  // multiples of 64 bytes, so a model with other widths runs its sequences one by one
  const ScopedBatchInvariantProducts invariant;
  if (rows_batch_invariant<S>(model.config()) || B == 1) return model.forward(batch).logits;
  Mat<S> logits(B, model.num_labels());
  for (Index b = 0; b < B; ++b) {
    DebertaBatch one;
    auto row = [&](const auto& t) {
      std::decay_t<decltype(t)> r(Shape{1, T});
      for (Index k = 0; k < T; ++k) r[k] = t[b * T + k];
      return r;
    };
    one.input_ids = row(batch.input_ids);
    if (batch.token_type_ids.dim() > 0) one.token_type_ids = row(batch.token_type_ids);
    if (batch.attention_mask.dim() > 0) one.attention_mask = row(batch.attention_mask);
    logits.row(b) = model.forward(one).logits;
  }
  return logits;
}

}  // namespace deberta
}  // namespace dea
