#!/usr/bin/env bash
# Installs the "dev" component alone (headers, CMake package, pkg-config file, licence) into a scratch prefix and
# builds tests/consumer against it the two ways a user's build would find it: find_package(dea CONFIG) and
# pkg-config. Each program then runs and must report the installed version.
#   bash cmake/check_package.sh BUILD_DIR VERSION CXX
# BUILD_DIR: a configured dea build; VERSION: the project's version (X.Y.Z); CXX: the C++ compiler.
# With DEA_CHECK_PREFIX set, the check uses that prefix as it is (an unpacked libdea-dev package, for instance)
# instead of installing into a scratch one; DEA_CHECK_WORK: its scratch directory (default BUILD_DIR/package-check).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: check_package.sh BUILD_DIR VERSION CXX}" && pwd)
version=${2:?usage: check_package.sh BUILD_DIR VERSION CXX}
cxx=${3:?usage: check_package.sh BUILD_DIR VERSION CXX}
work=${DEA_CHECK_WORK:-$build/package-check}
prefix="$work/prefix"
fail() { echo "package check: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
if [ -n "${DEA_CHECK_PREFIX:-}" ]; then
  prefix=$DEA_CHECK_PREFIX
else
  cmake --install "$build" --component dev --prefix "$prefix" >/dev/null
fi

# what the dev component holds, and that it holds no program
for f in include/dea/dea.hpp include/dea/version.hpp share/dea/cmake/deaConfig.cmake \
         share/dea/cmake/deaConfigVersion.cmake share/dea/cmake/deaTargets.cmake share/pkgconfig/dea.pc \
         share/doc/dea/LICENSE; do
  [ -f "$prefix/$f" ] || fail "the dev component did not install $f"
done
if [ -n "$(find "$prefix" -path "$prefix/bin*" -o -path "$prefix/lib*" | head -1)" ]; then
  find "$prefix" -path "$prefix/bin*" -o -path "$prefix/lib*"
  fail "the dev component installed files outside include/ and share/"
fi
grep -q "^#define DEA_VERSION_STRING \"$version\"$" "$prefix/include/dea/version.hpp" ||
  fail "include/dea/version.hpp does not say $version"

# pkg-config: the version, the include directory inside the prefix (the .pc file is relocatable), Eigen through
# Requires
export PKG_CONFIG_PATH="$prefix/share/pkgconfig"
[ "$(pkg-config --modversion dea)" = "$version" ] || fail "pkg-config --modversion dea: '$(pkg-config --modversion dea)', not $version"
incdir=$(realpath -m "$(pkg-config --variable=includedir dea)")
[ "$incdir" = "$(realpath "$prefix/include")" ] || fail "dea.pc's includedir is $incdir, not $prefix/include"
cflags=$(pkg-config --cflags dea)
omp=$(pkg-config --variable=openmp_flags dea)
case "$cflags" in *eigen3*) ;; *) fail "pkg-config --cflags dea names no Eigen directory: $cflags" ;; esac

# the two builds compile the same file, side by side; then each program runs
cmake -S "$src/tests/consumer" -B "$work/cmake" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake-configure.log" 2>&1 || { cat "$work/cmake-configure.log"; fail "configure failed"; }
cmake --build "$work/cmake" >"$work/cmake.log" 2>&1 & cmake_pid=$!
# shellcheck disable=SC2086  # the flags are words
"$cxx" -std=c++17 -O2 $cflags $omp "$src/tests/consumer/main.cpp" -o "$work/consumer-pc" $omp \
  $(pkg-config --libs dea) >"$work/pc.log" 2>&1 & pc_pid=$!
cmake_ok=0; pc_ok=0
wait "$cmake_pid" || cmake_ok=$?
wait "$pc_pid" || pc_ok=$?
[ "$cmake_ok" -eq 0 ] || { cat "$work/cmake.log"; fail "the find_package build failed"; }
[ "$pc_ok" -eq 0 ] || { cat "$work/pc.log"; fail "the pkg-config build failed"; }
for prog in "$work/cmake/consumer" "$work/consumer-pc"; do
  out=$("$prog") || { echo "$out"; fail "$prog failed"; }
  echo "$out"
  grep -q "^consumer: dea $version headers$" <<<"$out" || fail "$prog does not report dea $version"
done
echo "package check: the dev component alone builds the consumer with find_package and with pkg-config"
