/*
 * joint.c - the fused joint + loss on the CPU (tdt_joint_*; docs/joint.md has the whole story).
 *
 * For every lattice node n = (b, t, u) of a sample's lattice (t < T_b, u <= U_b):
 *     x = enc[b, t, :] + pred[b, u, :],  h = dropout(act(x))   (H values)
 *     z = W h + bias                                           (O = V + D values, or V: RNN-T)
 * and the loss of those logits, exactly as compute_tdt_loss() takes them, without ever holding
 * the (nodes x O) logits:
 *
 *   forward  (parallel over node tiles): a tile's h (JT_NODES x H), its logits
 *            z = h W^T + bias (JT_NODES x O, one GEMM against W^T, packed once a call), and
 *            for each node the same values the loss's node pass writes into the node's block
 *            (the token log-normaliser of z[0..V) by cpu.c's own row kernel, the blank and label
 *            log-probabilities, the duration log-softmax); then cpu.c's lattice pass, unchanged.
 *   backward in waves of S / 2 tiles (S slots of scratch in two sets, waves alternating):
 *            (a) each of the wave's tiles: h and z again, the logits' gradient dz in place of z
 *                (cpu.c's gradient row with the loss's per-node coefficients), and
 *                d h = dz W (JT_NODES x H), times act'(x) and the dropout mask: g;
 *            (b) each fixed chunk of outputs: d W[o, :] += sum_n dz[n, o] h[n, :] and
 *                d bias[o] += sum_n dz[n, o] over the wave's nodes (64 rows a chunk), and
 *                d enc[b, t, :] += g[n, :], d pred[b, u, :] += g[n, :] (64 hidden values a chunk).
 *            The items (a) and (b) of all the waves form one queue in a fixed order, handed out
 *            by one counter; an item waits only for the items it reads (tdt_cpu_joint_run), so
 *            no thread waits at a barrier between waves.
 *
 * Determinism: every output element is one fixed chain of operations whatever the thread count:
 * the tiles are consecutive runs of JT_NODES nodes in (b, t, u) order, fixed by the shapes and
 * lengths alone; a z or d h element is one FMA chain over H or O inside one tile; a d W,
 * d bias, d enc or d pred element is one chain over the nodes in (b, t, u) order, continued from
 * wave to wave (a value stored and reloaded between waves is the same value), so neither the
 * number of threads nor the number of slots (hence of waves) changes a bit.
 *
 * Precision: float32, float16 and bfloat16 inputs are computed in float32 (h, z, dz, every
 * GEMM, d h and the gradients' sums, rounded once to the dtype at the end for the 16-bit ones);
 * float64 in float64 throughout. The lattice is float64, as in the loss.
 *
 * Memory (the tiles' scratch, after the lattice's workspace): W^T in the accumulate type
 * (H x O), for 16-bit dtypes (or H not a multiple of JT_PAD) W itself widened (O x H), for
 * 16-bit dtypes float32 sums of the four gradients; and S slots of JT_NODES x (O + 2 H)
 * accumulate-type values, S from 2 a thread up to JT_MAX_SLOTS (about 1/48 of the tiles); rows
 * padded to JT_PAD values; skip_below's kept-node list (one int64 a node). Never nodes x O.
 *
 * skip_below (tdt_joint_gradients_t): jt_compact lists the nodes the backward keeps
 * (common/joint.h's rule on their coefficients), and the backward's tiles are runs of
 * JT_NODES of those, in the same (b, t, u) order, so the sums keep their order.
 *
 * The GEMMs run on one register tile (jt_tile_*) rather than a BLAS: see docs/joint.md.
 */
#include <omp.h>
#include <sched.h>
#include <string.h>

#include "common/dtype.h"
#include "common/joint.h"
#include "cpu/cpu.h"

/* Nodes a tile: a whole number of every register tile's rows (8 and 6, below), at most
 * TDT_SOFTMAX_NODES (one duration softmax call a tile). */
#define JT_NODES 24
/* Rows of d W an item of the backward's reduction phase; hidden values an item of d enc/pred. */
#define JT_WROWS 64
#define JT_HCHUNK 64
/* The backward's waves: about JT_WAVES of them for a large problem, from JT_MAX_SLOTS slots at
 * most (jt_layout_of). */
#define JT_WAVES 48
#define JT_MAX_SLOTS 64

#if JT_NODES > TDT_SOFTMAX_NODES || JT_NODES % 8 != 0 || JT_NODES % 6 != 0
#error "JT_NODES must be a multiple of every register tile's rows and at most TDT_SOFTMAX_NODES"
#endif

/* ---- GEMM micro-kernels --------------------------------------------------------------------------
 * C[i, j] += sum_k A(i, k) B(k, j) for i < M, j < N, with A(i, k) = a[i * ars + k * acs] (any
 * strides: its values are broadcast), B(k, j) = b[k * ldb + j] (rows contiguous), C(i, j) =
 * c[i * ldc + j]. Each element of C is one multiply-add chain over k in order, in the micro-tile
 * (MR rows by two vectors, held in registers) and at the edges alike. */

/* The register tile of this path's vector unit (joint.c is compiled once per path, paths.h):
 * MR rows by two vectors of VB bytes, its 2 MR accumulators and the operands in the vector
 * registers: 8 rows of two 64-byte vectors with AVX-512 (32 registers), 6 rows of two 32-byte
 * vectors with AVX2 and FMA, 6 rows of two 16-byte vectors elsewhere (16 registers: SSE2, NEON;
 * a portable build with 64-byte vectors spilled and ran 34x slower). The path's flags let the
 * compiler contract the tile's multiply-adds into FMAs where the path has them (CMakeLists.txt:
 * joint.c alone is built with -ffp-contract=fast). */
