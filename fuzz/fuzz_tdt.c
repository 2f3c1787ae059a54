/*
 * fuzz_tdt.c - libFuzzer target over the public C API of warp-tdt (CPU backend).
 *
 * The input is decoded (fuzz/make_corpus.py writes the same format) into one call:
 *
 *   byte  0  flags: bits 0-1 call kind (0 one-shot, 1 forward + backward with grad_costs NULL,
 *            2 forward + backward with random grad_costs, 3 costs only), bit 2 TDT (else RNN-T),
 *            bit 3 log-prob inputs, bit 4 allow -inf logits, bit 5 allow NaN / +inf logits,
 *            bit 6 no token gradient, bit 7 no duration gradient
 *   byte  1  dtype (mod 4)               byte  2  B (mod 5)        byte 3  max_frames (mod 13)
 *   byte  4  max_labels (mod 9)          byte  5  V - 1 (mod 12; >= 240: V = 13 + 4 (b - 240))
 *   byte  6  blank (>= 250: V - 1)
 *   byte  7  D - 1 (mod 6), then D duration bytes (low 4 bits < 8: that duration, made
 *            distinct; else one of 8..1000, 2^31 - 1: durations beyond T)
 *   next     options: bits 0-1 sigma, 2-3 FastEmit lambda, 4-5 clamp, bit 6 NULL for empty
 *            arrays, bit 7 NaN in the gaps of padded inputs
 *   next     num_threads (mod 5)
 *   next     input layout: bits 0-1 (0 separate, 1 joint, 2 broadcast, 3 random strides),
 *            bits 2-4 permutation, bits 5-7 padding
 *   next     gradient layout: bits 0-1 (0 separate, 1 joint, 2 in place, 3 random strides),
 *            bits 2-4 permutation, bits 5-7 padding
 *   next     values: bits 0-1 scale (0, 0.5, 2, 8), bit 2 dense special values
 *   next     workspace misalignment (bytes)
 *   next     fault (>= 160: inject fault (b - 160) % NUM_FAULTS), then its parameter byte
 *   next     per sample: frame length, label length bytes; then labels (B x max_labels)
 *   next     per sample: grad_costs index (table gcs[]); with random input strides, 6 stride
 *            bytes (token s0..s2, duration s0..s2)
 *   then     logit bytes, token then duration, in (b, t, u, v) order: value = int8(b) * scale
 *            / 16, except the top 32 bytes (all of them in dense mode, the top 8 otherwise),
 *            which are special values (k_specials[]: +-1e4, 65504, -inf, NaN, +inf ...)
 *   then     with random gradient strides, 6 stride bytes.
 * The fault numbers are the order of enum fault; make_corpus.py lists them in the same order.
 * Past the end of the input, bytes come from a PRNG seeded by the input, so short inputs still
 * give full-size problems.
 *
 * Checked, abort() with a message on any violation:
 *   - every call returns one of the tdt_status_t values, the one the single injected fault
 *     predicts (the dispatch layer validates in a documented order), with tdt_last_error()
 *     empty after SUCCESS and set otherwise, and nothing written on failure;
 *   - SUCCESS: costs finite or exactly +inf (then all-zero gradients); samples whose read
 *     logits hold NaN / +inf on a complete path have NaN cost; gradients without NaN / inf for
 *     clean samples; exact zeros outside each lattice; nothing written outside the gradient
 *     extent (gaps and guard elements keep their canary bytes); inputs unchanged;
 *   - agreement with fuzz/naive_ref.c (1e-9 relative for float64, a dtype tolerance otherwise);
 *   - forward + backward == one-shot (bitwise); any thread count gives the same bits; each
 *     sample alone gives the bits it gets in the batch (bad samples do not spread); the
 *     in-place gradient equals the out-of-place one bitwise; backward with grad_costs_scalar
 *     equals backward with that one value repeated for every sample, bitwise;
 *   - tdt_pack_indices on the call's labels and lengths (int32, or int64 copies) gives them back
 *     in its packed layout, with tdt_check_data's verdict; a forward that packs them itself
 *     (options.pack) gives the plain forward's costs bitwise, or a data status;
 *   - tdt_forward_ahead on the CPU writes no gradient and the costs of tdt_forward;
 *     tdt_scale_gradients gives each element inside a lattice times its factor, rounded once,
 *     and touches nothing else;
 *   - options.state_in_grads gives the one-shot call's bits in its smaller workspace, or
 *     INVALID_OPTION with nothing written where no token-gradient row can hold the state.
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "halfconv.h"
#include "naive_ref.h"
#include "tdt.h"

/* ---- failure reporting ------------------------------------------------------------------- */

static char g_case[2048];

static void die(int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "\nfuzz_tdt: VIOLATION at fuzz_tdt.c:%d: ", line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  case: %s\n  tdt_last_error: \"%s\"\n", g_case, tdt_last_error());
    abort();
}
#define REQUIRE(cond, ...)                          \
    do {                                            \
        if (!(cond)) die(__LINE__, __VA_ARGS__);    \
    } while (0)

/* ---- input reader ------------------------------------------------------------------------ */

typedef struct rd {
    const uint8_t *p;
    size_t n, i;
    uint64_t s;
} rd_t;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint8_t u8(rd_t *r) {
    if (r->i < r->n) {
        uint8_t b = r->p[r->i++];
        r->s = r->s * 1099511628211ull + b + 1;
        return b;
    }
    return (uint8_t)(splitmix(&r->s) >> 56);
}

/* ---- dtypes, written here (not taken from src/) ------------------------------------------ */

static size_t esize(tdt_dtype_t dt) {
    return dt == TDT_DTYPE_FLOAT64 ? 8 : dt == TDT_DTYPE_FLOAT32 ? 4 : 2;
}

static void put(void *buf, int64_t i, tdt_dtype_t dt, double x) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: ((double *)buf)[i] = x; break;
    case TDT_DTYPE_FLOAT32: ((float *)buf)[i] = (float)x; break;
    case TDT_DTYPE_FLOAT16: ((uint16_t *)buf)[i] = hc_d2h(x); break;
    default: ((uint16_t *)buf)[i] = hc_d2bf(x); break;
    }
}

static double get(const void *buf, int64_t i, tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return ((const double *)buf)[i];
    case TDT_DTYPE_FLOAT32: return ((const float *)buf)[i];
    case TDT_DTYPE_FLOAT16: return hc_h2d(((const uint16_t *)buf)[i]);
    default: return hc_bf2d(((const uint16_t *)buf)[i]);
    }
}

static int known_status(tdt_status_t s) {
    return (s >= TDT_STATUS_SUCCESS && s <= TDT_STATUS_CUDA_ERROR) || s == TDT_STATUS_UNKNOWN_ERROR;
}

/* ---- the decoded case -------------------------------------------------------------------- */

enum { K_ONESHOT = 0, K_TWOPHASE = 1, K_TWOPHASE_GC = 2, K_COSTS = 3, K_FORWARD = 4 };
enum { L_SEPARATE = 0, L_JOINT = 1, L_BCAST = 2, L_RANDOM = 3 };
enum { G_SEPARATE = 0, G_JOINT = 1, G_INPLACE = 2, G_RANDOM = 3 };

enum fault {
    F_NONE = -1,
    F_PROBLEM_NULL, F_OPTIONS_NULL, F_LOC_GPU, F_LOC_BAD, F_THREADS_NEG, F_KIND_BAD,
    F_SIGMA_BAD, F_FASTEMIT_BAD, F_CLAMP_BAD, F_BATCH_NEG, F_FRAMES_NEG, F_LABELS_BAD,
    F_VOCAB_BAD, F_DTYPE_BAD, F_BLANK_BAD, F_NDUR_BAD, F_DUR_NULL, F_DUR_NEG, F_DUR_DUP,
    F_DUR_NOPOS, F_TOK_NULL, F_FLEN_NULL, F_LLEN_NULL, F_LABELS_NULL, F_COSTS_NULL, F_WS_NULL,
    F_TOK_STRIDE_NEG, F_DUR_STRIDE_NEG, F_GRAD_STRIDE_NEG, F_INPLACE_STRIDES, F_WS_SMALL,
    F_FLEN_RANGE, F_LLEN_RANGE, F_LABEL_RANGE, F_LABEL_BLANK, F_STRIDE_HUGE, F_BWD_NO_FWD,
    F_BATCH_HUGE, F_BWD_OTHER_FWD,
    NUM_FAULTS
};

static const char *const fault_names[NUM_FAULTS] = {
    "problem NULL", "options NULL", "location GPU", "location invalid", "threads < 0",
    "input kind invalid", "sigma invalid", "fastemit invalid", "clamp invalid", "batch < 0",
    "max_frames < 0", "max_labels invalid", "vocab_size < 1", "dtype invalid", "blank invalid",
    "num_durations invalid", "durations NULL", "duration < 0", "duration duplicated",
    "no positive duration", "token_logits NULL", "frame_lengths NULL", "label_lengths NULL",
    "labels NULL", "costs NULL", "workspace NULL", "token stride < 0", "duration stride < 0",
    "gradient stride < 0", "in-place with other strides", "workspace too small",
    "frame length out of range", "label length out of range", "label out of range",
    "label == blank", "stride overflows", "backward without forward", "batch overflows",
    "backward after the forward of a smaller batch"};

typedef struct cfg {
    int kind, tdt, log_probs, allow_neginf, allow_nonfinite, want_tok, want_dur;
    tdt_dtype_t dt;
    int64_t B, T, U, V, D;
    int blank;
    int durs[TDT_MAX_DURATIONS + 8];
    double sigma, fastemit, clamp;
    int threads, null_empty, nan_gaps;
    int in_kind, in_perm, in_pad, g_kind, g_perm, g_pad;
    double scale;
    int dense;
    size_t misalign;
    int fault, fparam;
} cfg_t;

/* One strided tensor view: element (b, t, u, w) at base + b s0 + t s1 + u s2 + w. */
typedef struct view {
    int64_t base, s[3], W;
} view_t;

/* A buffer holding one or two views (two for a joint tensor). */
typedef struct buf {
    unsigned char *mem;
    int64_t elems;
} buf_t;

static const double k_specials[32] = {
    1e4, -1e4, 65504.0, -65504.0, 10000.5, -9999.75, 88.0, -88.0,
    -87.5, 100.0, -100.0, 1e-30, -1e-30, 700.0, -745.0, 0.0,
    20.0, -20.0, 1e3, -1e3, 5e3, 65000.0, 3.0, -3.0,
    -INFINITY, -INFINITY, -INFINITY, -INFINITY, NAN, NAN, INFINITY, -INFINITY};

static int avoid(const char *tag);

static double decode_value(uint8_t b, const cfg_t *c, int is_dur) {
    if (b >= 0xE0 && (c->dense || b >= 0xF8)) {
        double x = k_specials[b - 0xE0];
        if (x == -INFINITY && !c->allow_neginf) return -1e4;
        if ((x != x || x == INFINITY) && !c->allow_nonfinite) return 1e4;
        if (x == INFINITY && c->log_probs && avoid("logprob-inf")) return NAN;
        if (x == INFINITY && is_dur && avoid("dur-inf")) return NAN;
        return x;
    }
    int sv = b < 0x80 ? b : (int)b - 256;
    return sv * c->scale / 16.0;
}

