// dea/cli/flags.hpp: command-line parsing for every program (the `dea` subcommands, the examples, bench/).
//
// Every number is read in full (no trailing junk, no empty text, no overflow) and range-checked; a bad value is a
// dea::Error that names the flag, what was expected and what was given:
//   "--steps: expected an integer in [0, 100000000], got '99999999999999999999'"
// A range is a value (IntRange::closed(1, 10), Range::open_closed(0, 1e9), Range::closed_open(0, 1)), written once
// and shown by the help text, the parse error and any later check alike. Flag names take '_' and '-' alike: a flag
// declared as "max_len" is also "--max-len" (and "no-plots" is also "--no_plots").
//
// Three ways to use it. A declared flag set (FlagSet) holds each flag once, with its value name, default, range and
// help; it parses "--flag value" and "--flag=value" into the fields and prints the help table:
//   dea::cli::FlagSet fs("dea eval --ckpt DIR [flags]", "Evaluates a checkpoint.");
//   fs.text("ckpt", dir, "DIR", "the run directory (required)");
//   fs.integer("threads", threads, dea::cli::IntRange::closed(0, dea::cli::kMaxThreads), "OpenMP threads");
//   const auto given = fs.parse(args);   // given.help: print fs.help(); given.flags: the flags on the line
// A flag table (FlagTable<Config>, below) declares the flags of a configuration struct by member, once: it binds
// them to a FlagSet for parsing and help, checks a configuration read from a file against the same ranges and
// choices, knows which flags a resumed run may change, and fills in what a given flag implies.
// A hand-written loop (Args) for programs whose flags are few:
//   dea::cli::Args args(argc, argv);
//   while (args.next()) {
//     if (args.is("--steps")) steps = args.int_value(0, 100000000);
//     else if (args.is("--lr")) lr = args.double_value(dea::cli::Range::open_closed(0, 1e3));
//     else args.unknown();          // "unknown flag '--bogus'" (before any "missing value")
//   }
// "--" ends the options in both: what follows it is positional, never a flag.
#pragma once

#include "../core/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dea {
namespace cli {

/// The most threads a program accepts (more is a typo, and OpenMP would try to allocate for them).
constexpr std::int64_t kMaxThreads = 4096;

/// No upper bound for an integer flag ("an integer >= lo").
constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();

[[noreturn]] inline void bad_value(const std::string& flag, const std::string& value, const std::string& expected) {
  ::dea::detail::raise(::dea::detail::concat(flag, ": expected ", expected, ", got '", value, "'"));
}

/// The range of a real flag: an interval whose ends are each closed or open. Shown as "[lo, hi]", "(lo, hi]",
/// "[lo, hi)" with 6 significant digits (the bounds are round numbers: 1e+09, not 1000000000.0000001).
class Range {
public:
  static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
  static Range open_closed(double lo, double hi) { return {lo, hi, true, false}; }
  static Range closed_open(double lo, double hi) { return {lo, hi, false, true}; }
  static Range open(double lo, double hi) { return {lo, hi, true, true}; }

  double lo() const { return lo_; }
  double hi() const { return hi_; }
  /// x is finite and inside.
  bool contains(double x) const {
    return std::isfinite(x) && x >= lo_ && x <= hi_ && !(lo_open_ && x == lo_) && !(hi_open_ && x == hi_);
  }
  std::string text() const {
    std::ostringstream os;
    os << (lo_open_ ? "(" : "[") << lo_ << ", " << hi_ << (hi_open_ ? ")" : "]");
    return os.str();
  }

private:
  Range(double lo, double hi, bool lo_open, bool hi_open) : lo_(lo), hi_(hi), lo_open_(lo_open), hi_open_(hi_open) {}
  double lo_, hi_;
  bool lo_open_, hi_open_;
};

/// The range of an integer flag: [lo, hi], or every integer >= lo.
class IntRange {
public:
  static constexpr IntRange closed(std::int64_t lo, std::int64_t hi) { return {lo, hi}; }
  static constexpr IntRange at_least(std::int64_t lo) { return {lo, kNoMax}; }

