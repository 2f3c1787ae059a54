/*
 * gpu.cu - the CUDA backend's entry points: tdt_gpu_run(), tdt_gpu_scale(), tdt_gpu_count(),
 * tdt_gpu_built().
 *
 * tdt_gpu_run() receives one call already validated by src/tdt.c (internal.h), builds the
 * kernels' argument block and enqueues, on the caller's stream,
 *     forward:  normalize (per node)  ->  sweep (alpha | beta per sample, LL, cost), or the
 *               two overlapped: a memset of the workspace's layer counters, the normaliser in
 *               the order the sweep consumes its values, the sweep as its programmatic
 *               dependent (sweep.cuh, "The overlapped schedules"; the split schedule: alpha alone);
 *               with options.reduction, the sweeps count the costs they write and the last
 *               one's thread sums them (tdt_cost_counted; the counters zeroed first); with
 *               options.pack, first one block that packs the labels and lengths and zeroes the
 *               counters, in place of the memset
 *     backward: grad (per node); for the split schedule (tdt_gpu_schedule_t) the beta sweep
 *               first, the gradient pass trailing it as its programmatic dependent; for the
 *               fused schedule (a one-shot call), enqueued by the forward, the gradient pass
 *               trailing both sweeps as they run
 * Nothing else: no allocation (the caller's workspace holds every intermediate), no host
 * synchronisation, no stream or event creation, so the whole call can be captured in a CUDA
 * graph. The only state touched is the calling thread's current device, switched to the
 * device owning the workspace (so pointers of any GPU work) and restored before returning, on
 * every path, and the library's own kernels' attributes (how much dynamic shared memory, what
 * cluster size they may take: tdt_allow_smem, tdt_allow_cluster), which only its launches read.
 * CUDA's answers about a device and the library's kernels are kept in a table of the process
 * (tdt_kept_get, below), which only the library reads.
 *
 * Errors: every CUDA call and every launch is checked; a failure returns
 * TDT_STATUS_CUDA_ERROR with CUDA's own name and message in tdt_last_error().
 */
#include "common/indices.h"
#include "gpu_common.cuh"

