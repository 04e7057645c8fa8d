// Fuzz target: the ConceptNet assertion loader and the capitals list (dea/data/loaders.hpp). Properties of an
// accepted file: positive "conceptnet" pairs with text on both sides, relations isa / partof / capital only.
#include "fuzz_util.hpp"

#include <dea/data/loaders.hpp>

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dea_fuzz::write_temp("conceptnet", data, size);
  try {
    for (const auto& r : dea::data::load_conceptnet_assertions(path, 50))
      dea_fuzz::fuzz_require(r.label == 1 && !r.q_text.empty() && !r.k_text.empty() &&
                                 (r.relation == "isa" || r.relation == "partof"),
                             "a ConceptNet record is an isa / partof pair");
  } catch (const dea::Error&) {
  }
  try {
    const auto recs = dea::data::load_capitals(path);
    dea_fuzz::fuzz_require(!recs.empty(), "an accepted capitals list is not empty");
    for (const auto& r : recs)
      dea_fuzz::fuzz_require(r.relation == "capital" && !r.q_text.empty() && !r.k_text.empty(),
                             "a capitals record has both names");
  } catch (const dea::Error&) {
  }
  return 0;
}
