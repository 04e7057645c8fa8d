// Fuzz target: the bAbI task-file loader (dea/data/loaders.hpp, load_babi). Properties of an accepted file:
// every record is a positive "babi" pair with a non-empty question and answer; max_records is respected.
#include "fuzz_util.hpp"

#include <dea/data/loaders.hpp>

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dea_fuzz::write_temp("babi", data, size);
  for (std::size_t max_records : {std::size_t(3), std::numeric_limits<std::size_t>::max()}) {
    try {
      const std::vector<dea::data::Record> recs = dea::data::load_babi(path, "", max_records);
      dea_fuzz::fuzz_require(recs.size() <= max_records, "max_records respected");
      for (const auto& r : recs)
        dea_fuzz::fuzz_require(r.label == 1 && r.source == "babi" && !r.q_text.empty() && !r.k_text.empty(),
                               "a bAbI record is a positive pair with text on both sides");
    } catch (const dea::Error&) {
    }
  }
  return 0;
}
