/*
 * sweep.cuh - the alpha and beta sweeps over anti-diagonals, the log-likelihood and the cost
 * (forward pass, second kernel).
 *
 * Math (docs/math.md, section 2, "Forward and backward variables"): per sample, with the per-node
 * log-probabilities the normaliser left in the workspace,
 *     alpha(t,u) = logsumexp over slots j of tdt_alpha_slot_term(j)   alpha(0,0) = 0
 *     beta(t,u)  = logsumexp over slots j of tdt_beta_slot_term(j)    terminal arcs end at 0
 *     LL         = tdt_log_likelihood(...),   cost = tdt_cost(LL) = -(1 + fastemit_lambda) * LL
 * with the slot functions of src/common/lattice.h that the CPU backend's tdt_sweep_chunk loops
 * over (a slot is one arc of a node: 2 * D of them for TDT, 2 for RNN-T).
 * Every arc advances t + u by at least one and by at most span = max(blank duration, label
 * duration + 1), so all nodes of anti-diagonal s = t + u depend only on diagonals
 * s - span .. s - 1 (alpha) or s + 1 .. s + span (beta).
 *
 * Parallel mapping: one thread block per (sample, direction): block 2b sweeps alpha of sample
 * b, block 2b + 1 beta, so the two sweeps of a sample run concurrently on different SMs and
 * B samples give 2B independent blocks. Inside a block the loop runs over the T_b + U_b
 * diagonals in order, one __syncthreads() per diagonal. A node belongs to a group of G lanes
 * (G = 8, 4, 2 or 1, from the longest diagonal: sweep_choose; 8 in the staged kernel only, for
 * diagonals of at most 32 nodes):
 * lane l computes the terms of slots l, l + G, ..., their max and sum of exps are reduced over
 * the group by xor shuffles, and one log finishes the node. So a node's ~10 float64 exps and
 * its index arithmetic run side by side on G lanes instead of one after another on one thread
 * (the latency of a diagonal, which is what a sweep is made of, drops about G-fold, plus
 * log2 G shuffle steps). Group g owns node lo + g of each diagonal (and lo + g + k * blockDim/G
 * for diagonals longer than one pass: U is not capped).
 *
 * Four kernels, by how much of a diagonal fits in a block's shared memory (sweep_launch):
 *  - sweep_staged_kernel (the default; section "The staged sweep" below): a ring of the last
 *    few diagonals holding both the values and the normaliser's per-node weights, copied in
 *    asynchronously ahead of use, so a step's operands are all in shared memory;
 *  - sweep_cluster_kernel, the same for diagonals of more than 128 nodes (long utterances):
 *    each (sample, direction) is split over a thread-block cluster of up to 16 blocks, each
 *    owning a range of columns u, stepping through the diagonals together with one cluster
 *    barrier a diagonal; the one value a label arc carries across a block boundary goes into
 *    the neighbour's shared memory (distributed shared memory), so instead of one SM working
 *    through 400-node diagonals, 16 SMs each take 26 nodes;
 *  - sweep_kernel with RING = true, for rows too long for that (maxU beyond ~450 with
 *    durations 0..4): the values alone in the ring, the weights prefetched into registers one
 *    diagonal ahead (what follows describes this kernel);
 *  - sweep_kernel with RING = false, beyond ~3600: the workspace array itself, one lane a node.
 * The two staged kernels can also run alongside the normaliser, each sweep a few layers of
 * diagonals behind it, where their blocks leave most SMs to it ("The overlapped schedules").
 *
 * Per diagonal, the critical path holds no global-memory load:
 *  - the alphas (betas) of the last R diagonals live in a ring in shared memory, R the power of
 *    two above span (8 for durations up to 4+1, 2 for RNN-T); each value is also written
 *    through to the workspace for the gradient pass. Where R * (maxU + 1) doubles do not fit in
 *    a block's shared memory the ring is the workspace array itself (RING = false: another view
 *    of the same code, one lane a node);
 *  - the arc weights of a lane's slots on the next diagonal (the normaliser's output, known
 *    before the sweep starts) are loaded into registers before the current diagonal's
 *    arithmetic, so their latency hides behind it;
 *  - the workspace's per-node arrays are diagonal-major (lattice.h, tdt_node_index), so those
 *    loads and the write-through are contiguous across the groups of a diagonal.
 *
 * Race-free: on one diagonal every node has one writer (lane 0 of its group) and reads only
 * nodes of other diagonals, written before an earlier barrier. The ring slot written at
 * diagonal s (s mod R) last held diagonal s - R (alpha) or s + R (beta), which no node of s
 * reads since R > span (absent arcs read nothing; groups past the end of a diagonal store
 * nothing). A
 * barrier also makes a block's global writes visible to the whole block (the log-likelihood
 * reads the workspace alphas after the last one). Alpha and beta blocks write disjoint arrays;
 * only the alpha block writes ll, state and the cost. Bad device data (a length or label out of
 * range) is found first, by both blocks alike (__syncthreads_or over the labels), before any
 * lattice index is formed: such a sample gets state BAD_DATA, LL NaN and cost NaN, and nothing
 * of it is swept.
 *
 * Precision: float64 throughout (lattice.h), for every dtype: log-probabilities of long
 * utterances sum to thousands, and float32 alphas would lose the gradient's occupancies.
 * Deterministic: a node's terms, max and sum are formed in one fixed order for a given launch
 * shape (the butterfly gives every lane of a group the same bits); the CPU sums a node's slots
 * in a line, so the backends may differ in the last bits of a node.
 *
 * Limits: sequential in T_b + U_b (the dependency chain itself); up to 512 threads per block;
 * the shared-memory ring when R * (maxU + 1) * 8 bytes fit the device's per-block opt-in limit
 * (227 KiB on Hopper: maxU up to ~3600 with TDT durations up to 6, ~14500 for RNN-T).
 */
#ifndef TDT_GPU_SWEEP_CUH
#define TDT_GPU_SWEEP_CUH

#include <stdlib.h>
#include <string.h>

#include "gpu_common.cuh"

