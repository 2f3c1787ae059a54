/*
 * tdt.c - the dispatch layer: validates every argument before any work, then routes the call
 * to one backend (warp-ctc's entry-point pattern).
 *
 * Nothing is written on any status but SUCCESS (except the thread's error detail, and on the CPU
 * the arrays options.pack packs into, which its data check reads). Checks run in a fixed order:
 * structs, options, sizes, dtype, blank, durations, pointers, strides, options.state_in_grads,
 * workspace, backend, options.pack's arguments; then, on the CPU only, the data (lengths and labels, packed first
 * with options.pack).
 */
#include <math.h>
#include <string.h>

#include "common/indices.h"
#include "common/joint.h"
#include "internal.h"

/* One failed check: record the detail and return its status. */
#define TDT_FAIL(status, ...)          \
    do {                               \
        tdt_set_error(__VA_ARGS__);    \
        return (status);               \
    } while (0)

#define TDT_CHECK(expr)                        \
    do {                                       \
        tdt_status_t tdt_check_s_ = (expr);    \
        if (tdt_check_s_ != TDT_STATUS_SUCCESS) return tdt_check_s_; \
    } while (0)

/* ---- options and shapes ----------------------------------------------------------------------- */

static tdt_status_t check_option_value(const char *name, double value) {
    if (!isfinite(value) || value < 0.0)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->%s = %g must be finite and >= 0", name, value);
    return TDT_STATUS_SUCCESS;
}

static tdt_status_t check_options(const tdt_options_t *o) {
    if (o->location != TDT_LOCATION_CPU && o->location != TDT_LOCATION_GPU)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->location = %d is not a tdt_location_t",
                 (int)o->location);
    if (o->num_threads < 0)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->num_threads = %d must be >= 0 (0 = default)",
                 o->num_threads);
    if (o->input_kind != TDT_INPUT_LOGITS && o->input_kind != TDT_INPUT_LOG_PROBS)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->input_kind = %d is not a tdt_input_kind_t",
                 (int)o->input_kind);
    if (o->gpu_schedule < TDT_GPU_SCHEDULE_AUTO || o->gpu_schedule > TDT_GPU_SCHEDULE_TRAIL)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->gpu_schedule = %d is not a tdt_gpu_schedule_t",
                 (int)o->gpu_schedule);
    if (o->reduction < TDT_REDUCTION_NONE || o->reduction > TDT_REDUCTION_MEAN)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->reduction = %d is not a tdt_reduction_t",
                 (int)o->reduction);
    TDT_CHECK(check_option_value("sigma", o->sigma));
    TDT_CHECK(check_option_value("fastemit_lambda", o->fastemit_lambda));
    TDT_CHECK(check_option_value("clamp", o->clamp));
    if (o->location == TDT_LOCATION_GPU && !tdt_gpu_built()) return tdt_gpu_run(NULL);
    return TDT_STATUS_SUCCESS;
}

static tdt_status_t check_sizes(const tdt_problem_t *p) {
    if (p->batch < 0) TDT_FAIL(TDT_STATUS_INVALID_SIZE, "problem->batch = %lld must be >= 0", (long long)p->batch);
    if (p->max_frames < 0)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "problem->max_frames = %lld must be >= 0", (long long)p->max_frames);
    if (p->max_labels < 0 || p->max_labels >= INT32_MAX)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "problem->max_labels = %lld must be in [0, 2^31 - 1)",
                 (long long)p->max_labels);
    if (p->vocab_size < 1)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "problem->vocab_size = %lld must be >= 1", (long long)p->vocab_size);
    return TDT_STATUS_SUCCESS;
}

static tdt_status_t check_durations(const tdt_options_t *o) {
    if (o->num_durations < 1 || o->num_durations > TDT_MAX_DURATIONS)
        TDT_FAIL(TDT_STATUS_TOO_MANY_DURATIONS,
                 "options->num_durations = %d must be in [1, %d] when duration logits are given",
                 o->num_durations, TDT_MAX_DURATIONS);
    if (!o->durations)
        TDT_FAIL(TDT_STATUS_NULL_POINTER, "options->durations is NULL but duration logits are given");
    int any_positive = 0;
    for (int k = 0; k < o->num_durations; ++k) {
        if (o->durations[k] < 0)
            TDT_FAIL(TDT_STATUS_INVALID_DURATIONS, "options->durations[%d] = %d is negative", k,
                     o->durations[k]);
        for (int j = 0; j < k; ++j)
            if (o->durations[j] == o->durations[k])
                TDT_FAIL(TDT_STATUS_INVALID_DURATIONS,
                         "options->durations[%d] = %d duplicates options->durations[%d]", k,
                         o->durations[k], j);
        any_positive |= o->durations[k] > 0;
    }
    if (!any_positive)
        TDT_FAIL(TDT_STATUS_NO_POSITIVE_DURATION,
                 "options->durations has no duration > 0: no blank arc could advance a frame");
    return TDT_STATUS_SUCCESS;
}

/* ---- strides ---------------------------------------------------------------------------------- */

/* Checks a strided (B, max_frames, max_labels + 1, width) tensor: strides >= 0 and the largest
 * element offset fits int64; with disjoint != 0 also that no two elements share an address
 * (required of gradients; inputs may broadcast). */
/* Any strided tensor of n dimensions of these extents over rows of width contiguous elements of
 * dtype: the check above, and with span non-NULL the elements from its first to past its last. */
