// Extreme and non-finite inputs, per dtype:
//   - logits of magnitude 1e4 and at the float16 limit 65504 give finite costs and gradients
//     that match the naive float64 reference on the same (quantized) inputs;
//   - -inf entries (a masked vocabulary; masked durations) are probability 0: finite results,
//     gradients exactly 0 at the masked entries;
//   - NaN or +inf in one sample's logits gives that sample a NaN cost and leaves every other
//     sample's cost and gradient bit-identical to a run in which the bad sample is clean.
#include <limits>

#include "robustness_util.h"

namespace {

using rob::Case;
using rob::Result;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

class ExtremeValues : public ::testing::TestWithParam<tdt_dtype_t> {};

void expect_all_finite(const Result &r, const std::string &what) {
    for (size_t b = 0; b < r.costs.size(); ++b) EXPECT_TRUE(std::isfinite(r.costs[b])) << what << ": cost[" << b << "] = " << r.costs[b];
    for (size_t i = 0; i < r.gtok.size(); ++i)
        if (!std::isfinite(r.gtok[i])) {
            ADD_FAILURE() << what << ": token gradient element " << i << " = " << r.gtok[i];
            break;
        }
    for (size_t i = 0; i < r.gdur.size(); ++i)
        if (!std::isfinite(r.gdur[i])) {
            ADD_FAILURE() << what << ": duration gradient element " << i << " = " << r.gdur[i];
            break;
        }
}

// Every logit replaced by a draw from `values` (uniformly), deterministic in seed.
void fill_from(Case &c, const std::vector<double> &values, uint32_t seed) {
    std::mt19937 g(seed);
    for (double &x : c.tok) x = values[g() % values.size()];
    for (double &x : c.dur) x = values[g() % values.size()];
}

TEST_P(ExtremeValues, LogitsOfMagnitude1e4) {
    const tdt_dtype_t dt = GetParam();
    for (int tdt = 0; tdt < 2; ++tdt) {
        Case c = rob::random_case(31, 3, 9, 4, 7, tdt ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{}, 6);
        std::mt19937 g(5);
        std::uniform_real_distribution<double> u(-1.0, 1.0);
        for (double &x : c.tok) x = (g() % 4 == 0) ? (g() % 2 ? 1e4 : -1e4) : 1e4 * u(g);
        for (double &x : c.dur) x = (g() % 4 == 0) ? (g() % 2 ? 1e4 : -1e4) : 1e4 * u(g);
        c.sigma = 0.05;
        Result got = rob::run(c, {dt});
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        expect_all_finite(got, c.describe());
        rob::expect_near(got, rob::reference(c, dt), c, rob::tol_for(dt, 1e4, static_cast<double>(c.T + c.U)),
                         c.describe() + " " + rob::dtype_name(dt));
    }
}

TEST_P(ExtremeValues, Float16Limits) {
    const tdt_dtype_t dt = GetParam();
    const std::vector<double> values = {65504.0, -65504.0, 65000.0, -60000.0, 0.0, 1.0, -2.5, 32768.0, -1e-3};
    for (int tdt = 0; tdt < 2; ++tdt) {
        Case c = rob::random_case(32, 3, 8, 3, 6, tdt ? std::vector<int>{0, 1, 2} : std::vector<int>{}, 0);
        fill_from(c, values, 77 + static_cast<uint32_t>(tdt));
        Result got = rob::run(c, {dt});
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        expect_all_finite(got, c.describe());
        rob::expect_near(got, rob::reference(c, dt), c, rob::tol_for(dt, 65536.0, static_cast<double>(c.T + c.U)),
                         c.describe() + " " + rob::dtype_name(dt));
    }
}

// A masked vocabulary: 40% of the non-blank logits of every node are -inf (labels included, so
// some label arcs are impossible), and 20% of nodes have one duration masked.
TEST_P(ExtremeValues, MinusInfinityMasksTokensAndDurations) {
    const tdt_dtype_t dt = GetParam();
    for (int tdt = 0; tdt < 2; ++tdt) {
        Case c = rob::random_case(33, 3, 10, 4, 12, tdt ? std::vector<int>{0, 1, 2, 3, 4} : std::vector<int>{}, 11, 2.0);
        std::mt19937 g(9);
        std::vector<char> masked(c.tok.size(), 0);
        for (size_t i = 0; i < c.tok.size(); ++i)
            if (static_cast<int>(i % static_cast<size_t>(c.V)) != c.blank && g() % 10 < 4) {
                c.tok[i] = -kInf;
                masked[i] = 1;
            }
        for (int64_t n = 0; tdt && n < c.B * c.T * c.R(); ++n)
            if (g() % 5 == 0) c.dur[static_cast<size_t>(n * c.D()) + g() % static_cast<uint32_t>(c.D())] = -kInf;
        Result want = rob::reference(c, dt);
        for (size_t b = 0; b < want.costs.size(); ++b)
            ASSERT_TRUE(std::isfinite(want.costs[b])) << "test setup: sample " << b << " became infeasible";
        Result got = rob::run(c, {dt});
        ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << got.error;
        expect_all_finite(got, c.describe());
        rob::expect_near(got, want, c, rob::tol_for(dt, 10.0, static_cast<double>(c.T + c.U)), c.describe() + " " + rob::dtype_name(dt));
        for (size_t i = 0; i < masked.size(); ++i)
            if (masked[i]) {
                ASSERT_EQ(got.gtok[i], 0.0) << "masked token element " << i << " has a non-zero gradient";
            }
    }
}

// ---- NaN / inf stay in their sample ------------------------------------------------------------

struct Poison {
    const char *name;
    bool duration;      // in the duration logits (else the token logits)
    bool log_probs;     // inputs are log-probabilities
    double value;
    int64_t t, u, k;    // node and element in sample 2 (k == -1: the blank)
};

void check_poison(tdt_dtype_t dt, const Poison &ps) {
    Case clean = rob::random_case(40, 4, 8, 3, 6, {0, 1, 2}, 5);
    clean.Tl = {8, 6, 7, 5};
    clean.Ul = {3, 2, 3, 1};
    clean.log_probs = ps.log_probs;
    if (ps.log_probs)  // proper log-probabilities
        for (double &x : clean.tok) x = -std::fabs(x) - 0.1;
    Case bad = clean;
    const int64_t b = 2, k = ps.k < 0 ? bad.blank : ps.k;
    if (ps.duration) bad.h(b, ps.t, ps.u, k) = ps.value;
    else bad.z(b, ps.t, ps.u, k) = ps.value;
    Result r0 = rob::run(clean, {dt}), r1 = rob::run(bad, {dt});
    ASSERT_EQ(r0.status, TDT_STATUS_SUCCESS) << r0.error;
    ASSERT_EQ(r1.status, TDT_STATUS_SUCCESS) << r1.error;
    EXPECT_TRUE(std::isnan(r1.costs[b])) << ps.name << " (" << rob::dtype_name(dt) << "): cost of the bad sample is "
                                         << r1.costs[b] << ", not NaN";
    const size_t es = rob::esize(dt), as = rob::acc_size(dt);
    const int64_t per_tok = clean.T * clean.R() * clean.V, per_dur = clean.T * clean.R() * clean.D();
    for (int64_t o = 0; o < clean.B; ++o) {
        if (o == b) continue;
        EXPECT_EQ(0, std::memcmp(r0.raw_costs.data() + o * as, r1.raw_costs.data() + o * as, as))
            << ps.name << ": cost of sample " << o << " changed: " << r0.costs[o] << " -> " << r1.costs[o];
        EXPECT_EQ(0, std::memcmp(r0.raw_gtok.data() + o * per_tok * es, r1.raw_gtok.data() + o * per_tok * es, per_tok * es))
            << ps.name << ": token gradient of sample " << o << " changed";
        EXPECT_EQ(0, std::memcmp(r0.raw_gdur.data() + o * per_dur * es, r1.raw_gdur.data() + o * per_dur * es, per_dur * es))
            << ps.name << ": duration gradient of sample " << o << " changed";
    }
    // the bad sample's padding stays exactly zero
    for (int64_t t = 0; t < clean.T; ++t)
        for (int64_t u = 0; u < clean.R(); ++u)
            if (t >= bad.Tl[b] || u > bad.Ul[b]) {
                for (int64_t v = 0; v < clean.V; ++v) {
                    ASSERT_EQ(r1.gtok[static_cast<size_t>(clean.node(b, t, u) * clean.V + v)], 0.0) << ps.name << " padding gradient";
                }
            }
}

TEST_P(ExtremeValues, NonFiniteLogitsStayInTheirSample) {
    const Poison cases[] = {
        {"NaN token logit at (0,0)", false, false, kNaN, 0, 0, 2},
        {"+inf blank logit at (0,0)", false, false, kInf, 0, 0, -1},
        {"NaN token logit at the last node", false, false, kNaN, 6, 3, 0},
        {"+inf token logit mid-lattice", false, false, kInf, 3, 1, 4},
        {"NaN duration logit at (0,0)", true, false, kNaN, 0, 0, 1},
        {"+inf duration logit at (0,0), its arcs exist", true, false, kInf, 0, 0, 1},
        {"NaN log-prob blank at (0,0)", false, true, kNaN, 0, 0, -1},
    };
    for (const Poison &ps : cases) check_poison(GetParam(), ps);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ExtremeValues, ::testing::ValuesIn(rob::kAllDtypes), rob::DtypeName());

// Found by fuzz/fuzz_tdt.c (fuzz/regressions/duration_posinf_*.bin): +inf in a duration logit
// whose duration has no arc at that node (d = 1000 > T) is not reported. The duration
// log-softmax turns the other entries into -inf and only the +inf one into NaN, so the sample
// silently becomes infeasible (cost +inf) instead of NaN. tdt.h: "NaN or inf in a sample's
// logits gives that sample a NaN cost".
TEST(NonFinite, PlusInfDurationLogitWithoutArcGivesNaN) {
    Case c = rob::random_case(41, 2, 3, 0, 3, {1, 1000}, 0);
    c.Tl = {3, 3};
    c.Ul = {0, 0};
    c.h(0, 0, 0, 1) = kInf;
    Result r = rob::run(c);
    ASSERT_EQ(r.status, TDT_STATUS_SUCCESS) << r.error;
    EXPECT_TRUE(std::isnan(r.costs[0])) << "cost " << r.costs[0] << " for +inf in a duration logit";
    EXPECT_TRUE(std::isfinite(r.costs[1]));
}

// Found by fuzz/fuzz_tdt.c (fuzz/regressions/logprob_posinf_cost_neg_inf.bin): with log-prob
// inputs nothing checks for +inf, so alpha becomes +inf and the cost -inf (not NaN).
TEST(NonFinite, PlusInfLogProbGivesNaN) {
    Case c = rob::random_case(42, 2, 2, 0, 2, {}, 0);
    c.log_probs = true;
    for (double &x : c.tok) x = -std::fabs(x);
    c.Tl = {2, 2};
    c.Ul = {0, 0};
    c.z(0, 0, 0, 0) = kInf;
    Result r = rob::run(c);
    ASSERT_EQ(r.status, TDT_STATUS_SUCCESS) << r.error;
    EXPECT_TRUE(std::isnan(r.costs[0])) << "cost " << r.costs[0] << " for a +inf log-probability";
    EXPECT_TRUE(std::isfinite(r.costs[1]));
}

}  // namespace
