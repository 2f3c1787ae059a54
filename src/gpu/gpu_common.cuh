/*
 * gpu_common.cuh - what the three CUDA kernels of the GPU backend share: the argument block
 * handed to every kernel, element-type traits (loads, 16-byte vector loads, stores), node-index
 * decoding, the guarded read of device-resident lengths, and the launcher declarations.
 *
 * The kernels, in the order a one-shot call runs them on the caller's stream:
 *   normalize.cu  per node: token log-normaliser, lp_blank, lp_label, duration log-softmax
 *   sweep.cu      per sample: alpha and beta over anti-diagonals (separate blocks), LL, cost
 *   grad.cu       per node: token and duration gradients, upstream-scaled (grad_fused.cu:
 *                 the fused schedule's, beside the sweeps: sweep.cuh)
 * and, apart from them, scale.cu (tdt_scale_gradients). gpu.cu holds the backend entry points
 * (tdt_gpu_run / tdt_gpu_scale / tdt_gpu_count / tdt_gpu_built).
 *
 * The math is docs/math.md and src/common/lattice.h; nothing here restates a recurrence.
 * All element offsets are int64 (a logits tensor may exceed 2^31 elements).
 */
#ifndef TDT_GPU_COMMON_CUH
#define TDT_GPU_COMMON_CUH

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/indices.h"
#include "internal.h"

/* The most samples the trail schedule takes: its gradient pass ranks them in shared memory
 * (grad.cuh, grad_trail_kernel); a larger batch runs SERIAL (sweep.cuh, trail_plan). */
#define TDT_TRAIL_MAX_BATCH 1024

/* Per-sample state flags in the workspace's state[] array (written by the alpha sweep). */
#define TDT_GPU_STATE_OK 0
#define TDT_GPU_STATE_BAD_DATA 1 /* a length or a label out of range: cost NaN, gradient 0 */

/* Everything a kernel needs, passed by value (a few hundred bytes of kernel parameters, far
 * under the 4 KiB limit), so no device-side argument buffer is ever allocated. */
typedef struct tdt_gpu_args {
    int64_t B, maxT, maxU, row, V; /* row = maxU + 1 */
    int64_t nodes;                 /* B * maxT * row */
    int D;                         /* duration logits per node (0 for RNN-T) */
    int blank;
    int log_probs;                 /* TDT_INPUT_LOG_PROBS */
    int acc_double;                /* costs / grad_costs are double (FLOAT64) */
    double sigma, fastemit_lambda, clamp;
    const void *tok;               /* token logits, element (b,t,u,v) at tdt_row_offset + v */
    int64_t tok_s[3];
    const void *dur;               /* duration logits or NULL */
    int64_t dur_s[3];
    const int32_t *labels, *frame_lengths, *label_lengths;
    void *tok_g;                   /* token gradient or NULL */
    int64_t tok_gs[3];
    void *dur_g;                   /* duration gradient or NULL */
    int64_t dur_gs[3];
    void *costs;                   /* (B) float or double */
    const void *grad_costs;        /* (B) float or double, or NULL for ones */
    int grad_costs_scalar;         /* grad_costs is one value for every sample */
    int normalize_costs;           /* options.normalize_costs: per-label costs and upstreams */
    int batch_mean;                /* options.batch_mean: upstreams divided by B */
    tdt_arcs_t arcs;
    tdt_ws_t ws;
    tdt_wblocks_t wb;              /* the node blocks: in ws.w, or the token gradient's rows */
    int state_rows;                /* options.state_in_grads: wb is the token gradient's rows */
    /* Which (sample, direction) jobs the sweep kernels run: 0 alpha and beta, 1 alpha only
     * (the split schedule's forward, and a costs-only call: build_args), 2 beta only (the
     * split schedule's backward). */
    int sweep_only;
    /* The overlapped schedules (sweep.cuh, "The overlapped schedules"); fwd_tickets 0: the
     * normaliser runs first, alone. */
    int fwd_ends;       /* a layer of the ordered normaliser: 2 = diagonals k and S_b - 1 - k
                           (alpha and beta trail it), 1 = diagonal k (alpha alone) */
    int64_t fwd_layers; /* layers it produces */
    int64_t fwd_dlen;   /* node slots of a diagonal: min(maxT, row) */
    int fwd_tickets;    /* its tickets a layer */
    int fwd_block_tickets; /* 1: a ticket is the normaliser's whole block, 0: one warp */
    int fwd_blocks, fwd_cluster; /* launcher only: the ordered normaliser's grid and cluster */
    /* The split schedule's backward: the beta sweep publishes each sample's finished steps in
     * bwd_progress[b] (NULL: it does not); the gradient pass takes bwd_tickets tickets a layer,
     * layer k = diagonal S_b - 1 - k of every sample, over fwd_layers layers. */
    int32_t *bwd_progress;
    int bwd_tickets;
    /* The fused schedule (a one-shot call with gradients: sweep.cuh, "The fused schedule";
     * NULL: not this call): the alpha sweep publishes each sample's finished steps in
     * fus_alpha[b] (the beta sweep in bwd_progress[b]), the gradient pass counts sample b's
     * finished cut chunks in fus_cut[b] and takes its tickets from *fus_ticket, the first
     * fus_cut_layers of its layers being the cut chunks' tickets. */
    int32_t *fus_alpha, *fus_cut, *fus_ticket;
    int fus_cut_layers;
    int fus_publish;   /* the sweeps' steps between two publications */
    int fus_publisher; /* 0: thread 0 publishes, 1: the block's last thread */
    int fus_seen;      /* the gradient nodes read the counts through their block's cache */
    /* The trail schedule (a one-shot call with gradients and a serial forward: sweep.cuh, "The
     * trail schedule"; 0: not this call): the sweeps publish only each sample's final counts,
     * alpha's in fus_alpha[b], beta's in bwd_progress[b], and the gradient pass takes its
     * tickets from *fus_ticket. */
    int trail;
    /* options.reduction in a forward (0: none, 1: the sum, 2: the mean): the sweeps count the
     * costs they write in *cost_count (zeroed by the forward's first kernel or memset), and the
     * thread that counts the batch's last one writes the reduction to *reduced
     * (tdt_write_reduction), so no kernel of its own follows them. */
    int reduce;
    int32_t *cost_count;
    void *reduced;
    unsigned long long *tl; /* -DTDT_TIMELINE benchmark builds: the kernels' timeline (tdt_tl) */
} tdt_gpu_args_t;

/* ---- the timeline of a call (benchmark builds with -DTDT_TIMELINE in CMAKE_CUDA_FLAGS) ---------
 * %globaltimer (ns) of the first start and the last end of each kernel, and of the fused
 * schedule's milestones, into a.tl (a device buffer of TDT_TL_N; NULL elsewhere): tdt_tl_start
 * keeps the earliest, tdt_tl_end the latest; tdt_debug_timeline() (gpu.cu) reads and resets it.
 * Default builds compile every mark to nothing. */
