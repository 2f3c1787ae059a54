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
 * Parallel mapping: a group of G lanes (G = 32, or 8 for short rows) owns one node at a time,
 * grid-striding over all B * maxT * (maxU + 1) nodes. Each lane keeps an online (max, sum)
 * over its share of the row, read as 16-byte vectors (a scalar head up to the row's first
 * 16-byte boundary and a scalar tail; rows of a joint tensor are not all 16-byte aligned), then
 * the group merges the G states with a fixed xor-shuffle tree. Lane 0 writes the node's values.
 *
 * Race-free: every node is owned by exactly one group; each output element has one writer and
 * no element is read after being written in this kernel. Nodes outside a sample's lattice and
 * samples with out-of-range lengths are skipped (nothing read, nothing written); an
 * out-of-range label is never used as an index (lp_label is set to NaN; the sweep then marks
 * the sample bad).
 *
 * Precision: the V-wide (max, sum) in float32 for float32/float16/bfloat16 (as tdt.h
 * promises), in float64 for float64; lse and everything stored is float64. Deterministic: the
 * lane split and the reduction tree depend only on V and the row's alignment, not on timing.
 *
 * Limits: none on V, T, U or B beyond memory; every offset is int64. D <= TDT_MAX_DURATIONS.
 */
#include "gpu_common.cuh"

namespace {

const int kThreads = 256;
const int kUnroll = 4; /* 16-byte loads in flight per lane before they are consumed */

/* Online log-sum-exp state of one lane, in the accumulate precision. */
template <typename Acc> struct lse_state {
    Acc m, s;
};

/* Adds n values (n <= 8) to the state: one rescale per call, one exp per value. A NaN value
 * makes s NaN (fmax skips NaN for the max but the sum does not); all -inf leaves {m, 0}. */
template <int DT, typename Acc, int N>
__device__ __forceinline__ void lse_add(lse_state<Acc> &st, const Acc (&x)[N]) {
    const Acc ninf = -(Acc)INFINITY;
    Acc mv = x[0];
#pragma unroll
    for (int j = 1; j < N; ++j) mv = fmax(mv, x[j]);
    if (mv > st.m) {
        st.s = st.s * tdt_exp_acc<DT>(st.m - mv); /* exp(-inf) = 0 for the first finite value */
        st.m = mv;
    }
    if (st.m != ninf) {
#pragma unroll
        for (int j = 0; j < N; ++j) st.s += tdt_exp_acc<DT>(x[j] - st.m);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (x[j] != x[j]) st.s = x[j]; /* keep a NaN seen while the max is still -inf */
    }
}

/* Merges another lane's online (max, sum) state into st, in Acc. */
template <int DT, typename Acc>
__device__ __forceinline__ void lse_merge(lse_state<Acc> &st, Acc m2, Acc s2) {
    const Acc ninf = -(Acc)INFINITY;
    if (m2 > st.m) {
        st.s = st.s * tdt_exp_acc<DT>(st.m - m2) + s2;
        st.m = m2;
    } else if (m2 != ninf) {
        st.s += s2 * tdt_exp_acc<DT>(m2 - st.m);
    } else if (s2 != s2) {
        st.s = s2; /* NaN from the other lane */
    }
}

/* log sum_v exp z[v] over one row of V elements, the G lanes of a group together. Every lane
 * of the group gets the same result. */
template <int DT, int G>
__device__ double row_logsumexp(const typename tdt_elem<DT>::T *z, int64_t V, int lane,
                                unsigned mask) {
    typedef tdt_elem<DT> E;
    typedef typename E::T T;
    typedef typename E::Acc Acc;
    const int VEC = E::VEC;
    lse_state<Acc> st = {-(Acc)INFINITY, (Acc)0};

    const int64_t head = tdt_row_head<T>(z, V);
    const int64_t nvec = (V - head) / VEC;
    const int64_t tail = head + nvec * VEC;

    for (int64_t i = lane; i < head; i += G) {
        Acc x[1] = {E::to_acc(z[i])};
        lse_add<DT>(st, x);
    }
    const T *zv = z + head;
    for (int64_t i0 = lane; i0 < nvec; i0 += (int64_t)G * kUnroll) {
        tdt_vec<DT> buf[kUnroll];
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
            int64_t i = i0 + (int64_t)j * G;
            if (i < nvec) buf[j] = tdt_vec<DT>::load(zv + i * VEC);
        }
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
            int64_t i = i0 + (int64_t)j * G;
            if (i < nvec) {
                Acc x[VEC];
#pragma unroll
                for (int e = 0; e < VEC; ++e) x[e] = E::to_acc(buf[j].v[e]);
                lse_add<DT>(st, x);
            }
        }
    }
    for (int64_t i = tail + lane; i < V; i += G) {
        Acc x[1] = {E::to_acc(z[i])};
        lse_add<DT>(st, x);
    }

