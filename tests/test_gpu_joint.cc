// test_gpu_joint.cc - the GPU fused joint + loss (tdt_joint_* with TDT_LOCATION_GPU) against the
// CPU backend's, through the public API.
//
// Each case draws enc, pred, W and bias, rounds them to the dtype under test, and runs the
// joint on the GPU in that dtype and on the CPU in float64 on the same (rounded) values: the
// reference. Gradient buffers start as NaN (every byte 0xff), so an element the GPU forgot to
// write shows. Costs and the four gradients are compared element by element with
// |got - want| <= rel * |want| + abs * max|want| (of that output), naming the first element
// that diverged: float64 to 1e-9, float32 to 1e-4 of an element plus 1e-5 of the largest (the
// GPU sums in float32, in another order than float64), float16 and bfloat16 to a few units of
// their last place (the GPU rounds their h to the dtype, the tensor cores' operand, and the
// gradients once more at the end). Then a CUDA-graph capture, two runs bit for bit, the
// forward / backward pair with an upstream gradient, some gradients left out, and costs only.
//
// Without a CUDA build, a driver or a GPU every test is skipped (GTEST_SKIP).

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tdt.h"
#include "test_util.h"

namespace {

bool have_gpu() {
    if (!tdt_backend_built(TDT_LOCATION_GPU)) return false;
    int n = 0;
    return tdt_gpu_device_count(&n) == TDT_STATUS_SUCCESS && n > 0;
}

#define REQUIRE_GPU()                                                                          \
    do {                                                                                       \
        if (!have_gpu()) GTEST_SKIP() << "no CUDA build, device or driver";                    \
    } while (0)

uint64_t mix(uint64_t x) {  // splitmix64's output function
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    double uniform() { return (mix(s += 0x9e3779b97f4a7c15ull) >> 11) * (1.0 / 9007199254740992.0); }
    double sym() { return 2.0 * uniform() - 1.0; }  // uniform in [-1, 1)
    int below(int n) { return (int)(uniform() * n); }
};

// One joint problem: shapes, options and the values (float64, already rounded to the dtype).
struct Case {
    std::string name;
    int64_t B = 2, maxT = 5, maxU = 3, V = 9, H = 20;
    std::vector<int> durations = {0, 1, 2};  // empty: RNN-T
    tdt_activation_t act = TDT_ACTIVATION_RELU;
    double dropout = 0.0;
    bool bias = true;
    bool ragged = false;
    int infeasible = 0;  // 1: sample 0 cannot end (TDT without duration 0), 2: sample 0 T = 0
    bool strided = false;  // padded rows in every tensor and in the gradients
    double sigma = 0.0, fastemit = 0.0, clamp = 0.0;
    int normalize_costs = 0, batch_mean = 0;
    tdt_reduction_t reduction = TDT_REDUCTION_NONE;
    int blank_last = 0;  // blank = V - 1
    double wscale = 1.5;  // W's scale: logits of a few units
    double xscale = 1.0;  // enc's and pred's scale
    uint64_t seed = 1;

    int64_t row() const { return maxU + 1; }
    int64_t O() const { return V + (int64_t)durations.size(); }
    int64_t pad() const { return strided ? 3 : 0; }
};

struct Data {
    std::vector<double> enc, pred, W, bias;
    std::vector<int32_t> labels, T, U;
    int64_t enc_s[2], pred_s[2], W_s;
};

Data make_data(const Case &c, tdt_dtype_t dt) {
    Data d;
    Rng r(c.seed * 7919 + 17);
    const int64_t Hp = c.H + c.pad();
    d.enc_s[1] = Hp;
    d.enc_s[0] = c.maxT * Hp + c.pad();
    d.pred_s[1] = Hp;
    d.pred_s[0] = c.row() * Hp + c.pad();
    d.W_s = Hp;
    d.enc.assign((size_t)(c.B * d.enc_s[0]), 0.0);
    d.pred.assign((size_t)(c.B * d.pred_s[0]), 0.0);
    d.W.assign((size_t)(c.O() * d.W_s), 0.0);
    for (auto &x : d.enc) x = tdt_test::quantize(c.xscale * r.sym(), dt);
    for (auto &x : d.pred) x = tdt_test::quantize(c.xscale * r.sym(), dt);
    const double ws = c.wscale / std::sqrt((double)c.H);
    for (auto &x : d.W) x = tdt_test::quantize(ws * r.sym() * 1.7, dt);
    if (c.bias) {
        d.bias.resize((size_t)c.O());
        for (auto &x : d.bias) x = tdt_test::quantize(0.3 * r.sym(), dt);
    }
    const int blank = c.blank_last ? (int)c.V - 1 : 0;
    d.T.resize((size_t)c.B);
    d.U.resize((size_t)c.B);
    d.labels.assign((size_t)(c.B * c.maxU), 0);
    for (int64_t b = 0; b < c.B; ++b) {
        d.T[b] = (int32_t)(c.ragged ? 1 + r.below((int)c.maxT) : c.maxT);
        d.U[b] = (int32_t)(c.ragged ? r.below((int)c.maxU + 1) : c.maxU);
        for (int64_t i = 0; i < c.maxU; ++i) {
            int y = r.below((int)c.V - 1);
            if (y >= blank) ++y;  // any token but the blank
            d.labels[b * c.maxU + i] = y;
        }
    }
    if (c.infeasible == 1 && c.B > 0) {  // TDT durations without 0: U labels need U frames
        d.T[0] = 1;
        d.U[0] = (int32_t)std::min<int64_t>(2, c.maxU);
    }
    if (c.infeasible == 2 && c.B > 0) d.T[0] = 0;
    return d;
}

struct Out {
    tdt_status_t st = TDT_STATUS_SUCCESS;
    std::string err;
    std::vector<double> costs, enc_g, pred_g, W_g, bias_g;
    double reduced = 0.0;
    std::vector<uint8_t> raw;  // every output's bytes, for bitwise comparisons
};

enum class Mode { Loss, Pair };
struct RunOpts {
    Mode mode = Mode::Loss;
    std::vector<double> grad_costs;  // Pair: the upstream (B values)
    bool enc = true, pred = true, W = true, bias = true;  // which gradients
    bool graph = false;  // GPU: captured in a CUDA graph on a stream of its own
    double skip_below = 0.0;  // tdt_joint_gradients_t.skip_below
};

// The buffer of n elements of dtype dt in loc's memory, uploaded from host values (or poisoned).
struct Buf {
    void *p = nullptr;
    size_t bytes = 0;
    bool gpu = false;
    Buf(size_t b, bool on_gpu) : bytes(b), gpu(on_gpu) {
        if (bytes == 0) return;
        if (gpu) {
            if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
        } else {
            p = std::malloc(bytes);
        }
    }
    ~Buf() {
        if (!p) return;
        if (gpu) cudaFree(p);
        else std::free(p);
    }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    void put(const std::vector<uint8_t> &h) {
        if (!p || h.empty()) return;
        if (gpu) cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice);
        else std::memcpy(p, h.data(), h.size());
    }
    std::vector<uint8_t> get() const {
        std::vector<uint8_t> h(bytes);
        if (!p || bytes == 0) return h;
        if (gpu) cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
        else std::memcpy(h.data(), p, bytes);
        return h;
    }
    void poison() { put(std::vector<uint8_t>(bytes, 0xff)); }
};

