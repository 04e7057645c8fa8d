// dea/text/hf_tokenizer.hpp: the WordPiece tokenizer of a Hugging Face BERT model directory.
//
// The directory must hold vocab.txt (text/vocab.hpp reads it). When it also holds tokenizer_config.json (as hub
// directories do), its normaliser settings are taken from there, as transformers' BertTokenizer(Fast) takes them:
//   do_lower_case           bool, default true
//   strip_accents           bool or null (null / absent: follow do_lower_case)
//   tokenize_chinese_chars  bool, default true
//   tokenizer_class         when present, "BertTokenizer" or "BertTokenizerFast"; anything else is refused by name
// Other keys (model_max_length, the special-token strings of bert-base-uncased, ...) are not read: the special
// tokens are [PAD] [UNK] [CLS] [SEP] [MASK]. A directory with a SentencePiece model and no vocab.txt (DeBERTa-v3,
// XLM-R) or only a tokenizer.json is refused with a message saying so.
//
//   const auto tok = dea::bert::load_hf_tokenizer("models/all-MiniLM-L6-v2");
//   dea::bert::check_tokenizer_fits(tok, cfg, "models/all-MiniLM-L6-v2");  // every id < vocab_size
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../io/json_limits.hpp"
#include "wordpiece.hpp"
#include "../bert/config.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <system_error>

namespace dea {
namespace bert {

/// Reads the normaliser settings of a tokenizer_config.json (see the file comment) into `opt`.
inline void apply_tokenizer_config(const nlohmann::json& j, text::WordPieceOptions& opt, const std::string& source) {
  check(j.is_object(), source, ": expected a JSON object, got ", j.type_name());
  auto flag = [&](const char* key, bool fallback) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    check(it->is_boolean(), source, ": ", key, ": expected true or false, got ", it->dump());
    return it->get<bool>();
  };
  if (const auto it = j.find("tokenizer_class"); it != j.end() && !it->is_null()) {
    check(it->is_string(), source, ": tokenizer_class: expected a string, got ", it->dump());
    const std::string cls = it->get<std::string>();
    check(cls == "BertTokenizer" || cls == "BertTokenizerFast", source, ": tokenizer_class \"", cls,
          "\" is not BERT's WordPiece (BertTokenizer or BertTokenizerFast); this library reads WordPiece only");
  }
  opt.normalizer.lowercase = flag("do_lower_case", true);
  opt.normalizer.handle_chinese_chars = flag("tokenize_chinese_chars", true);
  if (const auto it = j.find("strip_accents"); it != j.end() && !it->is_null()) {
    check(it->is_boolean(), source, ": strip_accents: expected true, false or null, got ", it->dump());
    opt.normalizer.strip_accents = it->get<bool>();
  }
}

/// The WordPiece tokenizer of the model directory `dir` (see the file comment).
inline text::WordPieceTokenizer load_hf_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d(dir);
  const std::string what = "Hugging Face model directory '" + dir + "'";
  check(fs::is_directory(d, ec), what, fs::exists(d, ec) ? " is not a directory" : " does not exist");
  const fs::path vocab = d / "vocab.txt";
  if (!fs::is_regular_file(vocab, ec)) {
    for (const char* spm : {"spm.model", "sentencepiece.bpe.model", "tokenizer.model"})
      check(!fs::exists(d / spm, ec), what, " holds a SentencePiece model (", spm, ") and no vocab.txt: its tokenizer "
            "is not BERT's WordPiece (a DeBERTa-v2/v3 directory's is read by text::SpmTokenizer, and dea oracle --nli "
            "takes such a directory)");
    check(!fs::exists(d / "tokenizer.json", ec), what, " holds tokenizer.json but no vocab.txt: write the WordPiece "
          "vocabulary out (tokenizer.save_pretrained writes vocab.txt for a BERT tokenizer)");
    ::dea::detail::raise(::dea::detail::concat(what, " has no vocab.txt (expected '", vocab.string(), "')"));
  }
  text::WordPieceOptions opt;
  const fs::path tc = d / "tokenizer_config.json";
  if (fs::is_regular_file(tc, ec)) {
    const std::string source = "tokenizer_config.json '" + tc.string() + "'";
    apply_tokenizer_config(io::parse_json_limited(read_file(tc.string(), kMaxConfigBytes), source), opt, source);
  }
  return text::WordPieceTokenizer::from_file(vocab.string(), opt);
}

/// Checks that every id `tok` can produce is a row of the model's word embeddings (vocab.txt no longer than
/// vocab_size; a shorter one is fine, as hub checkpoints pad vocab_size) and that [CLS] and [SEP] exist.
inline void check_tokenizer_fits(const text::WordPieceTokenizer& tok, const BertConfig& cfg, const std::string& dir) {
  check(static_cast<Index>(tok.vocab().size()) <= cfg.vocab_size, "model directory '", dir, "': vocab.txt has ",
        tok.vocab().size(), " tokens but config.json's vocab_size is ", cfg.vocab_size,
        " (the vocabulary belongs to another model)");
  (void)tok.cls_id();
  (void)tok.sep_id();
}

}  // namespace bert
}  // namespace dea
