// dea/data/loaders.hpp: D_alpha positives from local copies of the real data sets, and the D_alpha build that
// mixes them with the synthetic sources.
//
// Formats read (every error is a dea::Error naming the file and the line; loops only ever walk the file's
// lines, so a garbage file gives an error, never a crash or a hang):
//  * bAbI task files (qa16 / qa17 / qa18 "tasks_1-20_v1-2" text format): "ID text" lines; ID 1 starts a new
//    story and IDs then increase by one; a question line is "ID question<TAB>answer<TAB>supporting ids".
//    Each question gives one record: q = the story's statements so far + the question, joined by spaces,
//    k = the answer, relation = the task ("qa16", from the file name, or as given), strength "strong".
//  * CLUTRR CSV (the public data set's CSV files, RFC 4180 quoting): the header must name `query` and
//    `target` (or `target_text`) and `clean_story` or `story`. We read the story (`clean_story` when the column
//    exists and the cell is not empty, else `story` with the [ ] name markers removed), the query "('A', 'B')"
//    and the target relation r, and make q = story, k = "B is the r of A.", relation = r.
//  * ConceptNet assertion dump (tab-separated: assertion URI, relation "/r/IsA", start "/c/en/...",
//    end "/c/en/...", JSON info), read as a stream (the full dump is large; decompress it first). Only English
//    IsA and PartOf assertions are kept; a term "/c/en/ice_cream/n" reads "ice cream". IsA gives q = start,
//    k = end ("dog" -> "animal"); PartOf gives q = end, k = start (whole -> part, "car" -> "wheel").
//  * Capitals list: "capital<TAB>country" or "capital,country" lines; blank lines, '#' comments and a
//    "capital,country" header are skipped.
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "dalpha.hpp"
#include "../core/files.hpp"
#include "../core/utf8.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace dea::data {

/// Longest line the line-streamed readers accept (a real bAbI, ConceptNet or capitals line is under 4 KiB).
constexpr std::size_t kMaxLineBytes = std::size_t(1) << 20;

namespace detail {

/// Calls f(line, line_number) for each line of the file (CR of CRLF removed) until f returns false.
/// Streams the file, so it works on files too large to hold in memory; a line longer than kMaxLineBytes is a
/// dea::Error (found before it is held in memory).
template <class F>
void for_each_line(const std::string& path, F&& f) {
  std::error_code ec;
  check(!std::filesystem::is_directory(path, ec), "'", path, "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), "cannot open file '", path, "'");
  std::streambuf* sb = in.rdbuf();
  std::string line;
  std::size_t no = 0;
  for (bool more = true; more;) {
    line.clear();
    int c;
    while ((c = sb->sbumpc()) != std::char_traits<char>::eof() && c != '\n') {
      check(line.size() < kMaxLineBytes, path, ":", no + 1, ": line longer than ", kMaxLineBytes, " bytes");
      line.push_back(static_cast<char>(c));
    }
    more = c != std::char_traits<char>::eof();
    if (!more && line.empty()) break;  // no partial last line
    ++no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!f(line, no)) return;
  }
}

inline std::string basename_of(const std::string& path) {
  const std::size_t s = path.find_last_of("/\\");
  return s == std::string::npos ? path : path.substr(s + 1);
}

inline std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t p = s.find(sep, start);
    if (p == std::string_view::npos) {
      out.emplace_back(s.substr(start));
      return out;
    }
    out.emplace_back(s.substr(start, p - start));
    start = p + 1;
  }
}

inline std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------------------------------------

/// A parsed CSV file: the header, the rows and the file line on which each row starts.
struct CsvTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::size_t> row_line;

  /// Index of a column, or -1.
  long column(const std::string& name) const {
    for (std::size_t i = 0; i < header.size(); ++i)
      if (header[i] == name) return static_cast<long>(i);
    return -1;
  }
};

