/*
 * tdt_demo - the main job: one TDT loss, forward and backward, on a Parakeet-like problem.
 *
 * With no arguments it builds an embedded default problem (B 4, T 150, U 30, V 8193 with blank
 * V - 1, durations 0..4: Parakeet-TDT's vocabulary and durations, scaled to a few seconds on two
 * CPU cores), computes costs and gradients on the CPU and, when the library has CUDA and a GPU
 * is present, on the GPU; cross-checks the backends and a central finite-difference probe in
 * float64; and prints the losses, the agreement, time and effective memory bandwidth.
 * Exit status 0 when every check passes, 1 when one fails, 2 on a usage or library error.
 */
#include "common.h"

#ifdef TDT_DEMO_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct demo_args {
    long long B, T, U, V;
    int D, durations[TDT_MAX_DURATIONS];
    tdt_dtype_t dtype;
    int threads, iters, ragged, rnnt;
    int want_cpu, want_gpu; /* --backend: cpu, gpu or all (both) */
    double sigma, fastemit;
    uint64_t seed;
} demo_args_t;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tdt_demo [options]\n"
            "Computes the TDT loss and its gradients on a random Parakeet-like problem, on the CPU\n"
            "and (when built with CUDA and a GPU is present) the GPU, and cross-checks them.\n\n"
            "  --batch B         samples (default 4)\n"
            "  --frames T        frames per sample (default 150)\n"
            "  --labels U        labels per sample (default 30)\n"
            "  --vocab V         tokens including blank; blank is V-1 (default 8193)\n"
            "  --durations LIST  comma-separated TDT durations (default 0,1,2,3,4)\n"
            "  --rnnt            plain RNN-T instead of TDT (no duration logits)\n"
            "  --dtype T         f32 | f64 | f16 | bf16 (default f32)\n"
            "  --threads N       CPU threads (default 0: OpenMP's default)\n"
            "  --backend B       cpu | gpu | all (default all: every backend available)\n"
            "  --ragged          random lengths T_b in [T/2, T], U_b in [U/2, U]\n"
            "  --sigma S         logit undernormalisation (default 0)\n"
            "  --fastemit L      FastEmit lambda (default 0)\n"
            "  --iters N         timed repetitions, best kept (default 3)\n"
            "  --seed N          random seed (default 1)\n"
            "  --help            this text\n");
}

enum {
    OPT_BATCH = 256, OPT_FRAMES, OPT_LABELS, OPT_VOCAB, OPT_DURATIONS, OPT_RNNT, OPT_DTYPE,
    OPT_THREADS, OPT_BACKEND, OPT_RAGGED, OPT_SIGMA, OPT_FASTEMIT, OPT_ITERS, OPT_SEED
};

static const struct option demo_options[] = {
    {"batch", required_argument, NULL, OPT_BATCH},     {"frames", required_argument, NULL, OPT_FRAMES},
    {"labels", required_argument, NULL, OPT_LABELS},   {"vocab", required_argument, NULL, OPT_VOCAB},
    {"durations", required_argument, NULL, OPT_DURATIONS}, {"rnnt", no_argument, NULL, OPT_RNNT},
    {"dtype", required_argument, NULL, OPT_DTYPE},     {"threads", required_argument, NULL, OPT_THREADS},
    {"backend", required_argument, NULL, OPT_BACKEND}, {"ragged", no_argument, NULL, OPT_RAGGED},
    {"sigma", required_argument, NULL, OPT_SIGMA},     {"fastemit", required_argument, NULL, OPT_FASTEMIT},
    {"iters", required_argument, NULL, OPT_ITERS},     {"seed", required_argument, NULL, OPT_SEED},
    {"help", no_argument, NULL, 'h'},                  {NULL, 0, NULL, 0},
};

