/*
 * joint.h - what both backends of the fused joint + loss (tdt_joint_*) compute alike, host and
 * device: the joint dropout's mask and the activations with their derivatives.
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

#endif /* TDT_COMMON_JOINT_H */
