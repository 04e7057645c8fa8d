// Fuzz target: the CSV parser and the CLUTRR loader (dea/data/loaders.hpp, parse_csv and load_clutrr_csv).
// Properties: every parsed row has as many fields as the header; an accepted CLUTRR file gives positive
// "clutrr" records with a story and a "B is the r of A." key.
#include "fuzz_util.hpp"

#include <dea/data/loaders.hpp>

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (char sep : {',', '\t'}) {
    try {
      const dea::data::CsvTable t = dea::data::parse_csv(text, "fuzz", sep);
      dea_fuzz::fuzz_require(!t.header.empty() && t.rows.size() == t.row_line.size(), "CSV table is consistent");
      for (const auto& row : t.rows) dea_fuzz::fuzz_require(row.size() == t.header.size(), "row width = header width");
    } catch (const dea::Error&) {
    }
  }
  try {
    const auto recs = dea::data::load_clutrr_csv(dea_fuzz::write_temp("clutrr", data, size));
    for (const auto& r : recs)
      dea_fuzz::fuzz_require(r.label == 1 && r.source == "clutrr" && !r.q_text.empty() && r.k_text.back() == '.',
                             "a CLUTRR record is a positive pair");
  } catch (const dea::Error&) {
  }
  return 0;
}
