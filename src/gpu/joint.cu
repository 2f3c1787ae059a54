/*
 * joint.cu - the fused joint + loss on the GPU (tdt_gpu_joint_run, internal.h): the costs and
 * the gradients of enc, pred, W and bias from the joint's inputs, never holding the
 * (nodes x (V + D)) logits. include/tdt.h ("The fused joint + loss") states the semantics,
 * docs/joint.md the algorithm; this file is its GPU form, in two schedules: the chunked
 * cuBLASLt products of joint_gemm.cu (the default where cuBLASLt loads, TDT_GPU_JOINT=gemm),
 * and the tiles below (TDT_GPU_JOINT=tiles, and where cuBLASLt does not load);
 * joint_common.cuh holds what they share.
 *
 * The tiles' kernels, in the order a one-shot call enqueues them on the caller's stream:
 *   joint_fwd_kernel     per tile of T lattice nodes (padded (b, t, u) order): h = dropout(act(
 *                        enc + pred)) into shared memory, then W's rows T at a time (staged kKC
 *                        columns of H at a time), z = W h + bias accumulated per (node, row), a
 *                        running log-sum-exp over the token rows, the blank, label and duration
 *                        logits kept; at the end each node's block as the normaliser writes it
 *                        (workspace.h: lp_blank, lp_label, the duration log-softmax, lse)
 *   the sweeps           the lattice's own forward (tdt_gpu_run on the call's lattice part,
 *                        schedule SERIAL: its normaliser is skipped where there are no token
 *                        logits, sweep.cuh's forward_enqueue), alpha and beta, costs, reduction
 *   joint_dnode_kernel   backward, per chunk of R (b, t) rows of nodes (joint_plan.h), per tile
 *                        of T nodes: h again, and for each tile of W's rows z again, dz (the
 *                        softmax term times the node's occupancy, minus the blank and label
 *                        terms, clamp, FastEmit, upstream: lattice.h's tdt_token_grad and
 *                        tdt_duration_grad), d h += dz W in shared memory; then d(enc + pred) =
 *                        d h * dropout's mask and scale * act' into the chunk's scratch dx
 *   joint_denc_kernel    d enc[b, t] = sum over u of the chunk's dx (a fixed order), written
 *   joint_dpred_kernel   d pred[b, u] += sum over t of the chunk's dx (a fixed order), into an
 *                        accumulator; joint_pred_out_kernel writes it once every chunk is in
 *   joint_dw_kernel      per tile of T rows of W and partition p of the node tiles (tiles p,
 *                        p + P, ...): h, z, dz again, d W += dz^T h and d bias += sum dz in
 *                        shared memory, written to the partition's scratch;
 *                        joint_dw_out_kernel sums the P partitions in order and writes them
 * So the backward runs four GEMM passes (z twice, dz W, dz^T h) and the forward one: five in
 * all, where a backward keeping dz would need three.
 *
 * Tensor cores: float16 and bfloat16 in tiles of 32 take z's tiles (the three z passes) with
 * mma.sync m16n8k16 on sm_80 and later (tc_path, z_tile_mma); d h and d W, and everything of
 * float32 (never TF32) and float64, run on the CUDA cores.
 *
 * Precision: z, the running log-sum-exp, d h, d W and every sum in the accumulate type (float
 * for float32 / float16 / bfloat16, double for float64), as the CPU backend; h as well, but on
 * the tensor-core path, whose h is rounded to the dtype (its operand); the node's values,
 * occupancies and dz's formula in float64, dz rounded to the accumulate type; each gradient
 * rounded once to the dtype.
 *
 * Deterministic: every sum has one fixed order, set by the shapes and by T (which depends on
 * the device's shared memory alone): the tile's k loop (an mma's own order on tensor cores),
 * the xor-shuffle trees of the running
 * log-sum-exp, d h over W's row tiles in order, d enc over u, d pred over t chunk by chunk,
 * d W over a partition's node tiles in order and then over the partitions in order. No atomics.
 *
 * No allocation, no host synchronisation, nothing but launches and one memset on the caller's
 * stream (capturable in a CUDA graph); the caller's current device is restored.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "joint_common.cuh"

namespace {

const int kThreads = 256;
const int kKC = 32; /* columns of H in one staged chunk of W's rows */


/* 16 bytes of the accumulate type: the vector the tiles' loops read shared memory in. */
template <typename A> struct vec16;
template <> struct vec16<float> {
    typedef float4 V;
    enum { N = 4 };
    static __device__ __forceinline__ float at(const V &v, int i) {
        return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
    }
};
template <> struct vec16<double> {
    typedef double2 V;
    enum { N = 2 };
    static __device__ __forceinline__ double at(const V &v, int i) { return i == 0 ? v.x : v.y; }
};
template <typename A> __device__ __forceinline__ typename vec16<A>::V ld16(const A *p) {
    return *reinterpret_cast<const typename vec16<A>::V *>(p);
}

/* Where z's tiles run on tensor cores (z_tile_mma): float16 and bfloat16 in tiles of 32, on
 * sm_80 and later. Their h is then held in the dtype (rounded once: the tensor cores' operand),
 * for every use of it, on every device, so a device without the path (sm_75: z_tile's CUDA-core
 * loop over the same rounded h) computes the same function. */
template <int DT, int T> struct tc_path {
    enum { ON = (DT == TDT_DTYPE_FLOAT16 || DT == TDT_DTYPE_BFLOAT16) && T == 32 };
    typedef typename std::conditional<ON, typename tdt_elem<DT>::T, acc_t<DT>>::type H; /* h's type */
};

