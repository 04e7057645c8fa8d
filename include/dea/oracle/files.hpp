// dea/oracle/files.hpp: the files of the NLI oracle (`dea oracle`, oracle/run.hpp): the pairs it scores,
// the human labels it calibrates on, and the alpha cache it writes, one JSON object per line.
//
// Pairs (PAIRS.jsonl), one pair per line; blank lines are skipped; other fields (label, source, ...) are ignored:
//   {"premise": "Paris is the capital of France.", "hypothesis": "France"}
//   {"q_text": "a car has a wheel.", "k_text": "wheel", "label": 1}       (D_alpha records as the reference saves them)
// A line has "premise" and "hypothesis", or else "q_text" and "k_text", both strings.
//
// Labels (LABELS.jsonl, for --calibrate): the same pair fields and "alpha", the human value, a number in [0, 1]:
//   {"premise": "a dog is a kind of animal.", "hypothesis": "animal", "alpha": 0.9}
//
// Cache (CACHE.jsonl), one line per pair in the pairs' order, written by oracle_cache_line: the pair under the names
// its input line used, then alpha, alpha_raw, phi and sim (shortest round-trip decimal forms):
//   {"premise":"Paris is the capital of France.","hypothesis":"France","alpha":0.686,"alpha_raw":0.686,"phi":1.04,"sim":0.867}
// It is an alpha cache as io/jsonl.hpp reads it (read_alpha_cache; alpha_raw is an extra field there).
//
// Every line must be valid UTF-8 and one JSON object; anything else is a dea::Error naming the file and the line.
//
// read_partial_cache reads what an interrupted run left (the recovery rule is in oracle/run.hpp): the complete
// lines, each of which must be the record of the pair at its position, byte for byte as oracle_cache_line writes
// it, and at most one torn line after them (the bytes after the last newline).
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../text/unicode.hpp"
#include "../io/json_limits.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace dea::io {

/// One pair of a pairs or labels file.
struct OraclePair {
  std::string premise;     ///< q_text
  std::string hypothesis;  ///< k_text
  bool qk_names = false;   ///< the line named them "q_text" / "k_text" (its cache line does too)
  std::size_t line = 0;    ///< its line in the file, from 1
};

/// One line of a labels file.
struct LabelledPair {
  OraclePair pair;
  double alpha = 0;  ///< the human alpha, in [0, 1]
};

namespace detail {

/// "'text'", cut to 60 characters (whole UTF-8 sequences) for messages.
inline std::string quote_short(const std::string& s) {
  std::size_t n = 0, chars = 0;
  while (n < s.size() && chars < 60) {
    const auto c = static_cast<unsigned char>(s[n]);
    n += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    ++chars;
  }
  return n >= s.size() ? "'" + s + "'" : "'" + s.substr(0, n) + "...'";
}

/// The JSON object of line `number` of `path` (checked: UTF-8, nesting, syntax, an object).
inline nlohmann::json parse_object_line(std::string_view line, const std::string& path, std::size_t number) {
  const std::size_t bad = text::unicode::first_invalid_utf8(line);
  if (bad != std::string_view::npos)
    ::dea::detail::raise(::dea::detail::concat(path, ":", number, ": ",
                                               text::unicode::invalid_utf8_message(line, bad, "the line")));
  check(json_nesting_depth(line) <= kMaxJsonDepth, path, ":", number, ": JSON nested deeper than ", kMaxJsonDepth,
        " levels");
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  check(!j.is_discarded(), path, ":", number, ": invalid JSON");
  check(j.is_object(), path, ":", number, ": expected a JSON object, got ", j.type_name());
  return j;
}

/// The pair of a parsed line: "premise" + "hypothesis", or else "q_text" + "k_text".
inline OraclePair pair_of(const nlohmann::json& j, const std::string& path, std::size_t number) {
  const bool ph = j.contains("premise") || j.contains("hypothesis");
  const bool qk = !ph && (j.contains("q_text") || j.contains("k_text"));
  check(ph || qk, path, ":", number, ": missing field \"premise\" (a pair has \"premise\" and \"hypothesis\", or "
        "\"q_text\" and \"k_text\")");
  const char* a = ph ? "premise" : "q_text";
  const char* b = ph ? "hypothesis" : "k_text";
  OraclePair p;
  for (const char* key : {a, b}) {
    const auto it = j.find(key);
    check(it != j.end(), path, ":", number, ": missing field \"", key, "\" (the line has \"", key == a ? b : a,
          "\")");
    check(it->is_string(), path, ":", number, ": field \"", key, "\" must be a string, got ", it->type_name());
  }
  p.premise = j[a].get<std::string>();
  p.hypothesis = j[b].get<std::string>();
  p.qk_names = qk;
  p.line = number;
  return p;
}

/// Calls f(object, line number) for each non-blank line of `path`.
template <class F>
void for_each_object_line(const std::string& path, F&& f) {
  const std::vector<std::string> lines = read_lines(path);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (trim(lines[i]).empty()) continue;
    f(parse_object_line(lines[i], path, i + 1), i + 1);
  }
}

}  // namespace detail

/// Reads a pairs file (see the file comment); an empty one is an error.
inline std::vector<OraclePair> read_oracle_pairs(const std::string& path) {
  std::vector<OraclePair> out;
  detail::for_each_object_line(path, [&](const nlohmann::json& j, std::size_t line) {
    out.push_back(detail::pair_of(j, path, line));
  });
  check(!out.empty(), path, ": no pairs (every line is blank)");
  return out;
}

