/*
 * test_golden.cc - hand-computable lattices and published values of peers' test suites.
 */
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "data/golden.h"
#include "data/parakeet_fixture.h"
#include "test_util.h"

using namespace tdt_test;

namespace {

// Expected output of one sample from a flat gradient table.
Output expected(std::vector<double> costs, std::vector<double> gtok, std::vector<double> gdur = {}) {
    Output o;
    o.costs = std::move(costs);
    o.gtok = std::move(gtok);
    o.gdur = std::move(gdur);
    return o;
}

std::vector<double> flat(const double *a, size_t n) { return std::vector<double>(a, a + n); }

// The two float dtypes every published value is checked in; tolerances widen to the golden
// value's own precision.
class Golden : public ::testing::TestWithParam<tdt_dtype_t> {
  protected:
    Tol tol(double cost_abs, double grad_abs) const {
        Tol t = tol_for(GetParam());
        t.cost_abs = std::max(t.cost_abs, cost_abs);
        t.grad_abs = std::max(t.grad_abs, grad_abs);
        return t;
    }
    Output run(Problem p) const {
        RunOptions ro;
        ro.dtype = GetParam();
        return run_lib(p, ro);
    }
};

}  // namespace

// ---- hand-computable lattices ------------------------------------------------------------------

// TDT, T=2, U=1 (label 1), V=2 (blank 0), durations {0, 1}, every logit 0: every token and
// duration probability is 1/2, so every arc weighs 1/4. Arcs (d = duration):
//   A: (0,0) -label d0-> (0,1) -blank d1-> (1,1) -blank d1-> end    (1/4)^3
//   B: (0,0) -label d1-> (1,1) -blank d1-> end                      (1/4)^2
//   C: (0,0) -blank d1-> (1,0) -label d0-> (1,1) -blank d1-> end    (1/4)^3
// P = 1/64 + 4/64 + 1/64 = 3/32, cost = log(32/3); path posteriors A = C = 1/6, B = 2/3.
// Gradient dz_v = p_v occ - [blank] occB - [label] occL, dh_k = q_k occ - occ_k:
//   (0,0): occ 1, occB 1/6 (k1), occL 1/6 (k0) + 2/3 (k1): dz = {1/3, -1/3}, dh = {1/3, -1/3}
//   (0,1): occ 1/6, blank k1:                              dz = {-1/12, 1/12}, dh = {1/12, -1/12}
//   (1,0): occ 1/6, label k0:                              dz = {1/12, -1/12}, dh = {-1/12, 1/12}
//   (1,1): occ 1, blank k1 (terminal):                     dz = {-1/2, 1/2},   dh = {1/2, -1/2}
TEST_P(Golden, HandComputedTdtT2U1ZeroLogits) {
    const Problem p = make_problem(2, 1, 2, {1}, std::vector<double>(8, 0.0), std::vector<double>(8, 0.0),
                                   {0, 1}, 0);
    const double a = 1.0 / 3, b = 1.0 / 12, c = 0.5;
    const Output want = expected({std::log(32.0 / 3.0)},
                                 {a, -a, -b, b, /* t=1 */ b, -b, -c, c},
                                 {a, -a, b, -b, /* t=1 */ -b, b, c, -c});
    expect_near(run(p), want, p, tol(0, 0), "TDT T=2 U=1, zero logits");
}

// The same lattice with distinct logits: the cost in closed form from the three paths.
TEST_P(Golden, ClosedFormTdtT2U1) {
    // Token logits (blank 0, label 1) and duration logits (d0, d1) per node (t, u).
    const double z[2][2][2] = {{{0.3, -0.2}, {1.1, 0.4}}, {{-0.7, 0.9}, {0.25, -1.3}}};
    const double h[2][2][2] = {{{0.5, -0.5}, {-0.1, 0.8}}, {{1.2, 0.1}, {-0.4, 0.6}}};
    auto pt = [&](int t, int u, int v) { return std::exp(z[t][u][v]) / (std::exp(z[t][u][0]) + std::exp(z[t][u][1])); };
    auto qd = [&](int t, int u, int k) { return std::exp(h[t][u][k]) / (std::exp(h[t][u][0]) + std::exp(h[t][u][1])); };
    const double end = pt(1, 1, 0) * qd(1, 1, 1);  // terminal blank d1 from (1,1)
    const double P = pt(0, 0, 1) * qd(0, 0, 0) * pt(0, 1, 0) * qd(0, 1, 1) * end  // A
                     + pt(0, 0, 1) * qd(0, 0, 1) * end                             // B
                     + pt(0, 0, 0) * qd(0, 0, 1) * pt(1, 0, 1) * qd(1, 0, 0) * end;  // C
    Problem p = make_problem(2, 1, 2, {1}, flat(&z[0][0][0], 8), flat(&h[0][0][0], 8), {0, 1}, 0);
    ASSERT_NEAR(run_ref(p).costs[0], -std::log(P), 1e-14) << "the reference disagrees with the closed form";
    quantize_inputs(p, GetParam());
    const Output got = run(p);
    expect_near(got, run_ref(p), p, tol(0, 0), "closed-form TDT T=2 U=1, against the reference");
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS);
    EXPECT_NEAR(got.costs[0], -std::log(P), GetParam() == TDT_DTYPE_FLOAT64 ? 1e-12 : 1e-5);
}

