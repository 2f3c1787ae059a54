/*
 * joint_bwd_proto.cu - prototypes of the fused joint's backward products on Hopper's tensor
 * cores with dz's dense part, P = g exp(z - lse) (g a node's weight), formed on the chip and
 * never written: z recomputed tile by tile (wgmma, float32 sums), P rounded to bfloat16 into
 * shared memory in the 128-byte swizzle and consumed there by the next product. The register file
 * holds 64 x 640 float32 sums a block (two warpgroups' 2 x 80 values a thread), so the two
 * products run as two passes:
 *   - d h = P W (dh_kernel): a block keeps 64 nodes' rows of h and d h; W streams through, a tile
 *     of 128 token rows at a time, twice: as the forward packs it (z) and transposed (d h); or
 *     (dh_kernel<true>, the library's chip layout has no room for W^T) as the forward packs it
 *     both times, d h's stages slabs of 32 rows across all of H read MN-major by m64n256k16 and
 *     m64n64k16 (the library's d h reads each 64-column chunk apart, m64n64k16);
 *   - d W = P^T h (dw_kernel): a block keeps 64 of W's rows and their d W; h streams through, a
 *     tile of 64 nodes at a time, twice: as the forward packs W (z^T = W h^T) and transposed
 *     (d W), over a chunk of node tiles a launch (the chunk's h in L2), each block adding its rows
 *     of d W once a launch.
 * A producer warp streams each operand with bulk copies on full/empty mbarriers (two rings).
 * The backward's other terms (the blank's, the label's and the durations', a few values a node),
 * the bias, act' and the reductions into d enc and d pred are left out: this measures whether
 * the dominant work runs on the chip near the GEMMs' rate, against cuBLAS's way (the GEMM
 * schedule's: z into a buffer in bfloat16, P from it, then the product).
 *
 * Also timed: dz alone written to memory by the library's wgmma kernel (tdt_gpu_wgmma_dz, the
 * GEMM schedule's backward z product and dz kernel in one), in chunks of 32768 and 6464 nodes.
 *
 * Check before timing: d h and d W against cuBLAS's products of the same P (computed from cuBLAS's
 * float32 z, rounded to bfloat16 as here), and tdt_gpu_wgmma_dz's dz against that P on the first
 * chunk, normwise relative difference printed, the run failing beyond 2e-3 (P's roundings differ
 * where the two z differ in their last bits).
 *
 * A third form of d W (dwh_kernel) builds h on the chip from enc and pred (relu(enc + pred), the
 * inputs' h), tile by tile of 8 frames x 8 labels, and reads it both ways (K-major for z^T,
 * MN-major for d W), so that neither h nor its transpose is ever written and one launch covers
 * every node: the pass needs W packed and d W's float32 sums, which each block adds its own to
 * every 128 tiles (or once, at the end).
 *
 *   joint_bwd_proto [--nodes N] [--vocab V] [--labels U1] [--iters I]
 * defaults: huge-joint's 303000 nodes (one sample of T x U1 = 3000 x 101: the fewest frames of U1
 * nodes that hold N), V 8193, H 640 (fixed: the warpgroups' 2 x 2 blocks of 160 columns). Built
 * for sm_90a alone: it runs on the H100 and H200.
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
const int kAtom = 32 * 128;              /* dh_kernel<true>: 32 rows x 64 values of W, one of a stage's ten */
const int kThreads = 384;                /* warpgroups 0, 1: consumers; 2: the producer */
const float kLog2e = 1.4426950408889634f;
/* shared memory: h, P (two chunks), the rings, then the barriers; 1024-aligned */
const size_t kSmem = (size_t)KC * kHChunk + 2 * kHChunk + (size_t)kZStages * kZStage + (size_t)kHStages * kHStage +
                     2 * (kZStages + kHStages) * 8 + 1024;

/* bfloat16 products with both operands K-major, by the accumulators' size: m64n32k16 and
 * m64n64k16 (wgmma.cuh's), m64n160k16 (below) */
__device__ __forceinline__ void mma_bf16(float (&d)[16], uint64_t da, uint64_t db, int acc) { mma_n32<0>(d, da, db, acc); }
__device__ __forceinline__ void mma_bf16(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    mma_n64<0, 0>(d, da, db, acc);
}

/* d (+)= A B^T, A 64 x 16 and B 160 x 16 bfloat16 from their descriptors, float32 sums; d
 * overwritten where !acc */
__device__ __forceinline__ void mma_bf16(float (&d)[80], uint64_t da, uint64_t db, int acc) {
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

/* A warpgroup's product over H: KC stages of a ring (stage bytes `bytes`, `stages` of them from
 * ring, full and empty mbarriers from full0 and empty0, i the ring's running count), each 64
 * values of the inner dimension: acc = A B^T with A's chunk kc at a + kc kHChunk and B's rows at
 * offset b of the stage (m64nNk16, N from acc's size); each stage given back once its products
 * are retired. */
template <int R>
__device__ __forceinline__ void ring_product(float (&acc)[R], uint32_t a, uint32_t ring, int bytes, int stages,
                                             uint32_t b, uint32_t full0, uint32_t empty0, int &i, int lane) {
    for (int kc = 0; kc < KC; ++kc, ++i) {
        const int s = i % stages;
        mbar_wait(full0 + 8 * s, (uint32_t)((i / stages) & 1));
        pin_n(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            mma_bf16(acc, desc_of(a + kc * kHChunk + kk * 32), desc_of(ring + s * bytes + b + kk * 32),
                     kc > 0 || kk > 0);
        wgmma_commit();
        wgmma_wait<1>();
        if (kc > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % stages));
    }
    wgmma_wait<0>();
    pin_n(acc);
    if (lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % stages));
}

/* A warpgroup's Q stages of the 40 KB ring (kHStages of them from ring, mbarriers from full0 and
 * empty0, i its running count): stage q adds A's chunk q / 2 (at a + (q / 2) kHChunk) times the
 * warpgroup's 160 rows of the stage (offset b) to block q % 2 of the sums, d0 or d1 (m64n160k16). */
template <int Q>
__device__ __forceinline__ void ring_blocks(float (&d0)[80], float (&d1)[80], uint32_t a, uint32_t ring, uint32_t b,
                                            uint32_t full0, uint32_t empty0, int &i, int lane) {
    auto step = [&](float(&d)[80], int kc, int s) {
        pin_n(d);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            mma_bf16(d, desc_of(a + kc * kHChunk + kk * 32), desc_of(ring + s * kHStage + b + kk * 32), 1);
        wgmma_commit();
    };
#pragma unroll
    for (int q = 0; q < Q; ++q, ++i) {
        const int s = i % kHStages;
        mbar_wait(full0 + 8 * s, (uint32_t)((i / kHStages) & 1));
        if (q & 1) step(d1, q >> 1, s);
        else step(d0, q >> 1, s);
        wgmma_wait<1>();
        if (q > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % kHStages));
    }
    wgmma_wait<0>();
    pin_n(d0);
    pin_n(d1);
    if (lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % kHStages));
}

