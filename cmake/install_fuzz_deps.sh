#!/usr/bin/env bash
# Installs what the fuzz and asan presets need beyond the build's packages: clang, its runtime libraries
# (libFuzzer, AddressSanitizer, UndefinedBehaviorSanitizer) and its OpenMP runtime, from Debian's packages only.
# Usage: bash cmake/install_fuzz_deps.sh   (as root on Debian 12; does nothing for packages already present)
set -euo pipefail
bash "$(dirname "$0")/install_deps.sh" clang libclang-rt-14-dev libomp-dev
