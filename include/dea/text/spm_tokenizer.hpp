// dea/text/spm_tokenizer.hpp: the SentencePiece tokenizer of DeBERTa-v2/v3 model directories, in two modes.
//
//   fast  what transformers' AutoTokenizer loads for such a directory (DebertaV2TokenizerFast: Hugging Face's
//         tokenizers running the pipeline transformers converts from spm.model); what the NLI oracle uses.
//         text/spm_fast.hpp computes it over the pieces the sentencepiece library reads from the model.
//   slow  DebertaV2Tokenizer: the sentencepiece library's own encoding (with byte fallback: a character outside the
//         vocabulary becomes its UTF-8 bytes as <0xHH> pieces).
// Both split the five special-token strings out of the raw text first ([PAD] [CLS] [SEP] [UNK] [MASK], exact and
// case-sensitive, left to right; each becomes its own token) and tokenise the text between them on its own. The
// modes differ on characters outside the vocabulary (one [UNK] per run in fast), on text that normalises to a control
// or byte piece (fast matches it), on whitespace and zero-width characters at the ends of a text, on some grapheme
// clusters, and on pair truncation at odd budgets; docs/spm_tokenizer.md lists the differences.
//
// Encodings: encode(a) is [CLS] A [SEP] (token types 0), encode_pair(a, b) is [CLS] A [SEP] B [SEP] (types 0 through
// the first [SEP], then 1); attention_mask is all 1. max_length (0: none) counts the special tokens; truncation is
// longest-first (spm_pair_lengths): a single text keeps its first max_length - 2 tokens.
//
// Input: a DeBERTa model directory, which must hold spm.model and may hold tokenizer_config.json (do_lower_case and
// split_by_punct must be false; tokenizer_class, when given, a DeBERTa-v2 tokenizer), special_tokens_map.json (the
// special-token strings) and added_tokens.json ({"[MASK]": id}; tokenizer_config.json's added_tokens_decoder is read
// too); or the path of a bare model file (then the defaults: the five strings above, [MASK] = number of pieces).
//
// The sentencepiece library is optional: programs built without it (DEA_HAVE_SENTENCEPIECE undefined) get the same
// API, whose constructor refuses with a message saying how to build with it. The header-only core never includes
// this file.
//
//   const dea::text::SpmTokenizer tok("models/deberta-v3-base-mnli", dea::text::SpmMode::fast);
//   const dea::text::Encoding e = tok.encode_pair(premise, hypothesis, 256);
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../io/json_limits.hpp"
#include "spm_fast.hpp"
#include "spm_model_file.hpp"
#include "unicode.hpp"
#include "wordpiece.hpp"  // text::Encoding

#include <nlohmann/json.hpp>

#if defined(DEA_HAVE_SENTENCEPIECE)
#include <sentencepiece_processor.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace dea::text {

/// Whether this program was built with the sentencepiece library.
#if defined(DEA_HAVE_SENTENCEPIECE)
inline constexpr bool kHaveSentencePiece = true;
#else
inline constexpr bool kHaveSentencePiece = false;
#endif

/// What a program built without the sentencepiece library says when asked for a SentencePiece tokenizer.
inline std::string spm_unavailable_message(const std::string& what) {
  return ::dea::detail::concat(what, " needs the SentencePiece tokenizer, but this program was built without the "
                               "sentencepiece library: install it (Debian: apt-get install libsentencepiece-dev, or "
                               "bash cmake/install_deps.sh), configure again (CMake then reports \"SentencePiece "
                               "found\") and rebuild");
}

/// The two tokenisation modes (see the file comment).
enum class SpmMode { fast, slow };

inline const char* to_string(SpmMode m) { return m == SpmMode::fast ? "fast" : "slow"; }
/// "fast" or "slow"; anything else is a dea::Error naming the choices.
inline SpmMode parse_spm_mode(std::string_view s) {
  if (s == "fast") return SpmMode::fast;
  check(s == "slow", "SentencePiece tokenizer mode '", s, "': expected 'fast' or 'slow'");
  return SpmMode::slow;
}

