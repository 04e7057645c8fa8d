# Cross-compiling for 64-bit ARM (aarch64) Linux with Debian's cross toolchain (g++-aarch64-linux-gnu); programs run
# on the build machine under qemu-user (package qemu-user), which ctest uses as the emulator.
#   cmake -S examples/embedded_inference -B build/arm -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake ...
# (cmake/arm_check.sh does the whole cross build and comparison in one command.)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(DEA_AARCH64_SYSROOT /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH ${DEA_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L ${DEA_AARCH64_SYSROOT})
