// test_gpu.cc - the CUDA backend against the CPU backend (the reference), through the public API.
//
// Every test builds one problem on the host, runs it on the CPU (TDT_LOCATION_CPU) and on the
// GPU (TDT_LOCATION_GPU, device copies of every buffer, gradient buffers poisoned with NaN
// first so an element the GPU forgot to write shows), and compares costs and gradients element
// by element, naming the first element that diverged. Tolerances: float64 1e-9 relative (the
// lattice is float64 on both sides; only exp/log rounding differs); float32 a few 1e-6 of the
// row sums; float16 / bfloat16 a unit or two of their last place, since both sides round the
// same float value but the float32 sums before it differ in order.
//
// Standalone on purpose (its own helpers): it only needs tdt.h and the CUDA runtime. Without a
// CUDA build, a driver or a GPU every test is skipped (GTEST_SKIP), so CI still compiles it.
// TDT_GPU_PERF=1 in the environment also runs GpuPerf.Timings (prints milliseconds).

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/workspace.h"  // the counters of the overlapped schedules (which one ran)
#include "tdt.h"
#include "test_util.h"

namespace {

// Whether the library runs its sm_90 code on a device of compute capability `major`: an sm_90
// device and a build whose architectures include sm_90 (TDT_TEST_SM90_CODE, tests/CMakeLists.txt).
// A build for sm_80 alone runs its PTX on an sm_90 device without the overlapped schedules.
#ifndef TDT_TEST_SM90_CODE
#define TDT_TEST_SM90_CODE 1
#endif
bool hopper_code(int major) { return major >= 9 && TDT_TEST_SM90_CODE; }

// ---- small utilities ---------------------------------------------------------------------------

#define CUDA_OK(expr)                                                                          \
    do {                                                                                       \
        cudaError_t e_ = (expr);                                                               \
        ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);                 \
    } while (0)

#define TDT_OK(expr)                                                                           \
    do {                                                                                       \
        tdt_status_t s_ = (expr);                                                              \
        ASSERT_EQ(s_, TDT_STATUS_SUCCESS) << #expr << ": " << tdt_status_string(s_) << " / "   \
                                          << tdt_last_error();                                 \
    } while (0)

int gpu_count() {
    if (!tdt_backend_built(TDT_LOCATION_GPU)) return 0;
    int n = 0;
    if (tdt_gpu_device_count(&n) != TDT_STATUS_SUCCESS) return 0;
    return n;
}

#define REQUIRE_GPU()                                                                          \
    do {                                                                                       \
        if (!tdt_backend_built(TDT_LOCATION_GPU)) GTEST_SKIP() << "library built without CUDA"; \
        if (gpu_count() < 1) GTEST_SKIP() << "no CUDA device or driver";                       \
    } while (0)

// *value = attribute attr of the current device; a CUDA failure is fatal to the calling test
// (call it inside ASSERT_NO_FATAL_FAILURE).
void current_device_attribute(cudaDeviceAttr attr, int *value) {
    int dev = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(value, attr, dev));
}

// splitmix64: fast, seedable, the same on every platform.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
    int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
    double normal() {  // Box-Muller
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300) u1 = 1e-300;
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
};

size_t esize(tdt_dtype_t dt) {
    return dt == TDT_DTYPE_FLOAT64 ? 8 : dt == TDT_DTYPE_FLOAT32 ? 4 : 2;
}
size_t acc_size(tdt_dtype_t dt) { return dt == TDT_DTYPE_FLOAT64 ? 8 : 4; }
const char *dt_name(tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT32: return "f32";
    case TDT_DTYPE_FLOAT64: return "f64";
    case TDT_DTYPE_FLOAT16: return "f16";
    case TDT_DTYPE_BFLOAT16: return "bf16";
    }
    return "?";
}

// 16-bit conversions: test_util's, which keep subnormals (a scaled gradient has them)
using tdt_test::float_to_half;
using tdt_test::half_to_float;
float bf16_to_float(uint16_t h) { return tdt_test::bfloat16_to_float(h); }
uint16_t float_to_bf16(float f) { return tdt_test::float_to_bfloat16(f); }

double load_el(const void *p, int64_t i, tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return static_cast<const double *>(p)[i];
    case TDT_DTYPE_FLOAT32: return static_cast<const float *>(p)[i];
    case TDT_DTYPE_FLOAT16: return half_to_float(static_cast<const uint16_t *>(p)[i]);
    case TDT_DTYPE_BFLOAT16: return bf16_to_float(static_cast<const uint16_t *>(p)[i]);
    }
    return 0;
}
void store_el(void *p, int64_t i, double x, tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: static_cast<double *>(p)[i] = x; break;
    case TDT_DTYPE_FLOAT32: static_cast<float *>(p)[i] = (float)x; break;
    case TDT_DTYPE_FLOAT16: static_cast<uint16_t *>(p)[i] = float_to_half((float)x); break;
    case TDT_DTYPE_BFLOAT16: static_cast<uint16_t *>(p)[i] = float_to_bf16((float)x); break;
    }
}

// ---- a problem, laid out as the library sees it ------------------------------------------------

// Layouts of the logits: one joint tensor (B, T, U+1, V + D + pad) sliced at V, or two
// separate tensors with `pad` extra elements per row. Gradients: into a joint-shaped buffer
// with the logits' strides, into separate contiguous tensors, or in place over the logits.
enum class Grads { Joint, Separate, InPlace };

struct Spec {
    int64_t B = 2, T = 6, U = 3, V = 7;
    std::vector<int> durs = {0, 1, 2, 3, 4};  // empty: RNN-T
    tdt_dtype_t dt = TDT_DTYPE_FLOAT32;
    int blank = -1;  // -1: V - 1
    double sigma = 0, lambda = 0, clamp = 0;
    bool log_probs = false;
    bool joint = true;
    int64_t pad = 0;
    Grads grads = Grads::Joint;
    bool ragged = false;           // T_b in [T/2, T], U_b in [0, U]
    std::vector<int32_t> Tb, Ub;   // explicit lengths (override ragged)
    double scale = 1.0;            // logit standard deviation
    uint64_t seed = 1;

    int D() const { return (int)durs.size(); }
    int blank_id() const { return blank < 0 ? (int)V - 1 : blank; }
    std::string str() const {
        std::ostringstream s;
        s << dt_name(dt) << " B" << B << " T" << T << " U" << U << " V" << V << " D{";
        for (size_t i = 0; i < durs.size(); ++i) s << (i ? "," : "") << durs[i];
        s << "} blank" << blank_id() << " sigma" << sigma << " lambda" << lambda << " clamp"
          << clamp << (log_probs ? " logprobs" : "") << (joint ? " joint" : " separate")
          << " pad" << pad << " grads"
          << (grads == Grads::Joint ? "Joint" : grads == Grads::Separate ? "Separate" : "InPlace")
          << (ragged ? " ragged" : "") << " seed" << seed;
        return s.str();
    }
};

struct Host {
    Spec s;
    int64_t row_tok = 0, row_dur = 0;  // elements per (b,t,u) row of each logits buffer
    std::vector<uint8_t> tok, dur;     // logits (dur empty when joint or RNN-T)
    int64_t tok_s[3] = {0, 0, 0}, dur_s[3] = {0, 0, 0};
    int64_t dur_offset = 0;            // duration logits start (elements) inside `tok` if joint
    std::vector<int32_t> labels, T, U;
    int64_t gtok_s[3] = {0, 0, 0}, gdur_s[3] = {0, 0, 0};
    int64_t gtok_elems = 0, gdur_elems = 0;  // sizes of separate gradient buffers
};

void strides_of(int64_t T, int64_t U, int64_t row, int64_t *s) {
    s[2] = row;
    s[1] = (U + 1) * row;
    s[0] = T * (U + 1) * row;
}

Host make_host(const Spec &s) {
    Host h;
    h.s = s;
    Rng r(s.seed);
    const int64_t D = s.D(), nodes = s.B * s.T * (s.U + 1);
    const size_t es = esize(s.dt);
    if (s.joint) {
        h.row_tok = s.V + D + s.pad;
        h.tok.resize((size_t)(nodes * h.row_tok) * es);
        strides_of(s.T, s.U, h.row_tok, h.tok_s);
        std::memcpy(h.dur_s, h.tok_s, sizeof h.tok_s);
        h.dur_offset = s.V;
    } else {
        h.row_tok = s.V + s.pad;
        h.row_dur = D + s.pad;
        h.tok.resize((size_t)(nodes * h.row_tok) * es);
        h.dur.resize((size_t)(nodes * h.row_dur) * es);
        strides_of(s.T, s.U, h.row_tok, h.tok_s);
        strides_of(s.T, s.U, h.row_dur, h.dur_s);
    }
    // logits (or log-probs: a log-softmax of random logits, per row)
    std::vector<double> rowv(std::max<int64_t>(s.V, D) + 1);
    auto fill_row = [&](void *base, int64_t off, int64_t n, bool lp) {
        double m = -INFINITY;
        for (int64_t i = 0; i < n; ++i) { rowv[i] = s.scale * r.normal(); m = std::max(m, rowv[i]); }
        if (lp) {
            double sum = 0;
            for (int64_t i = 0; i < n; ++i) sum += std::exp(rowv[i] - m);
            for (int64_t i = 0; i < n; ++i) rowv[i] -= m + std::log(sum);
        }
        for (int64_t i = 0; i < n; ++i) store_el(base, off + i, rowv[i], s.dt);
    };
    for (int64_t n = 0; n < nodes; ++n) {
        // padding elements get a recognisable value (they must never be read into a result)
        if (s.joint) {
            fill_row(h.tok.data(), n * h.row_tok, s.V, s.log_probs);
            if (D) fill_row(h.tok.data(), n * h.row_tok + s.V, D, s.log_probs);
            for (int64_t i = s.V + D; i < h.row_tok; ++i) store_el(h.tok.data(), n * h.row_tok + i, 1e4, s.dt);
        } else {
            fill_row(h.tok.data(), n * h.row_tok, s.V, s.log_probs);
            for (int64_t i = s.V; i < h.row_tok; ++i) store_el(h.tok.data(), n * h.row_tok + i, 1e4, s.dt);
            if (D) {
                fill_row(h.dur.data(), n * h.row_dur, D, s.log_probs);
                for (int64_t i = D; i < h.row_dur; ++i) store_el(h.dur.data(), n * h.row_dur + i, 1e4, s.dt);
            }
        }
    }
    const int blank = s.blank_id();
    h.labels.resize((size_t)std::max<int64_t>(s.B * s.U, 1));
    for (auto &l : h.labels) {
        do l = r.below((int)s.V); while (l == blank && s.V > 1);
    }
    h.T.resize(s.B);
    h.U.resize(s.B);
    for (int64_t b = 0; b < s.B; ++b) {
        h.T[b] = (int32_t)s.T;
        h.U[b] = (int32_t)s.U;
        if (s.ragged && b > 0) {  // sample 0 keeps the full lengths
            h.T[b] = (int32_t)(s.T / 2 + r.below((int)(s.T - s.T / 2) + 1));
            h.U[b] = (int32_t)r.below((int)s.U + 1);
        }
        if (!s.Tb.empty()) h.T[b] = s.Tb[b];
        if (!s.Ub.empty()) h.U[b] = s.Ub[b];
    }
    // gradient layouts
    if (s.grads == Grads::Separate) {
        strides_of(s.T, s.U, s.V, h.gtok_s);
        strides_of(s.T, s.U, D, h.gdur_s);
        h.gtok_elems = nodes * s.V;
        h.gdur_elems = nodes * D;
    } else {
        std::memcpy(h.gtok_s, h.tok_s, sizeof h.tok_s);
        std::memcpy(h.gdur_s, h.dur_s, sizeof h.dur_s);
    }
    return h;
}

// Results in logical layout: costs (B), token grads (B,T,U+1,V), duration grads (B,T,U+1,D).
struct Out {
    std::vector<double> costs, gtok, gdur;
    std::vector<uint8_t> raw_costs, raw_gtok, raw_gdur;  // the bytes as written (bitwise checks)
    std::vector<int32_t> order;  // RunOpts::keep_order: the workspace's int32 counters after the call
    int written = -1;            // Mode::Ahead: tdt_forward_ahead's grads_written
    std::vector<uint8_t> raw_reduced;  // options.reduced_cost's one value (0xff bytes: unwritten)
    std::vector<int32_t> packed;       // RunOpts::pack: the problem's int32 array after the calls
    int pack_valid = -1;               // RunOpts::pack: options.pack_valid after the calls
    tdt_status_t status = TDT_STATUS_SUCCESS;  // run_gpu: what the calls returned (RunOpts::expect)
    std::string error;                         // run_gpu: tdt_last_error() after them
};

// CostsOnly: compute_tdt_loss() without gradients (alpha alone is swept); FwdOnly: tdt_forward().
// Ahead: tdt_forward_ahead() with grad_costs (empty: NULL); where it wrote the gradients,
// tdt_scale_gradients() by `scale` (none if empty), else tdt_backward() with grad_costs times
// scale (ones where empty), as an autograd binding does. Elsewhere a non-empty `scale` runs
// tdt_scale_gradients() after the call.
enum class Mode { OneShot, FwdBwd, FwdOnly, CostsOnly, Ahead };

struct RunOpts {
    Mode mode = Mode::OneShot;
    std::vector<double> grad_costs;  // FwdBwd: upstream gradients (empty: NULL = ones)
    bool grad_scalar = false;        // grad_costs holds one value for every sample
    bool normalize = false;          // options.normalize_costs
    bool batch_mean = false;         // options.batch_mean
    cudaStream_t stream = nullptr;
    bool graph = false;              // GPU: capture the calls in a CUDA graph and replay it
    bool want_tok = true, want_dur = true;
    tdt_gpu_schedule_t schedule = TDT_GPU_SCHEDULE_AUTO;
    bool backward_twice = false;     // FwdBwd, Ahead: a second tdt_backward() over the same
                                     // workspace (Ahead: with grad_costs times scale)
    std::vector<double> scale;       // tdt_scale_gradients() factors (see Mode)
    bool scale_scalar = false;       // scale holds one value for every sample
    bool keep_order = false;         // download the workspace's counters (Out::order)
    tdt_reduction_t reduction = TDT_REDUCTION_NONE;  // options.reduction, into Out::raw_reduced
    bool twice = false;              // the calls enqueued twice over one workspace (the
                                     // second finds the first one's counters)
    bool pack = false;               // options.pack: the labels and lengths uploaded as int64
                                     // (label rows one wider, the spare element -1), packed by
                                     // the forward call into one int32 array of garbage; the
                                     // verdict in pinned host memory (Out::packed, pack_valid)
    bool state_in_grads = false;     // options.state_in_grads, the workspace sized with it (the
                                     // library refuses it for tdt_forward: FwdBwd, FwdOnly and
                                     // CostsOnly with it are refusal tests; Ahead is the pair)
    tdt_status_t expect = TDT_STATUS_SUCCESS;  // run_gpu: the status the calls must return
                                               // (Out::status, Out::error); the results are
                                               // downloaded either way
};

void fill_options(const Host &h, tdt_location_t loc, tdt_options_t *o, cudaStream_t stream) {
    std::memset(o, 0, sizeof *o);
    o->location = loc;
    o->stream = stream;
    o->blank = h.s.blank_id();
    o->durations = h.s.durs.empty() ? nullptr : h.s.durs.data();
    o->num_durations = h.s.D();
    o->sigma = h.s.sigma;
    o->fastemit_lambda = h.s.lambda;
    o->clamp = h.s.clamp;
    o->input_kind = h.s.log_probs ? TDT_INPUT_LOG_PROBS : TDT_INPUT_LOGITS;
}

// Reads a gradient buffer (bytes) back into the logical layout.
void unpack(const Host &h, const std::vector<uint8_t> &buf, const int64_t *strides, int64_t base,
            int64_t width, std::vector<double> *out) {
    const Spec &s = h.s;
    out->assign((size_t)(s.B * s.T * (s.U + 1) * width), 0.0);
    size_t i = 0;
    for (int64_t b = 0; b < s.B; ++b)
        for (int64_t t = 0; t < s.T; ++t)
            for (int64_t u = 0; u <= s.U; ++u) {
                int64_t off = base + b * strides[0] + t * strides[1] + u * strides[2];
                for (int64_t k = 0; k < width; ++k) (*out)[i++] = load_el(buf.data(), off + k, s.dt);
            }
}

void unpack_costs(const Host &h, Out *o) {
    o->costs.resize(h.s.B);
    for (int64_t b = 0; b < h.s.B; ++b)
        o->costs[b] = h.s.dt == TDT_DTYPE_FLOAT64 ? ((const double *)o->raw_costs.data())[b]
                                                  : ((const float *)o->raw_costs.data())[b];
}

std::vector<uint8_t> acc_bytes(const std::vector<double> &v, tdt_dtype_t dt) {
    std::vector<uint8_t> r(v.size() * acc_size(dt));
    for (size_t i = 0; i < v.size(); ++i) {
        if (dt == TDT_DTYPE_FLOAT64) ((double *)r.data())[i] = v[i];
        else ((float *)r.data())[i] = (float)v[i];
    }
    return r;
}

// Fills the tdt_problem_t / tdt_gradients_t for buffers at the given (host or device) pointers.
struct Ptrs {
    void *tok = nullptr, *dur = nullptr, *gtok = nullptr, *gdur = nullptr;
    int32_t *labels = nullptr, *T = nullptr, *U = nullptr;
};

void fill_problem(const Host &h, const Ptrs &p, tdt_problem_t *pr, tdt_gradients_t *g,
                  const RunOpts &ro) {
    const Spec &s = h.s;
    const size_t es = esize(s.dt);
    std::memset(pr, 0, sizeof *pr);
    std::memset(g, 0, sizeof *g);
    pr->batch = s.B;
    pr->max_frames = s.T;
    pr->max_labels = s.U;
    pr->vocab_size = s.V;
    pr->dtype = s.dt;
    pr->token_logits = p.tok;
    std::memcpy(pr->token_strides, h.tok_s, sizeof h.tok_s);
    if (s.D()) {
        pr->duration_logits = s.joint ? (const void *)((const char *)p.tok + h.dur_offset * es) : p.dur;
        std::memcpy(pr->duration_strides, h.dur_s, sizeof h.dur_s);
    }
    pr->labels = s.U > 0 ? p.labels : nullptr;
    pr->frame_lengths = p.T;
    pr->label_lengths = p.U;
    if (ro.want_tok) g->token_grads = p.gtok;
    std::memcpy(g->token_strides, h.gtok_s, sizeof h.gtok_s);
    if (s.D() && ro.want_dur)  // joint-shaped (or in place over a joint tensor): the slice at V
        g->duration_grads = s.joint && s.grads != Grads::Separate ? (char *)p.gtok + h.dur_offset * es
                                                                  : p.gdur;
    std::memcpy(g->duration_strides, h.gdur_s, sizeof h.gdur_s);
}

