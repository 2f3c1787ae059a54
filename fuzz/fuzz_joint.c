/*
 * fuzz_joint.c - libFuzzer target over the fused joint + loss (tdt_joint_*, CPU backend).
 *
 * The input is decoded into one joint call on small shapes (bytes past the end come from a PRNG
 * seeded by the input):
 *
 *   byte 0  flags: bit 0 TDT (else RNN-T), bit 1 forward + backward (else tdt_joint_loss),
 *           bits 2-3 activation, bit 4 dropout, bit 5 no bias, bit 6 inject a fault,
 *           bit 7 random upstream gradients (with bit 1)
 *   byte 1  dtype (mod 4)      byte 2 B (mod 4)      byte 3 max_frames (mod 7)
 *   byte 4  max_labels (mod 5) byte 5 V - 1 (mod 9)  byte 6 H - 1 (mod 40)
 *   byte 7  blank (mod V)      byte 8 D - 1 (mod 4), then D duration bytes (mod 7, made distinct)
 *   next    options: bits 0-1 sigma, 2-3 FastEmit, 4-5 clamp, 6 reduction sum, 7 weight padding
 *   next    num_threads (1 + mod 3)   next  which gradients (bits 0-3: enc, pred, W, bias off;
 *           bits 4-5: skip_below 0, 1e-6, 1e-3 or 0.1)
 *   next    fault number and parameter (with bit 6)
 *   next    per sample: frame length, label length; then labels
 *   then    values: int8 / 16 times a scale (enc, pred, W, bias), upstream gradients
 *
 * Checked, abort() with a message on any violation:
 *   - an injected fault gives its status, tdt_last_error() set, and nothing written;
 *   - SUCCESS: costs finite or exactly +inf (then that sample's d enc / d pred exactly 0); no
 *     NaN or inf in any gradient; the costs and the four gradients agree with the naive
 *     float64 reference (fuzz/naive_ref.c's loss of the joint's logits computed here, the chain
 *     rule here): 1e-9 relative for float64, a dtype tolerance otherwise, plus a rounding bound
 *     for sums that cancel (outs_t below), plus skip_below's bound (eps times the sum over
 *     every node of |W|, |h| or 1: the nodes left out are a subset);
 *   - the same bits for 1 thread and for num_threads, and for the one-shot call and the pair;
 *   - the inputs are left unchanged (ASan catches any access out of the exact-size buffers).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "halfconv.h"
#include "naive_ref.h"
#include "tdt.h"

static void violation(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "VIOLATION: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* ---- input bytes ------------------------------------------------------------------------------- */

typedef struct src {
    const uint8_t *p;
    size_t n, i;
    uint64_t s;
} src_t;

static uint8_t byte(src_t *r) {
    if (r->i < r->n) return r->p[r->i++];
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (uint8_t)(r->s >> 24);
}

/* ---- dtypes --------------------------------------------------------------------------------------- */

static size_t esz(tdt_dtype_t d) { return d == TDT_DTYPE_FLOAT64 ? 8 : d == TDT_DTYPE_FLOAT32 ? 4 : 2; }

static double q(double x, tdt_dtype_t d) { /* x rounded to d */
    switch (d) {
    case TDT_DTYPE_FLOAT32: return (float)x;
    case TDT_DTYPE_FLOAT16: return hc_h2d(hc_d2h(x));
    case TDT_DTYPE_BFLOAT16: return hc_bf2d(hc_d2bf(x));
    default: return x;
    }
}

static void put(void *p, size_t i, tdt_dtype_t d, double x) {
    switch (d) {
    case TDT_DTYPE_FLOAT64: ((double *)p)[i] = x; break;
    case TDT_DTYPE_FLOAT32: ((float *)p)[i] = (float)x; break;
    case TDT_DTYPE_FLOAT16: ((uint16_t *)p)[i] = hc_d2h(x); break;
    default: ((uint16_t *)p)[i] = hc_d2bf(x); break;
    }
}

static double get(const void *p, size_t i, tdt_dtype_t d) {
    switch (d) {
    case TDT_DTYPE_FLOAT64: return ((const double *)p)[i];
    case TDT_DTYPE_FLOAT32: return ((const float *)p)[i];
    case TDT_DTYPE_FLOAT16: return hc_h2d(((const uint16_t *)p)[i]);
    default: return hc_bf2d(((const uint16_t *)p)[i]);
    }
}

