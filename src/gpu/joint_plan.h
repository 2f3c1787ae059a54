/*
 * joint_plan.h - the GPU fused joint's scratch (src/gpu/joint.cu): its size, for
 * tdt_joint_get_workspace_size(), and its layout, for the kernels. Plain C (the dispatch layer
 * includes it), host and device.
 *
 * The scratch, after the lattice's workspace (tdt_joint_call_t.scratch_offset), in the
 * accumulate type (float; double for float64), each part TDT_WS_ALIGN-aligned:
 *   dx       [R * (U + 1) * H]  d(enc + pred) of the nodes of R consecutive (b, t) rows: the
 *                               backward takes the lattice's nodes in chunks of R rows
 *   pred_acc [B * (U + 1) * H]  d pred summed over the chunks so far (t ascending)
 *   w_part   [P * O * H]        d W of each of P node partitions (summed in order after)
 *   b_part   [P * O]            d bias likewise
 * R and P are functions of the shapes alone, so the size query (which sees no device) and the
 * kernels agree: R keeps dx near TDT_JOINT_DX_BYTES, P gives d W's kernel about
 * TDT_JOINT_W_BLOCKS blocks (each owns TDT_JOINT_PLAN_TILE rows of W over its partition of the
 * nodes) while w_part stays near TDT_JOINT_WPART_BYTES (at least one partition, whatever its
 * size). At B 8, T 375, U 100, H 640, V + D 8198 (float32): 32 + 2 + 21 MB.
 *
 * With TDT_GPU_JOINT_BWD=chip (16-bit dtypes, H <= 640) the scratch is the chip layout instead,
 * and the other two take chunks that fit in its bytes (tdt_gpu_joint_plan, below).
 *
 * The GEMM schedule (joint_gemm.cu) lays out the same scratch its own way (a call takes one
 * schedule, so the scratch is the larger of the two layouts), for chunks of G consecutive
 * (b, t) rows in the forward, N = G (U + 1) nodes, and of G_b rows in the backward, N_b =
 * G_b (U + 1) nodes: G_b = G, but for float32 with split products (below), where a backward
 * node's z and dz's three parts take 10 bytes a value to the forward's 4, and G_b = 2 G / 5:
 *   g_z      [N * ldz]          the chunk's logits z plus bias (accumulate type, O rows of pitch
 *                               ldz, O rounded up to 8); in the backward N_b rows of pitch ldz
 *                               hold z plus bias in the dtype (less lse for float16 and
 *                               bfloat16), then in place its dz; with split products, dz goes
 *                               into its three bfloat16 parts after those rows (3 matrices,
 *                               N_b x ldz) instead, but for a row with a value that is not
 *                               finite (its dz in place, its parts zeros)
 *   g_h      [N * ldhp]         the chunk's h, the products' operand: the dtype, pitch ldhp =
 *                               ldh (H + 4 rounded up to 8), a 1 at column H (the bias's operand
 *                               in the z product, d bias's in the d W product), then
 *                               TDT_JOINT_LSE_PARTS columns that are zero but in the backward of
 *                               float16 and bfloat16, -lse split into that many values of the
 *                               dtype, then zeros; with split products, bfloat16 and pitch
 *                               ldhp = 6 ldh: six blocks of ldh, h's parts h0 h0 h0 h1 h1 h2,
 *                               and in the backward, after its N_b rows, the parts again as
 *                               three N_b x ldh matrices h2, h1, h0 (for d W's products)
 *   g_dx     [N_b * H]          d h, then in place d(enc + pred) (accumulate type)
 *   g_pred   [B * (U + 1) * H]  as pred_acc
 *   g_w      [ldz * ldw]        d W (columns 0..H-1 of ldz rows of pitch ldw = ldh; rows from O
 *                               on are zero) and d bias (column H), summed over the chunks so far
 *   g_wp     [ldz * ldwp]       W in the dtype, its rows padded to ldwp = ldh: the bias at column
 *                               H, ones in the TDT_JOINT_LSE_PARTS columns after it, zeros after
 *                               those, and zero rows from O to ldz; with split products,
 *                               bfloat16 and ldwp = 6 ldh: the parts W0 W1 W2 W0 W1 W0, so that
 *                               [W parts] [h parts]^T is the six products W_i h_j, i + j < 3
 *   g_lt     TDT_JOINT_LT_BYTES cuBLASLt's workspace
 *   g_nf     [1 + N_b] int32    split products only: the count of the chunk's dz rows with a
 *                               value that is not finite, then a flag a row
 *   g_coef   [N_b] records of TDT_JOINT_COEF_BYTES  the backward chunk's nodes' dz coefficients
 *                               (joint_gemm.cu's dz_coef: the dz kernel's, set up a thread a
 *                               node before it)
 *   g_krow   [B * T + 1] int32  skip_below's compaction: where each (b, t) row's kept nodes
 *                               start in g_kidx (an exclusive prefix sum; the last entry is
 *                               their count)
 *   g_kidx   [B * T * (U + 1)] int32  the kept nodes, ascending (their padded-order numbers)
 *   g_desc   [4] int64          the current compacted chunk: its first and end (b, t) row, its
 *                               first and end entry of g_kidx
 *   g_krow, g_kidx and g_desc are empty where the padded extent has 2^31 nodes or more (the
 *   backward then takes every node, its left-out ones as zero rows of dz).
 * Split products (float32 unless joint.cu's TDT_GPU_JOINT_FLOAT32 says sgemm): each float32
 * operand is the exact sum of three bfloat16 values (tdt_split3 below), and a product of two of
 * them is the sum of the six products of parts whose indices add up to at most 2, on bfloat16
 * tensor cores with float32 sums: the three dropped are at most 2^-23 of the product, two units
 * of float32's own rounding of it.
 * Every product's dimensions and pitches are thus multiples of 8 (ldz, ldh, ldwp), as cuBLASLt's
 * vectorised kernels want (the rows of z, dz and d W from O to ldz are zeros): with O = 8198 its
 * kernels loaded 2 or 1 values at a time.
 * G keeps g_z, g_h and g_dx together near the chunk budget, TDT_JOINT_Z_BYTES unless the
 * caller gives another (joint.cu: the environment variable TDT_GPU_JOINT_CHUNK_KB), at least one
 * row. At the shapes above in bfloat16: 119 + 5 + 9 (G 36) + 2 + 21 + 10.6 + 4 + 1.2 MB. The
 * budget trades memory for time: huge-joint bfloat16 forward+backward took 68, 42 and 36 ms with
 * 32, 128 and 512 MB (joint_gpu_bench --iters 5, H100, warp-tdt 0.7.0 at commit f806fb6).
 */
