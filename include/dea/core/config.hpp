// dea/core/config.hpp: compile-time configuration shared by every header.
#pragma once

#if defined(__FAST_MATH__)
#error "dea must not be built with -ffast-math / -Ofast: masked softmax relies on -inf and NaN checks on IEEE semantics"
#endif

#include <Eigen/Core>
#include <cstdint>

namespace dea {

/// Index type used for every size and offset (Eigen's signed index).
using Index = Eigen::Index;

/// Size tag meaning "given at run time", as in Eigen's own Matrix.
constexpr int Dynamic = Eigen::Dynamic;

}  // namespace dea
