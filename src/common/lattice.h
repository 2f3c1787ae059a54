/*
 * lattice.h - the TDT / RNN-T lattice math, written once for the OpenMP and CUDA backends.
 *
 * docs/math.md derives every formula used here. In brief, for one sample with T frames and U
 * labels, nodes (t, u) with 0 <= t < T, 0 <= u <= U, and arc k = 0..count-1 of each kind:
 *
 *   label arc k:  (t, u) -> (t + label_dur[k], u + 1)  if u < U, label_dur[k] >= 0,
 *                 t + label_dur[k] < T;   weight lp_label(t, u) + lp_dur(t, u, k)
 *   blank arc k:  (t, u) -> (t + blank_dur[k], u)      if blank_dur[k] > 0 and
 *                 t + blank_dur[k] < T, or terminal when u == U and t + blank_dur[k] == T;
 *                 weight lp_blank(t, u) + lp_dur(t, u, k)
 *
 *   alpha(0, 0) = 0,  alpha(t, u) = logsumexp over arcs into (t, u) of alpha(src) + weight
 *   beta(t, u)  = logsumexp over arcs out of (t, u) of weight + beta(dst)   (terminal dst: 0)
 *   log p(y|x)  = logsumexp over terminal arcs of alpha(src) + weight  (== beta(0, 0))
 *
 * TDT: label_dur[k] = d_k, blank_dur[k] = d_k if d_k > 0 else none, lp_dur from the duration
 * logits. RNN-T: one arc of each kind, label_dur = 0, blank_dur = 1, lp_dur = 0. Every arc
 * advances t + u by at least one, so anti-diagonals t + u = s can be swept in order.
 *
 * Node storage (tdt_node_index): the per-node arrays of one sample hold max_frames rows of
 * row = max_labels + 1 nodes, and anti-diagonal s = t + u lives in row s mod max_frames:
 * n = ((t + u) mod max_frames) * row + u. For each u, t -> (t + u) mod max_frames is a
 * bijection of [0, max_frames), so this is a permutation of the plain t-major order (same size,
 * sample offsets unchanged), and the nodes of one anti-diagonal, and each arc's other ends, are
 * contiguous in u: a sweep over a diagonal reads and writes whole cache lines. A node's
 * weights are one block (workspace.h): lp_blank, lp_label, then lp_dur, node (t, u)'s at
 * tdt_node_block(), in the workspace's w or at the head of the node's token-gradient row.
 *
 * Log-sum-exp of a node (tdt_lse_terms): two passes over its arc terms (all terms first, their
 * max, then independent exps and one log, with no branch between them), so the exps of one
 * node do not wait on each other. NaN in any term gives NaN; a node whose terms are all -inf
 * (or that has no arc) gets -inf; an absent arc is a -inf term and contributes exactly 0.
 * The sweeps themselves take their exps from branch-free functions here: the CPU's from
 * tdt_exp_le0 (a chunk vectorises it over its nodes), a GPU's from tdt_exp_le0_tab and its
 * logs from tdt_log_ge1_tab (short polynomials and a table lookup, one shared-memory load a
 * lane; as a CPU vector gather it was 3x slower than tdt_exp_le0), each within a few ulp of the
 * math library's. The log-likelihood uses the math library's exp; the occupancies and the
 * duration softmax use it on a GPU and tdt_exp_le0 on the CPU, which takes them a run of nodes
 * at a time (tdt_node_occupancy_args, tdt_log_softmax_small).
 *
 * Sweeps by arc slot (tdt_slot_t: the 2 * count arcs of a node as data): per slot, the weights
 * of its arc (tdt_alpha_slot_weight / tdt_beta_slot_weight: the normaliser's output, known
 * before the sweep starts, so a GPU sweep loads the next diagonal's while it computes the
 * current one) and its term (tdt_alpha_slot_term / tdt_beta_slot_term: the weights plus the
 * alpha / beta at the arc's other end, read through a tdt_diag_view_t, the workspace array or
 * a ring of the last few diagonals in GPU shared memory); then the log-sum-exp of the node's
 * terms. The CPU backend runs them for a run of a diagonal's nodes (tdt_sweep_chunk, at the
 * end); a GPU sweep gives each lane of a group a few slots and reduces across the group with the
 * same tdt_lse_max / tdt_lse_finish.
 *
 * Determinism: every function visits slots in one fixed order (k ascending, blank before
 * label), so on one backend a node's value does not depend on the thread or block that
 * computes it (a GPU group adds its lanes' partial sums in a fixed tree: the two backends may
 * differ in the last bits).
 */
#ifndef TDT_COMMON_LATTICE_H
#define TDT_COMMON_LATTICE_H

#include "tdt.h"

#include <string.h>

#include "hd.h"
#include "workspace.h"

/* The arcs that leave every node: the duration rule of TDT or of plain RNN-T, as data. */
typedef struct tdt_arcs {
    int count;                           /* arcs of each kind per node (D for TDT, 1 for RNN-T) */
    int use_dur;                         /* 1: add lp_dur(t, u, k) to arc k's weight (TDT) */
    int label_dur[TDT_MAX_DURATIONS];    /* frames label arc k advances, -1 for no label arc */
    int blank_dur[TDT_MAX_DURATIONS];    /* frames blank arc k advances, -1 for no blank arc */
} tdt_arcs_t;

/* One sample's lattice: its lengths and its per-node log-probabilities (already offset to the
 * sample). alpha and beta arrays are passed separately so sweeps can write them. */
typedef struct tdt_lattice {
    tdt_wblocks_t wb; /* the sample's blocks (workspace.h's tdt_wblock with b = 0) of wn
                         doubles, TDT_W_*: log p(blank) - sigma, log p(y_{u+1}) - sigma (for
                         u < U), the duration log-probs (TDT), the token log-normaliser */
    int64_t wn;       /* doubles a block: tdt_w_block(D) */
    int64_t row;            /* max_labels + 1 */
    int64_t frames;         /* max_frames: the per-node arrays' rows (see tdt_node_index) */
    int64_t T;              /* frames of this sample */
    int64_t U;              /* labels of this sample */
} tdt_lattice_t;

/* Gradient coefficients of one node, from its arc occupancies
 * occB_k = exp(alpha + w_blank_k + beta(dst) - LL), occL_k likewise for label arcs. */
typedef struct tdt_node_grad {
    double tok_occ;   /* sum_k occB_k + (1 + lambda) occL_k: multiplies softmax p_v */
    double blank_occ; /* sum_k occB_k: subtracted at v == blank */
    double label_occ; /* (1 + lambda) sum_k occL_k: subtracted at v == y_{u+1} */
    double dur_occ;   /* sum_k occB_k + occL_k: multiplies duration softmax q_k */
    double dur_arc[TDT_MAX_DURATIONS]; /* occB_k + occL_k: subtracted at duration k */
} tdt_node_grad_t;

