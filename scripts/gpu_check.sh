#!/usr/bin/env bash
# Every GPU check in one go, for a CUDA machine (the H200 of the device tool, or any):
# build with CUDA, the GPU test suite, compute-sanitizer (memcheck, racecheck, initcheck) on it,
# the binding's pytest suite, the multi-GPU checks (two GPUs or more), tdt_demo, tdt_bench and
# benchmark/bench.py. Logs (and the plot) go to $OUT (default: gpu-logs/). A summary is printed
# last; the exit status is the number of failed steps.
#   GoogleTest: set GTEST_DIR (default third_party/googletest, else the system's sources).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
GTEST_DIR=${GTEST_DIR:-third_party/googletest}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
failed=0
summary=()
step() { # step NAME COMMAND...: runs it, logs to $OUT/NAME.log, records the verdict
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$OUT/$name.log" 2>&1; then summary+=("ok     $name ($((SECONDS - t0)) s)")
  else summary+=("FAILED $name ($((SECONDS - t0)) s): see $name.log"); failed=$((failed + 1)); fi
}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi > "$OUT/nvidia-smi.log" 2>&1
gtest_flag=()
[[ -f $GTEST_DIR/CMakeLists.txt ]] && gtest_flag=(-DTDT_GTEST_SOURCE_DIR="$GTEST_DIR")

step build bash -c "cmake -B build-gpu -DTDT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 ${gtest_flag[*]} \
  && cmake --build build-gpu -j$(nproc)"
lib=build-gpu/libwarptdt.so
export WARP_TDT_LIBRARY=$PWD/$lib PYTHONPATH=$PWD/pytorch_binding
step gpu_tests build-gpu/tests/tdt_gpu_tests
step cpu_tests build-gpu/tests/tdt_tests
san="--error-exitcode=1"
# the sanitizers over the suite, less the multi-gigabyte and timing tests
step memcheck compute-sanitizer --tool memcheck $san build-gpu/tests/tdt_gpu_tests --gtest_filter='-GpuHuge.*:GpuPerf.*'
step racecheck compute-sanitizer --tool racecheck $san build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuGolden.*:GpuEdge.*:GpuCalls.*:GpuBadData.*:GpuLong.*'
step initcheck compute-sanitizer --tool initcheck $san build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuGolden.*:GpuEdge.*:GpuCalls.*:GpuBadData.*:GpuVsCpu.*'
step pytest python3 -m pytest -q -rs tests/python
if (( ngpu >= 2 )); then
  step ddp torchrun --nproc_per_node=2 tests/multigpu/ddp_tdt.py --steps 5
fi
step demo build-gpu/benchmark/tdt_demo
step train_example python3 examples/train_tiny_tdt.py --check
step tdt_bench build-gpu/benchmark/tdt_bench --backend gpu --iters 30
step bench_py python3 benchmark/bench.py --device cuda --iters 20 --plot "$OUT/bench.png"
step bench_py_novalidate python3 benchmark/bench.py --device cuda --iters 20 --no-validate --baseline-shapes none
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.log"
exit $failed