/* 1: parsed; 0: refused (one line on stderr already); -1: --help. */
static int parse_args(int argc, char **argv, demo_args_t *a) {
    static const char *const P = "tdt_demo";
    a->B = 4; a->T = 150; a->U = 30; a->V = 8193;
    a->D = 5;
    for (int k = 0; k < 5; ++k) a->durations[k] = k;
    a->dtype = TDT_DTYPE_FLOAT32;
    a->threads = 0; a->iters = 3; a->ragged = 0; a->rnnt = 0;
    a->want_cpu = a->want_gpu = 1;
    a->sigma = 0.0; a->fastemit = 0.0;
    a->seed = 1;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, ":h", demo_options, NULL)) != -1) {
        const char *v = optarg;
        int ok = 1;
        switch (c) {
        case 'h': return -1;
        case OPT_RNNT: a->rnnt = 1; break;
        case OPT_RAGGED: a->ragged = 1; break;
        /* sizes up to int32: the labels and lengths are int32 */
        case OPT_BATCH: ok = bench_arg_int(P, "--batch", v, 1, INT32_MAX, &a->B); break;
        case OPT_FRAMES: ok = bench_arg_int(P, "--frames", v, 1, INT32_MAX, &a->T); break;
        case OPT_LABELS: ok = bench_arg_int(P, "--labels", v, 0, INT32_MAX, &a->U); break;
        case OPT_VOCAB: ok = bench_arg_int(P, "--vocab", v, 2, INT32_MAX, &a->V); break;
        case OPT_THREADS: ok = bench_arg_int32(P, "--threads", v, 0, 4096, &a->threads); break;
        case OPT_ITERS: ok = bench_arg_int32(P, "--iters", v, 1, 1000000, &a->iters); break;
        case OPT_SEED: ok = bench_arg_u64(P, "--seed", v, &a->seed); break;
        case OPT_SIGMA: ok = bench_arg_double(P, "--sigma", v, 0.0, HUGE_VAL, &a->sigma); break;
        case OPT_FASTEMIT: ok = bench_arg_double(P, "--fastemit", v, 0.0, HUGE_VAL, &a->fastemit); break;
        case OPT_BACKEND:
            ok = bench_arg_backend(P, v, &a->want_cpu, &a->want_gpu);
            break;
        case OPT_DTYPE:
            if (!bench_parse_dtype(v, &a->dtype)) {
                fprintf(stderr, "%s: --dtype: '%s' is not f32, f64, f16 or bf16\n", P, v);
                ok = 0;
            }
            break;
        case OPT_DURATIONS: ok = bench_arg_durations(P, v, a->durations, &a->D); break;
        default: bench_arg_refusal(P, c, demo_options, argv[optind - 1]); ok = 0; break;
        }
        if (!ok) return 0;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", P, argv[optind]);
        return 0;
    }
    return 1;
}

static tdt_options_t make_options(const demo_args_t *a, const bench_problem_t *p) {
    tdt_options_t o;
    memset(&o, 0, sizeof o);
    o.blank = (int)(p->V - 1);
    o.durations = p->rnnt ? NULL : p->durations;
    o.num_durations = p->rnnt ? 0 : (int)p->D;
    o.sigma = a->sigma;
    o.fastemit_lambda = a->fastemit;
    o.num_threads = a->threads;
    return o;
}

static double cost_at(const bench_problem_t *p, const void *costs, int64_t b) {
    return p->dtype == TDT_DTYPE_FLOAT64 ? ((const double *)costs)[b] : ((const float *)costs)[b];
}

/* Central finite differences in float64 on a small problem with the run's options: the
 * gradient the library writes against (L(x + h) - L(x - h)) / 2h, token and duration elements. */
