// dea/text/unicode.hpp: the Unicode properties and transforms the WordPiece tokenizer needs, over the generated
// tables of text/unicode_tables.hpp (from the Unicode Character Database; see cmake/gen_unicode_tables.py).
//
//   is_control         general category Cc, Cf or Co, as Hugging Face's tokenizers has it (Unicode 8.0 data)
//   is_whitespace      the White_Space property
//   is_punctuation     ASCII punctuation (33-47, 58-64, 91-96, 123-126) or general category P* (Unicode 8.0)
//   is_nonspacing_mark general category Mn (Unicode 8.0)
//   is_cjk_ideograph   the CJK blocks BERT puts spaces around
//   nfd                canonical decomposition (Unicode 9.0) with canonical ordering: Normalization Form D
//   append_lower       the full lower-case mapping (UnicodeData.txt + unconditional SpecialCasing.txt), as Rust's
//                      char::to_lowercase: no final-sigma rule, U+0130 -> "i" U+0307
// Text is UTF-8 at the API and UTF-32 (std::u32string) inside; decode_utf8 refuses invalid UTF-8 with a dea::Error.
// Standard library only (no Eigen, no ICU).
#pragma once

#include "../core/error.hpp"
#include "../core/utf8.hpp"
#include "unicode_tables.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

namespace dea::text::unicode {

namespace detail {

/// Whether c lies in one of the sorted, disjoint ranges of `table`.
template <std::size_t N>
inline bool in_ranges(const tables::Range (&table)[N], char32_t c) {
  const auto it = std::upper_bound(std::begin(table), std::end(table), static_cast<std::uint32_t>(c),
                                   [](std::uint32_t v, const tables::Range& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

// Hangul syllables decompose arithmetically (The Unicode Standard, section 3.12).
constexpr char32_t kHangulS = 0xAC00, kHangulL = 0x1100, kHangulV = 0x1161, kHangulT = 0x11A7;
constexpr char32_t kHangulVCount = 21, kHangulTCount = 28, kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = 19 * kHangulNCount;

/// Appends the full canonical decomposition of c (not yet canonically ordered).
inline void append_decomposition(std::u32string& out, char32_t c) {
  if (c < 0xC0) {  // nothing below U+00C0 decomposes
    out += c;
    return;
  }
  if (c >= kHangulS && c < kHangulS + kHangulSCount) {
    const char32_t s = c - kHangulS;
    out += kHangulL + s / kHangulNCount;
    out += kHangulV + (s % kHangulNCount) / kHangulTCount;
    if (s % kHangulTCount != 0) out += kHangulT + s % kHangulTCount;
    return;
  }
  const auto& t = tables::kDecomposition;
  const auto it = std::lower_bound(std::begin(t), std::end(t), static_cast<std::uint32_t>(c),
                                   [](const tables::Decomposition& d, std::uint32_t v) { return d.cp < v; });
  if (it == std::end(t) || it->cp != c) {
    out += c;
    return;
  }
  append_decomposition(out, it->first);  // the parts decompose again (at most a few levels deep)
  if (it->second != 0) append_decomposition(out, it->second);
}

}  // namespace detail

/// General category Cc, Cf or Co (Unicode 8.0, as tokenizers' tables): C0/C1 controls, format characters such as
/// U+00AD, U+200B..U+200F, U+FEFF, and the private-use planes. \t, \n and \r are included (the normaliser treats
/// them as whitespace before it asks).
inline bool is_control(char32_t c) { return detail::in_ranges(tables::kControl, c); }

/// The White_Space property: \t \n \v \f \r, space, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
/// U+202F, U+205F, U+3000.
inline bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return detail::in_ranges(tables::kWhiteSpace, c);
}

/// ASCII punctuation ($ + < = > ^ ` | ~ included) or general category P* (Unicode 8.0). Symbols (Sc Sk Sm So) and
/// numbers are not punctuation outside ASCII.
inline bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return detail::in_ranges(tables::kPunctuation, c);
}

/// General category Mn (Unicode 8.0): the marks accent stripping removes. Mc and Me are kept.
inline bool is_nonspacing_mark(char32_t c) { return c >= 0x300 && detail::in_ranges(tables::kNonspacingMark, c); }

/// The code points BERT's normaliser surrounds with spaces: U+4E00..9FFF, 3400..4DBF, 20000..2A6DF, 2A700..2B73F,
/// 2B740..2B81F, 2B920..2CEAF, F900..FAFF, 2F800..2FA1F. This is the list of Hugging Face's tokenizers library,
/// which starts the fifth block at U+2B920 (Google's BERT and HF's Python BertTokenizer start it at U+2B820).
/// Hiragana, katakana, Hangul and full-width Latin are not included.
inline bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/// The canonical combining class of c (0 for starters and for characters newer than the normalisation data).
inline std::uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  const auto& t = tables::kCombiningClass;
  const auto it = std::upper_bound(std::begin(t), std::end(t), static_cast<std::uint32_t>(c),
                                   [](std::uint32_t v, const tables::CombiningClassRange& r) { return v < r.first; });
  return (it != std::begin(t) && c <= std::prev(it)->last) ? std::prev(it)->ccc : std::uint8_t(0);
}

/// Normalization Form D of `s`: every character replaced by its full canonical decomposition, then each run of
/// non-starters stably sorted by combining class (the canonical ordering algorithm).
inline std::u32string nfd(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size() + s.size() / 4);
  for (const char32_t c : s) detail::append_decomposition(out, c);
  // canonical ordering: insertion sort (stable) of each run of non-zero classes; runs are a few marks long
  for (std::size_t i = 1; i < out.size(); ++i) {
    const std::uint8_t ci = combining_class(out[i]);
    if (ci == 0) continue;
    const char32_t c = out[i];
    std::size_t j = i;
    while (j > 0) {
      const std::uint8_t cj = combining_class(out[j - 1]);
      if (cj == 0 || cj <= ci) break;
      out[j] = out[j - 1];
      --j;
    }
    out[j] = c;
  }
  return out;
}

