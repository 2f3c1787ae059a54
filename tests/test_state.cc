/*
 * test_state.cc - options.state_in_grads on the CPU: the per-node blocks (3 + D doubles a node)
 * kept at the head of each token-gradient row instead of in the workspace. The option only moves
 * where the state lives, so every result must be the same bits as without it; the workspace
 * shrinks by those blocks; and the calls that have no row of their own to put them in are
 * refused before anything is written.
 */
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

using namespace tdt_test;

namespace {

// The smallest vocab_size whose token-gradient row holds a node's block: 8 (3 + D) bytes plus,
// for rows aligned to their element only, the 8 - size bytes that rounding the row's head up to
// a double may skip (tdt.h, state_in_grads).
int64_t min_vocab(tdt_dtype_t dt, int D) {
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    const int64_t need = 8 * (3 + D) + (es < 8 ? 8 - es : 0);
    return (need + es - 1) / es;
}

std::string durations_name(const std::vector<int> &d) {
    if (d.empty()) return "RNN-T";
    std::string s = "durations {";
    for (size_t k = 0; k < d.size(); ++k) s += (k ? "," : "") + std::to_string(d[k]);
    return s + "}";
}

// Runs p with and without the option, the same call otherwise, and wants the same bits.
void expect_same_bits(const Problem &p, RunOptions ro, const std::string &what) {
    ro.state_in_grads = false;
    const Output want = run_lib(p, ro);
    ro.state_in_grads = true;
    const Output got = run_lib(p, ro);
    const std::string full = what + ", " + dtype_name(ro.dtype) + ", " + layout_name(ro.layout) +
                             (ro.two_phase ? (ro.ahead ? ", forward_ahead + backward" : ", pair") : ", one-shot");
    expect_bitwise(got, want, p, full + ": with state_in_grads against without");
    if (p.nodes() > 0) {  // the option reached the library: the blocks left the workspace
        EXPECT_LT(got.workspace_bytes, want.workspace_bytes) << full << ": the workspace did not shrink";
    }
    EXPECT_EQ(std::memcmp(&got.reduced, &want.reduced, sizeof got.reduced), 0)
        << full << ": the reduced cost, " << got.reduced << " with the option, " << want.reduced << " without";
}

const std::vector<tdt_dtype_t> kAllDtypes = {TDT_DTYPE_FLOAT64, TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16,
                                             TDT_DTYPE_BFLOAT16};
const std::vector<std::vector<int>> kDurationSets = {{0, 1, 2, 3, 4}, {1, 2, 4}, {}};

// (durations set, dtype, layout, forward_ahead + backward instead of the one-shot call)
using SameBitsParam = std::tuple<int, tdt_dtype_t, Layout, bool>;
class StateInGradsSameBits : public ::testing::TestWithParam<SameBitsParam> {};

// A ragged batch (T_b in [3, 9], U_b in [0, 5]), options varied with the layout and the call so
// that each of sigma, FastEmit, the clamp, log-probs and normalize_costs meets the option. V = 40
// for TDT (joint 16-bit rows of 45 or 43 elements: row heads at 0, 2, 4 and 6 bytes mod 8) and
// 41 for RNN-T (rows of an odd element count for every narrow dtype).
TEST_P(StateInGradsSameBits, WithAndWithout) {
    const std::vector<int> &durs = kDurationSets[std::get<0>(GetParam())];
    RunOptions ro;
    ro.dtype = std::get<1>(GetParam());
    ro.layout = std::get<2>(GetParam());
    ro.two_phase = ro.ahead = std::get<3>(GetParam());
    const int64_t V = durs.empty() ? 41 : 40;
    Problem p = random_problem(700 + std::get<0>(GetParam()), 5, 9, 5, V, durs, durs.empty() ? 0 : 7, 1.0, 3);
    switch (ro.layout) {
    case Layout::Joint: p.sigma = 0.05; p.fastemit = 0.01; break;
    case Layout::Padded: p.clamp = 0.5; to_log_probs(p); break;
    default: break;
    }
    const std::vector<double> upstream = {0.5, -2.0, 1.0, 0.25, 3.0};
    if (ro.ahead) {
        ro.grad_costs = &upstream;
        ro.normalize_costs = true;
        for (int64_t b = 0; b < p.B; ++b)  // costs / U_b: no U_b = 0 (infinite gradients hide all)
            if (p.U[b] == 0) {
                p.U[b] = 1;
                p.labels[b * p.maxU] = 1;
            }
    }
    quantize_inputs(p, ro.dtype);
    expect_same_bits(p, ro, durations_name(durs));
}

std::string same_bits_name(const ::testing::TestParamInfo<SameBitsParam> &i) {
    static const char *const durs[] = {"Tdt01234", "Tdt124", "Rnnt"};
    std::string layout = layout_name(std::get<2>(i.param));
    layout[0] = static_cast<char>(layout[0] - 'a' + 'A');
    return std::string(durs[std::get<0>(i.param)]) + "_" + dtype_name(std::get<1>(i.param)) + "_" + layout +
           (std::get<3>(i.param) ? "_Ahead" : "_OneShot");
}

INSTANTIATE_TEST_SUITE_P(StateInGrads, StateInGradsSameBits,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::ValuesIn(kAllDtypes),
                                            ::testing::Values(Layout::Contiguous, Layout::Joint, Layout::Padded),
                                            ::testing::Bool()),
                         same_bits_name);

