/*
 * tdt.h - warp-tdt: the TDT (Token-and-Duration Transducer) and RNN-T losses, on the CPU
 * (OpenMP) and on NVIDIA GPUs (CUDA), behind one C interface.
 *
 * This is the only public header. It is C (C99 and later, and C++), with every name prefixed
 * tdt_ / TDT_ except the warp-family entry point compute_tdt_loss().
 *
 * The loss, in one paragraph (docs/math.md has the derivation): for sample b with T frames and
 * U labels y_1..y_U, the lattice has nodes (t, u), 0 <= t < T, 0 <= u <= U. From node (t, u) and
 * for every duration d_k, a label arc (u < U) emits y_{u+1} and goes to (t + d_k, u + 1); a blank
 * arc (d_k > 0) goes to (t + d_k, u), or ends the utterance when u == U and t + d_k == T exactly.
 * An arc's log-weight is log_softmax(token logits)[token] - sigma + log_softmax(duration
 * logits)[k]. The cost is -log of the sum over all complete paths. Without duration logits the
 * plain RNN-T lattice is used instead: label arcs (t, u) -> (t, u + 1), blank arcs
 * (t, u) -> (t + 1, u), and the terminal blank from (T - 1, U).
 *
 * Dimension names, used throughout: B batch, T frames (padded: max_frames), U labels (padded:
 * max_labels; the lattice has U + 1 rows), V vocabulary including blank, D = num_durations.
 *
 * Memory spaces: every pointer argument lives in the memory of the compute location chosen in
 * tdt_options_t.location (host memory for TDT_LOCATION_CPU, device memory of one GPU for
 * TDT_LOCATION_GPU), except tdt_options_t.durations, which is always a host array, and the
 * structs themselves, which are read on the host during the call and may be freed on return.
 *
 * The library never allocates, never prints, never exits, and never changes global OpenMP or
 * CUDA state (thread counts go through OpenMP's num_threads clause; the GPU path restores the
 * caller's current device before returning).
 */
#ifndef TDT_H
#define TDT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the exported functions (the library is built with hidden visibility otherwise). */
#if defined(_WIN32)
#define TDT_API
#elif defined(__GNUC__) || defined(__clang__)
#define TDT_API __attribute__((visibility("default")))
#else
#define TDT_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions. The macros give the header this program was compiled with; tdt_version() gives the
 * library that was loaded. Compare the two to catch a stale shared library.
 * ------------------------------------------------------------------------------------------- */
#define TDT_VERSION_MAJOR 0
#define TDT_VERSION_MINOR 7
#define TDT_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, e.g. 100 for 0.1.0. */
#define TDT_VERSION_NUMBER (TDT_VERSION_MAJOR * 10000 + TDT_VERSION_MINOR * 100 + TDT_VERSION_PATCH)

/* Most durations a TDT model may use (tdt_options_t.num_durations). Parakeet-TDT uses 5. */
#define TDT_MAX_DURATIONS 32

/* ---------------------------------------------------------------------------------------------
 * Status codes. The numbers are pinned: they are never renumbered, new ones are only appended.
 * tdt_status_string() names each; tdt_last_error() says which argument and which value.
 * ------------------------------------------------------------------------------------------- */
typedef enum tdt_status {
    TDT_STATUS_SUCCESS = 0,
    TDT_STATUS_NULL_POINTER = 1,          /* a required pointer is NULL */
    TDT_STATUS_INVALID_SIZE = 2,          /* batch, max_frames, max_labels < 0, or vocab_size < 1 */
    TDT_STATUS_INVALID_BLANK = 3,         /* blank outside [0, vocab_size) */
    TDT_STATUS_INVALID_DURATIONS = 4,     /* a negative or a duplicated duration */
    TDT_STATUS_NO_POSITIVE_DURATION = 5,  /* no duration > 0: no blank arc can ever advance */
    TDT_STATUS_TOO_MANY_DURATIONS = 6,    /* num_durations < 1 or > TDT_MAX_DURATIONS (TDT mode) */
    TDT_STATUS_INVALID_STRIDES = 7,       /* negative, overflowing or overlapping strides */
    TDT_STATUS_INVALID_DTYPE = 8,         /* dtype not one of tdt_dtype_t */
    TDT_STATUS_WORKSPACE_TOO_SMALL = 9,   /* workspace_bytes < tdt_get_workspace_size() */
    TDT_STATUS_BACKEND_NOT_BUILT = 10,    /* GPU asked of a library built without CUDA */
    TDT_STATUS_INVALID_LENGTH = 11,       /* a frame length outside [0, max_frames] or a label
                                             length outside [0, max_labels] (CPU check) */
    TDT_STATUS_INVALID_LABEL = 12,        /* a label outside [0, vocab_size) or equal to blank
                                             (CPU check) */
    TDT_STATUS_INVALID_OPTION = 13,       /* location, input kind, GPU schedule, num_threads, or
                                             a non-finite or negative sigma / fastemit_lambda /
                                             clamp */
    TDT_STATUS_INVALID_WORKSPACE = 14,    /* tdt_backward() on a CPU workspace that does not hold
                                             tdt_forward() of the same problem */
    TDT_STATUS_CUDA_ERROR = 15,           /* a CUDA call or launch failed; tdt_last_error() has
                                             CUDA's own message */
    TDT_STATUS_UNKNOWN_ERROR = 99
} tdt_status_t;

/* Where the computation runs and where every data pointer lives. */
typedef enum tdt_location {
    TDT_LOCATION_CPU = 0, /* OpenMP backend; host pointers */
    TDT_LOCATION_GPU = 1  /* CUDA backend; device pointers of one GPU, the caller's stream */
} tdt_location_t;

/* Element type of the logits and of the gradients written. float16 and bfloat16 are read and
 * written as their 16-bit IEEE / bfloat16 bit patterns and accumulate in float32; float32
 * accumulates V-wide sums in float32; float64 is computed in float64 end to end (use it for
 * gradient checking). The lattice (alpha, beta, occupancies) is float64 for every dtype. */
