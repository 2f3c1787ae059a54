/*
 * test_util.cc - see test_util.h.
 */
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "reference.h"

namespace tdt_test {

// ---- dtypes ------------------------------------------------------------------------------------

size_t dtype_size(tdt_dtype_t dtype) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return 8;
    case TDT_DTYPE_FLOAT32: return 4;
    default: return 2;
    }
}

const char *dtype_name(tdt_dtype_t dtype) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT32: return "float32";
    case TDT_DTYPE_FLOAT64: return "float64";
    case TDT_DTYPE_FLOAT16: return "float16";
    case TDT_DTYPE_BFLOAT16: return "bfloat16";
    }
    return "?";
}

double quantize(double x, tdt_dtype_t dtype) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return x;
    case TDT_DTYPE_FLOAT32: return static_cast<float>(x);
    case TDT_DTYPE_FLOAT16: return half_to_float(float_to_half(static_cast<float>(x)));
    case TDT_DTYPE_BFLOAT16: return bfloat16_to_float(float_to_bfloat16(static_cast<float>(x)));
    }
    return x;
}

void store(void *p, int64_t i, double x, tdt_dtype_t dtype) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: static_cast<double *>(p)[i] = x; break;
    case TDT_DTYPE_FLOAT32: static_cast<float *>(p)[i] = static_cast<float>(x); break;
    case TDT_DTYPE_FLOAT16: static_cast<uint16_t *>(p)[i] = float_to_half(static_cast<float>(x)); break;
    case TDT_DTYPE_BFLOAT16:
        static_cast<uint16_t *>(p)[i] = float_to_bfloat16(static_cast<float>(x));
        break;
    }
}

double load(const void *p, int64_t i, tdt_dtype_t dtype) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return static_cast<const double *>(p)[i];
    case TDT_DTYPE_FLOAT32: return static_cast<const float *>(p)[i];
    case TDT_DTYPE_FLOAT16: return half_to_float(static_cast<const uint16_t *>(p)[i]);
    case TDT_DTYPE_BFLOAT16: return bfloat16_to_float(static_cast<const uint16_t *>(p)[i]);
    }
    return 0.0;
}

// ---- problems --------------------------------------------------------------------------------

std::string Problem::describe() const {
    std::ostringstream s;
    s << "B=" << B << " maxT=" << maxT << " maxU=" << maxU << " V=" << V << " blank=" << blank;
    if (rnnt()) {
        s << " RNN-T";
    } else {
        s << " durations={";
        for (size_t k = 0; k < durations.size(); ++k) s << (k ? "," : "") << durations[k];
        s << "}";
    }
    if (sigma) s << " sigma=" << sigma;
    if (fastemit) s << " fastemit=" << fastemit;
    if (clamp) s << " clamp=" << clamp;
    if (log_probs) s << " log-probs";
    s << " T={";
    for (int64_t b = 0; b < B; ++b) s << (b ? "," : "") << T[b];
    s << "} U={";
    for (int64_t b = 0; b < B; ++b) s << (b ? "," : "") << U[b];
    s << "}";
    return s.str();
}

Problem make_problem(int64_t T, int64_t U, int64_t V, std::vector<int32_t> labels,
                     std::vector<double> tok, std::vector<double> dur, std::vector<int> durations,
                     int blank) {
    Problem p;
    p.B = 1;
    p.maxT = T;
    p.maxU = U;
    p.V = V;
    p.durations = std::move(durations);
    p.blank = blank;
    p.labels = std::move(labels);
    p.tok = std::move(tok);
    p.dur = std::move(dur);
    p.T = {static_cast<int32_t>(T)};
    p.U = {static_cast<int32_t>(U)};
    EXPECT_EQ(static_cast<int64_t>(p.tok.size()), p.nodes() * V) << "make_problem: token logits";
    EXPECT_EQ(static_cast<int64_t>(p.dur.size()), p.nodes() * p.D()) << "make_problem: duration logits";
    return p;
}

