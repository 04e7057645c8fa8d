// dea/text/simple_tokenizer.hpp: the reference's offline word-level tokenizer (SimpleTokenizer) and its
// [CLS] A [SEP] B [SEP] pair encoding.
//
// Splitting. The text is lower-cased, then scanned left to right; at each position the first rule that
// matches wins (the reference's regex `\d+(?:[+\-*/]\d+)+|\w+|[^\w\s]`, written here as a scanner):
//   1. an arithmetic run: ASCII digits, then one or more groups of an operator + - * / followed by digits
//      ("5+3", "12*4", "1+2-3"); a run with no operator group is not an arithmetic run;
//   2. a run of word characters (letters, digits, '_', by utf8::is_word);
//   3. one non-space, non-word code point ("=", ",", "→");
// whitespace separates tokens and is dropped. So "5+3=8" gives "5+3", "=", "8" and "Paris→France" gives
// "paris", "→", "france". Only ASCII '-' is an operator (as in the reference's regex), not U+2212.
//
// Vocabulary. Ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]. build_vocab counts the tokens of the texts and
// appends them most frequent first; among equal counts, the token seen first in the texts comes first
// (Python's Counter.most_common keeps first-insertion order among ties, so the ids equal the reference's for
// the same texts). It stops at max_size entries (specials included) or at the first count below min_freq.
// Unknown tokens map to [UNK].
#pragma once

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../data/knowledge.hpp"
#include "../core/utf8.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dea::data {

/// The result of encoding one text or a pair. `span_a` and `span_b` are half-open [begin, end) token
/// positions of A's and B's tokens; span_b is (0, 0) for a single text.
struct Encoding {
  std::vector<std::string> tokens;
  std::vector<std::int64_t> input_ids;
  std::vector<std::int64_t> token_type_ids;  ///< 0 over [CLS] A [SEP], 1 over B [SEP]
  std::vector<std::int64_t> attention_mask;  ///< all ones (padding is added at collation)
  std::pair<Index, Index> span_a{0, 0};
  std::pair<Index, Index> span_b{0, 0};
  Index size() const { return static_cast<Index>(input_ids.size()); }
};