typedef enum tdt_dtype {
    TDT_DTYPE_FLOAT32 = 0,
    TDT_DTYPE_FLOAT64 = 1,
    TDT_DTYPE_FLOAT16 = 2,
    TDT_DTYPE_BFLOAT16 = 3
} tdt_dtype_t;

/* What the token / duration inputs hold. */
typedef enum tdt_input_kind {
    TDT_INPUT_LOGITS = 0,   /* raw logits: log_softmax is fused into the loss (default) */
    TDT_INPUT_LOG_PROBS = 1 /* already log-probabilities: used as they are, and the gradient is
                               the derivative with respect to those log-probabilities */
} tdt_input_kind_t;

/* How the GPU backend orders its kernels (tdt_options_t.gpu_schedule). SERIAL, OVERLAP, SPLIT
 * and TRAIL give the same costs and gradients, bit for bit; they differ only in speed. FUSED gives
 * their costs bit for bit, and gradients that agree with theirs to float64 rounding (its
 * gradients take log p(y|x) from the middle of the lattice: docs/math.md, section 5), so at most
 * a last-bit difference in an element of the dtype. A schedule the device or the problem cannot
 * take runs as TDT_GPU_SCHEDULE_SERIAL (FUSED: as OVERLAP, in a call that does not compute the
 * gradients with the forward: other than compute_tdt_loss() with gradients and
 * tdt_forward_ahead()). tdt_forward() and tdt_backward() of one pair must be given the same
 * schedule (as they must be given the same options). Any schedule is deterministic: the same
 * call gives the same bits. (The same sample in another batch may not: the GPU splits a row's
 * log-sum-exp over lanes by V and the batch's padded node count.) */
typedef enum tdt_gpu_schedule {
    TDT_GPU_SCHEDULE_AUTO = 0,    /* the library picks one from the shapes and the device
                                     (docs/math.md, section 5) */
    TDT_GPU_SCHEDULE_SERIAL = 1,  /* forward: the per-node pass, then the alpha and beta sweeps;
                                     backward: the gradient pass */
    TDT_GPU_SCHEDULE_OVERLAP = 2, /* forward: the alpha and beta sweeps trail the per-node pass
                                     as it runs (sm_90); backward: the gradient pass */
    TDT_GPU_SCHEDULE_SPLIT = 3,   /* forward: the alpha sweep trails the per-node pass; backward:
                                     the beta sweep, the gradient pass trailing it (sm_90) */
    TDT_GPU_SCHEDULE_FUSED = 4,   /* compute_tdt_loss() with gradients, tdt_forward_ahead():
                                     OVERLAP's forward, with the gradient pass trailing both
                                     sweeps from the lattice's middle out, while they run
                                     (sm_90); AUTO takes it for such calls where it takes
                                     OVERLAP for long rows (sweeps split over thread-block
                                     clusters) or for rows of at least 0.4 MB of logits a
                                     diagonal (over the batch), and where it would take SPLIT
                                     for a lattice of fewer than 360 diagonals of at most 64
                                     rows (parakeet float32: 4 % faster on the H200) */
    TDT_GPU_SCHEDULE_TRAIL = 5    /* compute_tdt_loss() with gradients, tdt_forward_ahead():
                                     SERIAL's forward, with the gradient pass beside the sweeps
                                     (sm_90), taking each sample once both its sweeps have
                                     ended, samples of fewer diagonals first; at most 1024
                                     samples. AUTO takes it for such calls where it would take
                                     SERIAL with the sweeps' blocks leaving SMs free (ragged
                                     batches: 21 % faster on the H200; batches of equal lengths
                                     run 3-7 % slower by it than SERIAL). Other calls: SERIAL */
} tdt_gpu_schedule_t;

/* A reduction of the batch's costs that the forward calls also write (tdt_options_t.reduction),
 * so that a caller whose loss is one number needs no reduction of its own after the call. */
typedef enum tdt_reduction {
    TDT_REDUCTION_NONE = 0, /* nothing more is written (default) */
    TDT_REDUCTION_SUM = 1,  /* the sum of costs[0..B-1] */
    TDT_REDUCTION_MEAN = 2  /* that sum divided by B (NaN for B = 0) */
} tdt_reduction_t;

/* Labels and lengths in the caller's integer type (tdt_pack_indices(), tdt_options_t.pack):
 * the loss reads them as int32 (tdt_problem_t); frameworks hold int64. */
typedef enum tdt_index_type {
    TDT_INDEX_INT32 = 0,
    TDT_INDEX_INT64 = 1
} tdt_index_type_t;

typedef struct tdt_indices {
    tdt_index_type_t type;     /* of all three arrays */
    const void *labels;        /* (batch, columns): row b starts at element b * labels_stride.
                                  May be NULL when no label is read (columns or max_labels 0). */
    int64_t columns;           /* labels given a sample, >= 0. Rows are zero-padded from columns
                                  up to max_labels; beyond max_labels nothing is read. */
    int64_t labels_stride;     /* elements between rows, >= 0 */
    const void *frame_lengths; /* (batch), contiguous */
    const void *label_lengths; /* (batch), contiguous */
} tdt_indices_t;

/* ---------------------------------------------------------------------------------------------
 * Options. Zero-initialise (tdt_options_t o = {0};) and set what you need: every zero field
 * means its documented default. The struct grows at its end from release to release (fields
 * are never removed or reordered), and so may the other structs. A program compiled against an
 * older 0.x header runs against a newer libwarptdt.so.0: a function whose struct grew gets a
 * new symbol version, and the version older programs bind to reads only the fields their
 * header had (docs/abi.md). A program compiled against a newer header than the library it
 * meets does not start if it calls a function in a form the library lacks (the dynamic linker
 * names the missing WARPTDT_0.x version). A binding that loads functions by name (ctypes,
 * dlsym) gets their newest form, which reads the whole current struct: it appends zero bytes
 * to its copy of the struct, which a newer library reads as its new fields' defaults, and
 * checks tdt_version() before setting a field newer than the library.
 * ------------------------------------------------------------------------------------------- */