Problem random_problem(uint64_t seed, int64_t B, int64_t maxT, int64_t maxU, int64_t V,
                       std::vector<int> durations, int blank, double scale, int64_t minT,
                       std::vector<int32_t> Ts, std::vector<int32_t> Us) {
    Problem p;
    p.B = B;
    p.maxT = maxT;
    p.maxU = maxU;
    p.V = V;
    p.durations = std::move(durations);
    p.blank = blank;
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, scale);
    p.T.resize(B);
    p.U.resize(B);
    for (int64_t b = 0; b < B; ++b) {
        p.T[b] = b == 0 ? static_cast<int32_t>(maxT)
                        : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(std::min(minT, maxT), maxT)(rng));
        p.U[b] = b == 0 ? static_cast<int32_t>(maxU)
                        : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, maxU)(rng));
    }
    if (!Ts.empty()) p.T = Ts;
    if (!Us.empty()) p.U = Us;
    // Labels: uniform over the non-blank tokens; the padding beyond U_b holds garbage that is
    // out of range, negative, or the blank itself (the library must never read it).
    p.labels.resize(B * maxU);
    const int32_t garbage[] = {-7, static_cast<int32_t>(V) + 3, blank, 1 << 30};
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < maxU; ++i) {
            if (i < p.U[b]) {
                int32_t y = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, V - 2)(rng));
                p.labels[b * maxU + i] = y >= blank ? y + 1 : y;
            } else {
                p.labels[b * maxU + i] = garbage[(b + i) % 4];
            }
        }
    }
    // Logits: normal inside every lattice; large finite garbage in the padding nodes.
    p.tok.resize(p.nodes() * V);
    p.dur.resize(p.nodes() * p.D());
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < maxT; ++t) {
            for (int64_t u = 0; u <= maxU; ++u) {
                const bool inside = t < p.T[b] && u <= p.U[b];
                const int64_t n = p.node(b, t, u);
                for (int64_t v = 0; v < V; ++v)
                    p.tok[n * V + v] = inside ? normal(rng) : (v % 2 ? 3.0e4 : -3.0e4);
                for (int k = 0; k < p.D(); ++k)
                    p.dur[n * p.D() + k] = inside ? normal(rng) : (k % 2 ? -3.0e4 : 3.0e4);
            }
        }
    }
    return p;
}

void quantize_inputs(Problem &p, tdt_dtype_t dtype) {
    for (double &x : p.tok) x = quantize(x, dtype);
    for (double &x : p.dur) x = quantize(x, dtype);
}

static void log_softmax_rows(std::vector<double> &x, int64_t n) {
    if (n == 0) return;
    for (size_t r = 0; r < x.size() / n; ++r) {
        double *row = &x[r * n];
        double m = *std::max_element(row, row + n), s = 0.0;
        for (int64_t i = 0; i < n; ++i) s += std::exp(row[i] - m);
        for (int64_t i = 0; i < n; ++i) row[i] -= m + std::log(s);
    }
}

void to_log_probs(Problem &p) {
    log_softmax_rows(p.tok, p.V);
    log_softmax_rows(p.dur, p.D());
    p.log_probs = true;
}

// ---- running the library ---------------------------------------------------------------------

const char *layout_name(Layout layout) {
    switch (layout) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Joint: return "joint";
    case Layout::InPlace: return "in-place";
    case Layout::Padded: return "padded";
    }
    return "?";
}

namespace {

// A strided (B, T, U+1, W) view: element (b, t, u, w) at b*s[0] + t*s[1] + u*s[2] + w.
struct View {
    int64_t s[3];
    int64_t offset;  // element offset of (0, 0, 0, 0) in the buffer
    int64_t at(int64_t b, int64_t t, int64_t u, int64_t w) const {
        return offset + b * s[0] + t * s[1] + u * s[2] + w;
    }
};

View make_view(const Problem &p, int64_t row, int64_t frames, int64_t offset) {
    const int64_t R = p.maxU + 1;
    return View{{frames * R * row, R * row, row}, offset};
}

int64_t view_extent(const Problem &p, const View &v, int64_t width) {
    if (p.B == 0 || p.maxT == 0) return v.offset + 1;
    return v.at(p.B - 1, p.maxT - 1, p.maxU, width - 1) + 1;
}

}  // namespace

