/*
 * joint_wgmma.cu - the GEMM schedule's products that end on the chip, on Hopper's tensor cores
 * (wgmma, compiled for sm_90a alone; joint_wgmma.h is the interface, joint_gemm.cu the caller),
 * z = h W^T over W's V token rows for a chunk's nodes, the logits never written:
 *   - the forward's log-normalisers, lse = log sum_v exp(z_v + bias_v) (wgmma_lse_kernel: the
 *     producer-warp kernel first measured in benchmark/joint_lse_proto.cu, which now times this
 *     one, with h's columns from H on, the bias's and the shift's in the GEMM schedule's rows,
 *     left out and the bias added to each value as it is folded in);
 *   - the backward's dz from row coefficients, written in the dtype (wgmma_dz_kernel), for the
 *     products that follow;
 *   - the chip backward's products with dz formed on the chip from z recomputed there: d W and d
 *     bias (wgmma_dw_kernel, 64 of W's rows a block, the chunk's h streamed in tiles of 128
 *     nodes) and d h (wgmma_dh_kernel, 64 nodes a block, W streamed), each described where it
 *     is defined.
 *
 * The first two: a block of 128 nodes, two warpgroups of 64 (warps 0-7) and a producer warp
 * (warp 8). h's rows stay in shared memory as KC = ceil(H / 64) chunks of 64 values, 128 bytes a
 * row in the 128-byte swizzle (row r's 16-byte unit u at unit u ^ (r % 8)); W's token rows,
 * packed once a call into that layout (tdt_gpu_wgmma_pack), stream through kStages stages of 128 rows x 64
 * values, one bulk copy a stage completing on the stage's "full" mbarrier; each warp gives a
 * stage back on its "empty" mbarrier once its products on it are retired. A stage: each
 * warpgroup's four m64n128k16 products (float32 sums); after a tile's last chunk its 64 x 128
 * values are folded into a running log-sum-exp a row (base 2, float32), or turned into dz and
 * stored (z_tiles runs the loop, the kernels their tile's epilogue).
 */
#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../gpu_common.cuh"
#include "../joint_wgmma.h"
#include "wgmma.cuh"

namespace {

const int kNodes = 128, kRows = 128, kChunk = 64, kStages = 4, kThreads = 288;
const int kHBytes = kNodes * kChunk * 2; /* one chunk of h's rows */
const int kStage = kRows * kChunk * 2;   /* one stage of W's rows */
const float kLog2e = 1.4426950408889634f;

__host__ __device__ inline int chunks_of(int64_t H) { return (int)((H + kChunk - 1) / kChunk); }
inline size_t smem_of(int64_t H) {
    return (size_t)chunks_of(H) * kHBytes + (size_t)kStages * kStage + 2 * kStages * 8 + 1024;
}

__device__ __forceinline__ uint32_t bits_of(__half2 x) { return *reinterpret_cast<uint32_t *>(&x); }
__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 x) { return *reinterpret_cast<uint32_t *>(&x); }

template <int F16> __device__ __forceinline__ float to_f(uint16_t x) {
    if (F16) return __half2float(__ushort_as_half(x));
    return __bfloat162float(__ushort_as_bfloat16(x));
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

/* A block's z = h W^T for its 128 nodes (node0 = block 128 on) and W's tiles [tile0, tile1) of 128
 * token rows: the barriers, the producer warp (which returns false at once), h's rows into shared
 * memory, then for each tile this warpgroup's 64 x 128 float32 products in acc, handed to
 * fold(tile, acc) once they are retired (thread (warp, lane) of the warpgroup holds rows warp 16 + lane / 4 and 8
 * more at the tile's columns 8 j + 2 (lane % 4) + c: acc[4 j + 2 hf + c] for row hf 8 on).
 * True in the warpgroups' threads, after the last tile. */
template <int F16, typename Fold>
__device__ __forceinline__ bool z_tiles(const uint16_t *__restrict__ h, int64_t ldh,
                                        const unsigned char *__restrict__ Wp, int64_t H, int64_t count, int tile0,
                                        int tile1, const Fold &fold) {
    extern __shared__ unsigned char smem_raw[];
    /* the swizzle's pattern repeats every 1024 bytes: the base aligned to that */
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    const int KC = chunks_of(H);
    unsigned char *hs = smem, *ws = smem + (size_t)KC * kHBytes;
    const uint32_t full0 = saddr(ws + kStages * kStage), empty0 = full0 + kStages * 8;
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7;
    const int64_t node0 = (int64_t)blockIdx.x * kNodes;
    const int steps = (tile1 - tile0) * KC;
    if (tid == 0)
        for (int s = 0; s < kStages; ++s) {
            mbar_init<1>(full0 + 8 * s);
            mbar_init<8>(empty0 + 8 * s);
        }
    __syncthreads(); /* the barriers' initialisation, before any use */
    if (tid >= 256) { /* the producer: one thread */
        if (tid == 256)
            for (int step = 0; step < steps; ++step) {
                const int s = step % kStages;
                if (step >= kStages) mbar_wait(empty0 + 8 * s, (uint32_t)((step / kStages - 1) & 1));
                bulk_load(saddr(ws + s * kStage), Wp + ((size_t)tile0 * KC + step) * kStage, kStage, full0 + 8 * s);
            }
        return false;
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
    cp_commit();
    cp_wait<0>();
    fence_proxy_async(); /* for the tensor cores */
    asm volatile("bar.sync 1, 256;\n" ::: "memory"); /* both warpgroups' rows */

    const uint32_t a0 = saddr(hs) + wgi * 64 * 128, b0 = saddr(ws);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int tile = tile0, step = 0; tile < tile1; ++tile) {
        for (int kc = 0; kc < KC; ++kc, ++step) {
            const int s = step % kStages;
            mbar_wait(full0 + 8 * s, (uint32_t)((step / kStages) & 1));
            pin(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kChunk / 16; ++kk)
                mma<F16>(acc, desc_of(a0 + kc * kHBytes + kk * 32), desc_of(b0 + s * kStage + kk * 32), kc > 0 || kk > 0);
            wgmma_commit();
            wgmma_wait<1>();
            /* the previous stage's products are retired: give it back */
            if (step > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((step - 1) % kStages));
        }
        wgmma_wait<0>();
        pin(acc);
        fold(tile, acc);
    }
    return true;
}

/* The bias of the tile's columns col0 + 8 j + c (col0 = tile 128 + 2 (lane % 4)): -inf from V on */
template <int F16>
__device__ __forceinline__ void tile_bias(float (&b)[16][2], int64_t col0, int64_t V, const uint16_t *bias) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int64_t col = col0 + 8 * j + c;
            b[j][c] = col >= V ? -INFINITY : bias ? to_f<F16>(__ldg(bias + col)) : 0.f;
        }
}

