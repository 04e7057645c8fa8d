// dea/dea.hpp: the umbrella header. Embedded users may include only core/, ops/, attention/, nn/ and optim/
// headers, which need Eigen alone.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/param.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"
