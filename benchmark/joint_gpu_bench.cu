/*
 * joint_gpu_bench - times the GPU fused joint + loss (tdt_joint_forward, tdt_joint_loss with
 * every gradient) on the joint's named shapes, against a plain GEMM of the same size (cuBLAS,
 * linked into this program only) measured in the same run.
 *
 * For each shape and dtype it prints: the forward and forward+backward milliseconds (median of
 * --iters runs after one warm-up), the workspace (the call's whole extra memory: the lattice's
 * state and the tiles' scratch), the achieved TFLOP/s of forward+backward counted as 4 GEMM
 * passes of 2 x nodes x H x (V + D) (the work a joint's forward and backward need at least:
 * z, d h and d W, and z again or kept), cuBLAS's TFLOP/s for one such GEMM (nodes x (V + D) x H,
 * the dtype in, float32 accumulation, TF32 off; V + D rounded up to a multiple of 8, the shape
 * cuBLAS has its vectorised kernels for, as the fused path pads W) and the ratio of the two, and
 * the ratio to the same GEMM in bfloat16 (the dense bfloat16 rate: for float32, whose products
 * run on bfloat16 parts by default, the rate its tensor cores give).
 *
 * Check before timing: every cost finite and positive, and the float32 and bfloat16 costs of a
 * shape within 2 % of each other (their correctness against the CPU backend is
 * tests/test_gpu_joint.cc's). A failure prints FAILED and the exit status is 1.
 *
 * The schedule is the library's (TDT_GPU_JOINT: gemm, the default where cuBLASLt loads, or
 * tiles); the header line names it.
 *
 *   joint_gpu_bench                                  every shape but xl-joint, bfloat16 and float32
 *   joint_gpu_bench --shapes parakeet-joint --dtypes bf16 --iters 5
 *   TDT_GPU_JOINT=tiles joint_gpu_bench --shapes huge-joint --dtypes bf16
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <getopt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tdt.h"

namespace {

struct Shape {
    const char *name;
    int64_t B, T, U, H, V, D;
};
const Shape kShapes[] = {
    {"parakeet-joint", 4, 200, 40, 640, 8193, 5},
    {"huge-joint", 8, 375, 100, 640, 8193, 5},
    {"long-joint", 1, 1500, 400, 640, 1025, 5},
    {"xl-joint", 32, 750, 200, 640, 8193, 5}, /* only when named: its logits would be 79 GB */
};

int failures = 0;

#define CK(expr)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (expr);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
            std::exit(2);                                                                      \
        }                                                                                      \
    } while (0)