template <int F16>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_lse_kernel(const uint16_t *__restrict__ h, int64_t ldh, const unsigned char *__restrict__ Wp,
                     const uint16_t *__restrict__ bias, int64_t V, int64_t H, int64_t count, float *lse) {
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t node0 = (int64_t)blockIdx.x * kNodes;
    lse2 run[2] = {{-INFINITY, 0.f}, {-INFINITY, 0.f}};
    const auto fold = [&](int tile, float(&acc)[64]) {
        float b[16][2];
        tile_bias<F16>(b, (int64_t)tile * kRows + 2 * (lane & 3), V, bias);
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
    };
    if (!z_tiles<F16>(h, ldh, Wp, H, count, 0, (int)((V + kRows - 1) / kRows), fold)) return;
    lse2_store(run, lse, node0 + wgi * 64, count, warp, lane);
}

/* the formula's value of dz for x = z + bias and a row's coefficients c (valid) */
__device__ __forceinline__ float dz_bulk(const tdt_wgmma_dz_row &c, float x) {
    const float t = exp2f(fmaf(x, kLog2e, -c.ref)) * c.occ;
    return c.scale * (t > c.cl ? c.cl : t);
}

/* dz[n, v] = scale min(2^(x K - ref) occ, cl) for v < V, x = z[n, v] + bias[v] (rows[n]'s
 * coefficients; 0 where !valid), in the 16-bit type, for the nodes n < count: a tile's values
 * stored as soon as its products are retired. No sum runs across W's rows, so blocks (x, y) split
 * them: block y of gridDim.y takes W's tiles [tiles y / gridDim.y, tiles (y + 1) / gridDim.y). */
template <int F16>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_dz_kernel(const uint16_t *__restrict__ h, int64_t ldh, const unsigned char *__restrict__ Wp,
                    const uint16_t *__restrict__ bias, int64_t V, int64_t H, int64_t count,
                    const tdt_wgmma_dz_row *__restrict__ rows, uint16_t *dz, int64_t ldz) {
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t node0 = (int64_t)blockIdx.x * kNodes;
    tdt_wgmma_dz_row rc[2];
    uint16_t *dr[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int64_t n = node0 + wgi * 64 + warp * 16 + hf * 8 + (lane >> 2);
        rc[hf] = n < count ? rows[n] : tdt_wgmma_dz_row{0.f, 0.f, 0.f, 0.f, 0, -1, 0, 0};
        dr[hf] = n < count ? dz + n * ldz : NULL;
    }
    const auto store = [&](int tile, float(&acc)[64]) {
        const int64_t col0 = (int64_t)tile * kRows + 2 * (lane & 3);
        float b[16][2];
        tile_bias<F16>(b, col0, V, bias);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            if (!dr[hf]) continue;
            const tdt_wgmma_dz_row &c = rc[hf];
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int64_t col = col0 + 8 * j;
                if (col >= V) break;
                float g[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float v = dz_bulk(c, acc[4 * j + 2 * hf + e] + b[j][e]);
                    g[e] = c.valid ? v : 0.f;
                }
                const uint32_t pair =
                    F16 ? bits_of(__floats2half2_rn(g[0], g[1])) : bits_of(__floats2bfloat162_rn(g[0], g[1]));
                if (col + 1 < V) *reinterpret_cast<uint32_t *>(dr[hf] + col) = pair;
                else dr[hf][col] = (uint16_t)(pair & 0xffffu);
            }
        }
    };
    const int tiles = (int)((V + kRows - 1) / kRows);
    (void)z_tiles<F16>(h, ldh, Wp, H, count, (int)((int64_t)tiles * blockIdx.y / gridDim.y),
                       (int)((int64_t)tiles * (blockIdx.y + 1) / gridDim.y), store);
}

