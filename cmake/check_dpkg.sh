#!/usr/bin/env bash
# Installs the Debian packages with dpkg -i and uses them as a user would: builds the packages with cpack, checks
# their control fields and contents, installs them with `dpkg --root` into a scratch root under the build directory
# (a dpkg database of its own, holding the machine's records of the packages they depend on, so dpkg checks the
# Depends fields against what this machine has installed), builds tests/consumer against the installed libdea-dev
# with find_package and with pkg-config, runs the installed dea --version and its bash completion, imports the
# installed Python module when python3-dea was built, then removes and purges the packages and checks that they
# leave no file behind. Nothing is installed on the machine itself, so nothing can stay installed after the test,
# however it ends.
#   bash cmake/check_dpkg.sh BUILD_DIR VERSION CXX      (BUILD_DIR: a dea build with the dea program built)
# Exit 77 (skipped) when not run as root (dpkg -i needs it) or without dpkg, dpkg-deb, dpkg-shlibdeps (Debian's
# dpkg-dev), cpack or pkg-config.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: check_dpkg.sh BUILD_DIR VERSION CXX}" && pwd)
version=${2:?usage: check_dpkg.sh BUILD_DIR VERSION CXX}
cxx=${3:?usage: check_dpkg.sh BUILD_DIR VERSION CXX}
say() { echo "dpkg check: $*"; }
fail() { say "$*"; exit 1; }
skip() { say "$*: skipped"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "dpkg -i needs root (user $(id -un))"
for tool in dpkg dpkg-deb dpkg-query dpkg-shlibdeps cpack pkg-config; do
  command -v "$tool" >/dev/null || skip "'$tool' not found (Debian: dpkg, dpkg-dev, pkg-config)"
done
work="$build/dpkg-check"
root="$work/root"
admin="$root/var/lib/dpkg"
rm -rf "$work"
mkdir -p "$work"
# the scratch roots go however the script ends (the logs stay in $work)
trap 'rm -rf "$root" "$work/bare-root"' EXIT

# 1. the packages
(cd "$build" && cpack --config CPackConfig.cmake -B "$work/packages") >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack failed"; }
first() { for f in "$@"; do if [ -f "$f" ]; then echo "$f"; return; fi; done; }
dev=$(first "$work"/packages/libdea-dev_"$version"-*_all.deb)
tools=$(first "$work"/packages/dea-tools_"$version"-*.deb)
py=$(first "$work"/packages/python3-dea_"$version"-*.deb)
[ -n "$dev" ] || { ls "$work/packages"; fail "no libdea-dev_${version}-*_all.deb"; }
[ -n "$tools" ] || { ls "$work/packages"; fail "no dea-tools_${version}-*.deb"; }
debs=("$dev" "$tools")
[ -z "$py" ] || debs+=("$py")

# 2. control fields (what lintian would look at first), the copyright file and the changelog, the contents
arch=$(dpkg --print-architecture)
for deb in "${debs[@]}"; do
  f() { dpkg-deb -f "$deb" "$1"; }
  name=$(f Package)
  case "$name" in libdea-dev) want_arch=all ;; *) want_arch=$arch ;; esac
  [ "$(f Architecture)" = "$want_arch" ] || fail "$name: Architecture '$(f Architecture)', not $want_arch"
  case "$(f Version)" in "$version"-[0-9]*) ;; *) fail "$name: Version '$(f Version)', not $version-N" ;; esac
  [[ "$(f Maintainer)" =~ ^[^\<]+\ \<[^@\ ]+@[^\>\ ]+\>$ ]] ||
    fail "$name: Maintainer '$(f Maintainer)', not 'Name <address>'"
  [ -n "$(f Section)" ] || fail "$name: no Section"
  [ "$(f Priority)" = optional ] || fail "$name: Priority '$(f Priority)', not optional"
  [ -n "$(f Installed-Size)" ] || fail "$name: no Installed-Size"
  desc=$(f Description)
  synopsis=$(head -n 1 <<<"$desc")
  long=$(tail -n +2 <<<"$desc")
  if [ -z "$synopsis" ] || [ "${#synopsis}" -gt 80 ]; then fail "$name: synopsis '$synopsis' (empty or over 80 characters)"; fi
  [ -n "$long" ] || fail "$name: no long description"
  if grep -qv '^ ' <<<"$long"; then fail "$name: a long description line does not start with a space"; fi
  if grep -q '^  ' <<<"$long"; then fail "$name: a long description line starts with two spaces (shown verbatim)"; fi
  if grep -q '^.\{81\}' <<<"$long"; then fail "$name: a long description line is over 80 characters"; fi
  contents=$(dpkg-deb -c "$deb")
  if grep -qv ' root/root ' <<<"$contents"; then fail "$name: files not owned by root/root"; fi
  # the Debian copyright file, in the machine-readable format
  dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/share/doc/$name/copyright" >"$work/$name.copyright" 2>/dev/null ||
    fail "$name: no /usr/share/doc/$name/copyright"
  [ "$(head -n 1 "$work/$name.copyright")" = \
    "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/" ] ||
    fail "$name: copyright: the first line is not the machine-readable Format line"
  for field in "Upstream-Name: dea" "Files: \*" "Copyright: .+" "License: Expat"; do
    grep -Eqx "$field" "$work/$name.copyright" || fail "$name: copyright: no line '$field'"
  done
  grep -q '^ Permission is hereby granted' "$work/$name.copyright" || fail "$name: copyright: no licence text"
  # the Debian changelog: this version's entry
  log=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/share/doc/$name/changelog.Debian.gz" 2>/dev/null | gzip -dc) ||
    fail "$name: no /usr/share/doc/$name/changelog.Debian.gz"
  [ "$(head -n 1 <<<"$log")" = "dea ($(f Version)) unstable; urgency=medium" ] ||
    fail "$name: changelog.Debian.gz does not begin with the entry of $(f Version): '$(head -n 1 <<<"$log")'"
  printf 'dpkg check: %s: %s bytes, installed %s KiB, Architecture %s, Section %s, Depends: %s\n' \
    "$(basename "$deb")" "$(stat -c %s "$deb")" "$(f Installed-Size)" "$(f Architecture)" "$(f Section)" \
    "$(f Depends)"