/* ---- the reference: joint here, loss by naive_ref, chain rule here --------------------------------- */

static double act(double x, int a) {
    return a == TDT_ACTIVATION_RELU ? (x > 0 ? x : 0) : a == TDT_ACTIVATION_TANH ? tanh(x)
           : a == TDT_ACTIVATION_SIGMOID ? 1 / (1 + exp(-x)) : x;
}

static double dact(double x, int a) {
    if (a == TDT_ACTIVATION_RELU) return x > 0 ? 1 : 0;
    if (a == TDT_ACTIVATION_TANH) return 1 - tanh(x) * tanh(x);
    if (a == TDT_ACTIVATION_SIGMOID) {
        const double s = 1 / (1 + exp(-x));
        return s * (1 - s);
    }
    return 1;
}

typedef struct prob {
    int64_t B, T, U, V, H, O, ldw;
    int D, durations[8], blank, activation, tdt;
    double dropout, sigma, fastemit, clamp;
    uint64_t seed, offset;
    tdt_dtype_t dt;
    double *enc, *pred, *W, *bias; /* float64 values (already rounded to dt) */
    int has_bias;
    int32_t *labels, *Ts, *Us;
    double *gc;                    /* upstream gradients (B), or NULL for ones */
    double skip_below;             /* tdt_joint_gradients_t.skip_below */
} prob_t;

/* The reference's values, and per value the scale of its rounding error in the library's
 * accumulation dtype. A float32 gradient of a saturated sample (one path of probability ~1) is a
 * sum of terms that cancel exactly: p - 1 at the path's outputs, with p = exp(z - lse). Its
 * rounding error is not relative to the (tiny) result but to the logits' own size: z - lse is
 * off by about eps * (T + U + 1) * zabs, where zabs bounds |W h| + |bias| term by term, and that
 * error reaches the gradient through sum |W| (or |h|) over the nodes that hold it. So each
 * gradient's error bound is eps times its mag[]: the sum over its nodes of
 * |g| * 2 (1 + FastEmit) * zabs * (T + U + 1) times sum |W| (d enc, d pred), |h| (d W) or 1 (d bias),
 * with the node's sample's zabs, T and U; a cost's is eps * zabs * (T + U + 1). */
typedef struct outs {
    double *costs, *denc, *dpred, *dW, *dbias;
    double *cost_err, *denc_mag, *dpred_mag, *dW_mag, *dbias_mag;
    double *denc_skip, *dpred_skip, *dW_skip, *dbias_skip; /* skip_below's bound over eps */
} outs_t;