/* The tiles' shared memory (bytes), every array and row 16-byte aligned: hs (T rows of h, pitch
 * hsp: H rounded up to kKC, the padding zero; 8 more on the tensor-core path, so that a
 * fragment's rows fall on distinct banks), for the backward d h or d W (T rows of pitch hp, H
 * rounded up to kKC, in the accumulate type), ws (T rows of a staged chunk of W, pitch kKC plus
 * one vector: the rows' vectors fall on distinct banks; the tensor-core path stages its
 * 16-bit chunk there) and dz (T rows of pitch dzp, T rounded up to a vector plus
 * one; the tensor-core path's z tile passes through it too). */
template <int DT, int T> struct smem_layout {
    typedef acc_t<DT> A;
    enum { VE = vec16<A>::N, WP = kKC + VE };
    int64_t hp, hsp, dzp;
    size_t dh_off, ws_off, dz_off, bytes;
    __host__ __device__ smem_layout(int64_t H, bool backward) {
        hp = (H + kKC - 1) / kKC * kKC;
        hsp = tc_path<DT, T>::ON ? hp + 8 : hp;
        dzp = (T + VE - 1) / VE * VE + VE;
        dh_off = ((size_t)T * (size_t)hsp * sizeof(typename tc_path<DT, T>::H) + 15) / 16 * 16;
        ws_off = dh_off + (backward ? (size_t)T * (size_t)hp * sizeof(A) : 0);
        dz_off = ws_off + (size_t)T * WP * sizeof(A);
        bytes = dz_off + (size_t)T * (size_t)dzp * sizeof(A);
    }
};


/* The tile's h into hs (T rows of pitch hsp), zeros for nodes that are not valid and in the
 * padding; in h's type (tc_path). */
template <int DT, int T>
__device__ __forceinline__ void build_h(const joint_args &a, const node_info *ni,
                                        typename tc_path<DT, T>::H *hs, int64_t hsp) {
    for (int64_t idx = threadIdx.x; idx < (int64_t)T * hsp; idx += kThreads) {
        const int m = (int)(idx / hsp);
        const int64_t k = idx - (int64_t)m * hsp;
        acc_t<DT> x, keep, h = 0;
        if (ni[m].valid && k < a.H) h = hidden<DT>(a, ni[m], k, &x, &keep);
        if constexpr (tc_path<DT, T>::ON) hs[idx] = tdt_elem<DT>::from_acc(h);
        else hs[idx] = h;
    }
}

/* Element i of hs in the accumulate type. */
template <int DT, int T> __device__ __forceinline__ acc_t<DT> h_at(const typename tc_path<DT, T>::H *hs, int64_t i) {
    if constexpr (tc_path<DT, T>::ON) return tdt_elem<DT>::to_acc(hs[i]);
    else return hs[i];
}

/* W's rows o0 .. o0 + T - 1, columns k0 .. k0 + kKC - 1, into ws (zeros past O and H); ends
 * with a barrier. */
template <int DT, int T>
__device__ __forceinline__ void stage_w(const joint_args &a, acc_t<DT> *ws, int64_t o0, int64_t k0) {
    for (int idx = threadIdx.x; idx < T * kKC; idx += kThreads) {
        const int r = idx / kKC, c = idx - r * kKC;
        const int64_t o = o0 + r, k = k0 + c;
        ws[r * smem_layout<DT, T>::WP + c] = (o < a.O && k < a.H) ? ld<DT>(a.W, o * a.W_s + k) : (acc_t<DT>)0;
    }
    __syncthreads();
}

/* The thread's elements of a T x T tile: element e = threadIdx.x + kThreads * i is node
 * m = e / T, row o0 + e % T of W, for e < T * T. A node's T elements are T consecutive lanes
 * of one warp (T <= 32 divides kThreads), so a row's reductions are shuffles of width T. */
template <int T> struct tile_shape {
    enum { PER = (T * T + kThreads - 1) / kThreads };
    static __device__ __forceinline__ int e(int i) { return threadIdx.x + kThreads * i; }
    static __device__ __forceinline__ int m(int i) { return e(i) / T; }
    static __device__ __forceinline__ int o(int i) { return e(i) % T; }
    static __device__ __forceinline__ bool on(int i) { return e(i) < T * T; }
};

/* ---- tensor cores (sm_80 and later): mma.sync.aligned.m16n8k16, float32 accumulation --------
 * The fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16 / .bf16 operands), for
 * lane l of a warp, g = l / 4 (its group) and q = l % 4 (its place in the group); a 32-bit
 * register holds two 16-bit elements, the one of the lower k in its lower half:
 *   A (16 x 16, row-major, rows m, columns k): a0 = A[g][2q, 2q+1], a1 = A[g+8][2q, 2q+1],
 *       a2 = A[g][2q+8, 2q+9], a3 = A[g+8][2q+8, 2q+9]
 *   B (16 x 8, "col": element (k, n) of B, for n the column): b0 = B[2q, 2q+1][g],
 *       b1 = B[2q+8, 2q+9][g]; here B[k][n] = W[n][k], so both are pairs of one row of W
 *   C, D (16 x 8, float32): d0 = D[g][2q], d1 = D[g][2q+1], d2 = D[g+8][2q], d3 = D[g+8][2q+1]
 * So every operand register is one aligned 32-bit load of two neighbours of a row in shared
 * memory (frag_ld), and the indices above are the only fragment arithmetic (z_tile_mma). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
__device__ __forceinline__ uint32_t frag_ld(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

template <int DT>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    if constexpr (DT == TDT_DTYPE_BFLOAT16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* z_tile on tensor cores, a tile of 32 nodes x 32 rows of W: warp w takes the 16 x 8 block of
 * nodes 16 (w / 4) .. + 15 and rows 8 (w % 4) .. + 7, one mma a 16 columns of H; W's chunk is
 * staged as its raw 16-bit values into w16 (pitch kW16 = kKC + 8: a fragment's rows fall on
 * distinct banks), h is hs (pitch hsp, 16-bit). The block
 * goes through zs (pitch zsp) to the thread's elements of tile_shape<32>. Ends with a barrier. */
