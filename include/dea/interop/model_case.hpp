// dea/interop/model_case.hpp: runs a `kind = dea_model` reference case (tests/data/golden/README.md) through
// nn::TransformerModel.
//
// The case holds the model sizes in its metadata, the parameters under their state_dict names, the inputs
// (`in.input_ids`, `in.attention_mask`, `in.token_type_ids`, `in.alpha_oracle`, optional `in.target_idx`,
// `in.labels`) and the reference's `out.logits`, `out.task_loss`, `out.loss_gate` and `grad.*` of the objective
// L = task_loss + loss_gate. run_dea_model_case() rebuilds the model (dropout 0), loads the parameters by name
// (strictly; a tied `mlm_head.weight` tensor, if the file has one, must equal `tok_emb.weight`), runs forward in
// evaluation mode and backward of L, and returns `out.*` and `grad.<every parameter>` (zeros for parameters the
// objective does not reach) as F64. Compare with compare_case() of dea_case.hpp.
#pragma once

#include "../nn/transformer.hpp"
#include "dea_case.hpp"
#include "../io/safetensors.hpp"

#include <sstream>
#include <string>
#include <vector>

namespace dea::interop {

using io::SafeTensors;
using io::DType;
using io::load_parameters;

namespace detail {

/// "0,2,-1" -> {0, 2, -1}; throws on anything else.
inline std::vector<Index> parse_index_list(const std::string& s, const std::string& source, const char* key) {
  std::vector<Index> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    while (!item.empty() && (item.front() == ' ' || item.front() == '[')) item.erase(item.begin());
    while (!item.empty() && (item.back() == ' ' || item.back() == ']')) item.pop_back();
    if (item.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    check(end && *end == '\0', source, ": metadata '", key, "': expected a list of integers, got '", s, "'");
    out.push_back(static_cast<Index>(v));
  }
  return out;
}

}  // namespace detail

/// The model configuration a `kind = dea_model` case describes (dropout 0).
inline nn::ModelConfig model_case_config(const SafeTensors& cs) {
  const auto& md = cs.metadata();
  const auto kind = md.find("kind");
  check(kind != md.end() && kind->second == "dea_model", cs.source(), ": expected metadata kind = dea_model");
  nn::ModelConfig cfg;
  const auto task = md.find("task");
  check(task != md.end(), cs.source(), ": metadata 'task' is missing");
  cfg.task = nn::parse_task(task->second);
  cfg.vocab_size = detail::metadata_int(cs, "vocab_size");
  cfg.d_model = detail::metadata_int(cs, "d_model");
  cfg.n_heads = detail::metadata_int(cs, "n_heads");
  cfg.n_layers = detail::metadata_int(cs, "n_layers");
  cfg.d_ff = detail::metadata_int(cs, "d_ff");
  cfg.max_len = detail::metadata_int(cs, "max_len");
  cfg.n_classes = md.count("n_classes") ? detail::metadata_int(cs, "n_classes") : 2;
  cfg.pad_id = md.count("pad_id") ? detail::metadata_int(cs, "pad_id") : 0;
  cfg.dropout = 0;
  // The sizes must agree with the tensors the file stores, checked before the model allocates anything from them
  // (a corrupt or hostile vocab_size = 10^12 is an Error, not an attempt to allocate terabytes).
  const std::string& src = cs.source();
  auto extent = [&](const std::string& name, std::size_t k) -> Index {
    check(cs.has(name), src, ": tensor '", name, "' is missing");
    const Shape& sh = cs.shape(name);
    check(sh.size() > k, src, ": tensor '", name, "': expected at least ", k + 1, " dimensions, got ", shape_str(sh));
    return sh[k];
  };
  auto agree = [&](const char* key, Index v, const std::string& name, std::size_t k) {
    const Index e = extent(name, k);
    check(v == e, src, ": metadata '", key, "' = ", v, " disagrees with tensor '", name, "' ",
          shape_str(cs.shape(name)));
  };
  agree("vocab_size", cfg.vocab_size, "tok_emb.weight", 0);
  agree("d_model", cfg.d_model, "tok_emb.weight", 1);
  check(cfg.n_layers >= 0 && cfg.n_layers <= 1024, src, ": metadata 'n_layers' = ", cfg.n_layers,
        " is outside [0, 1024]");
  if (cfg.n_layers > 0) {
    agree("n_heads", cfg.n_heads, "layers.0.attn.W_rel", 0);
    agree("d_ff", cfg.d_ff, "layers.0.ff.0.weight", 0);
    check(cs.has("layers." + std::to_string(cfg.n_layers - 1) + ".attn.W_rel") &&
              !cs.has("layers." + std::to_string(cfg.n_layers) + ".attn.W_rel"),
          src, ": metadata 'n_layers' = ", cfg.n_layers, " disagrees with the layers the file stores");
  }
  if (cfg.task == nn::Task::cls) agree("n_classes", cfg.n_classes, "cls_head.3.weight", 0);
  check(cfg.max_len >= 1 && cfg.max_len <= (Index(1) << 16), src, ": metadata 'max_len' = ", cfg.max_len,
        " is outside [1, 65536]");
  const auto sup = md.find("supervise_layers");
  if (sup != md.end() && sup->second != "None" && sup->second != "null")
    cfg.supervise_layers = detail::parse_index_list(sup->second, cs.source(), "supervise_layers");
  return cfg;
}

/// Runs a `kind = dea_model` case in precision S; returns the computed `out.*` and `grad.*` tensors as F64.
/// `pe_table` [max_len, d_model], when given, replaces the model's positional table (the reference computes
/// its table in float32 with its own libm, whose roundings the file does not record; see the golden test).
template <class S>
SafeTensors run_dea_model_case(const SafeTensors& cs, const Mat<double>* pe_table = nullptr) {
  const nn::ModelConfig cfg = model_case_config(cs);
  const double gamma = detail::metadata_double(cs, "gamma_mix", 0.0);
  Rng rng(0);
  nn::TransformerModel<S> model(cfg, rng);
  load_parameters(model.parameters(), cs, true, {"in.", "out.", "grad.", "mlm_head.weight"});
  detail::check_finite_parameters(model.parameters(), cs.source());
  if (pe_table) model.positional().set_table(pe_table->cast<S>());
  if (cs.has("mlm_head.weight")) {
    const Tensor<double> tied = cs.get<double>("mlm_head.weight"), emb = cs.get<double>("tok_emb.weight");
    check(tied.shape == emb.shape && tied.data == emb.data, cs.source(),
          ": mlm_head.weight must equal tok_emb.weight (the head is tied)");
  }

  nn::ModelBatch<S> batch;
  batch.input_ids = cs.get<std::int64_t>("in.input_ids");
  if (cs.has("in.attention_mask")) batch.attention_mask = cs.get<std::uint8_t>("in.attention_mask");
  if (cs.has("in.token_type_ids")) batch.token_type_ids = cs.get<std::int64_t>("in.token_type_ids");
  if (cs.has("in.alpha_oracle")) batch.alpha_oracle = cs.get<S>("in.alpha_oracle");
  if (cs.has("in.target_idx")) batch.target_idx = cs.get<std::int64_t>("in.target_idx");
  if (cs.has("in.labels")) batch.labels = cs.get<std::int64_t>("in.labels");

  typename nn::TransformerModel<S>::Cache cache;
  model.zero_grad();
  const nn::ModelOutput<S> out = model.forward(batch, S(gamma), false, nullptr, cache);
  model.backward(cache);  // L = task_loss + loss_gate

  SafeTensors res;
  auto put = [&](const std::string& name, const Shape& shape, const S* data) {
    Tensor<double> d(shape);
    for (Index k = 0; k < d.numel(); ++k) d[k] = static_cast<double>(data[k]);
    res.put(name, d, DType::F64);
  };
  const Index B = batch.batch(), T = batch.seq_len();
  const Shape lshape = cfg.task == nn::Task::cls ? Shape{B, cfg.n_classes} : Shape{B, T, cfg.vocab_size};
  put("out.logits", lshape, out.logits.data());
  put("out.task_loss", {}, &out.task_loss);
  put("out.loss_gate", {}, &out.loss_gate);
  for (Param<S>* p : model.parameters()) put("grad." + p->name, p->shape, p->grad.data());
  res.set_metadata("kind", "dea_model_result");
  return res;
}

}  // namespace dea::interop