// Mode::Ahead's upstream for tdt_backward(): grad_costs times scale, per sample (B values).
std::vector<double> upstream_of(const RunOpts &ro, int64_t B) {
    std::vector<double> u((size_t)B, 1.0);
    for (int64_t b = 0; b < B; ++b) {
        if (!ro.grad_costs.empty()) u[b] *= ro.grad_costs[ro.grad_scalar ? 0 : b];
        if (!ro.scale.empty()) u[b] *= ro.scale[ro.scale_scalar ? 0 : b];
    }
    return u;
}

// Runs the problem on the CPU, on copies of the host buffers (in place overwrites them).
Out run_cpu(const Host &h, const RunOpts &ro) {
    Out out;
    const Spec &s = h.s;
    tdt_options_t o;
    fill_options(h, TDT_LOCATION_CPU, &o, nullptr);
    o.grad_costs_scalar = ro.grad_scalar;
    o.normalize_costs = ro.normalize;
    o.batch_mean = ro.batch_mean;
    o.state_in_grads = ro.state_in_grads;
    out.raw_reduced.assign(acc_size(s.dt), 0xff);
    o.reduction = ro.reduction;
    o.reduced_cost = out.raw_reduced.data();
    std::vector<uint8_t> tok = h.tok, dur = h.dur, gtok, gdur;
    std::vector<int32_t> labels = h.labels, T = h.T, U = h.U;
    Ptrs p;
    p.tok = tok.data();
    p.dur = dur.empty() ? nullptr : dur.data();
    p.labels = labels.data();
    p.T = T.data();
    p.U = U.data();
    if (s.grads == Grads::InPlace) {
        p.gtok = p.tok;
        p.gdur = p.dur;
    } else if (s.grads == Grads::Joint) {
        gtok.assign(h.tok.size(), 0xff);
        gdur.assign(h.dur.size(), 0xff);
        p.gtok = gtok.data();
        p.gdur = gdur.empty() ? nullptr : gdur.data();
    } else {
        gtok.assign((size_t)h.gtok_elems * esize(s.dt), 0xff);
        gdur.assign((size_t)std::max<int64_t>(h.gdur_elems, 1) * esize(s.dt), 0xff);
        p.gtok = gtok.data();
        p.gdur = gdur.data();
    }
    tdt_problem_t pr;
    tdt_gradients_t g;
    fill_problem(h, p, &pr, &g, ro);
    size_t ws = 0;
    EXPECT_EQ(tdt_get_workspace_size(&pr, &o, &ws), TDT_STATUS_SUCCESS);
    std::vector<uint8_t> work(ws);
    out.raw_costs.assign((size_t)std::max<int64_t>(s.B, 1) * acc_size(s.dt), 0);
    tdt_status_t st;
    if (ro.mode == Mode::OneShot) {
        st = compute_tdt_loss(&pr, &o, out.raw_costs.data(), &g, work.data(), ws);
    } else if (ro.mode == Mode::Ahead) {
        std::vector<uint8_t> gc = acc_bytes(ro.grad_costs, s.dt), u = acc_bytes(upstream_of(ro, s.B), s.dt);
        st = tdt_forward_ahead(&pr, &o, out.raw_costs.data(), ro.grad_costs.empty() ? nullptr : gc.data(), &g,
                               work.data(), ws, &out.written);
        EXPECT_EQ(out.written, 0) << "the CPU wrote gradients ahead";
        o.grad_costs_scalar = 0;
        if (st == TDT_STATUS_SUCCESS) st = tdt_backward(&pr, &o, u.data(), &g, work.data(), ws);
    } else {
        st = tdt_forward(&pr, &o, out.raw_costs.data(), work.data(), ws);
        if (st == TDT_STATUS_SUCCESS && ro.mode == Mode::FwdBwd) {
            std::vector<uint8_t> gc = acc_bytes(ro.grad_costs, s.dt);
            st = tdt_backward(&pr, &o, ro.grad_costs.empty() ? nullptr : gc.data(), &g, work.data(), ws);
        }
    }
    if (st == TDT_STATUS_SUCCESS && ro.mode != Mode::Ahead && !ro.scale.empty()) {
        std::vector<uint8_t> sc = acc_bytes(ro.scale, s.dt);
        o.grad_costs_scalar = ro.scale_scalar;
        st = tdt_scale_gradients(&pr, &o, sc.data(), &g);
    }
    EXPECT_EQ(st, TDT_STATUS_SUCCESS) << "CPU: " << tdt_status_string(st) << " / " << tdt_last_error();
    out.raw_costs.resize((size_t)s.B * acc_size(s.dt));
    unpack_costs(h, &out);
    if (ro.mode == Mode::FwdOnly) return out;
    const std::vector<uint8_t> &gt = s.grads == Grads::InPlace ? tok : gtok;
    const std::vector<uint8_t> &gd = s.grads == Grads::InPlace ? (s.joint ? tok : dur)
                                     : (s.grads == Grads::Joint && s.joint ? gtok : gdur);
    out.raw_gtok = gt;
    out.raw_gdur = gd;
    unpack(h, gt, h.gtok_s, 0, s.V, &out.gtok);
    if (s.D()) unpack(h, gd, h.gdur_s, (s.joint && s.grads != Grads::Separate) ? h.dur_offset : 0, s.D(), &out.gdur);
    return out;
}

// Device copies of a host problem, freed on scope exit.
struct DevBuf {
    void *p = nullptr;
    size_t n = 0;
    DevBuf() = default;
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    ~DevBuf() { if (p) cudaFree(p); }
    cudaError_t alloc(size_t bytes) {
        n = bytes;
        return cudaMalloc(&p, bytes ? bytes : 1);
    }
    cudaError_t upload(const void *src, size_t bytes) {
        cudaError_t e = alloc(bytes);
        if (e != cudaSuccess || !bytes) return e;
        return cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
    }
    std::vector<uint8_t> download() const {
        std::vector<uint8_t> v(n);
        if (n) {
            EXPECT_EQ(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
        }
        return v;
    }
};

// Runs the problem on the current GPU. Gradient buffers are poisoned with 0xff (NaN) except in
// place, where they are the logits.
Out run_gpu(const Host &h, const RunOpts &ro, int *current_device_after = nullptr) {
    Out out;
    const Spec &s = h.s;
    const size_t es = esize(s.dt);
    DevBuf tok, dur, gtok, gdur, labels, T, U, costs, gc, work, sc, up, reduced;
    EXPECT_EQ(tok.upload(h.tok.data(), h.tok.size()), cudaSuccess);
    EXPECT_EQ(dur.upload(h.dur.data(), h.dur.size()), cudaSuccess);
    EXPECT_EQ(labels.upload(h.labels.data(), h.labels.size() * 4), cudaSuccess);
    EXPECT_EQ(T.upload(h.T.data(), h.T.size() * 4), cudaSuccess);
    EXPECT_EQ(U.upload(h.U.data(), h.U.size() * 4), cudaSuccess);
    Ptrs p;
    p.tok = tok.p;
    p.dur = h.dur.empty() ? nullptr : dur.p;
    p.labels = (int32_t *)labels.p;
    p.T = (int32_t *)T.p;
    p.U = (int32_t *)U.p;
    DevBuf lab64, T64, U64, packed;
    tdt_indices_t pin;
    std::memset(&pin, 0, sizeof pin);
    int32_t *pack_flag = nullptr;
    if (ro.pack) {
        std::vector<int64_t> l, t(h.T.begin(), h.T.end()), u(h.U.begin(), h.U.end());
        for (int64_t b = 0; b < s.B; ++b) {
            for (int64_t i = 0; i < s.U; ++i) l.push_back(h.labels[b * s.U + i]);
            l.push_back(-1);
        }
        EXPECT_EQ(lab64.upload(l.data(), l.size() * 8), cudaSuccess);
        EXPECT_EQ(T64.upload(t.data(), t.size() * 8), cudaSuccess);
        EXPECT_EQ(U64.upload(u.data(), u.size() * 8), cudaSuccess);
        EXPECT_EQ(packed.alloc((size_t)(s.B * (s.U + 2)) * 4), cudaSuccess);
        EXPECT_EQ(cudaMemset(packed.p, 0x7f, packed.n), cudaSuccess);  // lengths of 2^31 - ...
        EXPECT_EQ(cudaHostAlloc((void **)&pack_flag, sizeof *pack_flag, cudaHostAllocDefault), cudaSuccess);
        *pack_flag = -1;
        pin.type = TDT_INDEX_INT64;
        pin.labels = s.U > 0 ? lab64.p : nullptr;
        pin.columns = s.U;
        pin.labels_stride = s.U + 1;
        pin.frame_lengths = T64.p;
        pin.label_lengths = U64.p;
        p.T = (int32_t *)packed.p;
        p.U = p.T + s.B;
        p.labels = p.T + 2 * s.B;
    }
    if (s.grads == Grads::InPlace) {
        p.gtok = p.tok;
        p.gdur = p.dur;
    } else if (s.grads == Grads::Joint) {
        EXPECT_EQ(gtok.alloc(h.tok.size()), cudaSuccess);
        EXPECT_EQ(cudaMemset(gtok.p, 0xff, h.tok.size()), cudaSuccess);
        EXPECT_EQ(gdur.alloc(h.dur.size()), cudaSuccess);
        EXPECT_EQ(cudaMemset(gdur.p, 0xff, h.dur.size()), cudaSuccess);
        p.gtok = gtok.p;
        p.gdur = h.dur.empty() ? nullptr : gdur.p;
    } else {
        EXPECT_EQ(gtok.alloc((size_t)h.gtok_elems * es), cudaSuccess);
        EXPECT_EQ(cudaMemset(gtok.p, 0xff, gtok.n), cudaSuccess);
        EXPECT_EQ(gdur.alloc((size_t)std::max<int64_t>(h.gdur_elems, 1) * es), cudaSuccess);
        EXPECT_EQ(cudaMemset(gdur.p, 0xff, gdur.n), cudaSuccess);
        p.gtok = gtok.p;
        p.gdur = gdur.p;
    }
    tdt_options_t o;
    fill_options(h, TDT_LOCATION_GPU, &o, ro.stream);
    o.grad_costs_scalar = ro.grad_scalar;
    o.normalize_costs = ro.normalize;
    o.batch_mean = ro.batch_mean;
    o.gpu_schedule = ro.schedule;
    o.state_in_grads = ro.state_in_grads;
    EXPECT_EQ(reduced.alloc(acc_size(s.dt)), cudaSuccess);
    EXPECT_EQ(cudaMemset(reduced.p, 0xff, reduced.n), cudaSuccess);
    o.reduction = ro.reduction;
    o.reduced_cost = reduced.p;
    if (ro.pack) {
        o.pack = &pin;
        o.pack_valid = pack_flag;
    }
    tdt_problem_t pr;
    tdt_gradients_t g;
    fill_problem(h, p, &pr, &g, ro);
    size_t ws = 0;
    EXPECT_EQ(tdt_get_workspace_size(&pr, &o, &ws), TDT_STATUS_SUCCESS);
    EXPECT_EQ(work.alloc(ws), cudaSuccess);
    // NaN everywhere: a value read before the kernel meant to write it shows in the results
    EXPECT_EQ(cudaMemset(work.p, 0xff, ws), cudaSuccess);
    EXPECT_EQ(costs.alloc((size_t)std::max<int64_t>(s.B, 1) * acc_size(s.dt)), cudaSuccess);
    EXPECT_EQ(cudaMemset(costs.p, 0xff, costs.n), cudaSuccess);
    std::vector<uint8_t> gch = acc_bytes(ro.grad_costs, s.dt), sch = acc_bytes(ro.scale, s.dt),
                         uph = acc_bytes(upstream_of(ro, s.B), s.dt);
    EXPECT_EQ(gc.upload(gch.data(), gch.size()), cudaSuccess);
    EXPECT_EQ(sc.upload(sch.data(), sch.size()), cudaSuccess);
    EXPECT_EQ(up.upload(uph.data(), uph.size()), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    tdt_options_t so = o;  // tdt_scale_gradients' options
    so.grad_costs_scalar = ro.scale_scalar;

    auto enqueue_call = [&]() -> tdt_status_t {
        if (ro.mode == Mode::Ahead) {
            tdt_status_t st = tdt_forward_ahead(&pr, &o, costs.p, ro.grad_costs.empty() ? nullptr : gc.p,
                                                &g, work.p, ws, &out.written);
            if (st != TDT_STATUS_SUCCESS) return st;
            tdt_options_t uo = o;  // grad_costs times scale: B values
            uo.grad_costs_scalar = 0;
            if (out.written)
                st = ro.scale.empty() ? TDT_STATUS_SUCCESS : tdt_scale_gradients(&pr, &so, sc.p, &g);
            else
                st = tdt_backward(&pr, &uo, up.p, &g, work.p, ws);
            if (st != TDT_STATUS_SUCCESS || !ro.backward_twice) return st;
            return tdt_backward(&pr, &uo, up.p, &g, work.p, ws);
        }
        if (ro.mode == Mode::OneShot) return compute_tdt_loss(&pr, &o, costs.p, &g, work.p, ws);
        if (ro.mode == Mode::CostsOnly) return compute_tdt_loss(&pr, &o, costs.p, nullptr, work.p, ws);
        tdt_status_t st = tdt_forward(&pr, &o, costs.p, work.p, ws);
        if (st != TDT_STATUS_SUCCESS || ro.mode == Mode::FwdOnly) return st;
        st = tdt_backward(&pr, &o, ro.grad_costs.empty() ? nullptr : gc.p, &g, work.p, ws);
        if (st != TDT_STATUS_SUCCESS || !ro.backward_twice) return st;
        return tdt_backward(&pr, &o, ro.grad_costs.empty() ? nullptr : gc.p, &g, work.p, ws);
    };
    auto enqueue = [&]() -> tdt_status_t {
        tdt_status_t st = enqueue_call();
        if (st == TDT_STATUS_SUCCESS && ro.twice) st = enqueue_call();
        if (st != TDT_STATUS_SUCCESS || ro.mode == Mode::Ahead || ro.scale.empty()) return st;
        return tdt_scale_gradients(&pr, &so, sc.p, &g);
    };
    if (ro.graph) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(ro.stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        tdt_status_t st = enqueue();
        out.status = st;
        out.error = tdt_last_error();
        EXPECT_EQ(st, ro.expect) << tdt_status_string(st) << " / " << tdt_last_error();
        EXPECT_EQ(cudaStreamEndCapture(ro.stream, &graph), cudaSuccess);
        EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        EXPECT_EQ(cudaGraphLaunch(exec, ro.stream), cudaSuccess);
        EXPECT_EQ(cudaStreamSynchronize(ro.stream), cudaSuccess);
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
    } else {
        tdt_status_t st = enqueue();
        out.status = st;
        out.error = tdt_last_error();
        EXPECT_EQ(st, ro.expect) << tdt_status_string(st) << " / " << tdt_last_error();
        if (current_device_after) {
            EXPECT_EQ(cudaGetDevice(current_device_after), cudaSuccess);
        }
        EXPECT_EQ(cudaStreamSynchronize(ro.stream), cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (ro.keep_order && s.B > 0) {
        tdt_ws_layout_t l = {};
        EXPECT_TRUE(tdt_workspace_layout(s.B, s.T, s.U, s.D(), ro.state_in_grads ? 1 : 0, &l));
        EXPECT_EQ((uintptr_t)work.p % TDT_WS_ALIGN, 0u);  // cudaMalloc: the layout starts at p
        const std::vector<uint8_t> raw = work.download();
        out.order.resize((size_t)tdt_ws_counters(s.B, s.T, s.U));
        std::memcpy(out.order.data(), raw.data() + l.order, out.order.size() * 4);
    }
    out.raw_costs = costs.download();
    out.raw_costs.resize((size_t)s.B * acc_size(s.dt));
    out.raw_reduced = reduced.download();
    if (ro.pack) {
        const std::vector<uint8_t> raw = packed.download();
        out.packed.resize(raw.size() / 4);
        std::memcpy(out.packed.data(), raw.data(), raw.size());
        out.pack_valid = *pack_flag;
        cudaFreeHost(pack_flag);
    }
    unpack_costs(h, &out);
    if (ro.mode == Mode::FwdOnly || ro.mode == Mode::CostsOnly) return out;
    const DevBuf &gt = s.grads == Grads::InPlace ? tok : gtok;
    const DevBuf &gd = s.grads == Grads::InPlace ? (s.joint ? tok : dur)
                       : (s.grads == Grads::Joint && s.joint ? gtok : gdur);
    out.raw_gtok = gt.download();
    out.raw_gdur = &gd == &gt ? out.raw_gtok : gd.download();
    unpack(h, out.raw_gtok, h.gtok_s, 0, s.V, &out.gtok);
    if (s.D()) unpack(h, out.raw_gdur, h.gdur_s, (s.joint && s.grads != Grads::Separate) ? h.dur_offset : 0, s.D(), &out.gdur);
    return out;
}

// ---- comparisons ---------------------------------------------------------------------------------

struct Tol {
    double cost_rel, cost_abs, grad_rel, grad_abs;
};
Tol tol_for(tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return {1e-9, 1e-9, 1e-9, 1e-11};
    case TDT_DTYPE_FLOAT32: return {2e-5, 2e-4, 2e-3, 2e-5};
    case TDT_DTYPE_FLOAT16: return {2e-5, 2e-4, 4e-3, 1e-4};
    case TDT_DTYPE_BFLOAT16: return {2e-5, 2e-4, 2e-2, 1e-3};
    }
    return {0, 0, 0, 0};
}

bool close(double a, double b, double rel, double abs_) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    if (std::isinf(a) || std::isinf(b)) return a == b;
    return std::fabs(a - b) <= abs_ + rel * std::max(std::fabs(a), std::fabs(b));
}

void expect_close_vec(const char *what, const std::vector<double> &gpu,
                      const std::vector<double> &cpu, double rel, double abs_, const Spec &s,
                      int64_t width) {
    ASSERT_EQ(gpu.size(), cpu.size()) << what;
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
        if (!close(gpu[i], cpu[i], rel, abs_)) {
            if (!bad) first = i;
            ++bad;
        }
        if (std::isfinite(gpu[i]) && std::isfinite(cpu[i])) worst = std::max(worst, std::fabs(gpu[i] - cpu[i]));
    }
    if (bad) {
        int64_t k = (int64_t)first % width, n = (int64_t)first / width;
        int64_t u = n % (s.U + 1), t = (n / (s.U + 1)) % s.T, b = n / ((s.U + 1) * s.T);
        ADD_FAILURE() << what << ": " << bad << " of " << gpu.size() << " differ; first at (b" << b
                      << ", t" << t << ", u" << u << ", " << k << "): gpu " << gpu[first] << " cpu "
                      << cpu[first] << "; max |diff| " << worst << " [" << s.str() << "]";
    }
}

// Two gradient buffers (the same layout, dtype dt, as the bytes were written) that agree to the
// rounding of log p(y|x): the fused schedule takes it from the lattice's middle cut, the others
// from its end (tdt.h, tdt_gpu_schedule_t), which moves a float64 gradient by ~1e-14 and can move
// an element of the narrower dtypes to its neighbour. So each element the same bits, both NaN,
// within 1e-12, or one step of the dtype apart (neighbouring bit patterns of one sign).
void expect_within_rounding(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b,
                            tdt_dtype_t dt, const std::string &what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    const size_t es = esize(dt);
    auto ordered = [&](const std::vector<uint8_t> &v, size_t i) {
        uint64_t bits = 0;
        std::memcpy(&bits, v.data() + i, es);  // little-endian: the element's own bits
        const uint64_t sign = (uint64_t)1 << (8 * es - 1);
        return (bits & sign) ? -(int64_t)(bits & (sign - 1)) : (int64_t)bits;
    };
    size_t bad = 0, steps = 0, first = 0;
    for (size_t i = 0; i + es <= a.size(); i += es) {
        if (std::memcmp(a.data() + i, b.data() + i, es) == 0) continue;
        const double x = load_el(a.data(), (int64_t)(i / es), dt), y = load_el(b.data(), (int64_t)(i / es), dt);
        if ((std::isnan(x) && std::isnan(y)) || std::fabs(x - y) <= 1e-12) continue;
        const int64_t d = ordered(a, i) - ordered(b, i);
        if (d == 1 || d == -1) {
            ++steps;
            continue;
        }
        if (!bad) first = i / es;
        ++bad;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements beyond rounding, the first element " << first
                       << ": " << load_el(a.data(), (int64_t)first, dt) << " against "
                       << load_el(b.data(), (int64_t)first, dt) << " (" << steps << " one step apart)";
}

// A fused call's result against another schedule's: costs bitwise, gradients within rounding.
void expect_fused_match(const Out &o, const Out &ref, tdt_dtype_t dt, const std::string &what) {
    EXPECT_EQ(o.raw_costs, ref.raw_costs) << what << ": costs";
    expect_within_rounding(o.raw_gtok, ref.raw_gtok, dt, what + ": token gradient");
    expect_within_rounding(o.raw_gdur, ref.raw_gdur, dt, what + ": duration gradient");
}

// The fused schedule's counters in a call's workspace (Out::order; K layers): each sample's beta
// and alpha progress complete, and every chunk of its middle cut counted and the cut done
// (kCutDone); a sample without a lattice (T_b = 0) has no cut.
void expect_fused_counters(const Out &o, const Host &h, size_t K, const std::string &what) {
    const int64_t B = h.s.B;
    for (int64_t b = 0; b < B; ++b) {
        const std::string sb = what + ": sample " + std::to_string(b);
        EXPECT_EQ(o.order[1 + K + (size_t)b], INT32_MAX) << sb << "'s beta progress";
        EXPECT_EQ(o.order[1 + K + (size_t)(B + b)], INT32_MAX) << sb << "'s alpha progress";
        EXPECT_EQ(o.order[1 + K + (size_t)(2 * B + b)], h.T[b] > 0 ? 2 * TDT_WS_CUT_CHUNKS : 0) << sb << "'s cut";
    }
}

void expect_match(const Out &gpu, const Out &cpu, const Spec &s, bool grads = true) {
    Tol t = tol_for(s.dt);
    expect_close_vec("costs", gpu.costs, cpu.costs, t.cost_rel, t.cost_abs, s, 1);
    if (!grads) return;
    expect_close_vec("token grads", gpu.gtok, cpu.gtok, t.grad_rel, t.grad_abs, s, s.V);
    if (s.D()) expect_close_vec("duration grads", gpu.gdur, cpu.gdur, t.grad_rel, t.grad_abs, s, s.D());
}

// Joint-shaped gradient buffer with padding after the V + D elements of each row: the GPU
// must leave the padding as it found it (poisoned 0xff bytes).
void expect_padding_untouched(const Host &h, const Out &gpu) {
    const Spec &s = h.s;
    if (!(s.joint && s.grads == Grads::Joint && s.pad > 0)) return;
    const size_t es = esize(s.dt);
    const int64_t nodes = s.B * s.T * (s.U + 1);
    for (int64_t n = 0; n < nodes; ++n)
        for (int64_t i = s.V + s.D(); i < h.row_tok; ++i)
            for (size_t k = 0; k < es; ++k)
                ASSERT_EQ(gpu.raw_gtok[(size_t)(n * h.row_tok + i) * es + k], 0xff)
                    << "padding element " << i << " of row " << n << " was written";
}

// Also, for a call with gradients: the costs-only call (alpha alone) gives the same costs, bit
// for bit.
void check_vs_cpu(const Spec &s, const RunOpts &ro = RunOpts()) {
    Host h = make_host(s);
    Out c = run_cpu(h, ro);
    Out g = run_gpu(h, ro);
    expect_match(g, c, s, ro.mode != Mode::FwdOnly);
    if (ro.mode == Mode::FwdOnly) return;
    expect_padding_untouched(h, g);
    RunOpts co = ro;
    co.mode = Mode::CostsOnly;
    EXPECT_EQ(run_gpu(h, co).raw_costs, g.raw_costs) << s.str() << ": costs-only call's costs";
}

// ---- GPU against CPU over the configurations -----------------------------------------------------

struct Config {
    const char *name;
    Spec spec;
};

std::vector<Config> configs() {
    std::vector<Config> v;
    Spec s;
    s.B = 3; s.T = 12; s.U = 5; s.V = 17; s.ragged = true;
    v.push_back({"TdtParakeetDurations", s});
    s.sigma = 0.05; s.lambda = 0.01; s.clamp = 0.3; s.blank = 0; s.seed = 2;
    v.push_back({"TdtSigmaFastemitClamp", s});
    Spec r; r.B = 4; r.T = 9; r.U = 4; r.V = 11; r.durs = {}; r.blank = 0; r.ragged = true; r.seed = 3;
    v.push_back({"Rnnt", r});
    r.lambda = 0.02; r.clamp = 0.2; r.blank = -1; r.seed = 4;
    v.push_back({"RnntFastemitClamp", r});
    Spec l = s; l.sigma = 0.05; l.lambda = 0; l.clamp = 0; l.log_probs = true; l.seed = 5;
    v.push_back({"TdtLogProbs", l});
    Spec lr = r; lr.log_probs = true; lr.lambda = 0; lr.clamp = 0; lr.seed = 6;
    v.push_back({"RnntLogProbs", lr});
    Spec d = s; d.sigma = 0; d.lambda = 0; d.clamp = 0; d.durs = {3, 1, 0, 2}; d.seed = 7;
    v.push_back({"UnsortedDurations", d});
    d.durs = {1, 2, 4}; d.seed = 8;
    v.push_back({"DurationsWithoutZero", d});
    d.durs = {2, 3}; d.T = 11; d.seed = 9;  // no 0, no 1: some samples infeasible
    v.push_back({"DurationsWithout0And1", d});
    d.durs = {0, 1, 2, 3, 4, 5, 6}; d.seed = 10;  // generic (runtime arc count) kernels
    v.push_back({"SevenDurations", d});
    d.durs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}; d.T = 14; d.seed = 11;
    v.push_back({"TwelveDurations", d});  // span 12: a shared-memory ring of 16 diagonals
    d.durs = {0, 1, 2, 3, 4, 5, 6, 7}; d.T = 13; d.seed = 18;
    v.push_back({"EightDurations", d});
    Spec w; w.B = 2; w.T = 20; w.U = 6; w.V = 600; w.pad = 3; w.ragged = true; w.seed = 12;
    v.push_back({"WideRowsMisaligned", w});  // 32-lane groups, 16-byte heads and tails
    w.grads = Grads::Separate; w.seed = 13;
    v.push_back({"WideSeparateGrads", w});   // gradient rows aligned unlike the logits rows
    Spec ip = s; ip.grads = Grads::InPlace; ip.seed = 14;
    v.push_back({"InPlaceJoint", ip});
    Spec sep = s; sep.joint = false; sep.pad = 2; sep.grads = Grads::Separate; sep.seed = 15;
    v.push_back({"SeparateTensors", sep});
    Spec ips = sep; ips.grads = Grads::InPlace; ips.seed = 16;
    v.push_back({"InPlaceSeparateTensors", ips});
    Spec ipw = w; ipw.grads = Grads::InPlace; ipw.seed = 19;
    v.push_back({"InPlaceWideRows", ipw});  // in place through the gradient pass's shared-memory ring
    Spec one = s; one.V = 120; one.seed = 20;
    v.push_back({"RowsOfFewBatches", one});  // 0-3 batches a lane: fewer than the ring holds
    Spec bm = s; bm.blank = 6; bm.seed = 17;
    v.push_back({"BlankInTheMiddle", bm});
    // 3 * 300 * 151 = 135,900 node slots, over the 2^17 from which rows of 65 to 511 vectors
    // (every dtype here) take 4 lanes a node in the normaliser, not 8 (tdt_gpu_group_size)
    Spec many = s; many.T = 300; many.U = 150; many.V = 520; many.seed = 21;
    v.push_back({"NormaliserOfManyNodes", many});
    return v;
}

struct Param {
    int config;
    tdt_dtype_t dt;
};

std::vector<Param> params() {
    std::vector<Param> p;
    size_t n = configs().size();
    for (size_t i = 0; i < n; ++i)
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16})
            p.push_back({(int)i, dt});
    return p;
}

