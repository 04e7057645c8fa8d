// dea/interop/lm_case.hpp: runs one `kind = lm_model` golden case (layout below) through DecoderLM and compares.
//
// A case file holds one call of the reference's decoder LM with its loss: `in.input_ids` [B,S], pre-shifted
// `in.labels` [B,S], the parameters under their state_dict names, the expected `out.logits` [B,S,V], `out.loss` [],
// `out.hidden_states` [L+1,B,S,D], `out.last_hidden_state` [B,S,D], the gradients `grad.*` of out.loss for every
// parameter, and the configuration in the metadata `config_json` (ModelConfig fields plus label_smoothing and
// z_loss_coef). run_lm_case builds a DecoderLM<S> from the config, loads the parameters by name, runs forward, the
// loss and backward, and compares every out.* and grad.* tensor:
//   |ours - stored| <= tol * max(1, max|stored|) per tensor,
//   tol = 2e-6 in double (a pure-float64 evaluation is within 1.5e-7 of the reference, which
//   rounds the RoPE table, the softmaxes and the z-loss through float32), 1e-4 in float (float32 arithmetic
//   throughout; the measured worst error on lm_a_mha_dense is about 5e-7 of the tensor scale, so the tolerance
//   leaves two orders of magnitude for larger sizes and other seeds).
// The file's `dev_pure_f64.<name>` (distance of a pure-float64 evaluation to the stored numbers) is carried next to
// ours. The TR-MoE route tables (out.route_table.layers.{l}) must be equal, integer for integer.
//
//   auto r = dea::interop::run_lm_case<double>("tests/data/golden/lm/lm_a_mha_dense.safetensors");
//   std::cout << r.str();
//   return r.ok ? 0 : 1;
#pragma once

#include "../io/safetensors.hpp"
#include "../lm/model.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace dea::interop {

/// One compared tensor of an lm_model case.
struct LmTensorCheck {
  std::string name;
  double max_abs_error = 0;      ///< max |ours - stored|
  double max_abs_ref = 0;        ///< max |stored|
  double tolerance = 0;          ///< tol * max(1, max|stored|)
  double ref_dev_pure_f64 = -1;  ///< the file's dev_pure_f64.<name>, -1 if absent
  bool ok = false;
};

struct LmCaseResult {
  std::string path, case_name, description, attention_type, mlp_type;
  std::vector<LmTensorCheck> tensors;
  bool ok = true;
  double worst_ratio = 0;      ///< max over tensors of max_abs_error / tolerance
  double worst_rel_error = 0;  ///< max over tensors of max_abs_error / max(1, max|stored|)
  double loss = 0;             ///< our loss
  /// Every computed out.* / grad.* tensor under the case's names and shapes (F64): what `dea interop --out` writes.
  io::SafeTensors computed;

  std::string str() const {
    std::ostringstream os;
    os.precision(3);
    os << "lm_model case " << case_name << " (" << attention_type << " + " << mlp_type << "): " << (ok ? "PASS" : "FAIL")
       << "\n";
    for (const auto& t : tensors) {
      os << (t.ok ? "  ok   " : "  FAIL ") << t.name << " err " << std::scientific << t.max_abs_error << " tol "
         << t.tolerance << " max|ref| " << t.max_abs_ref;
      if (t.ref_dev_pure_f64 >= 0) os << " (file's pure-f64 dev " << t.ref_dev_pure_f64 << ")";
      os << "\n";
    }
    return os.str();
  }

  nlohmann::json to_json() const {
    nlohmann::json j;
    j["kind"] = "lm_model";
    j["path"] = path;
    j["case"] = case_name;
    j["attention_type"] = attention_type;
    j["mlp_type"] = mlp_type;
    j["ok"] = ok;
    j["worst_ratio"] = worst_ratio;
    j["worst_rel_error"] = worst_rel_error;
    for (const auto& t : tensors)
      j["tensors"][t.name] = {{"max_abs_error", t.max_abs_error}, {"max_abs_ref", t.max_abs_ref},
                              {"tolerance", t.tolerance}, {"ref_dev_pure_f64", t.ref_dev_pure_f64}, {"ok", t.ok}};
    return j;
  }
};

struct LmCaseOptions {
  double tolerance = -1;  ///< relative tolerance; < 0: 2e-6 for double, 1e-4 for float
};