namespace {

/* Up to 512 threads a block leave 128 registers a thread: a lane's slot terms, their weights
 * for this diagonal and the next one's in flight, without spills for one node a lane group
 * (10 slots, G = 1, is the largest case of durations 0..4). */
const int kMaxThreads = 512;

/* Arc slots per lane for arc count KD (0: any count up to TDT_MAX_DURATIONS) and G lanes a
 * node. */
template <int KD, int G> struct sweep_shape {
    enum { SLOTS = KD > 0 ? 2 * KD : 2 * TDT_MAX_DURATIONS, SPL = (SLOTS + G - 1) / G };
};

/* Max and sum over the G lanes of a group (xor butterflies inside each G-aligned lane segment;
 * every lane of the warp takes part, so the full mask). Each step combines a lane's value with
 * its partner's in an order-free way (NaN-keeping max; a + b == b + a), so all lanes of a
 * group end with the same bits. */
template <int G> __device__ __forceinline__ double group_max(double m) {
#pragma unroll
    for (int o = G / 2; o > 0; o /= 2) m = tdt_lse_max(m, __shfl_xor_sync(0xffffffffu, m, o, G));
    return m;
}
template <int G> __device__ __forceinline__ double group_sum(double x) {
#pragma unroll
    for (int o = G / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o, G);
    return x;
}

/* The sweeps' exp (of x - max <= 0) and log (of a sum of exps >= 1): lattice.h's table forms
 * (tdt_exp_le0_tab, tdt_log_ge1_tab), their table in shared memory, where each lane's lookups
 * are one load. Every sweep kernel copies it there first (lse_tab_load), before the barrier
 * that starts its first job (tdt_sweep_bad_sample), and the launchers leave room for it
 * (sweep_choose). Branch-free: a warp whose lanes mix absent arcs (-inf) and present ones runs
 * one path. H200 (tdt_sweep_step, 4 lanes a node): the staged step
 * 0.908 -> 0.836 us a diagonal at base, 0.956 -> 0.872 at parakeet, against the Taylor exp of
 * degree 13 and the atanh series of degree 23 these replace. */
__device__ const double c_lse_tab[TDT_LSE_TAB_N] = TDT_LSE_TAB;
__shared__ double s_lse_tab[TDT_LSE_TAB_N];
const size_t kLseTabBytes = TDT_LSE_TAB_N * sizeof(double);

__device__ __forceinline__ void lse_tab_load() {
    for (int i = threadIdx.x; i < TDT_LSE_TAB_N; i += blockDim.x) s_lse_tab[i] = c_lse_tab[i];
}
__device__ __forceinline__ double exp_le0(double x) { return tdt_exp_le0_tab(x, s_lse_tab); }
__device__ __forceinline__ double log_ge1(double x) { return tdt_log_ge1_tab(x, s_lse_tab); }

/* A lane's share of the arcs: its SPL slots (slot lane + i * G), and their weights. */
template <int SPL> struct lane_slots {
    tdt_slot_t q[SPL];
};
template <int SPL> struct slot_weights {
    double lp[SPL], dur[SPL];
};

/* Where a sweep keeps its values: X (read view) and xw (the same memory, written) are the ring
 * or the workspace array; glob is the workspace array to write through to, or NULL when X is
 * the workspace array already. */
struct sweep_store {
    tdt_diag_view_t X;
    double *xw;
    double *glob;
};

template <bool BETA, int SPL>
__device__ __forceinline__ void gather(const tdt_lattice_t &L, const tdt_arcs_t &A,
                                       const lane_slots<SPL> &sl, int64_t t, int64_t u,
                                       slot_weights<SPL> &w) {
#pragma unroll
    for (int i = 0; i < SPL; ++i) {
        if (BETA)
            tdt_beta_slot_weight(&L, &A, &sl.q[i], t, u, &w.lp[i], &w.dur[i]);
        else
            tdt_alpha_slot_weight(&L, &A, &sl.q[i], t, u, &w.lp[i], &w.dur[i]);
    }
}

/* The log-sum-exp of a node's terms, spread over its group: each lane's terms x (-inf for
 * absent arcs), the group's max, each lane's sum of exps, the group's sum, one log. Every lane
 * returns the same value. */
template <bool BETA, int SPL, int G>
__device__ __forceinline__ double group_lse(const double (&x)[SPL], int64_t t, int64_t u) {
    double m = -TDT_INF, sum = 0.0;
#pragma unroll
    for (int i = 0; i < SPL; ++i) m = tdt_lse_max(m, x[i]);
    m = group_max<G>(m);
#pragma unroll
    for (int i = 0; i < SPL; ++i) sum += exp_le0(x[i] - m);
    const double r = tdt_lse_finish_log(m, log_ge1(group_sum<G>(sum)));
    return BETA ? r : tdt_alpha_start(t, u, r);
}

/* alpha (beta) of node (t, u) from its group, the terms read through X (ring or workspace). */
template <bool BETA, int SPL, int G>
__device__ __forceinline__ double node_value(const tdt_lattice_t &L, const tdt_diag_view_t &X,
                                             const lane_slots<SPL> &sl, int64_t t, int64_t u,
                                             const slot_weights<SPL> &w) {
    double x[SPL];
#pragma unroll
    for (int i = 0; i < SPL; ++i)
        x[i] = BETA ? tdt_beta_slot_term(&L, &X, &sl.q[i], t, u, w.lp[i], w.dur[i])
                    : tdt_alpha_slot_term(&L, &X, &sl.q[i], t, u, w.lp[i], w.dur[i]);
    return group_lse<BETA, SPL, G>(x, t, u);
}

/* Diagonal s. Group g = threadIdx.x / G owns nodes lo + g + j * (blockDim / G); the weights of
 * its first node were gathered one step earlier (cur), and those of its first node on
 * diagonal s_next (-1: none) are loaded into nxt first: nothing consumes those loads before
 * the next step, so they are in flight during this diagonal's arithmetic. Groups past the end
 * of the diagonal compute its last node again and store nothing, so every lane of the block
 * runs the same passes (the shuffles see full warps). Further passes (diagonals longer than
 * blockDim / G nodes) gather in place. Ends with the diagonal's barrier. */
template <bool BETA, int SPL, int G>
__device__ __forceinline__ void sweep_diagonal(const tdt_lattice_t &L, const tdt_arcs_t &A,
                                               const lane_slots<SPL> &sl, const sweep_store &st,
                                               int64_t s, int64_t s_next,
                                               const slot_weights<SPL> &cur,
                                               slot_weights<SPL> &nxt) {
    const int64_t g = threadIdx.x / G, ng = blockDim.x / G;
    const bool writer = threadIdx.x % G == 0;
    int64_t lo, hi;
    if (s_next >= 0) {
        tdt_diagonal_range(&L, s_next, &lo, &hi);
        const int64_t u = min(lo + g, hi);
        gather<BETA, SPL>(L, A, sl, s_next - u, u, nxt);
    }
    tdt_diagonal_range(&L, s, &lo, &hi);
    for (int64_t first = lo; first <= hi; first += ng) { /* block-uniform */
        const int64_t u = min(first + g, hi);
        double v;
        if (first == lo) {
            v = node_value<BETA, SPL, G>(L, st.X, sl, s - u, u, cur);
        } else {
            slot_weights<SPL> w;
            gather<BETA, SPL>(L, A, sl, s - u, u, w);
            v = node_value<BETA, SPL, G>(L, st.X, sl, s - u, u, w);
        }
        if (writer && first + g <= hi) {
            st.xw[tdt_view_index(&L, &st.X, s, u)] = v;
            if (st.glob) st.glob[tdt_node_index(L.frames, L.row, s - u, u)] = v;
        }
    }
    __syncthreads();
}

/* The whole sweep of one sample in one direction (block-uniform control flow). */
template <bool BETA, int SPL, int G>
__device__ __forceinline__ void sweep(const tdt_lattice_t &L, const tdt_arcs_t &A,
                                      const lane_slots<SPL> &sl, const sweep_store &st) {
    const int64_t S = tdt_num_diagonals(&L);
    if (S == 0) return;
    const int64_t s0 = BETA ? S - 1 : 0, step = BETA ? -1 : 1;
    slot_weights<SPL> cur, nxt;
    {
        int64_t lo, hi;
        tdt_diagonal_range(&L, s0, &lo, &hi);
        const int64_t u = min(lo + (int64_t)(threadIdx.x / G), hi);
        gather<BETA, SPL>(L, A, sl, s0 - u, u, cur);
    }
    for (int64_t i = 0; i < S; ++i) {
        const int64_t s = s0 + step * i;
        sweep_diagonal<BETA, SPL, G>(L, A, sl, st, s, i + 1 < S ? s + step : -1, cur, nxt);
        cur = nxt;
    }
}

/* Block-wide: whether sample b has bad device data (a length or a label out of range), found
 * before any lattice index is formed; else its lengths in *T, *U. The barrier also ends the
 * previous job's ring reads. */
__device__ __forceinline__ int tdt_sweep_bad_sample(const tdt_gpu_args_t &a, int64_t b,
                                                    int64_t *T, int64_t *U) {
    int bad = !tdt_sample_lengths(a, b, T, U);
    if (!bad) {
        for (int64_t i = threadIdx.x; i < *U; i += blockDim.x) {
            const int32_t l = a.labels[b * a.maxU + i];
            if (l < 0 || l >= a.V || l == a.blank) bad = 1;
        }
    }
    return __syncthreads_or(bad);
}

/* A sample with bad device data: state BAD_DATA, LL and cost
 * NaN; nothing of it is swept. */
__device__ __forceinline__ void tdt_sweep_mark_bad(const tdt_gpu_args_t &a, int64_t b) {
    a.ws.state[b] = TDT_GPU_STATE_BAD_DATA;
    a.ws.ll[b] = (double)NAN;
    if (a.acc_double)
        static_cast<double *>(a.costs)[b] = (double)NAN;
    else
        static_cast<float *>(a.costs)[b] = (float)NAN;
}

/* After sample b's alpha sweep (its alphas in the workspace, visible to the block): LL, state
 * and cost. */
__device__ __forceinline__ void tdt_sweep_finish(const tdt_gpu_args_t &a, int64_t b,
                                                 const tdt_lattice_t &L, const tdt_arcs_t &A,
                                                 const double *alpha) {
    const double ll = tdt_log_likelihood(&L, &A, alpha);  /* -inf when T == 0 */
    const double cost = tdt_cost(ll, a.fastemit_lambda, a.normalize_costs, a.acc_double,
                                 L.U); /* +inf when infeasible */
    a.ws.ll[b] = ll;
    a.ws.state[b] = TDT_GPU_STATE_OK;
    if (a.acc_double)
        static_cast<double *>(a.costs)[b] = cost;
    else
        static_cast<float *>(a.costs)[b] = (float)cost;
}

/* Block-wide: runs body(b, is_beta, L, out) for each (sample, direction) job of this block,
 * out the sample's workspace alpha or beta array; a sample with bad device data is marked and
 * skipped (tdt_sweep_bad_sample). lead: this block's thread 0 is the one that writes an alpha
 * job's cost (in body, tdt_sweep_finish, or here for bad data); it then counts the cost for
 * options.reduction (tdt_cost_counted). A cluster's other blocks pass false. */
template <typename Body>
__device__ __forceinline__ void tdt_sweep_jobs(const tdt_gpu_args_t &a, int64_t first,
                                               int64_t stride, Body body, bool lead = true) {
    const int only = a.sweep_only; /* 1: alpha jobs only, 2: beta only */
    for (int64_t job = first; job < (only ? 1 : 2) * a.B; job += stride) { /* block-uniform */
        const int64_t b = only ? job : job >> 1;
        const int is_beta = only ? only == 2 : (int)(job & 1);
        int64_t T, U;
        if (tdt_sweep_bad_sample(a, b, &T, &U)) {
            if (!is_beta && threadIdx.x == 0) tdt_sweep_mark_bad(a, b);
        } else {
            /* the fused schedule's gradient pass reads the state before alpha ends (after an
             * acquire of alpha's count, whose release follows this store) */
            if (!is_beta && a.fus_alpha && threadIdx.x == 0) a.ws.state[b] = TDT_GPU_STATE_OK;
            const tdt_lattice_t L = tdt_sample_lattice(a, b, T, U);
            body(b, is_beta, L,
                 (is_beta ? a.ws.beta : a.ws.alpha) + tdt_sample_offset(b, a.maxT, a.row));
        }
        int32_t *const progress = is_beta ? a.bwd_progress : a.fus_alpha;
        if (progress) {
            /* the split backward's beta, the fused schedule's alpha and beta: sample b's values
             * all written (the body's last barrier; or bad data, state BAD_DATA written first):
             * its last count */
            __syncthreads();
            if (threadIdx.x == 0) tdt_st_release(progress + b, INT_MAX); /* fences itself */
        }
        /* after the release: the gradient pass waits for that, not for the count */
        if (!is_beta && lead && threadIdx.x == 0) tdt_cost_counted(a);
    }
}
template <typename Body>
__device__ __forceinline__ void tdt_sweep_jobs(const tdt_gpu_args_t &a, Body body) {
    tdt_sweep_jobs(a, blockIdx.x, gridDim.x, body); /* a job a block */
}

template <int KD, int G, bool RING>
__global__ void __launch_bounds__(kMaxThreads, 1) sweep_kernel(const tdt_gpu_args_t a, int ring_diags) {
    extern __shared__ double ring[];
    enum { SPL = sweep_shape<KD, G>::SPL };
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    const int tid = threadIdx.x;
    lane_slots<SPL> sl;
#pragma unroll
    for (int i = 0; i < SPL; ++i) sl.q[i] = tdt_slot_of(&a.arcs, tid % G + i * G);
    if (tid == 0) tdt_tl_start(a.tl, TDT_TL_SWEEP);
    lse_tab_load(); /* read after tdt_sweep_jobs's first barrier */

    tdt_sweep_jobs(a, [&](int64_t b, int is_beta, const tdt_lattice_t &L, double *g) {
        sweep_store st;
        if (RING) {
            st.X.v = ring;
            st.X.ring_mask = (int64_t)(uint32_t)(ring_diags - 1); /* visibly >= 0: no diag_row */
            st.xw = ring;
            st.glob = g;
        } else {
            st.X.v = g;
            st.X.ring_mask = -1;
            st.xw = g;
            st.glob = NULL;
        }
        if (!is_beta) {
            sweep<false, SPL, G>(L, A, sl, st);
            if (tid == 0) tdt_sweep_finish(a, b, L, A, g);
        } else {
            sweep<true, SPL, G>(L, A, sl, st);
        }
    });
    if (tid == 0) tdt_tl_end(a.tl, TDT_TL_SWEEP + 1);
}

/* ================================================================================================
 * The staged sweep (the default wherever its shared memory fits: see sweep_launch)
 *
 * The same recurrence, node mapping and lane groups as sweep_kernel, with every operand of a
 * diagonal's arithmetic in shared memory. The ring keeps, for each of its R diagonals, F
 * fields of row doubles: the sweep's own values (alpha or beta, field 0), then the per-node
 * weights the normaliser left in the workspace: lp_blank, lp_label, and lp_dur for each
 * duration (TDT only). A diagonal's weights are copied in by the whole block with cp.async
 * (asynchronous copies straight into shared memory, which hold no registers and no
 * scoreboard), kStageAhead diagonals before the step that first reads them; a step waits for
 * its own copies only (cp.async.wait_group) and the diagonal's barrier publishes them. So a
 * step waits only on copies issued kStageAhead steps before, and its index arithmetic is 32-bit
 * ring offsets: the register-prefetching sweep above spent about 430 of its ~600 instructions
 * a warp a diagonal on integer and index work (64-bit gathers), and ~17 % of its stalls waiting
 * for the gathered weights (ncu, H200). The staged one takes ~460.
 *
 * Ring sizes (sweep_launch): R, a power of two, > span + kStageAhead, so that the copy issued
 * at step i (diagonal i + kStageAhead in sweep order) lands in the slot of step i + kStageAhead
 * - R, which no step from i on reads: alpha reads diagonals s - span .. s - 1, beta s + 1 ..
 * s + span, and both their own diagonal's weights (beta) or the sources' (alpha, on the span
 * diagonals before). Values: a node's value is written to field 0 of its diagonal's slot by
 * lane 0 of its group, and through to the workspace for the gradient pass.
 * ============================================================================================== */

/* Diagonals whose weights are in flight while a step computes. 3 bought nothing on the H200
 * where the ring stays 8 diagonals (base, parakeet, ragged: the sweeps as slow beside the trail
 * gradient pass either way, so their slowdown there is not the staged copies' latency), and it
 * doubles the ring of durations 0..4 (span 5), which then no longer fits long's rows: long
 * 3.47 -> 10.7 ms f+b on the ring kernel (H200). */
const int kStageAhead = 2;

/* Columns a block of the cluster split (sweep_cluster_kernel) takes: long (401-node diagonals)
 * on the H200, forward ms with clusters of 1 / 4 / 8 / 12 / 16 blocks: 6.80 / 3.86 / 3.23 /
 * 3.10 / 3.05 (docs/performance.md, "The sweep"); 16 blocks of 26 columns. */
const int kClusterCols = 26;

enum { F_X = 0, F_BLANK = 1, F_LABEL = 2, F_DUR = 3 }; /* fields of a staged diagonal */

/* The overlapped schedules' forward: the sweep, the normaliser's programmatic dependent, ends
 * only once the normaliser has ended and its memory is visible, so whatever the stream runs
 * next (the gradient pass) sees both kernels done. Every block, at its end. */
__device__ __forceinline__ void overlap_end(const tdt_gpu_args_t &a) {
    if (threadIdx.x == 0) tdt_tl_end(a.tl, TDT_TL_SWEEP + 1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (a.fwd_tickets > 0) asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/* One sample's staged-ring geometry, 32-bit: sweep_launch picks this kernel only where a
 * sample's per-node index (max_frames * row, times the doubles of a node's block) fits an int. */
struct staged_geo {
    int T, U, row, frames, mask, fstride; /* fstride: doubles a ring slot holds (F * row) */
    int use_dur;
    int c0, c1; /* cluster split: this block's columns u = c0..c1 (sweep_cluster_kernel) */
    /* The overlapped forward: the normaliser's finished tickets of each layer (NULL: it ran
     * before this kernel), and the count that completes a layer. */
    const int32_t *done;
    int full;
    /* Where the sweep publishes its finished steps (NULL: it does not): the split backward's
     * beta sweep, every step up to kPublish / 2, then every kPublish steps; the fused
     * schedule's sweeps, every pub_every steps from about the middle of the lattice on (in step
     * with the count the middle cut waits for), by thread pub_tid (a.fus_publish,
     * a.fus_publisher). */
    int32_t *progress;
    int pub_every, pub_tid;
};

/* A lane's slots with their offsets into a ring slot: the weights' fields (times row). */
template <int SPL> struct staged_slots {
    tdt_slot_t q[SPL];
    int dd[SPL];               /* dt + du: diagonals the arc spans */
    int off_lp[SPL], off_dur[SPL];
};

/* Diagonal s's nodes u = lo..hi, 32-bit (tdt_diagonal_range). */
__device__ __forceinline__ void staged_range(const staged_geo &g, int s, int *lo, int *hi) {
    *lo = max(s - (g.T - 1), 0);
    *hi = min(s, g.U);
}

/* Block-wide: the copies of the first F fields of cnt blocks of F + 1 doubles (a node's
 * weights and its lse, workspace.h), block c at first + c * step bytes rounded up to a double
 * (tdt_wblock), into a ring slot, field f of node c to slot[(F_BLANK + f) * row + c]: thread e
 * copies field e mod F of node e / F, so a warp's copies read a run of blocks where they are
 * one (the workspace's), one address computation a copy and no branch between fields (staging
 * field by field, a branch between the token and the duration fields, took the step 0-10 %
 * longer; blocks a joint row apart staged as fast as a run: H200, benchmark/sweep_step.cu). */
template <int F>
__device__ __forceinline__ void stage_blocks(const char *first, int64_t step, double *slot,
                                             int row, int cnt) {
    for (int e = threadIdx.x; e < F * cnt; e += blockDim.x) {
        const int c = e / F, f = e - c * F;
        cp_async8(slot + (F_BLANK + f) * row + c, tdt_align_double(first + c * step) + f);
    }
}

/* Block-wide: the asynchronous copies of diagonal s's weights into its ring slot: nodes
 * (s - u, u), whose blocks (tdt_node_block) are a run in the workspace (its row wr = s mod
 * max_frames, tdt_node_index) and a constant step apart in the token gradient's rows
 * (options.state_in_grads). KD > 0 durations a node. */
template <int KD, bool CLUSTER>
__device__ __forceinline__ void stage_diagonal(const tdt_lattice_t &L, const staged_geo &g,
                                               double *ring, int s, int wr) {
    int lo, hi;
    staged_range(g, s, &lo, &hi);
    if (CLUSTER) { /* own columns and the one before (alpha's label arcs start there) */
        lo = max(lo, g.c0 - 1);
        hi = min(hi, g.c1);
    }
    const int cnt = hi - lo + 1; /* <= 0: nothing */
    double *slot = ring + (s & g.mask) * g.fstride + lo;
    /* node (s - lo - c, lo + c)'s block, before tdt_wblock's rounding: first + c * step */
    const bool ws = L.wb.frames > 0;
    const char *first = L.wb.base + ((int64_t)(ws ? wr : s - lo) * L.wb.s[1] + (int64_t)lo * L.wb.s[2]);
    const int64_t step = ws ? L.wb.s[2] : L.wb.s[2] - L.wb.s[1];
    /* blocks of W = 3 + KD (TDT) or 3 (RNN-T) doubles */
    if (g.use_dur)
        stage_blocks<2 + KD>(first, step, slot, g.row, cnt);
    else
        stage_blocks<2>(first, step, slot, g.row, cnt);
}

/* The terms of a lane's slots at node (t, u) of diagonal s, from the ring: lattice.h's
 * existence rules and tdt_alpha_term / tdt_beta_term, with X and the weights read from the
 * staged fields (absent arcs read nothing). */
template <bool BETA, int SPL>
__device__ __forceinline__ void staged_terms(const tdt_lattice_t &L, const staged_geo &g,
                                             const staged_slots<SPL> &sl, const double *ring,
                                             int s, int t, int u, double (&x)[SPL]) {
#pragma unroll
    for (int i = 0; i < SPL; ++i) {
        const tdt_slot_t &q = sl.q[i];
        if (!BETA) {
            const int e = tdt_slot_in(&q, t, u);
            const double *p = ring + ((s - sl.dd[i]) & g.mask) * g.fstride + (u - q.du);
            const double a = e ? p[F_X] : 0.0, lp = e ? p[sl.off_lp[i]] : 0.0;
            const double dur = e && g.use_dur ? p[sl.off_dur[i]] : 0.0;
            x[i] = tdt_alpha_term(e, a, lp, dur);
        } else {
            const int e = tdt_slot_out(&L, &q, t, u), f = tdt_slot_final(&L, &q, t, u);
            const double *own = ring + (s & g.mask) * g.fstride + u;
            const double *dst = ring + ((s + sl.dd[i]) & g.mask) * g.fstride + (u + q.du);
            const double lp = e || f ? own[sl.off_lp[i]] : 0.0;
            const double dur = (e || f) && g.use_dur ? own[sl.off_dur[i]] : 0.0;
            const double b = e ? dst[F_X] : 0.0;
            x[i] = tdt_beta_term(e, f, b, lp, dur);
        }
    }
}

/* ================================================================================================
 * The overlapped schedules (tdt_gpu_schedule_t; sweep_launch and backward_launch take them
 * where they pay: overlap_plan, split_plan)
 *
 * OVERLAP, the forward:
 * The sweep need not wait for the whole normaliser: its step i reads the weights of diagonals i
 * (alpha) or S - 1 - i (beta) and the ones before, and normalize_ordered_kernel produces them in
 * that order, layer k = diagonals k and S_b - 1 - k of every sample, counting each layer's
 * finished tickets. So the normaliser is enqueued first on one block an SM, leaving free the SMs
 * the sweep's blocks need (whole clusters of them for the cluster split), and the sweep after
 * it as its programmatic dependent: the normaliser's blocks let it launch as soon as they have
 * all started (griddepcontrol.launch_dependents), and before staging a diagonal it waits for
 * that diagonal's layer (wait_layers). Each sweep then trails the normaliser by a few layers
 * instead of starting after it.
 *
 * Safe whatever the scheduling: the normaliser waits on nothing, so it always finishes; the
 * sweep waits only on it. Where the programmatic launch does not overlap them (a device or a
 * stream without it, a tool that serialises kernels), the sweep starts after the normaliser
 * ends and finds every layer done. Memory: the count goes up after the ticket's values and a
 * fence (normalize.cu); warp 0 reads it with ld.acquire.gpu, whose barrier then orders every
 * thread's copies of those values after it. The sweep ends with griddepcontrol.wait, so the
 * next kernel in the stream starts after both (overlap_end).
 *
 * SPLIT: while the normaliser is slower than half a sweep, both sweeps trail it to the middle
 * and then each still has half a sweep to go. So the forward runs the alpha sweep alone
 * (sweep_only 1; the cost needs nothing else), trailing a normaliser whose layer k is diagonal
 * k (fwd_ends 1): about the normaliser's time. The backward then runs the beta sweep first
 * (sweep_only 2, B blocks, the normaliser's weights all there) and the gradient pass as its
 * programmatic dependent on the other SMs (grad_ordered_kernel, grad.cuh), in layers from the
 * last diagonal back: the beta block of sample b stores its finished steps in bwd_progress[b]
 * (a release store every step up to kPublish / 2, then every kPublish steps, and INT_MAX once
 * done or skipped), and a node of layer k waits (ld.acquire.gpu) until that count passes k. The
 * same safety argument: the beta sweep waits on nothing. Both calls derive the schedule from
 * the problem, the options and the device alone (split_plan), so the backward knows whether
 * the forward left beta to it.
 * ============================================================================================== */

/* Block-wide (every thread, block-uniform arguments): waits until layer ready + 1 of the
 * normaliser is finished, layers (of this sample) the count; returns the last layer known
 * finished: warp 0 looks at the next 32 layers at once, so one wait covers many steps while the
 * normaliser runs ahead. */
__device__ __noinline__ int wait_layers(const int32_t *done, int full, int ready, int layers) {
    int n = 0;
    if (threadIdx.x < 32) {
        for (;;) {
            const int k = ready + 1 + (int)threadIdx.x;
            const int ok = k < layers && tdt_ld_acquire(done + k) >= full;
            const unsigned m = __ballot_sync(0xffffffffu, ok);
            n = m == 0xffffffffu ? 32 : __ffs(~m) - 1; /* finished layers in a row */
            if (n > 0) break;
            __nanosleep(64);
        }
    }
    return ready + __syncthreads_count((int)threadIdx.x < n);
}

/* The layer of diagonal s of a sample of S diagonals. */
__device__ __forceinline__ int layer_of(int s, int S, int ends) { return ends == 2 ? min(s, S - 1 - s) : s; }

/* Steps of the split backward's beta sweep between two publications of its progress, once it
 * has published each of its first kPublish / 2 steps (so the gradient pass can start): a
 * publication is a release store by one thread (a fence, which holds that thread up, and so
 * the block's next barrier); the gradient pass, far behind after its start, needs no finer
 * grain. The fused schedule's sweeps publish every kFusedPublish steps from the middle on: the
 * gradient pass beside them makes each fence wait longer. Their publisher is the block's last
 * thread, which stores no value on short diagonals (a fence waits for its own thread's stores):
 * H200, f+b ms, every 8 steps, last thread against thread 0: long float32 3.564 /
 * 3.589, bfloat16 2.988 / 3.058; every step, 3.572 / 3.602 and 3.021 / 3.110. */
const int kPublish = 16;
const int kFusedPublish = 8;

/* barrier.cluster: every thread of every block of the cluster; release / acquire at cluster
 * scope, so shared-memory stores into another block (and global stores) before it are seen
 * after it. */
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else /* before sm_90 a launch has no clusters: each block is a cluster of one */
    __syncthreads();
#endif
}
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
#if __CUDA_ARCH__ >= 900
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
__device__ __forceinline__ unsigned cluster_size() {
    unsigned r = 1;
#if __CUDA_ARCH__ >= 900
    asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
#endif
    return r;
}
/* The address of p (this block's shared memory) in block `rank` of the cluster: a generic
 * pointer into its shared memory. */
__device__ __forceinline__ double *cluster_map(double *p, unsigned rank) {
#if __CUDA_ARCH__ >= 900
    uint64_t r;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(p), "r"(rank));
    return reinterpret_cast<double *>(r);
#else
    (void)rank;
    return p;
#endif
}

/* Block-wide: diagonal s's values of columns lo..hi, from its ring slot to the workspace (row
 * wr); the cluster sweep's write-through, one step after the diagonal (a barrier between). */
__device__ __forceinline__ void staged_write_through(const staged_geo &g, const double *ring,
                                                     double *glob, int s, int wr, int lo, int hi) {
    const double *x = ring + (s & g.mask) * g.fstride + F_X * g.row;
    for (int u = lo + (int)threadIdx.x; u <= hi; u += blockDim.x) glob[wr * g.row + u] = x[u];
}

/* The whole sweep of one sample in one direction (block-uniform control flow). glob: the
 * workspace's alpha or beta array of the sample. CLUSTER (sweep_cluster_kernel): this block
 * computes columns g.c0..g.c1 of each diagonal, in step with the other blocks of its cluster
 * (one cluster barrier a diagonal); the value of its last column (alpha) or first (beta), which
 * the neighbour's label arcs read, is also stored into the neighbour's ring (nb, NULL at the
 * ends of the row), so every read stays in the block's own shared memory. PUBLISH (the split
 * backward's beta sweep, one block, PUBLISH 1): its progress goes to g.progress as it runs;
 * PUBLISH 2 (the fused schedule, both sweeps): its progress goes to g.progress (NULL but in a
 * cluster's block 0) every kFusedPublish steps from about the middle of the lattice on, in
 * step with the count the middle cut needs (at multiples of kFusedPublish instead, base's cut
 * waited 4 steps past it), one step late in a cluster (whose values reach the
 * workspace a step late). Neither asks L2 for the weights ahead of their staging: that
 * prefetch (one line a thread, 8 steps ahead) cost the fused sweeps 7 % of long's sweep time
 * even with no gradient pass beside them, long bfloat16 7 % of its f+b time, and the split's
 * beta sweep 3-9 % of its time (H200). ENDS: the diagonals a layer of the normaliser it
 * trails holds (a.fwd_ends: 2, diagonals k and S - 1 - k; 1, diagonal k). */
template <bool BETA, int KD, int SPL, int G, bool CLUSTER, int PUBLISH = 0, int ENDS = 2>
__device__ __forceinline__ void staged_sweep(const tdt_lattice_t &L, const staged_geo &g,
                                             const staged_slots<SPL> &sl, double *ring,
                                             double *glob, double *nb) {
    const int S = g.T > 0 ? g.T + g.U : 0;
    if (S == 0) return;
    const int step = BETA ? -1 : 1;
    int s_st = BETA ? S - 1 : 0;  /* next diagonal to stage */
    int wr_st = s_st % g.frames;  /* its workspace row */
    int wr = wr_st;               /* workspace row of the step's diagonal */
    int ready = -1;               /* overlapped forward: the last layer known finished */
    const int layers = ENDS == 2 ? (S + 1) / 2 : S;
#pragma unroll
    for (int j = 0; j < kStageAhead; ++j) {
        if (j < S) {
            if (g.done && layer_of(s_st, S, ENDS) > ready) ready = wait_layers(g.done, g.full, ready, layers);
            stage_diagonal<KD, CLUSTER>(L, g, ring, s_st, wr_st);
        }
        cp_async_commit();
        s_st += step;
        wr_st = BETA ? (wr_st == 0 ? g.frames - 1 : wr_st - 1) : (wr_st + 1 == g.frames ? 0 : wr_st + 1);
    }
    const int grp = threadIdx.x / G, ng = blockDim.x / G;
    const bool writer = threadIdx.x % G == 0;
    const int edge = BETA ? g.c0 : g.c1; /* the column the neighbour reads (CLUSTER) */
    /* CLUSTER: the previous diagonal, whose values go to the workspace one step late: a store
     * to global memory before the cluster barrier's release would hold the barrier up until it
     * completes; one step later it has long completed. */
    int p_s = 0, p_wr = 0, p_lo = 0, p_hi = -1;
    /* PUBLISH 2: the step whose publication is the count the middle cut and the first layer
     * of gradient nodes wait for (alpha: tdt_mid_cut(S) steps; beta: S minus that), one step
     * later in a cluster; the publications fall every pub_every steps from one before it. */
    const int cut = (int)tdt_mid_cut(S);
    const int pub_at = (BETA ? S - cut : cut) + (CLUSTER ? 1 : 0);
    for (int i = 0; i < S; ++i) {
        const int s = BETA ? S - 1 - i : i;
        /* alpha reads the weights of diagonals before s, beta those of s itself */
        cp_async_wait < BETA ? kStageAhead - 1 : kStageAhead > ();
        if (CLUSTER)
            cluster_sync();
        else
            __syncthreads();
        /* the split backward: steps 0..i-1 written (by the whole block: the barrier); every
         * step at first, so the gradient pass trailing it starts early */
        if (PUBLISH == 1 && threadIdx.x == 0 && i > 0 && (i < kPublish / 2 || i % kPublish == 0))
            tdt_st_release(g.progress, i);
        if (PUBLISH == 2 && g.progress && (int)threadIdx.x == g.pub_tid &&
            i + g.pub_every >= pub_at && (i + g.pub_every - pub_at) % g.pub_every == 0)
            tdt_st_release(g.progress, CLUSTER ? i - 1 : i);
        if (i + kStageAhead < S) {
            if (g.done && layer_of(s_st, S, ENDS) > ready) ready = wait_layers(g.done, g.full, ready, layers);
            stage_diagonal<KD, CLUSTER>(L, g, ring, s_st, wr_st);
        }
        cp_async_commit();
        s_st += step;
        wr_st = BETA ? (wr_st == 0 ? g.frames - 1 : wr_st - 1) : (wr_st + 1 == g.frames ? 0 : wr_st + 1);

        if (CLUSTER) staged_write_through(g, ring, glob, p_s, p_wr, p_lo, p_hi);

        int lo, hi;
        staged_range(g, s, &lo, &hi);
        if (CLUSTER) {
            lo = max(lo, g.c0);
            hi = min(hi, g.c1);
        }
        for (int first = lo; first <= hi; first += ng) { /* block-uniform */
            const int u = min(first + grp, hi), t = s - u;
            double x[SPL];
            staged_terms<BETA, SPL>(L, g, sl, ring, s, t, u, x);
            const double v = group_lse<BETA, SPL, G>(x, t, u);
            if (writer && first + grp <= hi) {
                const int at = (s & g.mask) * g.fstride + F_X * g.row + u;
                ring[at] = v;
                if (!CLUSTER) glob[wr * g.row + u] = v;
                if (CLUSTER && u == edge && nb) nb[at] = v;
            }
        }
        p_s = s;
        p_wr = wr;
        p_lo = lo;
        p_hi = hi;
        wr = BETA ? (wr == 0 ? g.frames - 1 : wr - 1) : (wr + 1 == g.frames ? 0 : wr + 1);
    }
    cp_async_wait<0>(); /* no copy may land in the ring after the sweep */
    if (CLUSTER) {
        __syncthreads(); /* the last diagonal's values, written by the whole block */
        staged_write_through(g, ring, glob, p_s, p_wr, p_lo, p_hi);
        __threadfence(); /* the global values, for the log-likelihood's reads by block 0 */
        cluster_sync();  /* and no block leaves while a neighbour still stores into it */
    } else {
        __syncthreads();
    }
}

/* The alpha sweep of both staged kernels, in the layer form of the normaliser it trails: a
 * template argument, so the loop loads none (H200: long's sweep ran 2.7 % slower while it
 * read the form). fwd_ends 1 (one diagonal a layer): the split forward and a costs-only call, where
 * alpha alone trails the normaliser; else both sweeps do (or none, fwd_tickets 0). */
template <int KD, int SPL, int G, bool CLUSTER>
__device__ __forceinline__ void staged_alpha(const tdt_gpu_args_t &a, const tdt_lattice_t &L,
                                             const staged_geo &g, const staged_slots<SPL> &sl,
                                             double *ring, double *glob, double *nb) {
    if (a.fwd_ends == 1)
        staged_sweep<false, KD, SPL, G, CLUSTER, 0, 1>(L, g, sl, ring, glob, nb);
    else if (a.fus_alpha && !a.trail) /* the fused schedule: publishing */
        staged_sweep<false, KD, SPL, G, CLUSTER, 2>(L, g, sl, ring, glob, nb);
    else
        staged_sweep<false, KD, SPL, G, CLUSTER>(L, g, sl, ring, glob, nb);
}

/* The ring geometry of a launch (the sample's T and U are set per job, a cluster block's
 * columns by sweep_cluster_kernel), and this thread's slots with their ring offsets: both
 * staged kernels start with these two. */
template <int KD>
__device__ __forceinline__ staged_geo staged_geo_of(const tdt_gpu_args_t &a, const tdt_arcs_t &A,
                                                    int ring_diags) {
    staged_geo g;
    g.row = (int)a.row;
    g.frames = (int)a.maxT;
    g.mask = ring_diags - 1;
    g.use_dur = A.use_dur;
    g.fstride = (g.use_dur ? F_DUR + KD : F_DUR) * g.row;
    g.done = a.fwd_tickets > 0 ? a.ws.order + 1 : NULL;
    g.full = a.fwd_tickets;
    g.progress = NULL;
    g.pub_every = a.fus_publish > 0 ? a.fus_publish : 1;
    g.pub_tid = a.fus_publisher ? (int)blockDim.x - 1 : 0;
    return g;
}
template <int SPL, int G>
__device__ __forceinline__ void staged_slots_of(const tdt_gpu_args_t &a, int row, staged_slots<SPL> *sl) {
#pragma unroll
    for (int i = 0; i < SPL; ++i) {
        sl->q[i] = tdt_slot_of(&a.arcs, (int)threadIdx.x % G + i * G);
        sl->dd[i] = sl->q[i].dt + sl->q[i].du;
        sl->off_lp[i] = (F_BLANK + sl->q[i].du) * row;
        sl->off_dur[i] = (F_DUR + sl->q[i].k) * row;
    }
}

template <int KD, int G>
__global__ void __launch_bounds__(kMaxThreads, 1) sweep_staged_kernel(const tdt_gpu_args_t a, int ring_diags) {
    extern __shared__ double ring[];
    enum { SPL = sweep_shape<KD, G>::SPL };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* the split backward, the fused and the trail schedules: the gradient pass, the
     * programmatic dependent, may start */
    if (a.bwd_progress) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    const int tid = threadIdx.x;
    if (tid == 0) tdt_tl_start(a.tl, TDT_TL_SWEEP);
    staged_geo g = staged_geo_of<KD>(a, A, ring_diags);
    staged_slots<SPL> sl;
    staged_slots_of<SPL, G>(a, g.row, &sl);
    lse_tab_load(); /* read after tdt_sweep_jobs's first barrier */

    tdt_sweep_jobs(a, [&](int64_t b, int is_beta, const tdt_lattice_t &L, double *glob) {
        g.T = (int)L.T;
        g.U = (int)L.U;
        /* the trail schedule's sweeps publish their final counts only (tdt_sweep_jobs) */
        int32_t *const progress = a.trail ? NULL : is_beta ? a.bwd_progress : a.fus_alpha;
        g.progress = progress ? progress + b : NULL;
        if (tid == 0) tdt_tl_start(a.tl, is_beta ? TDT_TL_BETA : TDT_TL_ALPHA);
        if (!is_beta) {
            staged_alpha<KD, SPL, G, false>(a, L, g, sl, ring, glob, NULL);
            if (tid == 0) tdt_sweep_finish(a, b, L, A, glob);
            if (tid == 0) tdt_tl_end(a.tl, TDT_TL_ALPHA + 1);
        } else {
            /* the split backward's and the fused schedule's: their own copies, so the release
             * stores (whose memory clobbers constrain the compiler) stay out of the forward's
             * loop */
            if (g.progress && a.fus_alpha)
                staged_sweep<true, KD, SPL, G, false, 2>(L, g, sl, ring, glob, NULL);
            else if (g.progress)
                staged_sweep<true, KD, SPL, G, false, 1>(L, g, sl, ring, glob, NULL);
            else
                staged_sweep<true, KD, SPL, G, false>(L, g, sl, ring, glob, NULL);
            if (tid == 0) tdt_tl_end(a.tl, TDT_TL_BETA + 1);
        }
    });
    overlap_end(a);
}

/* The staged sweep of a (sample, direction) split over a cluster of blocks, for diagonals
 * longer than one block's lanes cover in one pass (sweep_launch): block r of the cluster owns
 * columns r * chunk .. (r + 1) * chunk - 1 of every diagonal; the blocks step through the
 * diagonals together, one cluster barrier a diagonal, and only the label arcs cross a block
 * boundary (from column c0 - 1, alpha, or into c1 + 1, beta), whose values arrive by a store
 * into this block's ring (staged_sweep). Each block keeps a whole-row ring (the same offsets
 * as the one-block kernel) and stages its own columns' weights and those of column c0 - 1. */
template <int KD, int G>
__global__ void __launch_bounds__(kMaxThreads, 1) sweep_cluster_kernel(const tdt_gpu_args_t a, int ring_diags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap(); /* clusters need sm_90: sweep_launch_cluster never launches this build there */
#else
    extern __shared__ double ring[];
    enum { SPL = sweep_shape<KD, G>::SPL };
    /* the fused schedule: the gradient pass, the programmatic dependent, may start */
    if (a.fus_alpha) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    const int tid = threadIdx.x;
    if (tid == 0) tdt_tl_start(a.tl, TDT_TL_SWEEP);
    const unsigned rank = cluster_rank(), ncta = cluster_size();
    staged_geo g = staged_geo_of<KD>(a, A, ring_diags);
    const int chunk = (g.row + (int)ncta - 1) / (int)ncta;
    g.c0 = (int)rank * chunk;
    g.c1 = min(g.c0 + chunk, g.row) - 1;
    staged_slots<SPL> sl;
    staged_slots_of<SPL, G>(a, g.row, &sl);
    double *right = rank + 1 < ncta ? cluster_map(ring, rank + 1) : NULL;
    double *left = rank > 0 ? cluster_map(ring, rank - 1) : NULL;
    lse_tab_load(); /* read after tdt_sweep_jobs's first barrier */

    tdt_sweep_jobs(a, blockIdx.x / ncta, gridDim.x / ncta,
                   [&](int64_t b, int is_beta, const tdt_lattice_t &L, double *glob) {
        g.T = (int)L.T;
        g.U = (int)L.U;
        /* the fused schedule: block 0 of the cluster publishes */
        int32_t *const progress = a.fus_alpha && rank == 0 ? (is_beta ? a.bwd_progress : a.fus_alpha) : NULL;
        g.progress = progress ? progress + b : NULL;
        if (!is_beta) {
            staged_alpha<KD, SPL, G, true>(a, L, g, sl, ring, glob, right);
            if (rank == 0 && tid == 0) tdt_sweep_finish(a, b, L, A, glob);
        } else if (a.fus_alpha) {
            staged_sweep<true, KD, SPL, G, true, 2>(L, g, sl, ring, glob, left);
        } else {
            staged_sweep<true, KD, SPL, G, true>(L, g, sl, ring, glob, left);
        }
    }, rank == 0);
    overlap_end(a);
#endif
}

/* Dynamic shared memory beyond the default 48 KiB (less the kernel's static table) must be
 * asked for, per kernel. */
template <typename Kernel> cudaError_t sweep_smem_attr(Kernel kernel, size_t smem_bytes) {
    if (smem_bytes + kLseTabBytes <= 48 * 1024) return cudaSuccess; /* the static table beside it */
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes);
}