static void reference(const prob_t *p, outs_t *o) {
    const int64_t H = p->H, O = p->O, R = p->U + 1;
    double *h = malloc(sizeof(double) * (size_t)(p->T * R * H)), *m = malloc(sizeof(double) * (size_t)(p->T * R * H));
    double *tok = malloc(sizeof(double) * (size_t)(p->T * R * p->V + 1)), *dur = malloc(sizeof(double) * (size_t)(p->T * R * (p->D + 1)));
    double *gt = malloc(sizeof(double) * (size_t)(p->T * R * p->V + 1)), *gd = malloc(sizeof(double) * (size_t)(p->T * R * (p->D + 1)));
    uint8_t *keep = malloc((size_t)H);
    memset(o->denc, 0, sizeof(double) * (size_t)(p->B * p->T * H));
    memset(o->dpred, 0, sizeof(double) * (size_t)(p->B * R * H));
    memset(o->dW, 0, sizeof(double) * (size_t)(O * H));
    memset(o->dbias, 0, sizeof(double) * (size_t)O);
    memset(o->denc_mag, 0, sizeof(double) * (size_t)(p->B * p->T * H));
    memset(o->dpred_mag, 0, sizeof(double) * (size_t)(p->B * R * H));
    memset(o->dW_mag, 0, sizeof(double) * (size_t)(O * H));
    memset(o->dbias_mag, 0, sizeof(double) * (size_t)O);
    memset(o->denc_skip, 0, sizeof(double) * (size_t)(p->B * p->T * H));
    memset(o->dpred_skip, 0, sizeof(double) * (size_t)(p->B * R * H));
    memset(o->dW_skip, 0, sizeof(double) * (size_t)(O * H));
    memset(o->dbias_skip, 0, sizeof(double) * (size_t)O);
    nref_config_t cfg = {p->V, p->blank, p->tdt ? p->durations : NULL, p->tdt ? p->D : 0, p->sigma, p->fastemit, p->clamp, 0};
    for (int64_t b = 0; b < p->B; ++b) {
        const int64_t T = p->Ts[b], U = p->Us[b];
        double zabs = 1;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u <= U; ++u) {
                const int64_t n = t * R + u;
                const uint64_t c0 = p->offset + (uint64_t)(((b * p->T + t) * R + u) * H);
                if (p->dropout > 0 && tdt_joint_dropout_mask(p->dropout, p->seed, c0, H, keep) != TDT_STATUS_SUCCESS)
                    violation("tdt_joint_dropout_mask failed: %s", tdt_last_error());
                for (int64_t k = 0; k < H; ++k) {
                    const double x = p->enc[(b * p->T + t) * H + k] + p->pred[(b * R + u) * H + k];
                    m[n * H + k] = p->dropout > 0 ? (keep[k] ? 1.0 / (1.0 - p->dropout) : 0.0) : 1.0;
                    h[n * H + k] = act(x, p->activation) * m[n * H + k];
                }
                for (int64_t oo = 0; oo < O; ++oo) {
                    double s = p->bias[oo], sa = fabs(p->bias[oo]);
                    for (int64_t k = 0; k < H; ++k) {
                        s += p->W[oo * p->ldw + k] * h[n * H + k];
                        sa += fabs(p->W[oo * p->ldw + k] * h[n * H + k]);
                    }
                    zabs = fmax(zabs, sa);
                    if (oo < p->V)
                        tok[(t * (U + 1) + u) * p->V + oo] = s;
                    else
                        dur[(t * (U + 1) + u) * p->D + (oo - p->V)] = s;
                }
            }
        nref_result_t r;
        const double g = p->gc ? p->gc[b] : 1.0;
        if (nref_sample(&cfg, T, U, p->labels + b * p->U, tok, dur, g, &r, gt, p->tdt ? gd : NULL) != 0) abort();
        o->costs[b] = r.cost;
        const double steps = (double)(T + U + 1), w = 2 * fabs(g) * (1 + p->fastemit) * zabs * steps;
        o->cost_err[b] = zabs * steps;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u <= U; ++u) {
                const int64_t n = t * R + u, nn = t * (U + 1) + u;
                for (int64_t oo = 0; oo < O; ++oo) {
                    const double e = oo < p->V ? gt[nn * p->V + oo] : gd[nn * p->D + (oo - p->V)];
                    o->dbias[oo] += e;
                    o->dbias_mag[oo] += w;
                    o->dbias_skip[oo] += 1;
                    for (int64_t k = 0; k < H; ++k) {
                        o->dW[oo * H + k] += e * h[n * H + k];
                        o->dW_mag[oo * H + k] += w * fabs(h[n * H + k]);
                        o->dW_skip[oo * H + k] += fabs(h[n * H + k]);
                    }
                }
                for (int64_t k = 0; k < H; ++k) {
                    double dh = 0, wabs = 0;
                    for (int64_t oo = 0; oo < O; ++oo) {
                        dh += (oo < p->V ? gt[nn * p->V + oo] : gd[nn * p->D + (oo - p->V)]) * p->W[oo * p->ldw + k];
                        wabs += fabs(p->W[oo * p->ldw + k]);
                    }
                    const double x = p->enc[(b * p->T + t) * H + k] + p->pred[(b * R + u) * H + k];
                    const double da = dact(x, p->activation) * m[n * H + k];
                    o->denc[(b * p->T + t) * H + k] += dh * da;
                    o->dpred[(b * R + u) * H + k] += dh * da;
                    o->denc_mag[(b * p->T + t) * H + k] += w * wabs * fabs(da);
                    o->dpred_mag[(b * R + u) * H + k] += w * wabs * fabs(da);
                    o->denc_skip[(b * p->T + t) * H + k] += wabs * fabs(da);
                    o->dpred_skip[(b * R + u) * H + k] += wabs * fabs(da);
                }
            }
    }
    free(h);
    free(m);
    free(tok);
    free(dur);
    free(gt);
    free(gd);
    free(keep);
}

