// dea/core/utf8.hpp: the small amount of UTF-8 and Unicode knowledge the word-level tokenizer needs.
//
// The reference tokenizer runs Python's `re` on a `str`, so it sees code points and uses Python's Unicode
// tables for `\w`, `\s`, `\d` and `str.lower()`. We do not carry the full Unicode database: this header
// decodes UTF-8 and classifies code points with range tables that agree with Python on ASCII, Latin-1,
// Latin Extended-A/B, Greek, Cyrillic, Arabic, Hebrew, the CJK blocks, general punctuation, arrows and
// mathematical operators (so "→", "×", "–" are punctuation, "é", "ж", "日" are word characters).
// Outside those blocks the classification is an approximation (documented per range below).
//
// Invalid UTF-8 never throws: each invalid byte decodes to U+FFFD, which is a punctuation character.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dea::utf8 {

/// The replacement character that stands for an invalid byte.
constexpr char32_t kReplacement = 0xFFFD;

/// Decodes the code point starting at s[i]; returns the number of bytes consumed (>= 1).
/// Overlong forms, surrogates, code points above U+10FFFF and truncated sequences give U+FFFD and consume
/// exactly one byte, so the caller always makes progress.
inline std::size_t decode(std::string_view s, std::size_t i, char32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  std::size_t len = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
    min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
    min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
    min = 0x10000;
  } else {
    cp = kReplacement;
    return 1;
  }
  if (i + len > s.size()) {
    cp = kReplacement;
    return 1;
  }
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      cp = kReplacement;
      return 1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    cp = kReplacement;
    return 1;
  }
  return len;
}

/// The byte offset of the first byte of `s` that is not part of valid UTF-8 (a stray or missing continuation byte,
/// an overlong form, a surrogate, a code point above U+10FFFF), or npos when `s` is valid UTF-8.
inline std::size_t first_invalid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp = 0;
    const std::size_t n = decode(s, i, cp);
    // decode gives U+FFFD for one byte of an invalid sequence; a real U+FFFD takes three bytes
    if (n == 1) return i;
    i += n;
  }
  return std::string_view::npos;
}

/// Appends the UTF-8 encoding of `cp` to `out`.
inline void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// Python's `\s` for str patterns: ASCII whitespace, the information separators U+001C..U+001F, NEL,
/// NBSP, the Ogham space, U+2000..U+200A, the line/paragraph separators, narrow NBSP, medium math space
/// and the ideographic space.
inline bool is_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/// ASCII decimal digit: the only digits that may form an arithmetic run ("5+3"). Other scripts' digits
/// are still word characters (Python's `\d` would also accept them; our arithmetic rule does not).
inline bool is_ascii_digit(char32_t c) { return c >= '0' && c <= '9'; }

