/*
 * test_reference.cc - the library against the naive float64 reference (reference.h) on random
 * problems, every option, every dtype; and against central finite differences.
 */
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

using namespace tdt_test;

namespace {

struct Shape {
    const char *name;
    int64_t B, maxT, maxU, V;
    std::vector<int> durations;  // empty: RNN-T
    int blank;                   // -1: V - 1
    uint64_t seed;
};

const std::vector<Shape> &shapes() {
    static const std::vector<Shape> s = {
        {"parakeet", 4, 12, 5, 9, {0, 1, 2, 3, 4}, -1, 11},
        {"tdt_blank0", 3, 10, 4, 6, {0, 1, 2}, 0, 12},
        {"tdt_no_zero", 3, 9, 4, 6, {1, 2, 3}, 2, 13},
        {"tdt_no_one", 4, 9, 3, 5, {0, 2, 3}, -1, 14},
        {"tdt_unsorted", 3, 11, 4, 7, {2, 0, 4, 1}, 0, 15},
        {"tdt_single_duration", 2, 8, 3, 4, {1}, 1, 16},
        {"rnnt_blank0", 4, 8, 5, 7, {}, 0, 17},
        {"rnnt_blank_last", 3, 7, 4, 5, {}, -1, 18},
        // A vocabulary wider than any vector unit and odd: exercises vector loops and tails.
        {"tdt_large_vocab", 2, 5, 3, 1031, {0, 1, 2, 3, 4}, -1, 19},
        {"rnnt_large_vocab", 2, 4, 3, 1031, {}, 0, 20},
        // Rows of over 16 KB in float32 (parakeet's are 32 KB), starting at every alignment
        // (V odd): the row loops' vector bodies, heads and tails at that width.
        {"tdt_wide_rows", 2, 4, 2, 4133, {0, 1, 2, 3, 4}, -1, 23},
        {"rnnt_wide_rows", 2, 3, 2, 4133, {}, 0, 24},
    };
    return s;
}

Problem shape_problem(const Shape &s, tdt_dtype_t dtype) {
    Problem p = random_problem(s.seed, s.B, s.maxT, s.maxU, s.V, s.durations,
                               s.blank < 0 ? static_cast<int>(s.V - 1) : s.blank);
    quantize_inputs(p, dtype);
    return p;
}

const std::vector<tdt_dtype_t> kAllDtypes = {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16,
                                             TDT_DTYPE_BFLOAT16};

std::string dtype_param_name(const ::testing::TestParamInfo<tdt_dtype_t> &i) { return dtype_name(i.param); }

// Library (dtype) vs reference on p, one-shot and costs-only.
void check_vs_reference(const Problem &p, tdt_dtype_t dtype, const std::string &what) {
    RunOptions ro;
    ro.dtype = dtype;
    const Output want = run_ref(p);
    expect_near(run_lib(p, ro), want, p, tol_for(dtype), what);
    ro.costs_only = true;
    expect_near(run_lib(p, ro), want, p, tol_for(dtype), what + " (costs only)");
}

}  // namespace

// ---- random problems, every shape x dtype -------------------------------------------------------

class RandomVsReference : public ::testing::TestWithParam<std::tuple<size_t, tdt_dtype_t>> {};