Output run_lib(const Problem &p, const RunOptions &ro) {
    const tdt_dtype_t dt = ro.dtype;
    const size_t es = dtype_size(dt);
    const int64_t V = p.V, D = p.D(), R = p.maxU + 1;
    const double nan = std::numeric_limits<double>::quiet_NaN();

    // Logits and gradient views per layout.
    View vt{}, vd{}, gt{}, gd{};
    bool separate_grads = true;  // gradients in their own buffers (not in place)
    switch (ro.layout) {
    case Layout::Contiguous:
    case Layout::InPlace:
        vt = make_view(p, V, p.maxT, 0);
        vd = make_view(p, D, p.maxT, 0);
        gt = vt;
        gd = vd;
        separate_grads = ro.layout == Layout::Contiguous;
        break;
    case Layout::Joint:
        vt = make_view(p, V + D, p.maxT, 0);
        vd = make_view(p, V + D, p.maxT, V);
        gt = vt;
        gd = vd;
        break;
    case Layout::Padded:
        vt = make_view(p, V + 5, p.maxT + 1, 0);
        vd = make_view(p, D + 3, p.maxT + 1, 0);
        gt = make_view(p, V + 2, p.maxT, 0);
        gd = make_view(p, D + 1, p.maxT + 1, 0);
        break;
    }
    const bool joint = ro.layout == Layout::Joint;
    std::vector<unsigned char> tok_buf, dur_buf, gtok_buf, gdur_buf;
    auto alloc = [&](std::vector<unsigned char> &buf, int64_t elems) {
        buf.assign(static_cast<size_t>(std::max<int64_t>(elems, 1)) * es, 0);
        for (int64_t i = 0; i < elems; ++i) store(buf.data(), i, nan, dt);
    };
    alloc(tok_buf, joint ? view_extent(p, vd, std::max<int64_t>(D, 1)) : view_extent(p, vt, V));
    if (!joint && D > 0) alloc(dur_buf, view_extent(p, vd, D));
    void *tok_ptr = tok_buf.data();
    void *dur_ptr = D > 0 ? (joint ? static_cast<void *>(tok_buf.data()) : dur_buf.data()) : nullptr;
    for (int64_t b = 0; b < p.B; ++b)
        for (int64_t t = 0; t < p.maxT; ++t)
            for (int64_t u = 0; u < R; ++u) {
                const int64_t n = p.node(b, t, u);
                for (int64_t v = 0; v < V; ++v) store(tok_ptr, vt.at(b, t, u, v), p.tok[n * V + v], dt);
                for (int64_t k = 0; k < D; ++k) store(dur_ptr, vd.at(b, t, u, k), p.dur[n * D + k], dt);
            }

    void *gtok_ptr = nullptr, *gdur_ptr = nullptr;
    if (separate_grads) {
        alloc(gtok_buf, joint ? view_extent(p, gd, std::max<int64_t>(D, 1)) : view_extent(p, gt, V));
        if (!joint && D > 0) alloc(gdur_buf, view_extent(p, gd, D));
        gtok_ptr = gtok_buf.data();
        gdur_ptr = D > 0 ? (joint ? static_cast<void *>(gtok_buf.data()) : gdur_buf.data()) : nullptr;
    } else {
        gtok_ptr = tok_ptr;
        gdur_ptr = dur_ptr;
    }
    if (joint && D > 0) {
        tok_ptr = tok_buf.data();
        dur_ptr = tok_buf.data() + V * es;
        gtok_ptr = gtok_buf.data();
        gdur_ptr = gtok_buf.data() + V * es;
        vd.offset = gd.offset = 0;
    }

    tdt_problem_t prob;
    std::memset(&prob, 0, sizeof prob);
    prob.batch = p.B;
    prob.max_frames = p.maxT;
    prob.max_labels = p.maxU;
    prob.vocab_size = V;
    prob.dtype = dt;
    prob.token_logits = tok_ptr;
    std::memcpy(prob.token_strides, vt.s, sizeof vt.s);
    prob.duration_logits = D > 0 ? dur_ptr : nullptr;
    std::memcpy(prob.duration_strides, vd.s, sizeof vd.s);
    prob.labels = p.maxU > 0 ? p.labels.data() : nullptr;
    prob.frame_lengths = p.T.data();
    prob.label_lengths = p.U.data();
    // options.pack: int64 sources (label rows one element wider than max_labels, the spare
    // element -1), and the problem's arrays one int32 array of garbage the call must overwrite
    std::vector<int64_t> lab64, fl64(p.T.begin(), p.T.end()), ll64(p.U.begin(), p.U.end());
    std::vector<int32_t> packed(static_cast<size_t>(p.B * (p.maxU + 2)), -77);
    tdt_indices_t pack;
    std::memset(&pack, 0, sizeof pack);
    int32_t pack_valid = -1;
    if (ro.pack) {
        for (int64_t b = 0; b < p.B; ++b) {
            for (int64_t i = 0; i < p.maxU; ++i) lab64.push_back(p.labels[b * p.maxU + i]);
            lab64.push_back(-1);
        }
        pack.type = TDT_INDEX_INT64;
        pack.labels = lab64.empty() ? nullptr : lab64.data();
        pack.columns = p.maxU;
        pack.labels_stride = p.maxU + 1;
        pack.frame_lengths = fl64.data();
        pack.label_lengths = ll64.data();
        prob.frame_lengths = packed.data();
        prob.label_lengths = packed.data() + p.B;
        prob.labels = p.maxU > 0 ? packed.data() + 2 * p.B : nullptr;
    }

    tdt_options_t opt;
    std::memset(&opt, 0, sizeof opt);
    opt.location = TDT_LOCATION_CPU;
    opt.num_threads = p.num_threads;
    opt.blank = p.blank;
    opt.durations = D > 0 ? p.durations.data() : nullptr;
    opt.num_durations = static_cast<int>(D);
    opt.sigma = p.sigma;
    opt.fastemit_lambda = p.fastemit;
    opt.clamp = p.clamp;
    opt.input_kind = p.log_probs ? TDT_INPUT_LOG_PROBS : TDT_INPUT_LOGITS;
    opt.grad_costs_scalar = ro.grad_costs_scalar;
    opt.normalize_costs = ro.normalize_costs;
    opt.batch_mean = ro.batch_mean;
    opt.state_in_grads = ro.state_in_grads ? 1 : 0;
    if (ro.pack) {
        opt.pack = &pack;
        opt.pack_valid = &pack_valid;
    }

    tdt_gradients_t grads;
    std::memset(&grads, 0, sizeof grads);
    grads.token_grads = ro.want_tok ? gtok_ptr : nullptr;
    std::memcpy(grads.token_strides, gt.s, sizeof gt.s);
    grads.duration_grads = ro.want_dur && D > 0 ? gdur_ptr : nullptr;
    std::memcpy(grads.duration_strides, gd.s, sizeof gd.s);

    Output out;
    size_t ws_bytes = 0;
    out.status = tdt_get_workspace_size(&prob, &opt, &ws_bytes);
    if (out.status != TDT_STATUS_SUCCESS) {
        out.error = tdt_last_error();
        return out;
    }
    out.workspace_bytes = ws_bytes;
    // Garbage in the workspace: the library must not rely on it being zeroed.
    std::vector<unsigned char> ws(ws_bytes + ro.misalign + 1, 0xa5);
    void *ws_ptr = ws.data() + ro.misalign;

    const bool dbl = dt == TDT_DTYPE_FLOAT64;
    std::vector<double> costs_d(static_cast<size_t>(p.B) + 1, nan);
    std::vector<float> costs_f(static_cast<size_t>(p.B) + 1, static_cast<float>(nan));
    void *costs = dbl ? static_cast<void *>(costs_d.data()) : static_cast<void *>(costs_f.data());
    double reduced_d = nan;  // options.reduced_cost, of the accumulate type
    float reduced_f = static_cast<float>(nan);
    opt.reduction = ro.reduction;
    opt.reduced_cost = dbl ? static_cast<void *>(&reduced_d) : static_cast<void *>(&reduced_f);

    // (B) values of the accumulate type, as the library reads them
    auto acc_values = [&](const std::vector<double> *v, std::vector<double> &d, std::vector<float> &f) {
        if (!v) return static_cast<const void *>(nullptr);
        d = *v;
        f.assign(d.begin(), d.end());
        return dbl ? static_cast<const void *>(d.data()) : static_cast<const void *>(f.data());
    };
    std::vector<double> gc_d, sc_d;
    std::vector<float> gc_f, sc_f;
    // What every buffer the calls may write held before them: a failed call must leave all alike.
    const std::vector<unsigned char> tok_before = tok_buf, dur_before = dur_buf,
                                     gtok_before = gtok_buf, gdur_before = gdur_buf;
    if (ro.two_phase) {
        const void *gc = acc_values(ro.grad_costs, gc_d, gc_f);
        if (ro.ahead) {
            int written = -1;
            out.status = tdt_forward_ahead(&prob, &opt, costs, gc, ro.costs_only ? nullptr : &grads,
                                           ws_ptr, ws_bytes, &written);
            EXPECT_EQ(written, 0) << "the CPU wrote gradients ahead";
        } else {
            out.status = tdt_forward(&prob, &opt, costs, ws_ptr, ws_bytes);
        }
        if (out.status == TDT_STATUS_SUCCESS && !ro.costs_only)
            out.status = tdt_backward(&prob, &opt, gc, &grads, ws_ptr, ws_bytes);
    } else {
        out.status = compute_tdt_loss(&prob, &opt, costs, ro.costs_only ? nullptr : &grads, ws_ptr,
                                      ws_bytes);
    }
    if (out.status == TDT_STATUS_SUCCESS && ro.scale && !ro.costs_only) {
        tdt_options_t so = opt;
        so.grad_costs_scalar = ro.scale_scalar;
        out.status = tdt_scale_gradients(&prob, &so, acc_values(ro.scale, sc_d, sc_f), &grads);
    }
    out.error = tdt_last_error();
    out.pack_valid = pack_valid;
    if (out.status != TDT_STATUS_SUCCESS) {
        bool costs_nan = dbl ? std::isnan(reduced_d) : std::isnan(reduced_f);
        for (int64_t b = 0; b <= p.B; ++b) costs_nan = costs_nan && (dbl ? std::isnan(costs_d[b]) : std::isnan(costs_f[b]));
        out.untouched = costs_nan && tok_buf == tok_before && dur_buf == dur_before &&
                        gtok_buf == gtok_before && gdur_buf == gdur_before;
        return out;
    }
    if (ro.pack) {  // the packed array holds what the Problem gave as int32
        std::vector<int32_t> want(p.T.begin(), p.T.end());
        want.insert(want.end(), p.U.begin(), p.U.end());
        want.insert(want.end(), p.labels.begin(), p.labels.begin() + p.B * p.maxU);
        EXPECT_EQ(packed, want) << "options.pack's packed array";
        EXPECT_EQ(pack_valid, 1) << "options.pack_valid";
    }

    out.costs.resize(p.B);
    for (int64_t b = 0; b < p.B; ++b) out.costs[b] = dbl ? costs_d[b] : costs_f[b];
    out.reduced = dbl ? reduced_d : reduced_f;
    if (ro.reduction == TDT_REDUCTION_NONE) {
        EXPECT_TRUE(std::isnan(out.reduced)) << "options.reduced_cost was written with no reduction";
    }
    EXPECT_TRUE(dbl ? std::isnan(costs_d[p.B]) : std::isnan(costs_f[p.B]))
        << "costs[" << p.B << "], one past the batch, was written";
    if (ro.costs_only) return out;

    // Read the gradients back; check that the gaps of padded layouts were left alone.
    const bool got_tok = grads.token_grads != nullptr, got_dur = grads.duration_grads != nullptr;
    if (got_tok) out.gtok.assign(p.nodes() * V, nan);
    if (got_dur) out.gdur.assign(p.nodes() * D, nan);
    for (int64_t b = 0; b < p.B; ++b)
        for (int64_t t = 0; t < p.maxT; ++t)
            for (int64_t u = 0; u < R; ++u) {
                const int64_t n = p.node(b, t, u);
                for (int64_t v = 0; got_tok && v < V; ++v) out.gtok[n * V + v] = load(gtok_ptr, gt.at(b, t, u, v), dt);
                for (int64_t k = 0; got_dur && k < D; ++k) out.gdur[n * D + k] = load(gdur_ptr, gd.at(b, t, u, k), dt);
            }
    if (ro.layout == Layout::Padded) {
        auto check_gaps = [&](const void *buf, const View &v, int64_t width, int64_t elems, const char *name) {
            std::vector<char> inside(static_cast<size_t>(elems), 0);
            for (int64_t b = 0; b < p.B; ++b)
                for (int64_t t = 0; t < p.maxT; ++t)
                    for (int64_t u = 0; u < R; ++u)
                        for (int64_t w = 0; w < width; ++w) inside[v.at(b, t, u, w)] = 1;
            int64_t touched = 0;
            for (int64_t i = 0; i < elems; ++i)
                if (!inside[i] && !std::isnan(load(buf, i, dt))) ++touched;
            EXPECT_EQ(touched, 0) << touched << " elements of " << name
                                  << " outside the (B, T, U+1, W) extent were written";
        };
        if (got_tok) check_gaps(gtok_ptr, gt, V, view_extent(p, gt, V), "the token gradient buffer");
        if (got_dur) check_gaps(gdur_ptr, gd, D, view_extent(p, gd, D), "the duration gradient buffer");
    }
    return out;
}