class SimpleTokenizer {
public:
  static constexpr std::int64_t pad_id = 0;
  static constexpr std::int64_t unk_id = 1;
  static constexpr std::int64_t cls_id = 2;
  static constexpr std::int64_t sep_id = 3;
  static constexpr std::int64_t mask_id = 4;
  static constexpr Index num_special = 5;
  /// The special tokens in id order.
  static const std::array<std::string, 5>& special_tokens() {
    static const std::array<std::string, 5> s{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    return s;
  }

  /// A tokenizer that knows only the special tokens.
  SimpleTokenizer() {
    for (const auto& t : special_tokens()) add_token(t);
  }

  /// A tokenizer with the given vocabulary (token i has id i). The first five entries must be the special
  /// tokens in order; tokens must be non-empty, unique and contain no line break.
  static SimpleTokenizer from_vocab(const std::vector<std::string>& id_to_token) {
    check(id_to_token.size() >= special_tokens().size(), "SimpleTokenizer::from_vocab: vocabulary has ",
          id_to_token.size(), " entries, expected at least the 5 special tokens");
    SimpleTokenizer t;
    for (std::size_t i = 0; i < special_tokens().size(); ++i)
      check(id_to_token[i] == special_tokens()[i], "SimpleTokenizer::from_vocab: id ", i, " must be ",
            special_tokens()[i], ", got '", id_to_token[i], "'");
    for (std::size_t i = special_tokens().size(); i < id_to_token.size(); ++i) {
      const std::string& tok = id_to_token[i];
      check(!tok.empty(), "SimpleTokenizer::from_vocab: empty token at id ", i);
      check(tok.find('\n') == std::string::npos && tok.find('\r') == std::string::npos,
            "SimpleTokenizer::from_vocab: token at id ", i, " contains a line break");
      check(t.ids_.find(tok) == t.ids_.end(), "SimpleTokenizer::from_vocab: duplicate token '", tok, "' at id ", i);
      t.add_token(tok);
    }
    return t;
  }

  /// The reference's get_tokenizer("simple", texts): vocabulary built from `texts` followed by mock_corpus().
  static SimpleTokenizer from_texts(const std::vector<std::string>& texts, Index max_size = 30000,
                                    Index min_freq = 1) {
    std::vector<std::string> all(texts);
    const std::vector<std::string> mock = mock_corpus();
    all.insert(all.end(), mock.begin(), mock.end());
    SimpleTokenizer t;
    t.build_vocab(all, max_size, min_freq);
    return t;
  }

  /// Lower-cases and splits `text` into tokens (rules in the file comment).
  std::vector<std::string> tokenize(std::string_view text) const {
    const std::vector<char32_t> cp = utf8::lower_code_points(text);
    const std::size_t n = cp.size();
    std::vector<std::string> out;
    std::size_t i = 0;
    while (i < n) {
      const char32_t c = cp[i];
      if (utf8::is_space(c)) {
        ++i;
        continue;
      }
      std::size_t end = i;
      if (utf8::is_ascii_digit(c)) {
        // Rule 1: digits (op digits)+
        std::size_t j = i;
        while (j < n && utf8::is_ascii_digit(cp[j])) ++j;
        std::size_t k = j;
        while (k + 1 < n && is_operator(cp[k]) && utf8::is_ascii_digit(cp[k + 1])) {
          k += 1;
          while (k < n && utf8::is_ascii_digit(cp[k])) ++k;
        }
        if (k > j) end = k;
      }
      if (end == i && utf8::is_word(c)) {
        // Rule 2: word characters
        end = i;
        while (end < n && utf8::is_word(cp[end])) ++end;
      }
      if (end == i) end = i + 1;  // Rule 3: one punctuation / symbol code point
      std::string tok;
      for (std::size_t q = i; q < end; ++q) utf8::append(tok, cp[q]);
      out.push_back(std::move(tok));
      i = end;
    }
    return out;
  }

  /// Adds the tokens of `texts` by frequency (see the file comment); returns *this.
  SimpleTokenizer& build_vocab(const std::vector<std::string>& texts, Index max_size = 30000, Index min_freq = 1) {
    check(max_size >= 0, "build_vocab: max_size must be >= 0, got ", max_size);
    struct Count {
      Index count;
      std::size_t first;  // order of first appearance
    };
    std::unordered_map<std::string, Count> counts;
    std::vector<std::string> order;  // tokens in first-appearance order
    for (const std::string& text : texts)
      for (std::string& tok : tokenize(text)) {
        auto it = counts.find(tok);
        if (it == counts.end()) {
          counts.emplace(tok, Count{1, order.size()});
          order.push_back(std::move(tok));
        } else {
          ++it->second.count;
        }
      }
    // Frequency descending; equal counts keep first-appearance order (stable sort of the appearance list).
    std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
      return counts.at(a).count > counts.at(b).count;
    });
    for (const std::string& tok : order) {
      if (counts.at(tok).count < min_freq || static_cast<Index>(id_to_token_.size()) >= max_size) break;
      if (ids_.find(tok) == ids_.end()) add_token(tok);
    }
    return *this;
  }

  Index vocab_size() const { return static_cast<Index>(id_to_token_.size()); }
  /// Token i has id i.
  const std::vector<std::string>& vocab() const { return id_to_token_; }

  /// Id of a token; [UNK] for a token not in the vocabulary.
  std::int64_t token_to_id(const std::string& tok) const {
    auto it = ids_.find(tok);
    return it == ids_.end() ? unk_id : it->second;
  }
  /// Token of an id; "[UNK]" for an id out of range.
  const std::string& id_to_token(std::int64_t id) const {
    if (id < 0 || id >= vocab_size()) return special_tokens()[unk_id];
    return id_to_token_[static_cast<std::size_t>(id)];
  }
  bool contains(const std::string& tok) const { return ids_.find(tok) != ids_.end(); }

  std::vector<std::int64_t> convert_tokens_to_ids(const std::vector<std::string>& toks) const {
    std::vector<std::int64_t> ids;
    ids.reserve(toks.size());
    for (const auto& t : toks) ids.push_back(token_to_id(t));
    return ids;
  }
  std::vector<std::string> convert_ids_to_tokens(const std::vector<std::int64_t>& ids) const {
    std::vector<std::string> toks;
    toks.reserve(ids.size());
    for (auto id : ids) toks.push_back(id_to_token(id));
    return toks;
  }

  /// [CLS] A [SEP], truncated to max_len (>= 2) by dropping A's last tokens.
  Encoding encode(std::string_view a, Index max_len) const { return encode_impl(a, nullptr, max_len); }

  /// [CLS] A [SEP] B [SEP]. When |A| + |B| > max_len - 3, tokens are removed one at a time from the end of
  /// the longer side (from A on a tie) until the pair fits. max_len must be >= 3.
  Encoding encode_pair(std::string_view a, std::string_view b, Index max_len) const {
    return encode_impl(a, &b, max_len);
  }

  /// Writes the vocabulary as UTF-8 text, one token per line, line i+1 = id i (atomic write).
  void save(const std::string& path) const {
    std::string content;
    for (const auto& t : id_to_token_) {
      content += t;
      content += '\n';
    }
    write_file_atomic(path, content);
  }

  /// Largest vocabulary file load() accepts: its size in bytes and its number of tokens.
  static constexpr std::size_t kMaxVocabFileBytes = std::size_t(1) << 28;
  static constexpr Index kMaxVocabSize = Index(1) << 22;

  /// Reads a vocabulary written by save(). A missing file, an empty line, a duplicate token or wrong special
  /// tokens are dea::Error naming the file and line.
  static SimpleTokenizer load(const std::string& path) {
    const std::vector<std::string> lines = split_lines(read_file(path, kMaxVocabFileBytes));
    check(lines.size() <= static_cast<std::size_t>(kMaxVocabSize), path, ": vocabulary has ", lines.size(),
          " lines, more than the maximum of ", kMaxVocabSize);
    check(lines.size() >= special_tokens().size(), path, ": vocabulary has ", lines.size(),
          " lines, expected at least the 5 special tokens");
    SimpleTokenizer t;
    for (std::size_t i = 0; i < special_tokens().size(); ++i)
      check(lines[i] == special_tokens()[i], path, ":", i + 1, ": expected special token ", special_tokens()[i],
            ", got '", lines[i], "'");
    for (std::size_t i = special_tokens().size(); i < lines.size(); ++i) {
      check(!lines[i].empty(), path, ":", i + 1, ": empty token");
      check(t.ids_.find(lines[i]) == t.ids_.end(), path, ":", i + 1, ": duplicate token '", lines[i], "'");
      t.add_token(lines[i]);
    }
    return t;
  }

