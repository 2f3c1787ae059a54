/*
 * test_edge.cc - edge cases of the lattice, memory layouts, the call shapes and determinism.
 */
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <omp.h>

#include <gtest/gtest.h>

#include "test_util.h"

using namespace tdt_test;

namespace {

const std::vector<tdt_dtype_t> kAllDtypes = {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16,
                                             TDT_DTYPE_BFLOAT16};
std::string dtype_param_name(const ::testing::TestParamInfo<tdt_dtype_t> &i) { return dtype_name(i.param); }

Output lib(const Problem &p, tdt_dtype_t dtype = TDT_DTYPE_FLOAT64) {
    RunOptions ro;
    ro.dtype = dtype;
    return run_lib(p, ro);
}

// Library vs reference plus the "exactly zero outside the lattices, no NaN" rule.
void check(const Problem &p, const std::string &what, tdt_dtype_t dtype = TDT_DTYPE_FLOAT64) {
    const Output got = lib(p, dtype);
    expect_near(got, run_ref(p), p, tol_for(dtype), what);
    if (got.status == TDT_STATUS_SUCCESS) expect_zero_outside_lattices(got, p);
}

}  // namespace

// ---- lattice edge cases --------------------------------------------------------------------------

TEST(Edge, NoLabelsAtAll) {  // max_labels = 0: labels may be NULL; only blank paths
    check(random_problem(41, 3, 6, 0, 5, {0, 1, 2}, 4), "TDT, U = 0 (labels NULL)");
    check(random_problem(42, 3, 6, 0, 5, {}, 0), "RNN-T, U = 0 (labels NULL)");
}

TEST(Edge, EmptyLabelSequenceInABatch) {
    Problem p = random_problem(43, 3, 7, 4, 6, {0, 1, 2, 3}, 5);
    p.U[1] = 0;
    check(p, "TDT, sample 1 has U = 0");
    Problem r = random_problem(44, 3, 7, 4, 6, {}, 0);
    r.U[2] = 0;
    check(r, "RNN-T, sample 2 has U = 0");
}

TEST(Edge, SingleFrame) {  // T = 1: every label on frame 0 (duration 0), then the final blank
    check(random_problem(45, 2, 1, 3, 5, {0, 1, 2}, 0), "TDT, T = 1");
    check(random_problem(46, 2, 1, 3, 5, {}, 0), "RNN-T, T = 1");
}

// Durations {0, 4} cannot land exactly on T = 3: +inf, all-zero gradients, no NaN; the
// feasible sample next to it is unaffected.
TEST(Edge, InfeasibleSample) {
    const Problem p = random_problem(47, 2, 4, 2, 5, {0, 4}, 4, 1.0, 1, {3, 4});
    const Output got = lib(p);
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
    EXPECT_TRUE(std::isinf(got.costs[0]) && got.costs[0] > 0) << "cost " << got.costs[0];
    EXPECT_TRUE(std::isfinite(got.costs[1])) << "cost " << got.costs[1];
    for (int64_t t = 0; t < p.maxT; ++t)
        for (int64_t u = 0; u <= p.maxU; ++u) {
            const int64_t n = p.node(0, t, u);
            for (int64_t v = 0; v < p.V; ++v) EXPECT_EQ(got.gtok[n * p.V + v], 0.0) << "token grad (0," << t << "," << u << "," << v << ")";
            for (int k = 0; k < p.D(); ++k) EXPECT_EQ(got.gdur[n * p.D() + k], 0.0) << "duration grad (0," << t << "," << u << "," << k << ")";
        }
    check(p, "durations {0, 4}, T = {3, 4}");
    for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16}) {
        Problem q = p;
        quantize_inputs(q, dt);
        check(q, std::string("infeasible, ") + dtype_name(dt), dt);
    }
}

TEST(Edge, ZeroFrames) {  // T_b = 0 is infeasible in both modes, and so is max_frames = 0
    Problem p = random_problem(48, 3, 5, 2, 4, {0, 1, 2}, 0);
    p.T[1] = 0;
    check(p, "TDT, sample 1 has T = 0");
    Problem r = random_problem(49, 3, 5, 2, 4, {}, 0);
    r.T[2] = 0;
    check(r, "RNN-T, sample 2 has T = 0");
    Problem z = random_problem(50, 2, 0, 2, 4, {0, 1}, 0);
    const Output got = lib(z);
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
    for (double c : got.costs) EXPECT_TRUE(std::isinf(c) && c > 0) << c;
}

// Unreachable nodes inside a feasible lattice get exactly 0: durations {0, 2} from frame 0 only
// ever visit even frames.
TEST(Edge, UnreachableNodesExactlyZero) {
    const Problem q = random_problem(51, 1, 5, 2, 4, {0, 2}, 0);  // T = 5 is odd: infeasible
    // T = 4 of max_frames 5: frames 0..3 are the lattice, the terminal blank leaves frame 2.
    const Problem f = random_problem(51, 1, 5, 2, 4, {0, 2}, 0, 1.0, 1, {4});
    const Output got = lib(f);
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
    ASSERT_TRUE(std::isfinite(got.costs[0]));
    for (int64_t t : {1, 3})
        for (int64_t u = 0; u <= f.maxU; ++u) {
            const int64_t n = f.node(0, t, u);
            for (int64_t v = 0; v < f.V; ++v) EXPECT_EQ(got.gtok[n * f.V + v], 0.0) << "(t=" << t << ", u=" << u << ", v=" << v << ")";
            for (int k = 0; k < f.D(); ++k) EXPECT_EQ(got.gdur[n * f.D() + k], 0.0) << "(t=" << t << ", u=" << u << ", k=" << k << ")";
        }
    check(f, "durations {0, 2}, T = 4");
    check(q, "durations {0, 2}, T = 5 (infeasible)");
}

