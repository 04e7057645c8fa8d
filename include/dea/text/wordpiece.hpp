// dea/text/wordpiece.hpp: BERT's WordPiece tokenizer, as Hugging Face's tokenizers library computes it for
// bert-base-uncased, and its [CLS] A [SEP] B [SEP] encodings.
//
// text -> pieces:
//   1. Special tokens ([PAD] [UNK] [CLS] [SEP] [MASK], those the vocabulary holds) are cut out of the raw text where
//      they occur exactly (case-sensitive, before any normalisation) and become tokens of their own: "x[MASK]y" ->
//      x, [MASK], y; "[mask]" is not special.
//   2. The text between them is normalised and split into words (text/bert_normalizer.hpp).
//   3. Each word: more than max_input_chars_per_word (100) code points -> [UNK]. Otherwise greedy longest match from
//      the left, every piece after the first spelled with the prefix "##"; when no piece matches at some point, the
//      whole word becomes one [UNK] (the pieces found so far are dropped).
// Encodings: encode_single is [CLS] A [SEP] (token types 0); encode_pair is [CLS] A [SEP] B [SEP] (types 0 up to
// and including the first [SEP], then 1); attention_mask is all ones.
//
// Two truncation rules for pairs, both counting the special tokens in max_length (so A and B share
// b = max_length - 3 tokens) and both cutting from the right:
//   - encode_pair: Hugging Face's longest_first (truncation=True), longest_first_lengths(): with nA <= nB, A keeps
//     min(nA, b/2) and B the rest of b; otherwise B keeps min(nB, b/2) and A the rest. Only the counts nA and nB are
//     not always the full ones: tokenizers 0.23.2 stops tokenizing a text early under truncation (EarlyStop), once
//     it holds max_length pieces, a special token being counted only when the next word is. So a text of more than
//     max_length pieces counts as max_length, or a few more when it stops inside a word (all of that word's pieces
//     count) or just after a special token (one more word). This decides the split only when both texts reach
//     max_length: nA = 5, nB = 4, max_length 4 keeps A 0 + B 1 (both count 4), where the full counts would give 1 + 0.
//   - reference_encode_pair: the DEA reference's own encode_pair (data.py), reference_pair_lengths(): one token at a
//     time, from the end of A while |A| >= |B|, else from B. It also gives span_a and span_b. This is the rule of the
//     D_alpha training data. The two differ when b is odd and A is the longer text (nA = 6, nB = 4, max_length 8:
//     HF keeps 3 + 2, the reference 2 + 3).
// Invalid UTF-8 text is a dea::Error. Standard library only (no Eigen).
#pragma once

#include "../core/error.hpp"
#include "bert_normalizer.hpp"
#include "unicode.hpp"
#include "vocab.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dea::text {

/// An encoded text or pair. span_a and span_b are half-open [begin, end) token positions of A's and B's tokens
/// (span_b is (0, 0) for a single text).
struct Encoding {
  std::vector<std::string> tokens;
  std::vector<std::int64_t> input_ids;
  std::vector<std::int64_t> token_type_ids;
  std::vector<std::int64_t> attention_mask;
  std::pair<std::ptrdiff_t, std::ptrdiff_t> span_a{0, 0};
  std::pair<std::ptrdiff_t, std::ptrdiff_t> span_b{0, 0};
  std::size_t size() const { return input_ids.size(); }
};

/// The settings of a WordPiece tokenizer; the defaults are bert-base-uncased's tokenizer.json.
struct WordPieceOptions {
  BertNormalizer normalizer{};
  std::string unk_token = "[UNK]";
  std::string cls_token = "[CLS]";
  std::string sep_token = "[SEP]";
  std::string pad_token = "[PAD]";
  std::string mask_token = "[MASK]";
  std::string continuing_subword_prefix = "##";
  std::size_t max_input_chars_per_word = 100;
};

