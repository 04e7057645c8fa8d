// dea/text/run_tokenizer.hpp: the tokenizer of a training run, one of two behind the interface the D_alpha pairs,
// the masked-LM chunks and the Paris probe need:
//   * simple: the reference's word-level SimpleTokenizer (text/simple_tokenizer.hpp), its vocabulary built from the run's
//     training texts; [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0..4;
//   * wordpiece: BERT's WordPiece (text/wordpiece.hpp) over a given vocab.txt, whose size becomes the model's
//     vocabulary; pairs are encoded by the reference's own rule (reference_encode_pair: truncation one piece at a
//     time from the longer side, spans of A and B), as its D_alpha path does with the Hugging Face tokenizer. The
//     special tokens are the vocabulary's [PAD] [UNK] [CLS] [SEP] [MASK].
// Both save their vocabulary as one token per line (line n = id n), the run directory's tokenizer.txt, and load it
// back by kind.
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "wordpiece.hpp"
#include "../data/mlm.hpp"
#include "simple_tokenizer.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dea::data {

class RunTokenizer {
public:
  /// The SimpleTokenizer that knows only the special tokens.
  RunTokenizer() = default;
  /// A SimpleTokenizer (implicit: code that holds one passes it where a RunTokenizer is expected).
  RunTokenizer(SimpleTokenizer t) : simple_(std::move(t)) {}  // NOLINT
  /// A WordPiece tokenizer; its vocabulary must hold [PAD], [CLS], [SEP] and [MASK] besides [UNK] (dea::Error
  /// naming the vocabulary and the token).
  explicit RunTokenizer(text::WordPieceTokenizer t) : wp_(std::move(t)) {
    const text::Vocab& v = wp_->vocab();
    for (const std::string* s : {&wp_->options().pad_token, &wp_->options().cls_token, &wp_->options().sep_token,
                                 &wp_->options().mask_token})
      v.require(*s, "the D_alpha pairs and the masked-LM chunks");
    pad_ = wp_->pad_id();
    cls_ = wp_->cls_id();
    sep_ = wp_->sep_id();
    mask_ = v.find(wp_->options().mask_token);
  }

  /// "simple" or "wordpiece": the value of --tokenizer.
  const char* kind() const { return wp_ ? "wordpiece" : "simple"; }
  bool is_wordpiece() const { return wp_.has_value(); }
  const SimpleTokenizer& simple() const {
    check(!wp_, "RunTokenizer::simple: the tokenizer is WordPiece");
    return simple_;
  }
  const text::WordPieceTokenizer& wordpiece() const {
    check(wp_.has_value(), "RunTokenizer::wordpiece: the tokenizer is the SimpleTokenizer");
    return *wp_;
  }

  Index vocab_size() const {
    return wp_ ? static_cast<Index>(wp_->vocab().size()) : simple_.vocab_size();
  }
  /// The tokens in id order.
  const std::vector<std::string>& vocab() const { return wp_ ? wp_->vocab().tokens() : simple_.vocab(); }
  bool contains(const std::string& token) const { return wp_ ? wp_->vocab().contains(token) : simple_.contains(token); }

  std::int64_t pad_id() const { return wp_ ? pad_ : SimpleTokenizer::pad_id; }
  std::int64_t unk_id() const { return wp_ ? wp_->unk_id() : SimpleTokenizer::unk_id; }
  std::int64_t cls_id() const { return wp_ ? cls_ : SimpleTokenizer::cls_id; }
  std::int64_t sep_id() const { return wp_ ? sep_ : SimpleTokenizer::sep_id; }
  std::int64_t mask_id() const { return wp_ ? mask_ : SimpleTokenizer::mask_id; }

  /// The tokens (pieces) of `text`, without [CLS] / [SEP]. WordPiece: invalid UTF-8 is a dea::Error.
  std::vector<std::string> tokenize(std::string_view text) const {
    return wp_ ? wp_->tokenize(text) : simple_.tokenize(text);
  }
  /// The ids of the tokens of `text`, without [CLS] / [SEP].
  std::vector<std::int64_t> ids(std::string_view text) const {
    return wp_ ? wp_->encode(text) : simple_.convert_tokens_to_ids(simple_.tokenize(text));
  }