std::vector<uint8_t> pack(const std::vector<double> &v, tdt_dtype_t dt) {
    std::vector<uint8_t> h(v.size() * tdt_test::dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) tdt_test::store(h.data(), (int64_t)i, v[i], dt);
    return h;
}
template <typename I> std::vector<uint8_t> bytes_of(const std::vector<I> &v) {
    std::vector<uint8_t> h(v.size() * sizeof(I));
    if (!v.empty()) std::memcpy(h.data(), v.data(), h.size());
    return h;
}

Out run(const Case &c, const Data &d, tdt_dtype_t dt, tdt_location_t loc, const RunOpts &ro = RunOpts()) {
    Out out;
    const bool gpu = loc == TDT_LOCATION_GPU;
    const size_t es = tdt_test::dtype_size(dt), acc = dt == TDT_DTYPE_FLOAT64 ? 8 : 4;
    const int64_t O = c.O(), H = c.H;
    Buf enc(d.enc.size() * es, gpu), pred(d.pred.size() * es, gpu), W(d.W.size() * es, gpu),
        bias(d.bias.size() * es, gpu);
    enc.put(pack(d.enc, dt));
    pred.put(pack(d.pred, dt));
    W.put(pack(d.W, dt));
    bias.put(pack(d.bias, dt));
    Buf labels(d.labels.size() * 4, gpu), T(d.T.size() * 4, gpu), U(d.U.size() * 4, gpu);
    labels.put(bytes_of(d.labels));
    T.put(bytes_of(d.T));
    U.put(bytes_of(d.U));

    tdt_joint_problem_t p;
    std::memset(&p, 0, sizeof p);
    p.batch = c.B;
    p.max_frames = c.maxT;
    p.max_labels = c.maxU;
    p.vocab_size = c.V;
    p.hidden = H;
    p.num_outputs = O;
    p.dtype = dt;
    p.enc = enc.p;
    p.pred = pred.p;
    p.weight = W.p;
    p.bias = c.bias ? bias.p : nullptr;
    for (int i = 0; i < 2; ++i) {
        p.enc_strides[i] = d.enc_s[i];
        p.pred_strides[i] = d.pred_s[i];
    }
    p.weight_stride = d.W_s;
    p.activation = c.act;
    p.dropout = c.dropout;
    p.dropout_seed = 1234 + c.seed;
    p.dropout_offset = 99;
    p.labels = (const int32_t *)labels.p;
    p.frame_lengths = (const int32_t *)T.p;
    p.label_lengths = (const int32_t *)U.p;

    // gradients with strides of their own (one more pad than the inputs' when strided)
    const int64_t gp = c.strided ? 5 : 0, Hg = H + gp;
    tdt_joint_gradients_t g;
    std::memset(&g, 0, sizeof g);
    g.enc_strides[1] = Hg;
    g.enc_strides[0] = c.maxT * Hg;
    g.pred_strides[1] = Hg;
    g.pred_strides[0] = c.row() * Hg;
    g.weight_stride = Hg;
    Buf enc_g((size_t)(c.B * c.maxT * Hg) * es, gpu), pred_g((size_t)(c.B * c.row() * Hg) * es, gpu),
        W_g((size_t)(O * Hg) * es, gpu), bias_g((size_t)O * es, gpu);
    for (Buf *b : {&enc_g, &pred_g, &W_g, &bias_g}) b->poison();
    g.enc_grad = ro.enc ? enc_g.p : nullptr;
    g.pred_grad = ro.pred ? pred_g.p : nullptr;
    g.weight_grad = ro.W ? W_g.p : nullptr;
    g.bias_grad = ro.bias ? bias_g.p : nullptr;
    g.skip_below = ro.skip_below;

    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.location = loc;
    o.blank = c.blank_last ? (int)c.V - 1 : 0;
    o.durations = c.durations.empty() ? nullptr : c.durations.data();
    o.num_durations = (int)c.durations.size();
    o.sigma = c.sigma;
    o.fastemit_lambda = c.fastemit;
    o.clamp = c.clamp;
    o.normalize_costs = c.normalize_costs;
    o.batch_mean = c.batch_mean;
    o.reduction = c.reduction;
    Buf costs((size_t)c.B * acc + acc, gpu), reduced(acc, gpu), gcost((size_t)c.B * acc + acc, gpu);
    costs.poison();
    reduced.poison();
    o.reduced_cost = c.reduction != TDT_REDUCTION_NONE ? reduced.p : nullptr;
    std::vector<uint8_t> gc_host((size_t)c.B * acc);
    for (size_t b = 0; b < ro.grad_costs.size() && b < (size_t)c.B; ++b) {
        if (acc == 8) std::memcpy(&gc_host[b * 8], &ro.grad_costs[b], 8);
        else {
            const float f = (float)ro.grad_costs[b];
            std::memcpy(&gc_host[b * 4], &f, 4);
        }
    }
    gcost.put(gc_host);

    size_t wbytes = 0;
    out.st = tdt_joint_get_workspace_size(&p, &o, &wbytes);
    if (out.st != TDT_STATUS_SUCCESS) {
        out.err = tdt_last_error();
        return out;
    }
    Buf work(wbytes, gpu);
    cudaStream_t stream = nullptr;
    if (gpu && ro.graph) {
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        o.stream = stream;
    }
    auto enqueue = [&]() -> tdt_status_t {
        if (ro.mode == Mode::Loss) return tdt_joint_loss(&p, &o, costs.p, &g, work.p, wbytes);
        tdt_status_t s = tdt_joint_forward(&p, &o, costs.p, work.p, wbytes);
        if (s != TDT_STATUS_SUCCESS) return s;
        return tdt_joint_backward(&p, &o, ro.grad_costs.empty() ? nullptr : gcost.p, &g, work.p, wbytes);
    };
    if (gpu && ro.graph) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        out.st = enqueue();
        out.err = tdt_last_error();
        EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        if (exec) cudaGraphExecDestroy(exec);
        if (graph) cudaGraphDestroy(graph);
        cudaStreamDestroy(stream);
    } else {
        out.st = enqueue();
        out.err = tdt_last_error();
    }
    if (gpu) {
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    }
    if (out.st != TDT_STATUS_SUCCESS) return out;

    const std::vector<uint8_t> rc = costs.get();
    for (int64_t b = 0; b < c.B; ++b) {
        if (acc == 8) out.costs.push_back(((const double *)rc.data())[b]);
        else out.costs.push_back(((const float *)rc.data())[b]);
    }
    if (c.reduction != TDT_REDUCTION_NONE) {
        const std::vector<uint8_t> rr = reduced.get();
        out.reduced = acc == 8 ? *(const double *)rr.data() : *(const float *)rr.data();
    }
    out.raw = rc;
    out.raw.resize((size_t)c.B * acc);
    // the gradients, compact (B, maxT, H) etc.; the padding must stay untouched (NaN bytes)
    auto unpack = [&](const Buf &buf, bool on, int64_t rows, std::vector<double> *v) {
        if (!on) return;
        const std::vector<uint8_t> h = buf.get();
        out.raw.insert(out.raw.end(), h.begin(), h.end());
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t k = 0; k < Hg; ++k) {
                const double x = tdt_test::load(h.data(), r * Hg + k, dt);
                if (k < H) v->push_back(x);
                else EXPECT_TRUE(std::isnan(x)) << "a gradient's padding was written at row " << r;
            }
    };
    unpack(enc_g, ro.enc, c.B * c.maxT, &out.enc_g);
    unpack(pred_g, ro.pred, c.B * c.row(), &out.pred_g);
    unpack(W_g, ro.W, O, &out.W_g);
    if (ro.bias) {
        const std::vector<uint8_t> h = bias_g.get();
        out.raw.insert(out.raw.end(), h.begin(), h.end());
        for (int64_t i = 0; i < O; ++i) out.bias_g.push_back(tdt_test::load(h.data(), i, dt));
    }
    return out;
}

