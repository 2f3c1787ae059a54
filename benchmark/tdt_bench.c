/*
 * tdt_bench - times the loss on the named shapes below (the ones docs/performance.md reports) or
 * any shape, on the CPU and the GPU, forward only and forward+backward, per dtype; against the
 * memory-traffic floor.
 *
 * Every result is checked before it is timed: CPU results against the CPU backend in float64 on
 * the same (rounded) logits, GPU results against the CPU backend in the same dtype. A wrong
 * answer prints FAILED instead of a time, and the exit status is 1.
 *
 * Floor: forward reads the logits once, forward+backward reads them twice and writes the
 * gradient once (docs/math.md section 5), over the copy bandwidth measured in the same run
 * (a large memcpy / cudaMemcpy device-to-device, bytes read + written per second).
 *
 *   tdt_bench                                  the named shapes on every backend present
 *   tdt_bench --shapes base,long --backend gpu --dtypes f32,bf16
 *   tdt_bench --shape 4,200,40,8193 --ragged   any shape (B,T,U,V)
 */
#include <omp.h>

#include "common.h"

#ifdef TDT_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct shape {
    const char *name;
    int64_t B, T, U, V;
    int ragged;
    int gpu_only; /* too large for a 2-core CPU in a benchmark run */
} shape_t;

/* --schedule's names, in tdt_gpu_schedule_t's order */
static const char *const schedule_names[] = {"auto", "serial", "overlap", "split", "fused", "trail"};

static const shape_t named_shapes[] = {
    {"base", 8, 100, 20, 1025, 0, 0},     {"parakeet", 4, 200, 40, 8193, 0, 0},
    {"large", 16, 400, 100, 1025, 0, 1},  {"long", 1, 1500, 400, 1025, 0, 0},
    {"ragged", 32, 150, 60, 257, 1, 0},   {"huge", 8, 375, 100, 8193, 0, 1},
};
#define NUM_SHAPES ((int)(sizeof named_shapes / sizeof named_shapes[0]))

typedef struct bench_args {
    int shape_on[NUM_SHAPES];
    shape_t custom;
    int have_custom;
    tdt_dtype_t dtypes[4];
    int num_dtypes;
    int cpu, gpu, iters, threads;
    int own_stream; /* GPU: run on a created non-blocking stream, not the legacy default */
    tdt_gpu_schedule_t schedule; /* GPU: tdt_options_t.gpu_schedule */
    int durations[TDT_MAX_DURATIONS], D;
    /* GPU, --vary NAME=v1,v2,...: each value in turn (the schedule, or an environment variable
     * that a TDT_SWEEP_TUNING build of the library reads per call), each checked then timed,
     * --rounds times over; without --vary one variant, the plain run */
    char vary_name[64], vary_values[8][32];
    int num_vary, rounds;
} bench_args_t;

static int failures = 0;

