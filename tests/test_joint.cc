// test_joint.cc - the fused joint + loss (tdt_joint_*) against the unfused path.
//
// The reference is written here, independently of the library's joint: the joint in plain
// float64 loops (x = enc + pred, act, the dropout mask of tdt_joint_dropout_mask applied
// explicitly, z = W h + bias) into a logits tensor, then compute_tdt_loss() (or tdt_forward()
// and tdt_backward() with an upstream gradient) on it for the costs and the logits' gradient,
// then the chain rule by hand: d h = dz W, d W = dz^T h, d bias = sum dz, and d h times act'
// and the mask summed over u into d enc and over t into d pred.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tdt.h"
#include "test_util.h"

namespace {

using tdt_test::dtype_size;
using tdt_test::load;
using tdt_test::quantize;
using tdt_test::store;

struct JointCase {
    int64_t B = 2, T = 5, U = 3, V = 7, H = 9;
    std::vector<int> durations{0, 1, 2};  // empty: RNN-T
    int blank = 0;
    tdt_activation_t act = TDT_ACTIVATION_RELU;
    double dropout = 0.0;
    uint64_t seed = 0x1234, offset = 77;
    double sigma = 0.0, fastemit = 0.0, clamp = 0.0;
    bool bias = true;
    std::vector<int32_t> Ts, Us;  // empty: random (sample 0 full)
    uint64_t data_seed = 1;
    int64_t weight_pad = 0;       // weight_stride = H + weight_pad
    bool enc_broadcast = false;   // enc's batch stride 0 (one row set for every sample)

