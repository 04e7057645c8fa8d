// dea/data/mlm.hpp: masked-LM data from a local plain-text corpus, the offline equivalent of the reference's
// Wikipedia path (docs/training.md, data).
//
//  1. split_sentences: citation markers "[12]" become spaces; the text is cut into paragraphs at '\n'; a
//     paragraph is kept when it has more than 40 characters (code points); paragraphs are cut into sentences
//     after '.', '!' or '?' followed by whitespace; sentences of at least 4 words are kept.
//  2. split_texts: shuffle the sentences with Rng(seed), split 90 / 5 / 5 (train = int(0.9 n),
//     val up to int(0.95 n), test the rest, computed in double as the reference does); an empty part
//     takes the first 10 sentences of the shuffled list, as the reference does.
//  3. make_mlm_chunks: the token stream of a part (sentences in order) is cut into chunks of max_len - 2
//     tokens (the last chunk may be shorter), each wrapped as [CLS] ... [SEP].
//  4. collate_mlm: right padding; each real token other than [CLS]/[SEP] is selected with probability 0.15,
//     and a row with no selected token gets one chosen uniformly among its candidates; a selected token becomes
//     [MASK] with probability 0.8, a uniform random id in [5, vocab) with probability 0.1, and stays
//     unchanged with probability 0.1; labels hold the original id at selected positions and -100 elsewhere.
//     Optionally the oracle is mock_alpha over [B, T, T] with NaN wherever the query or the key is padding
//     (a random graded oracle that only exercises the plumbing).
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "dalpha.hpp"
#include "../core/files.hpp"
#include "random.hpp"
#include "../text/simple_tokenizer.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace dea::data {

namespace detail {

inline bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

inline std::size_t count_words(std::string_view s) {
  std::size_t n = 0;
  bool in_word = false;
  for (char c : s) {
    const bool sp = ascii_space(c);
    if (!sp && !in_word) ++n;
    in_word = !sp;
  }
  return n;
}

inline std::size_t count_code_points(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

/// Replaces every "[digits]" (a citation marker) by one space.
inline std::string strip_citations(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') {
      std::size_t j = i + 1;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      if (j > i + 1 && j < text.size() && text[j] == ']') {
        out += ' ';
        i = j;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

}  // namespace detail

/// Sentences of a plain text (rules in the file comment).
inline std::vector<std::string> split_sentences(std::string_view text, std::size_t min_words = 4,
                                                std::size_t min_paragraph_chars = 40) {
  const std::string clean = detail::strip_citations(text);
  std::vector<std::string> out;
  for (const std::string& raw_para : split_lines(clean)) {
    const std::string_view para = trim(raw_para);
    if (detail::count_code_points(para) <= min_paragraph_chars) continue;
    auto emit = [&](std::string_view piece) {
      const std::string_view sent = trim(piece);
      if (detail::count_words(sent) >= min_words) out.emplace_back(sent);
    };
    std::size_t start = 0, i = 0;
    while (i < para.size()) {
      const char c = para[i];
      if ((c == '.' || c == '!' || c == '?') && i + 1 < para.size() && detail::ascii_space(para[i + 1])) {
        emit(para.substr(start, i + 1 - start));  // the sentence keeps its final punctuation
        std::size_t j = i + 1;
        while (j < para.size() && detail::ascii_space(para[j])) ++j;
        start = i = j;
        continue;
      }
      ++i;
    }
    emit(para.substr(start));
  }
  return out;
}

/// The start of `text` that holds its first `n` documents, a document being a line that is not blank (the
/// layout of a one-document-per-line corpus); n = 0: all of it.
inline std::string_view first_documents(std::string_view text, std::size_t n) {
  if (n == 0) return text;
  std::size_t docs = 0, start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    if (!trim(text.substr(start, end - start)).empty() && ++docs == n) return text.substr(0, end);
    start = end + 1;
  }
  return text;
}

/// Sentences of a plain-text file (UTF-8) or of its first `max_docs` documents (first_documents; 0 = all); a missing
/// file is a dea::Error naming it.
inline std::vector<std::string> read_text_corpus(const std::string& path, std::size_t min_words = 4,
                                                 std::size_t min_paragraph_chars = 40, std::size_t max_docs = 0) {
  const std::string text = read_file(path);
  return split_sentences(first_documents(text, max_docs), min_words, min_paragraph_chars);
}

struct TextSplits {
  std::vector<std::string> train, val, test;
};

/// Shuffles the sentences with Rng(seed) and splits them 90 / 5 / 5 (see the file comment).
inline TextSplits split_texts(std::vector<std::string> sentences, std::uint64_t seed = 42) {
  check(!sentences.empty(), "split_texts: no sentences (is the corpus empty or are all paragraphs too short?)");
  Rng rng(seed);
  shuffle(sentences, rng);
  const std::size_t n = sentences.size();
  const auto a = static_cast<std::size_t>(0.9 * static_cast<double>(n));
  const auto b = static_cast<std::size_t>(0.95 * static_cast<double>(n));
  TextSplits s;
  s.train.assign(sentences.begin(), sentences.begin() + static_cast<std::ptrdiff_t>(a));
  s.val.assign(sentences.begin() + static_cast<std::ptrdiff_t>(a), sentences.begin() + static_cast<std::ptrdiff_t>(b));
  s.test.assign(sentences.begin() + static_cast<std::ptrdiff_t>(b), sentences.end());
  const std::vector<std::string> head(sentences.begin(),
                                      sentences.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(10, n)));
  for (auto* part : {&s.train, &s.val, &s.test})
    if (part->empty()) *part = head;
  return s;
}

/// Token-id chunks of max_len - 2 tokens (the last may be shorter), each as cls ... sep; `ids(text)` gives the token
/// ids of a text (any tokenizer's: RunTokenizer::ids).
template <class Ids>
std::vector<std::vector<std::int64_t>> make_mlm_chunks(const std::vector<std::string>& texts, const Ids& ids,
                                                       std::int64_t cls, std::int64_t sep, Index max_len) {
  check(max_len >= 3, "make_mlm_chunks: max_len must be >= 3, got ", max_len);
  const std::size_t L = static_cast<std::size_t>(max_len - 2);
  std::vector<std::vector<std::int64_t>> chunks;
  std::vector<std::int64_t> buf;
  auto emit = [&](std::size_t count) {
    std::vector<std::int64_t> c;
    c.reserve(count + 2);
    c.push_back(cls);
    c.insert(c.end(), buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(count));
    c.push_back(sep);
    chunks.push_back(std::move(c));
    buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(count));
  };
  for (const std::string& t : texts) {
    for (const std::int64_t id : ids(t)) buf.push_back(id);
    while (buf.size() >= L) emit(L);
  }
  if (!buf.empty()) emit(buf.size());
  return chunks;
}