/* The MN-major form of d h's stages (dh_kernel<true>): stage q of a tile holds its token rows
 * 32 q to 32 q + 31 across all of H, ten 4 KB atoms of 64 columns as the forward's pack has them
 * (no W^T); warpgroup w adds P's 32 values of those rows (two k-steps of chunk q / 2, (q % 2) 64
 * bytes on, at a) times its columns w 320 on: atoms 5 w to 5 w + 3 into dA (m64n256k16) and atom
 * 5 w + 4 into dB (m64n64k16), both B operands read MN-major (atoms 4 KB apart). */
__device__ __forceinline__ void ring_slabs(float (&dA)[128], float (&dB)[32], uint32_t a, uint32_t ring, int wgi,
                                           uint32_t full0, uint32_t empty0, int &i, int lane) {
#pragma unroll
    for (int q = 0; q < 4; ++q, ++i) {
        const int s = i % kHStages;
        mbar_wait(full0 + 8 * s, (uint32_t)((i / kHStages) & 1));
        pin_n(dA);
        pin_n(dB);
        wgmma_fence();
        const uint32_t st = ring + s * kHStage + wgi * 5 * kAtom;
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            const uint64_t da = desc_of(a + (q >> 1) * kHChunk + (q & 1) * 64 + ks * 32);
            mma_n256_mn<0>(dA, da, desc_mn(st + ks * 2048, kAtom), 1);
            mma_n64<0, 1>(dB, da, desc_mn(st + 4 * kAtom + ks * 2048, kAtom), 1);
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (q > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % kHStages));
    }
    wgmma_wait<0>();
    pin_n(dA);
    pin_n(dB);
    if (lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % kHStages));
}

/* A matrix's rows (16-bit values, pitch ld, H columns, `rows` of them) transposed into the
 * second operand of a product whose inner dimension runs over those rows: for each tile t of
 * kcs 64 rows, chunk kc of 64 of them and block pair jj, a stage of 320 rows of 64 values (row r:
 * column jj 160 + r of the matrix for r < 160, 320 + jj 160 + r - 160 after; its values the
 * matrix's rows t kcs 64 + kc 64 on), the 128-byte swizzle's layout (16-byte unit u of row r at
 * u ^ r % 8), zero past `rows`; stage q = kc 2 + jj of tile t at (t 2 kcs + q) kHStage. W^T for d
 * h (kcs 2: tiles of 128 token rows), h^T for d W (kcs 1: tiles of 64 nodes). */
__global__ void pack_t_kernel(const uint16_t *__restrict__ M, int64_t ld, int64_t rows, int kcs, uint4 *out) {
    const int64_t tiles = (rows + 64 * kcs - 1) / (64 * kcs), units = tiles * 2 * kcs * (2 * kBlock) * 8;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < units; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t st = i / (2 * kBlock * 8);
        const int r = (int)(i / 8 % (2 * kBlock)), u = (int)(i % 8);
        const int64_t t = st / (2 * kcs);
        const int q = (int)(st % (2 * kcs)), kc = q >> 1, jj = q & 1;
        const int col = (r < kBlock ? 0 : 2 * kBlock) + jj * kBlock + r % kBlock;
        const int64_t v0 = t * 64 * kcs + kc * 64 + u * 8;
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = v0 + e < rows ? M[(v0 + e) * ld + col] : (uint16_t)0;
        uint4 w;
        w.x = v[0] | (uint32_t)v[1] << 16, w.y = v[2] | (uint32_t)v[3] << 16;
        w.z = v[4] | (uint32_t)v[5] << 16, w.w = v[6] | (uint32_t)v[7] << 16;
        out[st * (2 * kBlock * 8) + r * 8 + (u ^ (r & 7))] = w;
    }
}

/*
 * d h[n] = sum_v g[n] exp(z[n, v] - lse[n]) W[v] for the nodes n < count (h's rows: pitch ldh, H
 * values; d h's: float32, pitch ldo), z = h W^T over W's V token rows, P rounded to bfloat16
 * before its product. Wz: W packed by tdt_gpu_wgmma_pack; Wt: by pack_t_kernel (kcs 2).
 *
 * 384 threads: warpgroups 0 and 1 the consumers, warp 8 (warpgroup 2) the producer. A tile of
 * W's rows: z's 10 stages, warpgroup w taking rows w 64 to w 64 + 63 of each (m64n64k16, 32
 * float32 values a thread), then P's 64 x 64 values of warpgroup w into chunk w of P's shared
 * rows (K-major: node rows of 64 token values), then d h's 4 stages q = (kc, jj): warpgroup w
 * adds P's chunk kc times its 160 columns of the stage to its block jj of d h (m64n160k16, 2 x 80
 * values a thread: d h's columns w 320 + jj 160 on). A barrier of the two warpgroups before P
 * is written (the other's products on the last P done) and after (both chunks in).
 * MN (dh_kernel<true>): no W^T; d h's stages are slabs of the tile's rows as Wz holds them, read
 * MN-major (ring_slabs: m64n256k16 and m64n64k16, 128 + 32 values a thread).
 */