#define JT_DEFINE_GEMM(SUF, F, VB, MR, ATTR)                                                     \
    typedef F jt_v_##SUF __attribute__((vector_size(VB)));                                       \
    enum { JT_VL_##SUF = (int)(VB / sizeof(F)) };                                                \
    ATTR static void jt_tile_##SUF(int64_t K, const F *a, int64_t ars, int64_t acs, const F *b,  \
                                   int64_t ldb, F *c, int64_t ldc) {                            \
        jt_v_##SUF c0[MR], c1[MR];                                                               \
        TDT_UNROLL for (int i = 0; i < MR; ++i) {                                                \
            memcpy(&c0[i], c + i * ldc, sizeof(jt_v_##SUF));                                     \
            memcpy(&c1[i], c + i * ldc + JT_VL_##SUF, sizeof(jt_v_##SUF));                       \
        }                                                                                        \
        for (int64_t k = 0; k < K; ++k) {                                                        \
            jt_v_##SUF b0, b1;                                                                   \
            memcpy(&b0, b + k * ldb, sizeof b0);                                                 \
            memcpy(&b1, b + k * ldb + JT_VL_##SUF, sizeof b1);                                   \
            const F *ak = a + k * acs;                                                           \
            TDT_UNROLL for (int i = 0; i < MR; ++i) {                                            \
                const F x = ak[i * ars];                                                         \
                c0[i] += x * b0;                                                                 \
                c1[i] += x * b1;                                                                 \
            }                                                                                    \
        }                                                                                        \
        TDT_UNROLL for (int i = 0; i < MR; ++i) {                                                \
            memcpy(c + i * ldc, &c0[i], sizeof(jt_v_##SUF));                                     \
            memcpy(c + i * ldc + JT_VL_##SUF, &c1[i], sizeof(jt_v_##SUF));                       \
        }                                                                                        \
    }                                                                                            \
    /* Edge tiles (M or N short of a whole tile) run the same register tile on a copy of C:     \
       A's rows and B's columns must be readable up to whole tiles (the callers pad them). */    \
    ATTR static void jt_gemm_##SUF(int64_t M, int64_t N, int64_t K, const F *a, int64_t ars,     \
                                   int64_t acs, const F *b, int64_t ldb, F *c, int64_t ldc) {    \
        const int64_t NR = 2 * JT_VL_##SUF;                                                      \
        for (int64_t j = 0; j < N; j += NR)                                                      \
            for (int64_t i = 0; i < M; i += MR) {                                                \
                const int64_t m = M - i < MR ? M - i : MR, n = N - j < NR ? N - j : NR;          \
                if (m == MR && n == NR) {                                                        \
                    jt_tile_##SUF(K, a + i * ars, ars, acs, b + j, ldb, c + i * ldc + j, ldc);   \
                    continue;                                                                    \
                }                                                                                \
                F t[MR * 2 * JT_VL_##SUF];                                                       \
                memset(t, 0, sizeof t);                                                          \
                for (int64_t r = 0; r < m; ++r) memcpy(t + r * NR, c + (i + r) * ldc + j, (size_t)n * sizeof(F)); \
                jt_tile_##SUF(K, a + i * ars, ars, acs, b + j, ldb, t, NR);                      \
                for (int64_t r = 0; r < m; ++r) memcpy(c + (i + r) * ldc + j, t + r * NR, (size_t)n * sizeof(F)); \
            }                                                                                    \
    }

typedef void (*jt_gemm_f_t)(int64_t, int64_t, int64_t, const float *, int64_t, int64_t,
                            const float *, int64_t, float *, int64_t);
typedef void (*jt_gemm_d_t)(int64_t, int64_t, int64_t, const double *, int64_t, int64_t,
                            const double *, int64_t, double *, int64_t);

#if defined(__AVX512F__)
JT_DEFINE_GEMM(f, float, 64, 8, )
JT_DEFINE_GEMM(d, double, 64, 8, )
#elif defined(__AVX2__) && defined(__FMA__)
JT_DEFINE_GEMM(f, float, 32, 6, )
JT_DEFINE_GEMM(d, double, 32, 6, )
#else
JT_DEFINE_GEMM(f, float, 16, 6, )
JT_DEFINE_GEMM(d, double, 16, 6, )
#endif

static void jt_gemm_pick(jt_gemm_f_t *gf, jt_gemm_d_t *gd) {
    *gf = jt_gemm_f;
    *gd = jt_gemm_d;
}

/* ---- the scratch ----------------------------------------------------------------------------- */

/* Byte offsets of the scratch's parts from its (aligned) start; acc: the accumulate type's size. */
typedef struct jt_layout {
    size_t starts; /* int64 [B + 1]: first node of sample b in the (b, t, u) order */
    size_t wt;     /* acc [H x Op]: W^T, its columns past O zero */
    size_t wf;     /* acc [O x Hp]: W widened and padded with zero columns (16-bit dtypes, and H
                      not a multiple of JT_PAD; else the caller's W is read) */
    size_t bias;   /* acc [Op]: the bias (0 without one, and past O) */
    size_t genc, gpred, gw, gbias; /* float [B T H], [B (U + 1) H], [O H], [O]: the sums of
                                      16-bit dtypes' gradients (none otherwise) */
    size_t h, z, g; /* acc [S JT_NODES x Hp], [S JT_NODES x Op], [S JT_NODES x Hp]: the slots */
    size_t x;       /* acc [S x 3 H]: a slot's rows of x = enc + pred, of pred, of the mask */
    size_t nodes;   /* int32 [S JT_NODES x 3]: the slots' nodes (b, t, u) */
    size_t kept;    /* int64 [B T (U + 1)]: skip_below's kept nodes, compacted (jt_compact) */
    size_t sync;    /* int32 [2 waves + items + 1]: the backward's completion counters */
    int64_t waves, items; /* at most, for the sync counters */
    size_t total;
    int slots;
    int acc;
} jt_layout_t;

/* Rows of the GEMMs' operands padded to whole register tiles (a multiple of two vectors of
 * float32 for every register tile), so that every product runs on the register tile (Hp, Op: H and O
 * padded). */
#define JT_PAD 32
static int64_t jt_pad(int64_t n) { return (n + JT_PAD - 1) / JT_PAD * JT_PAD; }

/* The backward's slots come in two sets (one wave's tiles fill one set while the last wave's
 * sums read the other); a single slot is one set. */
static int jt_set_slots(int slots) { return slots >= 2 ? slots / 2 : 1; }

static int jt_threads(const tdt_options_t *o) {
    return o->num_threads > 0 ? o->num_threads : omp_get_max_threads();
}

/* 0 on overflow of size_t (the dispatch layer then refuses the sizes). */
static int jt_layout_of(const tdt_joint_problem_t *jp, int nthreads, jt_layout_t *l) {
    const int64_t B = jp->batch, T = jp->max_frames, R = jp->max_labels + 1, H = jp->hidden,
                  O = jp->num_outputs;
    const int narrow = jp->dtype == TDT_DTYPE_FLOAT16 || jp->dtype == TDT_DTYPE_BFLOAT16;
    const size_t acc = jp->dtype == TDT_DTYPE_FLOAT64 ? 8 : 4;
    size_t nodes, tiles, cur = 0, n;
    if (!tdt_mul_size((size_t)B, (size_t)T, &nodes) || !tdt_mul_size(nodes, (size_t)R, &nodes)) return 0;
    tiles = nodes / JT_NODES + 1;
    /* 2 slots a thread at least (a set a thread, two sets), and up to JT_MAX_SLOTS so that a
       large problem's backward has about JT_WAVES waves: each wave's sums load and store all of
       d W once, so few large waves keep that traffic small, while the slots' memory stays a
       few per cent of the logits' (docs/joint.md) */
    int64_t want = (int64_t)(tiles / JT_WAVES);
    want = want < JT_MAX_SLOTS ? want : JT_MAX_SLOTS;
    want = want > 2 * (int64_t)nthreads ? want : 2 * (int64_t)nthreads;
    l->slots = (int)((size_t)want < tiles ? (size_t)want : tiles);
    l->acc = (int)acc;
    const size_t S = (size_t)l->slots;
    const int64_t Hp = jt_pad(H), Op = jt_pad(O);
    const int wide = narrow || Hp != H; /* a widened, padded W (jt_ctx_t.w) */
    size_t OH, OHp, HOp, SNH, SNO;
    if (!tdt_mul_size((size_t)O, (size_t)H, &OH) || !tdt_mul_size((size_t)O, (size_t)Hp, &OHp) ||
        !tdt_mul_size((size_t)H, (size_t)Op, &HOp) || !tdt_mul_size(S * JT_NODES, (size_t)Hp, &SNH) ||
        !tdt_mul_size(S * JT_NODES, (size_t)Op, &SNO))
        return 0;
    int ok = tdt_ws_take(&cur, (size_t)B + 1, 8, &l->starts) && tdt_ws_take(&cur, HOp, acc, &l->wt) &&
             tdt_ws_take(&cur, wide ? OHp : 0, acc, &l->wf) && tdt_ws_take(&cur, (size_t)Op, acc, &l->bias);
    if (!ok) return 0;
    size_t be = 0, bp = 0;
    if (narrow && (!tdt_mul_size((size_t)B * (size_t)T, (size_t)H, &be) ||
                   !tdt_mul_size((size_t)B * (size_t)R, (size_t)H, &bp)))
        return 0;
    ok = tdt_ws_take(&cur, be, 4, &l->genc) && tdt_ws_take(&cur, bp, 4, &l->gpred) &&
         tdt_ws_take(&cur, narrow ? OH : 0, 4, &l->gw) && tdt_ws_take(&cur, narrow ? (size_t)O : 0, 4, &l->gbias) &&
         tdt_ws_take(&cur, SNH, acc, &l->h) && tdt_ws_take(&cur, SNO, acc, &l->z) &&
         tdt_ws_take(&cur, SNH, acc, &l->g) && tdt_mul_size(3 * S, (size_t)H, &n) &&
         tdt_ws_take(&cur, n, acc, &l->x) && tdt_ws_take(&cur, S * JT_NODES * 3, 4, &l->nodes) &&
         tdt_ws_take(&cur, nodes, 8, &l->kept);
    if (!ok) return 0;
    l->waves = (int64_t)(tiles / jt_set_slots(l->slots) + 2);
    l->items = (O + JT_WROWS - 1) / JT_WROWS + (H + JT_HCHUNK - 1) / JT_HCHUNK;
    if (!tdt_ws_take(&cur, (size_t)(2 * l->waves + l->items + 1), 4, &l->sync)) return 0;
    l->total = cur;
    return 1;
}

size_t tdt_cpu_joint_scratch_bytes(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                   int num_durations) {
    jt_layout_t l;
    (void)num_durations;
    return jt_layout_of(problem, jt_threads(options), &l) ? l.total : SIZE_MAX;
}

/* ---- element access ----------------------------------------------------------------------------- */

static inline double jt_load(const void *base, int64_t i, tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return ((const double *)base)[i];
    case TDT_DTYPE_FLOAT16: return tdt_fp16_to_float(((const uint16_t *)base)[i]);
    case TDT_DTYPE_BFLOAT16: return tdt_bf16_to_float(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static inline void jt_store(void *base, int64_t i, tdt_dtype_t dt, double x) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: ((double *)base)[i] = x; break;
    case TDT_DTYPE_FLOAT16: ((uint16_t *)base)[i] = tdt_float_to_fp16((float)x); break;
    case TDT_DTYPE_BFLOAT16: ((uint16_t *)base)[i] = tdt_float_to_bf16((float)x); break;
    default: ((float *)base)[i] = (float)x; break;
    }
}

/* a row of n elements of dt from src, as floats (double for float64) into dst */
#define JT_DEFINE_WIDEN(SUF, F)                                                                  \
    static void jt_widen_##SUF(F *dst, const void *src, int64_t n, tdt_dtype_t dt) {             \
        switch (dt) {                                                                            \
        case TDT_DTYPE_FLOAT64:                                                                  \
            for (int64_t i = 0; i < n; ++i) dst[i] = (F)((const double *)src)[i];                \
            break;                                                                               \
        case TDT_DTYPE_FLOAT16:                                                                  \
            for (int64_t i = 0; i < n; ++i) dst[i] = (F)tdt_fp16_to_float(((const uint16_t *)src)[i]); \
            break;                                                                               \
        case TDT_DTYPE_BFLOAT16:                                                                 \
            for (int64_t i = 0; i < n; ++i) dst[i] = (F)tdt_bf16_to_float(((const uint16_t *)src)[i]); \
            break;                                                                               \
        default:                                                                                 \
            for (int64_t i = 0; i < n; ++i) dst[i] = (F)((const float *)src)[i];                 \
            break;                                                                               \
        }                                                                                        \
    }
JT_DEFINE_WIDEN(f, float)
JT_DEFINE_WIDEN(d, double)

/* ---- the call's context ---------------------------------------------------------------------- */

typedef struct jt_ctx {
    const tdt_joint_call_t *jc;
    const tdt_call_t *c;
    const tdt_joint_problem_t *jp;
    tdt_ws_t ws;
    tdt_wblocks_t wb;
    jt_layout_t l;
    char *s;              /* the scratch's aligned start */
    const int64_t *starts;
    int64_t nodes, tiles; /* live nodes, tiles (the backward's, after skip_below's compaction) */
    const int64_t *kept;  /* skip_below: the backward's nodes (indices of the live order), else NULL */
    int64_t H, O, V, D;
    int64_t Hp, Op;       /* H and O padded (jt_pad): the slots' and W^T's row lengths */
    jt_gemm_f_t gemm_f;   /* the register tile this CPU runs (jt_gemm_pick) */
    jt_gemm_d_t gemm_d;
    int acc_double, narrow;
    const void *w;        /* W in the accumulate type: the caller's, or the widened copy */
    int64_t ldw;
    uint32_t thr;         /* dropout threshold (0: none) */
    double keep_scale;
} jt_ctx_t;

#define JT_PTR(ctx, part, T) ((T *)(void *)((ctx)->s + (ctx)->l.part))

/* The nodes of tile i into the slot's node list ((b, t, u) triples); returns their count. */
static int jt_tile_nodes(const jt_ctx_t *x, int64_t i, int32_t *nl) {
    const tdt_problem_t *p = &x->c->p;
    int64_t n = i * JT_NODES, b = 0;
    const int64_t end = n + JT_NODES < x->nodes ? n + JT_NODES : x->nodes;
    if (x->kept) { /* the compacted nodes, ascending */
        int cnt = 0;
        for (; n < end; ++n, ++cnt) {
            const int64_t k = x->kept[n];
            while (x->starts[b + 1] <= k) ++b;
            const int64_t R = p->label_lengths[b] + 1, loc = k - x->starts[b];
            nl[3 * cnt] = (int32_t)b;
            nl[3 * cnt + 1] = (int32_t)(loc / R);
            nl[3 * cnt + 2] = (int32_t)(loc % R);
        }
        return cnt;
    }
    while (x->starts[b + 1] <= n) ++b;
    int64_t R = p->label_lengths[b] + 1, loc = n - x->starts[b], t = loc / R, u = loc % R;
    int cnt = 0;
    for (; n < end; ++n, ++cnt) {
        nl[3 * cnt] = (int32_t)b;
        nl[3 * cnt + 1] = (int32_t)t;
        nl[3 * cnt + 2] = (int32_t)u;
        if (++u == R) {
            u = 0;
            if (++t == p->frame_lengths[b] && n + 1 < end) {
                do ++b; while (x->starts[b + 1] == x->starts[b]);
                R = p->label_lengths[b] + 1;
                t = 0;
            }
        }
    }
    return cnt;
}

/* The gradient coefficients of a tile's cnt nodes nl (by runs of one row (b, t), consecutive in
 * u): ng, q (D values a node), the upstream scale scl, and, where keep is not NULL, whether
 * grads->skip_below keeps the node (common/joint.h; jt_compact asks). */
static void jt_tile_coeffs(const jt_ctx_t *x, const int32_t *nl, int cnt, tdt_node_grad_t *ng, double *q,
                           double *scl, unsigned char *keep) {
    const tdt_call_t *c = x->c;
    const tdt_problem_t *p = &c->p;
    const int64_t D = x->D;
    for (int r0 = 0; r0 < cnt;) {
        int r1 = r0 + 1;
        while (r1 < cnt && r1 - r0 < TDT_CPU_COEFF_NODES && nl[3 * r1] == nl[3 * r0] &&
               nl[3 * r1 + 1] == nl[3 * r0 + 1] && nl[3 * r1 + 2] == nl[3 * r1 - 1] + 1)
            ++r1;
        const int64_t b = nl[3 * r0];
        tdt_cpu_node_coeffs(c, &x->ws, b, nl[3 * r0 + 1], nl[3 * r0 + 2], r1 - r0, ng + r0,
                            D > 0 ? q + r0 * D : NULL);
        const double scale = tdt_upstream(c->grad_costs, x->acc_double, c->o.grad_costs_scalar, b,
                                          c->o.batch_mean ? p->batch : 0, c->o.normalize_costs != 0,
                                          p->label_lengths[b]);
        for (int r = r0; r < r1; ++r) {
            scl[r] = scale;
            if (keep) keep[r] = !tdt_joint_skips(x->jc->jg.skip_below, scale, &ng[r]);
        }
        r0 = r1;
    }
}

/* ---- per dtype of accumulation ------------------------------------------------------------------ */

#define JT_DEFINE_PASSES(SUF, F, ACC_DOUBLE, EXP, TANH)                                          \
    static inline F jt_act_##SUF(F v, tdt_activation_t a) {                                     \
        switch (a) {                                                                             \
        case TDT_ACTIVATION_RELU: return v > (F)0 ? v : (F)0;                                    \
        case TDT_ACTIVATION_TANH: return TANH(v);                                                \
        case TDT_ACTIVATION_SIGMOID: return (F)1 / ((F)1 + EXP(-v));                             \
        default: return v;                                                                       \
        }                                                                                        \
    }                                                                                            \
    /* act'(v) */                                                                                \
    static inline F jt_dact_##SUF(F v, tdt_activation_t a) {                                     \
        switch (a) {                                                                             \
        case TDT_ACTIVATION_RELU: return v > (F)0 ? (F)1 : (F)0;                                 \
        case TDT_ACTIVATION_TANH: {                                                              \
            const F y = TANH(v);                                                                 \
            return (F)1 - y * y;                                                                 \
        }                                                                                        \
        case TDT_ACTIVATION_SIGMOID: {                                                           \
            const F y = (F)1 / ((F)1 + EXP(-v));                                                 \
            return y * ((F)1 - y);                                                               \
        }                                                                                        \
        default: return (F)1;                                                                    \
        }                                                                                        \
    }                                                                                            \
    /* act and act' of a row in place, the activation chosen once a row (so the loops vectorise) */ \
    static void jt_act_row_##SUF(F *v, int64_t n, tdt_activation_t a) {                          \
        switch (a) {                                                                             \
        case TDT_ACTIVATION_RELU:                                                                \
            for (int64_t k = 0; k < n; ++k) v[k] = v[k] > (F)0 ? v[k] : (F)0;                    \
            break;                                                                               \
        case TDT_ACTIVATION_IDENTITY: break;                                                     \
        default:                                                                                 \
            for (int64_t k = 0; k < n; ++k) v[k] = jt_act_##SUF(v[k], a);                        \
            break;                                                                               \
        }                                                                                        \
    }                                                                                            \
    static void jt_dact_row_##SUF(F *v, int64_t n, tdt_activation_t a) {                         \
        switch (a) {                                                                             \
        case TDT_ACTIVATION_RELU:                                                                \
            for (int64_t k = 0; k < n; ++k) v[k] = v[k] > (F)0 ? (F)1 : (F)0;                    \
            break;                                                                               \
        case TDT_ACTIVATION_IDENTITY:                                                            \
            for (int64_t k = 0; k < n; ++k) v[k] = (F)1;                                         \
            break;                                                                               \
        default:                                                                                 \
            for (int64_t k = 0; k < n; ++k) v[k] = jt_dact_##SUF(v[k], a);                       \
            break;                                                                               \
        }                                                                                        \
    }                                                                                            \
    /* x = enc[b, t, :] + pred[b, u, :] of node (b, t, u) */                                     \
    static void jt_x_##SUF(const jt_ctx_t *x, const int32_t *nd, F *xr, F *tmp) {                \
        const tdt_joint_problem_t *jp = x->jp;                                                   \
        const int64_t esz = tdt_dtype_size(jp->dtype);                                          \
        const char *e = (const char *)jp->enc + (nd[0] * jp->enc_strides[0] + nd[1] * jp->enc_strides[1]) * esz; \
        const char *p = (const char *)jp->pred + (nd[0] * jp->pred_strides[0] + nd[2] * jp->pred_strides[1]) * esz; \
        jt_widen_##SUF(xr, e, x->H, jp->dtype);                                                  \
        jt_widen_##SUF(tmp, p, x->H, jp->dtype);                                                 \
        for (int64_t k = 0; k < x->H; ++k) xr[k] += tmp[k];                                      \
    }                                                                                            \
    /* the multiplier of element k of the node's hidden row under dropout (keep_scale or 0) */   \
    static void jt_mask_##SUF(const jt_ctx_t *x, const int32_t *nd, F *m) {                      \
        const tdt_joint_problem_t *jp = x->jp;                                                   \
        const uint64_t c0 = tdt_dropout_counter(jp->dropout_offset, nd[0], nd[1], nd[2],          \
                                                jp->max_frames, jp->max_labels, x->H);           \
        const F s = (F)x->keep_scale;                                                            \
        for (int64_t k = 0; k < x->H; ++k)                                                       \
            m[k] = tdt_dropout_keep(jp->dropout_seed, c0 + (uint64_t)k, x->thr) ? s : (F)0;     \
    }                                                                                            \
    /* a tile's h (JT_NODES x H; rows past cnt zero) and z = h W^T + bias (JT_NODES x O) */       \
    static void jt_hz_##SUF(const jt_ctx_t *x, const int32_t *nl, int cnt, F *h, F *z, F *tmp) { \
        const int64_t H = x->H, Hp = x->Hp, Op = x->Op;                                          \
        const tdt_activation_t a = x->jp->activation;                                            \
        F *m = tmp + H;                                                                          \
        for (int r = 0; r < cnt; ++r) {                                                          \
            F *hr = h + r * Hp;                                                                  \
            jt_x_##SUF(x, nl + 3 * r, hr, tmp);                                                  \
            jt_act_row_##SUF(hr, H, a);                                                          \
            if (x->thr) {                                                                        \
                jt_mask_##SUF(x, nl + 3 * r, m);                                                 \
                for (int64_t k = 0; k < H; ++k) hr[k] *= m[k];                                   \
            }                                                                                    \
            memset(hr + H, 0, (size_t)(Hp - H) * sizeof(F));                                     \
        }                                                                                        \
        memset(h + cnt * Hp, 0, (size_t)(JT_NODES - cnt) * (size_t)Hp * sizeof(F));             \
        const F *bias = JT_PTR(x, bias, const F);                                                \
        for (int r = 0; r < JT_NODES; ++r) memcpy(z + r * Op, bias, (size_t)Op * sizeof(F));     \
        x->gemm_##SUF(JT_NODES, Op, H, h, Hp, 1, JT_PTR(x, wt, const F), Op, z, Op);             \
    }                                                                                            \
    /* forward of tile i: the node blocks of its nodes */                                        \
    static void jt_forward_tile_##SUF(const jt_ctx_t *x, int64_t i, int slot) {                  \
        const int64_t Hp = x->Hp, Op = x->Op, V = x->V, D = x->D;                                \
        int32_t *nl = JT_PTR(x, nodes, int32_t) + (size_t)slot * JT_NODES * 3;                    \
        F *h = JT_PTR(x, h, F) + (size_t)slot * JT_NODES * Hp;                                   \
        F *z = JT_PTR(x, z, F) + (size_t)slot * JT_NODES * Op;                                   \
        F *tmp = JT_PTR(x, g, F) + (size_t)slot * JT_NODES * Hp; /* g: free in the forward */    \
        const int cnt = jt_tile_nodes(x, i, nl);                                                 \
        const tdt_problem_t *p = &x->c->p;                                                       \
        const double sigma = x->c->o.sigma;                                                      \
        const int blank = x->c->o.blank;                                                         \
        jt_hz_##SUF(x, nl, cnt, h, z, tmp);                                                      \
        double hd[TDT_MAX_DURATIONS * TDT_SOFTMAX_NODES];                                        \
        for (int r = 0; r < cnt; ++r) {                                                          \
            const int32_t *nd = nl + 3 * r;                                                      \
            const F *zr = z + r * Op;                                                            \
            const int64_t U = p->label_lengths[nd[0]];                                           \
            const double lse = tdt_cpu_row_lse(zr, V, ACC_DOUBLE);                               \
            double *w = tdt_wblock(&x->wb, nd[0], nd[1], nd[2]);                                 \
            w[tdt_w_lse(D)] = lse;                                                               \
            w[TDT_W_BLANK] = (double)zr[blank] - lse - sigma;                                    \
            w[TDT_W_LABEL] = nd[2] < U ? (double)zr[p->labels[nd[0] * p->max_labels + nd[2]]] - lse - sigma \
                                       : -INFINITY;                                              \
            for (int64_t k = 0; k < D; ++k) hd[k * TDT_SOFTMAX_NODES + r] = (double)zr[V + k];   \
        }                                                                                        \
        if (D > 0 && cnt > 0) {                                                                  \
            tdt_log_softmax_small(hd, (int)D, cnt, TDT_SOFTMAX_NODES);                           \
            for (int r = 0; r < cnt; ++r) {                                                      \
                double *lp = tdt_wblock(&x->wb, nl[3 * r], nl[3 * r + 1], nl[3 * r + 2]) + TDT_W_DUR; \
                for (int64_t k = 0; k < D; ++k) lp[k] = hd[k * TDT_SOFTMAX_NODES + r];           \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    /* backward (a) of tile i in slot: h, dz (in z), and with need_g, g = (dz W) act' mask */    \
    static void jt_backward_tile_##SUF(const jt_ctx_t *x, int64_t i, int slot, int need_g) {     \
        const int64_t H = x->H, Hp = x->Hp, O = x->O, Op = x->Op, V = x->V, D = x->D;            \
        const tdt_call_t *c = x->c;                                                              \
        const tdt_problem_t *p = &c->p;                                                          \
        int32_t *nl = JT_PTR(x, nodes, int32_t) + (size_t)slot * JT_NODES * 3;                    \
        F *h = JT_PTR(x, h, F) + (size_t)slot * JT_NODES * Hp;                                   \
        F *z = JT_PTR(x, z, F) + (size_t)slot * JT_NODES * Op;                                   \
        F *g = JT_PTR(x, g, F) + (size_t)slot * JT_NODES * Hp;                                   \
        F *tmp = JT_PTR(x, x, F) + (size_t)slot * 3 * H;                                         \
        const int cnt = jt_tile_nodes(x, i, nl);                                                 \
        /* the nodes' gradient coefficients (with skip_below, jt_compact kept these nodes) */  \
        tdt_node_grad_t ng[JT_NODES];                                                            \
        double q[JT_NODES * TDT_MAX_DURATIONS], scl[JT_NODES];                                   \
        jt_tile_coeffs(x, nl, cnt, ng, q, scl, NULL);                                            \
        jt_hz_##SUF(x, nl, cnt, h, z, g); /* g: scratch until d h */                             \
        for (int r = 0; r < cnt; ++r) {                                                          \
            const int64_t b = nl[3 * r], t = nl[3 * r + 1], u = nl[3 * r + 2];                   \
            const int64_t U = p->label_lengths[b];                                               \
            F *zr = z + r * Op;                                                                  \
            const double lse = tdt_wblock(&x->wb, b, t, u)[tdt_w_lse(D)];                        \
            const int32_t label = u < U ? p->labels[b * p->max_labels + u] : -1;                  \
            tdt_cpu_token_grad(zr, zr, V, ACC_DOUBLE, c->o.blank, c->o.clamp, lse, &ng[r], label, \
                               scl[r]);                                                          \
            for (int64_t k = 0; k < D; ++k)                                                      \
                zr[V + k] = (F)(scl[r] * tdt_duration_grad(&ng[r], q[r * D + k], (int)k));       \
        }                                                                                        \
        memset(z + cnt * Op, 0, (size_t)(JT_NODES - cnt) * (size_t)Op * sizeof(F));              \
        if (!need_g) return;                                                                     \
        memset(g, 0, (size_t)JT_NODES * (size_t)Hp * sizeof(F));                                 \
        x->gemm_##SUF(JT_NODES, Hp, O, z, Op, 1, (const F *)x->w, x->ldw, g, Hp);                \
        const tdt_activation_t a = x->jp->activation;                                            \
        F *xr = tmp, *pt = tmp + H, *m = tmp + 2 * H;                                            \
        for (int r = 0; r < cnt; ++r) {                                                          \
            F *gr = g + r * Hp;                                                                  \
            jt_x_##SUF(x, nl + 3 * r, xr, pt);                                                   \
            jt_dact_row_##SUF(xr, H, a);                                                         \
            if (x->thr) {                                                                        \
                jt_mask_##SUF(x, nl + 3 * r, m);                                                 \
                for (int64_t k = 0; k < H; ++k) gr[k] *= xr[k] * m[k];                           \
            } else {                                                                             \
                for (int64_t k = 0; k < H; ++k) gr[k] *= xr[k];                                  \
            }                                                                                    \
        }                                                                                        \
    }

JT_DEFINE_PASSES(f, float, 0, expf, tanhf)
JT_DEFINE_PASSES(d, double, 1, exp, tanh)

/* ---- the backward's reduction phase and the accumulators -------------------------------------- */

/* Where the gradients' sums go: the caller's buffers (float32, float64) or float32 ones in the
 * scratch (16-bit dtypes), NULL where that gradient is not asked for; strides in elements. */
typedef struct jt_acc {
    void *enc, *pred, *w, *bias;
    int64_t enc_s[2], pred_s[2], ldw;
} jt_acc_t;

static jt_acc_t jt_accumulators(const jt_ctx_t *x) {
    const tdt_joint_gradients_t *g = &x->jc->jg;
    jt_acc_t a;
    memset(&a, 0, sizeof a);
    if (!x->narrow) {
        a.enc = g->enc_grad;
        a.pred = g->pred_grad;
        a.w = g->weight_grad;
        a.bias = g->bias_grad;
        memcpy(a.enc_s, g->enc_strides, sizeof a.enc_s);
        memcpy(a.pred_s, g->pred_strides, sizeof a.pred_s);
        a.ldw = g->weight_stride;
        return a;
    }
    const int64_t H = x->H;
    if (g->enc_grad) a.enc = x->s + x->l.genc;
    if (g->pred_grad) a.pred = x->s + x->l.gpred;
    if (g->weight_grad) a.w = x->s + x->l.gw;
    if (g->bias_grad) a.bias = x->s + x->l.gbias;
    a.enc_s[0] = x->jp->max_frames * H;
    a.enc_s[1] = H;
    a.pred_s[0] = (x->jp->max_labels + 1) * H;
    a.pred_s[1] = H;
    a.ldw = H;
    return a;
}

#define JT_DEFINE_REDUCE(SUF, F)                                                                 \
    /* item it of the reduction over the wave's nw tiles (from tile w0): d W / d bias rows, then \
       d enc / d pred hidden chunks */                                                           \
    static void jt_reduce_item_##SUF(const jt_ctx_t *x, const jt_acc_t *A, int64_t w0, int nw,   \
                                     int slot0, int64_t it, int64_t witems) {                    \
        const int64_t H = x->H, Hp = x->Hp, O = x->O, Op = x->Op, K = (int64_t)nw * JT_NODES;    \
        const F *z = JT_PTR(x, z, const F) + (size_t)slot0 * JT_NODES * Op;                      \
        const F *h = JT_PTR(x, h, const F) + (size_t)slot0 * JT_NODES * Hp;                      \
        if (it < witems) {                                                                       \
            const int64_t o0 = it * JT_WROWS, o1 = o0 + JT_WROWS < O ? o0 + JT_WROWS : O;        \
            if (A->w)                                                                            \
                x->gemm_##SUF(o1 - o0, H, K, z + o0, 1, Op, h, Hp, (F *)A->w + o0 * A->ldw, A->ldw); \
            if (A->bias) {                                                                       \
                F *gb = (F *)A->bias;                                                            \
                for (int64_t n = 0; n < K; ++n)                                                  \
                    for (int64_t o = o0; o < o1; ++o) gb[o] += z[n * Op + o];                    \
            }                                                                                    \
            return;                                                                              \
        }                                                                                        \
        const int64_t k0 = (it - witems) * JT_HCHUNK, k1 = k0 + JT_HCHUNK < H ? k0 + JT_HCHUNK : H; \
        const F *g = JT_PTR(x, g, const F) + (size_t)slot0 * JT_NODES * Hp;                      \
        const int32_t *nl = JT_PTR(x, nodes, const int32_t) + (size_t)slot0 * JT_NODES * 3;      \
        for (int s = 0; s < nw; ++s) {                                                           \
            const int64_t first = (w0 + s) * JT_NODES;                                           \
            const int cnt = (int)(x->nodes - first < JT_NODES ? x->nodes - first : JT_NODES);    \
            for (int r = 0; r < cnt; ++r) {                                                      \
                const int32_t *nd = nl + 3 * (s * JT_NODES + r);                                 \
                const F *gr = g + (s * JT_NODES + r) * Hp;                                       \
                if (A->enc) {                                                                    \
                    F *e = (F *)A->enc + nd[0] * A->enc_s[0] + nd[1] * A->enc_s[1];              \
                    for (int64_t k = k0; k < k1; ++k) e[k] += gr[k];                             \
                }                                                                                \
                if (A->pred) {                                                                   \
                    F *q = (F *)A->pred + nd[0] * A->pred_s[0] + nd[2] * A->pred_s[1];           \
                    for (int64_t k = k0; k < k1; ++k) q[k] += gr[k];                             \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    /* W^T (and W widened, for 16-bit dtypes) and the bias into the scratch, rows o0 .. o1 */    \
    static void jt_pack_##SUF(const jt_ctx_t *x, int64_t o0, int64_t o1, F *row) {               \
        const tdt_joint_problem_t *jp = x->jp;                                                   \
        const int64_t H = x->H, Hp = x->Hp, Op = x->Op, esz = tdt_dtype_size(jp->dtype);        \
        F *wt = JT_PTR(x, wt, F), *wf = JT_PTR(x, wf, F), *bias = JT_PTR(x, bias, F);            \
        for (int64_t o = o0; o < o1; ++o) {                                                      \
            jt_widen_##SUF(row, (const char *)jp->weight + o * jp->weight_stride * esz, H, jp->dtype); \
            if (x->w == (const void *)wf) {                                                      \
                memcpy(wf + o * Hp, row, (size_t)H * sizeof(F));                                 \
                memset(wf + o * Hp + H, 0, (size_t)(Hp - H) * sizeof(F));                        \
            }                                                                                    \
            for (int64_t k = 0; k < H; ++k) wt[k * Op + o] = row[k];                             \
            bias[o] = jp->bias ? (F)jt_load(jp->bias, o, jp->dtype) : (F)0;                      \
        }                                                                                        \
    }

JT_DEFINE_REDUCE(f, float)
JT_DEFINE_REDUCE(d, double)

/* Sets every element of a strided (n0, n1, width) gradient to 0 (acc_elem: its element size). */
static void jt_zero(void *base, int64_t n0, int64_t n1, const int64_t *s, int64_t width, int64_t esz) {
    if (!base) return;
    for (int64_t i = 0; i < n0; ++i)
        for (int64_t j = 0; j < n1; ++j)
            memset((char *)base + (i * s[0] + j * s[1]) * esz, 0, (size_t)(width * esz));
}

/* 16-bit dtypes: the float32 sums (compact) into the caller's gradient (strided), rounded once. */
static void jt_narrow(void *dst, const float *src, int64_t n0, int64_t n1, const int64_t *s,
                      int64_t width, tdt_dtype_t dt) {
    if (!dst) return;
    for (int64_t i = 0; i < n0; ++i)
        for (int64_t j = 0; j < n1; ++j) {
            char *d = (char *)dst + (i * s[0] + j * s[1]) * 2;
            const float *r = src + (i * n1 + j) * width;
            for (int64_t k = 0; k < width; ++k) jt_store(d, k, dt, r[k]);
        }
}

/* skip_below: the nodes the backward keeps, in the live order, into the scratch's kept list;
 * the backward's tiles are then runs of JT_NODES of them (x->nodes, x->tiles, x->kept), so a
 * node left out costs no product at all, and the sums keep their order (nodes ascending). */
static void jt_compact(jt_ctx_t *x, int team) {
    int64_t *kept = JT_PTR(x, kept, int64_t);
#pragma omp parallel for schedule(static) num_threads(team)
    for (int64_t i = 0; i < x->tiles; ++i) {
        int32_t nl[3 * JT_NODES];
        tdt_node_grad_t ng[JT_NODES];
        double q[JT_NODES * TDT_MAX_DURATIONS], scl[JT_NODES];
        unsigned char keep[JT_NODES];
        const int cnt = jt_tile_nodes(x, i, nl);
        jt_tile_coeffs(x, nl, cnt, ng, q, scl, keep);
        for (int r = 0; r < cnt; ++r) kept[i * JT_NODES + r] = keep[r];
    }
    int64_t k = 0;
    for (int64_t n = 0; n < x->nodes; ++n) /* in place: k <= n */
        if (kept[n]) kept[k++] = n;
    x->kept = kept;
    x->nodes = k;
    x->tiles = (k + JT_NODES - 1) / JT_NODES;
}

/* ---- entry ------------------------------------------------------------------------------------ */

/* Waits until *c >= v (another thread's release store or add), yielding the CPU while it waits. */
static void jt_wait(int32_t *c, int32_t v) {
    for (int spins = 0; __atomic_load_n(c, __ATOMIC_ACQUIRE) < v; ++spins)
        if (spins >= 64) sched_yield();
}

tdt_status_t tdt_cpu_joint_run(const tdt_joint_call_t *jc) {
    const tdt_call_t *c = &jc->c;
    const tdt_problem_t *p = &c->p;
    jt_ctx_t x;
    memset(&x, 0, sizeof x);
    x.jc = jc;
    x.c = c;
    x.jp = &jc->jp;
    const int nthreads = jt_threads(&c->o);
    tdt_workspace_carve(&c->layout, c->workspace, &x.ws);
    if (!jt_layout_of(x.jp, nthreads, &x.l) || x.l.total > jc->scratch_bytes) {
        /* num_threads 0 and omp_get_max_threads() grew since the size was asked */
        tdt_set_error("the workspace holds the joint's scratch for fewer threads than this call "
                      "runs (options->num_threads = %d): ask tdt_joint_get_workspace_size() again",
                      c->o.num_threads);
        return TDT_STATUS_WORKSPACE_TOO_SMALL;
    }
    x.s = (char *)tdt_align_up((size_t)(uintptr_t)c->workspace) + jc->scratch_offset;
    x.wb = tdt_wblocks_ws(x.ws.w, c->layout.block, p->max_frames, p->max_labels + 1);
    x.H = x.jp->hidden;
    x.O = x.jp->num_outputs;
    x.Hp = jt_pad(x.H);
    x.Op = jt_pad(x.O);
    jt_gemm_pick(&x.gemm_f, &x.gemm_d);
    x.V = p->vocab_size;
    x.D = c->num_durations;
    x.acc_double = tdt_acc_is_double(p->dtype);
    x.narrow = p->dtype == TDT_DTYPE_FLOAT16 || p->dtype == TDT_DTYPE_BFLOAT16;
    x.thr = tdt_dropout_threshold(x.jp->dropout);
    x.keep_scale = tdt_dropout_scale(x.jp->dropout);
    int64_t *starts = JT_PTR(&x, starts, int64_t);
    starts[0] = 0;
    for (int64_t b = 0; b < p->batch; ++b)
        starts[b + 1] = starts[b] + (int64_t)p->frame_lengths[b] * (p->label_lengths[b] + 1);
    x.starts = starts;
    x.nodes = starts[p->batch];
    x.tiles = (x.nodes + JT_NODES - 1) / JT_NODES;
    const int wide = x.narrow || x.Hp != x.H;
    x.w = wide ? (const void *)JT_PTR(&x, wf, char) : x.jp->weight;
    x.ldw = wide ? x.Hp : x.jp->weight_stride;
    const int S = x.l.slots;
    const int team = nthreads < S ? nthreads : S;

    if (x.tiles > 0) { /* W^T and the bias, packed once a call (in slot 0.. of h as a row) */
        const size_t acc = x.acc_double ? 8 : 4;
        char *wt = JT_PTR(&x, wt, char), *bias = JT_PTR(&x, bias, char);
        for (int64_t k = 0; k < x.H; ++k) memset(wt + (size_t)(k * x.Op + x.O) * acc, 0, (size_t)(x.Op - x.O) * acc);
        memset(bias + (size_t)x.O * acc, 0, (size_t)(x.Op - x.O) * acc);
        const int64_t blocks = (x.O + 15) / 16;
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
        for (int64_t ib = 0; ib < blocks; ++ib) {
            const int slot = omp_get_thread_num();
            const int64_t o0 = ib * 16, o1 = o0 + 16 < x.O ? o0 + 16 : x.O;
            if (x.acc_double)
                jt_pack_d(&x, o0, o1, JT_PTR(&x, h, double) + (size_t)slot * JT_NODES * x.Hp);
            else
                jt_pack_f(&x, o0, o1, JT_PTR(&x, h, float) + (size_t)slot * JT_NODES * x.Hp);
        }
    }

    if (c->do_forward) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
        for (int64_t i = 0; i < x.tiles; ++i) {
            const int slot = omp_get_thread_num();
            if (x.acc_double)
                jt_forward_tile_d(&x, i, slot);
            else
                jt_forward_tile_f(&x, i, slot);
        }
        tdt_cpu_forward_lattice(c, &x.ws, nthreads, TDT_WS_JOINT_MAGIC);
    } else {
        const tdt_status_t s = tdt_cpu_check_forward(c, &x.ws, TDT_WS_JOINT_MAGIC);
        if (s != TDT_STATUS_SUCCESS) return s;
    }
    if (!c->do_backward) return TDT_STATUS_SUCCESS;

    const tdt_joint_gradients_t *jg = &jc->jg;
    const jt_acc_t A = jt_accumulators(&x);
    const int64_t B = p->batch, T = p->max_frames, R = p->max_labels + 1, H = x.H, O = x.O;
    const int64_t aesz = x.acc_double ? 8 : 4;
    const int64_t one[2] = {0, 0}, ldw2[2] = {0, A.ldw};
    jt_zero(A.enc, B, T, A.enc_s, H, aesz);
    jt_zero(A.pred, B, R, A.pred_s, H, aesz);
    jt_zero(A.w, 1, O, ldw2, H, aesz);
    jt_zero(A.bias, 1, 1, one, O, aesz);
    if (jg->skip_below > 0.0) jt_compact(&x, team);
    const int need_g = A.enc || A.pred;
    const int64_t witems = (A.w || A.bias) ? (O + JT_WROWS - 1) / JT_WROWS : 0;
    const int64_t items = witems + (need_g ? (H + JT_HCHUNK - 1) / JT_HCHUNK : 0);
    /* The waves as one queue of work in a fixed order, wave w's tiles (A) then its sums (B),
       handed out by one counter, each item waiting only for what it reads: A(w) for the sums
       B(w - 2) that read its slot set; B(w, it) for all of A(w) and for B(w - 1, it), the sums
       it continues. Every item waits only on items handed out before it, so the queue always
       moves, and no thread waits at a barrier between waves. */
    const int Ss = jt_set_slots(S), sets = S >= 2 ? 2 : 1;
    const int64_t waves = (x.tiles + Ss - 1) / Ss, block = Ss + items, total = x.tiles + waves * items;
    int32_t *doneA = JT_PTR(&x, sync, int32_t), *doneB = doneA + x.l.waves, *item_wave = doneB + x.l.waves;
    memset(doneA, 0, (size_t)(2 * x.l.waves + x.l.items) * sizeof(int32_t));
    int64_t next = 0;
#pragma omp parallel num_threads(team)
    {
        for (;;) {
            const int64_t gi = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
            if (gi >= total) break;
            const int64_t w = gi / block, r = gi % block, w0 = w * Ss;
            const int nw = (int)(x.tiles - w0 < Ss ? x.tiles - w0 : Ss);
            const int slot0 = (int)(w % sets) * Ss;
            if (r < nw) {
                if (w >= sets) jt_wait(&doneB[w - sets], (int32_t)items);
                if (x.acc_double)
                    jt_backward_tile_d(&x, w0 + r, slot0 + (int)r, need_g);
                else
                    jt_backward_tile_f(&x, w0 + r, slot0 + (int)r, need_g);
                __atomic_fetch_add(&doneA[w], 1, __ATOMIC_RELEASE);
            } else {
                const int64_t it = r - nw;
                jt_wait(&doneA[w], nw);
                jt_wait(&item_wave[it], (int32_t)w);
                if (x.acc_double)
                    jt_reduce_item_d(&x, &A, w0, nw, slot0, it, witems);
                else
                    jt_reduce_item_f(&x, &A, w0, nw, slot0, it, witems);
                __atomic_store_n(&item_wave[it], (int32_t)(w + 1), __ATOMIC_RELEASE);
                __atomic_fetch_add(&doneB[w], 1, __ATOMIC_RELEASE);
            }
        }
    }
    if (x.narrow) {
        const int64_t gw[2] = {0, jg->weight_stride};
        jt_narrow(jg->enc_grad, (const float *)A.enc, B, T, jg->enc_strides, H, p->dtype);
        jt_narrow(jg->pred_grad, (const float *)A.pred, B, R, jg->pred_strides, H, p->dtype);
        jt_narrow(jg->weight_grad, (const float *)A.w, 1, O, gw, H, p->dtype);
        jt_narrow(jg->bias_grad, (const float *)A.bias, 1, 1, one, O, p->dtype);
    }
    return TDT_STATUS_SUCCESS;
}
