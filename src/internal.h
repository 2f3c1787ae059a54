/*
 * internal.h - what the dispatch layer hands a backend: one validated call.
 *
 * The dispatch layer (src/tdt.c) checks every argument, builds the arc set and the workspace
 * layout, and then calls exactly one backend entry. Backends trust what they are given here:
 * pointers non-NULL where required, sizes in range, strides non-negative and free of int64
 * overflow, durations valid, workspace large enough. The CPU backend also gets lengths and
 * labels that were checked; the GPU backend must guard its own reads of them (they live in
 * device memory).
 */
#ifndef TDT_INTERNAL_H
#define TDT_INTERNAL_H

#include "tdt.h"

#include "common/lattice.h"
#include "common/workspace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdt_call {
    tdt_problem_t p;          /* as the caller gave it */
    tdt_options_t o;          /* as the caller gave it */
    tdt_arcs_t arcs;          /* TDT durations or the RNN-T rule */
    int tdt_mode;             /* 1: duration logits given */
    int num_durations;        /* D in TDT mode, 0 for RNN-T */
    tdt_ws_layout_t layout;   /* of the workspace */
    void *workspace;          /* the caller's pointer (carve with tdt_workspace_carve) */
    int do_forward;           /* fill the workspace and write costs */
    int do_backward;          /* write the gradients from a filled workspace */
    int costs_only;           /* forward with no backward to follow (compute_tdt_loss without
                                 gradients): both backends skip beta; the CPU also leaves the
                                 workspace unfit for tdt_backward (the GPU cannot mark it) */
    void *costs;              /* (B) accumulate type; forward output */
    const void *grad_costs;   /* (B) accumulate type, or NULL for ones; backward input */
    tdt_gradients_t g;        /* gradients to write (NULL pointers skipped) */
    int *ahead;               /* tdt_forward_ahead(): do_backward only where the backend runs
                                 the gradients with the forward (the GPU's fused schedule);
                                 *ahead = 1 when it did, else left 0. NULL elsewhere. */
} tdt_call_t;

/* Backends. Each returns SUCCESS or a status after setting the error detail. */
tdt_status_t tdt_cpu_run(const tdt_call_t *call);
tdt_status_t tdt_gpu_run(const tdt_call_t *call);
tdt_status_t tdt_gpu_count(int *count);
/* tdt_scale_gradients(): grad_costs is the scale; no workspace (call->workspace NULL). */
tdt_status_t tdt_cpu_scale(const tdt_call_t *call);
tdt_status_t tdt_gpu_scale(const tdt_call_t *call);
int tdt_gpu_built(void);
/* tdt_pack_indices() on the GPU, its arguments checked (indices->type, sizes, pointers). */
tdt_status_t tdt_gpu_pack(const tdt_problem_t *problem, const tdt_options_t *options,
                          const tdt_indices_t *indices, int32_t *packed, int32_t *valid);

/* A validated fused joint + loss call (tdt_joint_*): the lattice part is an ordinary call whose
 * problem has no logits pointers (c.p.token_logits and duration_logits NULL; c.tdt_mode and
 * c.num_durations say TDT or RNN-T), whose c.g is unused, and whose c.layout is the lattice's
 * workspace layout; the tiles' scratch follows it in the workspace. */
typedef struct tdt_joint_call {
    tdt_joint_problem_t jp;   /* as the caller gave it */
    tdt_call_t c;             /* the lattice call (options, arcs, layout, costs, grad_costs) */
    tdt_joint_gradients_t jg; /* gradients to write (NULL pointers skipped) */
    size_t scratch_offset;    /* bytes from the aligned workspace start to the tiles' scratch */
    size_t scratch_bytes;
} tdt_joint_call_t;

tdt_status_t tdt_cpu_joint_run(const tdt_joint_call_t *call);
tdt_status_t tdt_gpu_joint_run(const tdt_joint_call_t *call);
/* Bytes of the tiles' scratch a backend needs for this problem (its shapes, dtype and
 * num_outputs; hidden >= 1 and the sizes checked, D the durations, 0 for RNN-T) and options
 * (location, num_threads): tdt_joint_get_workspace_size() adds it to the lattice's layout, and a
 * call hands the backend that many bytes from tdt_joint_call_t.scratch_offset (aligned to
 * TDT_WS_ALIGN). A function of those arguments alone; at most SIZE_MAX / 2 or the call fails. */
size_t tdt_cpu_joint_scratch_bytes(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                   int num_durations);
size_t tdt_gpu_joint_scratch_bytes(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                   int num_durations);

/* Records the detail returned by tdt_last_error() for this thread (printf-style). */
void tdt_set_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
void tdt_clear_error(void);

/* Accumulate-type helpers for costs and upstream gradients. */
static inline int tdt_acc_is_double(tdt_dtype_t dtype) { return dtype == TDT_DTYPE_FLOAT64; }

/* Bytes of one logits element. */
static inline int tdt_dtype_size(tdt_dtype_t dtype) {
    return dtype == TDT_DTYPE_FLOAT64 ? 8 : dtype == TDT_DTYPE_FLOAT32 ? 4 : 2;
}

/* Where a call's node blocks are (workspace.h): in the workspace's w, or with
 * options.state_in_grads at the head of the token gradient's rows (checked by the dispatch
 * layer: given, not in place, rows of tdt_state_row_bytes() or more). */
static inline tdt_wblocks_t tdt_call_blocks(const tdt_call_t *c, double *w) {
    if (c->o.state_in_grads)
        return tdt_wblocks_rows(c->g.token_grads, c->g.token_strides, tdt_dtype_size(c->p.dtype));
    return tdt_wblocks_ws(w, c->layout.block, c->p.max_frames, c->p.max_labels + 1);
}

#ifdef __cplusplus
}
#endif

#endif /* TDT_INTERNAL_H */