#pragma unroll
    for (int off = G / 2; off > 0; off /= 2) {
        Acc m2 = __shfl_xor_sync(mask, st.m, off, G);
        Acc s2 = __shfl_xor_sync(mask, st.s, off, G);
        lse_merge<DT>(st, m2, s2);
    }
    if (st.m == -(Acc)INFINITY && st.s == (Acc)0) return -TDT_INF; /* all -inf */
    return (double)st.m + log((double)st.s);
}

template <int DT, int G>
__global__ void __launch_bounds__(kThreads) normalize_kernel(const tdt_gpu_args_t a) {
    typedef tdt_elem<DT> E;
    typedef typename E::T T;
    const int lane = threadIdx.x & (G - 1);
    const unsigned mask = tdt_group_mask<G>();
    const int64_t groups = (int64_t)gridDim.x * (kThreads / G);
    const T *tok = static_cast<const T *>(a.tok);
    const T *dur = static_cast<const T *>(a.dur);
    const int D = a.D;

    for (int64_t n = (int64_t)blockIdx.x * (kThreads / G) + threadIdx.x / G; n < a.nodes;
         n += groups) {
        int64_t b, t, u, Tb, Ub;
        tdt_decode_node(a, n, &b, &t, &u);
        if (!tdt_sample_lengths(a, b, &Tb, &Ub) || t >= Tb || u > Ub) continue; /* group-uniform */

        const T *z = tok + tdt_row_offset(a.tok_s, b, t, u);
        double lse = a.log_probs ? 0.0 : row_logsumexp<DT, G>(z, a.V, lane, mask);
        const int64_t nw = tdt_ws_node(a, b, t, u); /* the node in the workspace's order */

        if (lane == 0) {
            a.ws.lse[nw] = lse;
            a.ws.lp_blank[nw] = (double)E::to_acc(z[a.blank]) - lse - a.sigma;
            double lpl = -TDT_INF; /* u == U_b: no label arc leaves this row */
            if (u < Ub) {
                int32_t y = a.labels[b * a.maxU + u];
                lpl = (y >= 0 && y < a.V && y != a.blank)
                          ? (double)E::to_acc(z[y]) - lse - a.sigma
                          : (double)NAN; /* bad label: never indexed; the sweep flags it */
            }
            a.ws.lp_label[nw] = lpl;
        }
        if (D > 0 && lane == (G > 1 ? 1 : 0)) {
            /* The duration row is short (D <= 32): one lane, the shared small log-softmax. */
            const T *h = dur + tdt_row_offset(a.dur_s, b, t, u);
            double hd[TDT_MAX_DURATIONS];
            for (int k = 0; k < D; ++k) hd[k] = (double)E::to_acc(h[k]);
            if (!a.log_probs) tdt_log_softmax_small(hd, D);
            double *out = a.ws.lp_dur + nw * D;
            for (int k = 0; k < D; ++k) out[k] = hd[k];
        }
    }
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

template <int DT> cudaError_t launch_dt(const tdt_gpu_args_t &a, int num_sms, cudaStream_t s) {
    if (tdt_gpu_group_size(a.V, tdt_elem<DT>::VEC) == 32) return launch<DT, 32>(a, num_sms, s);
    return launch<DT, 8>(a, num_sms, s);
}

} /* namespace */

/* ================================================================================================
 * launcher
 * ============================================================================================== */

cudaError_t tdt_launch_normalize(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                                 cudaStream_t stream) {
    if (a.nodes == 0) return cudaSuccess;
    switch (dtype) {
    case TDT_DTYPE_FLOAT32: return launch_dt<TDT_DTYPE_FLOAT32>(a, num_sms, stream);
    case TDT_DTYPE_FLOAT64: return launch_dt<TDT_DTYPE_FLOAT64>(a, num_sms, stream);
    case TDT_DTYPE_FLOAT16: return launch_dt<TDT_DTYPE_FLOAT16>(a, num_sms, stream);
    case TDT_DTYPE_BFLOAT16: return launch_dt<TDT_DTYPE_BFLOAT16>(a, num_sms, stream);
    }
    return cudaErrorInvalidValue;
}