  /// [CLS] A [SEP] of at most max_len (>= 2) tokens.
  Encoding encode(std::string_view a, Index max_len) const {
    if (!wp_) return simple_.encode(a, max_len);
    check(max_len >= 2, "RunTokenizer::encode: max_len must be >= 2, got ", max_len);
    return convert(wp_->encode_single(a, static_cast<std::size_t>(max_len)));
  }
  /// [CLS] A [SEP] B [SEP] of at most max_len (>= 3) tokens by the reference's rule (pop the last token of the
  /// longer side, of A on a tie), with the spans of A and B.
  Encoding encode_pair(std::string_view a, std::string_view b, Index max_len) const {
    if (!wp_) return simple_.encode_pair(a, b, max_len);
    check(max_len >= 3, "RunTokenizer::encode_pair: max_len must be >= 3, got ", max_len);
    return convert(wp_->reference_encode_pair(a, b, static_cast<std::size_t>(max_len)));
  }

  /// Writes the vocabulary, one token per line (atomic write; for the SimpleTokenizer what its save() writes).
  void save(const std::string& path) const {
    std::string content;
    for (const std::string& t : vocab()) {
      content += t;
      content += '\n';
    }
    write_file_atomic(path, content);
  }

  /// Reads a vocabulary written by save() as the tokenizer `kind` ("simple" or "wordpiece"); dea::Error naming the
  /// file on a bad one.
  static RunTokenizer load(const std::string& path, const std::string& kind) {
    if (kind == "simple") return RunTokenizer(SimpleTokenizer::load(path));
    check(kind == "wordpiece", "RunTokenizer::load: kind must be 'simple' or 'wordpiece', got '", kind, "'");
    return RunTokenizer(text::WordPieceTokenizer(text::Vocab::load(path)));
  }

private:
  static Encoding convert(text::Encoding e) {
    Encoding out;
    out.tokens = std::move(e.tokens);
    out.input_ids = std::move(e.input_ids);
    out.token_type_ids = std::move(e.token_type_ids);
    out.attention_mask = std::move(e.attention_mask);
    out.span_a = {static_cast<Index>(e.span_a.first), static_cast<Index>(e.span_a.second)};
    out.span_b = {static_cast<Index>(e.span_b.first), static_cast<Index>(e.span_b.second)};
    return out;
  }

  SimpleTokenizer simple_;
  std::optional<text::WordPieceTokenizer> wp_;
  std::int64_t pad_ = 0, cls_ = 0, sep_ = 0, mask_ = 0;
};

/// The first position >= `from` at which the tokens `needle` occur in `hay` (a word's pieces in an encoding), or -1
/// (also for an empty needle).
inline Index find_span(const std::vector<std::string>& hay, const std::vector<std::string>& needle, Index from) {
  if (needle.empty()) return -1;
  for (Index i = std::max<Index>(from, 0); i + static_cast<Index>(needle.size()) <= static_cast<Index>(hay.size()); ++i)
    if (std::equal(needle.begin(), needle.end(), hay.begin() + i)) return i;
  return -1;
}

/// The padding id of the tokenizer (what the collation functions pad with).
inline std::int64_t pad_id_of(const RunTokenizer& t) { return t.pad_id(); }

/// The masked-LM chunks of `texts` in the tokenizer's ids, as [CLS] ... [SEP] (data/mlm.hpp).
inline std::vector<std::vector<std::int64_t>> make_mlm_chunks(const std::vector<std::string>& texts,
                                                              const RunTokenizer& tok, Index max_len) {
  return make_mlm_chunks(texts, [&tok](std::string_view t) { return tok.ids(t); }, tok.cls_id(), tok.sep_id(),
                         max_len);
}

/// The masking options (data/mlm.hpp) with the special ids of `tok`.
inline MlmOptions mlm_options(const RunTokenizer& tok) {
  MlmOptions o;
  o.pad_id = tok.pad_id();
  o.cls_id = tok.cls_id();
  o.sep_id = tok.sep_id();
  o.mask_id = tok.mask_id();
  return o;
}

}  // namespace dea::data