typedef struct tdt_options {
    tdt_location_t location; /* default TDT_LOCATION_CPU */
    int num_threads;         /* CPU: OpenMP threads for this call; 0 = omp_get_max_threads().
                                Must be >= 0. Ignored on the GPU. */
    void *stream;            /* GPU: the cudaStream_t to enqueue on; NULL = the legacy default
                                stream. Ignored on the CPU. */
    int blank;               /* index of the blank token in [0, vocab_size); default 0.
                                Parakeet-TDT uses vocab_size - 1. */
    const int *durations;    /* TDT: host array of num_durations distinct non-negative
                                durations, any order, at least one > 0; durations[k] belongs to
                                duration-logit k. Ignored (may be NULL) for RNN-T. */
    int num_durations;       /* D, 1..TDT_MAX_DURATIONS for TDT */
    double sigma;            /* logit undernormalisation: subtracted from every token log-prob
                                (never from durations). >= 0; default 0. */
    double fastemit_lambda;  /* FastEmit: label-arc occupancies scaled by (1 + lambda) in the
                                token gradient; cost reported as (1 + lambda) * (-log p). >= 0. */
    double clamp;            /* > 0: each token-gradient element clipped to [-clamp, clamp] before
                                the upstream scale; 0 = off. Duration gradients are not clamped. */
    tdt_input_kind_t input_kind; /* default TDT_INPUT_LOGITS */
    int grad_costs_scalar;   /* tdt_backward(): nonzero = grad_costs points to one value, the
                                upstream gradient of every sample (what a sum or batch-mean
                                reduction hands back); 0 = (B) values. Ignored elsewhere. */
    tdt_gpu_schedule_t gpu_schedule; /* GPU: default TDT_GPU_SCHEDULE_AUTO. Ignored on the CPU. */
    int normalize_costs;     /* nonzero: per-label costs, cost_b / U_b (what NeMo's and
                                transformers' "mean" reduction averages): costs[b] is the cost
                                divided by the sample's label length in the accumulate type
                                (inf or NaN when U_b = 0, as that division gives), and
                                tdt_backward() (and tdt_forward_ahead()'s gradients) take
                                grad_costs as the upstream of those, so a sample's upstream is
                                grad_costs[b] / U_b, divided the same way. The bits of dividing
                                the plain costs and upstreams in float32 (float64) yourself.
                                tdt_scale_gradients() ignores it: its scale is a plain factor. */
    int batch_mean;          /* nonzero: grad_costs is the upstream gradient of the batch mean of
                                the costs (the mean over all B samples), so tdt_backward() takes
                                a sample's upstream as grad_costs[b] / B, and tdt_forward_ahead()
                                without grad_costs as 1 / B, before normalize_costs divides it by
                                U_b. The division is a product with the reciprocal, 1 / B rounded
                                to the accumulate type, then x * (1 / B) rounded: within an ulp of
                                x / B, and the bits of torch's mean backward on CUDA. The costs
                                are not averaged: costs[] is as without it.
                                tdt_scale_gradients() ignores it. */
    tdt_reduction_t reduction; /* compute_tdt_loss(), tdt_forward(), tdt_forward_ahead(): with
                                  SUM or MEAN also write that reduction of costs[] to
                                  *reduced_cost (after normalize_costs' division, if set). The
                                  costs are summed in float64 in sample order, the sum divided by
                                  B in float64 for MEAN, and the result rounded once to the
                                  accumulate type: the same bits on both backends and, for
                                  float32 costs of one sign (those of logits are >= 0), within
                                  an ulp of the exact value, where a float32 sum (torch's) may
                                  drift further. inf and NaN costs carry into it.
                                  tdt_backward() and tdt_scale_gradients() ignore it, and it
                                  changes no gradient (batch_mean is the backward's part). */
    void *reduced_cost;      /* with a reduction: one value of the accumulate type, in the memory
                                costs lives in (device memory on the GPU, written in stream
                                order after the costs). Must not overlap costs. */
    const tdt_indices_t *pack; /* compute_tdt_loss(), tdt_forward(), tdt_forward_ahead(): non-NULL
                                  = the call first converts these labels and lengths (int32 or
                                  int64, any row stride) into the problem's int32 arrays, exactly
                                  as tdt_pack_indices(problem, options, pack, packed, pack_valid)
                                  with packed = problem->frame_lengths, and then reads them there.
                                  The problem's three arrays must then be that one writable
                                  packed array: label_lengths = frame_lengths + batch and, when
                                  max_labels > 0, labels = frame_lengths + 2 * batch
                                  (TDT_STATUS_INVALID_OPTION otherwise). The GPU runs the packing
                                  in the kernel that zeroes the workspace's counters, which the
                                  overlapped schedules launch anyway, so a framework caller saves
                                  a call and a launch. tdt_backward() and tdt_scale_gradients()
                                  ignore it: they read the packed arrays this call wrote. CPU:
                                  the packing precedes the data check, so a call that fails it
                                  (TDT_STATUS_INVALID_LENGTH or _LABEL, naming the first bad
                                  element of pack's arrays) has written the packed arrays and
                                  *pack_valid, and nothing else. GPU: bad values are handled as
                                  "GPU and bad data" below says, and *pack_valid reports them. */
    int32_t *pack_valid;       /* with pack: NULL, or where tdt_pack_indices()'s verdict goes (1:
                                  every value one the loss accepts, else 0), in the same memory
                                  (GPU: device memory, or pinned host memory, which holds it once
                                  the stream has passed the call's first kernel). An empty batch
                                  gets 1. */
    int state_in_grads;        /* nonzero: the per-node log-probabilities that the sweeps and the
                                  gradient pass read (3 + D doubles a node: 8 (3 + D) bytes)
                                  live at the head of each node's token-gradient row, which the
                                  call overwrites with the gradient afterwards, instead of in the
                                  workspace, which then holds 16 bytes a node (alpha and beta)
                                  instead of 8 (5 + D). tdt_get_workspace_size() gives the
                                  smaller size with it. At V = 257, D = 5 that is the gradient
                                  plus 1.5 % of the float32 logits, or 3 % of 16-bit ones, where
                                  the workspace held 7.6 % or 15 %. The costs and gradients are
                                  the same bits as without it.
                                  For compute_tdt_loss() and tdt_forward_ahead() with a token
                                  gradient, and for the tdt_backward() that follows a
                                  tdt_forward_ahead() that did not write the gradients (with the
                                  same grads, whose token rows must then be left untouched in
                                  between). Once the gradients are written the state is gone, so
                                  no tdt_backward() may follow that call. Refused
                                  (TDT_STATUS_INVALID_OPTION) without a token gradient (costs
                                  only, tdt_forward()), with the token gradient written in place,
                                  and where a token row holds fewer than 8 (3 + D) + 8 - size
                                  bytes (V * size: 68 bytes for float32 at D = 5, V >= 17; 70 for
                                  16-bit types, V >= 35; 64 for float64; RNN-T: D = 0). GPU: the
                                  split and fused schedules, which write a row while a sweep may
                                  still read its block, are not taken (asked for, they run as
                                  SERIAL and OVERLAP do). */
} tdt_options_t;