/// Reads a labels file (see the file comment); an empty one is an error.
inline std::vector<LabelledPair> read_oracle_labels(const std::string& path) {
  std::vector<LabelledPair> out;
  detail::for_each_object_line(path, [&](const nlohmann::json& j, std::size_t line) {
    LabelledPair l;
    l.pair = detail::pair_of(j, path, line);
    const auto it = j.find("alpha");
    check(it != j.end(), path, ":", line, ": missing field \"alpha\" (the human label)");
    check(it->is_number(), path, ":", line, ": field \"alpha\" must be a number, got ", it->type_name());
    l.alpha = it->get<double>();
    check(std::isfinite(l.alpha) && l.alpha >= 0 && l.alpha <= 1, path, ":", line, ": alpha ", l.alpha,
          " outside [0, 1]");
    out.push_back(std::move(l));
  });
  check(!out.empty(), path, ": no labelled pairs (every line is blank)");
  return out;
}

/// The cache line of a pair, with its '\n' (see the file comment).
inline std::string oracle_cache_line(const OraclePair& p, double alpha, double alpha_raw, double phi, double sim) {
  nlohmann::ordered_json j;
  j[p.qk_names ? "q_text" : "premise"] = p.premise;
  j[p.qk_names ? "k_text" : "hypothesis"] = p.hypothesis;
  j["alpha"] = alpha;
  j["alpha_raw"] = alpha_raw;
  j["phi"] = phi;
  j["sim"] = sim;
  return j.dump() + "\n";
}

/// What an interrupted run left in a cache file (read_partial_cache).
struct PartialCache {
  bool exists = false;           ///< the file exists
  std::size_t records = 0;       ///< its complete records: those of pairs 0 .. records-1
  std::uint64_t good_bytes = 0;  ///< the bytes of those records
  std::uint64_t torn_bytes = 0;  ///< the bytes after the last newline (a torn record), dropped on resume
  std::string last_record;       ///< the last complete record, with its '\n' (empty when none)
};

/// Reads the cache `out_path` left by a run over `pairs` (read from `pairs_path`, named in messages) and checks it:
/// every complete line must be the record of the pair at its position, byte for byte as oracle_cache_line writes it;
/// more records than pairs is an error. A missing file is an empty PartialCache.
inline PartialCache read_partial_cache(const std::string& out_path, const std::vector<OraclePair>& pairs,
                                       const std::string& pairs_path) {
  PartialCache pc;
  std::error_code ec;
  if (!std::filesystem::exists(out_path, ec)) return pc;
  pc.exists = true;
  const std::string text = read_file(out_path);
  const std::size_t end = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  pc.torn_bytes = text.size() - end;
  const std::string advice = "remove it to compute every pair again, or give another --out";
  std::size_t pos = 0, number = 0, last_start = 0;
  while (pos < end) {
    last_start = pos;
    const std::size_t nl = text.find('\n', pos);
    const std::string_view line(text.data() + pos, nl - pos);
    ++number;
    check(number <= pairs.size(), out_path, " holds more records than the ", pairs.size(), " pairs of ", pairs_path,
          ": it was written for other pairs; ", advice);
    const OraclePair& want = pairs[number - 1];
    nlohmann::json j;
    try {
      j = detail::parse_object_line(line, out_path, number);
    } catch (const Error& e) {
      ::dea::detail::raise(::dea::detail::concat(without_error_prefix(e.what()), " (only the last line of an interrupted run can be torn, and it "
                                                 "has no newline): ", advice));
    }
    const auto str = [&](const char* key) -> std::string {
      const auto it = j.find(key);
      return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    const char* a = want.qk_names ? "q_text" : "premise";
    const char* b = want.qk_names ? "k_text" : "hypothesis";
    const bool same_pair = j.contains(a) && j.contains(b) && str(a) == want.premise && str(b) == want.hypothesis;
    if (!same_pair) {
      const bool qk = !j.contains("premise") && j.contains("q_text");
      const std::string got_a = str(qk ? "q_text" : "premise"), got_b = str(qk ? "k_text" : "hypothesis");
      ::dea::detail::raise(::dea::detail::concat(
          out_path, ":", number, ": holds the pair (", detail::quote_short(got_a), ", ", detail::quote_short(got_b),
          ") but pair ", number, " of ", pairs_path, " (line ", want.line, ") is (", want.premise.empty() ? "''" :
          detail::quote_short(want.premise), ", ", detail::quote_short(want.hypothesis), ")",
          qk != want.qk_names ? " (and its field names differ)" : "", ": it was written for other pairs; ", advice));
    }
    double v[4] = {0, 0, 0, 0};
    const char* keys[4] = {"alpha", "alpha_raw", "phi", "sim"};
    bool numbers = true;
    for (int k = 0; k < 4; ++k) {
      const auto it = j.find(keys[k]);
      numbers = numbers && it != j.end() && it->is_number();
      if (numbers) v[k] = it->get<double>();
    }
    check(numbers && oracle_cache_line(want, v[0], v[1], v[2], v[3]) == std::string(line) + "\n", out_path, ":",
          number, ": not a record as dea oracle writes them (the pair, then alpha, alpha_raw, phi and sim): ", advice);
    pos = nl + 1;
  }
  pc.records = number;
  pc.good_bytes = end;
  pc.last_record = text.substr(last_start, end - last_start);
  return pc;
}

}  // namespace dea::io
