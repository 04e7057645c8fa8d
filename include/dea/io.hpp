// dea/io.hpp: file formats: safetensors checkpoints, JSONL, SVG plots, and the reference's golden case runner.
// Needs nlohmann_json (Debian: nlohmann-json3-dev) besides Eigen.
#pragma once

#include "dea.hpp"
#include "io/dea_case.hpp"
#include "io/jsonl.hpp"
#include "io/model_case.hpp"
#include "io/plots.hpp"
#include "io/tr_mha_case.hpp"
#include "io/safetensors.hpp"
#include "io/svg.hpp"
