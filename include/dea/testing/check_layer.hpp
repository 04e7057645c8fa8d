// dea/testing/check_layer.hpp: one call that checks a layer's backward contract, for dea's layers and for yours.
//
// check_layer runs, in double, the checks a hand-written backward must pass:
//   1. gradients accumulate: with every parameter gradient prefilled with random values P, backward leaves
//      P + g, where g is what it leaves from zero (it adds, it does not overwrite);
//   2. every parameter and every input: the backward's gradient of the random projection objective
//      L = <y, R> (R fixed, entries N(0, 1)) against central differences (L(v + h) - L(v - h)) / 2h;
//   3. the relative error of each tensor, max |analytic - numeric| / max(|analytic|, |numeric|), is at most
//      `tolerance` (1e-6 by default), and so is that of the accumulation check.
// It returns a report (every tensor's error, the worst one and where it is) and throws nothing on a failed
// check, so it serves Catch2 (`INFO(rep.str()); REQUIRE(rep.ok);`) and plain code alike.
//
// Two forms:
//   * a layer object with `ParamList<double> parameters()`, `Mat<double> forward(const Mat<double>& x)` and
//     `Mat<double> backward(const Mat<double>& dy)` (which returns dL/dx and adds into the parameter gradients,
//     from the cache of the last forward), checked on a random input of a given shape:
//
//       dea::testing::CheckLayerReport rep = dea::testing::check_layer(model, rows, cols);
//
//   * any layer through two functions, with the parameters to check and named inputs:
//
//       Mat<double> x = dea::testing::random_projection(N, D, 5);
//       LayerNorm<double>::Cache c;
//       auto rep = dea::testing::check_layer(
//           ln.parameters(), {{"x", &x}},
//           [&] { Mat<double> y; ln.forward(x, y, c); return y; },                    // y from current values
//           [&](const Mat<double>& dy) { Mat<double> dx; ln.backward(dy, x, c, dx); return InputGrads{dx}; });
//
//     `forward()` computes y from the current values of the parameters and inputs (the checker perturbs them in
//     place); it must be deterministic (reseed any dropout Rng inside it). `backward(dy)` is called right after a
//     forward and returns dL/d(input) for every input, in order, each of its input's shape.
//
// What the forward treats as a constant must stay constant under perturbation: the Dual-Expert task path reads α̂
// as a constant, so check it with α̂ frozen (AttnInputs::set_frozen_alpha_hat) or with an oracle that labels every
// cell at γ_mix = 1, where the output does not depend on α̂.
#pragma once

#include "../core/error.hpp"
#include "gradcheck.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace dea {
namespace testing {

struct CheckLayerOptions {
  double step = 1e-6;         ///< central-difference step h
  double tolerance = 1e-6;    ///< largest accepted relative error, per tensor and for the accumulation check
  double floor = 1e-10;       ///< denominators below this count as this (tensors whose gradient is ~0)
  std::uint64_t seed = 1234;  ///< seeds R, the prefilled gradients and (layer form) the random input
};

/// One input of the layer: its name in the report and the matrix the checker perturbs.
struct LayerInput {
  std::string name;
  Mat<double>* value;
};

/// The input gradients a backward returns, one per input, in the order of the inputs.
using InputGrads = std::vector<Mat<double>>;

struct CheckLayerReport {
  bool ok = false;
  GradCheckReport gradients;       ///< every parameter and every input: analytic against central differences
  bool accumulates = false;        ///< backward added into the prefilled parameter gradients
  double accumulation_error = 0;   ///< max over parameters of max |h - P - g| / max(|g|, |P|)
  std::string accumulation_worst;  ///< the parameter with that error
  double worst_rel_error = 0;      ///< the largest relative error of all checks
  std::string worst_tensor;        ///< where it is: a parameter or input name, or "accumulation of <parameter>"
  Index worst_index = -1;          ///< its element (-1 for the accumulation check)

