// Fuzz target: the SentencePiece tokenizer (dea/text/spm_tokenizer.hpp) over the golden nmt_nfkc model
// (tests/data/deberta/spm/spm_nfkc.model, whose character map the fast mode applies per grapheme cluster) on arbitrary
// bytes, in both modes. Invalid UTF-8 must be a dea::Error that says so, exactly when the bytes are not valid UTF-8.
// Properties on valid text: the fast normaliser's output is valid UTF-8; every id is below vocab_size and is the id
// of its token string (a piece or a special token; fast's unknown runs are [UNK]); in slow mode every unknown
// character became byte pieces (no [UNK]); [CLS] A [SEP] B [SEP] encodings fit max_length, with token types 0
// through the first [SEP] and 1 after, and truncation keeps a prefix of each text's tokens.
#include "fuzz_util.hpp"

#include <dea/text/spm_tokenizer.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#ifndef DEA_FUZZ_SPM_MODEL
#error "DEA_FUZZ_SPM_MODEL (the path of a SentencePiece model) must be defined"
#endif

namespace {

const dea::text::SpmTokenizer& tokenizer(dea::text::SpmMode mode) {
  static const dea::text::SpmTokenizer fast(DEA_FUZZ_SPM_MODEL, dea::text::SpmMode::fast);
  static const dea::text::SpmTokenizer slow(DEA_FUZZ_SPM_MODEL, dea::text::SpmMode::slow);
  return mode == dea::text::SpmMode::fast ? fast : slow;
}

bool is_prefix(const std::vector<std::int64_t>& part, const std::vector<std::int64_t>& whole) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = dea::text::unicode::first_invalid_utf8(text) == std::string_view::npos;
  for (const dea::text::SpmMode mode : {dea::text::SpmMode::fast, dea::text::SpmMode::slow}) {
    const dea::text::SpmTokenizer& tok = tokenizer(mode);
    std::vector<dea::text::SpmToken> tokens;
    try {
      tokens = tok.tokens(text);
    } catch (const dea::Error& e) {
      dea_fuzz::fuzz_require(!valid, "valid UTF-8 is tokenised");
      dea_fuzz::fuzz_require(std::string(e.what()).find("not valid UTF-8") != std::string::npos,
                             "the error says the text is not valid UTF-8");
      continue;
    }
    dea_fuzz::fuzz_require(valid, "invalid UTF-8 is refused");
    if (mode == dea::text::SpmMode::fast)
      dea_fuzz::fuzz_require(dea::text::unicode::first_invalid_utf8(tok.normalize_fast(text)) == std::string_view::npos,
                             "the normalised text is valid UTF-8");
    for (const dea::text::SpmToken& t : tokens) {
      dea_fuzz::fuzz_require(t.id >= 0 && static_cast<std::size_t>(t.id) < tok.vocab_size(), "ids < vocab_size");
      if (t.id != tok.unk_id() || mode == dea::text::SpmMode::slow)
        dea_fuzz::fuzz_require(tok.id_to_token(t.id) == t.token, "an id is that of its token string");
      if (mode == dea::text::SpmMode::slow && t.id == tok.unk_id())
        dea_fuzz::fuzz_require(t.token == "[UNK]", "slow mode: unknown characters are byte pieces");
    }
    // a pair: the input cut in two at a character boundary, max_length from the first byte
    std::size_t cut = size / 2;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    const std::string_view a = text.substr(0, cut), b = text.substr(cut);
    const std::vector<std::int64_t> ia = tok.ids(a), ib = tok.ids(b);
    const std::size_t max_length = 3 + (size ? data[0] % 48 : 0);
    const dea::text::Encoding e = tok.encode_pair(a, b, max_length);
    dea_fuzz::fuzz_require(e.size() >= 3 && e.size() <= max_length && e.size() == e.token_type_ids.size() &&
                               e.size() == e.attention_mask.size() && e.size() == e.tokens.size(),
                           "a pair fits max_length, its arrays agree");
    const auto sa = static_cast<std::size_t>(e.span_a.second - e.span_a.first);
    const auto sb = static_cast<std::size_t>(e.span_b.second - e.span_b.first);
    dea_fuzz::fuzz_require(sa + sb + 3 == e.size(), "spans cover A and B");
    const auto a_begin = e.input_ids.begin() + 1, b_begin = a_begin + static_cast<std::ptrdiff_t>(sa) + 1;
    dea_fuzz::fuzz_require(is_prefix({a_begin, b_begin - 1}, ia) && is_prefix({b_begin, e.input_ids.end() - 1}, ib),
                           "truncation keeps a prefix of each text");
    for (std::size_t t = 0; t < e.size(); ++t)
      dea_fuzz::fuzz_require(e.token_type_ids[t] == (t <= sa + 1 ? 0 : 1), "token types: 0 through the first [SEP]");
  }
  return 0;
}
