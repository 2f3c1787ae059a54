/*
 * joint_bench.c - the fused joint + loss (tdt_joint_forward + tdt_joint_backward) against the
 * unfused path on the same inputs, in one run, on the CPU.
 *
 * The unfused path is what a caller without the fused calls runs: h = act(enc + pred) for every
 * node into a (nodes, H) buffer, the logits z = h W^T + bias into a (nodes, V + D) buffer, the
 * loss by tdt_forward() / tdt_backward() on z's two slices into a logits-gradient buffer dz, then
 * the backward products d h = dz W, d W = dz^T h, d bias = sum dz, and d enc, d pred from
 * d h act'. Its products run on the BLAS the build found (OpenBLAS: sgemm, dgemm, and sbgemm for
 * bfloat16, whose products come out in float32 and are rounded to bfloat16 as a framework's
 * bfloat16 matmul would), on as many threads as the library (openblas_set_num_threads, which
 * this program may set: it is the program, not the library); without a BLAS, on plain loops.
 *
 * Each configuration first checks the fused path against the unfused one (costs and the four
 * gradients: 1e-9 relative in float64, a dtype tolerance otherwise) and refuses to time a
 * wrong answer. Then it times forward + backward (the median of --iters runs after a warm-up)
 * and prints: milliseconds, the peak extra memory (fused: the workspace; unfused: the workspace,
 * the hidden values, the logits and their gradient, and d h), and GFLOP/s counted as the matrix
 * work each path does: 4 passes of 2 x nodes x H x (V + D) for the fused path (forward, the
 * backward's recompute, d h, d W), 3 for the unfused one.
 *
 *   joint_bench [--shape B,T,U,H,V] [--durations 0,1,2,3,4 | --rnnt] [--dtypes f32,bf16]
 *               [--threads 1,2] [--iters N] [--activation relu|tanh|sigmoid|identity]
 *               [--dropout P]
 * Defaults: base-joint (B 8, T 100, U 20, H 256, V 1025, D 5, float32, relu), 1 and 2 threads.
 */
#include <getopt.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tdt.h"

#ifdef JB_HAVE_CBLAS
#include <cblas.h>
#endif

typedef struct cfg {
    int64_t B, T, U, H, V;
    int durations[TDT_MAX_DURATIONS];
    int D;
    tdt_activation_t act;
    double dropout;
    int iters;
} cfg_t;