/* ---------------------------------------------------------------------------------------------
 * The problem: shapes, logits, labels and lengths. All strides are in elements, not bytes.
 *
 * Token logits of sample b, frame t, lattice row u, token v are at
 *     token_logits[b * token_strides[0] + t * token_strides[1] + u * token_strides[2] + v]
 * for v in [0, vocab_size): the last dimension is contiguous, the others are free (non-negative),
 * so the two slices of one joint tensor (B, max_frames, max_labels + 1, vocab_size + D) are
 * passed without a copy: token_logits = joint, duration_logits = joint + vocab_size, both with
 * the joint tensor's strides. Duration logits likewise, with k in [0, num_durations).
 * ------------------------------------------------------------------------------------------- */
typedef struct tdt_problem {
    int64_t batch;           /* B >= 0 */
    int64_t max_frames;      /* padded T >= 0 */
    int64_t max_labels;      /* padded U >= 0; the lattice has max_labels + 1 rows */
    int64_t vocab_size;      /* V >= 1, blank included */
    tdt_dtype_t dtype;       /* of both logits tensors and of both gradients */
    const void *token_logits;    /* (B, max_frames, max_labels + 1, V), strided as above */
    int64_t token_strides[3];
    const void *duration_logits; /* (B, max_frames, max_labels + 1, D), or NULL for plain RNN-T */
    int64_t duration_strides[3];
    const int32_t *labels;        /* (B, max_labels), row-major and contiguous: the labels of
                                     sample b are labels[b * max_labels + i], i < label_lengths[b];
                                     the padding beyond is never read. May be NULL when
                                     max_labels == 0. */
    const int32_t *frame_lengths; /* (B): T_b in [0, max_frames] */
    const int32_t *label_lengths; /* (B): U_b in [0, max_labels] */
} tdt_problem_t;

/* Where gradients go. Same layout rules as the logits: element (b, t, u, v) of the token
 * gradient is token_grads[b * token_strides[0] + t * token_strides[1] + u * token_strides[2] + v].
 * Every element of the (B, max_frames, max_labels + 1, V or D) extent is overwritten (nodes
 * outside a sample's lattice, and every node of an infeasible sample, get exactly 0); nothing
 * else is touched. The strides may differ from the logits' strides, so both gradients can be
 * written into one joint-shaped buffer. A NULL pointer skips that gradient.
 *
 * In place: a gradient pointer may equal its logits pointer, with identical strides; the
 * logits are then overwritten by their gradient. Any other overlap between a gradient and an
 * input, or between the two gradients, is undefined. */
typedef struct tdt_gradients {
    void *token_grads;       /* (B, max_frames, max_labels + 1, V) or NULL */
    int64_t token_strides[3];
    void *duration_grads;    /* (B, max_frames, max_labels + 1, D) or NULL (always NULL-able) */
    int64_t duration_strides[3];
} tdt_gradients_t;

/* ---------------------------------------------------------------------------------------------
 * Costs and upstream gradients have the accumulate type of the dtype: double for
 * TDT_DTYPE_FLOAT64, float for the three others. An infeasible sample (T_b == 0, or no path that
 * ends exactly at T_b, or every path of probability 0) gets cost +inf and all-zero gradients.
 *
 * GPU and bad data: on the GPU, lengths and labels are in device memory and are not read by the
 * host. A sample whose frame length, label length or labels are out of range gets cost NaN and
 * all-zero gradients; no memory outside that sample's slices is read or written, and the other
 * samples are unaffected. Check costs for NaN (torch.isnan) to catch it. NaN or inf in a
 * sample's logits gives that sample a NaN cost (and gradient) on either backend and leaves
 * the others alone.
 * ------------------------------------------------------------------------------------------- */

/* Bytes of workspace that the calls below need for this problem. Reads only batch, max_frames,
 * max_labels and whether duration_logits is NULL of problem, and num_durations and
 * state_in_grads of options
 * (nothing is dereferenced but the two structs), so it can be called before any tensor exists;
 * a placeholder non-NULL duration_logits asks for the TDT size. RNN-T (duration_logits NULL)
 * ignores num_durations; its size is never larger than TDT's for the same shapes. The same size
 * serves the one-shot call and the forward/backward pair. Any alignment of the workspace pointer
 * is accepted (the size includes slack for alignment). */
TDT_API tdt_status_t tdt_get_workspace_size(const tdt_problem_t *problem, const tdt_options_t *options,
                                    size_t *workspace_bytes);

/* One-shot loss, warp-ctc style: writes costs[b] for every sample and, when grads is non-NULL
 * and has a non-NULL gradient pointer, that gradient of sum_b costs[b] (upstream gradient 1).
 *
 * costs:     (B) of float / double (see above), overwritten; in the location's memory.
 * grads:     NULL for costs only: then alpha alone is swept, since no backward follows, and
 *            the workspace does not hold what tdt_backward() needs (the CPU refuses it there;
 *            the GPU cannot check it: do not pass it to tdt_backward()).
 * workspace: workspace_bytes of scratch in the location's memory, owned by the caller.
 * CPU: returns when done. GPU: returns once the work is enqueued on options->stream; no host
 * synchronisation, no allocation, capturable in a CUDA graph.
 * Every argument is validated before any work; on any status but SUCCESS nothing was written. */
