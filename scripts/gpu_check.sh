#!/usr/bin/env bash
# Every GPU check in one go, for a CUDA machine (the H200 of the device tool, or any): build
# with CUDA, the GPU test suite, the binding's pytest suite, the multi-GPU checks (two GPUs or
# more), tdt_demo, the example training, tdt_bench and benchmark/bench.py, and compute-sanitizer
# (memcheck, racecheck, initcheck) over the GPU suite. Each step has a time limit and the whole
# run a budget (BUDGET seconds, default 540): steps past it are skipped and say so.
# Output in $OUT (default gpu-logs/): summary.log, logs.tgz (one log per step), bench.png.
# The exit status is the number of failed steps.
#   GoogleTest: set GTEST_DIR (default third_party/googletest, else the system's sources).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
BUDGET=${BUDGET:-540}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
GTEST_DIR=${GTEST_DIR:-third_party/googletest}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
failed=0
summary=()
step() { # step NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  if (( SECONDS + 20 > BUDGET )); then summary+=("SKIP   $name (out of budget)"); return; fi
  (( SECONDS + limit > BUDGET )) && limit=$((BUDGET - SECONDS))
  local t0=$SECONDS
  if timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1; then summary+=("ok     $name ($((SECONDS - t0)) s)")
  else summary+=("FAILED $name ($((SECONDS - t0)) s, limit $limit s): see $name.log"); failed=$((failed + 1)); fi
  tail -n 3 "$LOGS/$name.log" | sed "s/^/  [$name] /"
}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi > "$LOGS/nvidia-smi.log" 2>&1
gtest_flag=""
[[ -f $GTEST_DIR/CMakeLists.txt ]] && gtest_flag="-DTDT_GTEST_SOURCE_DIR=$GTEST_DIR"

step build 240 bash -c "cmake -B build-gpu -DTDT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 $gtest_flag \
  && cmake --build build-gpu -j$(nproc)"
export WARP_TDT_LIBRARY=$PWD/build-gpu/libwarptdt.so PYTHONPATH=$PWD/pytorch_binding
step gpu_tests 120 build-gpu/tests/tdt_gpu_tests
step pytest 150 python3 -m pytest -q -rs tests/python
if (( ngpu >= 2 )); then
  step ddp 90 torchrun --nproc_per_node=2 tests/multigpu/ddp_tdt.py --steps 5
fi
step tdt_bench 120 build-gpu/benchmark/tdt_bench --backend gpu --iters 30
step demo 60 build-gpu/benchmark/tdt_demo
step bench_py 120 python3 benchmark/bench.py --device cuda --iters 20 --plot "$OUT/bench.png"
step bench_py_novalidate 60 python3 benchmark/bench.py --device cuda --iters 20 --no-validate \
  --shapes base,parakeet,ragged --baseline-shapes none
step train_example 60 python3 examples/train_tiny_tdt.py --check
san="--error-exitcode=1"
step memcheck 120 compute-sanitizer --tool memcheck $san build-gpu/tests/tdt_gpu_tests \
  --gtest_filter='-GpuHuge.*:GpuPerf.*:GpuLong.*'
step racecheck 60 compute-sanitizer --tool racecheck $san build-gpu/tests/tdt_gpu_tests \
  --gtest_filter='GpuGolden.*:GpuEdge.*:GpuCalls.*:GpuBadData.*'
step initcheck 60 compute-sanitizer --tool initcheck $san build-gpu/tests/tdt_gpu_tests \
  --gtest_filter='GpuGolden.*:GpuEdge.*:GpuBadData.*'
step cpu_tests 60 build-gpu/tests/tdt_tests
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.log"
tar czf "$OUT/logs.tgz" -C "$LOGS" .
exit $failed
