// Very long lattices keep float64 accuracy: T = 20000 frames, U = 2000 labels
// (40 million nodes), small V, float64, checked against references computed another way:
//
//   - Broadcast logits (all strides 0: every node holds the same token and duration logits)
//     turn the loss into a sum over path *counts*, which has a closed form in binomials:
//       RNN-T:          LL = T lp_b + sum_i lp(y_i) + ln C(T - 1 + U, U)
//       TDT, d = {0,1}: LL = sum_i lp(y_i) + T lq_1
//                            + ln sum_j C(T - 1 + U - j, U - j) C(T - 1, j) p_b^(T - j) q_0^(U - j)
//     (j = labels emitted with duration 1; the final arc is the terminal blank). The gradient
//     of the cost with respect to the one shared logit is the sum of the library's per-node
//     gradients over the lattice, and it also has a closed form (expected arc counts), so the
//     gradient pass is checked over all 40M nodes too.
//   - Position-dependent logits (strides {0, 2 V, V}: node (t, u) reads row 2t + u of a small
//     table) against an independent DP written here (rolling rows, pull form).
// Measured at T = 20000, U = 2000 (the bounds below leave ~5x margin): costs agree with the
// closed forms to ~2e-13 relative and with the DP to ~1e-14; the lattice sums of the gradients
// to ~3.5e-9 of T + U. That last figure is float64 conditioning, not a defect: alpha and beta
// (magnitude ~3e4) carry ~6e-9 of accumulated rounding after 22000 sequential log-adds (the
// cost shows the same absolute error), and an occupancy exp(alpha + w + beta - LL) turns that
// into the same relative error.
// Sanitizer builds shrink the lattice 4x in each direction (same code paths, 16x less work).
#include <cmath>
#include <cstdio>

#include "robustness_util.h"

namespace {

using rob::kSanitized;

const int64_t kT = kSanitized ? 5000 : 20000;
const int64_t kU = kSanitized ? 500 : 2000;

long double lnC(long double n, long double k) { return lgammal(n + 1) - lgammal(k + 1) - lgammal(n - k + 1); }

long double lse(long double a, long double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    return a > b ? a + log1pl(expl(b - a)) : b + log1pl(expl(a - b));
}

std::vector<long double> log_softmax(const std::vector<double> &x) {
    long double m = -INFINITY, s = 0;
    for (double v : x) m = v > m ? v : m;
    for (double v : x) s += expl(v - m);
    std::vector<long double> out;
    for (double v : x) out.push_back(v - m - logl(s));
    return out;
}

// One sample of T frames and U labels whose token (and duration) logits all live in one row,
// broadcast to every node with zero strides; gradients into dense (T, U + 1, .) buffers.
struct Broadcast {
    int64_t T, U, V;
    int blank;
    std::vector<int> durs;
    std::vector<double> z, h;  // (V), (D)
    std::vector<int32_t> labels;
    double cost = 0;
    std::vector<long double> gsum_tok, gsum_dur;  // sum over the lattice of each gradient column
    tdt_status_t status = TDT_STATUS_SUCCESS;

