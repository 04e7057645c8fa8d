#!/usr/bin/env bash
# The embedded profile on 64-bit ARM in one command: cross-compiles the embedded programs
# (examples/embedded_inference) for aarch64 with cmake/toolchain-aarch64.cmake, runs them under qemu-user, and
# compares them with the x86-64 build: every program must succeed on both (the golden layer check compares with
# the reference's numbers, the profile check with the dynamic-size build), and the values they print (the
# models' logits, the golden outputs) must agree within float tolerance. Then prints the size and memory table.
#   bash cmake/arm_check.sh [HOST_BUILD_DIR [ARM_BUILD_DIR]]     (defaults: build/release, build/arm)
# HOST_BUILD_DIR is a configured build of this repository (cmake --preset release): its embedded targets are
# built if needed, and their generated weights headers (made by `dea train` and `dea export-c` on this machine) are what
# the ARM build compiles. Only the four embedded programs are cross-built. Packages: cmake/install_arm_deps.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
host=$(realpath -m "${1:-$root/build/release}")
arm=$(realpath -m "${2:-$root/build/arm}")
sysroot=/usr/aarch64-linux-gnu
progs=(embedded_inference_tiny embedded_inference_small embedded_golden_check embedded_profile_check)
for tool in aarch64-linux-gnu-g++ aarch64-linux-gnu-strip qemu-aarch64 strip awk; do
  command -v "$tool" >/dev/null || { echo "arm_check: '$tool' not found (bash cmake/install_arm_deps.sh)"; exit 2; }
done
[ -f "$host/CMakeCache.txt" ] || { echo "arm_check: $host is not a configured build (cmake --preset release)"; exit 2; }
t0=$(date +%s)

echo "== arm_check: host (x86-64) build of the embedded programs in $host"
cmake --build "$host" -j2 --target "${progs[@]}" >/dev/null
hostbin=$host/examples/embedded_inference
echo "== arm_check: aarch64 cross build in $arm"
cmake -S "$root/examples/embedded_inference" -B "$arm" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchain-aarch64.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DDEA_EMBEDDED_GENERATED_DIR="$hostbin/generated" >/dev/null
cmake --build "$arm" -j2 >/dev/null
t1=$(date +%s)

out=$arm/arm_check_outputs
mkdir -p "$out"
# the numbers of the lines both builds print for comparison: "logits..." and "<case> values: ..."
numbers() { grep -E '^logits|^[a-z_]+ values:' "$1" | sed 's/^[^:]*://' | tr -s ' ' '\n' | grep -v '^$' || true; }
status=0
for p in "${progs[@]}"; do
  ran=1
  if ! "$hostbin/$p" >"$out/$p.x86_64.txt" 2>&1; then
    echo "FAILED: $p on x86-64"; cat "$out/$p.x86_64.txt"; status=1; ran=0
  fi
  if ! qemu-aarch64 -L "$sysroot" "$arm/$p" >"$out/$p.aarch64.txt" 2>&1; then
    echo "FAILED: $p on aarch64 (qemu)"; cat "$out/$p.aarch64.txt"; status=1; ran=0
  fi
  numbers "$out/$p.x86_64.txt" >"$out/$p.x86_64.num"
  numbers "$out/$p.aarch64.txt" >"$out/$p.aarch64.num"
  if [ ! -s "$out/$p.x86_64.num" ] && [ ! -s "$out/$p.aarch64.num" ]; then
    [ $ran -eq 1 ] && echo "ok: $p: $(grep -c '^ok:' "$out/$p.aarch64.txt" || true) checks pass on aarch64 (qemu) and x86-64"
    continue
  fi
  # |x86 - arm| <= 1e-5 max(1, |x86|) for every printed value, and the same count of values
  if cmp=$(paste "$out/$p.x86_64.num" "$out/$p.aarch64.num" | awk -F'\t' '
        { n++; a = $1 + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; if (m < 1) m = 1;
          if ($1 == "" || $2 == "" || d > 1e-5 * m) bad++; if (d / m > worst) worst = d / m }
        END { printf "%d values, max relative difference %.3g", n, worst; exit (bad > 0) }'); then
    echo "ok: $p: aarch64 (qemu) and x86-64 agree: $cmp"
  else
    echo "FAILED: $p: aarch64 and x86-64 differ: $cmp"; status=1
  fi
done
grep -h "embedded golden check:\|embedded profile check:" "$out"/*.aarch64.txt | sed 's/^/aarch64: /'

echo "== arm_check: embedded_inference, stripped binaries (-Os, dynamically linked to libstdc++) and memory"
printf '%-7s %-22s %12s %13s %10s %12s %12s %14s\n' model "sizes" "x86-64 B" "aarch64 B" "params B" "workspace B" "params+ws B" "x86 latency"
for size in tiny small; do
  p=embedded_inference_$size
  strip -o "$out/$p.x86_64.stripped" "$hostbin/$p"
  aarch64-linux-gnu-strip -o "$out/$p.aarch64.stripped" "$arm/$p"
  f=$out/$p.x86_64.txt
  dims=$(sed -n 's/^embedded_inference: \(V=[0-9]* D=[0-9]* H=[0-9]* L=[0-9]* d_ff=[0-9]*\).*/\1/p' "$f" | tr ' ' ',')
  pb=$(sed -n 's/^parameters: [0-9]* values, \([0-9]*\) bytes.*/\1/p' "$f")
  wb=$(sed -n 's/^workspace: \([0-9]*\) bytes.*/\1/p' "$f")
  lat=$(sed -n 's/^latency: \([0-9.]*\) us.*/\1 us/p' "$f")
  printf '%-7s %-22s %12s %13s %10s %12s %12s %14s\n' "$size" "$dims" "$(stat -c %s "$out/$p.x86_64.stripped")" \
    "$(stat -c %s "$out/$p.aarch64.stripped")" "$pb" "$wb" "$((pb + wb))" "$lat"
done
t2=$(date +%s)
echo "== arm_check: cross build $((t1 - t0)) s, runs and comparison $((t2 - t1)) s: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
