// dea/text/bert_normalizer.hpp: BERT's text normaliser and pre-tokeniser (Hugging Face's BertNormalizer and
// BertPreTokenizer): text -> words, before WordPiece (text/wordpiece.hpp) cuts the words into pieces.
//
// Normaliser, in this order (each step can be switched off, as in HF's tokenizer.json):
//   1. clean_text: remove U+0000, U+FFFD and every control character (unicode::is_control: Cc, Cf, Co) other than
//      \t \n \r; then replace every remaining whitespace character (White_Space) with a space.
//   2. handle_chinese_chars: a space before and after every CJK ideograph (unicode::is_cjk_ideograph).
//   3. strip_accents: NFD, then drop every non-spacing mark (Mn). Unset, it follows `lowercase` (HF's null).
//   4. lowercase: the full lower-case mapping of every character (no final-sigma rule).
// Pre-tokeniser: split at whitespace (dropped), then cut every punctuation character (unicode::is_punctuation)
// out as a word of its own. Defaults: bert-base-uncased (everything on).
#pragma once

#include "unicode.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace dea::text {

/// The normaliser of BERT's tokenizers (see the file comment); the defaults are bert-base-uncased's.
struct BertNormalizer {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::optional<bool> strip_accents;  ///< unset: as `lowercase` (HF's `strip_accents: null`)
  bool lowercase = true;

  /// Whether accents are stripped (strip_accents, or lowercase when it is unset).
  bool strips_accents() const { return strip_accents.value_or(lowercase); }

  /// The normalised code points of `s`.
  std::u32string normalize(std::u32string_view s) const {
    std::u32string t;
    t.reserve(s.size());
    for (const char32_t c : s) {
      if (clean_text) {
        if (c == 0 || c == utf8::kReplacement) continue;
        // the control test comes first: VT, FF and U+0085 are whitespace and controls, and go
        if (c != '\t' && c != '\n' && c != '\r' && unicode::is_control(c)) continue;
        if (unicode::is_whitespace(c)) {
          t += U' ';
          continue;
        }
      }
      if (handle_chinese_chars && unicode::is_cjk_ideograph(c)) {
        t += U' ';
        t += c;
        t += U' ';
        continue;
      }
      t += c;
    }
    if (strips_accents()) {
      std::u32string d = unicode::nfd(t);
      t.clear();
      for (const char32_t c : d)
        if (!unicode::is_nonspacing_mark(c)) t += c;
    }
    if (lowercase) {
      std::u32string l;
      l.reserve(t.size());
      for (const char32_t c : t) unicode::append_lower(l, c);
      t.swap(l);
    }
    return t;
  }

  /// The normalised form of UTF-8 text, as UTF-8; invalid UTF-8 is a dea::Error.
  std::string normalize(std::string_view utf8_text) const {
    return unicode::encode_utf8(normalize(unicode::decode_utf8(utf8_text)));
  }
};

/// BERT's pre-tokeniser over normalised code points: calls word(std::u32string_view) for each word in order
/// (whitespace separates words and is dropped; each punctuation character is a word by itself).
template <class F>
void bert_pre_tokenize(std::u32string_view s, F&& word) {
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    const bool ws = unicode::is_whitespace(c);
    if (!ws && !unicode::is_punctuation(c)) continue;
    if (i > start) word(s.substr(start, i - start));
    if (!ws) word(s.substr(i, 1));
    start = i + 1;
  }
  if (s.size() > start) word(s.substr(start));
}

}  // namespace dea::text
