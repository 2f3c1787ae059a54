/*
 * normalize.cu - the per-node fused log-softmax (forward pass, first kernel).
 *
 * Math (docs/math.md, sections 1 and 5): for every node (t, u) inside a sample's
 * lattice (t < T_b, u <= U_b),
 *     lse(t,u)      = log sum_v exp z(t,u,v)                       (token log-normaliser)
 *     lp_blank(t,u) = z(t,u,blank)   - lse - sigma
 *     lp_label(t,u) = z(t,u,y_{u+1}) - lse - sigma                  (u < U_b only)
 *     lp_dur(t,u,k) = log_softmax(h(t,u,:))[k]                      (TDT only)
 * With TDT_INPUT_LOG_PROBS the inputs are used as they are (lse = 0, no softmax over h).
 * The logits are read exactly once and never copied; only these per-node values (O(nodes))
 * are written, into the caller's workspace (float64).
 *
 * Parallel mapping: a group of G lanes (32, 8 or 2 by row length, 4 in place of 8 for problems of
 * many nodes: tdt_gpu_group_size) owns one node at a time, grid-striding over all
 * B * maxT * (maxU + 1) nodes. Each lane keeps an online (reference, sum) over its share of
 * the row, read as 16-byte vectors in batches (a
 * scalar head up to the row's first 16-byte boundary and a scalar tail; rows of a joint tensor
 * are not all 16-byte aligned), then the group merges the G states with a fixed xor-shuffle
 * tree. Lane 0 writes the node's token values, each lane its share of the durations'. The hot
 * loop is one FFMA, one MUFU.EX2 and one add an element (plus the conversion of a 16-bit
 * element): the reference starts at the blank's logit
 * and moves only in the rare batch whose terms would pass 2^64 or are not finite (lse_slow),
 * so there is no running max and no branch per element.
 * Two kernels share that per-node work (normalize_node): normalize_kernel takes the nodes in
 * memory order, before the sweep; normalize_ordered_kernel takes them in the order the sweeps
 * read them, counting what is done, for the forward that overlaps the two (sweep.cuh, "The
 * overlapped schedules"). A node's values are the same bits either way.
 *
 * Race-free: every node is owned by exactly one group; each output element has one writer and
 * no element is read after being written in this kernel. Nodes outside a sample's lattice and
 * samples with out-of-range lengths are skipped (nothing read, nothing written); an
 * out-of-range label is never used as an index (lp_label is set to NaN; the sweep then marks
 * the sample bad).
 *
 * Precision: the V-wide sums in float32 for float32/float16/bfloat16 (as tdt.h promises), in
 * float64 for float64; lse and everything stored is float64. The terms of the float types are
 * base-2 exponentials (tdt_rexp2 in gpu_common.cuh: about 2 ulp a term, as expf), float64 keeps
 * exp(). Rows with a float value beyond 1e7 in magnitude are summed again in natural units
 * (row_lse_nat; rare, so never a second pass in practice). Deterministic: the lane split, the
 * batch order and the reduction tree depend only on V, the row's alignment and the problem's
 * padded node count (G), not on timing.
 *
 * Limits: none on V, T, U or B beyond memory; every offset is int64. D <= TDT_MAX_DURATIONS.
 */
#include <string.h>

#include "gpu_common.cuh"

