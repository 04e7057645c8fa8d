// dea/io/jsonl.hpp: JSON-lines files (one JSON object per line), the oracle alpha cache and D_alpha records.
//
// Reading skips blank lines; any other line must be one JSON object, and a line that is not (or lacks a
// required field, or has one of the wrong type) is a dea::Error naming the file and the line number. Writing
// goes to "<path>.tmp" and is renamed over the target.
//
// Alpha cache lines: {"premise": "...", "hypothesis": "...", "alpha": 0.87, "phi": 3.1, "sim": 0.42}
// ("phi" and "sim" optional; null counts as absent). To read the reference's cache files (its records saved with
// the oracle alpha), "q_text" / "k_text" are accepted in place of "premise" / "hypothesis".
#pragma once

#include "../core/error.hpp"
#include "../data/byte_file.hpp"
#include "../data/dalpha.hpp"
#include "../core/files.hpp"
#include "../core/utf8.hpp"
#include "../oracle/alpha.hpp"
#include "json_limits.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dea::io {

namespace detail {

/// Line `no` of a JSONL file as its object (dea::Error naming the file and the line otherwise).
inline nlohmann::json jsonl_object(const std::string& line, const std::string& path, std::size_t no) {
  check(json_nesting_depth(line) <= kMaxJsonDepth, path, ":", no, ": JSON nested deeper than ", kMaxJsonDepth,
        " levels");
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  check(!j.is_discarded(), path, ":", no, ": invalid JSON");
  check(j.is_object(), path, ":", no, ": expected a JSON object, got ", j.type_name());
  return j;
}

}  // namespace detail

/// Calls f(object, line_number) for each non-blank line of a JSONL file.
template <class F>
void read_jsonl(const std::string& path, F&& f) {
  const std::vector<std::string> lines = dea::read_lines(path);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (dea::trim(lines[i]).empty()) continue;
    f(detail::jsonl_object(lines[i], path, i + 1), i + 1);
  }
}

/// read_jsonl reading the file line by line through its index of line offsets (data/byte_file.hpp): one line held
/// at a time, whatever the file's size; the same lines, checks and messages (and a file changed while it is read is
/// an error).
template <class F>
void read_jsonl_streamed(const std::string& path, F&& f) {
  const data::LineIndex lines(path);
  lines.for_each([&](const std::string& line, std::size_t k) {
    if (!dea::trim(line).empty()) f(detail::jsonl_object(line, path, k + 1), k + 1);
  });
}