done
case "$(dpkg-deb -f "$dev" Depends)" in libeigen3-dev*) ;; *) fail "libdea-dev: Depends '$(dpkg-deb -f "$dev" Depends)'" ;; esac
# (the listings are read whole: grep -q would close the pipe early)
dev_files=$(dpkg-deb -c "$dev")
tools_files=$(dpkg-deb -c "$tools")
if grep -Eq '\./usr/(bin|lib)/' <<<"$dev_files"; then fail "libdea-dev holds a program or a library"; fi
grep -q ' \./usr/share/bash-completion/completions/dea$' <<<"$tools_files" ||
  fail "dea-tools: no /usr/share/bash-completion/completions/dea"
if [ -n "$py" ]; then
  for d in python3 python3-numpy; do
    tr ',' '\n' <<<"$(dpkg-deb -f "$py" Depends)" | grep -Eq "^ *$d( |$)" || fail "python3-dea: Depends names no $d"
  done
fi

# 3. dpkg enforces Depends: into a bare database, libdea-dev is refused for want of libeigen3-dev
mkdir -p "$work/bare-root/var/lib/dpkg/info" "$work/bare-root/var/lib/dpkg/updates"
: >"$work/bare-root/var/lib/dpkg/status"
if dpkg --root="$work/bare-root" -i "$dev" >"$work/bare.log" 2>&1; then
  fail "dpkg -i accepted libdea-dev without libeigen3-dev"
fi
grep -q "libdea-dev depends on libeigen3-dev" "$work/bare.log" || { cat "$work/bare.log"; fail "dpkg refused libdea-dev for another reason"; }

# 4. the scratch root's database: the machine's records of every package the .debs depend on (the first
# installed alternative of each), each with an empty file list, so dpkg checks the Depends and versions for real
mkdir -p "$admin/info" "$admin/updates" "$admin/triggers"
: >"$admin/status"
declare -A seeded=()
for deb in "${debs[@]}"; do
  while IFS= read -r group; do
    [ -n "${group// /}" ] || continue
    chosen=""
    IFS='|' read -ra alts <<<"$group"
    for alt in "${alts[@]}"; do
      dep=$(awk '{print $1}' <<<"$alt")
      dep=${dep%%:*}
      st=$(dpkg-query -W -f '${db:Status-Abbrev}' "$dep" 2>/dev/null || true)
      if [ "${st:0:2}" = ii ]; then chosen=$dep; break; fi
    done
    [ -n "$chosen" ] || fail "$(dpkg-deb -f "$deb" Package) depends on '$group', which is not installed on this machine"
    [ -z "${seeded[$chosen]:-}" ] || continue
    seeded[$chosen]=1
    { dpkg-query -s "$chosen"; echo; } >>"$admin/status"
    dpkg-query -W -f '${binary:Package}\n' "$chosen" | while read -r listed; do : >"$admin/info/$listed.list"; done
  done < <(dpkg-deb -f "$deb" Depends | tr ',' '\n')
done
say "the scratch database holds the machine's ${#seeded[@]} dependencies: ${!seeded[*]}"