/* ---- index helpers ------------------------------------------------------------------------ */

/* tdt_diag_row (workspace.h): the row of the per-node arrays that holds anti-diagonal s. */

/* Node (t, u) of a sample in the per-node arrays: row (t + u) mod max_frames, column u. */
TDT_HD int64_t tdt_node_index(int64_t max_frames, int64_t row, int64_t t, int64_t u) {
    return tdt_diag_row(t + u, max_frames) * row + u;
}

/* First node of sample b in the batch's per-node arrays (max_frames * row nodes a sample). */
TDT_HD int64_t tdt_sample_offset(int64_t b, int64_t max_frames, int64_t row) {
    return b * max_frames * row;
}

/* Element offset of logits row (b, t, u) for strides {sb, st, su}. */
TDT_HD int64_t tdt_row_offset(const int64_t *strides, int64_t b, int64_t t, int64_t u) {
    return b * strides[0] + t * strides[1] + u * strides[2];
}

/* ---- arcs --------------------------------------------------------------------------------- */

/* The arc set for TDT durations d[0..count-1] (validated by the dispatch layer). */
TDT_HD void tdt_arcs_tdt(tdt_arcs_t *arcs, const int *durations, int count) {
    arcs->count = count;
    arcs->use_dur = 1;
    for (int k = 0; k < count; ++k) {
        arcs->label_dur[k] = durations[k];
        arcs->blank_dur[k] = durations[k] > 0 ? durations[k] : -1;
    }
}

/* The arc set of plain RNN-T: label arcs stay on the frame, blank arcs advance one. */
TDT_HD void tdt_arcs_rnnt(tdt_arcs_t *arcs) {
    arcs->count = 1;
    arcs->use_dur = 0;
    arcs->label_dur[0] = 0;
    arcs->blank_dur[0] = 1;
}

/* Node (t, u)'s block of weights (workspace.h). */
TDT_HD const double *tdt_node_block(const tdt_lattice_t *L, int64_t t, int64_t u) {
    return tdt_wblock(&L->wb, 0, t, u);
}

/* Duration log-prob of arc k at node (t, u) (0 for RNN-T). */
TDT_HD double tdt_arc_dur(const tdt_lattice_t *L, const tdt_arcs_t *A, int64_t t, int64_t u, int k) {
    return A->use_dur ? tdt_node_block(L, t, u)[TDT_W_DUR + k] : 0.0;
}

/* ---- the sweeps ---------------------------------------------------------------------------- */

/* Where a sweep reads alpha (or beta) of node (s - u, u) on anti-diagonal s
 * (0 <= s <= max_frames + max_labels, u <= max_labels):
 * v[r * row + u], with r = s & ring_mask for a ring of ring_mask + 1 diagonals (a power of two,
 * at least one more than the longest arc's diagonal span), or r = tdt_diag_row(s) for the
 * workspace array itself (ring_mask = -1). */
typedef struct tdt_diag_view {
    const double *v;
    int64_t ring_mask;
} tdt_diag_view_t;

TDT_HD int64_t tdt_view_index(const tdt_lattice_t *L, const tdt_diag_view_t *X, int64_t s,
                              int64_t u) {
    return (X->ring_mask >= 0 ? (s & X->ring_mask) : tdt_diag_row(s, L->frames)) * L->row + u;
}

/* Arc slots. The 2 * count arcs that enter (alpha) or leave (beta) a node, in the one order
 * every sum below uses: slot j = 2k is blank arc k, slot 2k + 1 label arc k. A slot is data: how
 * far its arc moves in t and in u, and which log-probs weigh it; a slot past 2 * count, or a
 * blank arc of duration 0, has dt = -1 and never exists. A sweep computes one term per slot
 * (-inf for an arc that does not exist at the node) and takes their log-sum-exp: the CPU
 * backend loops over a node's slots, a GPU sweep spreads them over the lanes of a group
 * (src/gpu/sweep.cuh); both call the functions below. */
typedef struct tdt_slot {
    int dt;       /* frames the arc advances, -1: no arc */
    int du;       /* labels the arc advances: 0 blank, 1 label */
    int k;        /* its duration index (lp_dur's) */
} tdt_slot_t;

TDT_HD int tdt_num_slots(const tdt_arcs_t *A) { return 2 * A->count; }

TDT_HD tdt_slot_t tdt_slot_of(const tdt_arcs_t *A, int j) {
    tdt_slot_t q;
    q.k = j >> 1;
    q.du = j & 1;
    q.dt = -1;
    if (j >= 0 && j < 2 * A->count) q.dt = q.du ? A->label_dur[q.k] : A->blank_dur[q.k];
    if (q.dt < 0) q.k = 0; /* keeps the absent arc's (discarded) loads in range */
    return q;
}

/* Slot q's arc into (t, u) exists: its source (t - dt, u - du) is a node. */
TDT_HD int tdt_slot_in(const tdt_slot_t *q, int64_t t, int64_t u) {
    return q->dt >= 0 && t >= q->dt && u >= q->du;
}
/* Slot q's arc out of (t, u) ends on a node (t + dt, u + du) of the lattice... */
TDT_HD int tdt_slot_out(const tdt_lattice_t *L, const tdt_slot_t *q, int64_t t, int64_t u) {
    return q->dt >= 0 && t + q->dt < L->T && u + q->du <= L->U;
}
/* ... or is a terminal blank arc: from (t, U) landing exactly on T. */
TDT_HD int tdt_slot_final(const tdt_lattice_t *L, const tdt_slot_t *q, int64_t t, int64_t u) {
    return q->du == 0 && q->dt > 0 && u == L->U && t + q->dt == L->T;
}

/* The two log-probs that weigh slot q's arc when it leaves node (t, u) (the weight of an arc
 * is a property of the node it leaves): the token's (blank or label) and the duration's (0 for
 * RNN-T). Returned apart, so a GPU sweep can have the loads in flight for a whole diagonal
 * before anything consumes them. */
TDT_HD void tdt_block_weight(const tdt_arcs_t *A, const tdt_slot_t *q, const double *w,
                             double *lp, double *dur) {
    *lp = w[q->du ? TDT_W_LABEL : TDT_W_BLANK];
    *dur = A->use_dur ? w[TDT_W_DUR + q->k] : 0.0;
}
TDT_HD void tdt_slot_weight(const tdt_lattice_t *L, const tdt_arcs_t *A, const tdt_slot_t *q,
                            int64_t t, int64_t u, double *lp, double *dur) {
    tdt_block_weight(A, q, tdt_node_block(L, t, u), lp, dur);
}

/* Weights of slot q's arc into (t, u), read at its source; an absent arc reads (t, u) itself
 * (in range) and its values are never used. */
TDT_HD void tdt_alpha_slot_weight(const tdt_lattice_t *L, const tdt_arcs_t *A, const tdt_slot_t *q,
                                  int64_t t, int64_t u, double *lp, double *dur) {
    const int e = tdt_slot_in(q, t, u);
    tdt_slot_weight(L, A, q, e ? t - q->dt : t, e ? u - q->du : u, lp, dur);
}

