/*
 * paths.h - the CPU backend's vector paths: cpu.c compiled once for each, one picked at run time.
 *
 * The build compiles cpu.c (and kernels.h with it) and joint.c once per path of the target, each
 * with its own instruction set flags and TDT_CPU_PATH set to the path's name, which names the
 * table cpu.c exports: tdt_cpu_path_NAME, its entry points (the functions cpu.c lends joint.c,
 * cpu.h, carry the path's name too). dispatch.c, compiled once for the
 * target's baseline, picks the path for the process (the CPU's features, the environment
 * variable TDT_CPU_ISA) and forwards tdt_cpu_run and tdt_cpu_scale to it.
 *
 *   x86-64:   baseline    x86-64 (SSE2)
 *             avx2        AVX2, FMA and F16C (Haswell, Zen 1 and later)
 *             avx512      AVX-512 F, BW, DQ and VL, with AVX2, FMA and F16C (Skylake-SP, Ice Lake)
 *             avx512bf16  the same and AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4, Zen 5)
 *   aarch64:  neon        ARMv8-A (Advanced SIMD is part of it)
 *   others:   baseline    the target's default
 *   TDT_NATIVE_ARCH=ON: native (-march=native, this path alone)
 *
 * The paths with FMA give the same bits as each other, and so do the paths without: kernels.h.
 */
#ifndef TDT_CPU_PATHS_H
#define TDT_CPU_PATHS_H

#include "internal.h"

/* One path's entry points: tdt_cpu_run, tdt_cpu_scale, tdt_cpu_joint_run and
 * tdt_cpu_joint_scratch_bytes as internal.h declares them. */
typedef struct tdt_cpu_path {
    const char *isa; /* the path's name, tdt_cpu_isa()'s answer */
    tdt_status_t (*run)(const tdt_call_t *call);
    tdt_status_t (*scale)(const tdt_call_t *call);
    tdt_status_t (*joint_run)(const tdt_joint_call_t *call);
    size_t (*joint_scratch_bytes)(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                  int num_durations);
} tdt_cpu_path_t;

#define TDT_CPU_PASTE2(a, b) a##b
#define TDT_CPU_PASTE(a, b) TDT_CPU_PASTE2(a, b)
#define TDT_CPU_STR2(a) #a
#define TDT_CPU_STR(a) TDT_CPU_STR2(a)

#if defined(TDT_CPU_PATH)
/* In a per-path source: its table's name and its path's name. */
#define TDT_CPU_PATH_TABLE TDT_CPU_PASTE(tdt_cpu_path_, TDT_CPU_PATH)
#define TDT_CPU_PATH_NAME TDT_CPU_STR(TDT_CPU_PATH)
#endif

#endif /* TDT_CPU_PATHS_H */
