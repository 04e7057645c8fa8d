#!/usr/bin/env bash
# Installs what dea needs to build its tests, examples and benchmarks, from Debian's packages only.
# Usage: bash cmake/install_deps.sh [EXTRA_PACKAGE ...]   (as root on Debian 12; does nothing for packages already
# present; the other install_*_deps.sh scripts pass their packages as arguments)
set -euo pipefail
# python3, libxml2-utils, w3c-sgml-lib: the tests parse every SVG plot with Python's XML parser and validate it
# against the SVG 1.1 DTD with xmllint (tests/check_svg.py); unicode-data: the Unicode Character Database, from which
# the test unicode_tables_up_to_date regenerates the tokenizer's tables (cmake/gen_unicode_tables.py);
# libsentencepiece-dev: the SentencePiece library of the DeBERTa tokenizer (optional for the library, found by
# cmake/sentencepiece.cmake); dpkg-dev and pkg-config: the package tests build the Debian packages and a consumer
# against the installed files (cmake/check_deb.sh, cmake/check_package.sh)
pkgs=(cmake g++ make libeigen3-dev libfmt-dev catch2 nlohmann-json3-dev python3 libxml2-utils w3c-sgml-lib unicode-data
      libsentencepiece-dev dpkg-dev pkg-config)
pkgs+=("$@")
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
