// dea/interop/tr_mha_case.hpp: runs one `kind = tr_mha_layer` interop case (tests/data/golden/README.md) and compares.
//
// A case file holds one call of one token-routed MHA layer of the reference: inputs `in.x` [B,S,D],
// `in.token_ids` [B,S], `in.grad_output` [B,S,D], the parameters under their state_dict names, the expected
// forward values `out.*`, the gradients `grad.*` of L = sum(out.output * in.grad_output) and the configuration
// and telemetry in `__metadata__`. run_tr_mha_case builds a TokenRoutedAttention<S> from the metadata, loads the
// parameters by name, runs forward and backward and compares every `out.*` and `grad.*` tensor:
//   |ours - stored| <= tol * max(1, max|stored|) per tensor (tol 2e-6 in double, 1e-4 in float),
//   out.route_idx exactly, telemetry values within 1e-6 (the reference computes them in float32).
// The reference rounds the RoPE table, the attention probabilities and the route softmaxes through float32, so a
// double run is not bit-exact; the file records that distance for a pure-float64 evaluation as
// `dev_pure_f64.<name>`, which the result carries next to ours.
//
//   auto r = dea::interop::run_tr_mha_case<double>("tests/data/golden/tr_mha/v1_basic.safetensors");
//   std::cout << r.str();   // or r.to_json()
//   return r.ok ? 0 : 1;
#pragma once

#include "../attention/token_routed.hpp"
#include "../io/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace dea::interop {

using io::SafeTensors;

/// One compared tensor.
struct TrMhaTensorCheck {
  std::string name;                ///< "out.output", "grad.q_proj.weight", "grad.in.x", ...
  double max_abs_error = 0;        ///< max |ours - stored|
  double max_abs_ref = 0;          ///< max |stored|
  double tolerance = 0;            ///< tol * max(1, max|stored|); 0 for exact comparisons
  double ref_dev_pure_f64 = -1;    ///< the file's dev_pure_f64.<name> (max |pure f64 - stored|), -1 if absent
  bool ok = false;
};

/// One compared telemetry value.
struct TrMhaTelemetryCheck {
  std::string name;  ///< "tr_mha_gate", ...
  double ours = 0, stored = 0, error = 0, tolerance = 0;
  bool ok = false;
};

struct TrMhaCaseResult {
  std::string path, case_name, variant, description;
  std::vector<TrMhaTensorCheck> tensors;
  std::vector<TrMhaTelemetryCheck> telemetry;
  bool ok = true;
  double worst_ratio = 0;  ///< max over tensors of max_abs_error / tolerance (exact tensors excluded)
  /// Every tensor the runner computed, under the case's names and shapes (out.*, grad.*: F64, out.route_idx: I64),
  /// with the telemetry as metadata "telemetry.<name>": what `dea interop CASE --out R.safetensors` writes.
  SafeTensors computed;

  std::string str() const {
    std::ostringstream os;
    os.precision(3);
    os << "tr_mha_layer case " << case_name << " (" << variant << "): " << (ok ? "PASS" : "FAIL") << "\n";
    for (const auto& t : tensors) {
      os << (t.ok ? "  ok   " : "  FAIL ") << t.name << " err " << std::scientific << t.max_abs_error << " tol "
         << t.tolerance << " max|ref| " << t.max_abs_ref;
      if (t.ref_dev_pure_f64 >= 0) os << " (file's pure-f64 dev " << t.ref_dev_pure_f64 << ")";
      os << "\n";
    }
    for (const auto& t : telemetry)
      os << (t.ok ? "  ok   " : "  FAIL ") << "telemetry." << t.name << " ours " << t.ours << " stored " << t.stored
         << " err " << t.error << "\n";
    return os.str();
  }

