/*
 * joint_bwd_proto.cu - a prototype of the fused joint's backward d h on Hopper's tensor cores,
 * dz never written: each block keeps 64 nodes' rows of h in shared memory and, a tile of 128 of
 * W's token rows at a time, recomputes z = h W^T (wgmma m64n64k16, float32 sums), forms the
 * dense part of dz, P = g exp(z - lse) (bfloat16), in shared memory and at once takes
 * d h += P W (wgmma m64n160k16, W^T's tile as the K-major operand), d h's 64 x 640 float32
 * sums held in the two consumer warpgroups' registers (each 320 of the columns) across all of
 * W's tiles. A producer warp streams two rings of W: W packed as the forward packs it
 * (src/gpu/sm90a/joint_wgmma.cu, 16 KB stages of 128 rows x 64 values) for z, and W^T packed
 * here into 40 KB stages (64 token rows x the two warpgroups' 160-column blocks) for d h.
 *
 * The backward's other terms (the blank's, the label's and the durations', a few values a node)
 * and act' with the reductions into d enc and d pred are left out: this measures whether the
 * dominant part runs on the chip near the GEMMs' rate, against cuBLAS's way (the GEMM
 * schedule's: z into a buffer, P from it, then the d h product).
 *
 * Check before timing: d h against cuBLAS's product of the same P (computed from cuBLAS's z,
 * rounded to bfloat16 as here), normwise relative difference printed, the run failing beyond
 * 2e-3 (P's roundings differ where the two z differ in their last bits).
 *
 *   joint_bwd_proto [--nodes N] [--vocab V] [--iters I]
 * defaults: huge-joint's 303000 nodes, V 8193, H 640 (fixed: the warpgroups' 2 x 2 blocks of
 * 160 columns). Built for sm_90a alone: it runs on the H100 and H200.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "gpu/joint_wgmma.h"
#include "gpu/sm90a/wgmma.cuh"
#include "proto_util.cuh"

namespace {

const int H = 640;                       /* hidden size: 4 blocks of 160 columns */
const int kNodes = 64;                   /* nodes a block */
const int kRows = 128;                   /* W's token rows a tile */
const int KC = H / 64;                   /* h's chunks of 64 values */
const int kHChunk = kNodes * 128;        /* bytes of one chunk of h's rows (8 KB) */
const int kZStage = kRows * 128;         /* one stage of W for z: 128 rows x 64 values (16 KB) */
const int kZStages = 3;
const int kBlock = 160;                  /* d h's columns a wgmma */
const int kHStage = 2 * kBlock * 128;    /* one stage of W^T for d h: 2 x 160 rows x 64 values (40 KB) */
const int kHStages = 2;
const int kThreads = 384;                /* warpgroups 0, 1: consumers; 2: the producer */
const float kLog2e = 1.4426950408889634f;
/* shared memory: h, P (two chunks), the rings, then the barriers; 1024-aligned */
const size_t kSmem = (size_t)KC * kHChunk + 2 * kHChunk + (size_t)kZStages * kZStage + (size_t)kHStages * kHStage +
                     2 * (kZStages + kHStages) * 8 + 1024;

/* d (+)= A B^T, A 64 x 16 and B 64 x 16 bfloat16 from their descriptors, float32 sums; d
 * overwritten where !acc */
__device__ __forceinline__ void mma_n64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
#else
    (void)d, (void)da, (void)db, (void)acc;
    __trap();
#endif
}

/* d (+)= A B^T, A 64 x 16 and B 160 x 16 bfloat16 from their descriptors, float32 sums; d
 * overwritten where !acc */
__device__ __forceinline__ void mma_n160(float (&d)[80], uint64_t da, uint64_t db, int acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
                 "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
                 "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "
                 "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
                 "}, %80, %81, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                   "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
                   "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
                   "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
                   "+f"(d[78]), "+f"(d[79])
                 : "l"(da), "l"(db), "r"(acc));
#else
    (void)d, (void)da, (void)db, (void)acc;
    __trap();
#endif
}

template <int N> __device__ __forceinline__ void pin_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/* W's token rows (pitch ldw, columns < H) as d h's operand: for each tile t of 128 rows, chunk kc
 * of 64 of them and block pair jj, a stage of 320 rows of 64 values (W^T: row r is column
 * jj 160 + r of W for r < 160, 320 + jj 160 + r - 160 after, its values W's rows t 128 + kc 64
 * on), the 128-byte swizzle's layout (16-byte unit u of row r at u ^ r % 8), zero past V;
 * stage q = kc 2 + jj of tile t at (t 4 + q) kHStage */