// More labels than a CUDA block has threads: nothing may be tied to U.
TEST(Edge, MoreThan1024Labels) {
    const Problem p = random_problem(52, 2, 4, 1100, 6, {0, 1, 2}, 5, 1.0, 1, {4, 3}, {1100, 1030});
    check(p, "TDT, U = 1100");
    Problem q = p;
    quantize_inputs(q, TDT_DTYPE_FLOAT32);
    check(q, "TDT, U = 1100, float32", TDT_DTYPE_FLOAT32);
    check(random_problem(53, 1, 3, 1100, 5, {}, 0), "RNN-T, U = 1100");
}

TEST(Edge, LargeLogits) {  // log-softmax must be computed stably
    check(random_problem(54, 2, 6, 3, 8, {0, 1, 2}, 7, 40.0), "TDT, logits ~ N(0, 40^2)");
    check(random_problem(55, 2, 6, 3, 8, {}, 0, 40.0), "RNN-T, logits ~ N(0, 40^2)");
}

TEST(Edge, BlankPositions) {  // blank first, in the middle and last
    for (int blank : {0, 3, 6}) {
        check(random_problem(56 + blank, 3, 6, 3, 7, {0, 1, 2}, blank), "TDT blank " + std::to_string(blank));
        check(random_problem(66 + blank, 3, 6, 3, 7, {}, blank), "RNN-T blank " + std::to_string(blank));
    }
}

// A token masked with -inf logits (as a model may do) has probability 0: finite cost, its
// gradient exactly 0, no NaN.
TEST(Edge, MinusInfinityMasksAToken) {
    for (bool rnnt : {false, true}) {
        Problem p = random_problem(58, 2, 6, 3, 6, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2}, 0, 1.0, 1,
                                   {6, 5}, {3, 2});
        for (int64_t b = 0; b < p.B; ++b)
            for (int64_t i = 0; i < p.U[b]; ++i) p.labels[b * p.maxU + i] = 1 + static_cast<int32_t>(i % 3);
        for (int64_t n = 0; n < p.nodes(); ++n) p.tok[n * p.V + 5] = -std::numeric_limits<double>::infinity();
        check(p, rnnt ? "RNN-T, token 5 masked with -inf" : "TDT, token 5 masked with -inf");
    }
}

// Every path of probability 0 (the first label's logit is -inf everywhere): +inf, zero
// gradients, no NaN; the other sample is unaffected.
TEST(Edge, EveryPathImpossible) {
    for (bool rnnt : {false, true}) {
        Problem p = random_problem(59, 2, 5, 2, 5, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2}, 0, 1.0, 1,
                                   {5, 5}, {2, 2});
        p.labels = {1, 2, 3, 4};
        for (int64_t t = 0; t < p.maxT; ++t)
            for (int64_t u = 0; u <= p.maxU; ++u) p.tok[p.node(0, t, u) * p.V + 1] = -std::numeric_limits<double>::infinity();
        const Output got = lib(p);
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        EXPECT_TRUE(std::isinf(got.costs[0]) && got.costs[0] > 0) << "cost " << got.costs[0];
        check(p, rnnt ? "RNN-T, sample 0 impossible" : "TDT, sample 0 impossible");
    }
}

// NaN (or +inf) inside one sample's lattice: that sample's cost is NaN, the others are
// exactly what they are without it (header: "leaves the others alone").
TEST(Edge, NaNInsideOneSampleLeavesOthersAlone) {
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
        Problem p = random_problem(60, 3, 6, 3, 5, {0, 1, 2}, 4, 1.0, 1, {6, 6, 6}, {3, 3, 3});
        const Output clean = lib(p);
        p.tok[p.node(1, 2, 1) * p.V + 3] = bad;
        const Output got = lib(p);
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        EXPECT_TRUE(std::isnan(got.costs[1])) << "logit " << bad << " in sample 1: cost " << got.costs[1];
        for (int64_t b : {0, 2}) {
            EXPECT_EQ(got.costs[b], clean.costs[b]) << "sample " << b;
            for (int64_t t = 0; t < p.maxT; ++t)
                for (int64_t u = 0; u <= p.maxU; ++u) {
                    const int64_t n = p.node(b, t, u);
                    for (int64_t v = 0; v < p.V; ++v)
                        ASSERT_EQ(got.gtok[n * p.V + v], clean.gtok[n * p.V + v]) << "sample " << b << " node (" << t << "," << u << ")";
                    for (int k = 0; k < p.D(); ++k)
                        ASSERT_EQ(got.gdur[n * p.D() + k], clean.gdur[n * p.D() + k]) << "sample " << b << " node (" << t << "," << u << ")";
                }
        }
    }
}

TEST(Edge, EmptyBatch) {
    Problem p = random_problem(57, 0, 4, 2, 5, {0, 1}, 0);
    const Output got = lib(p);
    EXPECT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
    EXPECT_TRUE(got.costs.empty());
}

// A narrow dtype's run against a float32 run of the same (rounded) problem, two-phase with the
// given upstream gradients, into *f32 and *n. Both must succeed: call it under
// ASSERT_NO_FATAL_FAILURE, so a failed run stops the test before its outputs are read.
static void float32_and(const Problem &p, tdt_dtype_t narrow, const std::vector<double> &grad_costs,
                        Output *f32, Output *n) {
    RunOptions ro;
    ro.two_phase = true;
    ro.grad_costs = &grad_costs;
    ro.dtype = TDT_DTYPE_FLOAT32;
    *f32 = run_lib(p, ro);
    ro.dtype = narrow;
    *n = run_lib(p, ro);
    ASSERT_EQ(f32->status, TDT_STATUS_SUCCESS) << f32->error;
    ASSERT_EQ(n->status, TDT_STATUS_SUCCESS) << n->error;
}