  constexpr std::int64_t lo() const { return lo_; }
  constexpr std::int64_t hi() const { return hi_; }
  constexpr bool contains(std::int64_t x) const { return x >= lo_ && x <= hi_; }
  /// "[lo, hi]", or ">= lo" without an upper bound.
  std::string text() const {
    return hi_ == kNoMax ? ::dea::detail::concat(">= ", lo_) : ::dea::detail::concat("[", lo_, ", ", hi_, "]");
  }
  /// What a bad value was expected to be: "an integer in [lo, hi]", or "an integer >= lo".
  std::string expected() const {
    return hi_ == kNoMax ? ::dea::detail::concat("an integer >= ", lo_)
                         : ::dea::detail::concat("an integer in [", lo_, ", ", hi_, "]");
  }

private:
  constexpr IntRange(std::int64_t lo, std::int64_t hi) : lo_(lo), hi_(hi) {}
  std::int64_t lo_, hi_;
};

/// The values of a choice flag, in the order the help lists them.
class Choices {
public:
  Choices(std::initializer_list<const char*> values) : values_(values.begin(), values.end()) {}
  explicit Choices(std::vector<std::string> values) : values_(std::move(values)) {}

  const std::vector<std::string>& values() const { return values_; }
  bool contains(const std::string& v) const { return std::find(values_.begin(), values_.end(), v) != values_.end(); }
  /// "a|b|c": the help's value name.
  std::string value_name() const {
    std::string s;
    for (std::size_t i = 0; i < values_.size(); ++i) s += (i ? "|" : "") + values_[i];
    return s;
  }
  /// "'a', 'b' or 'c'": what a bad value was expected to be.
  std::string expected() const {
    std::string s;
    for (std::size_t i = 0; i < values_.size(); ++i)
      s += (i == 0 ? "'" : (i + 1 == values_.size() ? "' or '" : "', '")) + values_[i];
    return s + "'";
  }

private:
  std::vector<std::string> values_;
};

/// Whether a text flag accepts the empty text.
enum class Empty { refused, allowed };

/// The name of a flag as its table keeps it: '-' and '_' are one character ("max-len" is "max_len").
inline std::string flag_key(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

/// An integer in `range`, all of `v`.
inline std::int64_t parse_int(const std::string& flag, const std::string& v, IntRange range) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || !end || *end || errno == ERANGE || !range.contains(x)) bad_value(flag, v, range.expected());
  return static_cast<std::int64_t>(x);
}
/// An integer in [lo, hi], all of `v`.
inline std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t lo,
                              std::int64_t hi = kNoMax) {
  return parse_int(flag, v, IntRange::closed(lo, hi));
}

/// A finite number in `range`, all of `v`.
inline double parse_double(const std::string& flag, const std::string& v, Range range) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || !end || *end || !range.contains(x)) bad_value(flag, v, "a number in " + range.text());
  return x;
}

/// Splits `v` at `sep` (empty pieces kept, so "1,,2" is caught by the item parser).
inline std::vector<std::string> split(const std::string& v, char sep) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (true) {
    const std::size_t j = v.find(sep, i);
    out.push_back(v.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) return out;
    i = j + 1;
  }
}

/// A comma-separated list of integers in [lo, hi].
inline std::vector<std::int64_t> parse_int_list(const std::string& flag, const std::string& v, std::int64_t lo,
                                                std::int64_t hi) {
  std::vector<std::int64_t> out;
  for (const auto& item : split(v, ',')) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || !end || *end || errno == ERANGE || x < lo || x > hi)
      bad_value(flag, v, ::dea::detail::concat("a comma-separated list of integers in [", lo, ", ", hi, "]"));
    out.push_back(static_cast<std::int64_t>(x));
  }
  return out;
}

/// A comma-separated list of finite numbers in `range`.
inline std::vector<double> parse_double_list(const std::string& flag, const std::string& v, Range range) {
  std::vector<double> out;
  for (const auto& item : split(v, ',')) {
    char* end = nullptr;
    const double x = std::strtod(item.c_str(), &end);
    if (item.empty() || !end || *end || !range.contains(x))
      bad_value(flag, v, "a comma-separated list of numbers in " + range.text());
    out.push_back(x);
  }
  return out;
}

