#!/usr/bin/env bash
# Installs what dea needs to build its tests, examples and benchmarks, from Debian's packages only.
# Usage: bash cmake/install_deps.sh   (as root on Debian 12; does nothing for packages already present)
set -euo pipefail
pkgs=(cmake g++ make libeigen3-dev libfmt-dev catch2 nlohmann-json3-dev)
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
  echo "dea: all build dependencies present"
fi