static double median(double *x, int n) {
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && x[j] < x[j - 1]; --j) {
            double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* ---- host work spread over the machine's cores (the `huge` shape has 2.5e9 elements) --------
 * OpenMP loops with their own num_threads clause: the process's OpenMP settings stay as they are
 * for the library's calls. Small work runs on one thread. */

static int host_threads(size_t n) {
    return n < ((size_t)1 << 20) ? 1 : omp_get_num_procs();
}

/* bench_make (common.h), the same numbers, with the logits drawn in parallel: pair i of the
 * normals is a function of (seed, i) alone, so any split draws the same problem. */
static int bench_make_fast(bench_problem_t *p, uint64_t seed, int ragged) {
    size_t n;
    if (!bench_alloc(p, &n)) return 0;
    const long long pairs = (long long)((n + 1) / 2), chunk = 1 << 16;
#pragma omp parallel for num_threads(host_threads((size_t)pairs)) schedule(static)
    for (long long lo = 0; lo < pairs; lo += chunk)
        bench_fill_pairs(p, seed, n, (size_t)lo, (size_t)(lo + chunk < pairs ? lo + chunk : pairs));
    bench_fill_labels(p, seed, n, ragged);
    return 1;
}

/* The gradient comparison of check(), in parallel: the worst |x - y| / (rel |y| + 1e-6), a NaN
 * difference counting as the worst. */
static double worst_grad_error(const void *grad, tdt_dtype_t dtype, const void *ref, tdt_dtype_t ref_dtype,
                               double rel, size_t n) {
    double worst = 0.0;
    int nan_seen = 0;
#pragma omp parallel for num_threads(host_threads(n)) schedule(static) reduction(max : worst) reduction(| : nan_seen)
    for (long long i = 0; i < (long long)n; ++i) {
        double x = bench_load(grad, (size_t)i, dtype), y = bench_load(ref, (size_t)i, ref_dtype);
        double d = fabs(x - y) / (rel * fabs(y) + 1e-6);
        if (d != d) nan_seen = 1;
        else if (d > worst) worst = d;
    }
    return nan_seen ? NAN : worst;
}

/* Compares costs and gradients with a tolerance for the dtype; prints the verdict. */
static int check(const bench_problem_t *p, const void *costs, const void *grad, const void *ref_costs,
                 tdt_dtype_t ref_dtype, const void *ref_grad, char *verdict, size_t len) {
    double rel = p->dtype == TDT_DTYPE_FLOAT64 ? 1e-9 : p->dtype == TDT_DTYPE_FLOAT32 ? 1e-4 : 1.6e-2;
    double cost_tol = p->dtype == TDT_DTYPE_FLOAT64 ? 1e-10 : 2e-5, worst_cost = 0.0, worst_grad = 0.0;
    int acc64 = p->dtype == TDT_DTYPE_FLOAT64, ref64 = ref_dtype == TDT_DTYPE_FLOAT64;
    for (int64_t b = 0; b < p->B; ++b) {
        double x = acc64 ? ((const double *)costs)[b] : ((const float *)costs)[b];
        double y = ref64 ? ((const double *)ref_costs)[b] : ((const float *)ref_costs)[b];
        double d = x == y ? 0.0 : fabs(x - y) / fabs(y);
        if (!(d <= worst_cost)) worst_cost = d; /* NaN-safe */
    }
    if (grad) worst_grad = worst_grad_error(grad, p->dtype, ref_grad, ref_dtype, rel, bench_joint_elems(p));
    int ok = worst_cost <= cost_tol && worst_grad <= 1.0;
    snprintf(verdict, len, "%s (cost rel %.1e, grad err/tol %.2f)", ok ? "ok" : "FAILED", worst_cost, worst_grad);
    return ok;
}

static tdt_options_t bench_options(const bench_args_t *a, const bench_problem_t *p, tdt_location_t loc) {
    tdt_options_t o;
    memset(&o, 0, sizeof o);
    o.location = loc;
    o.blank = (int)(p->V - 1);
    o.durations = p->durations;
    o.num_durations = (int)p->D;
    o.num_threads = a->threads;
    o.gpu_schedule = a->schedule;
    return o;
}

/* The CPU backend's result on p in dtype, into costs (B doubles of room) and grad (or NULL). */
static void cpu_result(const bench_args_t *a, const bench_problem_t *p, void *costs, void *grad) {
    tdt_problem_t v = bench_view(p, p->joint, p->labels, p->frame_lengths, p->label_lengths);
    tdt_options_t o = bench_options(a, p, TDT_LOCATION_CPU);
    tdt_gradients_t g = bench_grads(p, grad);
    size_t ws_bytes;
    BENCH_CHECK(tdt_get_workspace_size(&v, &o, &ws_bytes));
    void *ws = malloc(ws_bytes);
    BENCH_CHECK(compute_tdt_loss(&v, &o, costs, grad ? &g : NULL, ws, ws_bytes));
    free(ws);
}

/* Float64 copy of p (the reference problem for CPU results). */
static bench_problem_t to_float64(const bench_problem_t *p) {
    bench_problem_t q = *p;
    size_t n = bench_joint_elems(p);
    q.dtype = TDT_DTYPE_FLOAT64;
    q.joint = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; ++i) ((double *)q.joint)[i] = bench_load(p->joint, i, p->dtype);
    return q;
}

