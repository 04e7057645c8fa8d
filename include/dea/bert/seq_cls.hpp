// dea/bert/seq_cls.hpp: Hugging Face's BertForSequenceClassification (docs/bert.md): a BertModel, dropout
// on its pooler output and a linear classifier, with the mean cross-entropy of integer labels.
//
// Shapes (B batch, C = num_labels = len(id2label)):
//   pooled = BertModel(batch).pooler_output                 [B, H]
//   logits = Dropout(pooled) W_c^T + b_c                    [B, C]   (classifier_dropout, or hidden_dropout_prob)
//   loss   = mean_b CE(logits_b, labels_b)                           (labels -100 ignored, as F.cross_entropy)
// Parameters: "bert." + the BertModel names, then classifier.weight [C, H], classifier.bias [C]. A fresh classifier
// is N(0, initializer_range^2) with a zero bias.
// num_labels = 1 is regression in transformers (MSE); its loss is not implemented here (the logits are).
// store_bf16_weights (float only) makes it a bf16 inference model as BertModel's does (model.hpp), the classifier's
// weight packed as bf16 too: the logits are then the float model's under ScopedPrecision(Precision::bf16), bit for bit.
#pragma once

#include "../core/error.hpp"
#include "../nn/dropout.hpp"
#include "../nn/linear.hpp"
#include "../ops/cross_entropy.hpp"
#include "bf16_weights.hpp"
#include "model.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace dea {
namespace bert {

/// What BertForSequenceClassification::forward returns.
template <class S>
struct SeqClsOutput {
  Mat<S> logits;          ///< [B, num_labels]
  bool has_loss = false;  ///< labels were given
  S loss = 0;             ///< mean cross-entropy over the labelled rows
  BertOutput<S> bert;     ///< the encoder's outputs
};

template <class S, class SelfAttention = BertSelfAttention<S>>
class BertForSequenceClassification {
public:
  using Scalar = S;
  using Model = BertModel<S, SelfAttention>;

  struct Cache {
    typename Model::Cache bert;
    Mat<S> pooled_dropped;  ///< [B, H] Dropout(pooled), the classifier input
    nn::DropoutState drop;
    bool has_loss = false;
    Mat<S> dlogits;         ///< d loss / d logits (with labels)
  };

  /// A fresh model (HF init): the BertModel, then the classifier.
  BertForSequenceClassification(const BertConfig& cfg, Rng& rng)
      : bert_(cfg, rng), classifier_(detail::zero_linear<S>(cfg.hidden_size, cfg.num_labels())),
        drop_(cfg.classifier_dropout_or_hidden()) {
    detail::hf_init_linear(classifier_, rng, cfg.initializer_range);
    name_parameters();
  }
  /// Zero weights (LayerNorms 1 / 0), to be loaded next (hf_dir.hpp).
  template <class SA = SelfAttention, std::enable_if_t<std::is_same<SA, BertSelfAttention<S>>::value, int> = 0>
  explicit BertForSequenceClassification(const BertConfig& cfg)
      : bert_(cfg), classifier_(detail::zero_linear<S>(cfg.hidden_size, cfg.num_labels())),
        drop_(cfg.classifier_dropout_or_hidden()) {
    name_parameters();
  }

  const BertConfig& config() const { return bert_.config(); }
  Index num_labels() const { return classifier_.out_features(); }
  Model& bert() { return bert_; }
  nn::Linear<S>& classifier() { return classifier_; }

