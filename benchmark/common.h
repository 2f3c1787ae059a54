/*
 * common.h - what tdt_demo and tdt_bench share: a random joint-tensor problem (Parakeet
 * layout: blank = V - 1, duration logits after the token logits in one (B, T, U+1, V+D) row),
 * dtype loads and stores (with the library's own conversions), timing, and checked library calls.
 */
#ifndef TDT_BENCH_COMMON_H
#define TDT_BENCH_COMMON_H

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h" /* src/: the library's float16 / bfloat16 conversions */
#include "tdt.h"

/* A problem on the host, in the run dtype. */
typedef struct bench_problem {
    int64_t B, T, U, V, D;
    int durations[TDT_MAX_DURATIONS];
    tdt_dtype_t dtype;
    int rnnt;             /* 1: plain RNN-T (no duration logits) */
    void *joint;          /* (B, T, U+1, V+D) logits in dtype */
    int32_t *labels, *frame_lengths, *label_lengths;
} bench_problem_t;

static inline size_t bench_dtype_size(tdt_dtype_t d) {
    return d == TDT_DTYPE_FLOAT64 ? 8 : d == TDT_DTYPE_FLOAT32 ? 4 : 2;
}

static inline const char *bench_dtype_name(tdt_dtype_t d) {
    switch (d) {
    case TDT_DTYPE_FLOAT64: return "float64";
    case TDT_DTYPE_FLOAT16: return "float16";
    case TDT_DTYPE_BFLOAT16: return "bfloat16";
    default: return "float32";
    }
}

static inline int bench_parse_dtype(const char *s, tdt_dtype_t *d) {
    if (!strcmp(s, "f32") || !strcmp(s, "float32")) *d = TDT_DTYPE_FLOAT32;
    else if (!strcmp(s, "f64") || !strcmp(s, "float64")) *d = TDT_DTYPE_FLOAT64;
    else if (!strcmp(s, "f16") || !strcmp(s, "float16")) *d = TDT_DTYPE_FLOAT16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *d = TDT_DTYPE_BFLOAT16;
    else return 0;
    return 1;
}

/* "0,1,2,3,4" -> durations; returns the count or -1 (not integers, or more than
 * TDT_MAX_DURATIONS). Their values are the library's to check. */
static inline int bench_parse_durations(const char *s, int *out) {
    int n = 0;
    if (!*s) return -1;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || isspace((unsigned char)*s) || errno == ERANGE || v < -2147483647L - 1 ||
            v > 2147483647L || n == TDT_MAX_DURATIONS || (*end && *end != ','))
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* ---- command-line values, checked whole --------------------------------------------------------
 * Each returns 1 with the value, or prints one line naming the program, the flag and the value
 * and returns 0 (the caller prints the usage and exits with status 2). */

static inline int bench_arg_int(const char *prog, const char *flag, const char *v, long long lo,
                                long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || isspace((unsigned char)*v)) {
        fprintf(stderr, "%s: %s: '%s' is not an integer\n", prog, flag, v);
        return 0;
    }
    if (errno == ERANGE || x < lo || x > hi) {
        fprintf(stderr, "%s: %s: '%s' is out of range (%lld to %lld)\n", prog, flag, v, lo, hi);
        return 0;
    }
    *out = x;
    return 1;
}

static inline int bench_arg_int32(const char *prog, const char *flag, const char *v, int lo, int hi, int *out) {
    long long x;
    if (!bench_arg_int(prog, flag, v, lo, hi, &x)) return 0;
    *out = (int)x;
    return 1;
}

static inline int bench_arg_u64(const char *prog, const char *flag, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    /* strtoull takes "-1" as 2^64 - 1: only digits are a seed */
    if (end == v || *end || !isdigit((unsigned char)*v)) {
        fprintf(stderr, "%s: %s: '%s' is not a non-negative integer\n", prog, flag, v);
        return 0;
    }
    if (errno == ERANGE) {
        fprintf(stderr, "%s: %s: '%s' is out of range (0 to %llu)\n", prog, flag, v, (unsigned long long)UINT64_MAX);
        return 0;
    }
    *out = (uint64_t)x;
    return 1;
}

static inline int bench_arg_double(const char *prog, const char *flag, const char *v, double lo,
                                   double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || isspace((unsigned char)*v) || x != x) {
        fprintf(stderr, "%s: %s: '%s' is not a number\n", prog, flag, v);
        return 0;
    }
    if (errno == ERANGE || !(x >= lo && x <= hi)) {
        fprintf(stderr, "%s: %s: '%s' is out of range (%g to %g)\n", prog, flag, v, lo, hi);
        return 0;
    }
    *out = x;
    return 1;
}