/* ---- the library call ----------------------------------------------------------------------------- */

typedef struct lib {
    void *enc, *pred, *W, *bias, *costs, *genc, *gpred, *gW, *gbias, *gc, *ws, *reduced;
    size_t bytes, n_enc, n_pred, n_W, n_b;
    tdt_joint_problem_t jp;
    tdt_joint_gradients_t g;
    tdt_options_t o;
} lib_t;

static void lib_setup(const prob_t *p, int threads, int want, lib_t *L) {
    const tdt_dtype_t d = p->dt;
    const int64_t R = p->U + 1;
    memset(L, 0, sizeof *L);
    L->n_enc = (size_t)(p->B * p->T * p->H);
    L->n_pred = (size_t)(p->B * R * p->H);
    L->n_W = (size_t)(p->O * p->ldw);
    L->n_b = (size_t)p->O;
    L->enc = malloc(L->n_enc * esz(d) + 1);
    L->pred = malloc(L->n_pred * esz(d) + 1);
    L->W = malloc(L->n_W * esz(d) + 1);
    L->bias = malloc(L->n_b * esz(d));
    for (size_t i = 0; i < L->n_enc; ++i) put(L->enc, i, d, p->enc[i]);
    for (size_t i = 0; i < L->n_pred; ++i) put(L->pred, i, d, p->pred[i]);
    for (size_t i = 0; i < L->n_W; ++i) put(L->W, i, d, p->W[i]);
    for (size_t i = 0; i < L->n_b; ++i) put(L->bias, i, d, p->bias[i]);
    const size_t acc = d == TDT_DTYPE_FLOAT64 ? 8 : 4;
    L->costs = malloc((size_t)p->B * acc + 1);
    L->reduced = malloc(acc);
    L->gc = malloc((size_t)p->B * acc + 1);
    for (int64_t b = 0; b < p->B; ++b) {
        if (acc == 8) ((double *)L->gc)[b] = p->gc ? p->gc[b] : 1.0;
        else ((float *)L->gc)[b] = (float)(p->gc ? p->gc[b] : 1.0);
    }
    L->genc = (want & 1) ? malloc(L->n_enc * esz(d) + 1) : NULL;
    L->gpred = (want & 2) ? malloc(L->n_pred * esz(d) + 1) : NULL;
    L->gW = (want & 4) ? malloc(L->n_W * esz(d) + 1) : NULL;
    L->gbias = (want & 8) ? malloc(L->n_b * esz(d)) : NULL;
    tdt_joint_problem_t *jp = &L->jp;
    jp->batch = p->B;
    jp->max_frames = p->T;
    jp->max_labels = p->U;
    jp->vocab_size = p->V;
    jp->hidden = p->H;
    jp->num_outputs = p->O;
    jp->dtype = d;
    jp->enc = L->enc;
    jp->enc_strides[0] = p->T * p->H;
    jp->enc_strides[1] = p->H;
    jp->pred = L->pred;
    jp->pred_strides[0] = R * p->H;
    jp->pred_strides[1] = p->H;
    jp->weight = L->W;
    jp->weight_stride = p->ldw;
    jp->bias = p->has_bias ? L->bias : NULL;
    jp->activation = (tdt_activation_t)p->activation;
    jp->dropout = p->dropout;
    jp->dropout_seed = p->seed;
    jp->dropout_offset = p->offset;
    jp->labels = p->labels;
    jp->frame_lengths = p->Ts;
    jp->label_lengths = p->Us;
    L->g.enc_grad = L->genc;
    memcpy(L->g.enc_strides, jp->enc_strides, sizeof L->g.enc_strides);
    L->g.pred_grad = L->gpred;
    memcpy(L->g.pred_strides, jp->pred_strides, sizeof L->g.pred_strides);
    L->g.weight_grad = L->gW;
    L->g.weight_stride = p->ldw;
    L->g.bias_grad = L->gbias;
    L->g.skip_below = p->skip_below;
    L->o.num_threads = threads;
    L->o.blank = p->blank;
    L->o.durations = p->durations;
    L->o.num_durations = p->D;
    L->o.sigma = p->sigma;
    L->o.fastemit_lambda = p->fastemit;
    L->o.clamp = p->clamp;
    if (tdt_joint_get_workspace_size(jp, &L->o, &L->bytes) != TDT_STATUS_SUCCESS)
        violation("tdt_joint_get_workspace_size failed: %s", tdt_last_error());
    L->ws = malloc(L->bytes);
}