    int D() const { return static_cast<int>(durations.size()); }
    int64_t O() const { return V + D(); }
    int64_t R() const { return U + 1; }
};

struct JointData {
    std::vector<double> enc, pred, W, bias;  // (B, T, H), (B, U + 1, H), (O, H), (O)
    std::vector<int32_t> labels, Ts, Us;
};

JointData make_data(const JointCase &jc) {
    JointData d;
    std::mt19937_64 rng(jc.data_seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    d.enc.resize(jc.B * jc.T * jc.H);
    d.pred.resize(jc.B * jc.R() * jc.H);
    d.W.resize(jc.O() * jc.H);
    d.bias.resize(jc.O());
    for (auto &x : d.enc) x = normal(rng);
    if (jc.enc_broadcast)
        for (int64_t i = jc.T * jc.H; i < (int64_t)d.enc.size(); ++i) d.enc[i] = d.enc[i % (jc.T * jc.H)];
    for (auto &x : d.pred) x = normal(rng);
    const double ws = 1.0 / std::sqrt((double)jc.H);
    for (auto &x : d.W) x = 2.0 * ws * normal(rng);
    for (auto &x : d.bias) x = jc.bias ? 0.5 * normal(rng) : 0.0;
    d.Ts = jc.Ts;
    d.Us = jc.Us;
    for (int64_t b = (int64_t)d.Ts.size(); b < jc.B; ++b)
        d.Ts.push_back(b == 0 ? (int32_t)jc.T : (int32_t)std::uniform_int_distribution<int64_t>(1, jc.T)(rng));
    for (int64_t b = (int64_t)d.Us.size(); b < jc.B; ++b)
        d.Us.push_back(b == 0 || jc.V < 2 ? (int32_t)(jc.V < 2 ? 0 : jc.U)
                                          : (int32_t)std::uniform_int_distribution<int64_t>(0, jc.U)(rng));
    d.labels.resize(jc.B * jc.U);
    for (auto &y : d.labels) {
        int32_t v = jc.V > 1 ? (int32_t)std::uniform_int_distribution<int64_t>(0, jc.V - 2)(rng) : 0;
        y = v >= jc.blank ? v + 1 : v;
        if (jc.V < 2) y = 0;
    }
    return d;
}

// Rounds every input to what dtype holds, so the reference sees the library's inputs.
void quantize_data(JointData &d, tdt_dtype_t dt) {
    for (auto *v : {&d.enc, &d.pred, &d.W, &d.bias})
        for (auto &x : *v) x = quantize(x, dt);
}

struct JointOut {
    tdt_status_t status = TDT_STATUS_SUCCESS;
    std::string error;
    std::vector<double> costs, denc, dpred, dW, dbias;
    double reduced = 0.0;
};

struct JointRun {
    tdt_dtype_t dtype = TDT_DTYPE_FLOAT64;
    int num_threads = 0;
    bool two_phase = false;
    const std::vector<double> *grad_costs = nullptr;
    bool grad_costs_scalar = false, normalize_costs = false, batch_mean = false;
    tdt_reduction_t reduction = TDT_REDUCTION_NONE;
    bool want_enc = true, want_pred = true, want_W = true, want_bias = true;
    double skip_below = 0.0;  // tdt_joint_gradients_t.skip_below
};

tdt_options_t options_of(const JointCase &jc, const JointRun &r) {
    tdt_options_t o{};
    o.num_threads = r.num_threads;
    o.blank = jc.blank;
    o.durations = jc.durations.empty() ? nullptr : jc.durations.data();
    o.num_durations = jc.D();
    o.sigma = jc.sigma;
    o.fastemit_lambda = jc.fastemit;
    o.clamp = jc.clamp;
    o.grad_costs_scalar = r.grad_costs_scalar;
    o.normalize_costs = r.normalize_costs;
    o.batch_mean = r.batch_mean;
    o.reduction = r.reduction;
    return o;
}

// The upstream gradients in the accumulate type of dt.
std::vector<unsigned char> acc_buffer(const std::vector<double> &v, tdt_dtype_t dt) {
    const bool dbl = dt == TDT_DTYPE_FLOAT64;
    std::vector<unsigned char> out(v.size() * (dbl ? 8 : 4));
    for (size_t i = 0; i < v.size(); ++i) {
        if (dbl) {
            std::memcpy(out.data() + 8 * i, &v[i], 8);
        } else {
            float f = (float)v[i];
            std::memcpy(out.data() + 4 * i, &f, 4);
        }
    }
    return out;
}

double acc_at(const std::vector<unsigned char> &buf, size_t i, tdt_dtype_t dt) {
    if (dt == TDT_DTYPE_FLOAT64) {
        double x;
        std::memcpy(&x, buf.data() + 8 * i, 8);
        return x;
    }
    float f;
    std::memcpy(&f, buf.data() + 4 * i, 4);
    return f;
}

std::vector<unsigned char> to_dtype(const std::vector<double> &v, tdt_dtype_t dt, size_t pad_elems = 0) {
    std::vector<unsigned char> out((v.size() + pad_elems) * dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) store(out.data(), (int64_t)i, v[i], dt);
    return out;
}

std::vector<double> from_dtype(const std::vector<unsigned char> &buf, size_t n, tdt_dtype_t dt) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = load(buf.data(), (int64_t)i, dt);
    return v;
}

// The fused path: the library's joint calls.
JointOut run_fused(const JointCase &jc, const JointData &d, const JointRun &r) {
    const tdt_dtype_t dt = r.dtype;
    const int64_t H = jc.H, O = jc.O(), ldw = H + jc.weight_pad;
    std::vector<double> Wpad(O * ldw, 0.0);
    for (int64_t o = 0; o < O; ++o)
        for (int64_t k = 0; k < H; ++k) Wpad[o * ldw + k] = d.W[o * H + k];
    auto enc = to_dtype(d.enc, dt), pred = to_dtype(d.pred, dt), W = to_dtype(Wpad, dt),
         bias = to_dtype(d.bias, dt);
    tdt_joint_problem_t p{};
    p.batch = jc.B;
    p.max_frames = jc.T;
    p.max_labels = jc.U;
    p.vocab_size = jc.V;
    p.hidden = H;
    p.num_outputs = O;
    p.dtype = dt;
    p.enc = enc.data();
    p.enc_strides[0] = jc.enc_broadcast ? 0 : jc.T * H;
    p.enc_strides[1] = H;
    p.pred = pred.data();
    p.pred_strides[0] = jc.R() * H;
    p.pred_strides[1] = H;
    p.weight = W.data();
    p.weight_stride = ldw;
    p.bias = jc.bias ? bias.data() : nullptr;
    p.activation = jc.act;
    p.dropout = jc.dropout;
    p.dropout_seed = jc.seed;
    p.dropout_offset = jc.offset;
    p.labels = d.labels.data();
    p.frame_lengths = d.Ts.data();
    p.label_lengths = d.Us.data();
    tdt_options_t o = options_of(jc, r);
    const bool dbl = dt == TDT_DTYPE_FLOAT64;
    std::vector<unsigned char> costs(jc.B * (dbl ? 8 : 4)), reduced(8);
    if (r.reduction != TDT_REDUCTION_NONE) o.reduced_cost = reduced.data();
    std::vector<unsigned char> genc(d.enc.size() * dtype_size(dt)), gpred(d.pred.size() * dtype_size(dt)),
        gW(Wpad.size() * dtype_size(dt)), gbias(O * dtype_size(dt));
    tdt_joint_gradients_t g{};
    if (r.want_enc) g.enc_grad = genc.data();
    g.enc_strides[0] = jc.T * H;
    g.enc_strides[1] = H;
    if (r.want_pred) g.pred_grad = gpred.data();
    g.pred_strides[0] = jc.R() * H;
    g.pred_strides[1] = H;
    if (r.want_W) g.weight_grad = gW.data();
    g.weight_stride = ldw;
    if (r.want_bias) g.bias_grad = gbias.data();
    g.skip_below = r.skip_below;
    size_t bytes = 0;
    JointOut out;
    out.status = tdt_joint_get_workspace_size(&p, &o, &bytes);
    if (out.status != TDT_STATUS_SUCCESS) {
        out.error = tdt_last_error();
        return out;
    }
    std::vector<unsigned char> ws(bytes);
    if (!r.two_phase) {
        out.status = tdt_joint_loss(&p, &o, costs.data(), &g, ws.data(), bytes);
    } else {
        out.status = tdt_joint_forward(&p, &o, costs.data(), ws.data(), bytes);
        if (out.status == TDT_STATUS_SUCCESS) {
            std::vector<unsigned char> gc;
            if (r.grad_costs) gc = acc_buffer(*r.grad_costs, dt);
            out.status = tdt_joint_backward(&p, &o, r.grad_costs ? gc.data() : nullptr, &g, ws.data(), bytes);
        }
    }
    out.error = tdt_last_error();
    if (out.status != TDT_STATUS_SUCCESS) return out;
    for (int64_t b = 0; b < jc.B; ++b) out.costs.push_back(acc_at(costs, b, dt));
    out.reduced = acc_at(reduced, 0, dt);
    if (r.want_enc) out.denc = from_dtype(genc, d.enc.size(), dt);
    if (r.want_pred) out.dpred = from_dtype(gpred, d.pred.size(), dt);
    if (r.want_W) {
        auto full = from_dtype(gW, Wpad.size(), dt);
        for (int64_t o2 = 0; o2 < O; ++o2)
            for (int64_t k = 0; k < H; ++k) out.dW.push_back(full[o2 * ldw + k]);
    }
    if (r.want_bias) out.dbias = from_dtype(gbias, O, dt);
    return out;
}

double act(double x, tdt_activation_t a) {
    switch (a) {
    case TDT_ACTIVATION_RELU: return x > 0 ? x : 0;
    case TDT_ACTIVATION_TANH: return std::tanh(x);
    case TDT_ACTIVATION_SIGMOID: return 1.0 / (1.0 + std::exp(-x));
    default: return x;
    }
}

double dact(double x, tdt_activation_t a) {
    switch (a) {
    case TDT_ACTIVATION_RELU: return x > 0 ? 1 : 0;
    case TDT_ACTIVATION_TANH: return 1 - std::tanh(x) * std::tanh(x);
    case TDT_ACTIVATION_SIGMOID: {
        const double s = 1.0 / (1.0 + std::exp(-x));
        return s * (1 - s);
    }
    default: return 1;
    }
}

// The unfused path: the joint here, the loss by compute_tdt_loss() (or the pair) on logits of
// loss_dtype (rounded from float64), the chain rule here in float64.
JointOut run_unfused(const JointCase &jc, const JointData &d, const JointRun &r,
                     tdt_dtype_t loss_dtype = TDT_DTYPE_FLOAT64) {
    const int64_t B = jc.B, T = jc.T, R = jc.R(), H = jc.H, O = jc.O(), V = jc.V, D = jc.D();
    const int64_t N = B * T * R;
    std::vector<double> h(N * H), m(N * H, 1.0), z(N * O);
    std::vector<uint8_t> keep(H);
    const double ks = 1.0 / (1.0 - jc.dropout);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u < R; ++u) {
                const int64_t n = (b * T + t) * R + u;
                if (jc.dropout > 0) {
                    EXPECT_EQ(tdt_joint_dropout_mask(jc.dropout, jc.seed, jc.offset + (uint64_t)(n * H), H, keep.data()),
                              TDT_STATUS_SUCCESS);
                    for (int64_t k = 0; k < H; ++k) m[n * H + k] = keep[k] ? ks : 0.0;
                }
                for (int64_t k = 0; k < H; ++k) {
                    const double x = d.enc[(b * T + t) * H + k] + d.pred[(b * R + u) * H + k];
                    h[n * H + k] = act(x, jc.act) * m[n * H + k];
                }
                for (int64_t o = 0; o < O; ++o) {
                    double s = d.bias[o];
                    for (int64_t k = 0; k < H; ++k) s += d.W[o * H + k] * h[n * H + k];
                    z[n * O + o] = s;
                }
            }
    const tdt_dtype_t dt = loss_dtype;
    auto zb = to_dtype(z, dt);
    std::vector<unsigned char> gz(zb.size());
    tdt_problem_t p{};
    p.batch = B;
    p.max_frames = T;
    p.max_labels = jc.U;
    p.vocab_size = V;
    p.dtype = dt;
    p.token_logits = zb.data();
    const int64_t st[3] = {T * R * O, R * O, O};
    std::copy(st, st + 3, p.token_strides);
    p.duration_logits = D > 0 ? zb.data() + V * dtype_size(dt) : nullptr;
    std::copy(st, st + 3, p.duration_strides);
    p.labels = d.labels.data();
    p.frame_lengths = d.Ts.data();
    p.label_lengths = d.Us.data();
    tdt_gradients_t g{};
    g.token_grads = gz.data();
    std::copy(st, st + 3, g.token_strides);
    g.duration_grads = D > 0 ? gz.data() + V * dtype_size(dt) : nullptr;
    std::copy(st, st + 3, g.duration_strides);
    JointRun rr = r;
    rr.dtype = dt;
    tdt_options_t o = options_of(jc, rr);
    const bool dbl = dt == TDT_DTYPE_FLOAT64;
    std::vector<unsigned char> costs(B * (dbl ? 8 : 4)), reduced(8);
    if (r.reduction != TDT_REDUCTION_NONE) o.reduced_cost = reduced.data();
    size_t bytes = 0;
    JointOut out;
    EXPECT_EQ(tdt_get_workspace_size(&p, &o, &bytes), TDT_STATUS_SUCCESS);
    std::vector<unsigned char> ws(bytes);
    if (!r.two_phase) {
        out.status = compute_tdt_loss(&p, &o, costs.data(), &g, ws.data(), bytes);
    } else {
        out.status = tdt_forward(&p, &o, costs.data(), ws.data(), bytes);
        std::vector<unsigned char> gc;
        if (r.grad_costs) gc = acc_buffer(*r.grad_costs, dt);
        if (out.status == TDT_STATUS_SUCCESS)
            out.status = tdt_backward(&p, &o, r.grad_costs ? gc.data() : nullptr, &g, ws.data(), bytes);
    }
    EXPECT_EQ(out.status, TDT_STATUS_SUCCESS) << tdt_last_error();
    for (int64_t b = 0; b < B; ++b) out.costs.push_back(acc_at(costs, b, dt));
    out.reduced = acc_at(reduced, 0, dt);
    const std::vector<double> dz = from_dtype(gz, N * O, dt);
    out.denc.assign(B * T * H, 0.0);
    out.dpred.assign(B * R * H, 0.0);
    out.dW.assign(O * H, 0.0);
    out.dbias.assign(O, 0.0);
    std::vector<double> dh(H);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t u = 0; u < R; ++u) {
                const int64_t n = (b * T + t) * R + u;
                std::fill(dh.begin(), dh.end(), 0.0);
                for (int64_t o = 0; o < O; ++o) {
                    const double e = dz[n * O + o];
                    out.dbias[o] += e;
                    for (int64_t k = 0; k < H; ++k) {
                        dh[k] += e * d.W[o * H + k];
                        out.dW[o * H + k] += e * h[n * H + k];
                    }
                }
                for (int64_t k = 0; k < H; ++k) {
                    const double x = d.enc[(b * T + t) * H + k] + d.pred[(b * R + u) * H + k];
                    const double gk = dh[k] * dact(x, jc.act) * m[n * H + k];
                    out.denc[(b * T + t) * H + k] += gk;
                    out.dpred[(b * R + u) * H + k] += gk;
                }
            }
    return out;
}