static void decode_cfg(rd_t *r, cfg_t *c) {
    static const double sigmas[4] = {0.0, 0.05, 0.5, 2.0};
    static const double lambdas[4] = {0.0, 0.01, 0.5, 3.0};
    static const double clamps[4] = {0.0, 0.1, 1.0, 1e-3};
    static const double scales[4] = {0.0, 0.5, 2.0, 8.0};
    static const int big_durs[8] = {8, 9, 12, 13, 20, 1000, 100000, 2147483647};
    memset(c, 0, sizeof *c);
    uint8_t f = u8(r);
    c->kind = f & 3;
    c->tdt = (f >> 2) & 1;
    c->log_probs = (f >> 3) & 1;
    c->allow_neginf = (f >> 4) & 1;
    c->allow_nonfinite = (f >> 5) & 1;
    c->want_tok = !((f >> 6) & 1);
    c->want_dur = !((f >> 7) & 1);
    c->dt = (tdt_dtype_t)(u8(r) % 4);
    c->B = u8(r) % 5;
    c->T = u8(r) % 13;
    c->U = u8(r) % 9;
    uint8_t vb = u8(r);
    /* rarely a wide vocabulary (13..73), so the SIMD main loops run, not only their tails */
    c->V = vb >= 240 ? 13 + (vb - 240) * 4 : 1 + vb % 12;
    uint8_t bl = u8(r);
    c->blank = bl >= 250 ? (int)c->V - 1 : (int)(bl % c->V);
    c->D = 1 + u8(r) % 6;
    for (int k = 0; k < c->D; ++k) {
        uint8_t b = u8(r);
        int d;
        if ((b & 15) < 8) {
            d = b & 7;
            for (int tries = 0; tries < 8; ++tries) { /* make it distinct */
                int dup = 0;
                for (int j = 0; j < k; ++j) dup |= c->durs[j] == d;
                if (!dup) break;
                d = (d + 1) & 7;
            }
        } else {
            d = big_durs[(b >> 4) & 7];
        }
        for (int j = 0; j < k; ++j)
            if (c->durs[j] == d) d = 20 + k; /* a big one collided: still distinct */
        c->durs[k] = d;
    }
    int pos = 0;
    for (int k = 0; k < c->D; ++k) pos |= c->durs[k] > 0;
    if (!pos) c->durs[0] = c->D == 1 ? 1 : 7 + (c->durs[0] == 7);
    uint8_t o = u8(r);
    c->sigma = sigmas[o & 3];
    c->fastemit = lambdas[(o >> 2) & 3];
    c->clamp = clamps[(o >> 4) & 3];
    c->null_empty = (o >> 6) & 1;
    c->nan_gaps = (o >> 7) & 1;
    c->threads = u8(r) % 5;
    uint8_t li = u8(r);
    c->in_kind = li & 3;
    c->in_perm = (li >> 2) & 7;
    c->in_pad = li >> 5;
    uint8_t lg = u8(r);
    c->g_kind = lg & 3;
    c->g_perm = (lg >> 2) & 7;
    c->g_pad = lg >> 5;
    uint8_t vm = u8(r);
    c->scale = scales[vm & 3];
    c->dense = (vm >> 2) & 1;
    c->misalign = u8(r);
    uint8_t fb = u8(r);
    c->fault = fb >= 160 ? (fb - 160) % NUM_FAULTS : F_NONE;
    c->fparam = u8(r);
}

/* Natural layout of extents E (outer dims) with rows of rowlen elements: the dims nested in
 * the order perm picks, each padded by one element-row when its pad bit is set. Returns the
 * number of elements spanned. */
static int64_t natural_view(const int64_t E[3], int64_t rowlen, int perm, int pad, int64_t s[3]) {
    static const int orders[8][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0},
                                     {2, 0, 1}, {2, 1, 0}, {0, 1, 2}, {2, 1, 0}};
    const int *ord = orders[perm & 7]; /* outer -> inner */
    int64_t cur = rowlen;
    for (int i = 2; i >= 0; --i) {
        int d = ord[i];
        s[d] = cur;
        cur *= (E[d] > 0 ? E[d] : 1) + ((pad >> d) & 1);
    }
    return cur;
}

/* Elements from the view's base to past its last element (0 if the extent is empty). */
static int64_t view_span(const view_t *v, const int64_t E[3]) {
    int64_t span = v->W;
    for (int i = 0; i < 3; ++i) {
        if (E[i] == 0) return 0;
        span += (E[i] - 1) * v->s[i];
    }
    return span;
}

static int64_t view_off(const view_t *v, int64_t b, int64_t t, int64_t u) {
    return v->base + b * v->s[0] + t * v->s[1] + u * v->s[2];
}

/* Whether two elements of the extent of v share an address. */
static int view_overlaps(const view_t *v, const int64_t E[3], int64_t elems) {
    if (E[0] * E[1] * E[2] == 0) return 0;
    unsigned char *seen = calloc((size_t)elems + 1, 1);
    int hit = 0;
    for (int64_t b = 0; b < E[0] && !hit; ++b)
        for (int64_t t = 0; t < E[1] && !hit; ++t)
            for (int64_t u = 0; u < E[2] && !hit; ++u)
                for (int64_t w = 0; w < v->W; ++w) {
                    int64_t o = view_off(v, b, t, u) + w;
                    if (seen[o]) { hit = 1; break; }
                    seen[o] = 1;
                }
    free(seen);
    return hit;
}

static void fill_elems(buf_t *bf, tdt_dtype_t dt, double x) {
    for (int64_t i = 0; i < bf->elems; ++i) put(bf->mem, i, dt, x);
}

static buf_t buf_alloc(int64_t elems, tdt_dtype_t dt) {
    buf_t bf;
    bf.elems = elems;
    bf.mem = malloc((size_t)(elems > 0 ? elems : 1) * esize(dt));
    return bf;
}

static void *elem_ptr(const buf_t *bf, int64_t off, tdt_dtype_t dt) {
    return bf->mem + off * (int64_t)esize(dt);
}

/* Marks the extent of view v in mask. */
static void mark_view(unsigned char *mask, const view_t *v, const int64_t E[3]) {
    for (int64_t b = 0; b < E[0]; ++b)
        for (int64_t t = 0; t < E[1]; ++t)
            for (int64_t u = 0; u < E[2]; ++u)
                for (int64_t w = 0; w < v->W; ++w) mask[view_off(v, b, t, u) + w] = 1;
}

/* ---- everything one case needs ----------------------------------------------------------- */

typedef struct world {
    cfg_t c;
    int64_t E[3];                 /* B, T, U + 1 */
    /* inputs */
    buf_t in_tok, in_dur;         /* in_dur.mem == in_tok.mem for a joint tensor */
    int in_joint;
    view_t vt, vd;
    double *tok, *dur;            /* dense (B, T, U + 1, V / D) copies of what the views hold */
    int32_t *labels, *flen, *llen;
    /* gradients */
    buf_t g_tok, g_dur;           /* g_dur.mem == g_tok.mem for joint */
    int g_joint, g_weird, g_inplace;
    view_t gt, gd;
    unsigned char *mask_tok, *mask_dur; /* extent elements of the gradient buffers */
    double gc[8];                 /* upstream gradients (B) */
    size_t ws_need;
} world_t;

static size_t acc_size(tdt_dtype_t dt) { return dt == TDT_DTYPE_FLOAT64 ? 8 : 4; }

static double cost_at(const void *costs, int64_t b, tdt_dtype_t dt) {
    return dt == TDT_DTYPE_FLOAT64 ? ((const double *)costs)[b] : ((const float *)costs)[b];
}

/* ---- one library invocation -------------------------------------------------------------- */

typedef struct inv {
    tdt_problem_t p;
    tdt_options_t o;
    tdt_gradients_t g;
    int pass_problem, pass_options, pass_grads;
    void *costs;
    void *gc;                     /* grad_costs or NULL */
    void *ws;
    size_t wsb;
    int64_t fwd_batch;            /* >= 0: the forward runs on the first fwd_batch samples only */
} inv_t;

/* Runs the call shape of kind; returns the status of the first call that failed (or SUCCESS).
 * skip_forward: backward only (fault F_BWD_NO_FWD). *failed_phase = 1 forward, 2 backward. */
static tdt_status_t invoke(int kind, inv_t *v, int skip_forward, int *failed_phase) {
    const tdt_problem_t *p = v->pass_problem ? &v->p : NULL;
    const tdt_options_t *o = v->pass_options ? &v->o : NULL;
    tdt_status_t s;
    *failed_phase = 1;
    if (kind == K_ONESHOT && !skip_forward) return compute_tdt_loss(p, o, v->costs, v->pass_grads ? &v->g : NULL, v->ws, v->wsb);
    if (kind == K_COSTS) return compute_tdt_loss(p, o, v->costs, NULL, v->ws, v->wsb);
    if (kind == K_FORWARD) return tdt_forward(p, o, v->costs, v->ws, v->wsb);
    if (!skip_forward) {
        tdt_problem_t pf;
        if (p && v->fwd_batch >= 0) {
            pf = *p;
            pf.batch = v->fwd_batch;
            p = &pf;
        }
        s = tdt_forward(p, o, v->costs, v->ws, v->wsb);
        p = v->pass_problem ? &v->p : NULL;
        REQUIRE(known_status(s), "tdt_forward returned %d", (int)s);
        if (s != TDT_STATUS_SUCCESS) return s;
    }
    *failed_phase = 2;
    return tdt_backward(p, o, kind == K_TWOPHASE_GC ? v->gc : NULL, v->pass_grads ? &v->g : NULL,
                        v->ws, v->wsb);
}

/* ---- checks of a successful run ---------------------------------------------------------- */

typedef struct tol {
    double cost_abs, cost_rel, grad_abs, grad_rel;
} tol_t;

static tol_t tolerance(const cfg_t *c, int64_t T, int64_t U, double mag, double g) {
    tol_t t;
    double lam = 1.0 + c->fastemit, ag = fabs(g) * lam;
    double len = (double)(T + U + 2);
    if (c->dt == TDT_DTYPE_FLOAT64) {
        double cond = 64.0 * DBL_EPSILON * len * (mag + 10.0);
        t.cost_abs = 1e-9 + cond * lam;
        t.cost_rel = 1e-9;
        t.grad_abs = 1e-9 + cond * ag;
        t.grad_rel = 1e-9;
        return t;
    }
    const double e32 = FLT_EPSILON;
    t.cost_abs = lam * 2e-5 * len + 8.0 * e32 * mag;
    t.cost_rel = 2e-6;
    t.grad_abs = ag * (5e-6 * len + 8.0 * e32 * (mag + 10.0));
    t.grad_rel = 1e-5;
    if (c->dt == TDT_DTYPE_FLOAT16) {
        t.grad_abs += 6e-8;
        t.grad_rel = 1.1e-3;
    } else if (c->dt == TDT_DTYPE_BFLOAT16) {
        t.grad_rel = 8e-3;
    }
    return t;
}

/* Per-sample classification of what the library reads: bad rows (NaN / +inf read, or a fully
 * -inf row under log_softmax) and whether one lies on a complete path. */
typedef struct sample_info {
    int bad, bad_on_path;
    int64_t paths_nodes; /* nodes on complete paths (0: structurally infeasible) */
    double mag;          /* largest finite |logit| read */
} sample_info_t;

static int row_bad_logits(const double *x, int64_t n) {
    int all_neg_inf = 1;
    for (int64_t i = 0; i < n; ++i) {
        if (x[i] != x[i] || x[i] == INFINITY) return 1;
        if (x[i] != -INFINITY) all_neg_inf = 0;
    }
    return all_neg_inf;
}

static int bad_lp(double x) { return x != x || x == INFINITY; }

static nref_config_t ref_config(const world_t *w) {
    nref_config_t rc;
    rc.V = w->c.V;
    rc.blank = w->c.blank;
    rc.durations = w->c.tdt ? w->c.durs : NULL;
    rc.D = w->c.tdt ? (int)w->c.D : 0;
    rc.sigma = w->c.sigma;
    rc.fastemit = w->c.fastemit;
    rc.clamp = w->c.clamp;
    rc.log_probs = w->c.log_probs;
    return rc;
}