#ifndef TDT_GPU_JOINT_PLAN_H
#define TDT_GPU_JOINT_PLAN_H

#include <stdint.h>

#include "common/dtype.h"
#include "common/workspace.h"

#define TDT_JOINT_DX_BYTES ((size_t)32 << 20)
#define TDT_JOINT_WPART_BYTES ((size_t)32 << 20)
#define TDT_JOINT_W_BLOCKS 512
#define TDT_JOINT_PLAN_TILE 32
#define TDT_JOINT_Z_BYTES ((size_t)128 << 20)
#define TDT_JOINT_LT_BYTES ((size_t)4 << 20)
#define TDT_JOINT_SPLIT_BLOCKS 6 /* split products: the blocks of h's and W's rows (joint_gemm.cu) */
#define TDT_JOINT_LSE_PARTS 3 /* h's columns after its 1 that carry -lse in the backward (joint_gemm.cu) */
#define TDT_JOINT_COEF_BYTES 320 /* a backward node's dz coefficients (joint_gemm.cu's dz_coef) */
#define TDT_JOINT_CHIP_BYTES ((size_t)28 << 20) /* the chip schedule's area, by default (below) */
#define TDT_JOINT_CHIP_ROW 32 /* a chip node's coefficients (joint_wgmma.h's tdt_wgmma_dz_row) */
#define TDT_JOINT_CHIP_MAX_H 640 /* the chip's kernels keep ceil(H / 64) <= 10 chunks of sums */

