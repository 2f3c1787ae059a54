/*
 * joint_wgmma.cu - the GEMM schedule's forward log-normalisers on Hopper's tensor cores (wgmma,
 * compiled for sm_90a alone; joint_wgmma.h is the interface, joint_gemm.cu the caller): for each
 * node of a chunk, lse = log sum_v exp(z_v + bias_v) over the V token outputs, z = h W^T, the
 * logits never written. benchmark/joint_lse_proto.cu's producer-warp kernel, with h's columns
 * from H on (the bias's and the shift's in the GEMM schedule's rows) left out and the bias
 * added to each value as it is folded in.
 *
 * A block: 128 nodes, two warpgroups of 64 (warps 0-7) and a producer warp (warp 8). h's rows
 * stay in shared memory as KC = ceil(H / 64) chunks of 64 values, 128 bytes a row in the
 * 128-byte swizzle (row r's 16-byte unit u at unit u ^ (r % 8)); W's token rows, packed once a
 * call into that layout (tdt_gpu_wgmma_pack), stream through kStages stages of 128 rows x 64
 * values, one bulk copy a stage completing on the stage's "full" mbarrier; each warp gives a
 * stage back on its "empty" mbarrier once its products on it are retired. A stage: each
 * warpgroup's four m64n128k16 products (float32 sums); after a tile's last chunk its 64 x 128
 * values are folded into a running log-sum-exp a row (base 2, float32).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../joint_wgmma.h"

namespace {

const int kNodes = 128, kRows = 128, kChunk = 64, kStages = 4, kThreads = 288;
const int kHBytes = kNodes * kChunk * 2; /* one chunk of h's rows */
const int kStage = kRows * kChunk * 2;   /* one stage of W's rows */
const float kLog2e = 1.4426950408889634f;

__host__ __device__ inline int chunks_of(int64_t H) { return (int)((H + kChunk - 1) / kChunk); }
inline size_t smem_of(int64_t H) {
    return (size_t)chunks_of(H) * kHBytes + (size_t)kStages * kStage + 2 * kStages * 8 + 1024;
}

__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* bytes (0-16) of 16 global -> shared, the rest zero */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

/* the shared-memory descriptor of a K-major operand in the 128-byte swizzle: start, leading
 * offset 1 (unused by the layout), stride 1024 bytes (8 rows of 128 bytes) */
__device__ __forceinline__ uint64_t desc_of(uint32_t a) {
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

/* pins the accumulators to this point of the program (the waits say nothing of registers) */
__device__ __forceinline__ void pin(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/* d (+)= A B^T, A 64 x 16 and B 128 x 16 of the 16-bit type F16 (1: float16, 0: bfloat16) from
 * their descriptors; d overwritten where !acc */
template <int F16> __device__ __forceinline__ void mma(float (&d)[64], uint64_t da, uint64_t db, int acc) {
#define TDT_WGMMA_REGS                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "  \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "   \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "   \
    "%59, %60, %61, %62, %63}"
#define TDT_WGMMA_OUT                                                                                   \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),     \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),        \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),      \
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),      \
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),      \
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),      \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),      \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),      \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (F16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " TDT_WGMMA_REGS
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : TDT_WGMMA_OUT
                     : "l"(da), "l"(db), "r"(acc));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TDT_WGMMA_REGS
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                     : TDT_WGMMA_OUT
                     : "l"(da), "l"(db), "r"(acc));
#else
    (void)d, (void)da, (void)db, (void)acc;
    __trap();
#endif
#undef TDT_WGMMA_REGS
#undef TDT_WGMMA_OUT
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

template <int F16> __device__ __forceinline__ float to_f(uint16_t x) {
    if (F16) return __half2float(__ushort_as_half(x));
    return __bfloat162float(__ushort_as_bfloat16(x));
}

/* a running log-sum-exp in base 2 */
struct lse2 {
    float m, s;
};
__device__ __forceinline__ lse2 lse2_merge(lse2 a, lse2 b) {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return a;
    return {m, a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m)};
}

/* W's token rows (the dtype, pitch ldw, columns < H) -> tiles of kRows rows x KC chunks, each
 * stage the swizzle's layout, zero past V and H */
__global__ void wgmma_pack_kernel(const uint16_t *__restrict__ W, int64_t ldw, int64_t V, int64_t H, uint4 *Wp) {
    const int KC = chunks_of(H);
    const int64_t tiles = (V + kRows - 1) / kRows, units = tiles * KC * kRows * 8;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < units; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t st = i / (kRows * 8);
        const int r = (int)(i / 8 % kRows), u = (int)(i % 8);
        const int64_t row = st / KC * kRows + r, k0 = st % KC * kChunk + u * 8;
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = row < V && k0 + e < H ? W[row * ldw + k0 + e] : (uint16_t)0;
        uint4 q;
        q.x = v[0] | (uint32_t)v[1] << 16, q.y = v[2] | (uint32_t)v[3] << 16;
        q.z = v[4] | (uint32_t)v[5] << 16, q.w = v[6] | (uint32_t)v[7] << 16;
        Wp[st * (kRows * 8) + r * 8 + (u ^ (r & 7))] = q;
    }
}