struct Tol {
    double rel, abs;  // |got - want| <= rel |want| + abs max|want|
};
Tol tol_of(tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return {1e-9, 1e-9};
    case TDT_DTYPE_FLOAT32: return {1e-4, 1e-5};
    case TDT_DTYPE_FLOAT16: return {4e-3, 1e-3};
    case TDT_DTYPE_BFLOAT16: return {2e-2, 4e-3};
    }
    return {0, 0};
}

void expect_close(const std::vector<double> &got, const std::vector<double> &want, const Tol &tol,
                  const std::string &what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double scale = 0.0;
    for (double w : want)
        if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
    // every wanted value zero (V + D = 1: log p = 0, no gradient): the dtype's absolute
    // tolerance against the logits' scale, 1, as the float computation cannot give exact zeros
    if (scale == 0.0) scale = 1.0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double g = got[i], w = want[i];
        if (std::isnan(w)) {
            ASSERT_TRUE(std::isnan(g)) << what << "[" << i << "] = " << g << ", want NaN";
            continue;
        }
        if (std::isinf(w)) {
            ASSERT_EQ(g, w) << what << "[" << i << "]";
            continue;
        }
        ASSERT_TRUE(std::isfinite(g)) << what << "[" << i << "] = " << g << ", want " << w;
        ASSERT_LE(std::fabs(g - w), tol.rel * std::fabs(w) + tol.abs * scale)
            << what << "[" << i << "] = " << g << ", want " << w << " (largest " << scale << ")";
    }
}

// The GPU in dtype dt against the CPU in float64 on the same rounded values.
void check_case(const Case &c, tdt_dtype_t dt, const RunOpts &ro = RunOpts()) {
    SCOPED_TRACE(c.name + " " + tdt_test::dtype_name(dt));
    const Data d = make_data(c, dt);
    const Out want = run(c, d, TDT_DTYPE_FLOAT64, TDT_LOCATION_CPU, ro);
    ASSERT_EQ(want.st, TDT_STATUS_SUCCESS) << "CPU: " << want.err;
    const Out got = run(c, d, dt, TDT_LOCATION_GPU, ro);
    ASSERT_EQ(got.st, TDT_STATUS_SUCCESS) << "GPU: " << got.err;
    Tol t = tol_of(dt);
    // costs: float32 sums of float32 logits (float32); for float16 / bfloat16 the logits' h is
    // rounded to the dtype first (the tensor cores' operand), which moves a cost by ~1e-4 of it
    const Tol tc = dt == TDT_DTYPE_FLOAT64   ? Tol{1e-9, 1e-12}
                   : dt == TDT_DTYPE_FLOAT32 ? Tol{1e-4, 1e-6}
                                             : Tol{3e-3, 1e-6};
    expect_close(got.costs, want.costs, tc, "costs");
    if (c.reduction != TDT_REDUCTION_NONE)
        expect_close({got.reduced}, {want.reduced}, tc, "reduced_cost");
    if (ro.enc) expect_close(got.enc_g, want.enc_g, t, "enc_grad");
    if (ro.pred) expect_close(got.pred_g, want.pred_g, t, "pred_grad");
    if (ro.W) expect_close(got.W_g, want.W_g, t, "weight_grad");
    if (ro.bias) expect_close(got.bias_g, want.bias_g, t, "bias_grad");
}

const tdt_dtype_t kAll[] = {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16};

Case basic() {
    Case c;
    c.name = "basic";
    return c;
}

TEST(GpuJoint, BasicTdtEveryDtype) {
    REQUIRE_GPU();
    for (tdt_dtype_t dt : kAll) check_case(basic(), dt);
}

TEST(GpuJoint, RaggedDropoutTanhOddHidden) {
    REQUIRE_GPU();
    Case c;
    c.name = "ragged dropout tanh";
    c.B = 3, c.maxT = 7, c.maxU = 4, c.V = 11, c.H = 33;
    c.durations = {0, 1, 2, 4};
    c.act = TDT_ACTIVATION_TANH;
    c.dropout = 0.3;
    c.ragged = true;
    c.seed = 2;
    for (tdt_dtype_t dt : kAll) check_case(c, dt);
}

TEST(GpuJoint, RnntSigmoidNoBias) {
    REQUIRE_GPU();
    Case c;
    c.name = "rnnt sigmoid";
    c.B = 2, c.maxT = 6, c.maxU = 3, c.V = 13, c.H = 40;
    c.durations.clear();
    c.act = TDT_ACTIVATION_SIGMOID;
    c.bias = false;
    c.blank_last = 1;
    c.seed = 3;
    for (tdt_dtype_t dt : kAll) check_case(c, dt);
}

TEST(GpuJoint, InfeasibleSamples) {
    REQUIRE_GPU();
    Case c;
    c.name = "infeasible";
    c.B = 3, c.maxT = 4, c.maxU = 3;
    c.durations = {1, 2};
    c.infeasible = 1;
    c.seed = 4;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32}) check_case(c, dt);
    c.name = "empty sample";
    c.durations = {0, 1, 2};
    c.infeasible = 2;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_BFLOAT16}) check_case(c, dt);
}

TEST(GpuJoint, OptionsAndReductions) {
    REQUIRE_GPU();
    Case c;
    c.name = "sigma fastemit clamp normalize mean";
    c.B = 3, c.maxT = 6, c.maxU = 3, c.V = 10, c.H = 24;
    c.sigma = 0.05;
    c.fastemit = 0.01;
    c.clamp = 0.2;
    c.normalize_costs = 1;
    c.batch_mean = 1;
    c.ragged = true;
    c.reduction = TDT_REDUCTION_MEAN;
    c.act = TDT_ACTIVATION_IDENTITY;
    c.seed = 5;
    for (tdt_dtype_t dt : kAll) check_case(c, dt);
    c.reduction = TDT_REDUCTION_SUM;
    c.normalize_costs = 0;
    c.batch_mean = 0;
    check_case(c, TDT_DTYPE_FLOAT32);
}

TEST(GpuJoint, StridedTensors) {
    REQUIRE_GPU();
    Case c;
    c.name = "strided";
    c.strided = true;
    c.dropout = 0.1;
    c.H = 37;
    c.seed = 6;
    for (tdt_dtype_t dt : kAll) check_case(c, dt);
}

TEST(GpuJoint, ParakeetVocabulary) {
    REQUIRE_GPU();
    Case c;
    c.name = "V + D = 8198";
    c.B = 2, c.maxT = 3, c.maxU = 2, c.V = 8193, c.H = 64;
    c.durations = {0, 1, 2, 3, 4};
    c.blank_last = 1;
    c.wscale = 4.0;
    c.seed = 7;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16}) check_case(c, dt);
}