typedef struct tdt_gpu_joint_plan {
    int64_t rows;   /* R: (b, t) rows of nodes a backward chunk, >= 1 */
    int64_t parts;  /* P: node partitions of d W, >= 1 */
    size_t dx, pred_acc, w_part, b_part; /* byte offsets from the scratch's (aligned) start */
    int64_t g_rows, g_rows_b; /* the GEMM schedule: G (forward), G_b (backward) */
    int64_t g_ldz, g_ldh, g_ldhp, g_ldw, g_ldwp; /* its pitches (elements) */
    int g_split; /* float32's products on bfloat16 parts (joint_gemm.cu) */
    size_t g_z, g_h, g_dx, g_pred, g_w, g_wp, g_lt, g_nf, g_coef; /* its byte offsets */
    int g_compact; /* 1: g_krow, g_kidx and g_desc are there (fewer than 2^31 nodes) */
    size_t g_krow, g_kidx, g_desc; /* skip_below's compaction (joint_gemm.cu) */
    /* the chip layout (c_chip = 1, below): W packed, d pred, the area and its uses */
    int c_chip;
    size_t c_wpk, c_pred, c_area, c_area_bytes;
    size_t c_fwd_h, c_fwd_lse; /* the forward's h rows and log-normalisers, after W padded at c_area */
    int64_t c_rows_f, c_rows_w, c_rows_h; /* (b, t) rows a chunk: forward, d W sweep, d h sweep */
    size_t bytes;   /* the scratch's size, TDT_WS_ALIGN slack included */
} tdt_gpu_joint_plan_t;

/* A chip chunk's parts (TDT_GPU_JOINT_BWD=chip, joint_gemm.cu), byte offsets. */
typedef struct tdt_gpu_chip_chunk {
    size_t h, hp, rows, kn, rare, zr, dx, end;
} tdt_gpu_chip_chunk_t;

/* The parts of a chip chunk of n nodes from byte at on, each TDT_WS_ALIGN-aligned: h's rows
 * (pitch ldh, 16-bit values) or, where packed, h packed instead as joint_wgmma.h's
 * tdt_gpu_wgmma_pack packs W (tiles of 128 nodes, ceil(H / 64) chunks of 16 KB a tile; h takes
 * no bytes then, at hp), the nodes' coefficients
 * (TDT_JOINT_CHIP_ROW bytes each), their known values (2 + D float32 each: the blank's, the
 * label's, the durations' dz), the count of rare rows (an int32) and a row of z for them (ldz
 * 16-bit values), where dx d h (H float32 a node); end: the byte after. 0 on overflow. */
TDT_HD int tdt_gpu_chip_chunk(size_t at, int64_t n, int64_t H, int64_t D, int64_t ldh, int64_t ldz, int packed,
                              int dx, tdt_gpu_chip_chunk_t *c) {
    size_t cur = at;
    const size_t tiles = packed ? ((size_t)n + 127) / 128 : 0, kc = (size_t)(H + 63) / 64;
    if (!tdt_ws_take(&cur, packed ? 0 : (size_t)n, (size_t)ldh * 2, &c->h) ||
        !tdt_ws_take(&cur, tiles * kc, 16384, &c->hp) ||
        !tdt_ws_take(&cur, (size_t)n, TDT_JOINT_CHIP_ROW, &c->rows) ||
        !tdt_ws_take(&cur, (size_t)n, (size_t)(2 + D) * 4, &c->kn) || !tdt_ws_take(&cur, 1, 4, &c->rare) ||
        !tdt_ws_take(&cur, (size_t)ldz, 2, &c->zr) || !tdt_ws_take(&cur, dx ? (size_t)n : 0, (size_t)H * 4, &c->dx))
        return 0;
    c->end = cur;
    return 1;
}

/* The bytes of the chip area's use (0: the forward, W padded then h's rows and a float32
 * log-normaliser for n nodes; 1: the d W sweep, d W in float32 then a packed chunk of n nodes;
 * 2: the d h sweep, a chunk of n nodes with d h) into *bytes, and the forward's offsets; 0 on
 * overflow. p's pitches are set. */