enum {
    TDT_TL_NORM = 0,  /* 0 start, 1 end: the normaliser (either kernel) */
    TDT_TL_SWEEP = 2, /* 2 start, 3 end: the sweep (any kernel) */
    TDT_TL_GRAD = 4,  /* 4 start, 5 end of its work: the gradient pass (either kernel) */
    TDT_TL_CUT = 6,   /* 6 the first cut chunk past its waits, 7 the last cut merged */
    TDT_TL_NODE = 8,  /* 8 the first fused node past its waits */
    TDT_TL_ALPHA = 10, /* 10 start, 11 end: the one-block staged sweep's alpha jobs */
    TDT_TL_BETA = 12,  /* 12 start, 13 end: its beta jobs */
    TDT_TL_N = 16
};
#ifdef TDT_TIMELINE
__device__ __forceinline__ unsigned long long tdt_tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void tdt_tl_start(unsigned long long *tl, int i) {
    if (tl) atomicMin(tl + i, tdt_tl_now());
}
__device__ __forceinline__ void tdt_tl_end(unsigned long long *tl, int i) {
    if (tl) atomicMax(tl + i, tdt_tl_now());
}
#else
__device__ __forceinline__ void tdt_tl_start(unsigned long long *, int) {}
__device__ __forceinline__ void tdt_tl_end(unsigned long long *, int) {}
#endif

/* options.reduction's value: the costs' float64 sum in sample order (tdt_reduce_costs, the CPU's
 * bits), or their mean, rounded once to the accumulate type into out. One thread. */
__device__ __forceinline__ void tdt_write_reduction(const void *costs, int acc_double, int64_t B,
                                                    int mean, void *out) {
    const double r = tdt_reduce_costs(costs, acc_double, B, mean);
    if (acc_double)
        *static_cast<double *>(out) = r;
    else
        *static_cast<float *>(out) = (float)r;
}

/* A sweep's thread that has just written a sample's cost (or NaN for bad data) counts it, with
 * a.reduce; the one that counts the batch's last writes the reduction. The fence before the
 * count publishes this thread's cost; the one after the last count orders its reads after
 * every other cost's publication. */
__device__ __forceinline__ void tdt_cost_counted(const tdt_gpu_args_t &a) {
    if (!a.reduce) return;
    __threadfence();
    if (atomicAdd(a.cost_count, 1) != (int)(a.B - 1)) return;
    __threadfence();
    tdt_write_reduction(a.costs, a.acc_double, a.B, a.reduce == 2, a.reduced);
}

/* ---- element types ---------------------------------------------------------------------------
 * Acc is the precision of the V-wide sums: float for float32 / float16 / bfloat16, double for
 * float64 (tdt.h promises exactly this). VEC elements make one 16-byte load. */
template <int DT> struct tdt_elem;

template <> struct tdt_elem<TDT_DTYPE_FLOAT32> {
    typedef float T;
    typedef float Acc;
    enum { VEC = 4 };
    static __device__ __forceinline__ Acc to_acc(T x) { return x; }
    static __device__ __forceinline__ T from_double(double x) { return (float)x; }
    static __device__ __forceinline__ T from_acc(Acc x) { return x; }
};
template <> struct tdt_elem<TDT_DTYPE_FLOAT64> {
    typedef double T;
    typedef double Acc;
    enum { VEC = 2 };
    static __device__ __forceinline__ Acc to_acc(T x) { return x; }
    static __device__ __forceinline__ T from_double(double x) { return x; }
    static __device__ __forceinline__ T from_acc(Acc x) { return x; }
};
template <> struct tdt_elem<TDT_DTYPE_FLOAT16> {
    typedef uint16_t T; /* IEEE half bit pattern */
    typedef float Acc;
    enum { VEC = 8 };
    static __device__ __forceinline__ Acc to_acc(T x) {
        return __half2float(__ushort_as_half(x));
    }
    /* double -> float -> half, both round-to-nearest-even, as the CPU backend via dtype.h */
    static __device__ __forceinline__ T from_double(double x) {
        return __half_as_ushort(__float2half_rn((float)x));
    }
    static __device__ __forceinline__ T from_acc(Acc x) { return __half_as_ushort(__float2half_rn(x)); }
};
template <> struct tdt_elem<TDT_DTYPE_BFLOAT16> {
    typedef uint16_t T; /* bfloat16 bit pattern */
    typedef float Acc;
    enum { VEC = 8 };
    static __device__ __forceinline__ Acc to_acc(T x) { return __uint_as_float((uint32_t)x << 16); }
    static __device__ __forceinline__ T from_double(double x) {
        return __bfloat16_as_ushort(__float2bfloat16_rn((float)x));
    }
    static __device__ __forceinline__ T from_acc(Acc x) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    }
};

/* exp in the accumulate precision, per element type: float64 exp for float64 and expf (the
 * accurate single-precision exp) for float32; for float16 / bfloat16, whose values carry 11 / 8
 * significant bits, __expf (one multiply and the hardware's ex2, relative error ~1e-6 over the
 * softmax's range), since the accurate expf's instruction count makes the 16-bit passes
 * arithmetic-bound: at copy bandwidth an SM must take 8 elements a clock. */
template <int DT> __device__ __forceinline__ typename tdt_elem<DT>::Acc tdt_exp_acc(typename tdt_elem<DT>::Acc x);
template <> __device__ __forceinline__ float tdt_exp_acc<TDT_DTYPE_FLOAT32>(float x) { return expf(x); }
template <> __device__ __forceinline__ double tdt_exp_acc<TDT_DTYPE_FLOAT64>(double x) { return exp(x); }
template <> __device__ __forceinline__ float tdt_exp_acc<TDT_DTYPE_FLOAT16>(float x) { return __expf(x); }
template <> __device__ __forceinline__ float tdt_exp_acc<TDT_DTYPE_BFLOAT16>(float x) { return __expf(x); }

/* One 16-byte vector of VEC elements, loaded or stored in a single instruction. The pointer
 * must be 16-byte aligned (the callers split each row into scalar head, vector body, scalar
 * tail by the row's own address). */
template <int DT> struct tdt_vec {
    typedef typename tdt_elem<DT>::T T;
    enum { VEC = tdt_elem<DT>::VEC };
    T v[VEC];
    static __device__ __forceinline__ tdt_vec load(const T *p) {
        tdt_vec r;
        uint4 raw = *reinterpret_cast<const uint4 *>(p);
        memcpy(r.v, &raw, 16);
        return r;
    }
    __device__ __forceinline__ void store(T *p) const {
        uint4 raw;
        memcpy(&raw, v, 16);
        *reinterpret_cast<uint4 *>(p) = raw;
    }
};