__global__ void pack_wt_kernel(const uint16_t *__restrict__ W, int64_t ldw, int64_t V, uint4 *Wt) {
    const int64_t tiles = (V + kRows - 1) / kRows, units = tiles * 4 * (2 * kBlock) * 8;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < units; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t st = i / (2 * kBlock * 8);
        const int r = (int)(i / 8 % (2 * kBlock)), u = (int)(i % 8);
        const int64_t t = st / 4;
        const int q = (int)(st % 4), kc = q >> 1, jj = q & 1;
        const int col = (r < kBlock ? 0 : 2 * kBlock) + jj * kBlock + r % kBlock;
        const int64_t v0 = t * kRows + kc * 64 + u * 8;
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = v0 + e < V ? W[(v0 + e) * ldw + col] : (uint16_t)0;
        uint4 w;
        w.x = v[0] | (uint32_t)v[1] << 16, w.y = v[2] | (uint32_t)v[3] << 16;
        w.z = v[4] | (uint32_t)v[5] << 16, w.w = v[6] | (uint32_t)v[7] << 16;
        Wt[st * (2 * kBlock * 8) + r * 8 + (u ^ (r & 7))] = w;
    }
}

/*
 * d h[n] = sum_v g[n] exp(z[n, v] - lse[n]) W[v] for the nodes n < count (h's rows: pitch ldh, H
 * values; d h's: float32, pitch ldo), z = h W^T over W's V token rows, P rounded to bfloat16
 * before its product. Wz: W packed by tdt_gpu_wgmma_pack; Wt: by pack_wt_kernel.
 *
 * 384 threads: warpgroups 0 and 1 the consumers, warp 8 (warpgroup 2) the producer. A tile of
 * W's rows: z's 10 stages, warpgroup w taking rows w 64 to w 64 + 63 of each (m64n64k16, 32
 * float32 values a thread), then P's 64 x 64 values of warpgroup w into chunk w of P's shared
 * rows (K-major: node rows of 64 token values), then d h's 4 stages q = (kc, jj): warpgroup w
 * adds P's chunk kc times its 160 columns of the stage to its block jj of d h (m64n160k16, 2 x 80
 * values a thread: d h's columns w 320 + jj 160 on). A barrier of the two warpgroups before P
 * is written (the other's products on the last P done) and after (both chunks in).
 */