static void print_row(const char *shape, const char *backend, const bench_problem_t *p, const char *pass,
                      double ms, double bytes_moved, double copy_gbs, const char *verdict, int ok) {
    double floor_ms = bytes_moved / (copy_gbs * 1e9) * 1e3;
    if (ok)
        printf("%-9s %-4s %-9s %-8s %10.3f %9.1f %10.3f %8.2f  %s\n", shape, backend, bench_dtype_name(p->dtype),
               pass, ms, bytes_moved / (ms * 1e-3) * 1e-9, floor_ms, ms / floor_ms, verdict);
    else
        printf("%-9s %-4s %-9s %-8s %10s %9s %10.3f %8s  %s\n", shape, backend, bench_dtype_name(p->dtype), pass,
               "-", "-", floor_ms, "-", verdict);
    fflush(stdout);
}

static double host_copy_gbs(void) {
    size_t bytes = (size_t)1 << 30;
    char *src = (char *)malloc(bytes), *dst = (char *)malloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    double best = INFINITY;
    for (int i = 0; i < 5; ++i) {
        double t0 = bench_now();
        memcpy(dst, src, bytes);
        double dt = bench_now() - t0;
        best = dt < best ? dt : best;
    }
    free(src);
    free(dst);
    return 2.0 * (double)bytes / best * 1e-9;
}

static void bench_cpu(const bench_args_t *a, const shape_t *s, bench_problem_t *p, double copy_gbs) {
    bench_problem_t ref = to_float64(p);
    size_t n = bench_joint_elems(p), bytes = n * bench_dtype_size(p->dtype);
    double *ref_costs = (double *)malloc((size_t)p->B * 8), *costs = (double *)malloc((size_t)p->B * 8);
    void *ref_grad = malloc(n * sizeof(double)), *grad = malloc(bytes);
    cpu_result(a, &ref, ref_costs, ref_grad);
    free(ref.joint);

    tdt_problem_t v = bench_view(p, p->joint, p->labels, p->frame_lengths, p->label_lengths);
    tdt_options_t o = bench_options(a, p, TDT_LOCATION_CPU);
    tdt_gradients_t g = bench_grads(p, grad);
    size_t ws_bytes;
    BENCH_CHECK(tdt_get_workspace_size(&v, &o, &ws_bytes));
    void *ws = malloc(ws_bytes);
    for (int pass = 0; pass < 2; ++pass) {
        char verdict[160];
        BENCH_CHECK(compute_tdt_loss(&v, &o, costs, pass ? &g : NULL, ws, ws_bytes));
        int ok = check(p, costs, pass ? grad : NULL, ref_costs, TDT_DTYPE_FLOAT64, ref_grad, verdict, sizeof verdict);
        double t[64];
        int iters = a->iters < 64 ? a->iters : 64;
        for (int i = 0; ok && i < iters; ++i) {
            double t0 = bench_now();
            BENCH_CHECK(compute_tdt_loss(&v, &o, costs, pass ? &g : NULL, ws, ws_bytes));
            t[i] = (bench_now() - t0) * 1e3;
        }
        failures += !ok;
        print_row(s->name, "cpu", p, pass ? "fwd+bwd" : "fwd", ok ? median(t, iters) : 0.0,
                  (pass ? 3.0 : 1.0) * (double)bytes, copy_gbs, verdict, ok);
    }
    free(ws); free(ref_costs); free(costs); free(ref_grad); free(grad);
}

#ifdef TDT_BENCH_CUDA
#define BENCH_CUDA(call)                                                                     \
    do {                                                                                     \
        cudaError_t bench_e_ = (call);                                                       \
        if (bench_e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "tdt_bench: %s: %s\n", #call, cudaGetErrorString(bench_e_));   \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

static double device_copy_gbs(void) {
    size_t bytes = (size_t)2 << 30;
    void *src, *dst;
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaMalloc(&src, bytes));
    BENCH_CUDA(cudaMalloc(&dst, bytes));
    BENCH_CUDA(cudaMemset(src, 1, bytes));
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));
    double t[10];
    for (int i = 0; i < 12; ++i) {
        float ms;
        BENCH_CUDA(cudaEventRecord(e0, NULL));
        BENCH_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, NULL));
        BENCH_CUDA(cudaEventRecord(e1, NULL));
        BENCH_CUDA(cudaEventSynchronize(e1));
        BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 2) t[i - 2] = ms;
    }
    cudaFree(src); cudaFree(dst); cudaEventDestroy(e0); cudaEventDestroy(e1);
    return 2.0 * (double)bytes / (median(t, 10) * 1e-3) * 1e-9;
}