/* Asks for the line holding p into L1 (a prefetch never faults), holding no register while it
 * comes: for data the thread loads a little later. */
__device__ __forceinline__ void tdt_prefetch_l1(const void *p) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

/* Asynchronous copies into shared memory (cp.async): the issuing thread's own copies, made
 * visible to it by cp_async_wait<N>() (all but its N latest groups complete). 8 bytes (the
 * sweeps' staged weights, read again by the block) and 16 bytes (a gradient row's logits, both
 * addresses 16-byte aligned) both through L1 (.ca). The 16-byte copies went through L2 only
 * (.cg, LDGSTS.BYPASS) at first: then L1 asked L2 for 1.5x the sectors the warps copied (ncu,
 * H200: 24 sectors for a warp's 512 bytes, at every shape and lane count tried), and the
 * gradient pass was bound by L2's throughput; through L1 the copies ask for what they read, and
 * large float32's pass took 1.61 ms against 1.71 (docs/performance.md, "The gradient pass"). */
__device__ __forceinline__ void cp_async8(double *dst, const double *src) {
#if __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
#else /* before sm_80 (no cp.async): a plain copy, complete when it returns */
    *dst = *src;
#endif
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
#if __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#else
    *(uint4 *)dst = *(const uint4 *)src;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* A row read in batches through shared memory: calls f(raw) for each batch m < nb, in order,
 * raw[j] (j < U) the 16-byte vector at p + m * step + j * jstride (elements; 16-byte aligned),
 * copied in by cp.async into this thread's ring of S batch slots in the kernel's dynamic shared
 * memory (slot s's vector j at [(s * U + j) * blockDim.x + threadIdx.x]: a warp's copies and
 * reads fall on consecutive 16 bytes), S - 1 batches ahead of the one f gets: S - 1 batches
 * in flight that hold no register (grad.cuh's rows). The kernel's launch gives it
 * tdt_stage_bytes<U, S>(threads) of dynamic shared memory (tdt_allow_smem). */
template <int U, int S> static inline size_t tdt_stage_bytes(int threads) {
    return (size_t)threads * S * U * 16;
}
template <int U, int S, typename T, typename F>
__device__ __forceinline__ void tdt_staged_batches(const T *p, int64_t nb, int64_t step, int64_t jstride,
                                                   F f) {
    extern __shared__ uint4 tdt_stage_smem[];
    const int nt = (int)blockDim.x;
    uint4 *ring = tdt_stage_smem + threadIdx.x;
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
        if (s < nb)
#pragma unroll
            for (int j = 0; j < U; ++j)
                cp_async16(ring + (s * U + j) * nt, p + s * step + j * jstride);
        cp_async_commit();
    }
    int sm = 0; /* batch m's slot; batch m + S - 1 takes the one batch m - 1 left */
    for (int64_t m = 0; m < nb; ++m) {
        const int si = sm == 0 ? S - 1 : sm - 1;
        if (m + S - 1 < nb)
#pragma unroll
            for (int j = 0; j < U; ++j)
                cp_async16(ring + (si * U + j) * nt, p + (m + S - 1) * step + j * jstride);
        cp_async_commit();
        cp_async_wait<S - 1>(); /* batch m's copies done (the groups after it may be empty) */
        uint4 raw[U];
#pragma unroll
        for (int j = 0; j < U; ++j) raw[j] = ring[(sm * U + j) * nt];
        f(raw);
        sm = sm == S - 1 ? 0 : sm + 1;
    }
}
/* Lets kernel take bytes of dynamic shared memory, kernel by kernel. Its default maximum is
 * 48 KB less its static shared memory, so the opt-in goes by the kernel's current maximum, not
 * by 48 KB: a kernel with static tables needs it below 48 KB of dynamic memory. */
template <typename Kernel> cudaError_t tdt_allow_smem(Kernel kernel, size_t bytes) {
    cudaFuncAttributes fa;
    const cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
    if (e != cudaSuccess) return e;
    if ((size_t)fa.maxDynamicSharedSizeBytes >= bytes) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* Elements before the first ALIGN-byte boundary of a row starting at p (V if p is not even
 * element-aligned, so the whole row goes scalar). ALIGN is 16 (a vector) or 32 (an L2 sector:
 * the gradient pass, whose 16-byte vectors then fill whole sectors, grad.cuh). */
template <typename T, unsigned ALIGN = 16>
__device__ __forceinline__ int64_t tdt_row_head(const void *p, int64_t V) {
    static_assert(ALIGN == 16 || ALIGN == 32, "a vector or a sector");
    uintptr_t a = (uintptr_t)p;
    if (a % sizeof(T)) return V;
    int64_t h = (int64_t)(((ALIGN - (a & (ALIGN - 1))) & (ALIGN - 1)) / sizeof(T));
    return h < V ? h : V;
}

/* A row's scalar elements: its head up to the first ALIGN-byte boundary (head of them) and its
 * tail from `tail` on, nscalar = head + (V - tail) in all, numbered k = 0 .. nscalar - 1; lane l
 * of a group of G takes k = l, l + G, ... Where the row is element-aligned there are under
 * ALIGN / sizeof(T) + VEC of them, so a lane's first N (tdt_row_scalars<T, VEC, G, ALIGN>::N)
 * fit registers: load() fetches them before the row's vectors, so that their latency hides
 * behind the vectors' instead of adding one more memory round trip at the end of every node
 * (large 1.5-3 % faster on the H200); the caller uses v[i] for k = lane + i * G < nscalar after the
 * vectors, in the order it had, and any k from lane + N * G on (a row that is not
 * element-aligned) from memory. */
__device__ __forceinline__ int64_t tdt_row_scalar_at(int64_t k, int64_t head, int64_t tail) {
    return k < head ? k : tail + (k - head);
}
template <typename T, int VEC, int G, unsigned ALIGN = 16> struct tdt_row_scalars {
    enum { N = ((int)(ALIGN / sizeof(T)) - 1 + VEC - 1 + G - 1) / G };
    T v[N];
    __device__ __forceinline__ void load(const T *z, int64_t head, int64_t tail, int64_t nscalar, int lane) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const int64_t k = lane + (int64_t)i * G;
            v[i] = k < nscalar ? z[tdt_row_scalar_at(k, head, tail)] : T();
        }
    }
};

