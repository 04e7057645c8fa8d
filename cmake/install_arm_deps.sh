#!/usr/bin/env bash
# Installs what cmake/arm_check.sh needs beyond the build's packages: Debian's cross compiler for 64-bit ARM
# (g++-aarch64-linux-gnu, with its aarch64 C and C++ runtime) and qemu-user to run the programs it builds.
# Usage: bash cmake/install_arm_deps.sh   (as root on Debian 12; does nothing for packages already present)
set -euo pipefail
bash "$(dirname "$0")/install_deps.sh" g++-aarch64-linux-gnu qemu-user