#ifdef TDT_TIMELINE
/* Benchmark builds with -DTDT_TIMELINE (C and CUDA flags): the library's kernel timeline of one
 * more call (src/gpu/gpu_common.cuh), in us from the first kernel's start. */
int tdt_debug_timeline(unsigned long long *out);
static void timeline_row(const tdt_problem_t *v, const tdt_options_t *o, void *costs,
                         const tdt_gradients_t *g, void *ws, size_t ws_bytes) {
    /* gpu_common.cuh's TDT_TL_*: alpha and beta are the one-block staged sweep's own jobs */
    static const char *const names[] = {"norm", "sweep", "grad", "cut", "node", "alpha", "beta"};
    unsigned long long tl[16];
    if (tdt_debug_timeline(tl) < 0) return; /* reset */
    if (compute_tdt_loss(v, o, costs, g, ws, ws_bytes) != TDT_STATUS_SUCCESS) return;
    if (tdt_debug_timeline(tl) < 0) return;
    unsigned long long t0 = ~0ull;
    for (int i = 0; i < 10; i += 2)
        if (tl[i] < t0) t0 = tl[i];
    printf("    timeline us:");
    for (int i = 0; i < 2 * (int)(sizeof names / sizeof *names); i += 2) {
        if (tl[i] == ~0ull) continue;
        printf(" %s %.1f", names[i / 2], (tl[i] - t0) * 1e-3);
        if (tl[i + 1]) printf("-%.1f", (tl[i + 1] - t0) * 1e-3);
    }
    printf("\n");
}
#endif

