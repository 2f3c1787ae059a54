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
 * Node storage: the per-node arrays of one sample are indexed n = t * row + u with
 * row = max_labels + 1 (tdt_node_index); lp_dur is indexed n * count + k.
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

/* Node (t, u) of a sample in the per-node arrays. */
TDT_HD int64_t tdt_node_index(int64_t row, int64_t t, int64_t u) { return t * row + u; }

/* First node of sample b in the batch's per-node arrays. */
TDT_HD int64_t tdt_sample_offset(int64_t b, int64_t max_frames, int64_t row) {
    return b * max_frames * row;
}

/* Element offset of logits row (b, t, u) for strides {sb, st, su}. */
TDT_HD int64_t tdt_row_offset(const int64_t *strides, int64_t b, int64_t t, int64_t u) {
    return b * strides[0] + t * strides[1] + u * strides[2];
}

/* ---- log-space arithmetic ----------------------------------------------------------------- */

/* log(exp(a) + exp(b)), exact for -inf operands, never NaN for non-NaN inputs. (The sweeps
 * use the online state below instead: one exp per arc and one log per node.) */
TDT_HD double tdt_log_add(double a, double b) {
    if (a == -TDT_INF) return b;
    if (b == -TDT_INF) return a;
    return a > b ? a + log1p(exp(b - a)) : b + log1p(exp(a - b));
}

/* Online log-sum-exp state: max m and sum s of exp(x - m). Start from {-inf, 0}. */
TDT_HD void tdt_lse_push(double *m, double *s, double x) {
    if (x > *m) {
        *s = *s * exp(*m - x) + 1.0;
        *m = x;
    } else if (x != -TDT_INF) {
        *s += exp(x - *m);
    }
}

/* Merge of two online states (for parallel reductions). */
TDT_HD void tdt_lse_merge(double *m, double *s, double m2, double s2) {
    if (m2 > *m) {
        *s = *s * exp(*m - m2) + s2;
        *m = m2;
    } else if (m2 != -TDT_INF) {
        *s += s2 * exp(m2 - *m);
    }
}

/* Final value of an online state: log(sum exp(x)); -inf for an empty or all -inf set; NaN
 * propagates (a NaN input leaves m or s NaN). */
TDT_HD double tdt_lse_value(double m, double s) {
    if (m == -TDT_INF && s == 0.0) return -TDT_INF;
    return m + log(s);
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

/* ---- the sweeps --------------------------------------------------------------------------- */

/* alpha(t, u) from the alphas of its predecessors (all on earlier anti-diagonals). */
TDT_HD double tdt_alpha_node(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha,
                             int64_t t, int64_t u) {
    if (t == 0 && u == 0) return 0.0;
    double m = -TDT_INF, s = 0.0;
    TDT_FOR_ARCS(k, A) {
        int64_t d = A->blank_dur[k];
        if (d > 0 && t - d >= 0) {
            int64_t n = tdt_node_index(L->row, t - d, u);
            tdt_lse_push(&m, &s, alpha[n] + L->lp_blank[n] + tdt_arc_dur(L, A, n, k));
        }
        d = A->label_dur[k];
        if (u > 0 && d >= 0 && t - d >= 0) {
            int64_t n = tdt_node_index(L->row, t - d, u - 1);
            tdt_lse_push(&m, &s, alpha[n] + L->lp_label[n] + tdt_arc_dur(L, A, n, k));
        }
    }
    return tdt_lse_value(m, s);
}

/* beta(t, u) from the betas of its successors (all on later anti-diagonals). */
TDT_HD double tdt_beta_node(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *beta,
                            int64_t t, int64_t u) {
    int64_t n = tdt_node_index(L->row, t, u);
    double m = -TDT_INF, s = 0.0;
    TDT_FOR_ARCS(k, A) {
        int64_t d = A->blank_dur[k];
        if (d > 0) {
            double w = L->lp_blank[n] + tdt_arc_dur(L, A, n, k);
            if (t + d < L->T)
                tdt_lse_push(&m, &s, w + beta[tdt_node_index(L->row, t + d, u)]);
            else if (u == L->U && t + d == L->T)
                tdt_lse_push(&m, &s, w);
        }
        d = A->label_dur[k];
        if (u < L->U && d >= 0 && t + d < L->T) {
            double w = L->lp_label[n] + tdt_arc_dur(L, A, n, k);
            tdt_lse_push(&m, &s, w + beta[tdt_node_index(L->row, t + d, u + 1)]);
        }
    }
    return tdt_lse_value(m, s);
}

/* log p(y | x) from alpha: the terminal blank arcs that land exactly on T. -inf if none. */
TDT_HD double tdt_log_likelihood(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *alpha) {
    double m = -TDT_INF, s = 0.0;
    TDT_FOR_ARCS(k, A) {
        int64_t d = A->blank_dur[k];
        if (d > 0 && L->T - d >= 0) {
            int64_t n = tdt_node_index(L->row, L->T - d, L->U);
            tdt_lse_push(&m, &s, alpha[n] + L->lp_blank[n] + tdt_arc_dur(L, A, n, k));
        }
    }
    return tdt_lse_value(m, s);
}

/* Number of anti-diagonals of a sample: s = t + u runs over 0 .. T - 1 + U. */
TDT_HD int64_t tdt_num_diagonals(const tdt_lattice_t *L) { return L->T > 0 ? L->T + L->U : 0; }

/* Range of u on anti-diagonal s: u in [*u_lo, *u_hi] (empty when *u_lo > *u_hi). */
TDT_HD void tdt_diagonal_range(const tdt_lattice_t *L, int64_t s, int64_t *u_lo, int64_t *u_hi) {
    int64_t lo = s - (L->T - 1);
    *u_lo = lo > 0 ? lo : 0;
    *u_hi = s < L->U ? s : L->U;
}

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
    int64_t n = tdt_node_index(L->row, t, u);
    double a = alpha[n];
    double occ_blank = 0.0, occ_label = 0.0;
    TDT_FOR_ARCS(k, A) {
        double ob = 0.0, ol = 0.0;
        int64_t d = A->blank_dur[k];
        if (a != -TDT_INF && d > 0) {
            double w = L->lp_blank[n] + tdt_arc_dur(L, A, n, k);
            if (t + d < L->T)
                ob = tdt_occupancy(a, w, beta[tdt_node_index(L->row, t + d, u)], ll);
            else if (u == L->U && t + d == L->T)
                ob = tdt_occupancy(a, w, 0.0, ll);
        }
        d = A->label_dur[k];
        if (a != -TDT_INF && u < L->U && d >= 0 && t + d < L->T) {
            double w = L->lp_label[n] + tdt_arc_dur(L, A, n, k);
            ol = tdt_occupancy(a, w, beta[tdt_node_index(L->row, t + d, u + 1)], ll);
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

/* Duration log-softmax in place over h[0..count-1] (count is small). */
TDT_HD void tdt_log_softmax_small(double *h, int count) {
    double m = -TDT_INF, s = 0.0;
    for (int k = 0; k < count; ++k) tdt_lse_push(&m, &s, h[k]);
    double lse = tdt_lse_value(m, s);
    for (int k = 0; k < count; ++k) h[k] -= lse;
}

#endif /* TDT_COMMON_LATTICE_H */