/// Longest-first truncation of a pair of n1 and n2 tokens to `budget` tokens in all (the special tokens already
/// taken off): the numbers of tokens A and B keep, from their starts.
///   fast: nothing is cut when n1 + n2 <= budget; else the shorter text (A on a tie) is kept whole when
///         2 * n_shorter <= budget and the longer keeps the rest; else the shorter keeps floor(budget / 2) and the
///         longer ceil(budget / 2).
///   slow: one token at a time comes off the end of the longer text (B on a tie), so when both are cut A keeps
///         ceil(budget / 2) and B floor(budget / 2).
inline std::pair<std::size_t, std::size_t> spm_pair_lengths(std::size_t n1, std::size_t n2, std::size_t budget,
                                                            SpmMode mode) {
  if (n1 + n2 <= budget) return {n1, n2};
  if (mode == SpmMode::fast) {
    const bool a_shorter = n1 <= n2;
    const std::size_t shorter = a_shorter ? n1 : n2;
    std::size_t keep_short = shorter, keep_long = budget - shorter;
    if (2 * shorter > budget) {
      keep_short = budget / 2;
      keep_long = budget - keep_short;
    }
    return a_shorter ? std::make_pair(keep_short, keep_long) : std::make_pair(keep_long, keep_short);
  }
  // slow: the longer loses tokens until both fit; from equal lengths on they alternate, B first
  std::size_t a = n1, b = n2;
  if (a > b) a -= std::min(a - b, a + b - budget);
  else if (b > a) b -= std::min(b - a, a + b - budget);
  const std::size_t excess = a + b - std::min(a + b, budget);  // left to remove with a == b
  b -= (excess + 1) / 2;
  a -= excess / 2;
  return {a, b};
}

/// A token: its id and its string (a piece, a special token, or in fast mode the text of an unknown run).
struct SpmToken {
  std::int64_t id;
  std::string token;
};

/// The settings read from a model directory besides spm.model (see the file comment).
struct SpmDirectorySettings {
  std::string pad_token = "[PAD]", cls_token = "[CLS]", sep_token = "[SEP]", unk_token = "[UNK]",
              mask_token = "[MASK]";
  std::map<std::string, std::int64_t> added;  ///< added tokens (added_tokens.json, added_tokens_decoder): string -> id
};

namespace detail {

/// A special-token string of special_tokens_map.json / tokenizer_config.json: a string or {"content": string}.
inline void read_token_string(const nlohmann::json& j, const char* key, std::string& out, const std::string& source) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_object() && it->contains("content")) {
    const auto& c = (*it)["content"];
    check(c.is_string() && !c.get<std::string>().empty(), source, ": ", key, ".content: expected a non-empty string");
    out = c.get<std::string>();
    return;
  }
  check(it->is_string() && !it->get<std::string>().empty(), source, ": ", key,
        ": expected a non-empty string or {\"content\": string}, got ", it->dump());
  out = it->get<std::string>();
}

inline void check_added_id(std::int64_t id, const std::string& token, const std::string& source) {
  check(id >= 0 && id < (std::int64_t(1) << 24), source, ": added token '", token, "' has id ", id,
        " (expected 0 .. 16777215)");
}