// Largest |a - b| / (1 + |b|) over a vector, and where.
struct Diff {
    double rel = 0.0;
    size_t at = 0;
};
Diff max_rel(const std::vector<double> &a, const std::vector<double> &b) {
    Diff d;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        const double e = std::fabs(a[i] - b[i]) / (1.0 + std::fabs(b[i]));
        if (!(e <= d.rel)) {  // NaN counts as the largest
            d.rel = std::isnan(e) ? INFINITY : e;
            d.at = i;
        }
    }
    return d;
}

// Finite values compare by relative error; +inf costs must match exactly.
void expect_close(const char *what, const std::vector<double> &got, const std::vector<double> &want, double tol) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::isinf(want[i]) || std::isinf(got[i])) {
            EXPECT_EQ(got[i], want[i]) << what << "[" << i << "]";
            continue;
        }
        const double e = std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i]));
        EXPECT_LE(e, tol) << what << "[" << i << "] = " << got[i] << ", unfused " << want[i];
        if (!(e <= tol)) return;  // one message a tensor
    }
}

void expect_match(const JointOut &f, const JointOut &u, double tol) {
    ASSERT_EQ(f.status, TDT_STATUS_SUCCESS) << f.error;
    expect_close("costs", f.costs, u.costs, tol);
    if (!f.denc.empty()) expect_close("d enc", f.denc, u.denc, tol);
    if (!f.dpred.empty()) expect_close("d pred", f.dpred, u.dpred, tol);
    if (!f.dW.empty()) expect_close("d W", f.dW, u.dW, tol);
    if (!f.dbias.empty()) expect_close("d bias", f.dbias, u.dbias, tol);
}

