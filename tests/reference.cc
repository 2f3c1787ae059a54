/*
 * reference.cc - the naive float64 TDT / RNN-T loss (see reference.h). Written from
 * docs/math.md (sections 1-4 and 7) alone; shares nothing with src/.
 */
#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace tdt_ref {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double log_add(double a, double b) {
    if (a == -kInf) return b;
    if (b == -kInf) return a;
    const double m = std::max(a, b);
    return m + std::log(std::exp(a - m) + std::exp(b - m));
}

// log_softmax of x[0..n) into out (a plain, two-pass textbook version).
void log_softmax(const double *x, int64_t n, double *out) {
    double m = -kInf;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
    const double lse = m + std::log(s);
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] - lse;
}

struct Arc {
    int64_t src;      // node index t * (U + 1) + u
    int64_t dst;      // node index, or -1 for the terminal arc
    int64_t token;    // the token it emits (blank or y_{u+1})
    int k;            // duration index (0 for RNN-T)
    bool is_label;    // label arc (else blank arc)
    double weight;    // lp_tok(src, token) + lp_dur(src, k)
};

}  // namespace

Result compute(const Config &c, const Sample &s, double g) {
    const int64_t T = s.T, U = s.U, V = c.vocab_size, R = U + 1;
    const bool rnnt = c.durations.empty();
    const int D = static_cast<int>(c.durations.size());
    if (static_cast<int64_t>(s.labels.size()) < U) throw std::invalid_argument("labels < U");
    if (static_cast<int64_t>(s.tok.size()) != T * R * V) throw std::invalid_argument("tok size");
    if (!rnnt && static_cast<int64_t>(s.dur.size()) != T * R * D)
        throw std::invalid_argument("dur size");

    for (int64_t i = 0; i < U; ++i)
        if (s.labels[i] < 0 || s.labels[i] >= V || s.labels[i] == c.blank) throw std::invalid_argument("label");
    if (c.blank < 0 || c.blank >= V) throw std::invalid_argument("blank");

    Result r;
    r.grad_tok.assign(static_cast<size_t>(T * R * V), 0.0);
    r.grad_dur.assign(rnnt ? 0 : static_cast<size_t>(T * R * D), 0.0);
    r.cost = kInf;
    r.log_likelihood = -kInf;
    r.beta00 = -kInf;
    if (T == 0) return r;  // no frame: no path at all

    // 1. Log-probabilities of every node, materialised in full.
    std::vector<double> lp_tok(static_cast<size_t>(T * R * V));
    std::vector<double> lp_dur(static_cast<size_t>(T * R * D));
    for (int64_t n = 0; n < T * R; ++n) {
        if (c.log_probs_input) {
            std::copy(&s.tok[n * V], &s.tok[n * V] + V, &lp_tok[n * V]);
            if (!rnnt) std::copy(&s.dur[n * D], &s.dur[n * D] + D, &lp_dur[n * D]);
        } else {
            log_softmax(&s.tok[n * V], V, &lp_tok[n * V]);
            if (!rnnt) log_softmax(&s.dur[n * D], D, &lp_dur[n * D]);
        }
        for (int64_t v = 0; v < V; ++v) lp_tok[n * V + v] -= c.sigma;  // sigma: tokens only
    }

    // 2. Every arc of the lattice, sources in (t, u) order, which is topological: every arc
    //    either advances t, or keeps t and advances u.
    std::vector<Arc> arcs;
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t u = 0; u <= U; ++u) {
            const int64_t n = t * R + u;
            const int kcount = rnnt ? 1 : D;
            for (int k = 0; k < kcount; ++k) {
                const int64_t dl = rnnt ? 0 : c.durations[k];  // label arc advance
                const int64_t db = rnnt ? 1 : c.durations[k];  // blank arc advance
                const double lpd = rnnt ? 0.0 : lp_dur[n * D + k];
                if (u < U && t + dl < T) {
                    const int64_t y = s.labels[u];
                    arcs.push_back({n, (t + dl) * R + (u + 1), y, k, true, lp_tok[n * V + y] + lpd});
                }
                if (db > 0) {
                    const double w = lp_tok[n * V + c.blank] + lpd;
                    if (t + db < T) {
                        arcs.push_back({n, (t + db) * R + u, c.blank, k, false, w});
                    } else if (u == U && t + db == T) {
                        arcs.push_back({n, -1, c.blank, k, false, w});
                    }
                }
            }
        }
    }

    // 3. alpha: push along arcs in source order; LL: the terminal arcs.
    std::vector<double> alpha(static_cast<size_t>(T * R), -kInf);
    alpha[0] = 0.0;
    double ll = -kInf;
    for (const Arc &a : arcs) {
        const double x = alpha[a.src] + a.weight;
        if (a.dst < 0) {
            ll = log_add(ll, x);
        } else {
            alpha[a.dst] = log_add(alpha[a.dst], x);
        }
    }

    // 4. beta: pull along arcs in reverse source order.
    std::vector<double> beta(static_cast<size_t>(T * R), -kInf);
    for (auto it = arcs.rbegin(); it != arcs.rend(); ++it) {
        const double x = it->weight + (it->dst < 0 ? 0.0 : beta[it->dst]);
        beta[it->src] = log_add(beta[it->src], x);
    }
    r.log_likelihood = ll;
    r.beta00 = beta[0];
    if (!(ll > -kInf)) return r;  // infeasible: +inf cost, zero gradients
    r.feasible = true;
    r.cost = -(1.0 + c.fastemit_lambda) * ll;

    // 5. Occupancies per node: blank / label sums, and per duration index.
    std::vector<double> occ_b(static_cast<size_t>(T * R), 0.0), occ_l(static_cast<size_t>(T * R), 0.0);
    std::vector<double> occ_k(static_cast<size_t>(T * R * std::max(D, 1)), 0.0);
    for (const Arc &a : arcs) {
        const double x = alpha[a.src] + a.weight + (a.dst < 0 ? 0.0 : beta[a.dst]) - ll;
        const double o = std::exp(x);  // exp(-inf) == 0 for unreachable arcs
        (a.is_label ? occ_l : occ_b)[a.src] += o;
        if (!rnnt) occ_k[a.src * D + a.k] += o;
    }

    // 6. Gradients.
    const double lam1 = 1.0 + c.fastemit_lambda;
    std::vector<double> p(static_cast<size_t>(std::max<int64_t>(V, D)));
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t u = 0; u <= U; ++u) {
            const int64_t n = t * R + u;
            const int64_t y = u < U ? s.labels[u] : -1;
            const double ob = occ_b[n], ol = occ_l[n];
            double *gt = &r.grad_tok[n * V];
            if (c.log_probs_input) {
                for (int64_t v = 0; v < V; ++v) {
                    double gv = 0.0;
                    if (v == c.blank) gv -= ob;
                    if (v == y) gv -= lam1 * ol;
                    gt[v] = gv;
                }
            } else {
                log_softmax(&s.tok[n * V], V, p.data());
                const double occ_tok = ob + lam1 * ol;
                for (int64_t v = 0; v < V; ++v) {
                    double gv = std::exp(p[v]) * occ_tok;
                    if (v == c.blank) gv -= ob;
                    if (v == y) gv -= lam1 * ol;
                    gt[v] = gv;
                }
            }
            for (int64_t v = 0; v < V; ++v) {
                if (c.clamp > 0.0) gt[v] = std::min(c.clamp, std::max(-c.clamp, gt[v]));
                gt[v] *= g;
            }
            if (rnnt) continue;
            double *gd = &r.grad_dur[n * D];
            if (c.log_probs_input) {
                for (int k = 0; k < D; ++k) gd[k] = -occ_k[n * D + k] * g;
            } else {
                log_softmax(&s.dur[n * D], D, p.data());
                const double occ = ob + ol;
                for (int k = 0; k < D; ++k) gd[k] = (std::exp(p[k]) * occ - occ_k[n * D + k]) * g;
            }
        }
    }
    return r;
}

}  // namespace tdt_ref