/// The model configuration and loss options of a case's `config_json` (ModelConfig field names). Throws dea::Error
/// naming the field on a bad value. Fields absent from the JSON keep DecoderConfig's defaults; null means "unset".
inline lm::DecoderConfig decoder_config_from_json(const nlohmann::json& j, lm::CausalLmLossOptions* loss = nullptr,
                                                  const std::string& source = "<config>") {
  check(j.is_object(), "lm config '", source, "': expected a JSON object");
  lm::DecoderConfig c;
  const auto num = [&](const char* key, auto& field) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    check(it->is_number(), "lm config '", source, "': ", key, " expected a number, got ", it->dump());
    using F = std::decay_t<decltype(field)>;
    if constexpr (std::is_integral_v<F>) {
      const double v = it->template get<double>();
      check(v == std::floor(v) && std::abs(v) < 9.0e15, "lm config '", source, "': ", key, " expected an integer, got ",
            it->dump());
      field = static_cast<F>(v);
    } else {
      field = it->template get<double>();
    }
  };
  const auto flag = [&](const char* key, bool& field) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    check(it->is_boolean(), "lm config '", source, "': ", key, " expected true or false, got ", it->dump());
    field = it->template get<bool>();
  };
  const auto text = [&](const char* key, std::string& field) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    check(it->is_string(), "lm config '", source, "': ", key, " expected a string, got ", it->dump());
    field = it->template get<std::string>();
  };
  num("hidden_size", c.hidden_size);
  num("num_hidden_layers", c.num_hidden_layers);
  num("num_attention_heads", c.num_attention_heads);
  num("num_key_value_heads", c.num_key_value_heads);
  text("attention_type", c.attention_type);
  num("intermediate_size", c.intermediate_size);
  num("vocab_size", c.vocab_size);
  num("rope_theta", c.rope_theta);
  flag("use_qk_norm", c.use_qk_norm);
  num("norm_eps", c.norm_eps);
  flag("tie_word_embeddings", c.tie_word_embeddings);
  text("mlp_type", c.mlp_type);
  num("initializer_range", c.initializer_range);
  num("num_experts", c.num_experts);
  num("top_k", c.top_k);
  flag("shared_expert", c.shared_expert);
  num("shared_intermediate_size", c.shared_intermediate_size);
  text("routing_strategy", c.routing_strategy);
  num("top_k_primary_weight", c.top_k_primary_weight);
  num("tr_mha_num_experts", c.tr_mha_num_experts);
  num("tr_mha_adapter_rank", c.tr_mha_adapter_rank);
  num("tr_mha_top_k", c.tr_mha_top_k);
  text("tr_mha_targets", c.tr_mha_targets);
  num("tr_mha_adapter_gate_init", c.tr_mha_adapter_gate_init);
  num("tr_mha_id_primary_logit", c.tr_mha_id_primary_logit);
  num("tr_mha_id_secondary_logit", c.tr_mha_id_secondary_logit);
  num("tr_mha_id_other_logit", c.tr_mha_id_other_logit);
  num("tr_mha_verifier_gate_init", c.tr_mha_verifier_gate_init);
  num("tr_mha_verifier_temperature", c.tr_mha_verifier_temperature);
  if (loss) {
    *loss = lm::CausalLmLossOptions{};
    num("label_smoothing", loss->label_smoothing);
    num("z_loss_coef", loss->z_loss_coef);
  }
  return c;
}

