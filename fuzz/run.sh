#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] - build fuzz_tdt with clang (ASan + UBSan + libFuzzer), replay the bug
# reproducers in fuzz/regressions/, then fuzz for SECONDS (default 90) on a copy of
# fuzz/corpus/ in a temporary directory. Exits non-zero on any crash, sanitizer report or
# property violation; crashing inputs are kept in $FUZZ_ARTIFACTS (default build-fuzz/artifacts).
#
# Environment:
#   FUZZ_BUILD_DIR   build directory (default <repo>/build-fuzz)
#   FUZZ_ARTIFACTS   where crashing inputs are copied (default $FUZZ_BUILD_DIR/artifacts)
#   FUZZ_TDT_AVOID   comma-separated known-bug tags the target steps around (see fuzz_tdt.c);
#                    the reproducers of those bugs then pass too. Empty: test everything.
#   FUZZ_JOBS        parallel fuzzing jobs (default 1)
set -euo pipefail

secs=${1:-90}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
artifacts=${FUZZ_ARTIFACTS:-$build/artifacts}
jobs=${FUZZ_JOBS:-1}

command -v clang >/dev/null || { echo "run.sh: clang not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }

echo "== building fuzz_tdt in $build"
CC=clang CXX=clang++ cmake -S "$root/fuzz" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz_tdt -j"$(nproc)" >/dev/null
bin=$build/fuzz_tdt

work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz_tdt.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"

# UBSan reports abort (the build uses -fno-sanitize-recover=all); keep stacks readable.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/fuzz/lsan.supp}

status=0
# replay BINARY DIR [NOTE]: run BINARY on each DIR/*.bin, one line each; status=1 on a failure
replay() {
  local regs=("$2"/*.bin) f
  [ -e "${regs[0]}" ] || return 0
  echo "== replaying ${#regs[@]} reproducers from ${2#"$root"/}${3:+ ($3)}"
  for f in "${regs[@]}"; do
    if "$1" "$f" >"$work/reg.log" 2>&1; then
      echo "   ok    $(basename "$f")"
    else
      echo "   FAIL  $(basename "$f"):"
      grep -E -A2 "VIOLATION|runtime error|ERROR: AddressSanitizer" "$work/reg.log" | head -6 | sed 's/^/         /'
      status=1
    fi
  done
}
replay "$bin" "$root/fuzz/regressions" "FUZZ_TDT_AVOID='${FUZZ_TDT_AVOID:-}'"

echo "== fuzzing for ${secs}s (corpus copy in $work/corpus)"
cp -r "$root/fuzz/corpus" "$work/corpus"
set +e
"$bin" "$work/corpus" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=60 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$work/" $([ "$jobs" -gt 1 ] && echo "-jobs=$jobs -workers=$jobs") \
  >"$work/fuzz.log" 2>&1
rc=$?
set -e
if [ "$jobs" -gt 1 ]; then cat "$work"/fuzz-*.log >>"$work/fuzz.log" 2>/dev/null || true; fi
grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$work/fuzz.log" | awk '!seen[$0]++' || true
crashes=$(ls "$work" | grep -E "^(crash|leak|timeout|oom)-" || true)
if [ "$rc" -ne 0 ] || [ -n "$crashes" ]; then
  echo "== fuzz_tdt FAILED (exit $rc)"
  grep -E -A3 "VIOLATION|runtime error|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)" "$work/fuzz.log" | head -20
  for c in $crashes; do cp "$work/$c" "$artifacts/" && echo "   kept $artifacts/$c"; done
  echo "   reproduce: $bin <input>   (FUZZ_TDT_DUMP=1 prints the lattice values)"
  status=1
fi
[ "$status" -eq 0 ] && echo "== fuzz_tdt: no violations"

# fuzz_joint: the fused joint + loss; its reproducers replayed, then fuzzed from them for the
# same time
echo "== building fuzz_joint"
cmake --build "$build" --target fuzz_joint -j"$(nproc)" >/dev/null
mkdir -p "$work/joint_corpus"
before=$status
status=0
replay "$build/fuzz_joint" "$root/fuzz/regressions/joint"
cp "$root"/fuzz/regressions/joint/*.bin "$work/joint_corpus/" 2>/dev/null || true
echo "== fuzzing fuzz_joint for ${secs}s"
set +e
"$build/fuzz_joint" "$work/joint_corpus" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=60 \
  -max_len=2048 -print_final_stats=1 -artifact_prefix="$work/joint-" >"$work/joint.log" 2>&1
rc=$?
set -e
grep -E "^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units" "$work/joint.log" | awk '!seen[$0]++' || true
crashes=$(ls "$work" | grep -E "^joint-(crash|leak|timeout|oom)-" || true)
if [ "$rc" -ne 0 ] || [ -n "$crashes" ]; then
  echo "== fuzz_joint FAILED (exit $rc)"
  grep -E -A3 "VIOLATION|runtime error|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)" "$work/joint.log" | head -20
  for c in $crashes; do cp "$work/$c" "$artifacts/" && echo "   kept $artifacts/$c"; done
  status=1
elif [ "$status" -eq 0 ]; then
  echo "== fuzz_joint: no violations"
fi
[ "$before" -eq 0 ] || status=1
exit "$status"
