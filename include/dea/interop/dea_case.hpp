// dea/interop/dea_case.hpp: runs a reference case file (tests/data/golden/README.md) through the library and compares
// results.
//
// A `kind = dea_layer` case holds the inputs (`in.*`), the parameters under their state_dict names, and the
// reference's forward values (`out.*`) and gradients (`grad.*`) of L = sum(out.output * in.grad_output) +
// loss_gate. run_dea_layer_case() rebuilds the layer from the metadata, loads the parameters, runs forward on
// the training graph with dropout 0 and both backward passes, and returns every `out.*` and `grad.*` tensor it
// computed. compare_case() lists, per expected tensor, max |got - expected| / max(max |expected|, 1e-12).
#pragma once

#include "../attention/dual_expert.hpp"
#include "../io/safetensors.hpp"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace dea::interop {

using io::SafeTensors;
using io::DType;
using io::dtype_is_floating;
using io::load_parameters;

namespace detail {

inline long long metadata_int(const SafeTensors& st, const std::string& key) {
  const auto& md = st.metadata();
  const auto it = md.find(key);
  check(it != md.end(), st.source(), ": metadata '", key, "' is missing");
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  check(end && *end == '\0' && !it->second.empty(), st.source(), ": metadata '", key, "' is not an integer: '",
        it->second, "'");
  return v;
}

inline double metadata_double(const SafeTensors& st, const std::string& key, double fallback) {
  const auto& md = st.metadata();
  const auto it = md.find(key);
  if (it == md.end()) return fallback;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  check(end && *end == '\0' && !it->second.empty(), st.source(), ": metadata '", key, "' is not a number: '",
        it->second, "'");
  return v;
}

template <class S, class Alloc>
Tensor<S> flat_tensor(const std::vector<S, Alloc>& v, const Shape& shape) {
  Tensor<S> t(shape);
  check(t.numel() == static_cast<Index>(v.size()), "internal: buffer of ", v.size(), " for shape ", shape_str(shape));
  for (Index k = 0; k < t.numel(); ++k) t[k] = v[static_cast<std::size_t>(k)];
  return t;
}

template <class S>
Tensor<S> matrix_tensor(const Mat<S>& m, const Shape& shape) {
  Tensor<S> t(shape);
  check(t.numel() == m.size(), "internal: matrix of ", m.size(), " for shape ", shape_str(shape));
  t.data = Eigen::Map<const Vec<S>>(m.data(), m.size());
  return t;
}

/// A case's parameters must be finite (a NaN weight makes every output NaN: a bad file, not a mismatch).
template <class S>
void check_finite_parameters(const ParamList<S>& params, const std::string& source) {
  for (const auto* p : params)
    for (Index k = 0; k < p->numel(); ++k)
      check(std::isfinite(p->value[k]), source, ": parameter '", p->name, "' has a non-finite value at flat index ",
            k);
}

}  // namespace detail

