/*
 * sweep.cuh - the alpha and beta sweeps over anti-diagonals, the log-likelihood and the cost
 * (forward pass, second kernel).
 *
 * Math (docs/math.md, section 2, "Forward and backward variables"): per sample, with the per-node
 * log-probabilities the normaliser left in the workspace,
 *     alpha(t,u) = tdt_alpha_combine(tdt_alpha_terms(t,u))   over arcs into (t,u), alpha(0,0) = 0
 *     beta(t,u)  = tdt_beta_combine(tdt_beta_terms(t,u))     over arcs out of (t,u), terminal 0
 *     LL         = tdt_log_likelihood(...),   cost = tdt_cost(LL) = -(1 + fastemit_lambda) * LL
 * exactly the functions of src/common/lattice.h that the CPU backend calls (its tdt_alpha_node
 * is the same two steps). Every arc advances t + u by at least one and by at most
 * span = max(blank duration, label duration + 1), so all nodes of anti-diagonal s = t + u depend
 * only on diagonals s - span .. s - 1 (alpha) or s + 1 .. s + span (beta).
 *
 * Parallel mapping: one thread block per (sample, direction): block 2b sweeps alpha of sample
 * b, block 2b + 1 beta, so the two sweeps of a sample run concurrently on different SMs and
 * B samples give 2B independent blocks. Inside a block the loop runs over the T_b + U_b
 * diagonals in order, one __syncthreads() per diagonal; thread i owns node lo + i of each
 * diagonal (and lo + i + k * blockDim for diagonals longer than the block: U is not capped).
 *
 * Per diagonal, the critical path holds no global-memory load:
 *  - the alphas (betas) of the last R diagonals live in a ring in shared memory, R the power of
 *    two above span (8 for durations up to 4+1, 2 for RNN-T); each value is also written
 *    through to the workspace for the gradient pass. Where R * (maxU + 1) doubles do not fit in
 *    a block's shared memory the ring is the workspace array itself (same code, another view);
 *  - the arc weights of a thread's node on the next diagonal (the normaliser's output, known
 *    before the sweep starts) are loaded into registers (tdt_arc_terms_t) before the current
 *    diagonal's arithmetic, so their latency hides behind it; the loop is unrolled by two so
 *    the two register sets alternate without copies;
 *  - the workspace's per-node arrays are diagonal-major (lattice.h, tdt_node_index), so those
 *    loads and the write-through are contiguous across the threads of a diagonal.
 * What remains per diagonal is float64 arithmetic: for a node with n arcs, n exps and one log,
 * independent of one another (two-pass log-sum-exp).
 *
 * Race-free: on one diagonal every node has one writer and reads only nodes of other diagonals,
 * written before an earlier barrier. The ring slot written at diagonal s (s mod R) last held
 * diagonal s - R (alpha) or s + R (beta), which no node of s reads since R > span (the reads
 * of absent arcs, whose values are discarded, go to diagonal s + 1, never written during
 * step s; threads past the end of a diagonal store nothing). A barrier
 * also makes a block's global writes visible to the whole block (the log-likelihood reads the
 * workspace alphas after the last one). Alpha and beta blocks write disjoint arrays; only the
 * alpha block writes ll, state and the cost. Bad device data (a length or label out of range)
 * is found first, by both blocks alike (__syncthreads_or over the labels), before any lattice
 * index is formed: such a sample gets state BAD_DATA, LL NaN and cost NaN, and nothing of it is
 * swept.
 *
 * Precision: float64 throughout (lattice.h), for every dtype: log-probabilities of long
 * utterances sum to thousands, and float32 alphas would lose the gradient's occupancies.
 * Deterministic: each node is computed by one thread with lattice.h's fixed arc order.
 *
 * Limits: sequential in T_b + U_b (the dependency chain itself); 256 threads per block; the
 * shared-memory ring when R * (maxU + 1) * 8 bytes fit the device's per-block opt-in limit
 * (227 KiB on Hopper: maxU up to ~3600 with TDT durations up to 6, ~14500 for RNN-T).
 */
#ifndef TDT_GPU_SWEEP_CUH
#define TDT_GPU_SWEEP_CUH

