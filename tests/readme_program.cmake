# The README's program (its first ```cpp block) is built and run as a test, so the README cannot show code that
# does not compile or does not run. Included from tests/CMakeLists.txt.
#
# The block is extracted at build time (readme_extract.cmake, re-run whenever README.md changes) into
# <build>/tests/readme_program.cpp; a program that no longer compiles fails the build, and the test fails when the
# program exits non-zero (it checks its own result) or prints other than the README shows. Compiler errors name
# README.md and the line in it.
get_filename_component(DEA_README_SOURCE ${CMAKE_CURRENT_LIST_DIR}/../README.md ABSOLUTE)
set(DEA_README_PROGRAM ${CMAKE_CURRENT_BINARY_DIR}/readme_program.cpp)
add_custom_command(
  OUTPUT ${DEA_README_PROGRAM}
  COMMAND ${CMAKE_COMMAND} -DREADME=${DEA_README_SOURCE} -DOUT=${DEA_README_PROGRAM}
          -P ${CMAKE_CURRENT_LIST_DIR}/readme_extract.cmake
  DEPENDS ${DEA_README_SOURCE} ${CMAKE_CURRENT_LIST_DIR}/readme_extract.cmake
  COMMENT "Extracting the program of README.md"
  VERBATIM)
add_executable(readme_program ${DEA_README_PROGRAM})
# dea_instances: the program's DualExpertAttention<double> is compiled once there (see cmake/instances.cmake), so
# this adds seconds to the build, not minutes. A user compiling the same file without it instantiates the layer.
target_link_libraries(readme_program PRIVATE dea::dea dea_instances dea_warnings)
# The test runs it and compares what it prints with the output the README shows (readme_check.cmake).
add_test(NAME readme_program
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:readme_program> -DREADME=${DEA_README_SOURCE}
                 -P ${CMAKE_CURRENT_LIST_DIR}/readme_check.cmake)
set_tests_properties(readme_program PROPERTIES TIMEOUT 60)

# The README's gradient-check snippet (the first ```cpp block under "## Checking gradients") is built and run the
# same way: it exits non-zero when a tensor fails the check.
set(DEA_README_GRADCHECK ${CMAKE_CURRENT_BINARY_DIR}/readme_gradcheck.cpp)
add_custom_command(
  OUTPUT ${DEA_README_GRADCHECK}
  COMMAND ${CMAKE_COMMAND} -DREADME=${DEA_README_SOURCE} -DOUT=${DEA_README_GRADCHECK} "-DAFTER=## Checking gradients"
          -P ${CMAKE_CURRENT_LIST_DIR}/readme_extract.cmake
  DEPENDS ${DEA_README_SOURCE} ${CMAKE_CURRENT_LIST_DIR}/readme_extract.cmake
  COMMENT "Extracting the gradient check of README.md"
  VERBATIM)
add_executable(readme_gradcheck ${DEA_README_GRADCHECK})
target_link_libraries(readme_gradcheck PRIVATE dea::dea dea_warnings)
add_test(NAME readme_gradcheck COMMAND readme_gradcheck)
set_tests_properties(readme_gradcheck PROPERTIES TIMEOUT 60 FAIL_REGULAR_EXPRESSION "FAIL")