/// Writes one compact JSON value per line (atomic write).
inline void write_jsonl(const std::string& path, const std::vector<nlohmann::json>& objects) {
  std::string out;
  for (const auto& j : objects) {
    out += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  dea::write_file_atomic(path, out);
}

namespace detail {

inline const nlohmann::json* field(const nlohmann::json& j, const char* a, const char* b = nullptr) {
  auto it = j.find(a);
  if (it != j.end()) return &*it;
  if (b) {
    it = j.find(b);
    if (it != j.end()) return &*it;
  }
  return nullptr;
}

inline std::string get_string(const nlohmann::json& j, const std::string& path, std::size_t line, const char* a,
                              const char* b = nullptr) {
  const nlohmann::json* v = field(j, a, b);
  check(v != nullptr, path, ":", line, ": missing field \"", a, "\"");
  check(v->is_string(), path, ":", line, ": field \"", a, "\" must be a string, got ", v->type_name());
  return v->get<std::string>();
}

inline double get_number(const nlohmann::json& j, const std::string& path, std::size_t line, const char* name) {
  const nlohmann::json* v = field(j, name);
  check(v != nullptr, path, ":", line, ": missing field \"", name, "\"");
  check(v->is_number(), path, ":", line, ": field \"", name, "\" must be a number, got ", v->type_name());
  const double d = v->get<double>();
  check(std::isfinite(d), path, ":", line, ": field \"", name, "\" is not finite");
  return d;
}

inline std::optional<double> get_optional_number(const nlohmann::json& j, const std::string& path, std::size_t line,
                                                 const char* name) {
  const nlohmann::json* v = field(j, name);
  if (v == nullptr || v->is_null()) return std::nullopt;
  return get_number(j, path, line, name);
}

}  // namespace detail

namespace detail {

inline data::OracleEntry alpha_entry(const nlohmann::json& j, const std::string& path, std::size_t line) {
  data::OracleEntry e;
  e.premise = get_string(j, path, line, "premise", "q_text");
  e.hypothesis = get_string(j, path, line, "hypothesis", "k_text");
  e.alpha = get_number(j, path, line, "alpha");
  check(e.alpha >= 0 && e.alpha <= data::kAlphaMax, path, ":", line, ": alpha ", e.alpha, " outside [0, 0.95]");
  e.phi = get_optional_number(j, path, line, "phi");
  e.sim = get_optional_number(j, path, line, "sim");
  return e;
}

}  // namespace detail

/// Reads an alpha cache (format in the file comment). alpha must lie in [0, 0.95].
inline data::AlphaCache read_alpha_cache(const std::string& path) {
  data::AlphaCache cache;
  read_jsonl(path, [&](const nlohmann::json& j, std::size_t line) { cache.add(detail::alpha_entry(j, path, line)); });
  return cache;
}

/// The entries of the alpha cache `path` whose pair keep(premise, hypothesis) accepts, the file read line by line
/// (read_jsonl_streamed): it holds the kept entries, never the file. Every line is checked as read_alpha_cache
/// checks it, kept or not, so the same file gives the same errors.
template <class Keep>
data::AlphaCache read_alpha_cache(const std::string& path, Keep&& keep) {
  data::AlphaCache cache;
  read_jsonl_streamed(path, [&](const nlohmann::json& j, std::size_t line) {
    data::OracleEntry e = detail::alpha_entry(j, path, line);
    if (keep(e.premise, e.hypothesis)) cache.add(std::move(e));
  });
  return cache;
}

/// Writes an alpha cache, one entry per line in insertion order.
inline void write_alpha_cache(const std::string& path, const data::AlphaCache& cache) {
  std::vector<nlohmann::json> lines;
  lines.reserve(cache.size());
  for (const auto& e : cache.entries()) {
    nlohmann::json j;
    j["premise"] = e.premise;
    j["hypothesis"] = e.hypothesis;
    j["alpha"] = e.alpha;
    if (e.phi) j["phi"] = *e.phi;
    if (e.sim) j["sim"] = *e.sim;
    lines.push_back(std::move(j));
  }
  write_jsonl(path, lines);
}

/// Writes D_alpha records as the reference's save_records does (q_text, k_text, label, source, relation,
/// strength, and alpha when set).
inline void write_records(const std::string& path, const std::vector<data::Record>& records) {
  std::vector<nlohmann::json> lines;
  lines.reserve(records.size());
  for (const auto& r : records) {
    nlohmann::json j;
    j["q_text"] = r.q_text;
    j["k_text"] = r.k_text;
    j["label"] = r.label;
    j["source"] = r.source;
    j["relation"] = r.relation;
    j["strength"] = r.strength;
    if (!std::isnan(r.alpha)) j["alpha"] = r.alpha;
    lines.push_back(std::move(j));
  }
  write_jsonl(path, lines);
}

/// Writes (q_text, k_text) pairs, one {"q_text": ..., "k_text": ...} object per line in the order given (the input
/// of an oracle run, `dea train --dump_pairs`). A text that is not valid UTF-8 is a dea::Error naming the pair (JSON
/// could not carry it unchanged, so its alpha would never be found for the record).
inline void write_pairs(const std::string& path, const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string out;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    for (const std::string* t : {&pairs[i].first, &pairs[i].second}) {
      const std::size_t bad = utf8::first_invalid(*t);
      check(bad == std::string::npos, path, ": pair ", i + 1, ": its ", t == &pairs[i].first ? "q_text" : "k_text",
            " is not valid UTF-8 (byte offset ", bad, ")");
    }
    nlohmann::ordered_json j;  // q_text first, as a person reads the pair
    j["q_text"] = pairs[i].first;
    j["k_text"] = pairs[i].second;
    out += j.dump();
    out += '\n';
  }
  dea::write_file_atomic(path, out);
}

/// Reads records written by write_records (or by the reference). q_text, k_text and label are required;
/// source, relation and strength default to empty / "none"; alpha is optional.
inline std::vector<data::Record> read_records(const std::string& path) {
  std::vector<data::Record> out;
  read_jsonl(path, [&](const nlohmann::json& j, std::size_t line) {
    data::Record r;
    r.q_text = detail::get_string(j, path, line, "q_text");
    r.k_text = detail::get_string(j, path, line, "k_text");
    const nlohmann::json* lab = detail::field(j, "label");
    check(lab != nullptr, path, ":", line, ": missing field \"label\"");
    check(lab->is_number_integer() || lab->is_boolean(), path, ":", line, ": field \"label\" must be 0 or 1");
    const std::int64_t label = lab->is_boolean() ? (lab->get<bool>() ? 1 : 0) : lab->get<std::int64_t>();
    check(label == 0 || label == 1, path, ":", line, ": label must be 0 or 1, got ", label);
    r.label = static_cast<int>(label);
    if (detail::field(j, "source")) r.source = detail::get_string(j, path, line, "source");
    if (detail::field(j, "relation")) r.relation = detail::get_string(j, path, line, "relation");
    r.strength = detail::field(j, "strength") ? detail::get_string(j, path, line, "strength") : "none";
    if (auto a = detail::get_optional_number(j, path, line, "alpha")) r.alpha = *a;
    out.push_back(std::move(r));
  });
  return out;
}

}  // namespace dea::io