/* Weights of slot q's arc out of (t, u): the node's own. */
TDT_HD void tdt_beta_slot_weight(const tdt_lattice_t *L, const tdt_arcs_t *A, const tdt_slot_t *q,
                                 int64_t t, int64_t u, double *lp, double *dur) {
    tdt_slot_weight(L, A, q, t, u, lp, dur);
}

/* The terms from values already read: alpha's, alpha(source) a + (lp + dur) for an arc that
 * exists (e), else -inf; beta's, (lp + dur) + beta(destination) b for an arc that ends on a node
 * (e), lp + dur for a terminal one (f), else -inf. A sweep that keeps its operands elsewhere
 * (the GPU's staged ring) reads them its own way and forms the terms here. */
TDT_HD double tdt_alpha_term(int e, double a, double lp, double dur) {
    return e ? a + (lp + dur) : -TDT_INF;
}
TDT_HD double tdt_beta_term(int e, int f, double b, double lp, double dur) {
    const double w = lp + dur;
    return e ? w + b : f ? w : -TDT_INF;
}

/* alpha's term of slot q at (t, u), alpha(source) read through X. Only an existing arc reads
 * X (on a GPU, a predicated load: no branch, and nothing is read that no sweep wrote). */
TDT_HD double tdt_alpha_slot_term(const tdt_lattice_t *L, const tdt_diag_view_t *X,
                                  const tdt_slot_t *q, int64_t t, int64_t u, double lp, double dur) {
    const int e = tdt_slot_in(q, t, u);
    const double a = e ? X->v[tdt_view_index(L, X, t + u - q->dt - q->du, u - q->du)] : 0.0;
    return tdt_alpha_term(e, a, lp, dur);
}

/* beta's term of slot q at (t, u), beta(destination) read through X (0 for a terminal arc). */
TDT_HD double tdt_beta_slot_term(const tdt_lattice_t *L, const tdt_diag_view_t *X,
                                 const tdt_slot_t *q, int64_t t, int64_t u, double lp, double dur) {
    const int e = tdt_slot_out(L, q, t, u), f = tdt_slot_final(L, q, t, u);
    const double b = e ? X->v[tdt_view_index(L, X, t + u + q->dt + q->du, u + q->du)] : 0.0;
    return tdt_beta_term(e, f, b, lp, dur);
}

/* Max for a log-sum-exp that keeps NaN: once a term is NaN the max is NaN. Commutative in
 * value, so a reduction over lanes in any tree gives every lane the same max. */
TDT_HD double tdt_lse_max(double m, double x) { return (x > m || x != x) ? x : m; }

/* exp's Taylor coefficients 1/13!, 1/12!, ..., 1/2!, 1, 1, highest first (tdt_exp_le0). */
#define TDT_EXP_TAYLOR                                                                           \
    {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,  \
     1.0 / 40320.0,      1.0 / 5040.0,      1.0 / 720.0,      1.0 / 120.0,     1.0 / 24.0,      \
     1.0 / 6.0,          0.5,               1.0,              1.0}
/* 2^k for -1022 <= k <= 1023, from its exponent bits. */
TDT_HD double tdt_pow2i(int k) {
#if defined(__CUDA_ARCH__)
    return __hiloint2double((k + 1023) << 20, 0);
#else
    union {
        uint64_t u;
        double d;
    } v;
    v.u = (uint64_t)(k + 1023) << 52;
    return v.d;
#endif
}

/* exp(x) in float64 for a log-sum-exp's x - max <= 0, with no branch, so it vectorises (the
 * CPU's tdt_sweep_chunk: eight nodes a 512-bit vector; the GPU's sweeps take tdt_exp_le0_tab
 * below): x = -inf gives exactly 0, NaN gives NaN. Cody-Waite
 * reduction x = n ln2 + r, |r| <= ln2 / 2, the Taylor polynomial of degree 13 (TDT_EXP_TAYLOR;
 * truncation error below 5e-18 relative, so the result is within about 2 ulp of e^x), and 2^n
 * applied as one factor. Below -708 it gives 0: e^x is then under
 * 2^-1021, and every sum this exp feeds holds its max term's e^0 = 1, whose own rounding
 * (2^-53) is 2^968 times larger than what the flushed terms add up to (the sums come out the
 * same but in a tie of that rounding); from -708 up, n >= -1021 keeps 2^n and the result
 * normal, the same bits as before. (A form that followed e^x into the
 * subnormal range with two factors and a second clamp: 15 more instructions a warp a step in
 * the GPU's staged sweep, whose lanes took three exps each: dropped.) The clamp is a select (the
 * vectoriser's form); the host spells its FMAs its own way, as FMAs only where
 * the CPU has them (a compiler targeting x86-64 without FMA would call a software fma; a
 * multiply and an add keep the result within the same few ulp). */
#if defined(__CUDA_ARCH__) || defined(__FMA__)
#define TDT_EXP_FMA(a, b, c) fma(a, b, c)
#else
#define TDT_EXP_FMA(a, b, c) ((a) * (b) + (c))
#endif
TDT_HD double tdt_exp_le0(double x) {
    const double c[14] = TDT_EXP_TAYLOR;
#define TDT_EXP_C(i) c[i]
    const double xc = x > -708.0 ? x : -708.0; /* NaN too: kept below */
    const double n = rint(xc * 1.4426950408889634);
    double r = TDT_EXP_FMA(n, -6.93147180369123816490e-01, xc); /* ln2 high part: n * it is exact */
    r = TDT_EXP_FMA(n, -1.90821492927058770002e-10, r);         /* ln2 low part */
    double p = TDT_EXP_C(0);
    TDT_UNROLL for (int i = 1; i < 14; ++i) p = TDT_EXP_FMA(p, r, TDT_EXP_C(i));
#undef TDT_EXP_C
    const double e = p * tdt_pow2i((int)n); /* n in [-1021, 0] */
    return x != x ? x : (x < -708.0 ? 0.0 : e);
}

/* ---- the GPU sweeps' exp and log, from tables ---------------------------------------------
 * A GPU sweep's step is bound by its instruction stream (docs/performance.md, "The sweep"), and its
 * exps and log were ~200 of a warp's ~450 instructions a step. With small tables both take
 * short polynomials (H200: the staged step 8-9 % faster alone at base and parakeet, the f+b
 * 1-4 %). The tables, TDT_LSE_TAB (rounded to nearest from 60-digit values):
 *   [0, 32)    2^(j / 32)
 *   [32, 96)   inv_j = 1 / (1 + j / 64), rounded (so inv_0 = 1)
 *   [96, 160)  -log(inv_j) of that rounded inv_j (so 0 for j = 0)
 * A GPU kernel copies them into shared memory (src/gpu/sweep.cuh); the host tests read them
 * as a local array. */
