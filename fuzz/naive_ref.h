/*
 * naive_ref.h - a second, independent naive float64 reference of the TDT and RNN-T losses, for
 * the fuzzer (fuzz/fuzz_tdt.c) and the robustness tests (tests/robustness/).
 *
 * Written from docs/math.md (sections 1-4) only. It shares no code with src/ (nor with the
 * tests helper's tests/reference.cc, so a mistake copied into one is not copied into both):
 *
 *   - every node's token and duration rows are log-softmaxed in full and kept;
 *   - the lattice is a flat list of arcs (source node, destination node or terminal, kind,
 *     duration index, log-weight) enumerated from the arc rules, sources in (t, u) order;
 *   - alpha is *pushed* along the list front to back, beta *pulled* back to front (every arc
 *     goes to a node later in (t, u) lexicographic order, so one pass each way suffices);
 *   - occupancies exp(alpha(src) + w + beta(dst) - LL) give both gradients.
 *
 * One sample at a time, dense row-major layout: tok (T, U + 1, V), dur (T, U + 1, D).
 * Plain C99, no dependency but libm.
 */
#ifndef TDT_FUZZ_NAIVE_REF_H
#define TDT_FUZZ_NAIVE_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nref_config {
    int64_t V;              /* vocabulary, blank included */
    int blank;              /* in [0, V) */
    const int *durations;   /* TDT durations, or NULL for plain RNN-T */
    int D;                  /* number of durations; 0 for RNN-T */
    double sigma;           /* subtracted from every token log-prob */
    double fastemit;        /* FastEmit lambda */
    double clamp;           /* > 0: token-gradient elements clipped to [-clamp, clamp] */
    int log_probs;          /* 1: inputs are log-probs used as they are */
} nref_config_t;

typedef struct nref_result {
    double cost;            /* (1 + lambda) * -LL; +inf when infeasible */
    double ll;              /* log-likelihood from alpha; -inf when infeasible */
    double beta00;          /* beta(0, 0): equals ll (self-check) */
    int feasible;           /* ll > -inf */
} nref_result_t;

/* Loss and gradients of one sample with T frames, U labels; g is the upstream gradient.
 * grad_tok (T, U + 1, V) and grad_dur (T, U + 1, D) may be NULL; when given they are fully
 * overwritten (zero where no arc has occupancy, all zero when infeasible).
 * Returns 0, or -1 when memory could not be allocated. */
int nref_sample(const nref_config_t *c, int64_t T, int64_t U, const int32_t *labels,
                const double *tok, const double *dur, double g, nref_result_t *r,
                double *grad_tok, double *grad_dur);

/* Graph structure only (weights ignored): on_path[t * (U + 1) + u] = 1 when node (t, u) lies
 * on at least one complete path from (0, 0) to a terminal arc, else 0. Returns the number of
 * such nodes (0 means infeasible for every choice of weights), or -1 on allocation failure. */
int64_t nref_on_path(const nref_config_t *c, int64_t T, int64_t U, unsigned char *on_path);

/* Whether an arc whose weight is marked bad lies on a complete path (weights ignored).
 * bad_blank / bad_label: per node (t * (U + 1) + u), the blank / label log-prob is bad;
 * bad_dur: per node and duration (n * D + k), or NULL. Returns 1, 0, or -1 on allocation
 * failure. */
int nref_bad_arc_on_path(const nref_config_t *c, int64_t T, int64_t U,
                         const unsigned char *bad_blank, const unsigned char *bad_label,
                         const unsigned char *bad_dur);

#ifdef __cplusplus
}
#endif

#endif /* TDT_FUZZ_NAIVE_REF_H */