/* x[i] = scale * uniform[-1, 1) from a hash of (seed, i), in dtype. */
__global__ void fill(void *p, int64_t n, int dt, float scale, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        x ^= x >> 31;
        const float v = scale * (float)((double)(x >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        if (dt == TDT_DTYPE_FLOAT32) static_cast<float *>(p)[i] = v;
        else static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
    }
}

void fill_dev(void *p, int64_t n, tdt_dtype_t dt, float scale, uint64_t seed) {
    fill<<<1024, 256>>>(p, n, (int)dt, scale, seed);
    CK(cudaGetLastError());
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Result {
    bool ok = false;
    double fwd_ms = 0, fb_ms = 0, ws_mb = 0, tflops = 0, gemm_tflops = 0;
    std::vector<double> costs;
};

/* cuBLAS: C (nodes x O) = h (nodes x H) W^T, dtype in, float32 accumulation, for at most
 * kGemmRows nodes (the rate no longer grows with the rows there) and O = V + D rounded up to
 * 8; its TFLOP/s over the median time. */
const int64_t kGemmRows = 65536;
double gemm_tflops(const Shape &s, tdt_dtype_t dt, int iters) {
    const int64_t nodes = std::min(s.B * s.T * (s.U + 1), kGemmRows), O = (s.V + s.D + 7) / 8 * 8;
    const size_t es = dt == TDT_DTYPE_FLOAT32 ? 4 : 2;
    void *A = nullptr, *W = nullptr, *C = nullptr;
    CK(cudaMalloc(&A, (size_t)(nodes * s.H) * es));
    CK(cudaMalloc(&W, (size_t)(O * s.H) * es));
    CK(cudaMalloc(&C, (size_t)(nodes * O) * es));
    fill_dev(A, nodes * s.H, dt, 1.0f, 1);
    fill_dev(W, O * s.H, dt, 0.05f, 2);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasCreate failed\n");
        std::exit(2);
    }
    const cudaDataType_t t = dt == TDT_DTYPE_FLOAT32 ? CUDA_R_32F : CUDA_R_16BF;
    const float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> ms;
    for (int i = 0; i <= iters; ++i) {
        CK(cudaEventRecord(e0));
        /* column-major: C^T (O x nodes) = W (O x H: W's rows are H-contiguous, so op T of an
           H x O matrix) times h^T (H x nodes) */
        const cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)O, (int)nodes, (int)s.H, &alpha,
                                               W, t, (int)s.H, A, t, (int)s.H, &beta, C, t, (int)O,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        if (st != CUBLAS_STATUS_SUCCESS) {
            std::fprintf(stderr, "cublasGemmEx failed (%d)\n", (int)st);
            std::exit(2);
        }
        float m = 0;
        CK(cudaEventElapsedTime(&m, e0, e1));
        if (i > 0) ms.push_back(m);
    }
    cublasDestroy(h);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(A);
    cudaFree(W);
    cudaFree(C);
    return 2.0 * (double)nodes * (double)s.H * (double)O / (median(ms) * 1e-3) / 1e12;
}

