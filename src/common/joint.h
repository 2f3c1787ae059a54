/*
 * joint.h - what both backends of the fused joint + loss (tdt_joint_*) compute alike, host and
 * device: the joint dropout's mask, and which nodes a backward with grads->skip_below leaves out.
 *
 * Dropout (include/tdt.h, tdt_joint_problem_t.dropout; docs/joint.md): element (b, t, u, i) of
 * act(enc + pred) has the counter
 *     c = dropout_offset + ((b * max_frames + t) * (max_labels + 1) + u) * H + i   (mod 2^64)
 * and the 64-bit value r = tdt_splitmix64(dropout_seed + (c + 1) * 0x9e3779b97f4a7c15), the
 * (c + 1)-th output of the SplitMix64 generator seeded with dropout_seed (mod 2^64 throughout).
 * It is kept iff (r >> 32) >= tdt_dropout_threshold(p) = floor(p * 2^32), so it is dropped with
 * probability floor(p 2^32) / 2^32, within 2^-32 of p; a kept element is scaled by
 * 1 / (1 - p) (tdt_dropout_scale, rounded once to the accumulate type). p = 0 keeps everything
 * (threshold 0) and scales by exactly 1.
 */
#ifndef TDT_COMMON_JOINT_H
#define TDT_COMMON_JOINT_H

#include "tdt.h"

#include "hd.h"
#include "lattice.h"

/* Written by a CPU joint forward (tdt_joint_forward, tdt_joint_loss), checked by its backward
 * (workspace.h's header; a plain forward writes TDT_WS_MAGIC, so neither backward takes the
 * other's workspace). "TDT_JNT1". */
#define TDT_WS_JOINT_MAGIC 0x5444545f4a4e5431ull

/* SplitMix64's output function (Steele, Lea and Flood 2014). */
TDT_HD uint64_t tdt_splitmix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* floor(p * 2^32) for p in [0, 1): drop iff the hash's top 32 bits are below it. */
TDT_HD uint32_t tdt_dropout_threshold(double p) { return (uint32_t)(p * 4294967296.0); }

/* 1 iff the element with counter c is kept under seed at threshold thr. */
TDT_HD int tdt_dropout_keep(uint64_t seed, uint64_t c, uint32_t thr) {
    return (uint32_t)(tdt_splitmix64(seed + (c + 1u) * 0x9e3779b97f4a7c15ull) >> 32) >= thr;
}

/* The scale of a kept element, 1 / (1 - p), in float64 (round it once to the accumulate type). */
TDT_HD double tdt_dropout_scale(double p) { return 1.0 / (1.0 - p); }

/* Counter of element (b, t, u, 0) of the joint's hidden values (add i for element i). */
TDT_HD uint64_t tdt_dropout_counter(uint64_t offset, int64_t b, int64_t t, int64_t u,
                                    int64_t max_frames, int64_t max_labels, int64_t hidden) {
    return offset + (((uint64_t)b * (uint64_t)max_frames + (uint64_t)t) * ((uint64_t)max_labels + 1u) +
                     (uint64_t)u) * (uint64_t)hidden;
}

/* Whether a backward with tdt_joint_gradients_t.skip_below = eps leaves out a node of upstream
 * gradient g and coefficients ng (lattice.h): every element of the node's logits' gradient is
 * at most |g| max(tok_occ, dur_occ) in magnitude (tdt_token_grad: p tok_occ less blank_occ or
 * label_occ, which sum to tok_occ; tdt_duration_grad: q dur_occ less one of the arcs summing to
 * dur_occ; a clamp only lowers it), so a node whose bound is below eps is skipped, its gradient
 * taken as zero. eps 0 skips nothing; a NaN bound is never below eps. */
TDT_HD int tdt_joint_skips(double eps, double g, const tdt_node_grad_t *ng) {
    if (!(eps > 0.0)) return 0;
    const double occ = ng->tok_occ > ng->dur_occ ? ng->tok_occ : ng->dur_occ;
    return (g < 0.0 ? -g : g) * occ < eps;
}

#endif /* TDT_COMMON_JOINT_H */