template <int DT>
__device__ __forceinline__ void z_tile_mma(const joint_args &a, const uint16_t *hs, int64_t hsp, uint16_t *w16,
                                           float *zs, int64_t zsp, int64_t o0,
                                           float (&acc)[tile_shape<32>::PER]) {
    typedef tile_shape<32> S;
    const int kW16 = kKC + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int mb = 16 * (warp >> 2), nb = 8 * (warp & 3);
    const uint16_t *W = static_cast<const uint16_t *>(a.W);
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t k0 = 0; k0 < a.H; k0 += kKC) {
        for (int idx = threadIdx.x; idx < 32 * kKC; idx += kThreads) {
            const int r = idx / kKC, c = idx - r * kKC;
            const int64_t o = o0 + r, k = k0 + c;
            w16[r * kW16 + c] = (o < a.O && k < a.H) ? W[o * a.W_s + k] : (uint16_t)0;
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < kKC; ks += 16) {
            const uint16_t *pa = hs + (mb + g) * hsp + k0 + ks + 2 * q; /* A[g][2q] */
            const uint16_t *pb = w16 + (nb + g) * kW16 + ks + 2 * q;    /* B[2q][g] = W[g][2q] */
            mma16816<DT>(d, frag_ld(pa), frag_ld(pa + 8 * hsp), frag_ld(pa + 8), frag_ld(pa + 8 * hsp + 8),
                         frag_ld(pb), frag_ld(pb + 8));
        }
        __syncthreads();
    }
    float *pz = zs + (mb + g) * zsp + nb + 2 * q; /* D[g][2q] */
    pz[0] = d[0];
    pz[1] = d[1];
    pz[8 * zsp] = d[2];
    pz[8 * zsp + 1] = d[3];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < S::PER; ++i) acc[i] = zs[S::m(i) * zsp + S::o(i)];
    __syncthreads();
}
#endif

/* acc[i] = sum over k (ascending) of hs[m][k] W[o0 + o][k] for the thread's elements, W staged
 * through ws, both read in 16-byte vectors (h's a broadcast: a warp's lanes share m for T = 32).
 * The last chunk runs to its end over zeros (H's padding in hs and ws). Every thread of the
 * block calls it; ends with a barrier. */
template <int DT, int T>
__device__ __forceinline__ void z_tile(const joint_args &a, const typename tc_path<DT, T>::H *hs, int64_t hsp,
                                       acc_t<DT> *ws, acc_t<DT> *zs, int64_t zsp, int64_t o0,
                                       acc_t<DT> (&acc)[tile_shape<T>::PER]) {
    typedef tile_shape<T> S;
    typedef acc_t<DT> A;
    typedef vec16<A> X;
    enum { WP = smem_layout<DT, T>::WP };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (tc_path<DT, T>::ON) {
        z_tile_mma<DT>(a, hs, hsp, reinterpret_cast<uint16_t *>(ws), zs, zsp, o0, acc);
        return;
    }
#endif
    (void)zs;
    (void)zsp;
#pragma unroll
    for (int i = 0; i < S::PER; ++i) acc[i] = 0;
    for (int64_t k0 = 0; k0 < a.H; k0 += kKC) {
        stage_w<DT, T>(a, ws, o0, k0);
        const A *wr = ws + S::o(0) * WP; /* o is the same for every i */
        if constexpr (tc_path<DT, T>::ON) { /* 16-bit h (a device before sm_80): one at a time */
#pragma unroll
            for (int i = 0; i < S::PER; ++i) {
                if (!S::on(i)) continue;
                for (int c = 0; c < kKC; ++c)
                    acc[i] = fma(h_at<DT, T>(hs, S::m(i) * hsp + k0 + c), wr[c], acc[i]);
            }
        } else {
#pragma unroll
            for (int c = 0; c < kKC; c += X::N) {
                const typename X::V w = ld16(wr + c);
#pragma unroll
                for (int i = 0; i < S::PER; ++i) {
                    if (!S::on(i)) continue;
                    const typename X::V h = ld16(hs + S::m(i) * hsp + k0 + c);
#pragma unroll
                    for (int q = 0; q < X::N; ++q) acc[i] = fma(X::at(h, q), X::at(w, q), acc[i]);
                }
            }
        }
        __syncthreads();
    }
}

/* Max and sum over the T lanes of a node's elements (every lane of the warp takes part). */
template <int T, typename A> __device__ __forceinline__ A row_max(A x) {
#pragma unroll
    for (int off = T / 2; off > 0; off /= 2) x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, off, T));
    return x;
}
template <int T, typename A> __device__ __forceinline__ A row_sum(A x) {
#pragma unroll
    for (int off = T / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off, T);
    return x;
}

/* The backward kernels' arrays in the dynamic shared memory (smem_layout): h, d h or d W (acc2),
 * W's staged chunk, dz. */
template <int DT, int T> struct bwd_smem {
    typedef acc_t<DT> A;
    typename tc_path<DT, T>::H *hs;
    A *acc2, *ws, *dzs;
    int64_t hp, hsp, dzp;
    __device__ __forceinline__ bwd_smem(void *base, int64_t H) {
        const smem_layout<DT, T> sl(H, true);
        char *const sm = static_cast<char *>(base);
        hs = reinterpret_cast<typename tc_path<DT, T>::H *>(sm);
        acc2 = reinterpret_cast<A *>(sm + sl.dh_off);
        ws = reinterpret_cast<A *>(sm + sl.ws_off);
        dzs = reinterpret_cast<A *>(sm + sl.dz_off);
        hp = sl.hp;
        hsp = sl.hsp;
        dzp = sl.dzp;
    }
};

/* Dynamic shared memory of the tile kernels (smem_layout). */
template <int DT, int T> static inline size_t dyn_bytes(int64_t H, bool backward) {
    return smem_layout<DT, T>(H, backward).bytes;
}

/* ================================================================================================
 * forward
 * ============================================================================================== */

