/*
 * naive_ref.c - see naive_ref.h. Clarity over speed; every array is dense and materialised.
 */
#include "naive_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ARC_BLANK = 0, ARC_LABEL = 1 };

typedef struct arc {
    int64_t src;   /* node t * (U + 1) + u */
    int64_t dst;   /* node, or -1 for the terminal arc */
    int kind;      /* ARC_BLANK or ARC_LABEL */
    int k;         /* duration index (0 for RNN-T) */
    double w;      /* log-weight */
} arc_t;

/* log(exp(a) + exp(b)) written the textbook way (the library uses log1p). */
static double lae(double a, double b) {
    double m = a > b ? a : b;
    if (m == -INFINITY) return -INFINITY;
    return m + log(exp(a - m) + exp(b - m));
}

/* out[i] = x[i] - log sum exp(x), n >= 1 */
static void log_softmax(const double *x, int64_t n, double *out) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; ++i)
        if (x[i] > m || x[i] != x[i]) m = x[i];
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += exp(x[i] - m);
    double lse = m + log(s);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] - lse;
}

/* Enumerates the arcs of the lattice in (t, u) order of their sources. With lp == NULL the
 * weights are left 0 (structure only). Returns the count written to arcs (may be NULL to
 * count). */
static int64_t enumerate(const nref_config_t *c, int64_t T, int64_t U, const int32_t *y,
                         const double *lp_tok, const double *lp_dur, arc_t *arcs) {
    const int64_t R = U + 1, V = c->V;
    const int tdt = c->durations != NULL && c->D > 0;
    const int K = tdt ? c->D : 1;
    int64_t n_arcs = 0;
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t u = 0; u <= U; ++u) {
            int64_t n = t * R + u;
            for (int k = 0; k < K; ++k) {
                int64_t d_label = tdt ? c->durations[k] : 0;
                int64_t d_blank = tdt ? c->durations[k] : 1;
                double wd = tdt && lp_dur ? lp_dur[n * c->D + k] : 0.0;
                /* blank arc */
                if (d_blank > 0) {
                    int64_t dst = -2;
                    if (t + d_blank < T) dst = (t + d_blank) * R + u;
                    else if (u == U && t + d_blank == T) dst = -1;
                    if (dst != -2) {
                        if (arcs) {
                            arc_t a = {n, dst, ARC_BLANK, k,
                                       lp_tok ? lp_tok[n * V + c->blank] + wd : 0.0};
                            arcs[n_arcs] = a;
                        }
                        ++n_arcs;
                    }
                }
                /* label arc */
                if (u < U && t + d_label < T) {
                    if (arcs) {
                        arc_t a = {n, (t + d_label) * R + u + 1, ARC_LABEL, k,
                                   lp_tok ? lp_tok[n * V + y[u]] + wd : 0.0};
                        arcs[n_arcs] = a;
                    }
                    ++n_arcs;
                }
            }
        }
    }
    return n_arcs;
}

int nref_sample(const nref_config_t *c, int64_t T, int64_t U, const int32_t *labels,
                const double *tok, const double *dur, double g, nref_result_t *r,
                double *grad_tok, double *grad_dur) {
    const int64_t R = U + 1, V = c->V, N = T * R;
    const int tdt = c->durations != NULL && c->D > 0;
    const int D = tdt ? c->D : 0;
    const double lam = c->fastemit;
    int rc = -1;

    double *lp_tok = malloc(sizeof(double) * (size_t)(N * V + 1));
    double *lp_dur = malloc(sizeof(double) * (size_t)(N * (D > 0 ? D : 1) + 1));
    double *alpha = malloc(sizeof(double) * (size_t)(N + 1));
    double *beta = malloc(sizeof(double) * (size_t)(N + 1));
    double *occ_b = calloc((size_t)N + 1, sizeof(double));
    double *occ_l = calloc((size_t)N + 1, sizeof(double));
    double *occ_k = calloc((size_t)(N * (D > 0 ? D : 1) + 1), sizeof(double));
    int64_t max_arcs = N * 2 * (D > 0 ? D : 1);
    arc_t *arcs = malloc(sizeof(arc_t) * (size_t)(max_arcs + 1));
    if (!lp_tok || !lp_dur || !alpha || !beta || !occ_b || !occ_l || !occ_k || !arcs) goto done;

    /* log-probs per node: sigma on tokens only */
    for (int64_t n = 0; n < N; ++n) {
        if (c->log_probs) {
            for (int64_t v = 0; v < V; ++v) lp_tok[n * V + v] = tok[n * V + v] - c->sigma;
            for (int k = 0; k < D; ++k) lp_dur[n * D + k] = dur[n * D + k];
        } else {
            log_softmax(tok + n * V, V, lp_tok + n * V);
            for (int64_t v = 0; v < V; ++v) lp_tok[n * V + v] -= c->sigma;
            if (D > 0) log_softmax(dur + n * D, D, lp_dur + n * D);
        }
    }

    int64_t n_arcs = enumerate(c, T, U, labels, lp_tok, lp_dur, arcs);

    /* alpha: push forward */
    for (int64_t n = 0; n < N; ++n) alpha[n] = -INFINITY;
    if (N > 0) alpha[0] = 0.0;
    double ll = -INFINITY;
    for (int64_t i = 0; i < n_arcs; ++i) {
        const arc_t *a = &arcs[i];
        double x = alpha[a->src] + a->w;
        if (a->dst < 0) ll = lae(ll, x);
        else alpha[a->dst] = lae(alpha[a->dst], x);
    }
    /* beta: pull backward */
    for (int64_t n = 0; n < N; ++n) beta[n] = -INFINITY;
    for (int64_t i = n_arcs - 1; i >= 0; --i) {
        const arc_t *a = &arcs[i];
        double x = a->w + (a->dst < 0 ? 0.0 : beta[a->dst]);
        beta[a->src] = lae(beta[a->src], x);
    }
    r->ll = ll;
    r->beta00 = N > 0 ? beta[0] : -INFINITY;
    r->feasible = ll > -INFINITY;
    r->cost = r->feasible ? -(1.0 + lam) * ll : INFINITY;

    /* occupancies */
    if (r->feasible) {
        for (int64_t i = 0; i < n_arcs; ++i) {
            const arc_t *a = &arcs[i];
            double bd = a->dst < 0 ? 0.0 : beta[a->dst];
            if (alpha[a->src] == -INFINITY || bd == -INFINITY || a->w == -INFINITY) continue;
            double o = exp(alpha[a->src] + a->w + bd - ll);
            if (a->kind == ARC_BLANK) occ_b[a->src] += o;
            else occ_l[a->src] += o;
            if (D > 0) occ_k[a->src * D + a->k] += o;
        }
    }

    if (grad_tok) {
        for (int64_t n = 0; n < N; ++n) {
            int64_t u = n % R;
            int32_t y = u < U ? labels[u] : -1;
            double ot = occ_b[n] + (1.0 + lam) * occ_l[n];
            for (int64_t v = 0; v < V; ++v) {
                double x = 0.0;
                if (r->feasible) {
                    double p = c->log_probs ? 0.0 : exp(lp_tok[n * V + v] + c->sigma);
                    x = p * ot;
                    if (v == c->blank) x -= occ_b[n];
                    if (v == y) x -= (1.0 + lam) * occ_l[n];
                    if (c->clamp > 0.0) x = x > c->clamp ? c->clamp : (x < -c->clamp ? -c->clamp : x);
                }
                grad_tok[n * V + v] = g * x;
            }
        }
    }
    if (grad_dur && D > 0) {
        for (int64_t n = 0; n < N; ++n) {
            double od = occ_b[n] + occ_l[n];
            for (int k = 0; k < D; ++k) {
                double x = 0.0;
                if (r->feasible) {
                    double q = c->log_probs ? 0.0 : exp(lp_dur[n * D + k]);
                    x = q * od - occ_k[n * D + k];
                }
                grad_dur[n * D + k] = g * x;
            }
        }
    }
    rc = 0;
done:
    free(lp_tok);
    free(lp_dur);
    free(alpha);
    free(beta);
    free(occ_b);
    free(occ_l);
    free(occ_k);
    free(arcs);
    return rc;
}