/* One launch: a block a job (2 B: alpha and beta of each sample; B with a.sweep_only),
 * smem_bytes of dynamic shared memory. */
template <typename Kernel>
cudaError_t sweep_launch_k(Kernel kernel, const tdt_gpu_args_t &a, int threads, int ring_diags,
                           size_t smem_bytes, cudaStream_t stream, bool pdl = false) {
    int64_t blocks = (a.sweep_only ? 1 : 2) * a.B;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;
    cudaError_t e = sweep_smem_attr(kernel, smem_bytes);
    if (e != cudaSuccess) return e;
    if (!pdl) {
        kernel<<<(unsigned)blocks, threads, smem_bytes, stream>>>(a, ring_diags);
        return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)blocks, 1, 1);
    cfg.blockDim = dim3((unsigned)threads, 1, 1);
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr = tdt_pdl_attr();
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, kernel, a, ring_diags);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* The most lanes a node uses: the power of two at or above its 2 * KD slots, at most 8, and 8
 * only in the one-block staged kernel, for diagonals of at most kEightLanesDiag nodes. H200
 * (docs/performance.md, "The sweep"): 8 lanes against 4 took base (21 nodes a diagonal, 6 warps
 * instead of 3) from 0.188 to 0.176 ms f+b, bfloat16 0.165 -> 0.152; with 41 nodes (parakeet)
 * the staged step was 1 % slower alone (tdt_sweep_step) and 0-2 % faster in the library, with
 * 61 (ragged) 12 % slower alone and ragged 0.401 -> 0.406 ms (on an older step, 8 lanes were
 * no faster either). The runtime arc count (KD = 0) takes 4: SPL = 16 slots a lane cover
 * TDT_MAX_DURATIONS. Only the G that can occur are instantiated. */