Output run_ref(const Problem &p, const std::vector<double> *grad_costs) {
    tdt_ref::Config c;
    c.vocab_size = p.V;
    c.blank = p.blank;
    c.durations = p.durations;
    c.sigma = p.sigma;
    c.fastemit_lambda = p.fastemit;
    c.clamp = p.clamp;
    c.log_probs_input = p.log_probs;
    const int64_t V = p.V, D = p.D();
    Output out;
    out.costs.resize(p.B);
    out.gtok.assign(p.nodes() * V, 0.0);
    out.gdur.assign(p.nodes() * D, 0.0);
    for (int64_t b = 0; b < p.B; ++b) {
        tdt_ref::Sample s;
        s.T = p.T[b];
        s.U = p.U[b];
        s.labels.assign(p.labels.begin() + b * p.maxU, p.labels.begin() + b * p.maxU + s.U);
        for (int64_t t = 0; t < s.T; ++t)
            for (int64_t u = 0; u <= s.U; ++u) {
                const int64_t n = p.node(b, t, u);
                s.tok.insert(s.tok.end(), &p.tok[n * V], &p.tok[n * V] + V);
                if (D) s.dur.insert(s.dur.end(), &p.dur[n * D], &p.dur[n * D] + D);
            }
        const tdt_ref::Result r = tdt_ref::compute(c, s, grad_costs ? (*grad_costs)[b] : 1.0);
        if (r.feasible) {
            EXPECT_NEAR(r.beta00, r.log_likelihood, 1e-12 * std::fabs(r.log_likelihood) + 1e-12)
                << "the reference itself: beta(0,0) != LL for sample " << b;
        }
        out.costs[b] = r.cost;
        for (int64_t t = 0; t < s.T; ++t)
            for (int64_t u = 0; u <= s.U; ++u) {
                const int64_t n = p.node(b, t, u), m = t * (s.U + 1) + u;
                std::copy(&r.grad_tok[m * V], &r.grad_tok[m * V] + V, &out.gtok[n * V]);
                if (D) std::copy(&r.grad_dur[m * D], &r.grad_dur[m * D] + D, &out.gdur[n * D]);
            }
    }
    return out;
}