static tdt_status_t check_strided(const char *name, const int64_t *strides, const int64_t *extent,
                                  int n, int64_t width, tdt_dtype_t dtype, int disjoint,
                                  int64_t *span_out) {
    int64_t span = width; /* elements from a row's first element to past its last */
    int64_t esz = tdt_dtype_size(dtype);
    for (int i = 0; i < n; ++i) {
        if (strides[i] < 0)
            TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "%s_strides[%d] = %lld is negative", name, i,
                     (long long)strides[i]);
        int64_t reach;
        if (extent[i] > 1 && (__builtin_mul_overflow(strides[i], extent[i] - 1, &reach) ||
                              __builtin_add_overflow(span, reach, &span)))
            TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "%s_strides overflow 64-bit offsets", name);
    }
    if (span > INT64_MAX / esz)
        TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "%s_strides reach %lld elements: overflows 64-bit "
                 "byte offsets", name, (long long)span);
    if (span_out) *span_out = span;
    /* a tensor of no element has no rows to overlap (and spans no byte) */
    for (int i = 0; i < n; ++i)
        if (extent[i] == 0) {
            if (span_out) *span_out = 0;
            return TDT_STATUS_SUCCESS;
        }
    if (!disjoint) return TDT_STATUS_SUCCESS;
    /* Disjoint iff, with the dimensions of extent > 1 sorted by stride, each stride clears
     * everything spanned by the dimensions inside it. */
    int order[3], m = 0;
    for (int i = 0; i < n; ++i)
        if (extent[i] > 1) order[m++] = i;
    n = m;
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && strides[order[j]] < strides[order[j - 1]]; --j) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    int64_t inner = width;
    for (int i = 0; i < n; ++i) {
        int d = order[i];
        if (strides[d] < inner)
            TDT_FAIL(TDT_STATUS_INVALID_STRIDES,
                     "%s_strides[%d] = %lld makes rows overlap (needs >= %lld for a row of %lld)",
                     name, d, (long long)strides[d], (long long)inner, (long long)width);
        inner = strides[d] * (extent[d] - 1) + inner;
    }
    return TDT_STATUS_SUCCESS;
}

static tdt_status_t check_strides(const char *name, const int64_t *strides,
                                  const tdt_problem_t *p, int64_t width, int disjoint) {
    const int64_t extent[3] = {p->batch, p->max_frames, p->max_labels + 1};
    return check_strided(name, strides, extent, 3, width, p->dtype, disjoint, NULL);
}

/* A gradient that aliases its logits must use the logits' strides exactly. */
static tdt_status_t check_in_place(const char *name, const void *grad, const int64_t *gs,
                                   const void *logits, const int64_t *ls, const tdt_problem_t *p) {
    int64_t extent[3] = {p->batch, p->max_frames, p->max_labels + 1};
    if (grad != logits) return TDT_STATUS_SUCCESS;
    for (int i = 0; i < 3; ++i)
        if (extent[i] > 1 && gs[i] != ls[i])
            TDT_FAIL(TDT_STATUS_INVALID_STRIDES,
                     "%s is written in place over the logits but its stride %d is %lld, the "
                     "logits' is %lld", name, i, (long long)gs[i], (long long)ls[i]);
    return TDT_STATUS_SUCCESS;
}

/* options.state_in_grads: the per-node blocks go to the head of the token gradient's rows
 * (workspace.h, tdt_wblocks_rows), which must exist, be the call's own (a gradient written in
 * place would overwrite logits that the gradient pass still reads) and hold a block each. */
static tdt_status_t check_state_in_grads(const tdt_call_t *c, int any_rows) {
    const tdt_problem_t *p = &c->p;
    if (!any_rows) return TDT_STATUS_SUCCESS; /* no node: nothing to keep */
    if (!c->g.token_grads)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION,
                 "options->state_in_grads = %d keeps the per-node state in the token gradient's "
                 "rows, but this call writes no token gradient (grads or grads->token_grads is "
                 "NULL, or tdt_forward())", c->o.state_in_grads);
    if (c->g.token_grads == p->token_logits)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION,
                 "options->state_in_grads = %d cannot take a token gradient written in place over "
                 "the logits (grads->token_grads == problem->token_logits)", c->o.state_in_grads);
    const int64_t elem = tdt_dtype_size(p->dtype);
    const int64_t need = tdt_state_row_bytes(tdt_w_block(c->num_durations), elem);
    if (p->vocab_size * elem < need)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION,
                 "options->state_in_grads = %d needs token-gradient rows of at least %lld bytes "
                 "(vocab_size >= %lld for this dtype and %d durations), but vocab_size = %lld",
                 c->o.state_in_grads, (long long)need, (long long)((need + elem - 1) / elem),
                 c->num_durations, (long long)p->vocab_size);
    return TDT_STATUS_SUCCESS;
}

/* ---- data (CPU only: on the GPU these live in device memory) ------------------------------ */

static tdt_status_t check_blank(const tdt_problem_t *p, const tdt_options_t *o) {
    if (o->blank < 0 || o->blank >= p->vocab_size)
        TDT_FAIL(TDT_STATUS_INVALID_BLANK, "options->blank = %d is outside [0, %lld) (vocab_size)",
                 o->blank, (long long)p->vocab_size);
    return TDT_STATUS_SUCCESS;
}

/* Lengths and labels: arrays of no element may be NULL. */
static tdt_status_t check_data_pointers(const tdt_problem_t *p) {
    if (p->batch > 0 && !p->frame_lengths) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem->frame_lengths is NULL");
    if (p->batch > 0 && !p->label_lengths) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem->label_lengths is NULL");
    if (p->batch > 0 && p->max_labels > 0 && !p->labels)
        TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem->labels is NULL but max_labels = %lld", (long long)p->max_labels);
    return TDT_STATUS_SUCCESS;
}

static tdt_status_t check_data(const tdt_problem_t *p, int blank) {
    for (int64_t b = 0; b < p->batch; ++b) {
        int32_t T = p->frame_lengths[b], U = p->label_lengths[b];
        if (!tdt_length_ok(T, p->max_frames))
            TDT_FAIL(TDT_STATUS_INVALID_LENGTH, "frame_lengths[%lld] = %d is outside [0, %lld] (max_frames)",
                     (long long)b, T, (long long)p->max_frames);
        if (!tdt_length_ok(U, p->max_labels))
            TDT_FAIL(TDT_STATUS_INVALID_LENGTH, "label_lengths[%lld] = %d is outside [0, %lld] (max_labels)",
                     (long long)b, U, (long long)p->max_labels);
        const int32_t *y = p->max_labels > 0 ? p->labels + b * p->max_labels : NULL; /* NULL labels allowed when max_labels == 0 */
        for (int32_t i = 0; i < U; ++i) {
            if (!tdt_label_in_vocab(y[i], p->vocab_size))
                TDT_FAIL(TDT_STATUS_INVALID_LABEL, "labels[%lld][%d] = %d is outside [0, %lld) (vocab_size)",
                         (long long)b, i, y[i], (long long)p->vocab_size);
            if (y[i] == blank)
                TDT_FAIL(TDT_STATUS_INVALID_LABEL, "labels[%lld][%d] = %d equals blank %d",
                         (long long)b, i, y[i], blank);
        }
    }
    return TDT_STATUS_SUCCESS;
}

