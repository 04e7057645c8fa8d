// Fuzz target: the JSONL readers (dea/io/jsonl.hpp): the oracle alpha cache and the D_alpha records.
// Properties of an accepted file: every alpha lies in [0, 0.95]; writing the cache and reading it back gives
// the same entries.
#include "fuzz_util.hpp"

#include <dea/io/jsonl.hpp>

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = dea_fuzz::write_temp("jsonl", data, size);
  try {
    const dea::data::AlphaCache cache = dea::io::read_alpha_cache(path);
    for (const auto& e : cache.entries())
      dea_fuzz::fuzz_require(e.alpha >= 0 && e.alpha <= dea::data::kAlphaMax, "alpha in [0, 0.95]");
    const std::string out = path + ".out";
    dea::io::write_alpha_cache(out, cache);
    const dea::data::AlphaCache back = dea::io::read_alpha_cache(out);
    dea_fuzz::fuzz_require(back.size() == cache.size(), "alpha cache round trip keeps the entries");
    for (std::size_t i = 0; i < back.size(); ++i) {
      const auto &a = cache.entries()[i], &b = back.entries()[i];
      dea_fuzz::fuzz_require(a.premise == b.premise && a.hypothesis == b.hypothesis && a.alpha == b.alpha &&
                                 a.phi == b.phi && a.sim == b.sim,
                             "alpha cache round trip is exact");
    }
    std::remove(out.c_str());
  } catch (const dea::Error&) {
  }
  try {
    const std::vector<dea::data::Record> recs = dea::io::read_records(path);
    for (const auto& r : recs) dea_fuzz::fuzz_require(r.label == 0 || r.label == 1, "label is 0 or 1");
  } catch (const dea::Error&) {
  }
  return 0;
}