/* d W on the chip: a block of 384 threads owns W's 64 rows vrow0 = block 64 on (half block % 2
 * of the packed tile block / 2, in shared memory for the whole launch: KC chunks of 64 rows x 64
 * values) and walks the count nodes in tiles of 128, their rows of h packed as W is
 * (tdt_gpu_wgmma_pack: a tile of 128 nodes, a chunk of it 16 KB). Warp 8 streams each tile's
 * chunks of h twice through a ring of kDwStages stages, a pair of chunks a stage (pair_load);
 * the two consumer warpgroups (240 registers) form z^T = W h^T on the first pass (m64n64k16:
 * warpgroup w the tile's nodes 64 w on), dz^T's 64 x 128 values in the 16-bit type into P^T
 * (K-major: token rows of 128 node values, two chunks) and d bias's row sums, then add P^T h on
 * the second (mn_pass, h read MN-major: 5 x 32 float32 sums a thread, kept from the first tile
 * to the last). */
const int kDwRows = 64, kDwNodes = 128, kDwStages = 3, kDwThreads = 384;
const int kDwChunk = kDwRows * 128; /* one chunk of W's 64 rows */
static_assert(kDwChunk == 8192, "z_pass takes A's chunks 8 KB apart");
inline size_t dw_smem_of(int64_t H) {
    return (size_t)chunks_of(H) * kDwChunk + (size_t)kDwStages * 2 * kStage + 2 * kDwChunk +
           kDwNodes * sizeof(tdt_wgmma_dz_row) + kDwRows * sizeof(float) + 8 * (1 + 2 * kDwStages) + 1024;
}

/* Where dz's values of row o of W come from: kn's index of the node's known value (the blank's
 * 0, the label's 1, the D durations' 2 to 1 + D: kn[n kp + i], kp = 2 + D), -1 for a token row
 * but the blank's (the formula's, but at a node's label), -2 for no row (o >= O) */
__device__ __forceinline__ int row_kind(int64_t o, int64_t V, int64_t O, int64_t blank) {
    return o >= O ? -2 : o >= V ? 2 + (int)(o - V) : o == blank ? 0 : -1;
}

/* dz[n, o] for a row o of kind known (row_kind's) and node n of coefficients c (in: n < count),
 * x = z + bias_o with z = (W h^T)[o, n]: the node's known value, the formula's, or 0 for a node
 * out of range, a row that is not valid (a rare row's values are tdt_gpu_wgmma_dw's caller's) or
 * no row */
__device__ __forceinline__ float dw_known(const tdt_wgmma_dz_row &c, const float *kn, int64_t n, int kp, int known,
                                          bool in, int64_t o, float x) {
    if (!in || !c.valid || known == -2) return 0.f;
    if (known >= 0) return kn[n * kp + known];
    return o == c.y ? kn[n * kp + 1] : dz_bulk(c, x);
}

/* dw_known for a row o whose kind is found here */
__device__ __forceinline__ float dw_value(const tdt_wgmma_dz_row &c, const float *kn, int64_t n, int kp, int64_t o,
                                          float z, float bias_o, int64_t V, int64_t O, int64_t blank) {
    return dw_known(c, kn, n, kp, row_kind(o, V, O, blank), true, o, z + bias_o);
}

/* The chip kernels' rings hold chunks in pairs: stage j of a pass holds chunk j of the streamed
 * operand and, where there is one, chunk j + HC (HC = ceil(KC / 2)), each HALF bytes, so that in
 * the second pass both warpgroups multiply on every stage: warpgroup 0 its chunk j, warpgroup 1
 * chunk j + HC, each into its sums d[j]. mn_pass is that pass over the HC stages from i on (a
 * ring of depth stages of 2 HALF bytes): d[j] += A B, A the KS x 16 values of P in shared memory
 * at p0 (K-major, chunks of 64 values 8 KB apart) and B the stage's half read MN-major (KS x 16
 * rows of 64 values). Every stage is waited for and given back by both warpgroups (each empty
 * barrier counts 8 arrivals a use); one group of products stays in flight, a stage given back
 * once the next one's products are issued and its own retired. */