/* ---- small helpers --------------------------------------------------------------------------- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "joint_bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static size_t esize(tdt_dtype_t d) { return d == TDT_DTYPE_FLOAT64 ? 8 : d == TDT_DTYPE_FLOAT32 ? 4 : 2; }

static const char *dname(tdt_dtype_t d) {
    return d == TDT_DTYPE_FLOAT64 ? "float64" : d == TDT_DTYPE_FLOAT32 ? "float32" : d == TDT_DTYPE_BFLOAT16 ? "bfloat16" : "float16";
}

static float bf16_to_f(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint16_t f_to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static double ld(const void *p, size_t i, tdt_dtype_t d) {
    if (d == TDT_DTYPE_FLOAT64) return ((const double *)p)[i];
    if (d == TDT_DTYPE_FLOAT32) return ((const float *)p)[i];
    return bf16_to_f(((const uint16_t *)p)[i]);
}

static void st(void *p, size_t i, tdt_dtype_t d, double x) {
    if (d == TDT_DTYPE_FLOAT64) ((double *)p)[i] = x;
    else if (d == TDT_DTYPE_FLOAT32) ((float *)p)[i] = (float)x;
    else ((uint16_t *)p)[i] = f_to_bf16((float)x);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double normal(void) { /* Box-Muller on a xorshift */
    double u[2];
    for (int i = 0; i < 2; ++i) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        u[i] = ((rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static int parse_list(const char *s, long *out, int max) {
    int n = 0;
    while (*s) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s || n == max || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n;
}

/* ---- the inputs ------------------------------------------------------------------------------- */

typedef struct inputs {
    tdt_dtype_t dt;
    void *enc, *pred, *W, *bias; /* (B, T, H), (B, U + 1, H), (O, H), (O) in dt */
    int32_t *labels, *Ts, *Us;
} inputs_t;

static void make_inputs(const cfg_t *c, tdt_dtype_t dt, inputs_t *in) {
    const int64_t O = c->V + c->D, R = c->U + 1;
    const size_t e = esize(dt);
    rng_state = 0x9e3779b97f4a7c15ull;
    in->dt = dt;
    in->enc = xmalloc(c->B * c->T * c->H * e);
    in->pred = xmalloc(c->B * R * c->H * e);
    in->W = xmalloc(O * c->H * e);
    in->bias = xmalloc(O * e);
    for (int64_t i = 0; i < c->B * c->T * c->H; ++i) st(in->enc, i, dt, normal());
    for (int64_t i = 0; i < c->B * R * c->H; ++i) st(in->pred, i, dt, normal());
    for (int64_t i = 0; i < O * c->H; ++i) st(in->W, i, dt, normal() * 2.0 / sqrt((double)c->H));
    for (int64_t i = 0; i < O; ++i) st(in->bias, i, dt, 0.1 * normal());
    in->labels = xmalloc(c->B * (c->U > 0 ? c->U : 1) * sizeof(int32_t));
    in->Ts = xmalloc(c->B * sizeof(int32_t));
    in->Us = xmalloc(c->B * sizeof(int32_t));
    for (int64_t i = 0; i < c->B * c->U; ++i) {
        normal(); /* a fresh draw a label */
        in->labels[i] = (int32_t)(rng_state % (uint64_t)(c->V - 1));
    }
    for (int64_t b = 0; b < c->B; ++b) { /* full lengths, blank = V - 1 (Parakeet) */
        in->Ts[b] = (int32_t)c->T;
        in->Us[b] = (int32_t)c->U;
    }
}

static void free_inputs(inputs_t *in) {
    free(in->enc);
    free(in->pred);
    free(in->W);
    free(in->bias);
    free(in->labels);
    free(in->Ts);
    free(in->Us);
}

static tdt_options_t options(const cfg_t *c, int threads) {
    tdt_options_t o;
    memset(&o, 0, sizeof o);
    o.num_threads = threads;
    o.blank = (int)c->V - 1;
    o.durations = c->D ? c->durations : NULL;
    o.num_durations = c->D;
    return o;
}

/* ---- results ---------------------------------------------------------------------------------- */

typedef struct grads {
    void *costs, *enc, *pred, *W, *bias;
} grads_t;

static void alloc_grads(const cfg_t *c, tdt_dtype_t dt, grads_t *g) {
    const int64_t O = c->V + c->D;
    const size_t e = esize(dt);
    g->costs = xmalloc(c->B * 8);
    g->enc = xmalloc(c->B * c->T * c->H * e);
    g->pred = xmalloc(c->B * (c->U + 1) * c->H * e);
    g->W = xmalloc(O * c->H * e);
    g->bias = xmalloc(O * e);
}

static void free_grads(grads_t *g) {
    free(g->costs);
    free(g->enc);
    free(g->pred);
    free(g->W);
    free(g->bias);
}

/* ---- the fused path ------------------------------------------------------------------------------ */

typedef struct fused {
    tdt_joint_problem_t p;
    tdt_joint_gradients_t g;
    tdt_options_t o;
    void *ws;
    size_t bytes;
} fused_t;

static void fused_setup(const cfg_t *c, const inputs_t *in, grads_t *out, int threads, fused_t *f) {
    const int64_t R = c->U + 1, H = c->H;
    memset(f, 0, sizeof *f);
    f->p.batch = c->B;
    f->p.max_frames = c->T;
    f->p.max_labels = c->U;
    f->p.vocab_size = c->V;
    f->p.hidden = H;
    f->p.num_outputs = c->V + c->D;
    f->p.dtype = in->dt;
    f->p.enc = in->enc;
    f->p.enc_strides[0] = c->T * H;
    f->p.enc_strides[1] = H;
    f->p.pred = in->pred;
    f->p.pred_strides[0] = R * H;
    f->p.pred_strides[1] = H;
    f->p.weight = in->W;
    f->p.weight_stride = H;
    f->p.bias = in->bias;
    f->p.activation = c->act;
    f->p.dropout = c->dropout;
    f->p.dropout_seed = 1234;
    f->p.labels = in->labels;
    f->p.frame_lengths = in->Ts;
    f->p.label_lengths = in->Us;
    f->g.enc_grad = out->enc;
    memcpy(f->g.enc_strides, f->p.enc_strides, sizeof f->g.enc_strides);
    f->g.pred_grad = out->pred;
    memcpy(f->g.pred_strides, f->p.pred_strides, sizeof f->g.pred_strides);
    f->g.weight_grad = out->W;
    f->g.weight_stride = H;
    f->g.bias_grad = out->bias;
    f->o = options(c, threads);
    if (tdt_joint_get_workspace_size(&f->p, &f->o, &f->bytes) != TDT_STATUS_SUCCESS) {
        fprintf(stderr, "joint_bench: tdt_joint_get_workspace_size: %s\n", tdt_last_error());
        exit(1);
    }
    f->ws = xmalloc(f->bytes);
}

static void fused_run(fused_t *f, void *costs) {
    tdt_status_t s = tdt_joint_forward(&f->p, &f->o, costs, f->ws, f->bytes);
    if (s == TDT_STATUS_SUCCESS) s = tdt_joint_backward(&f->p, &f->o, NULL, &f->g, f->ws, f->bytes);
    if (s != TDT_STATUS_SUCCESS) {
        fprintf(stderr, "joint_bench: fused call FAILED: %s (%s)\n", tdt_status_string(s), tdt_last_error());
        exit(1);
    }
}

/* ---- the unfused path ----------------------------------------------------------------------------- */

typedef struct unfused {
    const cfg_t *c;
    const inputs_t *in;
    int threads;
    int64_t N, O;
    void *h, *z, *dz, *dh; /* (N, H), (N, O), (N, O), (N, H) in dt */
    float *tmp, *af, *bf;  /* bfloat16: float32 operands and products, a block of rows at a time */
    float *wf, *cf;        /* bfloat16: W widened, d W's float32 sums */
    float *bf16_bias;      /* bfloat16: the bias widened */
    int64_t tmp_rows;
    tdt_problem_t p;
    tdt_gradients_t g;
    tdt_options_t o;
    void *ws;
    size_t bytes;
} unfused_t;

static double act_f(double x, tdt_activation_t a) {
    switch (a) {
    case TDT_ACTIVATION_RELU: return x > 0 ? x : 0;
    case TDT_ACTIVATION_TANH: return tanh(x);
    case TDT_ACTIVATION_SIGMOID: return 1 / (1 + exp(-x));
    default: return x;
    }
}

static double dact_f(double x, tdt_activation_t a) {
    switch (a) {
    case TDT_ACTIVATION_RELU: return x > 0 ? 1 : 0;
    case TDT_ACTIVATION_TANH: return 1 - tanh(x) * tanh(x);
    case TDT_ACTIVATION_SIGMOID: {
        const double s = 1 / (1 + exp(-x));
        return s * (1 - s);
    }
    default: return 1;
    }
}

static void unfused_setup(const cfg_t *c, const inputs_t *in, int threads, unfused_t *u) {
    memset(u, 0, sizeof *u);
    u->c = c;
    u->in = in;
    u->threads = threads;
    u->O = c->V + c->D;
    u->N = c->B * c->T * (c->U + 1);
    const size_t e = esize(in->dt);
    u->h = xmalloc(u->N * c->H * e);
    u->z = xmalloc(u->N * u->O * e);
    u->dz = xmalloc(u->N * u->O * e);
    u->dh = xmalloc(u->N * c->H * e);
    u->tmp_rows = 1024;
    if (in->dt == TDT_DTYPE_BFLOAT16) {
        const size_t row = (size_t)(u->O > c->H ? u->O : c->H) * sizeof(float);
        u->tmp = xmalloc(u->tmp_rows * row);
        u->af = xmalloc(u->tmp_rows * row);
        u->bf = xmalloc(u->tmp_rows * row);
        u->wf = xmalloc(u->O * c->H * sizeof(float));
        u->cf = xmalloc(u->O * c->H * sizeof(float));
        u->bf16_bias = xmalloc(u->O * sizeof(float));
        for (int64_t o = 0; o < u->O; ++o) u->bf16_bias[o] = (float)ld(in->bias, o, in->dt);
    }
    u->p.batch = c->B;
    u->p.max_frames = c->T;
    u->p.max_labels = c->U;
    u->p.vocab_size = c->V;
    u->p.dtype = in->dt;
    const int64_t s[3] = {c->T * (c->U + 1) * u->O, (c->U + 1) * u->O, u->O};
    u->p.token_logits = u->z;
    memcpy(u->p.token_strides, s, sizeof s);
    u->p.duration_logits = c->D ? (char *)u->z + c->V * e : NULL;
    memcpy(u->p.duration_strides, s, sizeof s);
    u->p.labels = in->labels;
    u->p.frame_lengths = in->Ts;
    u->p.label_lengths = in->Us;
    u->g.token_grads = u->dz;
    memcpy(u->g.token_strides, s, sizeof s);
    u->g.duration_grads = c->D ? (char *)u->dz + c->V * e : NULL;
    memcpy(u->g.duration_strides, s, sizeof s);
    u->o = options(c, threads);
    if (tdt_get_workspace_size(&u->p, &u->o, &u->bytes) != TDT_STATUS_SUCCESS) exit(1);
    u->ws = xmalloc(u->bytes);
}

static void unfused_free(unfused_t *u) {
    free(u->h);
    free(u->z);
    free(u->dz);
    free(u->dh);
    free(u->tmp);
    free(u->af);
    free(u->bf);
    free(u->wf);
    free(u->cf);
    free(u->bf16_bias);
    free(u->ws);
}

/* C (M x N, row-major, ldc) = A (M x K) op B, A row-major; trans_b: B is (N x K) (so A B^T), else
 * (K x N); trans_a: A is given as (K x M). In the run's dtype, float32 accumulation for 16-bit. */
static void mm(const unfused_t *u, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
               const void *A, int64_t lda, const void *Bm, int64_t ldb, void *C, int64_t ldc,
               const void *bias) {
    const tdt_dtype_t dt = u->in->dt;
    if (bias && dt != TDT_DTYPE_BFLOAT16) { /* C's rows start as the bias: the product is added */
        const size_t e = esize(dt);
#pragma omp parallel for num_threads(u->threads)
        for (int64_t i = 0; i < M; ++i) memcpy((char *)C + (size_t)(i * ldc) * e, bias, (size_t)N * e);
    }
    const float beta_f = bias ? 1.0f : 0.0f;
    const double beta_d = bias ? 1.0 : 0.0;
#ifdef JB_HAVE_CBLAS
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    if (dt == TDT_DTYPE_FLOAT32) {
        cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, Bm, (int)ldb, beta_f, C, (int)ldc);
        return;
    }
    if (dt == TDT_DTYPE_FLOAT64) {
        cblas_dgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0, A, (int)lda, Bm, (int)ldb, beta_d, C, (int)ldc);
        return;
    }
    if (dt == TDT_DTYPE_BFLOAT16) { /* bfloat16 operands widened to float32 a block of rows at a
                                       time, float32 products, rounded once to bfloat16 (what
                                       OpenBLAS's sbgemm does; Debian's build has none). The
                                       conversions run on this thread alone: OpenMP regions
                                       between OpenBLAS calls made the two thread pools spin
                                       against each other (3-10x slower at 2 threads) */
        const int64_t rows = u->tmp_rows;
        if (!trans_a) { /* C = A op(B): B (W) widened whole, A and C by blocks of rows */
            const int64_t bn = trans_b ? N * ldb : K * ldb;
            for (int64_t i = 0; i < bn; ++i) u->wf[i] = bf16_to_f(((const uint16_t *)Bm)[i]);
            for (int64_t i0 = 0; i0 < M; i0 += rows) {
                const int64_t m = M - i0 < rows ? M - i0 : rows;
                for (int64_t i = 0; i < m * lda; ++i) u->af[i] = bf16_to_f(((const uint16_t *)A)[i0 * lda + i]);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, (int)m, (int)N, (int)K, 1.0f, u->af, (int)lda, u->wf,
                            (int)ldb, 0.0f, u->tmp, (int)N);
                for (int64_t i = 0; i < m * N; ++i)
                    ((uint16_t *)C)[(i0 + i / N) * ldc + i % N] =
                        f_to_bf16(bias ? u->tmp[i] + u->bf16_bias[i % N] : u->tmp[i]);
            }
            return;
        }
        /* C = A^T B, A (K x M), B (K x N): float32 sums over blocks of K, rounded at the end */
        for (int64_t k0 = 0; k0 < K; k0 += rows) {
            const int64_t m = K - k0 < rows ? K - k0 : rows;
            for (int64_t i = 0; i < m * lda; ++i) u->af[i] = bf16_to_f(((const uint16_t *)A)[k0 * lda + i]);
            for (int64_t i = 0; i < m * ldb; ++i) u->bf[i] = bf16_to_f(((const uint16_t *)Bm)[k0 * ldb + i]);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)M, (int)N, (int)m, 1.0f, u->af, (int)lda, u->bf,
                        (int)ldb, k0 ? 1.0f : 0.0f, u->cf, (int)N);
        }
        for (int64_t i = 0; i < M * N; ++i) ((uint16_t *)C)[(i / N) * ldc + i % N] = f_to_bf16(u->cf[i]);
        return;
    }
