// Fuzz target: a WordPiece vocabulary (BERT's vocab.txt, dea/text/vocab.hpp) parsed from arbitrary bytes.
// Properties of an accepted vocabulary: at least one token; every token non-empty, valid UTF-8 and without trailing
// whitespace; token -> id -> token is the identity; the tokens written back one per line parse to the same
// vocabulary; when it holds [UNK], a WordPiece tokenizer over it spells a fixed text with its own tokens only.
#include "fuzz_util.hpp"

#include <dea/text/wordpiece.hpp>

#include <cstdint>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using dea::text::Vocab;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Vocab v;
  try {
    v = Vocab::parse(bytes, "fuzz_vocab.txt");
  } catch (const dea::Error&) {
    return 0;
  }
  dea_fuzz::fuzz_require(v.size() >= 1, "an accepted vocabulary has a token");
  std::string back;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string& t = v.tokens()[i];
    dea_fuzz::fuzz_require(!t.empty(), "tokens are not empty");
    dea_fuzz::fuzz_require(dea::text::unicode::first_invalid_utf8(t) == std::string_view::npos, "tokens are valid UTF-8");
    const std::u32string cps = dea::text::unicode::decode_utf8(t);
    dea_fuzz::fuzz_require(!dea::text::unicode::is_whitespace(cps.back()), "no trailing whitespace in a token");
    dea_fuzz::fuzz_require(v.find(t) == static_cast<std::int64_t>(i), "token -> id is the line's id");
    dea_fuzz::fuzz_require(v.token(static_cast<std::int64_t>(i)) == t, "id -> token");
    back += t;
    back += '\n';
  }
  const Vocab again = Vocab::parse(back, "fuzz_vocab_back.txt");  // a throw here escapes: a finding
  dea_fuzz::fuzz_require(again.tokens() == v.tokens(), "the tokens written back parse to the same vocabulary");

  if (v.contains("[UNK]")) {
    const dea::text::WordPieceTokenizer wp(v);
    const std::vector<std::int64_t> ids = wp.encode("Paris is the capital of France; x[MASK]y 5+3=8 caf\xc3\xa9");
    const std::vector<std::string> pieces = wp.tokenize("Paris is the capital of France; x[MASK]y 5+3=8 caf\xc3\xa9");
    dea_fuzz::fuzz_require(ids.size() == pieces.size(), "ids and pieces agree");
    for (std::size_t k = 0; k < ids.size(); ++k)
      dea_fuzz::fuzz_require(ids[k] >= 0 && v.token(ids[k]) == pieces[k], "every piece is a token of the vocabulary");
  }
  return 0;
}