// ---- comparisons -----------------------------------------------------------------------------

Tol tol_for(tdt_dtype_t dtype) {
    // Measured headroom: with float32 logits the library is within ~1e-7 of the float64
    // reference (V-wide sums in float32, lattice in float64); 16-bit gradients are one rounding
    // (2^-11 / 2^-8 relative) away. Costs are float32 for the three narrow dtypes. These bounds
    // are a few times that, tight enough to catch a 1e-4 slip in a normaliser.
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return Tol{1e-10, 1e-10, 1e-10, 1e-9};
    case TDT_DTYPE_FLOAT32: return Tol{2e-6, 1e-6, 5e-7, 5e-6};
    case TDT_DTYPE_FLOAT16: return Tol{2e-6, 1e-6, 2e-6, 6e-4};
    case TDT_DTYPE_BFLOAT16: return Tol{2e-6, 1e-6, 2e-6, 4.5e-3};
    }
    return Tol{0, 0, 0, 0};
}

namespace {

std::string where(const Problem &p, int64_t i, int64_t width) {
    const int64_t w = i % width, n = i / width, R = p.maxU + 1;
    const int64_t u = n % R, t = (n / R) % p.maxT, b = n / (R * p.maxT);
    std::ostringstream s;
    s << "(b=" << b << ", t=" << t << ", u=" << u << ", " << (width == p.V ? "v=" : "k=") << w << ")";
    return s.str();
}

void compare_array(const std::vector<double> &got, const std::vector<double> &want, const Problem &p,
                   int64_t width, double atol, double rtol, const std::string &what,
                   const char *name) {
    if (got.empty() || want.empty()) return;
    ASSERT_EQ(got.size(), want.size()) << what << ": " << name;
    int64_t bad = 0;
    double worst = 0.0;
    std::ostringstream first;
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(got[i] - want[i]), lim = atol + rtol * std::fabs(want[i]);
        if (d <= lim) continue;
        if (!(d <= worst)) worst = d;  // NaN sticks
        if (bad++ < 6) {
            char buf[200];
            std::snprintf(buf, sizeof buf, "\n  %s %s: got %.17g want %.17g (diff %.3g > tol %.3g)", name,
                          where(p, static_cast<int64_t>(i), width).c_str(), got[i], want[i], d, lim);
            first << buf;
        }
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " " << name
                      << " elements diverge, largest |diff| " << worst << first.str() << "\n  problem "
                      << p.describe();
}

}  // namespace