/* --durations LIST: 1 with the count in *D, or 0 after the line. */
static inline int bench_arg_durations(const char *prog, const char *v, int *durations, int *D) {
    int n = bench_parse_durations(v, durations);
    if (n < 1) {
        fprintf(stderr, "%s: --durations: '%s' is not a list of integers like 0,1,2,3,4 (at most %d)\n",
                prog, v, TDT_MAX_DURATIONS);
        return 0;
    }
    *D = n;
    return 1;
}

/* --backend cpu|gpu|all: 1 with *cpu and *gpu set, or 0 after the line. */
static inline int bench_arg_backend(const char *prog, const char *v, int *cpu, int *gpu) {
    if (strcmp(v, "cpu") && strcmp(v, "gpu") && strcmp(v, "all")) {
        fprintf(stderr, "%s: --backend: '%s' is not cpu, gpu or all\n", prog, v);
        return 0;
    }
    *cpu = strcmp(v, "gpu") != 0;
    *gpu = strcmp(v, "cpu") != 0;
    return 1;
}

/* The line for getopt_long's refusals (called with opterr = 0 and an optstring that starts
 * with ':'): c == ':' is a missing value for the option whose val is optopt, anything else an
 * unknown option, arg being the word it came in (argv[optind - 1]). */
static inline void bench_arg_refusal(const char *prog, int c, const struct option *opts, const char *arg) {
    if (c == ':') {
        for (const struct option *o = opts; o->name; ++o)
            if (o->val == optopt) {
                fprintf(stderr, "%s: --%s needs a value\n", prog, o->name);
                return;
            }
        fprintf(stderr, "%s: %s needs a value\n", prog, arg);
    } else if (strncmp(arg, "--", 2) != 0 && optopt > 0 && optopt < 128 && isgraph(optopt)) {
        fprintf(stderr, "%s: unknown option '-%c'\n", prog, optopt);
    } else if (strchr(arg, '=') && strncmp(arg, "--", 2) == 0) {
        fprintf(stderr, "%s: unknown option, or one that takes no value: '%s'\n", prog, arg);
    } else {
        fprintf(stderr, "%s: unknown option '%s'\n", prog, arg);
    }
}