void check_f64(const JointCase &jc, JointRun r = JointRun()) {
    JointData d = make_data(jc);
    r.dtype = TDT_DTYPE_FLOAT64;
    const JointOut f = run_fused(jc, d, r);
    const JointOut u = run_unfused(jc, d, r);
    expect_match(f, u, 1e-9);
    if (r.reduction != TDT_REDUCTION_NONE) {
        EXPECT_NEAR(f.reduced, u.reduced, 1e-9 * (1 + std::fabs(u.reduced)));
    }
}

// ---- float64 against the unfused path ---------------------------------------------------------

class JointActivation : public ::testing::TestWithParam<std::tuple<tdt_activation_t, bool, double>> {};

TEST_P(JointActivation, Float64MatchesUnfused) {
    JointCase jc;
    jc.act = std::get<0>(GetParam());
    if (!std::get<1>(GetParam())) jc.durations.clear();  // RNN-T
    jc.dropout = std::get<2>(GetParam());
    jc.B = 3;
    jc.T = 6;
    jc.U = 4;
    jc.H = 21;
    check_f64(jc);
}

INSTANTIATE_TEST_SUITE_P(All, JointActivation,
                         ::testing::Combine(::testing::Values(TDT_ACTIVATION_RELU, TDT_ACTIVATION_TANH,
                                                              TDT_ACTIVATION_SIGMOID, TDT_ACTIVATION_IDENTITY),
                                            ::testing::Bool(), ::testing::Values(0.0, 0.3)));

TEST(Joint, RaggedBlankLastDurationsWithoutZeroOrOne) {
    JointCase jc;
    jc.B = 4;
    jc.T = 9;
    jc.U = 5;
    jc.V = 11;
    jc.blank = 10;
    jc.durations = {3, 2, 5};
    jc.Ts = {9, 7, 4, 8};
    jc.Us = {5, 2, 0, 3};
    jc.data_seed = 5;
    check_f64(jc);
}

TEST(Joint, InfeasibleSamplesGetInfAndNoGradient) {
    JointCase jc;
    jc.B = 3;
    jc.T = 5;
    jc.U = 2;
    jc.durations = {2, 4};  // every arc advances an even number of frames: T odd is infeasible
    jc.Ts = {5, 0, 4};      // infeasible (odd), infeasible (no frame), feasible
    jc.Us = {2, 1, 1};
    JointData d = make_data(jc);
    JointRun r;
    const JointOut f = run_fused(jc, d, r), u = run_unfused(jc, d, r);
    ASSERT_EQ(f.status, TDT_STATUS_SUCCESS) << f.error;
    EXPECT_EQ(f.costs[0], INFINITY);
    EXPECT_EQ(f.costs[1], INFINITY);
    EXPECT_TRUE(std::isfinite(f.costs[2])) << f.costs[2];
    for (int64_t k = 0; k < jc.T * jc.H; ++k) EXPECT_EQ(f.denc[k], 0.0) << "d enc of infeasible sample 0, " << k;
    expect_match(f, u, 1e-9);
}

TEST(Joint, HiddenSizesOffEveryTile) {
    for (int64_t H : {1, 7, 33, 70}) {
        JointCase jc;
        jc.H = H;
        jc.B = 2;
        jc.T = 7;
        jc.U = 6;  // 56 nodes: two tiles, one partial
        SCOPED_TRACE("H = " + std::to_string(H));
        check_f64(jc);
    }
}

TEST(Joint, OutputsFromOneTo8198) {
    struct S {
        int64_t V;
        std::vector<int> durs;
    };
    for (const S &s : {S{1, {}}, S{2, {1}}, S{3, {0, 1, 2, 3, 4}}, S{40, {}}, S{67, {1, 2}}, S{8193, {0, 1, 2, 3, 4}}}) {
        JointCase jc;
        jc.V = s.V;
        jc.durations = s.durs;
        jc.H = 5;
        jc.B = 2;
        jc.T = 3;
        jc.U = s.V > 1 ? 2 : 0;
        SCOPED_TRACE("V + D = " + std::to_string(jc.O()));
        check_f64(jc);
    }
}

TEST(Joint, OptionsSigmaFastEmitClampReductions) {
    JointCase jc;
    jc.sigma = 0.05;
    jc.fastemit = 0.01;
    jc.clamp = 0.3;
    jc.blank = 3;
    jc.Us = {3, 1};  // normalize_costs divides by U_b
    for (tdt_reduction_t red : {TDT_REDUCTION_SUM, TDT_REDUCTION_MEAN}) {
        JointRun r;
        r.reduction = red;
        r.normalize_costs = true;
        r.batch_mean = true;
        check_f64(jc, r);
    }
}

TEST(Joint, UpstreamGradientsPerSampleAndScalar) {
    JointCase jc;
    jc.B = 3;
    std::vector<double> gc{0.5, -2.0, 3.0}, one{1.5};
    JointRun r;
    r.two_phase = true;
    r.grad_costs = &gc;
    check_f64(jc, r);
    r.grad_costs = &one;
    r.grad_costs_scalar = true;
    check_f64(jc, r);
}

TEST(Joint, StridedInputsAndSomeGradientsOnly) {
    JointCase jc;
    jc.weight_pad = 3;
    jc.enc_broadcast = true;
    jc.bias = false;
    JointRun r;
    check_f64(jc, r);
    r.want_enc = false;
    r.want_W = false;
    check_f64(jc, r);
    r.want_enc = true;
    r.want_pred = false;
    r.want_bias = false;
    r.want_W = true;
    check_f64(jc, r);
}

// ---- narrow dtypes: within the unfused path's own error -----------------------------------------

double max_abs_err(const std::vector<double> &a, const std::vector<double> &b) {
    double e = 0.0;
    for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
    return e;
}

