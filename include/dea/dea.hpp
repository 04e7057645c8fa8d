// dea/dea.hpp: the umbrella header. It needs Eigen alone (OpenMP optional).
//
// File formats, plots and golden cases are in dea/io.hpp (also needs nlohmann_json); training runs in
// dea/train.hpp (also needs fmt).
// It includes every class that needs Eigen alone: the attention classes, the encoder and the decoder LM, the
// optimiser, the data, tokenizers, the oracle's alpha tools and calibration, metrics and the gradient checkers.
// Embedded users may include single headers from core/, ops/, attention/, nn/ and optim/ instead.
#pragma once

#include "core/allocator.hpp"
#include "core/bf16.hpp"
#include "core/config.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "core/init.hpp"
#include "core/parallel.hpp"
#include "core/param.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "core/utf8.hpp"
#include "core/workspace.hpp"

#include "ops/activations.hpp"
#include "ops/attention_core.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/dropout.hpp"
#include "ops/gelu.hpp"
#include "ops/gemm.hpp"
#include "ops/l1_distance.hpp"
#include "ops/layer_norm.hpp"
#include "ops/linear.hpp"
#include "ops/mse.hpp"
#include "ops/packed_bf16.hpp"
#include "ops/packed_gemm.hpp"
#include "ops/rms_norm.hpp"
#include "ops/rope.hpp"
#include "ops/softmax.hpp"
#include "ops/swiglu.hpp"

#include "attention/dot_product.hpp"
#include "attention/dual_expert.hpp"
#include "attention/gate_loss.hpp"
#include "attention/gate_stats.hpp"
#include "attention/inputs.hpp"
#include "attention/laplacian.hpp"
#include "attention/token_routed.hpp"

#include "nn/dropout.hpp"
#include "nn/embedding.hpp"
#include "nn/encoder_layer.hpp"
#include "nn/feed_forward.hpp"
#include "nn/inference.hpp"
#include "nn/layer_norm.hpp"
#include "nn/linear.hpp"
#include "nn/positional.hpp"
#include "nn/transformer.hpp"

#include "lm/causal_attention.hpp"
#include "lm/config.hpp"
#include "lm/dense_mlp.hpp"
#include "lm/loss.hpp"
#include "lm/model.hpp"
#include "lm/route_table.hpp"
#include "lm/tr_moe.hpp"

#include "optim/adamw.hpp"
#include "optim/schedule.hpp"

#include "data/collate.hpp"
#include "data/dalpha.hpp"
#include "data/loaders.hpp"
#include "data/mlm.hpp"

#include "text/byte_tokenizer.hpp"
#include "text/run_tokenizer.hpp"
#include "text/simple_tokenizer.hpp"
#include "text/vocab.hpp"
#include "text/wordpiece.hpp"

#include "oracle/alpha.hpp"
#include "oracle/isotonic.hpp"

#include "eval/metrics.hpp"
#include "eval/stats.hpp"

#include "testing/check_layer.hpp"
#include "testing/gradcheck.hpp"
