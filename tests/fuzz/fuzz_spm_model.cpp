// Fuzz target: loading a SentencePiece model file (spm.model; dea/text/spm_tokenizer.hpp) from arbitrary bytes, in
// both modes: a truncated or corrupt protobuf, an empty vocabulary, a model of another type, missing special pieces,
// a broken character map. A refusal must be a dea::Error; a model that loads must tokenise a few texts (among them
// text its character map changes) with ids below vocab_size and [CLS] A [SEP] B [SEP] encodings that fit max_length.
#include "fuzz_util.hpp"

#include <dea/text/spm_tokenizer.hpp>

#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const dea::text::SpmMode mode : {dea::text::SpmMode::fast, dea::text::SpmMode::slow}) {
    try {
      const dea::text::SpmTokenizer tok = dea::text::SpmTokenizer::from_bytes(bytes, mode, "fuzz.model");
      dea_fuzz::fuzz_require(tok.num_pieces() > 0 && tok.vocab_size() >= tok.num_pieces(), "a model has pieces");
      for (const char* text : {"Hello, world!", " \xEF\xBD\x86\xEF\xAC\x81 e\xCC\x81\xCC\x81 \xE2\x80\x8B",
                               "a[MASK]b [SEP]", "\xE2\x98\x83\xF0\x9F\x91\x8D\xE2\x80\x8D\xF0\x9F\x91\x8D"}) {
        for (const std::int64_t id : tok.ids(text))
          dea_fuzz::fuzz_require(id >= 0 && static_cast<std::size_t>(id) < tok.vocab_size(), "ids < vocab_size");
        const dea::text::Encoding e = tok.encode_pair(text, "x y", 6);
        dea_fuzz::fuzz_require(e.size() >= 3 && e.size() <= 6 && e.input_ids.front() == tok.cls_id() &&
                                   e.input_ids.back() == tok.sep_id(),
                               "a pair fits max_length between [CLS] and [SEP]");
      }
    } catch (const dea::Error&) {
      // refused: a correct outcome
    }
  }
  return 0;
}