/// Runs a `kind = dea_layer` case in precision S; returns the computed `out.*` and `grad.*` tensors (stored as
/// F64 whatever S is, so they compare directly with the reference's).
template <class S>
SafeTensors run_dea_layer_case(const SafeTensors& cs) {
  const auto& md = cs.metadata();
  const auto kind = md.find("kind");
  check(kind != md.end() && kind->second == "dea_layer", cs.source(), ": expected metadata kind = dea_layer");
  const Index D = detail::metadata_int(cs, "d_model"), H = detail::metadata_int(cs, "n_heads");
  const double gamma = detail::metadata_double(cs, "gamma_mix", 0.0);

  const Tensor<S> x = cs.get<S>("in.x");
  check(x.dim() == 3 && x.size(2) == D, cs.source(), ": in.x: expected shape [B, T, ", D, "], got ",
        shape_str(x.shape));
  const Index B = x.size(0), T = x.size(1);
  const Tensor<S> gy = cs.get<S>("in.grad_output");
  check_shape(gy, x.shape, "in.grad_output");

  Rng rng(0);
  typename DualExpertAttention<S>::Options opt;
  opt.out_proj = cs.has("W_o.weight");
  opt.bias = cs.has("W_q.bias");
  DualExpertAttention<S> layer(D, H, rng, opt);
  load_parameters(layer.parameters(), cs, true, {"in.", "out.", "grad."});
  detail::check_finite_parameters(layer.parameters(), cs.source());

  AttnInputs<S> in(B, T);
  if (cs.has("in.key_mask")) in.set_key_mask(cs.get<std::uint8_t>("in.key_mask"));
  if (cs.has("in.alpha_oracle")) in.set_oracle(cs.get<S>("in.alpha_oracle")).set_gamma_mix(S(gamma));
  if (cs.has("in.target_idx")) in.set_targets(cs.get<std::int64_t>("in.target_idx"));

  const Mat<S> xm = x.matrix(D);
  typename DualExpertAttention<S>::Cache cache;
  layer.zero_grad();
  const Mat<S> y = layer.forward(xm, in, cache);
  // L = sum(y * grad_output) + loss_gate: dL/dy = grad_output, dL/d loss_gate = 1
  const Mat<S> dx = layer.backward(gy.matrix(D), cache);
  layer.backward_gate(cache, S(1));

  SafeTensors out;
  auto put = [&](const std::string& name, const Tensor<S>& t) {
    Tensor<double> d(t.shape);
    for (Index k = 0; k < t.numel(); ++k) d[k] = static_cast<double>(t[k]);
    out.put(name, d, DType::F64);
  };
  const Shape cells{B, H, T, T};
  put("out.output", detail::matrix_tensor(y, {B, T, D}));
  put("out.alpha_hat", detail::flat_tensor(cache.alpha_hat, cells));
  put("out.E0_norm", detail::flat_tensor(cache.e0n, cells));
  put("out.E1_norm", detail::flat_tensor(cache.e1n, cells));
  put("out.attn", detail::flat_tensor(cache.attn, cells));
  if (cache.has_oracle) put("out.S_mix", detail::flat_tensor(cache.scores, cells));
  Tensor<S> lg(Shape{});
  lg[0] = cache.loss_gate;
  put("out.loss_gate", lg);
  for (Param<S>* p : layer.parameters()) {
    Tensor<S> g(p->shape);
    g.data = p->grad;
    put("grad." + p->name, g);
  }
  put("grad.in.x", detail::matrix_tensor(dx, {B, T, D}));
  if (cache.has_oracle) {
    out.set_metadata("stats.loss_reg", ::dea::detail::concat(cache.stats.loss_reg));
    out.set_metadata("stats.loss_spot", ::dea::detail::concat(cache.stats.loss_spot));
    out.set_metadata("stats.loss_decision", ::dea::detail::concat(cache.stats.loss_decision));
    out.set_metadata("stats.decision_side_acc", ::dea::detail::concat(cache.stats.decision_side_acc));
    out.set_metadata("stats.n_decision_pairs", ::dea::detail::concat(cache.stats.n_decision_pairs));
  }
  out.set_metadata("kind", "dea_layer_result");
  return out;
}

/// One compared tensor.
struct TensorComparison {
  std::string name;
  double rel_error = 0;     ///< max |got - expected| / max(max |expected|, 1e-12); for integers, the max |diff|
  double max_expected = 0;  ///< max |expected|
  bool integer = false;
  bool missing = false;     ///< the run produced no tensor of that name
  bool ok = false;
};

/// Compares every `out.*` and `grad.*` tensor of `expected` with `got`. Floating tensors pass at
/// rel_error <= tol; integer tensors must match exactly. NaN in the same places counts as equal.
inline std::vector<TensorComparison> compare_case(const SafeTensors& expected, const SafeTensors& got, double tol) {
  std::vector<TensorComparison> out;
  for (const std::string& name : expected.names()) {
    if (name.rfind("out.", 0) != 0 && name.rfind("grad.", 0) != 0) continue;
    TensorComparison c;
    c.name = name;
    c.integer = !dtype_is_floating(expected.dtype(name));
    if (!got.has(name)) {
      c.missing = true;
      out.push_back(c);
      continue;
    }
    check(got.shape(name) == expected.shape(name), "compare_case: ", name, ": expected shape ",
          shape_str(expected.shape(name)), ", got ", shape_str(got.shape(name)));
    const Tensor<double> e = expected.get<double>(name), g = got.get<double>(name);
    double num = 0, mx = 0;
    bool nan_mismatch = false;
    for (Index k = 0; k < e.numel(); ++k) {
      const bool en = std::isnan(e[k]), gn = std::isnan(g[k]);
      if (en || gn) {
        nan_mismatch = nan_mismatch || en != gn;
        continue;
      }
      num = std::max(num, std::abs(g[k] - e[k]));
      mx = std::max(mx, std::abs(e[k]));
    }
    c.max_expected = mx;
    c.rel_error = c.integer ? num : num / std::max(mx, 1e-12);
    if (nan_mismatch) c.rel_error = INFINITY;
    c.ok = c.integer ? c.rel_error == 0 : c.rel_error <= tol;
    out.push_back(c);
  }
  return out;
}

}  // namespace dea::interop