#define TDT_LSE_TAB_N 160
#define TDT_LSE_TAB                                                                                \
    {0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,       \
     0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,       \
     0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,       \
     0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,       \
     0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,       \
     0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,       \
     0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,       \
     0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,       \
     0x1.0000000000000p+0, 0x1.f81f81f81f820p-1, 0x1.f07c1f07c1f08p-1, 0x1.e9131abf0b767p-1,       \
     0x1.e1e1e1e1e1e1ep-1, 0x1.dae6076b981dbp-1, 0x1.d41d41d41d41dp-1, 0x1.cd85689039b0bp-1,       \
     0x1.c71c71c71c71cp-1, 0x1.c0e070381c0e0p-1, 0x1.bacf914c1bad0p-1, 0x1.b4e81b4e81b4fp-1,       \
     0x1.af286bca1af28p-1, 0x1.a98ef606a63bep-1, 0x1.a41a41a41a41ap-1, 0x1.9ec8e951033d9p-1,       \
     0x1.999999999999ap-1, 0x1.948b0fcd6e9e0p-1, 0x1.8f9c18f9c18fap-1, 0x1.8acb90f6bf3aap-1,       \
     0x1.8618618618618p-1, 0x1.8181818181818p-1, 0x1.7d05f417d05f4p-1, 0x1.78a4c8178a4c8p-1,       \
     0x1.745d1745d1746p-1, 0x1.702e05c0b8170p-1, 0x1.6c16c16c16c17p-1, 0x1.6816816816817p-1,       \
     0x1.642c8590b2164p-1, 0x1.6058160581606p-1, 0x1.5c9882b931057p-1, 0x1.58ed2308158edp-1,       \
     0x1.5555555555555p-1, 0x1.51d07eae2f815p-1, 0x1.4e5e0a72f0539p-1, 0x1.4afd6a052bf5bp-1,       \
     0x1.47ae147ae147bp-1, 0x1.446f86562d9fbp-1, 0x1.4141414141414p-1, 0x1.3e22cbce4a902p-1,       \
     0x1.3b13b13b13b14p-1, 0x1.3813813813814p-1, 0x1.3521cfb2b78c1p-1, 0x1.323e34a2b10bfp-1,       \
     0x1.2f684bda12f68p-1, 0x1.2c9fb4d812ca0p-1, 0x1.29e4129e4129ep-1, 0x1.27350b8812735p-1,       \
     0x1.2492492492492p-1, 0x1.21fb78121fb78p-1, 0x1.1f7047dc11f70p-1, 0x1.1cf06ada2811dp-1,       \
     0x1.1a7b9611a7b96p-1, 0x1.1811811811812p-1, 0x1.15b1e5f75270dp-1, 0x1.135c81135c811p-1,       \
     0x1.1111111111111p-1, 0x1.0ecf56be69c90p-1, 0x1.0c9714fbcda3bp-1, 0x1.0a6810a6810a7p-1,       \
     0x1.0842108421084p-1, 0x1.0624dd2f1a9fcp-1, 0x1.0410410410410p-1, 0x1.0204081020408p-1,       \
     0x0p+0, 0x1.fc0a8b0fc03c4p-7, 0x1.f829b0e7832f8p-6, 0x1.77458f632dcffp-5,                     \
     0x1.f0a30c01162a8p-5, 0x1.341d7961bd1d0p-4, 0x1.6f0d28ae56b4ep-4, 0x1.a926d3a4ad562p-4,       \
     0x1.e27076e2af2eap-4, 0x1.0d77e7cd08e5bp-3, 0x1.29552f81ff521p-3, 0x1.44d2b6ccb7d1cp-3,       \
     0x1.5ff3070a793d6p-3, 0x1.7ab890210d907p-3, 0x1.9525a9cf456b6p-3, 0x1.af3c94e80bff3p-3,       \
     0x1.c8ff7c79a9a20p-3, 0x1.e27076e2af2e8p-3, 0x1.fb9186d5e3e29p-3, 0x1.0a324e27390e2p-2,       \
     0x1.1675cababa60fp-2, 0x1.22941fbcf7966p-2, 0x1.2e8e2bae11d31p-2, 0x1.3a64c556945eap-2,       \
     0x1.4618bc21c5ec2p-2, 0x1.51aad872df82ep-2, 0x1.5d1bdbf5809cap-2, 0x1.686c81e9b14adp-2,       \
     0x1.739d7f6bbd007p-2, 0x1.7eaf83b82afc2p-2, 0x1.89a3386c1425bp-2, 0x1.947941c2116fbp-2,       \
     0x1.9f323ecbf984dp-2, 0x1.a9cec9a9a084ap-2, 0x1.b44f77bcc8f64p-2, 0x1.beb4d9da71b7ap-2,       \
     0x1.c8ff7c79a9a21p-2, 0x1.d32fe7e00ebd5p-2, 0x1.dd46a04c1c4a1p-2, 0x1.e744261d68789p-2,       \
     0x1.f128f5faf06ecp-2, 0x1.faf588f78f31dp-2, 0x1.02552a5a5d0ffp-1, 0x1.0723e5c1cdf41p-1,       \
     0x1.0be72e4252a83p-1, 0x1.109f39e2d4c96p-1, 0x1.154c3d2f4d5eap-1, 0x1.19ee6b467c96fp-1,       \
     0x1.1e85f5e7040d1p-1, 0x1.23130d7bebf43p-1, 0x1.2795e1289b11bp-1, 0x1.2c0e9ed448e8cp-1,       \
     0x1.307d7334f10bep-1, 0x1.34e289d9ce1d2p-1, 0x1.393e0d3562a1ap-1, 0x1.3d9026a7156fbp-1,       \
     0x1.41d8fe84672afp-1, 0x1.4618bc21c5ec2p-1, 0x1.4a4f85db03ebbp-1, 0x1.4e7d811b75bb0p-1,       \
     0x1.52a2d265bc5abp-1, 0x1.56bf9d5b3f399p-1, 0x1.5ad404c359f2dp-1, 0x1.5ee02a9241676p-1}