/* ---- packed indices (tdt_pack_indices, options.pack) ----------------------------------------- */

/* The arguments of a packing of `in` into `packed` (names: how errors call them): the index type,
 * columns and stride, 64-bit sizes and offsets, and the pointers a non-empty batch reads. */
static tdt_status_t check_pack(const tdt_problem_t *problem, const tdt_indices_t *in,
                               const int32_t *packed, const char *name, const char *packed_name) {
    if (in->type != TDT_INDEX_INT32 && in->type != TDT_INDEX_INT64)
        TDT_FAIL(TDT_STATUS_INVALID_DTYPE, "%s->type = %d is not a tdt_index_type_t", name, (int)in->type);
    if (in->columns < 0)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "%s->columns = %lld must be >= 0", name, (long long)in->columns);
    if (in->labels_stride < 0)
        TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "%s->labels_stride = %lld is negative", name,
                 (long long)in->labels_stride);
    const int64_t B = problem->batch, U = problem->max_labels;
    int64_t n;
    if (__builtin_mul_overflow(B, U + 2, &n) || n > INT64_MAX / 8)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "batch %lld x (max_labels %lld + 2) overflows 64-bit sizes",
                 (long long)B, (long long)U);
    const int64_t read = in->columns < U ? in->columns : U;
    int64_t reach;
    if (B > 1 && read > 0 && (__builtin_mul_overflow(in->labels_stride, B - 1, &reach) ||
                              reach > INT64_MAX / 8 - read))
        TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "%s->labels_stride = %lld overflows 64-bit offsets",
                 name, (long long)in->labels_stride);
    if (B > 0) {
        if (!in->frame_lengths) TDT_FAIL(TDT_STATUS_NULL_POINTER, "%s->frame_lengths is NULL", name);
        if (!in->label_lengths) TDT_FAIL(TDT_STATUS_NULL_POINTER, "%s->label_lengths is NULL", name);
        if (read > 0 && !in->labels)
            TDT_FAIL(TDT_STATUS_NULL_POINTER, "%s->labels is NULL but %lld columns are read", name,
                     (long long)read);
        if (!packed) TDT_FAIL(TDT_STATUS_NULL_POINTER, "%s is NULL", packed_name);
    }
    return TDT_STATUS_SUCCESS;
}

/* Packs in into packed on the host; returns the index of the first element the loss does not
 * accept (tdt_pack_one), or -1 when there is none. */
static int64_t cpu_pack(const tdt_problem_t *problem, int blank, const tdt_indices_t *in,
                        int32_t *packed) {
    const tdt_pack_shape_t shape = {problem->batch, problem->max_frames, problem->max_labels,
                                    problem->vocab_size, blank};
    const int64_t n = problem->batch * (problem->max_labels + 2);
    int64_t bad = -1;
    for (int64_t i = 0; i < n; ++i)
        if (!tdt_pack_one(in, &shape, i, packed + i) && bad < 0) bad = i;
    return bad;
}

/* options.pack's error for packed element i, the first the loss does not accept: its value as
 * the caller gave it, and why. */
static tdt_status_t pack_error(const tdt_problem_t *p, int blank, const tdt_indices_t *in, int64_t i) {
    const int64_t B = p->batch;
    if (i < 2 * B) {
        const int second = i >= B;
        const int64_t b = second ? i - B : i;
        const long long v = (long long)tdt_index_at(second ? in->label_lengths : in->frame_lengths, b, in->type);
        if (v < INT32_MIN || v > INT32_MAX)
            TDT_FAIL(TDT_STATUS_INVALID_LENGTH, "options->pack->%s[%lld] = %lld is outside int32",
                     second ? "label_lengths" : "frame_lengths", (long long)b, v);
        if (!second)
            TDT_FAIL(TDT_STATUS_INVALID_LENGTH, "options->pack->frame_lengths[%lld] = %lld is outside "
                     "[0, %lld] (max_frames)", (long long)b, v, (long long)p->max_frames);
        if (v > in->columns && v <= p->max_labels)
            TDT_FAIL(TDT_STATUS_INVALID_LENGTH, "options->pack->label_lengths[%lld] = %lld exceeds "
                     "options->pack->columns = %lld", (long long)b, v, (long long)in->columns);
        TDT_FAIL(TDT_STATUS_INVALID_LENGTH, "options->pack->label_lengths[%lld] = %lld is outside "
                 "[0, %lld] (max_labels)", (long long)b, v, (long long)p->max_labels);
    }
    const int64_t j = i - 2 * B, b = j / p->max_labels, k = j - b * p->max_labels;
    const long long y = (long long)tdt_index_at(in->labels, b * in->labels_stride + k, in->type);
    if (y < INT32_MIN || y > INT32_MAX)
        TDT_FAIL(TDT_STATUS_INVALID_LABEL, "options->pack->labels[%lld][%lld] = %lld is outside int32",
                 (long long)b, (long long)k, y);
    if (y == blank)
        TDT_FAIL(TDT_STATUS_INVALID_LABEL, "options->pack->labels[%lld][%lld] = %lld equals blank %d",
                 (long long)b, (long long)k, y, blank);
    TDT_FAIL(TDT_STATUS_INVALID_LABEL, "options->pack->labels[%lld][%lld] = %lld is outside [0, %lld) "
             "(vocab_size)", (long long)b, (long long)k, y, (long long)p->vocab_size);
}

