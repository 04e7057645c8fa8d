// Fuzz target: loading a training checkpoint (dea/train/run_dir.hpp, load_checkpoint) into a tiny model and its
// AdamW optimiser. Properties: an accepted checkpoint leaves only finite parameters; a refused one (dea::Error)
// leaves the model's parameters exactly as they were (loading is all or nothing).
//
// With DEA_FUZZ_WRITE_SEED=<dir> in the environment the target writes the tiny model's real checkpoint to
// <dir>/checkpoint.safetensors (how the seed corpus was made) and exits.
#include "fuzz_util.hpp"

#include <dea/train.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace {

using namespace dea::train;
using namespace dea::train::encoder;
using Scalar = float;
using Model = dea::nn::TransformerModel<Scalar>;

TrainConfig tiny_config() {
  TrainConfig c;
  c.d_model = 4;
  c.n_heads = 2;
  c.n_layers = 1;
  c.d_ff = 4;
  c.max_len = 6;
  c.seed = 7;
  return c;
}

struct Tiny {
  TrainConfig cfg = tiny_config();
  dea::Rng rng{7};
  Model model{model_config(cfg, 7, dea::nn::Task::cls), rng};
  dea::optim::AdamW<Scalar> opt = make_optimizer(model, cfg);
};

std::vector<std::vector<float>> snapshot(Model& m) {
  std::vector<std::vector<float>> out;
  for (auto* p : m.parameters()) out.emplace_back(p->value.data(), p->value.data() + p->value.size());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("DEA_FUZZ_WRITE_SEED")) {
    Tiny t;
    dea::data::SimpleTokenizer tok;
    save_checkpoint(dir, t.cfg, tok, t.model, &t.opt, 3);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Tiny t;
  const std::string& dir = dea_fuzz::temp_path("checkpoint_dir");
  std::filesystem::create_directories(dir);
  const std::string file = checkpoint_path(dir);
  {
    std::FILE* f = std::fopen(file.c_str(), "wb");
    if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) std::abort();
  }
  const auto before = snapshot(t.model);
  try {
    (void)load_checkpoint(dir, t.model, &t.opt, t.cfg.seed);
    for (auto* prm : t.model.parameters())
      for (dea::Index i = 0; i < prm->value.size(); ++i)
        dea_fuzz::fuzz_require(std::isfinite(prm->value[i]), "loaded parameters are finite");
  } catch (const dea::Error&) {
    dea_fuzz::fuzz_require(snapshot(t.model) == before, "a refused checkpoint leaves the model unchanged");
  }
  return 0;
}
