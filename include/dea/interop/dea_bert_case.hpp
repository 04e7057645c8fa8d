// dea/interop/dea_bert_case.hpp: runs the `dea_bert` golden kind (tests/data/bert/README.md) through
// bert::DualExpertBert.
//
// A case holds the BERT configuration (metadata `config`), gamma_mix and n_classes, the parameters under the
// reference's names (bert.*, ...attention.self.dea.*, cls_head.1.*), the inputs in.input_ids, in.attention_mask,
// in.token_type_ids, in.labels [B] and, except on the inference path, in.alpha_oracle [B, T, T] (NaN = unlabelled),
// and the reference's out.logits, out.task_loss, out.loss_gate, out.loss_gate_layer.{l}, out.alpha_hat.{l}
// [B, A, T, T], out.last_hidden_state [B, T, H] and grad.* of L = task_loss + loss_gate.
// run_dea_bert_case() checks the tensors against the configuration before it builds the model (every parameter
// present with its shape, nothing extra), loads them, runs an evaluation-mode forward (dropout 0) and the
// backward of L, and returns every out.* and grad.* (one per parameter; the pooler's are zeros) as F64, with the
// gate statistics of each layer as metadata stats.{l}.* (as the case stores the reference's). Compare with
// compare_bert_case() (bert_case.hpp: the golden set's tolerances).
#pragma once

#include "../bert/dual_expert_bert.hpp"
#include "bert_case.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dea::interop {

/// Every parameter name of the DualExpertBert a `dea_bert` case describes, with its shape, in state_dict order.
inline std::vector<std::pair<std::string, Shape>> dea_bert_parameter_shapes(const bert::BertConfig& cfg,
                                                                           Index n_classes) {
  const Index H = cfg.hidden_size, A = cfg.num_attention_heads, d = cfg.head_dim();
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [name, shape] : bert::bert_parameter_shapes(cfg)) {
    const std::size_t at = name.find(".attention.self.");
    if (at == std::string::npos) {
      out.push_back({"bert." + name, shape});
      continue;
    }
    if (name.compare(name.size() - 12, 12, "query.weight") != 0) continue;  // the layer's adapter, once
    const std::string p = "bert." + name.substr(0, at) + ".attention.self.dea.";
    for (const char* w : {"W_q", "W_k", "W_v"}) {
      out.push_back({p + w + ".weight", {H, H}});
      out.push_back({p + w + ".bias", {H}});
    }
    out.push_back({p + "W_rel", {A, d, d}});
    out.push_back({p + "W_gate", {A, 2 * d + 2}});
    out.push_back({p + "c_gate", {A}});
  }
  out.push_back({"cls_head.1.weight", {n_classes, H}});
  out.push_back({"cls_head.1.bias", {n_classes}});
  return out;
}