// V + D and H around the GEMM schedule's padding to multiples of 8: its W rows and h columns
// (the bias, -lse's parts), dz's zero tail, and the rows shorter than one 16-byte vector
TEST(GpuJoint, OutputsAndHiddenSizesOffTheVectors) {
    REQUIRE_GPU();
    struct S {
        int64_t V, H;
        std::vector<int> durs;
    };
    for (const S &s : {S{1, 5, {}}, S{2, 5, {1}}, S{3, 5, {0, 1, 2, 3, 4}}, S{40, 5, {}}, S{67, 5, {1, 2}},
                       S{11, 1, {0, 1, 2}}, S{11, 7, {0, 1, 2}}, S{11, 70, {0, 1, 2}}}) {
        Case c;
        c.V = s.V;
        c.H = s.H;
        c.durations = s.durs;
        c.B = 2, c.maxT = 3, c.maxU = s.V > 1 ? 2 : 0;
        c.seed = 11;
        c.name = "V + D = " + std::to_string(c.O()) + ", H = " + std::to_string(c.H);
        for (tdt_dtype_t dt : kAll) check_case(c, dt);
    }
}

TEST(GpuJoint, WideHiddenSmallerTiles) {
    REQUIRE_GPU();
    Case c;  // float64 at H = 1000 takes tiles of 8 nodes (shared memory), float32 of 16
    c.name = "H 1000";
    c.B = 1, c.maxT = 4, c.maxU = 2, c.V = 7, c.H = 1000;
    c.seed = 8;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32}) check_case(c, dt);
}

TEST(GpuJoint, ForwardBackwardPairWithUpstream) {
    REQUIRE_GPU();
    Case c = basic();
    c.name = "pair";
    c.B = 3;
    c.ragged = true;
    c.dropout = 0.2;
    RunOpts ro;
    ro.mode = Mode::Pair;
    ro.grad_costs = {0.5, -2.0, 3.0};
    for (tdt_dtype_t dt : kAll) check_case(c, dt, ro);
}

TEST(GpuJoint, SomeGradientsOnly) {
    REQUIRE_GPU();
    Case c = basic();
    c.name = "some gradients";
    RunOpts ro;
    ro.enc = false;
    ro.W = false;
    check_case(c, TDT_DTYPE_FLOAT32, ro);
    ro = RunOpts();
    ro.pred = false;
    ro.bias = false;
    check_case(c, TDT_DTYPE_FLOAT64, ro);
    ro = RunOpts();  // no gradient: costs only (the alpha sweep alone)
    ro.enc = ro.pred = ro.W = ro.bias = false;
    c.reduction = TDT_REDUCTION_SUM;
    check_case(c, TDT_DTYPE_BFLOAT16, ro);
}

TEST(GpuJoint, GraphCaptureMatchesDirectCall) {
    REQUIRE_GPU();
    Case c = basic();
    c.ragged = true;
    c.B = 3;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16}) {
        const Data d = make_data(c, dt);
        const Out direct = run(c, d, dt, TDT_LOCATION_GPU);
        ASSERT_EQ(direct.st, TDT_STATUS_SUCCESS) << direct.err;
        RunOpts ro;
        ro.graph = true;
        const Out graphed = run(c, d, dt, TDT_LOCATION_GPU, ro);
        ASSERT_EQ(graphed.st, TDT_STATUS_SUCCESS) << graphed.err;
        EXPECT_EQ(graphed.raw, direct.raw) << "captured in a graph, " << tdt_test::dtype_name(dt);
    }
}

// skip_below: the GPU leaves out the nodes the CPU leaves out (the same rule, common/joint.h, on
// occupancies that agree far closer than a threshold's width), so the two agree as the exact ones do;
// and a huge threshold leaves every gradient zero.
TEST(GpuJoint, SkipBelowAsTheCpu) {
    REQUIRE_GPU();
    Case c = basic();
    c.name = "skip_below";
    RunOpts ro;
    ro.skip_below = 1e-3;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32}) check_case(c, dt, ro);
    ro.skip_below = 1e300;
    const Data d = make_data(c, TDT_DTYPE_FLOAT32);
    const Out got = run(c, d, TDT_DTYPE_FLOAT32, TDT_LOCATION_GPU, ro);
    ASSERT_EQ(got.st, TDT_STATUS_SUCCESS) << got.err;
    for (const auto *v : {&got.enc_g, &got.pred_g, &got.W_g, &got.bias_g})
        for (double x : *v) ASSERT_EQ(x, 0.0) << "a gradient with every node left out";
}

// An environment variable restored, as it was, when the test ends (a failed assertion included).
struct EnvGuard {
    std::string name, saved;
    bool had;
    explicit EnvGuard(const char *n) : name(n) {
        const char *v = std::getenv(n);
        had = v != nullptr;
        saved = v ? v : "";
    }
    ~EnvGuard() {
        if (had) setenv(name.c_str(), saved.c_str(), 1);
        else unsetenv(name.c_str());
    }
};

// skip_below on the GEMM schedule compacts the kept nodes into chunks of its own (two (b, t) rows'
// room a chunk or more): with small chunks their runs start and end inside rows and samples,
// and d enc, d pred, d W and d bias still add up as the CPU's; at 8 KB float64 has one row a
// chunk, and a captured call no compaction: the dense products, left-out nodes as zero rows.
// Then 1200 rows, past one block of the kept-node count's prefix sum.
TEST(GpuJoint, SkipBelowCompactedChunks) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), chunk("TDT_GPU_JOINT_CHUNK_KB");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    Case c;
    c.name = "compacted skip_below";
    c.B = 3, c.maxT = 9, c.maxU = 5, c.V = 40, c.H = 24;
    c.durations = {0, 1, 2, 4};
    c.dropout = 0.1;
    c.ragged = true;
    c.wscale = 4.0;  // peaked logits: most nodes left out
    c.seed = 31;
    RunOpts ro;
    ro.skip_below = 1e-3;
    RunOpts pair = ro;
    pair.mode = Mode::Pair;
    pair.grad_costs = {0.5, -2.0, 1.0};
    for (const char *kb : {"", "8", "16"}) {
        setenv("TDT_GPU_JOINT_CHUNK_KB", kb, 1);
        SCOPED_TRACE(std::string("chunk KB \"") + kb + "\"");
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32}) {
            check_case(c, dt, ro);
            check_case(c, dt, pair);
        }
    }
    RunOpts graphed = ro;  // under capture: no compaction (it reads the kept count on the host)
    graphed.graph = true;
    check_case(c, TDT_DTYPE_FLOAT32, graphed);
    // more (b, t) rows than the prefix sum's block takes at once (1024): its carry from block to
    // block, in one compacted chunk and in many
    Case l;
    l.name = "compacted skip_below, 1200 rows";
    l.B = 2, l.maxT = 600, l.maxU = 2, l.V = 12, l.H = 8;
    l.ragged = true;
    l.wscale = 4.0;
    l.seed = 32;
    for (const char *kb : {"", "16"}) {
        setenv("TDT_GPU_JOINT_CHUNK_KB", kb, 1);
        SCOPED_TRACE(std::string("chunk KB \"") + kb + "\"");
        check_case(l, TDT_DTYPE_FLOAT64, ro);
    }
}