TEST(Joint, NarrowDtypesWithinTheUnfusedError) {
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_BFLOAT16, TDT_DTYPE_FLOAT16}) {
        JointCase jc;
        jc.B = 3;
        jc.T = 8;
        jc.U = 5;
        jc.V = 29;
        jc.H = 40;
        JointData d = make_data(jc);
        quantize_data(d, dt);
        JointRun r;
        const JointOut ref = run_unfused(jc, d, r);  // float64 on the rounded inputs
        const JointOut un = run_unfused(jc, d, r, dt);
        r.dtype = dt;
        const JointOut f = run_fused(jc, d, r);
        ASSERT_EQ(f.status, TDT_STATUS_SUCCESS) << f.error;
        const char *names[5] = {"costs", "d enc", "d pred", "d W", "d bias"};
        const std::vector<double> *fv[5] = {&f.costs, &f.denc, &f.dpred, &f.dW, &f.dbias};
        const std::vector<double> *uv[5] = {&un.costs, &un.denc, &un.dpred, &un.dW, &un.dbias};
        const std::vector<double> *rv[5] = {&ref.costs, &ref.denc, &ref.dpred, &ref.dW, &ref.dbias};
        for (int i = 0; i < 5; ++i) {
            const double ef = max_abs_err(*fv[i], *rv[i]), eu = max_abs_err(*uv[i], *rv[i]);
            // the fused path rounds its gradients to the dtype once, the unfused one its logits,
            // their gradients and then the products: within twice the unfused error (plus one
            // rounding step of the largest value, for an unfused error of exactly 0)
            double scale = 0.0;
            for (double v : *rv[i]) scale = std::max(scale, std::fabs(v));
            const double ulp = dt == TDT_DTYPE_FLOAT32 ? 0x1p-23 : dt == TDT_DTYPE_BFLOAT16 ? 0x1p-7 : 0x1p-10;
            EXPECT_LE(ef, 2.0 * eu + ulp * scale)
                << tdt_test::dtype_name(dt) << " " << names[i] << ": fused error " << ef << ", unfused " << eu;
        }
    }
}

// ---- determinism ----------------------------------------------------------------------------------

TEST(Joint, SameBitsForAnyThreadCountAndForThePair) {
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64, TDT_DTYPE_BFLOAT16}) {
        JointCase jc;
        jc.B = 5;
        jc.T = 11;
        jc.U = 7;
        jc.V = 45;
        jc.H = 37;
        jc.dropout = 0.2;
        jc.act = TDT_ACTIVATION_TANH;
        JointData d = make_data(jc);
        quantize_data(d, dt);
        JointRun r;
        r.dtype = dt;
        r.num_threads = 1;
        const JointOut one = run_fused(jc, d, r);
        ASSERT_EQ(one.status, TDT_STATUS_SUCCESS) << one.error;
        for (int threads : {2, 3, 7}) {
            r.num_threads = threads;
            r.two_phase = threads == 3;
            const JointOut k = run_fused(jc, d, r);
            ASSERT_EQ(k.status, TDT_STATUS_SUCCESS) << k.error;
            const std::vector<double> *a[5] = {&one.costs, &one.denc, &one.dpred, &one.dW, &one.dbias};
            const std::vector<double> *b[5] = {&k.costs, &k.denc, &k.dpred, &k.dW, &k.dbias};
            for (int i = 0; i < 5; ++i) {
                ASSERT_EQ(a[i]->size(), b[i]->size());
                const Diff df = max_rel(*b[i], *a[i]);
                EXPECT_TRUE(std::memcmp(a[i]->data(), b[i]->data(), a[i]->size() * sizeof(double)) == 0)
                    << tdt_test::dtype_name(dt) << " tensor " << i << " differs at " << threads
                    << " threads from 1 thread: element " << df.at << " by " << df.rel;
            }
        }
    }
}

// ---- the approximate backward (tdt_joint_gradients_t.skip_below) -----------------------------------

// A peaked problem (W four times larger: one alignment takes most of the probability, as in a
// trained model), float64.
struct Peaked {
    JointCase jc;
    JointData d;
    Peaked() {
        jc.B = 3, jc.T = 16, jc.U = 6, jc.V = 30, jc.H = 24;
        jc.Ts = {16, 13, 16};
        jc.Us = {6, 4, 0};
        d = make_data(jc);
        for (auto &w : d.W) w *= 4.0;
    }
};

TEST(JointSkip, EachGradientMovesWithinItsBound) {
    // Every element of a left-out node's logits' gradient is below eps, so d enc[b, t, k] moves
    // by at most eps sum_u sum_o |W[o, k]| (relu: act' <= 1, no dropout), d pred[b, u, k] by eps
    // sum_t sum_o |W[o, k]|, d W[o, k] by eps sum_n |h[n, k]|, d bias by eps times the nodes.
    // The costs are the forward's: the same bits.
    const Peaked pk;
    const JointCase &jc = pk.jc;
    const JointData &d = pk.d;
    JointRun exact_run;
    const JointOut exact = run_fused(jc, d, exact_run);
    ASSERT_EQ(exact.status, TDT_STATUS_SUCCESS) << exact.error;
    const double eps = 1e-3;
    JointRun r;
    r.skip_below = eps;
    const JointOut got = run_fused(jc, d, r);
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
    EXPECT_EQ(got.costs, exact.costs);
    const int64_t H = jc.H, O = jc.O(), R = jc.R();
    std::vector<double> wcol(H, 0.0);  // sum_o |W[o, k]|
    for (int64_t o = 0; o < O; ++o)
        for (int64_t k = 0; k < H; ++k) wcol[k] += std::fabs(d.W[o * H + k]);
    double hmax = 0.0;  // |h| <= |enc + pred| for relu
    for (int64_t b = 0; b < jc.B; ++b)
        for (int64_t t = 0; t < jc.T; ++t)
            for (int64_t u = 0; u < R; ++u)
                for (int64_t k = 0; k < H; ++k)
                    hmax = std::max(hmax, std::fabs(d.enc[(b * jc.T + t) * H + k] + d.pred[(b * R + u) * H + k]));
    const double nodes = (double)(jc.B * jc.T * R);
    size_t moved = 0;
    for (size_t i = 0; i < exact.denc.size(); ++i) {
        const double bound = eps * (double)R * wcol[i % H] * (1 + 1e-9);
        EXPECT_LE(std::fabs(got.denc[i] - exact.denc[i]), bound) << "d enc[" << i << "]";
        moved += got.denc[i] != exact.denc[i];
    }
    for (size_t i = 0; i < exact.dpred.size(); ++i)
        EXPECT_LE(std::fabs(got.dpred[i] - exact.dpred[i]), eps * (double)jc.T * wcol[i % H] * (1 + 1e-9))
            << "d pred[" << i << "]";
    for (size_t i = 0; i < exact.dW.size(); ++i)
        EXPECT_LE(std::fabs(got.dW[i] - exact.dW[i]), eps * nodes * hmax * (1 + 1e-9)) << "d W[" << i << "]";
    for (size_t i = 0; i < exact.dbias.size(); ++i)
        EXPECT_LE(std::fabs(got.dbias[i] - exact.dbias[i]), eps * nodes * (1 + 1e-9)) << "d bias[" << i << "]";
    // something was left out (the check is not of the exact path against itself)
    EXPECT_GT(moved, 0u) << "no node was left out at eps = " << eps;
}

