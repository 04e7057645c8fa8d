// dea/interop/bert_case.hpp: runs the BERT golden kinds (tests/data/bert/README.md) through bert::BertModel and
// bert::BertForSequenceClassification, and a Hugging Face model directory on a case's inputs.
//
// A case holds its BERT configuration as the JSON string metadata `config`, the parameters under their HF names,
// the inputs `in.input_ids`, `in.attention_mask`, `in.token_type_ids` (I64 [B, T]) and the expected `out.*` and
// `grad.*`:
//   bert_model          L = sum(last_hidden_state * in.grad_last_hidden_state) + sum(pooler_output *
//                       in.grad_pooler_output); out.last_hidden_state [B, T, H], out.pooler_output [B, H], grad.*
//   bert_seq_cls        L = mean cross-entropy of in.labels; out.logits [B, C], out.loss [], grad.* ("bert." names)
//   sentence_embedding  out.embedding [B, H] (mean over the mask, L2-normalised), out.last_hidden_state; no grad.*
// run_bert_case() checks the case's tensors against its configuration before it builds the model (every parameter
// present with its shape; a tensor that is no parameter is an error), runs an evaluation-mode forward (dropout 0)
// and the objective's backward, and returns every out.* and grad.* (one per parameter) as F64.
// run_hf_model_case() loads the BertModel of a model directory (bert/hf_dir.hpp) and writes out.last_hidden_state and
// out.pooler_output for the case's in.* tensors (the hf_fixtures' expected.safetensors are such cases).
// compare_bert_case() applies the golden set's tolerances: relative to each tensor's largest magnitude, 1e-9 in double;
// in float 1e-4 for out.* and 1e-3 for grad.*; a gradient that is zero in exact arithmetic (the key biases) is
// measured relative to the case's largest gradient instead (see there).
#pragma once

#include "../bert/config.hpp"
#include "../bert/hf_dir.hpp"
#include "../bert/model.hpp"
#include "../bert/sentence_embedding.hpp"
#include "../bert/seq_cls.hpp"
#include "../io/json_limits.hpp"
#include "../io/safetensors.hpp"
#include "dea_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dea::interop {

/// The BERT configuration a golden case describes (its metadata `config`), with every dropout 0.
inline bert::BertConfig bert_case_config(const SafeTensors& cs) {
  const auto& md = cs.metadata();
  const auto it = md.find("config");
  check(it != md.end(), cs.source(), ": metadata 'config' (the BERT configuration as JSON) is missing");
  const std::string src = cs.source() + ": metadata 'config'";
  bert::BertConfig cfg = bert::parse_bert_config(io::parse_json_limited(it->second, src), src);
  cfg.hidden_dropout_prob = 0;
  cfg.attention_probs_dropout_prob = 0;
  cfg.classifier_dropout = 0.0;
  return cfg;
}

namespace detail {

/// Stores m (any shape with m.size() elements) as an F64 tensor of `shape`.
template <class S>
void put_f64(SafeTensors& out, const std::string& name, const Shape& shape, const S* data) {
  Tensor<double> d(shape);
  for (Index k = 0; k < d.numel(); ++k) d[k] = static_cast<double>(data[k]);
  out.put(name, d, DType::F64);
}

/// The case's in.input_ids / in.attention_mask / in.token_type_ids as a batch of an encoder family (a type with
/// those three members: bert::BertBatch, deberta::DebertaBatch).
template <class Batch>
Batch read_case_batch(const SafeTensors& cs) {
  Batch b;
  check(cs.has("in.input_ids"), cs.source(), ": tensor 'in.input_ids' is missing");
  b.input_ids = cs.get<std::int64_t>("in.input_ids");
  check(b.input_ids.dim() == 2, cs.source(), ": in.input_ids: expected shape [B, T], got ", shape_str(b.input_ids.shape));
  if (cs.has("in.attention_mask")) {
    b.attention_mask = cs.get<std::uint8_t>("in.attention_mask");
    for (Index k = 0; k < b.attention_mask.numel(); ++k)
      check(b.attention_mask[k] <= 1, cs.source(), ": in.attention_mask: expected 0 or 1, got ",
            int(b.attention_mask[k]), " at flat index ", k);
  }
  if (cs.has("in.token_type_ids")) b.token_type_ids = cs.get<std::int64_t>("in.token_type_ids");
  return b;
}

/// The case's inputs as a BERT batch (read_case_batch).
template <class S>
bert::BertBatch<S> bert_case_batch(const SafeTensors& cs) {
  return read_case_batch<bert::BertBatch<S>>(cs);
}

/// Validates the case's parameters against `expected` (nothing missing, nothing extra, shapes, finite).
inline bert::HfNameMap match_case(const SafeTensors& cs, const std::vector<std::pair<std::string, Shape>>& expected,
                                  const std::string& base_prefix) {
  bert::HfNameMap m = bert::match_checkpoint(cs, expected, base_prefix, cs.source(), {}, {"in.", "out.", "grad."});
  check(m.ignored.empty(), cs.source(), ": tensor '", m.ignored.empty() ? "" : m.ignored.front(),
        "' is no parameter of the model its configuration describes");
  return m;
}

}  // namespace detail