namespace {

#ifdef TDT_TIMELINE
/* Benchmark builds only (-DTDT_TIMELINE): the kernels' timeline (gpu_common.cuh), one device
 * buffer for the process, allocated on first use (the one allocation such a build makes).
 * Reset: every start entry (even) ~0, every end entry (odd) 0. */
cudaError_t timeline_reset(unsigned long long *buf) {
    unsigned long long init[TDT_TL_N];
    for (int i = 0; i < TDT_TL_N; ++i) init[i] = i % 2 == 0 ? ~0ull : 0ull;
    return cudaMemcpy(buf, init, sizeof init, cudaMemcpyHostToDevice);
}

unsigned long long *timeline_buffer() {
    static unsigned long long *buf = NULL;
    if (!buf) {
        if (cudaMalloc(&buf, TDT_TL_N * sizeof *buf) != cudaSuccess) return NULL;
        timeline_reset(buf);
    }
    return buf;
}
#endif


/* The kernels' argument block from the validated call. */
void build_args(const tdt_call_t *c, tdt_gpu_args_t *a) {
    const tdt_problem_t &p = c->p;
    memset(a, 0, sizeof *a);
    a->B = p.batch;
    a->maxT = p.max_frames;
    a->maxU = p.max_labels;
    a->row = p.max_labels + 1;
    a->V = p.vocab_size;
    a->nodes = c->layout.nodes;
    a->D = c->tdt_mode ? c->num_durations : 0;
    a->blank = c->o.blank;
    a->log_probs = c->o.input_kind == TDT_INPUT_LOG_PROBS;
    a->acc_double = tdt_acc_is_double(p.dtype);
    a->sigma = c->o.sigma;
    a->fastemit_lambda = c->o.fastemit_lambda;
    a->clamp = c->o.clamp;
    a->tok = p.token_logits;
    a->dur = c->tdt_mode ? p.duration_logits : NULL;
    for (int i = 0; i < 3; ++i) {
        a->tok_s[i] = p.token_strides[i];
        a->dur_s[i] = p.duration_strides[i];
        a->tok_gs[i] = c->g.token_strides[i];
        a->dur_gs[i] = c->g.duration_strides[i];
    }
    a->labels = p.labels;
    a->frame_lengths = p.frame_lengths;
    a->label_lengths = p.label_lengths;
    a->tok_g = c->do_backward ? c->g.token_grads : NULL;
    a->dur_g = c->do_backward && c->tdt_mode ? c->g.duration_grads : NULL;
    a->costs = c->costs;
    a->grad_costs = c->grad_costs;
    a->grad_costs_scalar = c->o.grad_costs_scalar != 0;
    a->normalize_costs = c->o.normalize_costs != 0;
    a->batch_mean = c->o.batch_mean != 0;
    a->arcs = c->arcs;
    a->sweep_only = c->costs_only ? 1 : 0; /* no backward follows: alpha alone gives the costs */
    if (c->workspace) { /* none: scaling */
        tdt_workspace_carve(&c->layout, c->workspace, &a->ws);
        a->wb = tdt_call_blocks(c, a->ws.w);
        a->state_rows = c->o.state_in_grads != 0;
    }
    /* options.reduction: written by the sweeps' last cost (tdt_cost_counted), where the count
     * fits its int32 counter; else by reduce_costs_kernel after them (enqueue). A forward here
     * has a workspace and a sample (an empty batch is enqueue_empty's). */
    if (c->do_forward && c->o.reduction != TDT_REDUCTION_NONE && p.batch < INT32_MAX) {
        a->reduce = c->o.reduction == TDT_REDUCTION_MEAN ? 2 : 1;
        a->cost_count = a->ws.order + tdt_ws_cost_count(p.batch, p.max_frames, p.max_labels);
        a->reduced = c->o.reduced_cost;
    }
#ifdef TDT_TIMELINE
    a->tl = timeline_buffer();
#endif
}

/* options.reduction where no sweep writes it (an empty batch, or one too large for the
 * sweeps' count): one thread sums the costs in the order tdt_reduce_costs fixes (the CPU's
 * bits), in stream order after the kernels that wrote them. */
__global__ void reduce_costs_kernel(const void *costs, int acc_double, int64_t B, int mean,
                                    void *out) {
    tdt_write_reduction(costs, acc_double, B, mean, out);
}

/* Enqueues options.reduction's kernel, if the call asks for one and no sweep writes it, on the
 * current device. */
tdt_status_t enqueue_reduction(const tdt_call_t *c, const tdt_gpu_args_t *a) {
    if (!c->do_forward || c->o.reduction == TDT_REDUCTION_NONE || (a && a->reduce))
        return TDT_STATUS_SUCCESS;
    reduce_costs_kernel<<<1, 1, 0, (cudaStream_t)c->o.stream>>>(
        c->costs, tdt_acc_is_double(c->p.dtype), c->p.batch, c->o.reduction == TDT_REDUCTION_MEAN,
        c->o.reduced_cost);
    const cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? tdt_gpu_cuda_fail(e, "reduce_costs_kernel launch") : TDT_STATUS_SUCCESS;
}

/* tdt_pack_indices()'s sizes and blank, for the packing kernel. */
tdt_pack_shape_t prologue_shape(const tdt_problem_t *p, const tdt_options_t *o) {
    const tdt_pack_shape_t s = {p->batch, p->max_frames, p->max_labels, p->vocab_size, o->blank};
    return s;
}

/* options.pack of a forward call (the problem's frame_lengths the packed array), or NULL (the
 * dispatch layer clears it for every call but a forward). */
const tdt_gpu_prologue_t *prologue_of(const tdt_call_t *c, tdt_gpu_prologue_t *pro) {
    if (!c->o.pack) return NULL;
    pro->in = *c->o.pack;
    pro->shape = prologue_shape(&c->p, &c->o);
    pro->packed = c->p.batch > 0 ? (int32_t *)c->p.frame_lengths : NULL;
    pro->valid = c->o.pack_valid;
    return pro;
}

/* An empty batch: only the reduction and options.pack's verdict (1) to write, on the current
 * device (the one owning reduced_cost, with a reduction). */
tdt_status_t enqueue_empty(const tdt_call_t *c, int) {
    tdt_gpu_prologue_t pro;
    if (prologue_of(c, &pro) && pro.valid) {
        const cudaError_t e = tdt_launch_prologue(pro, NULL, 0, (cudaStream_t)c->o.stream);
        if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "the packing kernel's launch");
    }
    return enqueue_reduction(c, NULL);
}

