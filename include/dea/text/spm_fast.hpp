// dea/text/spm_fast.hpp: the fast SentencePiece pipeline, as Hugging Face's tokenizers runs the tokenizer.json that
// transformers' DeBERTa-v2 converter builds from a model file (what AutoTokenizer loads for a DeBERTa-v3 directory).
//
// Why our own code and not the sentencepiece library: the converted pipeline is not sentencepiece's. It normalises
// per grapheme cluster with the shortest match of the character map (the library: per code point, longest match), it
// strips Unicode whitespace before normalising, its unigram lattice holds every vocabulary entry (control and byte
// pieces included, which the library never matches), it sums scores in double, and a run of characters outside the
// vocabulary becomes one unknown token instead of byte pieces. The library gives the pieces and their scores
// (text/spm_tokenizer.hpp); the steps here reproduce the converted pipeline over them:
//   1. strip: leading and trailing characters with the Unicode White_Space property are removed;
//   2. precompiled: (when the model has a character map) the text is cut into extended grapheme clusters
//      (text/spm_grapheme.hpp); a cluster shorter than 6 bytes with a key of the map at its start is replaced as a
//      whole by the replacement of the shortest such key; otherwise each code point is replaced by its own key's
//      replacement or kept;
//   3. every run of two or more U+0020 becomes one;
//   4. metaspace: U+0020 becomes U+2581 "▁", one "▁" is put in front unless the text starts with one (when the model
//      adds a dummy prefix), and the text is cut before every "▁" into words;
//   5. unigram, per word: the best-scoring segmentation into vocabulary entries (Viterbi over byte positions that
//      start characters; candidates at a position tried shortest first, a later one replaces an earlier one only when
//      strictly better); where no entry covers exactly the one character at a position, an unknown node of that
//      character with score min(all scores) - 10 is added; adjacent unknown nodes of the best path merge into one
//      token with the unknown id, whose string is the text it covers.
// Standard library only (the input must be valid UTF-8; text/spm_tokenizer.hpp checks it).
#pragma once

#include "../core/error.hpp"
#include "../core/utf8.hpp"
#include "spm_grapheme.hpp"
#include "spm_model_file.hpp"
#include "unicode.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dea::text::spm {

/// "▁" (U+2581), SentencePiece's visible space.
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";

/// Steps 1-3 of the file comment: the fast pipeline's normalised text of `text` (valid UTF-8).
inline std::string fast_normalize(std::string_view text, const Charsmap& map) {
  // 1. strip Unicode whitespace at both ends
  std::size_t begin = 0, end = text.size();
  while (begin < end) {
    char32_t c = 0;
    const std::size_t n = utf8::decode(text, begin, c);
    if (!unicode::is_whitespace(c)) break;
    begin += n;
  }
  while (end > begin) {
    std::size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    char32_t c = 0;
    (void)utf8::decode(text, start, c);
    if (!unicode::is_whitespace(c)) break;
    end = start;
  }
  const std::string_view s = text.substr(begin, end - begin);
  // 2. the character map, per grapheme cluster
  std::string mapped;
  if (map.empty()) {
    mapped = std::string(s);
  } else {
    std::u32string cps;
    std::vector<std::size_t> byte_at;  // byte offset in s of each code point, then s.size()
    for (std::size_t i = 0; i < s.size();) {
      char32_t c = 0;
      byte_at.push_back(i);
      i += utf8::decode(s, i, c);
      cps += c;
    }
    byte_at.push_back(s.size());
    const std::vector<std::size_t> breaks = grapheme_breaks(cps);
    mapped.reserve(s.size());
    for (std::size_t g = 0; g + 1 < breaks.size(); ++g) {
      const std::size_t cb = byte_at[breaks[g]], ce = byte_at[breaks[g + 1]];
      const std::string_view cluster = s.substr(cb, ce - cb);
      if (cluster.size() < 6) {
        if (const auto m = map.shortest(cluster)) {
          mapped += m->second;
          continue;
        }
      }
      for (std::size_t k = breaks[g]; k < breaks[g + 1]; ++k) {
        const std::string_view ch = s.substr(byte_at[k], byte_at[k + 1] - byte_at[k]);
        const auto m = map.shortest(ch);
        if (m && m->first == ch.size()) mapped += m->second;
        else mapped += ch;
      }
    }
  }
  // 3. runs of spaces become one
  std::string out;
  out.reserve(mapped.size());
  for (std::size_t i = 0; i < mapped.size(); ++i)
    if (!(mapped[i] == ' ' && i > 0 && mapped[i - 1] == ' ')) out += mapped[i];
  return out;
}