static void bench_gpu(const bench_args_t *a, const shape_t *s, bench_problem_t *p, double copy_gbs) {
    size_t n = bench_joint_elems(p), bytes = n * bench_dtype_size(p->dtype), ws_bytes;
    size_t lab = (size_t)(p->B * (p->U > 0 ? p->U : 1)) * sizeof(int32_t), len = (size_t)p->B * sizeof(int32_t);
    double *ref_costs = (double *)malloc((size_t)p->B * 8), *costs = (double *)malloc((size_t)p->B * 8);
    void *ref_grad = malloc(bytes), *grad = malloc(bytes);
    cpu_result(a, p, ref_costs, ref_grad);

    void *d_joint, *d_grad, *d_costs, *d_ws;
    int32_t *d_labels, *d_T, *d_U;
    BENCH_CUDA(cudaMalloc(&d_joint, bytes));
    BENCH_CUDA(cudaMalloc(&d_grad, bytes));
    BENCH_CUDA(cudaMalloc(&d_costs, (size_t)p->B * 8));
    BENCH_CUDA(cudaMalloc((void **)&d_labels, lab));
    BENCH_CUDA(cudaMalloc((void **)&d_T, len));
    BENCH_CUDA(cudaMalloc((void **)&d_U, len));
    BENCH_CUDA(cudaMemcpy(d_joint, p->joint, bytes, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_labels, p->labels, lab, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_T, p->frame_lengths, len, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(d_U, p->label_lengths, len, cudaMemcpyHostToDevice));
    tdt_problem_t v = bench_view(p, d_joint, d_labels, d_T, d_U);
    tdt_options_t o = bench_options(a, p, TDT_LOCATION_GPU);
    tdt_gradients_t g = bench_grads(p, d_grad);
    cudaStream_t st = NULL;
    if (a->own_stream) BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    o.stream = st;
    BENCH_CHECK(tdt_get_workspace_size(&v, &o, &ws_bytes));
    BENCH_CUDA(cudaMalloc(&d_ws, ws_bytes));
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));
    size_t cost_bytes = (size_t)p->B * (p->dtype == TDT_DTYPE_FLOAT64 ? 8 : 4);
    const int variants = a->num_vary > 0 ? a->num_vary : 1;
    for (int run = 0; run < 2 * a->rounds * variants; ++run) {
        const int pass = run / (a->rounds * variants), var = run % variants;
        char verdict[160], label[96];
        snprintf(label, sizeof label, "%s", s->name);
        if (a->num_vary > 0) {
            snprintf(label, sizeof label, "%s %s=%s", s->name, a->vary_name, a->vary_values[var]);
            if (!strcmp(a->vary_name, "schedule")) {
                for (int k = 0; k < (int)(sizeof schedule_names / sizeof *schedule_names); ++k)
                    if (!strcmp(a->vary_values[var], schedule_names[k])) o.gpu_schedule = (tdt_gpu_schedule_t)k;
            } else if (!strcmp(a->vary_name, "state")) { /* the gradient rows hold it: f+b only */
                o.state_in_grads = pass && atoi(a->vary_values[var]) != 0;
            } else {
                setenv(a->vary_name, a->vary_values[var], 1);
            }
        }
        BENCH_CUDA(cudaMemset(d_grad, 0xff, bytes)); /* poison: every element must be written */
        BENCH_CHECK(compute_tdt_loss(&v, &o, d_costs, pass ? &g : NULL, d_ws, ws_bytes));
        BENCH_CUDA(cudaStreamSynchronize(st));
        BENCH_CUDA(cudaMemcpy(costs, d_costs, cost_bytes, cudaMemcpyDeviceToHost));
        if (pass) BENCH_CUDA(cudaMemcpy(grad, d_grad, bytes, cudaMemcpyDeviceToHost));
        int ok = check(p, costs, pass ? grad : NULL, ref_costs, p->dtype, ref_grad, verdict, sizeof verdict);
        int iters = a->iters < 1000 ? a->iters : 1000;
        double t[1000];
        for (int i = 0; ok && i < iters + 3; ++i) {
            float ms;
            BENCH_CUDA(cudaEventRecord(e0, st));
            BENCH_CHECK(compute_tdt_loss(&v, &o, d_costs, pass ? &g : NULL, d_ws, ws_bytes));
            BENCH_CUDA(cudaEventRecord(e1, st));
            BENCH_CUDA(cudaEventSynchronize(e1));
            BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            if (i >= 3) t[i - 3] = ms;
        }
        failures += !ok;
        print_row(label, "gpu", p, pass ? "fwd+bwd" : "fwd", ok ? median(t, iters) : 0.0,
                  (pass ? 3.0 : 1.0) * (double)bytes, copy_gbs, verdict, ok);
#ifdef TDT_TIMELINE
        if (ok) timeline_row(&v, &o, d_costs, pass ? &g : NULL, d_ws, ws_bytes);
#endif
    }
    cudaFree(d_joint); cudaFree(d_grad); cudaFree(d_costs); cudaFree(d_ws);
    cudaFree(d_labels); cudaFree(d_T); cudaFree(d_U);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    if (st) cudaStreamDestroy(st);
    free(ref_costs); free(costs); free(ref_grad); free(grad);
}
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: tdt_bench [--shapes LIST | --shape B,T,U,V [--ragged]] [--backend cpu|gpu|all]\n"
            "                 [--dtypes LIST] [--durations LIST] [--iters N] [--threads N] [--stream]\n"
            "                 [--schedule auto|serial|overlap|split|fused|trail]\n"
            "                 [--vary NAME=V1,V2,... [--rounds N]]\n"
            "  --shapes LIST   named shapes (B,T,U,V): base 8,100,20,1025, parakeet 4,200,40,8193,\n"
            "                  large 16,400,100,1025, long 1,1500,400,1025, ragged 32,150,60,257 with\n"
            "                  ragged lengths, huge 8,375,100,8193 (bf16 only) (default: all; on the\n"
            "                  CPU large and huge are skipped unless named)\n"
            "  --shape B,T,U,V any shape; --ragged draws T_b in [T/2, T] and U_b in [U/2, U]\n"
            "  --backend B     cpu | gpu | all (default all: every backend present)\n"
            "  --dtypes LIST   f32, f64, f16, bf16 (default f32,bf16)\n"
            "  --durations L   comma-separated TDT durations (default 0,1,2,3,4)\n"
            "  --iters N       timed repetitions after warm-up, 1 to 1000 (CPU: at most 64 are\n"
            "                  timed); the median is printed (default 20)\n"
            "  --threads N     CPU: tdt_options_t.num_threads (default 0: OpenMP's default)\n"
            "  --stream        GPU: run on a stream of its own (cudaStreamNonBlocking) instead of the\n"
            "                  legacy default stream, the one PyTorch's default stream is\n"
            "  --schedule S    GPU: tdt_options_t.gpu_schedule (default auto; the same costs in\n"
            "                  another kernel order, and gradients bit for bit but for fused's, which\n"
            "                  agree to rounding)\n"
            "  --vary N=LIST   GPU: run each value in turn, each checked, then timed: N schedule (the\n"
            "                  names above), state (0 or 1: tdt_options_t.state_in_grads, in the\n"
            "                  fwd+bwd rows), or an environment variable a TDT_SWEEP_TUNING build of\n"
            "                  the library reads per call (up to 8 values); --rounds N times over\n"
            "                  (default 1), interleaved, so the values see the same machine\n"
            "  --help          this text\n"
            "Exit status 0 when every result passes its check, 1 when one fails, 2 on a usage or\n"
            "library error.\n");
}