// Each of got within max(|want| rel, abs) of want (the float32 run's); where want lies clearly in
// the narrow type's subnormal range (4 tiny .. normal_min), got must not be 0 (rounded, not
// flushed). Returns how many such subnormal elements there were; *bad counts the failures
// (reported up to 5).
static int64_t expect_narrowed(const std::vector<double> &want, const std::vector<double> &got,
                               double rel, double abs, double tiny, double normal_min,
                               const char *what, int64_t *bad) {
    int64_t subnormal = 0;
    if (got.size() != want.size()) {
        ADD_FAILURE() << what << ": " << got.size() << " values against the float32 run's " << want.size();
        ++*bad;
        return 0;
    }
    for (size_t i = 0; i < want.size(); ++i) {
        if (std::fabs(want[i]) > 4 * tiny && std::fabs(want[i]) < normal_min) {
            ++subnormal;
            if (got[i] == 0.0 && (*bad)++ < 5) ADD_FAILURE() << what << " " << i << ": 0 (float32 run: " << want[i] << ")";
        }
        if (std::fabs(got[i] - want[i]) > std::max(std::fabs(want[i]) * rel, abs) && (*bad)++ < 5)
            ADD_FAILURE() << what << " " << i << ": " << got[i] << " against the float32 run's " << want[i];
    }
    return subnormal;
}

// bfloat16 gradients in float32's subnormal range are rounded, not flushed to zero (the CPU
// backend narrows with VCVTNE2PS2BF16 where it can, which flushes them; cpu.c takes the portable
// rounding for any block that holds one). An upstream gradient of 1e-36 pushes most of a row
// there; each element must match the float32 run's to bfloat16 precision, or within two of the
// smallest bfloat16 subnormals (9.2e-41), and every one the float32 run puts clearly inside the
// range must be non-zero. Rows of 300 (several 32-element blocks) and a tail.
TEST(Edge, Bfloat16GradientSubnormalsKept) {
    Problem p = random_problem(58, 2, 5, 3, 300, {0, 1, 2}, 299, 4.0);
    quantize_inputs(p, TDT_DTYPE_BFLOAT16);
    Output f32, bf;
    ASSERT_NO_FATAL_FAILURE(float32_and(p, TDT_DTYPE_BFLOAT16, {1e-36, -3e-37}, &f32, &bf));
    const double tiny = 9.183549615799121e-41;  // 2^-133, the smallest bfloat16 subnormal
    int64_t bad = 0;
    const int64_t subnormal = expect_narrowed(f32.gtok, bf.gtok, 1.0 / 128, 2 * tiny,
                                              tiny, 1.1754943508222875e-38, "token grad", &bad);
    EXPECT_GT(subnormal, 100) << "the problem no longer reaches the subnormal range";
}

// float16 rows longer than the CPU's widening chunk (512 elements, where F16C converts 16 at a
// time, cpu.c) and with a tail of each: the costs and gradients of a float16 run against a
// float32 run on the same (float16-rounded) inputs, to float16's rounding (half a unit in the
// last place: 2^-11 of the value, or 2^-25 in the subnormals; a little more for the two runs'
// own float32 differences). Sample 0's upstream gradient of 1e-6 puts most of its gradient in
// float16's subnormal range (under 6.1e-5): those elements must be rounded, not flushed, and
// every one the float32 run puts clearly inside the range must be non-zero.
TEST(Edge, Float16RowsOverChunks) {
    Problem p = random_problem(59, 2, 4, 3, 1100, {0, 1, 2}, 1099, 3.0);
    quantize_inputs(p, TDT_DTYPE_FLOAT16);
    Output f32, h;
    ASSERT_NO_FATAL_FAILURE(float32_and(p, TDT_DTYPE_FLOAT16, {1e-6, 0.5}, &f32, &h));
    for (int64_t b = 0; b < p.B; ++b)
        EXPECT_NEAR(h.costs[b], f32.costs[b], 1e-5 * std::fabs(f32.costs[b])) << "cost of sample " << b;
    const double tiny = 5.9604644775390625e-08;  // 2^-24, the smallest float16 subnormal
    int64_t bad = 0;
    const int64_t subnormal =
        expect_narrowed(f32.gtok, h.gtok, 4.9e-4, 0.51 * tiny, tiny, 6.103515625e-05, "token grad", &bad);
    expect_narrowed(f32.gdur, h.gdur, 4.9e-4, 0.51 * tiny, tiny, 6.103515625e-05, "duration grad", &bad);
    EXPECT_GT(subnormal, 1000) << "the problem no longer reaches float16's subnormal range";
}

// ---- padding: garbage in label padding (random_problem always puts it there) and in the logits
// of every node outside each lattice --------------------------------------------------------------

TEST(Padding, PaddedBatchWithGarbage) {
    // every sample shorter than max_frames and max_labels
    const Problem p = random_problem(61, 4, 12, 6, 6, {0, 1, 2, 3}, 5, 1.0, 1, {9, 3, 7, 1}, {4, 2, 0, 5});
    check(p, "TDT padded batch");
    const Problem r = random_problem(62, 4, 12, 6, 6, {}, 0, 1.0, 1, {9, 3, 7, 1}, {4, 2, 0, 5});
    check(r, "RNN-T padded batch");
}

// NaN in the logits of padding nodes must not leak into costs or gradients.
TEST(Padding, NaNInLogitsPadding) {
    for (bool rnnt : {false, true}) {
        Problem p = random_problem(63, 3, 8, 4, 5, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2}, 0, 1.0, 1,
                                   {8, 5, 2}, {4, 1, 3});
        const Output finite = lib(p);
        const double nan = std::numeric_limits<double>::quiet_NaN();
        for (int64_t b = 0; b < p.B; ++b)
            for (int64_t t = 0; t < p.maxT; ++t)
                for (int64_t u = 0; u <= p.maxU; ++u) {
                    if (t < p.T[b] && u <= p.U[b]) continue;
                    const int64_t n = p.node(b, t, u);
                    for (int64_t v = 0; v < p.V; ++v) p.tok[n * p.V + v] = nan;
                    for (int k = 0; k < p.D(); ++k) p.dur[n * p.D() + k] = nan;
                }
        const Output got = lib(p);
        expect_bitwise(got, finite, p, rnnt ? "RNN-T, NaN vs finite padding" : "TDT, NaN vs finite padding");
        expect_zero_outside_lattices(got, p);
    }
}