class GpuVsCpu : public ::testing::TestWithParam<Param> {};

// The reduction's one value, and what it must be: the costs summed in float64 in sample order,
// divided by B for the mean, rounded once (the CPU test's rule, by hand).
double reduced_of(const Out &o, tdt_dtype_t dt) {
    return dt == TDT_DTYPE_FLOAT64 ? *(const double *)o.raw_reduced.data() : *(const float *)o.raw_reduced.data();
}
std::vector<uint8_t> reduction_by_hand(const Out &o, tdt_dtype_t dt, bool mean) {
    double sum = 0.0;
    for (double c : o.costs) sum += c;
    return acc_bytes({mean ? sum / (double)o.costs.size() : sum}, dt);
}

TEST_P(GpuVsCpu, OneShot) {
    REQUIRE_GPU();
    Spec s = configs()[GetParam().config].spec;
    s.dt = GetParam().dt;
    check_vs_cpu(s);
}

INSTANTIATE_TEST_SUITE_P(All, GpuVsCpu, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param> &i) {
                             return std::string(configs()[i.param.config].name) + "_" + dt_name(i.param.dt);
                         });

// ---- golden value on the GPU alone (NeMo's fixed TDT case, docs/math.md) ---------------------------

TEST(GpuGolden, NemoFixedCase) {
    REQUIRE_GPU();
    Spec s;
    s.B = 1; s.T = 3; s.U = 1; s.V = 4; s.durs = {0, 1, 2}; s.blank = 3; s.sigma = 0.05;
    s.dt = TDT_DTYPE_FLOAT64;
    Host h = make_host(s);
    std::fill(h.tok.begin(), h.tok.end(), 0);  // all 7 logits zero at every node
    h.labels = {0};
    Out g = run_gpu(h, RunOpts());
    EXPECT_NEAR(g.costs[0], 4.155739, 1e-6);
    const double want_tok[4] = {-0.649628, 0.25, 0.25, 0.149628};
    const double want_dur[3] = {0.267258, -0.167926, -0.099332};
    for (int v = 0; v < 4; ++v) EXPECT_NEAR(g.gtok[v], want_tok[v], 1e-6) << "token " << v;
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(g.gdur[k], want_dur[k], 1e-6) << "duration " << k;
}

// ---- edge cases ----------------------------------------------------------------------------------

class GpuEdge : public ::testing::TestWithParam<tdt_dtype_t> {};

TEST_P(GpuEdge, NoLabels) {  // max_labels = 0: labels NULL, only blank paths
    REQUIRE_GPU();
    Spec s; s.B = 3; s.T = 7; s.U = 0; s.V = 5; s.dt = GetParam();
    check_vs_cpu(s);
    s.durs = {}; s.seed = 2;
    check_vs_cpu(s);
}

TEST_P(GpuEdge, EmptyLabelSequencesInABatch) {
    REQUIRE_GPU();
    Spec s; s.B = 3; s.T = 8; s.U = 4; s.V = 9; s.Ub = {4, 0, 2}; s.Tb = {8, 5, 8}; s.dt = GetParam();
    check_vs_cpu(s);
}

TEST_P(GpuEdge, SingleFrame) {
    REQUIRE_GPU();
    Spec s; s.B = 2; s.T = 1; s.U = 3; s.V = 6; s.dt = GetParam();
    check_vs_cpu(s);
    s.durs = {}; s.seed = 3;
    check_vs_cpu(s);
}

TEST_P(GpuEdge, InfeasibleAndZeroFrames) {
    REQUIRE_GPU();
    Spec s; s.B = 4; s.T = 7; s.U = 2; s.V = 6; s.durs = {2}; s.dt = GetParam();
    s.Tb = {7, 6, 0, 4};  // durations {2}: only even T_b can end exactly; T_b = 0 never
    Host h = make_host(s);
    Out c = run_cpu(h, RunOpts());
    Out g = run_gpu(h, RunOpts());
    expect_match(g, c, s);
    EXPECT_TRUE(std::isinf(g.costs[0]) && g.costs[0] > 0);
    EXPECT_TRUE(std::isinf(g.costs[2]) && g.costs[2] > 0);
    const int64_t per = s.T * (s.U + 1) * s.V;
    for (int64_t i = 0; i < per; ++i) ASSERT_EQ(g.gtok[i], 0.0) << "infeasible sample 0, element " << i;
    for (int64_t i = 2 * per; i < 3 * per; ++i) ASSERT_EQ(g.gtok[i], 0.0) << "T_b = 0 sample, element " << i;
}

TEST_P(GpuEdge, MaxFramesZeroAndEmptyBatch) {
    REQUIRE_GPU();
    Spec s; s.B = 2; s.T = 0; s.U = 2; s.V = 5; s.dt = GetParam();
    Host h = make_host(s);
    Out g = run_gpu(h, RunOpts());
    for (double c : g.costs) EXPECT_TRUE(std::isinf(c) && c > 0);
    RunOpts mean;
    mean.reduction = TDT_REDUCTION_MEAN;
    const double m = reduced_of(run_gpu(h, mean), s.dt);
    EXPECT_TRUE(std::isinf(m) && m > 0) << "the mean of infeasible samples: " << m;
    s.B = 0; s.T = 3;
    Host h0 = make_host(s);
    run_gpu(h0, RunOpts());  // must succeed and write nothing
    // an empty batch's reduction: still written, a sum of 0 and a mean of NaN
    EXPECT_TRUE(std::isnan(reduced_of(run_gpu(h0, mean), s.dt))) << "the mean of no sample";
    RunOpts sum;
    sum.reduction = TDT_REDUCTION_SUM;
    EXPECT_EQ(reduced_of(run_gpu(h0, sum), s.dt), 0.0) << "the sum of no sample";
    // options.pack: T = 0 packs (every sample infeasible); an empty batch gets the verdict 1,
    // with a reduction (on reduced_cost's device) and without
    RunOpts pack;
    pack.pack = true;
    const Out p2 = run_gpu(h, pack);
    EXPECT_EQ(p2.pack_valid, 1) << "T = 0";
    for (double c : p2.costs) EXPECT_TRUE(std::isinf(c) && c > 0);
    EXPECT_EQ(run_gpu(h0, pack).pack_valid, 1) << "an empty batch";
    pack.reduction = TDT_REDUCTION_SUM;
    EXPECT_EQ(run_gpu(h0, pack).pack_valid, 1) << "an empty batch, with a reduction";
}

TEST_P(GpuEdge, LargeLogitsAndPadding) {
    REQUIRE_GPU();
    Spec s; s.B = 3; s.T = 10; s.U = 4; s.V = 33; s.scale = 30; s.ragged = true; s.pad = 5;
    s.dt = GetParam();
    check_vs_cpu(s);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuEdge,
                         ::testing::Values(TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64, TDT_DTYPE_BFLOAT16),
                         [](const ::testing::TestParamInfo<tdt_dtype_t> &i) { return std::string(dt_name(i.param)); });

// ---- call shapes -----------------------------------------------------------------------------------

Spec medium(tdt_dtype_t dt) {
    Spec s; s.B = 3; s.T = 30; s.U = 8; s.V = 300; s.ragged = true; s.dt = dt; s.sigma = 0.02;
    return s;
}

// The one-shot call and the forward/backward pair: the same bits under AUTO and OVERLAP; under
// FUSED (sm_90: the gradient pass beside the sweeps, log p(y|x) from the lattice's middle), the
// same costs and gradients to rounding.
TEST(GpuCalls, ForwardBackwardEqualsOneShotBitwise) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16, TDT_DTYPE_FLOAT64}) {
        Host h = make_host(medium(dt));
        RunOpts one, pair;
        pair.mode = Mode::FwdBwd;
        Out b = run_gpu(h, pair);
        for (tdt_gpu_schedule_t sch : {TDT_GPU_SCHEDULE_AUTO, TDT_GPU_SCHEDULE_OVERLAP}) {
            one.schedule = sch;
            Out a = run_gpu(h, one);
            EXPECT_EQ(a.raw_costs, b.raw_costs) << dt_name(dt) << ", schedule " << (int)sch;
            EXPECT_EQ(a.raw_gtok, b.raw_gtok) << dt_name(dt) << ", schedule " << (int)sch;
        }
        one.schedule = TDT_GPU_SCHEDULE_FUSED;
        Out f = run_gpu(h, one);
        EXPECT_EQ(f.raw_costs, b.raw_costs) << dt_name(dt) << ", FUSED";
        expect_within_rounding(f.raw_gtok, b.raw_gtok, dt, std::string(dt_name(dt)) + ", FUSED");
    }
}

// `got` is `base` with every element inside sample b's lattice times scale[b] (the factor in
// the accumulate type, the product rounded once to the dtype), zeros and everything outside
// the lattices unchanged: what tdt_scale_gradients() promises, element for element.
void expect_scaled(const Out &got, const Out &base, const Host &h, const std::vector<double> &scale,
                   bool scalar, const std::string &what) {
    const Spec &s = h.s;
    auto check = [&](const std::vector<double> &g, const std::vector<double> &b0, int64_t width, const char *name) {
        ASSERT_EQ(g.size(), b0.size()) << what;
        size_t bad = 0;
        std::string first;
        for (int64_t b = 0; b < s.B; ++b) {
            double f = scale[scalar ? 0 : b];
            if (s.dt != TDT_DTYPE_FLOAT64) f = (float)f;
            for (int64_t t = 0; t < s.T; ++t)
                for (int64_t u = 0; u <= s.U; ++u)
                    for (int64_t k = 0; k < width; ++k) {
                        const size_t i = (size_t)(((b * s.T + t) * (s.U + 1) + u) * width + k);
                        double want = b0[i];
                        if (t < h.T[b] && u <= h.U[b] && want != 0.0) {
                            uint64_t cell = 0;
                            store_el(&cell, 0, want * f, s.dt);
                            want = load_el(&cell, 0, s.dt);
                        }
                        if (std::memcmp(&want, &g[i], sizeof want) != 0 && !(std::isnan(want) && std::isnan(g[i]))) {
                            if (!bad++) {
                                std::ostringstream o;
                                o << name << " (" << b << "," << t << "," << u << "," << k << "): " << g[i]
                                  << " against " << b0[i] << " x " << f << " = " << want;
                                first = o.str();
                            }
                        }
                    }
        }
        EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements not their factor times the unscaled one; first "
                           << first;
    };
    check(got.gtok, base.gtok, s.V, "token");
    if (s.D()) check(got.gdur, base.gdur, s.D(), "duration");
}