    void run(bool grads) {
        int32_t Tl = static_cast<int32_t>(T), Ul = static_cast<int32_t>(U);
        tdt_problem_t p;
        std::memset(&p, 0, sizeof p);
        p.batch = 1;
        p.max_frames = T;
        p.max_labels = U;
        p.vocab_size = V;
        p.dtype = TDT_DTYPE_FLOAT64;
        p.token_logits = z.data();  // strides {0, 0, 0}: broadcast
        p.duration_logits = durs.empty() ? nullptr : h.data();
        p.labels = labels.data();
        p.frame_lengths = &Tl;
        p.label_lengths = &Ul;
        tdt_options_t o;
        std::memset(&o, 0, sizeof o);
        o.blank = blank;
        o.durations = durs.empty() ? nullptr : durs.data();
        o.num_durations = static_cast<int>(durs.size());
        size_t wsb = 0;
        ASSERT_EQ(tdt_get_workspace_size(&p, &o, &wsb), TDT_STATUS_SUCCESS);
        std::vector<unsigned char> ws(wsb);
        const int64_t D = static_cast<int64_t>(durs.size()), R = U + 1;
        std::vector<double> gt(grads ? static_cast<size_t>(T * R * V) : 0), gd(grads ? static_cast<size_t>(T * R * D) : 0);
        tdt_gradients_t g;
        std::memset(&g, 0, sizeof g);
        g.token_grads = grads ? gt.data() : nullptr;
        g.token_strides[0] = T * R * V;
        g.token_strides[1] = R * V;
        g.token_strides[2] = V;
        g.duration_grads = grads && D > 0 ? gd.data() : nullptr;
        g.duration_strides[0] = T * R * D;
        g.duration_strides[1] = R * D;
        g.duration_strides[2] = D;
        status = compute_tdt_loss(&p, &o, &cost, grads ? &g : nullptr, ws.data(), wsb);
        ASSERT_EQ(status, TDT_STATUS_SUCCESS) << tdt_last_error();
        gsum_tok.assign(static_cast<size_t>(V), 0.0L);
        gsum_dur.assign(static_cast<size_t>(D), 0.0L);
        if (!grads) return;
        for (int64_t n = 0; n < T * R; ++n) {
            for (int64_t v = 0; v < V; ++v) gsum_tok[static_cast<size_t>(v)] += gt[static_cast<size_t>(n * V + v)];
            for (int64_t k = 0; k < D; ++k) gsum_dur[static_cast<size_t>(k)] += gd[static_cast<size_t>(n * D + k)];
        }
    }
};

Broadcast make_broadcast(int64_t T, int64_t U, std::vector<int> durs, uint32_t seed) {
    Broadcast c;
    c.T = T;
    c.U = U;
    c.V = 4;
    c.blank = 3;  // Parakeet: blank last
    c.durs = std::move(durs);
    std::mt19937 g(seed);
    std::normal_distribution<double> n(0.0, 1.0);
    for (int64_t v = 0; v < c.V; ++v) c.z.push_back(n(g));
    for (size_t k = 0; k < c.durs.size(); ++k) c.h.push_back(n(g));
    for (int64_t i = 0; i < U; ++i) c.labels.push_back(static_cast<int32_t>(g() % 3));  // 0..2, never blank
    return c;
}

// Closed-form cost and d cost / d (shared logit) of a Broadcast case: RNN-T, or TDT {0, 1}.
struct Closed {
    long double cost;
    std::vector<long double> dz, dh;
};

Closed closed_form(const Broadcast &c) {
    const long double T = c.T, U = c.U;
    std::vector<long double> lp = log_softmax(c.z);
    std::vector<long double> cnt(static_cast<size_t>(c.V), 0.0L);
    long double sum_lpy = 0;
    for (int32_t y : c.labels) {
        sum_lpy += lp[static_cast<size_t>(y)];
        cnt[static_cast<size_t>(y)] += 1;
    }
    Closed r;
    const size_t b = static_cast<size_t>(c.blank);
    if (c.durs.empty()) {
        r.cost = -(T * lp[b] + sum_lpy + lnC(T - 1 + U, U));
        for (int64_t v = 0; v < c.V; ++v)
            r.dz.push_back((T + U) * expl(lp[static_cast<size_t>(v)]) - (static_cast<size_t>(v) == b ? T : 0) - cnt[static_cast<size_t>(v)]);
        return r;
    }
    // durations {0, 1}
    std::vector<long double> lq = log_softmax(c.h);
    const long double lq0 = lq[0], lq1 = lq[1];
    const int64_t jmax = c.U < c.T - 1 ? c.U : c.T - 1;
    std::vector<long double> S;
    long double acc = -INFINITY;
    for (int64_t j = 0; j <= jmax; ++j) {
        long double s = lnC(T - 1 + U - j, U - j) + lnC(T - 1, j) + (T - j) * lp[b] + (U - j) * lq0;
        S.push_back(s);
        acc = lse(acc, s);
    }
    r.cost = -(sum_lpy + T * lq1 + acc);
    long double e_blank = 0, e_k0 = 0;
    for (int64_t j = 0; j <= jmax; ++j) {
        long double w = expl(S[static_cast<size_t>(j)] - acc);
        e_blank += w * (T - j);
        e_k0 += w * (U - j);
    }
    const long double e_arcs = e_blank + U;  // every arc carries one token and one duration
    for (int64_t v = 0; v < c.V; ++v)
        r.dz.push_back(e_arcs * expl(lp[static_cast<size_t>(v)]) - (static_cast<size_t>(v) == b ? e_blank : 0) - cnt[static_cast<size_t>(v)]);
    r.dh.push_back(e_arcs * expl(lq0) - e_k0);
    r.dh.push_back(e_arcs * expl(lq1) - T);
    return r;
}

// First: the closed forms themselves agree with the naive reference on lattices it can handle.
TEST(LongLattice, ClosedFormsMatchTheNaiveReference) {
    for (int tdt = 0; tdt < 2; ++tdt)
        for (int64_t T : {1, 2, 7}) {
            for (int64_t U : {0, 1, 5}) {
                Broadcast c = make_broadcast(T, U, tdt ? std::vector<int>{0, 1} : std::vector<int>{}, 7u + static_cast<uint32_t>(T * 10 + U));
                Closed cf = closed_form(c);
                rob::Case k;
                k.T = T;
                k.U = U;
                k.V = c.V;
                k.blank = c.blank;
                k.durs = c.durs;
                for (int64_t n = 0; n < T * (U + 1); ++n) {
                    k.tok.insert(k.tok.end(), c.z.begin(), c.z.end());
                    k.dur.insert(k.dur.end(), c.h.begin(), c.h.end());
                }
                k.labels = c.labels;
                k.Tl = {static_cast<int32_t>(T)};
                k.Ul = {static_cast<int32_t>(U)};
                rob::Result ref = rob::reference(k);
                EXPECT_NEAR(ref.costs[0], static_cast<double>(cf.cost), 1e-12 * (1 + std::fabs(ref.costs[0])))
                    << k.describe();
                for (int64_t v = 0; v < c.V; ++v) {
                    long double s = 0;
                    for (int64_t n = 0; n < T * (U + 1); ++n) s += ref.gtok[static_cast<size_t>(n * c.V + v)];
                    EXPECT_NEAR(static_cast<double>(s), static_cast<double>(cf.dz[static_cast<size_t>(v)]), 1e-11) << k.describe() << " v=" << v;
                }
                for (size_t kk = 0; kk < c.durs.size(); ++kk) {
                    long double s = 0;
                    for (int64_t n = 0; n < T * (U + 1); ++n) s += ref.gdur[static_cast<size_t>(n) * c.durs.size() + kk];
                    EXPECT_NEAR(static_cast<double>(s), static_cast<double>(cf.dh[kk]), 1e-11) << k.describe() << " k=" << kk;
                }
            }
        }
}

void check_long(Broadcast &c) {
    c.run(true);
    ASSERT_EQ(c.status, TDT_STATUS_SUCCESS);
    Closed cf = closed_form(c);
    const double rel = std::fabs(c.cost - static_cast<double>(cf.cost)) / static_cast<double>(cf.cost);
    std::printf("[ long lattice T=%lld U=%lld %s ] cost %.17g, closed form %.17Lg, relative error %.3g\n",
                static_cast<long long>(c.T), static_cast<long long>(c.U), c.durs.empty() ? "RNN-T" : "TDT {0,1}",
                c.cost, cf.cost, rel);
    EXPECT_LT(rel, 1e-12) << "cost " << c.cost << " vs closed form " << static_cast<double>(cf.cost);
    const double kGradTol = 2e-8;  // of T + U; see the top of the file
    const long double scale = static_cast<long double>(c.T + c.U);  // arcs per path
    double worst = 0;
    for (int64_t v = 0; v < c.V; ++v) {
        long double got = c.gsum_tok[static_cast<size_t>(v)], want = cf.dz[static_cast<size_t>(v)];
        double err = static_cast<double>(fabsl(got - want) / scale);
        worst = err > worst ? err : worst;
        EXPECT_LT(err, kGradTol) << "token " << v << ": lattice sum of gradients " << static_cast<double>(got)
                              << ", closed form " << static_cast<double>(want);
    }
    for (size_t k = 0; k < cf.dh.size(); ++k) {
        long double got = c.gsum_dur[k], want = cf.dh[k];
        double err = static_cast<double>(fabsl(got - want) / scale);
        worst = err > worst ? err : worst;
        EXPECT_LT(err, kGradTol) << "duration " << k << ": lattice sum of gradients " << static_cast<double>(got)
                              << ", closed form " << static_cast<double>(want);
    }
    std::printf("[ long lattice ] gradient sums: worst error %.3g relative to T + U\n", worst);
}

TEST(LongLattice, RnntBroadcastClosedForm) {
    Broadcast c = make_broadcast(kT, kU, {}, 11);
    check_long(c);
}

TEST(LongLattice, TdtBroadcastClosedForm) {
    Broadcast c = make_broadcast(kT, kU, {0, 1}, 12);
    check_long(c);
}

// Position-dependent logits: node (t, u) reads row 2t + u of a table (strides {0, 2 V, V}), so
// the weights vary along and across the lattice; TDT durations {2, 1} (no zero duration, a
// different arc set from the broadcast test); costs only, against a DP over rolling rows
// written from the arc rules.
TEST(LongLattice, TdtPositionDependentAgainstRollingDp) {
    const int64_t T = kT / 2, U = kU / 2, V = 4, R = U + 1;  // a quarter of the nodes: time
    const std::vector<int> durs = {2, 1};
    const int64_t D = 2, rows = 2 * (T - 1) + U + 1;
    const int blank = 0;
    std::mt19937 g(2024);
    std::normal_distribution<double> n(0.0, 1.5);
    std::vector<double> tok(static_cast<size_t>(rows * V)), dur(static_cast<size_t>(rows * D));
    for (double &x : tok) x = n(g);
    for (double &x : dur) x = n(g);
    std::vector<int32_t> labels;
    for (int64_t i = 0; i < U; ++i) labels.push_back(1 + static_cast<int32_t>(g() % 3));
    int32_t Tl = static_cast<int32_t>(T), Ul = static_cast<int32_t>(U);

    tdt_problem_t p;
    std::memset(&p, 0, sizeof p);
    p.batch = 1;
    p.max_frames = T;
    p.max_labels = U;
    p.vocab_size = V;
    p.dtype = TDT_DTYPE_FLOAT64;
    p.token_logits = tok.data();
    p.token_strides[1] = 2 * V;
    p.token_strides[2] = V;
    p.duration_logits = dur.data();
    p.duration_strides[1] = 2 * D;
    p.duration_strides[2] = D;
    p.labels = labels.data();
    p.frame_lengths = &Tl;
    p.label_lengths = &Ul;
    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.blank = blank;
    o.durations = durs.data();
    o.num_durations = static_cast<int>(D);
    o.sigma = 0.05;
    size_t wsb = 0;
    ASSERT_EQ(tdt_get_workspace_size(&p, &o, &wsb), TDT_STATUS_SUCCESS);
    std::vector<unsigned char> ws(wsb);
    double cost = 0;
    ASSERT_EQ(compute_tdt_loss(&p, &o, &cost, nullptr, ws.data(), wsb), TDT_STATUS_SUCCESS) << tdt_last_error();

    // the DP: per table row, log-softmax once (in long double); alpha over a ring of 3 frames
    std::vector<double> lpt(static_cast<size_t>(rows * V)), lpd(static_cast<size_t>(rows * D));
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> zr(tok.begin() + r * V, tok.begin() + (r + 1) * V), hr(dur.begin() + r * D, dur.begin() + (r + 1) * D);
        std::vector<long double> a = log_softmax(zr), b = log_softmax(hr);
        for (int64_t v = 0; v < V; ++v) lpt[static_cast<size_t>(r * V + v)] = static_cast<double>(a[static_cast<size_t>(v)] - 0.05L);
        for (int64_t k = 0; k < D; ++k) lpd[static_cast<size_t>(r * D + k)] = static_cast<double>(b[static_cast<size_t>(k)]);
    }
    auto row = [](int64_t t, int64_t u) { return 2 * t + u; };
    std::vector<double> ring(static_cast<size_t>(3 * R), -INFINITY);
    auto A = [&](int64_t t, int64_t u) -> double & { return ring[static_cast<size_t>((t % 3) * R + u)]; };
    auto add = [](double a, double b) {  // log(e^a + e^b), the textbook form
        double m = a > b ? a : b;
        return m == -INFINITY ? m : m + std::log(std::exp(a - m) + std::exp(b - m));
    };
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t u = 0; u <= U; ++u) {
            double acc = (t == 0 && u == 0) ? 0.0 : -INFINITY;
            for (int64_t k = 0; k < D; ++k) {
                int64_t d = durs[static_cast<size_t>(k)];
                if (d > 0 && t - d >= 0) {  // blank from (t - d, u)
                    int64_t r = row(t - d, u);
                    acc = add(acc, A(t - d, u) + lpt[static_cast<size_t>(r * V + blank)] + lpd[static_cast<size_t>(r * D + k)]);
                }
                if (u > 0 && t - d >= 0) {  // label y_u from (t - d, u - 1)
                    int64_t r = row(t - d, u - 1);
                    acc = add(acc, A(t - d, u - 1) + lpt[static_cast<size_t>(r * V + labels[static_cast<size_t>(u - 1)])] +
                                       lpd[static_cast<size_t>(r * D + k)]);
                }
            }
            A(t, u) = acc;
        }
    }
    double ll = -INFINITY;
    for (int64_t k = 0; k < D; ++k) {
        int64_t d = durs[static_cast<size_t>(k)];
        if (d > 0 && T - d >= 0) {
            int64_t r = row(T - d, U);
            ll = add(ll, A(T - d, U) + lpt[static_cast<size_t>(r * V + blank)] + lpd[static_cast<size_t>(r * D + k)]);
        }
    }
    const double rel = std::fabs(cost + ll) / std::fabs(ll);
    std::printf("[ long lattice T=%lld U=%lld TDT {2,1}, position-dependent ] cost %.17g, DP %.17g, "
                "relative error %.3g\n", static_cast<long long>(T), static_cast<long long>(U), cost, -ll, rel);
    EXPECT_LT(rel, 1e-12);
}

}  // namespace