/* options.pack of a forward call: its arguments, and the problem's arrays as one packed array. */
static tdt_status_t check_pack_option(const tdt_problem_t *p, const tdt_options_t *o) {
    TDT_CHECK(check_pack(p, o->pack, p->frame_lengths, "options->pack", "problem->frame_lengths"));
    if (p->batch == 0) return TDT_STATUS_SUCCESS;
    if (p->label_lengths != p->frame_lengths + p->batch)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->pack is set but problem->label_lengths %p is not "
                 "problem->frame_lengths %p + batch %lld (one packed array)", (const void *)p->label_lengths,
                 (const void *)p->frame_lengths, (long long)p->batch);
    if (p->max_labels > 0 && p->labels != p->frame_lengths + 2 * p->batch)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->pack is set but problem->labels %p is not "
                 "problem->frame_lengths %p + 2 * batch %lld (one packed array)", (const void *)p->labels,
                 (const void *)p->frame_lengths, (long long)p->batch);
    return TDT_STATUS_SUCCESS;
}

/* ---- the call --------------------------------------------------------------------------------- */

/* A forward's outputs: costs, and options.reduced_cost with a reduction, outside costs. */
static tdt_status_t check_costs(const tdt_problem_t *p, const tdt_options_t *o, const void *costs) {
    if (p->batch > 0 && !costs) TDT_FAIL(TDT_STATUS_NULL_POINTER, "costs is NULL");
    if (o->reduction != TDT_REDUCTION_NONE) {
        if (!o->reduced_cost)
            TDT_FAIL(TDT_STATUS_NULL_POINTER, "options->reduced_cost is NULL but options->reduction = %d",
                     (int)o->reduction);
        const char *r = (const char *)o->reduced_cost, *k = (const char *)costs;
        const size_t acc = tdt_acc_is_double(p->dtype) ? 8 : 4;
        if (k && r + acc > k && r < k + (size_t)p->batch * acc)
            TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->reduced_cost %p lies inside costs (%p, %lld values)",
                     o->reduced_cost, costs, (long long)p->batch);
    }
    return TDT_STATUS_SUCCESS;
}

/* The dtype is one of tdt_dtype_t. */
static tdt_status_t check_dtype(tdt_dtype_t dtype, const char *name) {
    if (dtype != TDT_DTYPE_FLOAT32 && dtype != TDT_DTYPE_FLOAT64 && dtype != TDT_DTYPE_FLOAT16 &&
        dtype != TDT_DTYPE_BFLOAT16)
        TDT_FAIL(TDT_STATUS_INVALID_DTYPE, "%s->dtype = %d is not a tdt_dtype_t", name, (int)dtype);
    return TDT_STATUS_SUCCESS;
}

/* Validates everything a call reads, fills *c, and returns SUCCESS or the first failure.
 * scaling: tdt_scale_gradients(), which reads grad_costs (its scale) and no workspace. */
static tdt_status_t prepare(tdt_call_t *c, const tdt_problem_t *problem,
                            const tdt_options_t *options, void *costs, const void *grad_costs,
                            const tdt_gradients_t *grads, void *workspace, size_t workspace_bytes,
                            int do_forward, int do_backward, int scaling) {
    memset(c, 0, sizeof *c);
    if (!problem) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem is NULL");
    if (!options) TDT_FAIL(TDT_STATUS_NULL_POINTER, "options is NULL");
    c->p = *problem;
    c->o = *options;
    const tdt_problem_t *p = &c->p;
    const tdt_options_t *o = &c->o;
    TDT_CHECK(check_options(o));
    TDT_CHECK(check_sizes(p));
    TDT_CHECK(check_dtype(p->dtype, "problem"));
    TDT_CHECK(check_blank(p, o));
    c->tdt_mode = p->duration_logits != NULL;
    if (c->tdt_mode) {
        TDT_CHECK(check_durations(o));
        c->num_durations = o->num_durations;
        tdt_arcs_tdt(&c->arcs, o->durations, o->num_durations);
    } else {
        tdt_arcs_rnnt(&c->arcs);
    }

    /* pointers: tensors of no element may be NULL */
    int any_rows = p->batch > 0 && p->max_frames > 0;
    if (!p->token_logits && any_rows) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem->token_logits is NULL");
    TDT_CHECK(check_data_pointers(p));
    if (do_forward) TDT_CHECK(check_costs(p, o, costs));
    if (!workspace && !scaling) TDT_FAIL(TDT_STATUS_NULL_POINTER, "workspace is NULL");
    if (scaling && p->batch > 0 && !grad_costs && grads && (grads->token_grads || grads->duration_grads))
        TDT_FAIL(TDT_STATUS_NULL_POINTER, "scale is NULL");

    /* strides */
    TDT_CHECK(check_strides("problem->token", p->token_strides, p, p->vocab_size, 0));
    if (c->tdt_mode)
        TDT_CHECK(check_strides("problem->duration", p->duration_strides, p, c->num_durations, 0));
    if (grads) c->g = *grads;
    if (!c->tdt_mode) c->g.duration_grads = NULL; /* RNN-T has no duration gradient */
    if (c->g.token_grads) {
        TDT_CHECK(check_strides("grads->token", c->g.token_strides, p, p->vocab_size, 1));
        TDT_CHECK(check_in_place("grads->token_grads", c->g.token_grads, c->g.token_strides,
                                 p->token_logits, p->token_strides, p));
    }
    if (c->g.duration_grads) {
        TDT_CHECK(check_strides("grads->duration", c->g.duration_strides, p, c->num_durations, 1));
        TDT_CHECK(check_in_place("grads->duration_grads", c->g.duration_grads, c->g.duration_strides,
                                 p->duration_logits, p->duration_strides, p));
    }

    if (scaling) c->o.state_in_grads = 0; /* no workspace, no blocks */
    if (c->o.state_in_grads) TDT_CHECK(check_state_in_grads(c, any_rows));

    /* workspace (none for tdt_scale_gradients) */
    /* RNN-T ignores num_durations: its layout is that of 0 durations, as in the size query */
    if (!scaling && !tdt_workspace_layout(p->batch, p->max_frames, p->max_labels, c->num_durations,
                                          c->o.state_in_grads != 0, &c->layout))
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "the workspace for batch %lld x max_frames %lld x (max_labels %lld + 1) "
                 "overflows 64-bit sizes", (long long)p->batch, (long long)p->max_frames, (long long)p->max_labels);
    if (!scaling && workspace_bytes < c->layout.total + TDT_WS_ALIGN)
        TDT_FAIL(TDT_STATUS_WORKSPACE_TOO_SMALL, "workspace_bytes = %zu < %zu (tdt_get_workspace_size)",
                 workspace_bytes, c->layout.total + TDT_WS_ALIGN);

    if (!do_forward) {
        c->o.pack = NULL; /* the backward and the scaling read what the forward packed */
        c->o.pack_valid = NULL;
    } else if (o->pack) {
        TDT_CHECK(check_pack_option(p, o));
        if (o->location == TDT_LOCATION_CPU) { /* the packing is the data check */
            const int64_t bad = cpu_pack(p, o->blank, o->pack, (int32_t *)p->frame_lengths);
            if (o->pack_valid) *o->pack_valid = bad < 0;
            if (bad >= 0) return pack_error(p, o->blank, o->pack, bad);
        }
    }
    if (o->location == TDT_LOCATION_CPU && p->batch > 0 && !o->pack) TDT_CHECK(check_data(p, o->blank));

    c->workspace = workspace;
    c->costs = costs;
    c->grad_costs = grad_costs;
    c->do_forward = do_forward;
    c->do_backward = do_backward && (c->g.token_grads || c->g.duration_grads);
    return TDT_STATUS_SUCCESS;
}

