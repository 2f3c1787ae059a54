/*
 * joint_lse_proto.cu - prototypes of the fused joint's forward on the tensor cores, z never
 * written: each block keeps its tile of 128 nodes' rows of h in shared memory and streams W's
 * token rows through it, z = h W^T (bfloat16 operands, float32 sums), each tile of z folded at
 * once into a running log-sum-exp a node: the GEMM schedule's forward z product and node kernel
 * (src/gpu/joint_gemm.cu) in one pass, with no buffer of z. Three kernels:
 *   - mma.sync m16n8k16, W through cp.async stages;
 *   - Hopper's wgmma (m64n128k16 from shared memory, two warpgroups), W through cp.async stages
 *     and a block-wide barrier a stage;
 *   - wgmma fed by a producer warp: W packed once into the stages' layout, one bulk copy a stage
 *     on mbarriers, no block-wide barrier: the library's kernel (src/gpu/sm90a/joint_wgmma.cu,
 *     the GEMM schedule's forward on compute capability 9.0), called here through
 *     joint_wgmma.h.
 * Measured (docs/joint.md, H100): at huge-joint's 303,000 nodes and V 8193, 15.8, 8.4 and 5.6 ms,
 * where cuBLAS's z product and a row pass take 9.3 ms and the product alone 6.2 ms: the third
 * is the first forward on the chip that beats them.
 *
 * Each is checked before it is timed: its log-normalisers against float64 sums over z computed
 * by cuBLAS from the same bfloat16 operands (max |difference| / max(1, |lse|) printed, and the
 * run fails beyond 1e-5; the wgmma kernels' output filled with NaN first), then timed against
 * what the GEMM schedule does now (cuBLAS's z product into float32, then a warp a node's
 * log-sum-exp over its row) and against cuBLAS's product alone.
 *
 *   joint_lse_proto [--nodes N] [--vocab V] [--hidden K] [--iters I]
 * defaults: huge-joint's 303000 nodes (B 8, T 375, U + 1 101), V 8193, K 640 (H; the wgmma
 * kernels take a multiple of 64 up to 640, the bias left to be added outside the product).
 * Built for sm_90a alone: it runs on the H100 and H200.
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
#include "proto_util.cuh"
#include "gpu/sm90a/wgmma.cuh"
#include "tdt.h"

namespace {

const int BM = 128;   /* nodes a block */
const int BN = 128;   /* W rows a tile */
const int BK = 32;    /* inner values a pipeline stage */
const int STAGES = 4; /* W's stages in flight */
const int PAD = 8;    /* values after each shared row: ldmatrix's 8 rows fall in distinct banks */
const int WROW = BK + PAD;
const int THREADS = 256;
const float LOG2E = 1.4426950408889634f;