TDT_API tdt_status_t compute_tdt_loss(const tdt_problem_t *problem, const tdt_options_t *options,
                              void *costs, const tdt_gradients_t *grads, void *workspace,
                              size_t workspace_bytes);

/* Forward half of an autograd pair: writes costs[b] and keeps in the workspace what
 * tdt_backward() needs (per-node log-probabilities and normalisers, alpha, and beta unless the
 * GPU's split schedule leaves it to the backward). The workspace must then be left untouched
 * until tdt_backward() of the same problem and options.
 * Memory, streams and validation as compute_tdt_loss(). */
TDT_API tdt_status_t tdt_forward(const tdt_problem_t *problem, const tdt_options_t *options, void *costs,
                         void *workspace, size_t workspace_bytes);

/* Backward half: writes the gradients of sum_b grad_costs[b] * costs[b], the per-sample upstream
 * gradient folded into the one pass that writes each gradient element (no second pass).
 * problem and options must describe the same call as the tdt_forward() that filled workspace
 * (the logits are read again, so they must still hold the same values unless the gradient is
 * written in place, which reads each logit before overwriting it).
 *
 * grad_costs: (B) of float / double in the location's memory (one value for every sample with
 *             options->grad_costs_scalar), or NULL for all ones.
 * It may be called again on the same workspace (the GPU's split schedule rewrites beta and
 * its counters there each time, to the same values), but two calls on one workspace must not
 * run concurrently (on the GPU: on one stream, or ordered by events).
 * On the CPU a workspace that does not hold a forward pass of this problem is refused with
 * TDT_STATUS_INVALID_WORKSPACE; the GPU cannot check it without a host synchronisation. */
TDT_API tdt_status_t tdt_backward(const tdt_problem_t *problem, const tdt_options_t *options,
                          const void *grad_costs, const tdt_gradients_t *grads, void *workspace,
                          size_t workspace_bytes);

/* Forward half that may run the backward ahead, for an autograd binding that knows its upstream
 * gradient only up to a factor when the forward runs (a reduction's weights, say, but not what
 * the rest of the graph multiplies the loss by).
 *
 * It does all that tdt_forward() does. Where the library's plan for a one-shot call with
 * gradients is faster than the tdt_forward() / tdt_backward() pair, it also writes the
 * gradients of sum_b grad_costs[b] * costs[b] into grads, in the same launch, and sets
 * *grads_written to 1. The GPU's fused and trail schedules do: under TDT_GPU_SCHEDULE_AUTO,
 * long rows and wide ones (fused) and batches too large for the other overlaps (trail); under
 * TDT_GPU_SCHEDULE_FUSED or TRAIL, wherever they can run. Everywhere else (and always on the
 * CPU) it sets *grads_written to 0 and leaves grads untouched, and tdt_backward() follows as
 * usual.
 *
 * Once written, tdt_scale_gradients() applies the factor that was missing; it reads and writes
 * nothing V-wide for a factor of exactly 1. Either way the workspace serves tdt_backward()
 * afterwards (a second backward pass through the same loss), as after tdt_forward().
 * The gradients written ahead are those of the schedule that wrote them: the fused schedule's
 * agree with tdt_backward()'s to rounding (see TDT_GPU_SCHEDULE_FUSED), the trail schedule's
 * are the same bits; the costs are the same bits.
 *
 * grad_costs:    as tdt_backward()'s (options->grad_costs_scalar applies), or NULL for ones.
 * grads:         as compute_tdt_loss()'s; NULL (or no gradient pointer) writes none ahead.
 * grads_written: non-NULL; set to 0 or 1 on success (0 on failure).
 * Memory, streams and validation as compute_tdt_loss(). */
TDT_API tdt_status_t tdt_forward_ahead(const tdt_problem_t *problem, const tdt_options_t *options,
                               void *costs, const void *grad_costs, const tdt_gradients_t *grads,
                               void *workspace, size_t workspace_bytes, int *grads_written);

/* Multiplies, in place, every gradient element inside sample b's lattice (t < T_b, u <= U_b) by
 * scale[b]: the factor tdt_forward_ahead()'s gradients were missing. Elements equal to zero stay
 * as they are (an infeasible sample's gradient stays exactly 0, whatever its factor), as does
 * every element outside the lattices. A sample whose factor is exactly 1 is not read at all, so
 * the call costs no V-wide pass when every factor is 1.
 *
 * scale: (B) of the accumulate type (float; double for TDT_DTYPE_FLOAT64), or one value with
 *        options->grad_costs_scalar, in the location's memory. The product is rounded once to
 *        the dtype, so after a factor other than 1 a gradient element may differ from
 *        tdt_backward()'s by a rounding step of the dtype.
 * problem, options and grads: those of the call that wrote the gradients (the logits are not
 *        read; the lengths are). No workspace.
 * CPU: returns when done. GPU: enqueued on options->stream; no synchronisation, capturable. */
TDT_API tdt_status_t tdt_scale_gradients(const tdt_problem_t *problem, const tdt_options_t *options,
                                 const void *scale, const tdt_gradients_t *grads);

/* Checks lengths and labels in host memory as a CPU call does: every frame length in
 * [0, max_frames], every label length in [0, max_labels], every label a sample uses in
 * [0, vocab_size) and not blank. For a GPU caller that keeps (or copies) them on the host too,
 * since the GPU backend never reads device data on the host (see "GPU and bad data" above).
 * Reads batch, max_frames, max_labels, vocab_size, labels, frame_lengths and label_lengths of
 * problem (the logits pointers and dtype are ignored) and blank of options; writes nothing.
 * Returns TDT_STATUS_INVALID_LENGTH or TDT_STATUS_INVALID_LABEL with tdt_last_error() naming
 * the first bad element (e.g. "labels[1][3] = 7 equals blank 7"), or a status for a bad size,
 * blank or NULL pointer. */