template <int F16, int KS, int HALF>
__device__ __forceinline__ void mn_pass(float (&d)[5][32], uint32_t p0, uint32_t ring, int depth, uint32_t full0,
                                        uint32_t empty0, int &i, int KC, int HC, int wgi, int lane) {
    int pend = -1; /* the stage of the products in flight */
#pragma unroll
    for (int j = 0; j < 5; ++j) {
        if (j >= HC) break;
        const int s = i % depth;
        mbar_wait(full0 + 8 * s, (uint32_t)((i / depth) & 1));
        if ((wgi ? j + HC : j) < KC) {
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
                mma_n64<F16, 1>(d[j], desc_of(p0 + (ks >> 2) * 8192 + (ks & 3) * 32),
                                desc_mn(ring + (s * 2 + wgi) * HALF + ks * 2048, HALF), 1);
            wgmma_commit();
            wgmma_wait<1>();
            if (pend >= 0 && lane == 0) mbar_arrive(empty0 + 8 * pend);
            pend = s;
        } else if (lane == 0) {
            mbar_arrive(empty0 + 8 * s);
        }
        ++i;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 5; ++j) pin_n(d[j]);
    if (pend >= 0 && lane == 0) mbar_arrive(empty0 + 8 * pend);
}

/* The producer's copies of a ring stage: chunk j and, below KC, chunk j + HC of a streamed
 * operand (chunk c at src + c step, half bytes each) into the stage at dst, on its full
 * barrier */
__device__ __forceinline__ void pair_load(uint32_t dst, const unsigned char *src, size_t step, int j, int KC, int HC,
                                          int half, uint32_t full) {
    const bool two = j + HC < KC;
    mbar_expect_tx(full, two ? 2 * half : half);
    bulk_copy(dst, src + (size_t)j * step, half, full);
    if (two) bulk_copy(dst + half, src + (size_t)(j + HC) * step, half, full);
}

/* The producer's loop of the chip kernels: each of tiles tiles of src (KC chunks of 16 KB from
 * src + t KC 16 KB on) twice (the two passes), a chunk pair a stage (pair_load) through the ring
 * at ring of depth stages of 32 KB, each stage first waited for on its empty barrier once used */
__device__ __forceinline__ void stream_pairs(uint32_t ring, const unsigned char *src, int64_t tiles, int KC, int HC,
                                             int depth, uint32_t full0, uint32_t empty0) {
    int i = 0;
    for (int64_t t = 0; t < tiles; ++t)
        for (int pass = 0; pass < 2; ++pass)
            for (int j = 0; j < HC; ++j, ++i) {
                const int s = i % depth;
                if (i >= depth) mbar_wait(empty0 + 8 * s, (uint32_t)((i / depth - 1) & 1));
                pair_load(ring + s * 2 * kStage, src + (size_t)t * KC * kStage, kStage, j, KC, HC, kStage, full0 + 8 * s);
            }
}

/* The chip kernels' first pass over a tile's HC stages from i on: z = A B^T (m64n64k16, float32
 * sums overwritten), A's chunk c of 64 rows at a0 + c 8 KB and B this warpgroup's 64 rows of the
 * stage's half that holds chunk c (both K-major), one group of products in flight; every stage
 * given back */
template <int F16>
__device__ __forceinline__ void z_pass(float (&z)[32], uint32_t a0, uint32_t ring, int depth, uint32_t full0,
                                       uint32_t empty0, int &i, int KC, int HC, int wgi, int lane) {
    for (int j = 0; j < HC; ++j, ++i) {
        const int s = i % depth;
        mbar_wait(full0 + 8 * s, (uint32_t)((i / depth) & 1));
        wgmma_fence();
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const int c = j + h2 * HC;
            if (c >= KC) break;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                mma_n64<F16, 0>(z, desc_of(a0 + c * 8192 + kk * 32),
                                desc_of(ring + (s * 2 + h2) * kStage + wgi * 8192 + kk * 32), j > 0 || h2 > 0 || kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>(); /* the previous stage's products retired: it is given back */
        if (j > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % depth));
    }
    wgmma_wait<0>();
    pin_n(z);
    if (lane == 0) mbar_arrive(empty0 + 8 * ((i - 1) % depth));
}

/* A consumer thread's row hf of its 5 x 32 float32 sums (mn_pass's: d[j] of chunk j + wgi HC,
 * columns (j + wgi HC) 64 + 8 e + 2 (lane % 4) + c below H) stored into row (ADD: added) */
template <bool ADD>
__device__ __forceinline__ void sums_out(const float (&d)[5][32], float *row, int hf, int wgi, int lane, int KC,
                                         int HC, int64_t H) {
#pragma unroll
    for (int j = 0; j < 5; ++j) {
        if (j >= HC || j + wgi * HC >= KC) break;
        const int64_t col0 = (j + wgi * HC) * 64 + 2 * (lane & 3);
        float x[16]; /* ADD: the chunk's 16 values read before any is written, so that the loads
                      * overlap (a store between them would order each after the last) */
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            const int64_t col = col0 + 8 * (u >> 1) + (u & 1);
            x[u] = ADD && col < H ? row[col] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            const int64_t col = col0 + 8 * (u >> 1) + (u & 1);
            if (col < H) row[col] = ADD ? x[u] + d[j][4 * (u >> 1) + 2 * hf + (u & 1)] : d[j][4 * (u >> 1) + 2 * hf + (u & 1)];
        }
    }
}

