/*
 * grad.cuh - the fused gradient pass (backward, one kernel): token and duration gradients of
 * sum_b g_b * cost_b, written once, upstream scale included.
 *
 * Math (docs/math.md, section 3, "Gradients"): at node (t, u) inside a feasible sample's lattice,
 * tdt_node_grad() (src/common/lattice.h) turns alpha, beta, LL and the arc weights into the
 * occupancy sums; then per token v, with p = softmax(z)_v = exp(z_v - lse) (p = 0 for
 * log-prob inputs),
 *     grad z(t,u,v) = g_b * tdt_token_grad(node, p, v == blank, v == y_{u+1}, clamp)
 * (for v neither blank nor y_{u+1} that is g_b * clip(p * tok_occ), computed as such),
 * and per duration k, with q = exp(lp_dur(t,u,k)) (0 for log-prob inputs),
 *     grad h(t,u,k) = g_b * tdt_duration_grad(node, q, k).
 * Every other element of the padded (B, maxT, maxU + 1, V or D) extent is written 0: nodes with
 * t >= T_b or u > U_b, every node of an infeasible sample (LL = -inf) and of a sample with bad
 * device data (state BAD_DATA, or lengths out of range, so no lattice index is ever formed).
 *
 * Parallel mapping: as normalize.cu, a group of G lanes per node, grid-striding over all
 * nodes; each lane covers its share of the row in 16-byte vectors (scalar head and tail up to
 * the logits row's 16-byte boundaries). Each lane computes the node's coefficients itself: the
 * lanes of a group run them in lock-step, so this costs the same as one lane and needs no
 * shuffles.
 *
 * Race-free, in place included: every gradient element is written by exactly one lane, and
 * that lane has already read the logit at the same position (same thread, load before store)
 * when the gradient aliases the logits; nothing else reads the logits in this kernel, and the
 * workspace is read-only here. No atomics: deterministic.
 *
 * Precision: the node's coefficients in float64 (lattice.h). The bulk of each row, p * occ
 * clipped and scaled, in the accumulate precision (float32; float64 for float64), as the CPU
 * backend does it; the blank and label elements through tdt_token_grad in float64. Each value
 * is rounded once to the dtype.
 * Gradient stores are 16-byte vectors when the gradient row has the logits row's alignment
 * modulo 16, else scalar (a gradient buffer with other strides still works).
 *
 * Limits: none on V, T, U or B beyond memory; int64 offsets.
 */
#ifndef TDT_GPU_GRAD_CUH
#define TDT_GPU_GRAD_CUH

#include "gpu_common.cuh"