// ---- layouts and call shapes, per dtype ----------------------------------------------------------

class Layouts : public ::testing::TestWithParam<tdt_dtype_t> {
  protected:
    tdt_dtype_t dtype() const { return GetParam(); }
    Problem problem(bool rnnt, uint64_t seed = 71) const {
        Problem p = random_problem(seed, 3, 9, 4, 7, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2, 3, 4}, rnnt ? 0 : 6);
        quantize_inputs(p, dtype());
        return p;
    }
    Output run(const Problem &p, Layout layout, bool two_phase = false) const {
        RunOptions ro;
        ro.dtype = dtype();
        ro.layout = layout;
        ro.two_phase = two_phase;
        return run_lib(p, ro);
    }
};

// One (B, T, U+1, V+D) joint tensor sliced by strides, gradients into one joint buffer: the
// same bits as separate contiguous tensors.
TEST_P(Layouts, JointTensorSlices) {
    for (bool rnnt : {false, true}) {
        const Problem p = problem(rnnt);
        const Output base = run(p, Layout::Contiguous);
        expect_near(base, run_ref(p), p, tol_for(dtype()), "contiguous vs reference");
        expect_bitwise(run(p, Layout::Joint), base, p, rnnt ? "RNN-T joint vs contiguous" : "TDT joint vs contiguous");
    }
}

// Rows padded, a spare frame per sample, different gradient strides; gaps hold NaN, must not be
// read and must not be written.
TEST_P(Layouts, PaddedStrides) {
    for (bool rnnt : {false, true}) {
        const Problem p = problem(rnnt, 72);
        expect_bitwise(run(p, Layout::Padded), run(p, Layout::Contiguous), p,
                       rnnt ? "RNN-T padded strides vs contiguous" : "TDT padded strides vs contiguous");
    }
}

TEST_P(Layouts, InPlaceGradients) {
    for (bool rnnt : {false, true}) {
        const Problem p = problem(rnnt, 73);
        const Output base = run(p, Layout::Contiguous);
        expect_bitwise(run(p, Layout::InPlace), base, p, rnnt ? "RNN-T in place, one-shot" : "TDT in place, one-shot");
        expect_bitwise(run(p, Layout::InPlace, true), base, p,
                       rnnt ? "RNN-T in place, forward + backward" : "TDT in place, forward + backward");
    }
}

TEST_P(Layouts, ForwardBackwardEqualsOneShot) {
    for (bool rnnt : {false, true}) {
        Problem p = problem(rnnt, 74);
        p.sigma = 0.01;
        p.fastemit = 0.1;
        expect_bitwise(run(p, Layout::Contiguous, true), run(p, Layout::Contiguous), p,
                       rnnt ? "RNN-T forward+backward vs one-shot" : "TDT forward+backward vs one-shot");
        expect_bitwise(run(p, Layout::Joint, true), run(p, Layout::Joint), p, "joint, forward+backward vs one-shot");
    }
}

// grad_costs scales each sample's gradients; NULL means ones.
TEST_P(Layouts, UpstreamGradientScaling) {
    for (bool rnnt : {false, true}) {
        Problem p = random_problem(75, 4, 7, 3, 6, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2}, 0);
        quantize_inputs(p, dtype());
        const std::vector<double> g = {0.5, -2.0, 0.0, 3.0};
        RunOptions ro;
        ro.dtype = dtype();
        ro.two_phase = true;
        ro.grad_costs = &g;
        expect_near(run_lib(p, ro), run_ref(p, &g), p, tol_for(dtype()), "g = {0.5, -2, 0, 3} vs reference");
        ro.grad_costs = nullptr;
        expect_bitwise(run_lib(p, ro), run(p, Layout::Contiguous), p, "grad_costs NULL vs one-shot");
        const std::vector<double> ones(4, 1.0);
        ro.grad_costs = &ones;
        expect_bitwise(run_lib(p, ro), run(p, Layout::Contiguous), p, "grad_costs all ones vs one-shot");
        // options.grad_costs_scalar: one value for every sample, as a sum reduction hands back
        const std::vector<double> rep(4, -1.5), one(1, -1.5);
        ro.grad_costs = &rep;
        const Output expected = run_lib(p, ro);
        ro.grad_costs = &one;
        ro.grad_costs_scalar = true;
        expect_bitwise(run_lib(p, ro), expected, p, "grad_costs_scalar {-1.5} vs {-1.5} x 4");
        ro.grad_costs_scalar = false;
    }
}

// options.normalize_costs: costs[b] / U_b and upstream grad_costs[b] / U_b, each divided in the
// accumulate type: the bits of a plain call whose costs and upstream the caller divided itself
// (a sample with U_b = 0 included: an inf cost, and inf upstream), one-shot and two-phase.
TEST_P(Layouts, NormalizedCosts) {
    Problem p = random_problem(77, 4, 7, 3, 6, {0, 1, 2}, 0, 1.0, 1, {}, {3, 1, 0, 2});
    quantize_inputs(p, dtype());
    const bool dbl = dtype() == TDT_DTYPE_FLOAT64;
    auto per = [&](double x, int32_t U) { return acc_div(x, U, dbl); };
    const std::vector<double> g = {0.5, -2.0, 0.75, 3.0};
    for (bool two_phase : {false, true}) {
        RunOptions ro;
        ro.dtype = dtype();
        ro.layout = two_phase ? Layout::Joint : Layout::Contiguous;
        ro.two_phase = two_phase;
        const Output plain = run_lib(p, ro);
        std::vector<double> up(4);
        for (int b = 0; b < 4; ++b) up[b] = per(two_phase ? g[b] : 1.0, p.U[b]);
        if (two_phase) ro.grad_costs = &up;
        else ro.two_phase = true, ro.grad_costs = &up;  // one-shot's ones, divided by hand
        Output want = run_lib(p, ro);
        ro.two_phase = two_phase;
        ro.grad_costs = two_phase ? &g : nullptr;
        ro.normalize_costs = true;
        const Output got = run_lib(p, ro);
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        for (int b = 0; b < 4; ++b) {
            const double w = per(plain.costs[b], p.U[b]);
            EXPECT_EQ(std::memcmp(&got.costs[b], &w, sizeof w), 0)
                << "cost " << b << ": " << got.costs[b] << " vs " << w << " (U_b " << p.U[b] << ")";
        }
        EXPECT_TRUE(std::isinf(got.costs[2]));
        want.costs = got.costs;
        expect_bitwise(got, want, p, two_phase ? "normalized, two-phase" : "normalized, one-shot");
    }
}