static void lib_free(lib_t *L) {
    void *ps[] = {L->enc, L->pred, L->W, L->bias, L->costs, L->genc, L->gpred, L->gW, L->gbias, L->gc, L->ws, L->reduced};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; ++i) free(ps[i]);
}

static tdt_status_t lib_call(lib_t *L, int pair, int with_gc) {
    if (!pair) return tdt_joint_loss(&L->jp, &L->o, L->costs, &L->g, L->ws, L->bytes);
    tdt_status_t s = tdt_joint_forward(&L->jp, &L->o, L->costs, L->ws, L->bytes);
    if (s != TDT_STATUS_SUCCESS) return s;
    return tdt_joint_backward(&L->jp, &L->o, with_gc ? L->gc : NULL, &L->g, L->ws, L->bytes);
}

/* ---- comparisons ------------------------------------------------------------------------------------ */

/* |got - want| <= tol (1 + max |want|) + eps * mag + skip * skipmag (outs_t says why) */
static void compare(const char *what, const void *got, const double *want, const double *mag, const double *skipmag,
                    double skip, size_t n, tdt_dtype_t d, double tol, double eps) {
    double scale = 0;
    for (size_t i = 0; i < n; ++i) scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; ++i) {
        const double x = get(got, i, d);
        if (!isfinite(x)) violation("%s[%zu] = %g is not finite", what, i, x);
        const double err = eps * mag[i] + skip * skipmag[i] * (1 + 1e-9);
        if (fabs(x - want[i]) > tol * (1.0 + scale) + err)
            violation("%s[%zu] = %.17g, reference %.17g (scale %g, tolerance %g, rounding bound %g, dtype %d)", what, i, x,
                      want[i], scale, tol, err, (int)d);
    }
}

static void same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    if (a && b && memcmp(a, b, bytes) != 0) violation("%s differs between thread counts or call forms", what);
}

/* ---- faults ---------------------------------------------------------------------------------------- */

enum { NUM_FAULTS = 13 };

/* spoils L (a fresh setup) with fault f for a one-shot call or the pair; returns the status the
 * call must give */