#endif
    /* plain loops */
#pragma omp parallel for num_threads(u->threads)
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double s = bias ? ld(bias, j, dt) : 0;
            for (int64_t k = 0; k < K; ++k)
                s += ld(A, trans_a ? k * lda + i : i * lda + k, dt) * ld(Bm, trans_b ? j * ldb + k : k * ldb + j, dt);
            st(C, i * ldc + j, dt, s);
        }
}

/* rows of n elements of dt at p + off (elements) to and from double, the dtype chosen once a row */
static void rd(const void *p, size_t off, tdt_dtype_t dt, double *dst, int64_t n) {
    if (dt == TDT_DTYPE_FLOAT64) {
        memcpy(dst, (const double *)p + off, (size_t)n * 8);
    } else if (dt == TDT_DTYPE_FLOAT32) {
        const float *s = (const float *)p + off;
        for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
    } else {
        const uint16_t *s = (const uint16_t *)p + off;
        for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f(s[i]);
    }
}

static void wr(void *p, size_t off, tdt_dtype_t dt, const double *src, int64_t n) {
    if (dt == TDT_DTYPE_FLOAT64) {
        memcpy((double *)p + off, src, (size_t)n * 8);
    } else if (dt == TDT_DTYPE_FLOAT32) {
        float *d = (float *)p + off;
        for (int64_t i = 0; i < n; ++i) d[i] = (float)src[i];
    } else {
        uint16_t *d = (uint16_t *)p + off;
        for (int64_t i = 0; i < n; ++i) d[i] = f_to_bf16((float)src[i]);
    }
}

