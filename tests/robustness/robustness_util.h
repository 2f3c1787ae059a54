/*
 * robustness_util.h - one small problem type, one call helper and one reference helper for the
 * robustness tests (CPU). Self-contained on purpose: it uses the public C API only, the
 * fuzzer's independent naive reference (fuzz/naive_ref.c) and its independent half / bfloat16
 * conversions (fuzz/halfconv.h), nothing from src/ or tests/test_util, so that a conversion
 * bug in the library's src/common/dtype.h shows up here as a disagreement.
 *
 * Layout of a Case: dense, row-major float64 token logits (B, T, U + 1, V) and duration logits
 * (B, T, U + 1, D); labels (B, U); lengths (B). run() stores them in the requested dtype,
 * calls the library, and returns costs and gradients as float64 plus their raw bytes (for
 * bitwise comparisons).
 */
#ifndef TDT_TESTS_ROBUSTNESS_UTIL_H
#define TDT_TESTS_ROBUSTNESS_UTIL_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "halfconv.h"
#include "naive_ref.h"
#include "tdt.h"

namespace rob {

inline size_t esize(tdt_dtype_t dt) { return dt == TDT_DTYPE_FLOAT64 ? 8 : dt == TDT_DTYPE_FLOAT32 ? 4 : 2; }
inline size_t acc_size(tdt_dtype_t dt) { return dt == TDT_DTYPE_FLOAT64 ? 8 : 4; }

inline const char *dtype_name(tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return "float64";
    case TDT_DTYPE_FLOAT32: return "float32";
    case TDT_DTYPE_FLOAT16: return "float16";
    default: return "bfloat16";
    }
}

inline void put(void *buf, int64_t i, tdt_dtype_t dt, double x) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: static_cast<double *>(buf)[i] = x; break;
    case TDT_DTYPE_FLOAT32: static_cast<float *>(buf)[i] = static_cast<float>(x); break;
    case TDT_DTYPE_FLOAT16: static_cast<uint16_t *>(buf)[i] = hc_d2h(x); break;
    default: static_cast<uint16_t *>(buf)[i] = hc_d2bf(x); break;
    }
}

inline double get(const void *buf, int64_t i, tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return static_cast<const double *>(buf)[i];
    case TDT_DTYPE_FLOAT32: return static_cast<const float *>(buf)[i];
    case TDT_DTYPE_FLOAT16: return hc_h2d(static_cast<const uint16_t *>(buf)[i]);
    default: return hc_bf2d(static_cast<const uint16_t *>(buf)[i]);
    }
}

// x as the dtype stores it.
inline double quantize(double x, tdt_dtype_t dt) {
    unsigned char b[8];
    put(b, 0, dt, x);
    return get(b, 0, dt);
}

struct Case {
    int64_t B = 1, T = 1, U = 0, V = 2;
    std::vector<int> durs;  // empty: plain RNN-T
    int blank = 0;
    double sigma = 0.0, lambda = 0.0, clamp = 0.0;
    bool log_probs = false;
    int threads = 0;
    std::vector<double> tok, dur;
    std::vector<int32_t> labels, Tl, Ul;

    int64_t D() const { return static_cast<int64_t>(durs.size()); }
    bool tdt() const { return !durs.empty(); }
    int64_t R() const { return U + 1; }
    int64_t node(int64_t b, int64_t t, int64_t u) const { return (b * T + t) * R() + u; }
    double &z(int64_t b, int64_t t, int64_t u, int64_t v) { return tok[node(b, t, u) * V + v]; }
    double &h(int64_t b, int64_t t, int64_t u, int64_t k) { return dur[node(b, t, u) * D() + k]; }
    std::string describe() const {
        std::string s = (tdt() ? "TDT" : "RNN-T") + std::string(" B=") + std::to_string(B) +
                        " T=" + std::to_string(T) + " U=" + std::to_string(U) + " V=" +
                        std::to_string(V) + " blank=" + std::to_string(blank);
        if (tdt()) {
            s += " durations={";
            for (int d : durs) s += std::to_string(d) + ",";
            s += "}";
        }
        return s;
    }
};

