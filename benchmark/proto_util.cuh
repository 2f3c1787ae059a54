/*
 * proto_util.cuh - what the joint's kernel prototypes (joint_lse_proto.cu, joint_bwd_proto.cu)
 * share outside their kernels: a CUDA call checked, reproducible inputs, and a timing loop.
 */
#ifndef TDT_BENCHMARK_PROTO_UTIL_CUH
#define TDT_BENCHMARK_PROTO_UTIL_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* a CUDA runtime call that must succeed: else the program says where and exits with status 1 */
#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

namespace proto {

/* value i of a stream `seed`, uniform in [0, 1) */
__device__ __forceinline__ float unit_hash(uint64_t i, uint32_t seed) {
    uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (float)((x >> 40) & 0xffffff) / 16777216.0f;
}

/* rows x K values uniform in [-scale, scale), zero from row `rows_from` and column `cols_from` on
 * (the operands' padding) */
__global__ void fill_bf16_kernel(__nv_bfloat16 *p, int64_t rows, int64_t K, int64_t rows_from, int64_t cols_from,
                                 float scale, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * K; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(i / K >= rows_from || i % K >= cols_from ? 0.f
                                                                          : (2.f * unit_hash(i, seed) - 1.f) * scale);
}

/* the mean milliseconds of `iters` runs of fn() on the default stream, after one warm-up run */
template <typename Fn> float time_ms(int iters, Fn fn) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    fn();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) fn();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms / (float)iters;
}

} /* namespace proto */

#endif
