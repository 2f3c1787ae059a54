#!/usr/bin/env bash
# Every GPU check in one go, for a CUDA machine (the H200 of the device tool, or any): build
# with CUDA, the GPU test suite, the binding's pytest suite, the multi-GPU checks (two GPUs or
# more), tdt_demo, the example training, tdt_bench and benchmark/bench.py, the fused joint's
# checks and benchmark, and compute-sanitizer (memcheck, racecheck, initcheck) over the GPU
# suite. Each step has a time limit and the whole run a budget (BUDGET seconds, default 540):
# steps past it are skipped and say so.
# Output in $OUT (default gpu-logs/): summary.log, logs.tgz (one log per step), bench.png,
# joint.png.
# The exit status is the number of failed steps.
#   PHASES: which groups of steps to run, in order (default: all but profile, arch80, archall):
#     build tests bench joint wgmma tune profile pytest pybench ddp sanitize arch80 archall
#   wgmma: the Hopper kernels alone (compute capability 9.0): their tests, memcheck, the
#   backward's dz on wgmma and the chip backward against cuBLASLt's (TDT_GPU_JOINT_BWD=gemm,
#   wgmma, chip) in joint_gpu_bench, the chip backward's memory in bench.py, and the
#   prototypes joint_bwd_proto and joint_lse_proto; on request, e.g. PHASES="build wgmma", or
#   with binaries built elsewhere in build-gpu/ (PHASES=wgmma).
#   arch80: a second build for CMAKE_CUDA_ARCHITECTURES=80 alone (its PTX-free sm_80 code runs on
#   any later GPU, without the sm_90 schedules) and the GPU suite on it.
#   archall: the default build (every architecture of CMakeLists.txt), its GPU suite and
#   tdt_bench: what a user's plain `cmake -B build` gives.
#   (a warm machine keeps build-gpu/ between calls, so later calls can skip build).
#   tune: tdt_bench times with each lanes-a-node choice of the sweep (TDT_SWEEP_LANES) and with
#   the register-prefetching ring instead of the staged sweep (TDT_SWEEP_STAGED=0), in a second
#   build, build-tune/, made with -DTDT_SWEEP_TUNING=ON by the build phase.
#   GoogleTest: set GTEST_DIR (default third_party/googletest, else the system's sources).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
BUDGET=${BUDGET:-540}
PHASES=" ${PHASES:-build tests bench joint tune pytest pybench ddp sanitize} "  # profile, arch80, archall: on request
want() { [[ $PHASES == *" $1 "* ]]; }
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

if want build; then
  step build 240 bash -c "cmake -B build-gpu -DTDT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DTDT_CUDA_LINEINFO=ON $gtest_flag \
    && cmake --build build-gpu -j$(nproc) --target all joint_gpu_bench joint_lse_proto joint_bwd_proto"
  if want tune; then
    step build_tune 240 bash -c "cmake -B build-tune -DTDT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DTDT_SWEEP_TUNING=ON $gtest_flag && cmake --build build-tune -j$(nproc) --target tdt_bench"
  fi
fi
export WARP_TDT_LIBRARY=$PWD/build-gpu/libwarptdt.so PYTHONPATH=$PWD/pytorch_binding
if want tests; then
  step gpu_tests 180 build-gpu/tests/tdt_gpu_tests
  step cpu_tests 90 build-gpu/tests/tdt_tests
  step demo 60 build-gpu/benchmark/tdt_demo
fi
if want bench; then
  step tdt_bench 150 build-gpu/benchmark/tdt_bench --backend gpu --iters 30