Result bench(const Shape &s, tdt_dtype_t dt, int iters) {
    Result r;
    const int64_t row = s.U + 1, O = s.V + s.D, nodes = s.B * s.T * row;
    const size_t es = dt == TDT_DTYPE_FLOAT32 ? 4 : 2, acc = 4;
    void *enc, *pred, *W, *bias, *genc, *gpred, *gW, *gbias, *costs, *work;
    int32_t *idx;
    CK(cudaMalloc(&enc, (size_t)(s.B * s.T * s.H) * es));
    CK(cudaMalloc(&pred, (size_t)(s.B * row * s.H) * es));
    CK(cudaMalloc(&W, (size_t)(O * s.H) * es));
    CK(cudaMalloc(&bias, (size_t)O * es));
    CK(cudaMalloc(&genc, (size_t)(s.B * s.T * s.H) * es));
    CK(cudaMalloc(&gpred, (size_t)(s.B * row * s.H) * es));
    CK(cudaMalloc(&gW, (size_t)(O * s.H) * es));
    CK(cudaMalloc(&gbias, (size_t)O * es));
    CK(cudaMalloc(&costs, (size_t)s.B * acc));
    CK(cudaMalloc(&idx, (size_t)(2 * s.B + s.B * s.U) * 4));
    fill_dev(enc, s.B * s.T * s.H, dt, 1.0f, 11);
    fill_dev(pred, s.B * row * s.H, dt, 1.0f, 12);
    fill_dev(W, O * s.H, dt, (float)(2.0 / std::sqrt((double)s.H)), 13);
    fill_dev(bias, O, dt, 0.1f, 14);
    std::vector<int32_t> hidx((size_t)(2 * s.B + s.B * s.U));
    for (int64_t b = 0; b < s.B; ++b) {
        hidx[b] = (int32_t)s.T;
        hidx[s.B + b] = (int32_t)s.U;
    }
    for (int64_t i = 0; i < s.B * s.U; ++i) hidx[2 * s.B + i] = (int32_t)((i * 7919 + 13) % (s.V - 1));
    CK(cudaMemcpy(idx, hidx.data(), hidx.size() * 4, cudaMemcpyHostToDevice));

    tdt_joint_problem_t p;
    std::memset(&p, 0, sizeof p);
    p.batch = s.B;
    p.max_frames = s.T;
    p.max_labels = s.U;
    p.vocab_size = s.V;
    p.hidden = s.H;
    p.num_outputs = O;
    p.dtype = dt;
    p.enc = enc;
    p.enc_strides[0] = s.T * s.H;
    p.enc_strides[1] = s.H;
    p.pred = pred;
    p.pred_strides[0] = row * s.H;
    p.pred_strides[1] = s.H;
    p.weight = W;
    p.weight_stride = s.H;
    p.bias = bias;
    p.activation = TDT_ACTIVATION_RELU;
    p.frame_lengths = idx;
    p.label_lengths = idx + s.B;
    p.labels = idx + 2 * s.B;
    tdt_joint_gradients_t g;
    std::memset(&g, 0, sizeof g);
    g.enc_grad = genc;
    g.enc_strides[0] = s.T * s.H;
    g.enc_strides[1] = s.H;
    g.pred_grad = gpred;
    g.pred_strides[0] = row * s.H;
    g.pred_strides[1] = s.H;
    g.weight_grad = gW;
    g.weight_stride = s.H;
    g.bias_grad = gbias;
    int durations[TDT_MAX_DURATIONS];
    for (int k = 0; k < s.D; ++k) durations[k] = k;
    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.location = TDT_LOCATION_GPU;
    o.blank = (int)s.V - 1;
    o.durations = durations;
    o.num_durations = (int)s.D;
    size_t wbytes = 0;
    tdt_status_t st = tdt_joint_get_workspace_size(&p, &o, &wbytes);
    if (st != TDT_STATUS_SUCCESS) {
        std::printf("%-15s %-5s FAILED: %s\n", s.name, dt == TDT_DTYPE_FLOAT32 ? "f32" : "bf16", tdt_last_error());
        ++failures;
        return r;
    }
    CK(cudaMalloc(&work, wbytes));
    r.ws_mb = (double)wbytes / (1024.0 * 1024.0);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> fwd, fb;
    for (int i = 0; i <= iters && st == TDT_STATUS_SUCCESS; ++i) {
        float m = 0;
        CK(cudaEventRecord(e0));
        st = tdt_joint_forward(&p, &o, costs, work, wbytes);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&m, e0, e1));
        if (i > 0) fwd.push_back(m);
        if (st != TDT_STATUS_SUCCESS) break;
        CK(cudaEventRecord(e0));
        st = tdt_joint_loss(&p, &o, costs, &g, work, wbytes);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&m, e0, e1));
        if (i > 0) fb.push_back(m);
    }
    if (st != TDT_STATUS_SUCCESS) {
        std::printf("%-15s %-5s FAILED: %s\n", s.name, dt == TDT_DTYPE_FLOAT32 ? "f32" : "bf16", tdt_last_error());
        ++failures;
    } else {
        std::vector<float> hc((size_t)s.B);
        CK(cudaMemcpy(hc.data(), costs, (size_t)s.B * 4, cudaMemcpyDeviceToHost));
        r.ok = true;
        for (float c : hc) {
            r.costs.push_back(c);
            if (!(std::isfinite(c) && c > 0)) r.ok = false;
        }
        r.fwd_ms = median(fwd);
        r.fb_ms = median(fb);
        const double flop = 4.0 * 2.0 * (double)nodes * (double)s.H * (double)O;
        r.tflops = flop / (r.fb_ms * 1e-3) / 1e12;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    for (void *q : {enc, pred, W, bias, genc, gpred, gW, gbias, costs, work, (void *)idx}) cudaFree(q);
    if (r.ok) r.gemm_tflops = gemm_tflops(s, dt, iters);
    return r;
}