void expect_near(const Output &got, const Output &want, const Problem &p, const Tol &tol,
                 const std::string &what) {
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << what << ": " << tdt_status_string(got.status) << " / "
                                              << got.error << "\n  problem " << p.describe();
    ASSERT_EQ(want.status, TDT_STATUS_SUCCESS) << what;
    ASSERT_EQ(got.costs.size(), want.costs.size()) << what;
    for (size_t b = 0; b < got.costs.size(); ++b) {
        const double g = got.costs[b], w = want.costs[b];
        if (std::isinf(w)) {
            EXPECT_TRUE(std::isinf(g) && g > 0) << what << ": cost[" << b << "] got " << g
                                                << ", want +inf (infeasible)\n  problem " << p.describe();
        } else {
            EXPECT_NEAR(g, w, tol.cost_abs + tol.cost_rel * std::fabs(w))
                << what << ": cost[" << b << "] (relative error " << std::fabs(g - w) / std::fabs(w)
                << ")\n  problem " << p.describe();
        }
    }
    compare_array(got.gtok, want.gtok, p, p.V, tol.grad_abs, tol.grad_rel, what, "token-gradient");
    compare_array(got.gdur, want.gdur, p, p.D(), tol.grad_abs, tol.grad_rel, what, "duration-gradient");
}