// At the smallest vocab_size the option takes, the block fills the row up to the last byte the
// rounding may need: the same bits, in joint rows (heads at every alignment the dtype allows)
// and padded ones, one-shot and in two phases, with a batch reduction written as well.
TEST(StateInGrads, SameBitsAtTheMinimumVocab) {
    for (const std::vector<int> &durs : kDurationSets)
        for (tdt_dtype_t dt : kAllDtypes) {
            const int64_t V = min_vocab(dt, static_cast<int>(durs.size()));
            Problem p = random_problem(800 + V, 4, 7, 4, V, durs, 0, 1.0, 2);
            quantize_inputs(p, dt);
            for (Layout layout : {Layout::Joint, Layout::Padded})
                for (bool ahead : {false, true}) {
                    RunOptions ro;
                    ro.dtype = dt;
                    ro.layout = layout;
                    ro.two_phase = ro.ahead = ahead;
                    ro.reduction = TDT_REDUCTION_SUM;
                    expect_same_bits(p, ro, durations_name(durs) + ", V = " + std::to_string(V) + " (the minimum)");
                }
        }
}

// tdt_scale_gradients ignores the option: after the one-shot call, scaling with it set gives
// the bits of scaling without it.
TEST(StateInGrads, ScaleGradientsIgnoresIt) {
    Problem p = random_problem(811, 3, 6, 3, 20, {0, 1, 2}, 0, 1.0, 2);
    const std::vector<double> scale = {2.0, -0.5, 3.0};
    RunOptions ro;
    ro.dtype = TDT_DTYPE_FLOAT32;
    ro.layout = Layout::Joint;
    ro.scale = &scale;
    quantize_inputs(p, ro.dtype);
    expect_same_bits(p, ro, "scaled");
}

// ---- the workspace --------------------------------------------------------------------------

