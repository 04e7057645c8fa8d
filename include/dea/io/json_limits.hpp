// dea/io/json_limits.hpp: parsing JSON read from files (safetensors headers, JSONL lines, config.json) within
// limits.
//
// nlohmann_json parses without recursion, but every nesting level of the document becomes a heap node, and
// copying, comparing or printing a value recurses over its levels. A file of a few megabytes of '[' would take
// gigabytes of memory to parse and could overflow the stack when printed. The files this library reads nest at
// most three levels deep, so before parsing, the text is scanned once (linear time, no allocation) and
// rejected when it nests deeper than kMaxJsonDepth.
#pragma once

#include "../core/error.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>

namespace dea::io {

/// The deepest nesting of arrays and objects accepted in a JSON text read from a file.
constexpr std::size_t kMaxJsonDepth = 64;

namespace detail {

/// The deepest nesting of '[' / '{' in `text` outside string literals, counting no further than `stop`
/// (so the scan ends as soon as the limit is passed). Brackets inside strings (with \" escapes) do not
/// count; the text need not be valid JSON (the parser reports that).
inline std::size_t json_nesting_depth(std::string_view text, std::size_t stop = kMaxJsonDepth + 1) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest >= stop) return deepest;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace detail

/// Parses JSON `text` read from `source` (a file name, for the messages). Throws dea::Error
/// "<source>: invalid JSON: ..." for a syntax error and "<source>: JSON nested deeper than 64 levels" for
/// text nested deeper than `max_depth`.
inline nlohmann::json parse_json_limited(std::string_view text, const std::string& source,
                                         std::size_t max_depth = kMaxJsonDepth) {
  if (detail::json_nesting_depth(text, max_depth + 1) > max_depth)
    ::dea::detail::raise(::dea::detail::concat(source, ": JSON nested deeper than ", max_depth, " levels"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    ::dea::detail::raise(::dea::detail::concat(source, ": invalid JSON: ", e.what()));
  }
  return j;
}

}  // namespace dea::io