/// Parses RFC 4180 CSV: fields separated by `sep`, optionally quoted with '"' (a quoted field may hold the
/// separator, newlines and doubled quotes ""). The first record is the header; empty lines are skipped; every
/// row must have as many fields as the header. `name` (the file name) prefixes every error message.
inline CsvTable parse_csv(std::string_view text, const std::string& name, char sep = ',') {
  CsvTable t;
  std::vector<std::string> rec;
  std::string field;
  bool in_quotes = false;  // inside "..."
  bool quoted = false;     // the current field started with a quote
  bool closed = false;     // the current field's closing quote has been seen
  std::size_t line = 1, rec_line = 1;
  auto finish_field = [&] {
    rec.push_back(std::move(field));
    field.clear();
    quoted = closed = false;
  };
  auto finish_record = [&] {
    const bool blank = rec.empty() && field.empty() && !quoted;
    finish_field();
    if (!blank) {
      if (t.header.empty()) {
        t.header = std::move(rec);
        if (t.header[0].size() >= 3 && t.header[0].compare(0, 3, "\xEF\xBB\xBF") == 0)
          t.header[0].erase(0, 3);  // UTF-8 byte order mark
      } else {
        check(rec.size() == t.header.size(), name, ":", rec_line, ": expected ", t.header.size(), " fields, got ",
              rec.size());
        t.rows.push_back(std::move(rec));
        t.row_line.push_back(rec_line);
      }
    }
    rec.clear();
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_quotes) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';  // "" inside quotes is one quote
        ++i;
      } else if (c == '"') {
        in_quotes = false;
        closed = true;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
    } else if (c == '"') {
      check(field.empty() && !quoted, name, ":", line, ": quote inside an unquoted field");
      in_quotes = quoted = true;
    } else if (c == sep) {
      finish_field();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      finish_record();
      rec_line = ++line;
    } else {
      check(!closed, name, ":", line, ": characters after a closing quote");
      field += c;
    }
  }
  check(!in_quotes, name, ":", rec_line, ": unterminated quoted field");
  if (!rec.empty() || !field.empty() || quoted) finish_record();
  check(!t.header.empty(), name, ": empty CSV file (no header)");
  return t;
}

inline CsvTable read_csv(const std::string& path, char sep = ',') { return parse_csv(read_file(path), path, sep); }

// ---------------------------------------------------------------------------------------------------------
// bAbI
// ---------------------------------------------------------------------------------------------------------

/// The task name in a bAbI file name ("qa16_basic-induction_train.txt" -> "qa16"), or "babi".
inline std::string babi_task_from_filename(const std::string& path) {
  const std::string base = detail::basename_of(path);
  for (std::size_t i = 0; i + 2 < base.size(); ++i)
    if (base[i] == 'q' && base[i + 1] == 'a' && std::isdigit(static_cast<unsigned char>(base[i + 2]))) {
      std::size_t j = i + 2;
      while (j < base.size() && std::isdigit(static_cast<unsigned char>(base[j]))) ++j;
      return base.substr(i, j - i);
    }
  return "babi";
}

/// Longest bAbI story accepted (bytes of its statements): real stories are a few hundred bytes.
constexpr std::size_t kMaxBabiStoryBytes = std::size_t(1) << 16;

