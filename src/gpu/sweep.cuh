/*
 * sweep.cuh - the alpha and beta sweeps over anti-diagonals, the log-likelihood and the cost
 * (forward pass, second kernel).
 *
 * Math (docs/math.md, section 2, "Forward and backward variables"): per sample, with the per-node
 * log-probabilities the normaliser left in the workspace,
 *     alpha(t,u) = logsumexp over slots j of tdt_alpha_slot_term(j)   alpha(0,0) = 0
 *     beta(t,u)  = logsumexp over slots j of tdt_beta_slot_term(j)    terminal arcs end at 0
 *     LL         = tdt_log_likelihood(...),   cost = tdt_cost(LL) = -(1 + fastemit_lambda) * LL
 * with the slot functions of src/common/lattice.h that the CPU backend's tdt_sweep_node loops
 * over (a slot is one arc of a node: 2 * D of them for TDT, 2 for RNN-T).
 * Every arc advances t + u by at least one and by at most span = max(blank duration, label
 * duration + 1), so all nodes of anti-diagonal s = t + u depend only on diagonals
 * s - span .. s - 1 (alpha) or s + 1 .. s + span (beta).
 *
 * Parallel mapping: one thread block per (sample, direction): block 2b sweeps alpha of sample
 * b, block 2b + 1 beta, so the two sweeps of a sample run concurrently on different SMs and
 * B samples give 2B independent blocks. Inside a block the loop runs over the T_b + U_b
 * diagonals in order, one __syncthreads() per diagonal. A node belongs to a group of G lanes
 * (G = 4, 2 or 1, from the longest diagonal: sweep_launch):
 * lane l computes the terms of slots l, l + G, ..., their max and sum of exps are reduced over
 * the group by xor shuffles, and one log finishes the node. So a node's ~10 float64 exps and
 * its index arithmetic run side by side on G lanes instead of one after another on one thread
 * (the latency of a diagonal, which is what a sweep is made of, drops about G-fold, plus
 * log2 G shuffle steps). Group g owns node lo + g of each diagonal (and lo + g + k * blockDim/G
 * for diagonals longer than one pass: U is not capped).
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

/* exp(x) in float64 for the log-sum-exp's x - max <= 0, with no branch: x = -inf (an absent
 * arc) gives exactly 0, NaN gives NaN. Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, the
 * Taylor polynomial of degree 13 (truncation error below 5e-18 relative, so the result is
 * within about 2 ulp of e^x), and 2^n applied as two factors 2^n1 2^n2 so results down to the
 * subnormal range come out right. CUDA's exp() branches on |x| > ~708, which absent arcs
 * (-inf) take, so a warp with both kinds of lanes ran both paths. */
__device__ __forceinline__ double exp_le0(double x) {
    const double xc = fmax(x, -745.5); /* e^-745.5 rounds to 0; NaN becomes -745.5 here */
    const double n = rint(xc * 1.4426950408889634);
    double r = fma(n, -6.93147180369123816490e-01, xc); /* ln2 high part: n * it is exact */
    r = fma(n, -1.90821492927058770002e-10, r);         /* ln2 low part */
    double p = 1.0 / 6227020800.0;                      /* 1/13! */
    p = fma(p, r, 1.0 / 479001600.0);
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    const int ni = (int)n, n1 = ni >> 1, n2 = ni - n1; /* both in [-538, 0]: normal powers */
    const double s1 = __hiloint2double((n1 + 1023) << 20, 0);
    const double s2 = __hiloint2double((n2 + 1023) << 20, 0);
    const double e = (p * s1) * s2;
    return x != x ? x : (x < -745.5 ? 0.0 : e);
}

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

/* alpha (beta) of node (t, u) from its group: each lane's slot terms, the group's max, each
 * lane's sum of exps, the group's sum, one log. Every lane returns the same value. */