/* keep: a later tdt_backward() may use the forward's workspace (tdt_forward); written: the
 * backward only where the backend runs it with the forward (tdt_forward_ahead), which says so */
static tdt_status_t run(const tdt_problem_t *problem, const tdt_options_t *options, void *costs,
                        const void *grad_costs, const tdt_gradients_t *grads, void *workspace,
                        size_t workspace_bytes, int do_forward, int do_backward, int keep,
                        int *written) {
    tdt_call_t c;
    tdt_status_t s = prepare(&c, problem, options, costs, grad_costs, grads, workspace,
                             workspace_bytes, do_forward, do_backward, 0);
    if (s != TDT_STATUS_SUCCESS) return s;
    c.costs_only = c.do_forward && !c.do_backward && !keep;
    c.ahead = written;
    tdt_clear_error();
    if (!c.do_forward && !c.do_backward) return TDT_STATUS_SUCCESS;
    return c.o.location == TDT_LOCATION_GPU ? tdt_gpu_run(&c) : tdt_cpu_run(&c);
}

/* ---- the public entry points -------------------------------------------------------------- */

TDT_API tdt_status_t tdt_get_workspace_size(const tdt_problem_t *problem,
                                            const tdt_options_t *options, size_t *workspace_bytes) {
    tdt_ws_layout_t layout;
    if (!problem) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem is NULL");
    if (!options) TDT_FAIL(TDT_STATUS_NULL_POINTER, "options is NULL");
    if (!workspace_bytes) TDT_FAIL(TDT_STATUS_NULL_POINTER, "workspace_bytes is NULL");
    TDT_CHECK(check_sizes(problem));
    /* RNN-T (no duration logits) ignores num_durations, here as in the call itself */
    int num_durations = problem->duration_logits ? options->num_durations : 0;
    if (num_durations < 0 || num_durations > TDT_MAX_DURATIONS)
        TDT_FAIL(TDT_STATUS_TOO_MANY_DURATIONS, "options->num_durations = %d must be in [0, %d]",
                 num_durations, TDT_MAX_DURATIONS);
    if (!tdt_workspace_layout(problem->batch, problem->max_frames, problem->max_labels,
                              num_durations, options->state_in_grads != 0, &layout))
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "the workspace size overflows 64-bit sizes");
    *workspace_bytes = layout.total + TDT_WS_ALIGN;
    tdt_clear_error();
    return TDT_STATUS_SUCCESS;
}

TDT_API tdt_status_t compute_tdt_loss(const tdt_problem_t *problem, const tdt_options_t *options,
                                      void *costs, const tdt_gradients_t *grads, void *workspace,
                                      size_t workspace_bytes) {
    return run(problem, options, costs, NULL, grads, workspace, workspace_bytes, 1, 1, 0, NULL);
}

TDT_API tdt_status_t tdt_forward(const tdt_problem_t *problem, const tdt_options_t *options,
                                 void *costs, void *workspace, size_t workspace_bytes) {
    return run(problem, options, costs, NULL, NULL, workspace, workspace_bytes, 1, 0, 1, NULL);
}

TDT_API tdt_status_t tdt_backward(const tdt_problem_t *problem, const tdt_options_t *options,
                                  const void *grad_costs, const tdt_gradients_t *grads,
                                  void *workspace, size_t workspace_bytes) {
    return run(problem, options, NULL, grad_costs, grads, workspace, workspace_bytes, 0, 1, 0, NULL);
}

TDT_API tdt_status_t tdt_forward_ahead(const tdt_problem_t *problem, const tdt_options_t *options,
                                       void *costs, const void *grad_costs,
                                       const tdt_gradients_t *grads, void *workspace,
                                       size_t workspace_bytes, int *grads_written) {
    if (!grads_written) TDT_FAIL(TDT_STATUS_NULL_POINTER, "grads_written is NULL");
    *grads_written = 0;
    return run(problem, options, costs, grad_costs, grads, workspace, workspace_bytes, 1, 1, 1,
               grads_written);
}

TDT_API tdt_status_t tdt_scale_gradients(const tdt_problem_t *problem, const tdt_options_t *options,
                                         const void *scale, const tdt_gradients_t *grads) {
    tdt_call_t c;
    TDT_CHECK(prepare(&c, problem, options, NULL, scale, grads, NULL, 0, 0, 1, 1));
    tdt_clear_error();
    if (!c.do_backward || c.p.batch == 0) return TDT_STATUS_SUCCESS;
    return c.o.location == TDT_LOCATION_GPU ? tdt_gpu_scale(&c) : tdt_cpu_scale(&c);
}

