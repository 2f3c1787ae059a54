/*
 * scale.cu - tdt_scale_gradients() on the GPU: every gradient element inside a sample's lattice
 * times that sample's factor, in place (tdt.h). The factor tdt_forward_ahead()'s gradients
 * were missing; a sample whose factor is exactly 1 is skipped by its blocks before they touch
 * a row, so a call of all ones costs a launch and B reads.
 *
 * A block per (sample, slice of its rows), a warp per row, 16-byte loads and stores (two in
 * flight a lane) between a scalar head and tail, since rows of a joint tensor start anywhere.
 * It runs only for a factor other than 1: one read and one write of the gradient.
 */
#include "gpu_common.cuh"

namespace {

constexpr int kScaleThreads = 256;
constexpr int kScaleUnroll = 2; /* 16-byte vectors a lane has in flight */

/* x times s, rounded once to the element type; zeros stay as they are (their sign too). */
template <int DT>
__device__ __forceinline__ typename tdt_elem<DT>::T scaled(typename tdt_elem<DT>::T x,
                                                          typename tdt_elem<DT>::Acc s) {
    typedef tdt_elem<DT> E;
    const typename E::Acc v = E::to_acc(x);
    return v != 0 ? E::from_acc(v * s) : x;
}

/* A row of n elements times s, by one warp: a scalar head up to the row's first 16-byte
 * boundary, 16-byte vectors, a scalar tail (rows of a joint tensor start anywhere). */
template <int DT>
__device__ __forceinline__ void scale_row(typename tdt_elem<DT>::T *g, int64_t n,
                                          typename tdt_elem<DT>::Acc s, int lane) {
    typedef tdt_elem<DT> E;
    typedef tdt_vec<DT> Vec;
    const int64_t head = tdt_row_head<typename E::T>(g, n);
    const int64_t nv = (n - head) / E::VEC;
    for (int64_t i = lane; i < head; i += 32) g[i] = scaled<DT>(g[i], s);
    typename E::T *body = g + head;
    for (int64_t j0 = lane; j0 < nv; j0 += 32 * kScaleUnroll) {
        Vec x[kScaleUnroll];
#pragma unroll
        for (int k = 0; k < kScaleUnroll; ++k)
            if (j0 + 32 * k < nv) x[k] = Vec::load(body + (j0 + 32 * k) * E::VEC);
#pragma unroll
        for (int k = 0; k < kScaleUnroll; ++k) {
            if (j0 + 32 * k >= nv) continue;
#pragma unroll
            for (int e = 0; e < E::VEC; ++e) x[k].v[e] = scaled<DT>(x[k].v[e], s);
            x[k].store(body + (j0 + 32 * k) * E::VEC);
        }
    }
    for (int64_t i = head + nv * E::VEC + lane; i < n; i += 32) g[i] = scaled<DT>(g[i], s);
}

template <int DT>
__global__ void __launch_bounds__(kScaleThreads) scale_kernel(tdt_gpu_args_t a) {
    typedef tdt_elem<DT> E;
    const int lane = threadIdx.x & 31, warps = kScaleThreads / 32;
    for (int64_t b = blockIdx.y; b < a.B; b += gridDim.y) {
        const double s = tdt_upstream(a.grad_costs, a.acc_double, a.grad_costs_scalar, b, 0, 0, 0);
        int64_t T, U;
        if (s == 1.0 || !tdt_sample_lengths(a, b, &T, &U)) continue; /* bad lengths: grads 0 */
        const int64_t rows = U + 1, nodes = T * rows;
        const typename E::Acc sa = (typename E::Acc)s; /* exact: s has the accumulate type */
        for (int64_t n = (int64_t)blockIdx.x * warps + threadIdx.x / 32; n < nodes;
             n += (int64_t)gridDim.x * warps) {
            const int64_t t = n / rows, u = n - t * rows;
            if (a.tok_g)
                scale_row<DT>(static_cast<typename E::T *>(a.tok_g) + tdt_row_offset(a.tok_gs, b, t, u),
                              a.V, sa, lane);
            if (a.dur_g)
                scale_row<DT>(static_cast<typename E::T *>(a.dur_g) + tdt_row_offset(a.dur_gs, b, t, u),
                              a.D, sa, lane);
        }
    }
}

template <int DT> cudaError_t scale_launch(const tdt_gpu_args_t &a, int num_sms, cudaStream_t stream) {
    /* about 8 blocks an SM over the whole batch, at least one a sample (gridDim.y <= 65535:
     * the blocks stride over further samples) */
    const int64_t by = a.B < 65535 ? a.B : 65535;
    int64_t bx = (8 * (int64_t)num_sms + by - 1) / by;
    const int64_t most = (a.maxT * a.row + kScaleThreads / 32 - 1) / (kScaleThreads / 32);
    if (bx > most) bx = most;
    if (bx < 1) bx = 1;
    scale_kernel<DT><<<dim3((unsigned)bx, (unsigned)by), kScaleThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

} /* namespace */

cudaError_t tdt_launch_scale(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                             cudaStream_t stream) {
    if (a.B == 0 || a.maxT == 0) return cudaSuccess;
    switch (dtype) {
    case TDT_DTYPE_FLOAT32: return scale_launch<TDT_DTYPE_FLOAT32>(a, num_sms, stream);
    case TDT_DTYPE_FLOAT64: return scale_launch<TDT_DTYPE_FLOAT64>(a, num_sms, stream);
    case TDT_DTYPE_FLOAT16: return scale_launch<TDT_DTYPE_FLOAT16>(a, num_sms, stream);
    case TDT_DTYPE_BFLOAT16: return scale_launch<TDT_DTYPE_BFLOAT16>(a, num_sms, stream);
    }
    return cudaErrorInvalidValue;
}