// tdt_forward_ahead() writes the gradients where the fused schedule runs (FUSED asked for here,
// on one-block sweeps; AUTO takes it for long rows: GpuLong.FusedScheduleOverClusters) and
// nothing elsewhere; tdt_scale_gradients() then applies the missing factor. Checked against the
// forward/backward pair with the whole upstream (weights times factors): AUTO must give its
// bits; FUSED its costs' bits and gradients within rounding (the factors are powers of two, so
// scaling adds no rounding of its own); a second tdt_backward() over the fused call's workspace
// the pair's bits again; in a CUDA graph, the same bits as eagerly.
TEST(GpuCalls, ForwardAheadAndScale) {
    REQUIRE_GPU();
    int major = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrComputeCapabilityMajor, &major));
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16, TDT_DTYPE_FLOAT64}) {
        const Spec sp = medium(dt);
        const Host h = make_host(sp);
        const std::string name = dt_name(dt);
        RunOpts pair;
        pair.mode = Mode::FwdBwd;
        pair.grad_costs = {0.25 * 2.0, 0.5 * 1.0, 1.0 * -0.5};
        const Out want = run_gpu(h, pair);
        RunOpts ahead;
        ahead.mode = Mode::Ahead;
        ahead.grad_costs = {0.25, 0.5, 1.0};
        ahead.scale = {2.0, 1.0, -0.5};
        const Out a = run_gpu(h, ahead);
        EXPECT_EQ(a.written, 0) << name << ": AUTO on one-block sweeps wrote the gradients ahead";
        EXPECT_EQ(a.raw_costs, want.raw_costs) << name << ", AUTO: costs";
        EXPECT_EQ(a.raw_gtok, want.raw_gtok) << name << ", AUTO: gradients";
        ahead.schedule = TDT_GPU_SCHEDULE_FUSED;
        const Out f = run_gpu(h, ahead);
        if (!hopper_code(major)) {  // no fused schedule: the pair's bits
            EXPECT_EQ(f.written, 0) << name;
            EXPECT_EQ(f.raw_gtok, want.raw_gtok) << name << ", FUSED without sm_90";
            continue;
        }
        EXPECT_EQ(f.written, 1) << name << ": FUSED did not write the gradients ahead";
        EXPECT_EQ(f.raw_costs, want.raw_costs) << name << ", FUSED: costs";
        expect_within_rounding(f.raw_gtok, want.raw_gtok, dt, name + ", FUSED ahead and scaled");
        expect_match(f, run_cpu(h, pair), sp);
        // the factors applied exactly: the unscaled gradients ahead, times each factor
        RunOpts unscaled = ahead;
        unscaled.scale = {};
        expect_scaled(f, run_gpu(h, unscaled), h, ahead.scale, false, name + ", FUSED");
        // one factor for all (grad_costs_scalar) and the same factor per sample: the same bits
        RunOpts one = ahead, rep = ahead;
        one.scale = {-0.5};
        one.scale_scalar = true;
        rep.scale.assign((size_t)sp.B, -0.5);
        EXPECT_EQ(run_gpu(h, one).raw_gtok, run_gpu(h, rep).raw_gtok) << name << ": scalar factor";
        // no weights, no factor: the one-shot fused call itself
        RunOpts bare = ahead, oneshot;
        bare.grad_costs = {};
        bare.scale = {};
        oneshot.schedule = TDT_GPU_SCHEDULE_FUSED;
        EXPECT_EQ(run_gpu(h, bare).raw_gtok, run_gpu(h, oneshot).raw_gtok) << name << ": against compute_tdt_loss";
        // the workspace serves a second backward: the pair's bits
        RunOpts twice = ahead;
        twice.backward_twice = true;
        const Out t2 = run_gpu(h, twice);
        EXPECT_EQ(t2.raw_gtok, want.raw_gtok) << name << ": tdt_backward after the fused forward_ahead";
        // captured in a graph on a second stream: the eager bits
        RunOpts graph = ahead;
        graph.stream = st;
        graph.graph = true;
        const Out g = run_gpu(h, graph);
        EXPECT_EQ(g.written, 1) << name << ", graph";
        EXPECT_EQ(g.raw_costs, f.raw_costs) << name << ", graph: costs";
        EXPECT_EQ(g.raw_gtok, f.raw_gtok) << name << ", graph: gradients";
    }
    CUDA_OK(cudaStreamDestroy(st));
}

// tdt_scale_gradients() after a one-shot call, any factor: each element inside a lattice times
// its sample's factor, rounded once; an infeasible sample (T_b odd with durations {0, 2}) keeps
// its exact zeros under an infinite factor, a factor of 1 leaves a sample's bits; padded rows
// untouched; separate and joint gradients.
TEST(GpuCalls, ScaleGradientsExact) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16, TDT_DTYPE_FLOAT64}) {
        for (Grads gl : {Grads::Joint, Grads::Separate}) {
            Spec sp = medium(dt);
            sp.B = 4;
            sp.durs = {0, 2};
            sp.Tb = {30, 21, 26, 12};
            sp.Ub = {8, 3, 0, 8};
            sp.pad = 3;
            sp.grads = gl;
            sp.joint = gl == Grads::Joint;
            const Host h = make_host(sp);
            const std::vector<double> scale = {0.3, -2.5, std::numeric_limits<double>::infinity(), 1.0};
            RunOpts ro;
            const Out base = run_gpu(h, ro);
            ASSERT_TRUE(std::isinf(base.costs[1])) << sp.str() << ": sample 1 should be infeasible";
            ro.scale = scale;
            const Out got = run_gpu(h, ro);
            expect_scaled(got, base, h, scale, false, sp.str());
            expect_padding_untouched(h, got);
            EXPECT_EQ(got.raw_costs, base.raw_costs) << sp.str();
            const Out cpu = run_cpu(h, ro);
            expect_scaled(cpu, run_cpu(h, RunOpts()), h, scale, false, sp.str() + " (CPU)");
            expect_match(got, cpu, sp);
        }
    }
}

TEST(GpuCalls, UpstreamGradientScaling) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64}) {
        Spec s = medium(dt);
        Host h = make_host(s);
        RunOpts ro;
        ro.mode = Mode::FwdBwd;
        ro.grad_costs = {0.5, -2.0, 0.0};
        Out c = run_cpu(h, ro), g = run_gpu(h, ro);
        expect_match(g, c, s);
        ro.grad_costs = {};
        ro.mode = Mode::FwdOnly;
        Out f = run_gpu(h, ro);
        EXPECT_EQ(f.raw_costs, g.raw_costs);
        // One upstream value for every sample (options.grad_costs_scalar, what a sum reduction
        // hands back): the same bits as that value repeated in a (B) array.
        ro.mode = Mode::FwdBwd;
        ro.grad_costs.assign((size_t)s.B, -1.5);
        Out rep = run_gpu(h, ro);
        ro.grad_costs = {-1.5};
        ro.grad_scalar = true;
        Out one = run_gpu(h, ro);
        EXPECT_EQ(one.raw_gtok, rep.raw_gtok) << dt_name(dt) << ": grad_costs_scalar, token gradient";
        EXPECT_EQ(one.raw_gdur, rep.raw_gdur) << dt_name(dt) << ": grad_costs_scalar, duration gradient";
        ro.grad_scalar = false;
    }
}

// options.normalize_costs on the device: costs[b] / U_b and upstream / U_b, the bits of a plain
// call whose upstream was divided by hand; the pair, the one-shot call, and the trail schedule's
// tdt_forward_ahead() (the gradients written in the forward) alike; and the CPU's values.
TEST(GpuCalls, NormalizedCosts) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64}) {
        const Spec s = medium(dt);
        Host h = make_host(s);
        const bool dbl = dt == TDT_DTYPE_FLOAT64;
        auto per = [&](double x, int32_t U) { return tdt_test::acc_div(x, U, dbl); };
        const std::vector<double> g = {0.5, -2.0, 0.75};
        RunOpts plain;
        plain.mode = Mode::FwdBwd;
        const Out p0 = run_gpu(h, plain);
        RunOpts by_hand = plain, ones_by_hand = plain;
        for (int64_t b = 0; b < s.B; ++b) {
            by_hand.grad_costs.push_back(per(g[b], h.U[b]));
            ones_by_hand.grad_costs.push_back(per(1.0, h.U[b]));
        }
        const Out want = run_gpu(h, by_hand), want_ones = run_gpu(h, ones_by_hand);
        RunOpts norm = plain;
        norm.grad_costs = g;
        norm.normalize = true;
        const Out got = run_gpu(h, norm);
        for (int64_t b = 0; b < s.B; ++b)
            EXPECT_EQ(got.costs[b], per(p0.costs[b], h.U[b])) << dt_name(dt) << ": cost " << b;
        EXPECT_EQ(got.raw_gtok, want.raw_gtok) << dt_name(dt) << ": token gradient";
        EXPECT_EQ(got.raw_gdur, want.raw_gdur) << dt_name(dt) << ": duration gradient";
        expect_match(got, run_cpu(h, norm), s);
        RunOpts one;
        one.normalize = true;
        const Out o = run_gpu(h, one);
        EXPECT_EQ(o.raw_costs, got.raw_costs) << dt_name(dt) << ": one-shot costs";
        EXPECT_EQ(o.raw_gtok, want_ones.raw_gtok) << dt_name(dt) << ": one-shot token gradient";
        RunOpts ahead = norm;
        ahead.mode = Mode::Ahead;
        ahead.schedule = TDT_GPU_SCHEDULE_TRAIL;
        const Out a = run_gpu(h, ahead);
        EXPECT_EQ(a.raw_costs, got.raw_costs) << dt_name(dt) << ": trail, ahead: costs";
        EXPECT_EQ(a.raw_gtok, got.raw_gtok) << dt_name(dt) << ": trail, ahead: token gradient (written "
                                            << a.written << ")";
    }
}

// options.batch_mean on the device: each upstream times 1 / B, then divided by U_b
// (normalize_costs), the bits of a call whose upstream was made by hand that way (2.5 / 3: the
// product differs from the division in both accumulate types); the costs unaveraged; the pair
// with a scalar upstream, the one-shot call (1 / B) and the trail schedule's tdt_forward_ahead()
// (the gradients written in the forward, for an upstream of 1 / B) alike.
TEST(GpuCalls, BatchMean) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64}) {
        const Spec s = medium(dt);
        Host h = make_host(s);
        const bool dbl = dt == TDT_DTYPE_FLOAT64;
        auto div = [&](double x, int64_t n) { return tdt_test::acc_div(x, n, dbl); };
        auto recip = [&](double x, int64_t n) { return tdt_test::acc_div_recip(x, n, dbl); };
        ASSERT_EQ(s.B, 3);
        RunOpts by_hand, ones_by_hand;
        by_hand.mode = ones_by_hand.mode = Mode::FwdBwd;
        for (int64_t b = 0; b < s.B; ++b) {
            by_hand.grad_costs.push_back(div(recip(2.5, s.B), h.U[b]));
            ones_by_hand.grad_costs.push_back(div(recip(1.0, s.B), h.U[b]));
        }
        const Out want = run_gpu(h, by_hand), want_ones = run_gpu(h, ones_by_hand);
        RunOpts mean;
        mean.mode = Mode::FwdBwd;
        mean.grad_costs = {2.5};
        mean.grad_scalar = true;
        mean.normalize = mean.batch_mean = true;
        const Out got = run_gpu(h, mean);
        RunOpts norm;
        norm.normalize = true;
        norm.mode = Mode::FwdOnly;
        const Out costs = run_gpu(h, norm);
        EXPECT_EQ(got.raw_costs, costs.raw_costs) << dt_name(dt) << ": batch_mean changed the costs";
        EXPECT_EQ(got.raw_gtok, want.raw_gtok) << dt_name(dt) << ": token gradient";
        EXPECT_EQ(got.raw_gdur, want.raw_gdur) << dt_name(dt) << ": duration gradient";
        expect_match(got, run_cpu(h, mean), s);
        RunOpts one;
        one.normalize = one.batch_mean = true;
        const Out o = run_gpu(h, one);
        EXPECT_EQ(o.raw_gtok, want_ones.raw_gtok) << dt_name(dt) << ": one-shot token gradient";
        EXPECT_EQ(o.raw_gdur, want_ones.raw_gdur) << dt_name(dt) << ": one-shot duration gradient";
        RunOpts ahead = one;
        ahead.mode = Mode::Ahead;
        ahead.schedule = TDT_GPU_SCHEDULE_TRAIL;
        const Out a = run_gpu(h, ahead);
        EXPECT_EQ(a.raw_gtok, want_ones.raw_gtok) << dt_name(dt) << ": trail, ahead: token gradient (written "
                                                  << a.written << ")";
        EXPECT_EQ(a.raw_gdur, want_ones.raw_gdur) << dt_name(dt) << ": trail, ahead: duration gradient";
    }
}

// A call shape, its schedule, and whether it runs captured in a CUDA graph.
struct CallCase {
    Mode mode;
    tdt_gpu_schedule_t schedule;
    bool graph;
    const char *name;
};

// options.reduction on the device, in every call that runs a forward (one-shot, the pair, the
// fused and trail schedules' tdt_forward_ahead(), costs-only) and in a CUDA graph: the
// reduction of the costs the call wrote, by the rule above (so the CPU's bits, which is checked
// too), and those costs and the gradients the bits of the call without it.
TEST(GpuCalls, Reduction) {
    REQUIRE_GPU();
    cudaStream_t side = nullptr;  // a graph is captured on a stream of its own
    CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64, TDT_DTYPE_BFLOAT16}) {
        Spec s = medium(dt);
        s.B = 5;
        s.V = 1025;
        const Host h = make_host(s);
        const CallCase cases[] = {{Mode::OneShot, TDT_GPU_SCHEDULE_AUTO, false, "one-shot"},
                              {Mode::FwdBwd, TDT_GPU_SCHEDULE_AUTO, false, "pair"},
                              {Mode::Ahead, TDT_GPU_SCHEDULE_FUSED, false, "fused, ahead"},
                              {Mode::Ahead, TDT_GPU_SCHEDULE_TRAIL, false, "trail, ahead"},
                              {Mode::CostsOnly, TDT_GPU_SCHEDULE_AUTO, false, "costs-only"},
                              {Mode::OneShot, TDT_GPU_SCHEDULE_AUTO, true, "one-shot in a graph"}};
        for (const CallCase &c : cases)
            for (bool per_label : {false, true}) {
                RunOpts ro;
                ro.mode = c.mode;
                ro.schedule = c.schedule;
                ro.graph = c.graph;
                ro.stream = c.graph ? side : nullptr;
                ro.normalize = per_label;
                const Out plain = run_gpu(h, ro);
                for (tdt_reduction_t r : {TDT_REDUCTION_SUM, TDT_REDUCTION_MEAN}) {
                    const std::string what = std::string(dt_name(dt)) + ", " + c.name +
                                             (per_label ? ", per label, " : ", ") +
                                             (r == TDT_REDUCTION_SUM ? "sum" : "mean");
                    ro.reduction = r;
                    const Out got = run_gpu(h, ro);
                    EXPECT_EQ(got.raw_reduced, reduction_by_hand(got, dt, r == TDT_REDUCTION_MEAN))
                        << what << ": " << reduced_of(got, dt);
                    if (!per_label) {  // (per label, a U_b = 0 sample makes it inf)
                        EXPECT_TRUE(std::isfinite(reduced_of(got, dt))) << what;
                    }
                    EXPECT_EQ(got.raw_costs, plain.raw_costs) << what << ": costs";
                    EXPECT_EQ(got.raw_gtok, plain.raw_gtok) << what << ": token gradient";
                    EXPECT_EQ(got.raw_gdur, plain.raw_gdur) << what << ": duration gradient";
                    if (c.mode == Mode::OneShot && !c.graph) {
                        const Out cpu = run_cpu(h, ro);
                        EXPECT_EQ(cpu.raw_reduced, reduction_by_hand(cpu, dt, r == TDT_REDUCTION_MEAN)) << what << ", CPU";
                    }
                }
            }
    }
    CUDA_OK(cudaStreamDestroy(side));
}

// options.reduction as the sweeps write it (the thread that writes the batch's last cost sums
// them: tdt_cost_counted), under every schedule and call shape, on one-block sweeps and on the
// cluster sweep of long diagonals (whose blocks all mark a bad sample, one counting it), called
// twice over one workspace (so the count the first call left must be zeroed again) and in a
// graph: a clean batch gives the costs' sum in sample order, to the bit; a T_b = 0 sample makes
// it +inf; a sample with bad data makes it NaN, and written (unwritten, it holds 0xff bytes).
TEST(GpuCalls, ReductionBySweeps) {
    REQUIRE_GPU();
    cudaStream_t side = nullptr;  // a graph is captured on a stream of its own
    CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    enum Kind { Clean, Infeasible, Bad };
    for (int shape = 0; shape < 2; ++shape) {
        Spec s;
        s.dt = TDT_DTYPE_FLOAT32;
        s.ragged = true;
        if (shape == 0) {
            s.B = 6; s.T = 24; s.U = 8; s.V = 33;
        } else {  // diagonals of 151 nodes: the cluster sweep (sweep.cuh, sweep_choose)
            s.B = 2; s.T = 160; s.U = 150; s.V = 17;
        }
        for (Kind kind : {Clean, Infeasible, Bad}) {
            Host h = make_host(s);
            h.T[0] = (int32_t)s.T;
            h.U[0] = (int32_t)s.U;
            if (kind == Infeasible) h.T[s.B - 1] = 0;
            if (kind == Bad) {
                h.U[s.B - 1] = std::max<int32_t>(h.U[s.B - 1], 1);
                h.labels[(s.B - 1) * s.U] = s.blank_id();
            }
            const CallCase cases[] = {{Mode::OneShot, TDT_GPU_SCHEDULE_SERIAL, false, "one-shot, serial"},
                                      {Mode::OneShot, TDT_GPU_SCHEDULE_OVERLAP, false, "one-shot, overlap"},
                                      {Mode::OneShot, TDT_GPU_SCHEDULE_SPLIT, false, "one-shot, split"},
                                      {Mode::OneShot, TDT_GPU_SCHEDULE_AUTO, false, "one-shot, auto"},
                                      {Mode::FwdBwd, TDT_GPU_SCHEDULE_SPLIT, false, "pair, split"},
                                      {Mode::FwdBwd, TDT_GPU_SCHEDULE_SERIAL, false, "pair, serial"},
                                      {Mode::Ahead, TDT_GPU_SCHEDULE_FUSED, false, "fused, ahead"},
                                      {Mode::Ahead, TDT_GPU_SCHEDULE_TRAIL, false, "trail, ahead"},
                                      {Mode::CostsOnly, TDT_GPU_SCHEDULE_SERIAL, false, "costs-only, serial"},
                                      {Mode::CostsOnly, TDT_GPU_SCHEDULE_OVERLAP, false, "costs-only, overlap"},
                                      {Mode::Ahead, TDT_GPU_SCHEDULE_AUTO, true, "ahead in a graph"}};
            for (const CallCase &c : cases)
                for (tdt_reduction_t r : {TDT_REDUCTION_SUM, TDT_REDUCTION_MEAN}) {
                    const std::string what = s.str() + ", " + c.name +
                                             (kind == Clean ? ", clean" : kind == Infeasible ? ", T_b = 0" : ", bad data") +
                                             (r == TDT_REDUCTION_SUM ? ", sum" : ", mean");
                    RunOpts ro;
                    ro.mode = c.mode;
                    ro.schedule = c.schedule;
                    ro.graph = c.graph;
                    ro.stream = c.graph ? side : nullptr;
                    ro.twice = true;
                    ro.reduction = r;
                    const Out got = run_gpu(h, ro);
                    const double v = reduced_of(got, TDT_DTYPE_FLOAT32);
                    if (kind == Bad) {
                        EXPECT_TRUE(std::isnan(v)) << what << ": " << v;
                        EXPECT_NE(got.raw_reduced, std::vector<uint8_t>(4, 0xff)) << what << ": not written";
                        EXPECT_TRUE(std::isnan(got.costs[s.B - 1])) << what << ": the bad sample's cost";
                        continue;
                    }
                    EXPECT_EQ(got.raw_reduced, reduction_by_hand(got, TDT_DTYPE_FLOAT32, r == TDT_REDUCTION_MEAN))
                        << what << ": " << v;
                    if (kind == Infeasible) {
                        EXPECT_TRUE(std::isinf(v) && v > 0) << what << ": " << v;
                    } else {
                        EXPECT_TRUE(std::isfinite(v)) << what << ": " << v;
                    }
                }
        }
    }
    CUDA_OK(cudaStreamDestroy(side));
}