class WordPieceTokenizer {
public:
  /// A tokenizer over `vocab`, which must hold the unknown token ([UNK]); [CLS] and [SEP] are needed by the
  /// encode_* functions and [PAD] by pad_id(), each checked when asked for.
  explicit WordPieceTokenizer(Vocab vocab, WordPieceOptions options = {})
      : vocab_(std::move(vocab)), opt_(std::move(options)) {
    unk_id_ = vocab_.require(opt_.unk_token, "the words the vocabulary cannot spell");
    for (const std::string* s : {&opt_.pad_token, &opt_.unk_token, &opt_.cls_token, &opt_.sep_token, &opt_.mask_token})
      if (!s->empty() && vocab_.contains(*s) &&
          std::find(specials_.begin(), specials_.end(), *s) == specials_.end())
        specials_.push_back(*s);
    std::sort(specials_.begin(), specials_.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });  // longest first
    for (const std::string& s : specials_) starts_special_[static_cast<unsigned char>(s[0])] = true;
    prefix_chars_ = unicode::decode_utf8(opt_.continuing_subword_prefix, "continuing_subword_prefix").size();
  }

  /// Loads vocab.txt and builds the tokenizer.
  static WordPieceTokenizer from_file(const std::string& vocab_path, WordPieceOptions options = {}) {
    return WordPieceTokenizer(Vocab::load(vocab_path), std::move(options));
  }

  const Vocab& vocab() const { return vocab_; }
  const WordPieceOptions& options() const { return opt_; }
  std::int64_t unk_id() const { return unk_id_; }
  std::int64_t cls_id() const { return vocab_.require(opt_.cls_token, "[CLS] A [SEP] encodings"); }
  std::int64_t sep_id() const { return vocab_.require(opt_.sep_token, "[CLS] A [SEP] encodings"); }
  std::int64_t pad_id() const { return vocab_.require(opt_.pad_token, "padding"); }

  /// The normaliser's output for the whole text (special tokens included, as HF's `normalized`).
  std::string normalize(std::string_view text) const { return opt_.normalizer.normalize(text); }

  /// The pieces of `text`, without [CLS] / [SEP].
  std::vector<std::string> tokenize(std::string_view text) const {
    std::vector<std::string> pieces;
    run(text, &pieces, nullptr);
    return pieces;
  }

  /// The ids of the pieces of `text`, without [CLS] / [SEP].
  std::vector<std::int64_t> encode(std::string_view text) const {
    std::vector<std::int64_t> ids;
    run(text, nullptr, &ids);
    return ids;
  }

  /// [CLS] A [SEP], all of token type 0, without truncation.
  Encoding encode_single(std::string_view text) const { return single(text, nullptr); }
  /// [CLS] A [SEP] of at most max_length (>= 2) tokens: A keeps its first max_length - 2 pieces.
  Encoding encode_single(std::string_view text, std::size_t max_length) const {
    check(max_length >= 2, "WordPieceTokenizer::encode_single: max_length must be >= 2 ([CLS] and [SEP]), got ",
          max_length);
    return single(text, &max_length);
  }

  /// [CLS] A [SEP] B [SEP] with token types, without truncation.
  Encoding encode_pair(std::string_view a, std::string_view b) const {
    return pair(a, b, 0, [](std::size_t na, std::size_t nb) { return std::make_pair(na, nb); });
  }
  /// [CLS] A [SEP] B [SEP] of at most max_length (>= 3) tokens, by Hugging Face's longest_first rule
  /// (longest_first_lengths).
  Encoding encode_pair(std::string_view a, std::string_view b, std::size_t max_length) const {
    check(max_length >= 3, "WordPieceTokenizer::encode_pair: max_length must be >= 3 ([CLS] and two [SEP]), got ",
          max_length);
    return pair(a, b, max_length,
                [max_length](std::size_t na, std::size_t nb) { return longest_first_lengths(na, nb, max_length); });
  }
  /// [CLS] A [SEP] B [SEP] of at most max_length (>= 3) tokens by the DEA reference's own rule
  /// (reference_pair_lengths), with span_a = [1, 1 + |A|) and span_b = [|A| + 2, |A| + 2 + |B|): what the D_alpha
  /// data path uses.
  Encoding reference_encode_pair(std::string_view a, std::string_view b, std::size_t max_length) const {
    check(max_length >= 3,
          "WordPieceTokenizer::reference_encode_pair: max_length must be >= 3 ([CLS] and two [SEP]), got ", max_length);
    return pair(a, b, 0,
                [max_length](std::size_t na, std::size_t nb) { return reference_pair_lengths(na, nb, max_length); });
  }

  /// Hugging Face's longest_first rule: the lengths (nA', nB') that texts of nA and nB pieces keep in a pair of at
  /// most max_length (>= 3) tokens. With b = max_length - 3: nothing is cut when nA + nB <= b; otherwise the
  /// shorter text (A on a tie) keeps min(n, b/2) and the other the rest of b. (encode_pair applies it to the piece
  /// counts after Hugging Face's early stop, which can differ from the full counts; see the file comment.)
  static std::pair<std::size_t, std::size_t> longest_first_lengths(std::size_t na, std::size_t nb,
                                                                   std::size_t max_length) {
    check(max_length >= 3, "longest_first_lengths: max_length must be >= 3, got ", max_length);
    const std::size_t budget = max_length - 3;
    if (na + nb <= budget) return {na, nb};
    const std::size_t half = budget / 2;
    if (na <= nb) {
      const std::size_t ka = std::min(na, half);
      return {ka, budget - ka};
    }
    const std::size_t kb = std::min(nb, half);
    return {budget - kb, kb};
  }

  /// The DEA reference's rule: with b = max_length - 3 (max_length >= 3), pop the last piece of A while
  /// |A| >= |B|, else of B, until |A| + |B| <= b.
  static std::pair<std::size_t, std::size_t> reference_pair_lengths(std::size_t na, std::size_t nb,
                                                                    std::size_t max_length) {
    check(max_length >= 3, "reference_pair_lengths: max_length must be >= 3, got ", max_length);
    const std::size_t budget = max_length - 3;
    while (na + nb > budget) (na >= nb ? na : nb) -= 1;
    return {na, nb};
  }

