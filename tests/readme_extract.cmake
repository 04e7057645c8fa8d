# Writes the first ```cpp block of a Markdown file to a C++ source file (run with cmake -P); with -DAFTER=<text>,
# the first ```cpp block after the first line that starts with <text> (a heading, say).
#
#   cmake -DREADME=README.md -DOUT=readme_program.cpp -P readme_extract.cmake
#   cmake -DREADME=README.md "-DAFTER=## Checking gradients" -DOUT=readme_gradcheck.cpp -P readme_extract.cmake
#
# The output starts with a #line directive, so a compiler error names README.md and the line in it. OUT is
# rewritten only when its content changes, so an edit elsewhere in the README recompiles nothing.
if(NOT DEFINED README OR NOT DEFINED OUT)
  message(FATAL_ERROR "readme_extract.cmake: pass -DREADME=<file.md> -DOUT=<file.cpp>")
endif()
if(NOT EXISTS "${README}")
  message(FATAL_ERROR "readme_extract.cmake: ${README} does not exist")
endif()
file(READ "${README}" text)
set(start 0)
set(where "")
if(DEFINED AFTER AND NOT AFTER STREQUAL "")
  string(FIND "\n${text}" "\n${AFTER}" start)
  if(start LESS 0)
    message(FATAL_ERROR "readme_extract.cmake: ${README} has no line starting with '${AFTER}'")
  endif()
  set(where " after '${AFTER}'")
endif()
string(SUBSTRING "${text}" ${start} -1 tail)
set(fence "```cpp\n")
string(FIND "${tail}" "${fence}" begin)
if(begin LESS 0)
  message(FATAL_ERROR "readme_extract.cmake: ${README} has no ```cpp block${where}")
endif()
math(EXPR begin "${begin} + ${start}")
string(LENGTH "${fence}" fence_len)
math(EXPR body_begin "${begin} + ${fence_len}")
string(SUBSTRING "${text}" 0 ${body_begin} head)
string(SUBSTRING "${text}" ${body_begin} -1 rest)
string(FIND "${rest}" "\n```" end)
if(end LESS 0)
  message(FATAL_ERROR "readme_extract.cmake: the ```cpp block${where} of ${README} is not closed")
endif()
math(EXPR end "${end} + 1")  # keep the block's last newline
string(SUBSTRING "${rest}" 0 ${end} body)
# the line of the block's first line of code (1-based)
string(REGEX MATCHALL "\n" newlines "${head}")
list(LENGTH newlines line)
math(EXPR line "${line} + 1")
file(TO_CMAKE_PATH "${README}" readme_path)
file(WRITE "${OUT}.tmp" "#line ${line} \"${readme_path}\"\n${body}")
configure_file("${OUT}.tmp" "${OUT}" COPYONLY)
file(REMOVE "${OUT}.tmp")