TDT_API tdt_status_t tdt_check_data(const tdt_problem_t *problem, const tdt_options_t *options);

/* ---------------------------------------------------------------------------------------------
 * Labels and lengths in the caller's integer type (tdt_indices_t, above). The loss reads them as
 * int32 (tdt_problem_t); frameworks hold int64 (PyTorch's default). tdt_pack_indices() converts
 * and checks them where they live, in one pass (one small kernel on the GPU), into one int32
 * array that a problem's three pointers then point into. A forward call can do the same itself,
 * first (tdt_options_t.pack).
 * ------------------------------------------------------------------------------------------- */

/* Writes packed[0 .. 2 B + B * max_labels) as int32: the frame lengths, the label lengths, then
 * the labels row-major (B, max_labels), so that a problem takes frame_lengths = packed,
 * label_lengths = packed + B and labels = packed + 2 B. With valid non-NULL it also writes
 * *valid = 1 when every value is one the loss accepts (tdt_check_data's rules, plus a label
 * length no larger than indices->columns, whose padding would otherwise be read as labels),
 * else 0; a value outside int32 counts as bad, and its packed entry is then 0. The first bad
 * element is not named: a caller that finds 0 looks at its own copy for the message.
 * Reads batch, max_frames, max_labels and vocab_size of problem (nothing dereferenced) and
 * location, stream and blank of options.
 * CPU: returns when done. GPU: one kernel of one block on options->stream, on the device that
 * owns packed; the indices and packed in device memory, valid in memory the device can write
 * (device memory, or pinned host memory, which holds the flag once the stream has passed the
 * call); no synchronisation, capturable. */
TDT_API tdt_status_t tdt_pack_indices(const tdt_problem_t *problem, const tdt_options_t *options,
                                      const tdt_indices_t *indices, int32_t *packed, int32_t *valid);

/* A static string naming the status, e.g. "TDT_STATUS_INVALID_LABEL: a label is outside
 * [0, vocab_size) or equals blank". Never NULL; unknown values give a generic string. */
TDT_API const char *tdt_status_string(tdt_status_t status);

/* Human-readable detail of the last failed call made from this thread, naming the argument
 * and the value (e.g. "labels[1][3] = 7 equals blank 7"). Empty string after a successful
 * call. The pointer is thread-local and valid until the next call from this thread. */
TDT_API const char *tdt_last_error(void);

/* Version of the loaded library: TDT_VERSION_NUMBER as it was when the library was built. */
TDT_API int tdt_version(void);

/* "MAJOR.MINOR.PATCH" of the loaded library, a static string. */
TDT_API const char *tdt_version_string(void);

/* 1 if the library was built with this backend, 0 otherwise. */
TDT_API int tdt_backend_built(tdt_location_t location);

/* The vector path the CPU backend runs in this process, a static string: on x86-64 "avx512bf16"
 * (AVX-512 F, BW, DQ, VL and BF16), "avx512" (AVX-512 F, BW, DQ, VL), "avx2" (AVX2, FMA, F16C) or
 * "baseline" (x86-64), the best one the CPU and the operating system support; "neon" on aarch64;
 * "native" in a build with TDT_NATIVE_ARCH=ON; "baseline" elsewhere. Chosen once, at the first
 * call of this function or of a CPU computation. On x86-64 the environment variable TDT_CPU_ISA,
 * set to one of the four names, asks for that path: a path the CPU lacks gives the best it has,
 * and an unknown name is ignored. The avx2, avx512 and avx512bf16 paths give the same costs and
 * gradients, bit for bit; the baseline's differ from theirs within a few ulp (it has no FMA).
 * Thread-safe. */
TDT_API const char *tdt_cpu_isa(void);

/* Number of usable CUDA devices; TDT_STATUS_BACKEND_NOT_BUILT in a build without CUDA. A
 * machine without a GPU or driver gives 0 and TDT_STATUS_SUCCESS. */
TDT_API tdt_status_t tdt_gpu_device_count(int *count);

/* ---------------------------------------------------------------------------------------------
 * The fused joint + loss. A transducer's joint network ends in
 *     z(b, t, u) = W act(enc[b, t, :] + pred[b, u, :]) + bias      (length V + D, or V for RNN-T)
 * and the calls above read those logits, a (B, max_frames, max_labels + 1, V + D) tensor that a
 * caller must first write in full. The calls below take the joint's inputs instead and compute
 * the same costs (and the gradients of enc, pred, W and bias) without ever holding the logits:
 * tiles of lattice nodes are multiplied against tiles of W's rows, with a running log-sum-exp
 * over the vocabulary, and each node keeps only what the lattice reads (its log-normaliser and
 * its blank, label and duration log-probabilities); the backward pass recomputes each tile's
 * logits and folds their gradient straight into d h and d W. Memory: O(nodes x (D + a few))
 * plus a bounded scratch for the tiles, never O(nodes x V). docs/joint.md has the algorithm.
 *
 * For every node (b, t, u) of sample b's lattice:
 *     h = dropout(act(enc[b, t, :] + pred[b, u, :]))           (length H)
 *     z = W h + bias                                            (length num_outputs)
 * z's first V values are the token logits (blank included, at options->blank), the D after them
 * the duration logits (duration-logit k belongs to options->durations[k]). The loss of those
 * logits is exactly compute_tdt_loss()'s with input_kind TDT_INPUT_LOGITS: the same options
 * (blank, durations, sigma, fastemit_lambda, clamp, reduction, normalize_costs, batch_mean,
 * grad_costs_scalar, num_threads, location, stream), the same infeasible-sample policy. Not
 * taken here (TDT_STATUS_INVALID_OPTION when set): input_kind TDT_INPUT_LOG_PROBS, pack,
 * state_in_grads; gpu_schedule is ignored.
 * On the GPU two schedules compute the same results: "gemm" (chunks of nodes through cuBLASLt's
 * matrix products, the chunk's logits in the workspace; the default where cuBLASLt, loaded at
 * run time, is found) and "tiles" (the logits recomputed in shared memory, never in device
 * memory; the default where cuBLASLt is not found). The environment variable TDT_GPU_JOINT,
 * read at every call, forces one: "gemm" (TDT_STATUS_CUDA_ERROR where cuBLASLt cannot be
 * loaded) or "tiles"; anything else gives TDT_STATUS_INVALID_OPTION. The workspace size covers
 * either. TDT_GPU_JOINT_CHUNK_KB (a tuning knob, docs/joint.md) sets the GEMM schedule's chunk
 * budget (default 128 MB) for the size query and the call alike, as TDT_GPU_JOINT_FLOAT32 does
 * float32's products there: "split" (the default: bfloat16 tensor cores on operands split into
 * three bfloat16 parts whose sum is exact, as accurate as float32 products) or "sgemm" (float32
 * kernels, 1.2-1.6x the time; docs/joint.md). TDT_GPU_JOINT_BWD trades the GEMM schedule's
 * time for memory: "chip" (float16 and bfloat16 on compute capability 9.0, H up to 640) takes a
 * smaller workspace, W packed, d pred's float32 sums and one area of TDT_GPU_JOINT_CHUNK_KB
 * (default 28 MB), and a backward that recomputes the logits on the chip twice instead of
 * writing a chunk of their gradient: 63 MB beyond the gradients instead of 188 at huge-joint
 * (B 8, T 375, U 100, V 8193) in bfloat16, at about 1.9x the default's time; "wgmma" and
 * "gemm" (the default) keep the default's workspace. TDT_GPU_JOINT_FWD "gemm" takes the forward's products
 * from cuBLASLt on every device ("wgmma", the default, from Hopper's tensor cores where the
 * "chip" conditions hold). Both are read by the size query and the call alike; anything else
 * gives TDT_STATUS_INVALID_OPTION.
 * docs/joint.md compares the two schedules.
 * ------------------------------------------------------------------------------------------- */