/// Reads tokenizer_config.json, special_tokens_map.json and added_tokens.json of directory `d` where present.
inline SpmDirectorySettings read_spm_directory(const std::filesystem::path& d) {
  namespace fs = std::filesystem;
  std::error_code ec;
  SpmDirectorySettings s;
  constexpr std::size_t kMaxJson = std::size_t(1) << 24;
  auto load = [&](const fs::path& p, const std::string& source) {
    return io::parse_json_limited(read_file(p.string(), kMaxJson), source);
  };
  const fs::path tc = d / "tokenizer_config.json";
  if (fs::is_regular_file(tc, ec)) {
    const std::string source = "tokenizer_config.json '" + tc.string() + "'";
    const nlohmann::json j = load(tc, source);
    check(j.is_object(), source, ": expected a JSON object, got ", j.type_name());
    for (const char* key : {"do_lower_case", "split_by_punct"}) {
      const auto it = j.find(key);
      if (it == j.end() || it->is_null()) continue;
      check(it->is_boolean(), source, ": ", key, ": expected true or false, got ", it->dump());
      check(!it->get<bool>(), source, ": ", key, " is true; only DeBERTa-v3's setting (false) is supported");
    }
    if (const auto it = j.find("tokenizer_class"); it != j.end() && !it->is_null()) {
      check(it->is_string(), source, ": tokenizer_class: expected a string, got ", it->dump());
      const std::string cls = it->get<std::string>();
      check(cls == "DebertaV2Tokenizer" || cls == "DebertaV2TokenizerFast", source, ": tokenizer_class \"", cls,
            "\" is not DeBERTa-v2/v3's SentencePiece tokenizer (DebertaV2Tokenizer or DebertaV2TokenizerFast)");
    }
    for (const auto& [key, out] : {std::pair<const char*, std::string*>{"pad_token", &s.pad_token},
                                   {"cls_token", &s.cls_token}, {"sep_token", &s.sep_token},
                                   {"unk_token", &s.unk_token}, {"mask_token", &s.mask_token}})
      read_token_string(j, key, *out, source);
    if (const auto it = j.find("added_tokens_decoder"); it != j.end() && !it->is_null()) {
      check(it->is_object(), source, ": added_tokens_decoder: expected an object, got ", it->type_name());
      for (const auto& [key, v] : it->items()) {
        std::int64_t id = -1;
        try {
          std::size_t used = 0;
          id = std::stoll(key, &used);
          check(used == key.size(), "");
        } catch (const std::exception&) {
          ::dea::detail::raise(::dea::detail::concat(source, ": added_tokens_decoder: key '", key, "' is not an id"));
        }
        check(v.is_object() && v.contains("content") && v["content"].is_string(), source, ": added_tokens_decoder.",
              key, ": expected {\"content\": string, ...}");
        check_added_id(id, v["content"].get<std::string>(), source);
        s.added[v["content"].get<std::string>()] = id;
      }
    }
  }
  const fs::path sm = d / "special_tokens_map.json";
  if (fs::is_regular_file(sm, ec)) {
    const std::string source = "special_tokens_map.json '" + sm.string() + "'";
    const nlohmann::json j = load(sm, source);
    check(j.is_object(), source, ": expected a JSON object, got ", j.type_name());
    for (const auto& [key, out] : {std::pair<const char*, std::string*>{"pad_token", &s.pad_token},
                                   {"cls_token", &s.cls_token}, {"sep_token", &s.sep_token},
                                   {"unk_token", &s.unk_token}, {"mask_token", &s.mask_token}})
      read_token_string(j, key, *out, source);
  }
  const fs::path at = d / "added_tokens.json";
  if (fs::is_regular_file(at, ec)) {
    const std::string source = "added_tokens.json '" + at.string() + "'";
    const nlohmann::json j = load(at, source);
    check(j.is_object(), source, ": expected a JSON object {\"token\": id}, got ", j.type_name());
    for (const auto& [token, v] : j.items()) {
      check(v.is_number_integer(), source, ": '", token, "': expected an integer id, got ", v.dump());
      check(!token.empty(), source, ": an added token is the empty string");
      check_added_id(v.get<std::int64_t>(), token, source);
      s.added[token] = v.get<std::int64_t>();
    }
  }
  return s;
}

}  // namespace detail

/// The SentencePiece tokenizer of a DeBERTa-v2/v3 model directory or model file (see the file comment).
class SpmTokenizer {
public:
  /// Loads `model_or_dir` (a directory holding spm.model, or a model file) for `mode`. dea::Error naming the file
  /// and the field on a bad one (a directory without spm.model, a model that is not a unigram SentencePiece model,
  /// a missing special piece, ...), or, in a program built without the sentencepiece library, saying so.
  explicit SpmTokenizer(const std::string& model_or_dir, SpmMode mode = SpmMode::fast) : mode_(mode) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path p(model_or_dir);
    std::string model_file = model_or_dir, what = "SentencePiece model '" + model_or_dir + "'";
    SpmDirectorySettings settings;
    if (fs::is_directory(p, ec)) {
      const fs::path m = p / "spm.model";
      check(fs::is_regular_file(m, ec), "DeBERTa model directory '", model_or_dir, "' has no spm.model (its "
            "SentencePiece model, expected '", m.string(), "')");
      model_file = m.string();
      what = "spm.model '" + model_file + "'";
      settings = detail::read_spm_directory(p);
    } else {
      check(fs::exists(p, ec), "SentencePiece model '", model_or_dir, "' does not exist");
    }
#if defined(DEA_HAVE_SENTENCEPIECE)
    load_model(read_file(model_file, kMaxModelBytes), what, settings);
#else
    (void)settings;
    ::dea::detail::raise(spm_unavailable_message(what));
#endif
  }