TEST(JointSkip, HugeEpsLeavesEveryNodeOutTinyEpsNone) {
    const Peaked pk;
    JointRun exact_run;
    const JointOut exact = run_fused(pk.jc, pk.d, exact_run);
    ASSERT_EQ(exact.status, TDT_STATUS_SUCCESS) << exact.error;
    JointRun r;
    r.skip_below = 1e300;
    const JointOut none = run_fused(pk.jc, pk.d, r);
    ASSERT_EQ(none.status, TDT_STATUS_SUCCESS) << none.error;
    EXPECT_EQ(none.costs, exact.costs);
    for (const auto *v : {&none.denc, &none.dpred, &none.dW, &none.dbias})
        for (double x : *v) ASSERT_EQ(x, 0.0) << "a gradient with every node left out";
    // eps below every nonzero bound: only nodes whose gradient is exactly zero are left out,
    // and the gradients equal the exact ones
    r.skip_below = 1e-300;
    const JointOut all = run_fused(pk.jc, pk.d, r);
    ASSERT_EQ(all.status, TDT_STATUS_SUCCESS) << all.error;
    EXPECT_EQ(all.denc, exact.denc);
    EXPECT_EQ(all.dpred, exact.dpred);
    EXPECT_EQ(all.dW, exact.dW);
    EXPECT_EQ(all.dbias, exact.dbias);
}

TEST(JointSkip, SameBitsForAnyThreadCountAndForThePair) {
    const Peaked pk;
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT64}) {
        JointData d = pk.d;
        quantize_data(d, dt);
        JointRun r;
        r.dtype = dt;
        r.skip_below = 1e-3;
        r.num_threads = 1;
        const JointOut one = run_fused(pk.jc, d, r);
        ASSERT_EQ(one.status, TDT_STATUS_SUCCESS) << one.error;
        r.num_threads = 3;
        r.two_phase = true;
        const JointOut three = run_fused(pk.jc, d, r);
        ASSERT_EQ(three.status, TDT_STATUS_SUCCESS) << three.error;
        EXPECT_EQ(three.denc, one.denc) << tdt_test::dtype_name(dt);
        EXPECT_EQ(three.dpred, one.dpred) << tdt_test::dtype_name(dt);
        EXPECT_EQ(three.dW, one.dW) << tdt_test::dtype_name(dt);
        EXPECT_EQ(three.dbias, one.dbias) << tdt_test::dtype_name(dt);
    }
}