namespace {

const int kThreads = 256;

/* 16-byte loads in flight per lane before they are consumed (a batch), per element type: the
 * knob to tune on the device. float32 takes 8 (H200: the memory-order normaliser 845 -> 808 us at
 * large, 79 registers). Registers (sm_90, no spills): float32 80, 16-bit types 80, float64 112. */
template <int DT> struct norm_tuning {
    enum { UNROLL = DT == TDT_DTYPE_FLOAT32 ? 8 : 4 };
};

/* A batch of values as loaded (raw elements, converted where used, so a 16-bit batch costs
 * its raw registers only): NV 16-byte vectors, or one scalar (NV = 0). */
template <int DT, int NV> struct batch {
    enum { N = NV * tdt_elem<DT>::VEC };
    tdt_vec<DT> v[NV];
    __device__ __forceinline__ typename tdt_elem<DT>::Acc at(int j) const {
        return tdt_elem<DT>::to_acc(v[j / tdt_elem<DT>::VEC].v[j % tdt_elem<DT>::VEC]);
    }
};
template <int DT> struct batch<DT, 0> {
    enum { N = 1 };
    typename tdt_elem<DT>::T x;
    __device__ __forceinline__ typename tdt_elem<DT>::Acc at(int) const { return tdt_elem<DT>::to_acc(x); }
};

/* log sum_v exp z[v] over one row of V elements, the G lanes of a group together, in the
 * type's fast units: a scalar head up to the row's first 16-byte boundary and a scalar tail
 * (taken together, one element a lane at a time), and between them 16-byte vectors, kUnroll of
 * them a batch per lane. zb = z[blank], the lanes' common first reference. Returns the lse and
 * sets *huge (group-uniform) when the row needs tdt_rexp_nat. */
template <int DT, int G>
__device__ double row_lse_fast(const typename tdt_elem<DT>::T *z, int64_t V, typename tdt_elem<DT>::Acc zb,
                               int lane, unsigned mask, int *huge) {
    typedef tdt_elem<DT> E;
    typedef typename E::T T;
    typedef typename E::Acc Acc;
    typedef typename tdt_rexp_fast<DT>::X X;
    const int VEC = E::VEC;
    const int kUnroll = norm_tuning<DT>::UNROLL;
    lse_lane<X> st;
    st.r = X::fits((double)zb) ? X::ref(zb) : -(Acc)INFINITY; /* else the slow path decides */
    st.s = (Acc)0;
    st.huge = 0;

    const int64_t head = tdt_row_head<T>(z, V);
    const int64_t nvec = (V - head) / VEC;
    const int64_t tail = head + nvec * VEC;
    /* This lane's vectors: lane, lane + G, ...; full batches of kUnroll, then one at a time. */
    const int64_t mine = lane < nvec ? (nvec - 1 - lane) / G + 1 : 0;
    /* The scalar head and tail loaded before the vectors, added after them as before (same
     * order, same bits): tdt_row_scalars. */
    const int64_t nscalar = head + (V - tail);
    tdt_row_scalars<T, VEC, G> pre;
    pre.load(z, head, tail, nscalar, lane);
    const T *p = z + head + (int64_t)lane * VEC;
    for (int64_t m = mine / kUnroll; m > 0; --m) {
        batch<DT, kUnroll> x;
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) x.v[j] = tdt_vec<DT>::load(p + j * G * VEC);
        lse_add<X>(st, x);
        p += kUnroll * G * VEC;
    }
    for (int64_t m = mine % kUnroll; m > 0; --m) {
        batch<DT, 1> x;
        x.v[0] = tdt_vec<DT>::load(p);
        lse_add<X>(st, x);
        p += G * VEC;
    }
#pragma unroll
    for (int i = 0; i < pre.N; ++i) {
        if (lane + (int64_t)i * G < nscalar) {
            batch<DT, 0> x;
            x.x = pre.v[i];
            lse_add<X>(st, x);
        }
    }
    for (int64_t k = lane + (int64_t)pre.N * G; k < nscalar; k += G) {
        batch<DT, 0> x;
        x.x = z[tdt_row_scalar_at(k, head, tail)];
        lse_add<X>(st, x);
    }
    *huge = X::MAY_OVERFLOW ? __any_sync(mask, st.huge) : 0;
    return lse_group<X, G>(st, mask);
}

/* The same sum in natural units, one element a lane at a time: only for the rows that
 * row_lse_fast cannot hold (float32 / bfloat16 values beyond 1e7, see tdt_rexp2::fits). */
template <int DT, int G>
__device__ __noinline__ double row_lse_nat(const typename tdt_elem<DT>::T *z, int64_t V, int lane,
                                           unsigned mask) {
    typedef tdt_elem<DT> E;
    typedef typename E::Acc Acc;
    typedef tdt_rexp_nat<DT> X;
    lse_lane<X> st = {-(Acc)INFINITY, (Acc)0, 0};
    for (int64_t k = lane; k < V; k += G) {
        batch<DT, 0> x;
        x.x = z[k];
        lse_add<X>(st, x);
    }
    return lse_group<X, G>(st, mask);
}

/* The duration row's log-softmax into out[0 .. D) (D <= TDT_MAX_DURATIONS; with log-prob
 * inputs the values as they are), the G lanes of a group together: lane l reads h[k] for
 * k = l, l + G, ... and takes its exp, and every lane takes the max and the sum over k
 * ascending from the group's shuffles. These are tdt_log_softmax_small's operations in its
 * order, so the same bits as one lane running it, but the exps run on their own lanes at once
 * rather than one after another, and no array indexed at run time goes to local memory. */