void usage() {
    std::printf("joint_gpu_bench [--shapes a,b] [--dtypes bf16,f32] [--iters N]\n"
                "shapes: parakeet-joint (B 4, T 200, U 40, H 640, V 8193, D 5), huge-joint (B 8,\n"
                "T 375, U 100, H 640, V 8193, D 5), long-joint (B 1, T 1500, U 400, H 640, V 1025, D 5);\n"
                "xl-joint (B 32, T 750, U 200, H 640, V 8193, D 5) only when named\n");
}

bool listed(const std::string &list, const char *name) {
    if (list.empty()) return std::strcmp(name, "xl-joint") != 0;
    size_t i = 0;
    while (i <= list.size()) {
        const size_t j = std::min(list.find(',', i), list.size());
        if (list.compare(i, j - i, name) == 0) return true;
        i = j + 1;
    }
    return false;
}

} /* namespace */

int main(int argc, char **argv) {
    std::string shapes, dtypes = "bf16,f32";
    int iters = 3;
    static const struct option longopts[] = {{"shapes", required_argument, nullptr, 's'},
                                             {"dtypes", required_argument, nullptr, 'd'},
                                             {"iters", required_argument, nullptr, 'i'},
                                             {"help", no_argument, nullptr, 'h'},
                                             {nullptr, 0, nullptr, 0}};
    for (int c; (c = getopt_long(argc, argv, "s:d:i:h", longopts, nullptr)) != -1;) {
        switch (c) {
        case 's': shapes = optarg; break;
        case 'd': dtypes = optarg; break;
        case 'i': iters = std::max(1, std::atoi(optarg)); break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    int dev = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    const char *sched = std::getenv("TDT_GPU_JOINT"), *chunk = std::getenv("TDT_GPU_JOINT_CHUNK_KB");
    std::printf("joint_gpu_bench: %s, warp-tdt %s, schedule %s, chunk (KB) %s, median of %d after a warm-up\n",
                prop.name, tdt_version_string(), sched && *sched ? sched : "default (gemm where cuBLASLt loads)",
                chunk && *chunk ? chunk : "default", iters);
    std::printf("%-15s %-5s %9s %9s %9s %9s %11s %7s %9s\n", "shape", "dtype", "fwd ms", "f+b ms",
                "ws MB", "TFLOP/s", "GEMM TF/s", "ratio", "x bf16");
    for (const Shape &s : kShapes) {
        if (!listed(shapes, s.name)) continue;
        std::vector<double> ref;
        double bf16_rate = 0.0; /* bfloat16's plain GEMM, once a shape */
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16}) {
            const char *dn = dt == TDT_DTYPE_FLOAT32 ? "f32" : "bf16";
            if (!listed(dtypes, dn)) continue;
            const Result r = bench(s, dt, iters);
            if (!r.ok) {
                if (!r.costs.empty()) {
                    std::printf("%-15s %-5s FAILED: a cost is not finite and positive\n", s.name, dn);
                    ++failures;
                }
                continue;
            }
            bool agree = true;
            for (size_t b = 0; b < ref.size() && b < r.costs.size(); ++b)
                if (std::fabs(r.costs[b] - ref[b]) > 0.02 * std::fabs(ref[b])) agree = false;
            if (ref.empty()) ref = r.costs;
            if (!agree) {
                std::printf("%-15s %-5s FAILED: costs differ from float32's by more than 2 %%\n", s.name, dn);
                ++failures;
                continue;
            }
            if (bf16_rate == 0.0)
                bf16_rate = dt == TDT_DTYPE_BFLOAT16 ? r.gemm_tflops : gemm_tflops(s, TDT_DTYPE_BFLOAT16, iters);
            std::printf("%-15s %-5s %9.2f %9.2f %9.1f %9.2f %11.1f %7.3f %9.3f\n", s.name, dn, r.fwd_ms, r.fb_ms,
                        r.ws_mb, r.tflops, r.gemm_tflops, r.tflops / r.gemm_tflops, r.tflops / bf16_rate);
            std::fflush(stdout);
        }
    }
    return failures ? 1 : 0;
}