// float16's and bfloat16's forward writes z less a shift in the dtype (joint_gemm.cu's
// fwd_shifted): logits of tens of units, most rows peaked on a token that is neither the blank
// nor the label (rounded far from the shift; the largest term recomputed from the products),
// and float16 rows past its range (|z| ~ 1e9: summed from the products instead; the loss alone,
// as the backward's float16 values cannot hold such logits either). bfloat16's gradients are
// left out at this scale: its rounding of h and dz alone moves them past the suite's tolerance,
// on either schedule (the tiles keep z in float32).
TEST(GpuJoint, ForwardShiftedRows) {
    REQUIRE_GPU();
    Case c;
    c.name = "peaked logits";
    c.B = 2, c.maxT = 6, c.maxU = 4, c.V = 300, c.H = 64;
    c.durations = {0, 1, 2, 3, 4};
    c.wscale = 8.0;
    c.seed = 41;
    RunOpts lo;
    lo.enc = lo.pred = lo.W = lo.bias = false;
    check_case(c, TDT_DTYPE_FLOAT16);
    check_case(c, TDT_DTYPE_BFLOAT16, lo);
    Case f;
    f.name = "float16 rows past its range";
    f.B = 2, f.maxT = 3, f.maxU = 2, f.V = 40, f.H = 16;
    f.act = TDT_ACTIVATION_IDENTITY;
    f.xscale = 2e4;                   // enc + pred up to 4e4
    f.wscale = 4e4 * 4.0 / 1.7;       // W up to 4e4
    f.seed = 42;
    check_case(f, TDT_DTYPE_FLOAT16, lo);
}

// TDT_GPU_JOINT picks the schedule: "gemm", "tiles", unset or empty (the default: gemm where
// cuBLASLt loads), anything else is refused.
TEST(GpuJoint, ScheduleVariable) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT");
    Case c = basic();
    const Data d = make_data(c, TDT_DTYPE_FLOAT32);
    setenv("TDT_GPU_JOINT", "fastest", 1);
    const Out bad = run(c, d, TDT_DTYPE_FLOAT32, TDT_LOCATION_GPU);
    EXPECT_EQ(bad.st, TDT_STATUS_INVALID_OPTION) << bad.err;
    EXPECT_NE(bad.err.find("TDT_GPU_JOINT"), std::string::npos) << bad.err;
    for (const char *sched : {"tiles", "gemm", ""}) {
        setenv("TDT_GPU_JOINT", sched, 1);
        SCOPED_TRACE(sched);
        check_case(c, TDT_DTYPE_FLOAT32);
    }
}

// TDT_GPU_JOINT_CHUNK_KB sets the GEMM schedule's chunk: at 1 KB every (b, t) row is a chunk of
// its own, so d W, d bias and d pred add up over many chunks; a bad value is refused.
TEST(GpuJoint, ChunkBudgetVariable) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), chunk("TDT_GPU_JOINT_CHUNK_KB");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    Case c;
    c.name = "one row a chunk";
    c.B = 3, c.maxT = 7, c.maxU = 4, c.V = 11, c.H = 33;
    c.durations = {0, 1, 2, 4};
    c.dropout = 0.2;
    c.ragged = true;
    c.seed = 12;
    const Data d = make_data(c, TDT_DTYPE_FLOAT32);
    for (const char *bad : {"0", "-4", "12abc", "99999999999"}) {
        setenv("TDT_GPU_JOINT_CHUNK_KB", bad, 1);
        const Out o = run(c, d, TDT_DTYPE_FLOAT32, TDT_LOCATION_GPU);
        EXPECT_EQ(o.st, TDT_STATUS_INVALID_OPTION) << bad << ": " << o.err;
        EXPECT_NE(o.err.find("TDT_GPU_JOINT_CHUNK_KB"), std::string::npos) << o.err;
    }
    setenv("TDT_GPU_JOINT_CHUNK_KB", "1", 1);
    for (tdt_dtype_t dt : kAll) check_case(c, dt);
}

// float32's products in the GEMM schedule: bfloat16 parts (TDT_GPU_JOINT_FLOAT32 unset or
// "split") or float32 kernels ("sgemm"); both against the CPU, the split as accurate as the
// float32 kernels (each gradient's largest error, relative to its largest value, within 4x theirs
// or 1e-6), with one (b, t) row a chunk as well (the backward's chunks then one row); a bad value
// is refused, and unset is "split" bit for bit.
TEST(GpuJoint, Float32ProductsVariable) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), f32("TDT_GPU_JOINT_FLOAT32"), chunk("TDT_GPU_JOINT_CHUNK_KB");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    Case c;
    c.name = "float32 products";
    c.B = 3, c.maxT = 9, c.maxU = 5, c.V = 300, c.H = 70;
    c.durations = {0, 1, 2, 4};
    c.dropout = 0.1;
    c.ragged = true;
    c.seed = 21;
    const Data d = make_data(c, TDT_DTYPE_FLOAT32);
    setenv("TDT_GPU_JOINT_FLOAT32", "tf32", 1);
    const Out bad = run(c, d, TDT_DTYPE_FLOAT32, TDT_LOCATION_GPU);
    EXPECT_EQ(bad.st, TDT_STATUS_INVALID_OPTION) << bad.err;
    EXPECT_NE(bad.err.find("TDT_GPU_JOINT_FLOAT32"), std::string::npos) << bad.err;
    const Out want = run(c, d, TDT_DTYPE_FLOAT64, TDT_LOCATION_CPU);
    ASSERT_EQ(want.st, TDT_STATUS_SUCCESS) << want.err;
    auto err = [](const std::vector<double> &g, const std::vector<double> &w) {
        double e = 0.0, scale = 0.0;
        for (size_t i = 0; i < w.size(); ++i) {
            e = std::max(e, std::fabs(g[i] - w[i]));
            scale = std::max(scale, std::fabs(w[i]));
        }
        return scale > 0.0 ? e / scale : e;
    };
    for (const char *kb : {"", "1"}) {
        setenv("TDT_GPU_JOINT_CHUNK_KB", kb, 1);
        std::vector<double> errs[2];
        for (int m = 0; m < 2; ++m) {
            setenv("TDT_GPU_JOINT_FLOAT32", m == 0 ? "sgemm" : "split", 1);
            SCOPED_TRACE(std::string(m == 0 ? "sgemm" : "split") + ", chunk KB \"" + kb + "\"");
            check_case(c, TDT_DTYPE_FLOAT32);
            const Out got = run(c, d, TDT_DTYPE_FLOAT32, TDT_LOCATION_GPU);
            ASSERT_EQ(got.st, TDT_STATUS_SUCCESS) << got.err;
            errs[m] = {err(got.costs, want.costs), err(got.enc_g, want.enc_g), err(got.pred_g, want.pred_g),
                       err(got.W_g, want.W_g), err(got.bias_g, want.bias_g)};
        }
        const char *names[] = {"costs", "enc_grad", "pred_grad", "weight_grad", "bias_grad"};
        for (int i = 0; i < 5; ++i)
            EXPECT_LE(errs[1][i], std::max(4 * errs[0][i], 1e-6))
                << names[i] << ": split products' error " << errs[1][i] << ", float32 kernels' " << errs[0][i]
                << " (chunk KB \"" << kb << "\")";
    }
    setenv("TDT_GPU_JOINT_CHUNK_KB", "", 1);
    setenv("TDT_GPU_JOINT_FLOAT32", "split", 1);
    const Out split = run(c, d, TDT_DTYPE_FLOAT32, TDT_LOCATION_GPU);
    unsetenv("TDT_GPU_JOINT_FLOAT32");
    const Out dflt = run(c, d, TDT_DTYPE_FLOAT32, TDT_LOCATION_GPU);
    ASSERT_EQ(dflt.st, TDT_STATUS_SUCCESS) << dflt.err;
    EXPECT_EQ(dflt.raw, split.raw) << "float32's default products are not the split ones";
}