TEST(JointSkip, BadValuesAreRefused) {
    const Peaked pk;
    for (double bad : {-1e-6, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
        JointRun r;
        r.skip_below = bad;
        const JointOut got = run_fused(pk.jc, pk.d, r);
        EXPECT_EQ(got.status, TDT_STATUS_INVALID_OPTION) << bad;
        EXPECT_NE(got.error.find("grads->skip_below"), std::string::npos) << got.error;
    }
}

// ---- the dropout hash -------------------------------------------------------------------------------

uint64_t splitmix64_next(uint64_t seed, uint64_t n) {  // the n-th output (n >= 1) of SplitMix64
    uint64_t x = seed + n * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

TEST(JointDropout, MaskIsTheDocumentedSplitMix64Rule) {
    const double p = 0.3;
    const uint64_t seed = 42, first = ~0ull - 5;  // wraps around 2^64
    std::vector<uint8_t> keep(100000);
    ASSERT_EQ(tdt_joint_dropout_mask(p, seed, first, (int64_t)keep.size(), keep.data()), TDT_STATUS_SUCCESS);
    const uint64_t thr = (uint64_t)(p * 4294967296.0);
    size_t kept = 0;
    for (size_t j = 0; j < keep.size(); ++j) {
        const uint64_t c = first + j;
        const int want = (splitmix64_next(seed, c + 1) >> 32) >= thr;
        ASSERT_EQ(keep[j], want) << "element " << j;
        kept += keep[j];
    }
    // 100000 draws at 0.7: the standard deviation of the kept fraction is 0.00145
    EXPECT_NEAR((double)kept / keep.size(), 0.7, 0.01);
    ASSERT_EQ(tdt_joint_dropout_mask(0.0, seed, 0, 1000, keep.data()), TDT_STATUS_SUCCESS);
    for (int j = 0; j < 1000; ++j) ASSERT_EQ(keep[j], 1) << "p = 0 dropped element " << j;
}

TEST(JointDropout, BadArgumentsAreRefused) {
    uint8_t keep[4] = {9, 9, 9, 9};
    EXPECT_EQ(tdt_joint_dropout_mask(1.0, 0, 0, 4, keep), TDT_STATUS_INVALID_OPTION);
    EXPECT_EQ(tdt_joint_dropout_mask(-0.1, 0, 0, 4, keep), TDT_STATUS_INVALID_OPTION);
    EXPECT_EQ(tdt_joint_dropout_mask(NAN, 0, 0, 4, keep), TDT_STATUS_INVALID_OPTION);
    EXPECT_EQ(tdt_joint_dropout_mask(0.5, 0, 0, -1, keep), TDT_STATUS_INVALID_SIZE);
    EXPECT_EQ(tdt_joint_dropout_mask(0.5, 0, 0, 4, nullptr), TDT_STATUS_NULL_POINTER);
    for (uint8_t k : keep) EXPECT_EQ(k, 9);
}

}  // namespace

namespace {

// ---- bad inputs: a clear status, nothing written ------------------------------------------------

struct BadCall {
    JointCase jc;
    JointData d;
    std::vector<double> enc, pred, W, bias;
    tdt_joint_problem_t p{};
    tdt_options_t o{};
    tdt_joint_gradients_t g{};
    std::vector<double> costs, genc, gpred, gW, gbias;
    std::vector<unsigned char> ws;
    size_t bytes = 0;

    explicit BadCall(int64_t B = 2, int64_t T = 4, int64_t U = 2) {
        jc.B = B;
        jc.T = T;
        jc.U = U;
        jc.V = 5;
        jc.H = 6;
        d = make_data(jc);
        p.batch = jc.B;
        p.max_frames = jc.T;
        p.max_labels = jc.U;
        p.vocab_size = jc.V;
        p.hidden = jc.H;
        p.num_outputs = jc.O();
        p.dtype = TDT_DTYPE_FLOAT64;
        p.enc = d.enc.data();
        p.enc_strides[0] = jc.T * jc.H;
        p.enc_strides[1] = jc.H;
        p.pred = d.pred.data();
        p.pred_strides[0] = jc.R() * jc.H;
        p.pred_strides[1] = jc.H;
        p.weight = d.W.data();
        p.weight_stride = jc.H;
        p.bias = d.bias.data();
        p.labels = d.labels.data();
        p.frame_lengths = d.Ts.data();
        p.label_lengths = d.Us.data();
        o.durations = jc.durations.data();
        o.num_durations = jc.D();
        costs.assign(jc.B, -7.0);
        genc.assign(d.enc.size(), -7.0);
        gpred.assign(d.pred.size(), -7.0);
        gW.assign(d.W.size(), -7.0);
        gbias.assign(d.bias.size(), -7.0);
        g.enc_grad = genc.data();
        std::copy(p.enc_strides, p.enc_strides + 2, g.enc_strides);
        g.pred_grad = gpred.data();
        std::copy(p.pred_strides, p.pred_strides + 2, g.pred_strides);
        g.weight_grad = gW.data();
        g.weight_stride = jc.H;
        g.bias_grad = gbias.data();
        EXPECT_EQ(tdt_joint_get_workspace_size(&p, &o, &bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
        ws.assign(bytes, 0);
    }
    tdt_status_t call() { return tdt_joint_loss(&p, &o, costs.data(), &g, ws.data(), bytes); }
    bool untouched() const {
        for (const auto *v : {&costs, &genc, &gpred, &gW, &gbias})
            for (double x : *v)
                if (x != -7.0) return false;
        return true;
    }
};

struct BadCase {
    const char *name;
    tdt_status_t want;
    void (*spoil)(BadCall &);
};

const int kBadDurations[3] = {1, 1, 2};

const BadCase kBad[] = {
    {"batch < 0", TDT_STATUS_INVALID_SIZE, [](BadCall &c) { c.p.batch = -1; }},
    {"hidden 0", TDT_STATUS_INVALID_SIZE, [](BadCall &c) { c.p.hidden = 0; }},
    {"num_outputs neither V nor V + D", TDT_STATUS_INVALID_SIZE, [](BadCall &c) { c.p.num_outputs += 1; }},
    {"num_outputs below V", TDT_STATUS_INVALID_SIZE, [](BadCall &c) { c.p.num_outputs = c.p.vocab_size - 1; }},
    {"vocab 0", TDT_STATUS_INVALID_SIZE, [](BadCall &c) { c.p.vocab_size = 0; }},
    {"dtype", TDT_STATUS_INVALID_DTYPE, [](BadCall &c) { c.p.dtype = (tdt_dtype_t)9; }},
    {"blank", TDT_STATUS_INVALID_BLANK, [](BadCall &c) { c.o.blank = 5; }},
    {"duplicate durations", TDT_STATUS_INVALID_DURATIONS, [](BadCall &c) { c.o.durations = kBadDurations; }},
    {"durations NULL", TDT_STATUS_NULL_POINTER, [](BadCall &c) { c.o.durations = nullptr; }},
    {"activation", TDT_STATUS_INVALID_OPTION, [](BadCall &c) { c.p.activation = (tdt_activation_t)4; }},
    {"dropout 1", TDT_STATUS_INVALID_OPTION, [](BadCall &c) { c.p.dropout = 1.0; }},
    {"dropout < 0", TDT_STATUS_INVALID_OPTION, [](BadCall &c) { c.p.dropout = -0.5; }},
    {"dropout NaN", TDT_STATUS_INVALID_OPTION, [](BadCall &c) { c.p.dropout = NAN; }},
    {"log-prob inputs", TDT_STATUS_INVALID_OPTION, [](BadCall &c) { c.o.input_kind = TDT_INPUT_LOG_PROBS; }},
    {"state_in_grads", TDT_STATUS_INVALID_OPTION, [](BadCall &c) { c.o.state_in_grads = 1; }},
    {"negative sigma", TDT_STATUS_INVALID_OPTION, [](BadCall &c) { c.o.sigma = -1.0; }},
    {"GPU without CUDA", TDT_STATUS_BACKEND_NOT_BUILT, [](BadCall &c) { c.o.location = TDT_LOCATION_GPU; }},
    {"enc NULL", TDT_STATUS_NULL_POINTER, [](BadCall &c) { c.p.enc = nullptr; }},
    {"pred NULL", TDT_STATUS_NULL_POINTER, [](BadCall &c) { c.p.pred = nullptr; }},
    {"weight NULL", TDT_STATUS_NULL_POINTER, [](BadCall &c) { c.p.weight = nullptr; }},
    {"labels NULL", TDT_STATUS_NULL_POINTER, [](BadCall &c) { c.p.labels = nullptr; }},
    {"frame lengths NULL", TDT_STATUS_NULL_POINTER, [](BadCall &c) { c.p.frame_lengths = nullptr; }},
    {"reduced_cost NULL", TDT_STATUS_NULL_POINTER, [](BadCall &c) { c.o.reduction = TDT_REDUCTION_SUM; }},
    {"negative enc stride", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.p.enc_strides[1] = -1; }},
    {"overflowing pred stride", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.p.pred_strides[0] = INT64_MAX / 2; }},
    {"weight_stride < H", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.p.weight_stride = c.p.hidden - 1; }},
    {"overlapping enc_grad rows", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.g.enc_strides[1] = 2; }},
    {"broadcast pred_grad", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.g.pred_strides[0] = 0; }},
    {"grad weight_stride < H", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.g.weight_stride = 1; }},
    {"gradient over an input", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.g.enc_grad = (void *)c.p.enc; }},
    {"two gradients overlap", TDT_STATUS_INVALID_STRIDES, [](BadCall &c) { c.g.bias_grad = c.g.weight_grad; }},
    {"workspace too small", TDT_STATUS_WORKSPACE_TOO_SMALL, [](BadCall &c) { c.bytes -= 1; }},
    {"frame length too long", TDT_STATUS_INVALID_LENGTH, [](BadCall &c) { c.d.Ts[1] = 5; }},
    {"label equals blank", TDT_STATUS_INVALID_LABEL, [](BadCall &c) { c.d.labels[0] = 0; }},
};