enum {
    OPT_SHAPES = 256, OPT_SHAPE, OPT_RAGGED, OPT_BACKEND, OPT_DTYPES, OPT_DURATIONS, OPT_ITERS,
    OPT_THREADS, OPT_STREAM, OPT_SCHEDULE, OPT_VARY, OPT_ROUNDS
};

static const struct option bench_long_options[] = {
    {"shapes", required_argument, NULL, OPT_SHAPES},       {"shape", required_argument, NULL, OPT_SHAPE},
    {"ragged", no_argument, NULL, OPT_RAGGED},             {"backend", required_argument, NULL, OPT_BACKEND},
    {"dtypes", required_argument, NULL, OPT_DTYPES},       {"durations", required_argument, NULL, OPT_DURATIONS},
    {"iters", required_argument, NULL, OPT_ITERS},         {"threads", required_argument, NULL, OPT_THREADS},
    {"stream", no_argument, NULL, OPT_STREAM},             {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"vary", required_argument, NULL, OPT_VARY},           {"rounds", required_argument, NULL, OPT_ROUNDS},
    {"help", no_argument, NULL, 'h'},                      {NULL, 0, NULL, 0},
};

/* Splits a comma-separated list into at most max tokens of fewer than len characters each;
 * returns the count, or -1 (an empty token, too many, or too long). */
static int split_list(const char *v, char (*out)[32], int max, size_t len) {
    int n = 0;
    const char *s = v;
    for (;;) {
        const char *end = strchr(s, ',');
        size_t k = end ? (size_t)(end - s) : strlen(s);
        if (k == 0 || k >= len || n == max) return -1;
        memcpy(out[n], s, k);
        out[n++][k] = '\0';
        if (!end) return n;
        s = end + 1;
    }
}

