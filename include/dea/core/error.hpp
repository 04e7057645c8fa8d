// dea/core/error.hpp: the library's error type and argument checks.
//
// Every violated precondition at an API boundary throws dea::Error (an std::invalid_argument) whose message
// names the argument, what was expected and what was found.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dea {

/// Thrown for a bad argument, a bad shape, non-finite input or a malformed file.
class Error : public std::invalid_argument {
public:
  explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

namespace detail {

inline void append_all(std::ostringstream&) {}
template <class T, class... Rest>
void append_all(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append_all(os, rest...);
}

/// Concatenates its arguments with operator<< into one string.
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  os.precision(17);
  append_all(os, args...);
  return os.str();
}

[[noreturn]] inline void raise(const std::string& msg) { throw Error("dea: " + msg); }

}  // namespace detail

/// Throws dea::Error with the concatenation of the arguments unless `cond` holds.
template <class... Args>
inline void check(bool cond, const Args&... args) {
  if (!cond) detail::raise(detail::concat(args...));
}

}  // namespace dea