TEST(JointErrors, EveryBadInputGetsItsStatusAndNothingIsWritten) {
    for (const BadCase &bc : kBad) {
        if (bc.want == TDT_STATUS_BACKEND_NOT_BUILT && tdt_backend_built(TDT_LOCATION_GPU)) continue;
        BadCall c;
        bc.spoil(c);
        const tdt_status_t s = c.call();
        EXPECT_EQ(s, bc.want) << bc.name << ": " << tdt_status_string(s) << " (" << tdt_last_error() << ")";
        EXPECT_GT(std::strlen(tdt_last_error()), 0u) << bc.name;
        EXPECT_TRUE(c.untouched()) << bc.name << ": something was written";
    }
}

TEST(JointErrors, NullStructsAndWorkspace) {
    BadCall c;
    EXPECT_EQ(tdt_joint_loss(nullptr, &c.o, c.costs.data(), &c.g, c.ws.data(), c.bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_joint_loss(&c.p, nullptr, c.costs.data(), &c.g, c.ws.data(), c.bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_joint_loss(&c.p, &c.o, nullptr, &c.g, c.ws.data(), c.bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_joint_loss(&c.p, &c.o, c.costs.data(), &c.g, nullptr, c.bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_joint_get_workspace_size(&c.p, &c.o, nullptr), TDT_STATUS_NULL_POINTER);
    EXPECT_TRUE(c.untouched());
    EXPECT_EQ(c.call(), TDT_STATUS_SUCCESS) << tdt_last_error();
    EXPECT_STREQ(tdt_last_error(), "");
}

TEST(JointErrors, BackwardNeedsTheJointForwardsWorkspace) {
    BadCall c;
    // an untouched workspace, then a plain loss forward's, are both refused
    EXPECT_EQ(tdt_joint_backward(&c.p, &c.o, nullptr, &c.g, c.ws.data(), c.bytes), TDT_STATUS_INVALID_WORKSPACE);
    EXPECT_TRUE(c.untouched());
    std::vector<double> z(c.jc.B * c.jc.T * c.jc.R() * c.jc.O(), 0.0), costs(c.jc.B);
    tdt_problem_t lp{};
    lp.batch = c.jc.B;
    lp.max_frames = c.jc.T;
    lp.max_labels = c.jc.U;
    lp.vocab_size = c.jc.V;
    lp.dtype = TDT_DTYPE_FLOAT64;
    lp.token_logits = z.data();
    lp.duration_logits = z.data() + c.jc.V;
    const int64_t st[3] = {c.jc.T * c.jc.R() * c.jc.O(), c.jc.R() * c.jc.O(), c.jc.O()};
    std::copy(st, st + 3, lp.token_strides);
    std::copy(st, st + 3, lp.duration_strides);
    lp.labels = c.d.labels.data();
    lp.frame_lengths = c.d.Ts.data();
    lp.label_lengths = c.d.Us.data();
    size_t lb = 0;
    ASSERT_EQ(tdt_get_workspace_size(&lp, &c.o, &lb), TDT_STATUS_SUCCESS);
    ASSERT_LE(lb, c.bytes);
    ASSERT_EQ(tdt_forward(&lp, &c.o, costs.data(), c.ws.data(), c.bytes), TDT_STATUS_SUCCESS);
    EXPECT_EQ(tdt_joint_backward(&c.p, &c.o, nullptr, &c.g, c.ws.data(), c.bytes), TDT_STATUS_INVALID_WORKSPACE);
    EXPECT_TRUE(c.untouched());
    // and the joint forward's workspace is refused by the plain backward
    ASSERT_EQ(tdt_joint_forward(&c.p, &c.o, c.costs.data(), c.ws.data(), c.bytes), TDT_STATUS_SUCCESS);
    tdt_gradients_t lg{};
    std::vector<double> gz(z.size(), -7.0);
    lg.token_grads = gz.data();
    std::copy(st, st + 3, lg.token_strides);
    EXPECT_EQ(tdt_backward(&lp, &c.o, nullptr, &lg, c.ws.data(), c.bytes), TDT_STATUS_INVALID_WORKSPACE);
    for (double x : gz) ASSERT_EQ(x, -7.0);
}

}  // namespace

namespace {

// The CPU workspace grows with the threads (the slots), and a call that needs more than it was
// given is refused; the size for the call's own options always serves.
TEST(JointWorkspace, SizeFollowsTheThreadsAndIsEnforced) {
    BadCall c(4, 20, 8);  // 720 nodes: 23 tiles, more than 2 slots a thread at 1 thread
    c.o.num_threads = 1;
    size_t one = 0, many = 0;
    ASSERT_EQ(tdt_joint_get_workspace_size(&c.p, &c.o, &one), TDT_STATUS_SUCCESS);
    c.o.num_threads = 16;
    ASSERT_EQ(tdt_joint_get_workspace_size(&c.p, &c.o, &many), TDT_STATUS_SUCCESS);
    EXPECT_GT(many, one);
    std::vector<unsigned char> ws(one);
    EXPECT_EQ(tdt_joint_loss(&c.p, &c.o, c.costs.data(), &c.g, ws.data(), one), TDT_STATUS_WORKSPACE_TOO_SMALL);
    EXPECT_TRUE(c.untouched());
    c.o.num_threads = 1;
    EXPECT_EQ(tdt_joint_loss(&c.p, &c.o, c.costs.data(), &c.g, ws.data(), one), TDT_STATUS_SUCCESS) << tdt_last_error();
    c.o.num_threads = 0;  // omp_get_max_threads(), asked and used alike
    size_t dflt = 0;
    ASSERT_EQ(tdt_joint_get_workspace_size(&c.p, &c.o, &dflt), TDT_STATUS_SUCCESS);
    std::vector<unsigned char> ws0(dflt);
    EXPECT_EQ(tdt_joint_loss(&c.p, &c.o, c.costs.data(), &c.g, ws0.data(), dflt), TDT_STATUS_SUCCESS) << tdt_last_error();
}

}  // namespace
