// dea/text/vocab.hpp: a WordPiece vocabulary (BERT's vocab.txt): one token per line, line n (counted from 0) is
// id n, UTF-8.
//
// Reading follows Hugging Face's WordPiece reader: a line ends at '\n' (a '\r' before it is dropped) and trailing
// whitespace is not part of the token. Stricter than it, a file that could silently give wrong ids is refused with a
// dea::Error naming the file and the line: a missing or empty file, an empty line (it would shift nothing but
// could never match), a token that repeats an earlier line (HF would keep the later id for both lines; the message
// names both lines), a line that is not valid UTF-8, more than kMaxSize lines or kMaxFileBytes bytes. Special
// tokens are not required here: the tokenizer asks for the ones it needs (vocab.require).
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "unicode.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dea::text {

class Vocab {
public:
  /// The largest vocabulary file accepted, in bytes and in tokens.
  static constexpr std::size_t kMaxFileBytes = std::size_t(1) << 28;
  static constexpr std::size_t kMaxSize = std::size_t(1) << 22;

  Vocab() = default;
  Vocab(const Vocab& o) : tokens_(o.tokens_), source_(o.source_), max_chars_(o.max_chars_) { index(); }
  Vocab& operator=(const Vocab& o) {
    if (this != &o) *this = Vocab(o);
    return *this;
  }
  // moving a vector keeps its element buffer, so the index's views into the tokens stay valid
  Vocab(Vocab&&) noexcept = default;
  Vocab& operator=(Vocab&&) noexcept = default;

  /// Reads vocab.txt (see the file comment for what is refused).
  static Vocab load(const std::string& path) { return parse(read_file(path, kMaxFileBytes), path); }

  /// Parses the text of a vocabulary file; `source` names it in messages.
  static Vocab parse(std::string_view content, const std::string& source) {
    std::vector<std::string> lines = split_lines(content);
    check(!lines.empty(), source, ": empty vocabulary (the file has no lines)");
    check(lines.size() <= kMaxSize, source, ": ", lines.size(), " tokens, more than the maximum of ", kMaxSize);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      std::string& t = lines[i];
      const std::size_t bad = unicode::first_invalid_utf8(t);
      if (bad != std::string_view::npos)
        ::dea::detail::raise(::dea::detail::concat(source, ":", i + 1, ": ", unicode::invalid_utf8_message(t, bad, "the line")));
      const std::u32string cps = unicode::decode_utf8(t);
      std::size_t n = cps.size();
      while (n > 0 && unicode::is_whitespace(cps[n - 1])) --n;
      if (n < cps.size()) t = unicode::encode_utf8(std::u32string_view(cps).substr(0, n));
      check(n > 0, source, ":", i + 1, ": empty token (line n holds the token of id n - 1; a line may not be empty)");
    }
    return from_tokens(std::move(lines), source);
  }

  /// A vocabulary of the given tokens (token i has id i); tokens must be non-empty, valid UTF-8 and distinct.
  static Vocab from_tokens(std::vector<std::string> tokens, std::string source = "vocabulary") {
    check(!tokens.empty(), source, ": empty vocabulary");
    check(tokens.size() <= kMaxSize, source, ": ", tokens.size(), " tokens, more than the maximum of ", kMaxSize);
    Vocab v;
    v.tokens_ = std::move(tokens);
    v.source_ = std::move(source);
    for (std::size_t i = 0; i < v.tokens_.size(); ++i) {
      const std::string& t = v.tokens_[i];
      check(!t.empty(), v.source_, ":", i + 1, ": empty token");
      const std::size_t bad = unicode::first_invalid_utf8(t);
      if (bad != std::string_view::npos)
        ::dea::detail::raise(::dea::detail::concat(v.source_, ":", i + 1, ": ", unicode::invalid_utf8_message(t, bad, "the token")));
      const std::size_t chars = unicode::decode_utf8(t).size();
      if (chars > v.max_chars_) v.max_chars_ = chars;
    }
    v.index();
    return v;
  }

  std::size_t size() const { return tokens_.size(); }
  /// Where the vocabulary came from (its path), for messages.
  const std::string& source() const { return source_; }
  /// The tokens in id order.
  const std::vector<std::string>& tokens() const { return tokens_; }
  /// The longest token, in code points.
  std::size_t max_token_chars() const { return max_chars_; }

  /// The id of `token`, or -1.
  std::int64_t find(std::string_view token) const {
    const auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }
  bool contains(std::string_view token) const { return ids_.count(token) > 0; }

  /// The id of `token`; a dea::Error "<source> has no token '[CLS]' (needed for <needed_for>)" when it is absent.
  std::int64_t require(std::string_view token, std::string_view needed_for) const {
    const std::int64_t id = find(token);
    check(id >= 0, source_, " has no token '", token, "' (needed for ", needed_for, ")");
    return id;
  }

  /// The token of `id` (checked).
  const std::string& token(std::int64_t id) const {
    check(id >= 0 && static_cast<std::size_t>(id) < tokens_.size(), "Vocab::token: id ", id, " outside [0, ",
          tokens_.size(), ")");
    return tokens_[static_cast<std::size_t>(id)];
  }

private:
  /// Builds the token -> id index (views into tokens_), refusing repeated tokens.
  void index() {
    ids_.clear();
    ids_.reserve(tokens_.size());
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      const auto [it, fresh] = ids_.emplace(std::string_view(tokens_[i]), static_cast<std::int64_t>(i));
      check(fresh, source_, ":", i + 1, ": duplicate token '", tokens_[i], "' (the same token as line ", it->second + 1,
            "; each token must appear once, line n holding id n - 1)");
    }
  }

  std::vector<std::string> tokens_;
  std::unordered_map<std::string_view, std::int64_t> ids_;
  std::string source_;
  std::size_t max_chars_ = 0;
};

}  // namespace dea::text
