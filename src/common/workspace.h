/*
 * workspace.h - the one workspace layout, used by the size query and by both backends.
 *
 * The caller's buffer is first rounded up to TDT_WS_ALIGN; every sub-buffer then starts on a
 * TDT_WS_ALIGN boundary (256 bytes: a CUDA allocation's alignment, and whole cache lines):
 *
 *   base (aligned) -> | header            | tdt_ws_header_t: what filled the workspace  |
 *                     | w     [N * W]     | double, N = B * max_frames * (max_labels + 1) |
 *                     |                   | nodes, a block of W = 3 + D a node (D =     |
 *                     |                   | num_durations, 0 for RNN-T): the node       |
 *                     |                   | pass's lp_blank, lp_label, lp_dur[0..D-1],  |
 *                     |                   | then the token log-normaliser lse           |
 *                     |                   | (TDT_W_* below); none with                  |
 *                     |                   | options.state_in_grads (tdt_wblocks_t)      |
 *                     | alpha    [N]      | double                                      |
 *                     | beta     [N]      | double                                      |
 *                     | ll       [B]      | double: log p(y|x) per sample               |
 *                     | ll_cut   [B]      | double: log p(y|x) at the middle cut (GPU,  |
 *                     |                   | the fused schedule's gradients)             |
 *                     | cut_part [B * C]  | double pairs: its chunks' partial sums      |
 *                     |                   | (C = TDT_WS_CUT_CHUNKS)                     |
 *                     | state    [B]      | int32: per-sample state flags (GPU)         |
 *                     | order [3 + K + 3B]| int32, the GPU's counters: a work ticket,   |
 *                     |                   | K = T + U per-layer done counts, B          |
 *                     |                   | per-sample beta progress counts, B alpha    |
 *                     |                   | progress counts, B cut chunk counts, the    |
 *                     |                   | gradient pass's own ticket, the costs       |
 *                     |                   | written (options.reduction's ticket)        |
 *                     |                   | (nothing when B == 0)                       |
 *
 * The per-node arrays hold sample b's nodes at b * max_frames * (max_labels + 1) +
 * tdt_node_index() (lattice.h): anti-diagonal-major, so a sweep's diagonal is contiguous (in
 * w, a contiguous run of blocks). A node's weights in one block, not an array each: a GPU sweep
 * stages a diagonal's as one run with one address computation a copy, which took its step
 * 0-10 % below the arrays' (H200, benchmark/sweep_step.cu; docs/performance.md, "The node
 * layout"), and the node pass writes, and
 * the gradient pass reads, a node's values in one 64-byte line at D = 5. With
 * options.state_in_grads the blocks are at the head of the token gradient's rows instead
 * (tdt_wblocks_t below), in the logits' (b, t, u) order; blocks in that order in w too cost
 * long 7 % and large bfloat16 2.5 % on the H200, the diagonals' blocks no longer
 * neighbours.
 *
 * tdt_get_workspace_size() returns layout total + TDT_WS_ALIGN (slack for an unaligned pointer).
 */
#ifndef TDT_COMMON_WORKSPACE_H
#define TDT_COMMON_WORKSPACE_H

#include "hd.h"

#define TDT_WS_ALIGN ((size_t)256)
#define TDT_WS_MAGIC 0x5444545f46574431ull /* "TDT_FWD1": a forward pass filled this */
/* Chunks of a sample's middle-cut log-likelihood (the GPU's fused schedule): one warp each,
 * their partial log-sum-exps kept as (max, sum) pairs. */
#define TDT_WS_CUT_CHUNKS 32

/* Written by the CPU forward pass, checked by the CPU backward pass. */
typedef struct tdt_ws_header {
    uint64_t magic;
    int64_t batch, max_frames, max_labels;
    int64_t num_durations; /* 0 for RNN-T */
    int64_t state_in_grads; /* the blocks went to the token gradient's rows */
} tdt_ws_header_t;

/* A node's block in w: its fields, and its size for D durations (0 for RNN-T). */
#define TDT_W_BLANK 0 /* lp_blank */
#define TDT_W_LABEL 1 /* lp_label (-inf at u == U_b) */
#define TDT_W_DUR 2   /* lp_dur[k] at TDT_W_DUR + k */
TDT_HD int64_t tdt_w_block(int64_t num_durations) { return 3 + num_durations; }
/* The field of the token log-normaliser, after the durations. */
TDT_HD int64_t tdt_w_lse(int64_t num_durations) { return TDT_W_DUR + num_durations; }

/* Row of the per-node arrays that holds anti-diagonal s, 0 <= s < max_frames + max_labels:
 * s mod max_frames (a subtraction in the common case U < T, a division only beyond 2 T). */
TDT_HD int64_t tdt_diag_row(int64_t s, int64_t max_frames) {
    return s < max_frames ? s : (s - max_frames < max_frames ? s - max_frames : s % max_frames);
}