/// Step 4 of the file comment: the words of the normalised text `normalized` (each starts with "▁" but perhaps the
/// first when `add_prefix` is false); an empty text has none.
inline std::vector<std::string> metaspace_words(std::string_view normalized, bool add_prefix) {
  std::string t;
  if (normalized.empty()) return {};
  for (const char c : normalized) {
    if (c == ' ') t += kMetaspace;
    else t += c;
  }
  if (add_prefix && t.compare(0, kMetaspace.size(), kMetaspace) != 0) t.insert(0, kMetaspace);
  std::vector<std::string> words;
  std::size_t start = 0;
  for (std::size_t i = 1; i + kMetaspace.size() <= t.size(); ++i) {
    if (t.compare(i, kMetaspace.size(), kMetaspace) == 0 && i > start) {
      words.push_back(t.substr(start, i - start));
      start = i;
    }
  }
  words.push_back(t.substr(start));
  return words;
}

/// A token of the fast pipeline: its id and its string (the vocabulary entry, or for an unknown run its text).
struct FastToken {
  std::int64_t id;
  std::string token;
};

/// Step 5 of the file comment: the unigram model of the fast pipeline over a vocabulary given in id order.
class FastUnigram {
public:
  FastUnigram() = default;
  /// `pieces[i]` and `scores[i]` are entry i; `unk_id` indexes the unknown entry. A piece that occurs twice maps to
  /// its last id (as the converted vocabulary does).
  FastUnigram(std::vector<std::string> pieces, const std::vector<double>& scores, std::int64_t unk_id)
      : pieces_(std::move(pieces)), scores_(scores), unk_id_(unk_id) {
    check(pieces_.size() == scores_.size() && !pieces_.empty(), "FastUnigram: ", pieces_.size(), " pieces and ",
          scores_.size(), " scores (equal and non-zero expected)");
    check(unk_id >= 0 && static_cast<std::size_t>(unk_id) < pieces_.size(), "FastUnigram: unk_id ", unk_id,
          " outside the ", pieces_.size(), " pieces");
    double lo = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      if (!pieces_[i].empty()) {
        ids_[pieces_[i]] = static_cast<std::int64_t>(i);
        max_len_ = std::max(max_len_, pieces_[i].size());
      }
      lo = std::min(lo, scores_[i]);
    }
    unk_score_ = lo - 10.0;
  }

  std::size_t size() const { return pieces_.size(); }

  /// Appends the tokens of one word (valid UTF-8) to `out`.
  void encode_word(std::string_view word, std::vector<FastToken>& out) const {
    struct Node {
      double score = 0;
      std::size_t start = 0;
      std::int64_t id = -1;  // -1: not reached yet
    };
    const std::size_t n = word.size();
    std::vector<Node> best(n + 1);
    best[0].id = 0;  // (the start: reached, score 0)
    for (std::size_t at = 0; at < n;) {
      char32_t c = 0;
      const std::size_t clen = utf8::decode(word, at, c);
      const double here = best[at].score;
      bool single = false;
      const std::size_t longest = std::min(max_len_, n - at);
      for (std::size_t len = 1; len <= longest; ++len) {
        const auto it = ids_.find(std::string(word.substr(at, len)));
        if (it == ids_.end()) continue;
        Node& target = best[at + len];
        const double cand = here + scores_[static_cast<std::size_t>(it->second)];
        if (target.id < 0 || cand > target.score) target = {cand, at, it->second};
        if (len == clen) single = true;
      }
      if (!single) {
        Node& target = best[at + clen];
        const double cand = here + unk_score_;
        if (target.id < 0 || cand > target.score) target = {cand, at, unk_id_};
      }
      at += clen;
    }
    // back from the end; the texts of adjacent unknown nodes join into one token. Each token's id is then that of
    // its string (so a joined unknown text that happens to be an entry gets the entry's id, as in the converted
    // pipeline), or the unknown id.
    std::vector<std::string> tokens;
    std::string unknown;  // the joined text of the unknown nodes met so far (in reverse order of nodes)
    std::vector<std::string_view> unknown_parts;
    auto flush = [&] {
      if (unknown_parts.empty()) return;
      unknown.clear();
      for (auto it = unknown_parts.rbegin(); it != unknown_parts.rend(); ++it) unknown += *it;
      tokens.push_back(unknown);
      unknown_parts.clear();
    };
    for (std::size_t end = n; end > 0;) {
      const Node& node = best[end];
      if (node.id == unk_id_) {
        unknown_parts.push_back(word.substr(node.start, end - node.start));
      } else {
        flush();
        tokens.push_back(pieces_[static_cast<std::size_t>(node.id)]);
      }
      end = node.start;
    }
    flush();
    for (auto it = tokens.rbegin(); it != tokens.rend(); ++it) {
      const auto found = ids_.find(*it);
      out.push_back({found == ids_.end() ? unk_id_ : found->second, std::move(*it)});
    }
  }

private:
  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  std::unordered_map<std::string, std::int64_t> ids_;
  std::size_t max_len_ = 0;
  std::int64_t unk_id_ = 0;
  double unk_score_ = 0;
};

}  // namespace dea::text::spm