// options.pack: labels and lengths handed over as int64 and packed by the forward call's first
// kernel (which also zeroes the counters the overlapped schedules use): every schedule and call
// shape, and in a CUDA graph, gives the bits of int32 arrays given directly; the packed array
// holds them and the verdict is 1; tdt_backward and tdt_scale_gradients read what the forward
// packed.
TEST(GpuCalls, PackedByTheCall) {
    REQUIRE_GPU();
    cudaStream_t side = nullptr;  // a graph is captured on a stream of its own
    CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16}) {
        Spec s = medium(dt);
        s.B = 5;
        s.V = 1025;
        const Host h = make_host(s);
        std::vector<int32_t> want(h.T.begin(), h.T.end());
        want.insert(want.end(), h.U.begin(), h.U.end());
        want.insert(want.end(), h.labels.begin(), h.labels.begin() + s.B * s.U);
        const CallCase cases[] = {{Mode::OneShot, TDT_GPU_SCHEDULE_AUTO, false, "one-shot, auto"},
                              {Mode::OneShot, TDT_GPU_SCHEDULE_SERIAL, false, "one-shot, serial"},
                              {Mode::FwdBwd, TDT_GPU_SCHEDULE_OVERLAP, false, "pair, overlap"},
                              {Mode::FwdBwd, TDT_GPU_SCHEDULE_SPLIT, false, "pair, split"},
                              {Mode::Ahead, TDT_GPU_SCHEDULE_FUSED, false, "fused, ahead"},
                              {Mode::Ahead, TDT_GPU_SCHEDULE_TRAIL, false, "trail, ahead"},
                              {Mode::CostsOnly, TDT_GPU_SCHEDULE_AUTO, false, "costs-only"},
                              {Mode::Ahead, TDT_GPU_SCHEDULE_AUTO, true, "ahead in a graph"}};
        for (const CallCase &c : cases) {
            const std::string what = std::string(dt_name(dt)) + ", " + c.name;
            RunOpts ro;
            ro.mode = c.mode;
            ro.schedule = c.schedule;
            ro.graph = c.graph;
            ro.stream = c.graph ? side : nullptr;
            ro.reduction = TDT_REDUCTION_MEAN;
            if (c.mode == Mode::Ahead) ro.scale = {0.5, 2.0, 1.0, -3.0, 1.0};
            const Out plain = run_gpu(h, ro);
            ro.pack = true;
            const Out got = run_gpu(h, ro);
            EXPECT_EQ(got.packed, want) << what << ": the packed array";
            EXPECT_EQ(got.pack_valid, 1) << what << ": the verdict";
            EXPECT_EQ(got.raw_costs, plain.raw_costs) << what << ": costs";
            EXPECT_EQ(got.raw_reduced, plain.raw_reduced) << what << ": the mean";
            EXPECT_EQ(got.raw_gtok, plain.raw_gtok) << what << ": token gradient";
            EXPECT_EQ(got.raw_gdur, plain.raw_gdur) << what << ": duration gradient";
            if (c.mode == Mode::Ahead) {
                EXPECT_EQ(got.written, plain.written) << what;
            }
        }
    }
    CUDA_OK(cudaStreamDestroy(side));
}

// Bad values packed by the call: the verdict 0, and the results of the same bad values given as
// int32 (their samples NaN, the others untouched), under the schedules that wait on samples.
TEST(GpuCalls, PackedBadValues) {
    REQUIRE_GPU();
    Spec s = medium(TDT_DTYPE_FLOAT32);
    s.B = 6;
    s.ragged = false;
    Host bad = make_host(s);
    bad.T[1] = (int32_t)s.T + 1;
    bad.U[2] = -1;
    bad.labels[3 * s.U + 2] = (int32_t)s.V + 100;
    bad.labels[4 * s.U] = s.blank_id();
    for (tdt_gpu_schedule_t sch : {TDT_GPU_SCHEDULE_AUTO, TDT_GPU_SCHEDULE_FUSED, TDT_GPU_SCHEDULE_TRAIL}) {
        RunOpts ro;
        ro.schedule = sch;
        const Out plain = run_gpu(bad, ro);
        ro.pack = true;
        const Out got = run_gpu(bad, ro);
        EXPECT_EQ(got.pack_valid, 0) << "schedule " << (int)sch;
        EXPECT_EQ(got.raw_costs, plain.raw_costs) << "schedule " << (int)sch;
        EXPECT_EQ(got.raw_gtok, plain.raw_gtok) << "schedule " << (int)sch;
        EXPECT_TRUE(std::isfinite(got.costs[0]) && std::isnan(got.costs[1])) << got.costs[0] << " " << got.costs[1];
    }
}

TEST(GpuCalls, OnlyOneGradient) {
    REQUIRE_GPU();
    Spec s = medium(TDT_DTYPE_FLOAT32);
    Host h = make_host(s);
    RunOpts a, b;
    a.want_dur = false;
    b.want_tok = false;
    Out full = run_gpu(h, RunOpts());
    Out ta = run_gpu(h, a), tb = run_gpu(h, b);
    EXPECT_EQ(ta.gtok, full.gtok);
    EXPECT_EQ(tb.gdur, full.gdur);
}

TEST(GpuCalls, DeterministicAcrossRuns) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16}) {
        Spec s = medium(dt);
        s.B = 4; s.V = 1025;
        Host h = make_host(s);
        Out a = run_gpu(h, RunOpts());
        for (int i = 0; i < 3; ++i) {
            Out b = run_gpu(h, RunOpts());
            ASSERT_EQ(a.raw_costs, b.raw_costs) << "run " << i;
            ASSERT_EQ(a.raw_gtok, b.raw_gtok) << "run " << i;
        }
    }
}

TEST(GpuCalls, SecondStreamAndGraphCapture) {
    REQUIRE_GPU();
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16}) {
        Spec s = medium(dt);
        Host h = make_host(s);
        RunOpts base;
        base.mode = Mode::FwdBwd;
        base.grad_costs = {1.0, 0.25, 3.0};
        Out ref = run_gpu(h, base);
        RunOpts on_stream = base;
        on_stream.stream = st;
        Out a = run_gpu(h, on_stream);
        EXPECT_EQ(a.raw_costs, ref.raw_costs) << "non-default stream, " << dt_name(dt);
        EXPECT_EQ(a.raw_gtok, ref.raw_gtok) << "non-default stream, " << dt_name(dt);
        RunOpts graph = on_stream;
        graph.graph = true;
        Out b = run_gpu(h, graph);
        EXPECT_EQ(b.raw_costs, ref.raw_costs) << "graph replay, " << dt_name(dt);
        EXPECT_EQ(b.raw_gtok, ref.raw_gtok) << "graph replay, " << dt_name(dt);
        Out c = run_cpu(h, base);
        expect_match(a, c, s);
    }
    CUDA_OK(cudaStreamDestroy(st));
}

// Threads calling the library at once, each on its own stream, as a multi-threaded trainer
// does: every call the single thread's bits. The launchers read and fill the table of CUDA's
// kept answers (gpu.cu) from all of them.
TEST(GpuCalls, ThreadsAtOnce) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16}) {
        Spec s = medium(dt);
        Host h = make_host(s);
        RunOpts base;
        base.mode = Mode::FwdBwd;
        base.grad_costs = {1.0, 0.25, 3.0};
        const Out ref = run_gpu(h, base);
        const int kThreads = 4, kRuns = 3;
        std::vector<Out> got(kThreads * kRuns);
        std::vector<std::thread> pool;
        for (int i = 0; i < kThreads; ++i)
            pool.emplace_back([&, i]() {
                cudaStream_t st = nullptr;
                if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return;
                RunOpts ro = base;
                ro.stream = st;
                ro.schedule = i % 2 ? TDT_GPU_SCHEDULE_AUTO : TDT_GPU_SCHEDULE_OVERLAP;
                for (int r = 0; r < kRuns; ++r) got[i * kRuns + r] = run_gpu(h, ro);
                cudaStreamDestroy(st);
            });
        for (std::thread &t : pool) t.join();
        for (int i = 0; i < kThreads * kRuns; ++i) {
            EXPECT_EQ(got[i].raw_costs, ref.raw_costs) << dt_name(dt) << ": thread " << i / kRuns << ", run " << i % kRuns;
            EXPECT_EQ(got[i].raw_gtok, ref.raw_gtok) << dt_name(dt) << ": thread " << i / kRuns << ", run " << i % kRuns;
        }
    }
}

// Sample b of a batch as a batch of one: the same bytes of logits, labels and lengths.
Host slice_sample(const Host &h, int64_t b) {
    Host o = h;
    const size_t es = esize(h.s.dt);
    o.s.B = 1;
    o.s.Tb.clear();
    o.s.Ub.clear();
    const size_t per = (size_t)h.tok_s[0] * es;
    o.tok.assign(h.tok.begin() + (ptrdiff_t)(b * per), h.tok.begin() + (ptrdiff_t)((b + 1) * per));
    if (!h.dur.empty()) {
        const size_t pd = (size_t)h.dur_s[0] * es;
        o.dur.assign(h.dur.begin() + (ptrdiff_t)(b * pd), h.dur.begin() + (ptrdiff_t)((b + 1) * pd));
    }
    if (h.s.U > 0)
        o.labels.assign(h.labels.begin() + b * h.s.U, h.labels.begin() + (b + 1) * h.s.U);
    o.T = {h.T[b]};
    o.U = {h.U[b]};
    o.gtok_elems = h.gtok_elems / h.s.B;
    o.gdur_elems = h.gdur_elems / h.s.B;
    return o;
}

// The overlapped forward (the normaliser enqueued first, in the order the sweeps read the
// lattice, and the sweep as its programmatic dependent: sweep.cuh) against the normaliser and
// the sweep one after the other: a batch whose sweep blocks would take more than a quarter of
// the SMs never overlaps, each of its samples alone does (on sm_90), and the two must give the
// same bits, on the legacy default stream and on a stream of its own. Each sample's logits
// start on a 16-byte boundary in both (T a multiple of 8), so the V-wide sums run in the same
// order. The workspace starts as NaN (run_gpu), so a weight the sweep read before the
// normaliser wrote it shows. Both the one-block staged sweep (B = num_sms / 8 + 1 samples)
// and the cluster split (rows of 301 nodes: clusters of 12 blocks, B = 3).
TEST(GpuCalls, OverlappedForwardMatchesSerialBitwise) {
    REQUIRE_GPU();
    int sms = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrMultiProcessorCount, &sms));
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int cluster = 0; cluster < 2; ++cluster) {
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16, TDT_DTYPE_FLOAT64}) {
            Spec s;
            s.dt = dt;
            s.ragged = true;
            s.seed = 70 + cluster;
            if (cluster) {
                s.B = 3; s.T = 160; s.U = 300; s.V = 40;
                if (dt == TDT_DTYPE_BFLOAT16) s.durs = {0, 2, 3};
            } else {
                s.B = sms / 8 + 1; s.T = 40; s.U = 13; s.V = 300;
                if (dt == TDT_DTYPE_BFLOAT16) s.durs = {};
            }
            Host h = make_host(s);
            RunOpts ro;
            ro.mode = Mode::FwdBwd;
            Out all = run_gpu(h, ro);
            const size_t acc = acc_size(dt), per = (size_t)h.tok_s[0] * esize(dt);
            for (int64_t b : {(int64_t)0, s.B / 2, s.B - 1}) {
                RunOpts one_ro = ro;  // the legacy default stream, and a stream of its own
                if (b == s.B / 2) one_ro.stream = st;
                Out one = run_gpu(slice_sample(h, b), one_ro);
                const std::vector<uint8_t> cost(all.raw_costs.begin() + (ptrdiff_t)(b * acc),
                                                all.raw_costs.begin() + (ptrdiff_t)((b + 1) * acc));
                const std::vector<uint8_t> grad(all.raw_gtok.begin() + (ptrdiff_t)(b * per),
                                                all.raw_gtok.begin() + (ptrdiff_t)((b + 1) * per));
                EXPECT_EQ(one.raw_costs, cost) << s.str() << ": cost of sample " << b << " (T_b "
                                               << h.T[b] << ", U_b " << h.U[b] << ")";
                EXPECT_EQ(one.raw_gtok, grad) << s.str() << ": gradient of sample " << b;
            }
        }
    }
    CUDA_OK(cudaStreamDestroy(st));
}

// The GPU schedules (tdt_gpu_schedule_t) reorder kernels, never arithmetic: costs and both
// gradients must be the same bits under each, against SERIAL, in the one-shot call and the
// forward/backward pair (backward run twice over one workspace: the split schedule recomputes
// beta there), with samples the split backward must not wait for: bad data (NaN cost), an
// infeasible sample (durations without 1, T_b = 1), T_b = 0, U_b = 0. The one exception is the
// fused schedule's one-shot call (FUSED; AUTO takes it for long rows and for rows of at least
// 0.4 MB a diagonal, not these: 0.3 MB at most), whose
// gradients take log p(y|x) from the lattice's middle: the same costs, gradients the same to
// rounding. The
// workspace's counters show which schedule ran: untouched (NaN poison) after SERIAL, the
// forward's layer counts after OVERLAP, every sample's final beta count (INT_MAX) after SPLIT,
// after the fused one-shot call every sample's final alpha and beta counts and each lattice's
// cut done, and after the trail one-shot call (TRAIL, which AUTO takes for the case of 24
// samples on the H200) the final counts with no layer count and no cut.
TEST(GpuCalls, SchedulesMatchSerialBitwise) {
    REQUIRE_GPU();
    int major = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrComputeCapabilityMajor, &major));
    struct Case {
        tdt_dtype_t dt;
        int64_t B, T, U, V;
        std::vector<int> durs;
        bool joint;
    };
    // The last four cases' rows are at most 64 vectors: the normaliser takes 2 lanes a node and
    // the gradient pass 4, so the split's gradient pass takes tickets of its own size.
    const std::vector<Case> cases = {
        {TDT_DTYPE_FLOAT32, 6, 40, 13, 300, {0, 1, 2, 3, 4}, false},   // 8 lanes a row
        {TDT_DTYPE_FLOAT32, 3, 24, 9, 2100, {0, 1, 2, 3, 4}, true},    // 32 lanes, joint slices
        {TDT_DTYPE_BFLOAT16, 5, 33, 20, 513, {0, 2, 3}, false},        // infeasible T_b = 1
        {TDT_DTYPE_FLOAT16, 4, 20, 6, 130, {}, false},                 // RNN-T
        {TDT_DTYPE_FLOAT64, 4, 18, 7, 90, {0, 1, 2}, false},
        {TDT_DTYPE_FLOAT32, 24, 30, 10, 257, {0, 1, 2, 3, 4}, false},  // too many for OVERLAP
        // 134,400 padded nodes, over kNormFourLanesNodes: the normaliser at 4 lanes where the
        // gradient pass takes 8; diagonals of 64 nodes a sample keep the sweeps in one block,
        // and 0.3 MB a diagonal keeps AUTO off the fused schedule
        {TDT_DTYPE_FLOAT32, 3, 700, 63, 300, {0, 1, 2, 3, 4}, false},
    };
    int sms = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrMultiProcessorCount, &sms));
    for (const Case &cs : cases) {
        Spec s;
        s.dt = cs.dt; s.B = cs.B; s.T = cs.T; s.U = cs.U; s.V = cs.V; s.durs = cs.durs;
        s.ragged = true; s.joint = cs.joint; s.seed = 90 + (uint64_t)cs.V;
        if (cs.joint) s.grads = Grads::Joint;
        Host h = make_host(s);
        h.T[0] = (int32_t)s.T;  // one full-length sample
        h.U[0] = (int32_t)s.U;
        h.labels[1 * s.U + 0] = s.blank_id();  // bad data: label == blank (if U_b > 0)
        h.U[1] = std::max<int32_t>(h.U[1], 1);
        h.T[2] = 1;  // infeasible without duration 1 (else a one-frame sample)
        if (s.B > 3) h.T[3] = 0;
        if (s.B > 4) h.U[4] = 0;
        RunOpts serial;
        serial.mode = Mode::FwdBwd;
        serial.schedule = TDT_GPU_SCHEDULE_SERIAL;
        serial.keep_order = true;
        const Out ref = run_gpu(h, serial);
        for (int32_t v : ref.order) EXPECT_EQ(v, -1) << s.str() << ": SERIAL touched a counter";
        EXPECT_TRUE(std::isnan(ref.costs[1])) << s.str() << ": bad sample 1 cost " << ref.costs[1];
        // AUTO's trail rule (sweep.cuh, trail_plan): a serial forward, its 2 B sweep blocks
        // more than a quarter of the SMs (no OVERLAP) and fewer than all of them
        const bool auto_trail = 2 * cs.B > sms / 4 && 2 * cs.B < sms;
        for (tdt_gpu_schedule_t sch : {TDT_GPU_SCHEDULE_OVERLAP, TDT_GPU_SCHEDULE_SPLIT, TDT_GPU_SCHEDULE_FUSED,
                                       TDT_GPU_SCHEDULE_TRAIL, TDT_GPU_SCHEDULE_AUTO}) {
            for (Mode m : {Mode::FwdBwd, Mode::OneShot, Mode::CostsOnly}) {
                RunOpts ro;
                ro.mode = m;
                ro.schedule = sch;
                ro.backward_twice = m == Mode::FwdBwd;
                ro.keep_order = true;
                const Out o = run_gpu(h, ro);
                const std::string what = s.str() + ", schedule " + std::to_string((int)sch) +
                                         (m == Mode::OneShot ? ", one-shot"
                                          : m == Mode::CostsOnly ? ", costs only" : ", backward twice");
                EXPECT_EQ(o.raw_costs, ref.raw_costs) << what << ": costs";
                const bool fused = m == Mode::OneShot && sch == TDT_GPU_SCHEDULE_FUSED;
                if (fused) {
                    expect_within_rounding(o.raw_gtok, ref.raw_gtok, cs.dt, what + ": token gradient");
                    expect_within_rounding(o.raw_gdur, ref.raw_gdur, cs.dt, what + ": duration gradient");
                } else if (m != Mode::CostsOnly) {
                    EXPECT_EQ(o.raw_gtok, ref.raw_gtok) << what << ": token gradient";
                    EXPECT_EQ(o.raw_gdur, ref.raw_gdur) << what << ": duration gradient";
                }
                if (!hopper_code(major)) continue;  // the overlapped schedules need sm_90: SERIAL ran
                const size_t K = (size_t)tdt_ws_layers(s.T, s.U);
                const bool trail = m == Mode::OneShot &&
                                   (sch == TDT_GPU_SCHEDULE_TRAIL || (sch == TDT_GPU_SCHEDULE_AUTO && auto_trail));
                if (trail) {
                    for (size_t k = 0; k <= K; ++k)
                        ASSERT_EQ(o.order[k], 0) << what << ": layer counter " << k << " of a serial forward";
                    for (int64_t b = 0; b < s.B; ++b) {
                        const std::string sb = what + ": sample " + std::to_string(b);
                        EXPECT_EQ(o.order[1 + K + (size_t)b], INT32_MAX) << sb << "'s final beta count";
                        EXPECT_EQ(o.order[1 + K + (size_t)(s.B + b)], INT32_MAX) << sb << "'s final alpha count";
                        EXPECT_EQ(o.order[1 + K + (size_t)(2 * s.B + b)], 0) << sb << ": a cut counted";
                    }
                    EXPECT_GT(o.order[1 + K + (size_t)(3 * s.B)], 0) << what << ": no gradient ticket taken";
                    continue;
                }
                if (sch == TDT_GPU_SCHEDULE_TRAIL) {
                    // TRAIL's pair and costs-only call run as SERIAL
                    for (size_t k = 0; k < o.order.size(); ++k)
                        ASSERT_EQ(o.order[k], -1) << what << ": counter " << k << " touched";
                    continue;
                }
                if (fused) {
                    expect_fused_counters(o, h, K, what);
                    continue;
                }
                if (m == Mode::CostsOnly) {
                    // alpha alone: under OVERLAP and SPLIT it trails the ordered normaliser
                    // (one diagonal a layer); no beta, so no beta progress count
                    if (sch != TDT_GPU_SCHEDULE_AUTO) {
                        EXPECT_GT(o.order[1], 0) << what << ": layer 0 of the ordered normaliser";
                    }
                    for (int64_t b = 0; b < s.B; ++b)
                        EXPECT_EQ(o.order[1 + K + (size_t)b], -1)
                            << what << ": sample " << b << "'s beta progress was written";
                } else if (sch == TDT_GPU_SCHEDULE_SPLIT) {
                    for (int64_t b = 0; b < s.B; ++b)
                        EXPECT_EQ(o.order[1 + K + (size_t)b], INT32_MAX)
                            << what << ": sample " << b << "'s beta progress";
                } else if (sch == TDT_GPU_SCHEDULE_OVERLAP || sch == TDT_GPU_SCHEDULE_FUSED) {
                    // FUSED's pair runs as OVERLAP
                    EXPECT_GT(o.order[1], 0) << what << ": layer 0 of the ordered normaliser";
                    EXPECT_EQ(o.order[1 + K], -1) << what << ": a beta progress count was written";
                }
            }
        }
    }
}