#include "gpu_common.cuh"

namespace {

/* 256 threads a block leave 255 registers a thread: two sets of prefetched terms per node and
 * the independent exps of a node in flight, without spills. A block prefetches for up to
 * 2 * 256 nodes of a diagonal (NPT = 2 nodes a thread beyond 256). */
const int kMaxThreads = 256;

/* The two steps of lattice.h for one direction. */
template <bool BETA>
__device__ __forceinline__ void node_terms(const tdt_lattice_t &L, const tdt_arcs_t &A, int64_t t,
                                           int64_t u, tdt_arc_terms_t *w) {
    if (BETA)
        tdt_beta_terms(&L, &A, t, u, w);
    else
        tdt_alpha_terms(&L, &A, t, u, w);
}

template <bool BETA>
__device__ __forceinline__ double node_combine(const tdt_lattice_t &L, const tdt_arcs_t &A,
                                               const tdt_diag_view_t &X, int64_t t, int64_t u,
                                               const tdt_arc_terms_t *w) {
    return BETA ? tdt_beta_combine(&L, &A, &X, t, u, w) : tdt_alpha_combine(&L, &A, &X, t, u, w);
}

/* Where a sweep keeps its values: X (read view) and xw (the same memory, written) are the ring
 * or the workspace array; glob is the workspace array to write through to, or NULL when X is
 * the workspace array already. */
struct sweep_store {
    tdt_diag_view_t X;
    double *xw;
    double *glob;
};

/* Diagonal s: thread i owns nodes lo + i + j * blockDim, j < NPT, whose terms were gathered
 * one step earlier (cur); the terms of its nodes on diagonal s_next (-1: none) are loaded into
 * nxt first, and nothing consumes those loads before the next step, so they are in flight
 * during this diagonal's arithmetic. A thread past the end of the diagonal computes its last
 * node again and does not store it, so the step has no branch around the arithmetic (the NPT
 * nodes of a thread interleave). Nodes beyond NPT * blockDim (diagonals longer than the block
 * can prefetch) gather their terms in place. Ends with the diagonal's barrier. */
template <bool BETA, int NPT>
__device__ __forceinline__ void sweep_diagonal(const tdt_lattice_t &L, const tdt_arcs_t &A,
                                               const sweep_store &st, int64_t s, int64_t s_next,
                                               const tdt_arc_terms_t (&cur)[NPT],
                                               tdt_arc_terms_t (&nxt)[NPT]) {
    const int64_t tid = threadIdx.x, nt = blockDim.x;
    int64_t lo, hi;
    if (s_next >= 0) {
        tdt_diagonal_range(&L, s_next, &lo, &hi);
#pragma unroll
        for (int j = 0; j < NPT; ++j) {
            const int64_t u = min(lo + tid + j * nt, hi);
            node_terms<BETA>(L, A, s_next - u, u, &nxt[j]);
        }
    }
    tdt_diagonal_range(&L, s, &lo, &hi);
    double v[NPT];
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
        const int64_t u = min(lo + tid + j * nt, hi);
        v[j] = node_combine<BETA>(L, A, st.X, s - u, u, &cur[j]);
    }
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
        const int64_t u = lo + tid + j * nt;
        if (u <= hi) {
            st.xw[tdt_view_index(&L, &st.X, s, u)] = v[j];
            if (st.glob) st.glob[tdt_node_index(L.frames, L.row, s - u, u)] = v[j];
        }
    }
    for (int64_t u = lo + tid + NPT * nt; u <= hi; u += nt) {
        tdt_arc_terms_t w;
        node_terms<BETA>(L, A, s - u, u, &w);
        const double x = node_combine<BETA>(L, A, st.X, s - u, u, &w);
        st.xw[tdt_view_index(&L, &st.X, s, u)] = x;
        if (st.glob) st.glob[tdt_node_index(L.frames, L.row, s - u, u)] = x;
    }
    __syncthreads();
}

/* The whole sweep of one sample in one direction (block-uniform control flow). The loop is
 * unrolled by two so the two register sets of terms alternate without copies. */