// The GEMM schedule's cuBLASLt kernels: TDT_GPU_JOINT_LT "first" (cuBLASLt's first choice for
// every product), "fewest" (the candidate with the fewest waves for every product) and "auto"
// (the default, by product; unset gives its bits) all match the CPU in every dtype, with
// products large enough that the candidates differ; a bad value is refused and named.
TEST(GpuJoint, CublasLtChoiceVariable) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), lt("TDT_GPU_JOINT_LT");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    Case c;
    c.name = "cuBLASLt's kernels";
    c.B = 3, c.maxT = 24, c.maxU = 10, c.V = 2049, c.H = 96;
    c.durations = {0, 1, 2, 4};
    c.ragged = true;
    c.seed = 33;
    const Data d = make_data(c, TDT_DTYPE_BFLOAT16);
    setenv("TDT_GPU_JOINT_LT", "best", 1);
    const Out bad = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU);
    EXPECT_EQ(bad.st, TDT_STATUS_INVALID_OPTION) << bad.err;
    EXPECT_NE(bad.err.find("TDT_GPU_JOINT_LT"), std::string::npos) << bad.err;
    for (const char *m : {"first", "fewest", "auto"}) {
        setenv("TDT_GPU_JOINT_LT", m, 1);
        SCOPED_TRACE(std::string("TDT_GPU_JOINT_LT=") + m);
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16})
            check_case(c, dt);
    }
    setenv("TDT_GPU_JOINT_LT", "auto", 1);
    const Out by_product = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU);
    ASSERT_EQ(by_product.st, TDT_STATUS_SUCCESS) << by_product.err;
    unsetenv("TDT_GPU_JOINT_LT");
    const Out dflt = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU);
    ASSERT_EQ(dflt.st, TDT_STATUS_SUCCESS) << dflt.err;
    EXPECT_EQ(dflt.raw, by_product.raw) << "the default kernels are not the \"auto\" ones";
}

// The forward's log-normalisers on wgmma (TDT_GPU_JOINT_FWD=wgmma; float16 and bfloat16 on
// compute capability 9.0 with H up to 640, elsewhere the default forward runs): against the CPU
// with H a whole number of 64-value chunks and not, V a whole number of 128-row tiles and not,
// with and without bias, tanh and dropout, strided tensors, and with the chunk too small to hold
// W packed (the default forward then). Costs within the dtype's tolerance of the CPU and within
// 1e-4 (relative) of the default forward's; a bad value is refused and named.
// The forward's log-normalisers on wgmma (TDT_GPU_JOINT_FWD, the default "wgmma" against
// "gemm", the cuBLASLt product) under chunk budgets that give one chunk of rows, several, or no
// room for W packed, and the default captured in a CUDA graph. One instance a case, dtype and
// budget, so that the sanitizers can take one.
struct WgmmaParam {
    int c;           // the case: wgmma_cases()[c]
    tdt_dtype_t dt;  // float16 or bfloat16
    const char *kb;  // TDT_GPU_JOINT_CHUNK_KB
};

std::vector<Case> wgmma_cases() {
    std::vector<Case> cases;
    Case c;
    c.name = "wgmma H 128, V 256";
    c.B = 3, c.maxT = 20, c.maxU = 7, c.V = 256, c.H = 128;
    c.durations = {0, 1, 2, 4};
    c.ragged = true;
    c.seed = 41;
    cases.push_back(c);
    c.name = "wgmma H 100, V 1025, no bias, tanh, dropout, strided";
    c.V = 1025, c.H = 100, c.bias = false, c.act = TDT_ACTIVATION_TANH, c.dropout = 0.1, c.strided = true;
    c.seed = 42;
    cases.push_back(c);
    c = Case();
    c.name = "wgmma H 640, V 300, RNN-T";
    c.B = 4, c.maxT = 40, c.maxU = 19, c.V = 300, c.H = 640;
    c.durations = {};
    c.seed = 43;
    cases.push_back(c);
    c = Case();
    c.name = "wgmma H 300 (an odd number of chunks of 64), V 500";
    c.B = 3, c.maxT = 15, c.maxU = 9, c.V = 500, c.H = 300;
    c.durations = {0, 1, 2, 3, 4};
    c.ragged = true;
    c.seed = 45;
    cases.push_back(c);
    return cases;
}

// whether the current device has compute capability 9.0, the wgmma kernels' (into *yes)
void compute_capability_90(bool *yes) {
    int dev = 0, major = 0, minor = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
    *yes = major == 9 && minor == 0;
}

class WgmmaForward : public ::testing::TestWithParam<WgmmaParam> {};

TEST_P(WgmmaForward, AgainstCpuAndCublasLt) {
    REQUIRE_GPU();
    const WgmmaParam prm = GetParam();
    const Case c = wgmma_cases()[(size_t)prm.c];
    const tdt_dtype_t dt = prm.dt;
    EnvGuard sched("TDT_GPU_JOINT"), fwd("TDT_GPU_JOINT_FWD"), chunk("TDT_GPU_JOINT_CHUNK_KB");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    setenv("TDT_GPU_JOINT_CHUNK_KB", prm.kb, 1);
    bool sm90 = false;
    ASSERT_NO_FATAL_FAILURE(compute_capability_90(&sm90));
    setenv("TDT_GPU_JOINT_FWD", "wgmma", 1);
    check_case(c, dt);
    const Data d = make_data(c, dt);
    const Out w = run(c, d, dt, TDT_LOCATION_GPU);
    setenv("TDT_GPU_JOINT_FWD", "gemm", 1);
    const Out g = run(c, d, dt, TDT_LOCATION_GPU);
    unsetenv("TDT_GPU_JOINT_FWD");
    const Out u = run(c, d, dt, TDT_LOCATION_GPU);
    ASSERT_EQ(w.st, TDT_STATUS_SUCCESS) << w.err;
    ASSERT_EQ(g.st, TDT_STATUS_SUCCESS) << g.err;
    ASSERT_EQ(u.st, TDT_STATUS_SUCCESS) << u.err;
    expect_close(w.costs, g.costs, Tol{1e-4, 1e-6}, "costs, wgmma against the cuBLASLt forward");
    EXPECT_TRUE(u.raw == w.raw) << "the default forward is not wgmma's, bit for bit";
    RunOpts ro;
    ro.graph = true;
    const Out graphed = run(c, d, dt, TDT_LOCATION_GPU, ro);
    ASSERT_EQ(graphed.st, TDT_STATUS_SUCCESS) << graphed.err;
    EXPECT_TRUE(graphed.raw == u.raw) << "captured in a graph, the default forward differs from the direct call";
    /* The two forwards round differently: costs equal to the last bit mean wgmma did not run,
     * which on compute capability 9.0 it must where z's bytes hold W packed. The default budget
     * holds it for every case; 300 KB (z 97 KB) only at H 128, V 256 (W packed 64 KB, then 14 of
     * the 60 rows a chunk: 4 chunks and 4 rows); 1 KB nowhere. */
    const bool ran = w.costs != g.costs;
    const bool room = std::strcmp(prm.kb, "") == 0 || (std::strcmp(prm.kb, "300") == 0 && prm.c == 0);
    EXPECT_EQ(ran, sm90 && room) << "the wgmma forward " << (ran ? "ran" : "did not run");
}