TDT_API tdt_status_t tdt_check_data(const tdt_problem_t *problem, const tdt_options_t *options) {
    if (!problem) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem is NULL");
    if (!options) TDT_FAIL(TDT_STATUS_NULL_POINTER, "options is NULL");
    TDT_CHECK(check_sizes(problem));
    TDT_CHECK(check_blank(problem, options));
    TDT_CHECK(check_data_pointers(problem));
    TDT_CHECK(check_data(problem, options->blank));
    tdt_clear_error();
    return TDT_STATUS_SUCCESS;
}

TDT_API tdt_status_t tdt_pack_indices(const tdt_problem_t *problem, const tdt_options_t *options,
                                      const tdt_indices_t *indices, int32_t *packed, int32_t *valid) {
    if (!problem) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem is NULL");
    if (!options) TDT_FAIL(TDT_STATUS_NULL_POINTER, "options is NULL");
    if (!indices) TDT_FAIL(TDT_STATUS_NULL_POINTER, "indices is NULL");
    TDT_CHECK(check_options(options));
    TDT_CHECK(check_sizes(problem));
    TDT_CHECK(check_blank(problem, options));
    TDT_CHECK(check_pack(problem, indices, packed, "indices", "packed"));
    if (options->location == TDT_LOCATION_GPU) {
        tdt_status_t s = tdt_gpu_pack(problem, options, indices, packed, valid);
        if (s == TDT_STATUS_SUCCESS) tdt_clear_error();
        return s;
    }
    const int64_t bad = cpu_pack(problem, options->blank, indices, packed);
    if (valid) *valid = bad < 0;
    tdt_clear_error();
    return TDT_STATUS_SUCCESS;
}

TDT_API int tdt_backend_built(tdt_location_t location) {
    if (location == TDT_LOCATION_CPU) return 1;
    if (location == TDT_LOCATION_GPU) return tdt_gpu_built();
    return 0;
}

TDT_API tdt_status_t tdt_gpu_device_count(int *count) {
    if (!count) TDT_FAIL(TDT_STATUS_NULL_POINTER, "count is NULL");
    tdt_status_t s = tdt_gpu_count(count);
    if (s == TDT_STATUS_SUCCESS) tdt_clear_error();
    return s;
}

/* ---- the fused joint + loss (tdt_joint_*) ------------------------------------------------------
 * The same checks in the same order as a loss call (structs, options, sizes, dtype, blank,
 * durations, pointers, strides, workspace, backend, then on the CPU the data), with the joint's
 * own between them: hidden and num_outputs with the sizes, activation and dropout after the
 * durations, the joint's tensors' pointers and strides, and no overlap of a gradient with
 * another tensor. The lattice part is an ordinary call (tdt_joint_call_t.c) without logits. */

/* The lattice problem of a joint problem: its sizes, dtype, labels and lengths, no logits. */
static tdt_problem_t joint_lattice_problem(const tdt_joint_problem_t *jp) {
    tdt_problem_t p;
    memset(&p, 0, sizeof p);
    p.batch = jp->batch;
    p.max_frames = jp->max_frames;
    p.max_labels = jp->max_labels;
    p.vocab_size = jp->vocab_size;
    p.dtype = jp->dtype;
    p.labels = jp->labels;
    p.frame_lengths = jp->frame_lengths;
    p.label_lengths = jp->label_lengths;
    return p;
}

/* hidden and num_outputs (after the lattice's sizes); *num_durations: D of a TDT problem
 * (num_outputs != vocab_size, D = options->num_durations checked with check_durations, or in
 * [1, TDT_MAX_DURATIONS] alone with check_dur 0), 0 for RNN-T. */
static tdt_status_t check_joint_sizes(const tdt_joint_problem_t *jp, const tdt_options_t *o,
                                      int check_dur, int *num_durations) {
    const tdt_problem_t lp = joint_lattice_problem(jp);
    TDT_CHECK(check_sizes(&lp));
    if (jp->hidden < 1)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "problem->hidden = %lld must be >= 1", (long long)jp->hidden);
    *num_durations = 0;
    if (jp->num_outputs == jp->vocab_size) return TDT_STATUS_SUCCESS;
    if (jp->num_outputs < jp->vocab_size)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "problem->num_outputs = %lld must be vocab_size %lld (RNN-T) or "
                 "vocab_size + options->num_durations (TDT)", (long long)jp->num_outputs,
                 (long long)jp->vocab_size);
    if (check_dur) {
        TDT_CHECK(check_durations(o));
    } else if (o->num_durations < 1 || o->num_durations > TDT_MAX_DURATIONS) {
        TDT_FAIL(TDT_STATUS_TOO_MANY_DURATIONS, "options->num_durations = %d must be in [1, %d] when "
                 "problem->num_outputs = %lld exceeds vocab_size = %lld (TDT)", o->num_durations,
                 TDT_MAX_DURATIONS, (long long)jp->num_outputs, (long long)jp->vocab_size);
    }
    if (jp->num_outputs != jp->vocab_size + o->num_durations)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "problem->num_outputs = %lld must be vocab_size %lld (RNN-T) or "
                 "vocab_size + options->num_durations = %lld (TDT)", (long long)jp->num_outputs,
                 (long long)jp->vocab_size, (long long)(jp->vocab_size + o->num_durations));
    *num_durations = o->num_durations;
    return TDT_STATUS_SUCCESS;
}

/* Bytes of the tiles' scratch for this problem on options->location. */
static size_t joint_scratch_bytes(const tdt_joint_problem_t *jp, const tdt_options_t *o, int D) {
    return o->location == TDT_LOCATION_GPU ? tdt_gpu_joint_scratch_bytes(jp, o, D)
                                           : tdt_cpu_joint_scratch_bytes(jp, o, D);
}

/* A tensor's bytes [lo, hi) for the overlap check (lo == hi: none). */
typedef struct joint_span {
    const char *name;
    const char *lo, *hi;
} joint_span_t;

static joint_span_t joint_span(const char *name, const void *ptr, int64_t elems, tdt_dtype_t dtype) {
    joint_span_t s;
    s.name = name;
    s.lo = (const char *)ptr;
    s.hi = ptr && elems > 0 ? s.lo + elems * tdt_dtype_size(dtype) : s.lo;
    return s;
}