// AUTO on a small lattice of rows that would split (sweep.cuh, kFusedOverSplitLayers): the
// one-shot call and tdt_forward_ahead() run the fused schedule (its counters, the pair's costs
// bit for bit, gradients within rounding; written ahead), while the pair still splits (the
// serial bits, beta's progress written by the backward), and a tdt_backward() after the fused
// forward_ahead, over its workspace, splits too: the pair's bits.
TEST(GpuCalls, FusedOverSplitOnShortLattices) {
    REQUIRE_GPU();
    int major = 0, sms = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrComputeCapabilityMajor, &major));
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrMultiProcessorCount, &sms));
    Spec s;
    s.dt = TDT_DTYPE_FLOAT32;
    // 2.6 MB of logits a diagonal (split: 2.5; the fused nodes' cache of counts seen, sweep.cuh's
    // kSeenBytesPerDiagonal: 2), 50 diagonals
    s.B = 4; s.T = 40; s.U = 10; s.V = 19000;
    s.ragged = true;
    s.seed = 1931;
    Host h = make_host(s);
    h.T[0] = (int32_t)s.T;
    h.U[0] = (int32_t)s.U;
    const double per_diagonal = (double)(s.B * s.T * (s.U + 1)) * (double)(s.V + s.D()) * 4.0 / (double)(s.T + s.U);
    ASSERT_GE(per_diagonal, 2.5 * 1024 * 1024) << "the case no longer reaches the split's rule";
    if (!hopper_code(major) || 2 * s.B > sms / 4) GTEST_SKIP() << "no overlapped schedules here";
    const size_t K = (size_t)tdt_ws_layers(s.T, s.U);
    RunOpts serial;
    serial.mode = Mode::FwdBwd;
    serial.schedule = TDT_GPU_SCHEDULE_SERIAL;
    const Out ref = run_gpu(h, serial);

    RunOpts pair;
    pair.mode = Mode::FwdBwd;
    pair.keep_order = true;
    const Out p = run_gpu(h, pair);
    EXPECT_EQ(p.raw_costs, ref.raw_costs) << s.str() << ", AUTO pair: costs";
    EXPECT_EQ(p.raw_gtok, ref.raw_gtok) << s.str() << ", AUTO pair: token gradient";
    EXPECT_EQ(p.raw_gdur, ref.raw_gdur) << s.str() << ", AUTO pair: duration gradient";
    for (int64_t b = 0; b < s.B; ++b)
        EXPECT_EQ(p.order[1 + K + (size_t)b], INT32_MAX) << s.str() << ", AUTO pair: sample " << b
                                                         << "'s beta progress (the split backward's)";

    RunOpts one;
    one.keep_order = true;
    const Out o = run_gpu(h, one);
    expect_fused_match(o, ref, s.dt, s.str() + ", AUTO one-shot");
    expect_fused_counters(o, h, K, s.str() + ", AUTO one-shot (the fused schedule's counters)");

    RunOpts ahead;
    ahead.mode = Mode::Ahead;
    ahead.backward_twice = true;  // then tdt_backward() over the fused forward's workspace
    const Out a = run_gpu(h, ahead);
    EXPECT_EQ(a.written, 1) << s.str() << ": AUTO's forward_ahead did not write the gradients";
    EXPECT_EQ(a.raw_costs, ref.raw_costs) << s.str() << ", AUTO ahead: costs";
    EXPECT_EQ(a.raw_gtok, ref.raw_gtok) << s.str() << ", tdt_backward after the fused forward_ahead";
    EXPECT_EQ(a.raw_gdur, ref.raw_gdur) << s.str() << ", tdt_backward after the fused forward_ahead (durations)";
}

// The trail schedule (TRAIL; AUTO takes it for a one-shot call whose forward is serial and whose
// sweeps leave SMs free) on ragged batches: the serial pair's bits in the one-shot call, written
// ahead by tdt_forward_ahead() for the same upstream, and captured in a CUDA graph; scaled
// afterwards, each element its factor times the unscaled one, and within one step of the pair
// given the product (powers of two, but a subnormal element loses a bit when halved); with more
// sweep blocks than SMs (its gradient pass starts once the last of them has); and beyond its
// TDT_TRAIL_MAX_BATCH samples, where it runs as SERIAL and writes nothing ahead.
TEST(GpuCalls, TrailScheduleMatchesSerial) {
    REQUIRE_GPU();
    int major = 0, sms = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrComputeCapabilityMajor, &major));
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrMultiProcessorCount, &sms));
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    struct Case {
        tdt_dtype_t dt;
        int64_t B, T, U, V;
        std::vector<int> durs;
    };
    const std::vector<Case> cases = {
        {TDT_DTYPE_FLOAT32, 40, 60, 20, 257, {0, 1, 2, 3, 4}},  // the ragged benchmark's kind
        {TDT_DTYPE_BFLOAT16, 40, 60, 20, 257, {0, 1, 2, 3, 4}},
        {TDT_DTYPE_FLOAT16, 12, 30, 9, 129, {}},                // RNN-T
        {TDT_DTYPE_FLOAT64, 20, 25, 8, 70, {0, 1, 2}},
        {TDT_DTYPE_FLOAT32, 300, 12, 5, 40, {0, 1, 2}},         // 600 sweep blocks
        {TDT_DTYPE_FLOAT32, 1030, 4, 2, 16, {0, 1}},            // beyond the trail's batch
    };
    const double factors[3] = {2.0, 1.0, -0.5};
    for (const Case &cs : cases) {
        Spec s;
        s.dt = cs.dt; s.B = cs.B; s.T = cs.T; s.U = cs.U; s.V = cs.V; s.durs = cs.durs;
        s.ragged = true; s.seed = 500 + (uint64_t)cs.B;
        const Host h = make_host(s);
        const bool runs = hopper_code(major) && cs.B <= 1024;
        const bool auto_trail = runs && 2 * cs.B > sms / 4 && 2 * cs.B < sms;
        RunOpts pair, pair_scaled, ahead;
        pair.mode = Mode::FwdBwd;
        pair.schedule = TDT_GPU_SCHEDULE_SERIAL;
        pair_scaled = pair;
        ahead.mode = Mode::Ahead;
        std::vector<double> scale;
        for (int64_t b = 0; b < cs.B; ++b) {
            const double w = 0.25 * (double)(1 + b % 3), f = factors[(b / 3) % 3];
            ahead.grad_costs.push_back(w);
            pair.grad_costs.push_back(w);
            pair_scaled.grad_costs.push_back(w * f);
            scale.push_back(f);
        }
        const Out want = run_gpu(h, pair), want_scaled = run_gpu(h, pair_scaled);
        for (tdt_gpu_schedule_t sch : {TDT_GPU_SCHEDULE_TRAIL, TDT_GPU_SCHEDULE_AUTO}) {
            const std::string what = s.str() + (sch == TDT_GPU_SCHEDULE_TRAIL ? ", TRAIL" : ", AUTO");
            const bool trail = sch == TDT_GPU_SCHEDULE_TRAIL ? runs : auto_trail;
            ahead.schedule = sch;
            ahead.scale = {};
            const Out a = run_gpu(h, ahead);
            if (sch == TDT_GPU_SCHEDULE_TRAIL || trail) {  // AUTO may write none where it overlaps
                EXPECT_EQ(a.written, trail ? 1 : 0) << what << ": gradients written ahead";
            }
            EXPECT_EQ(a.raw_costs, want.raw_costs) << what << ", ahead: costs";
            EXPECT_EQ(a.raw_gtok, want.raw_gtok) << what << ", ahead: token gradient";
            EXPECT_EQ(a.raw_gdur, want.raw_gdur) << what << ", ahead: duration gradient";
            ahead.scale = scale;
            const Out sc = run_gpu(h, ahead);
            if (trail) expect_scaled(sc, a, h, scale, false, what + ", scaled");
            expect_within_rounding(sc.raw_gtok, want_scaled.raw_gtok, cs.dt, what + ", scaled: token gradient");
            expect_within_rounding(sc.raw_gdur, want_scaled.raw_gdur, cs.dt, what + ", scaled: duration gradient");
        }
        RunOpts one, serial, graph;
        one.schedule = TDT_GPU_SCHEDULE_TRAIL;
        serial.schedule = TDT_GPU_SCHEDULE_SERIAL;
        graph = one;
        graph.stream = st;
        graph.graph = true;
        const Out o = run_gpu(h, one), ref = run_gpu(h, serial), g = run_gpu(h, graph);
        EXPECT_EQ(o.raw_costs, ref.raw_costs) << s.str() << ", one-shot: costs";
        EXPECT_EQ(o.raw_gtok, ref.raw_gtok) << s.str() << ", one-shot: token gradient";
        EXPECT_EQ(o.raw_gdur, ref.raw_gdur) << s.str() << ", one-shot: duration gradient";
        EXPECT_EQ(g.raw_costs, o.raw_costs) << s.str() << ", graph: costs";
        EXPECT_EQ(g.raw_gtok, o.raw_gtok) << s.str() << ", graph: token gradient";
        EXPECT_EQ(g.raw_gdur, o.raw_gdur) << s.str() << ", graph: duration gradient";
        if (cs.B <= 40) expect_match(o, run_cpu(h, RunOpts()), s);
    }
    CUDA_OK(cudaStreamDestroy(st));
}

TEST(GpuCalls, CurrentDeviceRestoredAndNonZeroDevice) {
    REQUIRE_GPU();
    Spec s = medium(TDT_DTYPE_FLOAT32);
    Host h = make_host(s);
    Out c = run_cpu(h, RunOpts());
    int n = gpu_count();
    CUDA_OK(cudaSetDevice(0));
    int after = -1;
    Out g0 = run_gpu(h, RunOpts(), &after);
    EXPECT_EQ(after, 0);
    expect_match(g0, c, s);
    if (n < 2) GTEST_SKIP() << "one GPU: the non-zero-device half needs two";
    // Buffers on device n-1 while the caller's current device is 0 at call time.
    CUDA_OK(cudaSetDevice(n - 1));
    // run_gpu allocates on the current device; switch back to 0 right before the call by
    // running with a stream of device n - 1 is not possible, so allocate there and call from 0.
    Host hh = h;
    DevBuf tok, labels, T, U, costs, gtok, work;
    ASSERT_EQ(tok.upload(hh.tok.data(), hh.tok.size()), cudaSuccess);
    ASSERT_EQ(labels.upload(hh.labels.data(), hh.labels.size() * 4), cudaSuccess);
    ASSERT_EQ(T.upload(hh.T.data(), hh.T.size() * 4), cudaSuccess);
    ASSERT_EQ(U.upload(hh.U.data(), hh.U.size() * 4), cudaSuccess);
    ASSERT_EQ(gtok.alloc(hh.tok.size()), cudaSuccess);
    ASSERT_EQ(costs.alloc((size_t)s.B * 4), cudaSuccess);
    Ptrs p;
    p.tok = tok.p; p.labels = (int32_t *)labels.p; p.T = (int32_t *)T.p; p.U = (int32_t *)U.p;
    p.gtok = gtok.p;
    tdt_options_t o;
    fill_options(hh, TDT_LOCATION_GPU, &o, nullptr);
    tdt_problem_t pr;
    tdt_gradients_t g;
    fill_problem(hh, p, &pr, &g, RunOpts());
    size_t ws = 0;
    TDT_OK(tdt_get_workspace_size(&pr, &o, &ws));
    ASSERT_EQ(work.alloc(ws), cudaSuccess);
    CUDA_OK(cudaSetDevice(0));
    TDT_OK(compute_tdt_loss(&pr, &o, costs.p, &g, work.p, ws));
    int cur = -1;
    CUDA_OK(cudaGetDevice(&cur));
    EXPECT_EQ(cur, 0) << "the caller's current device was not restored";
    CUDA_OK(cudaSetDevice(n - 1));
    CUDA_OK(cudaDeviceSynchronize());
    Out out;
    out.raw_costs = costs.download();
    unpack_costs(hh, &out);
    std::vector<uint8_t> raw = gtok.download();
    unpack(hh, raw, hh.gtok_s, 0, s.V, &out.gtok);
    unpack(hh, raw, hh.gdur_s, hh.dur_offset, s.D(), &out.gdur);
    expect_match(out, c, s);
    CUDA_OK(cudaSetDevice(0));
}

// ---- options.state_in_grads: the node blocks at the head of the token gradient's rows ----------------

