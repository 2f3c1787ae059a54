/*
 * wgmma.cuh - Hopper's building blocks for the sm_90a kernels (src/gpu/sm90a/, and the
 * prototypes of benchmark/joint_lse_proto.cu and joint_bwd_proto.cu): shared-memory addresses,
 * cp.async, the 128-byte-swizzle descriptors (K-major and MN-major operands), the m64n128k16,
 * m64n64k16 and m64n32k16 products, mbarriers and bulk copies, and a running log-sum-exp. Only
 * for translation units compiled for sm_90a: the products trap elsewhere.
 */
#ifndef TDT_GPU_SM90A_WGMMA_CUH
#define TDT_GPU_SM90A_WGMMA_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ uint32_t saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* bytes (0-16) of 16 global -> shared, the rest zero */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
/* this thread's writes to shared memory (cp.async's included), before the tensor cores read them */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* until at most N of this warpgroup's committed groups of products are pending */
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
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

/* the shared-memory descriptor of an MN-major operand in the 128-byte swizzle (rows of 64 values
 * along N, 8 of them a 1024-byte atom along K): start, 64-value blocks lbo bytes apart, 8-row
 * groups 1024 bytes apart */
__device__ __forceinline__ uint64_t desc_mn(uint32_t a, uint32_t lbo) {
    return (uint64_t)((a & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

/* d (+)= A B^T, A 64 x 16 and B 32 x 16 of the 16-bit type F16 from their descriptors (both
 * K-major); d overwritten where !acc */
template <int F16> __device__ __forceinline__ void mma_n32(float (&d)[16], uint64_t da, uint64_t db, int acc) {
#define TDT_WGMMA_N32(T)                                                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T " {"                                   \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, " \
                 "0, 0;\n}\n"                                                                                \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),   \
                   "+f"(d[14]), "+f"(d[15])                                                                 \
                 : "l"(da), "l"(db), "r"(acc))
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (F16) TDT_WGMMA_N32("f16");
    else TDT_WGMMA_N32("bf16");
#else
    (void)d, (void)da, (void)db, (void)acc;
    __trap();
#endif
#undef TDT_WGMMA_N32
}

/* d (+)= A B^T, A 64 x 16 (K-major) and B 64 x 16 of the 16-bit type F16 from their descriptors,
 * B K-major (TB 0: 64 rows of 16 values) or MN-major (TB 1: 16 rows of 64 values, B^T as
 * stored); d overwritten where !acc */
template <int F16, int TB> __device__ __forceinline__ void mma_n64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
#define TDT_WGMMA_N64(T)                                                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                               \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {"                                   \
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),   \
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                       \
                 : "l"(da), "l"(db), "r"(acc), "n"(TB))
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (F16) TDT_WGMMA_N64("f16");
    else TDT_WGMMA_N64("bf16");
#else
    (void)d, (void)da, (void)db, (void)acc;
    __trap();
#endif
#undef TDT_WGMMA_N64
}

template <int N> __device__ __forceinline__ void pin_n(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
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

/* an mbarrier at bar expecting N arrivals a phase */
template <int N> __device__ __forceinline__ void mbar_init(uint32_t bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "n"(N) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* this thread's arrival on the mbarrier bar, which then also waits for bytes of copies */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* bytes global -> shared by the copy engine, completing on the mbarrier bar (which some arrival
 * told to expect them) */
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* bytes global -> shared by the copy engine, counted on the mbarrier bar: one arrival */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    mbar_expect_tx(bar, bytes);
    bulk_copy(dst, src, bytes, bar);
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

/* A warpgroup's running sums after its last tile (m64nNk16's rows: thread (warp, lane) holds
 * rows warp 16 + lane / 4 and 8 more in run[0], run[1]): the 4 lanes of each row merge theirs,
 * then the row's lse in natural units goes to lse[row0 + row] for rows before count. */
__device__ __forceinline__ void lse2_store(const lse2 (&run)[2], float *lse, int64_t row0, int64_t count, int warp,
                                           int lane) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        lse2 r = run[hf];
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1)
            r = lse2_merge(r, {__shfl_xor_sync(0xffffffffu, r.m, o), __shfl_xor_sync(0xffffffffu, r.s, o)});
        const int64_t n = row0 + warp * 16 + hf * 8 + (lane >> 2);
        if ((lane & 3) == 0 && n < count) lse[n] = (r.m + log2f(r.s)) / 1.4426950408889634f;
    }
}

} /* namespace */

#endif