/// Runs a `bert_model` or `sentence_embedding` case in precision S.
template <class S>
SafeTensors run_bert_model_case(const SafeTensors& cs) {
  const auto kind = cs.metadata().count("kind") ? cs.metadata().at("kind") : "";
  check(kind == "bert_model" || kind == "sentence_embedding", cs.source(),
        ": expected metadata kind = bert_model or sentence_embedding, got '", kind, "'");
  const bert::BertConfig cfg = bert_case_config(cs);
  const bert::BertBatch<S> batch = detail::bert_case_batch<S>(cs);
  const Index B = batch.batch(), T = batch.seq_len(), H = cfg.hidden_size;
  const bool grads = kind == "bert_model";
  if (grads) {
    check(cs.has("in.grad_last_hidden_state") && cs.shape("in.grad_last_hidden_state") == Shape({B, T, H}),
          cs.source(), ": in.grad_last_hidden_state: expected shape ", shape_str({B, T, H}));
    check(cs.has("in.grad_pooler_output") && cs.shape("in.grad_pooler_output") == Shape({B, H}), cs.source(),
          ": in.grad_pooler_output: expected shape ", shape_str({B, H}));
  }
  const bert::HfNameMap m = detail::match_case(cs, bert::bert_parameter_shapes(cfg), "");
  bert::BertModel<S> model(cfg);
  bert::copy_matched(model.parameters(), cs, m);

  typename bert::BertModel<S>::Cache cache;
  const bert::BertOutput<S> out = model.forward(batch, cache);
  SafeTensors res;
  detail::put_f64(res, "out.last_hidden_state", {B, T, H}, out.last_hidden_state.data());
  if (grads) {
    detail::put_f64(res, "out.pooler_output", {B, H}, out.pooler_output.data());
    Mat<S> gl(B * T, H), gp(B, H);
    cs.get_into<S>("in.grad_last_hidden_state", gl.data(), gl.size());
    cs.get_into<S>("in.grad_pooler_output", gp.data(), gp.size());
    model.zero_grad();
    model.backward(&gl, &gp, cache);  // L = <last_hidden_state, G_last> + <pooler_output, G_pool>
    for (Param<S>* p : model.parameters()) detail::put_f64(res, "grad." + p->name, p->shape, p->grad.data());
  } else {
    const Mat<S> e = bert::mean_pool_normalize(out.last_hidden_state, batch.attention_mask, B, T);
    detail::put_f64(res, "out.embedding", {B, H}, e.data());
  }
  res.set_metadata("kind", kind + "_result");
  return res;
}

/// Runs a `bert_seq_cls` case in precision S (objective: the mean cross-entropy).
template <class S>
SafeTensors run_bert_seq_cls_case(const SafeTensors& cs) {
  const auto kind = cs.metadata().count("kind") ? cs.metadata().at("kind") : "";
  check(kind == "bert_seq_cls", cs.source(), ": expected metadata kind = bert_seq_cls, got '", kind, "'");
  bert::BertConfig cfg = bert_case_config(cs);
  if (cs.metadata().count("num_labels")) {
    const Index n = detail::metadata_int(cs, "num_labels");
    check(n >= 1 && n <= bert::BertConfig::kMaxLabels, cs.source(), ": metadata 'num_labels' = ", n, " is out of range");
    cfg.id2label.clear();
    for (Index k = 0; k < n; ++k) cfg.id2label.push_back("LABEL_" + std::to_string(k));
  }
  const bert::BertBatch<S> batch = detail::bert_case_batch<S>(cs);
  check(cs.has("in.labels"), cs.source(), ": tensor 'in.labels' is missing");
  const Tensor<std::int64_t> labels = cs.get<std::int64_t>("in.labels");
  const bert::HfNameMap m = detail::match_case(cs, bert::seq_cls_parameter_shapes(cfg), "bert.");
  bert::BertForSequenceClassification<S> model(cfg);
  bert::copy_matched(model.parameters(), cs, m);

  typename bert::BertForSequenceClassification<S>::Cache cache;
  const bert::SeqClsOutput<S> out = model.forward(batch, &labels, false, nullptr, cache);
  model.zero_grad();
  model.backward(cache);
  SafeTensors res;
  detail::put_f64(res, "out.logits", {batch.batch(), model.num_labels()}, out.logits.data());
  detail::put_f64(res, "out.loss", {}, &out.loss);
  for (Param<S>* p : model.parameters()) detail::put_f64(res, "grad." + p->name, p->shape, p->grad.data());
  res.set_metadata("kind", "bert_seq_cls_result");
  return res;
}