private:
  static bool is_operator(char32_t c) { return c == '+' || c == '-' || c == '*' || c == '/'; }

  void add_token(const std::string& tok) {
    ids_.emplace(tok, static_cast<std::int64_t>(id_to_token_.size()));
    id_to_token_.push_back(tok);
  }

  Encoding encode_impl(std::string_view a, const std::string_view* b, Index max_len) const {
    const Index reserved = b ? 3 : 2;
    check(max_len >= reserved, "SimpleTokenizer::encode", b ? "_pair" : "", ": max_len must be >= ", reserved,
          ", got ", max_len);
    std::vector<std::string> ta = tokenize(a);
    std::vector<std::string> tb = b ? tokenize(*b) : std::vector<std::string>{};
    const std::size_t budget = static_cast<std::size_t>(max_len - reserved);
    while (ta.size() + tb.size() > budget) (ta.size() >= tb.size() ? ta : tb).pop_back();

    Encoding e;
    e.tokens.reserve(ta.size() + tb.size() + 3);
    e.tokens.push_back(special_tokens()[cls_id]);
    e.tokens.insert(e.tokens.end(), ta.begin(), ta.end());
    e.tokens.push_back(special_tokens()[sep_id]);
    e.span_a = {1, 1 + static_cast<Index>(ta.size())};
    const std::size_t n_a = e.tokens.size();  // [CLS] A [SEP]: token type 0
    if (b) {
      const Index start = static_cast<Index>(e.tokens.size());
      e.tokens.insert(e.tokens.end(), tb.begin(), tb.end());
      e.tokens.push_back(special_tokens()[sep_id]);
      e.span_b = {start, start + static_cast<Index>(tb.size())};
    }
    e.input_ids = convert_tokens_to_ids(e.tokens);
    // The specials are looked up like any token (they are always ids 2 and 3), so ids and tokens agree.
    e.token_type_ids.assign(e.tokens.size(), 0);
    for (std::size_t i = n_a; i < e.tokens.size(); ++i) e.token_type_ids[i] = 1;
    e.attention_mask.assign(e.tokens.size(), 1);
    return e;
  }

  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, std::int64_t> ids_;
};

/// The padding id of a tokenizer (what the collation functions pad with; run_tokenizer.hpp has the other one).
inline std::int64_t pad_id_of(const SimpleTokenizer&) { return SimpleTokenizer::pad_id; }

}  // namespace dea::data