#if defined(DEA_HAVE_SENTENCEPIECE)
  /// Loads a model from its bytes (a serialised ModelProto) with the settings of a bare model file; `what` names it
  /// in messages.
  static SpmTokenizer from_bytes(std::string_view bytes, SpmMode mode, const std::string& what = "spm.model") {
    SpmTokenizer t;
    t.mode_ = mode;
    t.load_model(std::string(bytes), what, SpmDirectorySettings{});
    return t;
  }
#endif

  SpmMode mode() const { return mode_; }
  /// The number of pieces of the model.
  std::size_t num_pieces() const { return pieces_.size(); }
  /// Pieces plus added tokens: one more than the largest id the tokenizer can produce. A model's embedding must have
  /// at least this many rows.
  std::size_t vocab_size() const { return vocab_size_; }
  std::int64_t pad_id() const { return pad_id_; }
  std::int64_t cls_id() const { return cls_id_; }
  std::int64_t sep_id() const { return sep_id_; }
  std::int64_t unk_id() const { return unk_id_; }
  std::int64_t mask_id() const { return mask_id_; }
  /// The piece of id `id` (< num_pieces) or the added token's string.
  const std::string& id_to_token(std::int64_t id) const {
    check(id >= 0, "SpmTokenizer::id_to_token: id ", id, " is negative");
    if (static_cast<std::size_t>(id) < pieces_.size()) return pieces_[static_cast<std::size_t>(id)];
    for (const auto& [s, i] : specials_)
      if (i == id) return s;
    ::dea::detail::raise(::dea::detail::concat("SpmTokenizer::id_to_token: no token has id ", id));
  }

  /// The tokens of `text` (valid UTF-8; else a dea::Error), without [CLS] / [SEP].
  std::vector<SpmToken> tokens(std::string_view text) const {
    const std::size_t bad = unicode::first_invalid_utf8(text);
    if (bad != std::string_view::npos)
      ::dea::detail::raise(unicode::invalid_utf8_message(text, bad, "the text"));
    std::vector<SpmToken> out;
    std::size_t start = 0;
    for (std::size_t i = 0; i < text.size();) {
      const auto* sp = special_at(text, i);
      if (!sp) {
        ++i;
        continue;
      }
      segment(text.substr(start, i - start), out);
      out.push_back({sp->second, sp->first});
      i += sp->first.size();
      start = i;
    }
    segment(text.substr(start), out);
    return out;
  }
  /// The token strings of `text`, without [CLS] / [SEP].
  std::vector<std::string> tokenize(std::string_view text) const {
    std::vector<std::string> out;
    for (SpmToken& t : tokens(text)) out.push_back(std::move(t.token));
    return out;
  }
  /// The ids of `text`, without [CLS] / [SEP].
  std::vector<std::int64_t> ids(std::string_view text) const {
    std::vector<std::int64_t> out;
    for (const SpmToken& t : tokens(text)) out.push_back(t.id);
    return out;
  }
  /// The fast pipeline's normalised text of `text` (the special tokens are not split out first).
  std::string normalize_fast(std::string_view text) const {
    const std::size_t bad = unicode::first_invalid_utf8(text);
    if (bad != std::string_view::npos)
      ::dea::detail::raise(unicode::invalid_utf8_message(text, bad, "the text"));
    return spm::fast_normalize(text, charsmap_);
  }

  /// [CLS] A [SEP]; with max_length > 0 (>= 2), A keeps its first max_length - 2 tokens.
  Encoding encode(std::string_view a, std::size_t max_length = 0) const {
    check(max_length == 0 || max_length >= 2, "SpmTokenizer::encode: max_length must be >= 2 ([CLS] and [SEP]), got ",
          max_length);
    std::vector<SpmToken> ta = tokens(a);
    if (max_length > 0 && ta.size() > max_length - 2) ta.resize(max_length - 2);
    Encoding e;
    push(e, {cls_id_, cls_token_}, 0);
    for (SpmToken& t : ta) push(e, std::move(t), 0);
    push(e, {sep_id_, sep_token_}, 0);
    e.span_a = {1, static_cast<std::ptrdiff_t>(1 + ta.size())};
    return e;
  }
  /// [CLS] A [SEP] B [SEP] with token types; with max_length > 0 (>= 3) truncated longest first by the mode's rule
  /// (spm_pair_lengths).
  Encoding encode_pair(std::string_view a, std::string_view b, std::size_t max_length = 0) const {
    check(max_length == 0 || max_length >= 3,
          "SpmTokenizer::encode_pair: max_length must be >= 3 ([CLS] and two [SEP]), got ", max_length);
    std::vector<SpmToken> ta = tokens(a), tb = tokens(b);
    if (max_length > 0) {
      const auto [ka, kb] = spm_pair_lengths(ta.size(), tb.size(), max_length - 3, mode_);
      ta.resize(ka);
      tb.resize(kb);
    }
    Encoding e;
    push(e, {cls_id_, cls_token_}, 0);
    for (SpmToken& t : ta) push(e, std::move(t), 0);
    push(e, {sep_id_, sep_token_}, 0);
    e.span_a = {1, static_cast<std::ptrdiff_t>(1 + ta.size())};
    for (SpmToken& t : tb) push(e, std::move(t), 1);
    push(e, {sep_id_, sep_token_}, 1);
    e.span_b = {static_cast<std::ptrdiff_t>(2 + ta.size()), static_cast<std::ptrdiff_t>(2 + ta.size() + tb.size())};
    return e;
  }

  /// The largest model file read (the DeBERTa-v3 model is 2.4 MB).
  static constexpr std::size_t kMaxModelBytes = std::size_t(1) << 28;