/* ---- row exponentials of the V-wide passes (normalize.cu, grad.cuh) ----------------------------
 * Both passes sum or scale terms exp(x - c) over a row for one per-row reference c. A unit
 * system X says how a reference is held (X::ref(c)) and how a term is made (X::term(x, r)):
 *   tdt_rexp2 (float accumulate, the fast path of float32 / float16 / bfloat16): base 2. The
 *     reference is r = c * K in float, K = log2(e) rounded to float, and a term is
 *     ex2.approx.ftz(fma(x, K, -r)): one FFMA and one MUFU.EX2 an element. The product x * K is
 *     exact inside the FMA, so the exponent is rounded once (0.5 ulp of it, as x - c in float
 *     is) and ex2.approx adds about 2 ulp (expf's bound); subnormal terms (below 2^-126 of the
 *     reference) flush to 0. K's own rounding (relative 1.3e-8) is a change of units that
 *     to_log() undoes by dividing by K, leaving under 1.3e-8 * log(V) in a log-normaliser.
 *     The reference's own rounding (r is not exactly c * K) is the same for every term of the
 *     row, so it cancels where the terms are summed against r and is folded into one factor
 *     (ref_fix) where they are scaled; it is at most 0.5 ulp of r, which fits() keeps below 1
 *     (|c| <= 1e7: every float16 value, and logits far beyond any trained model's). Rows with
 *     values past that take tdt_rexp_nat.
 *   tdt_rexp_nat<DT> (natural units, exp in tdt_exp_acc's precision): float64 always; the
 *     rare rows of the other types whose values are beyond fits().
 * pow(d) is 2^d resp. e^d for a difference of two references (d <= 0 where the callers use it). */
__device__ __forceinline__ float tdt_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

struct tdt_rexp2 {
    typedef float Acc;
    enum { MAY_OVERFLOW = 1 };
    static __device__ __forceinline__ float K() { return 1.44269504088896341f; }
    static __device__ __forceinline__ float ref(float c) { return c * K(); }
    /* The reference of a float64 value c, and in *fix the factor 2^(r - c K) that its rounding
     * left out of every term (exact to float64; 1 +- 2^-24). */
    static __device__ __forceinline__ float ref_fix(double c, double *fix) {
        const float r = (float)(c * (double)K());
        *fix = exp2((double)r - c * (double)K());
        return r;
    }
    static __device__ __forceinline__ float term(float x, float r) { return tdt_ex2(fmaf(x, K(), -r)); }
    static __device__ __forceinline__ float pow(float d) { return tdt_ex2(d); }
    /* log of 2^r * s in natural units (float64). */
    static __device__ __forceinline__ double to_log(float r, float s) {
        return ((double)r + log2((double)s)) / (double)K();
    }
    /* Whether a natural-unit value (a logit, a log-normaliser) may be a reference in these
     * units: |c| <= 1e7 (false for NaN and inf). */
    static __device__ __forceinline__ bool fits(double c) { return fabs(c) <= 1e7; }
};

template <int DT> struct tdt_rexp_nat {
    typedef typename tdt_elem<DT>::Acc Acc;
    enum { MAY_OVERFLOW = 0 };
    static __device__ __forceinline__ Acc ref(Acc c) { return c; }
    static __device__ __forceinline__ Acc ref_fix(double c, double *fix) {
        *fix = 1.0;
        return (Acc)c;
    }
    static __device__ __forceinline__ Acc term(Acc x, Acc r) { return tdt_exp_acc<DT>(x - r); }
    static __device__ __forceinline__ Acc pow(Acc d) { return tdt_exp_acc<DT>(d); }
    static __device__ __forceinline__ double to_log(Acc r, Acc s) { return (double)r + log((double)s); }
    static __device__ __forceinline__ bool fits(double) { return true; }
};

/* The unit system of a type's hot loops: base 2 for the float-accumulate types, natural for
 * float64 (whose accuracy stays that of exp()). */
template <int DT> struct tdt_rexp_fast { typedef tdt_rexp2 X; };
template <> struct tdt_rexp_fast<TDT_DTYPE_FLOAT64> { typedef tdt_rexp_nat<TDT_DTYPE_FLOAT64> X; };

/* The bulk of a node's token-gradient row (every v but the blank and the label, which the
 * callers take in float64): g = scale * clip(term(z_v, r) * occ), with term in the units X,
 * r = X::ref(lse) and occ the node's tok_occ (for base 2, times the correction of r's rounding),
 * clip to [.., cl] (cl = +inf without clamp: g >= 0 here, and a NaN stays NaN). */
template <typename X> struct row_coef {
    typename X::Acc r, occ, cl, scale;
};

/* The coefficients for a row whose reference is ref (natural units; for base 2 within X::fits),
 * its tok_occ, clip cl and upstream scale. */
template <typename X>
__device__ __forceinline__ row_coef<X> tdt_row_coef(double ref, double tok_occ, typename X::Acc cl, double scale) {
    typedef typename X::Acc Acc;
    row_coef<X> c;
    double fix; /* r's rounding, folded into occ (1 in natural units) */
    c.r = X::ref_fix(ref, &fix);
    c.occ = (Acc)(tok_occ * fix);
    c.cl = cl;
    c.scale = (Acc)scale;
    return c;
}

template <typename X>
__device__ __forceinline__ typename X::Acc tdt_row_grad(const row_coef<X> &c, typename X::Acc x) {
    typename X::Acc g = X::term(x, c.r) * c.occ;
    g = g > c.cl ? c.cl : g;
    return c.scale * g;
}

/* ---- online log-sum-exp (normalize.cu's rows, joint_gemm.cu's chunk rows) --------------------
 * A batch type Bt has N values and at(j), each value in X::Acc. */

/* Online log-sum-exp state of one lane in the units X: the row's terms so far
 * relative to the reference r, summed in s. r is the scaled value of an element already seen
 * (or the blank's, which every lane starts from), so no term underflows more than against the
 * row's true maximum; r is raised only when a batch's terms would exceed 2^64 (or are not
 * finite), so the hot path has no max and no data-dependent branch per element. huge: a value
 * that X cannot take as a reference (X::fits: base-2 units, |x| > 1e7) was seen. */
template <typename X> struct lse_lane {
    typename X::Acc r, s;
    int huge;
};

/* The rare batch: raises the reference to the batch's maximum (rescaling s), then adds the
 * batch. Semantics: a NaN anywhere makes s NaN (fmax skips NaN for the maximum, the sum does
 * not); +inf makes the reference +inf and its own term NaN; -inf values add exactly 0, and while
 * every value so far is -inf (r = -inf) s stays 0 unless a NaN comes. */