namespace {

const int kThreads = 256;

/* Per element type: 16-byte loads in flight per lane (UNROLL) and blocks per SM (MIN_BLOCKS).
 * float32 / float64: 4 loads, 2 blocks (<= 128 registers, no spills; 16 warps per SM).
 * float16 / bfloat16: 2 loads, 3 blocks (<= 80 registers, a few spills; 24 warps per SM): with
 * 8 elements per load, 4 loads made the unrolled row loop too long for the instruction cache
 * (measured on an H200, large bf16: warps stalled 10 cycles per instruction on instruction
 * fetch, backward 3.8 ms against 1.9 ms with 2 loads; see benchmark/NOTES.md). */
template <int DT> struct grad_tuning {
    enum { WIDE = tdt_elem<DT>::VEC >= 8 };
    enum { UNROLL = WIDE ? 2 : 4, MIN_BLOCKS = WIDE ? 3 : 2 };
};

template <int DT> __device__ __forceinline__ void zero_row(typename tdt_elem<DT>::T *g, int64_t n,
                                                           int lane, int G) {
    typedef typename tdt_elem<DT>::T T;
    const int VEC = tdt_elem<DT>::VEC;
    const int64_t head = tdt_row_head<T>(g, n);
    const int64_t nvec = (n - head) / VEC;
    const int64_t tail = head + nvec * VEC;
    for (int64_t i = lane; i < head; i += G) g[i] = T(0);
    tdt_vec<DT> zv;
#pragma unroll
    for (int e = 0; e < VEC; ++e) zv.v[e] = T(0);
    for (int64_t i = lane; i < nvec; i += G) zv.store(g + head + i * VEC);
    for (int64_t i = tail + lane; i < n; i += G) g[i] = T(0);
}

/* What every token element of one node needs. The bulk of the row (v neither blank nor the
 * label) is p * tok_occ, clipped, times g_b: done in the accumulate precision, exactly as the
 * CPU backend's row loop; the two special elements take lattice.h's tdt_token_grad in float64. */
template <typename Acc> struct row_consts {
    Acc lse, occ, clamp, scale;
    double gb;
    int32_t y; /* y_{u+1}, or -1 when u == U_b; compared, never used as an index */
};

/* The gradient of token element v, from its logit x. SPECIAL = false: the caller knows v is
 * neither the blank nor the label (most 16-byte vectors), so the test is skipped. */
template <int DT, bool SPECIAL>
__device__ __forceinline__ typename tdt_elem<DT>::T token_grad_elem(
    const tdt_gpu_args_t &a, const tdt_node_grad_t &ng, const row_consts<typename tdt_elem<DT>::Acc> &rc,
    int64_t v, typename tdt_elem<DT>::T x) {
    typedef tdt_elem<DT> E;
    typedef typename E::Acc Acc;
    const Acc p = a.log_probs ? (Acc)0 : tdt_exp_acc<DT>(E::to_acc(x) - rc.lse);
    if (SPECIAL && (v == a.blank || v == rc.y))
        return E::from_double(rc.gb * tdt_token_grad(&ng, (double)p, v == a.blank, v == rc.y, a.clamp));
    if (a.log_probs) return E::from_acc((Acc)0);
    Acc g = p * rc.occ;
    if (rc.clamp > (Acc)0 && g > rc.clamp) g = rc.clamp; /* g >= 0 here: only the upper clip */
    return E::from_acc(rc.scale * g);
}

template <int DT, int G, int KD>
__global__ void __launch_bounds__(kThreads, grad_tuning<DT>::MIN_BLOCKS) grad_kernel(const tdt_gpu_args_t a) {
    typedef tdt_elem<DT> E;
    typedef typename E::T T;
    typedef typename E::Acc Acc;
    const int VEC = E::VEC;
    const int lane = threadIdx.x & (G - 1);
    const int64_t groups = (int64_t)gridDim.x * (kThreads / G);
    const tdt_arcs_t A = tdt_arcs_fixed<KD>(a.arcs);
    const T *tok = static_cast<const T *>(a.tok);
    T *tok_g = static_cast<T *>(a.tok_g);
    T *dur_g = a.D > 0 ? static_cast<T *>(a.dur_g) : (T *)0;
    const int D = a.D;

    for (int64_t n = (int64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; n < a.nodes;
         n += groups) {
        int64_t b, t, u, Tb, Ub;
        tdt_decode_node(a, n, &b, &t, &u);
        T *gz = tok_g ? tok_g + tdt_row_offset(a.tok_gs, b, t, u) : (T *)0;
        T *gh = dur_g ? dur_g + tdt_row_offset(a.dur_gs, b, t, u) : (T *)0;

        /* The per-sample values depend only on b: issue their loads together (one memory
         * round trip, not three dependent ones). b < B, so each read is in bounds. */
        const int lengths_ok = tdt_sample_lengths(a, b, &Tb, &Ub);
        const int32_t state = a.ws.state[b];
        const double ll = a.ws.ll[b];
        double gb = 1.0;
        if (a.grad_costs)
            gb = a.acc_double ? static_cast<const double *>(a.grad_costs)[b]
                              : (double)static_cast<const float *>(a.grad_costs)[b];
        if (!lengths_ok || state != TDT_GPU_STATE_OK || ll == -TDT_INF || t >= Tb || u > Ub) {
            /* group-uniform: outside the lattice, infeasible, or bad data */
            if (gz) zero_row<DT>(gz, a.V, lane, G);
            if (gh)
                for (int k = lane; k < D; k += G) gh[k] = T(0);
            continue;
        }
        const tdt_lattice_t L = tdt_sample_lattice(a, b, Tb, Ub);
        const int64_t off = tdt_sample_offset(b, a.maxT, a.row);
        const int64_t nl = tdt_node_index(a.maxT, a.row, t, u); /* node inside the sample */
        tdt_node_grad_t ng;
        tdt_node_grad(&L, &A, a.ws.alpha + off, a.ws.beta + off, t, u, ll, a.fastemit_lambda,
                      &ng);

        if (gz) {
            const T *z = tok + tdt_row_offset(a.tok_s, b, t, u);
            row_consts<Acc> rc;
            rc.lse = (Acc)a.ws.lse[off + nl];
            rc.occ = (Acc)ng.tok_occ;
            rc.clamp = (Acc)a.clamp;
            rc.scale = (Acc)gb;
            rc.gb = gb;
            rc.y = u < Ub ? a.labels[b * a.maxU + u] : -1;
            const int64_t V = a.V;
            const int64_t head = tdt_row_head<T>(z, V);
            const int64_t nvec = (V - head) / VEC;
            const int64_t tail = head + nvec * VEC;
            const bool vec_store = (((uintptr_t)gz ^ (uintptr_t)z) & 15u) == 0;

            for (int64_t i = lane; i < head; i += G) gz[i] = token_grad_elem<DT, true>(a, ng, rc, i, z[i]);
            const int kUnroll = grad_tuning<DT>::UNROLL;
            for (int64_t i0 = lane; i0 < nvec; i0 += (int64_t)G * kUnroll) {
                tdt_vec<DT> buf[kUnroll];
#pragma unroll
                for (int j = 0; j < kUnroll; ++j) {
                    int64_t i = i0 + (int64_t)j * G;
                    if (i < nvec) buf[j] = tdt_vec<DT>::load(z + head + i * VEC);
                }
#pragma unroll
                for (int j = 0; j < kUnroll; ++j) {
                    int64_t i = i0 + (int64_t)j * G;
                    if (i < nvec) {
                        const int64_t v0 = head + i * VEC;
                        tdt_vec<DT> o;
                        if ((uint64_t)(a.blank - v0) < (uint64_t)VEC ||
                            (uint64_t)(rc.y - v0) < (uint64_t)VEC) {
#pragma unroll
                            for (int e = 0; e < VEC; ++e)
                                o.v[e] = token_grad_elem<DT, true>(a, ng, rc, v0 + e, buf[j].v[e]);
                        } else {
#pragma unroll
                            for (int e = 0; e < VEC; ++e)
                                o.v[e] = token_grad_elem<DT, false>(a, ng, rc, v0 + e, buf[j].v[e]);
                        }
                        if (vec_store) {
                            o.store(gz + v0);
                        } else {
#pragma unroll
                            for (int e = 0; e < VEC; ++e) gz[v0 + e] = o.v[e];
                        }
                    }
                }
            }
            for (int64_t i = tail + lane; i < V; i += G) gz[i] = token_grad_elem<DT, true>(a, ng, rc, i, z[i]);
        }

        if (gh) {
            const double *lpd = L.lp_dur + nl * D;
            const int kmax = KD > 0 ? KD : TDT_MAX_DURATIONS;
#pragma unroll
            for (int k = 0; k < kmax; ++k) {
                if (k < D && (k % G) == lane) {
                    double q = a.log_probs ? 0.0 : exp(lpd[k]);
                    gh[k] = E::from_double(gb * tdt_duration_grad(&ng, q, k));
                }
            }
        }
    }
}

template <int DT, int G, int KD>
cudaError_t grad_launch_g(const tdt_gpu_args_t &a, int num_sms, cudaStream_t stream) {
    const int64_t per_block = kThreads / G;
    int64_t blocks = (a.nodes + per_block - 1) / per_block;
    const int64_t cap = (int64_t)num_sms * 32;
    if (blocks > cap) blocks = cap;
    if (blocks < 1) blocks = 1;
    grad_kernel<DT, G, KD><<<(unsigned)blocks, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

/* Enqueues the gradient kernel for arc count KD (0: any count), any dtype. */
template <int KD>
cudaError_t grad_launch(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms, cudaStream_t s) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT32:
        return tdt_gpu_group_size(a.V, 4) == 32 ? grad_launch_g<TDT_DTYPE_FLOAT32, 32, KD>(a, num_sms, s)
                                                : grad_launch_g<TDT_DTYPE_FLOAT32, 8, KD>(a, num_sms, s);
    case TDT_DTYPE_FLOAT64:
        return tdt_gpu_group_size(a.V, 2) == 32 ? grad_launch_g<TDT_DTYPE_FLOAT64, 32, KD>(a, num_sms, s)
                                                : grad_launch_g<TDT_DTYPE_FLOAT64, 8, KD>(a, num_sms, s);
    case TDT_DTYPE_FLOAT16:
        return tdt_gpu_group_size(a.V, 8) == 32 ? grad_launch_g<TDT_DTYPE_FLOAT16, 32, KD>(a, num_sms, s)
                                                : grad_launch_g<TDT_DTYPE_FLOAT16, 8, KD>(a, num_sms, s);
    case TDT_DTYPE_BFLOAT16:
        return tdt_gpu_group_size(a.V, 8) == 32 ? grad_launch_g<TDT_DTYPE_BFLOAT16, 32, KD>(a, num_sms, s)
                                                : grad_launch_g<TDT_DTYPE_BFLOAT16, 8, KD>(a, num_sms, s);
    }
    return cudaErrorInvalidValue;
}

} /* namespace */

#endif /* TDT_GPU_GRAD_CUH */