  nlohmann::json to_json() const {
    nlohmann::json j;
    j["kind"] = "tr_mha_layer";
    j["path"] = path;
    j["case"] = case_name;
    j["variant"] = variant;
    j["ok"] = ok;
    j["worst_ratio"] = worst_ratio;
    for (const auto& t : tensors)
      j["tensors"][t.name] = {{"max_abs_error", t.max_abs_error}, {"max_abs_ref", t.max_abs_ref},
                              {"tolerance", t.tolerance}, {"ref_dev_pure_f64", t.ref_dev_pure_f64}, {"ok", t.ok}};
    for (const auto& t : telemetry)
      j["telemetry"][t.name] = {{"ours", t.ours}, {"stored", t.stored}, {"error", t.error}, {"ok", t.ok}};
    return j;
  }
};

struct TrMhaCaseOptions {
  double tolerance = -1;            ///< relative tolerance; < 0: 2e-6 for double, 1e-4 for float
  double telemetry_tolerance = 1e-6;
};

namespace detail {

inline const std::string& tr_meta(const std::map<std::string, std::string>& md, const std::string& key,
                                  const std::string& source) {
  auto it = md.find(key);
  if (it == md.end()) ::dea::detail::raise("tr_mha case '" + source + "': metadata key '" + key + "' is missing");
  return it->second;
}

inline double tr_meta_double(const std::map<std::string, std::string>& md, const std::string& key,
                             const std::string& source) {
  const std::string& s = tr_meta(md, key, source);
  try {
    std::size_t pos = 0;
    const double v = std::stod(s, &pos);
    return v;
  } catch (const std::exception&) {
    ::dea::detail::raise("tr_mha case '" + source + "': metadata '" + key + "' is not a number: '" + s + "'");
  }
}

inline Index tr_meta_index(const std::map<std::string, std::string>& md, const std::string& key,
                           const std::string& source) {
  const double v = tr_meta_double(md, key, source);
  check(v == std::floor(v) && std::abs(v) < 9.0e15, "tr_mha case '", source, "': metadata '", key,
        "' must be an integer, got ", v);
  return static_cast<Index>(v);
}

inline bool tr_meta_bool(const std::map<std::string, std::string>& md, const std::string& key,
                         const std::string& source) {
  const std::string& s = tr_meta(md, key, source);
  if (s == "true" || s == "True" || s == "1") return true;
  if (s == "false" || s == "False" || s == "0") return false;
  ::dea::detail::raise("tr_mha case '" + source + "': metadata '" + key + "' is not a boolean: '" + s + "'");
}

}  // namespace detail

/// The layer configuration a case's metadata describes (throws dea::Error on a missing or unsupported key).
inline TokenRoutedOptions tr_mha_options_from_metadata(const std::map<std::string, std::string>& md,
                                                       const std::string& source = "<memory>") {
  using namespace detail;
  TokenRoutedOptions o;
  o.variant = parse_tr_variant(tr_meta(md, "variant", source));
  o.num_experts = tr_meta_index(md, "num_experts", source);
  o.adapter_rank = tr_meta_index(md, "adapter_rank", source);
  o.top_k = tr_meta_index(md, "top_k", source);
  o.targets = parse_tr_targets(tr_meta(md, "targets", source));
  o.layer_idx = tr_meta_index(md, "layer_idx", source);
  o.id_primary_logit = tr_meta_double(md, "id_primary_logit", source);
  o.id_secondary_logit = tr_meta_double(md, "id_secondary_logit", source);
  o.id_other_logit = tr_meta_double(md, "id_other_logit", source);
  o.verifier_temperature = tr_meta_double(md, "verifier_temperature", source);
  o.verifier_gate_init = tr_meta_double(md, "verifier_gate_init", source);
  o.adapter_gate_init = tr_meta_double(md, "adapter_gate_init", source);
  o.rope_theta = tr_meta_double(md, "rope_theta", source);
  o.use_qk_norm = tr_meta_bool(md, "use_qk_norm", source);
  o.qk_norm_eps = tr_meta_double(md, "qk_norm_eps", source);
  o.causal = tr_meta_bool(md, "causal", source);
  // Settings this layer implements only one way: refuse a case that asks for another.
  check(tr_meta_index(md, "position_offset", source) == 0, "tr_mha case '", source,
        "': only position_offset 0 is supported");
  check(tr_meta_double(md, "attention_dropout", source) == 0.0, "tr_mha case '", source,
        "': attention_dropout must be 0");
  check(tr_meta_index(md, "num_kv_heads", source) == tr_meta_index(md, "num_heads", source), "tr_mha case '", source,
        "': num_kv_heads must equal num_heads");
  const double dh = static_cast<double>(tr_meta_index(md, "head_dim", source));
  const double scale = tr_meta_double(md, "attn_scale", source);
  check(std::abs(scale - 1.0 / std::sqrt(dh)) <= 1e-12, "tr_mha case '", source, "': attn_scale expected 1/sqrt(",
        dh, "), got ", scale);
  return o;
}

