// Fuzz target: loading a training checkpoint (dea::train::load_checkpoint) into a tiny encoder and its AdamW
// optimiser. It uses the checkpoint functions that take any model, so no run configuration is involved. Properties:
// an accepted checkpoint leaves only finite parameters; a refused one (dea::Error) leaves the model's parameters
// exactly as they were (loading is all or nothing).
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

using Scalar = float;
using Model = dea::nn::TransformerModel<Scalar>;

// The smallest encoder with every kind of parameter (one layer, two heads), over a vocabulary of 7 tokens.
dea::nn::ModelConfig tiny_config() {
  dea::nn::ModelConfig c;
  c.vocab_size = 7;
  c.d_model = 4;
  c.n_heads = 2;
  c.n_layers = 1;
  c.d_ff = 4;
  c.max_len = 6;
  return c;
}

constexpr std::uint64_t kSeed = 7;

// The model and the reference's optimiser (groups "main" and "gate"): what a checkpoint holds.
struct Tiny {
  dea::Rng rng{kSeed};
  Model model{tiny_config(), rng};
  dea::optim::AdamW<Scalar> opt = dea::optim::build_optimizer(model.parameters());
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
    dea::train::save_checkpoint(dir, t.model, &t.opt, 3, kSeed);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Tiny t;
  const std::string& dir = dea_fuzz::temp_path("checkpoint_dir");
  std::filesystem::create_directories(dir);
  const std::string file = dea::train::checkpoint_path(dir);
  {
    std::FILE* f = std::fopen(file.c_str(), "wb");
    if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) std::abort();
  }
  const auto before = snapshot(t.model);
  try {
    (void)dea::train::load_checkpoint(dir, t.model, &t.opt, kSeed);
    for (auto* prm : t.model.parameters())
      for (dea::Index i = 0; i < prm->value.size(); ++i)
        dea_fuzz::fuzz_require(std::isfinite(prm->value[i]), "loaded parameters are finite");
  } catch (const dea::Error&) {
    dea_fuzz::fuzz_require(snapshot(t.model) == before, "a refused checkpoint leaves the model unchanged");
  }
  return 0;
}
