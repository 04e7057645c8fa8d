// Fuzz target: the word-level tokenizer (dea/text/simple_tokenizer.hpp) on arbitrary bytes (text and vocabulary
// files). Properties: tokens are non-empty valid UTF-8 without whitespace; pair encodings respect max_len and
// their spans; a vocabulary built from the input saves and loads back identically; an arbitrary vocabulary
// file loads or is refused with dea::Error.
#include "fuzz_util.hpp"

#include <dea/text/simple_tokenizer.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace {

bool valid_utf8_token(const std::string& t) {
  std::size_t i = 0;
  while (i < t.size()) {
    char32_t cp = 0;
    const std::size_t n = dea::utf8::decode(t, i, cp);
    if (cp == dea::utf8::kReplacement && n == 1) return false;  // an invalid byte inside a token
    if (dea::utf8::is_space(cp)) return false;
    i += n;
  }
  return !t.empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using dea::data::SimpleTokenizer;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  SimpleTokenizer tok;
  const std::vector<std::string> toks = tok.tokenize(text);
  for (const std::string& t : toks) dea_fuzz::fuzz_require(valid_utf8_token(t), "token is valid UTF-8 without spaces");

  // Split the input in two for a pair; max_len from the first byte.
  const std::size_t cut = size / 2;
  const dea::Index max_len = 3 + (size ? data[0] % 40 : 0);
  tok.build_vocab({std::string(text.substr(0, cut)), std::string(text.substr(cut))}, 1000, 1);
  const dea::data::Encoding e = tok.encode_pair(text.substr(0, cut), text.substr(cut), max_len);
  dea_fuzz::fuzz_require(e.size() <= max_len && e.size() >= 3, "pair encoding fits max_len");
  dea_fuzz::fuzz_require(e.input_ids.size() == e.tokens.size() && e.token_type_ids.size() == e.tokens.size(),
                         "encoding arrays agree");
  dea_fuzz::fuzz_require(e.span_a.first == 1 && e.span_a.second <= e.span_b.first && e.span_b.second < e.size(),
                         "spans are ordered and inside the encoding");
  for (std::int64_t id : e.input_ids) dea_fuzz::fuzz_require(id >= 0 && id < tok.vocab_size(), "ids in range");

  // A built vocabulary is a valid vocabulary, and round-trips through save / load (through the file for one
  // input in eight only: save syncs to disk, which would dominate the time per input).
  dea_fuzz::fuzz_require(SimpleTokenizer::from_vocab(tok.vocab()).vocab() == tok.vocab(), "from_vocab(vocab())");
  if (size % 8 == 0) {
    const std::string& vocab_path = dea_fuzz::temp_path("tokenizer_vocab");
    tok.save(vocab_path);
    const SimpleTokenizer back = SimpleTokenizer::load(vocab_path);
    dea_fuzz::fuzz_require(back.vocab() == tok.vocab(), "vocabulary save / load is the identity");
  }

  // The input as a vocabulary file.
  try {
    const SimpleTokenizer loaded = SimpleTokenizer::load(dea_fuzz::write_temp("tokenizer_file", data, size));
    dea_fuzz::fuzz_require(loaded.vocab_size() >= SimpleTokenizer::num_special, "a loaded vocabulary has the specials");
    for (dea::Index i = 0; i < loaded.vocab_size(); ++i)
      dea_fuzz::fuzz_require(loaded.token_to_id(loaded.vocab()[static_cast<std::size_t>(i)]) == i, "ids are unique");
  } catch (const dea::Error&) {
  }
  return 0;
}