template <bool MN>
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
            mbar_init<1>(zfull + 8 * s);
            mbar_init<8>(zempty + 8 * s);
        }
        for (int s = 0; s < kHStages; ++s) {
            mbar_init<1>(tfull + 8 * s);
            mbar_init<8>(tempty + 8 * s);
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
                    if (!MN) {
                        bulk_load(saddr(ts + s * kHStage), Wt + (size_t)ti * kHStage, kHStage, tfull + 8 * s);
                        continue;
                    }
                    mbar_expect_tx(tfull + 8 * s, KC * kAtom);
                    for (int kc = 0; kc < KC; ++kc)
                        bulk_copy(saddr(ts + s * kHStage + kc * kAtom), Wz + ((size_t)t * KC + kc) * kZStage + q * kAtom,
                                  kAtom, tfull + 8 * s);
                }
            }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    /* h's rows: chunk c, row r, unit u at hs + c kHChunk + r 128 + (u ^ r % 8) 16; zero from count on */
    for (int i = tid; i < KC * kNodes * 8; i += 256) {
        const int c = i / (kNodes * 8), r = (i / 8) % kNodes, u = i % 8;
        const bool in = node0 + r < count;
        cp16(saddr(hs + c * kHChunk + r * 128 + ((u ^ (r & 7)) << 4)),
             h + (in ? (node0 + r) * ldh + c * 64 + u * 8 : 0), in ? 16 : 0);
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
    float z[32], d0[MN ? 128 : 80], d1[MN ? 32 : 80];
#pragma unroll
    for (int i = 0; i < (MN ? 128 : 80); ++i) d0[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (MN ? 32 : 80); ++i) d1[i] = 0.f;
    const uint32_t a0 = saddr(hs), p0 = saddr(ps), zb = saddr(zs), tb = saddr(ts);
    for (int t = 0, zi = 0, ti = 0; t < tiles; ++t) {
        ring_product(z, a0, zb, kZStage, kZStages, wgi * 64 * 128, zfull, zempty, zi, lane);
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
        /* d h's four stages: (kc, jj) = (0, 0), (0, 1), (1, 0), (1, 1), or MN four slabs of 32 rows */
        if constexpr (MN) ring_slabs(d0, d1, p0, tb, wgi, tfull, tempty, ti, lane);
        else ring_blocks<4>(d0, d1, p0, tb, wgi * kBlock * 128, tfull, tempty, ti, lane);
    }
    /* d h: this thread's rows, columns wgi 320 + jj 160 + 8 j + 2 (lane % 4) + c */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int64_t n = node0 + warp * 16 + hf * 8 + (lane >> 2);
        if (n >= count) continue;
        float *row = dh + n * ldo + wgi * 2 * kBlock + 2 * (lane & 3);
        /* MN: d0's 256 columns, then d1's 64 */
        const int n0 = MN ? 32 : 20, n1 = MN ? 8 : 20, off1 = MN ? 256 : kBlock;
#pragma unroll
        for (int j = 0; j < n0; ++j)
            *reinterpret_cast<float2 *>(row + 8 * j) = make_float2(d0[4 * j + 2 * hf], d0[4 * j + 2 * hf + 1]);
#pragma unroll
        for (int j = 0; j < n1; ++j)
            *reinterpret_cast<float2 *>(row + off1 + 8 * j) = make_float2(d1[4 * j + 2 * hf], d1[4 * j + 2 * hf + 1]);
    }
}

/* P^T = g exp(z^T - lse) rounded to bfloat16, from a warpgroup's z^T (m64n32k16 sums: token rows
 * warp 16 + lane / 4 and 8 more, nodes wgi 32 + 8 j + 2 (lane % 4) + c of the block's 64), into
 * the 64 token rows of 64 node values at pt (K-major, the 128-byte swizzle); zero past V.
 * node(i, &g, &lse2) gives node i's weight and base-2 log-normaliser (zeros where i is none). */
template <typename Node>
__device__ __forceinline__ void pt_store(unsigned char *pt, const float (&z)[16], int64_t vrow0, int64_t V, int wgi,
                                         int warp, int lane, Node node) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float gn[2], ln[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) node(wgi * 32 + 8 * j + 2 * (lane & 3) + c, &gn[c], &ln[c]);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = warp * 16 + hf * 8 + (lane >> 2);
            const bool in = vrow0 + r < V;
            float v[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) v[c] = in ? gn[c] * exp2f(fmaf(z[4 * j + 2 * hf + c], kLog2e, -ln[c])) : 0.f;
            *reinterpret_cast<__nv_bfloat162 *>(pt + r * 128 + (((wgi * 4 + j) ^ (r & 7)) << 4) + (lane & 3) * 4) =
                __floats2bfloat162_rn(v[0], v[1]);
        }
    }
}

/* W's 64 rows of block b (half b % 2 of tile b / 2's stages as tdt_gpu_wgmma_pack lays them out)
 * into ws, KC chunks of 8 KB counted on the mbarrier wfull: one thread */
__device__ __forceinline__ void w_rows_load(unsigned char *ws, const unsigned char *Wz, uint32_t wfull) {
    const size_t half = (size_t)(blockIdx.x & 1) * kHChunk, tile = blockIdx.x >> 1;
    mbar_expect_tx(wfull, KC * kHChunk);
    for (int kc = 0; kc < KC; ++kc)
        bulk_copy(saddr(ws + kc * kHChunk), Wz + (tile * KC + kc) * (size_t)kZStage + half, kHChunk, wfull);
}

/* 8 values of h = relu(a + b), a and b 8 bfloat16 values each, rounded to bfloat16 */
__device__ __forceinline__ uint4 relu_sum8(const uint4 a, const uint4 b) {
    const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
    uint32_t ov[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&av[e])),
                     y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&bv[e]));
        const __nv_bfloat162 r = __floats2bfloat162_rn(fmaxf(x.x + y.x, 0.f), fmaxf(x.y + y.y, 0.f));
        ov[e] = *reinterpret_cast<const uint32_t *>(&r);
    }
    return make_uint4(ov[0], ov[1], ov[2], ov[3]);
}

/* A thread's d W sums of dwh_kernel (token rows vrow0 + warp 16 + lane / 4 and 8
 * more, columns (5 wgi + j) 64 + 8 e + 2 (lane % 4) + c) added into d W (pitch ldo, rows < V),
 * then zeroed */
__device__ __forceinline__ void add_sums(float (&d)[5][32], float *dW, int64_t ldo, int64_t vrow0, int64_t V, int wgi,
                                         int warp, int lane) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int64_t v = vrow0 + warp * 16 + hf * 8 + (lane >> 2);
#pragma unroll
        for (int j = 0; j < 5; ++j) {
            float *row = dW + v * ldo + (5 * wgi + j) * 64 + 2 * (lane & 3);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                if (v < V) {
                    float2 *o = reinterpret_cast<float2 *>(row + 8 * e);
                    const float2 x = *o;
                    *o = make_float2(x.x + d[j][4 * e + 2 * hf], x.y + d[j][4 * e + 2 * hf + 1]);
                }
                d[j][4 * e + 2 * hf] = d[j][4 * e + 2 * hf + 1] = 0.f;
            }
        }
    }
}

/* d W's shared memory: W's 64 rows, h's node-row ring, h^T's ring, P^T, then the barriers */
const int kNStages = 7; /* 56 KB of h in flight: with 3 stages (24 KB) d W took 1.6x cuBLAS's time */
const size_t kSmemW = (size_t)KC * kHChunk + (size_t)kNStages * kHChunk + (size_t)kHStages * kHStage + kHChunk +
                      8 + 2 * (kNStages + kHStages) * 8 + 1024;