/// Comma-separated integers and inclusive ranges a-b ("0-7,9") in [lo, hi], at most `max_count` values in all.
inline std::vector<std::int64_t> parse_int_ranges(const std::string& flag, const std::string& v, std::int64_t lo,
                                                  std::int64_t hi, std::size_t max_count) {
  const std::string expected =
      ::dea::detail::concat("comma-separated integers or ranges a-b (a <= b) in [", lo, ", ", hi, "], at most ",
                            max_count, " values");
  std::vector<std::int64_t> out;
  for (const auto& item : split(v, ',')) {
    const std::size_t dash = item.find('-', 1);  // a leading '-' would be a sign: refused by the range below
    const std::string a = item.substr(0, dash), b = dash == std::string::npos ? a : item.substr(dash + 1);
    std::int64_t x0 = 0, x1 = 0;
    for (auto [text, x] : {std::pair<const std::string&, std::int64_t*>{a, &x0}, {b, &x1}}) {
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || !end || *end || errno == ERANGE || n < lo || n > hi) bad_value(flag, v, expected);
      *x = static_cast<std::int64_t>(n);
    }
    if (x1 < x0 || static_cast<std::uint64_t>(x1 - x0) >= max_count - out.size()) bad_value(flag, v, expected);
    for (std::int64_t x = x0; x <= x1; ++x) out.push_back(x);
  }
  return out;
}

/// The one line a program prints for an error: "dea train: <message>\n". The library's errors start with "dea: "
/// (core/error.hpp); a program that prints its own name drops it, so that a message carries one prefix.
inline std::string message(const std::string& program, const std::string& what) {
  return program + ": " + without_error_prefix(what) + "\n";
}
inline std::string message(const std::string& program, const std::exception& e) { return message(program, e.what()); }

/// The flags of one program or subcommand, each declared once (see the file comment). The setters keep
/// references to the fields given: the fields must outlive the FlagSet. Help shows each flag's default (the
/// field's value when it was declared) and its range.
class FlagSet {
public:
  FlagSet(std::string usage, std::string description = {}) : usage_(std::move(usage)), desc_(std::move(description)) {}

  /// What parse() found besides the values it stored.
  struct Parsed {
    std::set<std::string> flags;          ///< the flags given (their declared names, without "--")
    std::vector<std::string> positional;  ///< arguments that are not flags (when the set accepts them)
    bool help = false;                    ///< -h or --help
  };

  /// An integer flag in `range`.
  template <class T>
  FlagSet& integer(const std::string& name, T& field, IntRange range, std::string help, std::string value_name = "N") {
    static_assert(std::is_integral<T>::value, "FlagSet::integer: an integer field");
    return add(name, std::move(value_name), std::move(help), ::dea::detail::concat(field), range.text(),
               [&field, range](const std::string& flag, const std::string& v) {
                 field = static_cast<T>(parse_int(flag, v, range));  // checked before narrowing
               });
  }
  /// An integer flag in [lo, hi] (hi = kNoMax: no upper bound).
  template <class T>
  FlagSet& integer(const std::string& name, T& field, std::int64_t lo, std::int64_t hi, std::string help,
                   std::string value_name = "N") {
    return integer(name, field, IntRange::closed(lo, hi), std::move(help), std::move(value_name));
  }
  /// A real flag in `range`.
  FlagSet& real(const std::string& name, double& field, Range range, std::string help, std::string value_name = "X") {
    std::ostringstream def;
    def << field;
    return add(name, std::move(value_name), std::move(help), def.str(), range.text(),
               [&field, range](const std::string& flag, const std::string& v) {
                 field = parse_double(flag, v, range);
               });
  }
  /// A text flag; Empty::refused refuses "" (naming `what`, e.g. "a directory path").
  FlagSet& text(const std::string& name, std::string& field, std::string value_name, std::string help,
                Empty empty = Empty::refused, std::string what = "a non-empty value") {
    return add(name, std::move(value_name), std::move(help), field.empty() ? "none" : field, {},
               [&field, empty, what](const std::string& flag, const std::string& v) {
                 if (empty == Empty::refused && v.empty()) bad_value(flag, v, what);
                 field = v;
               });
  }
  /// A text flag with a fixed set of values.
  FlagSet& choice(const std::string& name, std::string& field, Choices values, std::string help) {
    const std::string vn = values.value_name();
    return add(name, vn, std::move(help), field, {}, [&field, values](const std::string& flag, const std::string& v) {
      if (!values.contains(v)) bad_value(flag, v, values.expected());
      field = v;
    });
  }
  /// A switch (no value; "--name=1" and "--name=true" are accepted too): sets `field` to true.
  FlagSet& toggle(const std::string& name, bool& field, std::string help) {
    return add(name, {}, std::move(help), "off", {},
               [&field](const std::string&, const std::string&) { field = true; });
  }
  /// Any other flag: `set(flag, value)` parses and stores it (dea::Error on a bad value).
  FlagSet& custom(const std::string& name, std::string value_name, std::string default_text, std::string range,
                  std::string help, std::function<void(const std::string&, const std::string&)> set) {
    return add(name, std::move(value_name), std::move(help), std::move(default_text), std::move(range), std::move(set));
  }
  /// Another name for the declared flag `target` (e.g. the reference's spelling): "--name value" sets target's
  /// field, and parse() reports it as `target` in Parsed::flags. A bad value is named as given.
  FlagSet& alias(const std::string& name, const std::string& target, std::string help = {}) {
    const Flag* t = find(target);
    check(t != nullptr && t->alias_of.empty(), "FlagSet::alias: --", target, " is not a declared flag");
    const std::string value_name = t->value_name;
    const std::string canonical = t->name;
    auto set = t->set;
    add(name, value_name, help.empty() ? "another name for --" + target : std::move(help), {}, {}, std::move(set));
    flags_.back().alias_of = canonical;
    return *this;
  }
  /// Adds `text` to the help of the flag declared last, after its default and range ("may change on --resume").
  FlagSet& note(std::string text) {
    check(!flags_.empty(), "FlagSet::note: no flag declared yet");
    flags_.back().notes.push_back(std::move(text));
    return *this;
  }
  /// Accepts up to `max_count` positional arguments, shown in the help as `name`.
  FlagSet& positional(std::string name, std::string help, std::size_t max_count = 1) {
    pos_name_ = std::move(name);
    pos_help_ = std::move(help);
    pos_max_ = max_count;
    return *this;
  }