template <int DT, int T>
__global__ void __launch_bounds__(kThreads) joint_fwd_kernel(const __grid_constant__ joint_args a) {
    typedef acc_t<DT> A;
    typedef tile_shape<T> S;
    typedef typename tc_path<DT, T>::H HE;
    extern __shared__ uint4 joint_smem[];
    const smem_layout<DT, T> sl(a.H, false);
    const int64_t hsp = sl.hsp;
    char *const sm = reinterpret_cast<char *>(joint_smem);
    HE *hs = reinterpret_cast<HE *>(sm);
    A *ws = reinterpret_cast<A *>(sm + sl.ws_off);
    A *zs = reinterpret_cast<A *>(sm + sl.dz_off);
    __shared__ node_info ni[T];
    __shared__ A s_zb[T], s_zy[T], s_zd[T][TDT_MAX_DURATIONS];
    __shared__ double s_lse[T];
    const A ninf = -(A)INFINITY;
    const int64_t tiles = (a.nodes + T - 1) / T;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) { /* block-uniform */
        if (threadIdx.x < T) {
            int64_t Tb, Ub;
            node_decode(a, tile * T + threadIdx.x, a.nodes, &ni[threadIdx.x], &Tb, &Ub);
        }
        if (!__syncthreads_or(threadIdx.x < T && ni[threadIdx.x].valid)) continue;
        build_h<DT, T>(a, ni, hs, hsp);
        __syncthreads();
        A rm[S::PER], rs[S::PER];
#pragma unroll
        for (int i = 0; i < S::PER; ++i) rm[i] = ninf, rs[i] = 0;
        for (int64_t o0 = 0; o0 < a.O; o0 += T) {
            A acc[S::PER];
            z_tile<DT, T>(a, hs, hsp, ws, zs, sl.dzp, o0, acc);
#pragma unroll
            for (int i = 0; i < S::PER; ++i) {
                const int m = S::m(i) < T ? S::m(i) : 0;
                const int64_t o = o0 + S::o(i);
                const bool on = S::on(i) && o < a.O;
                A z = acc[i];
                if (on && a.bias) z += ld<DT>(a.bias, o);
                const bool tok = on && o < a.V;
                const A mx = row_max<T>(tok ? z : ninf);
                const A mn = max_nan(rm[i], mx);
                const A e = tok && z != ninf ? tdt_exp_acc<DT>(z - mn) : (A)0;
                const A s = row_sum<T>(e);
                rs[i] = (rm[i] == ninf ? (A)0 : rs[i] * tdt_exp_acc<DT>(rm[i] - mn)) + s;
                rm[i] = mn;
                if (on) {
                    if (o == a.blank) s_zb[m] = z;
                    if (o == ni[m].y) s_zy[m] = z;
                    if (o >= a.V) s_zd[m][o - a.V] = z;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < S::PER; ++i)
            if (S::on(i) && S::o(i) == 0)
                s_lse[S::m(i)] = rm[i] == ninf ? -TDT_INF : (double)rm[i] + log((double)rs[i]);
        __syncthreads();
        if (threadIdx.x < T && ni[threadIdx.x].valid) {
            const int m = threadIdx.x;
            const node_info &n = ni[m];
            node_block<A>(a, n, s_lse[m], s_zb[m], n.has_label && n.y >= 0 ? s_zy[m] : (A)0, s_zd[m]);
        }
        __syncthreads(); /* the tile's shared values read before the next tile's */
    }
}

/* ================================================================================================
 * backward
 * ============================================================================================== */


/* dz of the thread's elements of the tile at o0 into dzs (T rows of pitch dzp): upstream times
 * tdt_token_grad / tdt_duration_grad, 0 for nodes that are not valid and rows past O. Ends with a
 * barrier. */
template <int DT, int T>
__device__ __forceinline__ void dz_tile(const joint_args &a, const node_info *ni, const node_coef *nc,
                                        const acc_t<DT> (&acc)[tile_shape<T>::PER], int64_t o0,
                                        acc_t<DT> *dzs, int64_t dzp) {
    typedef tile_shape<T> S;
#pragma unroll
    for (int i = 0; i < S::PER; ++i) {
        if (!S::on(i)) continue;
        const int m = S::m(i);
        const int64_t o = o0 + S::o(i);
        double d = 0.0;
        if (ni[m].valid && o < a.O) {
            acc_t<DT> z = acc[i];
            if (a.bias) z += ld<DT>(a.bias, o);
            d = node_dz(a, ni[m], nc[m], o, z);
        }
        dzs[m * dzp + S::o(i)] = (acc_t<DT>)d;
    }
    __syncthreads();
}

/* The chunk's nodes [chunk_row0 * row, (chunk_row0 + chunk_rows) * row), T a tile: d(enc + pred)
 * of each into dx (0 for nodes outside a feasible lattice). */
template <int DT, int T>
__global__ void __launch_bounds__(kThreads) joint_dnode_kernel(const __grid_constant__ joint_args a) {
    typedef acc_t<DT> A;
    typedef tile_shape<T> S;
    typedef vec16<A> X;
    enum { WP = smem_layout<DT, T>::WP, PER2 = (T * kKC + kThreads - 1) / kThreads };
    extern __shared__ uint4 joint_smem[];
    const bwd_smem<DT, T> sm(joint_smem, a.H);
    const int64_t hp = sm.hp, hsp = sm.hsp, dzp = sm.dzp;
    typename tc_path<DT, T>::H *const hs = sm.hs;
    A *const dh = sm.acc2, *const ws = sm.ws, *const dzs = sm.dzs;
    __shared__ node_info ni[T];
    __shared__ node_coef nc[T];
    const int64_t first = a.chunk_row0 * a.row, count = a.chunk_rows * a.row;
    A *const dx = static_cast<A *>(a.dx);
    const int64_t tiles = (count + T - 1) / T;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        if (threadIdx.x < T)
            node_setup_bwd(a, first + tile * T + threadIdx.x, first + count, &ni[threadIdx.x], &nc[threadIdx.x]);
        const bool any = __syncthreads_or(threadIdx.x < T && ni[threadIdx.x].valid);
        if (any) {
            build_h<DT, T>(a, ni, hs, hsp);
            for (int64_t idx = threadIdx.x; idx < (int64_t)T * hp; idx += kThreads) dh[idx] = 0;
            __syncthreads();
            for (int64_t o0 = 0; o0 < a.O; o0 += T) {
                A acc[S::PER];
                z_tile<DT, T>(a, hs, hsp, ws, dzs, dzp, o0, acc);
                dz_tile<DT, T>(a, ni, nc, acc, o0, dzs, dzp);
                /* d h[m][k] += sum over the tile's rows r (ascending) of dz[m][r] W[o0 + r][k]:
                 * the thread's column c = its lane, its nodes m = warp + 8 j (j < PER2), dz read
                 * in vectors (a broadcast), each W value once for its PER2 nodes */
                const int c = threadIdx.x & 31, m0 = threadIdx.x >> 5;
                for (int64_t k0 = 0; k0 < a.H; k0 += kKC) {
                    stage_w<DT, T>(a, ws, o0, k0);
                    A s[PER2];
#pragma unroll
                    for (int j = 0; j < PER2; ++j) s[j] = 0;
#pragma unroll
                    for (int r = 0; r < T; r += X::N) {
                        A w[X::N];
#pragma unroll
                        for (int q = 0; q < X::N; ++q) w[q] = r + q < T ? ws[(r + q) * WP + c] : (A)0;
#pragma unroll
                        for (int j = 0; j < PER2; ++j) {
                            if (m0 + 8 * j >= T) continue;
                            const typename X::V d = ld16(dzs + (m0 + 8 * j) * dzp + r);
#pragma unroll
                            for (int q = 0; q < X::N; ++q)
                                if (r + q < T) s[j] = fma(X::at(d, q), w[q], s[j]);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < PER2; ++j)
                        if (m0 + 8 * j < T) dh[(m0 + 8 * j) * hp + k0 + c] += s[j];
                    __syncthreads();
                }
            }
        }
        /* d(enc + pred) = d h * keep * act'(x) */
        for (int64_t idx = threadIdx.x; idx < (int64_t)T * a.H; idx += kThreads) {
            const int m = (int)(idx / a.H);
            const int64_t k = idx - (int64_t)m * a.H;
            const int64_t n = tile * T + m;
            if (n >= count) continue;
            dx[n * a.H + k] = any && ni[m].valid ? node_dx<DT>(a, ni[m], k, dh[m * hp + k]) : (A)0;
        }
        __syncthreads();
    }
}


/* d W and d bias of W's rows o0 = blockIdx.x * T .. o0 + T - 1 over the node tiles
 * blockIdx.y, blockIdx.y + P, ... (in order), into partition blockIdx.y's scratch. */
template <int DT, int T>
__global__ void __launch_bounds__(kThreads) joint_dw_kernel(const __grid_constant__ joint_args a) {
    typedef acc_t<DT> A;
    typedef tile_shape<T> S;
    typedef vec16<A> X;
    extern __shared__ uint4 joint_smem[];
    const bwd_smem<DT, T> sm(joint_smem, a.H);
    const int64_t hp = sm.hp, hsp = sm.hsp, dzp = sm.dzp;
    typename tc_path<DT, T>::H *const hs = sm.hs;
    A *const dw = sm.acc2, *const ws = sm.ws, *const dzs = sm.dzs;
    __shared__ node_info ni[T];
    __shared__ node_coef nc[T];
    __shared__ A db[T];
    const int64_t o0 = (int64_t)blockIdx.x * T;
    for (int64_t idx = threadIdx.x; idx < (int64_t)T * hp; idx += kThreads) dw[idx] = 0;
    if (threadIdx.x < T) db[threadIdx.x] = 0;
    const int64_t tiles = (a.nodes + T - 1) / T;
    for (int64_t tile = blockIdx.y; tile < tiles; tile += a.parts) {
        if (threadIdx.x < T) node_setup_bwd(a, tile * T + threadIdx.x, a.nodes, &ni[threadIdx.x], &nc[threadIdx.x]);
        if (!__syncthreads_or(threadIdx.x < T && ni[threadIdx.x].valid)) continue;
        build_h<DT, T>(a, ni, hs, hsp);
        __syncthreads();
        A acc[S::PER];
        z_tile<DT, T>(a, hs, hsp, ws, dzs, dzp, o0, acc);
        dz_tile<DT, T>(a, ni, nc, acc, o0, dzs, dzp);
        /* d W[o0 + r][k] += sum over the tile's nodes m (ascending) of dz[m][r] h[m][k]: the
         * thread's column k, all T rows r in registers, dz read in vectors (a broadcast) */
        for (int64_t k = threadIdx.x; k < a.H; k += kThreads) {
            A s[T];
#pragma unroll
            for (int r = 0; r < T; ++r) s[r] = 0;
            for (int m = 0; m < T; ++m) {
                const A h = h_at<DT, T>(hs, m * hsp + k);
#pragma unroll
                for (int r = 0; r < T; r += X::N) {
                    const typename X::V d = ld16(dzs + m * dzp + r);
#pragma unroll
                    for (int q = 0; q < X::N; ++q)
                        if (r + q < T) s[r + q] = fma(X::at(d, q), h, s[r + q]);
                }
            }
#pragma unroll
            for (int r = 0; r < T; ++r) dw[r * hp + k] += s[r];
        }
        if (threadIdx.x < T) {
            A s = 0;
            for (int m = 0; m < T; ++m) s += dzs[m * dzp + threadIdx.x];
            db[threadIdx.x] += s;
        }
        __syncthreads();
    }
    __syncthreads();
    A *wp = static_cast<A *>(a.w_part) + (int64_t)blockIdx.y * a.O * a.H;
    A *bp = static_cast<A *>(a.b_part) + (int64_t)blockIdx.y * a.O;
    for (int64_t e = threadIdx.x; e < (int64_t)T * a.H; e += kThreads) {
        const int r = (int)(e / a.H);
        const int64_t k = e - (int64_t)r * a.H;
        if (o0 + r < a.O) wp[(o0 + r) * a.H + k] = dw[r * hp + k];
    }
    if (threadIdx.x < T && o0 + threadIdx.x < a.O) bp[o0 + threadIdx.x] = db[threadIdx.x];
}

/* ================================================================================================
 * host
 * ============================================================================================== */


template <int DT> size_t static_bytes(int T) {
    return (size_t)T * (sizeof(node_info) + sizeof(node_coef) + sizeof(acc_t<DT>)) + 1024;
}

/* The largest tile whose backward fits the device's shared memory a block, or 0. */
template <int DT, int T> bool tile_fits(int64_t H, size_t smem_max) {
    return dyn_bytes<DT, T>(H, true) + static_bytes<DT>(T) <= smem_max;
}
template <int DT> int tile_for(int64_t H, size_t smem_max) {
    return tile_fits<DT, 32>(H, smem_max) ? 32 : tile_fits<DT, 16>(H, smem_max) ? 16
         : tile_fits<DT, 8>(H, smem_max)  ? 8  : tile_fits<DT, 2>(H, smem_max)  ? 2 : 0;
}

struct joint_run {
    const tdt_joint_call_t *call;
    joint_args a;
    int num_sms;
    cudaStream_t stream;

    template <int DT, int T> cudaError_t forward() const {
        if (a.nodes == 0) return cudaSuccess;
        const size_t smem = dyn_bytes<DT, T>(a.H, false);
        cudaError_t e = tdt_allow_smem(joint_fwd_kernel<DT, T>, smem);
        if (e != cudaSuccess) return e;
        int64_t blocks = (a.nodes + T - 1) / T;
        if (blocks > (int64_t)num_sms * 8) blocks = (int64_t)num_sms * 8;
        joint_fwd_kernel<DT, T><<<(unsigned)blocks, kThreads, smem, stream>>>(a);
        return cudaGetLastError();
    }

    template <int DT, int T> cudaError_t backward(const tdt_gpu_joint_plan_t &plan) const {
        typedef acc_t<DT> A;
        const size_t smem = dyn_bytes<DT, T>(a.H, true);
        cudaError_t e;
        joint_args c = a;
        if (a.enc_g || a.pred_g) {
            e = tdt_allow_smem(joint_dnode_kernel<DT, T>, smem);
            if (e != cudaSuccess) return e;
            if (a.pred_g) {
                e = cudaMemsetAsync(a.pred_acc, 0, (size_t)(a.B * a.row * a.H) * sizeof(A), stream);
                if (e != cudaSuccess) return e;
            }
            const int64_t rows = a.B * a.maxT;
            for (int64_t r0 = 0; r0 < rows; r0 += plan.rows) {
                c.chunk_row0 = r0;
                c.chunk_rows = rows - r0 < plan.rows ? rows - r0 : plan.rows;
                int64_t blocks = (c.chunk_rows * a.row + T - 1) / T;
                if (blocks > (int64_t)num_sms * 8) blocks = (int64_t)num_sms * 8;
                joint_dnode_kernel<DT, T><<<(unsigned)blocks, kThreads, smem, stream>>>(c);
                if ((e = cudaGetLastError()) != cudaSuccess) return e;
                if (a.enc_g) {
                    joint_denc_kernel<DT><<<reduce_blocks(c.chunk_rows, a.H, num_sms), 256, 0, stream>>>(c);
                    if ((e = cudaGetLastError()) != cudaSuccess) return e;
                }
                if (a.pred_g) {
                    joint_dpred_kernel<DT><<<reduce_blocks(a.row, a.H, num_sms), 256, 0, stream>>>(c);
                    if ((e = cudaGetLastError()) != cudaSuccess) return e;
                }
            }
            if (a.pred_g) {
                joint_pred_out_kernel<DT><<<flat_blocks(a.B * a.row * a.H, num_sms), 256, 0, stream>>>(a);
                if ((e = cudaGetLastError()) != cudaSuccess) return e;
            }
        }
        if (a.W_g || a.bias_g) {
            e = tdt_allow_smem(joint_dw_kernel<DT, T>, smem);
            if (e != cudaSuccess) return e;
            const dim3 grid((unsigned)((a.O + T - 1) / T), (unsigned)a.parts, 1);
            joint_dw_kernel<DT, T><<<grid, kThreads, smem, stream>>>(a);
            if ((e = cudaGetLastError()) != cudaSuccess) return e;
            joint_dw_out_kernel<DT><<<flat_blocks(a.O * a.H + a.O, num_sms), 256, 0, stream>>>(a);
            if ((e = cudaGetLastError()) != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
};


struct fwd_go {
    const joint_run &r;
    template <int DT, int T> cudaError_t go() const { return r.template forward<DT, T>(); }
};
struct bwd_go {
    const joint_run &r;
    const tdt_gpu_joint_plan_t &plan;
    template <int DT, int T> cudaError_t go() const { return r.template backward<DT, T>(plan); }
};

template <int DT, typename F> cudaError_t with_tile(int T, F f) {
    switch (T) {
    case 32: return f.template go<DT, 32>();
    case 16: return f.template go<DT, 16>();
    case 8: return f.template go<DT, 8>();
    default: return f.template go<DT, 2>();
    }
}
template <typename F> cudaError_t with_dtype_tile(tdt_dtype_t dtype, int T, F f) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT32: return with_tile<TDT_DTYPE_FLOAT32>(T, f);
    case TDT_DTYPE_FLOAT64: return with_tile<TDT_DTYPE_FLOAT64>(T, f);
    case TDT_DTYPE_FLOAT16: return with_tile<TDT_DTYPE_FLOAT16>(T, f);
    case TDT_DTYPE_BFLOAT16: return with_tile<TDT_DTYPE_BFLOAT16>(T, f);
    }
    return cudaErrorInvalidValue;
}

int tile_of(tdt_dtype_t dtype, int64_t H, size_t smem_max) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return tile_for<TDT_DTYPE_FLOAT64>(H, smem_max);
    case TDT_DTYPE_FLOAT16: return tile_for<TDT_DTYPE_FLOAT16>(H, smem_max);
    case TDT_DTYPE_BFLOAT16: return tile_for<TDT_DTYPE_BFLOAT16>(H, smem_max);
    default: return tile_for<TDT_DTYPE_FLOAT32>(H, smem_max);
    }
}