__global__ void __launch_bounds__(kThreads, 1)
    dh_kernel(const uint16_t *__restrict__ h, int64_t ldh, const unsigned char *__restrict__ Wz,
              const unsigned char *__restrict__ Wt, const float *__restrict__ lse, const float *__restrict__ g,
              int64_t V, int64_t count, float *dh, int64_t ldo) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    unsigned char *hs = smem, *ps = hs + KC * kHChunk, *zs = ps + 2 * kHChunk, *ts = zs + kZStages * kZStage;
    const uint32_t zfull = saddr(ts + kHStages * kHStage), zempty = zfull + 8 * kZStages,
                   tfull = zempty + 8 * kZStages, tempty = tfull + 8 * kHStages;
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t node0 = (int64_t)blockIdx.x * kNodes;
    const int tiles = (int)((V + kRows - 1) / kRows);
    if (tid == 0) {
        for (int s = 0; s < kZStages; ++s) {
            mbar_init(zfull + 8 * s, 1);
            mbar_init(zempty + 8 * s, 8);
        }
        for (int s = 0; s < kHStages; ++s) {
            mbar_init(tfull + 8 * s, 1);
            mbar_init(tempty + 8 * s, 8);
        }
    }
    __syncthreads();
    if (wgi == 2) { /* the producer: z's stages of a tile, then d h's */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 256)
            for (int t = 0, zi = 0, ti = 0; t < tiles; ++t) {
                for (int kc = 0; kc < KC; ++kc, ++zi) {
                    const int s = zi % kZStages;
                    if (zi >= kZStages) mbar_wait(zempty + 8 * s, (uint32_t)((zi / kZStages - 1) & 1));
                    bulk_load(saddr(zs + s * kZStage), Wz + (size_t)zi * kZStage, kZStage, zfull + 8 * s);
                }
                for (int q = 0; q < 4; ++q, ++ti) {
                    const int s = ti % kHStages;
                    if (ti >= kHStages) mbar_wait(tempty + 8 * s, (uint32_t)((ti / kHStages - 1) & 1));
                    bulk_load(saddr(ts + s * kHStage), Wt + (size_t)ti * kHStage, kHStage, tfull + 8 * s);
                }
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    /* h's rows: chunk c, row r, unit u at hs + c kHChunk + r 128 + (u ^ r % 8) 16; zero from count on */
    for (int i = tid; i < KC * kNodes * 8; i += 256) {
        const int c = i / (kNodes * 8), r = (i / 8) % kNodes, u = i % 8;
        const bool in = node0 + r < count;
        cp16(saddr(hs + c * kHChunk + r * 128 + ((u ^ (r & 7)) << 4)), h + (in ? (node0 + r) * ldh + c * 64 + u * 8 : 0),
             in ? 16 : 0);
    }
    cp_commit();
    cp_wait<0>();
    fence_proxy_async();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");

    /* this thread's rows warp 16 + lane / 4 and 8 more: g and lse (base 2) */
    float gr[2], lr[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int64_t n = node0 + warp * 16 + hf * 8 + (lane >> 2);
        gr[hf] = n < count ? g[n] : 0.f;
        lr[hf] = n < count ? lse[n] * kLog2e : 0.f;
    }
    float z[32], d0[80], d1[80];
#pragma unroll
    for (int i = 0; i < 80; ++i) d0[i] = d1[i] = 0.f;
    const uint32_t a0 = saddr(hs), p0 = saddr(ps), zb = saddr(zs), tb = saddr(ts);
    auto dh_step = [&](float(&d)[80], int kc, int s) {
        pin_acc(d);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            mma_n160(d, desc_of(p0 + kc * kHChunk + kk * 32), desc_of(tb + s * kHStage + wgi * kBlock * 128 + kk * 32),
                     1);
        wgmma_commit();
    };
    for (int t = 0, zi = 0, ti = 0; t < tiles; ++t) {
        for (int kc = 0; kc < KC; ++kc, ++zi) {
            const int s = zi % kZStages;
            mbar_wait(zfull + 8 * s, (uint32_t)((zi / kZStages) & 1));
            pin_acc(z);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                mma_n64(z, desc_of(a0 + kc * kHChunk + kk * 32), desc_of(zb + s * kZStage + wgi * 64 * 128 + kk * 32),
                        kc > 0 || kk > 0);
            wgmma_commit();
            wgmma_wait<1>();
            if (kc > 0 && lane == 0) mbar_arrive(zempty + 8 * ((zi - 1) % kZStages));
        }
        wgmma_wait<0>();
        pin_acc(z);
        if (lane == 0) mbar_arrive(zempty + 8 * ((zi - 1) % kZStages));
        /* P into chunk wgi, once both warpgroups are past their products on the last P */
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        const int64_t c0 = (int64_t)t * kRows + wgi * 64 + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = warp * 16 + hf * 8 + (lane >> 2);
                float v[2];
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    v[c] = c0 + 8 * j + c < V ? gr[hf] * exp2f(fmaf(z[4 * j + 2 * hf + c], kLog2e, -lr[hf])) : 0.f;
                *reinterpret_cast<__nv_bfloat162 *>(ps + wgi * kHChunk + r * 128 + ((j ^ (r & 7)) << 4) +
                                                    (lane & 3) * 4) = __floats2bfloat162_rn(v[0], v[1]);
            }
        fence_proxy_async();
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        /* d h's four stages: (kc, jj) = (0, 0), (0, 1), (1, 0), (1, 1) */
#pragma unroll
        for (int q = 0; q < 4; ++q, ++ti) {
            const int s = ti % kHStages;
            mbar_wait(tfull + 8 * s, (uint32_t)((ti / kHStages) & 1));
            if (q & 1) dh_step(d1, q >> 1, s);
            else dh_step(d0, q >> 1, s);
            wgmma_wait<1>();
            if (q > 0 && lane == 0) mbar_arrive(tempty + 8 * ((ti - 1) % kHStages));
        }
        wgmma_wait<0>();
        pin_acc(d0);
        pin_acc(d1);
        if (lane == 0) mbar_arrive(tempty + 8 * ((ti - 1) % kHStages));
    }
    /* d h: this thread's rows, columns wgi 320 + jj 160 + 8 j + 2 (lane % 4) + c */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int64_t n = node0 + warp * 16 + hf * 8 + (lane >> 2);
        if (n >= count) continue;
        float *row = dh + n * ldo + wgi * 2 * kBlock + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < 20; ++j) {
            *reinterpret_cast<float2 *>(row + 8 * j) = make_float2(d0[4 * j + 2 * hf], d0[4 * j + 2 * hf + 1]);
            *reinterpret_cast<float2 *>(row + kBlock + 8 * j) = make_float2(d1[4 * j + 2 * hf], d1[4 * j + 2 * hf + 1]);
        }
    }
}