const int kEightLanesDiag = 32;
template <int KD, int G> struct sweep_g {
    enum { MAX = KD == 1 ? 2 : KD >= 3 ? 8 : 4, V = KD == 0 ? 4 : G < MAX ? G : MAX };
};

typedef void (*sweep_fn_t)(const tdt_gpu_args_t, int);

/* The cluster split's launch configuration: 2 B clusters of `cl` blocks (B with a.sweep_only;
 * attr: the caller's storage for the cluster attribute). *active: how many such clusters can be
 * resident at once, 0 where none can (or before sm_90); the caller then tries 8 blocks, then
 * one. */
template <int KD>
cudaError_t cluster_config(const tdt_gpu_args_t &a, int threads, size_t smem_bytes, int cl,
                           cudaStream_t stream, cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr,
                           int *active) {
    const sweep_fn_t kernel = sweep_cluster_kernel<KD, sweep_g<KD, 4>::V>;
    *active = 0;
    int64_t clusters = (a.sweep_only ? 1 : 2) * a.B;
    if (clusters > 0x7fffffff / cl) clusters = 0x7fffffff / cl;
    cudaError_t e = sweep_smem_attr(kernel, smem_bytes);
    if (e != cudaSuccess) return e;
    if (tdt_allow_cluster(kernel, cl) != cudaSuccess) { /* beyond the portable size */
        (void)cudaGetLastError();
        return cudaSuccess;
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->gridDim = dim3((unsigned)(clusters * cl), 1, 1);
    cfg->blockDim = dim3((unsigned)threads, 1, 1);
    cfg->dynamicSmemBytes = smem_bytes;
    cfg->stream = stream;
    *attr = tdt_cluster_attr(cl);
    cfg->attrs = attr;
    cfg->numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(active, kernel, cfg) != cudaSuccess || *active < 1) {
        (void)cudaGetLastError(); /* 0, or an error, before sm_90 */
        *active = 0;
    }
    return cudaSuccess;
}