static int joint_spans_meet(const joint_span_t *a, const joint_span_t *b) {
    return a->lo != a->hi && b->lo != b->hi && a->lo < b->hi && b->lo < a->hi;
}

static tdt_status_t prepare_joint(tdt_joint_call_t *jc, const tdt_joint_problem_t *problem,
                                  const tdt_options_t *options, void *costs, const void *grad_costs,
                                  const tdt_joint_gradients_t *grads, void *workspace,
                                  size_t workspace_bytes, int do_forward, int do_backward) {
    memset(jc, 0, sizeof *jc);
    if (!problem) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem is NULL");
    if (!options) TDT_FAIL(TDT_STATUS_NULL_POINTER, "options is NULL");
    jc->jp = *problem;
    tdt_call_t *c = &jc->c;
    c->o = *options;
    c->p = joint_lattice_problem(problem);
    const tdt_joint_problem_t *jp = &jc->jp;
    const tdt_problem_t *p = &c->p;
    const tdt_options_t *o = &c->o;
    TDT_CHECK(check_options(o));
    if (o->input_kind != TDT_INPUT_LOGITS)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->input_kind = %d: the joint computes logits, "
                 "only TDT_INPUT_LOGITS is taken", (int)o->input_kind);
    if (o->pack)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->pack is set: the joint calls take int32 labels "
                 "and lengths (pack them first with tdt_pack_indices)");
    if (o->state_in_grads)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->state_in_grads = %d: the joint calls have no "
                 "token-gradient rows to keep the state in", o->state_in_grads);
    int D = 0;
    TDT_CHECK(check_joint_sizes(jp, o, 1, &D));
    TDT_CHECK(check_dtype(jp->dtype, "problem"));
    TDT_CHECK(check_blank(p, o));
    c->tdt_mode = D > 0;
    c->num_durations = D;
    if (c->tdt_mode)
        tdt_arcs_tdt(&c->arcs, o->durations, D);
    else
        tdt_arcs_rnnt(&c->arcs);
    if (jp->activation != TDT_ACTIVATION_RELU && jp->activation != TDT_ACTIVATION_TANH &&
        jp->activation != TDT_ACTIVATION_SIGMOID && jp->activation != TDT_ACTIVATION_IDENTITY)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "problem->activation = %d is not a tdt_activation_t",
                 (int)jp->activation);
    if (!(jp->dropout >= 0.0 && jp->dropout < 1.0)) /* NaN too */
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "problem->dropout = %g must be in [0, 1)", jp->dropout);

    /* pointers: tensors of no element may be NULL */
    const int any_nodes = p->batch > 0 && p->max_frames > 0;
    if (any_nodes && !jp->enc) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem->enc is NULL");
    if (any_nodes && !jp->pred) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem->pred is NULL");
    if (any_nodes && !jp->weight) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem->weight is NULL");
    TDT_CHECK(check_data_pointers(p));
    if (do_forward) TDT_CHECK(check_costs(p, o, costs));
    if (!workspace) TDT_FAIL(TDT_STATUS_NULL_POINTER, "workspace is NULL");

    /* strides, and the extents of every tensor for the overlap check */
    const int64_t H = jp->hidden, O = jp->num_outputs;
    const int64_t enc_ext[2] = {p->batch, p->max_frames}, pred_ext[2] = {p->batch, p->max_labels + 1};
    const int64_t w_ext[1] = {O};
    int64_t span = 0;
    joint_span_t in[4], out[4];
    int nout = 0;
    TDT_CHECK(check_strided("problem->enc", jp->enc_strides, enc_ext, 2, H, jp->dtype, 0, &span));
    in[0] = joint_span("problem->enc", any_nodes ? jp->enc : NULL, span, jp->dtype);
    TDT_CHECK(check_strided("problem->pred", jp->pred_strides, pred_ext, 2, H, jp->dtype, 0, &span));
    in[1] = joint_span("problem->pred", any_nodes ? jp->pred : NULL, span, jp->dtype);
    if (jp->weight_stride < H)
        TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "problem->weight_stride = %lld must be >= hidden = %lld",
                 (long long)jp->weight_stride, (long long)H);
    TDT_CHECK(check_strided("problem->weight", &jp->weight_stride, w_ext, 1, H, jp->dtype, 0, &span));
    in[2] = joint_span("problem->weight", any_nodes ? jp->weight : NULL, span, jp->dtype);
    in[3] = joint_span("problem->bias", any_nodes ? jp->bias : NULL, O, jp->dtype);
    if (grads) jc->jg = *grads;
    tdt_joint_gradients_t *g = &jc->jg;
    if (!do_backward) memset(g, 0, sizeof *g);
    if (g->enc_grad) {
        TDT_CHECK(check_strided("grads->enc", g->enc_strides, enc_ext, 2, H, jp->dtype, 1, &span));
        out[nout++] = joint_span("grads->enc_grad", g->enc_grad, span, jp->dtype);
    }
    if (g->pred_grad) {
        TDT_CHECK(check_strided("grads->pred", g->pred_strides, pred_ext, 2, H, jp->dtype, 1, &span));
        out[nout++] = joint_span("grads->pred_grad", g->pred_grad, span, jp->dtype);
    }
    if (g->weight_grad) {
        if (g->weight_stride < H)
            TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "grads->weight_stride = %lld must be >= hidden = %lld",
                     (long long)g->weight_stride, (long long)H);
        TDT_CHECK(check_strided("grads->weight", &g->weight_stride, w_ext, 1, H, jp->dtype, 1, &span));
        out[nout++] = joint_span("grads->weight_grad", g->weight_grad, span, jp->dtype);
    }
    if (g->bias_grad) out[nout++] = joint_span("grads->bias_grad", g->bias_grad, O, jp->dtype);
    if (!(g->skip_below >= 0.0) || isinf(g->skip_below))
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "grads->skip_below = %g must be finite and >= 0 (0: exact)",
                 g->skip_below);
    for (int i = 0; i < nout; ++i) {
        for (int j = 0; j < 4; ++j)
            if (joint_spans_meet(&out[i], &in[j]))
                TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "%s overlaps %s", out[i].name, in[j].name);
        for (int j = 0; j < i; ++j)
            if (joint_spans_meet(&out[i], &out[j]))
                TDT_FAIL(TDT_STATUS_INVALID_STRIDES, "%s overlaps %s", out[i].name, out[j].name);
    }

    /* workspace: the lattice's, then the tiles' scratch */
    if (!tdt_workspace_layout(p->batch, p->max_frames, p->max_labels, D, 0, &c->layout))
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "the workspace for batch %lld x max_frames %lld x (max_labels %lld + 1) "
                 "overflows 64-bit sizes", (long long)p->batch, (long long)p->max_frames, (long long)p->max_labels);
    jc->scratch_offset = c->layout.total;
    jc->scratch_bytes = joint_scratch_bytes(jp, o, D);
    const size_t need = jc->scratch_offset + jc->scratch_bytes + TDT_WS_ALIGN;
    if (jc->scratch_bytes > SIZE_MAX / 2 || need < jc->scratch_offset)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "the joint's workspace overflows 64-bit sizes");
    if (workspace_bytes < need)
        TDT_FAIL(TDT_STATUS_WORKSPACE_TOO_SMALL, "workspace_bytes = %zu < %zu (tdt_joint_get_workspace_size)",
                 workspace_bytes, need);

    if (o->location == TDT_LOCATION_CPU && p->batch > 0) TDT_CHECK(check_data(p, o->blank));

    c->workspace = workspace;
    c->costs = costs;
    c->grad_costs = grad_costs;
    c->do_forward = do_forward;
    c->do_backward = do_backward && (g->enc_grad || g->pred_grad || g->weight_grad || g->bias_grad);
    return TDT_STATUS_SUCCESS;
}

