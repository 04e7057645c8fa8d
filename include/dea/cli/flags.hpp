// dea/train/flags.hpp: command-line parsing for every program (the `dea` subcommands, the examples, bench/).
//
// Every number is read in full (no trailing junk, no empty text, no overflow) and range-checked; a bad value is a
// dea::Error that names the flag, what was expected and what was given:
//   "--steps: expected an integer in [0, 100000000], got '99999999999999999999'"
// Two ways to use it. A declared flag set (FlagSet) holds each flag once, with its value name, default, range and
// help; it parses "--flag value" and "--flag=value" into the fields and prints the help table:
//   dea::cli::FlagSet fs("dea eval --ckpt DIR [flags]", "Evaluates a checkpoint.");
//   fs.text("ckpt", dir, "DIR", "the run directory (required)");
//   fs.integer("threads", threads, 0, dea::cli::kMaxThreads, "OpenMP threads (0 = the library default)");
//   const auto given = fs.parse(args);   // given.help: print fs.help(); given.flags: the flags on the line
// A hand-written loop (Args) for programs whose flags are few:
//   dea::cli::Args args(argc, argv);
//   while (args.next()) {
//     if (args.is("--steps")) steps = args.int_value(0, 100000000);
//     else if (args.is("--lr")) lr = args.double_value(0, 1e3, /*lo_open=*/true);
//     else args.unknown();          // "unknown flag '--bogus'" (before any "missing value")
//   }
#pragma once

#include "../core/error.hpp"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <algorithm>
#include <string>
#include <vector>

namespace dea {
namespace cli {

/// The most threads a program accepts (more is a typo, and OpenMP would try to allocate for them).
constexpr std::int64_t kMaxThreads = 4096;

[[noreturn]] inline void bad_value(const std::string& flag, const std::string& value, const std::string& expected) {
  ::dea::detail::raise(::dea::detail::concat(flag, ": expected ", expected, ", got '", value, "'"));
}

/// No upper bound for parse_int ("an integer >= lo").
constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();

/// "[lo, hi]", "(lo, hi]", "[lo, hi)" with 6 significant digits (the bounds are round numbers: 1e+09, not
/// 1000000000.0000001).
inline std::string range_text(double lo, double hi, bool lo_open, bool hi_open = false) {
  std::ostringstream os;
  os << (lo_open ? "(" : "[") << lo << ", " << hi << (hi_open ? ")" : "]");
  return os.str();
}

/// What parse_int expects: "an integer in [lo, hi]", or "an integer >= lo" when hi is kNoMax.
inline std::string int_range_text(std::int64_t lo, std::int64_t hi) {
  return hi == kNoMax ? ::dea::detail::concat("an integer >= ", lo)
                      : ::dea::detail::concat("an integer in [", lo, ", ", hi, "]");
}

/// An integer in [lo, hi], all of `v`.
inline std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t lo, std::int64_t hi = kNoMax) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || !end || *end || errno == ERANGE || x < lo || x > hi) bad_value(flag, v, int_range_text(lo, hi));
  return static_cast<std::int64_t>(x);
}

/// A finite number in [lo, hi] (either end open with lo_open / hi_open), all of `v`.
inline double parse_double(const std::string& flag, const std::string& v, double lo, double hi, bool lo_open = false,
                           bool hi_open = false) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || !end || *end || !std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo) ||
      (hi_open && x == hi))
    bad_value(flag, v, "a number in " + range_text(lo, hi, lo_open, hi_open));
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

