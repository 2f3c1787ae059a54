#!/usr/bin/env bash
# The GPU fused joint's checks in one go, for a CUDA machine: build with CUDA (sm_90), the
# joint's GPU tests (tests/test_gpu_joint.cc) and the CPU joint's tests, the GPU joint tests
# under compute-sanitizer (memcheck; racecheck on two of them), and benchmark/joint_gpu_bench.
# Each step has a time limit and the whole run a budget (BUDGET seconds, default 330): steps
# past it are skipped and say so. Logs in $OUT (default gpu-joint-logs/), one a step, and a
# summary table printed last (also summary.log). The exit status is the number of failed steps.
#   GTEST_DIR: GoogleTest's sources (default third_party/googletest, else the system's).
#   BUILD: the build folder (default build-gpu; a warm machine keeps it between calls).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-joint-logs}
BUDGET=${BUDGET:-330}
BUILD=${BUILD:-build-gpu}
GTEST_DIR=${GTEST_DIR:-third_party/googletest}
mkdir -p "$OUT"
failed=0
summary=()
step() { # step NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  if (( SECONDS + 10 > BUDGET )); then summary+=("SKIP   $name (out of budget)"); return; fi
  (( SECONDS + limit > BUDGET )) && limit=$((BUDGET - SECONDS))
  local t0=$SECONDS
  if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then summary+=("ok     $name ($((SECONDS - t0)) s)")
  else summary+=("FAILED $name ($((SECONDS - t0)) s, limit $limit s): see $name.log"); failed=$((failed + 1)); fi
  tail -n 3 "$OUT/$name.log" | sed "s/^/  [$name] /"
}
gtest_flag=""
[[ -f $GTEST_DIR/CMakeLists.txt ]] && gtest_flag="-DTDT_GTEST_SOURCE_DIR=$GTEST_DIR"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi > "$OUT/nvidia-smi.log" 2>&1

step build 200 bash -c "cmake -B $BUILD -DTDT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 $gtest_flag \
  && cmake --build $BUILD -j$(nproc) --target tdt_gpu_tests tdt_tests joint_gpu_bench"
step gpu_joint_tests 90 "$BUILD/tests/tdt_gpu_tests" --gtest_filter='GpuJoint.*'
step cpu_joint_tests 60 "$BUILD/tests/tdt_tests" --gtest_filter='Joint*'
step memcheck 120 "$sanitizer" --tool memcheck --error-exitcode=1 --print-limit 20 \
  "$BUILD/tests/tdt_gpu_tests" --gtest_filter='GpuJoint.*'
step racecheck 90 "$sanitizer" --tool racecheck --racecheck-report all --error-exitcode=1 \
  --print-limit 20 "$BUILD/tests/tdt_gpu_tests" \
  --gtest_filter='GpuJoint.BasicTdtEveryDtype:GpuJoint.RaggedDropoutTanhOddHidden'
step bench 150 "$BUILD/benchmark/joint_gpu_bench" --iters 3

{
  echo "== gpu_joint_check: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
  printf '%s\n' "${summary[@]}"
  if [[ -f $OUT/bench.log ]]; then
    echo "== joint_gpu_bench"
    grep -E '^(shape|[a-z]+-joint) ' "$OUT/bench.log"
  fi
  echo "== $failed failed step(s), $SECONDS s"
} | tee "$OUT/summary.log"
exit "$failed"
