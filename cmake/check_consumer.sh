#!/usr/bin/env bash
# Builds tests/consumer against dea twice: installed into a temporary prefix (find_package(dea CONFIG)) and as
# a subdirectory (add_subdirectory). Usage: bash cmake/check_consumer.sh BUILD_DIR   (BUILD_DIR: a configured dea build)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: check_consumer.sh BUILD_DIR}" && pwd)
work="$build/consumer-check"
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/dea/dea.hpp"
cmake -S "$src/tests/consumer" -B "$work/pkg" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$work/sub" -DCMAKE_BUILD_TYPE=Release -DDEA_SOURCE_DIR="$src" >/dev/null
# the two builds compile the same file, side by side; then each program runs
cmake --build "$work/pkg" >"$work/pkg.log" 2>&1 & pkg_pid=$!
cmake --build "$work/sub" >"$work/sub.log" 2>&1 & sub_pid=$!
pkg_ok=0; sub_ok=0
wait "$pkg_pid" || pkg_ok=$?
wait "$sub_pid" || sub_ok=$?
[ "$pkg_ok" -eq 0 ] || { cat "$work/pkg.log"; echo "consumer check: the find_package build failed"; exit 1; }
[ "$sub_ok" -eq 0 ] || { cat "$work/sub.log"; echo "consumer check: the add_subdirectory build failed"; exit 1; }
"$work/pkg/consumer"
"$work/sub/consumer"
echo "consumer check: find_package and add_subdirectory both build and run"