# 5. dpkg -i libdea-dev alone (a user who wants the library only), and the consumer against it: find_package (the
# scratch root's /usr seen as the system's /usr through CMAKE_FIND_ROOT_PATH, no prefix given), then the
# find_package and pkg-config builds of check_package.sh
names=()
for deb in "${debs[@]}"; do names+=("$(dpkg-deb -f "$deb" Package)"); done
installed() {
  for n in "$@"; do
    [ "$(dpkg-query --admindir="$admin" -W -f '${db:Status-Abbrev}' "$n")" = "ii " ] || fail "$n is not installed"
  done
}
dpkg --root="$root" -i "$dev" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "dpkg -i libdea-dev failed"; }
installed libdea-dev
say "dpkg -i installed libdea-dev"
[[ ":$(pkg-config --variable=pc_path pkg-config):" == *:/usr/share/pkgconfig:* ]] ||
  fail "pkg-config does not search /usr/share/pkgconfig by default"
cmake -S "$src/tests/consumer" -B "$work/find-root" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_FIND_ROOT_PATH="$root" \
  >"$work/find-root.log" 2>&1 || { cat "$work/find-root.log"; fail "the consumer does not configure against /usr"; }
dea_dir=$(sed -n 's/^dea_DIR:PATH=//p' "$work/find-root/CMakeCache.txt")
[ "$dea_dir" = "$root/usr/share/dea/cmake" ] || fail "find_package(dea) without a prefix found '$dea_dir'"
say "find_package(dea) finds the installed package in /usr/share/dea/cmake without a prefix"
DEA_CHECK_PREFIX="$root/usr" DEA_CHECK_WORK="$work/consumer" bash "$src/cmake/check_package.sh" "$build" "$version" "$cxx"

# 6. dpkg -i the others beside it (dpkg refuses a file that two packages hold)
dpkg --root="$root" -i "${debs[@]:1}" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "dpkg -i failed"; }
if grep -q 'warning' "$work/install.log"; then cat "$work/install.log"; fail "dpkg -i warned"; fi
installed "${names[@]}"
say "dpkg -i installed ${names[*]:1} beside libdea-dev"

# 7. the installed program and its completion
out=$("$root/usr/bin/dea" --version) || fail "the installed dea --version failed"
[ "$out" = "dea $version" ] || fail "the installed dea --version printed '$out'"
say "installed program: $out"
comp="$root/usr/share/bash-completion/completions/dea"
bash -n "$comp" || fail "bash -n refuses $comp"
got=$(bash -c 'source "$1"; COMP_WORDS=(dea ev); COMP_CWORD=1; _dea; echo "${COMPREPLY[*]}"' sh "$comp") ||
  fail "sourcing the completion failed"
[ "$got" = eval ] || fail "the installed completion completes 'dea ev' to '$got', not 'eval'"
if pkg-config --exists bash-completion; then
  cdir=$(pkg-config --variable=completionsdir bash-completion)
  [ "$cdir" = /usr/share/bash-completion/completions ] || fail "bash-completion loads completions from $cdir"
fi
say "installed completion: bash -n accepts it; 'dea ev' completes to 'eval'"

# 8. the installed Python module, where /usr/bin/python3 looks
if [ -n "$py" ]; then
  [ -x /usr/bin/python3 ] || fail "python3-dea was built but /usr/bin/python3 is missing"
  moddir=$(dpkg --root="$root" -L python3-dea |
           sed -En 's#^(/usr/lib/python3[^/]*/(dist|site)-packages)/dea(/__init__\.py|\.[^/]*\.so|\.so|\.py)$#\1#p' |
           head -n 1)
  [ -n "$moddir" ] || { dpkg --root="$root" -L python3-dea; fail "python3-dea holds no module 'dea' under /usr/lib/python3*"; }
  syspath=$(/usr/bin/python3 -c 'import sys; print("\n".join(sys.path))')
  grep -qx "$moddir" <<<"$syspath" || fail "/usr/bin/python3 does not search $moddir"
  file=$(cd "$work" && PYTHONPATH="$root$moddir" /usr/bin/python3 -c 'import dea; print(dea.__file__)') ||
    fail "/usr/bin/python3 -c 'import dea' failed"
  case "$file" in "$root$moddir"/*) ;; *) fail "import dea took $file, not the installed module" ;; esac
  say "/usr/bin/python3 imports the installed dea from $moddir"
fi

# 9. dpkg -r, then --purge: no package left, no file left
dpkg --root="$root" -r "${names[@]}" >"$work/remove.log" 2>&1 || { cat "$work/remove.log"; fail "dpkg -r failed"; }
dpkg --root="$root" --purge "${names[@]}" >>"$work/remove.log" 2>&1 || { cat "$work/remove.log"; fail "dpkg --purge failed"; }
for n in "${names[@]}"; do
  s=$(dpkg-query --admindir="$admin" -W -f '${db:Status-Abbrev}' "$n" 2>/dev/null || true)
  case "$s" in "" | "un "* | "pn "*) ;; *) fail "$n is still known to dpkg as '$s' after the purge" ;; esac
done
left=$(find "$root" -mindepth 1 -path "$root/var" -prune -o -print)
[ -z "$left" ] || { echo "$left"; fail "the purge left files behind"; }
say "dpkg -r and --purge remove ${names[*]} and every file of them"
say "the packages install with dpkg -i and work"