/* Whether `kernel`'s code is sm_90's (programmatic launch, griddepcontrol), which every
 * schedule that runs a kernel beside another needs; its PTX version kept (tdt_kept_get). */
inline bool sm90_code(sweep_fn_t kernel, int device) {
    int ptx = 0;
    const cudaError_t e = tdt_kept((const void *)kernel, 0, device, &ptx, [&](int *v) {
        cudaFuncAttributes fa;
        const cudaError_t e2 = cudaFuncGetAttributes(&fa, kernel);
        if (e2 == cudaSuccess) *v = fa.ptxVersion;
        return e2;
    });
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e == cudaSuccess && ptx >= 90;
}

/* Whether an overlapped schedule may run, and how (see "The overlapped schedules"): an sm_90
 * device and sm_90 code in `kernel` (programmatic launch, griddepcontrol); the normaliser one
 * block an SM, on the SMs the sweep's `blocks` blocks (in clusters of cl, one an SM) leave it;
 * for the cluster split, the device holds cluster_fit of the sweep's clusters at once; the
 * normaliser's tickets within an int. ends: the layer form (2 when both sweeps trail the
 * normaliser, 1 for alpha alone). block: the normaliser's tickets a block each, else a warp
 * (the split schedule's; its gradient pass sizes its own tickets: split_plan).
 * Sets a's fwd_* when it may. */
inline cudaError_t overlap_plan(tdt_gpu_args_t *a, const tdt_fwd_env_t &env, sweep_fn_t kernel,
                                int64_t blocks, int cl, int cluster_fit, int ends, bool block) {
    if (!env.sm90 || a->nodes == 0 || blocks >= env.num_sms || !sm90_code(kernel, env.device))
        return cudaSuccess;
    int per_sm = 0, norm_fit = 0;
    cudaError_t e = tdt_normalize_ordered_fit(a->V, a->nodes, env.dtype, 1, env.device, &per_sm);
    if (e != cudaSuccess) return e;
    if (per_sm != 1) return cudaSuccess; /* its blocks would not leave whole SMs free */
    int64_t norm_blocks;
    if (cl <= 1) {
        norm_blocks = env.num_sms - blocks; /* the rest for the sweep, one block an SM */
    } else {
        /* clusters of the normaliser as large as the sweep's, so the SMs left free come as
         * whole clusters (a cluster's blocks share one GPC) */
        e = tdt_normalize_ordered_fit(a->V, a->nodes, env.dtype, cl, env.device, &norm_fit);
        if (e != cudaSuccess) return e;
        const int64_t sweep_clusters = blocks / cl;
        if (sweep_clusters > cluster_fit || 2 * sweep_clusters > norm_fit) return cudaSuccess;
        norm_blocks = (norm_fit - sweep_clusters) * cl;
    }
    const int64_t diagonals = tdt_ws_layers(a->maxT, a->maxU);
    const int64_t layers = ends == 2 ? (diagonals + 1) / 2 : diagonals;
    const int64_t dlen = a->maxT < a->row ? a->maxT : a->row;
    const int64_t per = tdt_ticket_nodes<TDT_PASS_NORM>(a->V, a->nodes, env.dtype, block);
    const int64_t tickets = (ends * a->B * dlen + per - 1) / per;
    if (tickets > ((int64_t)1 << 30) / (layers > 0 ? layers : 1)) return cudaSuccess;
    a->fwd_ends = ends;
    a->fwd_layers = layers;
    a->fwd_dlen = dlen;
    a->fwd_tickets = (int)tickets;
    a->fwd_block_tickets = block;
    a->fwd_blocks = (int)norm_blocks;
    a->fwd_cluster = cl;
    return cudaSuccess;
}