// Plain RNN-T, T=2, U=1 (label 1), V=2 (blank 0), zero logits: two paths of three arcs of
// weight 1/2 each, P = 1/4, cost log 4, each path has posterior 1/2:
//   (0,0): occB = occL = 1/2 -> dz = {0, 0};   (0,1): blank 1/2 -> {-1/4, 1/4}
//   (1,0): label 1/2 -> {1/4, -1/4};          (1,1): terminal blank 1 -> {-1/2, 1/2}
TEST_P(Golden, HandComputedRnntT2U1ZeroLogits) {
    const Problem p = make_problem(2, 1, 2, {1}, std::vector<double>(8, 0.0), {}, {}, 0);
    const Output want = expected({std::log(4.0)}, {0, 0, -0.25, 0.25, 0.25, -0.25, -0.5, 0.5});
    expect_near(run(p), want, p, tol(0, 0), "RNN-T T=2 U=1, zero logits");
}

// ---- NeMo ----------------------------------------------------------------------------------------

// NVIDIA/NeMo tests/collections/asr/numba/rnnt_loss/test_rnnt_pytorch.py,
// TestTDTLoss::test_case_fixed_case_act_label (values in data/golden.h). The joint tensor is
// (1, 3, 2, 4 + 3); its token part is our token logits, the rest the duration logits.
TEST_P(Golden, NemoTdtFixedCase) {
    Problem p = make_problem(3, 1, 4, {0}, std::vector<double>(24, 0.0), std::vector<double>(18, 0.0),
                             {0, 1, 2}, 3);
    p.sigma = 0.05;
    std::vector<double> gt, gd;
    for (int t = 0; t < 3; ++t)
        for (int u = 0; u < 2; ++u) {
            gt.insert(gt.end(), golden::kNemoTdtGrad[t][u], golden::kNemoTdtGrad[t][u] + 4);
            gd.insert(gd.end(), golden::kNemoTdtGrad[t][u] + 4, golden::kNemoTdtGrad[t][u] + 7);
        }
    // The published cost has 7 digits, the gradients 8 (NeMo computes in float32).
    expect_near(run(p), expected({golden::kNemoTdtCost}, gt, gd), p, tol(1e-6, 2e-7), "NeMo TDT fixed case");
}

// ---- warp-transducer small test ------------------------------------------------------------------

namespace {
Problem small_problem(bool log_probs) {
    Problem p = make_problem(2, 2, 5, {golden::kSmallLabels[0], golden::kSmallLabels[1]},
                             flat(&golden::kSmallActs[0][0][0], 30), {}, {}, 0);
    if (log_probs) to_log_probs(p);  // what warp-transducer's CPU test feeds its CPU entry point
    return p;
}
}  // namespace

// Raw logits (NeMo test_case_small): cost 4.495666 and the logit gradients.
TEST_P(Golden, WarpTransducerSmallLogits) {
    Problem p = small_problem(false);
    quantize_inputs(p, GetParam());
    expect_near(run(p), expected({golden::kSmallCost}, flat(&golden::kSmallGradLogits[0][0][0], 30)), p,
                tol(1e-6, 5e-7), "warp-transducer small_test, logits");
}

// Log-probs (warp-transducer tests/test_cpu.cpp small_test, pytorch_binding small_test).
TEST_P(Golden, WarpTransducerSmallLogProbs) {
    Problem p = small_problem(true);
    quantize_inputs(p, GetParam());
    expect_near(run(p), expected({golden::kSmallCost}, flat(&golden::kSmallGradLogProbs[0][0][0], 30)), p,
                tol(1e-6, 1e-12), "warp-transducer small_test, log-probs");
}