/* The joint's activation, applied to enc + pred before the output layer (NeMo's three, and
 * none). */
typedef enum tdt_activation {
    TDT_ACTIVATION_RELU = 0,     /* max(x, 0) (NeMo's default); its derivative at 0 is 0 */
    TDT_ACTIVATION_TANH = 1,
    TDT_ACTIVATION_SIGMOID = 2,
    TDT_ACTIVATION_IDENTITY = 3
} tdt_activation_t;

/* The joint problem. Strides are in elements. All floating-point tensors (enc, pred, weight,
 * bias) have dtype; the gradients are written in it too. */
typedef struct tdt_joint_problem {
    int64_t batch;           /* B >= 0 */
    int64_t max_frames;      /* padded T >= 0 */
    int64_t max_labels;      /* padded U >= 0; the lattice has max_labels + 1 rows */
    int64_t vocab_size;      /* V >= 1, blank included */
    int64_t hidden;          /* H >= 1: the joint's hidden size */
    int64_t num_outputs;     /* rows of weight: V + D for TDT (D = options->num_durations), or V
                                for plain RNN-T; anything else is TDT_STATUS_INVALID_SIZE */
    tdt_dtype_t dtype;       /* of enc, pred, weight, bias and of every gradient; float16 and
                                bfloat16 accumulate in float32, float32 in float32, float64 in
                                float64 */
    const void *enc;         /* (B, max_frames, H): element (b, t, i) at
                                enc[b * enc_strides[0] + t * enc_strides[1] + i]; the encoder's
                                output already projected to H (NeMo's joint.enc(f)) */
    int64_t enc_strides[2];  /* >= 0; the last dimension is contiguous */
    const void *pred;        /* (B, max_labels + 1, H): element (b, u, i) at
                                pred[b * pred_strides[0] + u * pred_strides[1] + i]; the
                                prediction network's output projected to H (joint.pred(g)) */
    int64_t pred_strides[2]; /* >= 0; the last dimension is contiguous */
    const void *weight;      /* (num_outputs, H), nn.Linear's layout (out, in): row o at
                                weight + o * weight_stride */
    int64_t weight_stride;   /* elements between rows, >= H */
    const void *bias;        /* (num_outputs), contiguous, or NULL for none */
    tdt_activation_t activation;
    double dropout;          /* probability in [0, 1) that an element of act(enc + pred) is
                                zeroed (the others are scaled by 1 / (1 - dropout)), as
                                nn.Dropout in training; 0 = no dropout. The mask is never
                                stored: element (b, t, u, i) has the counter
                                c = dropout_offset + ((b * max_frames + t) * (max_labels + 1) + u) * H
                                + i and is kept iff the top 32 bits of SplitMix64's output
                                function of dropout_seed + (c + 1) * 0x9e3779b97f4a7c15 (all mod
                                2^64: the (c + 1)-th output of a SplitMix64 generator seeded with
                                dropout_seed) are >= floor(dropout * 2^32) (a dropout below
                                2^-32 keeps and scales nothing); the same on both
                                backends (tdt_joint_dropout_mask() writes it), and the backward
                                pass regenerates it. Give each training step its own seed or
                                offset. */
    uint64_t dropout_seed;
    uint64_t dropout_offset;
    const int32_t *labels;        /* as tdt_problem_t: (B, max_labels), row-major, contiguous */
    const int32_t *frame_lengths; /* (B): T_b in [0, max_frames] */
    const int32_t *label_lengths; /* (B): U_b in [0, max_labels] */
} tdt_joint_problem_t;

/* Where the joint's gradients go; each pointer may be NULL to skip that gradient. Every element
 * of each extent is overwritten (frames t >= T_b of enc_grad, rows u > U_b of pred_grad and
 * every element of an infeasible sample's enc_grad and pred_grad get exactly 0; an infeasible
 * sample adds nothing to weight_grad and bias_grad). The gradients' rows must be disjoint
 * (no broadcast strides), and the address range of each gradient (first to last element) must
 * not meet that of another gradient or of enc, pred, weight or bias
 * (TDT_STATUS_INVALID_STRIDES otherwise). */
