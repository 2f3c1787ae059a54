/*
 * wgmma.cuh - Hopper's building blocks for the sm_90a kernels (src/gpu/sm90a/, and the
 * prototypes of benchmark/joint_lse_proto.cu and joint_bwd_proto.cu): shared-memory addresses,
 * cp.async, the 128-byte-swizzle descriptors (K-major and MN-major operands), the m64n256k16 (B
 * MN-major), m64n128k16, m64n64k16 and m64n32k16 products, mbarriers and bulk copies, and a
 * running log-sum-exp. Only for translation units compiled for sm_90a: the products trap
 * elsewhere.
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

/* The wider products' operand lists: accumulator registers %0 to %63 and %64 to %127, and the
 * asm outputs d[o] to d[o + 15] (float32 sums read and written) */
#define TDT_WGMMA_R0_63 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63"
#define TDT_WGMMA_R64_127 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, " \
    "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, " \
    "%115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TDT_WGMMA_D16(d, o) \
    "+f"(d[(o) + 0]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), "+f"(d[(o) + 4]), "+f"(d[(o) + 5]), \
        "+f"(d[(o) + 6]), "+f"(d[(o) + 7]), "+f"(d[(o) + 8]), "+f"(d[(o) + 9]), "+f"(d[(o) + 10]), "+f"(d[(o) + 11]), \
        "+f"(d[(o) + 12]), "+f"(d[(o) + 13]), "+f"(d[(o) + 14]), "+f"(d[(o) + 15])

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
#define TDT_WGMMA_N128(T)                                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                              \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {" TDT_WGMMA_R0_63                 \
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                          \
                 : TDT_WGMMA_D16(d, 0), TDT_WGMMA_D16(d, 16), TDT_WGMMA_D16(d, 32), TDT_WGMMA_D16(d, 48)     \
                 : "l"(da), "l"(db), "r"(acc))
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (F16) TDT_WGMMA_N128("f16");
    else TDT_WGMMA_N128("bf16");
#else
    (void)d, (void)da, (void)db, (void)acc;
    __trap();
#endif
#undef TDT_WGMMA_N128
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
                 : TDT_WGMMA_D16(d, 0)                                                                     \
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
                 : TDT_WGMMA_D16(d, 0), TDT_WGMMA_D16(d, 16)                                              \
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

/* d (+)= A B, A 64 x 16 (K-major) and B 16 x 256 of the 16-bit type F16 read MN-major (four
 * 64-column atoms lbo bytes apart: desc_mn), float32 sums: the accumulators of four m64n64k16
 * products side by side (a thread's value 4 e + 2 h + c at column 8 e + 2 (lane % 4) + c); d
 * overwritten where !acc */
template <int F16> __device__ __forceinline__ void mma_n256_mn(float (&d)[128], uint64_t da, uint64_t db, int acc) {
#define TDT_WGMMA_N256(T) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." T "." T " {" TDT_WGMMA_R0_63 ", " \
                 TDT_WGMMA_R64_127 "}, %128, %129, p, 1, 1, 0, 1;\n}\n" \
                 : TDT_WGMMA_D16(d, 0), TDT_WGMMA_D16(d, 16), TDT_WGMMA_D16(d, 32), TDT_WGMMA_D16(d, 48), \
                   TDT_WGMMA_D16(d, 64), TDT_WGMMA_D16(d, 80), TDT_WGMMA_D16(d, 96), TDT_WGMMA_D16(d, 112) \
                 : "l"(da), "l"(db), "r"(acc))
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (F16) TDT_WGMMA_N256("f16");
    else TDT_WGMMA_N256("bf16");
#else
    (void)d, (void)da, (void)db, (void)acc;
    __trap();
#endif
#undef TDT_WGMMA_N256
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