/// Runs the case file at `path` in precision S and compares against its stored numbers. Throws dea::Error when
/// the file is unreadable or inconsistent (missing tensors, wrong shapes); returns ok = false on a numeric mismatch.
template <class S = double>
TrMhaCaseResult run_tr_mha_case(const std::string& path, const TrMhaCaseOptions& copt = {}) {
  static_assert(std::is_same_v<S, double> || std::is_same_v<S, float>, "run_tr_mha_case: S is float or double");
  const double tol = copt.tolerance >= 0 ? copt.tolerance : (std::is_same_v<S, double> ? 2e-6 : 1e-4);
  const SafeTensors st = SafeTensors::load(path);
  const auto& md = st.metadata();
  using namespace detail;
  check(tr_meta(md, "kind", path) == "tr_mha_layer", "tr_mha case '", path, "': metadata kind expected tr_mha_layer, got '",
        tr_meta(md, "kind", path), "'");

  TrMhaCaseResult res;
  res.path = path;
  res.case_name = md.count("case") ? md.at("case") : path;
  res.description = md.count("description") ? md.at("description") : "";
  const TokenRoutedOptions opt = tr_mha_options_from_metadata(md, path);
  res.variant = to_string(opt.variant);
  const Index D = tr_meta_index(md, "hidden_size", path), H = tr_meta_index(md, "num_heads", path);
  const Index B = tr_meta_index(md, "batch", path), T = tr_meta_index(md, "seq_len", path);

  Rng rng(0);
  TokenRoutedAttention<S> layer(D, H, rng, opt);
  for (Param<S>* p : layer.parameters()) {
    check(st.has(p->name), "tr_mha case '", path, "': parameter '", p->name, "' is missing");
    check(st.shape(p->name) == p->shape, "tr_mha case '", path, "': parameter '", p->name, "' expected shape ",
          shape_str(p->shape), ", got ", shape_str(st.shape(p->name)));
    st.get_into<S>(p->name, p->value.data(), p->numel());
  }
  check(st.shape("in.x") == Shape{B, T, D}, "tr_mha case '", path, "': in.x expected shape ", shape_str({B, T, D}),
        ", got ", shape_str(st.shape("in.x")));
  check(st.shape("in.grad_output") == Shape{B, T, D}, "tr_mha case '", path, "': in.grad_output expected shape ",
        shape_str({B, T, D}), ", got ", shape_str(st.shape("in.grad_output")));
  Mat<S> x(B * T, D), go(B * T, D);
  st.get_into<S>("in.x", x.data(), x.size());
  st.get_into<S>("in.grad_output", go.data(), go.size());
  const Tensor<std::int64_t> ids = st.get<std::int64_t>("in.token_ids");

  typename TokenRoutedAttention<S>::Cache cache;
  const AttnInputs<S> in(B, T);
  const Mat<S> y = layer.forward(x, ids, in, cache);
  layer.zero_grad();
  const Mat<S> dx = layer.backward(go, cache);

  auto compare = [&](const std::string& name, const S* ours, Index n, bool exact) {
    check(st.has(name), "tr_mha case '", path, "': tensor '", name, "' is missing");
    check(st.numel(name) == n, "tr_mha case '", path, "': tensor '", name, "' expected ", n, " elements, got ",
          st.numel(name));
    std::vector<double> ref(static_cast<std::size_t>(n));
    st.get_into<double>(name, ref.data(), n);
    if (exact) {
      Tensor<std::int64_t> t(st.shape(name));
      for (Index i = 0; i < n; ++i) t[i] = static_cast<std::int64_t>(ours[i]);
      res.computed.put(name, t, io::DType::I64);
    } else {
      Tensor<double> t(st.shape(name));
      for (Index i = 0; i < n; ++i) t[i] = static_cast<double>(ours[i]);
      res.computed.put(name, t, io::DType::F64);
    }
    TrMhaTensorCheck c;
    c.name = name;
    for (Index i = 0; i < n; ++i) {
      const double d = std::abs(static_cast<double>(ours[i]) - ref[static_cast<std::size_t>(i)]);
      c.max_abs_error = (d > c.max_abs_error || std::isnan(d)) ? (std::isnan(d) ? INFINITY : d) : c.max_abs_error;
      c.max_abs_ref = std::max(c.max_abs_ref, std::abs(ref[static_cast<std::size_t>(i)]));
    }
    c.tolerance = exact ? 0.0 : tol * std::max(1.0, c.max_abs_ref);
    c.ok = c.max_abs_error <= c.tolerance;
    auto it = md.find("dev_pure_f64." + name);
    if (it != md.end()) c.ref_dev_pure_f64 = std::stod(it->second);
    if (!exact && c.tolerance > 0) res.worst_ratio = std::max(res.worst_ratio, c.max_abs_error / c.tolerance);
    res.ok = res.ok && c.ok;
    res.tensors.push_back(c);
  };

  compare("out.output", y.data(), y.size(), false);
  {  // route indices: exact
    Mat<S> idx = cache.route_idx.template cast<S>();
    compare("out.route_idx", idx.data(), idx.size(), true);
  }
  compare("out.route_weights", cache.route_weights.data(), cache.route_weights.size(), false);
  compare("out.verifier_gate", cache.gate.data(), cache.gate.size(), false);
  compare("out.route_probs", cache.route_probs.data(), cache.route_probs.size(), false);
  compare("out.joint_logits", cache.joint_logits.data(), cache.joint_logits.size(), false);
  if (st.has("out.plain_mha_output")) {
    typename TokenRoutedAttention<S>::Cache pc;
    const Mat<S> yp = layer.forward_plain(x, in, pc);
    compare("out.plain_mha_output", yp.data(), yp.size(), false);
  }
  compare("grad.in.x", dx.data(), dx.size(), false);
  for (Param<S>* p : layer.parameters()) compare("grad." + p->name, p->grad.data(), p->numel(), false);
  // every out.* / grad.* of the file must have been compared
  for (const std::string& n : st.names())
    if (n.rfind("out.", 0) == 0 || n.rfind("grad.", 0) == 0) {
      bool seen = false;
      for (const auto& t : res.tensors) seen = seen || t.name == n;
      check(seen, "tr_mha case '", path, "': stored tensor '", n, "' has no counterpart in this layer");
    }

  for (const auto& [key, value] : layer.telemetry().items()) {
    auto it = md.find("telemetry." + key);
    check(it != md.end(), "tr_mha case '", path, "': metadata 'telemetry.", key, "' is missing");
    TrMhaTelemetryCheck t;
    t.name = key;
    t.ours = value;
    t.stored = std::stod(it->second);
    t.error = std::abs(t.ours - t.stored);
    t.tolerance = copt.telemetry_tolerance;
    t.ok = t.error <= t.tolerance;
    res.ok = res.ok && t.ok;
    res.telemetry.push_back(t);
  }
  std::map<std::string, std::string> meta = {{"kind", "tr_mha_layer_result"}, {"case", res.case_name}};
  for (const auto& t : res.telemetry) meta["telemetry." + t.name] = ::dea::detail::concat(t.ours);
  res.computed.set_metadata(meta);
  return res;
}

}  // namespace dea::interop