/*
 * d W[v] += sum_n P[n, v] h[n] over the node tiles [nt0, nt1) (64 nodes each; nodes from count
 * on add nothing), P = g exp(z - lse) in bfloat16 as dh_kernel forms it; block b owns W's rows
 * b 64 to b 64 + 63 and adds its 64 x H float32 sums into d W (pitch ldo) once, at the end: one
 * owner a row, so launches over successive chunks of nodes add in a fixed order. Wz: W packed by
 * tdt_gpu_wgmma_pack (the block's rows: half b % 2 of tile b / 2's stages); hn: h packed the same
 * way (node tile nt: half nt % 2 of tile nt / 2); ht: h^T by pack_t_kernel (kcs 1).
 *
 * 384 threads as dh_kernel's. W's rows stay in shared memory; a node tile: z^T's 10 stages of
 * h's node rows, warpgroup w taking nodes w 32 to w 32 + 31 of each (m64n32k16: z^T = W h^T,
 * 16 float32 values a thread), P^T's 64 x 32 values of warpgroup w into units 4 w to 4 w + 3 of
 * P^T's rows (K-major: token rows of 64 node values), then h^T's 2 stages jj: warpgroup w adds
 * P^T times its 160 columns of the stage to its block jj of d W (m64n160k16, 2 x 80 values a
 * thread: d W's columns w 320 + jj 160 on). Barriers of the two warpgroups around P^T's write.
 */
__global__ void __launch_bounds__(kThreads, 1)
    dw_kernel(const unsigned char *__restrict__ Wz, const unsigned char *__restrict__ hn,
              const unsigned char *__restrict__ ht, const float *__restrict__ lse, const float *__restrict__ g,
              int64_t V, int64_t count, int64_t nt0, int64_t nt1, float *dW, int64_t ldo) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    unsigned char *ws = smem, *ns = ws + KC * kHChunk, *ts = ns + kNStages * kHChunk, *pt = ts + kHStages * kHStage;
    const uint32_t wfull = saddr(pt + kHChunk), nfull = wfull + 8, nempty = nfull + 8 * kNStages,
                   tfull = nempty + 8 * kNStages, tempty = tfull + 8 * kHStages;
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t vrow0 = (int64_t)blockIdx.x * 64;
    if (tid == 0) {
        mbar_init<1>(wfull);
        for (int s = 0; s < kNStages; ++s) {
            mbar_init<1>(nfull + 8 * s);
            mbar_init<8>(nempty + 8 * s);
        }
        for (int s = 0; s < kHStages; ++s) {
            mbar_init<1>(tfull + 8 * s);
            mbar_init<8>(tempty + 8 * s);
        }
    }
    __syncthreads();
    if (wgi == 2) { /* the producer: W's rows once, then a node tile's h stages and h^T stages */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 256) {
            w_rows_load(ws, Wz, wfull);
            int ni = 0, ti = 0;
            for (int64_t nt = nt0; nt < nt1; ++nt) {
                const size_t nhalf = (size_t)(nt & 1) * kHChunk, ntile = (size_t)(nt >> 1);
                for (int kc = 0; kc < KC; ++kc, ++ni) {
                    const int s = ni % kNStages;
                    if (ni >= kNStages) mbar_wait(nempty + 8 * s, (uint32_t)((ni / kNStages - 1) & 1));
                    bulk_load(saddr(ns + s * kHChunk), hn + (ntile * KC + kc) * (size_t)kZStage + nhalf,
                                   kHChunk, nfull + 8 * s);
                }
                for (int jj = 0; jj < 2; ++jj, ++ti) {
                    const int s = ti % kHStages;
                    if (ti >= kHStages) mbar_wait(tempty + 8 * s, (uint32_t)((ti / kHStages - 1) & 1));
                    bulk_load(saddr(ts + s * kHStage), ht + ((size_t)nt * 2 + jj) * kHStage, kHStage,
                                   tfull + 8 * s);
                }
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    float z[16], d0[80], d1[80];
#pragma unroll
    for (int i = 0; i < 80; ++i) d0[i] = d1[i] = 0.f;
    const uint32_t w0 = saddr(ws), nb = saddr(ns), tb = saddr(ts), p0 = saddr(pt);
    mbar_wait(wfull, 0);
    int ni = 0, ti = 0;
    for (int64_t nt = nt0; nt < nt1; ++nt) {
        ring_product(z, w0, nb, kHChunk, kNStages, wgi * 32 * 128, nfull, nempty, ni, lane);
        /* P^T of the tile (both warpgroups past their products on the last one) */
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        pt_store(pt, z, vrow0, V, wgi, warp, lane, [&](int i, float *gn, float *ln) {
            const int64_t n = nt * 64 + i;
            *gn = n < count ? __ldg(g + n) : 0.f;
            *ln = n < count ? __ldg(lse + n) * kLog2e : 0.f;
        });
        fence_proxy_async();
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        ring_blocks<2>(d0, d1, p0, tb, wgi * kBlock * 128, tfull, tempty, ti, lane);
    }
    /* d W's rows: this thread's, columns wgi 320 + jj 160 + 8 j + 2 (lane % 4) + c, added */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int64_t v = vrow0 + warp * 16 + hf * 8 + (lane >> 2);
        if (v >= V) continue;
        float *row = dW + v * ldo + wgi * 2 * kBlock + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < 20; ++j) {
            float2 *a = reinterpret_cast<float2 *>(row + 8 * j), *b = reinterpret_cast<float2 *>(row + kBlock + 8 * j);
            const float2 x = *a, y = *b;
            *a = make_float2(x.x + d0[4 * j + 2 * hf], x.y + d0[4 * j + 2 * hf + 1]);
            *b = make_float2(y.x + d1[4 * j + 2 * hf], y.y + d1[4 * j + 2 * hf + 1]);
        }
    }
}

/* d W's third form: a block of 256 threads (the two consumer warpgroups, no producer), W's 64
 * rows, one node tile's h built in place, P^T, and two stages of a tile's raw rows (8 of enc, 8
 * of pred, 20 KB); 1024-aligned */
const int kThreadsH = 256;
const int kRaw = 16 * H * 2;
const size_t kSmemH = (size_t)KC * kHChunk + (size_t)KC * kHChunk + kHChunk + 2 * (size_t)kRaw + 8 + 1024;

