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
 * kernels agree: R keeps dx near kJointDxBytes, P gives d W's kernel about kJointWBlocks
 * blocks (each owns kJointPlanTile rows of W over its partition of the nodes) while w_part
 * stays near kJointWPartBytes (at least one partition, whatever its size). At B 8, T 375,
 * U 100, H 640, V + D 8198 (float32): 32 + 2 + 21 MB.
 */
#ifndef TDT_GPU_JOINT_PLAN_H
#define TDT_GPU_JOINT_PLAN_H

#include "common/workspace.h"

#define TDT_JOINT_DX_BYTES ((size_t)32 << 20)
#define TDT_JOINT_WPART_BYTES ((size_t)32 << 20)
#define TDT_JOINT_W_BLOCKS 512
#define TDT_JOINT_PLAN_TILE 32

typedef struct tdt_gpu_joint_plan {
    int64_t rows;   /* R: (b, t) rows of nodes a backward chunk, >= 1 */
    int64_t parts;  /* P: node partitions of d W, >= 1 */
    size_t dx, pred_acc, w_part, b_part; /* byte offsets from the scratch's (aligned) start */
    size_t bytes;   /* the scratch's size, TDT_WS_ALIGN slack included */
} tdt_gpu_joint_plan_t;

/* The plan for B, max_frames, max_labels, num_outputs O, hidden H and an accumulate type of
 * acc bytes (4 or 8). 0 on overflow. */
TDT_HD int tdt_gpu_joint_plan(int64_t B, int64_t max_frames, int64_t max_labels, int64_t O,
                              int64_t H, int64_t acc, tdt_gpu_joint_plan_t *p) {
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
    if (cursor > (size_t)INT64_MAX - TDT_WS_ALIGN) return 0;
    p->bytes = cursor + TDT_WS_ALIGN;
    return 1;
}

#endif /* TDT_GPU_JOINT_PLAN_H */
