// dea/core/param.hpp: a named trainable parameter and lists of them.
//
// A parameter carries the reference's state_dict name ("W_q.weight", "layers.3.attn.W_rel"), the optimiser
// group it belongs to ("main" or "gate"), its shape, its value and its gradient (flat, row-major).
#pragma once

#include "tensor.hpp"

#include <string>
#include <vector>

namespace dea {

template <class S>
struct Param {
  std::string name;
  std::string group = "main";
  Shape shape;
  Vec<S> value;
  Vec<S> grad;

  Param() = default;
  Param(std::string n, std::string g, Shape s) : name(std::move(n)), group(std::move(g)), shape(std::move(s)) {
    value = Vec<S>::Zero(shape_numel(shape));
    grad = Vec<S>::Zero(value.size());
  }

  Index numel() const { return value.size(); }
  /// Rows = first axis, columns = product of the others (a [out, in] Linear weight is out x in).
  Index rows() const { return shape.empty() ? 1 : shape[0]; }
  Index cols() const { return rows() == 0 ? 0 : numel() / rows(); }
  MatMap<S> mat() { return {value.data(), rows(), cols()}; }
  ConstMatMap<S> mat() const { return {value.data(), rows(), cols()}; }
  MatMap<S> grad_mat() { return {grad.data(), rows(), cols()}; }
  ConstMatMap<S> grad_mat() const { return {grad.data(), rows(), cols()}; }
  void zero_grad() { grad.setZero(); }
};

/// Non-owning list of a module's parameters, in a fixed order.
template <class S>
using ParamList = std::vector<Param<S>*>;

/// Finds a parameter by name; throws dea::Error naming it when absent.
template <class S>
Param<S>& find_param(const ParamList<S>& list, const std::string& name) {
  for (Param<S>* p : list)
    if (p->name == name) return *p;
  detail::raise("no parameter named '" + name + "'");
}

/// Prefixes every name of `list` with `prefix` (for nesting: "layers.0.attn." + "W_rel").
template <class S>
void prefix_names(const ParamList<S>& list, const std::string& prefix) {
  for (Param<S>* p : list) p->name = prefix + p->name;
}

template <class S>
void zero_grad(const ParamList<S>& list) {
  for (Param<S>* p : list) p->zero_grad();
}

/// Total number of scalar parameters.
template <class S>
Index count_parameters(const ParamList<S>& list) {
  Index n = 0;
  for (const Param<S>* p : list) n += p->numel();
  return n;
}

}  // namespace dea