static int finite_difference_probe(const demo_args_t *a) {
    bench_problem_t p;
    memset(&p, 0, sizeof p);
    p.B = 1; p.T = a->T < 12 ? a->T : 12; p.U = a->U < 4 ? a->U : 4; p.V = a->V < 16 ? a->V : 16;
    p.D = a->D; p.rnnt = a->rnnt; p.dtype = TDT_DTYPE_FLOAT64;
    memcpy(p.durations, a->durations, sizeof p.durations);
    if (!bench_make(&p, a->seed + 7, 0)) { fprintf(stderr, "tdt_demo: out of memory\n"); exit(2); }
    double *x64 = (double *)p.joint;
    tdt_problem_t v = bench_view(&p, p.joint, p.labels, p.frame_lengths, p.label_lengths);
    tdt_options_t o = make_options(a, &p);
    o.fastemit_lambda = 0.0; /* FastEmit's gradient is not the cost's derivative by design */
    size_t ws_bytes, n = bench_joint_elems(&p);
    BENCH_CHECK(tdt_get_workspace_size(&v, &o, &ws_bytes));
    void *ws = malloc(ws_bytes);
    double *grad = (double *)malloc(n * sizeof(double)), cost, cp, cm;
    tdt_gradients_t g = bench_grads(&p, grad);
    BENCH_CHECK(compute_tdt_loss(&v, &o, &cost, &g, ws, ws_bytes));
    double worst = 0.0;
    int checked = 0;
    uint64_t st = a->seed + 99;
    int64_t W = p.V + (p.rnnt ? 0 : p.D);
    for (int i = 0; i < 12; ++i) {
        /* inside the lattice, half of the probes on blank/label/duration columns */
        int64_t t = (int64_t)(bench_rand(&st) % (uint64_t)p.T), u = (int64_t)(bench_rand(&st) % (uint64_t)(p.U + 1));
        int64_t col = (int64_t)(bench_rand(&st) % (uint64_t)W);
        if (i % 2 == 0) col = i % 4 == 0 ? p.V - 1 : (u < p.U ? p.labels[u] : col);
        size_t e = (size_t)((t * (p.U + 1) + u) * W + col);
        double x = x64[e], h = 1e-5;
        x64[e] = x + h;
        BENCH_CHECK(compute_tdt_loss(&v, &o, &cp, NULL, ws, ws_bytes));
        x64[e] = x - h;
        BENCH_CHECK(compute_tdt_loss(&v, &o, &cm, NULL, ws, ws_bytes));
        x64[e] = x;
        /* error relative to the gradient's scale: central differences at h = 1e-5 on a cost of
           order 10 carry about 1e-9 of rounding and truncation noise */
        double fd = (cp - cm) / (2 * h), err = fabs(fd - grad[e]) / (fabs(fd) + 1e-3);
        worst = err > worst ? err : worst;
        ++checked;
    }
    printf("finite differences: %d elements (float64, B1 T%lld U%lld V%lld), worst relative error %.2e %s\n",
           checked, (long long)p.T, (long long)p.U, (long long)p.V, worst, worst < 1e-5 ? "ok" : "FAILED");
    free(ws); free(grad); bench_free(&p);
    return worst < 1e-5;
}

typedef struct demo_result {
    void *costs;   /* host copy, (B) */
    void *grad;    /* host copy of the joint gradient */
    double seconds; /* best of iters, forward + backward */
} demo_result_t;

static void run_cpu(const demo_args_t *a, const bench_problem_t *p, demo_result_t *r) {
    tdt_problem_t v = bench_view(p, p->joint, p->labels, p->frame_lengths, p->label_lengths);
    tdt_options_t o = make_options(a, p);
    size_t ws_bytes, bytes = bench_joint_elems(p) * bench_dtype_size(p->dtype);
    BENCH_CHECK(tdt_get_workspace_size(&v, &o, &ws_bytes));
    void *ws = malloc(ws_bytes);
    r->costs = malloc((size_t)p->B * 8);
    r->grad = malloc(bytes);
    if (!ws || !r->costs || !r->grad) { fprintf(stderr, "tdt_demo: out of memory\n"); exit(2); }
    tdt_gradients_t g = bench_grads(p, r->grad);
    r->seconds = INFINITY;
    for (int i = 0; i < a->iters; ++i) {
        double t0 = bench_now();
        BENCH_CHECK(compute_tdt_loss(&v, &o, r->costs, &g, ws, ws_bytes));
        double dt = bench_now() - t0;
        r->seconds = dt < r->seconds ? dt : r->seconds;
    }
    free(ws);
}

#ifdef TDT_DEMO_CUDA
#define DEMO_CUDA(call)                                                                      \
    do {                                                                                     \
        cudaError_t demo_e_ = (call);                                                        \
        if (demo_e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "tdt_demo: %s: %s\n", #call, cudaGetErrorString(demo_e_));     \
            exit(2);                                                                         \
        }                                                                                    \
    } while (0)