  /// The exit statuses of the program, shown at the end of the help as "Exit status: <text>"
  /// (e.g. "0 done, 1 failure, 2 bad command line").
  FlagSet& exit_status(std::string text) {
    exit_status_ = std::move(text);
    return *this;
  }
  const std::string& exit_status() const { return exit_status_; }

  /// Whether `name` is declared (in either spelling, '_' or '-').
  bool has(const std::string& name) const { return find(name) != nullptr; }

  /// Parses `args` (no program name). Unknown flags are reported before any bad value ("unknown flag --bogus");
  /// the values are stored in the order given after the whole line was read; a flag given twice keeps the last
  /// value. "--" ends the options: every argument after it is positional (a file named "-x" or "--help"), and is
  /// refused when the set takes none. dea::Error on any problem.
  Parsed parse(const std::vector<std::string>& args) const {
    Parsed p;
    std::vector<std::pair<const Flag*, std::pair<std::string, std::string>>> kv;  // flag, (as given, value)
    bool options_ended = false;  // after "--" every argument is positional, even one that starts with '-'
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (options_ended) {
        check(p.positional.size() < pos_max_, "unexpected argument '", a, "' after '--'",
              pos_max_ == 0 ? std::string(" (this command takes no positional argument)")
                            : ::dea::detail::concat(" (at most ", pos_max_, " ", pos_name_, ")"));
        p.positional.push_back(a);
        continue;
      }
      if (a == "--") {
        options_ended = true;
        continue;
      }
      if (a == "-h" || a == "--help") {
        p.help = true;
        continue;
      }
      if (a.size() < 2 || a.compare(0, 2, "--") != 0) {
        if (a.size() > 1 && a[0] == '-') ::dea::detail::raise("unknown flag " + a);
        check(p.positional.size() < pos_max_, "unexpected argument '", a, "'",
              pos_max_ == 0 ? std::string(" (flags start with --)")
                            : ::dea::detail::concat(" (at most ", pos_max_, " ", pos_name_, ")"));
        p.positional.push_back(a);
        continue;
      }
      std::string f = a.substr(2), v;
      const std::size_t eq = f.find('=');
      const bool has_eq = eq != std::string::npos;
      if (has_eq) {
        v = f.substr(eq + 1);
        f = f.substr(0, eq);
      }
      const Flag* flag = find(f);
      // an unknown flag is reported as such, not as "missing value" at the end of the line
      check(flag != nullptr, "unknown flag --", f);
      if (flag->value_name.empty()) {
        check(!has_eq || v == "1" || v == "true", "--", f, ": takes no value, got '", v, "'");
      } else if (!has_eq) {
        check(i + 1 < args.size() && args[i + 1].compare(0, 2, "--") != 0, "--", f, ": missing value",
              i + 1 < args.size() ? ::dea::detail::concat(" (the next argument is the flag '", args[i + 1], "')") : "");
        v = args[++i];
      }
      kv.push_back({flag, {f, v}});
      p.flags.insert(flag->alias_of.empty() ? flag->name : flag->alias_of);
    }
    for (const auto& [flag, given] : kv) flag->set("--" + given.first, given.second);
    return p;
  }
  Parsed parse(int argc, char** argv, int first = 1) const {
    return parse(std::vector<std::string>(argv + std::min(first, argc), argv + argc));
  }

  /// The help text: usage, description, and one entry per flag with its default, range and notes.
  std::string help() const {
    std::ostringstream os;
    os << "usage: " << usage_ << "\n";
    if (!desc_.empty()) os << "\n" << desc_ << "\n";
    if (!pos_name_.empty()) os << "\n  " << pos_name_ << "\n      " << pos_help_ << "\n";
    if (!flags_.empty()) os << "\nflags:\n";
    for (const Flag& f : flags_) {
      os << "  --" << f.name << (f.value_name.empty() ? "" : " " + f.value_name) << "\n      " << f.help;
      std::string extra;
      if (!f.value_name.empty() && !f.default_text.empty()) extra = "default " + f.default_text;
      if (!f.range.empty()) extra += (extra.empty() ? "" : ", ") + std::string("range ") + f.range;
      for (const std::string& n : f.notes) extra += (extra.empty() ? "" : "; ") + n;
      if (!extra.empty()) os << " (" << extra << ")";
      os << "\n";
    }
    os << "  -h, --help\n      this text\n";
    if (pos_max_ > 0) os << "  --\n      ends the flags: what follows is " << pos_name_ << ", even when it starts with '-'\n";
    if (!exit_status_.empty()) os << "\nExit status: " << exit_status_ << "\n";
    return os.str();
  }

