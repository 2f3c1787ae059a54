/*
 * sweep.cuh - the alpha and beta sweeps over anti-diagonals, the log-likelihood and the cost
 * (forward pass, second kernel).
 *
 * Math (docs/math.md, section 2, "Forward and backward variables"): per sample, with the per-node
 * log-probabilities the normaliser left in the workspace,
 *     alpha(t,u) = tdt_alpha_node(...)   over arcs into (t,u), alpha(0,0) = 0
 *     beta(t,u)  = tdt_beta_node(...)    over arcs out of (t,u), terminal arcs end at 0
 *     LL         = tdt_log_likelihood(...),   cost = -(1 + fastemit_lambda) * LL
 * exactly the functions of src/common/lattice.h that the CPU backend calls. Every arc advances
 * t + u by at least one, so all nodes of anti-diagonal s = t + u depend only on diagonals < s
 * (alpha) or > s (beta).
 *
 * Parallel mapping: one thread block per (sample, direction): block 2b sweeps alpha of sample
 * b, block 2b + 1 beta, so the two sweeps of a sample run concurrently on different SMs and
 * B samples give 2B independent blocks. Inside a block the loop runs over the T_b + U_b
 * diagonals in order; the threads stride over the nodes of the current diagonal (any number of
 * them: U is not capped by the block size), and a __syncthreads() separates diagonals. The
 * alpha / beta values live in the workspace (global memory, L2-resident at these sizes).
 *
 * Race-free: on one diagonal every node has one writer and reads only nodes of other
 * diagonals, written before the previous barrier (a barrier makes a block's global writes
 * visible to the whole block). Alpha and beta blocks write disjoint arrays; only the alpha
 * block writes ll, state and the cost. Bad device data (a length or label out of range) is
 * found first, by both blocks alike (__syncthreads_or over the labels), before any lattice
 * index is formed: such a sample gets state BAD_DATA, LL NaN and cost NaN, and nothing of it
 * is swept.
 *
 * Precision: float64 throughout (lattice.h), for every dtype: log-probabilities of long
 * utterances sum to thousands, and float32 alphas would lose the gradient's occupancies.
 * Deterministic: each node is computed by one thread with lattice.h's fixed arc order.
 *
 * Limits: sequential in T_b + U_b (the dependency chain itself); 512 threads per block.
 * Cost (measured on an H200, 2026-11-30): 3-4 us per diagonal for short diagonals (bound by
 * the latency of each node's float64 exp/log chain), ~7 us for the 401-node diagonals of the
 * `long` shape: the workspace is t-major (n = t * row + u), so the nodes of one diagonal, and
 * their predecessors, sit in different cache lines (stride row - 1) and each node costs some
 * 40 L1/L2 sectors. A diagonal-contiguous node order would fix that; it is the layout's choice
 * (workspace.h / lattice.h), not this kernel's.
 */
#ifndef TDT_GPU_SWEEP_CUH
#define TDT_GPU_SWEEP_CUH

#include "gpu_common.cuh"

namespace {

const int kMaxThreads = 512;

template <int KD>
__global__ void __launch_bounds__(kMaxThreads) sweep_kernel(const tdt_gpu_args_t a) {
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
        bad = __syncthreads_or(bad);
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
        const int64_t off = tdt_sample_offset(b, a.maxT, a.row);
        const int64_t S = tdt_num_diagonals(&L);
        if (!is_beta) {
            double *alpha = a.ws.alpha + off;
            for (int64_t s = 0; s < S; ++s) {
                int64_t lo, hi;
                tdt_diagonal_range(&L, s, &lo, &hi);
                for (int64_t u = lo + tid; u <= hi; u += nthreads)
                    alpha[tdt_node_index(L.row, s - u, u)] = tdt_alpha_node(&L, &A, alpha, s - u, u);
                __syncthreads();
            }
            if (tid == 0) {
                double ll = tdt_log_likelihood(&L, &A, alpha); /* -inf when T == 0 */
                double cost = -(1.0 + a.fastemit_lambda) * ll; /* +inf when infeasible */
                a.ws.ll[b] = ll;
                a.ws.state[b] = TDT_GPU_STATE_OK;
                if (a.acc_double)
                    static_cast<double *>(a.costs)[b] = cost;
                else
                    static_cast<float *>(a.costs)[b] = (float)cost;
            }
        } else {
            double *beta = a.ws.beta + off;
            for (int64_t s = S - 1; s >= 0; --s) {
                int64_t lo, hi;
                tdt_diagonal_range(&L, s, &lo, &hi);
                for (int64_t u = lo + tid; u <= hi; u += nthreads)
                    beta[tdt_node_index(L.row, s - u, u)] = tdt_beta_node(&L, &A, beta, s - u, u);
                __syncthreads();
            }
        }
    }
}

/* Enqueues the sweep for arc count KD (0: any count) with `threads` threads per block. */
template <int KD> cudaError_t sweep_launch(const tdt_gpu_args_t &a, int threads, cudaStream_t stream) {
    int64_t blocks = 2 * a.B;
    if (blocks > 0x7fffffff) blocks = 0x7fffffff;
    sweep_kernel<KD><<<(unsigned)blocks, threads, 0, stream>>>(a);
    return cudaGetLastError();
}

} /* namespace */

#endif /* TDT_GPU_SWEEP_CUH */