// Random case: normal(0, scale) logits, full lengths for sample 0, others in [1, T] x [0, U],
// labels uniform over the non-blank tokens.
inline Case random_case(uint32_t seed, int64_t B, int64_t T, int64_t U, int64_t V,
                        std::vector<int> durs, int blank = 0, double scale = 1.0) {
    std::mt19937 g(seed);
    std::normal_distribution<double> n(0.0, scale);
    Case c;
    c.B = B;
    c.T = T;
    c.U = U;
    c.V = V;
    c.durs = std::move(durs);
    c.blank = blank;
    c.tok.resize(static_cast<size_t>(B * T * (U + 1) * V));
    c.dur.resize(static_cast<size_t>(B * T * (U + 1) * c.D()));
    for (double &x : c.tok) x = n(g);
    for (double &x : c.dur) x = n(g);
    c.labels.resize(static_cast<size_t>(B * U));
    for (auto &y : c.labels) {
        int v = V > 1 ? static_cast<int>(g() % static_cast<uint32_t>(V - 1)) : 0;
        y = v < blank ? v : v + 1;
    }
    for (int64_t b = 0; b < B; ++b) {
        c.Tl.push_back(b == 0 ? static_cast<int32_t>(T) : static_cast<int32_t>(1 + g() % static_cast<uint32_t>(T > 0 ? T : 1)));
        c.Ul.push_back(b == 0 || V == 1 ? static_cast<int32_t>(V == 1 ? 0 : U) : static_cast<int32_t>(g() % static_cast<uint32_t>(U + 1)));
        if (T == 0) c.Tl.back() = 0;
    }
    return c;
}

struct Result {
    tdt_status_t status = TDT_STATUS_SUCCESS;
    std::string error;
    std::vector<double> costs, gtok, gdur;                    // float64 views
    std::vector<unsigned char> raw_costs, raw_gtok, raw_gdur; // what the library wrote
};

struct RunOpts {
    tdt_dtype_t dtype = TDT_DTYPE_FLOAT64;
    bool grads = true;
    int threads = -1;  // -1: the Case's
};

