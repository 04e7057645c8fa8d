#!/usr/bin/env bash
# Public headers compile on their own, also when every nested `detail` namespace of the library already exists.
#
# Why: inside namespace dea::ops, an unqualified `detail::f` finds dea::ops::detail as soon as any header has
# opened it, and then dea::detail::f is not looked at; so a header meaning dea::detail::f compiles or not depending
# on which headers came before it. Each translation unit here first declares (empty) every nested `detail`
# namespace that some header of include/dea opens, then includes one header, and is checked with -fsyntax-only.
# Only the headers that name `detail::` without a qualifier in front can go wrong this way, so only they are
# checked (about 25 of 65; --all checks every header, which also shows each one includes what it needs).
#   bash cmake/header_check.sh [--all] [CXX [EIGEN_INCLUDE_DIR]]     (defaults: c++, /usr/include/eigen3)
# Exit 0 when every header passes; 1 with the failing headers and their first errors; 2 when something is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
all=0
if [ "${1:-}" = "--all" ]; then all=1; shift; fi
cxx=${1:-c++}
eigen=${2:-/usr/include/eigen3}
command -v "$cxx" >/dev/null || { echo "header_check: compiler '$cxx' not found"; exit 2; }
[ -f "$eigen/Eigen/Core" ] || { echo "header_check: no Eigen/Core under '$eigen'"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root/include"
find dea -name '*.hpp' | sort > "$work/all"
if [ "$all" = 1 ]; then
  cp "$work/all" "$work/headers"
else  # "detail::" not preceded by ':' or a name character
  xargs grep -lE '(^|[^:A-Za-z0-9_])detail::' < "$work/all" > "$work/headers" || true
fi

# The enclosing namespaces of every `namespace detail {` (headers close each namespace with "}  // namespace X").
xargs awk '
  FNR == 1 { depth = 0 }
  /^[ \t]*namespace [A-Za-z_:]+ \{/ {
    name = $2
    if (name == "detail" && depth > 0) {
      path = stack[1]
      for (i = 2; i <= depth; ++i) path = path "::" stack[i]
      if (path != "dea") print "namespace " path "::detail {}"
    }
    stack[++depth] = name
    next
  }
  /^[ \t]*\}[ \t]*\/\/[ \t]*namespace/ { if (depth > 0) --depth }
' < "$work/all" | sort -u > "$work/pre.hpp"
echo "header_check: $(wc -l < "$work/headers") of $(wc -l < "$work/all") headers; nested detail namespaces declared first:"
sed 's/^/  /' "$work/pre.hpp"

check_one() {  # header -> "OK header" or "FAIL header"
  local h=$1 tu
  tu="$work/$(echo "$h" | tr / _).cpp"
  printf '#include "%s"\n#include <%s>\n' "$work/pre.hpp" "$h" > "$tu"
  if "$cxx" -std=c++17 -fsyntax-only -fopenmp -I"$root/include" -isystem "$eigen" "$tu" 2> "$tu.err"; then
    echo "OK $h"
  else
    echo "FAIL $h"
  fi
}
export -f check_one
export work root cxx eigen
xargs -P "$(nproc)" -I{} bash -c 'check_one "$1"' _ {} < "$work/headers" > "$work/results"
if grep -q '^FAIL' "$work/results"; then
  grep '^FAIL' "$work/results" | while read -r _ h; do
    echo "== $h"
    grep -m 5 'error' "$work/$(echo "$h" | tr / _).cpp.err" || true
  done
  echo "header_check: $(grep -c '^FAIL' "$work/results") of $(wc -l < "$work/headers") headers failed"
  exit 1
fi
echo "header_check: all $(wc -l < "$work/headers") headers compile on their own, after every nested detail namespace"