static void run_gpu(const demo_args_t *a, const bench_problem_t *p, demo_result_t *r) {
    size_t bytes = bench_joint_elems(p) * bench_dtype_size(p->dtype), ws_bytes;
    size_t lab = (size_t)(p->B * (p->U > 0 ? p->U : 1)) * sizeof(int32_t), len = (size_t)p->B * sizeof(int32_t);
    void *d_joint, *d_grad, *d_costs, *d_ws;
    int32_t *d_labels, *d_T, *d_U;
    DEMO_CUDA(cudaMalloc(&d_joint, bytes));
    DEMO_CUDA(cudaMalloc(&d_grad, bytes));
    DEMO_CUDA(cudaMalloc(&d_costs, (size_t)p->B * 8));
    DEMO_CUDA(cudaMalloc((void **)&d_labels, lab));
    DEMO_CUDA(cudaMalloc((void **)&d_T, len));
    DEMO_CUDA(cudaMalloc((void **)&d_U, len));
    DEMO_CUDA(cudaMemcpy(d_joint, p->joint, bytes, cudaMemcpyHostToDevice));
    DEMO_CUDA(cudaMemcpy(d_labels, p->labels, lab, cudaMemcpyHostToDevice));
    DEMO_CUDA(cudaMemcpy(d_T, p->frame_lengths, len, cudaMemcpyHostToDevice));
    DEMO_CUDA(cudaMemcpy(d_U, p->label_lengths, len, cudaMemcpyHostToDevice));
    tdt_problem_t v = bench_view(p, d_joint, d_labels, d_T, d_U);
    tdt_options_t o = make_options(a, p);
    o.location = TDT_LOCATION_GPU;
    BENCH_CHECK(tdt_get_workspace_size(&v, &o, &ws_bytes));
    DEMO_CUDA(cudaMalloc(&d_ws, ws_bytes));
    tdt_gradients_t g = bench_grads(p, d_grad);
    cudaEvent_t e0, e1;
    DEMO_CUDA(cudaEventCreate(&e0));
    DEMO_CUDA(cudaEventCreate(&e1));
    BENCH_CHECK(compute_tdt_loss(&v, &o, d_costs, &g, d_ws, ws_bytes)); /* warm-up */
    r->seconds = INFINITY;
    for (int i = 0; i < a->iters + 2; ++i) {
        float ms;
        DEMO_CUDA(cudaEventRecord(e0, NULL));
        BENCH_CHECK(compute_tdt_loss(&v, &o, d_costs, &g, d_ws, ws_bytes));
        DEMO_CUDA(cudaEventRecord(e1, NULL));
        DEMO_CUDA(cudaEventSynchronize(e1));
        DEMO_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        r->seconds = ms * 1e-3 < r->seconds ? ms * 1e-3 : r->seconds;
    }
    r->costs = malloc((size_t)p->B * 8);
    r->grad = malloc(bytes);
    DEMO_CUDA(cudaMemcpy(r->costs, d_costs, (size_t)p->B * 8 > 0 ? (size_t)p->B * bench_dtype_size(p->dtype == TDT_DTYPE_FLOAT64 ? TDT_DTYPE_FLOAT64 : TDT_DTYPE_FLOAT32) : 0, cudaMemcpyDeviceToHost));
    DEMO_CUDA(cudaMemcpy(r->grad, d_grad, bytes, cudaMemcpyDeviceToHost));
    cudaFree(d_joint); cudaFree(d_grad); cudaFree(d_costs); cudaFree(d_ws);
    cudaFree(d_labels); cudaFree(d_T); cudaFree(d_U);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
}
#endif

static void report(const char *name, const bench_problem_t *p, const demo_result_t *r, double copy_gbs) {
    double bytes = (double)(bench_joint_elems(p) * bench_dtype_size(p->dtype)), sum = 0.0;
    for (int64_t b = 0; b < p->B; ++b) sum += cost_at(p, r->costs, b);
    printf("%-4s  loss: ", name);
    for (int64_t b = 0; b < p->B && b < 4; ++b) printf("%.6f ", cost_at(p, r->costs, b));
    printf("%s(mean %.6f)\n", p->B > 4 ? "... " : "", sum / (double)p->B);
    printf("%-4s  forward+backward %.3f ms, effective bandwidth %.1f GB/s (3 x %.1f MB of logits)",
           name, r->seconds * 1e3, 3.0 * bytes / r->seconds * 1e-9, bytes * 1e-6);
    if (copy_gbs > 0) printf(", %.2fx the memcpy floor", r->seconds / (3.0 * bytes / (copy_gbs * 1e9)));
    printf("\n");
}

/* Bandwidth of a large host memcpy (bytes read + written per second), for the floor. */
static double host_copy_gbs(void *dst, const void *src, size_t bytes) {
    double best = INFINITY;
    for (int i = 0; i < 3; ++i) {
        double t0 = bench_now();
        memcpy(dst, src, bytes);
        double dt = bench_now() - t0;
        best = dt < best ? dt : best;
    }
    return 2.0 * (double)bytes / best * 1e-9;
}