// NeMo test_case_small_clamp: clamp 0.1 clips the logit gradients, leaves the cost.
TEST_P(Golden, NemoSmallClamp) {
    Problem p = small_problem(false);
    p.clamp = 0.1;
    quantize_inputs(p, GetParam());
    expect_near(run(p), expected({golden::kSmallCost}, flat(&golden::kSmallGradLogitsClamp01[0][0][0], 30)),
                p, tol(1e-6, 5e-7), "NeMo small_test with clamp 0.1");
}

// NeMo test_case_small_fastemit_clamp: the FastEmit cost is (1 + lambda) * 4.495666.
TEST_P(Golden, NemoSmallFastEmitCost) {
    for (double lambda : {1.0, 0.01, 0.00001}) {
        SCOPED_TRACE(::testing::Message() << "fastemit_lambda " << lambda);
        Problem p = small_problem(false);
        p.fastemit = lambda;
        p.clamp = 0.1;
        quantize_inputs(p, GetParam());
        const Output got = run(p);
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        EXPECT_NEAR(got.costs[0], golden::kSmallCost * (1 + lambda), 2e-6 * (1 + lambda));
    }
}

// ---- warp-transducer options test ----------------------------------------------------------------

namespace {
Problem options_problem(bool log_probs) {
    Problem p;
    p.B = 2;
    p.maxT = 4;
    p.maxU = 2;
    p.V = 3;
    p.blank = 0;
    p.tok = flat(&golden::kOptionsActs[0][0][0][0], 72);
    p.labels = {golden::kOptionsLabels[0][0], golden::kOptionsLabels[0][1], golden::kOptionsLabels[1][0],
                golden::kOptionsLabels[1][1]};
    p.T = {4, 4};
    p.U = {2, 2};
    if (log_probs) to_log_probs(p);
    return p;
}
}  // namespace

TEST_P(Golden, WarpTransducerOptionsLogits) {
    Problem p = options_problem(false);
    quantize_inputs(p, GetParam());
    // Costs: published with 17 digits (a float64 computation); gradients: NeMo's float32 run.
    expect_near(run(p), expected(flat(golden::kOptionsCosts, 2), flat(&golden::kOptionsGradLogits[0][0][0][0], 72)),
                p, tol(1e-12, 5e-7), "warp-transducer options_test, logits");
}

TEST_P(Golden, WarpTransducerOptionsLogProbs) {
    Problem p = options_problem(true);
    quantize_inputs(p, GetParam());
    expect_near(run(p),
                expected(flat(golden::kOptionsCosts, 2), flat(&golden::kOptionsGradLogProbs[0][0][0][0], 72)),
                p, tol(1e-12, 1e-12), "warp-transducer options_test, log-probs");
}

// ---- transformers Parakeet fixture ----------------------------------------------------------------

// huggingface/transformers tests/models/parakeet/generate_tdt_loss_fixtures.py (data and
// provenance in data/parakeet_fixture.h): per-sample losses 12.923372 and 9.054794, passed as
// the two strided slices of the joint tensor, as a Parakeet model would.
TEST_P(Golden, TransformersParakeetFixture) {
    using namespace golden;
    Problem p;
    p.B = kParakeetB;
    p.maxT = kParakeetT;
    p.maxU = kParakeetU;
    p.V = kParakeetV;
    p.blank = kParakeetV - 1;
    p.durations.assign(kParakeetDurations, kParakeetDurations + kParakeetD);
    for (int64_t n = 0; n < p.nodes(); ++n) {
        const float *row = &kParakeetJoint[n * (kParakeetV + kParakeetD)];
        p.tok.insert(p.tok.end(), row, row + kParakeetV);
        p.dur.insert(p.dur.end(), row + kParakeetV, row + kParakeetV + kParakeetD);
    }
    p.labels.assign(&kParakeetTargets[0][0], &kParakeetTargets[0][0] + 8);
    p.T.assign(kParakeetFrames, kParakeetFrames + 2);
    p.U.assign(kParakeetLabels, kParakeetLabels + 2);
    RunOptions ro;
    ro.dtype = GetParam();
    ro.layout = Layout::Joint;
    const Output got = run_lib(p, ro);
    // Costs to the fixture's 8 digits; gradients (not published) against the reference.
    Output want = run_ref(p);
    want.costs.assign(kParakeetLosses, kParakeetLosses + 2);
    expect_near(got, want, p, tol(2e-6, 0), "transformers Parakeet fixture");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Golden, ::testing::Values(TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32),
                         [](const ::testing::TestParamInfo<tdt_dtype_t> &i) { return std::string(dtype_name(i.param)); });