  /// bert.* (state_dict order), classifier.weight, classifier.bias.
  ParamList<S> parameters() {
    ParamList<S> out = bert_.parameters();
    for (Param<S>* p : classifier_.parameters()) out.push_back(p);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// Makes this a bf16 inference model: BertModel::store_bf16_weights, and the classifier's weight packed once as
  /// bf16 (its float value and gradient released). forward then runs every product in bf16 (training = false only)
  /// and backward throws. float models only. Returns weight_bytes().
  std::size_t store_bf16_weights() {
    if constexpr (std::is_same<S, float>::value) {
      if (!classifier16_) {
        bert_.store_bf16_weights();
        classifier16_ = std::make_shared<const ops::packed::Bf16Matrix>(detail::pack_linear_bf16(
            classifier_.weight.value.data(), classifier_.out_features(), classifier_.in_features()));
        detail::release_value_and_grad(classifier_.weight);
        classifier_.bias.grad = Vec<S>();
      }
    } else {
      check(false, "BertForSequenceClassification::store_bf16_weights: float models only (bf16 is a policy of the "
            "float path)");
    }
    return weight_bytes();
  }
  /// True after store_bf16_weights.
  bool has_bf16_weights() const { return classifier16_ != nullptr; }
  /// Bytes of the model's weights as held: float values (gradients not counted) and bf16 copies.
  std::size_t weight_bytes() const {
    return bert_.weight_bytes() + detail::value_bytes(classifier_.weight) + detail::value_bytes(classifier_.bias) +
           (classifier16_ ? classifier16_->bytes() : 0);
  }

  /// Forward pass; `labels` [B] (class ids, -100 = ignore) is optional (null: no loss).
  SeqClsOutput<S> forward(const BertBatch<S>& batch, const Tensor<std::int64_t>* labels, bool training, Rng* rng,
                          Cache& c);

  /// Backward of the loss (needs labels at forward); returns dL/d inputs_embeds [B*T, H].
  Mat<S> backward(Cache& c);
  /// Backward for an arbitrary dL/dlogits [B, num_labels].
  Mat<S> backward_logits(const Mat<S>& dlogits, Cache& c);

private:
  void name_parameters() {
    prefix_names(bert_.parameters(), "bert.");
    prefix_names(classifier_.parameters(), "classifier.");
  }

  Model bert_;
  nn::Linear<S> classifier_;
  nn::Dropout drop_;
  std::shared_ptr<const ops::packed::Bf16Matrix> classifier16_;  ///< the classifier's weight as bf16
};

template <class S, class SelfAttention>
SeqClsOutput<S> BertForSequenceClassification<S, SelfAttention>::forward(const BertBatch<S>& batch,
                                                                         const Tensor<std::int64_t>* labels,
                                                                         bool training, Rng* rng, Cache& c) {
  SeqClsOutput<S> out;
  check(!(training && classifier16_), "BertForSequenceClassification::forward: the weights are stored as bf16 for "
        "inference (training = false only)");
  out.bert = bert_.forward(batch, training, rng, c.bert);
  const Index B = c.bert.B;
  if (labels) {
    check_shape(*labels, {B}, "BertForSequenceClassification::forward: labels");
    check(num_labels() > 1, "BertForSequenceClassification::forward: num_labels = 1 is regression (MSE), which is "
          "not supported; give the logits' own objective to backward_logits");
  }
  c.pooled_dropped = out.bert.pooler_output;
  drop_.forward(c.pooled_dropped, training, rng, c.drop);             // Dropout(pooled)
  if constexpr (std::is_same<S, float>::value) {
    if (classifier16_)  // the bf16 copy: the bits of the float classifier under ScopedPrecision(Precision::bf16)
      detail::linear_bf16(c.pooled_dropped, *classifier16_, classifier_.bias.value.data(), out.logits);
    else
      classifier_.forward(c.pooled_dropped, out.logits);               // logits = . W_c^T + b_c
  } else {
    classifier_.forward(c.pooled_dropped, out.logits);                 // logits = . W_c^T + b_c
  }
  c.has_loss = labels != nullptr;
  if (labels) {
    auto ce = ops::cross_entropy<S>(out.logits, labels->ptr(), labels->numel(), -100, true);
    out.has_loss = true;
    out.loss = ce.loss;
    c.dlogits = std::move(ce.dlogits);
  }
  return out;
}

template <class S, class SelfAttention>
Mat<S> BertForSequenceClassification<S, SelfAttention>::backward(Cache& c) {
  check(c.has_loss, "BertForSequenceClassification::backward: the forward pass had no labels (no loss)");
  return backward_logits(c.dlogits, c);
}

template <class S, class SelfAttention>
Mat<S> BertForSequenceClassification<S, SelfAttention>::backward_logits(const Mat<S>& dlogits, Cache& c) {
  check(!classifier16_, "BertForSequenceClassification::backward: the weights are stored as bf16 for inference");
  check(c.bert.B > 0, "BertForSequenceClassification::backward: the cache holds no forward pass");
  check_matrix(dlogits, c.bert.B, num_labels(), "BertForSequenceClassification::backward: dlogits");
  Mat<S> dpooled;
  classifier_.backward(dlogits, c.pooled_dropped, &dpooled);  // logits = Dropout(pooled) W_c^T + b_c
  nn::Dropout::backward(dpooled, c.drop);                      // Dropout(pooled)
  return bert_.backward(nullptr, &dpooled, c.bert);
}

#ifdef DEA_EXTERN_TEMPLATES
extern template class BertForSequenceClassification<float>;
extern template class BertForSequenceClassification<double>;
#endif

}  // namespace bert
}  // namespace dea