fi
if want joint; then
  # the fused joint + loss. Its default schedule (the GEMM schedule, src/gpu/joint_gemm.cu): its GPU
  # tests under memcheck, racecheck (two of them) and initcheck (three), its benchmark against
  # cuBLAS's GEMM of the same size, then through the binding against the unfused path (time, peak
  # memory)
  san="--error-exitcode=1 --print-limit 20"
  step joint_memcheck 150 compute-sanitizer --tool memcheck $san build-gpu/tests/tdt_gpu_tests \
    --gtest_filter='GpuJoint*'
  # the wgmma forward (compute capability 9.0): three of its instances under racecheck, two
  # under initcheck (the slower tool: 35-40 s each on an H100). Both report inside cuBLASLt's own
  # kernels, which these tests run too (the cuBLASLt forward beside it, the backward's products):
  # racecheck within an sm_90 nvjet kernel, initcheck the reads of cuBLASLt's outputs (below); a
  # report about any other kernel fails
  wg='GpuJoint/WgmmaForward.*/case0_bfloat16_chunk300:GpuJoint/WgmmaForward.*/case0_float16_chunkdefault'
  wg_race="$wg:GpuJoint/WgmmaForward.*/case2_float16_chunkdefault"
  step joint_wgmma_racecheck 150 bash -c "compute-sanitizer --tool racecheck --racecheck-report all \
    --print-limit 1000000 build-gpu/tests/tdt_gpu_tests --gtest_filter='$wg_race' > \$0 2>&1; rc=\$?; \
    n=\$(grep -E '^=+ +(Read|Write) Thread' \$0 | grep -vc nvjet); echo \"hazards outside cuBLASLt: \$n\"; \
    (( rc == 0 && n == 0 ))" "$LOGS/joint_wgmma_racecheck.raw"
  step joint_wgmma_initcheck 150 bash -c "compute-sanitizer --tool initcheck --print-limit 1000000 \
    build-gpu/tests/tdt_gpu_tests --gtest_filter='$wg' > \$0 2>&1; rc=\$?; \
    grep -A1 Uninitialized \$0 | grep -o 'at [^(]*' | sort | uniq -c; \
    n=\$(grep -A1 Uninitialized \$0 | grep '^=* *at ' | grep -Evc 'gemm_(dx|dz|node)_kernel<'); \
    echo \"reports outside the kernels that read cuBLASLt's outputs: \$n\"; (( rc == 0 && n == 0 ))" \
    "$LOGS/joint_wgmma_initcheck.raw"
  step joint_racecheck 90 compute-sanitizer --tool racecheck --racecheck-report all $san \
    build-gpu/tests/tdt_gpu_tests \
    --gtest_filter='GpuJoint.BasicTdtEveryDtype:GpuJoint.RaggedDropoutTanhOddHidden'
  # initcheck: the tiles' schedule must be clean; under the GEMM schedule it reports reads of z
  # wherever cuBLASLt takes its sm_90 kernels, whose stores it does not see (docs/joint.md, "Checks
  # and measurements on the GPU"), so that step counts its reports without failing
  init3='GpuJoint.RnntSigmoidNoBias:GpuJoint.OptionsAndReductions:GpuJoint.DeterministicAcrossRuns'
  step joint_initcheck_reports 120 bash -c "set -o pipefail; compute-sanitizer --tool initcheck \
    --print-limit 3 build-gpu/tests/tdt_gpu_tests --gtest_filter='$init3' \
    | grep -E 'ERROR SUMMARY|PASSED|FAILED'"
  step joint_tiles_initcheck 180 env TDT_GPU_JOINT=tiles compute-sanitizer --tool initcheck $san \
    build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuJoint.*'
  step joint_bench 150 build-gpu/benchmark/joint_gpu_bench --iters 5 \
    --shapes parakeet-joint,huge-joint,long-joint,xl-joint
  # the forward on cuBLASLt (TDT_GPU_JOINT_FWD=gemm; the default on Hopper is the wgmma one): its
  # tests and its bfloat16 benchmark, against the default's above
  step joint_fwd_gemm_tests 120 env TDT_GPU_JOINT_FWD=gemm build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuJoint*'
  step joint_bench_fwd_gemm 120 env TDT_GPU_JOINT_FWD=gemm build-gpu/benchmark/joint_gpu_bench --iters 5 \
    --shapes parakeet-joint,huge-joint,long-joint --dtypes bf16
  step joint_bench_py 240 python3 benchmark/bench.py --device cuda --iters 5 \
    --joint parakeet-joint,huge-joint,long-joint,xl-joint --dtypes bfloat16,float32 \
    --plot "$OUT/joint.png"
  # float32's products as float32 kernels (TDT_GPU_JOINT_FLOAT32=sgemm; the default splits them
  # into bfloat16 parts): the GPU joint tests that way, then its benchmark
  step joint_sgemm_tests 120 env TDT_GPU_JOINT_FLOAT32=sgemm build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuJoint.*'
  step joint_bench_sgemm 150 env TDT_GPU_JOINT_FLOAT32=sgemm build-gpu/benchmark/joint_gpu_bench --iters 5 \
    --shapes parakeet-joint,huge-joint,long-joint --dtypes f32
  # skip_below's compacted backward against the exact step and the unfused path
  step joint_skip_bench 150 python3 benchmark/bench.py --device cuda --iters 3 \
    --joint parakeet-joint,huge-joint --dtypes bfloat16,float32 --joint-skip 1e-4,1e-3
  # the mma.sync forward prototype, checked then timed against cuBLAS's z product and row pass
  step joint_lse_proto 60 build-gpu/benchmark/joint_lse_proto --iters 5
  # the GEMM schedule's chunk budget (default 128 MB): 32 MB and 512 MB
  for kb in 32768 524288; do
    step joint_bench_chunk_$kb 120 env TDT_GPU_JOINT_CHUNK_KB=$kb build-gpu/benchmark/joint_gpu_bench \
      --iters 5 --shapes parakeet-joint,huge-joint,long-joint
  done
  # the other schedule (the tiles of src/gpu/joint.cu, used where cuBLASLt does not load): the
  # same tests, memcheck, racecheck and its benchmark
  step joint_tiles_tests 180 env TDT_GPU_JOINT=tiles build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuJoint.*'
  step joint_tiles_memcheck 120 env TDT_GPU_JOINT=tiles compute-sanitizer --tool memcheck $san \
    build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuJoint.*'
  step joint_tiles_racecheck 90 env TDT_GPU_JOINT=tiles compute-sanitizer --tool racecheck \
    --racecheck-report all $san build-gpu/tests/tdt_gpu_tests \
    --gtest_filter='GpuJoint.BasicTdtEveryDtype:GpuJoint.RaggedDropoutTanhOddHidden'
  step joint_tiles_bench 150 env TDT_GPU_JOINT=tiles build-gpu/benchmark/joint_gpu_bench --iters 3