// The option moves where the per-node state lives and nothing else. Under every schedule asked
// for, one-shot and tdt_forward_ahead() (followed by tdt_backward() where nothing was written
// ahead), with it: SERIAL's bits without it (SERIAL, OVERLAP, SPLIT and TRAIL give those; the
// option keeps SPLIT and FUSED from running, so they run as SERIAL or OVERLAP do, and FUSED
// asked for gives SERIAL's bits, not FUSED's); and the same request's without it, bit for bit
// except where that request may have run FUSED (FUSED, AUTO), there within FUSED's rounding.
// TRAIL still writes the gradients ahead (sm_90), and neither a split nor a fused sweep leaves
// its beta progress count. Joint rows of V + D (+ pad) elements put 16-bit row heads at 0, 2, 4
// and 6 bytes mod 8; V = 257 is the parakeet-like row; 16-bit V = 35 at D = 5 is the smallest
// row the option takes. Ragged batches; B = 32 is where AUTO takes TRAIL on 132 SMs.
TEST(GpuStateInGrads, SameBitsUnderEverySchedule) {
    REQUIRE_GPU();
    int major = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrComputeCapabilityMajor, &major));
    struct Case {
        tdt_dtype_t dt;
        int64_t B, T, U, V;
        std::vector<int> durs;
        Grads grads;
        int64_t pad;
    };
    const std::vector<Case> cases = {
        {TDT_DTYPE_FLOAT32, 12, 40, 16, 40, {0, 1, 2, 3, 4}, Grads::Joint, 0},
        {TDT_DTYPE_BFLOAT16, 12, 40, 16, 40, {0, 1, 2, 3, 4}, Grads::Joint, 0},
        {TDT_DTYPE_FLOAT16, 12, 40, 16, 40, {0, 1, 2, 3, 4}, Grads::Joint, 0},
        {TDT_DTYPE_FLOAT32, 32, 80, 30, 257, {0, 1, 2, 3, 4}, Grads::Joint, 0},
        {TDT_DTYPE_BFLOAT16, 32, 80, 30, 257, {0, 1, 2, 3, 4}, Grads::Joint, 1},  // padding kept
        {TDT_DTYPE_FLOAT16, 12, 40, 16, 257, {1, 2, 4}, Grads::Separate, 0},      // rows of 514 bytes
        {TDT_DTYPE_FLOAT32, 12, 40, 16, 41, {}, Grads::Joint, 0},                 // RNN-T
        {TDT_DTYPE_BFLOAT16, 12, 40, 16, 41, {}, Grads::Joint, 0},
        {TDT_DTYPE_FLOAT16, 12, 40, 16, 35, {0, 1, 2, 3, 4}, Grads::Joint, 1},    // the minimum V
    };
    const tdt_gpu_schedule_t schedules[] = {TDT_GPU_SCHEDULE_AUTO,  TDT_GPU_SCHEDULE_SERIAL,
                                            TDT_GPU_SCHEDULE_OVERLAP, TDT_GPU_SCHEDULE_SPLIT,
                                            TDT_GPU_SCHEDULE_FUSED, TDT_GPU_SCHEDULE_TRAIL};
    for (const Case &cs : cases) {
        Spec s;
        s.dt = cs.dt; s.B = cs.B; s.T = cs.T; s.U = cs.U; s.V = cs.V; s.durs = cs.durs;
        s.grads = cs.grads; s.pad = cs.pad; s.ragged = true; s.sigma = 0.02;
        s.seed = 900 + (uint64_t)(cs.V + cs.B);
        const Host h = make_host(s);
        std::vector<double> weights;  // tdt_forward_ahead's upstream (written ahead with it)
        for (int64_t b = 0; b < s.B; ++b) weights.push_back(0.25 * (double)(1 + b % 4) * (b % 3 ? 1.0 : -1.0));
        const size_t K = (size_t)tdt_ws_layers(s.T, s.U);
        for (Mode m : {Mode::OneShot, Mode::Ahead}) {
            RunOpts serial;
            serial.mode = m;
            serial.schedule = TDT_GPU_SCHEDULE_SERIAL;
            if (m == Mode::Ahead) serial.grad_costs = weights;
            const Out ref = run_gpu(h, serial);
            for (tdt_gpu_schedule_t sch : schedules) {
                const std::string what = s.str() + ", schedule " + std::to_string((int)sch) +
                                         (m == Mode::Ahead ? ", forward_ahead" : ", one-shot") + ", state_in_grads";
                RunOpts ro = serial;
                ro.schedule = sch;
                ro.state_in_grads = true;
                ro.keep_order = true;
                const Out o = run_gpu(h, ro);
                EXPECT_EQ(o.raw_costs, ref.raw_costs) << what << ": costs against SERIAL without it";
                EXPECT_EQ(o.raw_gtok, ref.raw_gtok) << what << ": token gradient against SERIAL without it";
                EXPECT_EQ(o.raw_gdur, ref.raw_gdur) << what << ": duration gradient against SERIAL without it";
                RunOpts without = ro;
                without.state_in_grads = false;
                without.keep_order = false;
                const Out n = run_gpu(h, without);
                if (sch == TDT_GPU_SCHEDULE_FUSED || sch == TDT_GPU_SCHEDULE_AUTO) {
                    expect_fused_match(o, n, s.dt, what + " against the same request without it");
                } else {
                    EXPECT_EQ(o.raw_costs, n.raw_costs) << what << ": costs against the same request without it";
                    EXPECT_EQ(o.raw_gtok, n.raw_gtok) << what << ": token gradient against the same request without it";
                    EXPECT_EQ(o.raw_gdur, n.raw_gdur) << what << ": duration gradient against the same request without it";
                }
                expect_padding_untouched(h, o);
                if (m == Mode::Ahead && sch == TDT_GPU_SCHEDULE_TRAIL) {
                    EXPECT_EQ(o.written, hopper_code(major) ? 1 : 0) << what << ": gradients written ahead";
                } else if (m == Mode::Ahead && sch != TDT_GPU_SCHEDULE_AUTO) {
                    EXPECT_EQ(o.written, 0) << what << ": gradients written ahead";
                }
                if (hopper_code(major) && (sch == TDT_GPU_SCHEDULE_SPLIT || sch == TDT_GPU_SCHEDULE_FUSED)) {
                    for (int64_t b = 0; b < s.B; ++b)
                        EXPECT_NE(o.order[1 + K + (size_t)b], INT32_MAX)
                            << what << ": sample " << b << "'s beta progress counted (a split or fused sweep ran)";
                }
            }
        }
        // the CPU with the option: the same values to the suite's tolerance
        RunOpts one;
        one.state_in_grads = true;
        expect_match(run_gpu(h, one), run_cpu(h, one), s);
    }
}

// Refused on the device as on the host (INVALID_OPTION, the error naming the option), before
// anything is written: in place, tdt_forward() (alone and as the pair's first call),
// compute_tdt_loss() without gradients, no token gradient, and token rows one element short of
// a block (float32 V = 16 and 16-bit V = 34 at D = 5; RNN-T float32 V = 6). The costs and the
// gradient buffers keep their 0xff poison (in place: the logits their values). The smallest
// rows are accepted (and give the bits of the call without the option), and so is every call
// of a problem without nodes (max_frames = 0, an empty batch), gradients or not.
TEST(GpuStateInGrads, Refusals) {
    REQUIRE_GPU();
    struct Case {
        const char *name;
        tdt_dtype_t dt;
        int64_t V;
        std::vector<int> durs;
        Grads grads;
        Mode mode;
        bool want_tok;
    };
    const std::vector<int> d5 = {0, 1, 2, 3, 4};
    const Case cases[] = {
        {"in place", TDT_DTYPE_FLOAT32, 40, d5, Grads::InPlace, Mode::OneShot, true},
        {"in place, forward_ahead", TDT_DTYPE_FLOAT32, 40, d5, Grads::InPlace, Mode::Ahead, true},
        {"in place, bfloat16", TDT_DTYPE_BFLOAT16, 40, d5, Grads::InPlace, Mode::OneShot, true},
        {"in place, RNN-T", TDT_DTYPE_FLOAT32, 40, {}, Grads::InPlace, Mode::OneShot, true},
        {"tdt_forward", TDT_DTYPE_FLOAT32, 40, d5, Grads::Joint, Mode::FwdOnly, true},
        {"tdt_forward + tdt_backward", TDT_DTYPE_FLOAT32, 40, d5, Grads::Joint, Mode::FwdBwd, true},
        {"costs only", TDT_DTYPE_FLOAT32, 40, d5, Grads::Joint, Mode::CostsOnly, true},
        {"no token gradient", TDT_DTYPE_FLOAT32, 40, d5, Grads::Joint, Mode::OneShot, false},
        {"float32, V = 16", TDT_DTYPE_FLOAT32, 16, d5, Grads::Joint, Mode::OneShot, true},
        {"bfloat16, V = 34", TDT_DTYPE_BFLOAT16, 34, d5, Grads::Joint, Mode::OneShot, true},
        {"float16, V = 34, forward_ahead", TDT_DTYPE_FLOAT16, 34, d5, Grads::Separate, Mode::Ahead, true},
        {"RNN-T float32, V = 6", TDT_DTYPE_FLOAT32, 6, {}, Grads::Joint, Mode::OneShot, true},
    };
    for (const Case &c : cases) {
        Spec s;
        s.B = 3; s.T = 8; s.U = 4; s.V = c.V; s.durs = c.durs; s.dt = c.dt; s.grads = c.grads; s.ragged = true;
        s.seed = 950 + (uint64_t)c.V;
        const Host h = make_host(s);
        RunOpts ro;
        ro.mode = c.mode;
        ro.want_tok = c.want_tok;
        ro.state_in_grads = true;
        ro.expect = TDT_STATUS_INVALID_OPTION;
        const Out o = run_gpu(h, ro);
        const std::string what = std::string(c.name) + " [" + s.str() + "]";
        EXPECT_NE(o.error.find("state_in_grads"), std::string::npos) << what << ": the error does not name the option: "
                                                                      << o.error;
        EXPECT_EQ(o.raw_costs, std::vector<uint8_t>(o.raw_costs.size(), 0xff)) << what << ": costs written";
        if (c.mode == Mode::FwdOnly || c.mode == Mode::CostsOnly) continue;  // no gradient downloaded
        if (c.grads == Grads::InPlace) {
            EXPECT_TRUE(o.raw_gtok == h.tok) << what << ": the logits were overwritten";
        } else {
            EXPECT_EQ(o.raw_gtok, std::vector<uint8_t>(o.raw_gtok.size(), 0xff)) << what << ": token gradient written";
            EXPECT_EQ(o.raw_gdur, std::vector<uint8_t>(o.raw_gdur.size(), 0xff)) << what << ": duration gradient written";
        }
    }
    // the smallest rows: accepted, the bits of the call without the option
    struct Min { tdt_dtype_t dt; int64_t V; std::vector<int> durs; };
    for (const Min &mn : {Min{TDT_DTYPE_FLOAT32, 17, d5}, Min{TDT_DTYPE_BFLOAT16, 35, d5},
                          Min{TDT_DTYPE_FLOAT64, 8, d5}, Min{TDT_DTYPE_FLOAT32, 7, {}}}) {
        Spec s;
        s.B = 3; s.T = 8; s.U = 4; s.V = mn.V; s.durs = mn.durs; s.dt = mn.dt; s.ragged = true; s.pad = 1;
        const Host h = make_host(s);
        RunOpts with, without;
        with.state_in_grads = true;
        const Out a = run_gpu(h, with), b = run_gpu(h, without);
        EXPECT_EQ(a.raw_costs, b.raw_costs) << s.str() << ", the smallest V: costs";
        EXPECT_EQ(a.raw_gtok, b.raw_gtok) << s.str() << ", the smallest V: gradients";
    }
    // no node, nothing to keep: accepted without any gradient (and with rows too short)
    for (int64_t B : {0, 2}) {
        Spec s;
        s.B = B; s.T = B ? 0 : 3; s.U = 2; s.V = 5;
        const Host h = make_host(s);
        for (Mode m : {Mode::FwdOnly, Mode::CostsOnly, Mode::OneShot}) {
            RunOpts ro;
            ro.mode = m;
            ro.state_in_grads = true;
            const Out o = run_gpu(h, ro);
            EXPECT_EQ(o.status, TDT_STATUS_SUCCESS) << "B = " << B << ", max_frames = " << s.T << ", mode "
                                                     << (int)m << ": " << o.error;
        }
    }
}

// ---- tdt_pack_indices on the device (the cases of test_indices.cc) -----------------------------------

// Every case, the flag in device memory and in pinned host memory (which the kernel writes over
// the bus: the flag must be there once the stream has passed the call), on a stream of its own.
TEST(GpuIndices, EveryCase) {
    REQUIRE_GPU();
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    int32_t *pinned = nullptr;
    ASSERT_EQ(cudaHostAlloc((void **)&pinned, sizeof *pinned, cudaHostAllocDefault), cudaSuccess);
    for (const tdt_test::PackCase &c : tdt_test::pack_cases()) {
        SCOPED_TRACE(c.name);
        DevBuf labels, fl, ll, packed, valid;
        ASSERT_EQ(labels.upload(tdt_test::pack_bytes(c.labels, c.type).data(),
                                c.labels.size() * (c.type == TDT_INDEX_INT64 ? 8 : 4)), cudaSuccess);
        ASSERT_EQ(fl.upload(tdt_test::pack_bytes(c.fl, c.type).data(),
                            c.fl.size() * (c.type == TDT_INDEX_INT64 ? 8 : 4)), cudaSuccess);
        ASSERT_EQ(ll.upload(tdt_test::pack_bytes(c.ll, c.type).data(),
                            c.ll.size() * (c.type == TDT_INDEX_INT64 ? 8 : 4)), cudaSuccess);
        const std::vector<int32_t> want = tdt_test::pack_expected(c);
        std::vector<int32_t> guard(want.size() + 1, -77);  // one guard element past the end
        ASSERT_EQ(packed.upload(guard.data(), guard.size() * 4), cudaSuccess);
        const int32_t minus1 = -1;
        ASSERT_EQ(valid.upload(&minus1, 4), cudaSuccess);
        tdt_indices_t in;
        std::memset(&in, 0, sizeof in);
        in.type = c.type;
        in.labels = c.labels.empty() ? nullptr : labels.p;
        in.columns = c.cols;
        in.labels_stride = c.stride;
        in.frame_lengths = c.fl.empty() ? nullptr : fl.p;
        in.label_lengths = c.ll.empty() ? nullptr : ll.p;
        tdt_problem_t p = tdt_test::pack_problem(c);
        tdt_options_t o;
        std::memset(&o, 0, sizeof o);
        o.location = TDT_LOCATION_GPU;
        o.stream = stream;
        o.blank = c.blank;
        ASSERT_EQ(tdt_pack_indices(&p, &o, &in, (int32_t *)packed.p, (int32_t *)valid.p),
                  TDT_STATUS_SUCCESS) << tdt_last_error();
        *pinned = -1;
        ASSERT_EQ(tdt_pack_indices(&p, &o, &in, (int32_t *)packed.p, pinned), TDT_STATUS_SUCCESS)
            << tdt_last_error();
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        EXPECT_EQ(*pinned, c.expect_valid) << "pinned host flag";
        std::vector<uint8_t> v = valid.download();
        int32_t flag;
        std::memcpy(&flag, v.data(), 4);
        EXPECT_EQ(flag, c.expect_valid) << "device flag";
        std::vector<uint8_t> raw = packed.download();
        std::vector<int32_t> got(guard.size());
        std::memcpy(got.data(), raw.data(), raw.size());
        for (size_t i = 0; i < want.size(); ++i)
            EXPECT_EQ(got[i], want[i]) << "packed[" << i << "] of " << want.size();
        EXPECT_EQ(got[want.size()], -77) << "wrote past 2 B + B U elements";
    }
    cudaFreeHost(pinned);
    cudaStreamDestroy(stream);
}

// More elements than the block's 1024 threads (each strides), one bad label near the end.
TEST(GpuIndices, ManyElementsOneBlock) {
    REQUIRE_GPU();
    const int64_t B = 37, U = 301, T = 50, V = 1000;
    std::vector<int64_t> lab(B * U), fl(B, T), ll(B, U);
    for (int64_t i = 0; i < B * U; ++i) lab[i] = (i * 7919) % (V - 1);
    tdt_test::PackCase c{"many", B, T, U, V, (int)V - 1, TDT_INDEX_INT64, U, U, lab, fl, ll, 1};
    for (int bad = 0; bad < 2; ++bad) {
        if (bad) c.labels[B * U - 2] = V - 1;  // the blank, inside the last sample's labels
        DevBuf dl, df, dll, packed, valid;
        ASSERT_EQ(dl.upload(tdt_test::pack_bytes(c.labels, c.type).data(), B * U * 8), cudaSuccess);
        ASSERT_EQ(df.upload(tdt_test::pack_bytes(c.fl, c.type).data(), B * 8), cudaSuccess);
        ASSERT_EQ(dll.upload(tdt_test::pack_bytes(c.ll, c.type).data(), B * 8), cudaSuccess);
        ASSERT_EQ(packed.alloc(B * (U + 2) * 4), cudaSuccess);
        ASSERT_EQ(valid.alloc(4), cudaSuccess);
        tdt_indices_t in = {c.type, dl.p, U, U, df.p, dll.p};
        tdt_problem_t p = tdt_test::pack_problem(c);
        tdt_options_t o;
        std::memset(&o, 0, sizeof o);
        o.location = TDT_LOCATION_GPU;
        o.blank = c.blank;
        ASSERT_EQ(tdt_pack_indices(&p, &o, &in, (int32_t *)packed.p, (int32_t *)valid.p),
                  TDT_STATUS_SUCCESS) << tdt_last_error();
        std::vector<uint8_t> raw = packed.download(), v = valid.download();
        std::vector<int32_t> got(B * (U + 2));
        std::memcpy(got.data(), raw.data(), raw.size());
        EXPECT_EQ(got, tdt_test::pack_expected(c));
        int32_t flag;
        std::memcpy(&flag, v.data(), 4);
        EXPECT_EQ(flag, bad ? 0 : 1);
    }
}

// ---- bad device-resident data ------------------------------------------------------------------------

TEST(GpuBadData, OutOfRangeLengthsAndLabels) {
    REQUIRE_GPU();
    Spec s = medium(TDT_DTYPE_FLOAT32);
    s.B = 6; s.ragged = false;
    Host good = make_host(s);
    Out c = run_cpu(good, RunOpts());
    Host bad = good;
    bad.T[1] = (int32_t)s.T + 1;          // frame length > max_frames
    bad.U[2] = -1;                        // negative label length
    bad.labels[3 * s.U + 2] = (int32_t)s.V + 100;  // label out of range
    bad.labels[4 * s.U + 0] = s.blank_id();        // label == blank
    bad.T[5] = -7;
    // AUTO, and the fused schedule, whose gradient pass waits on each sample's sweeps and cut
    // (bad labels with lengths in range: counts published, chunks counted without terms)
    // (and the trail schedule's, which waits on each sample's final counts)
    for (tdt_gpu_schedule_t sch : {TDT_GPU_SCHEDULE_AUTO, TDT_GPU_SCHEDULE_FUSED, TDT_GPU_SCHEDULE_TRAIL}) {
        SCOPED_TRACE(sch == TDT_GPU_SCHEDULE_AUTO ? "AUTO" : sch == TDT_GPU_SCHEDULE_FUSED ? "FUSED" : "TRAIL");
        RunOpts ro;
        ro.schedule = sch;
        Out g = run_gpu(bad, ro);
        const int64_t per_tok = s.T * (s.U + 1) * s.V, per_dur = s.T * (s.U + 1) * s.D();
        for (int64_t b = 0; b < s.B; ++b) {
            bool is_bad = b >= 1;
            if (b == 0) {
                EXPECT_TRUE(close(g.costs[b], c.costs[b], 2e-5, 2e-4)) << g.costs[b] << " vs " << c.costs[b];
                for (int64_t i = 0; i < per_tok; ++i)
                    ASSERT_TRUE(close(g.gtok[i], c.gtok[i], 2e-3, 2e-5)) << "good sample element " << i;
            }
            if (is_bad) {
                EXPECT_TRUE(std::isnan(g.costs[b])) << "sample " << b << " cost " << g.costs[b];
                for (int64_t i = b * per_tok; i < (b + 1) * per_tok; ++i)
                    ASSERT_EQ(g.gtok[i], 0.0) << "bad sample " << b << " token element " << i - b * per_tok;
                for (int64_t i = b * per_dur; i < (b + 1) * per_dur; ++i)
                    ASSERT_EQ(g.gdur[i], 0.0) << "bad sample " << b << " duration element " << i - b * per_dur;
            }
        }
    }
}

// ---- long lattices -------------------------------------------------------------------------------------

TEST(GpuLong, LabelsOver2048) {  // diagonals longer than a block: threads stride over u
    REQUIRE_GPU();
    for (bool rnnt : {false, true}) {
        Spec s; s.B = 1; s.T = 1100; s.U = 2100; s.V = 12; s.dt = TDT_DTYPE_FLOAT64; s.scale = 0.5;
        if (rnnt) s.durs = {};
        check_vs_cpu(s);
    }
}