/// Runs the lm_model case at `path` in precision S and compares against its stored numbers. Throws dea::Error when
/// the file is unreadable or inconsistent, or its MLP type is not available; returns ok = false on a numeric mismatch.
template <class S = double>
LmCaseResult run_lm_case(const std::string& path, const LmCaseOptions& copt = {}) {
  static_assert(std::is_same_v<S, double> || std::is_same_v<S, float>, "run_lm_case: S is float or double");
  const double tol = copt.tolerance >= 0 ? copt.tolerance : (std::is_same_v<S, double> ? 2e-6 : 1e-4);
  const io::SafeTensors st = io::SafeTensors::load(path);
  const auto& md = st.metadata();
  const auto meta = [&](const std::string& key) -> const std::string& {
    auto it = md.find(key);
    if (it == md.end()) ::dea::detail::raise("lm_model case '" + path + "': metadata key '" + key + "' is missing");
    return it->second;
  };
  check(meta("kind") == "lm_model", "lm_model case '", path, "': metadata kind expected lm_model, got '", meta("kind"),
        "'");
  nlohmann::json cj;
  try {
    cj = nlohmann::json::parse(meta("config_json"));
  } catch (const nlohmann::json::exception& e) {
    ::dea::detail::raise("lm_model case '" + path + "': config_json is not valid JSON: " + e.what());
  }
  lm::CausalLmLossOptions lopt;
  const lm::DecoderConfig cfg = decoder_config_from_json(cj, &lopt, path);
  LmCaseResult res;
  res.path = path;
  res.case_name = md.count("case") ? md.at("case") : path;
  res.description = md.count("description") ? md.at("description") : "";
  res.attention_type = cfg.attention_type;
  res.mlp_type = cfg.mlp_type;
  cfg.validate();

  lm::DecoderLM<S> model(cfg, 0);
  for (Param<S>* p : model.parameters()) {
    check(st.has(p->name), "lm_model case '", path, "': parameter '", p->name, "' is missing");
    check(st.shape(p->name) == p->shape, "lm_model case '", path, "': parameter '", p->name, "' expected shape ",
          shape_str(p->shape), ", got ", shape_str(st.shape(p->name)));
    st.get_into<S>(p->name, p->value.data(), p->numel());
  }
  const Tensor<std::int64_t> ids = st.get<std::int64_t>("in.input_ids");
  const Tensor<std::int64_t> labels = st.get<std::int64_t>("in.labels");
  check(ids.dim() == 2, "lm_model case '", path, "': in.input_ids expected shape [B, S], got ", shape_str(ids.shape));
  check(labels.shape == ids.shape, "lm_model case '", path, "': in.labels expected shape ", shape_str(ids.shape),
        ", got ", shape_str(labels.shape));
  const Index B = ids.size(0), T = ids.size(1), D = cfg.hidden_size, V = cfg.vocab_size, L = cfg.num_hidden_layers;

  typename lm::DecoderLM<S>::Cache cache;
  model.zero_grad();
  const Mat<S> logits = model.forward(ids, cache);
  const lm::CausalLmLossResult<S> lr = model.loss(logits, labels, lopt, true);
  model.backward(lr.dlogits, cache);
  res.loss = static_cast<double>(lr.loss);

  auto compare = [&](const std::string& name, const Shape& shape, const S* ours) {
    check(st.has(name), "lm_model case '", path, "': tensor '", name, "' is missing");
    check(st.shape(name) == shape, "lm_model case '", path, "': tensor '", name, "' expected shape ", shape_str(shape),
          ", got ", shape_str(st.shape(name)));
    const Index n = shape_numel(shape);
    std::vector<double> ref(static_cast<std::size_t>(n));
    st.get_into<double>(name, ref.data(), n);
    Tensor<double> t(shape);
    LmTensorCheck c;
    c.name = name;
    for (Index i = 0; i < n; ++i) {
      t[i] = static_cast<double>(ours[i]);
      const double d = std::abs(t[i] - ref[static_cast<std::size_t>(i)]);
      if (std::isnan(d)) c.max_abs_error = INFINITY;
      else c.max_abs_error = std::max(c.max_abs_error, d);
      c.max_abs_ref = std::max(c.max_abs_ref, std::abs(ref[static_cast<std::size_t>(i)]));
    }
    res.computed.put(name, t, io::DType::F64);
    c.tolerance = tol * std::max(1.0, c.max_abs_ref);
    c.ok = c.max_abs_error <= c.tolerance;
    auto it = md.find("dev_pure_f64." + name);
    if (it != md.end()) {
      try {
        c.ref_dev_pure_f64 = std::stod(it->second);
      } catch (const std::exception&) {
      }
    }
    res.worst_ratio = std::max(res.worst_ratio, c.max_abs_error / c.tolerance);
    res.worst_rel_error = std::max(res.worst_rel_error, c.max_abs_error / std::max(1.0, c.max_abs_ref));
    res.ok = res.ok && c.ok;
    res.tensors.push_back(c);
  };

  compare("out.logits", {B, T, V}, logits.data());
  const S loss_value = lr.loss;
  compare("out.loss", {}, &loss_value);
  {
    Mat<S> hs((L + 1) * B * T, D);
    for (Index l = 0; l <= L; ++l) hs.middleRows(l * B * T, B * T) = cache.hidden[static_cast<std::size_t>(l)];
    compare("out.hidden_states", {L + 1, B, T, D}, hs.data());
  }
  compare("out.last_hidden_state", {B, T, D}, cache.hf.data());
  for (Param<S>* p : model.parameters()) compare("grad." + p->name, p->shape, p->grad.data());
  // the TR-MoE route tables [V, k], exact (the reference's own integers)
  for (Index l = 0; l < L; ++l) {
    const lm::TrMoeMlp<S>* moe = model.tr_moe(l);
    const std::string name = "out.route_table.layers." + std::to_string(l);
    if (!moe) continue;
    const lm::RouteTable& R = moe->route_table();
    const Shape shape{R.rows(), R.cols()};
    check(st.has(name), "lm_model case '", path, "': tensor '", name, "' is missing");
    check(st.shape(name) == shape, "lm_model case '", path, "': tensor '", name, "' expected shape ", shape_str(shape),
          ", got ", shape_str(st.shape(name)));
    const Tensor<std::int64_t> ref = st.get<std::int64_t>(name);
    Tensor<std::int64_t> ours(shape);
    LmTensorCheck c;
    c.name = name;
    for (Index i = 0; i < ours.numel(); ++i) {
      ours[i] = R.data()[i];
      c.max_abs_error = std::max(c.max_abs_error, std::abs(double(ours[i]) - double(ref[i])));
      c.max_abs_ref = std::max(c.max_abs_ref, std::abs(double(ref[i])));
    }
    res.computed.put(name, ours);
    c.tolerance = 0;  // exact
    c.ok = c.max_abs_error == 0;
    res.ok = res.ok && c.ok;
    res.tensors.push_back(c);
  }
  // every out.* / grad.* of the file must have been compared
  for (const std::string& n : st.names())
    if (n.rfind("out.", 0) == 0 || n.rfind("grad.", 0) == 0) {
      bool seen = false;
      for (const auto& t : res.tensors) seen = seen || t.name == n;
      check(seen, "lm_model case '", path, "': stored tensor '", n, "' has no counterpart in this model");
    }
  res.computed.set_metadata(std::map<std::string, std::string>{{"kind", "lm_model_result"}, {"case", res.case_name}});
  return res;
}

}  // namespace dea::interop