static tdt_status_t inject(lib_t *L, int f, uint8_t param, int pair) {
    switch (f) {
    case 0: L->jp.hidden = 0; return TDT_STATUS_INVALID_SIZE;
    case 1: /* RNN-T (no durations): a TDT size without durations */
        L->jp.num_outputs += 1 + param % 3;
        return L->o.num_durations ? TDT_STATUS_INVALID_SIZE : TDT_STATUS_TOO_MANY_DURATIONS;
    case 2: L->jp.activation = (tdt_activation_t)(4 + param % 10); return TDT_STATUS_INVALID_OPTION;
    case 3: L->jp.dropout = param % 2 ? 1.0 : -0.25; return TDT_STATUS_INVALID_OPTION;
    case 4: L->jp.enc_strides[1] = -1 - param % 4; return TDT_STATUS_INVALID_STRIDES;
    case 5: L->jp.weight_stride = L->jp.hidden - 1; return TDT_STATUS_INVALID_STRIDES;
    case 6: L->jp.weight = NULL; return L->jp.batch > 0 && L->jp.max_frames > 0 ? TDT_STATUS_NULL_POINTER : TDT_STATUS_SUCCESS;
    case 7: L->bytes -= 1 + param % 8; return TDT_STATUS_WORKSPACE_TOO_SMALL;
    case 8: L->jp.dtype = (tdt_dtype_t)(4 + param % 4); return TDT_STATUS_INVALID_DTYPE;
    case 9: L->o.input_kind = TDT_INPUT_LOG_PROBS; return TDT_STATUS_INVALID_OPTION;
    case 10: L->o.blank = (int)L->jp.vocab_size + param % 3; return TDT_STATUS_INVALID_BLANK;
    case 11: /* the pair's forward would write its costs before the backward refuses it */
        if (pair) return TDT_STATUS_SUCCESS;
        L->g.skip_below = param % 3 == 0 ? -1e-3 : param % 3 == 1 ? NAN : INFINITY;
        return TDT_STATUS_INVALID_OPTION;
    default: L->jp.pred_strides[0] = INT64_MAX / 2 + 1; return L->jp.batch > 1 ? TDT_STATUS_INVALID_STRIDES : TDT_STATUS_SUCCESS;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    src_t r = {data, size, 0, 0x9e3779b97f4a7c15ull ^ size};
    for (size_t i = 0; i < size && i < 64; ++i) r.s = r.s * 31 + data[i] + 1;
    prob_t p;
    memset(&p, 0, sizeof p);
    const uint8_t flags = byte(&r);
    p.tdt = flags & 1;
    const int pair = (flags >> 1) & 1, fault = (flags >> 6) & 1, with_gc = pair && (flags >> 7);
    p.activation = (flags >> 2) & 3;
    p.dropout = (flags >> 4) & 1 ? 0.25 : 0.0;
    p.has_bias = !((flags >> 5) & 1);
    p.dt = (tdt_dtype_t)(byte(&r) % 4);
    p.B = byte(&r) % 4;
    p.T = byte(&r) % 7;
    p.U = byte(&r) % 5;
    p.V = 1 + byte(&r) % 9;
    p.H = 1 + byte(&r) % 40;
    p.blank = (int)(byte(&r) % p.V);
    if (p.V == 1) p.U = p.U ? p.U : 0;
    const int D = 1 + byte(&r) % 4;
    for (int k = 0; k < D; ++k) {
        int v = byte(&r) % 7;
        for (int j = 0; j < k; ++j)
            if (p.durations[j] == v) v = (v + 1) % 7, j = -1;
        p.durations[k] = v;
    }
    int any_pos = 0;
    for (int k = 0; k < D; ++k) any_pos |= p.durations[k] > 0;
    if (!any_pos) p.durations[0] = 7; /* distinct: the others are < 7 */
    p.D = p.tdt ? D : 0;
    p.O = p.V + p.D;
    const uint8_t ob = byte(&r);
    const double sig[4] = {0, 0.05, 0.5, 0}, fe[4] = {0, 0.01, 0.5, 0}, cl[4] = {0, 0.1, 1.0, 0};
    p.sigma = sig[ob & 3];
    p.fastemit = fe[(ob >> 2) & 3];
    p.clamp = cl[(ob >> 4) & 3];
    p.ldw = p.H + ((ob >> 7) ? 3 : 0);
    const int threads = 1 + byte(&r) % 3;
    const uint8_t wb = byte(&r);
    const int want = 15 & ~wb;
    const double skips[4] = {0, 1e-6, 1e-3, 0.1};
    p.skip_below = skips[(wb >> 4) & 3];
    const int fnum = byte(&r) % NUM_FAULTS;
    const uint8_t fparam = byte(&r);
    p.seed = (uint64_t)byte(&r) << 8 | byte(&r);
    p.offset = (uint64_t)byte(&r) * 1000003u;
    p.Ts = malloc(sizeof(int32_t) * (size_t)(p.B + 1));
    p.Us = malloc(sizeof(int32_t) * (size_t)(p.B + 1));
    p.labels = malloc(sizeof(int32_t) * (size_t)(p.B * p.U + 1));
    for (int64_t b = 0; b < p.B; ++b) {
        p.Ts[b] = (int32_t)(byte(&r) % (p.T + 1));
        p.Us[b] = p.V > 1 ? (int32_t)(byte(&r) % (p.U + 1)) : 0;
    }
    for (int64_t i = 0; i < p.B * p.U; ++i) {
        const int v = p.V > 1 ? byte(&r) % (int)(p.V - 1) : 0;
        p.labels[i] = v >= p.blank ? v + 1 : v;
        if (p.V == 1) p.labels[i] = 0;
    }
    const int64_t R = p.U + 1;
    p.enc = malloc(sizeof(double) * (size_t)(p.B * p.T * p.H + 1));
    p.pred = malloc(sizeof(double) * (size_t)(p.B * R * p.H + 1));
    p.W = calloc((size_t)(p.O * p.ldw + 1), sizeof(double));
    p.bias = malloc(sizeof(double) * (size_t)(p.O + 1));
    const double scale = 1.0 / 16;
    for (int64_t i = 0; i < p.B * p.T * p.H; ++i) p.enc[i] = q((int8_t)byte(&r) * scale, p.dt);
    for (int64_t i = 0; i < p.B * R * p.H; ++i) p.pred[i] = q((int8_t)byte(&r) * scale, p.dt);
    for (int64_t oo = 0; oo < p.O; ++oo)
        for (int64_t k = 0; k < p.H; ++k) p.W[oo * p.ldw + k] = q((int8_t)byte(&r) * scale / sqrt((double)p.H), p.dt);
    for (int64_t oo = 0; oo < p.O; ++oo) p.bias[oo] = p.has_bias ? q((int8_t)byte(&r) * scale, p.dt) : 0.0;
    double gcs[4];
    for (int64_t b = 0; b < p.B; ++b) gcs[b] = q(((int8_t)byte(&r)) / 32.0, p.dt == TDT_DTYPE_FLOAT64 ? p.dt : TDT_DTYPE_FLOAT32);
    p.gc = with_gc ? gcs : NULL;

    lib_t L;
    lib_setup(&p, threads, want, &L);
    const tdt_dtype_t dt = p.dt;
    if (fault) {
        const tdt_status_t expect = inject(&L, fnum, fparam, pair);
        const size_t acc = dt == TDT_DTYPE_FLOAT64 ? 8 : 4;
        memset(L.costs, 0x5a, (size_t)p.B * acc);
        if (L.genc) memset(L.genc, 0x5a, L.n_enc * esz(dt));
        if (L.gW) memset(L.gW, 0x5a, L.n_W * esz(dt));
        const tdt_status_t s = lib_call(&L, pair, with_gc);
        if (s != expect) violation("fault %d: status %d (%s), expected %d", fnum, (int)s, tdt_last_error(), (int)expect);
        if (s != TDT_STATUS_SUCCESS) {
            if (!*tdt_last_error()) violation("fault %d: no error detail", fnum);
            for (size_t i = 0; i < (size_t)p.B * acc; ++i)
                if (((unsigned char *)L.costs)[i] != 0x5a) violation("fault %d: costs written", fnum);
            if (L.genc)
                for (size_t i = 0; i < L.n_enc * esz(dt); ++i)
                    if (((unsigned char *)L.genc)[i] != 0x5a) violation("fault %d: d enc written", fnum);
            if (L.gW)
                for (size_t i = 0; i < L.n_W * esz(dt); ++i)
                    if (((unsigned char *)L.gW)[i] != 0x5a) violation("fault %d: d W written", fnum);
        }
    } else {
        const tdt_status_t s = lib_call(&L, pair, with_gc);
        if (s != TDT_STATUS_SUCCESS) violation("status %d: %s", (int)s, tdt_last_error());
        if (*tdt_last_error()) violation("error detail after SUCCESS: %s", tdt_last_error());
        outs_t ref;
        ref.costs = malloc(sizeof(double) * (size_t)(p.B + 1));
        ref.denc = malloc(sizeof(double) * (L.n_enc + 1));
        ref.dpred = malloc(sizeof(double) * (L.n_pred + 1));
        ref.dW = malloc(sizeof(double) * (size_t)(p.O * p.H + 1));
        ref.dbias = malloc(sizeof(double) * (size_t)(p.O + 1));
        ref.cost_err = malloc(sizeof(double) * (size_t)(p.B + 1));
        ref.denc_mag = malloc(sizeof(double) * (L.n_enc + 1));
        ref.dpred_mag = malloc(sizeof(double) * (L.n_pred + 1));
        ref.dW_mag = malloc(sizeof(double) * (size_t)(p.O * p.H + 1));
        ref.dbias_mag = malloc(sizeof(double) * (size_t)(p.O + 1));
        ref.denc_skip = malloc(sizeof(double) * (L.n_enc + 1));
        ref.dpred_skip = malloc(sizeof(double) * (L.n_pred + 1));
        ref.dW_skip = malloc(sizeof(double) * (size_t)(p.O * p.H + 1));
        ref.dbias_skip = malloc(sizeof(double) * (size_t)(p.O + 1));
        reference(&p, &ref);
        const tdt_dtype_t acc = dt == TDT_DTYPE_FLOAT64 ? TDT_DTYPE_FLOAT64 : TDT_DTYPE_FLOAT32;
        const double tol = dt == TDT_DTYPE_FLOAT64 ? 1e-9 : dt == TDT_DTYPE_FLOAT32 ? 1e-4 : 0.1;
        const double eps = acc == TDT_DTYPE_FLOAT64 ? 0x1p-53 : 0x1p-24; /* the accumulation's unit roundoff */
        for (int64_t b = 0; b < p.B; ++b) {
            const double c = get(L.costs, (size_t)b, acc);
            if (isinf(ref.costs[b]) || isinf(c)) {
                if (c != ref.costs[b]) violation("costs[%lld] = %g, reference %g", (long long)b, c, ref.costs[b]);
                if (L.genc)
                    for (int64_t k = 0; k < p.T * p.H; ++k)
                        if (get(L.genc, (size_t)(b * p.T * p.H + k), dt) != 0.0)
                            violation("infeasible sample %lld has a nonzero d enc", (long long)b);
            } else if (!(fabs(c - ref.costs[b]) <= tol * (1 + fabs(ref.costs[b])) + eps * ref.cost_err[b])) {
                violation("costs[%lld] = %.17g, reference %.17g (rounding bound %g)", (long long)b, c, ref.costs[b],
                          eps * ref.cost_err[b]);
            }
        }
        const double sk = p.skip_below;
        if (L.genc) compare("d enc", L.genc, ref.denc, ref.denc_mag, ref.denc_skip, sk, L.n_enc, dt, tol, eps);
        if (L.gpred) compare("d pred", L.gpred, ref.dpred, ref.dpred_mag, ref.dpred_skip, sk, L.n_pred, dt, tol, eps);
        if (L.gW) {
            double *w2 = malloc(sizeof(double) * (size_t)(p.O * p.H + 1));
            void *g2 = malloc((size_t)(p.O * p.H) * esz(dt) + 1);
            for (int64_t oo = 0; oo < p.O; ++oo)
                for (int64_t k = 0; k < p.H; ++k) put(g2, (size_t)(oo * p.H + k), dt, get(L.gW, (size_t)(oo * p.ldw + k), dt));
            for (int64_t i = 0; i < p.O * p.H; ++i) w2[i] = ref.dW[i];
            compare("d W", g2, w2, ref.dW_mag, ref.dW_skip, sk, (size_t)(p.O * p.H), dt, tol, eps);
            free(w2);
            free(g2);
        }
        if (L.gbias) compare("d bias", L.gbias, ref.dbias, ref.dbias_mag, ref.dbias_skip, sk, L.n_b, dt, tol, eps);
        /* the same bits at one thread, and by the other call form */
        lib_t L1;
        lib_setup(&p, 1, want, &L1);
        if (lib_call(&L1, !pair, with_gc) != TDT_STATUS_SUCCESS) violation("second call failed: %s", tdt_last_error());
        if (!with_gc) {
            same_bits("costs", L.costs, L1.costs, (size_t)p.B * (dt == TDT_DTYPE_FLOAT64 ? 8 : 4));
            same_bits("d enc", L.genc, L1.genc, L.n_enc * esz(dt));
            same_bits("d pred", L.gpred, L1.gpred, L.n_pred * esz(dt));
            same_bits("d bias", L.gbias, L1.gbias, L.n_b * esz(dt));
            if (L.gW)
                for (int64_t oo = 0; oo < p.O; ++oo)
                    same_bits("d W", (char *)L.gW + oo * p.ldw * esz(dt), (char *)L1.gW + oo * p.ldw * esz(dt), (size_t)p.H * esz(dt));
        }
        lib_free(&L1);
        free(ref.costs);
        free(ref.denc);
        free(ref.dpred);
        free(ref.dW);
        free(ref.dbias);
        free(ref.cost_err);
        free(ref.denc_mag);
        free(ref.dpred_mag);
        free(ref.dW_mag);
        free(ref.dbias_mag);
        free(ref.denc_skip);
        free(ref.dpred_skip);
        free(ref.dW_skip);
        free(ref.dbias_skip);
    }
    /* the inputs are as they were */
    for (size_t i = 0; i < L.n_enc; ++i)
        if (get(L.enc, i, dt) != p.enc[i]) violation("enc changed");
    lib_free(&L);
    free(p.Ts);
    free(p.Us);
    free(p.labels);
    free(p.enc);
    free(p.pred);
    free(p.W);
    free(p.bias);
    return 0;
}