/// Python's `\w` (letters, digits, numerics and '_'), by range. ASCII and Latin-1 are exact; the other
/// ranges treat a whole script block as letters, and symbol / punctuation blocks as non-word.
inline bool is_word(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  if (c < 0x100) {
    // Latin-1: ª ² ³ µ ¹ º ¼ ½ ¾ and the letters À..ÿ except × and ÷.
    if (c == 0xAA || c == 0xB2 || c == 0xB3 || c == 0xB5 || c == 0xB9 || c == 0xBA) return true;
    if (c >= 0xBC && c <= 0xBE) return true;
    return c >= 0xC0 && c != 0xD7 && c != 0xF7;
  }
  if (c < 0x0300) return true;                   // Latin Extended-A/B, IPA, modifier letters
  if (c < 0x0370) return false;                  // combining diacritical marks (not \w in Python)
  if (c < 0x0400) return c != 0x0375 && c != 0x037E && c != 0x0384 && c != 0x0385 && c != 0x0387;  // Greek
  if (c < 0x0530) return c < 0x0482 || c > 0x0489;  // Cyrillic minus its signs and combining marks
  if (c < 0x0590) return c < 0x0559 || c > 0x055F;  // Armenian minus its punctuation
  if (c < 0x0600) return c >= 0x05D0 && c <= 0x05F2;  // Hebrew letters only
  if (c < 0x0700) {                                // Arabic: letters and digits, not its punctuation
    return (c >= 0x0620 && c <= 0x064A) || (c >= 0x0660 && c <= 0x0669) || (c >= 0x066E && c <= 0x06D3) ||
           c == 0x06D5 || (c >= 0x06E5 && c <= 0x06E6) || (c >= 0x06EE && c <= 0x06FC) || c == 0x06FF;
  }
  if (c < 0x2000) return true;                   // other scripts (Indic, Thai, Georgian, Hangul Jamo, ...)
  if (c < 0x2C00) return false;                  // punctuation, super/subscripts, currency, arrows, math, ...
  if (c < 0x2E00) return true;                   // Glagolitic, Latin Extended-C, Coptic, Georgian supplement
  if (c < 0x3040) return false;                  // supplemental punctuation, CJK radicals, CJK punctuation
  if (c < 0x3100) return c != 0x30A0 && c != 0x30FB;  // kana
  if (c < 0x3200) return true;                   // Bopomofo, Hangul compatibility Jamo, Kanbun
  if (c < 0x3400) return false;                  // enclosed CJK letters, CJK compatibility symbols
  if (c < 0xD800) return c < 0x4DC0 || c > 0x4DFF;  // CJK ideographs, Yi, Hangul (not the hexagram symbols)
  if (c < 0xF900) return false;                  // surrogates, private use
  if (c < 0xFE00) return true;                   // CJK compatibility ideographs, presentation forms
  if (c < 0xFE70) return false;                  // variation selectors, vertical / small forms
  if (c < 0xFF00) return c != 0xFEFF;            // Arabic presentation forms B (not the BOM)
  if (c < 0xFFF0) {                              // fullwidth digits and Latin letters; halfwidth kana/Hangul
    return (c >= 0xFF10 && c <= 0xFF19) || (c >= 0xFF21 && c <= 0xFF3A) || (c >= 0xFF41 && c <= 0xFF5A) ||
           (c >= 0xFF66 && c <= 0xFFDC);
  }
  if (c < 0x10000) return false;
  if (c >= 0x20000 && c < 0x40000) return true;  // CJK extension planes
  if (c < 0x1D000) return true;                  // historic scripts of plane 1
  return false;                                  // musical / math symbols, emoji, tags, private use
}

/// Appends the lower-case form of `c` (Python's str.lower() for the ranges above; one-to-one except
/// U+0130, which lowers to "i" + U+0307 as in Python).
inline void append_lower(std::vector<char32_t>& out, char32_t c) {
  if (c < 0x80) {
    out.push_back((c >= 'A' && c <= 'Z') ? c + 32 : c);
    return;
  }
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) {
    out.push_back(c + 0x20);
    return;
  }
  if (c == 0x130) {
    out.push_back('i');
    out.push_back(0x307);
    return;
  }
  if (c == 0x178) {
    out.push_back(0xFF);
    return;
  }
  // Latin Extended-A: capital/small pairs alternate; the parity of the capital changes at U+0139 and U+0179.
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) {
    out.push_back((c % 2 == 0) ? c + 1 : c);
    return;
  }
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) {
    out.push_back((c % 2 == 1) ? c + 1 : c);
    return;
  }
  if ((c >= 0x391 && c <= 0x3A9 && c != 0x3A2)) {  // Greek capitals
    out.push_back(c + 0x20);
    return;
  }
  if (c >= 0x410 && c <= 0x42F) {  // Cyrillic А..Я
    out.push_back(c + 0x20);
    return;
  }
  if (c >= 0x400 && c <= 0x40F) {  // Cyrillic Ѐ..Џ
    out.push_back(c + 0x50);
    return;
  }
  if (c >= 0xFF21 && c <= 0xFF3A) {  // fullwidth A..Z
    out.push_back(c + 0x20);
    return;
  }
  out.push_back(c);
}

/// Decodes `s` and lower-cases it: the code point sequence the tokenizer scans.
inline std::vector<char32_t> lower_code_points(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    i += decode(s, i, cp);
    append_lower(out, cp);
  }
  return out;
}

/// ASCII-only lower-casing of a UTF-8 string (multi-byte sequences are left untouched).
inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out)
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
  return out;
}

}  // namespace dea::utf8