/* Whether the normaliser of an overlapped forward other than the split's takes a block a
 * ticket (see normalize.cu), not a warp: where a warp ticket holds several nodes (G < 32), or
 * alpha alone trails it (a costs-only call: ends 1). H200, ms, block
 * against warp: base f32 f+b 0.193-0.196 / 0.205-0.206, long f32 4.081-4.086 / 4.124-4.141;
 * parakeet bf16 (G = 32) costs only 0.254-0.255 / 0.263-0.266, but f+b (ends 2) 0.660 /
 * 0.646-0.649. */
inline bool norm_block_tickets(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int ends) {
#ifdef TDT_SWEEP_TUNING /* benchmark builds only: TDT_NORM_TICKETS=warp or block */
    if (const char *env_s = getenv("TDT_NORM_TICKETS")) return strcmp(env_s, "warp") != 0;
#endif
    return ends == 1 || tdt_ticket_nodes<TDT_PASS_NORM>(a.V, a.nodes, dtype, false) > 1;
}

/* Whether the overlap of both sweeps with the normaliser is wanted for a sweep of `blocks`
 * blocks: asked for, or (AUTO) where the sweep's blocks take at most a quarter of the SMs
 * (ragged on the H200, 64 blocks on half of them, ran 0.31 -> 0.40 ms forward: the normaliser
 * on the other half came too slowly; docs/performance.md, "AUTO's choice"). */
inline bool overlap_wanted(const tdt_fwd_env_t &env, int64_t blocks) {
    if (env.schedule == TDT_GPU_SCHEDULE_OVERLAP || env.schedule == TDT_GPU_SCHEDULE_FUSED) return true;
    return env.schedule == TDT_GPU_SCHEDULE_AUTO && blocks <= env.num_sms / 4;
}

/* ================================================================================================
 * The fused schedule (TDT_GPU_SCHEDULE_FUSED; AUTO takes it for a one-shot call with gradients
 * where it overlaps both sweeps, split over clusters, with the normaliser: fused_plan)
 *
 * With both sweeps trailing the normaliser, what is left in series is the gradient pass after
 * them. But a node's gradient needs alpha at its own diagonal d, beta at d + 1 .. d + span and
 * log p(y|x), and the sweeps meet in the middle: from then on every node between their fronts
 * is ready, but for log p(y|x), which the alpha sweep has only at its end. lattice.h's cut
 * (tdt_mid_cut) gives log p(y|x) from the arcs across the middle, once both sweeps have passed
 * it. So the gradient pass runs as the sweep's programmatic dependent (grad_ordered_kernel,
 * FUSED): its first tickets compute each sample's cut (grad.cuh), the others take the layers
 * from the middle out, each node once alpha has passed its diagonal and beta the next one. Both
 * sweeps publish their steps from the middle on (staged_sweep, PUBLISH 2). The gradients then
 * differ from the other schedules' only through log p(y|x)'s rounding (the costs stay alpha's).
 *
 * Safe whatever the scheduling: the normaliser waits on nothing, the sweeps on the normaliser
 * alone, the cut chunks on the sweeps, the nodes on the sweeps and the cut chunks taken before
 * theirs (tickets are taken in order, by running warps). The gradient pass's blocks start once
 * every block of the sweep has started (griddepcontrol.launch_dependents), on the SMs the
 * normaliser leaves as it ends; it ends with griddepcontrol.wait, so the stream's next work sees
 * all three kernels done.
 * ============================================================================================== */

/* Bytes of logits a diagonal (over the batch) from which AUTO takes the fused schedule for
 * one-block sweeps that it overlaps with the normaliser (and does not split): the gradient pass
 * beside their second half then saves more than the sweeps lose to its traffic. H200, f+b ms,
 * fused against overlap, two rounds (docs/performance.md, "AUTO's choice"): parakeet bfloat16
 * (2.1 MB a diagonal) 0.569-0.570 / 0.595-0.599, base float32 (0.55) 0.158-0.161 /
 * 0.165-0.166; but base bfloat16 (0.28) 0.148-0.149 / 0.144. (Fused also beat the split at
 * parakeet float32, 0.917 / 0.939, and lost to it at large float32, 2.829 / 2.585: AUTO
 * splits both, split_plan coming first.) */
const double kFusedBytesPerDiagonal = 0.4 * 1024 * 1024;

/* The fused gradient kernel reads the sweeps' and the cut's counts through its blocks' cache
 * (fus_seen: grad.cuh, "the counts a block has seen") where the logits hold at least this much
 * a diagonal: there its pass trails the sweeps, and the counts a node needs were seen before by
 * its block. Where the pass keeps up with the sweeps a node mostly misses, and the cache's
 * reads and raises then add to its waits. H200, tdt_bench f+b ms, with / without the cache,
 * three rounds (docs/performance.md, "Schedules"): parakeet bfloat16 (2.2 MB a diagonal) 0.497-0.501 /
 * 0.531-0.538, parakeet float32 (4.5 MB) 0.884-0.889 / 0.888-0.891, but base float32 (0.58 MB)
 * 0.146-0.149 / 0.140-0.142. */
const double kSeenBytesPerDiagonal = 2.0 * 1024 * 1024;

/* Whether the logits (token and duration rows, over the batch) hold at least per_diagonal
 * bytes a diagonal of the lattice: what AUTO's fused and split rules weigh. */
inline bool logits_bytes_reach(const tdt_gpu_args_t &a, tdt_dtype_t dtype, double per_diagonal) {
    const double bytes = (double)a.nodes * (double)(a.V + a.D) * (double)tdt_dtype_size(dtype);
    return bytes >= per_diagonal * (double)tdt_ws_layers(a.maxT, a.maxU);
}

inline bool fused_pays(const tdt_gpu_args_t &a, tdt_dtype_t dtype) {
    return logits_bytes_reach(a, dtype, kFusedBytesPerDiagonal);
}

/* Whether this call runs the fused schedule: gradients asked for (with_grads), an overlap plan
 * of both sweeps on *a, and the schedule FUSED, or AUTO with the sweeps split over clusters
 * (cluster: long rows) or with rows of enough bytes a diagonal (fused_pays). H200, tdt_bench
 * f+b ms, fused against overlap (docs/performance.md, "AUTO's choice"): long (clusters of 16) float32
 * 3.55-3.57 / 4.06, bfloat16 2.94 / 3.36; with one-block sweeps it lost then (base float32
 * 0.203-0.205 / 0.190, parakeet bfloat16 0.650-0.660 / 0.642-0.644) and pays since its
 * gradient kernel stopped spilling (grad_ordered: 512 threads). Then a's fus_* and bwd_*
 * are set. */
inline bool fused_plan(tdt_gpu_args_t *a, const tdt_fwd_env_t &env, bool with_grads, bool cluster) {
    if (!with_grads || a->state_rows || a->fwd_tickets == 0 || a->fwd_ends != 2) return false;
    if (env.schedule != TDT_GPU_SCHEDULE_FUSED &&
        !(env.schedule == TDT_GPU_SCHEDULE_AUTO && (cluster || fused_pays(*a, env.dtype))))
        return false;
#if defined(TDT_SWEEP_TUNING) || defined(TDT_FUSED_TUNING) /* benchmark builds: TDT_FUSED=0, overlap */
    if (const char *env_s = getenv("TDT_FUSED"))
        if (atoi(env_s) == 0) return false;
#endif
    const int64_t per = tdt_ticket_nodes<TDT_PASS_GRAD>(a->V, a->nodes, env.dtype, false); /* node slots a ticket */
    const int64_t tpl = (2 * a->B * a->fwd_dlen + per - 1) / per;
    const int64_t l0 = (a->B * TDT_WS_CUT_CHUNKS + tpl - 1) / tpl;
    if ((l0 + a->fwd_layers) * tpl > ((int64_t)1 << 30)) return false;
    a->fus_publish = kFusedPublish;
    a->fus_publisher = 1;
    a->fus_seen = logits_bytes_reach(*a, env.dtype, kSeenBytesPerDiagonal);
#if defined(TDT_SWEEP_TUNING) || defined(TDT_FUSED_TUNING)
    /* benchmark builds only (TDT_FUSED_TUNING: a define for CMAKE_CUDA_FLAGS that adds these
     * knobs and nothing else): TDT_FUSED_PUBLISH=n steps between publications,
     * TDT_FUSED_PUBLISHER=first (thread 0) or last (the block's last thread) */
    if (const char *env_s = getenv("TDT_FUSED_PUBLISH"))
        if (atoi(env_s) >= 1) a->fus_publish = atoi(env_s);
    if (const char *env_s = getenv("TDT_FUSED_PUBLISHER")) a->fus_publisher = strcmp(env_s, "first") != 0;
#endif
    int32_t *const o = a->ws.order + 1 + tdt_ws_layers(a->maxT, a->maxU);
    a->bwd_tickets = (int)tpl;
    a->fus_cut_layers = (int)l0;
    a->bwd_progress = o;
    a->fus_alpha = o + a->B;
    a->fus_cut = o + 2 * a->B;
    a->fus_ticket = o + 3 * a->B;
    return true;
}

/* ================================================================================================
 * The trail schedule (TDT_GPU_SCHEDULE_TRAIL; AUTO takes it for a one-shot call with gradients
 * whose forward is serial and whose sweeps leave SMs free: trail_plan)
 *
 * Where both sweeps run after the normaliser (ragged batches: too many sweep blocks for the
 * overlap, too little per diagonal for the split), the gradient pass used to start once the
 * longest sample's sweeps had ended, though the others' had ended long before: a sample's
 * sweeps take about its own S_b = T_b + U_b diagonals. So in a one-shot call the gradient pass
 * runs as the sweep's programmatic dependent (grad_trail_kernel, grad.cuh) on the SMs the
 * sweeps leave, and on theirs as they end: first the rows outside every lattice (zeros, waiting
 * on nothing), then each sample's nodes once both its sweeps have released their final counts
 * (tdt_sweep_jobs: alpha's in fus_alpha[b], after its log-likelihood, state and cost; beta's in
 * bwd_progress[b]), samples taken by S_b ascending. The sweeps' loops are the serial
 * schedule's (no publication on the way), and every gradient node reads the values the serial
 * gradient pass reads: the same bits as SERIAL.
 *
 * Safe whatever the scheduling: the sweeps wait on nothing (the normaliser ended before them);
 * the gradient pass's blocks start once every block of the sweep has started
 * (griddepcontrol.launch_dependents), so every sample it waits on is being swept, and it ends
 * with griddepcontrol.wait, so the stream's next work sees both kernels done.
 * ============================================================================================== */