__global__ void fill_unit_kernel(float *p, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = proto::unit_hash(i, seed);
}

/* a warp a node: lse of its first V values of z (float32, pitch ldz), summed in float64 */
__global__ void lse_kernel(const float *z, int64_t ldz, float *lse, int64_t nodes, int64_t V) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= nodes) return;
    const float *zr = z + n * ldz;
    double m = -INFINITY, s = 0.0;
    for (int64_t v = lane; v < V; v += 32) m = fmax(m, (double)zr[v]);
    for (int o = 16; o >= 1; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    for (int64_t v = lane; v < V; v += 32) s += exp((double)zr[v] - m);
    for (int o = 16; o >= 1; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) lse[n] = (float)(m + log(s));
}

/* P = g exp(z - lse) in bfloat16 (as dh_kernel rounds it) over a chunk's rows, zero from V on */
template <typename Z>
__global__ void p_kernel(const Z *z, int64_t ldz, const float *lse, const float *g, int64_t nodes, int64_t V,
                         __nv_bfloat16 *P) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nodes * ldz; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / ldz, v = i % ldz;
        const float x = (float)z[i];
        P[i] = __float2bfloat16(v < V ? g[n] * exp2f(fmaf(x, kLog2e, -lse[n] * kLog2e)) : 0.f);
    }
}

} // namespace