/* FUZZ_TDT_DUMP=1: print the values of each sample's lattice (for reading a crash). */
static void dump_sample(const world_t *w, int64_t b) {
    const cfg_t *c = &w->c;
    if (!getenv("FUZZ_TDT_DUMP")) return;
    fprintf(stderr, "sample %lld: T %d U %d labels", (long long)b, w->flen[b], w->llen[b]);
    for (int i = 0; i < w->llen[b]; ++i) fprintf(stderr, " %d", w->labels[b * c->U + i]);
    fprintf(stderr, "\n");
    for (int64_t t = 0; t < w->flen[b]; ++t)
        for (int64_t u = 0; u <= w->llen[b]; ++u) {
            fprintf(stderr, "  (%lld,%lld) tok", (long long)t, (long long)u);
            for (int64_t v = 0; v < c->V; ++v)
                fprintf(stderr, " %g", w->tok[(((b * c->T) + t) * (c->U + 1) + u) * c->V + v]);
            if (c->tdt) {
                fprintf(stderr, " | dur");
                for (int64_t k = 0; k < c->D; ++k)
                    fprintf(stderr, " %g", w->dur[(((b * c->T) + t) * (c->U + 1) + u) * c->D + k]);
            }
            fprintf(stderr, "\n");
        }
}

static sample_info_t classify(const world_t *w, int64_t b) {
    const cfg_t *c = &w->c;
    sample_info_t si = {0, 0, 0, 0.0};
    int64_t Tb = w->flen[b], Ub = w->llen[b], R = Ub + 1, V = c->V, D = c->D;
    size_t N = (size_t)(Tb * R + 1);
    unsigned char *on = malloc(N), *bb = calloc(N, 1), *bl = calloc(N, 1);
    unsigned char *bd = calloc(N * (size_t)D, 1);
    nref_config_t rc = ref_config(w);
    si.paths_nodes = nref_on_path(&rc, Tb, Ub, on);
    REQUIRE(si.paths_nodes >= 0, "out of memory");
    for (int64_t t = 0; t < Tb; ++t)
        for (int64_t u = 0; u <= Ub; ++u) {
            const double *z = w->tok + (((b * c->T) + t) * (c->U + 1) + u) * V;
            const double *h = w->dur + (((b * c->T) + t) * (c->U + 1) + u) * D;
            int64_t n = t * R + u;
            if (c->log_probs) {
                /* only the entries an arc uses are read */
                bb[n] = bad_lp(z[c->blank]);
                bl[n] = u < Ub && bad_lp(z[w->labels[b * c->U + u]]);
                for (int64_t k = 0; c->tdt && k < D; ++k) bd[n * D + k] = bad_lp(h[k]);
            } else {
                /* a bad entry spoils the normaliser, so every arc of the node */
                int bad = row_bad_logits(z, V) || (c->tdt && row_bad_logits(h, D));
                bb[n] = bl[n] = (unsigned char)bad;
                for (int64_t k = 0; c->tdt && k < D; ++k) bd[n * D + k] = (unsigned char)bad;
            }
            si.bad |= bb[n] | bl[n];
            for (int64_t k = 0; c->tdt && k < D; ++k) si.bad |= bd[n * D + k];
            for (int64_t v = 0; v < V; ++v)
                if (isfinite(z[v]) && fabs(z[v]) > si.mag) si.mag = fabs(z[v]);
            for (int64_t k = 0; c->tdt && k < D; ++k)
                if (isfinite(h[k]) && fabs(h[k]) > si.mag) si.mag = fabs(h[k]);
        }
    if (si.bad) {
        int hit = nref_bad_arc_on_path(&rc, Tb, Ub, bb, bl, bd);
        REQUIRE(hit >= 0, "out of memory");
        si.bad_on_path = hit;
    }
    free(on);
    free(bb);
    free(bl);
    free(bd);
    return si;
}

static int near(double got, double want, double abs_tol, double rel_tol) {
    if (want == INFINITY || want == -INFINITY) return got == want;
    return fabs(got - want) <= abs_tol + rel_tol * fabs(want);
}

/* Every check on one successful primary run (costs in `costs`, gradients in w->g_*). */
static void check_success(const world_t *w, const void *costs, int grads_written) {
    const cfg_t *c = &w->c;
    const tdt_dtype_t dt = c->dt;
    const int64_t V = c->V, D = c->D, R = c->U + 1;
    const int tok_on = grads_written && c->want_tok;
    const int dur_on = grads_written && c->want_dur && c->tdt;
    nref_config_t rc = ref_config(w);
    for (int64_t b = 0; b < c->B; ++b) {
        const int64_t Tb = w->flen[b], Ub = w->llen[b];
        const double g = c->kind == K_TWOPHASE_GC ? w->gc[b] : 1.0;
        const double cost = cost_at(costs, b, dt);
        sample_info_t si = classify(w, b);
        dump_sample(w, b);
        /* costs */
        if (si.bad_on_path)
            REQUIRE(cost != cost, "sample %lld reads NaN/+inf logits on a complete path but its "
                    "cost is %.17g, not NaN", (long long)b, cost);
        else if (!si.bad)
            REQUIRE(cost == cost && cost != -INFINITY, "sample %lld: cost %.17g is NaN or -inf "
                    "for clean inputs", (long long)b, cost);
        else
            REQUIRE(cost != -INFINITY, "sample %lld: cost -inf", (long long)b);
        if (si.paths_nodes == 0 && !si.bad)
            REQUIRE(cost == INFINITY, "sample %lld (T %lld, U %lld) has no complete path but "
                    "cost %.17g", (long long)b, (long long)Tb, (long long)Ub, cost);
        /* gradients: zero outside the lattice, zero when infeasible, finite when clean */
        for (int64_t t = 0; t < c->T; ++t)
            for (int64_t u = 0; u < R; ++u) {
                int inside = t < Tb && u <= Ub;
                for (int64_t v = 0; tok_on && v < V; ++v) {
                    double x = get(w->g_tok.mem, view_off(&w->gt, b, t, u) + v, dt);
                    if (!inside || cost == INFINITY)
                        REQUIRE(x == 0.0, "token grad (%lld,%lld,%lld,%lld) = %.17g, want exactly "
                                "0 (outside the lattice or infeasible, cost %g)", (long long)b,
                                (long long)t, (long long)u, (long long)v, x, cost);
                    else if (!si.bad)
                        REQUIRE(isfinite(x), "token grad (%lld,%lld,%lld,%lld) = %g for clean "
                                "inputs", (long long)b, (long long)t, (long long)u, (long long)v, x);
                }
                for (int64_t k = 0; dur_on && k < D; ++k) {
                    double x = get(w->g_dur.mem, view_off(&w->gd, b, t, u) + k, dt);
                    if (!inside || cost == INFINITY)
                        REQUIRE(x == 0.0, "duration grad (%lld,%lld,%lld,%lld) = %.17g, want "
                                "exactly 0", (long long)b, (long long)t, (long long)u, (long long)k, x);
                    else if (!si.bad)
                        REQUIRE(isfinite(x), "duration grad (%lld,%lld,%lld,%lld) = %g for clean "
                                "inputs", (long long)b, (long long)t, (long long)u, (long long)k, x);
                }
            }
        if (si.bad) continue;
        /* the naive reference, on the values the library was given */
        double *zt = malloc(sizeof(double) * (size_t)(Tb * (Ub + 1) * V + 1));
        double *zh = malloc(sizeof(double) * (size_t)(Tb * (Ub + 1) * D + 1));
        double *gt = malloc(sizeof(double) * (size_t)(Tb * (Ub + 1) * V + 1));
        double *gh = malloc(sizeof(double) * (size_t)(Tb * (Ub + 1) * D + 1));
        for (int64_t t = 0; t < Tb; ++t)
            for (int64_t u = 0; u <= Ub; ++u) {
                memcpy(zt + (t * (Ub + 1) + u) * V, w->tok + ((b * c->T + t) * R + u) * V,
                       sizeof(double) * (size_t)V);
                memcpy(zh + (t * (Ub + 1) + u) * D, w->dur + ((b * c->T + t) * R + u) * D,
                       sizeof(double) * (size_t)D);
            }
        nref_result_t res;
        REQUIRE(nref_sample(&rc, Tb, Ub, w->labels + b * c->U, zt, zh, g, &res, gt, gh) == 0,
                "out of memory");
        if (res.feasible && c->dt == TDT_DTYPE_FLOAT64)
            REQUIRE(near(res.beta00, res.ll, 1e-9, 1e-9), "naive reference self-check: beta00 "
                    "%.17g != ll %.17g", res.beta00, res.ll);
        tol_t tl = tolerance(c, Tb, Ub, si.mag, g);
        double want_cost = res.cost;
        if (c->dt != TDT_DTYPE_FLOAT64 && isfinite(want_cost) && fabs(want_cost) > FLT_MAX)
            want_cost = want_cost > 0 ? INFINITY : -INFINITY;
        REQUIRE(near(cost, want_cost, tl.cost_abs, tl.cost_rel), "sample %lld: cost %.17g, naive "
                "reference %.17g (diff %.3g)", (long long)b, cost, want_cost, cost - want_cost);
        if (res.feasible) {
            for (int64_t t = 0; t < Tb; ++t)
                for (int64_t u = 0; u <= Ub; ++u) {
                    for (int64_t v = 0; tok_on && v < V; ++v) {
                        double x = get(w->g_tok.mem, view_off(&w->gt, b, t, u) + v, dt);
                        double y = gt[(t * (Ub + 1) + u) * V + v];
                        REQUIRE(near(x, y, tl.grad_abs, tl.grad_rel), "token grad (%lld,%lld,%lld,"
                                "%lld) = %.17g, naive reference %.17g (diff %.3g, tol %.3g)",
                                (long long)b, (long long)t, (long long)u, (long long)v, x, y, x - y,
                                tl.grad_abs + tl.grad_rel * fabs(y));
                    }
                    for (int64_t k = 0; dur_on && k < D; ++k) {
                        double x = get(w->g_dur.mem, view_off(&w->gd, b, t, u) + k, dt);
                        double y = gh[(t * (Ub + 1) + u) * D + k];
                        REQUIRE(near(x, y, tl.grad_abs, tl.grad_rel), "duration grad (%lld,%lld,"
                                "%lld,%lld) = %.17g, naive reference %.17g (diff %.3g)",
                                (long long)b, (long long)t, (long long)u, (long long)k, x, y, x - y);
                    }
                }
        }
        free(zt);
        free(zh);
        free(gt);
        free(gh);
    }
}

/* Bytes outside the marked extent equal `before`. */
static void check_untouched(const buf_t *now, const unsigned char *before, const unsigned char *mask,
                            tdt_dtype_t dt, const char *what) {
    size_t es = esize(dt);
    for (int64_t i = 0; i < now->elems; ++i) {
        if (mask && mask[i]) continue;
        REQUIRE(memcmp(now->mem + i * es, before + i * es, es) == 0,
                "%s: element %lld (outside the written extent) was modified", what, (long long)i);
    }
}

/* ---- the fuzz entry ------------------------------------------------------------------------ */

static unsigned char *dup_mem(const void *p, size_t n) {
    unsigned char *q = malloc(n ? n : 1);
    if (n) memcpy(q, p, n);
    return q;
}

