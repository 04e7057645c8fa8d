// dea/train.hpp: training runs: the run configuration and its flags (train/config.hpp, on the flag table of
// cli/flags.hpp), the run directory and checkpoints (train/run_dir.hpp), the generic training loop
// (train/trainer.hpp) and the Dual-Expert encoder's data, evaluation and run (train/encoder.hpp). Needs fmt and
// nlohmann_json besides Eigen. DualExpertBert's fine-tuning (train/dea_bert.hpp) is included on its own (it brings
// in the BERT headers).
#pragma once

#include "cli/flags.hpp"
#include "dea.hpp"
#include "interop/dea_case.hpp"
#include "interop/model_case.hpp"
#include "interop/tr_mha_case.hpp"
#include "io.hpp"
#include "plot/figures.hpp"
#include "plot/svg.hpp"
#include "train/config.hpp"
#include "train/encoder.hpp"
#include "train/run_dir.hpp"
#include "train/seeds.hpp"
#include "train/trainer.hpp"
