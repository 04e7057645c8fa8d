# Warnings and build-type flags for the project's own programs and tests (never applied to users of dea::dea).
add_library(dea_warnings INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(dea_warnings INTERFACE -Wall -Wextra -Wpedantic -Wno-unused-parameter -Wno-uninitialized
                                                $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
endif()

option(DEA_NATIVE "Compile the project's programs with -march=native" ON)
if(DEA_NATIVE AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(dea_warnings INTERFACE -march=native)
endif()

option(DEA_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
if(DEA_SANITIZE)
  target_compile_options(dea_warnings INTERFACE -fsanitize=address,undefined -fno-sanitize-recover=all
                                                -fno-omit-frame-pointer)
  target_link_options(dea_warnings INTERFACE -fsanitize=address,undefined)
endif()