static void describe(const world_t *w) {
    const cfg_t *c = &w->c;
    int n = snprintf(g_case, sizeof g_case,
                     "%s kind=%d dtype=%d B=%lld T=%lld U=%lld V=%lld blank=%d %s sigma=%g "
                     "lambda=%g clamp=%g threads=%d in_layout=%d g_layout=%d tok_grad=%d "
                     "dur_grad=%d fault=%s lengths=",
                     c->tdt ? "TDT" : "RNNT", c->kind, (int)c->dt, (long long)c->B, (long long)c->T,
                     (long long)c->U, (long long)c->V, c->blank, c->log_probs ? "log-probs" : "logits",
                     c->sigma, c->fastemit, c->clamp, c->threads, c->in_kind, c->g_kind,
                     c->want_tok, c->want_dur, c->fault >= 0 ? fault_names[c->fault] : "none");
    for (int64_t b = 0; b < c->B && n < (int)sizeof g_case - 40; ++b)
        n += snprintf(g_case + n, sizeof g_case - (size_t)n, "(%d,%d)", w->flen[b], w->llen[b]);
    if (c->tdt && n < (int)sizeof g_case - 200) {
        n += snprintf(g_case + n, sizeof g_case - (size_t)n, " durations=");
        for (int64_t k = 0; k < c->D; ++k)
            n += snprintf(g_case + n, sizeof g_case - (size_t)n, "%d,", c->durs[k]);
    }
}

/* Small API calls that need no buffers. */
static void check_misc(const cfg_t *c) {
    REQUIRE(tdt_version() == TDT_VERSION_NUMBER, "tdt_version %d != header %d", tdt_version(),
            TDT_VERSION_NUMBER);
    REQUIRE(tdt_version_string() != NULL, "tdt_version_string NULL");
    tdt_status_t st = (tdt_status_t)(c->fparam % 20);
    REQUIRE(tdt_status_string(st) != NULL && tdt_status_string(st)[0], "tdt_status_string(%d)", (int)st);
    REQUIRE(tdt_status_string((tdt_status_t)(1000 + c->fparam)) != NULL, "status string of unknown");
    tdt_problem_t p;
    memset(&p, 0, sizeof p);
    tdt_options_t o;
    memset(&o, 0, sizeof o);
    size_t n = 0;
    p.batch = c->B;
    p.max_frames = c->T;
    p.max_labels = c->U;
    p.vocab_size = c->V;
    REQUIRE(tdt_get_workspace_size(NULL, &o, &n) == TDT_STATUS_NULL_POINTER, "ws size problem NULL");
    REQUIRE(tdt_get_workspace_size(&p, NULL, &n) == TDT_STATUS_NULL_POINTER, "ws size options NULL");
    REQUIRE(tdt_get_workspace_size(&p, &o, NULL) == TDT_STATUS_NULL_POINTER, "ws size out NULL");
    o.num_durations = c->fparam & 1 ? -1 - (c->fparam >> 1) : TDT_MAX_DURATIONS + 1 + (c->fparam >> 1);
    REQUIRE(tdt_get_workspace_size(&p, &o, &n) == TDT_STATUS_SUCCESS,
            "ws size of RNN-T (no duration logits) must ignore num_durations %d", o.num_durations);
    p.duration_logits = &p; /* a placeholder: the TDT size, never dereferenced */
    REQUIRE(tdt_get_workspace_size(&p, &o, &n) == TDT_STATUS_TOO_MANY_DURATIONS,
            "ws size with num_durations %d", o.num_durations);
    p.duration_logits = NULL;
    o.num_durations = (int)c->D;
    p.batch = -1 - c->fparam;
    REQUIRE(tdt_get_workspace_size(&p, &o, &n) == TDT_STATUS_INVALID_SIZE, "ws size batch < 0");
    p.batch = (int64_t)1 << (40 + c->fparam % 23);
    p.max_frames = (int64_t)1 << (20 + c->fparam % 7);
    st = tdt_get_workspace_size(&p, &o, &n);
    REQUIRE(st == TDT_STATUS_INVALID_SIZE, "ws size of an overflowing problem: status %d, %zu bytes",
            (int)st, n);
}

/* Known library bugs the fuzzer can be told to step around (so a long run gets past them
 * while the fix is pending): FUZZ_TDT_AVOID=tag[,tag...]. Tags:
 *   null-labels   never pass labels == NULL, even where the header allows it (max_labels == 0)
 *   logprob-inf   no +inf in log-prob inputs
 *   dur-inf       no +inf in duration logits
 * fuzz/regressions/ holds one input per bug; run.sh replays them without the knob. */
static int avoid(const char *tag) {
    const char *e = getenv("FUZZ_TDT_AVOID");
    return e && strstr(e, tag) != NULL;
}

/* options.pack: tdt_forward packing `in` (the call's labels and lengths, or int64 copies) into
 * a fresh packed array gives, where the data pass the check (ok), SUCCESS and the costs of
 * tdt_forward on the call's own arrays, bitwise, and the packed arrays back; else a length or
 * label status (the first bad element of the packed order, which may be another one than
 * tdt_check_data names), the verdict 0 and no cost written. */
static void check_pack_option(const tdt_problem_t *p, const tdt_options_t *o, const tdt_indices_t *in,
                              int ok) {
    const int64_t B = p->batch, U = p->max_labels, n = B * (U + 2);
    const size_t as = p->dtype == TDT_DTYPE_FLOAT64 ? 8 : 4;
    size_t need = 0;
    REQUIRE(tdt_get_workspace_size(p, o, &need) == TDT_STATUS_SUCCESS, "options.pack: workspace size");
    unsigned char *ws = (unsigned char *)malloc(need + 1), *c1 = (unsigned char *)malloc((size_t)(B + 1) * as),
                  *c2 = (unsigned char *)malloc((size_t)(B + 1) * as);
    int32_t *packed = (int32_t *)malloc((size_t)(n + 1) * 4), valid = -1;
    memset(c1, 0xC3, (size_t)(B + 1) * as);
    memset(c2, 0xC3, (size_t)(B + 1) * as);
    for (int64_t i = 0; i <= n; ++i) packed[i] = -77;
    tdt_options_t plain = *o;
    plain.pack = NULL;
    plain.pack_valid = NULL;
    const tdt_status_t s1 = tdt_forward(p, &plain, c1, ws, need);
    REQUIRE((s1 == TDT_STATUS_SUCCESS) == ok, "options.pack: the plain forward %d, the check %d", (int)s1, ok);
    tdt_problem_t q = *p;
    q.frame_lengths = packed;
    q.label_lengths = packed + B;
    q.labels = U > 0 ? packed + 2 * B : NULL;
    tdt_options_t po = plain;
    po.pack = in;
    po.pack_valid = &valid;
    const tdt_status_t s2 = tdt_forward(&q, &po, c2, ws, need);
    REQUIRE(valid == ok, "options.pack_valid %d, the check %d", (int)valid, ok);
    if (ok) {
        REQUIRE(s2 == TDT_STATUS_SUCCESS, "options.pack: status %d (%s): %s", (int)s2, tdt_status_string(s2),
                tdt_last_error());
        REQUIRE(memcmp(c1, c2, (size_t)(B + 1) * as) == 0, "options.pack: costs differ from the plain forward's");
        for (int64_t b = 0; b < B; ++b)
            REQUIRE(packed[b] == p->frame_lengths[b] && packed[B + b] == p->label_lengths[b],
                    "options.pack: lengths of sample %lld", (long long)b);
        for (int64_t i = 0; i < B * U; ++i)
            REQUIRE(packed[2 * B + i] == p->labels[i], "options.pack: label %lld", (long long)i);
    } else {
        REQUIRE(s2 == TDT_STATUS_INVALID_LENGTH || s2 == TDT_STATUS_INVALID_LABEL,
                "options.pack on bad data: status %d (%s)", (int)s2, tdt_status_string(s2));
        for (size_t i = 0; i < (size_t)(B + 1) * as; ++i)
            REQUIRE(c2[i] == 0xC3, "options.pack: costs written on failure");
    }
    REQUIRE(packed[n] == -77, "options.pack wrote past 2 B + B U elements");
    free(ws);
    free(c1);
    free(c2);
    free(packed);
}

/* tdt_pack_indices() on the call's int32 labels and lengths, as int64 copies (wide) or as they
 * are: SUCCESS, the same arrays back in the packed layout, nothing written past it, and a
 * verdict that is tdt_check_data's (ok). */