int64_t nref_on_path(const nref_config_t *c, int64_t T, int64_t U, unsigned char *on_path) {
    const int64_t R = U + 1, N = T * R;
    const int tdt = c->durations != NULL && c->D > 0;
    int64_t max_arcs = N * 2 * (tdt ? c->D : 1);
    arc_t *arcs = malloc(sizeof(arc_t) * (size_t)(max_arcs + 1));
    unsigned char *fwd = calloc((size_t)N + 1, 1), *bwd = calloc((size_t)N + 1, 1);
    int64_t count = -1;
    if (!arcs || !fwd || !bwd) goto done;
    /* labels are irrelevant to the structure: pass a dummy row the enumerator never reads
       (lp_tok == NULL) */
    int64_t n_arcs = enumerate(c, T, U, NULL, NULL, NULL, arcs);
    if (N > 0) fwd[0] = 1;
    for (int64_t i = 0; i < n_arcs; ++i)
        if (fwd[arcs[i].src] && arcs[i].dst >= 0) fwd[arcs[i].dst] = 1;
    for (int64_t i = n_arcs - 1; i >= 0; --i)
        if (arcs[i].dst < 0 || bwd[arcs[i].dst]) bwd[arcs[i].src] = 1;
    count = 0;
    for (int64_t n = 0; n < N; ++n) {
        on_path[n] = fwd[n] && bwd[n];
        count += on_path[n];
    }
done:
    free(arcs);
    free(fwd);
    free(bwd);
    return count;
}

int nref_bad_arc_on_path(const nref_config_t *c, int64_t T, int64_t U,
                         const unsigned char *bad_blank, const unsigned char *bad_label,
                         const unsigned char *bad_dur) {
    const int64_t N = T * (U + 1);
    const int tdt = c->durations != NULL && c->D > 0;
    int64_t max_arcs = N * 2 * (tdt ? c->D : 1);
    arc_t *arcs = malloc(sizeof(arc_t) * (size_t)(max_arcs + 1));
    unsigned char *fwd = calloc((size_t)N + 1, 1), *bwd = calloc((size_t)N + 1, 1);
    int hit = -1;
    if (!arcs || !fwd || !bwd) goto done;
    int64_t n_arcs = enumerate(c, T, U, NULL, NULL, NULL, arcs);
    if (N > 0) fwd[0] = 1;
    for (int64_t i = 0; i < n_arcs; ++i)
        if (fwd[arcs[i].src] && arcs[i].dst >= 0) fwd[arcs[i].dst] = 1;
    for (int64_t i = n_arcs - 1; i >= 0; --i)
        if (arcs[i].dst < 0 || bwd[arcs[i].dst]) bwd[arcs[i].src] = 1;
    hit = 0;
    for (int64_t i = 0; i < n_arcs && !hit; ++i) {
        const arc_t *a = &arcs[i];
        if (!fwd[a->src] || !(a->dst < 0 || bwd[a->dst])) continue;
        int bad = a->kind == ARC_BLANK ? bad_blank[a->src] : bad_label[a->src];
        if (tdt && bad_dur) bad |= bad_dur[a->src * c->D + a->k];
        hit = bad != 0;
    }
done:
    free(arcs);
    free(fwd);
    free(bwd);
    return hit;
}