template <int DT, int G>
__device__ __forceinline__ void dur_log_softmax(const typename tdt_elem<DT>::T *h, int D, bool log_probs,
                                                double *out, int lane, unsigned mask) {
    typedef tdt_elem<DT> E;
    if (log_probs) {
        for (int k = lane; k < D; k += G) out[k] = (double)E::to_acc(h[k]);
        return;
    }
    double m = -TDT_INF, sum = 0.0;
    for (int c = 0; c < D; c += G) { /* group-uniform */
        const double x = c + lane < D ? (double)E::to_acc(h[c + lane]) : 0.0;
        const int n = D - c < G ? D - c : G;
        for (int j = 0; j < n; ++j) m = tdt_lse_max(m, __shfl_sync(mask, x, j, G));
    }
    for (int c = 0; c < D; c += G) {
        const double e = c + lane < D ? exp((double)E::to_acc(h[c + lane]) - m) : 0.0;
        const int n = D - c < G ? D - c : G;
        for (int j = 0; j < n; ++j) sum += __shfl_sync(mask, e, j, G);
    }
    const double lse = tdt_lse_finish(m, sum);
    for (int k = lane; k < D; k += G) out[k] = (double)E::to_acc(h[k]) - lse;
}

/* Node (b, t, u) of a sample with U_b = Ub, inside its lattice: its row's lse, the blank and
 * label log-probabilities and the duration log-softmax, into the workspace. The G lanes of a
 * group together (mask); lane 0 writes the token values, lane l the durations k = l, l + G, ...
 * (dur_log_softmax). */
template <int DT, int G>
__device__ __forceinline__ void normalize_node(const tdt_gpu_args_t &a, int64_t b, int64_t t,
                                               int64_t u, int64_t Ub, int lane, unsigned mask) {
    typedef tdt_elem<DT> E;
    typedef typename E::T T;
    typedef typename E::Acc Acc;
    const T *tok = static_cast<const T *>(a.tok);
    const T *dur = static_cast<const T *>(a.dur);
    const int D = a.D;
    const T *z = tok + tdt_row_offset(a.tok_s, b, t, u);
    /* Issued before the row so their latency hides behind it (y: u == U_b has no label). */
    const Acc zb = E::to_acc(z[a.blank]);
    const int32_t y = u < Ub ? a.labels[b * a.maxU + u] : -1;
    /* The duration row, read after the token row: asked into L1 now by one lane (no register
     * held), so its loads are not one more memory round trip at the node's end. */
    const T *h = D > 0 ? dur + tdt_row_offset(a.dur_s, b, t, u) : NULL;
    if (D > 0 && lane == (G > 1 ? 1 : 0)) {
        tdt_prefetch_l1(h);
        tdt_prefetch_l1(h + (D - 1));
    }
    double lse = 0.0;
    if (!a.log_probs) {
        int huge;
        lse = row_lse_fast<DT, G>(z, a.V, zb, lane, mask, &huge);
        if (huge) lse = row_lse_nat<DT, G>(z, a.V, lane, mask); /* group-uniform, rare */
    }
    double *const w = tdt_wblock(&a.wb, b, t, u); /* the node's block (workspace.h) */
    if (lane == 0) {
        w[tdt_w_lse(D)] = lse;
        w[TDT_W_BLANK] = (double)zb - lse - a.sigma;
        double lpl = -TDT_INF; /* u == U_b: no label arc leaves this row */
        if (u < Ub)
            lpl = (y >= 0 && y < a.V && y != a.blank)
                      ? (double)E::to_acc(z[y]) - lse - a.sigma
                      : (double)NAN; /* bad label: never indexed; the sweep flags it */
        w[TDT_W_LABEL] = lpl;
    }
    if (D > 0) dur_log_softmax<DT, G>(h, D, a.log_probs, w + TDT_W_DUR, lane, mask);
}

