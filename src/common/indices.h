/*
 * indices.h - tdt_pack_indices()'s rule for one element, host and device: the value converted
 * to int32 and whether the loss accepts it, so the CPU loop and the GPU kernel pack and check
 * alike.
 */
#ifndef TDT_COMMON_INDICES_H
#define TDT_COMMON_INDICES_H

#include "tdt.h"

#include "hd.h"

/* The loss's rules for one value, written once for tdt_check_data (src/tdt.c, which names the
 * first bad one) and tdt_pack_one: a length in [0, hi]; a label in [0, vocab_size) (and not
 * the blank, a plain comparison at both). */
TDT_HD int tdt_length_ok(int64_t v, int64_t hi) { return v >= 0 && v <= hi; }
TDT_HD int tdt_label_in_vocab(int64_t y, int64_t vocab_size) { return y >= 0 && y < vocab_size; }

/* Element i of an int32 or int64 array. */
TDT_HD int64_t tdt_index_at(const void *a, int64_t i, tdt_index_type_t type) {
    return type == TDT_INDEX_INT64 ? ((const int64_t *)a)[i] : (int64_t)((const int32_t *)a)[i];
}

/* What tdt_pack_indices() needs besides the indices: the problem's sizes and the blank. */
typedef struct tdt_pack_shape {
    int64_t batch, max_frames, max_labels, vocab_size;
    int blank;
} tdt_pack_shape_t;

/* Element i of the packed array [frame lengths (B), label lengths (B), labels (B, max_labels)]
 * into *out (0 for a value outside int32); returns whether it is one the loss accepts: a frame
 * length in [0, max_frames]; a label length in [0, min(max_labels, columns)]; a label that its
 * sample reads (position < its label length) in [0, vocab_size) and not the blank. Positions
 * past columns read as 0 (padding). */
TDT_HD int tdt_pack_one(const tdt_indices_t *in, const tdt_pack_shape_t *s, int64_t i,
                        int32_t *out) {
    int64_t v;
    int ok;
    if (i < 2 * s->batch) {
        const int second = i >= s->batch;
        v = tdt_index_at(second ? in->label_lengths : in->frame_lengths,
                         second ? i - s->batch : i, in->type);
        const int64_t hi = !second ? s->max_frames
                                   : (in->columns < s->max_labels ? in->columns : s->max_labels);
        ok = tdt_length_ok(v, hi);
    } else {
        const int64_t j = i - 2 * s->batch, b = j / s->max_labels, k = j - b * s->max_labels;
        v = k < in->columns ? tdt_index_at(in->labels, b * in->labels_stride + k, in->type) : 0;
        ok = k >= tdt_index_at(in->label_lengths, b, in->type) ||
             (tdt_label_in_vocab(v, s->vocab_size) && v != s->blank);
    }
    const int fits = v >= INT32_MIN && v <= INT32_MAX;
    *out = fits ? (int32_t)v : 0;
    return ok && fits;
}

#endif /* TDT_COMMON_INDICES_H */