private:
  SpmTokenizer() = default;

  static void push(Encoding& e, SpmToken t, std::int64_t type) {
    e.input_ids.push_back(t.id);
    e.tokens.push_back(std::move(t.token));
    e.token_type_ids.push_back(type);
    e.attention_mask.push_back(1);
  }

  /// The special token (string, id) that starts at byte i of `text` (the longest one), or null.
  const std::pair<std::string, std::int64_t>* special_at(std::string_view text, std::size_t i) const {
    const std::pair<std::string, std::int64_t>* best = nullptr;
    for (const auto& sp : specials_)
      if (text.compare(i, sp.first.size(), sp.first) == 0 && (!best || sp.first.size() > best->first.size()))
        best = &sp;
    return best;
  }

  /// Appends the tokens of one piece of text between special tokens.
  void segment(std::string_view text, std::vector<SpmToken>& out) const {
    if (text.empty()) return;
    if (mode_ == SpmMode::fast) {
      std::vector<spm::FastToken> toks;
      for (const std::string& w : spm::metaspace_words(spm::fast_normalize(text, charsmap_), add_dummy_prefix_))
        fast_.encode_word(w, toks);
      for (spm::FastToken& t : toks) out.push_back({t.id, std::move(t.token)});
      return;
    }
#if defined(DEA_HAVE_SENTENCEPIECE)
    sentencepiece::ImmutableSentencePieceText spt;
    const auto status = sp_->Encode(text, spt.mutable_proto());
    check(status.ok(), "SentencePiece encoding failed: ", status.ToString());
    for (std::size_t i = 0; i < spt.pieces_size(); ++i) {
      const auto piece = spt.pieces(static_cast<int>(i));
      out.push_back({static_cast<std::int64_t>(piece.id()), piece.piece()});
    }
#endif
  }