std::vector<WgmmaParam> wgmma_params() {
    std::vector<WgmmaParam> v;
    for (const char *kb : {"", "300", "1"})
        for (int c = 0; c < (int)wgmma_cases().size(); ++c)
            for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16}) v.push_back({c, dt, kb});
    return v;
}

INSTANTIATE_TEST_SUITE_P(GpuJoint, WgmmaForward, ::testing::ValuesIn(wgmma_params()),
                         [](const ::testing::TestParamInfo<WgmmaParam> &i) {
                             const char *kb = i.param.kb;
                             return std::string("case") + std::to_string(i.param.c) + "_" +
                                    tdt_test::dtype_name(i.param.dt) + "_chunk" + (*kb ? kb : "default");
                         });

// The backward's dz on wgmma (TDT_GPU_JOINT_BWD=wgmma against the default "gemm": the z product
// on cuBLASLt, then the dz kernel), on the forward's cases and chunk budgets (z's bytes hold W
// packed and dz for chunks of fewer rows: one chunk, several, or no room), also captured in a
// CUDA graph.
class WgmmaBackward : public ::testing::TestWithParam<WgmmaParam> {};

/* TDT_GPU_JOINT_BWD=mode ("wgmma" or "chip") on the parameter's case and budget */
static void wgmma_backward_case(const WgmmaParam &prm, const char *mode) {
    const Case c = wgmma_cases()[(size_t)prm.c];
    const tdt_dtype_t dt = prm.dt;
    EnvGuard sched("TDT_GPU_JOINT"), bwd("TDT_GPU_JOINT_BWD"), chunk("TDT_GPU_JOINT_CHUNK_KB");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    setenv("TDT_GPU_JOINT_CHUNK_KB", prm.kb, 1);
    bool sm90 = false;
    ASSERT_NO_FATAL_FAILURE(compute_capability_90(&sm90));
    setenv("TDT_GPU_JOINT_BWD", mode, 1);
    check_case(c, dt);
    const Data d = make_data(c, dt);
    const Out w = run(c, d, dt, TDT_LOCATION_GPU);
    RunOpts ro;
    ro.graph = true;
    const Out graphed = run(c, d, dt, TDT_LOCATION_GPU, ro);
    unsetenv("TDT_GPU_JOINT_BWD");
    const Out g = run(c, d, dt, TDT_LOCATION_GPU);
    ASSERT_EQ(w.st, TDT_STATUS_SUCCESS) << w.err;
    ASSERT_EQ(graphed.st, TDT_STATUS_SUCCESS) << graphed.err;
    ASSERT_EQ(g.st, TDT_STATUS_SUCCESS) << g.err;
    EXPECT_TRUE(graphed.raw == w.raw) << "captured in a graph, the " << mode << " backward differs from the direct call";
    /* the two backwards round dz differently (wgmma: from float32 z; cuBLASLt: from z - lse in the
     * dtype): within the dtype's tolerance of each other, and different in their last bits exactly
     * where the wgmma backward runs (the budgets' rule of the forward's test) */
    const Tol t = tol_of(dt);
    const std::string vs = std::string(", ") + mode + " against the cuBLASLt backward";
    expect_close(w.enc_g, g.enc_g, t, ("enc_grad" + vs).c_str());
    expect_close(w.W_g, g.W_g, t, ("weight_grad" + vs).c_str());
    expect_close(w.bias_g, g.bias_g, t, ("bias_grad" + vs).c_str());
    const bool ran = w.enc_g != g.enc_g || w.W_g != g.W_g;
    /* wgmma: where z's bytes hold W packed and a chunk of dz: the default budget everywhere; 300
     * KB (z 97 KB) at H 128, V 256 (W's 256 token rows packed in 64 KB); 500 KB (z 161 KB) there
     * (23 of the 60 rows a chunk) and at H 100, V 1025 (z 339 KB, W packed 288 KB: 3 rows a
     * chunk). chip: everywhere (its layout's area is the budget or one row's needs, whichever is
     * larger); its forward, the wgmma forward in that layout, within the dtype's tolerance of the
     * default's (wgmma's or, where the budget leaves z no room for it, cuBLASLt's) */
    const bool chip = std::strcmp(mode, "chip") == 0, kb300 = std::strcmp(prm.kb, "300") == 0,
               kb500 = std::strcmp(prm.kb, "500") == 0;
    if (chip) expect_close(w.costs, g.costs, t, "costs, the chip layout's forward against the default's");
    const bool room = chip || std::strcmp(prm.kb, "") == 0 || (kb300 && prm.c == 0) || (kb500 && prm.c < 2);
    EXPECT_EQ(ran, sm90 && room) << "the " << mode << " backward " << (ran ? "ran" : "did not run");
}

TEST_P(WgmmaBackward, AgainstCpuAndCublasLt) {
    REQUIRE_GPU();
    wgmma_backward_case(GetParam(), "wgmma");
}

/* d W and d bias on the chip too (z recomputed there, dz's values formed and consumed there) */
TEST_P(WgmmaBackward, ChipAgainstCpuAndCublasLt) {
    REQUIRE_GPU();
    wgmma_backward_case(GetParam(), "chip");
}

/* the forward's budgets, and 500 KB: several chunks for the chip's d W */
std::vector<WgmmaParam> wgmma_bwd_params() {
    std::vector<WgmmaParam> v = wgmma_params();
    for (int c = 0; c < (int)wgmma_cases().size(); ++c)
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16}) v.push_back({c, dt, "500"});
    return v;
}

INSTANTIATE_TEST_SUITE_P(GpuJoint, WgmmaBackward, ::testing::ValuesIn(wgmma_bwd_params()),
                         [](const ::testing::TestParamInfo<WgmmaParam> &i) {
                             const char *kb = i.param.kb;
                             return std::string("case") + std::to_string(i.param.c) + "_" +
                                    tdt_test::dtype_name(i.param.dt) + "_chunk" + (*kb ? kb : "default");
                         });

