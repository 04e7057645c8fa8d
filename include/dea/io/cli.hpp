// dea/io/cli.hpp: strict command-line parsing for the programs (examples/, bench/).
//
// Every number is read in full (no trailing junk, no empty text, no overflow) and range-checked; a bad value is a
// dea::Error that names the flag, what was expected and what was given:
//   "--steps: expected an integer in [0, 100000000], got '99999999999999999999'"
// The flag loop:
//   dea::cli::Args args(argc, argv);
//   while (args.next()) {
//     if (args.is("--steps")) steps = args.int_value(0, 100000000);
//     else if (args.is("--lr")) lr = args.double_value(0, 1e3, /*lo_open=*/true);
//     else if (args.is("--out")) out = args.value();
//     else args.unknown();          // "unknown flag '--bogus'" (before any "missing value")
//   }
#pragma once

#include "../core/error.hpp"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace dea {
namespace cli {

/// The most threads a program accepts (more is a typo, and OpenMP would try to allocate for them).
constexpr std::int64_t kMaxThreads = 4096;

[[noreturn]] inline void bad_value(const std::string& flag, const std::string& value, const std::string& expected) {
  ::dea::detail::raise(::dea::detail::concat(flag, ": expected ", expected, ", got '", value, "'"));
}

/// "[lo, hi]" or "(lo, hi]" with 6 significant digits (the bounds are round numbers: 1e+09, not 1000000000.0000001).
inline std::string range_text(double lo, double hi, bool lo_open) {
  std::ostringstream os;
  os << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
  return os.str();
}

/// An integer in [lo, hi], all of `v`.
inline std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t lo, std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || !end || *end || errno == ERANGE || x < lo || x > hi)
    bad_value(flag, v, ::dea::detail::concat("an integer in [", lo, ", ", hi, "]"));
  return static_cast<std::int64_t>(x);
}

/// A finite number in [lo, hi] (or (lo, hi] with lo_open), all of `v`.
inline double parse_double(const std::string& flag, const std::string& v, double lo, double hi, bool lo_open = false) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || !end || *end || !std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad_value(flag, v, "a number in " + range_text(lo, hi, lo_open));
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