// Smaller by the blocks, N (3 + D) doubles, up to the 256-byte rounding of each sub-buffer.
TEST(StateInGrads, WorkspaceSmallerByTheBlocks) {
    struct Shape { int64_t B, T, U; };
    const Shape shapes[] = {{1, 1, 0}, {3, 7, 4}, {8, 150, 60}, {32, 40, 16}, {5, 33, 1}};
    const int dummy = 0;
    for (const Shape &s : shapes)
        for (const std::vector<int> &durs : kDurationSets) {
            tdt_problem_t prob;
            std::memset(&prob, 0, sizeof prob);
            prob.batch = s.B;
            prob.max_frames = s.T;
            prob.max_labels = s.U;
            prob.vocab_size = 300;
            prob.dtype = TDT_DTYPE_FLOAT32;
            prob.duration_logits = durs.empty() ? nullptr : &dummy;  // a placeholder asks for TDT
            tdt_options_t opt;
            std::memset(&opt, 0, sizeof opt);
            // RNN-T ignores num_durations: give it 5 anyway, its blocks must still be 3 doubles
            opt.num_durations = durs.empty() ? 5 : static_cast<int>(durs.size());
            size_t without = 0, with = 0;
            ASSERT_EQ(tdt_get_workspace_size(&prob, &opt, &without), TDT_STATUS_SUCCESS) << tdt_last_error();
            opt.state_in_grads = 1;
            ASSERT_EQ(tdt_get_workspace_size(&prob, &opt, &with), TDT_STATUS_SUCCESS) << tdt_last_error();
            const int64_t N = s.B * s.T * (s.U + 1), W = 3 + static_cast<int64_t>(durs.size());
            const int64_t diff = static_cast<int64_t>(without) - static_cast<int64_t>(with);
            EXPECT_GE(diff, N * W * 8 - 256) << durations_name(durs) << " B=" << s.B << " T=" << s.T << " U=" << s.U
                                             << ": " << without << " bytes without, " << with << " with";
            EXPECT_LE(diff, N * W * 8 + 256) << durations_name(durs) << " B=" << s.B << " T=" << s.T << " U=" << s.U
                                             << ": " << without << " bytes without, " << with << " with";
        }
}

// ---- refusals -------------------------------------------------------------------------------

// The call is refused with INVALID_OPTION naming the option, and writes nothing.
void expect_refused(const Problem &p, RunOptions ro, const std::string &what) {
    ro.state_in_grads = true;
    const Output o = run_lib(p, ro);
    EXPECT_EQ(o.status, TDT_STATUS_INVALID_OPTION) << what << ": " << tdt_status_string(o.status) << " / " << o.error;
    EXPECT_NE(o.error.find("state_in_grads"), std::string::npos) << what << ": the error does not name the option: "
                                                                 << o.error;
    EXPECT_TRUE(o.untouched) << what << ": the refused call wrote costs or gradients";
}

// Every call that has no token-gradient row of its own for the blocks.
TEST(StateInGrads, RefusedWithoutTokenGradientOrInPlace) {
    for (const std::vector<int> &durs : kDurationSets) {
        const Problem p = random_problem(820, 3, 6, 3, 40, durs, 0, 1.0, 2);
        const std::string name = durations_name(durs);
        RunOptions ro;
        ro.dtype = TDT_DTYPE_FLOAT32;
        RunOptions c = ro;
        c.costs_only = true;
        expect_refused(p, c, name + ", compute_tdt_loss without gradients");
        RunOptions a = c;
        a.two_phase = a.ahead = true;
        expect_refused(p, a, name + ", tdt_forward_ahead without gradients");
        RunOptions f = ro;
        f.two_phase = true;  // tdt_forward: never a gradient
        expect_refused(p, f, name + ", tdt_forward");
        RunOptions d = ro;
        d.want_tok = false;  // the duration gradient alone does not do
        expect_refused(p, d, name + ", no token gradient");
        RunOptions i = ro;
        i.layout = Layout::InPlace;
        expect_refused(p, i, name + ", in place, one-shot");
        i.two_phase = i.ahead = true;
        expect_refused(p, i, name + ", in place, forward_ahead");
        for (tdt_dtype_t dt : {TDT_DTYPE_FLOAT64, TDT_DTYPE_BFLOAT16}) {
            RunOptions n = i;
            n.dtype = dt;
            n.two_phase = n.ahead = false;
            expect_refused(p, n, name + ", in place, " + dtype_name(dt));
        }
    }
}