/*
 * d W = sum_n P[n, v] h[n] as dw_kernel, with h never in memory: one launch for all the nodes,
 * each block's 64 x H sums kept in registers. The lattice is one sample's T x U1 nodes (node n
 * = t U1 + u), h[n] = relu(enc[t] + pred[u]) rounded to bfloat16 (enc T x H, pred U1 x H,
 * bfloat16, pitch H). A tile is 8 frames x 8 labels (node i of the tile: t = 8 tt + i / 8, u =
 * 8 tu + i % 8; h and g zero outside the lattice), so that building its h reads 16 rows of H
 * values instead of 64.
 *
 * Per tile: the 256 threads build h (the 10 chunks of 64 node rows x 64 values, K-major in the
 * 128-byte swizzle, as tdt_gpu_wgmma_pack lays out W); z^T = W h^T as dw_kernel's (m64n32k16,
 * warpgroup w taking nodes w 32 on); P^T into shared memory; then d W += P^T h with h read
 * MN-major from the same chunks (m64n64k16 with B transposed: N = 64 of h's columns a chunk, K =
 * 16 nodes a step), warpgroup w adding chunks 5 w to 5 w + 4 (5 x 32 float32 values a thread).
 * No stage is streamed: the block's loads are W's rows once and, per tile, 16 rows of enc and
 * pred. PF 0: h built from those rows in L1 or L2 (each tile waits for its loads); PF 1: the
 * rows copied (cp.async) into shared memory a tile ahead, h built from there. Where W's blocks of
 * 64 rows are fewer than the SMs (V 1025: 17), the tiles are split over gridDim.y, block y's sums
 * at dW + y part, to be added in order.
 * Each thread adds its sums into d W (pitch ldo; the caller zeroes it) at the end and, with
 * FLUSH, every `flush` tiles, starting them again from zero: one owner a row, so the order is
 * fixed. wgmma's float32 sums over a whole launch (4875 tiles at huge-joint) lost 1e-3 of d W's
 * norm against 7e-5 for sums of 128 tiles.
 */
template <int PF, bool FLUSH>
__global__ void __launch_bounds__(kThreadsH, 1)
    dwh_kernel(const unsigned char *__restrict__ Wz, const uint16_t *__restrict__ enc,
               const uint16_t *__restrict__ pred, int64_t T, int64_t U1, const float *__restrict__ lse,
               const float *__restrict__ g, int64_t V, float *dW, int64_t ldo, int64_t part, int flush) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    unsigned char *ws = smem, *hs = ws + KC * kHChunk, *pt = hs + KC * kHChunk, *raw = pt + kHChunk;
    const uint32_t wfull = saddr(raw + 2 * kRaw);
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t vrow0 = (int64_t)blockIdx.x * 64;
    if (tid == 0) {
        mbar_init<1>(wfull);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) w_rows_load(ws, Wz, wfull);
    float z[16], d[5][32];
#pragma unroll
    for (int j = 0; j < 5; ++j)
#pragma unroll
        for (int i = 0; i < 32; ++i) d[j][i] = 0.f;
    const uint32_t w0 = saddr(ws), h0 = saddr(hs), p0 = saddr(pt);
    const int64_t tiles_u = (U1 + 7) / 8, tiles = (T + 7) / 8 * tiles_u;
    /* block y of gridDim.y takes its share of the tiles, its sums into partial sum y */
    const int64_t k0 = tiles * blockIdx.y / gridDim.y, k1 = tiles * (blockIdx.y + 1) / gridDim.y;
    dW += blockIdx.y * part;
    const auto add_out = [&]() { add_sums(d, dW, ldo, vrow0, V, wgi, warp, lane); };
    /* PF: tile k's raw rows (enc's 8 frames, then pred's 8 labels; zeros outside the lattice) into
     * raw stage k % 2 */
    const auto fetch = [&](int64_t k) {
        const int64_t t0 = k / tiles_u * 8, u0 = k % tiles_u * 8;
        unsigned char *st = raw + (k & 1) * kRaw;
        for (int q = tid; q < 16 * (H / 8); q += kThreadsH) {
            const int r = q / (H / 8), cu = q % (H / 8);
            const int64_t row = r < 8 ? t0 + r : u0 + r - 8;
            const bool in = r < 8 ? row < T : row < U1;
            const uint16_t *src = r < 8 ? enc : pred;
            cp16(saddr(st + r * (H * 2) + cu * 16), src + (in ? row * H + cu * 8 : 0), in ? 16 : 0);
        }
        cp_commit();
    };
    mbar_wait(wfull, 0);
    if (PF && k0 < k1) fetch(k0);
    for (int64_t k = k0; k < k1; ++k) {
        const int64_t t0 = k / tiles_u * 8, u0 = k % tiles_u * 8;
        if constexpr (PF) {
            if (k + 1 < k1) fetch(k + 1); /* its stage's last reader, tile k - 1's build, is past a barrier */
            else cp_commit();
            cp_wait<1>();
            __syncthreads(); /* every thread's copies of tile k's rows */
        }
        const unsigned char *st = raw + (k & 1) * kRaw;
        /* h: 64 nodes x 80 units of 8 values; unit q: node q / 80, columns 8 (q % 80) on */
        for (int q = tid; q < kNodes * (H / 8); q += kThreadsH) {
            const int i = q / (H / 8), cu = q % (H / 8);
            const int64_t t = t0 + i / 8, u = u0 + i % 8;
            uint4 out = make_uint4(0, 0, 0, 0);
            if (t < T && u < U1) {
                uint4 a, b;
                if constexpr (PF) {
                    a = *reinterpret_cast<const uint4 *>(st + (i / 8) * (H * 2) + cu * 16);
                    b = *reinterpret_cast<const uint4 *>(st + (8 + i % 8) * (H * 2) + cu * 16);
                } else {
                    a = __ldg(reinterpret_cast<const uint4 *>(enc + t * H) + cu);
                    b = __ldg(reinterpret_cast<const uint4 *>(pred + u * H) + cu);
                }
                out = relu_sum8(a, b);
            }
            *reinterpret_cast<uint4 *>(hs + (cu >> 3) * kHChunk + i * 128 + (((cu & 7) ^ (i & 7)) << 4)) = out;
        }
        fence_proxy_async();
        __syncthreads();
        /* z^T = W h^T: this warpgroup's 32 nodes */
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < KC; ++kc)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                mma_bf16(z, desc_of(w0 + kc * kHChunk + kk * 32), desc_of(h0 + kc * kHChunk + wgi * 32 * 128 + kk * 32),
                         kc > 0 || kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        pin_n(z);
        /* P^T of the tile */
        pt_store(pt, z, vrow0, V, wgi, warp, lane, [&](int i, float *gn, float *ln) {
            const int64_t t = t0 + i / 8, u = u0 + i % 8;
            const bool in = t < T && u < U1;
            *gn = in ? __ldg(g + t * U1 + u) : 0.f;
            *ln = in ? __ldg(lse + t * U1 + u) * kLog2e : 0.f;
        });
        fence_proxy_async();
        __syncthreads();
        /* d W += P^T h: chunks 5 wgi + j, K = the tile's 64 nodes in 4 steps of 16 (2 KB of h rows) */
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 5; ++j)
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
                mma_n64<0, 1>(d[j], desc_of(p0 + ks * 32), desc_mn(h0 + (5 * wgi + j) * kHChunk + ks * 2048, kHChunk), 1);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 5; ++j) pin_n(d[j]);
        __syncthreads(); /* h, P^T and the raw stage free for the next tile */
        if (FLUSH && (k - k0 + 1) % flush == 0 && k + 1 < k1) add_out();
    }
    add_out();
}