// options.batch_mean: the upstream is that of the batch mean, so each sample's is grad_costs
// times 1 / B, then (with normalize_costs) divided by U_b, each rounded to the accumulate type:
// the bits of a call whose upstream the caller divided by hand that way; the costs are not
// averaged. A scalar upstream and a (B) one, the pair and the one-shot call (upstream 1 / B).
// B = 3 and these upstreams: the reciprocal's product differs from a division here.
TEST_P(Layouts, BatchMean) {
    Problem p = random_problem(78, 3, 7, 3, 6, {0, 1, 2}, 0, 1.0, 1, {}, {3, 1, 2});
    quantize_inputs(p, dtype());
    const bool dbl = dtype() == TDT_DTYPE_FLOAT64;
    auto div = [&](double x, int64_t n) { return acc_div(x, n, dbl); };
    auto recip = [&](double x, int64_t n) { return acc_div_recip(x, n, dbl); };
    const std::vector<double> g = {1.25, -1.75, 2.45}, one_g = {2.5};
    for (bool per_label : {false, true})
        for (int call = 0; call < 3; ++call) {  // one-shot, pair with (B), pair with a scalar
            const std::vector<double> &up0 = call == 2 ? one_g : g;
            RunOptions ro;
            ro.dtype = dtype();
            ro.layout = call == 1 ? Layout::Joint : Layout::Contiguous;
            ro.normalize_costs = per_label;
            std::vector<double> up(3);
            for (int b = 0; b < 3; ++b) {
                const double x = recip(call == 0 ? 1.0 : up0[call == 2 ? 0 : b], p.B);
                up[b] = per_label ? div(x, p.U[b]) : x;
            }
            ro.two_phase = true;
            ro.grad_costs = &up;
            ro.normalize_costs = false;
            Output want = run_lib(p, ro);
            ro.normalize_costs = per_label;
            ro.two_phase = call != 0;
            ro.grad_costs = call == 0 ? nullptr : &up0;
            ro.grad_costs_scalar = call == 2;
            ro.batch_mean = true;
            const Output got = run_lib(p, ro);
            ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
            ro.batch_mean = false;
            ro.grad_costs = nullptr;
            ro.grad_costs_scalar = false;
            const Output costs = run_lib(p, ro);  // the costs with no batch mean asked
            EXPECT_EQ(std::memcmp(got.costs.data(), costs.costs.data(), 3 * sizeof(double)), 0)
                << "batch_mean changed the costs (per_label " << per_label << ", call " << call << ")";
            want.costs = got.costs;
            expect_bitwise(got, want, p, std::string("batch mean, ") + (per_label ? "per label, " : "") +
                                             (call == 0 ? "one-shot" : call == 1 ? "pair" : "pair, scalar"));
        }
}

// options.reduction: the costs' sum (or mean) summed in float64 in sample order, rounded once to
// the accumulate type, from every forward call (one-shot, pair, ahead, costs-only), per label or
// not; the costs and gradients are those of the call without it, bit for bit. An infeasible
// sample's +inf carries into it.
TEST_P(Layouts, Reduction) {
    Problem p = random_problem(79, 5, 7, 3, 6, {0, 1, 2}, 0, 1.0, 1, {7, 6, 7, 5, 4}, {3, 1, 2, 3, 0});
    quantize_inputs(p, dtype());
    const bool dbl = dtype() == TDT_DTYPE_FLOAT64;
    for (bool per_label : {false, true})
        for (int call = 0; call < 4; ++call) {  // one-shot, pair, ahead, costs-only
            RunOptions ro;
            ro.dtype = dtype();
            ro.layout = call == 1 ? Layout::Joint : Layout::Contiguous;
            ro.two_phase = call == 1 || call == 2;
            ro.ahead = call == 2;
            ro.costs_only = call == 3;
            ro.normalize_costs = per_label;
            const Output plain = run_lib(p, ro);
            ASSERT_EQ(plain.status, TDT_STATUS_SUCCESS) << plain.error;
            const char *calls[] = {"one-shot", "pair", "ahead", "costs-only"};
            for (tdt_reduction_t r : {TDT_REDUCTION_SUM, TDT_REDUCTION_MEAN}) {
                const std::string what = std::string(r == TDT_REDUCTION_SUM ? "sum, " : "mean, ") +
                                         (per_label ? "per label, " : "") + calls[call];
                ro.reduction = r;
                const Output got = run_lib(p, ro);
                ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << what << ": " << got.error;
                double sum = 0.0;
                for (double c : plain.costs) sum += c;
                double want = r == TDT_REDUCTION_MEAN ? sum / (double)p.B : sum;
                if (!dbl) want = static_cast<float>(want);
                if (per_label) {
                    EXPECT_TRUE(std::isinf(got.reduced)) << what << ": U_b = 0 gives an inf cost";
                } else {
                    EXPECT_TRUE(std::isfinite(got.reduced)) << what;
                }
                EXPECT_EQ(std::memcmp(&got.reduced, &want, sizeof want), 0)
                    << what << ": " << got.reduced << " vs " << want;
                expect_bitwise(got, plain, p, what + ": costs and gradients as without it");
            }
        }
}