void expect_bitwise(const Output &got, const Output &want, const Problem &p, const std::string &what) {
    ASSERT_EQ(got.status, TDT_STATUS_SUCCESS) << what << ": " << got.error;
    ASSERT_EQ(want.status, TDT_STATUS_SUCCESS) << what << ": " << want.error;
    auto cmp = [&](const std::vector<double> &a, const std::vector<double> &b, int64_t width,
                   const char *name) {
        ASSERT_EQ(a.size(), b.size()) << what << ": " << name;
        int64_t bad = 0;
        std::ostringstream first;
        for (size_t i = 0; i < a.size(); ++i) {
            if (std::memcmp(&a[i], &b[i], sizeof(double)) == 0) continue;
            if (bad++ < 4) {
                char buf[160];
                std::snprintf(buf, sizeof buf, "\n  %s[%zu]%s: %.17g vs %.17g", name, i,
                              width ? where(p, static_cast<int64_t>(i), width).c_str() : "", a[i], b[i]);
                first << buf;
            }
        }
        EXPECT_EQ(bad, 0) << what << ": " << bad << " " << name << " values differ in their bits"
                          << first.str();
    };
    cmp(got.costs, want.costs, 0, "cost");
    cmp(got.gtok, want.gtok, p.V, "token-gradient");
    cmp(got.gdur, want.gdur, p.D(), "duration-gradient");
}

void expect_zero_outside_lattices(const Output &got, const Problem &p) {
    int64_t bad = 0, nans = 0;
    std::string first;
    for (int64_t b = 0; b < p.B; ++b)
        for (int64_t t = 0; t < p.maxT; ++t)
            for (int64_t u = 0; u <= p.maxU; ++u) {
                const bool inside = t < p.T[b] && u <= p.U[b];
                const int64_t n = p.node(b, t, u);
                auto check = [&](const std::vector<double> &g, int64_t width) {
                    for (int64_t w = 0; w < width && !g.empty(); ++w) {
                        const double x = g[n * width + w];
                        if (std::isnan(x)) ++nans;
                        if (!inside && x != 0.0) {
                            if (bad++ == 0) first = where(p, n * width + w, width) + " = " + std::to_string(x);
                        }
                    }
                };
                check(got.gtok, p.V);
                check(got.gdur, p.D());
            }
    EXPECT_EQ(nans, 0) << nans << " NaN gradient elements; problem " << p.describe();
    EXPECT_EQ(bad, 0) << bad << " gradient elements outside the lattices are not exactly 0, first "
                      << first << "; problem " << p.describe();
}

double cost_sum(const Output &o) {
    double s = 0.0;
    for (double c : o.costs) s += c;
    return s;
}

// ---- tdt_pack_indices() cases ----------------------------------------------------------------