/* Where the node blocks are: node (b, t, u)'s starts at
 *     base + b * s[0] + r * s[1] + u * s[2] bytes, rounded up to a multiple of 8,
 * with r = tdt_diag_row(t + u, frames) where frames > 0, r = t where frames == 0.
 * In the workspace (tdt_wblocks_ws, frames = max_frames) the strides are those of compact
 * blocks in the per-node arrays' diagonal order from an aligned base, and the rounding changes
 * nothing. With options.state_in_grads (tdt_wblocks_rows, frames = 0) they are the token
 * gradient's row strides in bytes: each node's block sits at the head of its own token-gradient
 * row, which the call overwrites with the gradient once nothing reads the block any more (a
 * node's gradient is the last reader of its block: include/tdt.h lists the calls and the
 * schedules where that holds). Rows aligned to their element only (a 16-bit row of odd length,
 * say) are rounded up to the next double: tdt_state_row_bytes() is what a row must hold. */
typedef struct tdt_wblocks {
    char *base;
    int64_t s[3];   /* bytes */
    int64_t frames; /* > 0: diagonal rows (the workspace); 0: frame rows (the gradient's) */
} tdt_wblocks_t;

/* p rounded up to a double's alignment: p plus an offset, not an integer made a pointer again,
 * so that a GPU compiler still sees a global-memory pointer derived from its argument (through
 * a uintptr_t round trip the normaliser's stores became generic ones, and the H200's forward
 * at base and ragged 6-10 % slower). */
TDT_HD double *tdt_align_double(const char *p) {
    return (double *)(p + ((8 - ((uintptr_t)p & 7)) & 7));
}

TDT_HD double *tdt_wblock(const tdt_wblocks_t *k, int64_t b, int64_t t, int64_t u) {
    const int64_t r = k->frames > 0 ? tdt_diag_row(t + u, k->frames) : t;
    return tdt_align_double(k->base + (b * k->s[0] + r * k->s[1] + u * k->s[2]));
}

/* Node n of sample b, n its index in the per-node arrays (tdt_diag_offset + u), where the
 * blocks are the workspace's (frames > 0): tdt_wblock's address, found without the diagonal's
 * row (their strides make it n * s[2] bytes into the sample's), for a sweep that has n. */
TDT_HD double *tdt_wblock_node(const tdt_wblocks_t *k, int64_t b, int64_t n) {
    return tdt_align_double(k->base + (b * k->s[0] + n * k->s[2]));
}

/* The workspace's blocks: W doubles a node, in the per-node arrays' order. */
TDT_HD tdt_wblocks_t tdt_wblocks_ws(double *w, int64_t W, int64_t max_frames, int64_t row) {
    tdt_wblocks_t k;
    k.base = (char *)w;
    k.s[2] = W * (int64_t)sizeof(double);
    k.s[1] = row * k.s[2];
    k.s[0] = max_frames * k.s[1];
    k.frames = max_frames;
    return k;
}

/* The token gradient's rows (strides in elements of elem bytes, as tdt_gradients_t's). */
TDT_HD tdt_wblocks_t tdt_wblocks_rows(void *token_grads, const int64_t *strides, int64_t elem) {
    tdt_wblocks_t k;
    k.base = (char *)token_grads;
    for (int i = 0; i < 3; ++i) k.s[i] = strides[i] * elem;
    k.frames = 0;
    return k;
}

/* Bytes a token-gradient row must hold for a block of W doubles at its head: W doubles, and
 * the rounding of a row aligned to its elem-byte elements only up to a double's alignment. */
TDT_HD int64_t tdt_state_row_bytes(int64_t W, int64_t elem) {
    return W * (int64_t)sizeof(double) + (elem < 8 ? 8 - elem : 0);
}

/* Byte offsets from the aligned base. */
typedef struct tdt_ws_layout {
    size_t header, w, alpha, beta, ll, ll_cut, cut_part, state, order;
    size_t total; /* bytes from the aligned base to the end */
    int64_t nodes;       /* N */
    int64_t block;       /* W */
} tdt_ws_layout_t;

/* Pointers into one carved workspace. */
typedef struct tdt_ws {
    tdt_ws_header_t *header;
    double *w, *alpha, *beta, *ll, *ll_cut, *cut_part;
    int32_t *state;
    int32_t *order; /* [0]: next work ticket; [1 + k]: finished tickets of layer k (forward);
                       [1 + K + b]: beta diagonals of sample b published (split backward,
                       fused); [1 + K + B + b]: alpha diagonals of sample b published, and
                       [1 + K + 2B + b]: sample b's cut chunks done (fused);
                       [1 + K + 3B]: the fused gradient pass's next ticket;
                       [2 + K + 3B]: the samples whose cost the sweeps wrote (a forward
                       with options.reduction: the last one sums them) */
} tdt_ws_t;

