#!/usr/bin/env bash
# Installs what cmake/arm_check.sh needs beyond cmake/install_deps.sh: Debian's cross compiler for 64-bit ARM
# (g++-aarch64-linux-gnu, with its aarch64 C and C++ runtime) and qemu-user to run the programs it builds.
# Usage: bash cmake/install_arm_deps.sh   (as root on Debian 12; does nothing for packages already present)
set -euo pipefail
bash "$(dirname "$0")/install_deps.sh"
pkgs=(g++-aarch64-linux-gnu qemu-user)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "dea: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "dea: all ARM cross-build dependencies present"
fi