std::vector<PackCase> pack_cases() {
    std::vector<PackCase> cs;
    // B = 3, T = 5, U = 4, V = 7, blank 6: labels row-major, padding past each label length
    // holding what a framework may leave there (the blank, -1)
    PackCase ok{"int64, full width", 3, 5, 4, 7, 6, TDT_INDEX_INT64, 4, 4,
                {0, 1, 2, 3, /**/ 5, 4, 6, -1, /**/ 6, 6, 6, 6}, {5, 3, 0}, {4, 2, 0}, 1};
    cs.push_back(ok);
    PackCase c = ok;
    c.name = "int32, full width";
    c.type = TDT_INDEX_INT32;
    cs.push_back(c);
    c = ok;
    c.name = "narrow targets, strided rows: zero-padded to U";
    c.cols = 2;
    c.stride = 3;
    c.labels = {1, 2, 99, /**/ 3, 4, 99, /**/ 5, 0, 99};
    c.ll = {2, 1, 0};
    cs.push_back(c);
    c = ok;
    c.name = "wide targets: columns past U not read";
    c.cols = 6;
    c.stride = 6;
    c.labels = {0, 1, 2, 3, 6, 9, /**/ 5, 4, 6, 6, 6, 6, /**/ 1, 1, 1, 1, 1, 1};
    cs.push_back(c);
    c = ok;
    c.name = "broadcast labels (stride 0)";
    c.stride = 0;
    c.labels = {2, 3, 4, 5};
    cs.push_back(c);
    c = ok;
    c.name = "no labels (U = 0)";
    c.U = 0;
    c.cols = 0;
    c.stride = 0;
    c.labels = {};
    c.ll = {0, 0, 0};
    cs.push_back(c);
    c = ok;
    c.name = "empty batch";
    c.B = 0;
    c.labels = {};
    c.fl = {};
    c.ll = {};
    cs.push_back(c);
    c = ok;
    c.name = "blank past the label length is padding";
    c.labels = {0, 1, 6, 6, /**/ 5, 4, 6, 6, /**/ 6, 6, 6, 6};
    c.ll = {2, 2, 0};
    cs.push_back(c);
    // one bad value a case: ok's, changed by `change`
    auto bad = [&](const char *name, void (*change)(PackCase &)) {
        PackCase b = ok;
        b.name = name;
        b.expect_valid = 0;
        change(b);
        cs.push_back(b);
    };
    bad("frame length over T", [](PackCase &b) { b.fl = {5, 6, 0}; });
    bad("negative frame length", [](PackCase &b) { b.fl = {5, 3, -1}; });
    bad("label length over U", [](PackCase &b) { b.ll = {4, 5, 0}; });
    bad("negative label length", [](PackCase &b) { b.ll = {4, 2, -2}; });
    bad("label length over the columns given", [](PackCase &b) {
        b.cols = 2;
        b.stride = 2;
        b.labels = {1, 2, /**/ 3, 4, /**/ 5, 0};
        b.ll = {2, 3, 0};
    });
    bad("label >= V", [](PackCase &b) { b.labels[5] = 7; });
    bad("negative label", [](PackCase &b) { b.labels[2] = -3; });
    bad("label equals the blank", [](PackCase &b) { b.labels[1] = 6; });
    bad("int64 label past int32 (wraps to a valid 1)",
        [](PackCase &b) { b.labels[3] = (int64_t{1} << 32) + 1; });
    bad("int64 frame length past int32", [](PackCase &b) {
        b.T = int64_t{1} << 40;
        b.fl[0] = (int64_t{1} << 32) + 5;
    });
    return cs;
}

std::vector<uint8_t> pack_bytes(const std::vector<int64_t> &values, tdt_index_type_t type) {
    const size_t w = type == TDT_INDEX_INT64 ? 8 : 4;
    std::vector<uint8_t> out(values.size() * w);
    for (size_t i = 0; i < values.size(); ++i) {
        if (type == TDT_INDEX_INT64) {
            std::memcpy(&out[i * 8], &values[i], 8);
        } else {
            const int32_t v = (int32_t)values[i];
            std::memcpy(&out[i * 4], &v, 4);
        }
    }
    return out;
}

std::vector<int32_t> pack_expected(const PackCase &c) {
    auto narrow = [](int64_t v) {
        return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()
                   ? (int32_t)v : 0;
    };
    std::vector<int32_t> out;
    for (int64_t b = 0; b < c.B; ++b) out.push_back(narrow(c.fl[b]));
    for (int64_t b = 0; b < c.B; ++b) out.push_back(narrow(c.ll[b]));
    for (int64_t b = 0; b < c.B; ++b)
        for (int64_t k = 0; k < c.U; ++k)
            out.push_back(k < c.cols ? narrow(c.labels[b * c.stride + k]) : 0);
    return out;
}

tdt_problem_t pack_problem(const PackCase &c) {
    tdt_problem_t p;
    std::memset(&p, 0, sizeof p);
    p.batch = c.B;
    p.max_frames = c.T;
    p.max_labels = c.U;
    p.vocab_size = c.V;
    return p;
}

}  // namespace tdt_test