/// The chunks of the SimpleTokenizer's ids, as [CLS] ... [SEP].
inline std::vector<std::vector<std::int64_t>> make_mlm_chunks(const std::vector<std::string>& texts,
                                                              const SimpleTokenizer& tok, Index max_len) {
  return make_mlm_chunks(
      texts, [&tok](std::string_view t) { return tok.convert_tokens_to_ids(tok.tokenize(t)); },
      SimpleTokenizer::cls_id, SimpleTokenizer::sep_id, max_len);
}

struct MlmOptions {
  double mlm_prob = 0.15;
  bool mock_oracle = true;  ///< fill alpha_oracle with mock_alpha (NaN on padding); false: leave it empty
  /// The tokenizer's special ids (default: the SimpleTokenizer's; run_tokenizer.hpp's mlm_options(tok) gives those
  /// of a run's tokenizer)
  std::int64_t pad_id = SimpleTokenizer::pad_id, cls_id = SimpleTokenizer::cls_id, sep_id = SimpleTokenizer::sep_id,
               mask_id = SimpleTokenizer::mask_id;
  /// A "random" replacement is a uniform id in [random_id_begin, vocab) (the reference's [5, vocab))
  std::int64_t random_id_begin = SimpleTokenizer::num_special;
};


/// One collated masked-LM batch.
template <class S>
struct MlmBatch {
  Tensor<std::int64_t> input_ids;       ///< [B, T] after masking
  Tensor<std::int64_t> token_type_ids;  ///< [B, T], zeros
  Tensor<std::uint8_t> attention_mask;  ///< [B, T], 1 = real token
  Tensor<std::int64_t> labels;          ///< [B, T], original id at selected positions, -100 elsewhere
  Tensor<S> alpha_oracle;               ///< [B, T, T] (mock) or empty
};