TDT_HD int tdt_gpu_chip_use(tdt_gpu_joint_plan_t *p, int use, int64_t n, int64_t H, int64_t D, size_t *bytes) {
    size_t cur = 0, off, wb;
    tdt_gpu_chip_chunk_t c;
    if (use == 0) {
        if (!tdt_mul_size((size_t)p->g_ldz, (size_t)p->g_ldwp, &wb) || !tdt_ws_take(&cur, wb, 2, &off) ||
            !tdt_ws_take(&cur, (size_t)n, (size_t)p->g_ldh * 2, &p->c_fwd_h) ||
            !tdt_ws_take(&cur, (size_t)n, 4, &p->c_fwd_lse))
            return 0;
        *bytes = cur;
        return 1;
    }
    if (use == 1 && (!tdt_mul_size((size_t)p->g_ldz, (size_t)p->g_ldw, &wb) || !tdt_ws_take(&cur, wb, 4, &off)))
        return 0;
    if (!tdt_gpu_chip_chunk(cur, n, H, D, p->g_ldh, p->g_ldz, use == 1, use == 2, &c)) return 0;
    *bytes = c.end;
    return 1;
}

/* The most (b, t) rows of row nodes, from 1 to all, whose use of the chip area fits in area
 * bytes (1 where none does); 0 on overflow. */