template <bool BETA, int NPT>
__device__ __forceinline__ void sweep(const tdt_lattice_t &L, const tdt_arcs_t &A,
                                      const sweep_store &st) {
    const int64_t S = tdt_num_diagonals(&L);
    if (S == 0) return;
    const int64_t s0 = BETA ? S - 1 : 0, step = BETA ? -1 : 1;
    tdt_arc_terms_t w0[NPT], w1[NPT];
    {
        int64_t lo, hi;
        tdt_diagonal_range(&L, s0, &lo, &hi);
#pragma unroll
        for (int j = 0; j < NPT; ++j) {
            const int64_t u = min(lo + (int64_t)threadIdx.x + j * (int64_t)blockDim.x, hi);
            node_terms<BETA>(L, A, s0 - u, u, &w0[j]);
        }
    }
    for (int64_t i = 0; i < S; i += 2) {
        const int64_t s = s0 + step * i;
        sweep_diagonal<BETA, NPT>(L, A, st, s, i + 1 < S ? s + step : -1, w0, w1);
        if (i + 1 < S)
            sweep_diagonal<BETA, NPT>(L, A, st, s + step, i + 2 < S ? s + 2 * step : -1, w1, w0);
    }
}

template <int KD, bool RING, int NPT>
__global__ void __launch_bounds__(kMaxThreads, 1) sweep_kernel(const tdt_gpu_args_t a, int ring_diags) {
    extern __shared__ double ring[];
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    const int tid = threadIdx.x;
    const int nthreads = blockDim.x;

    for (int64_t job = blockIdx.x; job < 2 * a.B; job += gridDim.x) { /* block-uniform */
        const int64_t b = job >> 1;
        const int is_beta = (int)(job & 1);
        int64_t T, U;
        int bad = !tdt_sample_lengths(a, b, &T, &U);
        if (!bad) {
            const int32_t *y = a.labels + b * a.maxU;
            for (int64_t i = tid; i < U; i += nthreads) {
                int32_t l = y[i];
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
            sweep<false, NPT>(L, A, st);
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
            sweep<true, NPT>(L, A, st);
        }
    }
}

/* Enqueues the sweep for arc count KD (0: any count) with a shared-memory ring of ring_diags
 * diagonals (0: none) of smem_bytes. One thread per node of the longest diagonal (at most
 * min(maxT, maxU + 1) nodes) up to kMaxThreads, two per thread up to twice that; longer
 * diagonals stride. */
template <int KD, bool RING, int NPT>
cudaError_t sweep_launch3(const tdt_gpu_args_t &a, int threads, int ring_diags, size_t smem_bytes,
                          cudaStream_t stream) {
    int64_t blocks = 2 * a.B;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;
    if (smem_bytes > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(sweep_kernel<KD, RING, NPT>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem_bytes);
        if (e != cudaSuccess) return e;
    }
    sweep_kernel<KD, RING, NPT><<<(unsigned)blocks, threads, smem_bytes, stream>>>(a, ring_diags);
    return cudaGetLastError();
}

template <int KD>
cudaError_t sweep_launch(const tdt_gpu_args_t &a, int ring_diags, size_t smem_bytes,
                         cudaStream_t stream) {
    const int64_t diag = a.maxT < a.row ? a.maxT : a.row;
    const int npt = diag > kMaxThreads ? 2 : 1;
    int64_t threads = ((diag + npt - 1) / npt + 31) / 32 * 32;
    if (threads < 32) threads = 32;
    if (threads > kMaxThreads) threads = kMaxThreads;
    const int th = (int)threads;
    if (ring_diags > 0)
        return npt == 2 ? sweep_launch3<KD, true, 2>(a, th, ring_diags, smem_bytes, stream)
                        : sweep_launch3<KD, true, 1>(a, th, ring_diags, smem_bytes, stream);
    return npt == 2 ? sweep_launch3<KD, false, 2>(a, th, 0, 0, stream)
                    : sweep_launch3<KD, false, 1>(a, th, 0, 0, stream);
}

} /* namespace */

#endif /* TDT_GPU_SWEEP_CUH */
