#!/usr/bin/env bash
# Builds the Debian packages (cmake/packaging.cmake) from a built tree, checks their control fields, unpacks both
# into a scratch root, builds tests/consumer against the unpacked libdea-dev with find_package and pkg-config
# (cmake/check_package.sh) and runs the unpacked dea --version. Exit 77 (skipped) without dpkg-deb or
# dpkg-shlibdeps (Debian's dpkg-dev).
#   bash cmake/check_deb.sh BUILD_DIR VERSION CXX      (BUILD_DIR: a dea build with the dea program built)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: check_deb.sh BUILD_DIR VERSION CXX}" && pwd)
version=${2:?usage: check_deb.sh BUILD_DIR VERSION CXX}
cxx=${3:?usage: check_deb.sh BUILD_DIR VERSION CXX}
fail() { echo "deb check: $*"; exit 1; }
for tool in dpkg-deb dpkg-shlibdeps cpack; do
  command -v "$tool" >/dev/null || { echo "deb check: '$tool' not found (Debian: dpkg-dev): skipped"; exit 77; }
done
work="$build/deb-check"
rm -rf "$work"
mkdir -p "$work"
(cd "$build" && cpack --config CPackConfig.cmake -B "$work/packages") >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack failed"; }
dev=$(ls "$work"/packages/libdea-dev_"$version"-*_all.deb 2>/dev/null | head -1)
tools=$(ls "$work"/packages/dea-tools_"$version"-*.deb 2>/dev/null | head -1)
[ -n "$dev" ] || { ls "$work/packages"; fail "no libdea-dev_${version}-*_all.deb"; }
[ -n "$tools" ] || { ls "$work/packages"; fail "no dea-tools_${version}-*.deb"; }

field() { dpkg-deb -f "$1" "$2"; }
[ "$(field "$dev" Architecture)" = all ] || fail "libdea-dev: Architecture $(field "$dev" Architecture), not all"
case "$(field "$dev" Depends)" in libeigen3-dev*) ;; *) fail "libdea-dev: Depends '$(field "$dev" Depends)'" ;; esac
case "$(field "$tools" Depends)" in *libc6*) ;; *) fail "dea-tools: Depends '$(field "$tools" Depends)' (no shlibdeps)" ;; esac
if dpkg-deb -c "$dev" | grep -q '/bin/'; then fail "libdea-dev holds a program"; fi
for p in "$dev" "$tools"; do
  printf 'deb check: %s %s bytes, installed %s KiB, Depends: %s\n' "$(basename "$p")" "$(stat -c %s "$p")" \
    "$(field "$p" Installed-Size)" "$(field "$p" Depends)"
done

# each package into a root of its own, so the consumer sees libdea-dev alone
dpkg-deb -x "$dev" "$work/dev"
dpkg-deb -x "$tools" "$work/tools"
out=$("$work/tools/usr/bin/dea" --version) || fail "the packaged dea --version failed"
[ "$out" = "dea $version" ] || fail "the packaged dea --version printed '$out'"
echo "deb check: the packaged program: $out"
DEA_CHECK_PREFIX="$work/dev/usr" DEA_CHECK_WORK="$work/consumer" bash "$src/cmake/check_package.sh" "$build" "$version" "$cxx"
echo "deb check: libdea-dev and dea-tools build, unpack and work"