template <typename X, typename Bt>
__device__ __forceinline__ void lse_slow(lse_lane<X> &st, const Bt &x) {
    typedef typename X::Acc Acc;
    const Acc ninf = -(Acc)INFINITY;
    Acc xm = x.at(0);
#pragma unroll
    for (int j = 1; j < Bt::N; ++j) xm = fmax(xm, x.at(j));
    const Acc rn = X::ref(xm);
    if (X::MAY_OVERFLOW && xm > ninf && xm < -ninf && !X::fits((double)xm)) st.huge = 1;
    if (rn > st.r) {
        st.s = st.s * X::pow(st.r - rn); /* r = -inf: 0 (or NaN kept) */
        st.r = rn;
    }
    if (st.r == ninf) {
#pragma unroll
        for (int j = 0; j < Bt::N; ++j)
            if (x.at(j) != x.at(j)) st.s = x.at(j);
        return;
    }
    Acc bs = (Acc)0;
#pragma unroll
    for (int j = 0; j < Bt::N; ++j) bs += X::term(x.at(j), st.r);
    st.s += bs;
}

/* Adds a batch: one term an element, summed pairwise inside each 16-byte vector and then
 * across the vectors (a fixed order), one compare for the whole batch. */
template <typename X, typename Bt>
__device__ __forceinline__ void lse_add(lse_lane<X> &st, const Bt &x) {
    typedef typename X::Acc Acc;
    const int W = Bt::N < 8 ? Bt::N : 8; /* pairwise groups of up to 8 terms */
    Acc sum = (Acc)0;
#pragma unroll
    for (int j0 = 0; j0 < Bt::N; j0 += W) {
        Acc e[W];
#pragma unroll
        for (int j = 0; j < W; ++j) e[j] = X::term(x.at(j0 + j), st.r);
#pragma unroll
        for (int w = 1; w < W; w *= 2)
#pragma unroll
            for (int j = 0; j + w < W; j += 2 * w) e[j] += e[j + w];
        sum = j0 == 0 ? e[0] : sum + e[0];
    }
    if (sum <= (Acc)1.8446744073709552e19) /* 2^64; false for NaN and +inf */
        st.s += sum;
    else
        lse_slow<X>(st, x);
}

/* Merges the G lanes' states with a fixed xor-shuffle tree; returns log sum exp of the row in
 * natural units (float64). All lanes take part; lane 0's value is the one used. */
template <typename X, int G>
__device__ __forceinline__ double lse_group(lse_lane<X> st, unsigned mask) {
    typedef typename X::Acc Acc;
    const Acc ninf = -(Acc)INFINITY;
#pragma unroll
    for (int off = G / 2; off > 0; off /= 2) {
        const Acc r2 = __shfl_xor_sync(mask, st.r, off, G);
        const Acc s2 = __shfl_xor_sync(mask, st.s, off, G);
        if (r2 > st.r) {
            st.s = st.s * X::pow(st.r - r2) + s2;
            st.r = r2;
        } else if (r2 == st.r) {
            st.s += s2; /* also both -inf, or both +inf (then s is NaN already) */
        } else {
            st.s += s2 * X::pow(r2 - st.r); /* r2 = -inf: adds 0, or NaN */
        }
    }
    if (st.r == ninf) return st.s == (Acc)0 ? -TDT_INF : (double)NAN; /* all -inf; or NaN */
    return X::to_log(st.r, st.s); /* s >= about 1: the lane owning the reference's element */
}

/* ---- nodes and samples ---------------------------------------------------------------------- */

/* Logits row n in [0, B * maxT * row), in the logits' (b, t, u) order -> (b, t, u). The kernels
 * over logits rows walk this order (neighbouring rows are neighbours in memory), as do the node
 * blocks (tdt_wblock); alpha and beta are in lattice.h's diagonal order (tdt_node_index). */
__device__ __forceinline__ void tdt_decode_node(const tdt_gpu_args_t &a, int64_t n, int64_t *b,
                                                int64_t *t, int64_t *u) {
    int64_t per_sample = a.maxT * a.row;
    *b = n / per_sample;
    int64_t r = n - *b * per_sample;
    *t = r / a.row;
    *u = r - *t * a.row;
}

/* Reads T_b and U_b from device memory; 0 if either is out of range (bad data: the sample is
 * then never indexed with them). */
__device__ __forceinline__ int tdt_sample_lengths(const tdt_gpu_args_t &a, int64_t b, int64_t *T,
                                                  int64_t *U) {
    int64_t tb = a.frame_lengths[b];
    int64_t ub = a.label_lengths[b];
    *T = tb;
    *U = ub;
    return tb >= 0 && tb <= a.maxT && ub >= 0 && ub <= a.maxU;
}

/* Sample b's lattice view over the workspace (per-node arrays offset to the sample). */
__device__ __forceinline__ tdt_lattice_t tdt_sample_lattice(const tdt_gpu_args_t &a, int64_t b,
                                                            int64_t T, int64_t U) {
    tdt_lattice_t L;
    L.wn = tdt_w_block(a.D);
    L.wb = a.wb;
    L.wb.base += b * a.wb.s[0];
    L.row = a.row;
    L.frames = a.maxT;
    L.T = T;
    L.U = U;
    return L;
}

/* The arc set with its count made a compile-time constant when KD > 0: the shared per-node
 * loops in lattice.h then unroll, their loads issue together, and tdt_node_grad_t stays in
 * registers. KD == 0 keeps the runtime count (any D up to TDT_MAX_DURATIONS). */
template <int KD>
__device__ __forceinline__ tdt_arcs_t tdt_arcs_fixed(const tdt_arcs_t &in) {
    tdt_arcs_t A;
    A.count = KD > 0 ? KD : in.count;
    A.use_dur = in.use_dur;
    const int n = KD > 0 ? KD : TDT_MAX_DURATIONS;
#pragma unroll
    for (int k = 0; k < n; ++k) {
        A.label_dur[k] = in.label_dur[k];
        A.blank_dur[k] = in.blank_dur[k];
    }
    return A;
}

/* ---- tickets: work in the order another kernel consumes or produces it ---------------------
 * The overlapped schedules (sweep.cuh) run a V-wide pass over the nodes in layers of
 * anti-diagonals instead of memory order: the ordered normaliser (normalize.cu) ahead of the
 * sweeps, the ordered gradient pass (grad.cuh) behind the beta sweep. */