fi
if want wgmma; then
  wsan="--error-exitcode=1 --print-limit 20"
  wg='GpuJoint/WgmmaForward.*/case0_bfloat16_chunk300:GpuJoint/WgmmaForward.*/case2_float16_chunkdefault'
  wg+=':GpuJoint/WgmmaBackward.*/case0_bfloat16_chunk300:GpuJoint/WgmmaBackward.*/case2_float16_chunkdefault'
  wg+=':GpuJoint/WgmmaBackward.*/case0_bfloat16_chunk500:GpuJoint/WgmmaBackward.Chip*/case3_bfloat16_chunk1'
  wg+=':GpuJoint.ChipRareRows'
  step wgmma_tests 120 build-gpu/tests/tdt_gpu_tests --gtest_filter='GpuJoint/Wgmma*:GpuJoint.Wgmma*:GpuJoint.Chip*'
  step wgmma_memcheck 150 compute-sanitizer --tool memcheck $wsan build-gpu/tests/tdt_gpu_tests --gtest_filter="$wg"
  for round in 1 2; do
    for bwd in gemm wgmma chip; do
      step wgmma_bench_bwd_${bwd}_$round 90 env TDT_GPU_JOINT_BWD=$bwd build-gpu/benchmark/joint_gpu_bench --iters 5 \
        --shapes parakeet-joint,huge-joint,long-joint --dtypes bf16
    done
  done
  # the chip backward through the binding: its peak memory (63 MB beyond the gradients at
  # huge-joint) and time against the unfused path
  step chip_bench_py 240 env TDT_GPU_JOINT_BWD=chip python3 benchmark/bench.py --device cuda --iters 5 \
    --joint parakeet-joint,huge-joint,long-joint,xl-joint --dtypes bfloat16
  step bwd_proto_small 60 build-gpu/benchmark/joint_bwd_proto --nodes 300 --vocab 300 --iters 1
  step bwd_proto_memcheck 120 compute-sanitizer --tool memcheck $wsan build-gpu/benchmark/joint_bwd_proto \
    --nodes 300 --vocab 300 --iters 1
  step bwd_proto_huge 120 build-gpu/benchmark/joint_bwd_proto --iters 5
  step bwd_proto_long 120 build-gpu/benchmark/joint_bwd_proto --nodes 601500 --labels 401 --vocab 1025 --iters 5
  step lse_proto 60 build-gpu/benchmark/joint_lse_proto --hidden 640 --iters 10