/* The GEMM schedule's chunk budget (joint_plan.h) in bytes: TDT_GPU_JOINT_CHUNK_KB, a whole
 * number of KB from 1 to 2^26 (64 GB), for tuning and for tests (1 gives one (b, t) row a
 * chunk); 0 (the default budget) where unset; -1 where set to anything else. */
long long joint_chunk_bytes() {
    const char *v = getenv("TDT_GPU_JOINT_CHUNK_KB");
    if (!v || !*v) return 0;
    char *end = NULL;
    errno = 0;
    const long long kb = strtoll(v, &end, 10);
    if (errno || *end || kb < 1 || kb > (1LL << 26)) return -1;
    return kb << 10;
}

/* float32's products in the GEMM schedule (joint_plan.h): TDT_GPU_JOINT_FLOAT32 = "split" (the
 * default: on bfloat16 tensor cores, each operand the sum of three bfloat16 parts) or "sgemm"
 * (float32 kernels on the CUDA cores, 1.2-1.5x the time, docs/joint.md); 1, 0, or -1 where set
 * to anything else. Read by the size query and by the call, like TDT_GPU_JOINT_CHUNK_KB. */
int joint_float32_split() {
    const char *v = getenv("TDT_GPU_JOINT_FLOAT32");
    if (!v || !*v || strcmp(v, "split") == 0) return 1;
    return strcmp(v, "sgemm") == 0 ? 0 : -1;
}