int main(int argc, char **argv) {
    demo_args_t a;
    int parsed = parse_args(argc, argv, &a);
    if (parsed < 0) { usage(stdout); return 0; }
    if (!parsed) { usage(stderr); return 2; }
    bench_problem_t p;
    memset(&p, 0, sizeof p);
    p.B = a.B; p.T = a.T; p.U = a.U; p.V = a.V; p.D = a.rnnt ? 0 : a.D; p.rnnt = a.rnnt;
    p.dtype = a.dtype;
    memcpy(p.durations, a.durations, sizeof p.durations);
    int gpus = 0;
    if (tdt_gpu_device_count(&gpus) != TDT_STATUS_SUCCESS) gpus = 0;
    int want_cpu = a.want_cpu, want_gpu = a.want_gpu;
    printf("warp-tdt %s (header %d.%d.%d), CUDA backend %s, %d GPU(s)\n", tdt_version_string(),
           TDT_VERSION_MAJOR, TDT_VERSION_MINOR, TDT_VERSION_PATCH,
           tdt_backend_built(TDT_LOCATION_GPU) ? "built" : "not built", gpus);
    printf("problem: %s, B %lld, T %lld, U %lld, V %lld (blank %lld)", a.rnnt ? "RNN-T" : "TDT",
           (long long)p.B, (long long)p.T, (long long)p.U, (long long)p.V, (long long)(p.V - 1));
    if (!a.rnnt) {
        printf(", durations ");
        for (int k = 0; k < a.D; ++k) printf("%s%d", k ? "," : "", a.durations[k]);
    }
    printf(", %s%s\n", bench_dtype_name(p.dtype), a.ragged ? ", ragged lengths" : "");
    if (!bench_make(&p, a.seed, a.ragged)) { fprintf(stderr, "tdt_demo: out of memory\n"); return 2; }

    int ok = 1;
    demo_result_t cpu = {0}, gpu = {0};
    size_t bytes = bench_joint_elems(&p) * bench_dtype_size(p.dtype);
    if (want_cpu) {
        run_cpu(&a, &p, &cpu);
        double gbs = host_copy_gbs(cpu.grad, p.joint, bytes);
        printf("cpu   memcpy %.1f GB/s (read + write); floor %.3f ms\n", gbs, 3.0 * (double)bytes / (gbs * 1e9) * 1e3);
        /* rerun once so the timing is not of the copy's cache state; the result is the same */
        run_cpu(&a, &p, &cpu);
        report("cpu", &p, &cpu, gbs);
    }
    if (want_gpu) {
#ifdef TDT_DEMO_CUDA
        if (gpus > 0) {
            run_gpu(&a, &p, &gpu);
            report("gpu", &p, &gpu, 0.0);
        } else
#endif
            printf("gpu   skipped: %s\n", tdt_backend_built(TDT_LOCATION_GPU) ? "no GPU present" : "library built without CUDA");
    }
    if (cpu.costs && gpu.costs) {
        double dc = 0.0, dg = 0.0, gmax = 0.0;
        for (int64_t b = 0; b < p.B; ++b) {
            double x = cost_at(&p, cpu.costs, b), y = cost_at(&p, gpu.costs, b);
            double d = fabs(x - y) / fabs(x);
            dc = d > dc ? d : dc;
        }
        for (size_t i = 0; i < bench_joint_elems(&p); ++i) {
            double x = bench_load(cpu.grad, i, p.dtype), y = bench_load(gpu.grad, i, p.dtype);
            dg = fabs(x - y) > dg ? fabs(x - y) : dg;
            gmax = fabs(x) > gmax ? fabs(x) : gmax;
        }
        double tol = p.dtype == TDT_DTYPE_FLOAT64 ? 1e-9 : p.dtype == TDT_DTYPE_FLOAT32 ? 1e-4 : 2e-2;
        int agree = dc < tol && dg <= tol * (gmax > 1 ? gmax : 1);
        printf("cpu vs gpu: costs max relative difference %.2e, gradients max abs difference %.2e %s\n",
               dc, dg, agree ? "ok" : "FAILED");
        ok &= agree;
    }
    ok &= finite_difference_probe(&a);
    printf("%s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
    free(cpu.costs); free(cpu.grad); free(gpu.costs); free(gpu.grad);
    bench_free(&p);
    return ok ? 0 : 1;
}
