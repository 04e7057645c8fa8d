#!/usr/bin/env bash
# Writes the corpus of the documented lm_compare protocol: the King James Bible (public domain) as plain text,
# from Debian's bible-kjv package (installed with apt-get when missing; root on Debian 12).
#
#   bash examples/experiments/lm_compare/get_corpus.sh [OUT_FILE]     (default: data/kjv.txt)
#
# The package's `bible` program prints every verse from Genesis 1:1 to Revelation 22:21 with its chapter headings
# (4,298,239 bytes of ASCII text, lines of 80 columns; sha256 ba7c84a755b5ecc0... with bible-kjv 4.38). The experiment trains on the first 95% of the bytes and validates on the last 5%
# (the end of the New Testament).
set -euo pipefail
out="${1:-data/kjv.txt}"
if ! command -v bible >/dev/null 2>&1; then
  echo "get_corpus: installing Debian's bible-kjv (the King James Bible and its reader)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends bible-kjv bible-kjv-text
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
bible -l80 "gen1:1-rev22:21" > "$tmp"   # -l80: lines of 80 columns whatever COLUMNS says
bytes=$(wc -c < "$tmp")
if [ "$bytes" -lt 4000000 ]; then
  rm -f "$tmp"
  echo "get_corpus: bible printed only $bytes bytes (expected about 4.3 MB)" >&2
  exit 1
fi
mv "$tmp" "$out"
echo "get_corpus: wrote $out ($bytes bytes, $(sha256sum "$out" | cut -c1-16)...)"