/* The GEMM schedule's choice of cuBLASLt kernels, TDT_GPU_JOINT_LT: unset, empty or "auto"
 * (TDT_LT_BY_PRODUCT, the default: cuBLASLt's first choice for z, of its first eight candidates
 * the one with the fewest waves for d W and d h), "first" (TDT_LT_FIRST for every product) or
 * "fewest" (TDT_LT_FEWEST_WAVES for every product); -1 where set to anything else. */
int joint_lt_pick() {
    const char *v = getenv("TDT_GPU_JOINT_LT");
    if (!v || !*v || strcmp(v, "auto") == 0) return TDT_LT_BY_PRODUCT;
    if (strcmp(v, "fewest") == 0) return TDT_LT_FEWEST_WAVES;
    return strcmp(v, "first") == 0 ? TDT_LT_FIRST : -1;
}

/* The GEMM schedule's forward, TDT_GPU_JOINT_FWD: unset, empty or "wgmma" (1, the default: float16
 * and bfloat16 on compute capability 9.0 with H up to 640 take their log-normalisers from Hopper's
 * wgmma, the logits never written; the rest as "gemm") or "gemm" (0: the z product on cuBLASLt,
 * then the node kernel, everywhere); -1 where set to anything else. */
int joint_fwd_wgmma() {
    const char *v = getenv("TDT_GPU_JOINT_FWD");
    if (!v || !*v || strcmp(v, "wgmma") == 0) return 1;
    return strcmp(v, "gemm") == 0 ? 0 : -1;
}