TDT_HD int64_t tdt_gpu_chip_rows(tdt_gpu_joint_plan_t *p, int use, int64_t row, int64_t all, int64_t H, int64_t D,
                                 size_t area) {
    int64_t lo = 1, hi = all;
    size_t b;
    while (lo < hi) { /* the largest r in [lo, hi] that fits, or lo */
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (!tdt_gpu_chip_use(p, use, mid * row, H, D, &b)) return 0;
        if (b <= area) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The fused schedule's ("tiles") layout for R rows a backward chunk and P partitions, from 0:
 * its end into *end; 0 on overflow. */
TDT_HD int tdt_gpu_plan_tiles(tdt_gpu_joint_plan_t *p, int64_t B, size_t row_elems, size_t oh, int64_t O,
                              int64_t acc, size_t *end) {
    size_t cursor = 0, n;
    if (!tdt_mul_size((size_t)p->rows, row_elems, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->dx) ||
        !tdt_mul_size((size_t)B, row_elems, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->pred_acc) ||
        !tdt_mul_size((size_t)p->parts, oh, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->w_part) ||
        !tdt_mul_size((size_t)p->parts, (size_t)O, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->b_part))
        return 0;
    *end = cursor;
    return 1;
}

/* The GEMM schedule's layout for G rows a forward chunk (G_b from it), from 0: its end into
 * *end; 0 on overflow. p's pitches and g_split are set; zb, zbb, hb: a node's bytes of forward
 * z, backward z (and dz's parts) and h, elem the dtype's. */
TDT_HD int tdt_gpu_plan_gemm(tdt_gpu_joint_plan_t *p, int64_t G, int64_t B, int64_t row, int64_t all_rows,
                             size_t row_elems, int64_t H, int64_t acc, int64_t elem, size_t zb, size_t zbb,
                             size_t hb, size_t *end) {
    size_t g = 0, n, nodes, nodes_b, zf, zbk, wb;
    const size_t ob = p->g_split ? 2 : (size_t)elem;
    int64_t Gb = zbb > 0 ? (int64_t)((size_t)G * zb / zbb) : G; /* G zb: at most the budget, or one row's */
    if (Gb < 1) Gb = 1;
    p->g_rows = G;
    p->g_rows_b = Gb;
    if (!tdt_mul_size((size_t)G, (size_t)row, &nodes) || !tdt_mul_size((size_t)Gb, (size_t)row, &nodes_b))
        return 0;
    if (!tdt_mul_size(nodes, zb, &zf) || !tdt_mul_size(nodes_b, zbb, &zbk)) return 0;
    if (!tdt_ws_take(&g, zf > zbk ? zf : zbk, 1, &p->g_z)) return 0;
    if (!tdt_mul_size(nodes, hb, &n)) return 0;
    if (p->g_split) { /* the backward's h parts: N_b rows of six blocks, then three N_b x ldh matrices */
        size_t nh;
        if (!tdt_mul_size(nodes_b, hb + hb / 2, &nh)) return 0;
        if (nh > n) n = nh;
    }
    if (!tdt_ws_take(&g, n, 1, &p->g_h)) return 0;
    if (!tdt_mul_size(nodes_b, (size_t)H, &n) || !tdt_ws_take(&g, n, (size_t)acc, &p->g_dx)) return 0;
    if (!tdt_mul_size((size_t)B, row_elems, &n) || !tdt_ws_take(&g, n, (size_t)acc, &p->g_pred)) return 0;
    if (!tdt_mul_size((size_t)p->g_ldz, (size_t)p->g_ldw, &wb) || !tdt_ws_take(&g, wb, (size_t)acc, &p->g_w))
        return 0;
    if (!tdt_mul_size((size_t)p->g_ldz, (size_t)p->g_ldwp, &wb) || !tdt_ws_take(&g, wb, ob, &p->g_wp))
        return 0;
    if (!tdt_ws_take(&g, TDT_JOINT_LT_BYTES, 1, &p->g_lt)) return 0;
    /* split products: a count and a flag a backward node (int32) */
    if (!tdt_ws_take(&g, p->g_split ? nodes_b + 1 : 0, 4, &p->g_nf)) return 0;
    /* a backward node's dz coefficients */
    if (!tdt_mul_size(nodes_b, TDT_JOINT_COEF_BYTES, &n) || !tdt_ws_take(&g, n, 1, &p->g_coef)) return 0;
    /* skip_below's compaction: int32 row starts and node numbers (all_rows * row fits: the
     * lattice's layout checked it) */
    const int64_t padded = all_rows * row;
    p->g_compact = padded < INT32_MAX;
    if (!tdt_ws_take(&g, p->g_compact ? (size_t)all_rows + 1 : 0, 4, &p->g_krow) ||
        !tdt_ws_take(&g, p->g_compact ? (size_t)padded : 0, 4, &p->g_kidx) ||
        !tdt_ws_take(&g, p->g_compact ? 4 : 0, 8, &p->g_desc))
        return 0;
    *end = g;
    return 1;
}

/* The plan for B, max_frames, max_labels, num_outputs O, hidden H, an accumulate type of acc
 * bytes (4 or 8), a dtype of elem bytes (2, 4 or 8), split products (1: float32's products on
 * bfloat16 parts; only with acc = elem = 4), the chunk budget (chunk_bytes; 0 for the default),
 * D durations (0 for RNN-T) and chip (1: TDT_GPU_JOINT_BWD=chip). 0 on overflow.
 *
 * With chip, a dtype of 2 bytes and H <= TDT_JOINT_CHIP_MAX_H, the scratch is the chip layout
 * (c_chip = 1): W's O rows packed for wgmma (c_wpk), d pred (c_pred, float32), then an area
 * (c_area, chunk_bytes, by default TDT_JOINT_CHIP_BYTES, or what one row of each use needs) that
 * holds in turn the forward's W padded, h and log-normalisers for c_rows_f (b, t) rows at a time,
 * the d W sweep's d W (float32, pitch ldw) and chunks of c_rows_w rows (h packed), and the d h
 * sweep's chunks of c_rows_h rows (d h in float32); the fused and GEMM schedules' layouts then
 * take chunks that fit in the same bytes (they run where the chip's kernels cannot: another
 * device, skip_below), one row at least. At huge-joint (B 8, T 375, U 100, H 640, V 8193, D 5)
 * in bfloat16: 10.6 + 2.1 + 29.4 MB, rows 142, 30, 74. */
TDT_HD int tdt_gpu_joint_plan(int64_t B, int64_t max_frames, int64_t max_labels, int64_t O,
                              int64_t H, int64_t acc, int64_t elem, int split, size_t chunk_bytes,
                              int64_t D, int chip, tdt_gpu_joint_plan_t *p) {
    size_t row_elems, oh, cursor = 0, g = 0;
    const int64_t row = max_labels + 1;
    if (!tdt_mul_size((size_t)row, (size_t)H, &row_elems)) return 0;
    if (!tdt_mul_size((size_t)O, (size_t)H, &oh)) return 0;
    const size_t row_bytes = row_elems * (size_t)acc;
    const int64_t all_rows = B * max_frames; /* fits: the lattice's layout checked it */
    int64_t R = row_bytes > 0 ? (int64_t)(TDT_JOINT_DX_BYTES / row_bytes) : 1;
    if (R > all_rows) R = all_rows;
    if (R < 1) R = 1;
    const size_t part_bytes = oh * (size_t)acc;
    int64_t P = part_bytes > 0 ? (int64_t)(TDT_JOINT_WPART_BYTES / part_bytes) : 1;
    const int64_t otiles = (O + TDT_JOINT_PLAN_TILE - 1) / TDT_JOINT_PLAN_TILE;
    const int64_t want = (TDT_JOINT_W_BLOCKS + otiles - 1) / otiles;
    const int64_t tiles = (all_rows * row + TDT_JOINT_PLAN_TILE - 1) / TDT_JOINT_PLAN_TILE;
    if (P > want) P = want;
    if (P > tiles) P = tiles;
    if (P < 1) P = 1;
    p->rows = R;
    p->parts = P;
    if (!tdt_gpu_plan_tiles(p, B, row_elems, oh, O, acc, &cursor)) return 0;
    /* the GEMM schedule's layout, from the same start */
    size_t zrow, zb, hb, db;
    if (O > INT64_MAX / 16 || H > INT64_MAX / 16 / elem || H > INT64_MAX / 16 / acc) return 0;
    p->g_split = split && acc == 4 && elem == 4;
    const int64_t blocks = p->g_split ? TDT_JOINT_SPLIT_BLOCKS : 1, ob = p->g_split ? 2 : elem; /* h's */
    p->g_ldz = (O + 7) / 8 * 8;
    p->g_ldh = (H + 1 + TDT_JOINT_LSE_PARTS + 7) / 8 * 8;
    p->g_ldhp = p->g_ldh * blocks;
    p->g_ldw = p->g_ldh;
    p->g_ldwp = p->g_ldhp;
    /* a node's bytes: forward z (zb), backward z and dz's parts (zbb), h (hb), d h (db), and its
     * dz coefficients */
    size_t zbb;
    if (!tdt_mul_size((size_t)p->g_ldz, (size_t)elem, &zb) || !tdt_mul_size((size_t)p->g_ldhp, (size_t)ob, &hb) ||
        !tdt_mul_size((size_t)H, (size_t)acc, &db) || zb > SIZE_MAX / 8 || hb > SIZE_MAX / 4 || db > SIZE_MAX / 4)
        return 0;
    zbb = zb + (p->g_split ? 3 * (size_t)p->g_ldz * 2 : 0);
    if (!tdt_mul_size((size_t)row, zb + hb + db + TDT_JOINT_COEF_BYTES, &zrow)) return 0;
    p->c_chip = chip && elem == 2 && acc == 4 && H <= TDT_JOINT_CHIP_MAX_H && D >= 0;
    int64_t G;
    if (!p->c_chip) {
        if (chunk_bytes == 0) chunk_bytes = TDT_JOINT_Z_BYTES;
        G = zrow > 0 ? (int64_t)(chunk_bytes / zrow) : 1;
        if (G > all_rows) G = all_rows;
        if (G < 1) G = 1;
        if (!tdt_gpu_plan_gemm(p, G, B, row, all_rows, row_elems, H, acc, elem, zb, zbb, hb, &g)) return 0;
        if (g > cursor) cursor = g;
        p->c_wpk = p->c_pred = p->c_area = p->c_area_bytes = p->c_fwd_h = p->c_fwd_lse = 0;
        p->c_rows_f = p->c_rows_w = p->c_rows_h = 0;
    } else {
        /* the area: the budget, or one row of each use */
        size_t area = chunk_bytes ? chunk_bytes : TDT_JOINT_CHIP_BYTES, need, c = 0, n;
        for (int use = 0; use < 3; ++use) {
            if (!tdt_gpu_chip_use(p, use, row, H, D, &need)) return 0;
            if (need > area) area = need;
        }
        if (!(p->c_rows_w = tdt_gpu_chip_rows(p, 1, row, all_rows, H, D, area)) ||
            !(p->c_rows_h = tdt_gpu_chip_rows(p, 2, row, all_rows, H, D, area)) ||
            !(p->c_rows_f = tdt_gpu_chip_rows(p, 0, row, all_rows, H, D, area)) ||
            !tdt_gpu_chip_use(p, 0, p->c_rows_f * row, H, D, &need)) /* the forward's offsets */
            return 0;
        const size_t kc = (size_t)(H + 63) / 64, otl = ((size_t)O + 127) / 128;
        if (!tdt_mul_size(otl * kc, 16384, &n) || !tdt_ws_take(&c, n, 1, &p->c_wpk) ||
            !tdt_mul_size((size_t)B, row_elems, &n) || !tdt_ws_take(&c, n, 4, &p->c_pred) ||
            !tdt_ws_take(&c, area, 1, &p->c_area))
            return 0;
        p->c_area_bytes = area;
        /* the other layouts in the same bytes: the most rows a chunk that fit, one at least */
        int64_t lo = 1, hi = R;
        while (lo < hi) {
            p->rows = lo + (hi - lo + 1) / 2;
            if (!tdt_gpu_plan_tiles(p, B, row_elems, oh, O, acc, &cursor)) return 0;
            if (cursor <= c) lo = p->rows;
            else hi = p->rows - 1;
        }
        p->rows = lo;
        if (!tdt_gpu_plan_tiles(p, B, row_elems, oh, O, acc, &cursor)) return 0;
        lo = 1, hi = all_rows;
        while (lo < hi) {
            G = lo + (hi - lo + 1) / 2;
            if (!tdt_gpu_plan_gemm(p, G, B, row, all_rows, row_elems, H, acc, elem, zb, zbb, hb, &g)) return 0;
            if (g <= c) lo = G;
            else hi = G - 1;
        }
        if (!tdt_gpu_plan_gemm(p, lo, B, row, all_rows, row_elems, H, acc, elem, zb, zbb, hb, &g)) return 0;
        if (g > cursor) cursor = g;
        if (c > cursor) cursor = c;
    }
    if (cursor > (size_t)INT64_MAX - TDT_WS_ALIGN) return 0;
    p->bytes = cursor + TDT_WS_ALIGN;
    return 1;
}

/* Split products (joint_gemm.cu): x as three bfloat16 values (bits) whose sum is x exactly:
 * the bfloat16 nearest x (dtype.h's tdt_float_to_bf16), the one nearest the rest, then the rest
 * (x's 24 significant bits less the 8 or so of each part before: at most 8 left, so exact). |part 1| <= 2^-8 |x| and
 * |part 2| <= 2^-16 |x|, so of a product of two split values the three products of parts whose
 * indices add up to 3 or more are at most 2^-23 of it. A part that would round past bfloat16's
 * largest value is truncated instead (|part 1| <= 2^-7 |x| then, for |x| beyond that value
 * less half its last place); below float32's normal range the last part loses the bits
 * bfloat16's subnormals cannot hold. Infinities and NaN: the value, then zeros. */
TDT_HD void tdt_split3(float x, uint16_t part[3]) {
    if (!(x - x == 0.0f)) { /* infinite or NaN */
        part[0] = tdt_float_to_bf16(x);
        part[1] = part[2] = 0;
        return;
    }
    for (int i = 0; i < 3; ++i) {
        uint16_t b = tdt_float_to_bf16(x);
        if ((b & 0x7fffu) == 0x7f80u) /* rounded to an infinity: truncated instead */
            b = (uint16_t)(tdt_float_to_bits(x) >> 16);
        part[i] = b;
        x -= tdt_bf16_to_float(b);
    }
}

#endif /* TDT_GPU_JOINT_PLAN_H */