/* 1: parsed; 0: refused (one line on stderr already); -1: --help. */
static int parse_args(int argc, char **argv, bench_args_t *a, int *named_any) {
    static const char *const P = "tdt_bench";
    char toks[NUM_SHAPES > 8 ? NUM_SHAPES : 8][32];
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", bench_long_options, NULL)) != -1) {
        const char *v = optarg;
        int ok = 1, n;
        switch (c) {
        case 'h': return -1;
        case OPT_RAGGED: a->custom.ragged = 1; break;
        case OPT_STREAM: a->own_stream = 1; break;
        case OPT_SHAPES:
            n = split_list(v, toks, NUM_SHAPES, sizeof toks[0]);
            if (n < 0) {
                fprintf(stderr, "%s: --shapes: '%s' is not a list of shape names\n", P, v);
                return 0;
            }
            for (int k = 0; k < n; ++k) {
                int found = 0;
                for (int s = 0; s < NUM_SHAPES; ++s)
                    if (!strcmp(toks[k], named_shapes[s].name)) { a->shape_on[s] = 2; found = 1; }
                if (!found) {
                    fprintf(stderr, "%s: --shapes: unknown shape '%s' in '%s'\n", P, toks[k], v);
                    return 0;
                }
            }
            *named_any = 1;
            break;
        case OPT_SHAPE: {
            static const char *const what[4] = {"B", "T", "U", "V"};
            static const long long lo[4] = {1, 1, 0, 2};
            long long x[4];
            if (split_list(v, toks, 4, sizeof toks[0]) != 4) {
                fprintf(stderr, "%s: --shape: '%s' is not B,T,U,V\n", P, v);
                return 0;
            }
            for (int k = 0; k < 4; ++k) {
                char flag[16];
                snprintf(flag, sizeof flag, "--shape %s", what[k]);
                if (!bench_arg_int(P, flag, toks[k], lo[k], INT32_MAX, &x[k])) return 0;
            }
            a->custom.name = "custom";
            a->custom.B = x[0]; a->custom.T = x[1]; a->custom.U = x[2]; a->custom.V = x[3];
            a->have_custom = 1;
            break;
        }
        case OPT_SCHEDULE: {
            int found = -1;
            for (int k = 0; k < (int)(sizeof schedule_names / sizeof *schedule_names); ++k)
                if (!strcmp(v, schedule_names[k])) found = k;
            if (found < 0) {
                fprintf(stderr, "%s: --schedule: '%s' is not auto, serial, overlap, split, fused or trail\n", P, v);
                return 0;
            }
            a->schedule = (tdt_gpu_schedule_t)found;
            break;
        }
        case OPT_BACKEND: ok = bench_arg_backend(P, v, &a->cpu, &a->gpu); break;
        case OPT_DTYPES:
            n = split_list(v, toks, 4, sizeof toks[0]);
            if (n < 0) {
                fprintf(stderr, "%s: --dtypes: '%s' is not a list of at most 4 dtypes\n", P, v);
                return 0;
            }
            a->num_dtypes = n;
            for (int k = 0; k < n; ++k)
                if (!bench_parse_dtype(toks[k], &a->dtypes[k])) {
                    fprintf(stderr, "%s: --dtypes: '%s' in '%s' is not f32, f64, f16 or bf16\n", P, toks[k], v);
                    return 0;
                }
            break;
        case OPT_DURATIONS: ok = bench_arg_durations(P, v, a->durations, &a->D); break;
        case OPT_ITERS: ok = bench_arg_int32(P, "--iters", v, 1, 1000, &a->iters); break;
        case OPT_THREADS: ok = bench_arg_int32(P, "--threads", v, 0, 4096, &a->threads); break;
        case OPT_ROUNDS: ok = bench_arg_int32(P, "--rounds", v, 1, 1000, &a->rounds); break;
        case OPT_VARY: {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof a->vary_name) {
                fprintf(stderr, "%s: --vary: '%s': --vary wants NAME=V1,V2,...\n", P, v);
                return 0;
            }
            memcpy(a->vary_name, v, (size_t)(eq - v));
            a->vary_name[eq - v] = '\0';
            a->num_vary = split_list(eq + 1, a->vary_values, 8, sizeof a->vary_values[0]);
            if (a->num_vary < 1) {
                fprintf(stderr, "%s: --vary: '%s': wants 1 to 8 comma-separated values of at most %d characters\n",
                        P, v, (int)sizeof a->vary_values[0] - 1);
                return 0;
            }
            break;
        }
        default: bench_arg_refusal(P, c, bench_long_options, argv[optind - 1]); return 0;
        }
        if (!ok) return 0;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", P, argv[optind]);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    bench_args_t a;
    memset(&a, 0, sizeof a);
    int named_any = 0;
    a.cpu = a.gpu = 1;
    a.iters = 20;
    a.rounds = 1;
    a.dtypes[0] = TDT_DTYPE_FLOAT32; a.dtypes[1] = TDT_DTYPE_BFLOAT16; a.num_dtypes = 2;
    a.D = 5;
    for (int k = 0; k < 5; ++k) a.durations[k] = k;
    int parsed = parse_args(argc, argv, &a, &named_any);
    if (parsed < 0) { usage(stdout); return 0; }
    if (!parsed) { usage(stderr); return 2; }
    if (!named_any && !a.have_custom)
        for (int s = 0; s < NUM_SHAPES; ++s) a.shape_on[s] = 1;

    int gpus = 0;
    if (tdt_gpu_device_count(&gpus) != TDT_STATUS_SUCCESS) gpus = 0;
    printf("warp-tdt %s, CUDA backend %s, %d GPU(s)\n", tdt_version_string(),
           tdt_backend_built(TDT_LOCATION_GPU) ? "built" : "not built", gpus);
    double cpu_gbs = 0.0, gpu_gbs = 0.0;
    if (a.cpu) {
        cpu_gbs = host_copy_gbs();
        printf("cpu: memcpy %.1f GB/s (read + write), threads %d\n", cpu_gbs, a.threads);
    }