/* Whether this call runs the trail schedule: gradients asked for (with_grads), a serial forward
 * (no overlap plan on *a) with the one-block staged sweep `kernel` of `blocks` blocks (sm_90
 * code), at most TDT_TRAIL_MAX_BATCH samples, its tickets within an int, and the schedule
 * TRAIL, or AUTO with the sweeps' blocks leaving SMs free. Then a's trail flag and counters are
 * set.
 * H200, f+b ms, trail against serial (docs/performance.md, "Schedules"): ragged float32 0.413-0.415 /
 * 0.526-0.527, bfloat16 0.360-0.370 / 0.460-0.462; but on equal lengths, where no sample ends
 * early and the trail's gradient pass has only its own overhead to show (a ticket, a rank
 * search and a flag a node), 40,150,60,257 0.768 / 0.725 (bfloat16 0.625 / 0.585) and
 * 32,100,20,1025 0.434 / 0.423 (0.335 / 0.313). The host cannot see the lengths; AUTO takes it
 * for the ragged batches of training. */
inline bool trail_plan(tdt_gpu_args_t *a, const tdt_fwd_env_t &env, bool with_grads,
                       sweep_fn_t kernel, int64_t blocks) {
    if (!with_grads || !env.sm90 || a->fwd_tickets != 0 || a->B > TDT_TRAIL_MAX_BATCH) return false;
    if (env.schedule != TDT_GPU_SCHEDULE_TRAIL &&
        !(env.schedule == TDT_GPU_SCHEDULE_AUTO && blocks < env.num_sms))
        return false;
    if (!sm90_code(kernel, env.device)) return false;
    const int64_t per = tdt_ticket_nodes<TDT_PASS_GRAD>(a->V, a->nodes, env.dtype, false);
    if (a->nodes / per + 2 > ((int64_t)1 << 30)) return false; /* zero and lattice tickets */
    int32_t *const o = a->ws.order + 1 + tdt_ws_layers(a->maxT, a->maxU);
    a->trail = 1;
    a->bwd_progress = o;
    a->fus_alpha = o + a->B;
    a->fus_ticket = o + 3 * a->B;
    return true;
}

/* Enqueues the forward (after options.pack's packing, env.prologue, if any; with a reduction,
 * a.reduce, every counter zeroed first): the normaliser,
 * then sweep(a, false); or, when a carries an overlap plan, the layer counters zeroed, the
 * ordered normaliser, and sweep(a, true): the sweep as its programmatic dependent; and with a
 * fused plan (a.fus_alpha), every counter zeroed and the fused gradient pass on grad_blocks
 * blocks as the sweep's programmatic dependent. A trail plan (a.trail, no overlap plan): every
 * counter zeroed, the normaliser, the sweep, and the trail gradient pass on grad_blocks blocks
 * as its programmatic dependent. */
template <typename F>
cudaError_t forward_enqueue(const tdt_gpu_args_t &a, const tdt_fwd_env_t &env, cudaStream_t stream,
                            F sweep, int64_t grad_blocks = 0) {
    cudaError_t e = cudaSuccess;
    /* the counters: with a trail or fused plan, or a reduction, every one (the sweeps' counts,
     * the gradient pass's tickets, the costs written), else the normaliser's layer counts and
     * its ticket */
    const int64_t counters = a.trail || a.fus_alpha || a.reduce ? tdt_ws_counters(a.B, a.maxT, a.maxU)
                             : a.fwd_tickets != 0                 ? a.fwd_layers + 1
                                                                  : 0;
    /* options.pack: one kernel packs the indices and zeroes the counters (none for the serial
     * schedule), in place of the memset */
    if (env.prologue) e = tdt_launch_prologue(*env.prologue, a.ws.order, counters, stream);
    else if (counters > 0) e = cudaMemsetAsync(a.ws.order, 0, (size_t)counters * sizeof(int32_t), stream);
    if (e != cudaSuccess) return e;
    if (a.fwd_tickets == 0) {
        /* no token logits: a fused joint call (joint.cu), whose own kernel wrote the blocks */
        if (a.tok) e = tdt_launch_normalize(a, env.dtype, env.num_sms, stream);
        if (e != cudaSuccess) return e;
        e = sweep(a, false);
        if (e != cudaSuccess || !a.trail) return e;
        return tdt_launch_grad_trail(a, env.dtype, (int)(grad_blocks > 0 ? grad_blocks : 1), stream);
    }
    e = tdt_launch_normalize_ordered(a, env.dtype, a.fwd_blocks, a.fwd_cluster, stream);
    if (e != cudaSuccess) return e;
    e = sweep(a, true);
    if (e != cudaSuccess || !a.fus_alpha) return e;
    return tdt_launch_grad_fused(a, env.dtype, (int)(grad_blocks > 0 ? grad_blocks : 1), stream);
}

/* Which kernel runs a sweep. */
enum sweep_mode {
    SWEEP_STAGED, /* values and weights in the shared-memory ring (sweep_staged_kernel) */
    SWEEP_RING,   /* values in the ring, weights prefetched into registers (sweep_kernel) */
    SWEEP_ARRAY   /* values in the workspace array, one lane a node (sweep_kernel) */
};

template <int KD, int MODE> struct sweep_kernels {
    template <int G> static sweep_fn_t fn() {
        if constexpr (MODE == SWEEP_STAGED && KD > 0) /* no staged kernel for a runtime count */
            return sweep_staged_kernel<KD, sweep_g<KD, G>::V>;
        else
            return sweep_kernel<KD, sweep_g<KD, G>::V, MODE == SWEEP_RING>;
    }
};

/* The kernel of a mode and lanes a node. */
template <int KD, int MODE> sweep_fn_t sweep_kernel_of(int G) {
    typedef sweep_kernels<KD, MODE> K;
    if constexpr (MODE == SWEEP_ARRAY) {
        return K::template fn<1>();
    } else {
        switch (G) {
        case 8:
            if constexpr (MODE == SWEEP_STAGED) return K::template fn<8>();
            return K::template fn<4>();
        case 4: return K::template fn<4>();
        case 2: return K::template fn<2>();
        default: return K::template fn<1>();
        }
    }
}

/* The smallest power of two above n. */
static inline int pow2_above(int n) {
    int r = 1;
    while (r <= n) r *= 2;
    return r;
}

/* The sweep's kernel, ring and lanes a node, for the forward and for the split backward's beta
 * sweep alike (so both derive the same schedule). Arcs span up to `span` diagonals. The staged
 * kernel wherever its ring (R > span + kStageAhead diagonals of 3 + D fields of maxU + 1
 * doubles) fits the device's per-block shared memory: up to maxU ~450 for durations 0..4, ~900
 * for RNN-T; then the register-prefetching ring (R > span diagonals of values only: maxU up to
 * ~3600 and ~14500); beyond, the workspace array. Only the staged kernels overlap the
 * normaliser.
 * Lanes a node, from the longest diagonal, min(maxT, maxU + 1) nodes, and tdt_bench on the H200
 * (docs/performance.md, "The sweep"): 4 lanes while one pass of kMaxThreads threads covers the
 * diagonal; 2 lanes up to kMaxThreads nodes, in two passes (long, 401 nodes: 9.3 ms forward
 * against 10.3 with one lane a node and 11.5 with four); one lane beyond. */
struct sweep_cfg {
    int mode, G;
    int cl; /* blocks a cluster wanted (1: the one-block kernel; the launch may fall back) */
    int staged_ring, ring;
    size_t staged_smem;
};

template <int KD> sweep_cfg sweep_choose(const tdt_gpu_args_t &a, int span, const tdt_fwd_env_t &env) {
    sweep_cfg c;
    const int64_t diag = a.maxT < a.row ? a.maxT : a.row;
    c.G = diag <= kEightLanesDiag ? 8 : diag <= kMaxThreads / 4 ? 4 : diag <= kMaxThreads ? 2 : 1;
    c.staged_ring = pow2_above(span + kStageAhead);
    c.ring = pow2_above(span);
    const int fields = a.arcs.use_dur ? F_DUR + a.arcs.count : F_DUR;
    /* the dynamic shared memory a block may have beside the static table (lse_tab_load) */
    const int64_t limit = ((int64_t)env.smem_max - (int64_t)kLseTabBytes) / (int64_t)sizeof(double);
    c.mode = KD > 0 && a.row <= limit / (c.staged_ring * fields) ? SWEEP_STAGED
             : a.row <= limit / c.ring                                  ? SWEEP_RING
                                                                        : SWEEP_ARRAY;
    c.staged_smem = (size_t)c.staged_ring * fields * a.row * sizeof(double);
    /* Diagonals longer than one pass of 4 lanes a node: split over a cluster of blocks of
     * about kClusterCols columns each, at most 16 (beyond the portable 8: sweep_launch falls
     * back to 8 where 16 cannot be resident). */
    c.cl = 1;
    if (KD > 0 && c.mode == SWEEP_STAGED && diag > kMaxThreads / 4) {
        c.cl = (int)((a.row + kClusterCols - 1) / kClusterCols);
        if (c.cl > 16) c.cl = 16;
    }
#ifdef TDT_SWEEP_TUNING /* benchmark builds only (CMake TDT_SWEEP_TUNING): try another G or kernel */
    if (const char *env_s = getenv("TDT_SWEEP_LANES")) {
        const int g = atoi(env_s);
        if (g == 1 || g == 2 || g == 4 || g == 8) c.G = g;
    }
    if (const char *env_s = getenv("TDT_SWEEP_STAGED"))
        if (atoi(env_s) == 0 && c.mode == SWEEP_STAGED) c.mode = SWEEP_RING;
    if (const char *env_s = getenv("TDT_SWEEP_CLUSTER")) {
        const int n = atoi(env_s);
        if (n >= 1 && n <= 16) c.cl = n;
    }
    if (c.mode != SWEEP_STAGED) c.cl = 1;
#endif
    return c;
}

/* The one-block kernel of a choice (c.cl == 1, or the cluster split's last fallback), and its
 * launch: threads, ring diagonals, dynamic shared memory. */
struct one_block {
    sweep_fn_t kernel;
    int threads, ring;
    size_t smem;
};
template <int KD> one_block sweep_one_block(const tdt_gpu_args_t &a, const sweep_cfg &c) {
    one_block ob;
    const int64_t diag = a.maxT < a.row ? a.maxT : a.row;
    int G = c.G;
    if (KD == 0) G = 4;
    if (c.mode == SWEEP_ARRAY) G = 1;
    if (c.mode != SWEEP_STAGED && G > 4) G = 4; /* 8 lanes: the staged kernel's only */
    if (G > sweep_g<KD, 4>::MAX) G = sweep_g<KD, 4>::MAX;
    int64_t th = (diag * G + 31) / 32 * 32;
    if (th < 32) th = 32; /* maxT == 0: nothing to sweep, still a valid launch */
    if (th > kMaxThreads) th = kMaxThreads;
    ob.threads = (int)th;
    switch (c.mode) {
    case SWEEP_STAGED:
        ob.kernel = sweep_kernel_of<KD, SWEEP_STAGED>(G), ob.ring = c.staged_ring, ob.smem = c.staged_smem;
        break;
    case SWEEP_RING:
        ob.kernel = sweep_kernel_of<KD, SWEEP_RING>(G), ob.ring = c.ring;
        ob.smem = (size_t)c.ring * a.row * sizeof(double);
        break;
    default: ob.kernel = sweep_kernel_of<KD, SWEEP_ARRAY>(G), ob.ring = 0, ob.smem = 0; break;
    }
    return ob;
}