  /// A summary line, then one line per tensor (see GradCheckReport::str).
  std::string str() const {
    std::ostringstream os;
    os.precision(3);
    os << (ok ? "check_layer: ok" : "check_layer: FAILED") << ", worst relative error " << std::scientific
       << worst_rel_error << " at " << worst_tensor;
    if (worst_index >= 0) os << "[" << worst_index << "]";
    os << "\n"
       << (accumulates ? "  ok   " : "  FAIL ") << "gradients accumulate (rel " << accumulation_error
       << (accumulation_worst.empty() ? std::string() : " at " + accumulation_worst) << ")\n"
       << gradients.str();
    return os.str();
  }
};

namespace detail {

inline double dot(const Mat<double>& a, const Mat<double>& b) { return a.cwiseProduct(b).sum(); }

template <class M>
void fill_normal(M& m, Rng& rng) {
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = rng.normal();
}

}  // namespace detail

/// Checks `backward` against `forward` on every parameter of `params` and every input of `inputs` (see the file
/// comment). Throws dea::Error only for a misuse: a backward that returns the wrong number or shapes of gradients.
template <class Forward, class Backward>
CheckLayerReport check_layer(const ParamList<double>& params, const std::vector<LayerInput>& inputs,
                             Forward&& forward, Backward&& backward, const CheckLayerOptions& opt = {}) {
  for (const LayerInput& in : inputs)
    check(in.value != nullptr, "check_layer: input '", in.name, "' has no matrix");
  const Mat<double> y0 = forward();
  const Mat<double> R = random_projection(y0.rows(), y0.cols(), opt.seed);

  // forward then backward from dL/dy = R, the input gradients checked for number and shape
  auto run_backward = [&]() -> InputGrads {
    const Mat<double> y = forward();
    check(y.rows() == R.rows() && y.cols() == R.cols(), "check_layer: forward returned [", y.rows(), ", ", y.cols(),
          "], expected the first call's [", R.rows(), ", ", R.cols(), "]");
    InputGrads g = backward(R);
    check(g.size() == inputs.size(), "check_layer: backward returned ", g.size(), " input gradients, expected ",
          inputs.size());
    for (std::size_t k = 0; k < g.size(); ++k)
      check(g[k].rows() == inputs[k].value->rows() && g[k].cols() == inputs[k].value->cols(), "check_layer: d",
            inputs[k].name, ": expected [", inputs[k].value->rows(), ", ", inputs[k].value->cols(), "], got [",
            g[k].rows(), ", ", g[k].cols(), "]");
    return g;
  };

  CheckLayerReport rep;

  // 1. Accumulation: g from zeroed gradients, then h from gradients prefilled with P; h must be P + g.
  zero_grad(params);
  run_backward();
  std::vector<Vec<double>> g;
  for (const Param<double>* p : params) g.push_back(p->grad);
  Rng rng(opt.seed + 1);
  std::vector<Vec<double>> prefill;
  for (Param<double>* p : params) {
    Vec<double> P(p->grad.size());
    detail::fill_normal(P, rng);
    p->grad = P;
    prefill.push_back(std::move(P));
  }
  run_backward();
  rep.accumulates = true;
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (g[k].size() == 0) continue;
    const Vec<double>& h = params[k]->grad;
    const double scale = std::max({g[k].cwiseAbs().maxCoeff(), prefill[k].cwiseAbs().maxCoeff(), opt.floor});
    double err = (h - prefill[k] - g[k]).cwiseAbs().maxCoeff() / scale;
    if (std::isnan(err)) err = INFINITY;
    if (err > rep.accumulation_error) {
      rep.accumulation_error = err;
      rep.accumulation_worst = params[k]->name;
    }
  }
  rep.accumulates = rep.accumulation_error <= opt.tolerance;

  // 2. Every parameter and every input against central differences of L = <y, R>.
  std::vector<Mat<double>> dinputs;
  for (const LayerInput& in : inputs) dinputs.push_back(Mat<double>::Zero(in.value->rows(), in.value->cols()));
  GradCheck gc(GradCheck::Options{opt.step, opt.tolerance, opt.floor});
  gc.add(params);
  for (std::size_t k = 0; k < inputs.size(); ++k)
    gc.add(inputs[k].name, inputs[k].value->data(), dinputs[k].data(), inputs[k].value->size());
  rep.gradients = gc.run([&] { return detail::dot(forward(), R); },
                         [&] {
                           zero_grad(params);
                           const InputGrads d = run_backward();
                           // copied element by element: the registered buffers must stay where they are
                           for (std::size_t k = 0; k < d.size(); ++k)
                             std::copy(d[k].data(), d[k].data() + d[k].size(), dinputs[k].data());
                         });

  // 3. The verdict and the worst error.
  rep.worst_rel_error = -1;
  for (const TensorError& t : rep.gradients.tensors)
    if (!(t.rel_error <= rep.worst_rel_error)) {
      rep.worst_rel_error = t.rel_error;
      rep.worst_tensor = t.name;
      rep.worst_index = t.worst_index;
    }
  if (rep.accumulation_error > rep.worst_rel_error) {
    rep.worst_rel_error = rep.accumulation_error;
    rep.worst_tensor = "accumulation of " + rep.accumulation_worst;
    rep.worst_index = -1;
  }
  rep.ok = rep.accumulates && rep.gradients.ok;
  return rep;
}

/// Checks a layer object (parameters(), forward(x) -> y, backward(dy) -> dx) on an input of `rows` x `cols`
/// entries N(0, 1) drawn from opt.seed + 2, with every parameter the layer lists.
template <class Layer>
CheckLayerReport check_layer(Layer& layer, Index rows, Index cols, const CheckLayerOptions& opt = {}) {
  check(rows > 0 && cols > 0, "check_layer: the input shape must be positive, got [", rows, ", ", cols, "]");
  Mat<double> x(rows, cols);
  Rng rng(opt.seed + 2);
  detail::fill_normal(x, rng);
  return check_layer(
      layer.parameters(), {{"x", &x}}, [&] { return Mat<double>(layer.forward(x)); },
      [&](const Mat<double>& dy) { return InputGrads{Mat<double>(layer.backward(dy))}; }, opt);
}

}  // namespace testing
}  // namespace dea