// Rows one element short of a block are refused, the smallest that hold one accepted (and
// right: the same bits as without the option).
TEST(StateInGrads, VocabBoundaries) {
    // the documented minima (tdt.h), against the rule min_vocab() computes
    EXPECT_EQ(min_vocab(TDT_DTYPE_FLOAT32, 5), 17);
    EXPECT_EQ(min_vocab(TDT_DTYPE_BFLOAT16, 5), 35);
    EXPECT_EQ(min_vocab(TDT_DTYPE_FLOAT16, 5), 35);
    EXPECT_EQ(min_vocab(TDT_DTYPE_FLOAT64, 5), 8);
    EXPECT_EQ(min_vocab(TDT_DTYPE_FLOAT32, 0), 7);
    struct Case { tdt_dtype_t dt; std::vector<int> durs; };
    const Case cases[] = {{TDT_DTYPE_FLOAT32, {0, 1, 2, 3, 4}}, {TDT_DTYPE_BFLOAT16, {0, 1, 2, 3, 4}},
                          {TDT_DTYPE_FLOAT16, {0, 1, 2, 3, 4}}, {TDT_DTYPE_FLOAT64, {0, 1, 2, 3, 4}},
                          {TDT_DTYPE_FLOAT32, {}},              {TDT_DTYPE_BFLOAT16, {}},
                          {TDT_DTYPE_FLOAT64, {}},              {TDT_DTYPE_FLOAT32, {1, 2, 4}}};
    for (const Case &c : cases) {
        const int64_t V = min_vocab(c.dt, static_cast<int>(c.durs.size()));
        const std::string name = durations_name(c.durs) + ", " + dtype_name(c.dt) + ", V = ";
        RunOptions ro;
        ro.dtype = c.dt;
        Problem ok = random_problem(830 + V, 3, 5, 3, V, c.durs, 0, 1.0, 2);
        quantize_inputs(ok, c.dt);
        expect_same_bits(ok, ro, name + std::to_string(V));
        Problem short_rows = random_problem(830 + V, 3, 5, 3, V - 1, c.durs, 0, 1.0, 2);
        expect_refused(short_rows, ro, name + std::to_string(V - 1));
        RunOptions a = ro;
        a.two_phase = a.ahead = true;
        expect_refused(short_rows, a, name + std::to_string(V - 1) + ", forward_ahead");
    }
}

// No node, nothing to keep: an empty batch or max_frames = 0 takes the option without any
// gradient, and with rows too short for a block.
TEST(StateInGrads, NoNodesAccepted) {
    for (const std::vector<int> &durs : kDurationSets) {
        const Problem empty = random_problem(840, 0, 5, 3, 2, durs), no_frames = random_problem(841, 3, 0, 2, 2, durs);
        for (const Problem *p : {&empty, &no_frames}) {
            const std::string name = durations_name(durs) + (p == &empty ? ", B = 0" : ", max_frames = 0");
            RunOptions ro;
            ro.dtype = TDT_DTYPE_FLOAT32;
            ro.state_in_grads = true;
            RunOptions c = ro;
            c.costs_only = true;
            RunOptions f = ro;
            f.two_phase = true;
            RunOptions a = c;
            a.two_phase = a.ahead = true;
            for (const RunOptions *r : {&c, &f, &a, &ro}) {
                const Output o = run_lib(*p, *r);
                EXPECT_EQ(o.status, TDT_STATUS_SUCCESS)
                    << name << (r == &c ? ", costs only" : r == &f ? ", tdt_forward" : r == &a ? ", forward_ahead" : ", V = 2 with gradients")
                    << ": " << o.error;
            }
        }
    }
}

// ---- the two phases must agree on the option (CPU: the workspace header records it) --------