/// Runs a `dea_bert` case in precision S (objective: task_loss + loss_gate).
template <class S>
SafeTensors run_dea_bert_case(const SafeTensors& cs) {
  const auto kind = cs.metadata().count("kind") ? cs.metadata().at("kind") : "";
  check(kind == "dea_bert", cs.source(), ": expected metadata kind = dea_bert, got '", kind, "'");
  const bert::BertConfig cfg = bert_case_config(cs);
  const Index n_classes = cs.metadata().count("n_classes") ? detail::metadata_int(cs, "n_classes") : 2;
  check(n_classes >= 1 && n_classes <= bert::BertConfig::kMaxLabels, cs.source(), ": metadata 'n_classes' = ",
        n_classes, " is out of range");
  const double gamma = detail::metadata_double(cs, "gamma_mix", 0.0);
  check(gamma >= 0 && gamma <= 1, cs.source(), ": metadata 'gamma_mix' = ", gamma, " is outside [0, 1]");

  const bert::BertBatch<S> bb = detail::bert_case_batch<S>(cs);
  const Index B = bb.batch(), T = bb.seq_len(), H = cfg.hidden_size, A = cfg.num_attention_heads;
  typename bert::DualExpertBert<S>::Batch batch;
  batch.input_ids = bb.input_ids;
  batch.attention_mask = bb.attention_mask;
  batch.token_type_ids = bb.token_type_ids;
  check(cs.has("in.labels"), cs.source(), ": tensor 'in.labels' is missing");
  batch.labels = cs.get<std::int64_t>("in.labels");
  if (cs.has("in.alpha_oracle")) {
    check(cs.shape("in.alpha_oracle") == Shape({B, T, T}), cs.source(), ": in.alpha_oracle: expected shape ",
          shape_str({B, T, T}), ", got ", shape_str(cs.shape("in.alpha_oracle")));
    batch.alpha_oracle = cs.get<S>("in.alpha_oracle");
  }

  // the model: its parameters are the case's (the random draws of the conversion are overwritten)
  const bert::HfNameMap m = detail::match_case(cs, dea_bert_parameter_shapes(cfg, n_classes), "bert.");
  Rng rng(0);
  bert::DualExpertBertOptions opt;
  opt.n_classes = n_classes;
  opt.head_dropout = 0;
  bert::DualExpertBert<S> model(bert::BertModel<S>(cfg), rng, opt);
  bert::copy_matched(model.parameters(), cs, m);

  typename bert::DualExpertBert<S>::Cache cache;
  model.zero_grad();
  const bert::DualExpertBertOutput<S> out = model.forward(batch, S(gamma), false, nullptr, cache);
  model.backward(cache);  // L = task_loss + loss_gate

  SafeTensors res;
  detail::put_f64(res, "out.logits", {B, n_classes}, out.logits.data());
  detail::put_f64(res, "out.task_loss", {}, &out.task_loss);
  detail::put_f64(res, "out.loss_gate", {}, &out.loss_gate);
  for (Index l = 0; l < model.n_layers(); ++l) {
    const std::string ls = std::to_string(l);
    detail::put_f64(res, "out.loss_gate_layer." + ls, {}, &out.layer_loss_gate[static_cast<std::size_t>(l)]);
    const Tensor<S> ah = model.alpha_hat(cache, l);
    detail::put_f64(res, "out.alpha_hat." + ls, {B, A, T, T}, ah.ptr());
    if (out.layer_supervised[static_cast<std::size_t>(l)]) {
      const GateStats& st = out.layer_stats[static_cast<std::size_t>(l)];
      res.set_metadata("stats." + ls + ".loss_reg", ::dea::detail::concat(st.loss_reg));
      res.set_metadata("stats." + ls + ".loss_spot", ::dea::detail::concat(st.loss_spot));
      res.set_metadata("stats." + ls + ".loss_decision", ::dea::detail::concat(st.loss_decision));
      res.set_metadata("stats." + ls + ".decision_side_acc", ::dea::detail::concat(st.decision_side_acc));
      res.set_metadata("stats." + ls + ".n_decision_pairs", ::dea::detail::concat(st.n_decision_pairs));
    }
  }
  detail::put_f64(res, "out.last_hidden_state", {B, T, H}, out.last_hidden_state.data());
  for (Param<S>* p : model.parameters()) detail::put_f64(res, "grad." + p->name, p->shape, p->grad.data());
  res.set_metadata("kind", "dea_bert_result");
  return res;
}

/// "layer l: n_decision_pairs ours N, the reference's M" for every layer whose count the case's metadata records
/// and `got` differs from (a pair on the border of the beta window can flip with round-off); empty when
/// every recorded count agrees.
inline std::vector<std::string> dea_bert_decision_pair_differences(const SafeTensors& expected,
                                                                   const SafeTensors& got) {
  std::vector<std::string> out;
  for (const auto& [key, value] : expected.metadata()) {
    const std::string suffix = ".n_decision_pairs";
    if (key.rfind("stats.", 0) != 0 || key.size() <= suffix.size() ||
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const auto it = got.metadata().find(key);
    const std::string ours = it == got.metadata().end() ? "none" : it->second;
    if (ours != value)
      out.push_back("layer " + key.substr(6, key.size() - 6 - suffix.size()) + ": n_decision_pairs ours " + ours +
                    ", the reference's " + value);
  }
  return out;
}

}  // namespace dea::interop