/* splitmix64: a small deterministic generator, so a seed repeats a problem everywhere. */
static inline uint64_t bench_rand(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double bench_uniform(uint64_t *state) {
    return ((double)(bench_rand(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Rounds x to dtype (through float32 for the 16-bit types, as the library's conversions in
 * src/common/dtype.h do) and stores it at element i. */
static inline void bench_store(void *base, size_t i, tdt_dtype_t d, double x) {
    switch (d) {
    case TDT_DTYPE_FLOAT64: ((double *)base)[i] = x; return;
    case TDT_DTYPE_FLOAT32: ((float *)base)[i] = (float)x; return;
    case TDT_DTYPE_BFLOAT16: ((uint16_t *)base)[i] = tdt_float_to_bf16((float)x); return;
    case TDT_DTYPE_FLOAT16: ((uint16_t *)base)[i] = tdt_float_to_fp16((float)x); return;
    }
}

static inline double bench_load(const void *base, size_t i, tdt_dtype_t d) {
    switch (d) {
    case TDT_DTYPE_FLOAT64: return ((const double *)base)[i];
    case TDT_DTYPE_FLOAT32: return ((const float *)base)[i];
    case TDT_DTYPE_BFLOAT16: return tdt_bf16_to_float(((const uint16_t *)base)[i]);
    case TDT_DTYPE_FLOAT16: return tdt_fp16_to_float(((const uint16_t *)base)[i]);
    }
    return 0.0;
}

/* Pair i of standard normals (Box-Muller on splitmix64 outputs 2i + 1 and 2i + 2 of the seed):
 * a function of (seed, i) alone, so any split of the pairs across threads draws the same numbers. */
static inline void bench_fill_pairs(bench_problem_t *p, uint64_t seed, size_t n, size_t lo, size_t hi) {
    for (size_t pair = lo; pair < hi; ++pair) {
        uint64_t st = seed + (uint64_t)(2 * pair) * 0x9e3779b97f4a7c15ull;
        double u1 = bench_uniform(&st), u2 = bench_uniform(&st);
        double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        size_t i = 2 * pair;
        bench_store(p->joint, i, p->dtype, r * cos(a));
        if (i + 1 < n) bench_store(p->joint, i + 1, p->dtype, r * sin(a));
    }
}

/* Allocates a problem's buffers; *n = joint elements. 0 when out of memory. */
static inline int bench_alloc(bench_problem_t *p, size_t *n) {
    int64_t W = p->V + (p->rnnt ? 0 : p->D), rows = p->B * p->T * (p->U + 1);
    *n = (size_t)rows * (size_t)W;
    p->joint = malloc(*n * bench_dtype_size(p->dtype));
    p->labels = (int32_t *)malloc((size_t)(p->B * (p->U > 0 ? p->U : 1)) * sizeof(int32_t));
    p->frame_lengths = (int32_t *)malloc((size_t)(p->B > 0 ? p->B : 1) * sizeof(int32_t));
    p->label_lengths = (int32_t *)malloc((size_t)(p->B > 0 ? p->B : 1) * sizeof(int32_t));
    return p->joint && p->labels && p->frame_lengths && p->label_lengths;
}

/* Labels uniform in [0, V-1) (blank is V - 1); lengths full when ragged == 0, else T_b in
 * [T/2, T] and U_b in [U/2, U]; drawn after the n logits' pairs. */
static inline void bench_fill_labels(bench_problem_t *p, uint64_t seed, size_t n, int ragged) {
    uint64_t st = seed + (uint64_t)(2 * ((n + 1) / 2)) * 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < p->B * p->U; ++i)
        p->labels[i] = (int32_t)(bench_rand(&st) % (uint64_t)(p->V > 1 ? p->V - 1 : 1));
    for (int64_t b = 0; b < p->B; ++b) {
        p->frame_lengths[b] = (int32_t)(ragged ? p->T / 2 + (int64_t)(bench_rand(&st) % (uint64_t)(p->T - p->T / 2 + 1)) : p->T);
        p->label_lengths[b] = (int32_t)(ragged ? p->U / 2 + (int64_t)(bench_rand(&st) % (uint64_t)(p->U - p->U / 2 + 1)) : p->U);
    }
}

/* Random problem: normal logits, labels and lengths as above. 0 when out of memory. */
static inline int bench_make(bench_problem_t *p, uint64_t seed, int ragged) {
    size_t n;
    if (!bench_alloc(p, &n)) return 0;
    bench_fill_pairs(p, seed, n, 0, (n + 1) / 2);
    bench_fill_labels(p, seed, n, ragged);
    return 1;
}

static inline void bench_free(bench_problem_t *p) {
    free(p->joint);
    free(p->labels);
    free(p->frame_lengths);
    free(p->label_lengths);
}

/* The library's view of a joint tensor at base (dtype elements). */
static inline tdt_problem_t bench_view(const bench_problem_t *p, const void *base,
                                       const int32_t *labels, const int32_t *T, const int32_t *U) {
    tdt_problem_t v;
    int64_t W = p->V + (p->rnnt ? 0 : p->D);
    memset(&v, 0, sizeof v);
    v.batch = p->B;
    v.max_frames = p->T;
    v.max_labels = p->U;
    v.vocab_size = p->V;
    v.dtype = p->dtype;
    v.token_logits = base;
    v.token_strides[0] = p->T * (p->U + 1) * W;
    v.token_strides[1] = (p->U + 1) * W;
    v.token_strides[2] = W;
    if (!p->rnnt) {
        v.duration_logits = (const char *)base + (size_t)p->V * bench_dtype_size(p->dtype);
        memcpy(v.duration_strides, v.token_strides, sizeof v.token_strides);
    }
    v.labels = labels;
    v.frame_lengths = T;
    v.label_lengths = U;
    return v;
}

/* Gradients written into one joint-shaped buffer. */
static inline tdt_gradients_t bench_grads(const bench_problem_t *p, void *base) {
    tdt_gradients_t g;
    int64_t W = p->V + (p->rnnt ? 0 : p->D);
    memset(&g, 0, sizeof g);
    g.token_grads = base;
    g.token_strides[0] = p->T * (p->U + 1) * W;
    g.token_strides[1] = (p->U + 1) * W;
    g.token_strides[2] = W;
    if (!p->rnnt) {
        g.duration_grads = (char *)base + (size_t)p->V * bench_dtype_size(p->dtype);
        memcpy(g.duration_strides, g.token_strides, sizeof g.token_strides);
    }
    return g;
}

static inline size_t bench_joint_elems(const bench_problem_t *p) {
    return (size_t)(p->B * p->T * (p->U + 1)) * (size_t)(p->V + (p->rnnt ? 0 : p->D));
}

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Exits with the library's own words when a call fails (programs, not the library, may exit). */
#define BENCH_CHECK(call)                                                                    \
    do {                                                                                     \
        tdt_status_t bench_s_ = (call);                                                      \
        if (bench_s_ != TDT_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,      \
                    tdt_status_string(bench_s_), tdt_last_error());                          \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

#endif /* TDT_BENCH_COMMON_H */
