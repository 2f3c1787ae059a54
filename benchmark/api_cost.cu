/*
 * api_cost.cu - the host's cost of a call, in us: CUDA's runtime queries, a kernel launch and a
 * small memset, and the library's GPU entry points at the base shape (float32, joint slices,
 * int32 indices), each called in a loop with the GPU running behind (best of 5 loops; the
 * device is synchronised between loops, not inside them). What a call costs when it is hot,
 * against what the same call takes inside a PyTorch step (benchmark/host_step.py), where it
 * runs once among torch's work (docs/performance.md, "The binding's host
 * time"). The library's calls are checked for
 * SUCCESS once before they are timed.
 *
 *     build/benchmark/tdt_api_cost
 */
#include <cstdio>
#include <cstring>
#include <chrono>
#include <vector>
#include <cuda_runtime.h>
#include "tdt.h"
__global__ void empty_kernel() {}
static double now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
template <typename F> double per(const char *name, int n, F f) {
    for (int i = 0; i < 50; ++i) f();
    cudaDeviceSynchronize();
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
        double t0 = now();
        for (int i = 0; i < n; ++i) f();
        double t = (now() - t0) / n;
        cudaDeviceSynchronize();
        if (t < best) best = t;
    }
    printf("%-44s %8.2f us\n", name, best);
    return best;
}
int main() {
    void *d = nullptr;
    cudaMalloc(&d, 1 << 26);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    int dev = 0;
    per("cudaGetDevice", 10000, [&] { cudaGetDevice(&dev); });
    per("cudaSetDevice(same)", 10000, [&] { cudaSetDevice(0); });
    cudaPointerAttributes at;
    per("cudaPointerGetAttributes(device)", 10000, [&] { cudaPointerGetAttributes(&at, d); });
    int v;
    per("cudaDeviceGetAttribute(SMs)", 10000, [&] { cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0); });
    per("cudaGetLastError", 10000, [&] { cudaGetLastError(); });
    per("empty kernel <<<1,32>>>", 200, [&] { empty_kernel<<<1, 32, 0, st>>>(); });
    per("cudaMemsetAsync 64 B", 200, [&] { cudaMemsetAsync(d, 0, 64, st); });
    // the library: base-shaped problem, float32, joint layout, int32 indices
    const int64_t B = 8, T = 100, U = 20, V = 1025, D = 5, C = V + D;
    void *j2 = nullptr, *g2 = nullptr, *ws = nullptr, *ix = nullptr, *costs = nullptr, *one = nullptr;
    size_t jb = (size_t)B * T * (U + 1) * C * 4;
    cudaMalloc(&j2, jb); cudaMalloc(&g2, jb); cudaMalloc(&ix, 4 * B * (U + 2)); cudaMalloc(&costs, 64); cudaMalloc(&one, 4);
    cudaMemset(j2, 0, jb);
    std::vector<int32_t> h(B * (U + 2));
    for (int b = 0; b < B; ++b) { h[b] = T; h[B + b] = U; }
    for (int i = 0; i < B * U; ++i) h[2 * B + i] = i % (V - 1);
    cudaMemcpy(ix, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    float onef = 1.0f; cudaMemcpy(one, &onef, 4, cudaMemcpyHostToDevice);
    int durs[5] = {0, 1, 2, 3, 4};
    tdt_problem_t p; memset(&p, 0, sizeof p);
    p.batch = B; p.max_frames = T; p.max_labels = U; p.vocab_size = V; p.dtype = TDT_DTYPE_FLOAT32;
    p.token_logits = j2; p.duration_logits = (float *)j2 + V;
    int64_t s3[3] = {T * (U + 1) * C, (U + 1) * C, C};
    memcpy(p.token_strides, s3, sizeof s3); memcpy(p.duration_strides, s3, sizeof s3);
    p.frame_lengths = (int32_t *)ix; p.label_lengths = (int32_t *)ix + B; p.labels = (int32_t *)ix + 2 * B;
    tdt_options_t o; memset(&o, 0, sizeof o);
    o.location = TDT_LOCATION_GPU; o.stream = st; o.blank = V - 1; o.durations = durs; o.num_durations = 5;
    tdt_gradients_t g; memset(&g, 0, sizeof g);
    g.token_grads = g2; g.duration_grads = (float *)g2 + V;
    memcpy(g.token_strides, s3, sizeof s3); memcpy(g.duration_strides, s3, sizeof s3);
    size_t wsb = 0; tdt_get_workspace_size(&p, &o, &wsb); cudaMalloc(&ws, wsb);
    int written = 0;
    tdt_options_t so = o;
    so.grad_costs_scalar = 1;
    const tdt_status_t s1 = tdt_forward_ahead(&p, &o, costs, nullptr, &g, ws, wsb, &written);
    const tdt_status_t s2 = tdt_scale_gradients(&p, &so, one, &g);
    if (s1 != TDT_STATUS_SUCCESS || s2 != TDT_STATUS_SUCCESS || cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "tdt_api_cost: the library's calls failed: %s\n", tdt_last_error());
        return 1;
    }
    per("tdt_version (a call)", 10000, [&] { tdt_version(); });
    per("tdt_forward_ahead base f32 (enqueue)", 100, [&] { tdt_forward_ahead(&p, &o, costs, nullptr, &g, ws, wsb, &written); });
    printf("  written %d\n", written);
    per("tdt_forward base f32 (enqueue)", 100, [&] { tdt_forward(&p, &o, costs, ws, wsb); });
    per("tdt_scale_gradients factor 1 (enqueue)", 200, [&] { tdt_scale_gradients(&p, &so, one, &g); });
    o.reduction = TDT_REDUCTION_MEAN; o.reduced_cost = (char *)costs + 32;
    per("tdt_forward_ahead + reduction (enqueue)", 100, [&] { tdt_forward_ahead(&p, &o, costs, nullptr, &g, ws, wsb, &written); });
    return 0;
}