#if defined(DEA_HAVE_SENTENCEPIECE)
  void load_model(std::string bytes, const std::string& what, const SpmDirectorySettings& settings) {
    check(!bytes.empty(), what, ": empty file (not a SentencePiece model)");
    // our reading first: it refuses malformed protobuf with a message naming the problem, and finds the map
    const spm::SpmModelInfo info = spm::read_spm_model_info(bytes, what);
    check(info.num_pieces > 0, what, ": no pieces (an empty vocabulary: not a SentencePiece model?)");
    static const char* const kTypes[] = {"?", "unigram", "BPE", "word", "char"};
    check(info.model_type == 1, what, ": model type ",
          info.model_type >= 1 && info.model_type <= 4 ? kTypes[info.model_type] : "unknown", " (", info.model_type,
          "); only unigram models (DeBERTa-v2/v3's) are supported");
    charsmap_ = spm::Charsmap(info.precompiled_charsmap, what);
    add_dummy_prefix_ = info.add_dummy_prefix;
    auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
    const auto status = sp->LoadFromSerializedProto(bytes);
    check(status.ok(), what, ": not a valid SentencePiece model (", status.ToString(), ")");
    const int n = sp->GetPieceSize();
    check(n > 0 && static_cast<std::size_t>(n) == info.num_pieces, what, ": the library reads ", n,
          " pieces, the file holds ", info.num_pieces);
    pieces_.resize(static_cast<std::size_t>(n));
    std::vector<double> scores(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      pieces_[static_cast<std::size_t>(i)] = sp->IdToPiece(i);
      scores[static_cast<std::size_t>(i)] = static_cast<double>(sp->GetScore(i));
    }
    unk_id_ = sp->unk_id();
    check(unk_id_ >= 0 && unk_id_ < n, what, ": unk_id ", unk_id_, " is not a piece");
    auto piece_id = [&](const std::string& token, const char* role) {
      const int id = sp->PieceToId(token);
      check(id >= 0 && id < n && pieces_[static_cast<std::size_t>(id)] == token, what, ": no piece '", token,
            "' (the ", role, " token); a DeBERTa-v3 model has [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3");
      return static_cast<std::int64_t>(id);
    };
    pad_id_ = piece_id(settings.pad_token, "padding");
    cls_id_ = piece_id(settings.cls_token, "classification");
    sep_id_ = piece_id(settings.sep_token, "separator");
    check(pieces_[static_cast<std::size_t>(unk_id_)] == settings.unk_token, what, ": the unknown piece is '",
          pieces_[static_cast<std::size_t>(unk_id_)], "', the tokenizer files name '", settings.unk_token, "'");
    cls_token_ = settings.cls_token;
    sep_token_ = settings.sep_token;
    // [MASK]: an added token (its id from the files), else a piece of that name, else the next id after the pieces
    const int mask_piece = sp->PieceToId(settings.mask_token);
    if (const auto it = settings.added.find(settings.mask_token); it != settings.added.end()) mask_id_ = it->second;
    else if (pieces_[static_cast<std::size_t>(mask_piece)] == settings.mask_token) mask_id_ = mask_piece;
    else mask_id_ = n;
    specials_ = {{settings.pad_token, pad_id_}, {settings.cls_token, cls_id_}, {settings.sep_token, sep_id_},
                 {settings.unk_token, unk_id_}, {settings.mask_token, mask_id_}};
    for (const auto& [token, id] : settings.added)
      if (token != settings.mask_token) specials_.emplace_back(token, id);
    vocab_size_ = static_cast<std::size_t>(n);
    for (const auto& [token, id] : specials_) vocab_size_ = std::max(vocab_size_, static_cast<std::size_t>(id) + 1);
    if (mode_ == SpmMode::fast) fast_ = spm::FastUnigram(pieces_, scores, unk_id_);
    sp_ = std::move(sp);
  }

  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
#endif

  SpmMode mode_ = SpmMode::fast;
  std::vector<std::string> pieces_;
  std::vector<std::pair<std::string, std::int64_t>> specials_;  // split out of the raw text, with their ids
  std::string cls_token_ = "[CLS]", sep_token_ = "[SEP]";
  std::int64_t pad_id_ = 0, cls_id_ = 1, sep_id_ = 2, unk_id_ = 3, mask_id_ = 0;
  std::size_t vocab_size_ = 0;
  spm::Charsmap charsmap_;
  bool add_dummy_prefix_ = true;
  spm::FastUnigram fast_;
};

}  // namespace dea::text