/// Records of a bAbI task file (format in the file comment), at most max_records. `task` names the relation;
/// empty = taken from the file name.
inline std::vector<Record> load_babi(const std::string& path, const std::string& task = "",
                                     std::size_t max_records = std::numeric_limits<std::size_t>::max()) {
  const std::string rel = task.empty() ? babi_task_from_filename(path) : task;
  std::vector<Record> out;
  if (max_records == 0) return out;
  std::vector<std::string> story;
  std::size_t story_bytes = 0;
  long prev_id = 0;
  detail::for_each_line(path, [&](const std::string& raw, std::size_t no) {
    const std::string_view line = trim(raw);
    if (line.empty()) return true;
    std::size_t p = 0;
    while (p < line.size() && std::isdigit(static_cast<unsigned char>(line[p]))) ++p;
    check(p > 0 && p <= 9, path, ":", no, ": expected a line number at the start of the line");
    check(p < line.size() && (line[p] == ' ' || line[p] == '\t'), path, ":", no, ": expected a space after the line number");
    const long id = std::stol(std::string(line.substr(0, p)));
    if (id == 1) {
      story.clear();
      story_bytes = 0;
    } else {
      check(id == prev_id + 1, path, ":", no, ": line number ", id, " does not follow ", prev_id,
            " (a story starts at 1 and counts up by one)");
    }
    prev_id = id;
    const std::string_view rest = trim(line.substr(p + 1));
    check(!rest.empty(), path, ":", no, ": empty sentence");
    if (rest.find('\t') == std::string_view::npos) {
      // Every question copies the story so far, so its length is capped (else a small file of one long story
      // and many questions would expand to gigabytes of records).
      story_bytes += rest.size() + 1;
      check(story_bytes <= kMaxBabiStoryBytes, path, ":", no, ": story longer than ", kMaxBabiStoryBytes,
            " bytes (a bAbI story is a few hundred)");
      story.emplace_back(rest);
      return true;
    }
    const std::vector<std::string> f = detail::split(rest, '\t');
    const std::string q(trim(f[0]));
    const std::string answer(f.size() > 1 ? trim(f[1]) : std::string_view{});
    check(!q.empty(), path, ":", no, ": empty question");
    check(!answer.empty(), path, ":", no, ": question without an answer (expected question<TAB>answer<TAB>facts)");
    check(f.size() <= 3, path, ":", no, ": too many tab-separated fields (", f.size(), ")");
    if (f.size() == 3)
      for (char c : f[2])
        check(std::isdigit(static_cast<unsigned char>(c)) || c == ' ', path, ":", no,
              ": supporting facts must be line numbers, got '", f[2], "'");
    std::vector<std::string> parts(story);
    parts.push_back(q);
    out.push_back(make_record(detail::join(parts, " "), answer, 1, "babi", rel, "strong"));
    return out.size() < max_records;
  });
  return out;
}

/// The bAbI task files of the D_alpha source: `path` itself when it is a file, else the files of the directory
/// `path` named qa16_*_train.txt, qa17_*_train.txt and qa18_*_train.txt (the tasks_1-20_v1-2 layout, e.g. its en/
/// folder), in task order (by name within a task). A directory without any is a dea::Error naming it.
inline std::vector<std::string> babi_task_files(const std::string& path) {
  std::error_code ec;
  check(std::filesystem::exists(path, ec), "'", path, "' does not exist");
  if (!std::filesystem::is_directory(path, ec)) return {path};
  std::vector<std::string> out;
  for (const char* task : {"qa16_", "qa17_", "qa18_"}) {
    std::vector<std::string> found;
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      const std::string n = e.path().filename().string();
      const std::string suffix = "_train.txt";
      if (n.rfind(task, 0) == 0 && n.size() > suffix.size() &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0 && !e.is_directory(ec))
        found.push_back(e.path().string());
    }
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  check(!ec, "cannot list the directory '", path, "': ", ec.message());
  check(!out.empty(), "the directory '", path, "' holds no bAbI task file (qa16_*_train.txt, qa17_*_train.txt or ",
        "qa18_*_train.txt)");
  return out;
}