/* The N records of rows from n0 on (zeros from count on) into rc by the block's threads 0 to
 * 2 N - 1: one cp.async of 16 bytes each, uncommitted */
template <int N>
__device__ __forceinline__ void rows_load(tdt_wgmma_dz_row *rc, const tdt_wgmma_dz_row *rows, int64_t n0,
                                          int64_t count, int tid) {
    if (tid < 2 * N) {
        const int r = tid >> 1, half = tid & 1;
        const bool in = n0 + r < count;
        cp16(saddr(reinterpret_cast<unsigned char *>(rc + r) + half * 16),
             reinterpret_cast<const unsigned char *>(rows + (in ? n0 + r : 0)) + half * 16, in ? 16 : 0);
    }
}

template <int F16>
__global__ void __launch_bounds__(kDwThreads, 1)
    wgmma_dw_kernel(const unsigned char *__restrict__ hp, const unsigned char *__restrict__ Wp,
                    const uint16_t *__restrict__ bias, int64_t V, int64_t O, int64_t blank, int64_t H, int64_t count,
                    const tdt_wgmma_dz_row *__restrict__ rows, const float *__restrict__ kn, int kp,
                    float *wacc, int64_t ldw) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    const int KC = chunks_of(H);
    const int HC = (KC + 1) / 2; /* the ring's stages a pass: chunk pairs (j, j + HC) */
    unsigned char *ws = smem, *ring = ws + KC * kDwChunk, *pt = ring + kDwStages * 2 * kStage;
    tdt_wgmma_dz_row *rc = reinterpret_cast<tdt_wgmma_dz_row *>(pt + 2 * kDwChunk);
    float *bsum = reinterpret_cast<float *>(rc + kDwNodes);
    const uint32_t wfull = saddr(bsum + kDwRows), full0 = wfull + 8, empty0 = full0 + 8 * kDwStages;
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t vrow0 = (int64_t)blockIdx.x * kDwRows, tiles = (count + kDwNodes - 1) / kDwNodes;
    if (tid == 0) {
        mbar_init<1>(wfull);
        for (int s = 0; s < kDwStages; ++s) {
            mbar_init<1>(full0 + 8 * s);
            mbar_init<8>(empty0 + 8 * s);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wgi == 2) { /* the producer: W's rows once, then each tile's chunks of h twice */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 256) {
            const size_t half = (size_t)(blockIdx.x & 1) * kDwChunk, tile = blockIdx.x >> 1;
            mbar_expect_tx(wfull, KC * kDwChunk);
            for (int kc = 0; kc < KC; ++kc)
                bulk_copy(saddr(ws + kc * kDwChunk), Wp + (tile * KC + kc) * (size_t)kStage + half, kDwChunk, wfull);
            stream_pairs(saddr(ring), hp, tiles, KC, HC, kDwStages, full0, empty0);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    /* this thread's token rows: warp 16 + lane / 4 and 8 more; their biases */
    int64_t orow[2];
    float brow[2];
    int known[2]; /* their kinds (row_kind) */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        orow[hf] = vrow0 + warp * 16 + hf * 8 + (lane >> 2);
        brow[hf] = bias && orow[hf] < V ? to_f<F16>(__ldg(bias + orow[hf])) : 0.f;
        known[hf] = row_kind(orow[hf], V, O, blank);
    }
    float z[32], d[5][32], bs[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 5; ++j)
#pragma unroll
        for (int e = 0; e < 32; ++e) d[j][e] = 0.f;
    const uint32_t w0 = saddr(ws), rb = saddr(ring), p0 = saddr(pt);
    mbar_wait(wfull, 0);
    int i = 0;
    for (int64_t nt = 0; nt < tiles; ++nt) {
        const int64_t n0 = nt * kDwNodes;
        rows_load<kDwNodes>(rc, rows, n0, count, tid); /* the tile's coefficients */
        cp_commit();
        /* z^T = W h^T: this warpgroup's 64 nodes */
        z_pass<F16>(z, w0, rb, kDwStages, full0, empty0, i, KC, HC, wgi, lane);
        cp_wait<0>();
        /* both warpgroups past their products on the last P^T, and the coefficients in */
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        /* P^T: token row warp 16 + lane / 4 (+ 8), node wgi 64 + 8 j + 2 (lane % 4) + e, in chunk
         * wgi at unit j of the row (swizzled) */
        const int in = (int)min(count - n0, (int64_t)kDwNodes); /* the tile's nodes below count */
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c0 = wgi * 64 + 8 * j + 2 * (lane & 3);
            const tdt_wgmma_dz_row c[2] = {rc[c0], rc[c0 + 1]};
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    v[e] = dw_known(c[e], kn, n0 + c0 + e, kp, known[hf], c0 + e < in, orow[hf],
                                    z[4 * j + 2 * hf + e] + brow[hf]);
                const uint32_t pair =
                    F16 ? bits_of(__floats2half2_rn(v[0], v[1])) : bits_of(__floats2bfloat162_rn(v[0], v[1]));
                /* d bias sums the values as rounded for the product */
                bs[hf] += to_f<F16>((uint16_t)(pair & 0xffffu)) + to_f<F16>((uint16_t)(pair >> 16));
                const int r = warp * 16 + hf * 8 + (lane >> 2);
                *reinterpret_cast<uint32_t *>(pt + wgi * kDwChunk + r * 128 + ((j ^ (r & 7)) << 4) + (lane & 3) * 4) =
                    pair;
            }
        }
        fence_proxy_async();
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        /* d W += P^T h over the tile's 128 nodes: the second pass */
        mn_pass<F16, 8, kStage>(d, p0, rb, kDwStages, full0, empty0, i, KC, HC, wgi, lane);
    }
    /* d W: this thread's rows, added */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
        if (orow[hf] < O) sums_out<true>(d, wacc + orow[hf] * ldw, hf, wgi, lane, KC, HC, H);
    /* d bias: each row's sums over the lanes of its quad, then warpgroup 1's added to warpgroup 0's */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        bs[hf] += __shfl_xor_sync(0xffffffffu, bs[hf], 1);
        bs[hf] += __shfl_xor_sync(0xffffffffu, bs[hf], 2);
    }
    if (wgi == 1 && (lane & 3) == 0)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) bsum[warp * 16 + hf * 8 + (lane >> 2)] = bs[hf];
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (wgi == 0 && (lane & 3) == 0)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
            if (orow[hf] < O) wacc[orow[hf] * ldw + H] += bs[hf] + bsum[warp * 16 + hf * 8 + (lane >> 2)];
}

