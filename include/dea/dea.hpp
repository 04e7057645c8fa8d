// dea/dea.hpp: the umbrella header. It needs Eigen alone (OpenMP optional).
//
// File formats, plots and golden cases are in dea/io.hpp (also needs nlohmann_json); training runs in
// dea/train.hpp (also needs fmt).
// Embedded users may include single headers from core/, ops/, attention/, nn/ and optim/ instead.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/param.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "core/workspace.hpp"
#include "core/allocator.hpp"
#include "core/files.hpp"
#include "core/utf8.hpp"

#include "ops/gemm.hpp"
#include "ops/linear.hpp"
#include "ops/softmax.hpp"

#include "attention/inputs.hpp"
#include "attention/dual_expert.hpp"
#include "attention/gate_loss.hpp"
#include "attention/token_routed.hpp"

#include "nn/inference.hpp"
#include "nn/transformer.hpp"

#include "optim/adamw.hpp"
#include "optim/schedule.hpp"

#include "data/collate.hpp"
#include "data/dalpha.hpp"
#include "data/loaders.hpp"
#include "data/mlm.hpp"
#include "oracle/alpha.hpp"
#include "text/simple_tokenizer.hpp"

#include "eval/metrics.hpp"
#include "eval/stats.hpp"

#include "testing/gradcheck.hpp"