template <bool BETA, int SPL, int G>
__device__ __forceinline__ double node_value(const tdt_lattice_t &L, const tdt_diag_view_t &X,
                                             const lane_slots<SPL> &sl, int64_t t, int64_t u,
                                             const slot_weights<SPL> &w) {
    double x[SPL], m = -TDT_INF, sum = 0.0;
#pragma unroll
    for (int i = 0; i < SPL; ++i) {
        x[i] = BETA ? tdt_beta_slot_term(&L, &X, &sl.q[i], t, u, w.lp[i], w.dur[i])
                    : tdt_alpha_slot_term(&L, &X, &sl.q[i], t, u, w.lp[i], w.dur[i]);
        m = tdt_lse_max(m, x[i]);
    }
    m = group_max<G>(m);
#pragma unroll
    for (int i = 0; i < SPL; ++i) sum += exp_le0(x[i] - m);
    const double r = tdt_lse_finish(m, group_sum<G>(sum));
    return BETA ? r : tdt_alpha_start(t, u, r);
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

template <int KD, int G, bool RING>
__global__ void __launch_bounds__(kMaxThreads, 1) sweep_kernel(const tdt_gpu_args_t a, int ring_diags) {
    extern __shared__ double ring[];
    enum { SPL = sweep_shape<KD, G>::SPL };
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    const int tid = threadIdx.x;
    const int nthreads = blockDim.x;
    lane_slots<SPL> sl;
#pragma unroll
    for (int i = 0; i < SPL; ++i) sl.q[i] = tdt_slot_of(&a.arcs, tid % G + i * G);

    for (int64_t job = blockIdx.x; job < 2 * a.B; job += gridDim.x) { /* block-uniform */
        const int64_t b = job >> 1;
        const int is_beta = (int)(job & 1);
        int64_t T, U;
        int bad = !tdt_sample_lengths(a, b, &T, &U);
        if (!bad) {
            for (int64_t i = tid; i < U; i += nthreads) {
                int32_t l = a.labels[b * a.maxU + i];
                if (l < 0 || l >= a.V || l == a.blank) bad = 1;
            }
        }
        bad = __syncthreads_or(bad); /* also: the previous job's ring reads are over */
        if (bad) {
            if (!is_beta && tid == 0) {
                a.ws.state[b] = TDT_GPU_STATE_BAD_DATA;
                a.ws.ll[b] = (double)NAN;
                if (a.acc_double)
                    static_cast<double *>(a.costs)[b] = (double)NAN;
                else
                    static_cast<float *>(a.costs)[b] = (float)NAN;
            }
            continue;
        }

        const tdt_lattice_t L = tdt_sample_lattice(a, b, T, U);
        double *g = (is_beta ? a.ws.beta : a.ws.alpha) + tdt_sample_offset(b, a.maxT, a.row);
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
            if (tid == 0) {
                double ll = tdt_log_likelihood(&L, &A, g);     /* -inf when T == 0 */
                double cost = tdt_cost(ll, a.fastemit_lambda); /* +inf when infeasible */
                a.ws.ll[b] = ll;
                a.ws.state[b] = TDT_GPU_STATE_OK;
                if (a.acc_double)
                    static_cast<double *>(a.costs)[b] = cost;
                else
                    static_cast<float *>(a.costs)[b] = (float)cost;
            }
        } else {
            sweep<true, SPL, G>(L, A, sl, st);
        }
    }
}

template <int KD, int G, bool RING>
cudaError_t sweep_launch_g(const tdt_gpu_args_t &a, int threads, int ring_diags,
                           size_t smem_bytes, cudaStream_t stream) {
    int64_t blocks = 2 * a.B;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;
    if (smem_bytes > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(sweep_kernel<KD, G, RING>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem_bytes);
        if (e != cudaSuccess) return e;
    }
    sweep_kernel<KD, G, RING><<<(unsigned)blocks, threads, smem_bytes, stream>>>(a, ring_diags);
    return cudaGetLastError();
}

/* The most lanes a node uses: the power of two at or above its 2 * KD slots, at most 4 (8 lanes
 * measured no faster than 4 on the H200, and slower on ragged: benchmark/NOTES.md, v3). The
 * runtime arc count (KD = 0) takes 4: SPL = 16 slots a lane cover TDT_MAX_DURATIONS. Only the
 * G that can occur are instantiated. */
template <int KD, int G> struct sweep_g {
    enum { MAX = KD == 1 ? 2 : 4, V = KD == 0 ? 4 : G < MAX ? G : MAX };
};

/* Lanes a node, from the longest diagonal, min(maxT, maxU + 1) nodes, and tdt_bench on the H200
 * (benchmark/NOTES.md, v3): 4 lanes while one pass of kMaxThreads threads covers the
 * diagonal; 2 lanes up to kMaxThreads nodes, in two passes (long, 401 nodes: 9.3 ms forward
 * against 10.3 with one lane a node and 11.5 with four); one lane beyond. Without the ring (maxU
 * beyond ~3600) one lane a node reads the workspace array. */
template <int KD>
cudaError_t sweep_launch(const tdt_gpu_args_t &a, int ring_diags, size_t smem_bytes,
                         cudaStream_t stream) {
    const int64_t diag = a.maxT < a.row ? a.maxT : a.row;
    int G = diag <= kMaxThreads / 4 ? 4 : diag <= kMaxThreads ? 2 : 1;
#ifdef TDT_SWEEP_TUNING /* benchmark builds only (CMake TDT_SWEEP_TUNING): try another G */
    if (const char *env = getenv("TDT_SWEEP_LANES")) {
        const int g = atoi(env);
        if (g == 1 || g == 2 || g == 4) G = g;
    }
#endif
    if (KD == 0) G = 4;
    if (ring_diags == 0) G = 1;
    if (G > sweep_g<KD, 4>::MAX) G = sweep_g<KD, 4>::MAX;
    int64_t threads = (diag * G + 31) / 32 * 32;
    if (threads < 32) threads = 32; /* maxT == 0: nothing to sweep, still a valid launch */
    if (threads > kMaxThreads) threads = kMaxThreads;
    const int th = (int)threads;
    if (ring_diags == 0)
        return sweep_launch_g<KD, sweep_g<KD, 1>::V, false>(a, th, 0, 0, stream);
    switch (G) {
    case 4: return sweep_launch_g<KD, sweep_g<KD, 4>::V, true>(a, th, ring_diags, smem_bytes, stream);
    case 2: return sweep_launch_g<KD, sweep_g<KD, 2>::V, true>(a, th, ring_diags, smem_bytes, stream);
    default: return sweep_launch_g<KD, sweep_g<KD, 1>::V, true>(a, th, ring_diags, smem_bytes, stream);
    }
}

} /* namespace */

#endif /* TDT_GPU_SWEEP_CUH */