/* d h on the chip: a block of 384 threads owns 64 of the count nodes (node0 = block 64 on): their
 * rows of h stay in shared memory (KC chunks of 64 rows, K-major in the 128-byte swizzle) while
 * warp 8 streams W's packed tiles of 128 token and duration rows (O rows, tdt_gpu_wgmma_pack)
 * twice each through a ring of kDhStages stages, a pair of 16 KB chunks a stage (pair_load); the
 * consumers form z = h W^T on the first pass (m64n64k16: warpgroup w the tile's rows 64 w on, 32
 * float32 values a thread), dz's 64 x 128 values in the 16-bit type into P (K-major: node rows
 * of 128 token values, two chunks), then add P W_tile on the second (mn_pass, W read MN-major:
 * 5 x 32 float32 sums a thread) and store d h (float32, pitch H) at the end. */
const int kDhNodes = 64, kDhStages = 3, kDhThreads = 384;
static_assert(kDhNodes * 128 == 8192, "z_pass takes A's chunks 8 KB apart");
inline size_t dh_smem_of(int64_t H) {
    return (size_t)chunks_of(H) * kDhNodes * 128 + 2 * (size_t)kDhNodes * 128 + (size_t)kDhStages * 2 * kStage +
           kDhNodes * sizeof(tdt_wgmma_dz_row) + 8 * 2 * kDhStages + 1024;
}

/* d h's P of a tile of token rows from ot on (ps: two chunks of node rows of 128 values): this
 * thread's values at node rows r = warp 16 + lane / 4 and r + 8, token rows o = ot + wgi 64 + 8 j +
 * 2 (lane % 4) + e, into chunk wgi at unit j of the row (swizzled). PLAIN: the tile's rows are
 * token rows alone and not the blank's, so each value is the formula's but at a node's label,
 * and the two rows' coefficients are read once. */
template <int F16, bool PLAIN>
__device__ __forceinline__ void dh_p(unsigned char *ps, const float (&z)[32], const tdt_wgmma_dz_row *rc,
                                     const float *kn, int kp, const uint16_t *bias, int64_t ot, int64_t node0,
                                     int64_t V, int64_t O, int64_t blank, int wgi, int warp, int lane) {
    const int r0 = warp * 16 + (lane >> 2);
    tdt_wgmma_dz_row c[2];
    if (PLAIN) c[0] = rc[r0], c[1] = rc[r0 + 8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int64_t o0 = ot + wgi * 64 + 8 * j + 2 * (lane & 3);
        float b[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) b[e] = bias && (PLAIN || o0 + e < V) ? to_f<F16>(__ldg(bias + o0 + e)) : 0.f;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = r0 + hf * 8;
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e)
                v[e] = PLAIN ? dw_known(c[hf], kn, node0 + r, kp, -1, true, o0 + e, z[4 * j + 2 * hf + e] + b[e])
                             : dw_value(rc[r], kn, node0 + r, kp, o0 + e, z[4 * j + 2 * hf + e], b[e], V, O, blank);
            const uint32_t pair =
                F16 ? bits_of(__floats2half2_rn(v[0], v[1])) : bits_of(__floats2bfloat162_rn(v[0], v[1]));
            *reinterpret_cast<uint32_t *>(ps + wgi * (kDhNodes * 128) + r * 128 + ((j ^ (r & 7)) << 4) +
                                          (lane & 3) * 4) = pair;
        }
    }
}