TEST_P(RandomVsReference, CostsAndGradients) {
    const Shape &s = shapes()[std::get<0>(GetParam())];
    const tdt_dtype_t dtype = std::get<1>(GetParam());
    const Problem p = shape_problem(s, dtype);
    check_vs_reference(p, dtype, std::string(s.name) + " " + dtype_name(dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RandomVsReference,
    ::testing::Combine(::testing::Range<size_t>(0, shapes().size()), ::testing::ValuesIn(kAllDtypes)),
    [](const ::testing::TestParamInfo<std::tuple<size_t, tdt_dtype_t>> &i) {
        return std::string(shapes()[std::get<0>(i.param)].name) + "_" + dtype_name(std::get<1>(i.param));
    });

// ---- options, per dtype --------------------------------------------------------------------------

class Options : public ::testing::TestWithParam<tdt_dtype_t> {
  protected:
    tdt_dtype_t dtype() const { return GetParam(); }
    Problem tdt(uint64_t seed = 21) const { return shape_problem({"", 3, 10, 4, 7, {0, 1, 2, 3, 4}, -1, seed}, dtype()); }
    Problem rnnt(uint64_t seed = 22) const { return shape_problem({"", 3, 8, 4, 6, {}, 0, seed}, dtype()); }
    Output lib(const Problem &p) const {
        RunOptions ro;
        ro.dtype = dtype();
        return run_lib(p, ro);
    }
};

TEST_P(Options, SigmaTdt) {
    Problem p = tdt();
    p.sigma = 0.05;
    check_vs_reference(p, dtype(), "TDT sigma 0.05");
}

TEST_P(Options, SigmaRnnt) {
    Problem p = rnnt();
    p.sigma = 0.3;
    check_vs_reference(p, dtype(), "RNN-T sigma 0.3");
}

// FastEmit: cost (1 + lambda) * cost(0); token gradient per the reference; duration gradient
// exactly what it is without FastEmit.
TEST_P(Options, FastEmitTdt) {
    Problem p = tdt();
    const Output plain = lib(p);
    p.fastemit = 0.3;
    check_vs_reference(p, dtype(), "TDT fastemit 0.3");
    const Output fe = lib(p);
    ASSERT_EQ(fe.status, TDT_STATUS_SUCCESS) << fe.error;
    ASSERT_EQ(plain.status, TDT_STATUS_SUCCESS) << plain.error;
    const Tol t = tol_for(dtype());
    for (int64_t b = 0; b < p.B; ++b)
        EXPECT_NEAR(fe.costs[b], 1.3 * plain.costs[b], t.cost_rel * 1.3 * plain.costs[b]) << "sample " << b;
    Output dur_only_fe = fe, dur_only_plain = plain;
    dur_only_fe.gtok.clear();
    dur_only_plain.gtok.clear();
    dur_only_fe.costs = dur_only_plain.costs;
    expect_near(dur_only_fe, dur_only_plain, p, t, "duration gradient with vs without FastEmit");
}

TEST_P(Options, FastEmitRnnt) {
    Problem p = rnnt();
    p.fastemit = 0.01;
    check_vs_reference(p, dtype(), "RNN-T fastemit 0.01");
}

// Clamp: token-gradient elements within [-clamp, clamp], duration gradients not clamped.
TEST_P(Options, ClampTdt) {
    Problem p = tdt();
    const Output plain = lib(p);
    p.clamp = 0.05;
    check_vs_reference(p, dtype(), "TDT clamp 0.05");
    const Output cl = lib(p);
    ASSERT_EQ(cl.status, TDT_STATUS_SUCCESS) << cl.error;
    double max_tok = 0, max_dur = 0;
    for (double x : cl.gtok) max_tok = std::max(max_tok, std::fabs(x));
    for (double x : cl.gdur) max_dur = std::max(max_dur, std::fabs(x));
    EXPECT_LE(max_tok, quantize(0.05, dtype()));
    EXPECT_GT(max_dur, 0.05) << "test premise: some duration gradient exceeds the clamp";
    Output a = cl, b = plain;
    a.gtok.clear();
    b.gtok.clear();
    expect_near(a, b, p, tol_for(dtype()), "costs and duration gradient with vs without clamp");
}

TEST_P(Options, AllOptionsTogether) {
    Problem p = tdt(23);
    p.sigma = 0.02;
    p.fastemit = 0.5;
    p.clamp = 0.2;
    check_vs_reference(p, dtype(), "TDT sigma + fastemit + clamp");
    Problem r = rnnt(24);
    r.sigma = 0.02;
    r.fastemit = 0.5;
    r.clamp = 0.2;
    check_vs_reference(r, dtype(), "RNN-T sigma + fastemit + clamp");
}

// Log-prob inputs: used as they are; same cost as the logits they came from.
TEST_P(Options, LogProbsInput) {
    for (bool is_rnnt : {false, true}) {
        SCOPED_TRACE(is_rnnt ? "RNN-T" : "TDT");
        Problem p = is_rnnt ? rnnt() : tdt();
        const Output from_logits = lib(p);
        to_log_probs(p);
        quantize_inputs(p, dtype());
        check_vs_reference(p, dtype(), "log-probs");
        Output lp = lib(p);
        ASSERT_EQ(lp.status, TDT_STATUS_SUCCESS) << lp.error;
        Tol t = tol_for(dtype());
        if (dtype() == TDT_DTYPE_FLOAT16 || dtype() == TDT_DTYPE_BFLOAT16) t.cost_rel = 5e-2;  // re-rounded inputs
        for (int64_t b = 0; b < p.B; ++b)
            EXPECT_NEAR(lp.costs[b], from_logits.costs[b], t.cost_abs + t.cost_rel * from_logits.costs[b])
                << "sample " << b << ": log-probs input vs the logits they came from";
    }
}

// Log-prob inputs that are not normalised are still used as they are (no hidden softmax).
TEST_P(Options, LogProbsUnnormalised) {
    Problem p = tdt(25);
    for (double &x : p.tok) x = quantize(-1.5 + 0.3 * std::sin(x), dtype());
    for (double &x : p.dur) x = quantize(-1.0 + 0.2 * std::cos(x), dtype());
    p.log_probs = true;
    p.sigma = 0.01;
    check_vs_reference(p, dtype(), "unnormalised log-probs with sigma");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Options, ::testing::ValuesIn(kAllDtypes), dtype_param_name);

// ---- central finite differences (float64) -------------------------------------------------------

namespace {

// Checks d(sum_b g_b cost_b)/dx against the library's gradients at a sample of elements of the
// token and duration logits (inside the lattices, plus a few padding elements whose derivative
// must be 0), using central differences with step h.
void check_finite_differences(Problem p, const std::vector<double> &g, int samples, uint64_t seed,
                              const std::string &what) {
    const double h = 1e-5, tol = 2e-7;
    p.num_threads = 1;  // hundreds of tiny calls: no thread start-up per call
    RunOptions ro;
    ro.two_phase = true;
    ro.grad_costs = &g;
    const Output an = run_lib(p, ro);
    ASSERT_EQ(an.status, TDT_STATUS_SUCCESS) << an.error;
    RunOptions co;
    co.costs_only = true;
    auto f = [&]() {
        const Output o = run_lib(p, co);
        double s = 0;
        for (int64_t b = 0; b < p.B; ++b) s += g[b] * o.costs[b];
        return s;
    };
    std::mt19937_64 rng(seed);
    for (int which = 0; which < 2; ++which) {
        std::vector<double> &x = which == 0 ? p.tok : p.dur;
        const std::vector<double> &grad = which == 0 ? an.gtok : an.gdur;
        const int64_t width = which == 0 ? p.V : p.D();
        if (x.empty()) continue;
        for (int i = 0; i < samples; ++i) {
            const int64_t e = std::uniform_int_distribution<int64_t>(0, static_cast<int64_t>(x.size()) - 1)(rng);
            const double x0 = x[e];
            x[e] = x0 + h;
            const double fp = f();
            x[e] = x0 - h;
            const double fm = f();
            x[e] = x0;
            const double fd = (fp - fm) / (2 * h);
            EXPECT_NEAR(grad[e], fd, tol) << what << ": " << (which == 0 ? "token" : "duration")
                                          << " logit " << e << " (node " << e / width << ", index "
                                          << e % width << "): analytic vs central difference";
        }
    }
}

}  // namespace

TEST(FiniteDifferences, TdtTokenAndDurationGradients) {
    Problem p = random_problem(31, 3, 7, 3, 5, {0, 1, 2, 3}, 4);
    p.sigma = 0.05;
    check_finite_differences(p, {1.0, 1.0, 1.0}, 60, 1, "TDT");
}

TEST(FiniteDifferences, TdtWithUpstreamGradients) {
    const Problem p = random_problem(32, 3, 6, 3, 4, {0, 2, 1}, 0);
    check_finite_differences(p, {0.7, -1.3, 2.5}, 40, 2, "TDT, g = {0.7, -1.3, 2.5}");
}

TEST(FiniteDifferences, RnntTokenGradients) {
    const Problem p = random_problem(33, 3, 6, 4, 5, {}, 0);
    check_finite_differences(p, {1.0, 0.5, 2.0}, 60, 3, "RNN-T");
}

TEST(FiniteDifferences, LogProbInputs) {
    Problem p = random_problem(34, 2, 6, 3, 5, {0, 1, 2}, 4);
    to_log_probs(p);
    check_finite_differences(p, {1.0, 1.0}, 50, 4, "TDT log-prob inputs");
    Problem r = random_problem(35, 2, 5, 3, 4, {}, 0);
    to_log_probs(r);
    check_finite_differences(r, {1.0, 1.0}, 40, 5, "RNN-T log-prob inputs");
}