// tdt_forward_ahead with the option one way and tdt_backward the other is INVALID_WORKSPACE,
// and writes nothing: the matching tdt_backward afterwards still gives the one-shot call's bits.
TEST(StateInGrads, BackwardMustMatchTheForward) {
    Problem p = random_problem(850, 3, 6, 4, 24, {0, 1, 2, 3, 4}, 0, 1.0, 2);
    quantize_inputs(p, TDT_DTYPE_FLOAT32);
    const Output want = run_lib(p, RunOptions());  // float64 one-shot, checked against below
    std::vector<float> tok(p.tok.begin(), p.tok.end()), dur(p.dur.begin(), p.dur.end());
    const int64_t V = p.V, D = p.D(), R = p.maxU + 1;
    tdt_problem_t prob;
    std::memset(&prob, 0, sizeof prob);
    prob.batch = p.B;
    prob.max_frames = p.maxT;
    prob.max_labels = p.maxU;
    prob.vocab_size = V;
    prob.dtype = TDT_DTYPE_FLOAT32;
    prob.token_logits = tok.data();
    const int64_t ts[3] = {p.maxT * R * V, R * V, V}, ds[3] = {p.maxT * R * D, R * D, D};
    std::memcpy(prob.token_strides, ts, sizeof ts);
    prob.duration_logits = dur.data();
    std::memcpy(prob.duration_strides, ds, sizeof ds);
    prob.labels = p.labels.data();
    prob.frame_lengths = p.T.data();
    prob.label_lengths = p.U.data();
    tdt_options_t opt;
    std::memset(&opt, 0, sizeof opt);
    opt.location = TDT_LOCATION_CPU;
    opt.durations = p.durations.data();
    opt.num_durations = static_cast<int>(D);
    size_t ws_bytes = 0;  // the larger size (without the option) serves both
    ASSERT_EQ(tdt_get_workspace_size(&prob, &opt, &ws_bytes), TDT_STATUS_SUCCESS);
    std::vector<unsigned char> ws(ws_bytes);
    for (int forward_with : {0, 1}) {
        const std::string what = forward_with ? "forward_ahead with, backward without"
                                              : "forward_ahead without, backward with";
        std::vector<float> gtok(tok.size(), 7.0f), gdur(dur.size(), 7.0f), costs(p.B + 1, -1.0f);
        tdt_gradients_t g;
        std::memset(&g, 0, sizeof g);
        g.token_grads = gtok.data();
        g.duration_grads = gdur.data();
        std::memcpy(g.token_strides, ts, sizeof ts);
        std::memcpy(g.duration_strides, ds, sizeof ds);
        opt.state_in_grads = forward_with;
        int written = -1;
        ASSERT_EQ(tdt_forward_ahead(&prob, &opt, costs.data(), nullptr, &g, ws.data(), ws.size(), &written),
                  TDT_STATUS_SUCCESS) << what << ": " << tdt_last_error();
        EXPECT_EQ(written, 0) << what;
        const std::vector<float> gtok_after = gtok, gdur_after = gdur;
        opt.state_in_grads = !forward_with;
        EXPECT_EQ(tdt_backward(&prob, &opt, nullptr, &g, ws.data(), ws.size()), TDT_STATUS_INVALID_WORKSPACE)
            << what << ": " << tdt_last_error();
        EXPECT_NE(std::string(tdt_last_error()).find("state_in_grads"), std::string::npos)
            << what << ": the error does not name the option: " << tdt_last_error();
        // bytes, not floats: the blocks are doubles, and their halves may read as NaN
        EXPECT_TRUE(std::memcmp(gtok.data(), gtok_after.data(), gtok.size() * sizeof(float)) == 0 &&
                    std::memcmp(gdur.data(), gdur_after.data(), gdur.size() * sizeof(float)) == 0)
            << what << ": the refused backward wrote gradients";
        opt.state_in_grads = forward_with;
        ASSERT_EQ(tdt_backward(&prob, &opt, nullptr, &g, ws.data(), ws.size()), TDT_STATUS_SUCCESS)
            << what << ", then the matching backward: " << tdt_last_error();
        // float32 against float64: the same values to float32's tolerance (the bits of the
        // float32 call with and without the option are StateInGradsSameBits' business)
        Output got;
        got.costs.assign(costs.begin(), costs.begin() + p.B);
        got.gtok.assign(gtok.begin(), gtok.end());
        got.gdur.assign(gdur.begin(), gdur.end());
        EXPECT_EQ(costs[p.B], -1.0f) << what << ": costs[B] written";
        expect_near(got, want, p, tol_for(TDT_DTYPE_FLOAT32), what + ", then the matching backward");
    }
}

}  // namespace