template <int F16>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_lse_kernel(const uint16_t *__restrict__ h, int64_t ldh, const unsigned char *__restrict__ Wp,
                     const uint16_t *__restrict__ bias, int64_t V, int64_t H, int64_t count, float *lse) {
    extern __shared__ unsigned char smem_raw[];
    /* the swizzle's pattern repeats every 1024 bytes: the base aligned to that */
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    const int KC = chunks_of(H);
    unsigned char *hs = smem, *ws = smem + (size_t)KC * kHBytes;
    const uint32_t full0 = saddr(ws + kStages * kStage), empty0 = full0 + kStages * 8;
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t node0 = (int64_t)blockIdx.x * kNodes;
    const int tiles = (int)((V + kRows - 1) / kRows), steps = tiles * KC;
    if (tid == 0)
        for (int s = 0; s < kStages; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(full0 + 8 * s) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 8;\n" ::"r"(empty0 + 8 * s) : "memory");
        }
    __syncthreads(); /* the barriers' initialisation, before any use */
    if (tid >= 256) { /* the producer: one thread */
        if (tid == 256)
            for (int step = 0; step < steps; ++step) {
                const int s = step % kStages;
                const uint32_t full = full0 + 8 * s;
                if (step >= kStages) mbar_wait(empty0 + 8 * s, (uint32_t)((step / kStages - 1) & 1));
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full), "r"(kStage)
                             : "memory");
                asm volatile(
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                        saddr(ws + s * kStage)),
                    "l"(Wp + (size_t)step * kStage), "r"(kStage), "r"(full)
                    : "memory");
            }
        return;
    }
    /* h's rows: chunk c, row r, unit u at hs + c kHBytes + r 128 + (u ^ r % 8) 16; columns from H
     * on and rows from count on zero */
    for (int i = tid; i < KC * kNodes * 8; i += 256) {
        const int c = i / (kNodes * 8), r = (i / 8) % kNodes, u = i % 8;
        const int64_t k0 = (int64_t)c * kChunk + u * 8;
        const int64_t left = node0 + r < count ? H - k0 : 0;
        const int bytes = left <= 0 ? 0 : left >= 8 ? 16 : (int)left * 2;
        cp16(saddr(hs + c * kHBytes + r * 128 + ((u ^ (r & 7)) << 4)), h + (bytes ? (node0 + r) * ldh + k0 : 0),
             bytes);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* for the tensor cores */
    asm volatile("bar.sync 1, 256;\n" ::: "memory");                /* both warpgroups' rows */

    lse2 run[2] = {{-INFINITY, 0.f}, {-INFINITY, 0.f}};
    const uint32_t a0 = saddr(hs) + wgi * 64 * 128, b0 = saddr(ws);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int tile = 0, step = 0; tile < tiles; ++tile) {
        for (int kc = 0; kc < KC; ++kc, ++step) {
            const int s = step % kStages;
            mbar_wait(full0 + 8 * s, (uint32_t)((step / kStages) & 1));
            pin(acc);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk)
                mma<F16>(acc, desc_of(a0 + kc * kHBytes + kk * 32), desc_of(b0 + s * kStage + kk * 32), kc > 0 || kk > 0);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            /* the previous stage's products are retired: give it back */
            if (step > 0 && lane == 0)
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty0 + 8 * ((step - 1) % kStages))
                             : "memory");
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        pin(acc);
        /* thread (warp, lane) holds rows warp 16 + lane / 4 and 8 more at columns 8 j + 2 (lane % 4) + c */
        const int64_t col0 = (int64_t)tile * kRows + 2 * (lane & 3);
        float b[16][2];
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int64_t col = col0 + 8 * j + c;
                b[j][c] = col >= V ? -INFINITY : bias ? to_f<F16>(__ldg(bias + col)) : 0.f;
            }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c) mx = fmaxf(mx, (acc[4 * j + 2 * hf + c] + b[j][c]) * kLog2e);
            lse2 &r = run[hf];
            if (mx > r.m) {
                r.s *= exp2f(r.m - mx);
                r.m = mx;
            }
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c) sum += exp2f(fmaf(acc[4 * j + 2 * hf + c] + b[j][c], kLog2e, -r.m));
            r.s += sum;
        }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        lse2 r = run[hf];
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1)
            r = lse2_merge(r, {__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
        const int64_t n = node0 + wgi * 64 + warp * 16 + hf * 8 + (lane >> 2);
        if ((lane & 3) == 0 && n < count) lse[n] = (r.m + log2f(r.s)) / kLog2e;
    }
}

} /* namespace */

size_t tdt_gpu_wgmma_pack_bytes(int64_t V, int64_t H) {
    return (size_t)((V + kRows - 1) / kRows) * (size_t)chunks_of(H) * kStage;
}

bool tdt_gpu_wgmma_fits(int device, int64_t H) {
    int major = 0, minor = 0, optin = 0;
    if (H < 1 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        (void)cudaGetLastError(); /* this query's, not the caller's */
        return false;
    }
    return major == 9 && minor == 0 && smem_of(H) <= (size_t)optin;
}

cudaError_t tdt_gpu_wgmma_pack(const void *W, int64_t ldw, int64_t V, int64_t H, void *Wp, int num_sms,
                               cudaStream_t stream) {
    wgmma_pack_kernel<<<(unsigned)(num_sms * 4), 256, 0, stream>>>(static_cast<const uint16_t *>(W), ldw, V, H,
                                                                   static_cast<uint4 *>(Wp));
    return cudaGetLastError();
}

cudaError_t tdt_gpu_wgmma_lse(int f16, const void *h, int64_t ldh, const void *Wp, const void *bias, int64_t V,
                              int64_t H, int64_t count, float *lse, cudaStream_t stream) {
    if (count < 1) return cudaSuccess;
    const size_t smem = smem_of(H);
    void (*k)(const uint16_t *, int64_t, const unsigned char *, const uint16_t *, int64_t, int64_t, int64_t,
              float *) = f16 ? wgmma_lse_kernel<1> : wgmma_lse_kernel<0>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    k<<<(unsigned)((count + kNodes - 1) / kNodes), kThreads, smem, stream>>>(
        static_cast<const uint16_t *>(h), ldh, static_cast<const unsigned char *>(Wp),
        static_cast<const uint16_t *>(bias), V, H, count, lse);
    return cudaGetLastError();
}