/* The device that owns ptr (named `what` in errors): 0 and *device set, or a status. Host
 * memory is refused (the GPU location takes device memory); registered or managed memory names
 * its device too. */
tdt_status_t enqueue(const tdt_call_t *c, int device) {
    cudaStream_t stream = (cudaStream_t)c->o.stream;
    int num_sms = 0;
    cudaError_t e = tdt_device_attribute(cudaDevAttrMultiProcessorCount, device, &num_sms);
    if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaDeviceGetAttribute(MultiProcessorCount)");
    if (num_sms < 1) num_sms = 1;

    tdt_gpu_args_t a;
    build_args(c, &a);
    bool bwd_done = false; /* the fused schedule runs a one-shot call's backward in its forward */
    if (c->do_forward) {
        tdt_gpu_prologue_t pro;
        e = tdt_launch_forward(a, c->p.dtype, num_sms, c->o.gpu_schedule, stream,
                               c->do_backward ? &bwd_done : NULL, prologue_of(c, &pro));
        if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "launching the normalize and sweep kernels");
        const tdt_status_t st = enqueue_reduction(c, &a);
        if (st != TDT_STATUS_SUCCESS) return st;
        a.reduce = 0; /* the forward's alone */
    }
    if (c->ahead) { /* tdt_forward_ahead(): the backward only if it ran with the forward */
        *c->ahead = bwd_done ? 1 : 0;
        return TDT_STATUS_SUCCESS;
    }
    if (c->do_backward && !bwd_done) {
        e = tdt_launch_backward(a, c->p.dtype, num_sms, c->o.gpu_schedule, stream);
        if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "launching the backward's kernels");
    }
    return TDT_STATUS_SUCCESS;
}

tdt_status_t enqueue_scale(const tdt_call_t *c, int device) {
    int num_sms = 0;
    cudaError_t e = tdt_device_attribute(cudaDevAttrMultiProcessorCount, device, &num_sms);
    if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaDeviceGetAttribute(MultiProcessorCount)");
    tdt_gpu_args_t a;
    build_args(c, &a);
    e = tdt_launch_scale(a, c->p.dtype, num_sms < 1 ? 1 : num_sms, (cudaStream_t)c->o.stream);
    return e != cudaSuccess ? tdt_gpu_cuda_fail(e, "launching the scale kernel") : TDT_STATUS_SUCCESS;
}

/* Runs body(call, device) on the device owning ptr, restoring the caller's current device. */
/* The kept answers (gpu_common.cuh): a table of the process. An entry is claimed by a
 * compare-and-swap of its state from free to being written, filled, and published by a release
 * store of the state "kept"; entries are claimed in index order, so the first free one ends a
 * search. Two threads asking at once may both ask CUDA and keep the same answer twice; a full
 * table keeps nothing more, and its callers ask CUDA each time. */
enum { KEPT_FREE = 0, KEPT_WRITING = 1, KEPT_DONE = 2, KEPT_ENTRIES = 256 };
struct kept_entry {
    const void *key;
    int arg, device, value;
    int state;
};
kept_entry g_kept[KEPT_ENTRIES];