// Diagonals of 257..512 nodes: two prefetched nodes a thread (and t + u beyond 2 max_frames:
// the per-node arrays' row of such a diagonal, (t + u) mod max_frames, wraps twice).
TEST(GpuLong, DiagonalsOfTwoNodesAThread) {
    REQUIRE_GPU();
    for (bool rnnt : {false, true}) {
        Spec s; s.B = 2; s.T = 420; s.U = 450; s.V = 9; s.dt = TDT_DTYPE_FLOAT64; s.scale = 0.5;
        s.Tb = {420, 301}; s.Ub = {450, 333}; s.seed = rnnt ? 21 : 20;
        if (rnnt) s.durs = {};
        check_vs_cpu(s);
    }
}

// max_labels + 1 = 461 and 501: the staged sweep's ring (8 diagonals of 8 fields of a row, TDT
// durations up to 4) exceeds a block's 227 KiB, so the register-prefetching ring of values takes
// the sweep, with 2 lanes a node (300-node diagonals) and with 4 (100-node ones).
TEST(GpuLong, RingSweepBeyondTheStagedRing) {
    REQUIRE_GPU();
    for (int which = 0; which < 2; ++which) {
        Spec s; s.B = 2; s.V = 7; s.dt = TDT_DTYPE_FLOAT64; s.scale = 0.5; s.seed = 23 + which;
        s.T = which ? 100 : 300; s.U = which ? 500 : 460;
        s.Tb = {(int)s.T, (int)s.T - 17}; s.Ub = {(int)s.U, (int)s.U - 29};
        check_vs_cpu(s);
    }
}

// The fused schedule over the cluster split (rows of 301 nodes, one sample: where AUTO takes it
// for a one-shot call with gradients): against the CPU backend, against SERIAL (the same costs,
// gradients to rounding: log p(y|x) from the lattice's middle), the same bits again under AUTO
// and on a second run, and (sm_90) the workspace's counters show it ran: the sample's final
// alpha and beta counts, its cut done. A sample shorter than the padded extent, TDT with
// durations 0..4 and {1, 2, 4} (bfloat16), and RNN-T.
TEST(GpuLong, FusedScheduleOverClusters) {
    REQUIRE_GPU();
    int major = 0;
    ASSERT_NO_FATAL_FAILURE(current_device_attribute(cudaDevAttrComputeCapabilityMajor, &major));
    for (int which = 0; which < 3; ++which) {
        Spec s; s.B = 1; s.T = 160; s.U = 300; s.V = 24; s.scale = 0.5; s.seed = 60 + which;
        s.Tb = {150}; s.Ub = {280};
        if (which == 1) { s.durs = {1, 2, 4}; s.dt = TDT_DTYPE_BFLOAT16; }
        if (which == 2) s.durs = {};
        Host h = make_host(s);
        RunOpts fused;
        fused.schedule = TDT_GPU_SCHEDULE_FUSED;
        fused.keep_order = true;
        const Out f = run_gpu(h, fused);
        expect_match(f, run_cpu(h, RunOpts()), s);
        RunOpts serial;
        serial.schedule = TDT_GPU_SCHEDULE_SERIAL;
        expect_fused_match(f, run_gpu(h, serial), s.dt, s.str());
        const Out again = run_gpu(h, fused), autos = run_gpu(h, RunOpts());
        EXPECT_EQ(again.raw_gtok, f.raw_gtok) << s.str() << ": a second run";
        EXPECT_EQ(again.raw_gdur, f.raw_gdur) << s.str() << ": a second run";
        if (!hopper_code(major)) continue;  // SERIAL ran
        EXPECT_EQ(autos.raw_gtok, f.raw_gtok) << s.str() << ": AUTO";
        // what a binding's forward runs: tdt_forward_ahead under AUTO writes these gradients
        RunOpts ahead;
        ahead.mode = Mode::Ahead;
        const Out a = run_gpu(h, ahead);
        EXPECT_EQ(a.written, 1) << s.str() << ": AUTO did not write the gradients ahead";
        EXPECT_EQ(a.raw_costs, f.raw_costs) << s.str() << ": tdt_forward_ahead's costs";
        EXPECT_EQ(a.raw_gtok, f.raw_gtok) << s.str() << ": tdt_forward_ahead's gradients";
        const size_t K = (size_t)tdt_ws_layers(s.T, s.U);
        EXPECT_EQ(f.order[1 + K], INT32_MAX) << s.str() << ": beta progress";
        EXPECT_EQ(f.order[2 + K], INT32_MAX) << s.str() << ": alpha progress";
        EXPECT_EQ(f.order[3 + K], 2 * TDT_WS_CUT_CHUNKS) << s.str() << ": the cut";
    }
}

// Diagonals of more than 128 nodes in the staged ring: the sweep is split over a cluster of
// blocks, each owning a range of columns (u) and receiving its neighbour's boundary value
// through distributed shared memory. max_labels + 1 = 301 gives twelve blocks of 26 columns
// (the last 15; beyond the portable cluster size of 8); a sample with U_b = 90 leaves eight of
// them without columns, one with U_b = 150 ends inside the sixth; T_b = 199 and 150 end early.
// TDT with durations 0..4 and {1, 2, 4} (no zero), and RNN-T (two lanes a node).
TEST(GpuLong, ClusterSplitSweep) {
    REQUIRE_GPU();
    for (int which = 0; which < 3; ++which) {
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32}) {
            Spec s; s.B = 3; s.T = 200; s.U = 300; s.V = 7; s.dt = dt; s.scale = 0.5;
            s.seed = 40 + which;
            s.Tb = {200, 199, 150}; s.Ub = {300, 90, 150};
            if (which == 1) s.durs = {1, 2, 4};
            if (which == 2) s.durs = {};
            check_vs_cpu(s);
        }
    }
}

// max_labels + 1 = 3701: eight diagonals of it (TDT durations up to 4) exceed a block's shared
// memory, so the sweep keeps its values in the workspace array instead of the ring.
TEST(GpuLong, LabelsBeyondTheSharedMemoryRing) {
    REQUIRE_GPU();
    Spec s; s.B = 1; s.T = 40; s.U = 3700; s.V = 8; s.dt = TDT_DTYPE_FLOAT64; s.scale = 0.5;
    s.seed = 22;
    check_vs_cpu(s);
}

TEST(GpuLong, FramesOver4096) {
    REQUIRE_GPU();
    Spec s; s.B = 2; s.T = 4200; s.U = 300; s.V = 16; s.dt = TDT_DTYPE_FLOAT32; s.Tb = {4200, 3001};
    check_vs_cpu(s);
    s.dt = TDT_DTYPE_FLOAT64; s.durs = {}; s.seed = 5;
    check_vs_cpu(s);
}

// ---- the `huge` shape: over 2^31 logits elements (bf16), 64-bit indexing -----------------------------

TEST(GpuHuge, Bf16Over2To31Elements) {
    REQUIRE_GPU();
    const int64_t B = 8, T = 375, U = 100, V = 8193, D = 5, W = V + D;
    const int64_t elems = B * T * (U + 1) * W;
    ASSERT_GT(B * T * (U + 1) * V, (int64_t)1 << 31);
    size_t free_b = 0, total_b = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    if (free_b < (size_t)elems * 2 * 2 + ((size_t)1 << 30)) GTEST_SKIP() << "not enough GPU memory";
    // Random bf16 logits: a 64 Mi-element random tile, repeated (the tile length is not a
    // multiple of the row, so rows differ), on the host and the device alike.
    const int64_t tile = (int64_t)64 << 20;
    std::vector<uint16_t> host((size_t)elems);
    Rng r(99);
    for (int64_t i = 0; i < tile; ++i) host[i] = float_to_bf16((float)(2.0 * r.uniform() - 1.0) * 2.0f);
    for (int64_t i = tile; i < elems; i += tile)
        std::memcpy(&host[i], &host[0], (size_t)std::min(tile, elems - i) * 2);
    std::vector<int32_t> labels(B * U), Tl(B, (int32_t)T), Ul(B, (int32_t)U);
    for (auto &l : labels) l = r.below((int)V - 1);  // blank = V - 1
    const std::vector<int> durs = {0, 1, 2, 3, 4};

    DevBuf dlog, dgrad, dlab, dT, dU, dcost, dwork;
    ASSERT_EQ(dlog.upload(host.data(), host.size() * 2), cudaSuccess);
    ASSERT_EQ(dgrad.alloc(host.size() * 2), cudaSuccess);
    CUDA_OK(cudaMemset(dgrad.p, 0xff, dgrad.n));
    ASSERT_EQ(dlab.upload(labels.data(), labels.size() * 4), cudaSuccess);
    ASSERT_EQ(dT.upload(Tl.data(), Tl.size() * 4), cudaSuccess);
    ASSERT_EQ(dU.upload(Ul.data(), Ul.size() * 4), cudaSuccess);
    ASSERT_EQ(dcost.alloc(B * 4), cudaSuccess);

    tdt_problem_t p;
    std::memset(&p, 0, sizeof p);
    p.batch = B; p.max_frames = T; p.max_labels = U; p.vocab_size = V; p.dtype = TDT_DTYPE_BFLOAT16;
    int64_t st[3];
    strides_of(T, U, W, st);
    p.token_logits = dlog.p;
    p.duration_logits = (const uint16_t *)dlog.p + V;
    std::memcpy(p.token_strides, st, sizeof st);
    std::memcpy(p.duration_strides, st, sizeof st);
    p.labels = (const int32_t *)dlab.p; p.frame_lengths = (const int32_t *)dT.p; p.label_lengths = (const int32_t *)dU.p;
    tdt_gradients_t g;
    std::memset(&g, 0, sizeof g);
    g.token_grads = dgrad.p;
    g.duration_grads = (uint16_t *)dgrad.p + V;
    std::memcpy(g.token_strides, st, sizeof st);
    std::memcpy(g.duration_strides, st, sizeof st);
    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.location = TDT_LOCATION_GPU; o.blank = (int)V - 1; o.durations = durs.data(); o.num_durations = (int)D;
    size_t ws = 0;
    TDT_OK(tdt_get_workspace_size(&p, &o, &ws));
    ASSERT_EQ(dwork.alloc(ws), cudaSuccess);
    TDT_OK(compute_tdt_loss(&p, &o, dcost.p, &g, dwork.p, ws));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> gcost(B);
    CUDA_OK(cudaMemcpy(gcost.data(), dcost.p, B * 4, cudaMemcpyDeviceToHost));

    // CPU reference on the first and the last sample (the last starts past element 2^31),
    // each as a batch of one with the same strides.
    for (int64_t b : {(int64_t)0, B - 1}) {
        const int64_t off = b * st[0];
        tdt_problem_t q = p;
        q.batch = 1;
        q.token_logits = host.data() + off;
        q.duration_logits = host.data() + off + V;
        q.labels = labels.data() + b * U; q.frame_lengths = &Tl[b]; q.label_lengths = &Ul[b];
        std::vector<uint16_t> cgrad((size_t)st[0], 0xffff);
        tdt_gradients_t cg = g;
        cg.token_grads = cgrad.data();
        cg.duration_grads = cgrad.data() + V;
        tdt_options_t co = o;
        co.location = TDT_LOCATION_CPU;
        size_t cws = 0;
        TDT_OK(tdt_get_workspace_size(&q, &co, &cws));
        std::vector<uint8_t> cwork(cws);
        float ccost = 0;
        TDT_OK(compute_tdt_loss(&q, &co, &ccost, &cg, cwork.data(), cws));
        EXPECT_TRUE(close(gcost[b], ccost, 2e-5, 2e-4)) << "sample " << b << ": gpu " << gcost[b] << " cpu " << ccost;
        std::vector<uint16_t> ggrad((size_t)st[0]);
        CUDA_OK(cudaMemcpy(ggrad.data(), (const uint16_t *)dgrad.p + off, ggrad.size() * 2, cudaMemcpyDeviceToHost));
        int64_t bad = 0, first = -1;
        for (int64_t n = 0; n < T * (U + 1); ++n)
            for (int64_t k = 0; k < V + D; ++k) {
                int64_t i = n * W + k;
                double a = bf16_to_float(ggrad[i]), c = bf16_to_float(cgrad[i]);
                if (!close(a, c, 2e-2, 1e-3)) { if (first < 0) first = i; ++bad; }
            }
        EXPECT_EQ(bad, 0) << "sample " << b << ": first differing element " << first << " gpu "
                          << (first >= 0 ? bf16_to_float(ggrad[first]) : 0.0) << " cpu "
                          << (first >= 0 ? bf16_to_float(cgrad[first]) : 0.0);
    }
}

// ---- timings (TDT_GPU_PERF=1): forward+backward on joint slices, CUDA events, median ---------------

double median_ms(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

TEST(GpuPerf, Timings) {
    REQUIRE_GPU();
    const char *env = std::getenv("TDT_GPU_PERF");
    if (!env || std::string(env) != "1") GTEST_SKIP() << "set TDT_GPU_PERF=1";
    struct Shape { const char *name; int64_t B, T, U, V; tdt_dtype_t dt; };
    const Shape shapes[] = {
        {"base", 8, 100, 20, 1025, TDT_DTYPE_FLOAT32},
        {"parakeet", 4, 200, 40, 8193, TDT_DTYPE_FLOAT32},
        {"parakeet-bf16", 4, 200, 40, 8193, TDT_DTYPE_BFLOAT16},
        {"large", 16, 400, 100, 1025, TDT_DTYPE_FLOAT32},
        {"long", 1, 1500, 400, 1025, TDT_DTYPE_FLOAT32},
        {"ragged", 32, 150, 60, 257, TDT_DTYPE_FLOAT32},
    };
    std::printf("%-14s %9s %9s %9s %9s %9s\n", "shape", "fwd ms", "bwd ms", "f+b ms", "floor ms", "GB");
    for (const Shape &sh : shapes) {
        const int64_t D = 5, W = sh.V + D, elems = sh.B * sh.T * (sh.U + 1) * W;
        const size_t es = esize(sh.dt), bytes = (size_t)elems * es;
        DevBuf lg, gr, lab, Tl, Ul, cost, work, gcs;
        ASSERT_EQ(lg.alloc(bytes), cudaSuccess);
        ASSERT_EQ(gr.alloc(bytes), cudaSuccess);
        {   // random tile, repeated
            const size_t tile = std::min<size_t>(bytes, (size_t)32 << 20);
            std::vector<uint8_t> t(tile);
            Rng r(7);
            for (size_t i = 0; i + es <= tile; i += es) store_el(t.data(), (int64_t)(i / es), r.normal(), sh.dt);
            for (size_t off = 0; off < bytes; off += tile)
                CUDA_OK(cudaMemcpy((char *)lg.p + off, t.data(), std::min(tile, bytes - off), cudaMemcpyHostToDevice));
        }
        std::vector<int32_t> labels(sh.B * sh.U), T(sh.B), U(sh.B);
        Rng r(3);
        for (auto &l : labels) l = r.below((int)sh.V - 1);
        for (int64_t b = 0; b < sh.B; ++b) {
            T[b] = (int32_t)sh.T; U[b] = (int32_t)sh.U;
            if (std::string(sh.name) == "ragged") {
                T[b] = (int32_t)(sh.T / 2 + r.below((int)(sh.T / 2) + 1));
                U[b] = (int32_t)(sh.U / 2 + r.below((int)(sh.U / 2) + 1));
            }
        }
        ASSERT_EQ(lab.upload(labels.data(), labels.size() * 4), cudaSuccess);
        ASSERT_EQ(Tl.upload(T.data(), T.size() * 4), cudaSuccess);
        ASSERT_EQ(Ul.upload(U.data(), U.size() * 4), cudaSuccess);
        ASSERT_EQ(cost.alloc(sh.B * 8), cudaSuccess);
        std::vector<float> ones(sh.B, 1.0f);
        ASSERT_EQ(gcs.upload(ones.data(), ones.size() * 4), cudaSuccess);
        tdt_problem_t p;
        std::memset(&p, 0, sizeof p);
        p.batch = sh.B; p.max_frames = sh.T; p.max_labels = sh.U; p.vocab_size = sh.V; p.dtype = sh.dt;
        int64_t st[3];
        strides_of(sh.T, sh.U, W, st);
        p.token_logits = lg.p;
        p.duration_logits = (const char *)lg.p + sh.V * es;
        std::memcpy(p.token_strides, st, sizeof st);
        std::memcpy(p.duration_strides, st, sizeof st);
        p.labels = (const int32_t *)lab.p; p.frame_lengths = (const int32_t *)Tl.p; p.label_lengths = (const int32_t *)Ul.p;
        tdt_gradients_t g;
        std::memset(&g, 0, sizeof g);
        g.token_grads = gr.p;
        g.duration_grads = (char *)gr.p + sh.V * es;
        std::memcpy(g.token_strides, st, sizeof st);
        std::memcpy(g.duration_strides, st, sizeof st);
        const std::vector<int> durs = {0, 1, 2, 3, 4};
        tdt_options_t o;
        std::memset(&o, 0, sizeof o);
        o.location = TDT_LOCATION_GPU; o.blank = (int)sh.V - 1; o.durations = durs.data(); o.num_durations = 5;
        size_t ws = 0;
        TDT_OK(tdt_get_workspace_size(&p, &o, &ws));
        ASSERT_EQ(work.alloc(ws), cudaSuccess);
        cudaEvent_t e0, e1, e2;
        CUDA_OK(cudaEventCreate(&e0)); CUDA_OK(cudaEventCreate(&e1)); CUDA_OK(cudaEventCreate(&e2));
        std::vector<float> tf, tb, tt;
        for (int it = 0; it < 23; ++it) {
            CUDA_OK(cudaEventRecord(e0, nullptr));
            TDT_OK(tdt_forward(&p, &o, cost.p, work.p, ws));
            CUDA_OK(cudaEventRecord(e1, nullptr));
            TDT_OK(tdt_backward(&p, &o, gcs.p, &g, work.p, ws));
            CUDA_OK(cudaEventRecord(e2, nullptr));
            CUDA_OK(cudaEventSynchronize(e2));
            float a = 0, b = 0;
            CUDA_OK(cudaEventElapsedTime(&a, e0, e1));
            CUDA_OK(cudaEventElapsedTime(&b, e1, e2));
            if (it >= 3) { tf.push_back(a); tb.push_back(b); tt.push_back(a + b); }
        }
        std::vector<float> c(sh.B);
        CUDA_OK(cudaMemcpy(c.data(), cost.p, sh.B * 4, cudaMemcpyDeviceToHost));
        for (float x : c) EXPECT_TRUE(std::isfinite(x));
        const double tok_bytes = (double)sh.B * sh.T * (sh.U + 1) * sh.V * es;
        std::printf("%-14s %9.3f %9.3f %9.3f %9.3f %9.2f\n", sh.name, median_ms(tf), median_ms(tb),
                    median_ms(tt), 3 * tok_bytes / 4.2e12 * 1e3, tok_bytes / 1e9);
        cudaEventDestroy(e0); cudaEventDestroy(e1); cudaEventDestroy(e2);
    }
}

}  // namespace
