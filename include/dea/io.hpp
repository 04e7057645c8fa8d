// dea/io.hpp: file formats (safetensors checkpoints, JSONL alpha caches, JSON read within limits), SVG plots
// (dea/plot/) and the reference's golden-case runners (dea/interop/). Needs nlohmann_json besides Eigen.
#pragma once

#include "dea.hpp"
#include "interop/dea_case.hpp"
#include "interop/model_case.hpp"
#include "interop/tr_mha_case.hpp"
#include "io/json_limits.hpp"
#include "io/jsonl.hpp"
#include "io/safetensors.hpp"
#include "plot/figures.hpp"
#include "plot/svg.hpp"
