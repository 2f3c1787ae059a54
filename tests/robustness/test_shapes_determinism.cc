// Extreme shapes and bitwise determinism under any thread count:
// B = 0, T = 0 (padded and per sample), U = 0, V = 1 (blank only), V = 2, D = 1, durations far
// beyond T (and INT32_MAX), more threads than work; threads 1, 2, 3, 8 give the same bits.
#include <climits>

#include "robustness_util.h"

namespace {

using rob::Case;
using rob::Result;

// ---- determinism -----------------------------------------------------------------------------

class Determinism : public ::testing::TestWithParam<tdt_dtype_t> {};

void expect_same_bits(const Result &a, const Result &b, const std::string &what) {
    ASSERT_EQ(a.status, TDT_STATUS_SUCCESS) << what << ": " << a.error;
    ASSERT_EQ(b.status, TDT_STATUS_SUCCESS) << what << ": " << b.error;
    EXPECT_TRUE(a.raw_costs == b.raw_costs) << what << ": costs differ";
    EXPECT_TRUE(a.raw_gtok == b.raw_gtok) << what << ": token gradients differ";
    EXPECT_TRUE(a.raw_gdur == b.raw_gdur) << what << ": duration gradients differ";
}

TEST_P(Determinism, ThreadCounts1238GiveTheSameBits) {
    const tdt_dtype_t dt = GetParam();
    const Case cases[] = {
        rob::random_case(50, 3, 40, 12, 33, {0, 1, 2, 3, 4}, 32, 2.0),  // Parakeet-like TDT
        rob::random_case(51, 5, 25, 9, 17, {}, 0, 2.0),                 // RNN-T
    };
    for (const Case &c : cases) {
        Result base = rob::run(c, {dt, true, 1});
        for (int threads : {2, 3, 8, 1, 0}) expect_same_bits(base, rob::run(c, {dt, true, threads}), c.describe() + " threads " + std::to_string(threads));
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Determinism, ::testing::ValuesIn(rob::kAllDtypes), rob::DtypeName());

TEST(Shapes, MoreThreadsThanWork) {
    Case c = rob::random_case(52, 1, 1, 0, 3, {0, 1}, 0);
    Result base = rob::run(c, {TDT_DTYPE_FLOAT64, true, 1});
    rob::expect_near(base, rob::reference(c), c, rob::tol_for(TDT_DTYPE_FLOAT64), "B=1 T=1 U=0");
    for (int threads : {2, 8, 64}) expect_same_bits(base, rob::run(c, {TDT_DTYPE_FLOAT64, true, threads}), "threads " + std::to_string(threads));
}

// ---- B = 0 and T = 0 --------------------------------------------------------------------------

// An empty batch is a valid call that writes nothing, with or without NULL data pointers.
TEST(Shapes, EmptyBatch) {
    for (int nulls = 0; nulls < 2; ++nulls) {
        double tok[4] = {0, 0, 0, 0}, canary = 12.5;
        int32_t one = 1;
        int durs[2] = {1, 2};
        tdt_problem_t p;
        std::memset(&p, 0, sizeof p);
        p.batch = 0;
        p.max_frames = 5;
        p.max_labels = 3;
        p.vocab_size = 4;
        p.dtype = TDT_DTYPE_FLOAT64;
        p.token_logits = nulls ? nullptr : tok;
        p.duration_logits = tok;
        p.labels = nulls ? nullptr : &one;
        p.frame_lengths = nulls ? nullptr : &one;
        p.label_lengths = nulls ? nullptr : &one;
        tdt_options_t o;
        std::memset(&o, 0, sizeof o);
        o.durations = durs;
        o.num_durations = 2;
        size_t wsb = 0;
        ASSERT_EQ(tdt_get_workspace_size(&p, &o, &wsb), TDT_STATUS_SUCCESS);
        std::vector<unsigned char> ws(wsb);
        double g[4] = {7, 7, 7, 7};
        tdt_gradients_t gr;
        std::memset(&gr, 0, sizeof gr);
        gr.token_grads = g;
        gr.token_strides[2] = 4;
        gr.token_strides[1] = 16;
        gr.token_strides[0] = 80;
        EXPECT_EQ(compute_tdt_loss(&p, &o, nulls ? nullptr : &canary, &gr, ws.data(), wsb), TDT_STATUS_SUCCESS) << tdt_last_error();
        EXPECT_EQ(tdt_forward(&p, &o, nulls ? nullptr : &canary, ws.data(), wsb), TDT_STATUS_SUCCESS) << tdt_last_error();
        EXPECT_EQ(tdt_backward(&p, &o, nullptr, &gr, ws.data(), wsb), TDT_STATUS_SUCCESS) << tdt_last_error();
        EXPECT_EQ(canary, 12.5);
        for (double x : g) EXPECT_EQ(x, 7.0);
    }
}

// Every sample with T = 0, padded to max_frames 4 or max_frames itself 0: +inf, and every
// gradient element of the extent exactly 0 (none exist when max_frames is 0).
TEST(Shapes, ZeroFramesEverySample) {
    for (tdt_dtype_t dt : rob::kAllDtypes)
        for (int64_t maxT : {0, 4})
            for (int tdt = 0; tdt < 2; ++tdt) {
                Case c = rob::random_case(53, 3, maxT, 2, 5, tdt ? std::vector<int>{0, 1, 2} : std::vector<int>{});
                c.Tl = {0, 0, 0};
                Result r = rob::run(c, {dt});
                ASSERT_EQ(r.status, TDT_STATUS_SUCCESS) << r.error;
                for (double x : r.costs) EXPECT_EQ(x, std::numeric_limits<double>::infinity());
                for (double x : r.gtok) ASSERT_EQ(x, 0.0);
                for (double x : r.gdur) ASSERT_EQ(x, 0.0);
            }
}

// ---- U = 0, V = 1, V = 2 ----------------------------------------------------------------------

// No labels at all (max_labels = 0): only blank paths. RNN-T: cost = -sum_t lp_blank(t, 0).
TEST(Shapes, NoLabels) {
    for (tdt_dtype_t dt : rob::kAllDtypes) {
        Case r = rob::random_case(54, 3, 7, 0, 5, {}, 2);
        rob::expect_near(rob::run(r, {dt}), rob::reference(r, dt), r, rob::tol_for(dt), r.describe());
        Case t = rob::random_case(55, 3, 7, 0, 5, {0, 1, 3}, 2);
        rob::expect_near(rob::run(t, {dt}), rob::reference(t, dt), t, rob::tol_for(dt), t.describe());
    }
    Case r = rob::random_case(56, 1, 6, 0, 4, {}, 1);
    double want = 0;
    for (int64_t t = 0; t < 6; ++t) {
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < 4; ++v) m = std::max(m, r.z(0, t, 0, v));
        for (int64_t v = 0; v < 4; ++v) s += std::exp(r.z(0, t, 0, v) - m);
        want -= r.z(0, t, 0, 1) - m - std::log(s);
    }
    EXPECT_NEAR(rob::run(r).costs[0], want, 1e-12 * want);
}

// V = 1: the vocabulary is the blank alone, so only U = 0 is possible. Every log-prob is
// exactly 0, so an RNN-T cost is exactly T * sigma and the token gradient is 0.
TEST(Shapes, VocabularyOfOneBlank) {
    Case c = rob::random_case(57, 3, 9, 0, 1, {}, 0, 5.0);
    c.Tl = {9, 4, 1};
    c.sigma = 0.5;
    Result r = rob::run(c);
    ASSERT_EQ(r.status, TDT_STATUS_SUCCESS) << r.error;
    for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(r.costs[static_cast<size_t>(b)], 0.5 * c.Tl[static_cast<size_t>(b)]);
    for (double x : r.gtok) EXPECT_NEAR(x, 0.0, 1e-15);
    for (tdt_dtype_t dt : rob::kAllDtypes) {
        Case t = rob::random_case(58, 3, 9, 0, 1, {1, 3}, 0);
        t.sigma = 0.05;
        rob::expect_near(rob::run(t, {dt}), rob::reference(t, dt), t, rob::tol_for(dt), t.describe());
    }
    // V = 1 with a label: every label is the blank or out of range
    Case bad = rob::random_case(59, 1, 4, 1, 1, {}, 0);
    bad.Ul = {1};
    bad.labels = {0};
    EXPECT_EQ(rob::run(bad).status, TDT_STATUS_INVALID_LABEL);
}

TEST(Shapes, VocabularyOfTwo) {
    for (tdt_dtype_t dt : rob::kAllDtypes)
        for (int tdt = 0; tdt < 2; ++tdt) {
            Case c = rob::random_case(60 + static_cast<uint32_t>(tdt), 3, 8, 4, 2, tdt ? std::vector<int>{0, 2, 1} : std::vector<int>{}, 1);
            rob::expect_near(rob::run(c, {dt}), rob::reference(c, dt), c, rob::tol_for(dt), c.describe());
        }
}

// ---- D = 1 and durations beyond T ------------------------------------------------------------

TEST(Shapes, SingleDuration) {
    for (tdt_dtype_t dt : rob::kAllDtypes) {
        Case c = rob::random_case(62, 3, 9, 3, 5, {1}, 0);
        rob::expect_near(rob::run(c, {dt}), rob::reference(c, dt), c, rob::tol_for(dt), c.describe());
    }
    // {2} lands exactly on even T only: odd T is infeasible (+inf, zero gradients)
    Case c = rob::random_case(63, 2, 6, 2, 4, {2}, 0);
    c.Tl = {6, 5};
    c.Ul = {2, 2};
    Result r = rob::run(c);
    ASSERT_EQ(r.status, TDT_STATUS_SUCCESS) << r.error;
    EXPECT_TRUE(std::isfinite(r.costs[0]));
    EXPECT_EQ(r.costs[1], std::numeric_limits<double>::infinity());
    rob::expect_near(r, rob::reference(c), c, rob::tol_for(TDT_DTYPE_FLOAT64), c.describe());
    // {0}: no blank can advance a frame
    Case z = rob::random_case(64, 1, 3, 1, 3, {0}, 0);
    EXPECT_EQ(rob::run(z).status, TDT_STATUS_NO_POSITIVE_DURATION);
}

TEST(Shapes, LargestDurationBeyondT) {
    for (tdt_dtype_t dt : rob::kAllDtypes) {
        Case c = rob::random_case(65, 3, 9, 3, 5, {1, 1000}, 4);
        rob::expect_near(rob::run(c, {dt}), rob::reference(c, dt), c, rob::tol_for(dt), c.describe());
        Case m = rob::random_case(66, 2, 7, 2, 4, {INT_MAX, 0, 1}, 0);
        rob::expect_near(rob::run(m, {dt}), rob::reference(m, dt), m, rob::tol_for(dt), m.describe());
    }
    // {1000} alone: infeasible below T = 1000; at T = 1000 one arc, (0,0) -> end, whose weight
    // is lp_blank(0, 0) (one duration: lq = 0)
    for (int32_t T : {999, 1000}) {
        Case c = rob::random_case(67, 1, 1000, 0, 3, {1000}, 2);
        c.Tl = {T};
        Result r = rob::run(c);
        ASSERT_EQ(r.status, TDT_STATUS_SUCCESS) << r.error;
        if (T == 999) {
            EXPECT_EQ(r.costs[0], std::numeric_limits<double>::infinity());
            for (double x : r.gtok) ASSERT_EQ(x, 0.0);
            for (double x : r.gdur) ASSERT_EQ(x, 0.0);
        } else {
            double m = std::max({c.z(0, 0, 0, 0), c.z(0, 0, 0, 1), c.z(0, 0, 0, 2)});
            double lse = m + std::log(std::exp(c.z(0, 0, 0, 0) - m) + std::exp(c.z(0, 0, 0, 1) - m) + std::exp(c.z(0, 0, 0, 2) - m));
            EXPECT_NEAR(r.costs[0], lse - c.z(0, 0, 0, 2), 1e-14);
            rob::expect_near(r, rob::reference(c), c, rob::tol_for(TDT_DTYPE_FLOAT64), "T = 1000, durations {1000}");
        }
    }
}

}  // namespace
