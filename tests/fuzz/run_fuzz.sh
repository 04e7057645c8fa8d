#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time on a copy of its seed corpus.
# Usage: run_fuzz.sh FUZZER SEED_DIR SECONDS WORK_DIR [extra libFuzzer flags...]
# Exit status 0: no finding. Otherwise the fuzzer's report is on stderr and the input that triggered it is
# WORK_DIR/crash-*, leak-*, timeout-* or oom-* (replay it with: FUZZER WORK_DIR/<file>).
set -euo pipefail
fuzzer=${1:?fuzzer}; seeds=${2:?seed dir}; seconds=${3:?seconds}; work=${4:?work dir}; shift 4
rm -rf "$work"
mkdir -p "$work/corpus"
# -timeout: one input may take at most 10 s; -rss_limit_mb: more memory than that is an out-of-memory finding;
# -error_exitcode: any finding fails the run.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -error_exitcode=77 -timeout_exitcode=78 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds" 2> "$work/log.txt" || {
  status=$?
  tail -n 60 "$work/log.txt" >&2
  echo "run_fuzz: $(basename "$fuzzer") FAILED (exit $status); artifacts in $work" >&2
  exit 1
}
grep -E "^(stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)" "$work/log.txt" || true
echo "run_fuzz: $(basename "$fuzzer"): no finding in ${seconds} s"
