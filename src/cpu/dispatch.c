/*
 * dispatch.c - picks the CPU backend's vector path (paths.h) once for the process, and forwards
 * tdt_cpu_run and tdt_cpu_scale to it. Compiled once, for the target's baseline.
 *
 * Forwards tdt_cpu_joint_run and tdt_cpu_joint_scratch_bytes the same way.
 *
 * x86-64: the best path the CPU and the operating system both support, from CPUID (the
 * instruction sets) and XGETBV (the register state the OS saves on a context switch: the AVX
 * paths need the YMM state, the AVX-512 ones also the opmask and ZMM states; a CPU with AVX-512
 * under an OS or hypervisor that does not enable it gets the AVX2 path). The environment
 * variable TDT_CPU_ISA (baseline, avx2, avx512, avx512bf16), read at the library's first CPU
 * call, asks for a lower path: for tests, and for a user comparing paths; a path the CPU lacks,
 * or a name not in that list, gives the best supported path. Elsewhere one path, and
 * TDT_CPU_ISA is not read.
 *
 * Thread safety: the first caller's choice is published with a compare-and-swap, so concurrent
 * first calls agree, and every later call reads the same path. No other state.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/paths.h"

#if defined(TDT_CPU_X86_PATHS)
#include <cpuid.h>

extern const tdt_cpu_path_t tdt_cpu_path_baseline, tdt_cpu_path_avx2, tdt_cpu_path_avx512,
    tdt_cpu_path_avx512bf16;

/* In order: each path needs what the ones before it need. */
static const tdt_cpu_path_t *const paths[] = {&tdt_cpu_path_baseline, &tdt_cpu_path_avx2,
                                              &tdt_cpu_path_avx512, &tdt_cpu_path_avx512bf16};
enum { NUM_PATHS = (int)(sizeof paths / sizeof paths[0]) };

/* XCR0, the register states the OS saves (0 where it has not enabled XSAVE). */
static uint64_t os_saved_states(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* XCR0 */
    return ((uint64_t)hi << 32) | lo;
}

/* The index into paths of the best path this CPU and OS run. */
static int best_path(void) {
    unsigned a1, b1, c1, d1, a7, b7, c7, d7, a71 = 0, b71, c71, d71;
    if (!__get_cpuid(1, &a1, &b1, &c1, &d1)) return 0;
    if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return 0;
    if (a7 >= 1) __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71); /* a7: the last subleaf */
    const uint64_t xcr0 = os_saved_states();
    const int ymm = (xcr0 & 0x6) == 0x6;          /* XMM and YMM state */
    const int zmm = ymm && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    const int avx2 = ymm && (c1 & bit_AVX) && (c1 & bit_F16C) && (b7 & bit_AVX2);
    if (!avx2) return 0;
    const unsigned avx512 = bit_AVX512F | bit_AVX512DQ | bit_AVX512BW | bit_AVX512VL;
    if (!zmm || (b7 & avx512) != avx512) return 1;
    return (a71 & (1u << 5)) ? 3 : 2; /* CPUID.(7, 1):EAX bit 5, AVX512_BF16 */
}

static const tdt_cpu_path_t *pick_path(void) {
    const int best = best_path();
    const char *want = getenv("TDT_CPU_ISA");
    for (int i = 0; want && i < best; ++i)
        if (strcmp(want, paths[i]->isa) == 0) return paths[i];
    return paths[best];
}
#else
extern const tdt_cpu_path_t TDT_CPU_PASTE(tdt_cpu_path_, TDT_CPU_ONE_PATH);
static const tdt_cpu_path_t *pick_path(void) { return &TDT_CPU_PASTE(tdt_cpu_path_, TDT_CPU_ONE_PATH); }
#endif

static _Atomic(const tdt_cpu_path_t *) chosen_path;

static const tdt_cpu_path_t *cpu_path(void) {
    const tdt_cpu_path_t *p = atomic_load_explicit(&chosen_path, memory_order_acquire);
    if (!p) {
        const tdt_cpu_path_t *none = NULL;
        p = pick_path();
        if (!atomic_compare_exchange_strong(&chosen_path, &none, p)) p = none; /* another's */
    }
    return p;
}

tdt_status_t tdt_cpu_run(const tdt_call_t *call) { return cpu_path()->run(call); }

tdt_status_t tdt_cpu_scale(const tdt_call_t *call) { return cpu_path()->scale(call); }

tdt_status_t tdt_cpu_joint_run(const tdt_joint_call_t *call) { return cpu_path()->joint_run(call); }

size_t tdt_cpu_joint_scratch_bytes(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                   int num_durations) {
    return cpu_path()->joint_scratch_bytes(problem, options, num_durations);
}

TDT_API const char *tdt_cpu_isa(void) { return cpu_path()->isa; }
