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
cmake --build "$work/pkg" >/dev/null
"$work/pkg/consumer"
cmake -S "$src/tests/consumer" -B "$work/sub" -DCMAKE_BUILD_TYPE=Release -DDEA_SOURCE_DIR="$src" >/dev/null
cmake --build "$work/sub" >/dev/null
"$work/sub/consumer"
echo "consumer check: find_package and add_subdirectory both build and run"