/// Up to n records from several task files: file i contributes until the total reaches n*(i+1)/k (k files),
/// so the tasks share n about equally (the reference's cumulative quota).
inline std::vector<Record> load_babi_tasks(const std::vector<std::string>& paths, std::size_t n) {
  std::vector<Record> out;
  const std::size_t k = paths.size();
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t quota = n / k * (i + 1) + (n % k) * (i + 1) / k;  // = floor(n (i+1) / k) without overflow
    if (out.size() >= quota) continue;
    for (auto& r : load_babi(paths[i], "", quota - out.size())) out.push_back(std::move(r));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// CLUTRR
// ---------------------------------------------------------------------------------------------------------

/// Parses a CLUTRR query "('Anna', 'Bob')" into its first and last names; false if malformed.
inline bool parse_clutrr_query(std::string_view q, std::string& a, std::string& b) {
  std::string s;
  for (char c : q)
    if (c != '(' && c != ')' && c != '\'' && c != '"' && c != '[' && c != ']') s += c;
  const std::vector<std::string> parts = detail::split(s, ',');
  if (parts.size() < 2) return false;
  a = std::string(trim(parts.front()));
  b = std::string(trim(parts.back()));
  return !a.empty() && !b.empty();
}

/// Records of a CLUTRR CSV (columns in the file comment), at most max_records.
inline std::vector<Record> load_clutrr_csv(const std::string& path,
                                           std::size_t max_records = std::numeric_limits<std::size_t>::max()) {
  const CsvTable t = read_csv(path);
  const long c_clean = t.column("clean_story"), c_story = t.column("story"), c_query = t.column("query");
  long c_target = t.column("target");
  if (c_target < 0) c_target = t.column("target_text");
  check(c_clean >= 0 || c_story >= 0, path, ":1: no 'story' or 'clean_story' column");
  check(c_query >= 0, path, ":1: no 'query' column");
  check(c_target >= 0, path, ":1: no 'target' (or 'target_text') column");
  std::vector<Record> out;
  for (std::size_t r = 0; r < t.rows.size() && out.size() < max_records; ++r) {
    const auto& row = t.rows[r];
    const std::size_t line = t.row_line[r];
    std::string story;
    if (c_clean >= 0) story = std::string(trim(row[static_cast<std::size_t>(c_clean)]));
    if (story.empty() && c_story >= 0)
      for (char c : row[static_cast<std::size_t>(c_story)])
        if (c != '[' && c != ']') story += c;
    story = std::string(trim(story));
    check(!story.empty(), path, ":", line, ": empty story");
    std::string a, b;
    check(parse_clutrr_query(row[static_cast<std::size_t>(c_query)], a, b), path, ":", line,
          ": malformed query '", row[static_cast<std::size_t>(c_query)], "' (expected ('A', 'B'))");
    const std::string target(trim(row[static_cast<std::size_t>(c_target)]));
    check(!target.empty(), path, ":", line, ": empty target relation");
    out.push_back(make_record(story, b + " is the " + target + " of " + a + ".", 1, "clutrr", target, "strong"));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// ConceptNet and capitals
// ---------------------------------------------------------------------------------------------------------

/// "/c/en/ice_cream/n" -> "ice cream"; empty if the URI has no term.
inline std::string conceptnet_term(std::string_view uri) {
  const std::vector<std::string> parts = detail::split(uri, '/');
  if (parts.size() < 4) return {};
  std::string t = parts[3];
  std::replace(t.begin(), t.end(), '_', ' ');
  return std::string(trim(t));
}

/// English IsA and PartOf pairs of a ConceptNet assertion dump, at most max_records (streamed).
inline std::vector<Record> load_conceptnet_assertions(const std::string& path,
                                                      std::size_t max_records = std::numeric_limits<std::size_t>::max()) {
  std::vector<Record> out;
  if (max_records == 0) return out;
  detail::for_each_line(path, [&](const std::string& line, std::size_t no) {
    if (trim(line).empty()) return true;
    const std::vector<std::string> f = detail::split(line, '\t');
    check(f.size() >= 4, path, ":", no, ": expected tab-separated uri, relation, start, end (got ", f.size(),
          " field", f.size() == 1 ? "" : "s", ")");
    const std::string& rel = f[1];
    if (rel != "/r/IsA" && rel != "/r/PartOf") return true;
    if (f[2].rfind("/c/en/", 0) != 0 || f[3].rfind("/c/en/", 0) != 0) return true;
    const std::string x = conceptnet_term(f[2]), y = conceptnet_term(f[3]);
    check(!x.empty() && !y.empty(), path, ":", no, ": malformed concept URI");
    if (rel == "/r/PartOf")
      out.push_back(make_record(y, x, 1, "conceptnet", "partof", "strong"));
    else
      out.push_back(make_record(x, y, 1, "conceptnet", "isa", "strong"));
    return out.size() < max_records;
  });
  return out;
}

/// capital -> country records (relation "capital", source "conceptnet") of a capitals list.
inline std::vector<Record> load_capitals(const std::string& path) {
  std::vector<Record> out;
  detail::for_each_line(path, [&](const std::string& raw, std::size_t no) {
    const std::string_view line = trim(raw);
    if (line.empty() || line[0] == '#') return true;
    const char sep = line.find('\t') != std::string_view::npos ? '\t' : ',';
    const std::vector<std::string> f = detail::split(line, sep);
    check(f.size() == 2, path, ":", no, ": expected 'capital<TAB>country' or 'capital,country'");
    const std::string cap(trim(f[0])), country(trim(f[1]));
    check(!cap.empty() && !country.empty(), path, ":", no, ": empty capital or country");
    if (out.empty() && utf8::ascii_lower(cap) == "capital" && utf8::ascii_lower(country) == "country") return true;
    out.push_back(make_record(cap, country, 1, "conceptnet", "capital", "strong"));
    return true;
  });
  check(!out.empty(), path, ": no capital,country lines");
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// D_alpha from files
// ---------------------------------------------------------------------------------------------------------

/// Local files for the real sources. A source without a file (an empty path or list; for ConceptNet, neither the
/// assertions nor the capitals) is synthetic.
struct DalphaFiles {
  std::vector<std::string> babi;  ///< bAbI task files (qa16 / qa17 / qa18)
  std::string clutrr_csv;
  std::string conceptnet_csv;     ///< ConceptNet assertion dump (uncompressed); empty with capitals: capitals only
  std::string capitals;           ///< capitals list; empty = the built-in 47 capitals
  /// On a missing or malformed file: print a notice to `log` and use that source's synthetic generator
  /// (true), or throw the dea::Error (false).
  bool fallback_to_synthetic = false;
  std::ostream* log = &std::cerr;  ///< where notices go; nullptr = silent
};

/// D_alpha with real sources where files are given: per source n_per_source positives (bAbI, CLUTRR;
/// ConceptNet = the capitals followed by IsA/PartOf pairs up to n_per_source in total), each with 1:1
/// negatives, concatenated and shuffled with Rng(seed). A source without files is synthetic. A source whose
/// file fails (or yields no record) throws, or falls back to synthetic with a notice. The random draws come in the
/// synthetic build's order, so without any file the result is build_dalpha_synthetic's.
inline std::vector<Record> build_dalpha(const DalphaFiles& files, const DalphaOptions& opt = {}) {
  Rng rng(opt.seed);
  std::vector<Record> all;
  auto run = [&](const char* name, bool has_files, auto&& real, auto&& synth) {
    std::vector<Record> pos;
    bool use_synth = !has_files;
    if (has_files) {
      try {
        pos = real();
        check(!pos.empty(), "no ", name, " records in the given file(s)");
        if (files.log) *files.log << "[data] loaded real " << name << ": " << pos.size() << " positives\n";
      } catch (const Error& e) {
        if (!files.fallback_to_synthetic) throw;
        if (files.log) *files.log << "[data] real " << name << " unavailable (" << e.what() << "); using synthetic\n";
        use_synth = true;
      }
    }
    if (use_synth) pos = synth();
    for (auto& r : add_negatives(std::move(pos), rng)) all.push_back(std::move(r));
  };
  run("babi", !files.babi.empty(), [&] { return load_babi_tasks(files.babi, opt.n_per_source); },
      [&] { return generate_babi_like(opt.n_per_source, rng); });
  run("clutrr", !files.clutrr_csv.empty(), [&] { return load_clutrr_csv(files.clutrr_csv, opt.n_per_source); },
      [&] { return generate_clutrr_like(opt.n_per_source, rng); });
  run("conceptnet", !files.conceptnet_csv.empty() || !files.capitals.empty(),
      [&] {
        std::vector<Record> pos;
        if (!files.capitals.empty()) {
          pos = load_capitals(files.capitals);
        } else {
          for (const WordPair& p : knowledge::capitals)
            pos.push_back(make_record(p.q, p.k, 1, "conceptnet", "capital", "strong"));
        }
        const std::size_t want = opt.n_per_source > pos.size() ? opt.n_per_source - pos.size() : 0;
        if (!files.conceptnet_csv.empty())
          for (auto& r : load_conceptnet_assertions(files.conceptnet_csv, want)) pos.push_back(std::move(r));
        return pos;
      },
      [&] { return generate_conceptnet_like(rng); });
  shuffle(all, rng);
  return all;
}

}  // namespace dea::data