template <int DT, int G>
__global__ void __launch_bounds__(kThreads) normalize_kernel(const tdt_gpu_args_t a) {
    const int lane = threadIdx.x & (G - 1);
    const unsigned mask = tdt_group_mask<G>();
    const int64_t groups = (int64_t)gridDim.x * (kThreads / G);
    if (threadIdx.x == 0) tdt_tl_start(a.tl, TDT_TL_NORM);

    for (int64_t n = (int64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; n < a.nodes;
         n += groups) {
        int64_t b, t, u, Tb, Ub;
        tdt_decode_node(a, n, &b, &t, &u);
        if (!tdt_sample_lengths(a, b, &Tb, &Ub) || t >= Tb || u > Ub) continue; /* group-uniform */
        normalize_node<DT, G>(a, b, t, u, Ub, lane, mask);
    }
    if (threadIdx.x == 0) tdt_tl_end(a.tl, TDT_TL_NORM + 1);
}

/* Block-wide (every thread; the loop is block-uniform): tdt_ticket_loop with tickets of the
 * whole block, PER = THREADS / G consecutive slots (q: this thread's group's), and done(k) on
 * thread 0 after the barrier that ends the ticket. Thread 0 takes the next ticket while the
 * block works on the current one; it reaches the others through ticket[], double-buffered (a
 * slot is rewritten two barriers after it was read). Fewer, larger tickets finish a layer in
 * fewer pieces than the warp loop's, each layer sooner after its start (H200, docs/performance.md, "Schedules");
 * the warps of a block wait for its slowest group at every ticket. */
template <int G, int PER, typename Body, typename Done>
__device__ __forceinline__ void block_ticket_loop(int32_t *next, int total, int tpl, Body body,
                                                  Done done) {
    __shared__ int ticket[2];
    if (threadIdx.x == 0) ticket[0] = atomicAdd(next, 1);
    __syncthreads();
    int tk = ticket[0];
    for (int it = 1; tk < total; ++it) {
        int nxt = 0;
        if (threadIdx.x == 0) nxt = atomicAdd(next, 1); /* in flight during this ticket */
        const int k = tk / tpl;
        body(k, (int64_t)(tk - k * tpl) * PER + threadIdx.x / G);
        if (threadIdx.x == 0) ticket[it & 1] = nxt;
        __syncthreads(); /* the ticket's values all written; the next ticket published */
        if (threadIdx.x == 0) done(k);
        tk = ticket[it & 1];
    }
}

/* The same work in the order the sweeps consume it, for a forward whose sweep runs concurrently
 * (sweep.cuh, "The overlapped schedules"): layer k is diagonal k of every sample b (a.fwd_ends
 * 1: the alpha sweep alone trails it) or diagonals k and S_b - 1 - k (2: alpha and beta), the
 * ones the sweeps reach at their step k (tdt_layer_node). Work comes in tickets, taken in order
 * from a counter (order[0]), a warp at a time (tdt_ticket_loop: 32 / G node slots) or, with
 * a.fwd_block_tickets, a block at a time (block_ticket_loop: THREADS / G slots): ticket i is
 * chunk i mod tpl of layer i / tpl; a slot without a node does nothing. Once a ticket's nodes
 * are written, one thread adds it to its layer's count (order[1 + k]), after a fence: the sweep
 * reads a layer once its count reaches tpl. The blocks wait on nothing but their own barriers,
 * and each starts by letting its programmatic dependent (the sweep) launch. */
template <int DT, int G>
__global__ void __launch_bounds__(tdt_norm_ordered<DT>::THREADS, 1)
    normalize_ordered_kernel(const tdt_gpu_args_t a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    if (threadIdx.x == 0) tdt_tl_start(a.tl, TDT_TL_NORM);
    const int lane = threadIdx.x & (G - 1);
    const unsigned mask = tdt_group_mask<G>();
    const int ends = a.fwd_ends;
    const int64_t slots = ends * a.B * a.fwd_dlen; /* a layer's */
    int32_t *done = a.ws.order + 1;
    const int total = (int)a.fwd_layers * a.fwd_tickets; /* fits: overlap_plan */
    const auto body = [&](int64_t k, int64_t q) {
        int64_t b, t, u, Ub;
        if (q < slots && tdt_layer_node(a, k, q, ends, 0, &b, &t, &u, &Ub)) /* group-uniform */
            normalize_node<DT, G>(a, b, t, u, Ub, lane, mask);
    };
    const auto count = [&](int k) {
        __threadfence(); /* with the barrier (__syncwarp): the values before the count */
        atomicAdd(done + k, 1);
    };
    if (a.fwd_block_tickets)
        block_ticket_loop<G, tdt_norm_ordered<DT>::THREADS / G>(a.ws.order, total, a.fwd_tickets,
                                                                body, count);
    else
        tdt_ticket_loop<G>(a.ws.order, total, a.fwd_tickets, body, count);
    if (threadIdx.x == 0) tdt_tl_end(a.tl, TDT_TL_NORM + 1);
}

template <int DT, int G>
cudaError_t launch(const tdt_gpu_args_t &a, int num_sms, cudaStream_t stream) {
    const int64_t per_block = kThreads / G;
    int64_t blocks = (a.nodes + per_block - 1) / per_block;
    const int64_t cap = (int64_t)num_sms * 32; /* grid-stride beyond a few waves */
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    normalize_kernel<DT, G><<<(unsigned)blocks, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

/* The ordered kernel, as the sweep's programmatic primary: `blocks` blocks, in clusters of `cl`
 * (cl > 1: so the SMs it leaves free make whole clusters for the sweep's cluster split). */
template <int DT, int G>
cudaError_t launch_ordered(const tdt_gpu_args_t &a, int blocks, int cl, cudaStream_t stream) {
    void (*kernel)(const tdt_gpu_args_t) = normalize_ordered_kernel<DT, G>;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)blocks, 1, 1);
    cfg.blockDim = dim3(tdt_norm_ordered<DT>::THREADS, 1, 1);
    cfg.stream = stream;
    cudaLaunchAttribute attr = tdt_cluster_attr(cl);
    if (cl > 1) {
        cudaError_t e = tdt_allow_cluster(kernel, cl);
        if (e != cudaSuccess) return e;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
    }
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, a);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