/// Collates chunks[idx[...]] with masking (rules in the file comment). Random draws, all from `rng`, in this
/// order: the selection uniform of every cell (row-major), the forced pick of rows without a selection, the
/// 80/10/10 uniform of every cell, the random ids of "random" cells, then the mock oracle.
template <class S>
MlmBatch<S> collate_mlm(const std::vector<std::vector<std::int64_t>>& chunks, const std::vector<std::size_t>& idx,
                        Index vocab_size, Rng& rng, const MlmOptions& opt = {}) {
  check(!idx.empty(), "collate_mlm: empty batch");
  check(opt.random_id_begin >= 0 && vocab_size > opt.random_id_begin, "collate_mlm: vocab_size must exceed ",
        opt.random_id_begin, " (the random replacements are ids from ", opt.random_id_begin, " on), got ", vocab_size);
  check(opt.mlm_prob >= 0 && opt.mlm_prob <= 1, "collate_mlm: mlm_prob must be in [0, 1], got ", opt.mlm_prob);
  Index T = 0;
  for (std::size_t i : idx) {
    check(i < chunks.size(), "collate_mlm: chunk index ", i, " out of range (", chunks.size(), " chunks)");
    T = std::max(T, static_cast<Index>(chunks[i].size()));
  }
  check(T > 0, "collate_mlm: all chunks are empty");
  const Index B = static_cast<Index>(idx.size());
  MlmBatch<S> out;
  out.input_ids = Tensor<std::int64_t>({B, T}, opt.pad_id);
  out.token_type_ids = Tensor<std::int64_t>({B, T}, 0);
  out.attention_mask = Tensor<std::uint8_t>({B, T}, 0);
  out.labels = Tensor<std::int64_t>({B, T}, -100);
  for (Index b = 0; b < B; ++b) {
    const auto& c = chunks[idx[static_cast<std::size_t>(b)]];
    for (std::size_t t = 0; t < c.size(); ++t) {
      out.input_ids[b * T + static_cast<Index>(t)] = c[t];
      out.attention_mask[b * T + static_cast<Index>(t)] = 1;
    }
  }
  const Index n = B * T;
  auto candidate = [&](Index k) {
    const std::int64_t id = out.input_ids[k];
    return out.attention_mask[k] != 0 && id != opt.cls_id && id != opt.sep_id;
  };
  std::vector<std::uint8_t> pick(static_cast<std::size_t>(n), 0);
  for (Index k = 0; k < n; ++k) pick[static_cast<std::size_t>(k)] = (rng.uniform() < opt.mlm_prob) && candidate(k);
  for (Index b = 0; b < B; ++b) {
    std::vector<Index> cand;
    bool any = false;
    for (Index t = 0; t < T; ++t) {
      any = any || pick[static_cast<std::size_t>(b * T + t)];
      if (candidate(b * T + t)) cand.push_back(b * T + t);
    }
    if (!any && !cand.empty()) pick[static_cast<std::size_t>(cand[random_index(rng, cand.size())])] = 1;
  }
  std::vector<double> r(static_cast<std::size_t>(n));
  for (auto& v : r) v = rng.uniform();
  for (Index k = 0; k < n; ++k) {
    if (!pick[static_cast<std::size_t>(k)]) continue;
    out.labels[k] = out.input_ids[k];
    const double u = r[static_cast<std::size_t>(k)];
    if (u < 0.8) out.input_ids[k] = opt.mask_id;
  }
  for (Index k = 0; k < n; ++k) {
    const double u = r[static_cast<std::size_t>(k)];
    if (pick[static_cast<std::size_t>(k)] && u >= 0.8 && u < 0.9)
      out.input_ids[k] = opt.random_id_begin +
                         static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(vocab_size - opt.random_id_begin)));
  }
  if (opt.mock_oracle) {
    out.alpha_oracle = mock_alpha<S>({B, T, T}, rng);
    for (Index b = 0; b < B; ++b)
      for (Index i = 0; i < T; ++i)
        for (Index j = 0; j < T; ++j)
          if (!out.attention_mask[b * T + i] || !out.attention_mask[b * T + j])
            out.alpha_oracle[(b * T + i) * T + j] = std::numeric_limits<S>::quiet_NaN();
  }
  return out;
}

}  // namespace dea::data
