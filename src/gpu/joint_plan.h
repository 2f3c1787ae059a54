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
    size_t bytes;   /* the scratch's size, TDT_WS_ALIGN slack included */
} tdt_gpu_joint_plan_t;

/* The plan for B, max_frames, max_labels, num_outputs O, hidden H, an accumulate type of acc
 * bytes (4 or 8), a dtype of elem bytes (2, 4 or 8), split products (1: float32's products on
 * bfloat16 parts; only with acc = elem = 4) and the GEMM schedule's chunk budget (chunk_bytes;
 * 0 for TDT_JOINT_Z_BYTES). 0 on overflow. */
TDT_HD int tdt_gpu_joint_plan(int64_t B, int64_t max_frames, int64_t max_labels, int64_t O,
                              int64_t H, int64_t acc, int64_t elem, int split, size_t chunk_bytes,
                              tdt_gpu_joint_plan_t *p) {
    size_t row_elems, oh, cursor = 0, n;
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
    if (!tdt_mul_size((size_t)R, row_elems, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->dx))
        return 0;
    if (!tdt_mul_size((size_t)B, row_elems, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->pred_acc))
        return 0;
    if (!tdt_mul_size((size_t)P, oh, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->w_part))
        return 0;
    if (!tdt_mul_size((size_t)P, (size_t)O, &n) || !tdt_ws_take(&cursor, n, (size_t)acc, &p->b_part))
        return 0;
    /* the GEMM schedule's layout, from the same start */
    size_t g = 0, zrow, nodes, zb, hb, db, wb;
    if (O > INT64_MAX / 16 || H > INT64_MAX / 16 / elem || H > INT64_MAX / 16 / acc) return 0;
    p->g_split = split && acc == 4 && elem == 4;
    const int64_t blocks = p->g_split ? TDT_JOINT_SPLIT_BLOCKS : 1, ob = p->g_split ? 2 : elem;
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
    if (chunk_bytes == 0) chunk_bytes = TDT_JOINT_Z_BYTES;
    int64_t G = zrow > 0 ? (int64_t)(chunk_bytes / zrow) : 1;
    if (G > all_rows) G = all_rows;
    if (G < 1) G = 1;
    int64_t Gb = zbb > 0 ? (int64_t)((size_t)G * zb / zbb) : G; /* G zb: at most the budget, or one row's */
    if (Gb < 1) Gb = 1;
    p->g_rows = G;
    p->g_rows_b = Gb;
    size_t nodes_b, zf, zbk; /* nodes: a forward chunk's, nodes_b a backward one's */
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
    if (!tdt_mul_size((size_t)p->g_ldz, (size_t)p->g_ldwp, &wb) || !tdt_ws_take(&g, wb, (size_t)ob, &p->g_wp))
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
    if (g > cursor) cursor = g;
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
