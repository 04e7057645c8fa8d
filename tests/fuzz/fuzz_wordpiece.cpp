// Fuzz target: BERT's WordPiece tokenizer (dea/text/wordpiece.hpp) over bert-base-uncased's vocabulary
// (tests/data/bert/vocab.txt) on arbitrary bytes. Invalid UTF-8 must be a dea::Error that says so, exactly when the
// bytes are not valid UTF-8. Properties on valid text: the normaliser's output is valid UTF-8; every piece is a
// token of the vocabulary and its id the token's; the ids are those of the pieces; [CLS] A [SEP] B [SEP] encodings
// (Hugging Face's longest_first and the reference's rule) fit max_length, with token types 0 then 1 and spans that
// cover exactly A's and B's pieces.
#include "fuzz_util.hpp"

#include <dea/text/wordpiece.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#ifndef DEA_FUZZ_VOCAB
#error "DEA_FUZZ_VOCAB (the path of a vocab.txt) must be defined"
#endif

namespace {

const dea::text::WordPieceTokenizer& tokenizer() {
  static const dea::text::WordPieceTokenizer wp = dea::text::WordPieceTokenizer::from_file(DEA_FUZZ_VOCAB);
  return wp;
}

void check_pair(const dea::text::Encoding& e, std::size_t max_length, bool spans) {
  dea_fuzz::fuzz_require(e.size() >= 3 && (max_length == 0 || e.size() <= max_length), "a pair fits max_length");
  dea_fuzz::fuzz_require(e.tokens.size() == e.size() && e.token_type_ids.size() == e.size() &&
                             e.attention_mask.size() == e.size(),
                         "the encoding's arrays agree");
  const std::ptrdiff_t first_sep = e.span_a.second;
  for (std::size_t t = 0; t < e.size(); ++t)
    dea_fuzz::fuzz_require(e.token_type_ids[t] == (static_cast<std::ptrdiff_t>(t) <= first_sep ? 0 : 1),
                           "token types: 0 through the first [SEP], then 1");
  if (spans)
    dea_fuzz::fuzz_require(e.span_a.first == 1 && e.span_b.first == e.span_a.second + 1 &&
                               e.span_b.second == static_cast<std::ptrdiff_t>(e.size()) - 1,
                           "spans cover A's and B's pieces");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const dea::text::WordPieceTokenizer& wp = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = dea::text::unicode::first_invalid_utf8(text) == std::string_view::npos;
  std::vector<std::string> pieces;
  try {
    pieces = wp.tokenize(text);
  } catch (const dea::Error& e) {
    dea_fuzz::fuzz_require(!valid, "valid UTF-8 is tokenized");
    dea_fuzz::fuzz_require(std::string(e.what()).find("not valid UTF-8") != std::string::npos,
                           "the error says the text is not valid UTF-8");
    return 0;
  }
  dea_fuzz::fuzz_require(valid, "invalid UTF-8 is refused");
  dea_fuzz::fuzz_require(dea::text::unicode::first_invalid_utf8(wp.normalize(text)) == std::string_view::npos,
                         "the normalised text is valid UTF-8");
  const std::vector<std::int64_t> ids = wp.encode(text);
  dea_fuzz::fuzz_require(ids.size() == pieces.size(), "ids and pieces agree");
  for (std::size_t k = 0; k < ids.size(); ++k)
    dea_fuzz::fuzz_require(wp.vocab().find(pieces[k]) == ids[k], "every piece is a token, with its id");

  // a pair: the input cut in two at a character boundary, max_length from the first byte
  std::size_t cut = size / 2;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  const std::string_view a = text.substr(0, cut), b = text.substr(cut);
  const std::size_t max_length = 3 + (size ? data[0] % 48 : 0);
  check_pair(wp.encode_pair(a, b), 0, true);
  check_pair(wp.encode_pair(a, b, max_length), max_length, true);
  check_pair(wp.reference_encode_pair(a, b, max_length), max_length, true);
  const dea::text::Encoding single = wp.encode_single(text, max_length);
  dea_fuzz::fuzz_require(single.size() >= 2 && single.size() <= max_length, "a single text fits max_length");
  return 0;
}
