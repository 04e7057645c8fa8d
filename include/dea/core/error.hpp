// dea/core/error.hpp: the library's error type and argument checks.
//
// Every violated precondition at an API boundary throws dea::Error (an std::invalid_argument) whose message
// names the argument, what was expected and what was found.
//
// Without exceptions (-fno-exceptions, or DEA_NO_EXCEPTIONS defined before the first dea header) a violated
// precondition calls the error handler instead, with the same message ("dea: ..."). The default handler
// prints the message and a newline to stderr and calls std::abort(); dea::set_error_handler() installs another
// (to log, reset a device, or longjmp out). A handler must not return: if it does, std::abort() follows.
#pragma once

#if !defined(DEA_NO_EXCEPTIONS) && !(defined(__cpp_exceptions) || defined(__EXCEPTIONS) || defined(_CPPUNWIND))
#define DEA_NO_EXCEPTIONS
#endif

#include <cstdio>
#include <cstdlib>
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

/// Receives the message of a violated precondition when exceptions are off (DEA_NO_EXCEPTIONS). Must not return.
using ErrorHandler = void (*)(const char* message);

/// The default handler: prints the message and a newline to stderr, then aborts.
inline void default_error_handler(const char* message) {
  std::fputs(message, stderr);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

namespace detail {
inline ErrorHandler& error_handler_slot() {
  static ErrorHandler handler = &default_error_handler;
  return handler;
}
}  // namespace detail

/// Installs `handler` (nullptr: the default) for builds without exceptions; returns the previous one.
/// With exceptions enabled the handler is never called: errors throw dea::Error.
inline ErrorHandler set_error_handler(ErrorHandler handler) {
  ErrorHandler& slot = detail::error_handler_slot();
  const ErrorHandler previous = slot;
  slot = handler ? handler : &default_error_handler;
  return previous;
}

/// The handler in force.
inline ErrorHandler error_handler() { return detail::error_handler_slot(); }

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

/// Throws dea::Error("dea: " + msg), or without exceptions passes that message to the error handler.
[[noreturn]] inline void raise(const std::string& msg) {
#ifdef DEA_NO_EXCEPTIONS
  const std::string full = "dea: " + msg;
  error_handler()(full.c_str());
  std::abort();  // a handler that returns: there is no way to continue the call that failed
#else
  throw Error("dea: " + msg);
#endif
}

}  // namespace detail

/// An error's text without the "dea: " that raise() puts in front, for a message that quotes it after a prefix of its
/// own ("rank 1 of 2: ...", "NliOracle: pair 3: ...").
inline std::string without_error_prefix(std::string what) {
  if (what.compare(0, 5, "dea: ") == 0) what.erase(0, 5);
  return what;
}

/// Throws dea::Error with the concatenation of the arguments unless `cond` holds (without exceptions: calls
/// the error handler with that message).
template <class... Args>
inline void check(bool cond, const Args&... args) {
  if (!cond) detail::raise(detail::concat(args...));
}

}  // namespace dea