typedef struct tdt_joint_gradients {
    void *enc_grad;            /* (B, max_frames, H), strided like enc (its own strides) */
    int64_t enc_strides[2];
    void *pred_grad;           /* (B, max_labels + 1, H), strided like pred */
    int64_t pred_strides[2];
    void *weight_grad;         /* (num_outputs, H), rows weight_stride apart */
    int64_t weight_stride;     /* >= H */
    void *bias_grad;           /* (num_outputs), contiguous */
    double skip_below;         /* 0 (the default): the exact gradients. eps > 0: the backward
                                  leaves out every lattice node whose logits' gradient is
                                  certainly below eps in every element (below) */
} tdt_joint_gradients_t;

/* skip_below: a node (b, t, u) is left out (its logits' gradient taken as zero, its logits not
 * recomputed) when |g_b| x occ < eps, with g_b the sample's upstream gradient and occ the
 * larger of the node's two occupancy sums (its token and its duration softmax terms' weights:
 * the posterior probability that an alignment passes through the node, times 1 + FastEmit's
 * lambda for its label arcs). Every element of a left-out node's logits' gradient is at most
 * that bound in magnitude, so each gradient element moves by at most eps times the sum of
 * |W| (d h), |h| (d W) or 1 (d bias) over the left-out nodes it collects from; the costs are
 * exact. Nodes off the likely alignments (most of a trained model's lattice) are the ones left
 * out: the transducer form of Cut Cross-Entropy's gradient filtering. Must be finite and >= 0
 * (TDT_STATUS_INVALID_OPTION). On the GPU the GEMM schedule then lists the kept nodes and runs
 * its products on them alone, which reads their number back: such a backward waits for
 * options->stream once. Under CUDA-graph capture it takes every node instead (the left-out
 * ones as zeros: the same gradients to rounding), with no synchronisation. */

/* Bytes of workspace the joint calls need for this problem and these options: the lattice's
 * per-node state (as tdt_get_workspace_size()) plus the scratch of the tiles. Reads the shapes
 * (hidden and num_outputs included), dtype and whether the problem is TDT (num_outputs !=
 * vocab_size) of problem, and location, num_threads and num_durations of options; nothing is
 * dereferenced but the structs. The same size serves the one-shot call and the pair.
 * CPU: the scratch holds W^T in the accumulate type (num_outputs x hidden values), W widened
 * (16-bit dtypes, or hidden not a multiple of 32), float32 sums of the four gradients (16-bit
 * dtypes), skip_below's list of kept nodes (8 bytes a node of the padded extent B x max_frames
 * x (max_labels + 1)), and slots of 24 nodes x (num_outputs + 2 hidden) values: about one for every
 * 48 x 24 nodes of the padded extent, at most 64 by that rule but at least 2 a thread (and at
 * most one a tile), so the size depends on
 * options->num_threads (0: omp_get_max_threads() when asked, which must then be no smaller in
 * the call: a call that needs more gets TDT_STATUS_WORKSPACE_TOO_SMALL). GPU: the larger of
 * the two schedules' scratch (src/gpu/joint_plan.h), mostly the GEMM schedule's chunk of
 * logits (TDT_GPU_JOINT_CHUNK_KB, default 128 MB): for a Parakeet joint (H 640, V + D 8198)
 * about 165-190 MB in bfloat16 at docs/joint.md's shapes, plus skip_below's list of kept
 * nodes (4 bytes a node of the padded extent); with TDT_GPU_JOINT_BWD=chip (above) about
 * 41-78 MB there. */
TDT_API tdt_status_t tdt_joint_get_workspace_size(const tdt_joint_problem_t *problem,
                                                  const tdt_options_t *options,
                                                  size_t *workspace_bytes);

/* One-shot fused joint + loss: writes costs[b] (and options->reduced_cost with a reduction)
 * and, when grads is non-NULL, the gradients of sum_b costs[b] (upstream 1; batch_mean and
 * normalize_costs apply as in tdt_backward()). Memory, streams and validation as
 * compute_tdt_loss(): every argument checked before any work, nothing written on failure. */
TDT_API tdt_status_t tdt_joint_loss(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                    void *costs, const tdt_joint_gradients_t *grads,
                                    void *workspace, size_t workspace_bytes);

/* Forward half of an autograd pair: costs, and in the workspace what tdt_joint_backward()
 * needs (the per-node log-probabilities and normalisers, alpha, beta). enc, pred, weight and
 * bias must hold the same values when the backward runs. */
TDT_API tdt_status_t tdt_joint_forward(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                       void *costs, void *workspace, size_t workspace_bytes);

/* Backward half: the gradients of sum_b grad_costs[b] * costs[b] (grad_costs as
 * tdt_backward()'s, NULL for ones), recomputing each tile's logits from the problem. On the
 * CPU a workspace that does not hold tdt_joint_forward() of this problem (a plain
 * tdt_forward()'s included) is refused with TDT_STATUS_INVALID_WORKSPACE. The CPU gives the
 * same bits for any options->num_threads, and the pair gives those of tdt_joint_loss(). */
TDT_API tdt_status_t tdt_joint_backward(const tdt_joint_problem_t *problem, const tdt_options_t *options,
                                        const void *grad_costs, const tdt_joint_gradients_t *grads,
                                        void *workspace, size_t workspace_bytes);

/* The joint dropout's mask, for checking: keep[j] = 1 if the element with counter
 * first + j (mod 2^64) is kept at probability `dropout` under `seed`, else 0, for j < count
 * (host memory; the counter of element (b, t, u, i) and the rule are given at
 * tdt_joint_problem_t.dropout). TDT_STATUS_INVALID_OPTION for dropout outside [0, 1),
 * TDT_STATUS_INVALID_SIZE for count < 0, TDT_STATUS_NULL_POINTER for keep NULL with count > 0. */
TDT_API tdt_status_t tdt_joint_dropout_mask(double dropout, uint64_t seed, uint64_t first,
                                            int64_t count, uint8_t *keep);

#ifdef __cplusplus
}
#endif

#endif /* TDT_H */