__device__ __forceinline__ int tdt_ld_acquire(const int32_t *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/* A count other blocks poll: the caller's earlier stores (and, after a barrier, its block's)
 * are visible to a block that reads v with tdt_ld_acquire. */
__device__ __forceinline__ void tdt_st_release(int32_t *p, int v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

/* The same pair at block scope, for a flag in shared memory (p: a pointer into it) that one
 * thread of a block raises after its own acquire (tdt_ld_acquire) and the others read: what
 * that acquire made visible to the raising thread is visible to a thread that reads the flag
 * set. Both are atomics (an OR of 0 reads, an exchange writes), which compute-sanitizer's
 * racecheck knows to be synchronisation: as a plain ld.acquire / st.release pair, as correct
 * under the PTX memory model, it reported every use of the flag as a shared-memory hazard. */
__device__ __forceinline__ int tdt_ld_acquire_block(int32_t *p) {
    int v;
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("atom.acquire.cta.shared::cta.or.b32 %0, [%1], 0;\n"
                 : "=r"(v)
                 : "r"(s)
                 : "memory");
    return v;
}
__device__ __forceinline__ int tdt_st_release_block(int32_t *p, int v) { /* returns the old value */
    int old;
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("atom.release.cta.shared::cta.exch.b32 %0, [%1], %2;\n"
                 : "=r"(old)
                 : "r"(s), "r"(v)
                 : "memory");
    return old;
}
/* The same release, as a maximum: *p = max(*p, v), for a count that only grows (the fused
 * gradient kernel's seen counts, grad.cuh). */
__device__ __forceinline__ void tdt_max_release_block(int32_t *p, int v) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("red.release.cta.shared::cta.max.s32 [%0], %1;\n" ::"r"(s), "r"(v) : "memory");
}

/* Slot q of layer k, as (sample b, node t, u): layer k holds, of every sample with S_b =
 * T_b + U_b diagonals, diagonal k (ends 1, rev 0), diagonal S_b - 1 - k (ends 1, rev 1), or both
 * (ends 2: diagonal k and, while distinct, S_b - 1 - k; a sample's diagonals are then spread
 * over its first L_b = ceil(S_b / 2) layers; with rev 1, from the middle out: layer k is then
 * what layer L_b - 1 - k is in the other order). A layer has ends * B * a.fwd_dlen slots:
 * sample-major, then end, then position on the diagonal. 0 for a slot with no node (past its
 * diagonal's end, past the sample's last layer, or a sample whose lengths are out of range). */
__device__ __forceinline__ int tdt_layer_node(const tdt_gpu_args_t &a, int64_t k, int64_t q,
                                              int ends, int rev, int64_t *b, int64_t *t,
                                              int64_t *u, int64_t *Ub) {
    const int64_t dlen = a.fwd_dlen;
    *b = q / (ends * dlen);
    const int64_t r = q - *b * ends * dlen;
    const int end = ends == 2 ? (int)(r >= dlen) : rev;
    const int64_t j = r - (ends == 2 ? end * dlen : 0);
    int64_t Tb;
    if (!tdt_sample_lengths(a, *b, &Tb, Ub) || Tb == 0) return 0;
    const int64_t S = Tb + *Ub;
    if (ends == 2 && rev) {
        k = (S + 1) / 2 - 1 - k;
        if (k < 0) return 0;
    }
    const int64_t s = end ? S - 1 - k : k;
    /* ends 2: end 0 while k <= S - 1 - k, end 1 while S - 1 - k > k (the middle diagonal once) */
    if (ends == 2 ? !(end ? s > k : k <= S - 1 - k) : !(k < S)) return 0;
    const int64_t lo = s - (Tb - 1) > 0 ? s - (Tb - 1) : 0;
    const int64_t hi = s < *Ub ? s : *Ub;
    *u = lo + j;
    *t = s - *u;
    return *u <= hi;
}

/* Warp-wide (all 32 lanes; each warp on its own, with no block barrier, so one group's slow
 * node never holds up another warp's next one): takes tickets from *next until `total` are
 * taken, and for each runs body(k, q) (q: the slot of this lane's group of G lanes in layer
 * k = ticket / tpl; a ticket is 32 / G consecutive slots), then, after __syncwarp (which orders
 * the warp's memory operations before lane 0's), done(k) on lane 0. Lane 0 takes the next
 * ticket while the warp works on the current one. The loop is warp-uniform. */
template <int G, typename Body, typename Done>
__device__ __forceinline__ void tdt_ticket_loop(int32_t *next, int total, int tpl, Body body,
                                                Done done) {
    const int lane = threadIdx.x & 31;
    int tk = 0;
    if (lane == 0) tk = atomicAdd(next, 1);
    tk = __shfl_sync(0xffffffffu, tk, 0);
    while (tk < total) {
        int nxt = 0;
        if (lane == 0) nxt = atomicAdd(next, 1); /* in flight during this ticket */
        const int k = tk / tpl;
        body(k, (int64_t)(tk - k * tpl) * (32 / G) + lane / G);
        __syncwarp();
        if (lane == 0) done(k);
        tk = __shfl_sync(0xffffffffu, nxt, 0);
    }
}

/* Lanes of a G-lane group (G divides 32): the mask of the group inside its warp, so groups of
 * one warp may diverge (different nodes, some skipped) while each reduces on its own. */
template <int G> __device__ __forceinline__ unsigned tdt_group_mask() {
    if (G == 32) return 0xffffffffu;
    unsigned lane = threadIdx.x & 31u;
    return ((1u << (G & 31)) - 1u) << (lane & ~(unsigned)(G - 1));
}

/* ---- CUDA failures and the caller's device (gpu.cu) ---------------------------------------------
 * tdt_gpu_cuda_fail: TDT_STATUS_CUDA_ERROR, with CUDA's own name and message after `what` in
 * tdt_last_error(). tdt_gpu_owning_device: the device that owns ptr (`what` names it in the
 * error), TDT_STATUS_INVALID_OPTION for host memory. tdt_on_device: body(call, device) with
 * the calling thread's current device switched to the one that owns ptr and restored after,
 * on every path: the one device switch of every GPU entry point. */
tdt_status_t tdt_gpu_cuda_fail(cudaError_t e, const char *what);
tdt_status_t tdt_gpu_owning_device(const void *ptr, const char *what, int *device);

template <typename Call>
tdt_status_t tdt_on_device(const Call *call, const void *ptr, const char *what,
                           tdt_status_t (*body)(const Call *, int)) {
    int prev = 0, device = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaGetDevice");
    tdt_status_t st = tdt_gpu_owning_device(ptr, what, &device);
    if (st != TDT_STATUS_SUCCESS) return st;
    if (device != prev) {
        e = cudaSetDevice(device);
        if (e != cudaSuccess) return tdt_gpu_cuda_fail(e, "cudaSetDevice");
    }
    st = body(call, device);
    if (device != prev) {
        e = cudaSetDevice(prev);
        if (e != cudaSuccess && st == TDT_STATUS_SUCCESS) st = tdt_gpu_cuda_fail(e, "cudaSetDevice(restore)");
    }
    return st;
}

/* ---- CUDA's answers, kept (gpu.cu) ------------------------------------------------------------
 * The answers of CUDA queries that depend on nothing but the device and what is asked (a device
 * attribute; a kernel's PTX version or its occupancy at a block size fixed by the code), kept
 * for the process: each query costs the host 0.5-8 us, together ~12 us of each call's ~35 on
 * the H200's host (docs/performance.md, "The binding's host time"). Keyed by (key, arg, device): key the kernel's
 * address, or the address of tdt_device_attribute for a device attribute. Only answers CUDA
 * gave without an error are kept. tdt_kept_get: 1 and *value when kept, else 0. */
int tdt_kept_get(const void *key, int arg, int device, int *value);
void tdt_kept_put(const void *key, int arg, int device, int value);
/* The kept answer to (key, arg, device), else ask(value)'s, kept when it returns cudaSuccess:
 * every kept query goes through here. */
template <typename Ask>
cudaError_t tdt_kept(const void *key, int arg, int device, int *value, Ask ask) {
    if (tdt_kept_get(key, arg, device, value)) return cudaSuccess;
    const cudaError_t e = ask(value);
    if (e == cudaSuccess) tdt_kept_put(key, arg, device, *value);
    return e;
}
/* cudaDeviceGetAttribute, kept. */
cudaError_t tdt_device_attribute(cudaDeviceAttr attr, int device, int *value);

/* options.pack's packing, done by the forward's first kernel (tdt_launch_prologue). */
typedef struct tdt_gpu_prologue {
    tdt_indices_t in;       /* the caller's labels and lengths */
    tdt_pack_shape_t shape; /* the problem's sizes and the blank */
    int32_t *packed;        /* the problem's frame_lengths: the packed array */
    int32_t *valid;         /* options.pack_valid, or NULL */
} tdt_gpu_prologue_t;
/* One block that zeroes zero[0 .. nzero), packs pro's indices (none when pro.packed is NULL:
 * an empty batch) and writes its verdict (fenced for the system: pinned host memory holds it
 * once the stream has passed the kernel). gpu.cu; tdt_pack_indices() is this kernel with
 * nothing to zero. */
cudaError_t tdt_launch_prologue(const tdt_gpu_prologue_t &pro, int32_t *zero, int64_t nzero,
                                cudaStream_t stream);
/* ---- launchers (each in its kernel's file) ---------------------------------------------------
 * Each enqueues its kernels on stream and returns the first error of a launch. */
cudaError_t tdt_launch_normalize(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                                 cudaStream_t stream);
/* normalize_ordered_kernel (the overlapped schedules, sweep.cuh): `blocks` blocks in clusters of
 * cl (1: no cluster), as the programmatic primary of the sweep enqueued next; a.fwd_* set. */
cudaError_t tdt_launch_normalize_ordered(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                         int cl, cudaStream_t stream);
/* Its blocks an SM of `device` (the current device) holds (cl <= 1), or its clusters of cl
 * blocks the device holds. */
cudaError_t tdt_normalize_ordered_fit(int64_t V, int64_t nodes, tdt_dtype_t dtype, int cl, int device,
                                      int *fit);
/* The forward: the normaliser and the sweep, one after the other or overlapped (sweep.cuh);
 * a.fwd_* are set here, on a copy. bwd_done (NULL: none) for a one-shot call whose backward
 * follows: set when the fused schedule (sweep.cuh) ran the gradient pass here as well. */
cudaError_t tdt_launch_forward(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                               tdt_gpu_schedule_t schedule, cudaStream_t stream, bool *bwd_done,
                               const tdt_gpu_prologue_t *prologue);
/* The backward: the gradient pass, or for the split schedule the beta sweep with the ordered
 * gradient pass trailing it (sweep.cuh). */
cudaError_t tdt_launch_backward(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                                tdt_gpu_schedule_t schedule, cudaStream_t stream);
/* The gradient pass in memory order (the caller, tdt_launch_backward, skips a call with no
 * node or no gradient to write). */
cudaError_t tdt_launch_grad(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                            cudaStream_t stream);
/* grad_ordered_kernel (the split schedule's backward, sweep.cuh): `blocks` blocks, as the
 * programmatic dependent of the beta sweep enqueued before it; a.fwd_dlen, a.fwd_layers,
 * a.bwd_* set. Arc counts with their own instantiation only (tdt_with_arcs). */
cudaError_t tdt_launch_grad_ordered(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                    cudaStream_t stream);
/* The same kernel for the fused schedule (sweep.cuh), the programmatic dependent of both
 * sweeps; a.fus_* set as well. */
cudaError_t tdt_launch_grad_fused(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                  cudaStream_t stream);
/* grad_trail_kernel (the trail schedule, sweep.cuh): the programmatic dependent of the serial
 * forward's sweeps; the trail flag and the counters it names set. */
cudaError_t tdt_launch_grad_trail(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int blocks,
                                  cudaStream_t stream);
/* tdt_scale_gradients() (scale.cu): a.tok_g / a.dur_g times the factor in a.grad_costs. */
cudaError_t tdt_launch_scale(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                             cudaStream_t stream);
/* What the launchers of the forward and of the split backward know of the device and the call;
 * both derive the same schedule from it. */
typedef struct tdt_fwd_env {
    tdt_dtype_t dtype;
    int num_sms;
    size_t smem_max; /* per-block opt-in shared memory */
    int sm90;        /* compute capability 9.0 or above */
    tdt_gpu_schedule_t schedule; /* as asked (tdt_options_t.gpu_schedule) */
    int device;      /* the current device, where the launches go */
    const tdt_gpu_prologue_t *prologue; /* the forward: options.pack's packing, or NULL */
} tdt_fwd_env_t;
/* generic.cu: the same kernels for arc counts without their own instantiation. */
cudaError_t tdt_launch_sweep_generic(const tdt_gpu_args_t &a, int span, const tdt_fwd_env_t &env,
                                     cudaStream_t stream);
cudaError_t tdt_launch_grad_generic(const tdt_gpu_args_t &a, tdt_dtype_t dtype, int num_sms,
                                    cudaStream_t stream);

/* f.template go<KD>() for the arc counts that have their own instantiation of the kernels
 * (where lattice.h's per-arc loops unroll fully); *done = false, nothing called, for the others,
 * which generic.cu serves with the count a runtime value. */
template <typename F> cudaError_t tdt_with_arcs(int count, F f, bool *done) {
    *done = true;
    switch (count) {
    case 1: return f.template go<1>();
    case 2: return f.template go<2>();
    case 3: return f.template go<3>();
    case 4: return f.template go<4>();
    case 5: return f.template go<5>();
    case 6: return f.template go<6>();
    case 8: return f.template go<8>();
    default: *done = false; return cudaSuccess;
    }
}

/* ---- launch attributes (host) ------------------------------------------------------------- */
/* A thread-block cluster of cl blocks along x. */
static inline cudaLaunchAttribute tdt_cluster_attr(int cl) {
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)cl;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    return attr;
}
/* Makes a launch the programmatic dependent of the kernel before it in the stream. */
static inline cudaLaunchAttribute tdt_pdl_attr(void) {
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    return attr;
}
/* Clusters beyond the portable 8 blocks must be allowed, kernel by kernel. */
template <typename Kernel> cudaError_t tdt_allow_cluster(Kernel kernel, int cl) {
    if (cl <= 8) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

/* Lanes per node (G) for the V-wide kernels over rows of V elements, vec to a 16-byte load.
 * Each node costs a fixed latency (lengths, workspace values, a reduction or the occupancies)
 * besides its row, so short rows go several nodes a warp, and only long rows (Parakeet's
 * V = 8193) take a whole warp. Rows of at most 64 vectors go 4 lanes a node in the gradient
 * pass (8 nodes a warp in flight): H200, f+b ms against 8 lanes (docs/performance.md, "The node pass"),
 * ragged (V = 257) float32 0.587-0.591 -> 0.519-0.521, bfloat16 0.560-0.562 -> 0.452-0.453;
 * and 2 lanes in the normaliser (its reads alone, 16 nodes a warp). H200, f+b, 2 against 4 in
 * one process: ragged float32 0.405-0.406 / 0.412-0.413, bfloat16 0.350-0.353 / 0.362-0.364;
 * 40,150,60,257 bfloat16 0.621-0.632 / 0.636-0.644, but float32 0.778-0.782 / 0.767-0.775.
 * The gradient pass at 2 lost 50 %. Rows of 65 to 511 vectors take 8 in both (the
 * normaliser 4 in problems of many nodes, below): with
 * 4, base's forward went 0.128 -> 0.137 and long's gradient pass lost 0.2 ms; the normaliser
 * at 2 took large 3.06 -> 3.01 ms (bfloat16 2.12 -> 2.05) but base 0.199 -> 0.213.
 * The normaliser's G is a function of V, the dtype and the padded node count (nodes) alone, so
 * every schedule of a call gives the same bits (the lse's lane split is G's). Where its rows
 * take 8 lanes and there are at least kNormFourLanesNodes nodes (over 990 an SM on the H200),
 * it takes 4: with many nodes an SM the pass is the loads' latency, and a node's fixed work
 * (its reduction tree, its values written in float64, the durations' log-softmax) is then
 * paid once for 8 nodes a warp, not 4. H200, tdt_bench, one process (docs/performance.md, "The node pass"):
 * large float32 forward 0.957 -> 0.845 ms, f+b 2.596 -> 2.487; base (16,800 nodes) lost at 4,
 * 0.146 -> 0.155. So a sample's lse (and cost) may differ in its last bits between batches on
 * either side of the line. The gradient's elements do not depend on G, so its G is free, and
 * its ordered kernel takes tickets of its own G's size. */
enum { TDT_PASS_GRAD = 0, TDT_PASS_NORM = 1 };
const int64_t kNormFourLanesNodes = (int64_t)1 << 17;
static inline int tdt_gpu_group_size(int64_t V, int64_t nodes, int vec, int pass) {
#ifdef TDT_SWEEP_TUNING /* benchmark builds only: TDT_VWIDE_LANES=2, 4, 8, 16 or 32 (both passes), TDT_NORM_LANES */
    if (const char *env_s = pass == TDT_PASS_NORM ? getenv("TDT_NORM_LANES") : NULL) {
        const int g = atoi(env_s);
        if (g == 2 || g == 4 || g == 8 || g == 16 || g == 32) return g;
    }
    if (const char *env_s = getenv("TDT_VWIDE_LANES")) {
        const int g = atoi(env_s);
        if (g == 2 || g == 4 || g == 8 || g == 16 || g == 32) return g;
    }
#endif
    const int64_t n = V / vec;
    if (n >= 512) return 32;
    if (n > 64) return pass == TDT_PASS_NORM && nodes >= kNormFourLanesNodes ? 4 : 8;
    return pass == TDT_PASS_NORM ? 2 : 4;
}

#ifdef TDT_SWEEP_TUNING
#define TDT_EVERY_G 1 /* the knobs: G = 16, and the G each pass does not take */
#else
#define TDT_EVERY_G 0
#endif
/* f.template go<DT, G>() for the dtype, with pass PASS's G for this V and node count (only the
 * G a pass can take instantiated). */
template <int PASS, int DT, typename F> cudaError_t tdt_with_g(int64_t V, int64_t nodes, F f) {
    switch (tdt_gpu_group_size(V, nodes, tdt_elem<DT>::VEC, PASS)) {
    case 2:
        if constexpr (PASS == TDT_PASS_NORM || TDT_EVERY_G) return f.template go<DT, 2>();
        break;
    case 4: return f.template go<DT, 4>();
    case 16:
        if constexpr (TDT_EVERY_G) return f.template go<DT, 16>();
        break;
    case 32: return f.template go<DT, 32>();
    }
    return f.template go<DT, 8>();
}
template <int PASS = TDT_PASS_GRAD, typename F>
cudaError_t tdt_with_dtype(tdt_dtype_t dtype, int64_t V, int64_t nodes, F f) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT32: return tdt_with_g<PASS, TDT_DTYPE_FLOAT32>(V, nodes, f);
    case TDT_DTYPE_FLOAT64: return tdt_with_g<PASS, TDT_DTYPE_FLOAT64>(V, nodes, f);
    case TDT_DTYPE_FLOAT16: return tdt_with_g<PASS, TDT_DTYPE_FLOAT16>(V, nodes, f);
    case TDT_DTYPE_BFLOAT16: return tdt_with_g<PASS, TDT_DTYPE_BFLOAT16>(V, nodes, f);
    }
    return cudaErrorInvalidValue;
}

/* Threads of a block of normalize_ordered_kernel: one block fills an SM's registers (80 a
 * thread for float32 and the 16-bit types, 112 for float64), so each block has an SM to itself
 * and the SMs the grid leaves out are free for the sweep. */
template <int DT> struct tdt_norm_ordered {
    enum { THREADS = DT == TDT_DTYPE_FLOAT64 ? 512 : 768 };
};

/* Node slots a ticket of the ordered V-wide kernels covers: a warp's 32 / G groups
 * (tdt_ticket_loop: the gradient pass, and the normaliser of the split schedule), or with
 * block tickets the normaliser's whole block (its other overlapped forwards: normalize.cu). */
struct tdt_ticket_slots {
    int *n;
    bool block;
    template <int DT, int G> cudaError_t go() const {
        *n = (block ? (int)tdt_norm_ordered<DT>::THREADS : 32) / G;
        return cudaSuccess;
    }
};
template <int PASS>
static inline int tdt_ticket_nodes(int64_t V, int64_t nodes, tdt_dtype_t dtype, bool block) {
    int n = 1;
    (void)tdt_with_dtype<PASS>(dtype, V, nodes, tdt_ticket_slots{&n, block});
    return n;
}

#endif /* TDT_GPU_COMMON_CUH */