int main(int argc, char **argv) {
    int64_t nodes = 303000, V = 8193;
    int iters = 5;
    static const option opts[] = {{"nodes", required_argument, 0, 'n'}, {"vocab", required_argument, 0, 'v'},
                                  {"iters", required_argument, 0, 'i'}, {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'n') nodes = atoll(optarg);
        else if (c == 'v') V = atoll(optarg);
        else if (c == 'i') iters = atoi(optarg);
        else {
            fprintf(stderr, "usage: %s [--nodes N] [--vocab V] [--iters I]\n", argv[0]);
            return 2;
        }
    }
    if (nodes < 1 || V < 1 || iters < 1) {
        fprintf(stderr, "joint_bwd_proto: --nodes, --vocab and --iters must be positive\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("joint_bwd_proto: %s, nodes %lld, V %lld, H %d, iters %d\n", prop.name, (long long)nodes, (long long)V, H,
           iters);
    if (!tdt_gpu_wgmma_fits(0, H) || kSmem > (size_t)prop.sharedMemPerBlockOptin) {
        printf("not run: the kernel needs compute capability 9.0 and %zu bytes of shared memory a block\n", kSmem);
        return 0;
    }
    const int64_t ldz = (V + 7) / 8 * 8, tiles = (V + kRows - 1) / kRows;
    __nv_bfloat16 *h, *W, *P, *zb;
    float *g, *lse, *z, *dh, *dh_ref;
    void *Wz, *Wt;
    const int64_t chunk = std::min<int64_t>(nodes, 32768);
    CK(cudaMalloc(&h, (size_t)nodes * H * 2));
    CK(cudaMalloc(&W, (size_t)ldz * H * 2));
    CK(cudaMalloc(&g, nodes * 4));
    CK(cudaMalloc(&lse, nodes * 4));
    CK(cudaMalloc(&dh, (size_t)nodes * H * 4));
    CK(cudaMalloc(&dh_ref, (size_t)nodes * H * 4));
    CK(cudaMalloc(&z, (size_t)chunk * ldz * 4));
    CK(cudaMalloc(&zb, (size_t)chunk * ldz * 2));
    CK(cudaMalloc(&P, (size_t)chunk * ldz * 2));
    CK(cudaMalloc(&Wz, tdt_gpu_wgmma_pack_bytes(V, H)));
    CK(cudaMalloc(&Wt, (size_t)tiles * 4 * kHStage));
    proto::fill_bf16_kernel<<<1024, 256>>>(h, nodes, H, nodes, H, 1.0f, 1);
    proto::fill_bf16_kernel<<<1024, 256>>>(W, ldz, H, V, H, 3.0f / sqrtf((float)H), 2);
    fill_unit_kernel<<<256, 256>>>(g, nodes, 3);
    CK(cudaGetLastError());
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    const float one = 1.f, zero = 0.f;
    /* z (ldz x n, column-major: node rows) = W h^T, into float32 or bfloat16 */
    auto zgemm = [&](int64_t n0, int64_t n, void *out, cudaDataType_t type) {
        return cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)ldz, (int)n, H, &one, W, CUDA_R_16BF, H, h + n0 * H,
                            CUDA_R_16BF, H, &zero, out, type, (int)ldz, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    /* d h (H x n, column-major: node rows) = W^T P^T */
    auto dhgemm = [&](int64_t n0, int64_t n, float *out) {
        return cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, H, (int)n, (int)ldz, &one, W, CUDA_R_16BF, H, P,
                            CUDA_R_16BF, (int)ldz, &zero, out + n0 * H, CUDA_R_32F, H, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT);
    };
    /* lse from float32 z, then the reference: P from it, d h = P W */
    for (int64_t n0 = 0; n0 < nodes; n0 += chunk) {
        const int64_t n = std::min(chunk, nodes - n0);
        if (zgemm(n0, n, z, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx (z) failed\n");
            return 1;
        }
        lse_kernel<<<(unsigned)((n + 7) / 8), 256>>>(z, ldz, lse + n0, n, V);
        p_kernel<float><<<2048, 256>>>(z, ldz, lse + n0, g + n0, n, V, P);
        if (dhgemm(n0, n, dh_ref) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx (d h) failed\n");
            return 1;
        }
    }
    CK(tdt_gpu_wgmma_pack(W, H, V, H, Wz, prop.multiProcessorCount, 0));
    pack_wt_kernel<<<(unsigned)prop.multiProcessorCount * 4, 256>>>(reinterpret_cast<const uint16_t *>(W), H, V,
                                                                   static_cast<uint4 *>(Wt));
    CK(cudaGetLastError());
    CK(cudaFuncSetAttribute(dh_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
    const unsigned blocks = (unsigned)((nodes + kNodes - 1) / kNodes);
    auto fused = [&]() {
        dh_kernel<<<blocks, kThreads, kSmem>>>(reinterpret_cast<const uint16_t *>(h), H,
                                               static_cast<const unsigned char *>(Wz),
                                               static_cast<const unsigned char *>(Wt), lse, g, V, nodes, dh, H);
    };
    CK(cudaMemset(dh, 0xff, (size_t)nodes * H * 4)); /* NaN: every value must be written */
    fused();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> a((size_t)nodes * H), b((size_t)nodes * H);
    CK(cudaMemcpy(a.data(), dh, a.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), dh_ref, b.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0, worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (!(fabs(d) <= worst)) worst = fabs(d), wi = i;
    }
    const double rel = sqrt(num) / std::max(sqrt(den), 1e-300);
    printf("check: d h normwise rel. difference %.3g, largest |difference| %.3g (node %zu, column %zu: %.7g, want "
           "%.7g)\n",
           rel, worst, wi / H, wi % H, a[wi], b[wi]);
    if (!(rel <= 2e-3)) {
        printf("FAILED: the fused kernel's d h differs\n");
        return 1;
    }
    auto time = [&](auto fn) { return proto::time_ms(iters, fn); };
    auto unfused = [&]() { /* the GEMM schedule's way: z in bfloat16, P from it, d h = P W */
        for (int64_t n0 = 0; n0 < nodes; n0 += chunk) {
            const int64_t n = std::min(chunk, nodes - n0);
            zgemm(n0, n, zb, CUDA_R_16BF);
            p_kernel<__nv_bfloat16><<<2048, 256>>>(zb, ldz, lse + n0, g + n0, n, V, P);
            dhgemm(n0, n, dh_ref);
        }
    };
    auto packs = [&]() {
        tdt_gpu_wgmma_pack(W, H, V, H, Wz, prop.multiProcessorCount, 0);
        pack_wt_kernel<<<(unsigned)prop.multiProcessorCount * 4, 256>>>(reinterpret_cast<const uint16_t *>(W), H, V,
                                                                       static_cast<uint4 *>(Wt));
    };
    const double flop = 4.0 * (double)nodes * V * H; /* z and d h */
    const float tf = time(fused), tu = time(unfused), tp = time(packs);
    printf("fused z + P + d h            %8.3f ms  %6.1f TFLOP/s\n", tf, flop / tf / 1e9);
    printf("W's two packings             %8.3f ms\n", tp);
    printf("cuBLAS z, P kernel, cuBLAS d h %6.3f ms  %6.1f TFLOP/s  (fused / this %.2f)\n", tu, flop / tu / 1e9, tf / tu);
    return 0;
}