TDT_HD size_t tdt_align_up(size_t x) { return (x + TDT_WS_ALIGN - 1) & ~(TDT_WS_ALIGN - 1); }

/* a * b into *out, 0 on overflow of size_t or of int64 (sizes must also index as int64). */
TDT_HD int tdt_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > (size_t)INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* Appends a sub-buffer of count elements of elem bytes at *cursor; 0 on overflow. */
TDT_HD int tdt_ws_take(size_t *cursor, size_t count, size_t elem, size_t *offset) {
    size_t bytes;
    if (!tdt_mul_size(count, elem, &bytes)) return 0;
    *offset = *cursor;
    if (bytes > (size_t)INT64_MAX - *cursor - TDT_WS_ALIGN) return 0;
    *cursor = tdt_align_up(*cursor + bytes);
    return 1;
}

/* Layer counters K of the overlapped schedules: one per anti-diagonal, max_frames + max_labels
 * (a layer is one diagonal of every sample, or two, taken from both ends at once, when the
 * alpha and beta sweeps both trail the normaliser; then only the first half is used). Only
 * called for B > 0, where max_frames * (max_labels + 1) fits and so does the sum. */
TDT_HD int64_t tdt_ws_layers(int64_t max_frames, int64_t max_labels) { return max_frames + max_labels; }

/* The int32 counters of the order array (tdt_ws_t.order), for batch > 0. */
TDT_HD int64_t tdt_ws_counters(int64_t batch, int64_t max_frames, int64_t max_labels) {
    return 3 + tdt_ws_layers(max_frames, max_labels) + 3 * batch;
}

/* Index in the order array of the costs-written count (the last counter). */
TDT_HD int64_t tdt_ws_cost_count(int64_t batch, int64_t max_frames, int64_t max_labels) {
    return tdt_ws_counters(batch, max_frames, max_labels) - 1;
}

/* Layout for batch B, max_frames, max_labels, num_durations (0 for RNN-T); state_in_grads:
 * no w (options.state_in_grads). 0 on overflow. */
TDT_HD int tdt_workspace_layout(int64_t batch, int64_t max_frames, int64_t max_labels,
                                int64_t num_durations, int state_in_grads, tdt_ws_layout_t *l) {
    size_t nodes, w_elems, cursor = 0;
    const int64_t block = tdt_w_block(num_durations);
    if (!tdt_mul_size((size_t)batch, (size_t)max_frames, &nodes)) return 0;
    if (!tdt_mul_size(nodes, (size_t)max_labels + 1, &nodes)) return 0;
    if (!tdt_mul_size(nodes, (size_t)block, &w_elems)) return 0;
    if (state_in_grads) w_elems = 0;
    int ok = tdt_ws_take(&cursor, 1, sizeof(tdt_ws_header_t), &l->header) &&
             tdt_ws_take(&cursor, w_elems, sizeof(double), &l->w) &&
             tdt_ws_take(&cursor, nodes, sizeof(double), &l->alpha) &&
             tdt_ws_take(&cursor, nodes, sizeof(double), &l->beta) &&
             tdt_ws_take(&cursor, (size_t)batch, sizeof(double), &l->ll) &&
             tdt_ws_take(&cursor, (size_t)batch, sizeof(double), &l->ll_cut) &&
             tdt_ws_take(&cursor, (size_t)batch, 2 * TDT_WS_CUT_CHUNKS * sizeof(double), &l->cut_part) &&
             tdt_ws_take(&cursor, (size_t)batch, sizeof(int32_t), &l->state);
    if (!ok) return 0;
    /* No lattice, no counters: an empty batch's size does not grow with max_frames. Else the
     * node arrays fit, so T + U + 3 B (at most 4 B T (U + 1) + U) cannot overflow. */
    const int64_t counters = batch > 0 ? tdt_ws_counters(batch, max_frames, max_labels) : 0;
    if (!tdt_ws_take(&cursor, (size_t)counters, sizeof(int32_t), &l->order)) return 0;
    l->total = cursor;
    l->nodes = (int64_t)nodes;
    l->block = block;
    return 1;
}

/* Carves an (unaligned) workspace pointer into its sub-buffers. */
TDT_HD void tdt_workspace_carve(const tdt_ws_layout_t *l, void *workspace, tdt_ws_t *ws) {
    char *base = (char *)tdt_align_up((size_t)(uintptr_t)workspace);
    ws->header = (tdt_ws_header_t *)(base + l->header);
    ws->w = (double *)(base + l->w);
    ws->alpha = (double *)(base + l->alpha);
    ws->beta = (double *)(base + l->beta);
    ws->ll = (double *)(base + l->ll);
    ws->ll_cut = (double *)(base + l->ll_cut);
    ws->cut_part = (double *)(base + l->cut_part);
    ws->state = (int32_t *)(base + l->state);
    ws->order = (int32_t *)(base + l->order);
}

#endif /* TDT_COMMON_WORKSPACE_H */
