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
 * contiguous in u: a sweep over a diagonal reads and writes whole cache lines. lp_dur is
 * indexed n * count + k.
 *
 * Log-sum-exp of a node (tdt_lse_terms): two passes over its arc terms (all terms first, their
 * max, then independent exps and one log, with no branch between them), so the exps of one
 * node do not wait on each other. NaN in any term gives NaN; a node whose terms are all -inf
 * (or that has no arc) gets -inf; an absent arc is a -inf term and contributes exactly 0.
 *
 * Sweeps in two steps: tdt_alpha_terms / tdt_beta_terms gather the arc weights of a node (the
 * normaliser's output, known before the sweep starts, so a GPU sweep loads the next diagonal's
 * while it computes the current one), and tdt_alpha_combine / tdt_beta_combine add them to the
 * alphas / betas of the arcs' other ends, read through a tdt_diag_view_t (the workspace array,
 * or a ring of the last few diagonals in GPU shared memory). tdt_alpha_node / tdt_beta_node are
 * the two steps together on the workspace array (the CPU backend's call).
 *
 * Determinism: every function visits arcs in the same fixed order (k ascending, blank before
 * label), so a node's value does not depend on the thread or block that computes it.
 */
#ifndef TDT_COMMON_LATTICE_H
#define TDT_COMMON_LATTICE_H

#include "tdt.h"

#include "hd.h"

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
    const double *lp_blank; /* (T, row): log p(blank) - sigma */
    const double *lp_label; /* (T, row): log p(y_{u+1}) - sigma, for u < U */
    const double *lp_dur;   /* (T, row, count): duration log-probs (TDT only) */
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

/* Row of the per-node arrays that holds anti-diagonal s, 0 <= s < max_frames + max_labels:
 * s mod max_frames (a subtraction in the common case U < T, a division only beyond 2 T). */
TDT_HD int64_t tdt_diag_row(int64_t s, int64_t max_frames) {
    return s < max_frames ? s : (s - max_frames < max_frames ? s - max_frames : s % max_frames);
}

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

/* Duration log-prob of arc k at node n (0 for RNN-T). */
TDT_HD double tdt_arc_dur(const tdt_lattice_t *L, const tdt_arcs_t *A, int64_t n, int k) {
    return A->use_dur ? L->lp_dur[n * A->count + k] : 0.0;
}

/* ---- the sweeps ---------------------------------------------------------------------------- */

/* Where a combine step reads alpha (or beta) of node (s - u, u) on anti-diagonal s
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

/* The arc weights of one node's arcs, gathered apart from the alphas / betas they are added
 * to: for arc k of each kind, the token log-prob and the duration log-prob (0 for RNN-T) of
 * the node the arc leaves, kept apart so that a GPU sweep can have these loads in flight for a
 * whole diagonal before anything consumes them. Entries of arcs that do not exist hold values
 * of some node of the lattice (so every load is in range) and are never used. */
typedef struct tdt_arc_terms {
    double lp_blank[TDT_MAX_DURATIONS], dur_blank[TDT_MAX_DURATIONS]; /* blank arc k */
    double lp_label[TDT_MAX_DURATIONS], dur_label[TDT_MAX_DURATIONS]; /* label arc k */
} tdt_arc_terms_t;

/* Max for a log-sum-exp that keeps NaN: once a term is NaN the max is NaN. */
TDT_HD double tdt_lse_max(double m, double x) { return (x > m || x != x) ? x : m; }

/* Existence of the arcs into (t, u) (alpha) and out of it (beta), shared by the steps below. */
TDT_HD int tdt_blank_in(const tdt_arcs_t *A, int k, int64_t t) {
    return A->blank_dur[k] > 0 && t - A->blank_dur[k] >= 0;
}
TDT_HD int tdt_label_in(const tdt_arcs_t *A, int k, int64_t t, int64_t u) {
    return u > 0 && A->label_dur[k] >= 0 && t - A->label_dur[k] >= 0;
}
TDT_HD int tdt_blank_out(const tdt_lattice_t *L, const tdt_arcs_t *A, int k, int64_t t) {
    return A->blank_dur[k] > 0 && t + A->blank_dur[k] < L->T;
}
TDT_HD int tdt_blank_final(const tdt_lattice_t *L, const tdt_arcs_t *A, int k, int64_t t, int64_t u) {
    return A->blank_dur[k] > 0 && u == L->U && t + A->blank_dur[k] == L->T;
}
TDT_HD int tdt_label_out(const tdt_lattice_t *L, const tdt_arcs_t *A, int k, int64_t t, int64_t u) {
    return u < L->U && A->label_dur[k] >= 0 && t + A->label_dur[k] < L->T;
}

/* Two-pass log-sum-exp of the terms xb[k], xl[k] (-inf for absent arcs: exp(-inf - m) is
 * exactly 0), with no branch around the exps so they run independently. */
TDT_HD double tdt_lse_terms(const tdt_arcs_t *A, const double *xb, const double *xl) {
    double m = -TDT_INF, sum = 0.0;
    TDT_FOR_ARCS(k, A) {
        m = tdt_lse_max(m, xb[k]);
        m = tdt_lse_max(m, xl[k]);
    }
    TDT_FOR_ARCS(k, A) { sum += exp(xb[k] - m) + exp(xl[k] - m); }
    const double r = m + log(sum); /* NaN when m is NaN (or -inf: handled here) */
    return m == -TDT_INF ? -TDT_INF : r;
}

/* Weights of the arcs into (t, u): blank arc k from (t - d, u), label arc k from (t - d, u - 1)
 * (their sources' log-probs: the weight of an arc is a property of the node it leaves). */
TDT_HD void tdt_alpha_terms(const tdt_lattice_t *L, const tdt_arcs_t *A, int64_t t, int64_t u,
                            tdt_arc_terms_t *w) {
    TDT_FOR_ARCS(k, A) {
        const int b = tdt_blank_in(A, k, t), l = tdt_label_in(A, k, t, u);
        int64_t n = tdt_node_index(L->frames, L->row, b ? t - A->blank_dur[k] : t, u);
        w->lp_blank[k] = L->lp_blank[n];
        w->dur_blank[k] = tdt_arc_dur(L, A, n, k);
        n = tdt_node_index(L->frames, L->row, l ? t - A->label_dur[k] : t, l ? u - 1 : u);
        w->lp_label[k] = L->lp_label[n];
        w->dur_label[k] = tdt_arc_dur(L, A, n, k);
    }
}

/* alpha(t, u) from the gathered weights and the alphas of its predecessors (all on earlier
 * anti-diagonals), read through X: logsumexp_k alpha(src) + (lp + dur). */
TDT_HD double tdt_alpha_combine(const tdt_lattice_t *L, const tdt_arcs_t *A,
                                const tdt_diag_view_t *X, int64_t t, int64_t u,
                                const tdt_arc_terms_t *w) {
    const int64_t s = t + u;
    double xb[TDT_MAX_DURATIONS], xl[TDT_MAX_DURATIONS];
    TDT_FOR_ARCS(k, A) {
        const int b = tdt_blank_in(A, k, t), l = tdt_label_in(A, k, t, u);
        /* an absent arc reads diagonal s + 1 instead (in range, and written by no one while
           diagonal s is: a sweep's threads may all read it), and discards the value */
        const double ab = X->v[tdt_view_index(L, X, b ? s - A->blank_dur[k] : s + 1, u)];
        const double al = X->v[tdt_view_index(L, X, l ? s - A->label_dur[k] - 1 : s + 1, l ? u - 1 : u)];
        xb[k] = b ? ab + (w->lp_blank[k] + w->dur_blank[k]) : -TDT_INF;
        xl[k] = l ? al + (w->lp_label[k] + w->dur_label[k]) : -TDT_INF;
    }
    const double r = tdt_lse_terms(A, xb, xl);
    return t == 0 && u == 0 ? 0.0 : r;
}

/* Weights of the arcs out of (t, u): all from the node itself. */
TDT_HD void tdt_beta_terms(const tdt_lattice_t *L, const tdt_arcs_t *A, int64_t t, int64_t u,
                           tdt_arc_terms_t *w) {
    const int64_t n = tdt_node_index(L->frames, L->row, t, u);
    const double lb = L->lp_blank[n], ll = L->lp_label[n];
    TDT_FOR_ARCS(k, A) {
        const double dk = tdt_arc_dur(L, A, n, k);
        w->lp_blank[k] = lb;
        w->dur_blank[k] = dk;
        w->lp_label[k] = ll;
        w->dur_label[k] = dk;
    }
}

/* beta(t, u) from the gathered weights and the betas of its successors (all on later
 * anti-diagonals), read through X: logsumexp_k (lp + dur) + beta(dst); a terminal blank arc
 * ends at 0. */
TDT_HD double tdt_beta_combine(const tdt_lattice_t *L, const tdt_arcs_t *A,
                               const tdt_diag_view_t *X, int64_t t, int64_t u,
                               const tdt_arc_terms_t *w) {
    const int64_t s = t + u;
    double xb[TDT_MAX_DURATIONS], xl[TDT_MAX_DURATIONS];
    TDT_FOR_ARCS(k, A) {
        const int b = tdt_blank_out(L, A, k, t), f = tdt_blank_final(L, A, k, t, u);
        const int l = tdt_label_out(L, A, k, t, u);
        const double bb = X->v[tdt_view_index(L, X, b ? s + A->blank_dur[k] : s + 1, u)];
        const double bl = X->v[tdt_view_index(L, X, l ? s + A->label_dur[k] + 1 : s + 1, l ? u + 1 : u)];
        const double wb = w->lp_blank[k] + w->dur_blank[k];
        xb[k] = b ? wb + bb : f ? wb : -TDT_INF;
        xl[k] = l ? (w->lp_label[k] + w->dur_label[k]) + bl : -TDT_INF;
    }
    return tdt_lse_terms(A, xb, xl);
}

/* alpha(t, u) on the workspace array (both steps). */
TDT_HD double tdt_alpha_node(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha,
                             int64_t t, int64_t u) {
    tdt_arc_terms_t w;
    tdt_diag_view_t X = {alpha, -1};
    tdt_alpha_terms(L, A, t, u, &w);
    return tdt_alpha_combine(L, A, &X, t, u, &w);
}

/* beta(t, u) on the workspace array (both steps). */
TDT_HD double tdt_beta_node(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *beta,
                            int64_t t, int64_t u) {
    tdt_arc_terms_t w;
    tdt_diag_view_t X = {beta, -1};
    tdt_beta_terms(L, A, t, u, &w);
    return tdt_beta_combine(L, A, &X, t, u, &w);
}

/* log p(y | x) from alpha: the terminal blank arcs that land exactly on T. -inf if none. */
TDT_HD double tdt_log_likelihood(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha) {
    double xb[TDT_MAX_DURATIONS], xl[TDT_MAX_DURATIONS];
    TDT_FOR_ARCS(k, A) {
        int64_t d = A->blank_dur[k];
        xb[k] = -TDT_INF;
        xl[k] = -TDT_INF;
        if (d > 0 && L->T - d >= 0) {
            int64_t n = tdt_node_index(L->frames, L->row, L->T - d, L->U);
            xb[k] = alpha[n] + (L->lp_blank[n] + tdt_arc_dur(L, A, n, k));
        }
    }
    return tdt_lse_terms(A, xb, xl);
}

/* Number of anti-diagonals of a sample: s = t + u runs over 0 .. T - 1 + U. */
TDT_HD int64_t tdt_num_diagonals(const tdt_lattice_t *L) { return L->T > 0 ? L->T + L->U : 0; }

/* Range of u on anti-diagonal s: u in [*u_lo, *u_hi] (empty when *u_lo > *u_hi). */
TDT_HD void tdt_diagonal_range(const tdt_lattice_t *L, int64_t s, int64_t *u_lo, int64_t *u_hi) {
    int64_t lo = s - (L->T - 1);
    *u_lo = lo > 0 ? lo : 0;
    *u_hi = s < L->U ? s : L->U;
}

/* The reported cost from log p(y|x): -(1 + lambda) log p (FastEmit scales the cost too);
 * +inf for an infeasible sample (ll = -inf), NaN for NaN. */
TDT_HD double tdt_cost(double ll, double fastemit_lambda) { return -(1.0 + fastemit_lambda) * ll; }

/* ---- gradients ---------------------------------------------------------------------------- */

/* Arc occupancy exp(alpha + w + beta(dst) - LL); exactly 0 when any term is -inf. */
TDT_HD double tdt_occupancy(double alpha_src, double w, double beta_dst, double ll) {
    double x = alpha_src + w + beta_dst;
    return x == -TDT_INF ? 0.0 : exp(x - ll);
}

/* Gradient coefficients of node (t, u) for a feasible sample (ll finite). */
TDT_HD void tdt_node_grad(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha,
                          const double *beta, int64_t t, int64_t u, double ll,
                          double fastemit_lambda, tdt_node_grad_t *g) {
    int64_t n = tdt_node_index(L->frames, L->row, t, u);
    double a = alpha[n];
    double occ_blank = 0.0, occ_label = 0.0;
    TDT_FOR_ARCS(k, A) {
        double ob = 0.0, ol = 0.0;
        int64_t d = A->blank_dur[k];
        if (a != -TDT_INF && d > 0) {
            double w = L->lp_blank[n] + tdt_arc_dur(L, A, n, k);
            if (t + d < L->T)
                ob = tdt_occupancy(a, w, beta[tdt_node_index(L->frames, L->row, t + d, u)], ll);
            else if (u == L->U && t + d == L->T)
                ob = tdt_occupancy(a, w, 0.0, ll);
        }
        d = A->label_dur[k];
        if (a != -TDT_INF && u < L->U && d >= 0 && t + d < L->T) {
            double w = L->lp_label[n] + tdt_arc_dur(L, A, n, k);
            ol = tdt_occupancy(a, w, beta[tdt_node_index(L->frames, L->row, t + d, u + 1)], ll);
        }
        g->dur_arc[k] = ob + ol;
        occ_blank += ob;
        occ_label += ol;
    }
    g->blank_occ = occ_blank;
    g->label_occ = (1.0 + fastemit_lambda) * occ_label;
    g->tok_occ = occ_blank + g->label_occ;
    g->dur_occ = occ_blank + occ_label;
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

/* Duration log-softmax in place over h[0..count-1] (count is small), with the sweeps' two-pass
 * rule: NaN or +inf anywhere makes every entry NaN (so the sample's cost is NaN even when the
 * offending duration has no arc at this node); all -inf gives NaN entries as well (-inf - -inf). */
TDT_HD void tdt_log_softmax_small(double *h, int count) {
    double m = -TDT_INF, sum = 0.0;
    for (int k = 0; k < count; ++k) m = tdt_lse_max(m, h[k]);
    for (int k = 0; k < count; ++k) sum += exp(h[k] - m);
    const double lse = m == -TDT_INF ? -TDT_INF : m + log(sum);
    for (int k = 0; k < count; ++k) h[k] -= lse;
}

#endif /* TDT_COMMON_LATTICE_H */