// The reduction of an empty batch: a sum of 0, a mean of NaN (0 / 0), as torch gives.
TEST_P(Layouts, ReductionOfNoSample) {
    Problem p = random_problem(80, 0, 4, 2, 5, {0, 1}, 0);
    for (tdt_reduction_t r : {TDT_REDUCTION_SUM, TDT_REDUCTION_MEAN}) {
        RunOptions ro;
        ro.dtype = dtype();
        ro.reduction = r;
        const Output got = run_lib(p, ro);
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        if (r == TDT_REDUCTION_SUM)
            EXPECT_EQ(got.reduced, 0.0) << "the sum of no cost";
        else
            EXPECT_TRUE(std::isnan(got.reduced)) << "the mean of no cost: " << got.reduced;
    }
}

// options.pack: labels and lengths handed over as int64 and packed by the forward call itself
// (run_lib checks the packed array and the verdict): the same bits as int32 arrays given
// directly, for every call shape, and tdt_backward / tdt_scale_gradients reading what the
// forward packed.
TEST_P(Layouts, PackedByTheCall) {
    for (bool rnnt : {false, true}) {
        Problem p = random_problem(81, 4, 7, 3, 6, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2}, 0,
                                   1.0, 1, {7, 5, 6, 4}, {3, 2, 0, 1});
        quantize_inputs(p, dtype());
        const std::vector<double> scale = {0.5, 2.0, 1.0, -3.0};
        const char *calls[] = {"one-shot", "pair", "ahead", "costs-only", "pair, scaled"};
        for (int call = 0; call < 5; ++call) {
            RunOptions ro;
            ro.dtype = dtype();
            ro.layout = call == 1 ? Layout::Joint : Layout::Contiguous;
            ro.two_phase = call == 1 || call == 2 || call == 4;
            ro.ahead = call == 2;
            ro.costs_only = call == 3;
            ro.scale = call == 4 ? &scale : nullptr;
            ro.reduction = call == 0 ? TDT_REDUCTION_MEAN : TDT_REDUCTION_NONE;
            const Output plain = run_lib(p, ro);
            ASSERT_EQ(plain.status, TDT_STATUS_SUCCESS) << plain.error;
            ro.pack = true;
            const Output got = run_lib(p, ro);
            const std::string what = std::string(rnnt ? "RNN-T, " : "TDT, ") + calls[call];
            ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << what << ": " << got.error;
            expect_bitwise(got, plain, p, what + ": packed by the call vs int32 given");
            EXPECT_EQ(std::memcmp(&got.reduced, &plain.reduced, sizeof got.reduced), 0) << what;
        }
    }
}

// ---- options.pack: the empty batch and the errors ------------------------------------------

struct PackCall {  // a CPU forward of B = 2, T = 3, U = 2, V = 4 (blank 3) with options.pack
    std::vector<float> tok = std::vector<float>(2 * 3 * 3 * 4, 0.25f);
    std::vector<float> dur = std::vector<float>(2 * 3 * 3 * 2, 0.5f);
    std::vector<int> durations{0, 1};
    std::vector<int64_t> labels{0, 1, 2, 1}, fl{3, 2}, ll{2, 1};
    std::vector<int32_t> packed = std::vector<int32_t>(2 * (2 + 2), -77);
    std::vector<unsigned char> ws;
    float costs[2] = {0, 0};
    int32_t valid = -1;
    tdt_problem_t p;
    tdt_options_t o;
    tdt_indices_t in;
    PackCall() {
        std::memset(&p, 0, sizeof p);
        p.batch = 2;
        p.max_frames = 3;
        p.max_labels = 2;
        p.vocab_size = 4;
        p.dtype = TDT_DTYPE_FLOAT32;
        p.token_logits = tok.data();
        p.duration_logits = dur.data();
        const int64_t ts[3] = {3 * 3 * 4, 3 * 4, 4}, ds[3] = {3 * 3 * 2, 3 * 2, 2};
        std::memcpy(p.token_strides, ts, sizeof ts);
        std::memcpy(p.duration_strides, ds, sizeof ds);
        p.frame_lengths = packed.data();
        p.label_lengths = packed.data() + 2;
        p.labels = packed.data() + 4;
        std::memset(&o, 0, sizeof o);
        o.blank = 3;
        o.durations = durations.data();
        o.num_durations = 2;
        std::memset(&in, 0, sizeof in);
        in.type = TDT_INDEX_INT64;
        in.labels = labels.data();
        in.columns = 2;
        in.labels_stride = 2;
        in.frame_lengths = fl.data();
        in.label_lengths = ll.data();
        o.pack = &in;
        o.pack_valid = &valid;
        size_t n = 0;
        EXPECT_EQ(tdt_get_workspace_size(&p, &o, &n), TDT_STATUS_SUCCESS);
        ws.assign(n, 0);
    }
    tdt_status_t forward() { return tdt_forward(&p, &o, costs, ws.data(), ws.size()); }
};

// One way to spoil a PackCall, the status it must then give and words its message must hold.
struct PackBad {
    const char *what;
    void (*change)(PackCall &);
    tdt_status_t status;
    const char *message;
};

// The spoiled call: its status, its message, and no cost written; packed: the data check
// refused it, after the packing (the verdict 0, the packed arrays written), else the argument
// checks, before it (neither).
void expect_refused(const PackBad &b, bool packed) {
    SCOPED_TRACE(b.what);
    PackCall c;
    b.change(c);
    EXPECT_EQ(c.forward(), b.status);
    EXPECT_NE(std::string(tdt_last_error()).find(b.message), std::string::npos) << tdt_last_error();
    EXPECT_EQ(c.valid, packed ? 0 : -1) << "the verdict";
    EXPECT_EQ(c.packed[0] != -77, packed) << "the packed arrays (written only by the packing)";
    EXPECT_EQ(c.costs[0], 0.0f) << "costs written by a refused call";
}

TEST(PackOption, EmptyBatchIsValid) {
    PackCall c;
    c.p.batch = 0;
    EXPECT_EQ(c.forward(), TDT_STATUS_SUCCESS) << tdt_last_error();
    EXPECT_EQ(c.valid, 1);
    EXPECT_EQ(c.packed[0], -77) << "nothing to pack";
}

