/*
 * reference.h - an independent, deliberately naive float64 implementation of the TDT and
 * RNN-T losses, written from docs/math.md (sections 1-4 and 7) and nothing else. It is the yardstick
 * the library is measured against, so it shares no code with src/ (not even src/common/):
 *
 *   - full log_softmax of every node's token (and duration) logits, materialised;
 *   - the lattice as an explicit list of arcs (source, destination or "terminal", token,
 *     duration index, weight), enumerated from the arc rules;
 *   - alpha by pushing along every arc in topological order, beta by pulling in reverse;
 *   - gradients from arc occupancies exp(alpha(src) + w + beta(dst) - LL):
 *         dz(t,u,v) = p_v * occ_tok - [v == blank] occB - [v == y_{u+1}] (1 + lambda) occL
 *         dh(t,u,k) = q_k * occ     - (occB_k + occL_k)
 *     with occ_tok = occB + (1 + lambda) occL (FastEmit scales label occupancies in the token
 *     gradient only), token elements clamped to [-clamp, clamp], then scaled by the upstream
 *     gradient g. For log-prob inputs the gradient is d cost / d input = minus the occupancies.
 *
 * Speed is irrelevant here; clarity is everything. One sample at a time, compact layout:
 * token logits (T, U + 1, V), duration logits (T, U + 1, D), both row-major.
 */
#ifndef TDT_TESTS_REFERENCE_H
#define TDT_TESTS_REFERENCE_H

#include <cstdint>
#include <vector>

namespace tdt_ref {

struct Config {
    int64_t vocab_size = 0;        // V, blank included
    int blank = 0;                 // blank index in [0, V)
    std::vector<int> durations;    // TDT durations; empty = plain RNN-T
    double sigma = 0.0;            // subtracted from every token log-prob
    double fastemit_lambda = 0.0;  // FastEmit
    double clamp = 0.0;            // > 0: clip token-gradient elements
    bool log_probs_input = false;  // inputs are log-probabilities, used as they are
};

struct Sample {
    int64_t T = 0;                 // frames
    int64_t U = 0;                 // labels
    std::vector<int32_t> labels;   // U labels, 0-based
    std::vector<double> tok;       // (T, U + 1, V)
    std::vector<double> dur;       // (T, U + 1, D), empty for RNN-T
};

struct Result {
    double cost = 0.0;             // (1 + lambda) * -LL, +inf when infeasible
    double log_likelihood = 0.0;   // LL from alpha (-inf when infeasible)
    double beta00 = 0.0;           // beta(0, 0); equals LL (a self-check of the reference)
    bool feasible = false;
    std::vector<double> grad_tok;  // (T, U + 1, V), already scaled by the upstream gradient
    std::vector<double> grad_dur;  // (T, U + 1, D)
};

// The loss and both gradients of one sample, with upstream gradient g.
Result compute(const Config &config, const Sample &sample, double g = 1.0);

}  // namespace tdt_ref

#endif  // TDT_TESTS_REFERENCE_H