/* The GEMM schedule's backward, TDT_GPU_JOINT_BWD: unset, empty or "gemm" (0, the default: the
 * backward's z product on cuBLASLt, then the dz kernel), "wgmma" (1: float16 and bfloat16 on
 * compute capability 9.0 with H up to 640 and no skip_below, dz from Hopper's wgmma, z never
 * written; the rest as "gemm") or "chip" (2: the plan's chip layout, joint_plan.h, and where
 * "wgmma" runs the chip backward: no dz, d W, d bias and d h on the chip from z recomputed
 * there; elsewhere "gemm" in the same bytes); -1 where set to anything else. Read by the size
 * query and by the call, like TDT_GPU_JOINT_CHUNK_KB. */
int joint_bwd_wgmma() {
    const char *v = getenv("TDT_GPU_JOINT_BWD");
    if (!v || !*v || strcmp(v, "gemm") == 0) return 0;
    if (strcmp(v, "chip") == 0) return 2;
    return strcmp(v, "wgmma") == 0 ? 1 : -1;
}

/* An environment variable's value refused: the call's error names it, its value and what it
 * takes (what); TDT_STATUS_INVALID_OPTION. */
tdt_status_t env_refused(const char *name, const char *what) {
    tdt_set_error("%s = \"%s\": %s", name, getenv(name), what);
    return TDT_STATUS_INVALID_OPTION;
}