fi
if want tune; then
  # each lanes-a-node choice, and the register-prefetching ring instead of the staged sweep
  for cfg in TDT_SWEEP_STAGED=0 TDT_SWEEP_LANES=1 TDT_SWEEP_LANES=2 TDT_SWEEP_LANES=4; do
    step tune_${cfg#TDT_SWEEP_} 60 env $cfg build-tune/benchmark/tdt_bench --backend gpu \
      --shapes base,parakeet,large,long,ragged --dtypes f32 --iters 20
  done
fi
if want pytest; then
  step pytest 360 python3 -m pytest -q -rs tests/python
fi
if want sanitize; then
  # the whole GPU suite under each tool (GpuPerf only prints timings and is skipped there);
  # initcheck without GpuJoint (the joint phase runs it, for the reason given there) unless
  # INITCHECK_FILTER names tests
  san="--error-exitcode=1 --print-limit 20"
  tools=" ${SAN_TOOLS:-memcheck racecheck initcheck} "
  [[ $tools == *" memcheck "* ]] && \
    step memcheck ${SAN_LIMIT:-240} compute-sanitizer --tool memcheck $san build-gpu/tests/tdt_gpu_tests
  [[ $tools == *" racecheck "* ]] && \
    step racecheck ${SAN_LIMIT:-240} compute-sanitizer --tool racecheck --racecheck-report all $san \
      build-gpu/tests/tdt_gpu_tests
  [[ $tools == *" initcheck "* ]] && \
    step initcheck ${SAN_LIMIT:-240} compute-sanitizer --tool initcheck $san build-gpu/tests/tdt_gpu_tests \
    --gtest_filter="${INITCHECK_FILTER:--GpuJoint.*}"
fi
if want pybench; then
  step bench_py 150 python3 benchmark/bench.py --device cuda --iters 20 --plot "$OUT/bench.png"
  step bench_py_novalidate 60 python3 benchmark/bench.py --device cuda --iters 20 --no-validate \
    --shapes base,parakeet,ragged --baseline-shapes none
  step bench_py_sync 60 python3 benchmark/bench.py --device cuda --iters 20 --sync-validation \
    --shapes base,parakeet,ragged --baseline-shapes none
  step train_example 60 python3 examples/train_tiny_tdt.py --check
  step train_fused_example 90 python3 examples/train_tiny_tdt_fused.py --check
  step transformers_swap 90 python3 examples/train_tiny_tdt_fused.py --transformers
fi
if want arch80; then
  step build_80 300 bash -c "cmake -B build-80 -DTDT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=80 $gtest_flag \
    && cmake --build build-80 -j$(nproc) --target tdt_gpu_tests tdt_bench"
  step gpu_tests_80 300 build-80/tests/tdt_gpu_tests --gtest_brief=1
  step tdt_bench_80 120 build-80/benchmark/tdt_bench --backend gpu --iters 20
fi
if want archall; then
  step build_all 420 bash -c "cmake -B build-all -DTDT_CUDA=ON $gtest_flag \
    && cmake --build build-all -j$(nproc) --target tdt_gpu_tests tdt_bench"
  step gpu_tests_all 240 build-all/tests/tdt_gpu_tests --gtest_brief=1
  step tdt_bench_all 150 build-all/benchmark/tdt_bench --backend gpu --iters 20
fi
if want ddp && (( ngpu >= 2 )); then
  step ddp 90 torchrun --nproc_per_node=2 tests/multigpu/ddp_tdt.py --steps 5
fi
if want profile; then
  # where the sweep's time goes: stall reasons per SASS instruction, and the warp-state summary
  # (base: short diagonals, latency-bound; long: 401-node diagonals on one SM); then the V-wide
  # passes (normalize, grad) at parakeet, both dtypes; and the SASS of the whole library.
  ncu_args=(--clock-control none --launch-count 1)
  sweep=(--kernel-name regex:sweep_kernel)
  bench=(build-gpu/benchmark/tdt_bench --backend gpu --dtypes f32 --iters 1)
  step ncu_sweep_source 90 ncu "${ncu_args[@]}" "${sweep[@]}" --section SourceCounters \
    --section WarpStateStats --import-source yes --page source --print-source sass --csv \
    "${bench[@]}" --shapes base
  step ncu_sweep_details 90 ncu "${ncu_args[@]}" "${sweep[@]}" --section WarpStateStats \
    --section SchedulerStats --section LaunchStats --section Occupancy \
    --section ComputeWorkloadAnalysis --section InstructionStats "${bench[@]}" --shapes base
  step ncu_long_sweep 120 ncu "${ncu_args[@]}" "${sweep[@]}" --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --section SourceCounters "${bench[@]}" --shapes long
  for dt in f32 bf16; do
    step ncu_passes_$dt 120 ncu --clock-control none --kernel-name regex:"normalize_kernel|grad_kernel" \
      --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section Occupancy --section LaunchStats --section InstructionStats --section SourceCounters \
      build-gpu/benchmark/tdt_bench --backend gpu --dtypes $dt --iters 1 --shapes parakeet
  done
  # the fused joint's GEMM schedule: time per kernel and per cuBLASLt product (huge-joint, bf16,
  # 512 MB chunks so that ncu replays few launches), summed by benchmark/kernel_times.py over the
  # two runs of --iters 1 (warm-up, timed; each the forward alone, then forward+backward)
  step ncu_joint 150 bash -c "TDT_GPU_JOINT_CHUNK_KB=524288 ncu --clock-control none \
    --metrics gpu__time_duration.sum --csv build-gpu/benchmark/joint_gpu_bench --iters 1 \
    --shapes huge-joint --dtypes bf16 > $LOGS/ncu_joint.csv && python3 benchmark/kernel_times.py \
    $LOGS/ncu_joint.csv --runs 2"
  step sass 60 bash -c "cuobjdump -sass build-gpu/libwarptdt.so"
fi
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.log"
tar czf "$OUT/logs.tgz" -C "$LOGS" .
exit $failed