// One compute_tdt_loss call on contiguous buffers in the requested dtype.
inline Result run(const Case &c, const RunOpts &ro = RunOpts()) {
    const tdt_dtype_t dt = ro.dtype;
    const size_t es = esize(dt), as = acc_size(dt);
    const int64_t nt = c.B * c.T * c.R() * c.V, nd = c.B * c.T * c.R() * c.D();
    std::vector<unsigned char> tok(static_cast<size_t>(nt) * es + 1), dur(static_cast<size_t>(nd) * es + 1);
    for (int64_t i = 0; i < nt; ++i) put(tok.data(), i, dt, c.tok[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < nd; ++i) put(dur.data(), i, dt, c.dur[static_cast<size_t>(i)]);
    tdt_problem_t p;
    std::memset(&p, 0, sizeof p);
    p.batch = c.B;
    p.max_frames = c.T;
    p.max_labels = c.U;
    p.vocab_size = c.V;
    p.dtype = dt;
    p.token_logits = tok.data();
    p.token_strides[0] = c.T * c.R() * c.V;
    p.token_strides[1] = c.R() * c.V;
    p.token_strides[2] = c.V;
    if (c.tdt()) {
        p.duration_logits = dur.data();
        p.duration_strides[0] = c.T * c.R() * c.D();
        p.duration_strides[1] = c.R() * c.D();
        p.duration_strides[2] = c.D();
    }
    std::vector<int32_t> labels = c.labels, Tl = c.Tl, Ul = c.Ul;
    labels.push_back(0);  // never NULL, even for B * U == 0
    Tl.push_back(0);
    Ul.push_back(0);
    p.labels = labels.data();
    p.frame_lengths = Tl.data();
    p.label_lengths = Ul.data();
    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.num_threads = ro.threads >= 0 ? ro.threads : c.threads;
    o.blank = c.blank;
    o.durations = c.durs.empty() ? nullptr : c.durs.data();
    o.num_durations = static_cast<int>(c.D());
    o.sigma = c.sigma;
    o.fastemit_lambda = c.lambda;
    o.clamp = c.clamp;
    o.input_kind = c.log_probs ? TDT_INPUT_LOG_PROBS : TDT_INPUT_LOGITS;

    Result r;
    size_t wsb = 0;
    r.status = tdt_get_workspace_size(&p, &o, &wsb);
    if (r.status != TDT_STATUS_SUCCESS) {
        r.error = tdt_last_error();
        return r;
    }
    std::vector<unsigned char> ws(wsb);
    r.raw_costs.assign(static_cast<size_t>(c.B) * as + 1, 0xEE);
    r.raw_gtok.assign(ro.grads ? static_cast<size_t>(nt) * es + 1 : 0, 0xEE);
    r.raw_gdur.assign(ro.grads && c.tdt() ? static_cast<size_t>(nd) * es + 1 : 0, 0xEE);
    tdt_gradients_t g;
    std::memset(&g, 0, sizeof g);
    std::memcpy(g.token_strides, p.token_strides, sizeof g.token_strides);
    std::memcpy(g.duration_strides, p.duration_strides, sizeof g.duration_strides);
    g.token_grads = ro.grads ? r.raw_gtok.data() : nullptr;
    g.duration_grads = ro.grads && c.tdt() ? r.raw_gdur.data() : nullptr;
    r.status = compute_tdt_loss(&p, &o, r.raw_costs.data(), ro.grads ? &g : nullptr, ws.data(), wsb);
    r.error = tdt_last_error();
    if (r.status != TDT_STATUS_SUCCESS) return r;
    for (int64_t b = 0; b < c.B; ++b)
        r.costs.push_back(dt == TDT_DTYPE_FLOAT64 ? reinterpret_cast<const double *>(r.raw_costs.data())[b]
                                                  : reinterpret_cast<const float *>(r.raw_costs.data())[b]);
    if (ro.grads) {
        for (int64_t i = 0; i < nt; ++i) r.gtok.push_back(get(r.raw_gtok.data(), i, dt));
        for (int64_t i = 0; c.tdt() && i < nd; ++i) r.gdur.push_back(get(r.raw_gdur.data(), i, dt));
    }
    // the byte past each buffer is a canary
    EXPECT_EQ(r.raw_costs.back(), 0xEE) << "costs written past the batch";
    if (ro.grads) {
        EXPECT_EQ(r.raw_gtok.back(), 0xEE) << "token gradient written past its extent";
    }
    if (ro.grads && c.tdt()) {
        EXPECT_EQ(r.raw_gdur.back(), 0xEE) << "duration gradient written past its extent";
    }
    return r;
}

// The naive float64 reference on the inputs as dtype stores them; zero gradients outside each
// lattice.
inline Result reference(const Case &c, tdt_dtype_t dt = TDT_DTYPE_FLOAT64) {
    Result r;
    const int64_t V = c.V, D = c.D(), R = c.R();
    r.gtok.assign(static_cast<size_t>(c.B * c.T * R * V), 0.0);
    r.gdur.assign(static_cast<size_t>(c.B * c.T * R * D), 0.0);
    nref_config_t rc;
    rc.V = V;
    rc.blank = c.blank;
    rc.durations = c.tdt() ? c.durs.data() : nullptr;
    rc.D = static_cast<int>(D);
    rc.sigma = c.sigma;
    rc.fastemit = c.lambda;
    rc.clamp = c.clamp;
    rc.log_probs = c.log_probs;
    for (int64_t b = 0; b < c.B; ++b) {
        const int64_t Tb = c.Tl[static_cast<size_t>(b)], Ub = c.Ul[static_cast<size_t>(b)], Rb = Ub + 1;
        std::vector<double> zt(static_cast<size_t>(Tb * Rb * V + 1)), zh(static_cast<size_t>(Tb * Rb * D + 1));
        std::vector<double> gt(zt.size()), gh(zh.size());
        for (int64_t t = 0; t < Tb; ++t)
            for (int64_t u = 0; u < Rb; ++u) {
                for (int64_t v = 0; v < V; ++v)
                    zt[static_cast<size_t>((t * Rb + u) * V + v)] = quantize(c.tok[static_cast<size_t>(c.node(b, t, u) * V + v)], dt);
                for (int64_t k = 0; k < D; ++k)
                    zh[static_cast<size_t>((t * Rb + u) * D + k)] = quantize(c.dur[static_cast<size_t>(c.node(b, t, u) * D + k)], dt);
            }
        nref_result_t res;
        EXPECT_EQ(nref_sample(&rc, Tb, Ub, c.labels.data() + b * c.U, zt.data(), zh.data(), 1.0, &res,
                              gt.data(), gh.data()), 0);
        r.costs.push_back(res.cost);
        for (int64_t t = 0; t < Tb; ++t)
            for (int64_t u = 0; u < Rb; ++u) {
                for (int64_t v = 0; v < V; ++v)
                    r.gtok[static_cast<size_t>(c.node(b, t, u) * V + v)] = gt[static_cast<size_t>((t * Rb + u) * V + v)];
                for (int64_t k = 0; k < D; ++k)
                    r.gdur[static_cast<size_t>(c.node(b, t, u) * D + k)] = gh[static_cast<size_t>((t * Rb + u) * D + k)];
            }
    }
    return r;
}

// Tolerances: float64 is held to 1e-9 relative (plus the conditioning of exp() of sums of
// log-probs of magnitude `mag` along a path of `len` arcs); the narrow dtypes to a few of
// their own rounding units.
struct Tol {
    double cost_abs, cost_rel, grad_abs, grad_rel;
};

inline Tol tol_for(tdt_dtype_t dt, double mag = 10.0, double len = 20.0) {
    if (dt == TDT_DTYPE_FLOAT64) {
        double cond = 64.0 * 2.220446049250313e-16 * len * (mag + 10.0);
        return {1e-9 + cond, 1e-9, 1e-9 + cond, 1e-9};
    }
    const double e32 = 1.1920929e-07;
    Tol t{2e-5 * len + 8.0 * e32 * mag, 2e-6, 5e-6 * len + 8.0 * e32 * (mag + 10.0), 1e-5};
    if (dt == TDT_DTYPE_FLOAT16) {
        t.grad_abs += 6e-8;
        t.grad_rel = 1.1e-3;
    }
    if (dt == TDT_DTYPE_BFLOAT16) t.grad_rel = 8e-3;
    return t;
}

inline bool near(double got, double want, double abs_tol, double rel_tol) {
    if (std::isinf(want)) return got == want;
    return std::fabs(got - want) <= abs_tol + rel_tol * std::fabs(want);
}

// got vs want on every cost and gradient element; reports the first few divergences by index.
inline void expect_near(const Result &got, const Result &want, const Case &c, const Tol &tol,
                        const std::string &what) {
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << what << ": " << got.error;
    ASSERT_EQ(got.costs.size(), want.costs.size()) << what;
    for (size_t b = 0; b < got.costs.size(); ++b)
        EXPECT_TRUE(near(got.costs[b], want.costs[b], tol.cost_abs, tol.cost_rel))
            << what << ": cost[" << b << "] = " << got.costs[b] << ", reference " << want.costs[b]
            << " (diff " << got.costs[b] - want.costs[b] << ")";
    int reported = 0;
    auto cmp = [&](const std::vector<double> &g, const std::vector<double> &w, int64_t width, const char *name) {
        for (size_t i = 0; i < g.size() && reported < 5; ++i) {
            if (near(g[i], w[i], tol.grad_abs, tol.grad_rel)) continue;
            int64_t n = static_cast<int64_t>(i) / width, k = static_cast<int64_t>(i) % width;
            int64_t u = n % c.R(), t = (n / c.R()) % c.T, b = n / (c.R() * c.T);
            ADD_FAILURE() << what << ": " << name << " gradient (b " << b << ", t " << t << ", u " << u
                          << ", " << k << ") = " << g[i] << ", reference " << w[i] << " (diff "
                          << g[i] - w[i] << ")";
            ++reported;
        }
    };
    if (!got.gtok.empty()) cmp(got.gtok, want.gtok, c.V, "token");
    if (!got.gdur.empty()) cmp(got.gdur, want.gdur, c.D(), "duration");
}

const tdt_dtype_t kAllDtypes[] = {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16};

struct DtypeName {
    std::string operator()(const ::testing::TestParamInfo<tdt_dtype_t> &info) const {
        return dtype_name(info.param);
    }
};

// Sanitizer builds are several times slower: long-lattice tests shrink there.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

}  // namespace rob

#endif  // TDT_TESTS_ROBUSTNESS_UTIL_H