template <int F16>
__global__ void __launch_bounds__(kDhThreads, 1)
    wgmma_dh_kernel(const uint16_t *__restrict__ h, int64_t ldh, const unsigned char *__restrict__ Wp,
                    const uint16_t *__restrict__ bias, int64_t V, int64_t O, int64_t blank, int64_t H, int64_t count,
                    const tdt_wgmma_dz_row *__restrict__ rows, const float *__restrict__ kn, int kp,
                    float *dh) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    const int KC = chunks_of(H);
    const int chunk = kDhNodes * 128; /* one chunk of 64 rows */
    const int HC = (KC + 1) / 2; /* the ring's stages a pass: chunk pairs (j, j + HC) */
    unsigned char *hs = smem, *ps = hs + KC * chunk, *ring = ps + 2 * chunk;
    tdt_wgmma_dz_row *rc = reinterpret_cast<tdt_wgmma_dz_row *>(ring + kDhStages * 2 * kStage);
    const uint32_t full0 = saddr(rc + kDhNodes), empty0 = full0 + 8 * kDhStages;
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t node0 = (int64_t)blockIdx.x * kDhNodes;
    const int tiles = (int)((O + kRows - 1) / kRows);
    if (tid == 0) {
        for (int s = 0; s < kDhStages; ++s) {
            mbar_init<1>(full0 + 8 * s);
            mbar_init<8>(empty0 + 8 * s);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wgi == 2) { /* the producer: each tile of W's rows twice */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == 256) stream_pairs(saddr(ring), Wp, tiles, KC, HC, kDhStages, full0, empty0);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    /* the block's rows of h (columns from H on and rows from count on zero) and coefficients */
    for (int i = tid; i < KC * kDhNodes * 8; i += 256) {
        const int c = i / (kDhNodes * 8), r = (i / 8) % kDhNodes, u = i % 8;
        const int64_t k0 = (int64_t)c * kChunk + u * 8;
        const int64_t left = node0 + r < count ? H - k0 : 0;
        const int bytes = left <= 0 ? 0 : left >= 8 ? 16 : (int)left * 2;
        cp16(saddr(hs + c * chunk + r * 128 + ((u ^ (r & 7)) << 4)), h + (bytes ? (node0 + r) * ldh + k0 : 0), bytes);
    }
    rows_load<kDhNodes>(rc, rows, node0, count, tid);
    cp_commit();
    cp_wait<0>();
    fence_proxy_async();
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    float z[32], d[5][32];
#pragma unroll
    for (int j = 0; j < 5; ++j)
#pragma unroll
        for (int e = 0; e < 32; ++e) d[j][e] = 0.f;
    const uint32_t h0 = saddr(hs), p0 = saddr(ps), rb = saddr(ring);
    int i = 0;
    for (int t = 0; t < tiles; ++t) {
        /* z = h W^T for this warpgroup's 64 of the tile's rows */
        z_pass<F16>(z, h0, rb, kDhStages, full0, empty0, i, KC, HC, wgi, lane);
        /* both warpgroups past their products on the last P */
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        /* P of the tile's 128 token rows */
        const int64_t ot = (int64_t)t * kRows;
        if (ot + kRows <= V && (blank < ot || blank >= ot + kRows))
            dh_p<F16, true>(ps, z, rc, kn, kp, bias, ot, node0, V, O, blank, wgi, warp, lane);
        else
            dh_p<F16, false>(ps, z, rc, kn, kp, bias, ot, node0, V, O, blank, wgi, warp, lane);
        fence_proxy_async();
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        /* d h += P W_tile over the tile's 128 rows: the second pass */
        mn_pass<F16, 8, kStage>(d, p0, rb, kDhStages, full0, empty0, i, KC, HC, wgi, lane);
    }
    /* d h: this thread's rows */
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int64_t n = node0 + warp * 16 + hf * 8 + (lane >> 2);
        if (n < count) sums_out<false>(d, dh + n * H, hf, wgi, lane, KC, HC, H);
    }
}

} /* namespace */

size_t tdt_gpu_wgmma_pack_bytes(int64_t V, int64_t H) {
    return (size_t)((V + kRows - 1) / kRows) * (size_t)chunks_of(H) * kStage;
}