// The chip backward's rare rows (log-normalisers past 1e7, whose dz the base-2 formula cannot
// give: chip_rare_kernel takes them one at a time from their products) against the default
// backward's (gemm_dz_fix_kernel's rows on cuBLASLt's products), bfloat16 (float16 cannot hold
// such logits): logits around 1e7, so that some rows are rare and some not, and around 1e9,
// every row rare.
TEST(GpuJoint, ChipRareRows) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), bwd("TDT_GPU_JOINT_BWD");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    for (double x : {2.5e3, 2e4}) {
        Case c;
        c.name = "rare rows";
        c.B = 3, c.maxT = 5, c.maxU = 3, c.V = 40, c.H = 16;
        c.act = TDT_ACTIVATION_IDENTITY;
        c.xscale = x;
        c.wscale = 2.0 * x * 4.0 / 1.7;
        c.ragged = true;
        c.seed = 44;
        SCOPED_TRACE("enc and pred up to " + std::to_string(2 * x));
        const Data d = make_data(c, TDT_DTYPE_BFLOAT16);
        setenv("TDT_GPU_JOINT_BWD", "chip", 1);
        const Out w = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU);
        unsetenv("TDT_GPU_JOINT_BWD");
        const Out g = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU);
        ASSERT_EQ(w.st, TDT_STATUS_SUCCESS) << w.err;
        ASSERT_EQ(g.st, TDT_STATUS_SUCCESS) << g.err;
        const Tol t = tol_of(TDT_DTYPE_BFLOAT16);
        expect_close(w.costs, g.costs, t, "costs, the chip layout's forward against the default's");
        expect_close(w.enc_g, g.enc_g, t, "enc_grad, chip against the cuBLASLt backward");
        expect_close(w.pred_g, g.pred_g, t, "pred_grad, chip against the cuBLASLt backward");
        expect_close(w.W_g, g.W_g, t, "weight_grad, chip against the cuBLASLt backward");
        expect_close(w.bias_g, g.bias_g, t, "bias_grad, chip against the cuBLASLt backward");
    }
}

TEST(GpuJoint, WgmmaBackwardVariableRefusedAndSkipBelowOnCublasLt) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), bwd("TDT_GPU_JOINT_BWD");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    const Case c = wgmma_cases()[0];
    const Data d = make_data(c, TDT_DTYPE_BFLOAT16);
    setenv("TDT_GPU_JOINT_BWD", "tensor", 1);
    const Out bad = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU);
    EXPECT_EQ(bad.st, TDT_STATUS_INVALID_OPTION) << bad.err;
    EXPECT_NE(bad.err.find("TDT_GPU_JOINT_BWD"), std::string::npos) << bad.err;
    /* with skip_below the backward stays on cuBLASLt: the same bits as without the variable */
    RunOpts ro;
    ro.skip_below = 1e-3;
    setenv("TDT_GPU_JOINT_BWD", "wgmma", 1);
    const Out w = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU, ro);
    unsetenv("TDT_GPU_JOINT_BWD");
    const Out g = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU, ro);
    ASSERT_EQ(w.st, TDT_STATUS_SUCCESS) << w.err;
    ASSERT_EQ(g.st, TDT_STATUS_SUCCESS) << g.err;
    EXPECT_TRUE(w.raw == g.raw) << "skip_below: the wgmma backward ran";
}

// The chip layout's other paths: with skip_below the backward is the GEMM schedule's, in chunks
// that fit the chip layout's bytes (after a forward that put W padded in the chip's area); with
// TDT_GPU_JOINT_FWD=gemm the forward is cuBLASLt's in those chunks before the chip backward;
// with TDT_GPU_JOINT=tiles the tiles' schedule runs in chunks that fit the same bytes: each
// within the dtype's tolerance of the default.
TEST(GpuJoint, ChipLayoutWithSkipBelowAndCublasLtForward) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), bwd("TDT_GPU_JOINT_BWD"), fwd("TDT_GPU_JOINT_FWD");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    const Case c = wgmma_cases()[0];
    const tdt_dtype_t dt = TDT_DTYPE_BFLOAT16;
    const Data d = make_data(c, dt);
    const Tol t = tol_of(dt);
    RunOpts ro;
    ro.skip_below = 1e-3;
    setenv("TDT_GPU_JOINT_BWD", "chip", 1);
    const Out w = run(c, d, dt, TDT_LOCATION_GPU, ro);
    setenv("TDT_GPU_JOINT_FWD", "gemm", 1);
    const Out f = run(c, d, dt, TDT_LOCATION_GPU);
    unsetenv("TDT_GPU_JOINT_FWD");
    unsetenv("TDT_GPU_JOINT_BWD");
    const Out g = run(c, d, dt, TDT_LOCATION_GPU, ro), u = run(c, d, dt, TDT_LOCATION_GPU);
    for (const Out *o : {&w, &f, &g, &u}) ASSERT_EQ(o->st, TDT_STATUS_SUCCESS) << o->err;
    expect_close(w.costs, g.costs, t, "costs, chip layout with skip_below");
    expect_close(w.enc_g, g.enc_g, t, "enc_grad, chip layout with skip_below");
    expect_close(w.W_g, g.W_g, t, "weight_grad, chip layout with skip_below");
    expect_close(f.costs, u.costs, t, "costs, the cuBLASLt forward in the chip layout");
    expect_close(f.enc_g, u.enc_g, t, "enc_grad, the chip backward after the cuBLASLt forward");
    expect_close(f.W_g, u.W_g, t, "weight_grad, the chip backward after the cuBLASLt forward");
    expect_close(f.bias_g, u.bias_g, t, "bias_grad, the chip backward after the cuBLASLt forward");
    setenv("TDT_GPU_JOINT", "tiles", 1);
    setenv("TDT_GPU_JOINT_BWD", "chip", 1);
    const Out l = run(c, d, dt, TDT_LOCATION_GPU);
    ASSERT_EQ(l.st, TDT_STATUS_SUCCESS) << l.err;
    expect_close(l.costs, u.costs, t, "costs, the tiles in the chip layout's bytes");
    expect_close(l.enc_g, u.enc_g, t, "enc_grad, the tiles in the chip layout's bytes");
    expect_close(l.W_g, u.W_g, t, "weight_grad, the tiles in the chip layout's bytes");
}

TEST(GpuJoint, WgmmaForwardVariableRefused) {
    REQUIRE_GPU();
    EnvGuard sched("TDT_GPU_JOINT"), fwd("TDT_GPU_JOINT_FWD");
    setenv("TDT_GPU_JOINT", "gemm", 1);
    const Case c = wgmma_cases()[0];
    const Data d = make_data(c, TDT_DTYPE_BFLOAT16);
    setenv("TDT_GPU_JOINT_FWD", "tensor", 1);
    const Out bad = run(c, d, TDT_DTYPE_BFLOAT16, TDT_LOCATION_GPU);
    EXPECT_EQ(bad.st, TDT_STATUS_INVALID_OPTION) << bad.err;
    EXPECT_NE(bad.err.find("TDT_GPU_JOINT_FWD"), std::string::npos) << bad.err;
}

TEST(GpuJoint, DeterministicAcrossRuns) {
    REQUIRE_GPU();
    Case c;
    c.name = "determinism";
    c.B = 4, c.maxT = 9, c.maxU = 5, c.V = 70, c.H = 96;
    c.ragged = true;
    c.dropout = 0.1;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16, TDT_DTYPE_FLOAT64}) {
        const Data d = make_data(c, dt);
        const Out a = run(c, d, dt, TDT_LOCATION_GPU), b = run(c, d, dt, TDT_LOCATION_GPU);
        ASSERT_EQ(a.st, TDT_STATUS_SUCCESS) << a.err;
        ASSERT_EQ(b.st, TDT_STATUS_SUCCESS) << b.err;
        EXPECT_EQ(a.raw, b.raw) << "two runs, " << tdt_test::dtype_name(dt);
    }
}

}  // namespace
