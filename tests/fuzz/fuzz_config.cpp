// Fuzz target: the run configuration file config.json (dea/train/config.hpp, read_config). Properties of an
// accepted file: it passes validate(), it builds a valid model configuration, and it survives the
// to_json -> config_from_json round trip unchanged.
#include "fuzz_util.hpp"

#include <dea/train.hpp>

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dea::train;
  using namespace dea::train::encoder;
  TrainConfig c;
  try {
    c = read_config(dea_fuzz::write_temp("config", data, size));
  } catch (const dea::Error&) {
    return 0;
  }
  validate(c);  // an accepted file is a valid configuration: a throw here escapes and is a finding
  model_config(c, 10, dea::nn::Task::cls).validate();
  const TrainConfig back = config_from_json(to_json(c), "fuzz-roundtrip");
  dea_fuzz::fuzz_require(to_json(back) == to_json(c), "config JSON round trip is the identity");
  return 0;
}
