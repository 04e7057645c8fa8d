// Fuzz target: a Hugging Face DeBERTa-v2/v3 config.json (dea/deberta/config.hpp) from arbitrary bytes. Properties of
// an accepted file: the configuration passes validate(), its sizes are within the sane maxima, the heads divide the
// hidden size, log buckets (when on) are defined (m >= 1, m != R - 1), the buckets of distances up to 4 R are odd
// (and grow with the distance when m < R - 1), and writing the configuration as a config.json (deberta_config_json)
// and parsing that gives the same configuration.
#include "fuzz_util.hpp"

#include <dea/deberta/config.hpp>
#include <dea/deberta/relative.hpp>

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dea::deberta;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  DebertaConfig c;
  try {
    c = parse_deberta_config(dea::io::parse_json_limited(text, "fuzz config.json"), "fuzz config.json");
  } catch (const dea::Error&) {
    return 0;
  }
  c.validate("accepted");  // an accepted file is a valid configuration: a throw here escapes and is a finding
  dea_fuzz::fuzz_require(c.hidden_size % c.num_attention_heads == 0, "the heads divide the hidden size");
  dea_fuzz::fuzz_require(c.vocab_size <= DebertaConfig::kMaxVocab && c.hidden_size <= DebertaConfig::kMaxHidden &&
                             c.num_hidden_layers <= DebertaConfig::kMaxLayers && c.att_span() <= DebertaConfig::kMaxPositions,
                         "sizes within the maxima");
  if (c.relative_attention && c.position_buckets > 0) {
    const std::int64_t k = c.position_buckets, R = c.relative_range(), m = k / 2;
    dea_fuzz::fuzz_require(m >= 1 && m != R - 1, "log buckets are defined");
    std::int64_t last = m;
    for (std::int64_t d : {m, m + 1, R - 1, R, 2 * R, 4 * R}) {
      const std::int64_t b = relative_bucket(d, k, R);
      dea_fuzz::fuzz_require(relative_bucket(-d, k, R) == -b, "buckets are odd");
      dea_fuzz::fuzz_require(m > R - 1 || d < m || b >= last, "buckets grow with the distance");
      if (d >= m) last = b;
    }
  }
  const nlohmann::json j = deberta_config_json(c);
  const DebertaConfig back = parse_deberta_config(j, "round trip");
  dea_fuzz::fuzz_require(deberta_config_json(back) == j, "config.json round trip is the identity");
  return 0;
}
