// dea/testing/gradcheck.hpp: a finite-difference gradient checker for dea layers and for your own.
//
// The checker compares hand-derived gradients with central differences of a scalar objective, tensor by
// tensor. Use it in double with a random projection objective L = <y, R> (a fixed random R, never sum(y):
// a sum hides errors that add up to zero across a softmax row).
//
//   dea::testing::GradCheck gc;                       // step 1e-6, tolerance 1e-6
//   gc.add(layer.parameters());                        // every parameter ...
//   gc.add("x", x.data(), dx.data(), x.size());        // ... and every input (dx filled by `analytic`)
//   auto report = gc.run(objective, analytic);
//   REQUIRE(report.ok);   // report.str() lists every tensor's error
//
// `objective()` runs the forward pass on the current values and returns L. `analytic()` zeroes the
// gradients, runs forward and backward with dL/dy = R and leaves dL/d(value) in every registered gradient
// buffer. The checker calls `analytic` once, then perturbs each element by +-step and calls `objective`.
#pragma once

#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace dea {
namespace testing {

/// The error found on one tensor.
struct TensorError {
  std::string name;
  Index size = 0;
  double max_abs_error = 0;   ///< max_i |analytic_i - numeric_i|
  double max_abs_grad = 0;    ///< max_i max(|analytic_i|, |numeric_i|)
  double rel_error = 0;       ///< max_abs_error / max(max_abs_grad, floor)
  Index worst_index = -1;     ///< element with the largest error
  bool ok = false;
};

struct GradCheckReport {
  std::vector<TensorError> tensors;
  bool ok = true;
  double worst_rel_error = 0;

  /// One line per tensor: name, size, relative error, largest gradient, verdict.
  std::string str() const {
    std::ostringstream os;
    os.precision(3);
    for (const auto& t : tensors)
      os << (t.ok ? "  ok   " : "  FAIL ") << t.name << " [" << t.size << "] rel " << std::scientific << t.rel_error
         << " abs " << t.max_abs_error << " max|g| " << t.max_abs_grad << " worst@" << t.worst_index << "\n";
    return os.str();
  }
};

/// Random projection tensor R with entries N(0, 1) from a fixed seed.
inline Mat<double> random_projection(Index rows, Index cols, std::uint64_t seed = 1234) {
  Rng rng(seed);
  Mat<double> r(rows, cols);
  for (Index i = 0; i < r.size(); ++i) r.data()[i] = rng.normal();
  return r;
}

class GradCheck {
public:
  struct Options {
    double step = 1e-6;       ///< central-difference step h
    double tolerance = 1e-6;  ///< largest accepted relative error per tensor
    double floor = 1e-10;     ///< denominators below this count as this (tensors whose gradient is ~0)
  };

  GradCheck() = default;
  explicit GradCheck(Options o) : opt_(o) {}

  /// Registers a tensor: `value` is perturbed; `grad` must hold dL/dvalue after `analytic()`.
  void add(std::string name, double* value, const double* grad, Index n) {
    check(value != nullptr && grad != nullptr && n >= 0, "GradCheck::add: '", name, "' needs value and grad buffers");
    items_.push_back({std::move(name), value, grad, n});
  }

  /// Registers every parameter of a list.
  void add(const ParamList<double>& params) {
    for (Param<double>* p : params) add(p->name, p->value.data(), p->grad.data(), p->numel());
  }

  /// Registers parameters of a list, except those whose name contains any of `skip`.
  void add_except(const ParamList<double>& params, const std::vector<std::string>& skip) {
    for (Param<double>* p : params) {
      bool drop = false;
      for (const auto& s : skip) drop = drop || p->name.find(s) != std::string::npos;
      if (!drop) add(p->name, p->value.data(), p->grad.data(), p->numel());
    }
  }

  GradCheckReport run(const std::function<double()>& objective, const std::function<void()>& analytic) const {
    analytic();
    std::vector<std::vector<double>> ana(items_.size());
    for (std::size_t k = 0; k < items_.size(); ++k) ana[k].assign(items_[k].grad, items_[k].grad + items_[k].n);

    GradCheckReport rep;
    for (std::size_t k = 0; k < items_.size(); ++k) {
      const Item& it = items_[k];
      TensorError te;
      te.name = it.name;
      te.size = it.n;
      for (Index i = 0; i < it.n; ++i) {
        const double v0 = it.value[i];
        it.value[i] = v0 + opt_.step;
        const double lp = objective();
        it.value[i] = v0 - opt_.step;
        const double lm = objective();
        it.value[i] = v0;
        const double num = (lp - lm) / (2 * opt_.step);
        const double a = ana[k][static_cast<std::size_t>(i)];
        const double err = std::abs(a - num);
        if (!(err <= te.max_abs_error)) {  // also catches NaN
          te.max_abs_error = std::isnan(err) ? INFINITY : err;
          te.worst_index = i;
        }
        te.max_abs_grad = std::max({te.max_abs_grad, std::abs(a), std::abs(num)});
      }
      te.rel_error = te.max_abs_error / std::max(te.max_abs_grad, opt_.floor);
      te.ok = te.rel_error <= opt_.tolerance;
      rep.ok = rep.ok && te.ok;
      rep.worst_rel_error = std::max(rep.worst_rel_error, te.rel_error);
      rep.tensors.push_back(te);
    }
    objective();  // leave the module in the state of the unperturbed values
    return rep;
  }

private:
  struct Item {
    std::string name;
    double* value;
    const double* grad;
    Index n;
  };
  Options opt_;
  std::vector<Item> items_;
};

}  // namespace testing
}  // namespace dea