tdt_status_t joint_body(const tdt_joint_call_t *call, int device) {
    const tdt_joint_problem_t &p = call->jp;
    const tdt_call_t &c = call->c;
    cudaStream_t stream = (cudaStream_t)c.o.stream;
    int num_sms = 0, smem_max = 0;
    cudaError_t e = tdt_device_attribute(cudaDevAttrMultiProcessorCount, device, &num_sms);
    if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaDeviceGetAttribute(MultiProcessorCount)");
    e = tdt_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device, &smem_max);
    if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    if (num_sms < 1) num_sms = 1;
    /* the schedule: TDT_GPU_JOINT=gemm (joint_gemm.cu), or =tiles (below); unset, the GEMM
     * schedule where cuBLASLt loads (6-47x faster: docs/joint.md), else the tiles */
    const char *sched = getenv("TDT_GPU_JOINT");
    bool gemm;
    if (!sched || !*sched) gemm = tdt_gpu_joint_gemm_available();
    else if (strcmp(sched, "gemm") == 0) gemm = true;
    else if (strcmp(sched, "tiles") == 0) gemm = false;
    else
        return env_refused("TDT_GPU_JOINT", "the GPU joint's schedule is \"gemm\" or \"tiles\" (unset: gemm "
                                            "where cuBLASLt loads, else tiles)");
    const int T = tile_of(p.dtype, p.hidden, smem_max > 0 ? (size_t)smem_max : 0);
    if (T == 0 && !gemm) {
        tdt_set_error("problem->hidden = %lld: the GPU joint's tiles of its hidden values do not fit "
                      "this device's %d bytes of shared memory a block",
                      (long long)p.hidden, smem_max);
        return TDT_STATUS_INVALID_SIZE;
    }
    const long long chunk = joint_chunk_bytes();
    if (chunk < 0) return env_refused("TDT_GPU_JOINT_CHUNK_KB", "a whole number of KB from 1 to 67108864");
    const int split = joint_float32_split();
    if (split < 0)
        return env_refused("TDT_GPU_JOINT_FLOAT32", "float32's products are \"split\" (the default: on bfloat16 "
                                                    "parts) or \"sgemm\" (float32 kernels)");
    const int lt_pick = joint_lt_pick();
    if (lt_pick < 0)
        return env_refused("TDT_GPU_JOINT_LT", "the GEMM schedule's cuBLASLt kernels are \"auto\" (the default), "
                                               "\"first\" (cuBLASLt's first choice for every product) or "
                                               "\"fewest\" (the candidate with the fewest waves for every product)");
    const int fwd_wgmma = joint_fwd_wgmma();
    if (fwd_wgmma < 0)
        return env_refused("TDT_GPU_JOINT_FWD", "the GEMM schedule's forward is \"wgmma\" (the default: float16 "
                                                "and bfloat16 on compute capability 9.0, the rest on cuBLASLt) or "
                                                "\"gemm\" (on cuBLASLt)");
    const int bwd_wgmma = joint_bwd_wgmma();
    if (bwd_wgmma < 0)
        return env_refused("TDT_GPU_JOINT_BWD", "the GEMM schedule's backward is \"gemm\" (the default, on "
                                                "cuBLASLt), \"wgmma\" (dz on Hopper's tensor cores: float16 and "
                                                "bfloat16 on compute capability 9.0) or \"chip\" (no dz: d W, d "
                                                "bias and d h on the chip from z recomputed there)");
    const joint_gemm_opts gopts{lt_pick, fwd_wgmma, bwd_wgmma};
    tdt_gpu_joint_plan_t plan;
    if (!tdt_gpu_joint_plan(p.batch, p.max_frames, p.max_labels, p.num_outputs, p.hidden,
                            tdt_acc_is_double(p.dtype) ? 8 : 4, tdt_dtype_size(p.dtype), split, (size_t)chunk,
                            c.tdt_mode ? c.num_durations : 0, bwd_wgmma == 2, &plan) ||
        ((c.do_backward || gemm) && call->scratch_bytes < plan.bytes)) {
        tdt_set_error("the joint's GPU scratch (%zu bytes) is smaller than its plan needs (%zu)",
                      call->scratch_bytes, plan.bytes);
        return TDT_STATUS_WORKSPACE_TOO_SMALL;
    }
    joint_run run{call, args_of(call, plan), num_sms, stream};
    if (c.do_forward) {
        if (gemm) {
            const tdt_status_t st = tdt_gpu_joint_gemm(call, &plan, device, num_sms, 0, gopts);
            if (st != TDT_STATUS_SUCCESS) return st;
        } else {
            e = with_dtype_tile(p.dtype, T, fwd_go{run});
            if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "launching the joint's forward kernel");
        }
        /* the lattice: its sweeps (the node blocks are written), costs, reduction */
        tdt_call_t lat = c;
        lat.do_backward = 0;
        lat.ahead = NULL;
        lat.o.gpu_schedule = TDT_GPU_SCHEDULE_SERIAL;
        const tdt_status_t st = tdt_gpu_run(&lat);
        if (st != TDT_STATUS_SUCCESS) return st;
    }
    if (c.do_backward) {
        if (gemm) return tdt_gpu_joint_gemm(call, &plan, device, num_sms, 1, gopts);
        e = with_dtype_tile(p.dtype, T, bwd_go{run, plan});
        if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "launching the joint's backward kernels");
    }
    return TDT_STATUS_SUCCESS;
}

} /* namespace */

extern "C" size_t tdt_gpu_joint_scratch_bytes(const tdt_joint_problem_t *problem,
                                              const tdt_options_t *options, int num_durations) {
    (void)options;
    tdt_gpu_joint_plan_t plan;
    const long long chunk = joint_chunk_bytes(); /* a bad value: the default here, refused by the call */
    if (!tdt_gpu_joint_plan(problem->batch, problem->max_frames, problem->max_labels,
                            problem->num_outputs, problem->hidden,
                            tdt_acc_is_double(problem->dtype) ? 8 : 4, tdt_dtype_size(problem->dtype),
                            joint_float32_split() != 0, chunk > 0 ? (size_t)chunk : 0, num_durations,
                            joint_bwd_wgmma() == 2, &plan))
        return SIZE_MAX; /* the dispatch layer refuses it */
    return plan.bytes;
}

extern "C" tdt_status_t tdt_gpu_joint_run(const tdt_joint_call_t *call) {
    return tdt_on_device(call, call->c.workspace, "workspace", joint_body);
}