/* tdt_launch_prologue()'s kernel: one block strides over the counters to zero and over the
 * packed array, each thread zeroing and packing and checking its elements (tdt_pack_one); the
 * block's verdict goes to *valid, fenced for the system so that pinned host memory holds it when
 * the stream passes the kernel. */
__global__ void prologue_kernel(const tdt_indices_t in, const tdt_pack_shape_t s, int32_t *packed,
                                int32_t *valid, int32_t *zero, int64_t nzero) {
    for (int64_t i = threadIdx.x; i < nzero; i += blockDim.x) zero[i] = 0;
    const int64_t n = packed ? s.batch * (s.max_labels + 2) : 0;
    int bad = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) bad |= !tdt_pack_one(&in, &s, i, packed + i);
    bad = __syncthreads_or(bad);
    if (valid && threadIdx.x == 0) {
        *valid = !bad;
        __threadfence_system();
    }
}

} /* namespace */

/* ================================================================================================
 * failures and the caller's device (gpu_common.cuh)
 * ============================================================================================== */

tdt_status_t tdt_gpu_cuda_fail(cudaError_t e, const char *what) {
    tdt_set_error("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return TDT_STATUS_CUDA_ERROR;
}

tdt_status_t tdt_gpu_owning_device(const void *ptr, const char *what, int *device) {
    cudaPointerAttributes attr;
    cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
        tdt_set_error("cudaPointerGetAttributes(%s): %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
        return TDT_STATUS_CUDA_ERROR;
    }
    if (attr.type == cudaMemoryTypeUnregistered || attr.device < 0) {
        tdt_set_error("%s %p is not GPU-accessible memory (TDT_LOCATION_GPU takes device "
                      "pointers)", what, ptr);
        return TDT_STATUS_INVALID_OPTION;
    }
    *device = attr.device;
    return TDT_STATUS_SUCCESS;
}

/* ================================================================================================
 * kept answers (gpu_common.cuh)
 * ============================================================================================== */

int tdt_kept_get(const void *key, int arg, int device, int *value) {
    for (int i = 0; i < KEPT_ENTRIES; ++i) {
        const kept_entry &k = g_kept[i];
        const int state = __atomic_load_n(&k.state, __ATOMIC_ACQUIRE);
        if (state == KEPT_FREE) return 0;
        if (state == KEPT_DONE && k.key == key && k.arg == arg && k.device == device) {
            *value = k.value;
            return 1;
        }
    }
    return 0;
}

void tdt_kept_put(const void *key, int arg, int device, int value) {
    for (int i = 0; i < KEPT_ENTRIES; ++i) {
        kept_entry &k = g_kept[i];
        int expected = KEPT_FREE;
        if (__atomic_compare_exchange_n(&k.state, &expected, (int)KEPT_WRITING, false,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            k.key = key;
            k.arg = arg;
            k.device = device;
            k.value = value;
            __atomic_store_n(&k.state, (int)KEPT_DONE, __ATOMIC_RELEASE);
            return;
        }
    }
}

cudaError_t tdt_device_attribute(cudaDeviceAttr attr, int device, int *value) {
    return tdt_kept((const void *)&tdt_device_attribute, (int)attr, device, value,
                    [&](int *v) { return cudaDeviceGetAttribute(v, attr, device); });
}

cudaError_t tdt_launch_prologue(const tdt_gpu_prologue_t &pro, int32_t *zero, int64_t nzero,
                                cudaStream_t stream) {
    const int64_t n = pro.packed ? pro.shape.batch * (pro.shape.max_labels + 2) : 0;
    const int64_t most = n > nzero ? n : nzero;
    const int threads = most >= 1024 ? 1024 : (int)((most + 31) / 32 * 32) + (most == 0 ? 32 : 0);
    prologue_kernel<<<1, threads, 0, stream>>>(pro.in, pro.shape, pro.packed, pro.valid, zero, nzero);
    return cudaGetLastError();
}

/* ================================================================================================
 * backend entry points (internal.h)
 * ============================================================================================== */

extern "C" tdt_status_t tdt_gpu_run(const tdt_call_t *call) {
    if (call->p.batch == 0) { /* nothing to write but a reduction's sum (0) or mean (NaN) and
                                 options.pack's verdict */
        if (!call->do_forward) return TDT_STATUS_SUCCESS;
        if (call->o.reduction != TDT_REDUCTION_NONE)
            return tdt_on_device(call, call->o.reduced_cost, "options->reduced_cost", enqueue_empty);
        return call->o.pack && call->o.pack_valid ? enqueue_empty(call, 0) : TDT_STATUS_SUCCESS;
    }
    return tdt_on_device(call, call->workspace, "workspace", enqueue);
}

extern "C" tdt_status_t tdt_gpu_scale(const tdt_call_t *call) {
    /* no workspace: the gradient names the device */
    const void *g = call->g.token_grads ? call->g.token_grads : call->g.duration_grads;
    return tdt_on_device(call, g, call->g.token_grads ? "grads->token_grads" : "grads->duration_grads",
                     enqueue_scale);
}

extern "C" tdt_status_t tdt_gpu_pack(const tdt_problem_t *problem, const tdt_options_t *options,
                                     const tdt_indices_t *indices, int32_t *packed, int32_t *valid) {
    const int64_t n = problem->batch * (problem->max_labels + 2);
    if (n == 0 && !valid) return TDT_STATUS_SUCCESS; /* nothing to write */
    int prev = 0, device = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaGetDevice");
    device = prev; /* no element: the flag alone, on the current device */
    if (n > 0) {
        tdt_status_t st = tdt_gpu_owning_device(packed, "packed", &device);
        if (st != TDT_STATUS_SUCCESS) return st;
    }
    if (device != prev && (e = cudaSetDevice(device)) != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaSetDevice");
    const tdt_gpu_prologue_t pro = {*indices, prologue_shape(problem, options), packed, valid};
    tdt_status_t st = TDT_STATUS_SUCCESS;
    e = tdt_launch_prologue(pro, NULL, 0, (cudaStream_t)options->stream);
    if (e != cudaSuccess) st = tdt_gpu_cuda_fail(e, "the packing kernel's launch");
    if (device != prev) {
        e = cudaSetDevice(prev);
        if (e != cudaSuccess && st == TDT_STATUS_SUCCESS) st = tdt_gpu_cuda_fail(e, "cudaSetDevice(restore)");
    }
    return st;
}

extern "C" tdt_status_t tdt_gpu_count(int *count) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        e == cudaErrorInitializationError) {
        (void)cudaGetLastError(); /* the runtime records it: leave no error behind */
        *count = 0;
        return TDT_STATUS_SUCCESS;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tdt_gpu_cuda_fail(e, "cudaGetDeviceCount");
    }
    *count = n;
    return TDT_STATUS_SUCCESS;
}

extern "C" int tdt_gpu_built(void) { return 1; }

#ifdef TDT_TIMELINE
/* Benchmark builds only: copies the timeline of the calls since the last read into out
 * (TDT_TL_N values of %globaltimer ns: even entries the earliest start, odd the latest end,
 * ~0 / 0 where nothing marked) and resets it. Synchronises the device. */
extern "C" TDT_API int tdt_debug_timeline(unsigned long long *out) {
    unsigned long long *buf = timeline_buffer();
    if (!buf || cudaDeviceSynchronize() != cudaSuccess) return -1;
    if (cudaMemcpy(out, buf, TDT_TL_N * sizeof *buf, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
    return timeline_reset(buf) == cudaSuccess ? TDT_TL_N : -1;
}
#endif