private:
  struct Flag {
    std::string name, value_name, help, default_text, range;
    std::function<void(const std::string&, const std::string&)> set;
    std::string alias_of;            ///< the flag this one is another name for (empty: none)
    std::vector<std::string> notes;  ///< shown after the default and range
  };
  FlagSet& add(const std::string& name, std::string value_name, std::string help, std::string default_text,
               std::string range, std::function<void(const std::string&, const std::string&)> set) {
    check(!has(name), "FlagSet: flag --", name, " declared twice");
    flags_.push_back({name, std::move(value_name), std::move(help), std::move(default_text), std::move(range),
                      std::move(set), {}, {}});
    return *this;
  }
  const Flag* find(const std::string& name) const {
    const std::string key = flag_key(name);
    for (const Flag& f : flags_)
      if (flag_key(f.name) == key) return &f;
    return nullptr;
  }

  std::string usage_, desc_;
  std::vector<Flag> flags_;
  std::string pos_name_, pos_help_;
  std::size_t pos_max_ = 0;
  std::string exit_status_;
};

/// The flag loop of a program (see the file comment). is() takes '_' and '-' alike. "--" ends the options, as in
/// FlagSet: next() steps over it, and every argument after it is positional (is() matches no flag there, so a
/// "--steps" after "--" is not the flag), which these programs refuse through unknown():
///   "unexpected argument '--steps' after '--' (this program takes no positional argument)".
class Args {
public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}

  /// Moves to the next argument, over the first "--"; false at the end.
  bool next() {
    ++i_;
    if (!options_ended_ && i_ < argc_ && std::string(argv_[i_]) == "--") {
      options_ended_ = true;
      ++i_;
    }
    return i_ < argc_;
  }
  /// The current argument.
  std::string arg() const { return argv_[i_]; }
  /// The current argument came after "--": an operand, never a flag.
  bool options_ended() const { return options_ended_; }
  /// The current argument is `flag` ("--max_len" matches "--max-len" too); never after "--".
  bool is(const char* flag) const {
    if (options_ended_) return false;
    const std::string a = arg();
    return a.compare(0, 2, "--") == 0 ? flag_key(a) == flag_key(flag) : a == flag;
  }
  /// The value after the current flag (consumed); "--flag: missing value" at the end of the line.
  std::string value() {
    const std::string flag = arg();
    ::dea::check(i_ + 1 < argc_, flag, ": missing value");
    return argv_[++i_];
  }
  std::int64_t int_value(std::int64_t lo, std::int64_t hi) { return int_value(IntRange::closed(lo, hi)); }
  std::int64_t int_value(IntRange range) {
    const std::string flag = arg();
    return parse_int(flag, value(), range);
  }
  double double_value(Range range) {
    const std::string flag = arg();
    return parse_double(flag, value(), range);
  }
  /// --threads N: an integer in [1, kMaxThreads].
  int threads_value() { return static_cast<int>(int_value(1, kMaxThreads)); }
  [[noreturn]] void unknown() const {
    if (options_ended_)
      ::dea::detail::raise(::dea::detail::concat("unexpected argument '", arg(),
                                                 "' after '--' (this program takes no positional argument)"));
    ::dea::detail::raise(arg().compare(0, 1, "-") == 0 ? ::dea::detail::concat("unknown flag '", arg(), "'")
                                                       : ::dea::detail::concat("unexpected argument '", arg(), "'"));
  }

