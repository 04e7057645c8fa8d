// dea/interop/deberta_case.hpp: runs the DeBERTa golden kinds (tests/data/deberta/README.md) through
// deberta::DebertaV2Model and deberta::DebertaV2ForSequenceClassification, the bucket table through
// deberta::relative_bucket, and a DeBERTa model directory on a case's inputs.
//
//   deberta_model    the configuration in metadata `config` (JSON), the parameters under their HF names, in.input_ids
//                    / in.attention_mask / in.token_type_ids (I64 [B, T]); computes out.last_hidden_state [B, T, H],
//                    out.hidden_states.{i} [B, T, H] for i = 0 ... L-1 (0 = the embedding output), out.relative_pos
//                    I64 [2T - 1] (relative attention only)
//   deberta_seq_cls  the same with "deberta." names plus pooler.* and classifier.*; out.logits [B, C] as well
//   bucket_table     metadata position_buckets and max_relative_positions; in.relative_position (and
//                    in.relative_position_ext) I64; computes out.bucket, out.c2p_index (and out.bucket_ext)
// A case's tensors are checked against its configuration before the model is built (every parameter present with
// its shape, nothing extra). run_deberta_hf_case() loads a model directory (deberta/hf_dir.hpp) and computes
// out.last_hidden_state, and out.logits when the directory holds a classifier, for a case's in.* tensors (the
// deberta_fixtures' expected.safetensors are such cases). Tolerances: relative to each tensor's largest magnitude,
// 1e-9 in double, 1e-4 in float; integer tensors exact.
#pragma once

#include "../deberta/config.hpp"
#include "../deberta/hf_dir.hpp"
#include "../deberta/model.hpp"
#include "../deberta/relative.hpp"
#include "../deberta/seq_cls.hpp"
#include "../io/json_limits.hpp"
#include "../io/safetensors.hpp"
#include "bert_case.hpp"
#include "dea_case.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dea::interop {

/// True for the kinds run_deberta_case runs.
inline bool is_deberta_kind(const std::string& kind) {
  return kind == "deberta_model" || kind == "deberta_seq_cls" || kind == "bucket_table";
}

/// The DeBERTa configuration a golden case describes (its metadata `config`), with id2label from the metadata
/// `id2label` when the configuration lacks it.
inline deberta::DebertaConfig deberta_case_config(const SafeTensors& cs) {
  const auto& md = cs.metadata();
  const auto it = md.find("config");
  check(it != md.end(), cs.source(), ": metadata 'config' (the DeBERTa configuration as JSON) is missing");
  const std::string src = cs.source() + ": metadata 'config'";
  nlohmann::json j = io::parse_json_limited(it->second, src);
  const auto lab = md.find("id2label");
  if (j.is_object() && !j.contains("id2label") && lab != md.end())
    j["id2label"] = io::parse_json_limited(lab->second, cs.source() + ": metadata 'id2label'");
  return deberta::parse_deberta_config(j, src);
}

namespace detail {

/// The case's in.input_ids / in.attention_mask / in.token_type_ids as a DeBERTa batch (read_case_batch).
inline deberta::DebertaBatch deberta_case_batch(const SafeTensors& cs) {
  return read_case_batch<deberta::DebertaBatch>(cs);
}

/// Stores the encoder's outputs: last_hidden_state, hidden_states 0 ... L-1, relative_pos.
template <class S>
void put_deberta_outputs(SafeTensors& res, const deberta::DebertaOutput<S>& out, Index B, Index T, Index H) {
  put_f64(res, "out.last_hidden_state", {B, T, H}, out.last_hidden_state.data());
  for (std::size_t i = 0; i + 1 < out.hidden_states.size(); ++i)
    put_f64(res, "out.hidden_states." + std::to_string(i), {B, T, H}, out.hidden_states[i].data());
  if (!out.relative_pos.empty()) {
    Tensor<std::int64_t> r({static_cast<Index>(out.relative_pos.size())});
    for (std::size_t k = 0; k < out.relative_pos.size(); ++k) r[static_cast<Index>(k)] = out.relative_pos[k];
    res.put("out.relative_pos", r, DType::I64);
  }
}

}  // namespace detail

/// Runs a `deberta_model` or `deberta_seq_cls` case in precision S; returns every out.* it computes (F64; the
/// relative positions I64).
template <class S>
SafeTensors run_deberta_model_case(const SafeTensors& cs) {
  const auto kind = cs.metadata().count("kind") ? cs.metadata().at("kind") : "";
  check(kind == "deberta_model" || kind == "deberta_seq_cls", cs.source(),
        ": expected metadata kind = deberta_model or deberta_seq_cls, got '", kind, "'");
  const deberta::DebertaConfig cfg = deberta_case_config(cs);
  const deberta::DebertaBatch batch = detail::deberta_case_batch(cs);
  const Index B = batch.batch(), T = batch.seq_len(), H = cfg.hidden_size;
  SafeTensors res;
  if (kind == "deberta_model") {
    const bert::HfNameMap m = detail::match_case(cs, deberta::deberta_parameter_shapes(cfg), "");
    deberta::DebertaV2Model<S> model(cfg);
    bert::copy_matched(model.parameters(), cs, m);
    detail::put_deberta_outputs(res, model.forward(batch, true), B, T, H);
  } else {
    const bert::HfNameMap m = detail::match_case(cs, deberta::deberta_seq_cls_parameter_shapes(cfg), "");
    deberta::DebertaV2ForSequenceClassification<S> model(cfg);
    bert::copy_matched(model.parameters(), cs, m);
    const deberta::DebertaSeqClsOutput<S> out = model.forward(batch, true);
    detail::put_f64(res, "out.logits", {B, model.num_labels()}, out.logits.data());
    detail::put_deberta_outputs(res, out.deberta, B, T, H);
  }
  res.set_metadata("kind", kind + "_result");
  return res;
}

