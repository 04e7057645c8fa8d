// dea/optim/schedule.hpp: the γ_mix schedule of Dual-Expert training.
//
// γ_mix weights the oracle α against the gate's α̂ in the mixing coefficient (1 = pure oracle, 0 = the gate
// alone). The reference anneals it linearly over the first N optimiser steps and then keeps it at 0:
//
//     γ(s) = max(0, 1 − s/N),   s = step − 1 the 0-based step,  N = 10000 by default
//
// so step 1 (s = 0) uses γ = 1 and γ reaches 0 at s = N. Definitions at the edges:
//   * N = 0: no annealing window, γ = 0 at every step (the gate alone from the start);
//   * N < 0 or s < 0: dea::Error naming the value.
// The value is computed in double (as the reference does in Python) and cast to the Scalar asked for.
#pragma once

#include "../core/error.hpp"

#include <algorithm>
#include <cstdint>

namespace dea {
namespace optim {

/// γ(s) = max(0, 1 − s/N) for the 0-based step s and anneal length N (see the file comment for N = 0).
template <class S = double>
S gamma_mix(std::int64_t step0, std::int64_t anneal_steps) {
  check(anneal_steps >= 0, "gamma_mix: anneal_steps must be >= 0, got ", anneal_steps);
  check(step0 >= 0, "gamma_mix: the 0-based step must be >= 0, got ", step0);
  if (anneal_steps == 0) return S(0);
  return static_cast<S>(std::max(0.0, 1.0 - static_cast<double>(step0) / static_cast<double>(anneal_steps)));
}

/// The schedule as an object: `GammaMixSchedule sched;  ctx.gamma_mix = sched.at<float>(step - 1);`
class GammaMixSchedule {
public:
  /// The reference's anneal length.
  static constexpr std::int64_t kDefaultAnnealSteps = 10000;

  explicit GammaMixSchedule(std::int64_t anneal_steps = kDefaultAnnealSteps) : anneal_steps_(anneal_steps) {
    check(anneal_steps >= 0, "GammaMixSchedule: anneal_steps must be >= 0, got ", anneal_steps);
  }

  /// γ at the 0-based step s.
  template <class S = double>
  S at(std::int64_t step0) const {
    return gamma_mix<S>(step0, anneal_steps_);
  }
  double operator()(std::int64_t step0) const { return at<double>(step0); }

  /// γ for the 1-based optimiser step (the reference's `step`; s = step − 1).
  template <class S = double>
  S at_step(std::int64_t step1) const {
    check(step1 >= 1, "GammaMixSchedule::at_step: the 1-based step must be >= 1, got ", step1);
    return gamma_mix<S>(step1 - 1, anneal_steps_);
  }

  std::int64_t anneal_steps() const { return anneal_steps_; }

private:
  std::int64_t anneal_steps_;
};

}  // namespace optim
}  // namespace dea