private:
  int argc_;
  char** argv_;
  int i_ = 0;
  bool options_ended_ = false;
};

/// The flags of a configuration struct `Config`, each declared once by member: name, default (the member's
/// initialiser), range or choices, help, whether a resumed run may change it and what giving it implies. From the
/// one declaration come
///   bind(fs, c)               the flags on a FlagSet (parsing into c, the help with default, range and notes),
///   check(c)                  the range and choice of every field, for a configuration read from a file or code,
///   resumable_names()         the flags a resumed run may change, and copy_resumable() to take their new values,
///   apply_implications(c, g)  the values the given flags imply (a flag that applies to one value of a choice
///                             sets that choice, unless the choice itself was given).
/// A choice refused with a value_hint (set_value_hint) names the hint instead of the list of choices (a value that
/// another program writes and this one cannot rebuild).
///   cli::FlagTable<Cfg> t;
///   t.integer("steps", &Cfg::steps, cli::IntRange::at_least(1), "optimiser steps").resumable();
///   t.text("text", &Cfg::text, "FILE", "the corpus", cli::Empty::allowed).implies("data_source", "text");
template <class Config>
class FlagTable {
public:
  template <class T, class C>
  FlagTable& integer(const std::string& name, T C::*member, IntRange range, std::string help,
                     std::string value_name = "N") {
    static_assert(std::is_integral<T>::value && !std::is_same<T, bool>::value, "FlagTable::integer: an integer field");
    T Config::*field = member;
    Flag& f = add(name, field);
    f.declare = [field, range, help, value_name](FlagSet& fs, Config& c, const std::string& n) {
      fs.integer(n, c.*field, range, help, value_name);
    };
    f.check = [field, range, name](const Config& c) {
      const auto v = c.*field;
      bool in = false;
      if constexpr (std::is_unsigned<T>::value)  // beyond int64: inside a range without an upper bound
        in = static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(kNoMax)
                 ? range.hi() == kNoMax
                 : range.contains(static_cast<std::int64_t>(v));
      else
        in = range.contains(static_cast<std::int64_t>(v));
      ::dea::check(in, "--", name, ": ", v, " is outside the range ", range.text());
    };
    f.value_text = [field](const Config& c) { return ::dea::detail::concat(c.*field); };
    f.set_text = [field, range, name](Config& c, const std::string& v) {
      c.*field = static_cast<T>(parse_int("--" + name, v, range));
    };
    return *this;
  }
  template <class C>
  FlagTable& real(const std::string& name, double C::*member, Range range, std::string help,
                  std::string value_name = "X") {
    double Config::*field = member;
    Flag& f = add(name, field);
    f.declare = [field, range, help, value_name](FlagSet& fs, Config& c, const std::string& n) {
      fs.real(n, c.*field, range, help, value_name);
    };
    f.check = [field, range, name](const Config& c) {
      ::dea::check(range.contains(c.*field), "--", name, ": ", c.*field, " is outside the range ", range.text());
    };
    f.value_text = [field](const Config& c) { return ::dea::detail::concat(c.*field); };
    f.set_text = [field, range, name](Config& c, const std::string& v) {
      c.*field = parse_double("--" + name, v, range);
    };
    return *this;
  }
  template <class C>
  FlagTable& choice(const std::string& name, std::string C::*member, Choices values, std::string help) {
    std::string Config::*field = member;
    Flag& f = add(name, field);
    const auto refuse = [hint = hint_, values](const std::string& flag, const std::string& v) {
      const std::string why = *hint ? (*hint)(flag_key(flag.substr(2)), v) : std::string();
      if (!why.empty()) ::dea::detail::raise(::dea::detail::concat(flag, " '", v, "': ", why));
      bad_value(flag, v, values.expected());
    };
    f.declare = [field, values, help, refuse](FlagSet& fs, Config& c, const std::string& n) {
      fs.custom(n, values.value_name(), c.*field, {}, help,
                [&c, field, values, refuse](const std::string& flag, const std::string& v) {
                  if (!values.contains(v)) refuse(flag, v);
                  c.*field = v;
                });
    };
    f.check = [field, values, refuse, name](const Config& c) {
      if (!values.contains(c.*field)) refuse("--" + name, c.*field);
    };
    f.value_text = [field](const Config& c) { return c.*field; };
    f.set_text = [field](Config& c, const std::string& v) { c.*field = v; };
    return *this;
  }
  /// A text flag; Empty::refused refuses "" on the command line (naming `what`).
  template <class C>
  FlagTable& text(const std::string& name, std::string C::*member, std::string value_name, std::string help,
                  Empty empty = Empty::refused, std::string what = "a non-empty value") {
    std::string Config::*field = member;
    Flag& f = add(name, field);
    f.declare = [field, value_name, help, empty, what](FlagSet& fs, Config& c, const std::string& n) {
      fs.text(n, c.*field, value_name, help, empty, what);
    };
    f.value_text = [field](const Config& c) { return c.*field; };
    f.set_text = [field](Config& c, const std::string& v) { c.*field = v; };
    return *this;
  }
  template <class C>
  FlagTable& toggle(const std::string& name, bool C::*member, std::string help) {
    bool Config::*field = member;
    Flag& f = add(name, field);
    f.declare = [field, help](FlagSet& fs, Config& c, const std::string& n) { fs.toggle(n, c.*field, help); };
    f.takes_value = false;
    f.value_text = [field](const Config& c) { return std::string(c.*field ? "true" : "false"); };
    f.set_text = [field](Config& c, const std::string&) { c.*field = true; };
    return *this;
  }
  /// Any other flag of the member `member`: `set(c, flag, value)` parses and stores it (dea::Error on a bad value).
  template <class T, class C>
  FlagTable& custom(const std::string& name, T C::*member, std::string value_name, std::string default_text,
                    std::string range_text, std::string help,
                    std::function<void(Config&, const std::string&, const std::string&)> set) {
    T Config::*field = member;
    Flag& f = add(name, field);
    f.declare = [value_name, default_text, range_text, help, set](FlagSet& fs, Config& c, const std::string& n) {
      fs.custom(n, value_name, default_text, range_text, help,
                [&c, set](const std::string& flag, const std::string& v) { set(c, flag, v); });
    };
    f.set_text = [set, name](Config& c, const std::string& v) { set(c, "--" + name, v); };
    return *this;
  }