/* act (deriv 0) or act' (deriv 1) of a row in place */
static void act_row(double *v, int64_t n, tdt_activation_t a, int deriv) {
    if (a == TDT_ACTIVATION_RELU) {
        for (int64_t i = 0; i < n; ++i) v[i] = v[i] > 0 ? (deriv ? 1 : v[i]) : 0;
    } else if (a == TDT_ACTIVATION_IDENTITY) {
        if (deriv)
            for (int64_t i = 0; i < n; ++i) v[i] = 1;
    } else {
        for (int64_t i = 0; i < n; ++i) v[i] = deriv ? dact_f(v[i], a) : act_f(v[i], a);
    }
}

static void unfused_run(unfused_t *u, grads_t *out) {
    const cfg_t *c = u->c;
    const tdt_dtype_t dt = u->in->dt;
    const int64_t H = c->H, R = c->U + 1, O = u->O, T = c->T;
    /* h = act(enc + pred) */
#pragma omp parallel num_threads(u->threads)
    {
        double *x = xmalloc(2 * H * sizeof(double)), *y = x + H;
#pragma omp for
        for (int64_t n = 0; n < u->N; ++n) {
            const int64_t b = n / (T * R), t = n / R % T, r = n % R;
            rd(u->in->enc, (b * T + t) * H, dt, x, H);
            rd(u->in->pred, (b * R + r) * H, dt, y, H);
            for (int64_t k = 0; k < H; ++k) x[k] += y[k];
            act_row(x, H, c->act, 0);
            wr(u->h, n * H, dt, x, H);
        }
        free(x);
    }
    /* z = h W^T + bias (the bias first, the product added: addmm) */
    mm(u, 0, 1, u->N, O, H, u->h, H, u->in->W, H, u->z, O, u->in->bias);
    tdt_status_t s = tdt_forward(&u->p, &u->o, out->costs, u->ws, u->bytes);
    if (s == TDT_STATUS_SUCCESS) s = tdt_backward(&u->p, &u->o, NULL, &u->g, u->ws, u->bytes);
    if (s != TDT_STATUS_SUCCESS) {
        fprintf(stderr, "joint_bench: unfused loss FAILED: %s\n", tdt_last_error());
        exit(1);
    }
    /* d h = dz W, d W = dz^T h, d bias = sum dz */
    mm(u, 0, 0, u->N, H, O, u->dz, O, u->in->W, H, u->dh, H, NULL);
    mm(u, 1, 0, O, H, u->N, u->dz, O, u->h, H, out->W, H, NULL);
#pragma omp parallel num_threads(u->threads)
    {
        const int nt = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t o0 = O * me / nt, o1 = O * (me + 1) / nt;
        double *acc = xmalloc((size_t)(o1 - o0 + 1) * sizeof(double)), *row = xmalloc((size_t)(o1 - o0 + 1) * sizeof(double));
        memset(acc, 0, (size_t)(o1 - o0) * sizeof(double));
        for (int64_t n = 0; n < u->N; ++n) {
            rd(u->dz, n * O + o0, dt, row, o1 - o0);
            for (int64_t o = 0; o < o1 - o0; ++o) acc[o] += row[o];
        }
        wr(out->bias, o0, dt, acc, o1 - o0);
        free(acc);
        free(row);
    }
    /* g = d h act'(x); d enc = sum over u of g, d pred = sum over t */
#pragma omp parallel num_threads(u->threads)
    {
        double *x = xmalloc(4 * H * sizeof(double)), *y = x + H, *gsum = y + H, *d = gsum + H;
#pragma omp for
        for (int64_t bt = 0; bt < c->B * T; ++bt) {
            const int64_t b = bt / T;
            memset(gsum, 0, (size_t)H * sizeof(double));
            for (int64_t r = 0; r < R; ++r) {
                rd(u->in->enc, bt * H, dt, x, H);
                rd(u->in->pred, (b * R + r) * H, dt, y, H);
                for (int64_t k = 0; k < H; ++k) x[k] += y[k];
                act_row(x, H, c->act, 1);
                rd(u->dh, (bt * R + r) * H, dt, d, H);
                for (int64_t k = 0; k < H; ++k) gsum[k] += d[k] * x[k];
            }
            wr(out->enc, bt * H, dt, gsum, H);
        }
#pragma omp for
        for (int64_t br = 0; br < c->B * R; ++br) {
            const int64_t b = br / R, r = br % R;
            memset(gsum, 0, (size_t)H * sizeof(double));
            rd(u->in->pred, br * H, dt, y, H);
            for (int64_t t = 0; t < T; ++t) {
                rd(u->in->enc, (b * T + t) * H, dt, x, H);
                for (int64_t k = 0; k < H; ++k) x[k] += y[k];
                act_row(x, H, c->act, 1);
                rd(u->dh, ((b * T + t) * R + r) * H, dt, d, H);
                for (int64_t k = 0; k < H; ++k) gsum[k] += d[k] * x[k];
            }
            wr(out->pred, br * H, dt, gsum, H);
        }
        free(x);
    }
}