private:
  /// Hugging Face's early stop of a text's tokenization under truncation (tokenizers 0.23.2; see encode_pair):
  /// once `count` reaches `limit`, no further word or special token is taken. A special token counts only from the
  /// next word on (it waits in `pending`), so one that comes right before the limit lets one more word in.
  struct EarlyStop {
    std::size_t limit = 0, count = 0, pending = 0;
    bool stopped = false;
    /// Whether the next word or special token is still taken.
    bool open() {
      stopped = stopped || count >= limit;
      return !stopped;
    }
  };

  /// Tokenizes `text` into pieces and/or ids (either may be null), stopping early as `stop` says (null: never).
  void run(std::string_view text, std::vector<std::string>* pieces, std::vector<std::int64_t>* ids,
           EarlyStop* stop = nullptr) const {
    const std::size_t bad = unicode::first_invalid_utf8(text);
    if (bad != std::string_view::npos) ::dea::detail::raise(unicode::invalid_utf8_message(text, bad, "the text"));
    std::size_t start = 0;
    for (std::size_t i = 0; i < text.size();) {
      const std::string* hit = nullptr;
      if (starts_special_[static_cast<unsigned char>(text[i])])
        for (const std::string& s : specials_)
          if (text.compare(i, s.size(), s) == 0) {
            hit = &s;
            break;
          }
      if (!hit) {
        ++i;
        continue;
      }
      segment(text.substr(start, i - start), pieces, ids, stop);
      if (!stop || stop->open()) {
        if (pieces) pieces->push_back(*hit);
        if (ids) ids->push_back(vocab_.find(*hit));
        if (stop) ++stop->pending;
      }
      i += hit->size();
      start = i;
    }
    segment(text.substr(start), pieces, ids, stop);
  }

  /// Normalises, pre-tokenizes and cuts one stretch of text between special tokens.
  void segment(std::string_view text, std::vector<std::string>* pieces, std::vector<std::int64_t>* ids,
               EarlyStop* stop) const {
    if (text.empty() || (stop && !stop->open())) return;
    const std::u32string norm = opt_.normalizer.normalize(unicode::decode_utf8(text));
    bert_pre_tokenize(norm, [&](std::u32string_view word) {
      if (!stop) return wordpiece(word, pieces, ids);
      if (!stop->open()) return;
      const std::size_t before = pieces ? pieces->size() : ids->size();
      wordpiece(word, pieces, ids);
      stop->count += stop->pending + (pieces ? pieces->size() : ids->size()) - before;
      stop->pending = 0;
    });
  }

  /// Greedy longest-match-first WordPiece of one word.
  void wordpiece(std::u32string_view word, std::vector<std::string>* pieces, std::vector<std::int64_t>* ids) const {
    if (word.size() > opt_.max_input_chars_per_word) return emit_unk(pieces, ids);
    const std::string utf8 = unicode::encode_utf8(word);
    std::vector<std::size_t> at(word.size() + 1, 0);  // byte offset of each code point
    for (std::size_t k = 0, b = 0; k < word.size(); ++k) {
      at[k] = b;
      b += utf8_length(word[k]);
    }
    at[word.size()] = utf8.size();

    const std::size_t first_piece = pieces ? pieces->size() : 0, first_id = ids ? ids->size() : 0;
    std::string candidate;
    for (std::size_t s = 0; s < word.size();) {
      // longer candidates than the longest token cannot match
      const std::size_t extra = s > 0 ? prefix_chars_ : 0;
      const std::size_t longest = vocab_.max_token_chars() > extra ? vocab_.max_token_chars() - extra : 0;
      std::size_t e = std::min(word.size(), s + longest);
      std::int64_t id = -1;
      for (; e > s; --e) {
        candidate.clear();
        if (s > 0) candidate = opt_.continuing_subword_prefix;
        candidate.append(utf8, at[s], at[e] - at[s]);
        id = vocab_.find(candidate);
        if (id >= 0) break;
      }
      if (id < 0) {  // no piece fits here: the whole word is unknown
        if (pieces) pieces->resize(first_piece);
        if (ids) ids->resize(first_id);
        return emit_unk(pieces, ids);
      }
      if (pieces) pieces->push_back(candidate);
      if (ids) ids->push_back(id);
      s = e;
    }
  }

  void emit_unk(std::vector<std::string>* pieces, std::vector<std::int64_t>* ids) const {
    if (pieces) pieces->push_back(opt_.unk_token);
    if (ids) ids->push_back(unk_id_);
  }

  static std::size_t utf8_length(char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

  Encoding single(std::string_view text, const std::size_t* max_length) const {
    const std::int64_t cls = cls_id(), sep = sep_id();
    std::vector<std::string> p;
    std::vector<std::int64_t> id;
    EarlyStop stop;  // (it never changes a single text's result: it only saves work)
    stop.limit = max_length ? *max_length : 0;
    run(text, &p, &id, max_length ? &stop : nullptr);
    if (max_length && p.size() > *max_length - 2) {
      p.resize(*max_length - 2);
      id.resize(*max_length - 2);
    }
    Encoding e;
    e.tokens.reserve(p.size() + 2);
    e.input_ids.reserve(p.size() + 2);
    e.tokens.push_back(opt_.cls_token);
    e.input_ids.push_back(cls);
    e.tokens.insert(e.tokens.end(), p.begin(), p.end());
    e.input_ids.insert(e.input_ids.end(), id.begin(), id.end());
    e.tokens.push_back(opt_.sep_token);
    e.input_ids.push_back(sep);
    e.token_type_ids.assign(e.input_ids.size(), 0);
    e.attention_mask.assign(e.input_ids.size(), 1);
    e.span_a = {1, 1 + static_cast<std::ptrdiff_t>(p.size())};
    return e;
  }

  /// [CLS] A [SEP] B [SEP]; `early_stop` > 0 stops each text's tokenization as Hugging Face does under truncation
  /// at that max_length; `lengths(nA, nB)` gives how many pieces of each are kept.
  template <class Lengths>
  Encoding pair(std::string_view a, std::string_view b, std::size_t early_stop, Lengths lengths) const {
    const std::int64_t cls = cls_id(), sep = sep_id();
    std::vector<std::string> pa, pb;
    std::vector<std::int64_t> ia, ib;
    EarlyStop sa, sb;
    sa.limit = sb.limit = early_stop;
    run(a, &pa, &ia, early_stop ? &sa : nullptr);
    run(b, &pb, &ib, early_stop ? &sb : nullptr);
    const auto [ka, kb] = lengths(pa.size(), pb.size());
    pa.resize(ka);
    ia.resize(ka);
    pb.resize(kb);
    ib.resize(kb);
    Encoding e;
    const std::size_t n = ka + kb + 3;
    e.tokens.reserve(n);
    e.input_ids.reserve(n);
    e.tokens.push_back(opt_.cls_token);
    e.input_ids.push_back(cls);
    e.tokens.insert(e.tokens.end(), pa.begin(), pa.end());
    e.input_ids.insert(e.input_ids.end(), ia.begin(), ia.end());
    e.tokens.push_back(opt_.sep_token);
    e.input_ids.push_back(sep);
    e.token_type_ids.assign(e.input_ids.size(), 0);
    e.tokens.insert(e.tokens.end(), pb.begin(), pb.end());
    e.input_ids.insert(e.input_ids.end(), ib.begin(), ib.end());
    e.tokens.push_back(opt_.sep_token);
    e.input_ids.push_back(sep);
    e.token_type_ids.resize(e.input_ids.size(), 1);
    e.attention_mask.assign(e.input_ids.size(), 1);
    e.span_a = {1, 1 + static_cast<std::ptrdiff_t>(ka)};
    e.span_b = {static_cast<std::ptrdiff_t>(ka) + 2, static_cast<std::ptrdiff_t>(ka + kb) + 2};
    return e;
  }

  Vocab vocab_;
  WordPieceOptions opt_;
  std::int64_t unk_id_ = -1;
  std::vector<std::string> specials_;  ///< the special tokens the vocabulary holds, longest first
  std::array<bool, 256> starts_special_{};  ///< the first bytes of specials_
  std::size_t prefix_chars_ = 0;
};

}  // namespace dea::text