/* The high and low 32-bit words of a double, and a double from them. */
TDT_HD int32_t tdt_hi_word(double x) {
#if defined(__CUDA_ARCH__)
    return __double2hiint(x);
#else
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (int32_t)(uint32_t)(u >> 32);
#endif
}
TDT_HD int32_t tdt_lo_word(double x) {
#if defined(__CUDA_ARCH__)
    return __double2loint(x);
#else
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return (int32_t)(uint32_t)u;
#endif
}
TDT_HD double tdt_from_words(int32_t hi, int32_t lo) {
#if defined(__CUDA_ARCH__)
    return __hiloint2double(hi, lo);
#else
    const uint64_t u = ((uint64_t)(uint32_t)hi << 32) | (uint32_t)lo;
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* The two functions' constants: on a GPU in the constant bank, where a float64 FMA reads one as
 * an operand (a literal costs two uniform-register moves, re-made each step of a sweep), on the
 * host a local array. [0] the 1.5 * 2^52 shifter, [1] 32 / ln2, [2] [3] -ln2 / 32 in two
 * parts, [4..10] e^r's Taylor coefficients 1/6! .. 1, 1, [11..17] log1p's series -1/8 .. -1/2,
 * [18] [19] ln2 in two parts. Both use fma() on the host too (a software one where the CPU has
 * none): only tests call them there, and r = m inv_j - 1 needs its single rounding. */
#define TDT_LSE_POLY                                                                             \
    {6755399441055744.0, 46.16624130844682853, -6.93147180369123816490e-01 / 32.0,              \
     -1.90821492927058770002e-10 / 32.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5,  \
     1.0, 1.0, -1.0 / 8.0, 1.0 / 7.0, -1.0 / 6.0, 1.0 / 5.0, -1.0 / 4.0, 1.0 / 3.0, -0.5,         \
     6.93147180369123816490e-01, 1.90821492927058770002e-10}
#if defined(__CUDACC__)
static __constant__ double tdt_lse_poly_c[20] = TDT_LSE_POLY;
#endif
#if defined(__CUDA_ARCH__)
#define TDT_LSE_C(i) tdt_lse_poly_c[i]
#else
#define TDT_LSE_C(i) tdt_lse_poly_host[i]
#endif

/* exp(x) for x <= 0 as tdt_exp_le0 gives it (0 below -708 and for -inf, NaN kept, exactly 1 at
 * 0), from the table: x = (32 n + j) ln2 / 32 + r with |r| <= ln2 / 64, e^x = 2^n 2^(j / 32) e^r,
 * e^r by its Taylor polynomial of degree 6 (truncation below 4e-18 relative); n + j / 32 rounded
 * by the 1.5 * 2^52 shifter, whose low word is the integer. Within 2 ulp of e^x. */
TDT_HD double tdt_exp_le0_tab(double x, const double *tab) {
#if !defined(__CUDA_ARCH__)
    const double tdt_lse_poly_host[20] = TDT_LSE_POLY;
#endif
    const double xc = x > -708.0 ? x : -708.0; /* NaN too: kept below */
    const double ks = fma(xc, TDT_LSE_C(1), TDT_LSE_C(0));
    const int32_t k = tdt_lo_word(ks);
    const double kd = ks - TDT_LSE_C(0);
    double r = fma(kd, TDT_LSE_C(2), xc);
    r = fma(kd, TDT_LSE_C(3), r);
    double p = TDT_LSE_C(4);
    TDT_UNROLL for (int i = 5; i < 11; ++i) p = fma(p, r, TDT_LSE_C(i));
    const double e = tab[k & 31] * p * tdt_pow2i(k >> 5); /* k >> 5 in [-1022, 0] */
    return x != x ? x : (x < -708.0 ? 0.0 : e);
}

/* log(x) for a log-sum-exp's sum of exps, x >= 1 (the max term's exp is 1) and finite, or NaN
 * (kept): x = 2^e m with m in [1, 2), j = m's top 6 fraction bits, r = m inv_j - 1 (one
 * rounding), 0 <= r < 1 / 64 up to that rounding, log m = -log(inv_j) + log1p(r), log1p by its
 * series to r^8 (truncation below 6e-18), then e ln2 in two parts. Exactly 0 at 1; within 4 ulp
 * and 2^-50 absolutely of log(x) over [1, 64) (its result is added to the terms' max). */
TDT_HD double tdt_log_ge1_tab(double x, const double *tab) {
#if !defined(__CUDA_ARCH__)
    const double tdt_lse_poly_host[20] = TDT_LSE_POLY;
#endif
    const int32_t hi = tdt_hi_word(x), lo = tdt_lo_word(x);
    const int32_t e = (hi >> 20) - 1023;
    const int32_t j = (hi >> 14) & 63;
    const double m = tdt_from_words((hi & 0x000fffff) | 0x3ff00000, lo);
    const double r = fma(m, tab[32 + j], -1.0);
    double p = TDT_LSE_C(11);
    TDT_UNROLL for (int i = 12; i < 18; ++i) p = fma(p, r, TDT_LSE_C(i));
    const double l1p = fma(r * r, p, r);
    const double ed = (double)e;
    return x != x ? x : fma(ed, TDT_LSE_C(18), tab[96 + j] + fma(ed, TDT_LSE_C(19), l1p));
}
#undef TDT_LSE_C
#undef TDT_EXP_FMA

/* log-sum-exp from the terms' max m and sum of exp(term - m) (or its log): -inf when every term
 * is -inf (the sum is then NaN and ignored), NaN when m is NaN. */
TDT_HD double tdt_lse_finish_log(double m, double log_sum) {
    const double r = m + log_sum;
    return m == -TDT_INF ? -TDT_INF : r;
}
TDT_HD double tdt_lse_finish(double m, double sum) { return tdt_lse_finish_log(m, log(sum)); }

/* Two-pass log-sum-exp of x[0..n-1] (-inf for absent arcs: exp(-inf - m) is exactly 0), with
 * no branch around the exps so they run independently. */
TDT_HD double tdt_lse_terms(const double *x, int n) {
    double m = -TDT_INF, sum = 0.0;
    for (int j = 0; j < n; ++j) m = tdt_lse_max(m, x[j]);
    for (int j = 0; j < n; ++j) sum += exp(x[j] - m);
    return tdt_lse_finish(m, sum);
}

/* alpha(0, 0) = 0, whatever its (arc-less) log-sum-exp says. */
TDT_HD double tdt_alpha_start(int64_t t, int64_t u, double lse) {
    return t == 0 && u == 0 ? 0.0 : lse;
}

/* log p(y | x) from alpha: the terminal blank arcs, from (T - dt, U) landing exactly on T.
 * -inf if there are none. */
TDT_HD double tdt_log_likelihood(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha) {
    double x[2 * TDT_MAX_DURATIONS], lp, dur;
    const int n = tdt_num_slots(A);
    for (int j = 0; j < n; ++j) {
        const tdt_slot_t q = tdt_slot_of(A, j);
        x[j] = -TDT_INF;
        if (q.du == 0 && q.dt > 0 && L->T - q.dt >= 0) {
            const int64_t i = tdt_node_index(L->frames, L->row, L->T - q.dt, L->U);
            tdt_slot_weight(L, A, &q, L->T - q.dt, L->U, &lp, &dur);
            x[j] = alpha[i] + (lp + dur);
        }
    }
    return tdt_lse_terms(x, n);
}

/* Number of anti-diagonals of a sample: s = t + u runs over 0 .. T - 1 + U. */
TDT_HD int64_t tdt_num_diagonals(const tdt_lattice_t *L) { return L->T > 0 ? L->T + L->U : 0; }

/* Range of u on anti-diagonal s: u in [*u_lo, *u_hi] (empty when *u_lo > *u_hi). */
TDT_HD void tdt_diagonal_range(const tdt_lattice_t *L, int64_t s, int64_t *u_lo, int64_t *u_hi) {
    int64_t lo = s - (L->T - 1);
    *u_lo = lo > 0 ? lo : 0;
    *u_hi = s < L->U ? s : L->U;
}

/* x / n in the accumulate type (options.normalize_costs): a float64 division, or for the
 * 32-bit accumulate type the float32 division of x rounded to float32, as a caller dividing the
 * stored cost or upstream by its label count would get. */
TDT_HD double tdt_acc_div(double x, int acc_double, int64_t n) {
    return acc_double ? x / (double)n : (double)((float)x / (float)n);
}

/* x / n as x times the reciprocal of n, each rounded to the accumulate type
 * (options.batch_mean): how torch divides a CUDA tensor by a number (its mean backward
 * included), within an ulp of tdt_acc_div. */
TDT_HD double tdt_acc_div_recip(double x, int acc_double, int64_t n) {
    if (acc_double) return x * (1.0 / (double)n);
    const float r = 1.0f / (float)n;
    return (double)((float)x * r);
}

/* The reported cost from log p(y|x): -(1 + lambda) log p (FastEmit scales the cost too);
 * +inf for an infeasible sample (ll = -inf), NaN for NaN; with per_label
 * (options.normalize_costs) divided by the sample's label count U (tdt_acc_div). */
TDT_HD double tdt_cost(double ll, double fastemit_lambda, int per_label, int acc_double, int64_t U) {
    const double cost = -(1.0 + fastemit_lambda) * ll;
    return per_label ? tdt_acc_div(cost, acc_double, U) : cost;
}

/* Cost b of costs (float64 when acc_double, else float32), as a double. */
TDT_HD double tdt_cost_at(const void *costs, int acc_double, int64_t b) {
    return acc_double ? ((const double *)costs)[b] : (double)((const float *)costs)[b];
}

/* options.reduction of the B costs: their sum in float64, b ascending, divided by B for the
 * mean (0 / 0, NaN, for an empty batch's mean); the caller rounds it once to the accumulate
 * type. The one order both backends sum in. */
TDT_HD double tdt_reduce_costs(const void *costs, int acc_double, int64_t B, int mean) {
    /* eight loads before their eight adds: on the GPU one thread sums costs that other blocks
     * just wrote, from L2, and their latencies then overlap (the adds keep their order) */
    double sum = 0.0;
    int64_t b = 0;
    for (; b + 8 <= B; b += 8) {
        double v[8];
        for (int k = 0; k < 8; ++k) v[k] = tdt_cost_at(costs, acc_double, b + k);
        for (int k = 0; k < 8; ++k) sum += v[k];
    }
    for (; b < B; ++b) sum += tdt_cost_at(costs, acc_double, b);
    return mean ? sum / (double)B : sum;
}

/* ---- log p(y|x) at a cut ------------------------------------------------------------------ */

/* The most diagonals one arc spans: the largest dt + du of the arc set (at least 1). */
TDT_HD int64_t tdt_arcs_span(const tdt_arcs_t *A) {
    int64_t span = 1;
    for (int k = 0; k < A->count; ++k) {
        if (A->blank_dur[k] > span) span = A->blank_dur[k];
        if (A->label_dur[k] >= 0 && (int64_t)A->label_dur[k] + 1 > span) span = (int64_t)A->label_dur[k] + 1;
    }
    return span;
}

/* Every path of the lattice crosses the cut between diagonals c - 1 and c (0 < c <= S, S the
 * sample's diagonals) on exactly one arc, since every arc raises the diagonal (a terminal arc
 * lands on diagonal S). So
 *     log p(y|x) = logsumexp over the arcs from diagonals s < c to diagonals >= c of
 *                  alpha(source) + weight + beta(destination)   (beta 0 past a terminal arc),
 * and these arcs leave the tdt_arcs_span(A) diagonals below c. c = S gives the terminal arcs of
 * tdt_log_likelihood; the middle cut tdt_mid_cut(S) needs only alpha up to diagonal c - 1 and
 * beta from diagonal c on, which both sweeps have once they have crossed the middle: the GPU's
 * fused schedule takes its gradients' log p(y|x) there (docs/math.md, section 5). */
TDT_HD int64_t tdt_mid_cut(int64_t S) { return S - S / 2; }

/* The term of arc slot q out of node (t, u) (diagonal s = t + u < c) at the cut before diagonal
 * c: alpha(t, u) plus beta's term of the slot (tdt_beta_slot_term), or -inf for an arc that does
 * not exist or stays below c. */
TDT_HD double tdt_cut_slot_term(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha,
                                const double *beta, const tdt_slot_t *q, int64_t t, int64_t u,
                                int64_t c) {
    if (q->dt < 0 || t + u + q->dt + q->du < c) return -TDT_INF;
    double lp, dur;
    tdt_beta_slot_weight(L, A, q, t, u, &lp, &dur);
    const tdt_diag_view_t X = {beta, -1};
    return alpha[tdt_node_index(L->frames, L->row, t, u)] + tdt_beta_slot_term(L, &X, q, t, u, lp, dur);
}

/* ---- gradients ---------------------------------------------------------------------------- */

/* The upstream gradient of sample b (tdt_backward()'s grad_costs): 1 without one; else element
 * b, or element 0 for every sample with options.grad_costs_scalar (scalar); double or float by
 * the accumulate type (acc_double); with mean_of > 0 (options.batch_mean: the batch size B)
 * times its reciprocal (tdt_acc_div_recip), then with per_label (options.normalize_costs)
 * divided by the sample's label count U (tdt_acc_div). */
TDT_HD double tdt_upstream(const void *grad_costs, int acc_double, int scalar, int64_t b,
                           int64_t mean_of, int per_label, int64_t U) {
    double g = 1.0;
    if (grad_costs) {
        const int64_t i = scalar ? 0 : b;
        g = acc_double ? ((const double *)grad_costs)[i] : (double)((const float *)grad_costs)[i];
    }
    if (mean_of > 0) g = tdt_acc_div_recip(g, acc_double, mean_of);
    return per_label ? tdt_acc_div(g, acc_double, U) : g;
}

/* Arc occupancy exp(alpha + w + beta(dst) - LL); exactly 0 when any term is -inf. */
TDT_HD double tdt_occupancy(double alpha_src, double w, double beta_dst, double ll) {
    double x = alpha_src + w + beta_dst;
    return x == -TDT_INF ? 0.0 : exp(x - ll);
}

/* Occupancy of slot q's arc out of node (t, u), whose alpha is a: 0 when the arc does not
 * exist (or a is -inf). The arc's loads depend on its indices alone, not on a, so a GPU lane
 * has them in flight together with a's (one memory round trip, not two). */
TDT_HD double tdt_slot_occupancy(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *beta,
                                 const tdt_slot_t *q, int64_t t, int64_t u, double a, double ll) {
    const int e = tdt_slot_out(L, q, t, u);
    if (!(e || tdt_slot_final(L, q, t, u))) return 0.0;
    double lp, dur;
    tdt_slot_weight(L, A, q, t, u, &lp, &dur);
    const double b = e ? beta[tdt_node_index(L->frames, L->row, t + q->dt, u + q->du)] : 0.0;
    return a == -TDT_INF ? 0.0 : tdt_occupancy(a, lp + dur, b, ll);
}

/* The log of that occupancy, alpha + w + beta(dst) - LL, or -inf where tdt_slot_occupancy is
 * exactly 0 (the CPU's; the GPU keeps tdt_slot_occupancy's own expression: a shared helper for
 * the two cost the H200's gradient pass 3-7 % at large). It is <= 0
 * but for rounding (an occupancy is a probability), so tdt_exp_le0 takes it: the CPU's
 * gradient pass exponentiates a run of nodes' arguments together, vectorised. w: node (t, u)'s
 * block (tdt_node_block), which every slot of the node reads. */
TDT_HD double tdt_slot_occupancy_arg(const tdt_lattice_t *L, const tdt_arcs_t *A,
                                     const double *beta, const tdt_slot_t *q, int64_t t,
                                     int64_t u, const double *w, double a, double ll) {
    const int e = tdt_slot_out(L, q, t, u);
    if (!(e || tdt_slot_final(L, q, t, u))) return -TDT_INF;
    double lp, dur;
    tdt_block_weight(A, q, w, &lp, &dur);
    const double b = e ? beta[tdt_node_index(L->frames, L->row, t + q->dt, u + q->du)] : 0.0;
    const double x = a + (lp + dur) + b;
    return a == -TDT_INF || x == -TDT_INF ? -TDT_INF : x - ll;
}

/* Gradient coefficients of a node from its slots' occupancies occ[j] (tdt_slot_occupancy;
 * slot 2k blank arc k, 2k + 1 label arc k), summed in arc order. Both backends end here, the
 * GPU after spreading the slots over a node's lanes (grad.cuh), so the sums are the same
 * operations in the same order, however the occupancies were computed. */
TDT_HD void tdt_node_grad_of(const double *occ, int count, double fastemit_lambda,
                             tdt_node_grad_t *g) {
    double occ_blank = 0.0, occ_label = 0.0;
    for (int k = 0; k < count; ++k) {
        g->dur_arc[k] = occ[2 * k] + occ[2 * k + 1];
        occ_blank += occ[2 * k];
        occ_label += occ[2 * k + 1];
    }
    g->blank_occ = occ_blank;
    g->label_occ = (1.0 + fastemit_lambda) * occ_label;
    g->tok_occ = occ_blank + g->label_occ;
    g->dur_occ = occ_blank + occ_label;
}

/* Gradient coefficients of node (t, u) for a feasible sample (ll finite). */
TDT_HD void tdt_node_grad(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha,
                          const double *beta, int64_t t, int64_t u, double ll,
                          double fastemit_lambda, tdt_node_grad_t *g) {
    const double a = alpha[tdt_node_index(L->frames, L->row, t, u)];
    double occ[2 * TDT_MAX_DURATIONS];
    for (int j = 0; j < tdt_num_slots(A); ++j) {
        const tdt_slot_t q = tdt_slot_of(A, j);
        occ[j] = tdt_slot_occupancy(L, A, beta, &q, t, u, a, ll);
    }
    tdt_node_grad_of(occ, A->count, fastemit_lambda, g);
}

/* The occupancies' logs of node (t, u) (tdt_slot_occupancy_arg), slot by slot into x[0..slots):
 * tdt_node_grad's values once each is exponentiated, where the caller exponentiates many nodes'
 * at once (the CPU's gradient pass). */
TDT_HD void tdt_node_occupancy_args(const tdt_lattice_t *L, const tdt_arcs_t *A,
                                    const double *alpha, const double *beta, int64_t t,
                                    int64_t u, double ll, double *x) {
    const double a = alpha[tdt_node_index(L->frames, L->row, t, u)];
    const double *w = tdt_node_block(L, t, u); /* found once for the node's slots */
    for (int j = 0; j < tdt_num_slots(A); ++j) {
        const tdt_slot_t q = tdt_slot_of(A, j);
        x[j] = tdt_slot_occupancy_arg(L, A, beta, &q, t, u, w, a, ll);
    }
}

/* dLoss/dz for one token element: p = softmax(z)_v (0 for log-prob inputs), before the
 * upstream scale; clamp > 0 clips it. */
TDT_HD double tdt_token_grad(const tdt_node_grad_t *g, double p, int is_blank, int is_label,
                             double clamp) {
    double x = p * g->tok_occ;
    if (is_blank) x -= g->blank_occ;
    if (is_label) x -= g->label_occ;
    if (clamp > 0.0) x = x > clamp ? clamp : (x < -clamp ? -clamp : x);
    return x;
}

/* dLoss/dh for duration k: q = softmax(h)_k (0 for log-prob inputs), before the upstream scale. */
TDT_HD double tdt_duration_grad(const tdt_node_grad_t *g, double q, int k) {
    return q * g->dur_occ - g->dur_arc[k];
}

/* ---- per-node normalisation --------------------------------------------------------------- */

/* Nodes that one tdt_log_softmax_small call normalises at most. */
#define TDT_SOFTMAX_NODES 32

/* Duration log-softmax in place of nodes <= TDT_SOFTMAX_NODES nodes, entry k (k < count, count
 * is small) of node i at h[k * stride + i], with the sweeps' two-pass rule: NaN or +inf
 * anywhere in a node makes all its entries NaN (so the sample's cost is NaN even when the
 * offending duration has no arc at this node); all -inf gives NaN entries as well (-inf -
 * -inf). The exps are tdt_exp_le0 (each x - max <= 0) and independent across the nodes, so
 * the CPU's loops over i vectorise; each node's sum still adds its entries in order k. */
TDT_HD void tdt_log_softmax_small(double *h, int count, int nodes, int stride) {
    double m[TDT_SOFTMAX_NODES], sum[TDT_SOFTMAX_NODES];
    for (int i = 0; i < nodes; ++i) {
        m[i] = -TDT_INF;
        sum[i] = 0.0;
    }
    for (int k = 0; k < count; ++k)
        for (int i = 0; i < nodes; ++i) m[i] = tdt_lse_max(m[i], h[k * stride + i]);
    for (int k = 0; k < count; ++k)
        for (int i = 0; i < nodes; ++i) sum[i] += tdt_exp_le0(h[k * stride + i] - m[i]);
    for (int i = 0; i < nodes; ++i) m[i] = tdt_lse_finish(m[i], sum[i]);
    for (int k = 0; k < count; ++k)
        for (int i = 0; i < nodes; ++i) h[k * stride + i] -= m[i];
}

/* ==== Sweeps with per-diagonal geometry (the OpenMP backend's loops) ============================
 *
 * The functions above locate every arc's other end from scratch (tdt_slot_of, tdt_node_index,
 * tdt_view_index: a tdt_diag_row and a 64-bit multiply per arc). A sweep that walks the
 * diagonals in order can do that once: the slots once per sample, and for each slot once per
 * diagonal the row that holds the diagonal of its arcs' other ends (they are contiguous in u
 * there, see tdt_node_index). Existence, weights, terms and the log-sum-exp are the functions
 * above, so each node's value is bit for bit that of the plain loop over its slots
 * (tests/test_lattice.cc checks this). Nothing above this section calls into it; the CUDA
 * kernels do not use it. */

/* Node index of the first entry of the row that holds diagonal s, so node (s - u, u) is at
 * tdt_diag_offset(L, s) + u; 0 for s < 0 (a diagonal with no nodes, never read). */
TDT_HD int64_t tdt_diag_offset(const tdt_lattice_t *L, int64_t s) {
    return s >= 0 ? tdt_diag_row(s, L->frames) * L->row : 0;
}

/* A sweep's geometry: the slots of a node (tdt_slot_of, set once per sample by
 * tdt_sweep_geo_init) and, for the diagonal s being swept (tdt_sweep_geo_diag), the row
 * offset of s and of each slot's other end's diagonal: s - dt - du for alpha (the arc's
 * source), s + dt + du for beta (its destination). A slot's other ends are then read through
 * the view {v + off[j], ring_mask 0}, a ring of that one diagonal: tdt_view_index gives u. */
typedef struct tdt_sweep_geo {
    int n;                                /* tdt_num_slots */
    int is_beta;                          /* 0: alpha, 1: beta */
    const double *v;                      /* the workspace array swept (alpha or beta) */
    int64_t node;                         /* tdt_diag_offset of s: node (s - u, u) is node + u */
    tdt_slot_t q[2 * TDT_MAX_DURATIONS];  /* slot j */
    int64_t off[2 * TDT_MAX_DURATIONS];   /* tdt_diag_offset of slot j's other end's diagonal */
} tdt_sweep_geo_t;

TDT_HD void tdt_sweep_geo_init(tdt_sweep_geo_t *G, const tdt_arcs_t *A, const double *v,
                               int is_beta) {
    G->n = tdt_num_slots(A);
    G->is_beta = is_beta;
    G->v = v;
    G->node = 0;
    for (int j = 0; j < G->n; ++j) G->q[j] = tdt_slot_of(A, j);
}

/* Points G at diagonal s. */
TDT_HD void tdt_sweep_geo_diag(tdt_sweep_geo_t *G, const tdt_lattice_t *L, int64_t s) {
    G->node = tdt_diag_offset(L, s);
    for (int j = 0; j < G->n; ++j) {
        const int64_t span = (int64_t)G->q[j].dt + G->q[j].du; /* dt may be INT_MAX */
        G->off[j] = tdt_diag_offset(L, G->is_beta ? s + span : s - span);
    }
}

/* Nodes of a diagonal that one tdt_sweep_chunk call computes at most. */
#define TDT_SWEEP_CHUNK 32

/* alpha (G->is_beta = 0) or beta of the nodes (s - u, u), u = lo .. hi (hi - lo <
 * TDT_SWEEP_CHUNK), of G's diagonal s, into out[u - lo]: for each node the log-sum-exp over its
 * slots of their terms. Organised across the nodes: the terms slot by slot, then the
 * log-sum-exp's max (tdt_lse_max), its sum and tdt_lse_finish node by node within each step,
 * so the exps and logs of different nodes are independent work and the max needs no branch.
 * Each node still sees its slots in order, with tdt_lse_terms's arithmetic but for the exp,
 * tdt_exp_le0 (branch-free, so each step's loop over the nodes vectorises), whose sum leaves
 * out a -inf term (an arc that does not exist, or an unreachable end): it would add
 * exp(-inf - m) == 0 and never be the max, except where every term is -inf (then m - m is
 * NaN, and tdt_lse_finish gives -inf whatever the sum). */
TDT_HD void tdt_sweep_chunk(const tdt_sweep_geo_t *G, const tdt_lattice_t *L, const tdt_arcs_t *A,
                            int64_t s, int64_t lo, int64_t hi, double *out) {
    double x[2 * TDT_MAX_DURATIONS][TDT_SWEEP_CHUNK], m[TDT_SWEEP_CHUNK], sum[TDT_SWEEP_CHUNK];
    const int nn = (int)(hi - lo + 1);
    /* the workspace's blocks by node index, the alpha view's row of the source's diagonal
       (G->off) plus u - du, as X reads alpha there; elsewhere (the gradient's rows) by (t, u) */
    const int by_index = L->wb.frames > 0;
    for (int j = 0; j < G->n; ++j) {
        const tdt_slot_t *q = &G->q[j];
        const tdt_diag_view_t X = {G->v + G->off[j], 0};
        for (int i = 0; i < nn; ++i) {
            const int64_t u = lo + i, t = s - u;
            double lp, dur;
            if (G->is_beta) { /* the node's own weights */
                tdt_block_weight(A, q, by_index ? tdt_wblock_node(&L->wb, 0, G->node + u)
                                                : tdt_node_block(L, t, u), &lp, &dur);
                x[j][i] = tdt_beta_slot_term(L, &X, q, t, u, lp, dur);
            } else { /* the source's weights; the node's if none */
                const int e = tdt_slot_in(q, t, u);
                tdt_block_weight(A, q,
                                 by_index ? tdt_wblock_node(&L->wb, 0, e ? G->off[j] + u - q->du : G->node + u)
                                          : tdt_node_block(L, e ? t - q->dt : t, e ? u - q->du : u),
                                 &lp, &dur);
                x[j][i] = tdt_alpha_slot_term(L, &X, q, t, u, lp, dur);
            }
        }
    }
    for (int i = 0; i < nn; ++i) {
        m[i] = -TDT_INF;
        sum[i] = 0.0;
    }
    for (int j = 0; j < G->n; ++j)
        for (int i = 0; i < nn; ++i) m[i] = tdt_lse_max(m[i], x[j][i]);
    for (int j = 0; j < G->n; ++j)
        for (int i = 0; i < nn; ++i) {
            const double e = tdt_exp_le0(x[j][i] - m[i]);
            sum[i] += x[j][i] != -TDT_INF ? e : 0.0;
        }
    for (int i = 0; i < nn; ++i) {
        const double r = tdt_lse_finish(m[i], sum[i]);
        out[i] = G->is_beta ? r : tdt_alpha_start(s - lo - i, lo + i, r);
    }
}

#endif /* TDT_COMMON_LATTICE_H */
