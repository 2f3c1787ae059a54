// test_lattice.cc - the OpenMP backend's chunked sweep (lattice.h: tdt_sweep_geo_*,
// tdt_sweep_chunk) against the per-node recurrence it reorganises, bit for bit.
//
// The CPU backend computes alpha and beta with tdt_sweep_chunk: slot geometry once per sample,
// other ends' rows once per diagonal, up to TDT_SWEEP_CHUNK nodes at a time, its exps
// (tdt_exp_le0) vectorised across the nodes, and no -inf term in a sum. Each node must still
// come out with exactly the value of the plain loop over its slots (node_value below: lattice.h's
// slot functions and a two-pass log-sum-exp with the same exp, one node at a time). Random
// lattices cover TDT duration sets with and without 0, RNN-T, diagonals longer than a chunk,
// max_frames > T (rows that wrap: the per-node arrays hold diagonal s in row s mod max_frames),
// U > T (wrapping more than once), and weights that are -inf (unreachable nodes) or NaN.
// tdt_exp_le0 itself is checked against the C library's exp, and the log-likelihood at every cut
// of the lattice (tdt_cut_slot_term: the GPU's fused schedule) against alpha's.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "common/lattice.h"
}

namespace {

struct Case {
    int64_t T, U, frames;  // sample lengths; the per-node arrays' rows (max_frames >= T)
    std::vector<int> durations;  // empty: RNN-T
    double p_neg_inf, p_nan;     // per weight
};

// alpha (is_beta = 0) or beta of (t, u) on the workspace array v, one slot after another.
double node_value(const tdt_lattice_t *L, const tdt_arcs_t *A, const double *v, int64_t t,
                  int64_t u, int is_beta) {
    const tdt_diag_view_t X = {v, -1};
    double x[2 * TDT_MAX_DURATIONS], lp, dur;
    const int n = tdt_num_slots(A);
    for (int j = 0; j < n; ++j) {
        const tdt_slot_t q = tdt_slot_of(A, j);
        if (is_beta) {
            tdt_beta_slot_weight(L, A, &q, t, u, &lp, &dur);
            x[j] = tdt_beta_slot_term(L, &X, &q, t, u, lp, dur);
        } else {
            tdt_alpha_slot_weight(L, A, &q, t, u, &lp, &dur);
            x[j] = tdt_alpha_slot_term(L, &X, &q, t, u, lp, dur);
        }
    }
    double m = -TDT_INF, sum = 0.0;
    for (int j = 0; j < n; ++j) m = tdt_lse_max(m, x[j]);
    for (int j = 0; j < n; ++j)
        if (x[j] != -TDT_INF) sum += tdt_exp_le0(x[j] - m);
    const double r = tdt_lse_finish(m, sum);
    return is_beta ? r : tdt_alpha_start(t, u, r);
}

// One sample's random per-node weights (each drawn by weight(): every node's blank, then every
// label, then every duration) in the workspace's blocks, and the lattice over them.
struct RandomLattice {
    std::vector<double> w;
    tdt_lattice_t L;
    template <typename W>
    RandomLattice(int64_t T, int64_t U, int64_t frames, int count, W weight) {
        const size_t nodes = (size_t)(frames * (U + 1)), wn = (size_t)tdt_w_block(count);
        w.assign(nodes * wn, 0.0);
        for (size_t n = 0; n < nodes; ++n) w[n * wn + TDT_W_BLANK] = weight();
        for (size_t n = 0; n < nodes; ++n) w[n * wn + TDT_W_LABEL] = weight();
        for (size_t n = 0; n < nodes; ++n)
            for (int k = 0; k < count; ++k) w[n * wn + TDT_W_DUR + k] = weight();
        L.wb = tdt_wblocks_ws(w.data(), (int64_t)wn, frames, U + 1);
        L.wn = (int64_t)wn;
        L.row = U + 1;
        L.frames = frames;
        L.T = T;
        L.U = U;
    }
};

// Equal bits, or both NaN (a NaN's payload is not part of the contract).
bool same_bits(double a, double b) {
    return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

// Runs both sweeps of one case and compares every node's alpha and beta.
void check_case(const Case &c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(-2.0, 1.5);
    std::uniform_real_distribution<double> unit(0.0, 1.0);

    tdt_arcs_t A;
    if (c.durations.empty())
        tdt_arcs_rnnt(&A);
    else
        tdt_arcs_tdt(&A, c.durations.data(), (int)c.durations.size());
    const int64_t row = c.U + 1, nodes = c.frames * row, D = A.count;
    auto weight = [&]() {
        const double r = unit(rng);
        if (r < c.p_nan) return (double)NAN;
        if (r < c.p_nan + c.p_neg_inf) return -TDT_INF;
        return normal(rng);
    };
    const RandomLattice lat(c.T, c.U, c.frames, (int)D, weight);
    const tdt_lattice_t &L = lat.L;
    const int64_t S = tdt_num_diagonals(&L);

    for (int is_beta = 0; is_beta < 2; ++is_beta) {
        std::vector<double> ref(nodes, 0.0), chunked(nodes, 0.0);
        tdt_sweep_geo_t G;
        tdt_sweep_geo_init(&G, &A, chunked.data(), is_beta);
        for (int64_t i = 0; i < S; ++i) {
            const int64_t s = is_beta ? S - 1 - i : i;
            int64_t lo, hi;
            tdt_diagonal_range(&L, s, &lo, &hi);
            for (int64_t u = lo; u <= hi; ++u)
                ref[tdt_node_index(c.frames, row, s - u, u)] =
                    node_value(&L, &A, ref.data(), s - u, u, is_beta);
            tdt_sweep_geo_diag(&G, &L, s);
            for (int64_t u = lo; u <= hi; u += TDT_SWEEP_CHUNK) {
                const int64_t last = hi - u < TDT_SWEEP_CHUNK ? hi : u + TDT_SWEEP_CHUNK - 1;
                tdt_sweep_chunk(&G, &L, &A, s, u, last, chunked.data() + G.node + u);
            }
        }
        for (int64_t t = 0; t < c.T; ++t)
            for (int64_t u = 0; u <= c.U; ++u) {
                const int64_t n = tdt_node_index(c.frames, row, t, u);
                ASSERT_TRUE(same_bits(ref[n], chunked[n]))
                    << (is_beta ? "beta" : "alpha") << "(" << t << ", " << u << "): per-node "
                    << ref[n] << ", chunked " << chunked[n] << " (T " << c.T << ", U " << c.U
                    << ", max_frames " << c.frames << ", " << D << " arcs of each kind, seed "
                    << seed << ")";
            }
    }
}

TEST(LatticeChunks, MatchPerNodeSweepBitForBit) {
    const std::vector<std::vector<int>> duration_sets = {
        {0, 1, 2, 3, 4}, {1, 2}, {0, 4}, {0, 1}, {2, 3, 1}, {0, 2, 5, 7, 8, 6}, {}};
    std::mt19937 rng(7);
    int cases = 0;
    for (const auto &durs : duration_sets) {
        for (int k = 0; k < 12; ++k) {
            Case c;
            c.T = 1 + (int64_t)(rng() % 60);
            c.U = (int64_t)(rng() % 70);            // U > T in about half the cases
            c.frames = c.T + (int64_t)(rng() % 3);  // padded rows: diagonals wrap differently
            c.durations = durs;
            c.p_neg_inf = k % 3 == 0 ? 0.05 : 0.0;
            c.p_nan = k % 4 == 1 ? 0.002 : 0.0;
            check_case(c, 1000u * (uint32_t)cases + (uint32_t)k);
            if (HasFatalFailure()) return;
            ++cases;
        }
    }
    // diagonals of several chunks: 150 nodes on the longest one
    Case wide{200, 149, 200, {0, 1, 2, 3, 4}, 0.0, 0.0};
    check_case(wide, 99);
}

// log p(y|x) at a cut (lattice.h, tdt_cut_slot_term; the GPU's fused schedule takes its
// gradients' log-likelihood at tdt_mid_cut): for every cut c = 1 .. S of random lattices, the
// log-sum-exp of the cut terms of all nodes below c equals alpha's tdt_log_likelihood (and
// beta(0, 0)) to float64 rounding, and only the tdt_arcs_span(A) diagonals below c have terms.
// Infeasible lattices (-inf weights cutting every path, or T without a landing duration) give
// -inf at every cut.
TEST(LatticeCut, EveryCutGivesTheLogLikelihood) {
    const std::vector<std::vector<int>> duration_sets = {
        {0, 1, 2, 3, 4}, {1, 2}, {0, 4}, {0, 2, 5, 7, 8, 6}, {2, 3}, {}};
    std::mt19937 rng(11);
    std::normal_distribution<double> normal(-2.0, 1.5);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    int checked = 0, infeasible = 0;
    for (const auto &durs : duration_sets) {
        for (int k = 0; k < 10; ++k) {
            tdt_arcs_t A;
            if (durs.empty())
                tdt_arcs_rnnt(&A);
            else
                tdt_arcs_tdt(&A, durs.data(), (int)durs.size());
            const int64_t T = 1 + (int64_t)(rng() % 40), U = (int64_t)(rng() % 30);
            const int64_t frames = T + (int64_t)(rng() % 3), row = U + 1, nodes = frames * row;
            const double p_neg_inf = k % 3 == 0 ? 0.1 : 0.0;
            auto weight = [&]() { return unit(rng) < p_neg_inf ? -TDT_INF : normal(rng); };
            const RandomLattice lat(T, U, frames, A.count, weight);
            const tdt_lattice_t &L = lat.L;
            const int64_t S = tdt_num_diagonals(&L), span = tdt_arcs_span(&A);
            std::vector<double> alpha(nodes, 0.0), beta(nodes, 0.0);
            for (int64_t i = 0; i < S; ++i) {
                int64_t lo, hi;
                tdt_diagonal_range(&L, i, &lo, &hi);
                for (int64_t u = lo; u <= hi; ++u)
                    alpha[tdt_node_index(frames, row, i - u, u)] = node_value(&L, &A, alpha.data(), i - u, u, 0);
                const int64_t sb = S - 1 - i;
                tdt_diagonal_range(&L, sb, &lo, &hi);
                for (int64_t u = lo; u <= hi; ++u)
                    beta[tdt_node_index(frames, row, sb - u, u)] = node_value(&L, &A, beta.data(), sb - u, u, 1);
            }
            const double ll = tdt_log_likelihood(&L, &A, alpha.data());
            const std::string what = "T " + std::to_string(T) + ", U " + std::to_string(U) + ", " +
                                     std::to_string(durs.size()) + " durations, case " + std::to_string(k);
            if (ll == -TDT_INF) {
                ++infeasible;
                EXPECT_EQ(beta[0], -TDT_INF) << what << ": beta(0, 0) of an infeasible lattice";
            } else {
                ASSERT_TRUE(std::isfinite(ll)) << what << ": log-likelihood " << ll;
                EXPECT_NEAR(beta[0], ll, 1e-12 * std::max(1.0, std::fabs(ll))) << what << ": beta(0, 0)";
            }
            for (int64_t c = 1; c <= S; ++c) {
                std::vector<double> x;
                for (int64_t s = 0; s < c; ++s) {
                    int64_t lo, hi;
                    tdt_diagonal_range(&L, s, &lo, &hi);
                    for (int64_t u = lo; u <= hi; ++u)
                        for (int j = 0; j < tdt_num_slots(&A); ++j) {
                            const tdt_slot_t q = tdt_slot_of(&A, j);
                            const double v = tdt_cut_slot_term(&L, &A, alpha.data(), beta.data(), &q, s - u, u, c);
                            if (s < c - span) {
                                ASSERT_EQ(v, -TDT_INF) << what << ", cut " << c << ": a term from diagonal "
                                                       << s << ", more than the span " << span << " below";
                            } else {
                                x.push_back(v);
                            }
                        }
                }
                double m = -TDT_INF, sum = 0.0;
                for (double v : x) m = std::max(m, v);
                for (double v : x) sum += v == -TDT_INF ? 0.0 : std::exp(v - m);
                const double cut = m == -TDT_INF ? -TDT_INF : m + std::log(sum);
                if (ll == -TDT_INF)
                    ASSERT_EQ(cut, -TDT_INF) << what << ", cut " << c;
                else
                    ASSERT_NEAR(cut, ll, 1e-12 * std::max(1.0, std::fabs(ll)))
                        << what << ", cut " << c << " of " << S << " (the middle: " << tdt_mid_cut(S) << ")";
                ++checked;
            }
        }
    }
    EXPECT_GT(checked, 1000);
    EXPECT_GT(infeasible, 0) << "no infeasible lattice drawn: the -inf case went untested";
}

// tdt_exp_le0 (the CPU's exp in its sweeps, duration softmax and node occupancies, vectorised)
// against the C library's exp over [-746, 0]: within 2 ulp from -708 up (where e^x is normal),
// exactly 0 below (e^x < 2^-1021: every sum it feeds holds a 1, whose rounding dwarfs such
// terms), and exact at the ends (0 -> 1, -inf -> 0, NaN -> NaN). And sums as the sweeps form them
// (a 1, the max term's, plus terms in [-40, 0] and around -708) agree with the library's to a few
// ulp; just above 0, where an occupancy's log can round, it stays within 2 ulp.
TEST(LatticeExp, Le0WithinTwoUlpOfLibm) {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> wide(-746.0, 0.0), narrow(-1.0, 0.0), edge(-712.0, -704.0);
    double worst_ulp = 0.0, worst_x = 0.0;
    int flushed = 0;
    for (int i = 0; i < 2000000; ++i) {
        const double x = i % 3 == 0 ? wide(rng) : i % 3 == 1 ? narrow(rng) : edge(rng);
        const double want = std::exp(x), got = tdt_exp_le0(x);
        if (x < -708.0) {
            ASSERT_EQ(got, 0.0) << "x " << x;
            ++flushed;
            continue;
        }
        ASSERT_GE(want, 2.2250738585072014e-308) << "x " << x << ": e^x should be normal here";
        const double ulp = std::nextafter(want, INFINITY) - want;
        const double e = std::fabs(got - want) / ulp;
        if (e > worst_ulp) {
            worst_ulp = e;
            worst_x = x;
        }
    }
    EXPECT_LE(worst_ulp, 2.0) << "worst at x = " << worst_x;
    EXPECT_GT(flushed, 100000);
    EXPECT_EQ(tdt_exp_le0(0.0), 1.0);
    EXPECT_NEAR(tdt_exp_le0(-708.0), std::exp(-708.0), 2.0 * 4.9406564584124654e-324)
        << "the last value kept: within 2 ulp of e^-708, whose ulp is 2^-1074";
    EXPECT_EQ(tdt_exp_le0(-TDT_INF), 0.0);
    EXPECT_EQ(tdt_exp_le0(-800.0), 0.0);
    EXPECT_TRUE(std::isnan(tdt_exp_le0(NAN)));
    for (int i = 0; i < 100000; ++i) {
        double ours = 1.0, lib = 1.0;
        for (int k = 0; k < 9; ++k) {
            const double x = k % 2 ? edge(rng) : narrow(rng) * 40.0;
            ours += tdt_exp_le0(x);
            lib += std::exp(x);
        }
        ASSERT_NEAR(ours, lib, 8.0 * 2.220446049250313e-16 * lib) << "sample " << i;
    }
    // An occupancy's log (tdt_slot_occupancy_arg, exponentiated by tdt_exp_le0 in the CPU's
    // gradient pass) is <= 0 but for rounding: a little above 0 the exp stays within 2 ulp.
    std::uniform_real_distribution<double> above(0.0, 1e-9);
    for (int i = 0; i < 100000; ++i) {
        const double x = i % 2 ? above(rng) : std::ldexp(1.0, -40 - i % 60), want = std::exp(x);
        const double ulp = std::nextafter(want, INFINITY) - want;
        ASSERT_LE(std::fabs(tdt_exp_le0(x) - want), 2.0 * ulp) << "x " << x;
    }
}

// The GPU sweeps' exp and log, from TDT_LSE_TAB (lattice.h): the exp within 2 ulp of the C
// library's from -708 up and tdt_exp_le0's values at the ends; the log within 4 ulp, and 2^-50
// absolutely, of the C library's over the sums a log-sum-exp takes ([1, 64), dense near 1), exact
// at 1 (a node with one term keeps its term's bits), NaN kept.
TEST(LatticeExp, TablesWithinUlpsOfLibm) {
    const double tab[TDT_LSE_TAB_N] = TDT_LSE_TAB;
    std::mt19937_64 rng(12);
    std::uniform_real_distribution<double> wide(-746.0, 0.0), narrow(-1.0, 0.0), edge(-712.0, -704.0);
    std::uniform_real_distribution<double> sums(1.0, 64.0), near1(0.0, 1e-6);
    double worst_exp = 0.0, worst_x = 0.0, worst_log = 0.0, worst_abs = 0.0, worst_y = 0.0;
    for (int i = 0; i < 2000000; ++i) {
        const double x = i % 3 == 0 ? wide(rng) : i % 3 == 1 ? narrow(rng) : edge(rng);
        const double got = tdt_exp_le0_tab(x, tab);
        if (x < -708.0) {
            ASSERT_EQ(got, 0.0) << "x " << x;
        } else {
            const double want = std::exp(x);
            const double e = std::fabs(got - want) / (std::nextafter(want, INFINITY) - want);
            if (e > worst_exp) worst_exp = e, worst_x = x;
        }
        const double y = i % 2 ? sums(rng) : 1.0 + near1(rng);
        const double lw = std::log(y), lg = tdt_log_ge1_tab(y, tab);
        const double d = std::fabs(lg - lw);
        if (lw > 0.0 && d / (std::nextafter(lw, INFINITY) - lw) > worst_log) worst_log = d / (std::nextafter(lw, INFINITY) - lw), worst_y = y;
        worst_abs = std::max(worst_abs, d);
    }
    EXPECT_LE(worst_exp, 2.0) << "exp: worst at x = " << worst_x;
    EXPECT_LE(worst_log, 4.0) << "log: worst at y = " << worst_y;
    EXPECT_LE(worst_abs, 8.881784197001252e-16) << "log: absolute error";
    EXPECT_EQ(tdt_exp_le0_tab(0.0, tab), 1.0);
    EXPECT_NEAR(tdt_exp_le0_tab(-708.0, tab), std::exp(-708.0), 2.0 * 4.9406564584124654e-324)
        << "the last value kept: within 2 ulp of e^-708, whose ulp is 2^-1074";
    EXPECT_EQ(tdt_exp_le0_tab(-TDT_INF, tab), 0.0);
    EXPECT_EQ(tdt_exp_le0_tab(-800.0, tab), 0.0);
    EXPECT_TRUE(std::isnan(tdt_exp_le0_tab(NAN, tab)));
    EXPECT_EQ(tdt_log_ge1_tab(1.0, tab), 0.0);
    EXPECT_EQ(tdt_log_ge1_tab(2.0, tab), std::log(2.0));
    EXPECT_TRUE(std::isnan(tdt_log_ge1_tab(NAN, tab)));
}

}  // namespace