/* How many blocks of the ordered kernel fit an SM (cl <= 1), or how many clusters of cl of them
 * the device holds at once (0 where none, or before sm_90), as CUDA answers it (ordered_fit:
 * the answer kept). */
template <int DT, int G> cudaError_t ordered_fit_asked(int cl, int *fit) {
    void (*kernel)(const tdt_gpu_args_t) = normalize_ordered_kernel<DT, G>;
    *fit = 0;
    if (cl <= 1) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(fit, kernel, tdt_norm_ordered<DT>::THREADS, 0);
    if (tdt_allow_cluster(kernel, cl) != cudaSuccess) {
        (void)cudaGetLastError();
        return cudaSuccess;
    }
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)cl, 1, 1);
    cfg.blockDim = dim3(tdt_norm_ordered<DT>::THREADS, 1, 1);
    cudaLaunchAttribute attr = tdt_cluster_attr(cl);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(fit, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        *fit = 0;
    }
    return cudaSuccess;
}

/* ordered_fit_asked's answer for `device`, the current device, kept (tdt_kept). */
template <int DT, int G> cudaError_t ordered_fit(int cl, int device, int *fit) {
    return tdt_kept((const void *)normalize_ordered_kernel<DT, G>, cl, device, fit,
                    [&](int *v) { return ordered_fit_asked<DT, G>(cl, v); });
}

struct classic_launch {
    const tdt_gpu_args_t &a;
    int num_sms;
    cudaStream_t stream;
    template <int DT, int G> cudaError_t go() const { return launch<DT, G>(a, num_sms, stream); }
};
struct ordered_launch {
    const tdt_gpu_args_t &a;
    int blocks, cl;
    cudaStream_t stream;
    template <int DT, int G> cudaError_t go() const { return launch_ordered<DT, G>(a, blocks, cl, stream); }
};
struct ordered_fitting {
    int cl, device;
    int *fit;
    template <int DT, int G> cudaError_t go() const { return ordered_fit<DT, G>(cl, device, fit); }
};

} /* namespace */

/* ================================================================================================
 * launcher
 * ============================================================================================== */

cudaError_t tdt_normalize_ordered_fit(int64_t V, int64_t nodes, tdt_dtype_t dtype, int cl, int device,
                                      int *fit) {
    return tdt_with_dtype<TDT_PASS_NORM>(dtype, V, nodes, ordered_fitting{cl, device, fit});
}

cudaError_t tdt_launch_normalize(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                                 cudaStream_t stream) {
    if (a.nodes == 0) return cudaSuccess;
    return tdt_with_dtype<TDT_PASS_NORM>(dtype, a.V, a.nodes, classic_launch{a, num_sms, stream});
}

cudaError_t tdt_launch_normalize_ordered(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                         int cl, cudaStream_t stream) {
    return tdt_with_dtype<TDT_PASS_NORM>(dtype, a.V, a.nodes, ordered_launch{a, blocks, cl, stream});
}