/* shared memory a block for rows of ldh values (a multiple of 8) */
inline size_t lse_smem_bytes(int64_t ldh) {
    const int64_t kp = (ldh + BK - 1) / BK * BK;
    return (size_t)(BM * (kp + PAD) + STAGES * BN * WROW) * 2;
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a b, one m16n8k16 tile: a row-major 16 x 16, b 16 x 8 (W's rows: k contiguous) */
template <int DT> __device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                          uint32_t b1) {
    if (DT == TDT_DTYPE_BFLOAT16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* N x 2 values of a row of z, value(j, c) at column col0 + 8 j + c (those < V taken), into the
 * row's running sum r: the tile's largest value first, then their terms (base 2) */
template <int N, typename Value>
__device__ __forceinline__ void lse2_fold(lse2 &r, int col0, int V, const Value &value) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c)
            if (col0 + j * 8 + c < V) mx = fmaxf(mx, value(j, c) * LOG2E);
    if (mx > r.m) {
        r.s *= exp2f(r.m - mx);
        r.m = mx;
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c)
            if (col0 + j * 8 + c < V) sum += exp2f(fmaf(value(j, c), LOG2E, -r.m));
    r.s += sum;
}

/*
 * lse[n] (natural units) of z[n, 0..V) = h[n] W^T for the nodes n < count: h's rows (pitch ldh,
 * a multiple of 8, zeros past the inner size) and W's rows (pitch ldh), the dtype's bits.
 *
 * A block: BM nodes, 8 warps as 4 (nodes) x 2 (W rows), each 32 nodes x 64 W rows of a tile as
 * 2 x 8 mma tiles. h's BM x ldh stay in shared memory (rows padded to a multiple of BK); W's
 * token rows stream through STAGES stages of BN x BK, the (tile, stage) sequence flattened so
 * that the next tile's first stages load during the current tile's last. After each tile a
 * thread folds its 64 values (4 nodes x 16 W rows) into its nodes' running sums (base 2, its own
 * largest value); at the end the 4 lanes of a node and the 2 warps of its W rows merge theirs.
 * A NaN in a row makes its lse NaN.
 */
template <int DT>
__global__ void __launch_bounds__(THREADS, 1)
    joint_lse_kernel(const uint16_t *__restrict__ h, const uint16_t *__restrict__ W, int64_t ldh, float *lse,
                     int64_t count, int V) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int kst = (int)((ldh + BK - 1) / BK), HROW = kst * BK + PAD, k8s = kst * BK / 8;
    uint16_t *hs = reinterpret_cast<uint16_t *>(smem);
    uint16_t *ws = hs + BM * HROW;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    const int64_t node0 = (int64_t)blockIdx.x * BM;
    const int steps = (V + BN - 1) / BN * kst;

    /* h's rows, in the first group */
    for (int c = tid; c < BM * k8s; c += THREADS) {
        const int r = c / k8s, k8 = c - r * k8s;
        const bool in = node0 + r < count && k8 * 8 < ldh;
        cp16(saddr(hs + r * HROW + k8 * 8), h + (in ? (node0 + r) * ldh + k8 * 8 : 0), in ? 16 : 0);
    }
    auto load_stage = [&](int step) {
        if (step < steps) {
            const int tile = step / kst, kk = step - tile * kst;
            uint16_t *dst = ws + (step % STAGES) * BN * WROW;
#pragma unroll
            for (int i = 0; i < BN * BK / 8 / THREADS; ++i) {
                const int c = tid + i * THREADS, r = c / (BK / 8), k8 = c % (BK / 8);
                const int64_t row = (int64_t)tile * BN + r, k = (int64_t)kk * BK + k8 * 8;
                const bool in = row < V && k < ldh;
                cp16(saddr(dst + r * WROW + k8 * 8), W + (in ? row * ldh + k : 0), in ? 16 : 0);
            }
        }
        cp_commit(); /* every step a group, empty or not: the wait below counts them */
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) load_stage(s);

    float acc[2][8][4];
    auto clear = [&]() {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    };
    clear();
    lse2 run[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) run[i][hf] = {-INFINITY, 0.f};

    const int g = lane >> 2, t = lane & 3;
    /* ldmatrix's rows: A (h) row lane % 16 at column 8 (lane / 16); B (W) row 8 (lane / 16) +
     * lane % 8 at column 8 ((lane / 8) % 2): the fragments of m16n8k16 */
    const uint32_t a_base = saddr(hs + (wm * 32 + (lane & 15)) * HROW + (lane >> 4) * 8);
    const int b_row = wn * 64 + (lane >> 4) * 8 + (lane & 7), b_col = ((lane >> 3) & 1) * 8;

    for (int step = 0; step < steps; ++step) {
        cp_wait<STAGES - 2>();
        __syncthreads(); /* this step's stage is in; every warp is done with the one reloaded next */
        load_stage(step + STAGES - 1);
        const int tile = step / kst, kk = step - tile * kst;
        const uint32_t wst = saddr(ws + (step % STAGES) * BN * WROW);
#pragma unroll
        for (int k16 = 0; k16 < BK / 16; ++k16) {
            uint32_t a[2][4], b[4][4];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                ldsm_x4(a[i], a_base + (uint32_t)((i * 16 * HROW + kk * BK + k16 * 16) * 2));
#pragma unroll
            for (int p = 0; p < 4; ++p)
                ldsm_x4(b[p], wst + (uint32_t)(((b_row + p * 16) * WROW + b_col + k16 * 16) * 2));
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    mma16816<DT>(acc[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
        }
        if (kk == kst - 1) { /* the tile's z is whole: fold it in, start the next */
            const int col0 = tile * BN + wn * 64 + 2 * t;
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf)
                    lse2_fold<8>(run[i][hf], col0, V, [&](int j, int c) { return acc[i][j][hf * 2 + c]; });
            clear();
        }
    }
    cp_wait<0>();
    __syncthreads();
    /* the 4 lanes of a node, then the 2 warps of its W rows (W's stages reused) */
    float *red = reinterpret_cast<float *>(ws); /* m [2][BM], then s [2][BM] */
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            lse2 r = run[i][hf];
#pragma unroll
            for (int o = 1; o <= 2; o <<= 1)
                r = lse2_merge(r, {__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
            if (t == 0) {
                const int row = wm * 32 + i * 16 + hf * 8 + g;
                red[wn * BM + row] = r.m;
                red[2 * BM + wn * BM + row] = r.s;
            }
        }
    __syncthreads();
    if (tid < BM && node0 + tid < count) {
        const lse2 r = lse2_merge({red[tid], red[2 * BM + tid]}, {red[BM + tid], red[3 * BM + tid]});
        lse[node0 + tid] = (r.m + log2f(r.s)) / LOG2E;
    }
}


/*
 * The same log-sum-exp on Hopper's wgmma (sm_90a), two kernels below: blocks of 128 nodes, two
 * warpgroups of 64. h's rows stay in shared memory as KC chunks of 64 values (128 bytes a row,
 * the 128-byte swizzle: row r's 16-byte unit u at unit u ^ (r % 8)); W's rows stream through
 * WSTAGES stages of 128 rows x 64 values in the same layout. A step is one stage: each
 * warpgroup's four m64n128k16 products into its 64 x 128 float32 accumulators; after the last
 * chunk of a tile of W's rows the warpgroup waits for them and folds them into its nodes'
 * running sums as the mma.sync kernel does. h's pitch ldh must be a multiple of 64 and at most
 * 640 (the shared memory).
 */
namespace wg {
const int BM = 128, BN = 128, BK = 64, WSTAGES = 4, THREADS = 256;
const int CHUNK = BM * BK * 2;  /* bytes of one chunk of h's rows */
const int STAGE = BN * BK * 2;  /* bytes of one stage of W's rows */
inline size_t smem_bytes(int64_t ldh) { return (size_t)(ldh / BK) * CHUNK + (size_t)WSTAGES * STAGE + 1024; }
}  // namespace wg

/* a whole tile of z (64 x 128: thread (warp, lane) of a warpgroup holds rows warp 16 + lane / 4
 * and 8 more, columns 8 j + 2 (lane % 4) + c, as the accumulators of m64n128k16 lie) into its
 * rows' running sums, columns col0 = tile 128 on; both rows' after the wait that retired acc */
__device__ __forceinline__ void wg_fold(float (&acc)[64], lse2 (&run)[2], int col0, int V, int lane) {
    pin(acc);
    col0 += 2 * (lane & 3);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
        lse2_fold<16>(run[hf], col0, V, [&](int j, int c) { return acc[4 * j + 2 * hf + c]; });
}

/* h's rows node0.. (zeros past count) into shared memory: chunk c, row r, 16-byte unit u at
 * hs + c CHUNK + r 128 + (u ^ r % 8) 16, by threads tid of nthreads, as cp.async */
__device__ __forceinline__ void wg_load_h(unsigned char *hs, const uint16_t *h, int64_t ldh, int64_t node0,
                                          int64_t count, int tid, int nthreads) {
    const int KC = (int)(ldh / wg::BK);
    for (int i = tid; i < KC * wg::BM * 8; i += nthreads) {
        const int c = i / (wg::BM * 8), r = (i / 8) % wg::BM, u = i % 8;
        const bool in = node0 + r < count;
        cp16(saddr(hs + c * wg::CHUNK + r * 128 + ((u ^ (r & 7)) << 4)),
                   h + (in ? (node0 + r) * ldh + c * wg::BK + u * 8 : 0), in ? 16 : 0);
    }
}

/* W's stage `step` (tile step / KC, chunk step % KC) of z: the warpgroup's four m64n128k16
 * products, k 16 at a time inside the 128-byte rows (the descriptors' start moves 32 bytes) */
__device__ __forceinline__ void wg_products(float (&acc)[64], uint32_t a0, uint32_t stage, int kc) {
    pin(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < wg::BK / 16; ++kk)
        mma<0>(acc, desc_of(a0 + kc * wg::CHUNK + kk * 32), desc_of(stage + kk * 32),
                              kc > 0 || kk > 0);
    wgmma_commit();
}

/*
 * 256 threads, both warpgroups loading: W's stages by cp.async two steps ahead, a block-wide
 * barrier a step (the stage in; both warpgroups done with the one reloaded next).
 */
__global__ void __launch_bounds__(wg::THREADS, 1)
    joint_lse_wgmma_kernel(const uint16_t *__restrict__ h, const uint16_t *__restrict__ W, int64_t ldh, float *lse,
                           int64_t count, int V) {
    extern __shared__ unsigned char smem_raw[];
    /* the swizzle's pattern repeats every 1024 bytes: align the base to that */
    unsigned char *smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    const int KC = (int)(ldh / wg::BK);
    unsigned char *hs = smem, *ws = smem + (size_t)KC * wg::CHUNK;
    const int tid = threadIdx.x, lane = tid & 31, wgi = tid >> 7, warp = (tid >> 5) & 3;
    const int64_t node0 = (int64_t)blockIdx.x * wg::BM;
    const int tiles = (V + wg::BN - 1) / wg::BN, steps = tiles * KC;
    wg_load_h(hs, h, ldh, node0, count, tid, wg::THREADS);
    auto load_stage = [&](int step) {
        if (step < steps) {
            const int tile = step / KC, kc = step - tile * KC;
            unsigned char *dst = ws + (step % wg::WSTAGES) * wg::STAGE;
#pragma unroll
            for (int i = 0; i < wg::BN * 8 / wg::THREADS; ++i) {
                const int c = tid + i * wg::THREADS, r = c >> 3, u = c & 7;
                const int64_t row = (int64_t)tile * wg::BN + r;
                const bool in = row < V;
                cp16(saddr(dst + r * 128 + ((u ^ (r & 7)) << 4)),
                           W + (in ? row * ldh + kc * wg::BK + u * 8 : 0), in ? 16 : 0);
            }
        }
        cp_commit();
    };
    load_stage(0); /* with h's rows in the same group */
    load_stage(1);

    lse2 run[2] = {{-INFINITY, 0.f}, {-INFINITY, 0.f}};
    const uint32_t a0 = saddr(hs) + wgi * 64 * 128, b0 = saddr(ws);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    for (int tile = 0, step = 0; tile < tiles; ++tile) {
        for (int kc = 0; kc < KC; ++kc, ++step) {
            cp_wait<1>();
            fence_proxy_async(); /* this thread's cp.async writes, before the tensor cores read them */
            __syncthreads();     /* every thread's; and both warpgroups are past step - 2's products */
            load_stage(step + 2);
            wg_products(acc, a0, b0 + (step % wg::WSTAGES) * wg::STAGE, kc);
            wgmma_wait<1>();
        }
        wgmma_wait<0>();
        wg_fold(acc, run, tile * wg::BN, V, lane);
    }
    cp_wait<0>();
    lse2_store(run, lse, node0 + wgi * 64, count, warp, lane);
}

/* the GEMM schedule's way: a warp a node, the log-sum-exp of its first V values of z (float32,
 * pitch ldz), base 2, in float32 */
__global__ void lse_rows_kernel(const float *z, int64_t ldz, float *lse, int64_t nodes, int V) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= nodes) return;
    const float *zr = z + n * ldz;
    lse2 r = {-INFINITY, 0.f};
    for (int v = lane * 4; v < V; v += 128) {
        float x[4];
        if (v + 3 < V) {
            const float4 q = *reinterpret_cast<const float4 *>(zr + v);
            x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
        } else {
            for (int e = 0; e < 4; ++e) x[e] = v + e < V ? zr[v + e] : -INFINITY;
        }
        for (int e = 0; e < 4; ++e) r = lse2_merge(r, {x[e] * LOG2E, x[e] == -INFINITY ? 0.f : 1.f});
    }
    for (int o = 16; o >= 1; o >>= 1) r = lse2_merge(r, {__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
    if (lane == 0) lse[n] = (r.m + log2f(r.s)) / LOG2E;
}

/* float64 reference of a row's log-sum-exp from float32 z */
__global__ void lse_ref_kernel(const float *z, int64_t ldz, double *lse, int64_t nodes, int V) {
    const int lane = threadIdx.x & 31;
    const int64_t n = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= nodes) return;
    const float *zr = z + n * ldz;
    double m = -INFINITY;
    for (int v = lane; v < V; v += 32) m = fmax(m, (double)zr[v]);
    for (int o = 16; o >= 1; o >>= 1) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    double s = 0.0;
    for (int v = lane; v < V; v += 32) s += exp((double)zr[v] - m);
    for (int o = 16; o >= 1; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) lse[n] = m + log(s);
}

}  // namespace

