// dea/io.hpp: file formats: safetensors checkpoints (a validated reader, an atomic writer), JSON lines, JSON read
// within limits. Needs nlohmann_json besides Eigen. The oracle's files are in dea/oracle/files.hpp, SVG plots in
// dea/plot/, the golden-case runners in dea/interop/.
#pragma once

#include "io/json_limits.hpp"
#include "io/jsonl.hpp"
#include "io/safetensors.hpp"