/// Runs a `bucket_table` case: the bucket of every in.relative_position (and in.relative_position_ext) and the c2p
/// table row of the first, for the metadata's position_buckets and max_relative_positions.
inline SafeTensors run_bucket_table_case(const SafeTensors& cs) {
  const std::int64_t k = detail::metadata_int(cs, "position_buckets");
  const std::int64_t R = detail::metadata_int(cs, "max_relative_positions");
  check(k >= 2 && R >= 1 && k / 2 != R - 1 && R <= deberta::DebertaConfig::kMaxPositions, cs.source(),
        ": metadata position_buckets = ", k, ", max_relative_positions = ", R, ": expected position_buckets >= 2 "
        "with half of it other than max_relative_positions - 1");
  const std::int64_t S = k;  // the attention span with buckets
  SafeTensors res;
  auto buckets = [&](const std::string& in, const std::string& out, const char* rows) {
    const Tensor<std::int64_t> r = cs.get<std::int64_t>(in);
    Tensor<std::int64_t> b(r.shape), c(r.shape);
    for (Index n = 0; n < r.numel(); ++n) {
      check(r[n] > -(std::int64_t(1) << 40) && r[n] < (std::int64_t(1) << 40), cs.source(), ": ", in,
            ": distance ", r[n], " is out of range");
      b[n] = deberta::relative_bucket(r[n], k, R);
      c[n] = std::clamp<std::int64_t>(b[n] + S, 0, 2 * S - 1);
    }
    res.put(out, b, DType::I64);
    if (rows) res.put(rows, c, DType::I64);
  };
  check(cs.has("in.relative_position"), cs.source(), ": tensor 'in.relative_position' is missing");
  buckets("in.relative_position", "out.bucket", "out.c2p_index");
  if (cs.has("in.relative_position_ext")) buckets("in.relative_position_ext", "out.bucket_ext", nullptr);
  res.set_metadata("kind", "bucket_table_result");
  return res;
}

/// Runs a case of any DeBERTa kind (is_deberta_kind) in precision S (the bucket table is integer: S is unused).
template <class S>
SafeTensors run_deberta_case(const SafeTensors& cs) {
  const auto kind = cs.metadata().count("kind") ? cs.metadata().at("kind") : "";
  if (kind == "bucket_table") return run_bucket_table_case(cs);
  return run_deberta_model_case<S>(cs);
}

/// Loads the DeBERTa model directory `dir` in precision S (a DebertaV2ForSequenceClassification when its weights hold
/// classifier.weight, the DebertaV2Model otherwise), runs it on the case's in.* tensors and returns
/// out.last_hidden_state [B, T, H] (and out.logits [B, C]) as F64.
template <class S>
SafeTensors run_deberta_hf_case(const std::string& dir, const SafeTensors& cs, deberta::LoadReport* report = nullptr) {
  const deberta::DebertaDir d = deberta::open_deberta_dir(dir);
  const deberta::DebertaBatch batch = detail::deberta_case_batch(cs);
  const Index B = batch.batch(), T = batch.seq_len(), H = d.config.hidden_size;
  SafeTensors res;
  if (d.weights.has("classifier.weight")) {
    const auto model = deberta::load_deberta_for_sequence_classification<S>(d, report);
    const deberta::DebertaSeqClsOutput<S> out = model.forward(batch);
    detail::put_f64(res, "out.logits", {B, model.num_labels()}, out.logits.data());
    detail::put_f64(res, "out.last_hidden_state", {B, T, H}, out.deberta.last_hidden_state.data());
  } else {
    const auto model = deberta::load_deberta_model<S>(d, report);
    const deberta::DebertaOutput<S> out = model.forward(batch);
    detail::put_f64(res, "out.last_hidden_state", {B, T, H}, out.last_hidden_state.data());
  }
  res.set_metadata("kind", "deberta_dir_result");
  return res;
}

/// compare_case with the DeBERTa tolerances (1e-9 in double, 1e-4 in float; integers exact). With `only_computed`,
/// expected tensors `got` does not hold are left out.
inline std::vector<TensorComparison> compare_deberta_case(const SafeTensors& expected, const SafeTensors& got,
                                                          bool is_float, bool only_computed = false) {
  std::vector<TensorComparison> out;
  for (const TensorComparison& c : compare_case(expected, got, is_float ? 1e-4 : 1e-9))
    if (!(c.missing && only_computed)) out.push_back(c);
  return out;
}

}  // namespace dea::interop