int main(int argc, char **argv) {
    int64_t nodes = 303000;
    int V = 8193, K = 640, iters = 5;
    static const option opts[] = {{"nodes", required_argument, 0, 'n'}, {"vocab", required_argument, 0, 'v'},
                                  {"hidden", required_argument, 0, 'k'}, {"iters", required_argument, 0, 'i'},
                                  {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (c == 'n') nodes = atoll(optarg);
        else if (c == 'v') V = atoi(optarg);
        else if (c == 'k') K = atoi(optarg);
        else if (c == 'i') iters = atoi(optarg);
        else {
            fprintf(stderr, "usage: %s [--nodes N] [--vocab V] [--hidden K] [--iters I]\n", argv[0]);
            return 2;
        }
    }
    const int Kp = (K + 7) / 8 * 8, ldz = (V + 7) / 8 * 8;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("joint_lse_proto: %s, nodes %lld, V %d, K %d (padded %d), iters %d\n", prop.name, (long long)nodes, V, K,
           Kp, iters);
    __nv_bfloat16 *h, *W;
    float *lse_f, *lse_r, *z;
    double *lse_ref;
    CK(cudaMalloc(&h, (size_t)nodes * Kp * 2));
    CK(cudaMalloc(&W, (size_t)ldz * Kp * 2));
    CK(cudaMalloc(&lse_f, nodes * 4));
    CK(cudaMalloc(&lse_r, nodes * 4));
    CK(cudaMalloc(&lse_ref, nodes * 8));
    proto::fill_bf16_kernel<<<1024, 256>>>(h, nodes, Kp, nodes, K, 1.0f, 1);
    proto::fill_bf16_kernel<<<1024, 256>>>(W, ldz, Kp, ldz, K, 3.0f / sqrtf((float)K), 2);
    /* z for the check and the GEMM schedule's way, in chunks of at most 64 K nodes */
    const int64_t chunk = std::min<int64_t>(nodes, 65536);
    CK(cudaMalloc(&z, (size_t)chunk * ldz * 4));
    cublasHandle_t hb;
    cublasCreate(&hb);
    const float one = 1.f, zero = 0.f;
    auto gemm = [&](int64_t n0, int64_t n) { /* z (ldz x n, column-major: node rows) = W h^T */
        return cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, ldz, (int)n, Kp, &one, W, CUDA_R_16BF, Kp, h + n0 * Kp,
                            CUDA_R_16BF, Kp, &zero, z, CUDA_R_32F, ldz, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    const size_t smem = lse_smem_bytes(Kp);
    auto *kern = joint_lse_kernel<TDT_DTYPE_BFLOAT16>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const unsigned blocks = (unsigned)((nodes + BM - 1) / BM);
    auto fused = [&]() {
        kern<<<blocks, THREADS, smem>>>(reinterpret_cast<const uint16_t *>(h),
                                                  reinterpret_cast<const uint16_t *>(W), Kp, lse_f, nodes, V);
    };
    auto unfused = [&](bool rows) {
        for (int64_t n0 = 0; n0 < nodes; n0 += chunk) {
            const int64_t n = std::min(chunk, nodes - n0);
            gemm(n0, n);
            if (rows) lse_rows_kernel<<<(unsigned)((n + 7) / 8), 256>>>(z, ldz, lse_r + n0, n, V);
        }
    };
    /* the wgmma kernels where h's pitch suits them (the device is sm_90a's: this program's only
     * machine code) */
    const size_t wsmem = wg::smem_bytes(Kp);
    const bool use_wg = Kp % wg::BK == 0 && wsmem <= (size_t)prop.sharedMemPerBlockOptin &&
                        tdt_gpu_wgmma_fits(prop.major, prop.minor, (int)prop.sharedMemPerBlockOptin, K);
    float *lse_w = nullptr;
    void *Wp = nullptr;
    if (use_wg) {
        CK(cudaFuncSetAttribute(joint_lse_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wsmem));
        CK(cudaMalloc(&lse_w, nodes * 4));
        CK(cudaMalloc(&Wp, tdt_gpu_wgmma_pack_bytes(V, K)));
    } else {
        printf("wgmma kernels: not run (K padded %d: they take a multiple of 64, at most 640)\n", Kp);
    }
    auto fused_wg = [&](int variant) {
        if (variant == 1) { /* W packed, then the producer warp's kernel: the library's */
            CK(tdt_gpu_wgmma_pack(W, Kp, V, K, Wp, prop.multiProcessorCount, 0));
            CK(tdt_gpu_wgmma_lse(0, h, Kp, Wp, NULL, V, K, nodes, lse_w, 0));
        } else {
            joint_lse_wgmma_kernel<<<blocks, wg::THREADS, wsmem>>>(reinterpret_cast<const uint16_t *>(h),
                                                                   reinterpret_cast<const uint16_t *>(W), Kp, lse_w,
                                                                   nodes, V);
        }
    };
    /* check */
    fused();
    CK(cudaGetLastError());

    for (int64_t n0 = 0; n0 < nodes; n0 += chunk) {
        const int64_t n = std::min(chunk, nodes - n0);
        if (gemm(n0, n) != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx failed\n");
            return 1;
        }
        lse_ref_kernel<<<(unsigned)((n + 7) / 8), 256>>>(z, ldz, lse_ref + n0, n, V);
        lse_rows_kernel<<<(unsigned)((n + 7) / 8), 256>>>(z, ldz, lse_r + n0, n, V);
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> f(nodes), r(nodes);
    std::vector<double> ref(nodes);
    CK(cudaMemcpy(f.data(), lse_f, nodes * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(r.data(), lse_r, nodes * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ref.data(), lse_ref, nodes * 8, cudaMemcpyDeviceToHost));
    double ef = 0, er = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < nodes; ++i) {
        const double d = fabs(f[i] - ref[i]) / std::max(1.0, fabs(ref[i]));
        if (!(d <= ef)) ef = d, worst = i;
        er = std::max(er, fabs(r[i] - ref[i]) / std::max(1.0, fabs(ref[i])));
    }
    printf("check: fused max rel. difference %.3g (node %lld: %.9g, want %.9g), rows kernel %.3g\n", ef,
           (long long)worst, f[worst], ref[worst], er);
    if (!(ef <= 1e-5)) {
        printf("FAILED: the fused kernel's log-normalisers differ\n");
        return 1;
    }
    static const char *const wg_names[2] = {"wgmma, cp.async", "wgmma, producer warp"};
    for (int variant = 0; use_wg && variant < 2; ++variant) {
        CK(cudaMemset(lse_w, 0xff, nodes * 4)); /* NaN: every value must be written */
        fused_wg(variant);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(f.data(), lse_w, nodes * 4, cudaMemcpyDeviceToHost));
        double ew = 0;
        worst = 0;
        for (int64_t i = 0; i < nodes; ++i) {
            const double d = fabs(f[i] - ref[i]) / std::max(1.0, fabs(ref[i]));
            if (!(d <= ew)) ew = d, worst = i;
        }
        printf("check: %s max rel. difference %.3g (node %lld: %.9g, want %.9g)\n", wg_names[variant], ew,
               (long long)worst, f[worst], ref[worst]);
        if (!(ew <= 1e-5)) {
            printf("FAILED: the %s kernel's log-normalisers differ\n", wg_names[variant]);
            return 1;
        }
    }
    auto time = [&](auto fn) { return proto::time_ms(iters, fn); };
    const double flop = 2.0 * (double)nodes * V * Kp;
    const float tf = time(fused), tu = time([&] { unfused(true); }), tg = time([&] { unfused(false); });
    printf("fused z + log-sum-exp        %8.3f ms  %6.1f TFLOP/s\n", tf, flop / tf / 1e9);
    if (use_wg) {
        for (int variant = 0; variant < 2; ++variant) {
            const float tw = time([&] { fused_wg(variant); });
            printf("%-28s %8.3f ms  %6.1f TFLOP/s%s\n", wg_names[variant], tw, flop / tw / 1e9,
                   variant == 1 ? " (W's packing included)" : "");
        }
    }
    printf("cuBLAS z (float32) + rows    %8.3f ms  %6.1f TFLOP/s  (fused / this %.2f)\n", tu, flop / tu / 1e9, tf / tu);
    printf("cuBLAS z alone               %8.3f ms  %6.1f TFLOP/s\n", tg, flop / tg / 1e9);
    return 0;
}
