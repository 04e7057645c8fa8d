#!/usr/bin/env bash
# Installs what the fuzz preset needs beyond cmake/install_deps.sh: clang and its runtime libraries (libFuzzer,
# AddressSanitizer, UndefinedBehaviorSanitizer), from Debian's packages only.
# Usage: bash cmake/install_fuzz_deps.sh   (as root on Debian 12; does nothing for packages already present)
set -euo pipefail
bash "$(dirname "$0")/install_deps.sh"
pkgs=(clang libclang-rt-14-dev)
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
  echo "dea: all fuzzing dependencies present"
fi