/// A comma-separated list of finite numbers in [lo, hi] (or (lo, hi]).
inline std::vector<double> parse_double_list(const std::string& flag, const std::string& v, double lo, double hi,
                                             bool lo_open = false) {
  std::vector<double> out;
  for (const auto& item : split(v, ',')) {
    char* end = nullptr;
    const double x = std::strtod(item.c_str(), &end);
    if (item.empty() || !end || *end || !std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
      bad_value(flag, v, "a comma-separated list of numbers in " + range_text(lo, hi, lo_open));
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

/// The flags of one program or subcommand, each declared once (see the file comment). The setters keep
/// references to the fields given: the fields must outlive the FlagSet. Help shows each flag's default (the
/// field's value when it was declared) and its range.
class FlagSet {
public:
  FlagSet(std::string usage, std::string description = {}) : usage_(std::move(usage)), desc_(std::move(description)) {}

  /// What parse() found besides the values it stored.
  struct Parsed {
    std::set<std::string> flags;          ///< the flags given (names without "--")
    std::vector<std::string> positional;  ///< arguments that are not flags (when the set accepts them)
    bool help = false;                    ///< -h or --help
  };

  /// An integer flag in [lo, hi] (hi = kNoMax: no upper bound).
  template <class T>
  FlagSet& integer(const std::string& name, T& field, std::int64_t lo, std::int64_t hi, std::string help,
                   std::string value_name = "N") {
    static_assert(std::is_integral<T>::value, "FlagSet::integer: an integer field");
    return add(name, std::move(value_name), std::move(help), ::dea::detail::concat(field),
               hi == kNoMax ? ::dea::detail::concat(">= ", lo) : ::dea::detail::concat("[", lo, ", ", hi, "]"),
               [&field, lo, hi](const std::string& flag, const std::string& v) {
                 field = static_cast<T>(parse_int(flag, v, lo, hi));  // checked before narrowing
               });
  }
  /// A real flag in [lo, hi] (either end open).
  FlagSet& real(const std::string& name, double& field, double lo, double hi, bool lo_open, bool hi_open,
                std::string help, std::string value_name = "X") {
    std::ostringstream def;
    def << field;
    return add(name, std::move(value_name), std::move(help), def.str(), range_text(lo, hi, lo_open, hi_open),
               [&field, lo, hi, lo_open, hi_open](const std::string& flag, const std::string& v) {
                 field = parse_double(flag, v, lo, hi, lo_open, hi_open);
               });
  }
  /// A text flag; `non_empty` refuses "" (naming `what`, e.g. "a directory path").
  FlagSet& text(const std::string& name, std::string& field, std::string value_name, std::string help,
                bool non_empty = true, std::string what = "a non-empty value") {
    return add(name, std::move(value_name), std::move(help), field.empty() ? "none" : field, {},
               [&field, non_empty, what](const std::string& flag, const std::string& v) {
                 if (non_empty && v.empty()) bad_value(flag, v, what);
                 field = v;
               });
  }
  /// A text flag with a fixed set of values.
  FlagSet& choice(const std::string& name, std::string& field, std::vector<std::string> values, std::string help) {
    std::string vn, expected;
    for (std::size_t i = 0; i < values.size(); ++i) {
      vn += (i ? "|" : "") + values[i];
      expected += (i == 0 ? "'" : (i + 1 == values.size() ? "' or '" : "', '")) + values[i];
    }
    expected += "'";
    return add(name, vn, std::move(help), field, {},
               [&field, values, expected](const std::string& flag, const std::string& v) {
                 for (const auto& x : values)
                   if (v == x) {
                     field = v;
                     return;
                   }
                 bad_value(flag, v, expected);
               });
  }
  /// A switch (no value; "--name=1" and "--name=true" are accepted too): sets `field` to true.
  FlagSet& toggle(const std::string& name, bool& field, std::string help) {
    return add(name, {}, std::move(help), "off", {}, [&field](const std::string&, const std::string&) { field = true; });
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
    auto set = t->set;
    add(name, value_name, help.empty() ? "another name for --" + target : std::move(help), {}, {}, std::move(set));
    flags_.back().alias_of = target;
    return *this;
  }
  /// Accepts up to `max_count` positional arguments, shown in the help as `name`.
  FlagSet& positional(std::string name, std::string help, std::size_t max_count = 1) {
    pos_name_ = std::move(name);
    pos_help_ = std::move(help);
    pos_max_ = max_count;
    return *this;
  }

  bool has(const std::string& name) const { return find(name) != nullptr; }

  /// Parses `args` (no program name). Unknown flags are reported before any bad value ("unknown flag --bogus");
  /// the values are stored in the order given after the whole line was read; a flag given twice keeps the last
  /// value. dea::Error on any problem.
  Parsed parse(const std::vector<std::string>& args) const {
    Parsed p;
    std::vector<std::pair<const Flag*, std::string>> kv;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
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
      kv.emplace_back(flag, v);
      p.flags.insert(flag->alias_of.empty() ? f : flag->alias_of);
    }
    for (const auto& [flag, v] : kv) flag->set("--" + flag->name, v);
    return p;
  }
  Parsed parse(int argc, char** argv, int first = 1) const {
    return parse(std::vector<std::string>(argv + std::min(first, argc), argv + argc));
  }

  /// The help text: usage, description, and one entry per flag with its default and range.
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
      if (!extra.empty()) os << " (" << extra << ")";
      os << "\n";
    }
    os << "  -h, --help\n      this text\n";
    return os.str();
  }

private:
  struct Flag {
    std::string name, value_name, help, default_text, range;
    std::function<void(const std::string&, const std::string&)> set;
    std::string alias_of;  ///< the flag this one is another name for (empty: none)
  };
  FlagSet& add(const std::string& name, std::string value_name, std::string help, std::string default_text,
               std::string range, std::function<void(const std::string&, const std::string&)> set) {
    check(!has(name), "FlagSet: flag --", name, " declared twice");
    flags_.push_back({name, std::move(value_name), std::move(help), std::move(default_text), std::move(range),
                      std::move(set), {}});
    return *this;
  }
  const Flag* find(const std::string& name) const {
    for (const Flag& f : flags_)
      if (f.name == name) return &f;
    return nullptr;
  }

  std::string usage_, desc_;
  std::vector<Flag> flags_;
  std::string pos_name_, pos_help_;
  std::size_t pos_max_ = 0;
};

/// The flag loop of a program (see the file comment).
class Args {
public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}

  /// Moves to the next argument; false at the end.
  bool next() {
    ++i_;
    return i_ < argc_;
  }
  /// The current argument.
  std::string arg() const { return argv_[i_]; }
  bool is(const char* flag) const { return arg() == flag; }
  /// The value after the current flag (consumed); "--flag: missing value" at the end of the line.
  std::string value() {
    const std::string flag = arg();
    ::dea::check(i_ + 1 < argc_, flag, ": missing value");
    return argv_[++i_];
  }
  std::int64_t int_value(std::int64_t lo, std::int64_t hi) {
    const std::string flag = arg();
    return parse_int(flag, value(), lo, hi);
  }
  double double_value(double lo, double hi, bool lo_open = false) {
    const std::string flag = arg();
    return parse_double(flag, value(), lo, hi, lo_open);
  }
  /// --threads N: an integer in [1, kMaxThreads].
  int threads_value() { return static_cast<int>(int_value(1, kMaxThreads)); }
  [[noreturn]] void unknown() const {
    ::dea::detail::raise(arg().compare(0, 1, "-") == 0 ? ::dea::detail::concat("unknown flag '", arg(), "'")
                                                       : ::dea::detail::concat("unexpected argument '", arg(), "'"));
  }

private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

}  // namespace cli
}  // namespace dea