/* out[i] = sum over y < parts of in[y part + i], in order, for the first n values */
__global__ void sum_parts_kernel(const float *in, int64_t part, int parts, int64_t n, float *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a = 0.f;
        for (int y = 0; y < parts; ++y) a += in[y * part + i];
        out[i] = a;
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
    const int64_t all = nodes * ldz;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < all; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / ldz, v = i % ldz;
        const float x = (float)z[i];
        P[i] = __float2bfloat16(v < V ? g[n] * exp2f(fmaf(x, kLog2e, -lse[n] * kLog2e)) : 0.f);
    }
}

/* dz's row coefficients for tdt_gpu_wgmma_dz giving P's formula: reference lse (base 2), weight
 * g, no clip, scale 1 */
__global__ void dz_rows_kernel(const float *lse, const float *g, int64_t nodes, tdt_wgmma_dz_row *rows) {
    for (int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; n < nodes; n += (int64_t)gridDim.x * blockDim.x)
        rows[n] = tdt_wgmma_dz_row{lse[n] * kLog2e, g[n], INFINITY, 1.f, 1, -1, 0, 0};
}

/* bfloat16 values as float32 */
__global__ void widen_kernel(const __nv_bfloat16 *x, int64_t n, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

} // namespace

/* h[t U1 + u] = relu(enc[t] + pred[u]) rounded to bfloat16, as dwh_kernel forms it */
__global__ void h_kernel(const __nv_bfloat16 *enc, const __nv_bfloat16 *pred, int64_t T, int64_t U1,
                         __nv_bfloat16 *h) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * U1 * H; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / H, c = i % H;
        h[i] = __float2bfloat16(
            fmaxf(__bfloat162float(enc[n / U1 * H + c]) + __bfloat162float(pred[n % U1 * H + c]), 0.f));
    }
}

/* normwise relative difference of a against b (n values on the device), printed; whether it is
 * within tol */
static bool compare(const char *what, const float *a_dev, const float *b_dev, size_t n, int64_t cols, double tol) {
    std::vector<float> a(n), b(n);
    CK(cudaMemcpy(a.data(), a_dev, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), b_dev, n * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0, worst = -1;
    size_t wi = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (!(fabs(d) <= worst)) worst = fabs(d), wi = i;
    }
    const double rel = sqrt(num) / std::max(sqrt(den), 1e-300);
    printf("check: %s normwise rel. difference %.3g, largest |difference| %.3g (row %zu, column %zu: %.7g, want "
           "%.7g)\n",
           what, rel, worst, wi / (size_t)cols, wi % (size_t)cols, a[wi], b[wi]);
    if (!(rel <= tol)) printf("FAILED: the fused kernel's %s differs\n", what);
    return rel <= tol;
}