  /// Another name of the flag declared last (e.g. the reference's spelling).
  FlagTable& alias(std::string name, std::string help = {}) {
    last().aliases.push_back({std::move(name), std::move(help)});
    return *this;
  }
  /// A resumed run may give the flag declared last a new value (else it must repeat the saved one).
  FlagTable& resumable() {
    last().resumable = true;
    return *this;
  }
  /// Giving the flag declared last implies `flag` = `value` (unless `flag` is given too).
  FlagTable& implies(std::string flag, std::string value) {
    return implies_when({}, std::move(flag), std::move(value));
  }
  /// Giving the flag declared last with the value `when` implies `flag` = `value` (unless `flag` is given too).
  FlagTable& implies_when(std::string when, std::string flag, std::string value) {
    last().implies.push_back({std::move(when), std::move(flag), std::move(value)});
    return *this;
  }
  /// Why a choice value is refused, when there is more to say than the list of choices (empty: nothing more).
  FlagTable& set_value_hint(std::function<std::string(const std::string& flag, const std::string& value)> hint) {
    *hint_ = std::move(hint);
    return *this;
  }

  /// Declares every flag on `fs`, storing into `c` (the defaults shown are c's values now).
  void bind(FlagSet& fs, Config& c) const {
    for (const Flag& f : flags_) {
      f.declare(fs, c, f.name);
      if (f.resumable) fs.note("a resumed run may change it");
      for (const Implication& i : f.implies) {
        const Flag* target = find(i.flag);
        const std::string what = target && !target->takes_value ? "--" + i.flag : "--" + i.flag + " " + i.value;
        fs.note(i.when.empty() ? "implies " + what : ::dea::detail::concat("--", f.name, " ", i.when, " implies ", what));
      }
      for (const auto& [name, help] : f.aliases) fs.alias(name, f.name, help);
    }
  }
  /// The range or choice of every field that has one (dea::Error naming the first flag outside).
  void check(const Config& c) const {
    for (const Flag& f : flags_)
      if (f.check) f.check(c);
  }
  /// The declared names (aliases not included).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Flag& f : flags_) out.push_back(f.name);
    return out;
  }
  bool has(const std::string& name) const { return find(name) != nullptr; }
  /// The flags a resumed run may change.
  std::set<std::string> resumable_names() const {
    std::set<std::string> out;
    for (const Flag& f : flags_)
      if (f.resumable) out.insert(f.name);
    return out;
  }
  /// Copies the value of the resumable flag `name` from `from` into `to` (dea::Error for any other flag).
  void copy_resumable(const std::string& name, const Config& from, Config& to) const {
    const Flag* f = find(name);
    ::dea::check(f != nullptr && f->resumable, "FlagTable: --", name, " is not a resumable flag");
    f->copy(from, to);
  }
  /// Fills in what the `given` flags imply, following implications of implied flags too; a flag given explicitly
  /// is never changed (a contradiction is left to the configuration's checks, which name both flags). Returns the
  /// flags it set.
  std::set<std::string> apply_implications(Config& c, const std::set<std::string>& given) const {
    std::set<std::string> known = given, implied;
    for (bool changed = true; changed;) {
      changed = false;
      for (const Flag& f : flags_) {
        if (!known.count(f.name)) continue;
        for (const Implication& i : f.implies) {
          if (known.count(i.flag) || (!i.when.empty() && (!f.value_text || f.value_text(c) != i.when))) continue;
          const Flag* target = find(i.flag);
          ::dea::check(target != nullptr, "FlagTable: --", f.name, " implies the undeclared flag --", i.flag);
          target->set_text(c, i.value);
          known.insert(i.flag);
          implied.insert(i.flag);
          changed = true;
        }
      }
    }
    return implied;
  }