/* Bytes of logits a diagonal (over the batch) from which AUTO takes the split schedule. Its
 * forward is then about the normaliser's pass alone (the overlap of both sweeps takes the
 * normaliser plus half a sweep), but its backward is the gradient pass on the SMs the beta
 * sweep leaves, or the beta sweep itself (slower beside the gradient pass's traffic), whichever
 * is longer. H200, f+b ms, split against overlap (docs/performance.md, "AUTO's choice"): parakeet f32
 * (4.5 MB a diagonal) 0.985 / 1.019, large f32 (5.3) 3.045 / 3.120, large bf16 (2.7) 2.093 /
 * 2.198, huge bf16 (10.3) 5.137 / 5.145; but parakeet bf16 (2.2) 0.716 / 0.643, base (0.6)
 * 0.300 / 0.203. */
const double kSplitBytesPerDiagonal = 2.5 * 1024 * 1024;

inline bool split_pays(const tdt_gpu_args_t &a, tdt_dtype_t dtype) {
    return logits_bytes_reach(a, dtype, kSplitBytesPerDiagonal);
}

/* A lattice of fewer diagonals than kFusedOverSplitLayers, each of at most
 * kFusedOverSplitRows nodes a sample: there AUTO gives a one-shot call with gradients
 * (compute_tdt_loss(), tdt_forward_ahead()) the fused schedule where it would split, the fused
 * gradient pass beside both sweeps' second halves ending sooner than the split's beside the
 * beta sweep after the forward. H200, tdt_bench f+b ms float32, fused / split, two or three
 * rounds (docs/performance.md, "AUTO's choice"), by (B, T, U, V): 240 diagonals of 41 rows, parakeet
 * (4, 200, 40, 8193) 0.890-0.905 / 0.927-0.929 and (8, 200, 40, 8193) 1.725-1.729 /
 * 1.754-1.758; 250 of 51, (16, 200, 50, 1025) 0.709-0.713 / 0.736-0.742. But 250 diagonals
 * of 101 rows, (16, 150, 100, 1025) 1.072-1.080 / 1.022-1.025; and large's 500 of 101
 * 2.668-2.676 / 2.457-2.460 (bfloat16 1.882-1.891 / 1.629-1.642), huge bfloat16's 475 of 101
 * 4.610-4.613 / 4.307-4.317; (4, 400, 80, 8193), 480 of 81, a tie (3.385 / 3.382-3.398).
 * A pair (tdt_forward(), tdt_backward()) still splits: its forward cannot run the gradient
 * pass. */
const int64_t kFusedOverSplitLayers = 360;
const int64_t kFusedOverSplitRows = 64;

/* The one-block sweep of choice c (*ob), and whether the split schedule runs for this call:
 * the forward and the backward both call this, so they agree (it depends on the problem, the
 * options and the device only). Split: the one-block staged sweep (c.cl == 1 as chosen,
 * whatever a cluster launch would fall back to) of an arc count with its own instantiation
 * (KD > 0: each has an ordered gradient kernel too), asked for or (AUTO) worth it with the alpha
 * sweep's B blocks on at most a quarter of the SMs, and an overlap plan for the forward (one
 * diagonal a layer). Then *a carries it: fwd_* for the ordered normaliser and the gradient
 * pass's layers, bwd_tickets. */
template <int KD>
cudaError_t split_plan(tdt_gpu_args_t *a, const sweep_cfg &c, const tdt_fwd_env_t &env,
                       one_block *ob, bool *split) {
    *ob = sweep_one_block<KD>(*a, c);
    *split = false;
    /* options.state_in_grads: the split backward's gradient pass could overwrite a node's
     * block (its row's head) before the beta sweep beside it has read it */
    if (KD == 0 || a->state_rows || c.mode != SWEEP_STAGED || c.cl != 1) return cudaSuccess;
    if (env.schedule == TDT_GPU_SCHEDULE_AUTO) {
        if (a->B > env.num_sms / 4 || !split_pays(*a, env.dtype)) return cudaSuccess;
    } else if (env.schedule != TDT_GPU_SCHEDULE_SPLIT) {
        return cudaSuccess;
    }
    tdt_gpu_args_t p = *a;
    const cudaError_t e = overlap_plan(&p, env, ob->kernel, a->B, 1, 0, 1, false);
    if (e != cudaSuccess || p.fwd_tickets == 0) return e;
    /* the gradient pass's layers are the normaliser's (one diagonal each), taken from the other
     * end, in warp tickets of its own G (32 / G slots; the normaliser's G may differ:
     * tdt_gpu_group_size) */
    const int64_t per = tdt_ticket_nodes<TDT_PASS_GRAD>(a->V, a->nodes, env.dtype, false);
    const int64_t tickets = (a->B * p.fwd_dlen + per - 1) / per;
    if (tickets > ((int64_t)1 << 30) / (p.fwd_layers > 0 ? p.fwd_layers : 1)) return cudaSuccess;
    p.bwd_tickets = (int)tickets;
    *a = p;
    *split = true;
    return cudaSuccess;
}

/* The forward's launches: the sweep's kernel (sweep_choose), and whether and how it overlaps
 * the normaliser: the split schedule (alpha alone trails it), or both sweeps trailing it, or
 * neither (the normaliser first). */
template <int KD>
cudaError_t sweep_launch(const tdt_gpu_args_t &a_in, int span, const tdt_fwd_env_t &env,
                         cudaStream_t stream, bool *bwd_done) {
    tdt_gpu_args_t a = a_in; /* fwd_* set by overlap_plan, fus_* by fused_plan */
    /* bwd_done: a one-shot call's backward follows; set when the fused schedule runs it here */
    const bool with_grads = bwd_done && a.nodes > 0 && (a.tok_g || (a.dur_g && a.D > 0));
    const sweep_cfg c = sweep_choose<KD>(a, span, env);
    /* a costs-only call (a.sweep_only 1 from the start) sweeps alpha alone: B jobs, and where it
     * trails the normaliser, a layer is one diagonal */
    const int jobs = a.sweep_only ? 1 : 2;
    if constexpr (KD > 0) {
        /* the cluster split needs sm_90 code (a build for older architectures runs its PTX on
           an sm_90 device without clusters: sweep.cuh's cluster helpers are one block's there) */
        int cl = sm90_code(sweep_cluster_kernel<KD, sweep_g<KD, 4>::V>, env.device) ? c.cl : 1;
        while (cl > 1) {
            const int64_t chunk = (a.row + cl - 1) / cl;
            const int64_t d = a.maxT < chunk ? a.maxT : chunk;
            const int gc = sweep_g<KD, 4>::V;
            int64_t t = (d * gc + 31) / 32 * 32;
            if (t > kMaxThreads) t = kMaxThreads;
            cudaLaunchConfig_t cfg;
            cudaLaunchAttribute attrs[2];
            int active = 0;
            cudaError_t e = cluster_config<KD>(a, (int)t, c.staged_smem, cl, stream, &cfg, &attrs[0], &active);
            if (e != cudaSuccess) return e;
            if (active > 0) {
                const sweep_fn_t kernel = sweep_cluster_kernel<KD, sweep_g<KD, 4>::V>;
                bool fused = false;
                if (overlap_wanted(env, jobs * a.B * cl)) {
                    e = overlap_plan(&a, env, kernel, jobs * a.B * cl, cl, active, jobs,
                                     norm_block_tickets(a, env.dtype, jobs));
                    if (e != cudaSuccess) return e;
                    fused = fused_plan(&a, env, with_grads, true);
                }
                e = forward_enqueue(a, env, stream, [&](const tdt_gpu_args_t &x, bool pdl) {
                    if (pdl) {
                        attrs[1] = tdt_pdl_attr();
                        cfg.attrs = attrs;
                        cfg.numAttrs = 2;
                    }
                    const cudaError_t e2 = cudaLaunchKernelEx(&cfg, kernel, x, c.staged_ring);
                    return e2 != cudaSuccess ? e2 : cudaGetLastError();
                }, fused ? env.num_sms - jobs * a.B * cl : 0);
                if (e == cudaSuccess && fused) *bwd_done = true;
                return e;
            }
            /* not resident here: the portable 8, else the one-block kernel below */
            cl = cl > 8 ? 8 : 1;
        }
    }
    one_block ob;
    bool split;
    cudaError_t e = split_plan<KD>(&a, c, env, &ob, &split);
    if (e != cudaSuccess) return e;
    bool fused = false, trail = false;
    /* AUTO's small lattice: a one-shot call with gradients takes the fused schedule in place of
     * the split where the fused plan holds (then no backward follows this call; a later
     * tdt_backward() on its workspace splits, as the pair does, the forward having written all
     * that the split backward reads). The plans run on a copy of the call's arguments, which a
     * split that stays is not given. (split_plan splits only a staged sweep with KD > 0.) */
    const bool small = split && with_grads && env.schedule == TDT_GPU_SCHEDULE_AUTO &&
                       tdt_ws_layers(a.maxT, a.maxU) < kFusedOverSplitLayers &&
                       a.row <= kFusedOverSplitRows;
    if ((!split || small) && KD > 0 && c.mode == SWEEP_STAGED && overlap_wanted(env, jobs * a.B)) {
        tdt_gpu_args_t f = a_in;
        e = overlap_plan(&f, env, ob.kernel, jobs * f.B, 1, 0, jobs,
                         norm_block_tickets(f, env.dtype, jobs));
        if (e != cudaSuccess) return e;
        fused = fused_plan(&f, env, with_grads, false);
        if (!split || fused) {
            a = f;
            split = false;
        }
    }
    if (split) a.sweep_only = 1; /* beta runs in the backward (or not at all: costs only) */
    if (!split && !fused && KD > 0 && c.mode == SWEEP_STAGED)
        trail = trail_plan(&a, env, with_grads, ob.kernel, jobs * a.B);
    e = forward_enqueue(a, env, stream, [&](const tdt_gpu_args_t &x, bool pdl) {
        return sweep_launch_k(ob.kernel, x, ob.threads, ob.ring, ob.smem, stream, pdl);
    }, fused ? env.num_sms - jobs * a.B : trail ? env.num_sms : 0);
    if (e == cudaSuccess && (fused || trail)) *bwd_done = true;
    return e;
}

/* The backward's launches: the gradient pass; or for the split schedule its counters zeroed,
 * the beta sweep (B blocks, publishing each sample's progress), and the ordered gradient pass
 * as its programmatic dependent on the SMs it leaves free. */
template <int KD>
cudaError_t backward_launch(const tdt_gpu_args_t &a_in, int span, const tdt_fwd_env_t &env,
                            cudaStream_t stream) {
    tdt_gpu_args_t a = a_in;
    one_block ob;
    bool split;
    cudaError_t e = split_plan<KD>(&a, sweep_choose<KD>(a, span, env), env, &ob, &split);
    if (e != cudaSuccess) return e;
    if (!split) return tdt_launch_grad(a_in, env.dtype, env.num_sms, stream);
    const int64_t K = tdt_ws_layers(a.maxT, a.maxU);
    e = cudaMemsetAsync(a.ws.order, 0, (size_t)(1 + K + a.B) * sizeof(int32_t), stream);
    if (e != cudaSuccess) return e;
    a.sweep_only = 2;
    a.fwd_tickets = 0; /* the normaliser's values are all there: the sweep waits for none */
    a.bwd_progress = a.ws.order + 1 + K;
    e = sweep_launch_k(ob.kernel, a, ob.threads, ob.ring, ob.smem, stream, false);
    if (e != cudaSuccess) return e;
    return tdt_launch_grad_ordered(a, env.dtype, (int)(env.num_sms - a.B), stream);
}

} /* namespace */

#endif /* TDT_GPU_SWEEP_CUH */