int main(int argc, char **argv) {
    int64_t nodes = 303000, V = 8193, U1 = 101;
    int iters = 5;
    static const option opts[] = {{"nodes", required_argument, 0, 'n'}, {"vocab", required_argument, 0, 'v'},
                                  {"labels", required_argument, 0, 'u'}, {"iters", required_argument, 0, 'i'},
                                  {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'n') nodes = atoll(optarg);
        else if (c == 'v') V = atoll(optarg);
        else if (c == 'u') U1 = atoll(optarg);
        else if (c == 'i') iters = atoi(optarg);
        else {
            fprintf(stderr, "usage: %s [--nodes N] [--vocab V] [--labels U1] [--iters I]\n", argv[0]);
            return 2;
        }
    }
    if (nodes < 1 || V < 1 || U1 < 1 || iters < 1) {
        fprintf(stderr, "joint_bwd_proto: --nodes, --vocab, --labels and --iters must be positive\n");
        return 2;
    }
    /* one sample's lattice of T x U1 nodes, T the fewest frames that hold --nodes */
    const int64_t T = (nodes + U1 - 1) / U1;
    nodes = T * U1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("joint_bwd_proto: %s, nodes %lld (T %lld x U1 %lld), V %lld, H %d, iters %d\n", prop.name,
           (long long)nodes, (long long)T, (long long)U1, (long long)V, H, iters);
    if (!tdt_gpu_wgmma_fits(prop.major, prop.minor, (int)prop.sharedMemPerBlockOptin, H) ||
        std::max({kSmem, kSmemW, kSmemH}) > (size_t)prop.sharedMemPerBlockOptin) {
        printf("not run: the kernels need compute capability 9.0 and %zu bytes of shared memory a block\n",
               std::max({kSmem, kSmemW, kSmemH}));
        return 0;
    }
    const int64_t ldz = (V + 7) / 8 * 8, tiles = (V + kRows - 1) / kRows, ntiles = (nodes + kNodes - 1) / kNodes;
    const int sms = prop.multiProcessorCount;
    __nv_bfloat16 *h, *W, *P, *zb;
    float *g, *lse, *z, *dh, *dh_ref, *dW, *dW_ref;
    void *Wz, *Wt, *hn, *ht;
    const int64_t chunk = std::min<int64_t>(nodes, 32768);
    CK(cudaMalloc(&h, (size_t)nodes * H * 2));
    CK(cudaMalloc(&W, (size_t)ldz * H * 2));
    CK(cudaMalloc(&g, nodes * 4));
    CK(cudaMalloc(&lse, nodes * 4));
    CK(cudaMalloc(&dh, (size_t)nodes * H * 4));
    CK(cudaMalloc(&dh_ref, (size_t)nodes * H * 4));
    CK(cudaMalloc(&dW, (size_t)ldz * H * 4));
    CK(cudaMalloc(&dW_ref, (size_t)ldz * H * 4));
    CK(cudaMalloc(&z, (size_t)chunk * ldz * 4));
    CK(cudaMalloc(&zb, (size_t)chunk * ldz * 2));
    CK(cudaMalloc(&P, (size_t)chunk * ldz * 2));
    CK(cudaMalloc(&Wz, tdt_gpu_wgmma_pack_bytes(V, H)));
    CK(cudaMalloc(&Wt, (size_t)tiles * 4 * kHStage));
    CK(cudaMalloc(&hn, tdt_gpu_wgmma_pack_bytes(nodes, H)));
    CK(cudaMalloc(&ht, (size_t)ntiles * 2 * kHStage));
    /* h = relu(enc[t] + pred[u]) in bfloat16, enc and pred uniform in [-1, 1) */
    __nv_bfloat16 *enc, *pred;
    CK(cudaMalloc(&enc, (size_t)T * H * 2));
    CK(cudaMalloc(&pred, (size_t)U1 * H * 2));
    proto::fill_bf16_kernel<<<1024, 256>>>(enc, T, H, T, H, 1.0f, 4);
    proto::fill_bf16_kernel<<<1024, 256>>>(pred, U1, H, U1, H, 1.0f, 5);
    h_kernel<<<1024, 256>>>(enc, pred, T, U1, h);
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
    /* d W (H x ldz, column-major: token rows) (+)= h^T P */
    auto dwgemm = [&](int64_t n0, int64_t n, float *out) {
        const float *beta = n0 == 0 ? &zero : &one;
        return cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_T, H, (int)ldz, (int)n, &one, h + n0 * H, CUDA_R_16BF, H, P,
                            CUDA_R_16BF, (int)ldz, beta, out, CUDA_R_32F, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    /* lse from float32 z, then the references: P from it, d h = P W, d W = P^T h */
    for (int64_t n0 = 0; n0 < nodes; n0 += chunk) {
        const int64_t n = std::min(chunk, nodes - n0);
        if (zgemm(n0, n, z, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx (z) failed\n");
            return 1;
        }
        lse_kernel<<<(unsigned)((n + 7) / 8), 256>>>(z, ldz, lse + n0, n, V);
        p_kernel<float><<<2048, 256>>>(z, ldz, lse + n0, g + n0, n, V, P);
        if (dhgemm(n0, n, dh_ref) != CUBLAS_STATUS_SUCCESS || dwgemm(n0, n, dW_ref) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx (d h or d W) failed\n");
            return 1;
        }
    }
    auto packs_w = [&]() {
        CK(tdt_gpu_wgmma_pack(W, H, V, H, Wz, sms, 0));
        pack_t_kernel<<<(unsigned)sms * 4, 256>>>(reinterpret_cast<const uint16_t *>(W), H, V, 2,
                                                  static_cast<uint4 *>(Wt));
    };
    auto packs_h = [&]() {
        CK(tdt_gpu_wgmma_pack(h, H, nodes, H, hn, sms, 0));
        pack_t_kernel<<<(unsigned)sms * 4, 256>>>(reinterpret_cast<const uint16_t *>(h), H, nodes, 1,
                                                  static_cast<uint4 *>(ht));
    };
    packs_w();
    packs_h();
    CK(cudaGetLastError());
    CK(cudaFuncSetAttribute(dh_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
    CK(cudaFuncSetAttribute(dh_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
    CK(cudaFuncSetAttribute(dw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemW));
    auto fused_dh = [&]() {
        dh_kernel<false><<<(unsigned)ntiles, kThreads, kSmem>>>(reinterpret_cast<const uint16_t *>(h), (int64_t)H,
                                                                static_cast<const unsigned char *>(Wz),
                                                                static_cast<const unsigned char *>(Wt), lse, g, V,
                                                                nodes, dh, (int64_t)H);
    };
    auto fused_dh_mn = [&]() {
        dh_kernel<true><<<(unsigned)ntiles, kThreads, kSmem>>>(reinterpret_cast<const uint16_t *>(h), (int64_t)H,
                                                               static_cast<const unsigned char *>(Wz), NULL, lse, g, V,
                                                               nodes, dh, (int64_t)H);
    };
    /* d W a chunk of 128 node tiles at a time (8192 nodes: the chunk's h in L2), added in order */
    const int64_t tiles_a_chunk = 128;
    auto fused_dw = [&]() {
        CK(cudaMemsetAsync(dW, 0, (size_t)ldz * H * 4));
        for (int64_t t0 = 0; t0 < ntiles; t0 += tiles_a_chunk)
            dw_kernel<<<(unsigned)((V + 63) / 64), kThreads, kSmemW>>>(
                static_cast<const unsigned char *>(Wz), static_cast<const unsigned char *>(hn),
                static_cast<const unsigned char *>(ht), lse, g, V, nodes, t0, std::min(ntiles, t0 + tiles_a_chunk), dW,
                (int64_t)H);
    };
    CK(cudaMemset(dh, 0xff, (size_t)nodes * H * 4)); /* NaN: every value must be written */
    fused_dh();
    CK(cudaGetLastError());
    fused_dw();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    bool ok_dh = compare("d h", dh, dh_ref, (size_t)nodes * H, H, 2e-3);
    CK(cudaMemset(dh, 0xff, (size_t)nodes * H * 4));
    fused_dh_mn();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    ok_dh = compare("d h (W read MN-major, slabs of 32 rows)", dh, dh_ref, (size_t)nodes * H, H, 2e-3) && ok_dh;
    bool ok_dw = compare("d W", dW, dW_ref, (size_t)V * H, H, 2e-3);
    /* d W with h built on the chip, all the nodes in one launch: its rows built from L1/L2 or
     * from rows prefetched into shared memory, its sums added out at the end or every 128 tiles
     * (8192 nodes) */
    void (*dwhk[4])(const unsigned char *, const uint16_t *, const uint16_t *, int64_t, int64_t, const float *,
                    const float *, int64_t, float *, int64_t, int64_t, int) = {
        dwh_kernel<0, false>, dwh_kernel<0, true>, dwh_kernel<1, false>, dwh_kernel<1, true>};
    const char *dwh_name[4] = {"rows from L1/L2, added out at the end", "rows from L1/L2, added out every 128 tiles",
                               "rows prefetched, added out at the end", "rows prefetched, added out every 128 tiles"};
    for (auto k : dwhk) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemH));
    /* W's blocks of 64 rows, the tiles split over gridDim.y until there is a block an SM */
    const int64_t wblocks = (V + 63) / 64, parts = std::max<int64_t>(1, sms / wblocks), part = ldz * H;
    float *dWp = NULL;
    if (parts > 1) CK(cudaMalloc(&dWp, (size_t)(parts * part) * 4));
    auto fused_dwh = [&](int v) {
        float *out = parts > 1 ? dWp : dW;
        CK(cudaMemsetAsync(out, 0, (size_t)(parts * part) * 4));
        dwhk[v]<<<dim3((unsigned)wblocks, (unsigned)parts), kThreadsH, kSmemH>>>(
            static_cast<const unsigned char *>(Wz), reinterpret_cast<const uint16_t *>(enc),
            reinterpret_cast<const uint16_t *>(pred), T, U1, lse, g, V, out, (int64_t)H, part, 128);
        if (parts > 1) sum_parts_kernel<<<1024, 256>>>(dWp, part, (int)parts, part, dW);
    };
    printf("h built on the chip, 8 x 8 node tiles, one launch (%lld x %lld blocks):\n", (long long)wblocks,
           (long long)parts);
    for (int v = 0; v < 4; ++v) {
        CK(cudaMemset(dW, 0xff, (size_t)ldz * H * 4));
        fused_dwh(v);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        char what[96];
        snprintf(what, sizeof what, "d W (h built, %s)", dwh_name[v]);
        ok_dw = compare(what, dW, dW_ref, (size_t)V * H, H, 2e-3) && ok_dw;
    }
    /* the library's dz kernel (tdt_gpu_wgmma_dz) against the reference P on the first chunk */
    tdt_wgmma_dz_row *rows;
    __nv_bfloat16 *dzb;
    CK(cudaMalloc(&rows, nodes * sizeof(tdt_wgmma_dz_row)));
    CK(cudaMalloc(&dzb, (size_t)chunk * ldz * 2));
    dz_rows_kernel<<<256, 256>>>(lse, g, nodes, rows);
    CK(cudaMemset(dzb, 0, (size_t)chunk * ldz * 2));
    CK(tdt_gpu_wgmma_dz(0, h, H, Wz, NULL, V, H, chunk, rows, dzb, ldz, sms, 0));
    zgemm(0, chunk, z, CUDA_R_32F);
    p_kernel<float><<<2048, 256>>>(z, ldz, lse, g, chunk, V, P);
    widen_kernel<<<2048, 256>>>(dzb, chunk * ldz, z); /* z's buffer reused: dz as float32 */
    float *pw; /* P as float32 */
    CK(cudaMalloc(&pw, (size_t)chunk * ldz * 4));
    widen_kernel<<<2048, 256>>>(P, chunk * ldz, pw);
    CK(cudaGetLastError());
    const bool ok_dz = compare("dz (tdt_gpu_wgmma_dz, first chunk)", z, pw, (size_t)chunk * ldz, ldz, 2e-3);
    if (!ok_dh || !ok_dw || !ok_dz) return 1;
    auto time = [&](auto fn) { return proto::time_ms(iters, fn); };
    /* the GEMM schedule's way: z in bfloat16, P from it, then the product */
    auto unfused = [&](bool want_dh) {
        for (int64_t n0 = 0; n0 < nodes; n0 += chunk) {
            const int64_t n = std::min(chunk, nodes - n0);
            zgemm(n0, n, zb, CUDA_R_16BF);
            p_kernel<__nv_bfloat16><<<2048, 256>>>(zb, ldz, lse + n0, g + n0, n, V, P);
            if (want_dh) dhgemm(n0, n, dh_ref);
            else dwgemm(n0, n, dW_ref);
        }
    };
    const double flop = 4.0 * (double)nodes * V * H; /* z and one product */
    const float tua = time([&] { unfused(true); }), tub = time([&] { unfused(false); });
    const float ta = time(fused_dh), tb = time(fused_dw), tam = time(fused_dh_mn);
    printf("d h: fused z + P + d h  %8.3f ms  %6.1f TFLOP/s  (fused / cuBLAS's %.2f)\n", ta, flop / ta / 1e9, ta / tua);
    printf("d h: fused, W read MN-major in slabs (m64n256k16 + m64n64k16)  %8.3f ms  %6.1f TFLOP/s  (fused / "
           "cuBLAS's %.2f)\n",
           tam, flop / tam / 1e9, tam / tua);
    printf("d W: fused z + P + d W  %8.3f ms  %6.1f TFLOP/s  (fused / cuBLAS's %.2f; %lld launches of %lld node "
           "tiles)\n",
           tb, flop / tb / 1e9, tb / tub, (long long)((ntiles + tiles_a_chunk - 1) / tiles_a_chunk),
           (long long)tiles_a_chunk);
    for (int v = 0; v < 4; ++v) {
        const float tc = time([&] { fused_dwh(v); });
        printf("d W: fused z + P + d W, h built on the chip, %s  %8.3f ms  %6.1f TFLOP/s  (fused / cuBLAS's %.2f; "
               "one launch, %lld tiles of 8 x 8 nodes, %lld part(s))\n",
               dwh_name[v], tc, flop / tc / 1e9, tc / tub, (long long)((T + 7) / 8 * ((U1 + 7) / 8)), (long long)parts);
    }
    printf("d h: cuBLAS z, P, cuBLAS d h  %8.3f ms  %6.1f TFLOP/s\n", tua, flop / tua / 1e9);
    printf("d W: cuBLAS z, P, cuBLAS d W  %8.3f ms  %6.1f TFLOP/s\n", tub, flop / tub / 1e9);
    const float tpw = time(packs_w), tph = time(packs_h);
    printf("packing W twice %.3f ms, h twice %.3f ms\n", tpw, tph);
    /* dz alone, written (the GEMM schedule's backward keeps it for cuBLASLt's d h and d W), in
     * chunks of `c` nodes: the library's wgmma kernel against cuBLAS's z and the P kernel */
    for (const int64_t c : {chunk, std::min<int64_t>(nodes, 6464)}) {
        const float tz = time([&] {
            for (int64_t n0 = 0; n0 < nodes; n0 += c)
                tdt_gpu_wgmma_dz(0, h + n0 * H, H, Wz, NULL, V, H, std::min(c, nodes - n0), rows + n0, dzb, ldz,
                                 sms, 0);
        });
        const float tuz = time([&] {
            for (int64_t n0 = 0; n0 < nodes; n0 += c) {
                const int64_t n = std::min(c, nodes - n0);
                zgemm(n0, n, zb, CUDA_R_16BF);
                p_kernel<__nv_bfloat16><<<2048, 256>>>(zb, ldz, lse + n0, g + n0, n, V, P);
            }
        });
        printf("dz, chunks of %6lld nodes: wgmma %8.3f ms  %6.1f TFLOP/s; cuBLAS z + P %8.3f ms (wgmma / this %.2f)\n",
               (long long)c, tz, flop / 2 / tz / 1e9, tuz, tz / tuz);
    }
    return 0;
}