/// Appends the full lower-case form of c: one code point, or several for U+0130 (-> "i" U+0307). Σ is always σ.
inline void append_lower(std::u32string& out, char32_t c) {
  if (c < 0x80) {
    out += (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return;
  }
  for (const auto& m : tables::kLowerMulti)
    if (m.cp == c) {
      for (const std::uint32_t x : m.to)
        if (x != 0) out += static_cast<char32_t>(x);
      return;
    }
  const auto& t = tables::kLower;
  const auto it = std::upper_bound(std::begin(t), std::end(t), static_cast<std::uint32_t>(c),
                                   [](std::uint32_t v, const tables::LowerRange& r) { return v < r.first; });
  if (it != std::begin(t)) {
    const tables::LowerRange& r = *std::prev(it);
    if (c <= r.last && (c - r.first) % r.stride == 0) {
      out += static_cast<char32_t>(static_cast<std::int64_t>(c) + r.delta);
      return;
    }
  }
  out += c;
}

/// Two upper-case hexadecimal digits of a byte (for messages).
inline std::string hex_byte(char b) {
  const char* digits = "0123456789ABCDEF";
  const auto u = static_cast<unsigned char>(b);
  return {digits[u >> 4], digits[u & 15]};
}

/// The byte offset of the first byte of `s` that is not part of valid UTF-8 (a stray or missing continuation byte,
/// an overlong form, a surrogate, a code point above U+10FFFF), or npos when `s` is valid UTF-8.
inline std::size_t first_invalid_utf8(std::string_view s) { return utf8::first_invalid(s); }

/// "<what> is not valid UTF-8 (byte 0x.. at byte offset N)" for the first invalid byte of `s`.
inline std::string invalid_utf8_message(std::string_view s, std::size_t at, std::string_view what) {
  return ::dea::detail::concat(what, " is not valid UTF-8 (byte 0x", hex_byte(s[at]), " at byte offset ", at, ")");
}

/// Decodes UTF-8; invalid UTF-8 is a dea::Error (invalid_utf8_message).
inline std::u32string decode_utf8(std::string_view s, std::string_view what = "text") {
  const std::size_t bad = first_invalid_utf8(s);
  if (bad != std::string_view::npos) ::dea::detail::raise(invalid_utf8_message(s, bad, what));
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    i += utf8::decode(s, i, cp);
    out += cp;
  }
  return out;
}

/// Encodes code points as UTF-8.
inline std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char32_t c : s) utf8::append(out, c);
  return out;
}

}  // namespace dea::text::unicode