static void check_pack(const tdt_problem_t *p, const tdt_options_t *o, int ok, int wide) {
    const int64_t B = p->batch, U = p->max_labels, n = B * (U + 2);
    int64_t *l64 = (int64_t *)malloc((size_t)(B * U + 1) * 8), *f64 = (int64_t *)malloc((size_t)(B + 1) * 8),
            *u64 = (int64_t *)malloc((size_t)(B + 1) * 8);
    int32_t *packed = (int32_t *)malloc((size_t)(n + 1) * 4), valid = -1;
    for (int64_t i = 0; i < B * U; ++i) l64[i] = p->labels[i];
    for (int64_t b = 0; b < B; ++b) {
        f64[b] = p->frame_lengths[b];
        u64[b] = p->label_lengths[b];
    }
    for (int64_t i = 0; i <= n; ++i) packed[i] = -77;
    tdt_indices_t in;
    memset(&in, 0, sizeof in);
    in.type = wide ? TDT_INDEX_INT64 : TDT_INDEX_INT32;
    in.labels = wide ? (const void *)l64 : (const void *)p->labels;
    in.columns = U;
    in.labels_stride = U;
    in.frame_lengths = wide ? (const void *)f64 : (const void *)p->frame_lengths;
    in.label_lengths = wide ? (const void *)u64 : (const void *)p->label_lengths;
    const tdt_status_t s = tdt_pack_indices(p, o, &in, packed, &valid);
    REQUIRE(s == TDT_STATUS_SUCCESS, "tdt_pack_indices %d (%s): %s", (int)s, tdt_status_string(s),
            tdt_last_error());
    REQUIRE(valid == ok, "tdt_pack_indices says valid %d, tdt_check_data %d", (int)valid, ok);
    for (int64_t b = 0; b < B; ++b)
        REQUIRE(packed[b] == p->frame_lengths[b] && packed[B + b] == p->label_lengths[b],
                "tdt_pack_indices: lengths of sample %lld", (long long)b);
    for (int64_t i = 0; i < B * U; ++i)
        REQUIRE(packed[2 * B + i] == p->labels[i], "tdt_pack_indices: label %lld", (long long)i);
    REQUIRE(packed[n] == -77, "tdt_pack_indices wrote past 2 B + B U elements");
    check_pack_option(p, o, &in, ok);
    free(l64);
    free(f64);
    free(u64);
    free(packed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd_t rd = {data, size, 0, 0x6a09e667f3bcc908ull};
    world_t W;
    memset(&W, 0, sizeof W);
    cfg_t *c = &W.c;
    decode_cfg(&rd, c);
    check_misc(c);
    const tdt_dtype_t dt = c->dt;
    const int64_t B = c->B, T = c->T, U = c->U, V = c->V, D = c->D, R = U + 1;
    W.E[0] = B;
    W.E[1] = T;
    W.E[2] = R;
    g_case[0] = 0;

    /* ---- lengths and labels ---- */
    W.flen = malloc(sizeof(int32_t) * (size_t)(B + 1));
    W.llen = malloc(sizeof(int32_t) * (size_t)(B + 1));
    W.labels = malloc(sizeof(int32_t) * (size_t)(B * U + 1));
    for (int64_t b = 0; b < B; ++b) {
        W.flen[b] = (int32_t)(u8(&rd) % (T + 1));
        W.llen[b] = V > 1 ? (int32_t)(u8(&rd) % (U + 1)) : (u8(&rd), 0);
    }
    for (int64_t i = 0; i < B * U; ++i) {
        uint8_t x = u8(&rd);
        if (V > 1) {
            int idx = x % (int)(V - 1);
            W.labels[i] = idx < c->blank ? idx : idx + 1;
        } else {
            W.labels[i] = x; /* padding only: never read (U_b == 0) */
        }
    }
    static const double gcs[8] = {1.0, 0.5, -2.0, 0.0, 3.25, 1e-3, -0.75, 2.0};
    for (int64_t b = 0; b < B; ++b) W.gc[b] = gcs[u8(&rd) & 7];

    /* ---- input layout ---- */
    int64_t in_elems;
    W.in_joint = c->tdt && c->in_kind == L_JOINT;
    int64_t tpad = c->in_pad & 3, rowt = V + tpad, rowd = D + (c->in_pad >> 2);
    W.vt.W = V;
    W.vd.W = D;
    if (W.in_joint) {
        int64_t s[3];
        in_elems = natural_view(W.E, V + D + tpad, c->in_perm, c->in_pad, s);
        memcpy(W.vt.s, s, sizeof s);
        memcpy(W.vd.s, s, sizeof s);
        W.vt.base = 0;
        W.vd.base = V;
        W.in_tok = buf_alloc(in_elems, dt);
        W.in_dur = W.in_tok;
    } else {
        int64_t nt, nd;
        if (c->in_kind == L_RANDOM) {
            for (int i = 0; i < 3; ++i) W.vt.s[i] = u8(&rd) % 48;
            for (int i = 0; i < 3; ++i) W.vd.s[i] = u8(&rd) % 24;
            nt = view_span(&W.vt, W.E);
            nd = view_span(&W.vd, W.E);
        } else {
            nt = natural_view(W.E, rowt, c->in_perm, c->in_pad, W.vt.s);
            nd = natural_view(W.E, rowd, c->in_perm ^ 1, c->in_pad >> 1, W.vd.s);
            if (c->in_kind == L_BCAST) {
                int m = 1 + (c->in_pad % 7); /* which dims broadcast (stride 0) */
                for (int i = 0; i < 3; ++i)
                    if ((m >> i) & 1) W.vt.s[i] = 0;
                for (int i = 0; i < 3; ++i)
                    if ((m >> ((i + 1) % 3)) & 1) W.vd.s[i] = 0;
                nt = view_span(&W.vt, W.E);
                nd = view_span(&W.vd, W.E);
            }
        }
        W.in_tok = buf_alloc(nt, dt);
        W.in_dur = buf_alloc(c->tdt ? nd : 0, dt);
    }
    /* gaps: NaN or a value that would show if read */
    fill_elems(&W.in_tok, dt, c->nan_gaps ? NAN : 7.0);
    if (!W.in_joint) fill_elems(&W.in_dur, dt, c->nan_gaps ? NAN : -7.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u < R; ++u)
                for (int64_t v = 0; v < V; ++v)
                    put(W.in_tok.mem, view_off(&W.vt, b, t, u) + v, dt, decode_value(u8(&rd), c, 0));
    for (int64_t b = 0; c->tdt && b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u < R; ++u)
                for (int64_t k = 0; k < D; ++k)
                    put(W.in_dur.mem, view_off(&W.vd, b, t, u) + k, dt, decode_value(u8(&rd), c, 1));
    /* dense copies of what the library will read (overlapping views: the last write won) */
    W.tok = malloc(sizeof(double) * (size_t)(B * T * R * V + 1));
    W.dur = malloc(sizeof(double) * (size_t)(B * T * R * D + 1));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u < R; ++u) {
                int64_t n = (b * T + t) * R + u;
                for (int64_t v = 0; v < V; ++v)
                    W.tok[n * V + v] = get(W.in_tok.mem, view_off(&W.vt, b, t, u) + v, dt);
                for (int64_t k = 0; k < D; ++k)
                    W.dur[n * D + k] = c->tdt ? get(W.in_dur.mem, view_off(&W.vd, b, t, u) + k, dt) : 0.0;
            }

    /* ---- gradient layout (canary-filled, with guard elements around the extent) ---- */
    const int64_t guard = 2;
    W.g_inplace = c->g_kind == G_INPLACE;
    W.g_joint = c->g_kind == G_JOINT && c->tdt;
    W.g_weird = c->g_kind == G_RANDOM || (W.g_inplace && c->in_kind == L_RANDOM);
    W.gt.W = V;
    W.gd.W = D;
    if (W.g_inplace) {
        /* out of place first, into buffers laid out exactly like the logits (and holding
           them, so gaps keep the logits' bytes); the in-place run is compared to it */
        W.gt = W.vt;
        W.gd = W.vd;
        W.g_joint = W.in_joint;
        W.g_tok = buf_alloc(W.in_tok.elems, dt);
        memcpy(W.g_tok.mem, W.in_tok.mem, (size_t)W.in_tok.elems * esize(dt));
        if (W.g_joint) {
            W.g_dur = W.g_tok;
        } else {
            W.g_dur = buf_alloc(W.in_dur.elems, dt);
            memcpy(W.g_dur.mem, W.in_dur.mem, (size_t)W.in_dur.elems * esize(dt));
        }
    } else {
        int64_t nt, nd;
        if (W.g_joint) {
            int64_t s[3];
            nt = natural_view(W.E, V + D + (c->g_pad & 3), c->g_perm, c->g_pad, s);
            memcpy(W.gt.s, s, sizeof s);
            memcpy(W.gd.s, s, sizeof s);
            W.gt.base = guard;
            W.gd.base = guard + V;
            W.g_tok = buf_alloc(nt + 2 * guard, dt);
            W.g_dur = W.g_tok;
        } else {
            if (c->g_kind == G_RANDOM) {
                for (int i = 0; i < 3; ++i) W.gt.s[i] = u8(&rd) % 64;
                for (int i = 0; i < 3; ++i) W.gd.s[i] = u8(&rd) % 32;
                nt = view_span(&W.gt, W.E);
                nd = view_span(&W.gd, W.E);
            } else {
                nt = natural_view(W.E, V + (c->g_pad & 3), c->g_perm, c->g_pad, W.gt.s);
                nd = natural_view(W.E, D + (c->g_pad >> 1 & 1), c->g_perm ^ 2, c->g_pad >> 2, W.gd.s);
            }
            W.gt.base = guard;
            W.gd.base = guard;
            W.g_tok = buf_alloc(nt + 2 * guard, dt);
            W.g_dur = buf_alloc(nd + 2 * guard, dt);
        }
        /* canary: a pattern no gradient computation produces by accident */
        memset(W.g_tok.mem, 0xA5, (size_t)W.g_tok.elems * esize(dt));
        if (!W.g_joint) memset(W.g_dur.mem, 0x5A, (size_t)W.g_dur.elems * esize(dt));
    }
    W.mask_tok = calloc((size_t)W.g_tok.elems + 1, 1);
    W.mask_dur = W.g_joint ? W.mask_tok : calloc((size_t)W.g_dur.elems + 1, 1);
    const int tok_active = c->kind != K_COSTS && c->want_tok;
    const int dur_active = c->kind != K_COSTS && c->want_dur && c->tdt;
    if (tok_active) mark_view(W.mask_tok, &W.gt, W.E);
    if (dur_active) mark_view(W.mask_dur, &W.gd, W.E);
    const int tok_overlap = tok_active && view_overlaps(&W.gt, W.E, W.g_tok.elems);
    const int dur_overlap = dur_active && view_overlaps(&W.gd, W.E, W.g_dur.elems);

    /* ---- the call ---- */
    tdt_problem_t P;
    memset(&P, 0, sizeof P);
    P.batch = B;
    P.max_frames = T;
    P.max_labels = U;
    P.vocab_size = V;
    P.dtype = dt;
    P.token_logits = elem_ptr(&W.in_tok, W.vt.base, dt);
    memcpy(P.token_strides, W.vt.s, sizeof W.vt.s);
    P.duration_logits = c->tdt ? elem_ptr(&W.in_dur, W.vd.base, dt) : NULL;
    memcpy(P.duration_strides, W.vd.s, sizeof W.vd.s);
    P.labels = W.labels;
    P.frame_lengths = W.flen;
    P.label_lengths = W.llen;
    if (c->null_empty) {
        if (B * U == 0 && !avoid("null-labels")) P.labels = NULL;
        if (B == 0) P.frame_lengths = P.label_lengths = NULL;
        if (B * T == 0) P.token_logits = NULL;
    }
    tdt_options_t O;
    memset(&O, 0, sizeof O);
    O.location = TDT_LOCATION_CPU;
    O.num_threads = c->threads;
    O.blank = c->blank;
    O.durations = c->durs;
    O.num_durations = (int)D;
    O.sigma = c->sigma;
    O.fastemit_lambda = c->fastemit;
    O.clamp = c->clamp;
    O.input_kind = c->log_probs ? TDT_INPUT_LOG_PROBS : TDT_INPUT_LOGITS;

    size_t need = 0;
    tdt_status_t s = tdt_get_workspace_size(&P, &O, &need);
    REQUIRE(s == TDT_STATUS_SUCCESS, "tdt_get_workspace_size: status %d", (int)s);
    size_t need_rnnt = 0;
    tdt_options_t O0 = O;
    O0.num_durations = 0;
    REQUIRE(tdt_get_workspace_size(&P, &O0, &need_rnnt) == TDT_STATUS_SUCCESS && need_rnnt <= need,
            "workspace size without durations %zu > with %zu", need_rnnt, need);
    W.ws_need = need;

    /* costs and upstream gradients, in the accumulate type, guarded */
    const size_t as = acc_size(dt);
    unsigned char *costs_mem = malloc((size_t)(B + 2) * as);
    memset(costs_mem, 0xC3, (size_t)(B + 2) * as);
    void *costs = costs_mem + as;
    void *gcbuf = malloc((size_t)(B + 1) * as);
    for (int64_t b = 0; b < B; ++b) {
        if (dt == TDT_DTYPE_FLOAT64) ((double *)gcbuf)[b] = W.gc[b];
        else ((float *)gcbuf)[b] = (float)W.gc[b];
    }

    unsigned char *ws_mem = malloc(need + c->misalign);
    memset(ws_mem, 0xCD, need + c->misalign);

    inv_t iv;
    memset(&iv, 0, sizeof iv);
    iv.p = P;
    iv.o = O;
    iv.g.token_grads = c->want_tok ? elem_ptr(&W.g_tok, W.gt.base, dt) : NULL;
    memcpy(iv.g.token_strides, W.gt.s, sizeof W.gt.s);
    iv.g.duration_grads = c->want_dur ? elem_ptr(&W.g_dur, W.gd.base, dt) : NULL;
    memcpy(iv.g.duration_strides, W.gd.s, sizeof W.gd.s);
    iv.pass_problem = iv.pass_options = iv.pass_grads = 1;
    iv.costs = costs;
    iv.gc = gcbuf;
    iv.ws = ws_mem + c->misalign;
    iv.wsb = need;
    iv.fwd_batch = -1;

    /* ---- fault injection and the status it predicts ---- */
    int fault = c->fault;
    if (tok_overlap || dur_overlap) fault = F_NONE; /* the layout is the fault */
    tdt_status_t pre = TDT_STATUS_SUCCESS;  /* status of the forward (or one-shot) call */
    tdt_status_t post = TDT_STATUS_SUCCESS; /* status of the backward call */
    int alt_ok = 0;                         /* INVALID_STRIDES also acceptable */
    int skip_forward = 0, inplace_fault = 0;
    const int fp = c->fparam;
    const int grads_active = tok_active || dur_active;
    int have_rows = B > 0 && T > 0;
    int nonempty_label = -1; /* a sample with U_b > 0 */
    for (int64_t b = 0; b < B; ++b)
        if (W.llen[b] > 0 && nonempty_label < 0) nonempty_label = (int)b;
    switch (fault) {
    case F_NONE: break;
    case F_PROBLEM_NULL: iv.pass_problem = 0; pre = TDT_STATUS_NULL_POINTER; break;
    case F_OPTIONS_NULL: iv.pass_options = 0; pre = TDT_STATUS_NULL_POINTER; break;
    case F_LOC_GPU:
        if (tdt_backend_built(TDT_LOCATION_GPU)) break;
        iv.o.location = TDT_LOCATION_GPU;
        pre = TDT_STATUS_BACKEND_NOT_BUILT;
        break;
    case F_LOC_BAD: iv.o.location = (tdt_location_t)(fp & 1 ? -1 : 2 + fp); pre = TDT_STATUS_INVALID_OPTION; break;
    case F_THREADS_NEG: iv.o.num_threads = -1 - fp; pre = TDT_STATUS_INVALID_OPTION; break;
    case F_KIND_BAD: iv.o.input_kind = (tdt_input_kind_t)(fp & 1 ? -1 : 2 + fp); pre = TDT_STATUS_INVALID_OPTION; break;
    case F_SIGMA_BAD:
    case F_FASTEMIT_BAD:
    case F_CLAMP_BAD: {
        double bad = fp % 3 == 0 ? -0.5 : fp % 3 == 1 ? NAN : INFINITY;
        if (fault == F_SIGMA_BAD) iv.o.sigma = bad;
        else if (fault == F_FASTEMIT_BAD) iv.o.fastemit_lambda = bad;
        else iv.o.clamp = bad;
        pre = TDT_STATUS_INVALID_OPTION;
        break;
    }
    case F_BATCH_NEG: iv.p.batch = -1 - fp; pre = TDT_STATUS_INVALID_SIZE; break;
    case F_FRAMES_NEG: iv.p.max_frames = -1 - fp; pre = TDT_STATUS_INVALID_SIZE; break;
    case F_LABELS_BAD: iv.p.max_labels = fp & 1 ? -1 : INT32_MAX + (int64_t)(fp >> 1); pre = TDT_STATUS_INVALID_SIZE; break;
    case F_VOCAB_BAD: iv.p.vocab_size = -(fp % 3); pre = TDT_STATUS_INVALID_SIZE; break;
    case F_DTYPE_BAD: iv.p.dtype = (tdt_dtype_t)(fp & 1 ? -1 : 4 + fp); pre = TDT_STATUS_INVALID_DTYPE; break;
    case F_BLANK_BAD: iv.o.blank = fp & 1 ? -1 - (fp >> 1) : (int)V + (fp >> 1); pre = TDT_STATUS_INVALID_BLANK; break;
    case F_NDUR_BAD:
        iv.o.num_durations = c->tdt ? (fp & 1 ? 0 : TDT_MAX_DURATIONS + 1 + (fp >> 1)) : 0;
        if (c->tdt) pre = TDT_STATUS_TOO_MANY_DURATIONS;
        break;
    case F_DUR_NULL: iv.o.durations = NULL; if (c->tdt) pre = TDT_STATUS_NULL_POINTER; break;
    case F_DUR_NEG: c->durs[fp % D] = -1 - (fp >> 3); if (c->tdt) pre = TDT_STATUS_INVALID_DURATIONS; break;
    case F_DUR_DUP:
        if (D < 2) { c->durs[0] = -1; }
        else { int k = 1 + fp % (int)(D - 1); c->durs[k] = c->durs[fp % k]; }
        if (c->tdt) pre = TDT_STATUS_INVALID_DURATIONS;
        break;
    case F_DUR_NOPOS:
        for (int k = 0; k < D; ++k) c->durs[k] = 0;
        if (c->tdt) pre = D == 1 ? TDT_STATUS_NO_POSITIVE_DURATION : TDT_STATUS_INVALID_DURATIONS;
        break;
    case F_TOK_NULL: iv.p.token_logits = NULL; if (have_rows) pre = TDT_STATUS_NULL_POINTER; break;
    case F_FLEN_NULL: iv.p.frame_lengths = NULL; if (B > 0) pre = TDT_STATUS_NULL_POINTER; break;
    case F_LLEN_NULL: iv.p.label_lengths = NULL; if (B > 0) pre = TDT_STATUS_NULL_POINTER; break;
    case F_LABELS_NULL:
        if (!(B > 0 && U > 0) && avoid("null-labels")) break;
        iv.p.labels = NULL;
        if (B > 0 && U > 0) pre = TDT_STATUS_NULL_POINTER;
        break;
    case F_COSTS_NULL: iv.costs = NULL; if (B > 0) pre = TDT_STATUS_NULL_POINTER; break;
    case F_WS_NULL: iv.ws = NULL; pre = TDT_STATUS_NULL_POINTER; break;
    case F_TOK_STRIDE_NEG: iv.p.token_strides[fp % 3] = -1 - (fp >> 2); pre = TDT_STATUS_INVALID_STRIDES; break;
    case F_DUR_STRIDE_NEG: iv.p.duration_strides[fp % 3] = -1 - (fp >> 2); if (c->tdt) pre = TDT_STATUS_INVALID_STRIDES; break;
    case F_GRAD_STRIDE_NEG:
        if (tok_active && (fp & 1 || !dur_active)) {
            iv.g.token_strides[fp % 3] = -1 - (fp >> 3);
            post = TDT_STATUS_INVALID_STRIDES;
        } else if (dur_active) {
            iv.g.duration_strides[fp % 3] = -1 - (fp >> 3);
            post = TDT_STATUS_INVALID_STRIDES;
        }
        break;
    case F_INPLACE_STRIDES: {
        int d = -1;
        for (int i = 0; i < 3; ++i)
            if (W.E[(fp + i) % 3] > 1) { d = (fp + i) % 3; break; }
        if (d < 0 || !grads_active || P.token_logits == NULL) break;
        inplace_fault = 1;
        if (tok_active) {
            iv.g.token_grads = (void *)P.token_logits;
            memcpy(iv.g.token_strides, P.token_strides, sizeof P.token_strides);
            iv.g.token_strides[d] += 1 + (fp >> 4);
        } else {
            iv.g.duration_grads = (void *)P.duration_logits;
            memcpy(iv.g.duration_strides, P.duration_strides, sizeof P.duration_strides);
            iv.g.duration_strides[d] += 1 + (fp >> 4);
        }
        post = TDT_STATUS_INVALID_STRIDES;
        break;
    }
    case F_WS_SMALL: iv.wsb = need - 1 - (size_t)(fp % 64); pre = TDT_STATUS_WORKSPACE_TOO_SMALL; break;
    case F_FLEN_RANGE:
        if (B == 0) break;
        W.flen[fp % B] = fp & 8 ? -1 - (fp >> 4) : (int32_t)T + 1 + (fp >> 4);
        pre = TDT_STATUS_INVALID_LENGTH;
        break;
    case F_LLEN_RANGE:
        if (B == 0) break;
        W.llen[fp % B] = fp & 8 ? -1 - (fp >> 4) : (int32_t)U + 1 + (fp >> 4);
        pre = TDT_STATUS_INVALID_LENGTH;
        break;
    case F_LABEL_RANGE:
        if (nonempty_label < 0) break;
        W.labels[nonempty_label * U + fp % W.llen[nonempty_label]] = fp & 1 ? -1 - (fp >> 1) : (int32_t)V + (fp >> 1);
        pre = TDT_STATUS_INVALID_LABEL;
        break;
    case F_LABEL_BLANK:
        if (nonempty_label < 0) break;
        W.labels[nonempty_label * U + fp % W.llen[nonempty_label]] = c->blank;
        pre = TDT_STATUS_INVALID_LABEL;
        break;
    case F_STRIDE_HUGE: {
        /* either certain to overflow int64 element offsets (refused), or on a dimension of
           extent <= 1, where the stride never multiplies a non-zero index (accepted); a
           huge stride that fits would describe memory the harness does not own */
        int d = fp % 3;
        if (W.E[d] > 1) {
            iv.p.token_strides[d] = W.E[d] == 2 ? INT64_MAX - fp % V /* + V - 1 > max */
                                                : INT64_MAX / (W.E[d] - 1) + 1 + (fp >> 2);
            pre = TDT_STATUS_INVALID_STRIDES;
        } else {
            iv.p.token_strides[d] = INT64_MAX - fp;
        }
        break;
    }
    case F_BWD_NO_FWD:
        if (c->kind == K_COSTS) break;
        if (c->kind == K_ONESHOT) c->kind = K_TWOPHASE;
        skip_forward = 1;
        post = grads_active ? TDT_STATUS_INVALID_WORKSPACE : TDT_STATUS_SUCCESS;
        break;
    case F_BWD_OTHER_FWD:
        /* the workspace holds the forward of the first B - 1 samples: refused on the CPU */
        if (c->kind == K_COSTS || B == 0) break;
        if (c->kind == K_ONESHOT) c->kind = K_TWOPHASE;
        iv.fwd_batch = B - 1;
        skip_forward = 2;
        post = grads_active ? TDT_STATUS_INVALID_WORKSPACE : TDT_STATUS_SUCCESS;
        break;
    case F_BATCH_HUGE:
        /* needs every per-sample pointer (an empty batch may have passed NULLs) */
        if (!P.token_logits || !P.frame_lengths || !P.label_lengths || !P.labels) break;
        iv.p.batch = (int64_t)1 << (61 - fp % 3);
        pre = TDT_STATUS_INVALID_SIZE;
        break;
    }
    /* faults read through c->durs / W.labels / W.flen / W.llen are already in place */
    if (tok_overlap || dur_overlap) post = TDT_STATUS_INVALID_STRIDES;
    else if ((W.g_weird || B * T == 0) && grads_active)
        alt_ok = 1; /* the library may refuse an interleaved, non-overlapping layout, and
                       judges the strides of an empty extent as if it were not empty */
    if (fault == F_BATCH_HUGE) alt_ok = 2; /* strides or workspace may overflow first */
    describe(&W);

    /* what the call must not change */
    unsigned char *in_tok0 = dup_mem(W.in_tok.mem, (size_t)W.in_tok.elems * esize(dt));
    unsigned char *in_dur0 = dup_mem(W.in_dur.mem, (size_t)W.in_dur.elems * esize(dt));
    unsigned char *g_tok0 = dup_mem(W.g_tok.mem, (size_t)W.g_tok.elems * esize(dt));
    unsigned char *g_dur0 = dup_mem(W.g_dur.mem, (size_t)W.g_dur.elems * esize(dt));
    unsigned char *costs0 = dup_mem(costs_mem, (size_t)(B + 2) * as);
    int32_t *lab0 = (int32_t *)dup_mem(W.labels, sizeof(int32_t) * (size_t)(B * U + 1));

    int phase = 0;
    const int kind = c->kind;
    s = invoke(kind, &iv, skip_forward == 1, &phase);
    REQUIRE(known_status(s), "call returned %d, not a tdt_status_t", (int)s);
    const char *err = tdt_last_error();
    REQUIRE(err != NULL, "tdt_last_error() NULL");
    tdt_status_t want = TDT_STATUS_SUCCESS;
    int pack_verdict = -1; /* tdt_check_data's verdict where it ran: check_pack's expectation */
    if (kind == K_ONESHOT) want = pre != TDT_STATUS_SUCCESS ? pre : post;
    else if (kind == K_COSTS) want = pre;
    else want = pre != TDT_STATUS_SUCCESS ? pre : post;
    /* a stride refusal preempts only the checks after the strides' (workspace, data), and
       only in a call that is passed the gradients */
    int stride_alt = alt_ok == 1 && (kind == K_ONESHOT || phase == 2) &&
                     (want == TDT_STATUS_SUCCESS || want == TDT_STATUS_WORKSPACE_TOO_SMALL ||
                      want == TDT_STATUS_INVALID_LENGTH || want == TDT_STATUS_INVALID_LABEL ||
                      want == TDT_STATUS_INVALID_WORKSPACE);
    int ok_alt = (stride_alt && s == TDT_STATUS_INVALID_STRIDES) ||
                 (alt_ok == 2 && (s == TDT_STATUS_WORKSPACE_TOO_SMALL || s == TDT_STATUS_INVALID_STRIDES));
    REQUIRE(s == want || ok_alt, "status %d (%s) but %d (%s) expected", (int)s,
            tdt_status_string(s), (int)want, tdt_status_string(want));
    if (s == TDT_STATUS_SUCCESS || s == TDT_STATUS_INVALID_LENGTH || s == TDT_STATUS_INVALID_LABEL) {
        /* the host-side check of lengths and labels agrees with the call, in the same words
           (it rewrites the thread's message with the same text, or clears an empty one) */
        char said[512];
        snprintf(said, sizeof said, "%s", err);
        const tdt_status_t d = tdt_check_data(&iv.p, &iv.o);
        REQUIRE(d == s, "tdt_check_data %d (%s) but the call %d (%s)", (int)d, tdt_status_string(d),
                (int)s, tdt_status_string(s));
        REQUIRE(strcmp(said, tdt_last_error()) == 0, "tdt_check_data says \"%s\", the call \"%s\"",
                tdt_last_error(), said);
        pack_verdict = d == TDT_STATUS_SUCCESS;
    }

    /* inputs never change (the in-place fault was refused, so it wrote nothing either) */
    REQUIRE(memcmp(in_tok0, W.in_tok.mem, (size_t)W.in_tok.elems * esize(dt)) == 0, "token logits modified");
    REQUIRE(memcmp(in_dur0, W.in_dur.mem, (size_t)W.in_dur.elems * esize(dt)) == 0, "duration logits modified");
    REQUIRE(memcmp(lab0, W.labels, sizeof(int32_t) * (size_t)(B * U)) == 0, "labels modified");
    (void)inplace_fault;

    if (s != TDT_STATUS_SUCCESS) {
        REQUIRE(err[0] != 0, "status %d without a tdt_last_error() message", (int)s);
        if (pack_verdict >= 0) check_pack(&iv.p, &iv.o, pack_verdict, (int)(B & 1)); /* clears it */
        /* nothing written: costs (unless the forward succeeded before a failing backward) and
           gradients */
        if (phase == 1) REQUIRE(memcmp(costs0, costs_mem, (size_t)(B + 2) * as) == 0, "costs written on failure");
        check_untouched(&W.g_tok, g_tok0, NULL, dt, "token gradient buffer after a failed call");
        if (!W.g_joint) check_untouched(&W.g_dur, g_dur0, NULL, dt, "duration gradient buffer after a failed call");
        goto cleanup;
    }
    REQUIRE(err[0] == 0, "SUCCESS but tdt_last_error() = \"%s\"", err);
    if (pack_verdict >= 0) check_pack(&iv.p, &iv.o, pack_verdict, (int)(B & 1));
    /* a fault that turned out harmless (RNN-T ignoring durations, empty tensors) is a
       valid call from here on; carry its options */
    O = iv.o;
    P = iv.p;
    if (skip_forward) goto cleanup; /* backward on a workspace not filled by this forward */

    {
        const int wrote_grads = kind != K_COSTS;
        /* guards and gaps keep their bytes; the RNN-T duration buffer is never touched */
        REQUIRE(memcmp(costs0, costs_mem, as) == 0 && memcmp(costs0 + (B + 1) * as, costs_mem + (B + 1) * as, as) == 0,
                "costs guard written");
        check_untouched(&W.g_tok, g_tok0, W.mask_tok, dt, "token gradient buffer");
        if (!W.g_joint) check_untouched(&W.g_dur, g_dur0, W.mask_dur, dt, "duration gradient buffer");
        check_success(&W, costs, wrote_grads);

        const size_t gt_bytes = (size_t)W.g_tok.elems * esize(dt), gd_bytes = (size_t)W.g_dur.elems * esize(dt);
        unsigned char *g_tok1 = dup_mem(W.g_tok.mem, gt_bytes), *g_dur1 = dup_mem(W.g_dur.mem, gd_bytes);
        unsigned char *costs1 = dup_mem(costs_mem, (size_t)(B + 2) * as);
        inv_t alt = iv;

        /* 1. another thread count: same bits */
        memcpy(W.g_tok.mem, g_tok0, gt_bytes);
        memcpy(W.g_dur.mem, g_dur0, gd_bytes);
        alt.o.num_threads = 1 + (c->threads + 1 + fp % 3) % 4;
        memset(costs_mem, 0xC3, (size_t)(B + 2) * as);
        s = invoke(kind, &alt, 0, &phase);
        REQUIRE(s == TDT_STATUS_SUCCESS, "rerun with %d threads: status %d", alt.o.num_threads, (int)s);
        REQUIRE(memcmp(costs1, costs_mem, (size_t)(B + 2) * as) == 0, "costs differ with %d threads", alt.o.num_threads);
        REQUIRE(memcmp(g_tok1, W.g_tok.mem, gt_bytes) == 0, "token gradients differ with %d threads", alt.o.num_threads);
        REQUIRE(memcmp(g_dur1, W.g_dur.mem, gd_bytes) == 0, "duration gradients differ with %d threads", alt.o.num_threads);

        /* a costs-only call (alpha alone on the CPU) leaves a workspace tdt_backward refuses
         * (INVALID_WORKSPACE, or an earlier status for this case's gradient layout, which a
         * costs-only call never checks); never a backward from a stale beta */
        if (kind == K_COSTS && B > 0 && (alt.g.token_grads || (c->tdt && alt.g.duration_grads))) {
            s = tdt_backward(&alt.p, &alt.o, NULL, &alt.g, alt.ws, alt.wsb);
            REQUIRE(known_status(s) && s != TDT_STATUS_SUCCESS,
                    "tdt_backward after a costs-only call: status %d", (int)s);
        }

        /* 2. the other call shape: forward + backward vs one-shot */
        alt.o.num_threads = c->threads;
        memcpy(W.g_tok.mem, g_tok0, gt_bytes);
        memcpy(W.g_dur.mem, g_dur0, gd_bytes);
        memset(costs_mem, 0xC3, (size_t)(B + 2) * as);
        int other = kind == K_ONESHOT ? K_TWOPHASE : kind == K_COSTS ? K_FORWARD : K_ONESHOT;
        s = invoke(other, &alt, 0, &phase);
        REQUIRE(s == TDT_STATUS_SUCCESS, "call shape %d after success of shape %d: status %d", other, kind, (int)s);
        REQUIRE(memcmp(costs1, costs_mem, (size_t)(B + 2) * as) == 0, "costs differ between call shapes %d and %d", kind, other);
        if (kind == K_ONESHOT || kind == K_TWOPHASE) {
            REQUIRE(memcmp(g_tok1, W.g_tok.mem, gt_bytes) == 0, "token gradients differ between one-shot and forward+backward");
            REQUIRE(memcmp(g_dur1, W.g_dur.mem, gd_bytes) == 0, "duration gradients differ between one-shot and forward+backward");
        } else if (kind == K_TWOPHASE_GC) {
            /* backward(g) == g * one-shot, within rounding of the dtype */
            for (int64_t b = 0; b < B; ++b)
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t u = 0; u < R; ++u) {
                        for (int64_t v = 0; c->want_tok && v < V; ++v) {
                            int64_t o = view_off(&W.gt, b, t, u) + v;
                            double x = get(g_tok1, o, dt), y = W.gc[b] * get(W.g_tok.mem, o, dt);
                            double e = dt == TDT_DTYPE_FLOAT64 ? 1e-15 : dt == TDT_DTYPE_FLOAT32 ? 3e-7 : dt == TDT_DTYPE_FLOAT16 ? 2e-3 : 1.6e-2;
                            REQUIRE(x == y || fabs(x - y) <= e * fabs(y) + (dt == TDT_DTYPE_FLOAT16 ? 6e-8 : dt == TDT_DTYPE_FLOAT64 ? 1e-300 : 2.4e-38) * (1.0 + fabs(W.gc[b])) || (x != x && y != y),
                                    "backward(grad_costs %g) token grad (%lld,%lld,%lld,%lld) = %.9g, g * one-shot = %.9g",
                                    W.gc[b], (long long)b, (long long)t, (long long)u, (long long)v, x, y);
                        }
                        for (int64_t k = 0; c->want_dur && c->tdt && k < D; ++k) {
                            int64_t o = view_off(&W.gd, b, t, u) + k;
                            double x = get(g_dur1, o, dt), y = W.gc[b] * get(W.g_dur.mem, o, dt);
                            double e = dt == TDT_DTYPE_FLOAT64 ? 1e-15 : dt == TDT_DTYPE_FLOAT32 ? 3e-7 : dt == TDT_DTYPE_FLOAT16 ? 2e-3 : 1.6e-2;
                            REQUIRE(x == y || fabs(x - y) <= e * fabs(y) + (dt == TDT_DTYPE_FLOAT16 ? 6e-8 : dt == TDT_DTYPE_FLOAT64 ? 1e-300 : 2.4e-38) * (1.0 + fabs(W.gc[b])) || (x != x && y != y),
                                    "backward(grad_costs %g) duration grad (%lld,%lld,%lld,%lld) = %.9g, g * one-shot = %.9g",
                                    W.gc[b], (long long)b, (long long)t, (long long)u, (long long)k, x, y);
                        }
                    }
        }

        /* 2c. on the CPU, tdt_forward_ahead is tdt_forward (it writes no gradient ahead); then
         * tdt_scale_gradients by grad_costs over the one-shot gradients step 2 left: each
         * element inside sample b's lattice times its factor (the accumulate type's value),
         * rounded once to the dtype; zeros, the rest of the extent, gaps and guards untouched */
        if (kind == K_TWOPHASE_GC && B > 0) {
            unsigned char *g_tok3 = dup_mem(W.g_tok.mem, gt_bytes), *g_dur3 = dup_mem(W.g_dur.mem, gd_bytes);
            int written = -1;
            memset(costs_mem, 0xC3, (size_t)(B + 2) * as);
            s = tdt_forward_ahead(&alt.p, &alt.o, alt.costs, alt.gc, &alt.g, alt.ws, alt.wsb, &written);
            REQUIRE(s == TDT_STATUS_SUCCESS && written == 0, "tdt_forward_ahead: status %d, grads_written %d",
                    (int)s, written);
            REQUIRE(memcmp(costs1, costs_mem, (size_t)(B + 2) * as) == 0, "costs differ: tdt_forward_ahead vs tdt_forward");
            REQUIRE(memcmp(g_tok3, W.g_tok.mem, gt_bytes) == 0 && memcmp(g_dur3, W.g_dur.mem, gd_bytes) == 0,
                    "tdt_forward_ahead wrote gradients on the CPU");
            s = tdt_scale_gradients(&alt.p, &alt.o, alt.gc, &alt.g);
            REQUIRE(s == TDT_STATUS_SUCCESS, "tdt_scale_gradients: status %d", (int)s);
            check_untouched(&W.g_tok, g_tok3, W.mask_tok, dt, "token gradient buffer after tdt_scale_gradients");
            if (!W.g_joint) check_untouched(&W.g_dur, g_dur3, W.mask_dur, dt, "duration gradient buffer after tdt_scale_gradients");
            for (int64_t b = 0; b < B; ++b) {
                const double f = cost_at(alt.gc, b, dt);
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t u = 0; u < R; ++u) {
                        const int inside = t < W.flen[b] && u <= W.llen[b];
                        for (int k = 0; k < 2; ++k) {
                            const int64_t n = k ? (c->want_dur && c->tdt ? D : 0) : (c->want_tok ? V : 0);
                            const view_t *vw = k ? &W.gd : &W.gt;
                            const unsigned char *before = k ? g_dur3 : g_tok3;
                            const unsigned char *now = k ? W.g_dur.mem : W.g_tok.mem;
                            for (int64_t e = 0; e < n; ++e) {
                                const int64_t o = view_off(vw, b, t, u) + e;
                                const double x = get(before, o, dt), y = get(now, o, dt);
                                double want = x;
                                if (inside && x != 0.0) {
                                    double cell = 0.0; /* x * f rounded once (through float, as the library does) */
                                    put(&cell, 0, dt, dt == TDT_DTYPE_FLOAT64 ? x * f : (double)(float)(x * f));
                                    want = get(&cell, 0, dt);
                                }
                                REQUIRE((want == y && signbit(want) == signbit(y)) || (want != want && y != y),
                                        "tdt_scale_gradients(%g): %s grad (%lld,%lld,%lld,%lld) = %.9g, want %.9g (was %.9g)",
                                        f, k ? "duration" : "token", (long long)b, (long long)t, (long long)u,
                                        (long long)e, y, want, x);
                            }
                        }
                    }
            }
            free(g_tok3);
            free(g_dur3);
        }

        /* 2b. options.grad_costs_scalar: one upstream value for every sample gives the bits of
         * that value repeated in a (B) array */
        if (kind == K_TWOPHASE_GC && B > 0 && c->want_tok + c->want_dur > 0) {
            unsigned char *rep = (unsigned char *)malloc((size_t)B * as);
            REQUIRE(rep != NULL, "out of memory");
            for (int64_t b = 0; b < B; ++b) memcpy(rep + b * as, iv.gc, as);
            inv_t sc = alt;
            sc.gc = rep;
            memcpy(W.g_tok.mem, g_tok0, gt_bytes);
            memcpy(W.g_dur.mem, g_dur0, gd_bytes);
            s = invoke(K_TWOPHASE_GC, &sc, 0, &phase);
            REQUIRE(s == TDT_STATUS_SUCCESS, "grad_costs repeated: status %d", (int)s);
            unsigned char *g_tok2 = dup_mem(W.g_tok.mem, gt_bytes), *g_dur2 = dup_mem(W.g_dur.mem, gd_bytes);
            sc.gc = iv.gc; /* its first value */
            sc.o.grad_costs_scalar = 1 + (int)(fp & 7);
            memcpy(W.g_tok.mem, g_tok0, gt_bytes);
            memcpy(W.g_dur.mem, g_dur0, gd_bytes);
            s = invoke(K_TWOPHASE_GC, &sc, 0, &phase);
            REQUIRE(s == TDT_STATUS_SUCCESS, "grad_costs_scalar: status %d", (int)s);
            REQUIRE(memcmp(g_tok2, W.g_tok.mem, gt_bytes) == 0, "token gradients differ: grad_costs_scalar vs the value repeated");
            REQUIRE(memcmp(g_dur2, W.g_dur.mem, gd_bytes) == 0, "duration gradients differ: grad_costs_scalar vs the value repeated");
            free(g_tok2);
            free(g_dur2);
            free(rep);
        }

        /* 3. each sample alone gives the bits it had in the batch */
        /* (an empty extent has no rows to offset into: pointers past it could alias) */
        for (int64_t b = 0; B > 1 && T > 0 && b < B; ++b) {
            inv_t one = iv;
            memcpy(W.g_tok.mem, g_tok0, gt_bytes);
            memcpy(W.g_dur.mem, g_dur0, gd_bytes);
            memset(costs_mem, 0xC3, (size_t)(B + 2) * as);
            one.p.batch = 1;
            if (one.p.token_logits)
                one.p.token_logits = (const char *)one.p.token_logits + b * W.vt.s[0] * (int64_t)esize(dt);
            if (one.p.duration_logits)
                one.p.duration_logits = (const char *)one.p.duration_logits + b * W.vd.s[0] * (int64_t)esize(dt);
            if (one.p.labels) one.p.labels += b * U;
            one.p.frame_lengths += b;
            one.p.label_lengths += b;
            if (one.g.token_grads) one.g.token_grads = (char *)one.g.token_grads + b * W.gt.s[0] * (int64_t)esize(dt);
            if (one.g.duration_grads) one.g.duration_grads = (char *)one.g.duration_grads + b * W.gd.s[0] * (int64_t)esize(dt);
            one.gc = (char *)gcbuf + b * (int64_t)as;
            size_t need1 = 0;
            REQUIRE(tdt_get_workspace_size(&one.p, &one.o, &need1) == TDT_STATUS_SUCCESS && need1 <= need, "ws size of one sample");
            one.wsb = need1;
            s = invoke(kind, &one, 0, &phase);
            REQUIRE(s == TDT_STATUS_SUCCESS, "sample %lld alone: status %d", (long long)b, (int)s);
            REQUIRE(memcmp(costs_mem + as, costs1 + (b + 1) * as, as) == 0, "sample %lld alone: cost %.17g, in the batch %.17g",
                    (long long)b, cost_at(costs_mem + as, 0, dt), cost_at(costs1 + as, b, dt));
            size_t es = esize(dt);
            for (int64_t t = 0; kind != K_COSTS && t < T; ++t)
                for (int64_t u = 0; u < R; ++u) {
                    if (c->want_tok) {
                        int64_t o = view_off(&W.gt, b, t, u);
                        REQUIRE(memcmp(W.g_tok.mem + o * es, g_tok1 + o * es, (size_t)V * es) == 0,
                                "sample %lld alone: token gradient row (%lld,%lld) differs from the batch run",
                                (long long)b, (long long)t, (long long)u);
                    }
                    if (c->want_dur && c->tdt) {
                        int64_t o = view_off(&W.gd, b, t, u);
                        REQUIRE(memcmp(W.g_dur.mem + o * es, g_dur1 + o * es, (size_t)D * es) == 0,
                                "sample %lld alone: duration gradient row (%lld,%lld) differs from the batch run",
                                (long long)b, (long long)t, (long long)u);
                    }
                }
        }

        /* 4. in place: gradients written over a copy of the logits equal the out-of-place ones */
        if (W.g_inplace && kind != K_COSTS && P.token_logits != NULL) {
            unsigned char *lt = dup_mem(W.in_tok.mem, (size_t)W.in_tok.elems * esize(dt));
            unsigned char *ld = W.in_joint ? lt : dup_mem(W.in_dur.mem, (size_t)W.in_dur.elems * esize(dt));
            inv_t ip = iv;
            ip.p.token_logits = lt + W.vt.base * (int64_t)esize(dt);
            if (c->tdt) ip.p.duration_logits = ld + W.vd.base * (int64_t)esize(dt);
            ip.g.token_grads = c->want_tok ? (void *)ip.p.token_logits : NULL;
            ip.g.duration_grads = c->want_dur && c->tdt ? (void *)ip.p.duration_logits : NULL;
            memcpy(ip.g.token_strides, ip.p.token_strides, sizeof ip.p.token_strides);
            memcpy(ip.g.duration_strides, ip.p.duration_strides, sizeof ip.p.duration_strides);
            memset(costs_mem, 0xC3, (size_t)(B + 2) * as);
            s = invoke(kind, &ip, 0, &phase);
            REQUIRE(s == TDT_STATUS_SUCCESS, "in place: status %d", (int)s);
            REQUIRE(memcmp(costs1, costs_mem, (size_t)(B + 2) * as) == 0, "in place: costs differ");
            /* the out-of-place buffers started as copies of the logits, so where nothing is
               requested both hold the logits */
            REQUIRE(memcmp(lt, g_tok1, gt_bytes) == 0, "in place: token gradient buffer differs from out of place");
            if (!W.in_joint && c->tdt) {
                REQUIRE(memcmp(ld, g_dur1, gd_bytes) == 0, "in place: duration gradient buffer differs from out of place");
            }
            if (ld != lt) free(ld);
            free(lt);
        }

        /* 5. options.state_in_grads: the one-shot call with the per-node state at the head of
         * each token-gradient row, in the smaller workspace it asks for, gives the bits of step
         * 1 (kinds whose gradients are the one-shot's); refused with INVALID_OPTION, nothing
         * written, where the call has no token gradient or a row cannot hold a node's block */
        if ((kind == K_ONESHOT || kind == K_TWOPHASE) && B > 0 && T > 0) {
            inv_t st = iv;
            st.o.state_in_grads = 1;
            size_t need_st = 0;
            REQUIRE(tdt_get_workspace_size(&st.p, &st.o, &need_st) == TDT_STATUS_SUCCESS && need_st < need,
                    "state_in_grads: workspace size %zu, without it %zu", need_st, need);
            st.wsb = need_st;
            const int64_t es = (int64_t)esize(dt), blk = 8 * (3 + (c->tdt ? D : 0));
            const int ok = st.pass_grads && st.g.token_grads != NULL && V * es >= blk + (es < 8 ? 8 - es : 0);
            memcpy(W.g_tok.mem, g_tok0, gt_bytes);
            memcpy(W.g_dur.mem, g_dur0, gd_bytes);
            memset(costs_mem, 0xC3, (size_t)(B + 2) * as);
            s = invoke(K_ONESHOT, &st, 0, &phase);
            if (ok) {
                REQUIRE(s == TDT_STATUS_SUCCESS, "state_in_grads: status %d (%s)", (int)s, tdt_status_string(s));
                REQUIRE(memcmp(costs1, costs_mem, (size_t)(B + 2) * as) == 0, "state_in_grads: costs differ");
                REQUIRE(memcmp(g_tok1, W.g_tok.mem, gt_bytes) == 0, "state_in_grads: token gradients differ");
                REQUIRE(memcmp(g_dur1, W.g_dur.mem, gd_bytes) == 0, "state_in_grads: duration gradients differ");
            } else {
                REQUIRE(s == TDT_STATUS_INVALID_OPTION && strstr(tdt_last_error(), "state_in_grads") != NULL,
                        "state_in_grads without a row to hold it: status %d", (int)s);
                for (size_t i = 0; i < (size_t)(B + 2) * as; ++i)
                    REQUIRE(costs_mem[i] == 0xC3, "state_in_grads refused but costs written");
                check_untouched(&W.g_tok, g_tok0, NULL, dt, "token gradient buffer after a refused state_in_grads");
                if (!W.g_joint)
                    check_untouched(&W.g_dur, g_dur0, NULL, dt, "duration gradient buffer after a refused state_in_grads");
            }
        }
        free(g_tok1);
        free(g_dur1);
        free(costs1);
    }

cleanup:
    free(in_tok0);
    free(in_dur0);
    free(g_tok0);
    free(g_dur0);
    free(costs0);
    free(lab0);
    free(costs_mem);
    free(gcbuf);
    free(ws_mem);
    free(W.mask_tok);
    if (!W.g_joint) free(W.mask_dur);
    free(W.tok);
    free(W.dur);
    free(W.in_tok.mem);
    if (!W.in_joint) free(W.in_dur.mem);
    free(W.g_tok.mem);
    if (!W.g_joint) free(W.g_dur.mem);
    free(W.flen);
    free(W.llen);
    free(W.labels);
    return 0;
}