#ifdef TDT_BENCH_CUDA
    if (a.gpu && gpus > 0) {
        struct cudaDeviceProp prop;
        int dev = 0, rt = 0, drv = 0;
        BENCH_CUDA(cudaGetDevice(&dev));
        BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
        cudaRuntimeGetVersion(&rt);
        cudaDriverGetVersion(&drv);
        gpu_gbs = device_copy_gbs();
        printf("gpu: %s, %d SMs, %.0f GB, CUDA runtime %d, driver %d; device copy %.0f GB/s (read + write)\n",
               prop.name, prop.multiProcessorCount, (double)prop.totalGlobalMem / 1e9, rt, drv, gpu_gbs);
        FILE *smi = popen("nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,driver_version "
                          "--format=csv,noheader 2>/dev/null", "r");
        char line[256];
        if (smi && fgets(line, sizeof line, smi)) printf("gpu clocks (sm, max sm, mem, driver): %s", line);
        if (smi) pclose(smi);
        printf("gpu schedule %s, %s stream\n", schedule_names[a.schedule],
               a.own_stream ? "a non-blocking" : "the legacy default");
    }
#endif
    printf("durations ");
    for (int k = 0; k < a.D; ++k) printf("%s%d", k ? "," : "", a.durations[k]);
    printf(", blank V-1, logits as slices of one joint (B,T,U+1,V+D) tensor, gradient into one joint buffer\n");
    printf("%-9s %-4s %-9s %-8s %10s %9s %10s %8s  %s\n", "shape", "dev", "dtype", "pass", "ms", "GB/s",
           "floor ms", "x floor", "check");

    for (int s = -1; s < NUM_SHAPES; ++s) {
        const shape_t *sh = s < 0 ? (a.have_custom ? &a.custom : NULL) : (a.shape_on[s] ? &named_shapes[s] : NULL);
        if (!sh) continue;
        for (int d = 0; d < a.num_dtypes; ++d) {
            int huge_ok = strcmp(sh->name, "huge") != 0 || a.dtypes[d] == TDT_DTYPE_BFLOAT16;
            int run_cpu = a.cpu && huge_ok && (!sh->gpu_only || (s >= 0 && a.shape_on[s] == 2));
            int run_gpu = a.gpu && gpus > 0 && huge_ok;
            if (!run_cpu && !run_gpu) continue;
            bench_problem_t p;
            memset(&p, 0, sizeof p);
            p.B = sh->B; p.T = sh->T; p.U = sh->U; p.V = sh->V; p.D = a.D; p.dtype = a.dtypes[d];
            memcpy(p.durations, a.durations, sizeof p.durations);
            if (!bench_make_fast(&p, 1234, sh->ragged)) { fprintf(stderr, "tdt_bench: out of memory\n"); return 2; }
            if (run_cpu) bench_cpu(&a, sh, &p, cpu_gbs);
#ifdef TDT_BENCH_CUDA
            if (run_gpu) bench_gpu(&a, sh, &p, gpu_gbs);
#endif
            bench_free(&p);
        }
    }
    if (failures) printf("%d result(s) FAILED their check: no time printed for them\n", failures);
    return failures ? 1 : 0;
}