bool tdt_gpu_wgmma_fits(int cc_major, int cc_minor, int smem_optin, int64_t H) {
    return H >= 1 && cc_major == 9 && cc_minor == 0 && smem_of(H) <= (size_t)smem_optin;
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
    cudaError_t e = tdt_allow_smem(k, smem);
    if (e != cudaSuccess) return e;
    k<<<(unsigned)((count + kNodes - 1) / kNodes), kThreads, smem, stream>>>(
        static_cast<const uint16_t *>(h), ldh, static_cast<const unsigned char *>(Wp),
        static_cast<const uint16_t *>(bias), V, H, count, lse);
    return cudaGetLastError();
}

cudaError_t tdt_gpu_wgmma_dz(int f16, const void *h, int64_t ldh, const void *Wp, const void *bias, int64_t V,
                             int64_t H, int64_t count, const tdt_wgmma_dz_row *rows, void *dz, int64_t ldz, int num_sms,
                             cudaStream_t stream) {
    if (count < 1) return cudaSuccess;
    const size_t smem = smem_of(H);
    void (*k)(const uint16_t *, int64_t, const unsigned char *, const uint16_t *, int64_t, int64_t, int64_t,
              const tdt_wgmma_dz_row *, uint16_t *, int64_t) = f16 ? wgmma_dz_kernel<1> : wgmma_dz_kernel<0>;
    cudaError_t e = tdt_allow_smem(k, smem);
    if (e != cudaSuccess) return e;
    /* W's tiles split over gridDim.y where the node blocks are fewer than the SMs: the split with
     * the least waves x (tiles a block + 1), the 1 for the block's h, loaded again by each block
     * of a split (at 45 node blocks, 65 tiles and 132 SMs: 5, two full waves, where enough blocks
     * for the SMs gave 3 and a second wave of 3 blocks) */
    const int64_t blocks = (count + kNodes - 1) / kNodes, tiles = (V + kRows - 1) / kRows;
    int64_t split = 1;
    if (blocks < num_sms) {
        int64_t best = INT64_MAX;
        for (int64_t s = 1; s <= tiles; ++s) {
            const int64_t waves = (blocks * s + num_sms - 1) / num_sms, cost = waves * ((tiles + s - 1) / s + 1);
            if (cost < best) best = cost, split = s;
        }
    }
    k<<<dim3((unsigned)blocks, (unsigned)split), kThreads, smem, stream>>>(
        static_cast<const uint16_t *>(h), ldh, static_cast<const unsigned char *>(Wp),
        static_cast<const uint16_t *>(bias), V, H, count, rows, static_cast<uint16_t *>(dz), ldz);
    return cudaGetLastError();
}

cudaError_t tdt_gpu_wgmma_dw(int f16, const void *hp, const void *Wp, const void *bias, int64_t V, int64_t O,
                             int64_t blank, int64_t H, int64_t count, const tdt_wgmma_dz_row *rows, const float *kn,
                             int kp, float *wacc, int64_t ldw, cudaStream_t stream) {
    if (count < 1) return cudaSuccess;
    const size_t smem = dw_smem_of(H);
    void (*k)(const unsigned char *, const unsigned char *, const uint16_t *, int64_t, int64_t, int64_t, int64_t,
              int64_t, const tdt_wgmma_dz_row *, const float *, int, float *, int64_t) =
        f16 ? wgmma_dw_kernel<1> : wgmma_dw_kernel<0>;
    cudaError_t e = tdt_allow_smem(k, smem);
    if (e != cudaSuccess) return e;
    k<<<(unsigned)((O + kDwRows - 1) / kDwRows), kDwThreads, smem, stream>>>(
        static_cast<const unsigned char *>(hp), static_cast<const unsigned char *>(Wp),
        static_cast<const uint16_t *>(bias), V, O, blank, H, count, rows, kn, kp, wacc, ldw);
    return cudaGetLastError();
}

cudaError_t tdt_gpu_wgmma_dh(int f16, const void *h, int64_t ldh, const void *Wp, const void *bias, int64_t V,
                             int64_t O, int64_t blank, int64_t H, int64_t count, const tdt_wgmma_dz_row *rows,
                             const float *kn, int kp, float *dh, cudaStream_t stream) {
    if (count < 1) return cudaSuccess;
    const size_t smem = dh_smem_of(H);
    void (*k)(const uint16_t *, int64_t, const unsigned char *, const uint16_t *, int64_t, int64_t, int64_t, int64_t,
              int64_t, const tdt_wgmma_dz_row *, const float *, int, float *) =
        f16 ? wgmma_dh_kernel<1> : wgmma_dh_kernel<0>;
    cudaError_t e = tdt_allow_smem(k, smem);
    if (e != cudaSuccess) return e;
    k<<<(unsigned)((count + kDhNodes - 1) / kDhNodes), kDhThreads, smem, stream>>>(
        static_cast<const uint16_t *>(h), ldh, static_cast<const unsigned char *>(Wp),
        static_cast<const uint16_t *>(bias), V, O, blank, H, count, rows, kn, kp, dh);
    return cudaGetLastError();
}