private:
  struct Implication {
    std::string when, flag, value;
  };
  struct Flag {
    std::string name;
    std::function<void(FlagSet&, Config&, const std::string&)> declare;
    std::function<void(const Config&)> check;  ///< empty: no range or choice
    std::function<void(const Config&, Config&)> copy;
    std::function<std::string(const Config&)> value_text;
    std::function<void(Config&, const std::string&)> set_text;
    bool resumable = false;
    bool takes_value = true;  ///< false: a switch
    std::vector<Implication> implies;
    std::vector<std::pair<std::string, std::string>> aliases;  ///< name, help
  };
  template <class T>
  Flag& add(const std::string& name, T Config::*field) {
    ::dea::check(find(name) == nullptr, "FlagTable: flag --", name, " declared twice");
    Flag f;
    f.name = name;
    f.copy = [field](const Config& from, Config& to) { to.*field = from.*field; };
    flags_.push_back(std::move(f));
    return flags_.back();
  }
  Flag& last() {
    ::dea::check(!flags_.empty(), "FlagTable: no flag declared yet");
    return flags_.back();
  }
  const Flag* find(const std::string& name) const {
    const std::string key = flag_key(name);
    for (const Flag& f : flags_)
      if (flag_key(f.name) == key) return &f;
    return nullptr;
  }

  std::vector<Flag> flags_;
  using Hint = std::function<std::string(const std::string&, const std::string&)>;
  std::shared_ptr<Hint> hint_ = std::make_shared<Hint>();  ///< shared with the choices' checks (set at any time)
};
}  // namespace cli
}  // namespace dea