// Bad values: the packed arrays and the verdict written, the error naming the element as the
// caller gave it, nothing else written.
TEST(PackOption, BadValuesNamed) {
    const PackBad bads[] = {
        {"frame length", [](PackCall &c) { c.fl[1] = 4; }, TDT_STATUS_INVALID_LENGTH,
         "options->pack->frame_lengths[1] = 4 is outside [0, 3]"},
        {"label length past the columns", [](PackCall &c) { c.in.columns = 1; c.ll[0] = 2; },
         TDT_STATUS_INVALID_LENGTH, "options->pack->label_lengths[0] = 2 exceeds options->pack->columns = 1"},
        {"label length", [](PackCall &c) { c.ll[1] = -1; }, TDT_STATUS_INVALID_LENGTH,
         "options->pack->label_lengths[1] = -1 is outside [0, 2]"},
        {"blank label", [](PackCall &c) { c.labels[2] = 3; }, TDT_STATUS_INVALID_LABEL,
         "options->pack->labels[1][0] = 3 equals blank 3"},
        {"label past the vocabulary", [](PackCall &c) { c.labels[1] = 9; }, TDT_STATUS_INVALID_LABEL,
         "options->pack->labels[0][1] = 9 is outside [0, 4)"},
        {"label past int32", [](PackCall &c) { c.labels[0] = (int64_t{1} << 32) + 1; },
         TDT_STATUS_INVALID_LABEL, "options->pack->labels[0][0] = 4294967297 is outside int32"},
    };
    for (const PackBad &b : bads) expect_refused(b, true);
    PackCall good;
    EXPECT_EQ(good.forward(), TDT_STATUS_SUCCESS) << tdt_last_error();
    EXPECT_EQ(good.valid, 1);
    EXPECT_EQ(good.packed, (std::vector<int32_t>{3, 2, 2, 1, 0, 1, 2, 1}));
    EXPECT_TRUE(std::isfinite(good.costs[0]) && std::isfinite(good.costs[1]));
}

TEST(PackOption, ArgumentErrors) {
    const PackBad bads[] = {
        {"label_lengths apart", [](PackCall &c) { c.p.label_lengths = c.packed.data() + 3; },
         TDT_STATUS_INVALID_OPTION, "is not problem->frame_lengths"},
        {"labels apart", [](PackCall &c) { c.p.labels = c.packed.data() + 5; }, TDT_STATUS_INVALID_OPTION,
         "problem->labels"},
        {"index type", [](PackCall &c) { c.in.type = (tdt_index_type_t)5; }, TDT_STATUS_INVALID_DTYPE,
         "options->pack->type = 5"},
        {"columns", [](PackCall &c) { c.in.columns = -1; }, TDT_STATUS_INVALID_SIZE, "options->pack->columns"},
        {"stride", [](PackCall &c) { c.in.labels_stride = -2; }, TDT_STATUS_INVALID_STRIDES,
         "options->pack->labels_stride"},
        {"NULL labels", [](PackCall &c) { c.in.labels = nullptr; }, TDT_STATUS_NULL_POINTER,
         "options->pack->labels is NULL"},
        {"NULL lengths", [](PackCall &c) { c.in.frame_lengths = nullptr; }, TDT_STATUS_NULL_POINTER,
         "options->pack->frame_lengths is NULL"},
    };
    for (const PackBad &b : bads) expect_refused(b, false);
    // the backward ignores it: a bad pack there is never looked at
    PackCall c;
    ASSERT_EQ(c.forward(), TDT_STATUS_SUCCESS) << tdt_last_error();
    c.in.type = (tdt_index_type_t)5;
    std::vector<float> gtok(c.tok.size()), gdur(c.dur.size());
    tdt_gradients_t g;
    std::memset(&g, 0, sizeof g);
    g.token_grads = gtok.data();
    g.duration_grads = gdur.data();
    std::memcpy(g.token_strides, c.p.token_strides, sizeof g.token_strides);
    std::memcpy(g.duration_strides, c.p.duration_strides, sizeof g.duration_strides);
    c.valid = -1;
    EXPECT_EQ(tdt_backward(&c.p, &c.o, nullptr, &g, c.ws.data(), c.ws.size()), TDT_STATUS_SUCCESS)
        << tdt_last_error();
    EXPECT_EQ(c.valid, -1) << "tdt_backward wrote options.pack_valid";
}

// tdt_scale_gradients: each element inside sample b's lattice times scale[b], rounded once to the
// dtype; zeros (an infeasible sample's gradient, whatever its factor) and everything outside the
// lattices stay as they were; in every layout, padded gaps untouched (run_lib checks them).
TEST_P(Layouts, ScaleGradients) {
    for (bool rnnt : {false, true}) {
        // sample 3 infeasible (its one label, 1, has probability 0 everywhere): its gradient is
        // 0 inside its lattice and must stay 0 under an infinite factor
        Problem p = random_problem(77, 4, 7, 3, 6, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2}, 0,
                                   1.0, 1, {7, 5, 6, 4}, {3, 2, 0, 1});
        p.labels[3 * p.maxU] = 1;
        for (int64_t t = 0; t < p.maxT; ++t)
            for (int64_t u = 0; u <= p.maxU; ++u) p.tok[p.node(3, t, u) * p.V + 1] = -std::numeric_limits<double>::infinity();
        quantize_inputs(p, dtype());
        const std::vector<double> s = {0.3, 1.0, -2.5, std::numeric_limits<double>::infinity()};
        for (Layout layout : {Layout::Contiguous, Layout::Joint, Layout::Padded}) {
            const std::string what = std::string(rnnt ? "RNN-T " : "TDT ") + layout_name(layout);
            RunOptions ro;
            ro.dtype = dtype();
            ro.layout = layout;
            const Output base = run_lib(p, ro);
            ASSERT_EQ(base.status, TDT_STATUS_SUCCESS) << base.error;
            ASSERT_TRUE(std::isinf(base.costs[3])) << what << ": sample 3 should be infeasible";
            ro.scale = &s;
            const Output got = run_lib(p, ro);
            ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
            Output want = base;
            auto expect_scaled = [&](std::vector<double> &g, int64_t width) {
                for (int64_t b = 0; b < p.B; ++b) {
                    // the factor as the library reads it: of the accumulate type
                    const double f = dtype() == TDT_DTYPE_FLOAT64 ? s[b] : static_cast<double>(static_cast<float>(s[b]));
                    for (int64_t t = 0; t < p.T[b]; ++t)
                        for (int64_t u = 0; u <= p.U[b]; ++u)
                            for (int64_t k = 0; k < width; ++k) {
                                double &x = g[p.node(b, t, u) * width + k];
                                if (x != 0.0) x = quantize(x * f, dtype());
                            }
                }
            };
            expect_scaled(want.gtok, p.V);
            if (!rnnt) expect_scaled(want.gdur, p.D());
            expect_bitwise(got, want, p, what + ": scaled by {0.3, 1, -2.5, inf} vs each element times its factor");
            expect_zero_outside_lattices(got, p);
            // one factor for all (options.grad_costs_scalar)
            const std::vector<double> one(1, -0.75), rep(4, -0.75);
            ro.scale = &rep;
            const Output expected = run_lib(p, ro);
            ro.scale = &one;
            ro.scale_scalar = true;
            expect_bitwise(run_lib(p, ro), expected, p, what + ": scalar {-0.75} vs {-0.75} x 4");
        }
    }
}