/// True for the kinds run_bert_case runs.
inline bool is_bert_kind(const std::string& kind) {
  return kind == "bert_model" || kind == "bert_seq_cls" || kind == "sentence_embedding";
}

/// Runs a case of any BERT kind (is_bert_kind) in precision S.
template <class S>
SafeTensors run_bert_case(const SafeTensors& cs) {
  const auto kind = cs.metadata().count("kind") ? cs.metadata().at("kind") : "";
  if (kind == "bert_seq_cls") return run_bert_seq_cls_case<S>(cs);
  return run_bert_model_case<S>(cs);
}

/// Loads the BertModel of the Hugging Face model directory `dir` in precision S, runs it on the case's in.* tensors
/// (evaluation mode) and returns out.last_hidden_state [B, T, H] and out.pooler_output [B, H] as F64.
template <class S>
SafeTensors run_hf_model_case(const std::string& dir, const SafeTensors& cs, bert::HfLoadReport* report = nullptr) {
  bert::BertModel<S> model = bert::load_bert_model<S>(dir, report);
  const bert::BertBatch<S> batch = detail::bert_case_batch<S>(cs);
  typename bert::BertModel<S>::Cache cache;
  const bert::BertOutput<S> out = model.forward(batch, cache);
  const Index B = batch.batch(), T = batch.seq_len(), H = model.config().hidden_size;
  SafeTensors res;
  detail::put_f64(res, "out.last_hidden_state", {B, T, H}, out.last_hidden_state.data());
  detail::put_f64(res, "out.pooler_output", {B, H}, out.pooler_output.data());
  res.set_metadata("kind", "hf_model_result");
  return res;
}

/// The golden set's tolerance for tensor `name`: 1e-9 in double; in float 1e-4 for out.*, 1e-3 for grad.*.
inline double bert_tolerance(const std::string& name, bool is_float) {
  if (!is_float) return 1e-9;
  return name.rfind("grad.", 0) == 0 ? 1e-3 : 1e-4;
}

/// One compared tensor of a BERT case.
struct BertTensorComparison : TensorComparison {
  /// The tensor is zero in exact arithmetic (compare_bert_case): rel_error is relative to the case's largest
  /// gradient magnitude instead of the tensor's own.
  bool on_case_scale = false;
};

/// compare_case with bert_tolerance per tensor. With `only_computed`, expected tensors `got` does not hold are
/// left out (a model directory run computes two outputs, whatever else the case stores).
///
/// A gradient that is zero in exact arithmetic holds only round-off in the reference: the key biases, since the
/// softmax is invariant to adding q_i . b_k to every score of row i, so dL/db_k = sum_j dK_j = sum_i (sum_j dS_ij) q_i
/// = 0 (the reference stores values of ~1e-15). Relative to its own largest magnitude, two correct implementations
/// differ there by O(1), whatever their precision. A grad.* tensor whose largest expected magnitude is below 1e-12
/// of the case's largest gradient magnitude is therefore measured relative to that largest gradient magnitude (the
/// scale its round-off comes from), with the same tolerance; every other tensor relative to its own.
inline std::vector<BertTensorComparison> compare_bert_case(const SafeTensors& expected, const SafeTensors& got,
                                                           bool is_float, bool only_computed = false) {
  double grad_scale = 0;
  for (const std::string& name : expected.names())
    if (name.rfind("grad.", 0) == 0 && dtype_is_floating(expected.dtype(name))) {
      const Tensor<double> e = expected.get<double>(name);
      for (Index k = 0; k < e.numel(); ++k)
        if (!std::isnan(e[k])) grad_scale = std::max(grad_scale, std::abs(e[k]));
    }
  std::vector<BertTensorComparison> out;
  for (const TensorComparison& tc : compare_case(expected, got, 1e-9)) {
    if (tc.missing && only_computed) continue;
    BertTensorComparison c;
    static_cast<TensorComparison&>(c) = tc;
    if (!c.missing && !c.integer) {
      if (c.name.rfind("grad.", 0) == 0 && c.max_expected < 1e-12 * grad_scale && std::isfinite(c.rel_error)) {
        c.rel_error = c.rel_error * std::max(c.max_expected, 1e-12) / grad_scale;  // max |got - expected| / scale
        c.on_case_scale = true;
      }
      c.ok = c.rel_error <= bert_tolerance(c.name, is_float);
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace dea::interop
