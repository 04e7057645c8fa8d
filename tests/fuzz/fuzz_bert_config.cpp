// Fuzz target: a Hugging Face BERT config.json (dea/bert/config.hpp) from arbitrary bytes. Properties of an
// accepted file: the configuration passes validate(), its sizes are within the sane maxima, and writing it as a
// config.json (bert_config_json) and parsing that gives the same configuration.
#include "fuzz_util.hpp"

#include <dea/bert/config.hpp>

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dea::bert;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  BertConfig c;
  try {
    c = parse_bert_config(dea::io::parse_json_limited(text, "fuzz config.json"), "fuzz config.json");
  } catch (const dea::Error&) {
    return 0;
  }
  c.validate("accepted");  // an accepted file is a valid configuration: a throw here escapes and is a finding
  dea_fuzz::fuzz_require(c.hidden_size % c.num_attention_heads == 0, "the heads divide the hidden size");
  dea_fuzz::fuzz_require(c.vocab_size <= BertConfig::kMaxVocab && c.hidden_size <= BertConfig::kMaxHidden &&
                             c.num_hidden_layers <= BertConfig::kMaxLayers,
                         "sizes within the maxima");
  const nlohmann::json j = bert_config_json(c);
  const BertConfig back = parse_bert_config(j, "round trip");
  dea_fuzz::fuzz_require(bert_config_json(back) == j, "config.json round trip is the identity");
  return 0;
}