// tdt_forward_ahead on the CPU writes nothing ahead (the pair costs the same there): it is
// tdt_forward, and tdt_backward follows on its workspace.
TEST_P(Layouts, ForwardAheadIsTheForwardOnTheCpu) {
    const Problem p = problem(false, 78);
    const std::vector<double> g = {0.5, -2.0, 3.0};
    RunOptions ro;
    ro.dtype = dtype();
    ro.two_phase = true;
    ro.grad_costs = &g;
    const Output pair = run_lib(p, ro);
    ro.ahead = true;
    expect_bitwise(run_lib(p, ro), pair, p, "tdt_forward_ahead + tdt_backward vs the pair");
}

// Only one gradient requested: that one, unchanged.
TEST_P(Layouts, OneGradientOnly) {
    const Problem p = problem(false, 76);
    const Output both = run(p, Layout::Contiguous);
    RunOptions ro;
    ro.dtype = dtype();
    ro.want_dur = false;
    Output tok = run_lib(p, ro);
    ASSERT_TRUE(tok.gdur.empty());
    Output b1 = both;
    b1.gdur.clear();
    expect_bitwise(tok, b1, p, "token gradient only");
    ro.want_dur = true;
    ro.want_tok = false;
    Output dur = run_lib(p, ro);
    Output b2 = both;
    b2.gtok.clear();
    expect_bitwise(dur, b2, p, "duration gradient only");
}

// ---- determinism -------------------------------------------------------------------------------

TEST_P(Layouts, BitwiseDeterministic) {
    for (bool rnnt : {false, true}) {
        Problem p = random_problem(77, 6, 24, 9, 33, rnnt ? std::vector<int>{} : std::vector<int>{0, 1, 2, 3, 4}, rnnt ? 0 : 32);
        quantize_inputs(p, dtype());
        p.num_threads = 1;
        const Output one = run(p, Layout::Contiguous);
        ASSERT_EQ(one.status, TDT_STATUS_SUCCESS) << one.error;
        expect_bitwise(run(p, Layout::Contiguous), one, p, "1 thread, twice");
        p.num_threads = 2;
        const Output two = run(p, Layout::Contiguous);
        expect_bitwise(two, one, p, "2 threads vs 1 thread");
        expect_bitwise(run(p, Layout::Contiguous), two, p, "2 threads, twice");
        p.num_threads = 3;  // more threads than this machine may have
        expect_bitwise(run(p, Layout::Contiguous), one, p, "3 threads vs 1 thread");
        p.num_threads = 0;
        expect_bitwise(run(p, Layout::Contiguous, true), one, p, "default threads, forward+backward vs 1 thread");
    }
}

// The library is reentrant: two threads computing at once get the same bits as one at a time.
TEST_P(Layouts, ConcurrentCallsFromTwoThreads) {
    const Problem p = problem(false, 79), q = problem(true, 80);
    const Output p1 = run(p, Layout::Contiguous), q1 = run(q, Layout::Joint);
    Output p2, q2;
    std::thread a([&] { p2 = run(p, Layout::Contiguous); });
    std::thread b([&] { q2 = run(q, Layout::Joint); });
    a.join();
    b.join();
    expect_bitwise(p2, p1, p, "TDT in a thread next to another call");
    expect_bitwise(q2, q1, q, "RNN-T in a thread next to another call");
}

// Any alignment of the workspace pointer is accepted and changes nothing.
TEST_P(Layouts, MisalignedWorkspace) {
    const Problem p = problem(false, 78);
    const Output base = run(p, Layout::Contiguous);
    for (size_t m : {1, 3, 8, 100}) {
        RunOptions ro;
        ro.dtype = dtype();
        ro.misalign = m;
        expect_bitwise(run_lib(p, ro), base, p, "workspace misaligned by " + std::to_string(m));
        ro.two_phase = true;
        expect_bitwise(run_lib(p, ro), base, p, "workspace misaligned by " + std::to_string(m) + ", fwd+bwd");
    }
}

// Thread counts go through the num_threads clause: the caller's OpenMP settings are untouched.
TEST(Threads, OpenMPGlobalStateUntouched) {
    const int before = omp_get_max_threads();
    Problem p = random_problem(81, 3, 6, 3, 5, {0, 1, 2}, 0);
    for (int n : {1, 2, before + 1, 0}) {
        p.num_threads = n;
        ASSERT_EQ(lib(p).status, TDT_STATUS_SUCCESS);
        EXPECT_EQ(omp_get_max_threads(), before) << "after a call with num_threads " << n;
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Layouts, ::testing::ValuesIn(kAllDtypes), dtype_param_name);