/* ---- checking and timing ---------------------------------------------------------------------------- */

/* max |a - b| / (1 + max |b|) over a tensor of n elements of dt (costs: acc type) */
static double rel_err(const void *a, const void *b, size_t n, tdt_dtype_t dt) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; ++i) {
        const double x = ld(a, i, dt), y = ld(b, i, dt);
        e = fabs(x - y) > e || x != x ? (x != x ? INFINITY : fabs(x - y)) : e;
        m = fabs(y) > m ? fabs(y) : m;
    }
    return e / (1 + m);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static int run_config(const cfg_t *c, tdt_dtype_t dt, int threads) {
    inputs_t in;
    grads_t gf, gu;
    fused_t f;
    unfused_t u;
    make_inputs(c, dt, &in);
    alloc_grads(c, dt, &gf);
    alloc_grads(c, dt, &gu);
    fused_setup(c, &in, &gf, threads, &f);
    unfused_setup(c, &in, threads, &u);
#ifdef JB_HAVE_CBLAS
    openblas_set_num_threads(threads);
#endif
    const int64_t O = c->V + c->D, N = u.N;
    /* check first (the unfused path has no dropout: only with --dropout 0) */
    fused_run(&f, gf.costs);
    unfused_run(&u, &gu);
    const tdt_dtype_t acc = dt == TDT_DTYPE_FLOAT64 ? TDT_DTYPE_FLOAT64 : TDT_DTYPE_FLOAT32;
    const double tol = dt == TDT_DTYPE_FLOAT64 ? 1e-9 : dt == TDT_DTYPE_FLOAT32 ? 2e-3 : 5e-2;
    const double err[5] = {rel_err(gf.costs, gu.costs, c->B, acc), rel_err(gf.enc, gu.enc, c->B * c->T * c->H, dt),
                           rel_err(gf.pred, gu.pred, c->B * (c->U + 1) * c->H, dt), rel_err(gf.W, gu.W, O * c->H, dt),
                           rel_err(gf.bias, gu.bias, O, dt)};
    double worst = 0;
    for (int i = 0; i < 5; ++i) worst = err[i] > worst || err[i] != err[i] ? err[i] : worst;
    if (c->dropout == 0.0 && !(worst <= tol)) {
        printf("%-9s %2d  FAILED: fused vs unfused max relative error %.3g > %.3g (costs %.3g, d enc %.3g, "
               "d pred %.3g, d W %.3g, d bias %.3g)\n",
               dname(dt), threads, worst, tol, err[0], err[1], err[2], err[3], err[4]);
        return 1;
    }
    double *tf = xmalloc(c->iters * sizeof(double)), *tu = xmalloc(c->iters * sizeof(double));
    for (int i = 0; i < c->iters; ++i) {
        double t0 = now_ms();
        fused_run(&f, gf.costs);
        tf[i] = now_ms() - t0;
        t0 = now_ms();
        unfused_run(&u, &gu);
        tu[i] = now_ms() - t0;
    }
    const double mf = median(tf, c->iters), mu = median(tu, c->iters);
    const double pass = 2.0 * (double)N * (double)c->H * (double)O;
    const size_t e = esize(dt);
    const double mem_f = (double)f.bytes / 1e6;
    const double mem_u = ((double)u.bytes + (double)N * (double)(2 * c->H + 2 * O) * (double)e +
                          (u.tmp ? 3.0 * (double)u.tmp_rows * (double)(O > c->H ? O : c->H) * 4.0 +
                                       2.0 * (double)O * (double)c->H * 4.0 : 0.0)) / 1e6;
    printf("%-9s %2d  fused %9.1f ms %8.1f MB %7.1f GFLOP/s | unfused %9.1f ms %8.1f MB %7.1f GFLOP/s | "
           "time %.2fx memory %.2f %% | max rel err %.1e ok\n",
           dname(dt), threads, mf, mem_f, 4 * pass / mf * 1e-6, mu, mem_u, 3 * pass / mu * 1e-6, mf / mu,
           100.0 * mem_f / mem_u, worst);
    fflush(stdout);
    free(tf);
    free(tu);
    free(f.ws);
    unfused_free(&u);
    free_grads(&gf);
    free_grads(&gu);
    free_inputs(&in);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: joint_bench [--shape B,T,U,H,V] [--durations 0,1,2,3,4 | --rnnt] [--dtypes f32,bf16,f64]\n"
               "                   [--threads 1,2] [--iters N] [--activation relu|tanh|sigmoid|identity]\n"
               "                   [--dropout P]\n");
}