static tdt_status_t run_joint(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                              void *costs, const void *grad_costs, const tdt_joint_gradients_t *grads,
                              void *workspace, size_t workspace_bytes, int do_forward,
                              int do_backward, int keep) {
    tdt_joint_call_t jc;
    TDT_CHECK(prepare_joint(&jc, problem, options, costs, grad_costs, grads, workspace,
                            workspace_bytes, do_forward, do_backward));
    jc.c.costs_only = jc.c.do_forward && !jc.c.do_backward && !keep;
    tdt_clear_error();
    if (!jc.c.do_forward && !jc.c.do_backward) return TDT_STATUS_SUCCESS;
    return jc.c.o.location == TDT_LOCATION_GPU ? tdt_gpu_joint_run(&jc) : tdt_cpu_joint_run(&jc);
}

TDT_API tdt_status_t tdt_joint_get_workspace_size(const tdt_joint_problem_t *problem,
                                                  const tdt_options_t *options,
                                                  size_t *workspace_bytes) {
    tdt_ws_layout_t layout;
    int D = 0;
    if (!problem) TDT_FAIL(TDT_STATUS_NULL_POINTER, "problem is NULL");
    if (!options) TDT_FAIL(TDT_STATUS_NULL_POINTER, "options is NULL");
    if (!workspace_bytes) TDT_FAIL(TDT_STATUS_NULL_POINTER, "workspace_bytes is NULL");
    if (options->location != TDT_LOCATION_CPU && options->location != TDT_LOCATION_GPU)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->location = %d is not a tdt_location_t",
                 (int)options->location);
    if (options->num_threads < 0)
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "options->num_threads = %d must be >= 0 (0 = default)",
                 options->num_threads);
    TDT_CHECK(check_joint_sizes(problem, options, 0, &D));
    TDT_CHECK(check_dtype(problem->dtype, "problem"));
    if (!tdt_workspace_layout(problem->batch, problem->max_frames, problem->max_labels, D, 0, &layout))
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "the workspace size overflows 64-bit sizes");
    const size_t scratch = joint_scratch_bytes(problem, options, D);
    if (scratch > SIZE_MAX / 2 || layout.total + scratch + TDT_WS_ALIGN < layout.total)
        TDT_FAIL(TDT_STATUS_INVALID_SIZE, "the joint's workspace overflows 64-bit sizes");
    *workspace_bytes = layout.total + scratch + TDT_WS_ALIGN;
    tdt_clear_error();
    return TDT_STATUS_SUCCESS;
}

TDT_API tdt_status_t tdt_joint_loss(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                    void *costs, const tdt_joint_gradients_t *grads,
                                    void *workspace, size_t workspace_bytes) {
    return run_joint(problem, options, costs, NULL, grads, workspace, workspace_bytes, 1, 1, 0);
}

TDT_API tdt_status_t tdt_joint_forward(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                       void *costs, void *workspace, size_t workspace_bytes) {
    return run_joint(problem, options, costs, NULL, NULL, workspace, workspace_bytes, 1, 0, 1);
}

TDT_API tdt_status_t tdt_joint_backward(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                        const void *grad_costs, const tdt_joint_gradients_t *grads,
                                        void *workspace, size_t workspace_bytes) {
    return run_joint(problem, options, NULL, grad_costs, grads, workspace, workspace_bytes, 0, 1, 0);
}

TDT_API tdt_status_t tdt_joint_dropout_mask(double dropout, uint64_t seed, uint64_t first,
                                            int64_t count, uint8_t *keep) {
    if (!(dropout >= 0.0 && dropout < 1.0))
        TDT_FAIL(TDT_STATUS_INVALID_OPTION, "dropout = %g must be in [0, 1)", dropout);
    if (count < 0) TDT_FAIL(TDT_STATUS_INVALID_SIZE, "count = %lld must be >= 0", (long long)count);
    if (count > 0 && !keep) TDT_FAIL(TDT_STATUS_NULL_POINTER, "keep is NULL");
    const uint32_t thr = tdt_dropout_threshold(dropout);
    for (int64_t j = 0; j < count; ++j) keep[j] = (uint8_t)tdt_dropout_keep(seed, first + (uint64_t)j, thr);
    tdt_clear_error();
    return TDT_STATUS_SUCCESS;
}