int main(int argc, char **argv) {
    cfg_t c = {8, 100, 20, 256, 1025, {0, 1, 2, 3, 4}, 5, TDT_ACTIVATION_RELU, 0.0, 5};
    long threads[16] = {1, 2}, list[TDT_MAX_DURATIONS];
    int nthreads = 2, ndt = 1;
    tdt_dtype_t dts[4] = {TDT_DTYPE_FLOAT32};
    static const struct option longopts[] = {
        {"shape", required_argument, 0, 's'},      {"durations", required_argument, 0, 'd'},
        {"rnnt", no_argument, 0, 'r'},             {"dtypes", required_argument, 0, 't'},
        {"threads", required_argument, 0, 'j'},    {"iters", required_argument, 0, 'i'},
        {"activation", required_argument, 0, 'a'}, {"dropout", required_argument, 0, 'p'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end;
        switch (ch) {
        case 's': {
            long v[5];
            if (parse_list(optarg, v, 5) != 5 || v[0] < 1 || v[1] < 1 || v[2] < 0 || v[3] < 1 || v[4] < 2) {
                fprintf(stderr, "joint_bench: --shape wants B,T,U,H,V (B, T, H >= 1, U >= 0, V >= 2), got '%s'\n", optarg);
                return 2;
            }
            c.B = v[0], c.T = v[1], c.U = v[2], c.H = v[3], c.V = v[4];
            break;
        }
        case 'd': {
            const int n = parse_list(optarg, list, TDT_MAX_DURATIONS);
            if (n < 1) {
                fprintf(stderr, "joint_bench: --durations wants a list like 0,1,2,3,4, got '%s'\n", optarg);
                return 2;
            }
            c.D = n;
            for (int k = 0; k < n; ++k) c.durations[k] = (int)list[k];
            break;
        }
        case 'r': c.D = 0; break;
        case 't': {
            ndt = 0;
            char *s = optarg;
            while (*s && ndt < 4) {
                const size_t len = strcspn(s, ",");
                if (!strncmp(s, "f32", len) && len == 3) dts[ndt++] = TDT_DTYPE_FLOAT32;
                else if (!strncmp(s, "f64", len) && len == 3) dts[ndt++] = TDT_DTYPE_FLOAT64;
                else if (!strncmp(s, "bf16", len) && len == 4) dts[ndt++] = TDT_DTYPE_BFLOAT16;
                else {
                    fprintf(stderr, "joint_bench: --dtypes takes f32, f64, bf16, got '%s'\n", optarg);
                    return 2;
                }
                s += len + (s[len] == ',');
            }
            break;
        }
        case 'j':
            nthreads = parse_list(optarg, threads, 16);
            if (nthreads < 1) {
                fprintf(stderr, "joint_bench: --threads wants a list like 1,2, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'i':
            c.iters = (int)strtol(optarg, &end, 10);
            if (*end || c.iters < 1) {
                fprintf(stderr, "joint_bench: --iters wants a positive integer, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'a':
            if (!strcmp(optarg, "relu")) c.act = TDT_ACTIVATION_RELU;
            else if (!strcmp(optarg, "tanh")) c.act = TDT_ACTIVATION_TANH;
            else if (!strcmp(optarg, "sigmoid")) c.act = TDT_ACTIVATION_SIGMOID;
            else if (!strcmp(optarg, "identity")) c.act = TDT_ACTIVATION_IDENTITY;
            else {
                fprintf(stderr, "joint_bench: --activation takes relu, tanh, sigmoid, identity, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'p':
            c.dropout = strtod(optarg, &end);
            if (*end || !(c.dropout >= 0 && c.dropout < 1)) {
                fprintf(stderr, "joint_bench: --dropout wants a probability in [0, 1), got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    printf("joint_bench: warp-tdt %s, B %lld T %lld U %lld H %lld V %lld D %d, %lld nodes, one pass %.2f GFLOP, "
           "%d iterations (median), unfused products on %s%s\n",
           tdt_version_string(), (long long)c.B, (long long)c.T, (long long)c.U, (long long)c.H, (long long)c.V, c.D,
           (long long)(c.B * c.T * (c.U + 1)), 2e-9 * c.B * c.T * (c.U + 1) * c.H * (c.V + c.D), c.iters,
#ifdef JB_HAVE_CBLAS
           "OpenBLAS",
#else
           "plain C loops (no BLAS found at build time)",
#endif
           c.dropout > 0 ? "; dropout on: the unfused path has none, results not compared" : "");
    int bad = 0;
    for (int i = 0; i < ndt; ++i)
        for (int j = 0; j < nthreads; ++j) bad |= run_config(&c, dts[i], (int)threads[j]);
    return bad;
}
