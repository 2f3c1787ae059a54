/*
 * test_errors.cc - every status code, each from its own bad input. For each: the status of
 * compute_tdt_loss, tdt_forward_ahead, tdt_forward and tdt_backward (and of tdt_scale_gradients
 * where it reads the bad argument); tdt_last_error() names the argument; nothing was written
 * (costs and gradients keep their sentinels).
 */
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tdt.h"

namespace {

constexpr float kCostSentinel = 12345.0f, kGradSentinel = 777.0f;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// A valid float32 TDT call (B=2, T=4, U=2, V=5, blank 4, durations {0,1,2}); each test breaks
// one thing and checks the answer.
class Errors : public ::testing::Test {
  protected:
    static constexpr int64_t B = 2, T = 4, U = 2, V = 5, D = 3, R = U + 1;
    std::vector<float> tok = std::vector<float>(B * T * R * V, 0.1f), dur = std::vector<float>(B * T * R * D, -0.2f);
    std::vector<float> gtok, gdur, costs;
    std::vector<int32_t> labels = {1, 2, 3, 0}, frames = {4, 3}, lens = {2, 2};
    int durations[4] = {0, 1, 2, 3};
    std::vector<unsigned char> ws;
    size_t ws_bytes = 0;
    tdt_problem_t prob;
    tdt_options_t opt;
    tdt_gradients_t grads;

    void SetUp() override {
        std::memset(&prob, 0, sizeof prob);
        std::memset(&opt, 0, sizeof opt);
        std::memset(&grads, 0, sizeof grads);
        prob.batch = B;
        prob.max_frames = T;
        prob.max_labels = U;
        prob.vocab_size = V;
        prob.dtype = TDT_DTYPE_FLOAT32;
        prob.token_logits = tok.data();
        prob.token_strides[0] = T * R * V;
        prob.token_strides[1] = R * V;
        prob.token_strides[2] = V;
        prob.duration_logits = dur.data();
        prob.duration_strides[0] = T * R * D;
        prob.duration_strides[1] = R * D;
        prob.duration_strides[2] = D;
        prob.labels = labels.data();
        prob.frame_lengths = frames.data();
        prob.label_lengths = lens.data();
        opt.blank = static_cast<int>(V - 1);
        opt.durations = durations;
        opt.num_durations = static_cast<int>(D);
        std::memcpy(grads.token_strides, prob.token_strides, sizeof grads.token_strides);
        std::memcpy(grads.duration_strides, prob.duration_strides, sizeof grads.duration_strides);
        ASSERT_EQ(tdt_get_workspace_size(&prob, &opt, &ws_bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
        ws.assign(ws_bytes, 0);
        reset_outputs();
        ASSERT_EQ(call_compute(), TDT_STATUS_SUCCESS) << "the baseline call must be valid: " << tdt_last_error();
        reset_outputs();
        good_prob = prob;
        good_opt = opt;
    }

    void reset_outputs() {
        costs.assign(B, kCostSentinel);
        gtok.assign(tok.size(), kGradSentinel);
        gdur.assign(dur.size(), kGradSentinel);
        grads.token_grads = gtok.data();
        grads.duration_grads = gdur.data();
    }
    tdt_status_t call_compute() { return compute_tdt_loss(&prob, &opt, costs.data(), &grads, ws.data(), ws_bytes); }
    // tdt_forward_ahead with one upstream value for all; `written` must come back 0 on failure
    tdt_status_t call_ahead(int *written) {
        const float one = 1.0f;
        tdt_options_t o = opt;
        o.grad_costs_scalar = 1;
        *written = -1;
        return tdt_forward_ahead(&prob, &o, costs.data(), &one, &grads, ws.data(), ws_bytes, written);
    }
    tdt_status_t call_scale() {
        const float half = 0.5f;
        tdt_options_t o = opt;
        o.grad_costs_scalar = 1;
        return tdt_scale_gradients(&prob, &o, &half, &grads);
    }

    // Nothing written: every cost and gradient element still holds its sentinel.
    void expect_untouched(const std::string &what) {
        int64_t c = 0, g = 0;
        for (float x : costs) c += x != kCostSentinel;
        for (float x : gtok) g += x != kGradSentinel;
        for (float x : gdur) g += x != kGradSentinel;
        EXPECT_EQ(c, 0) << what << ": " << c << " costs written by a failing call";
        EXPECT_EQ(g, 0) << what << ": " << g << " gradient elements written by a failing call";
    }

    void expect_error_text(const char *needle, const std::string &what) {
        const std::string err = tdt_last_error();
        EXPECT_NE(err.find(needle), std::string::npos)
            << what << ": tdt_last_error() should name '" << needle << "'; it says \"" << err << "\"";
    }

    // The current (broken) prob/opt must give `want` from compute_tdt_loss, tdt_forward_ahead,
    // tdt_forward, tdt_backward (after a valid forward of the unbroken call) and, unless
    // check_scale is false (the workspace: it takes none), tdt_scale_gradients, with `needle` in
    // the message.
    void expect_status(tdt_status_t want, const char *needle, bool check_backward = true,
                       bool check_forward = true, bool check_scale = true) {
        reset_outputs();
        tdt_status_t st = call_compute();
        EXPECT_EQ(st, want) << "compute_tdt_loss: got " << tdt_status_string(st) << " (" << tdt_last_error() << ")";
        expect_error_text(needle, "compute_tdt_loss");
        expect_untouched("compute_tdt_loss");

        reset_outputs();
        int written = -1;
        st = call_ahead(&written);
        EXPECT_EQ(st, want) << "tdt_forward_ahead: got " << tdt_status_string(st) << " (" << tdt_last_error() << ")";
        expect_error_text(needle, "tdt_forward_ahead");
        expect_untouched("tdt_forward_ahead");
        EXPECT_EQ(written, 0) << "tdt_forward_ahead failed but set grads_written to " << written;

        if (check_scale) {
            reset_outputs();
            st = call_scale();
            EXPECT_EQ(st, want) << "tdt_scale_gradients: got " << tdt_status_string(st) << " (" << tdt_last_error() << ")";
            expect_error_text(needle, "tdt_scale_gradients");
            expect_untouched("tdt_scale_gradients");
        }
        if (want == TDT_STATUS_INVALID_LENGTH || want == TDT_STATUS_INVALID_LABEL) {
            // the host-side check of lengths and labels finds the same fault, in the same words
            const std::string text = tdt_last_error();
            st = tdt_check_data(&prob, &opt);
            EXPECT_EQ(st, want) << "tdt_check_data: got " << tdt_status_string(st) << " (" << tdt_last_error() << ")";
            EXPECT_EQ(text, tdt_last_error()) << "tdt_check_data names the fault otherwise";
        }

        if (check_forward) {  // false for a gradient argument: tdt_forward does not take one
            st = tdt_forward(&prob, &opt, costs.data(), ws.data(), ws_bytes);
            EXPECT_EQ(st, want) << "tdt_forward: got " << tdt_status_string(st) << " (" << tdt_last_error() << ")";
            expect_error_text(needle, "tdt_forward");
            expect_untouched("tdt_forward");
        }

        if (!check_backward) return;
        valid_forward();
        reset_outputs();
        st = tdt_backward(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes);
        EXPECT_EQ(st, want) << "tdt_backward: got " << tdt_status_string(st) << " (" << tdt_last_error() << ")";
        expect_error_text(needle, "tdt_backward");
        expect_untouched("tdt_backward");
    }

    // Fills the workspace with a valid forward pass of the unbroken call (private copies of
    // everything a test may break).
    void valid_forward() {
        std::vector<int32_t> l = {1, 2, 3, 0}, f = {4, 3}, n = {2, 2};
        int d[3] = {0, 1, 2};
        tdt_problem_t p = good_prob;
        tdt_options_t o = good_opt;
        p.labels = l.data();
        p.frame_lengths = f.data();
        p.label_lengths = n.data();
        o.durations = d;
        std::vector<float> c(B);
        ASSERT_EQ(tdt_forward(&p, &o, c.data(), ws.data(), ws.size()), TDT_STATUS_SUCCESS) << tdt_last_error();
    }
    tdt_problem_t good_prob;
    tdt_options_t good_opt;
};

}  // namespace

class ErrorsTest : public Errors {};

// ---- TDT_STATUS_NULL_POINTER ---------------------------------------------------------------------

TEST_F(ErrorsTest, NullStructs) {
    EXPECT_EQ(compute_tdt_loss(nullptr, &opt, costs.data(), &grads, ws.data(), ws_bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_NE(std::string(tdt_last_error()).find("problem"), std::string::npos) << tdt_last_error();
    EXPECT_EQ(compute_tdt_loss(&prob, nullptr, costs.data(), &grads, ws.data(), ws_bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_NE(std::string(tdt_last_error()).find("options"), std::string::npos) << tdt_last_error();
    EXPECT_EQ(tdt_forward(nullptr, &opt, costs.data(), ws.data(), ws_bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_backward(&prob, nullptr, nullptr, &grads, ws.data(), ws_bytes), TDT_STATUS_NULL_POINTER);
    size_t bytes = 0;
    EXPECT_EQ(tdt_get_workspace_size(nullptr, &opt, &bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_get_workspace_size(&prob, nullptr, &bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_get_workspace_size(&prob, &opt, nullptr), TDT_STATUS_NULL_POINTER);
    expect_untouched("null structs");
}

TEST_F(ErrorsTest, NullAheadAndScaleArguments) {
    const float one = 1.0f;
    EXPECT_EQ(tdt_forward_ahead(&prob, &opt, costs.data(), nullptr, &grads, ws.data(), ws_bytes, nullptr),
              TDT_STATUS_NULL_POINTER);
    EXPECT_NE(std::string(tdt_last_error()).find("grads_written"), std::string::npos) << tdt_last_error();
    int written = -1;
    EXPECT_EQ(tdt_forward_ahead(nullptr, &opt, costs.data(), nullptr, &grads, ws.data(), ws_bytes, &written),
              TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(written, 0);
    EXPECT_EQ(tdt_forward_ahead(&prob, &opt, nullptr, nullptr, &grads, ws.data(), ws_bytes, &written),
              TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_scale_gradients(&prob, &opt, nullptr, &grads), TDT_STATUS_NULL_POINTER);
    EXPECT_NE(std::string(tdt_last_error()).find("scale"), std::string::npos) << tdt_last_error();
    EXPECT_EQ(tdt_scale_gradients(nullptr, &opt, &one, &grads), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_scale_gradients(&prob, nullptr, &one, &grads), TDT_STATUS_NULL_POINTER);
    expect_untouched("NULL arguments of tdt_forward_ahead / tdt_scale_gradients");
    // no gradient to scale, or an empty batch: nothing to do, and no scale is read
    EXPECT_EQ(tdt_scale_gradients(&prob, &opt, nullptr, nullptr), TDT_STATUS_SUCCESS) << tdt_last_error();
    prob.batch = 0;
    EXPECT_EQ(tdt_scale_gradients(&prob, &opt, nullptr, &grads), TDT_STATUS_SUCCESS) << tdt_last_error();
}

TEST_F(ErrorsTest, NullCosts) {
    EXPECT_EQ(compute_tdt_loss(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_NE(std::string(tdt_last_error()).find("costs"), std::string::npos) << tdt_last_error();
    EXPECT_EQ(tdt_forward(&prob, &opt, nullptr, ws.data(), ws_bytes), TDT_STATUS_NULL_POINTER);
    expect_untouched("costs NULL");
}

TEST_F(ErrorsTest, NullWorkspace) {
    EXPECT_EQ(compute_tdt_loss(&prob, &opt, costs.data(), &grads, nullptr, ws_bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_NE(std::string(tdt_last_error()).find("workspace"), std::string::npos) << tdt_last_error();
    EXPECT_EQ(tdt_forward(&prob, &opt, costs.data(), nullptr, ws_bytes), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_backward(&prob, &opt, nullptr, &grads, nullptr, ws_bytes), TDT_STATUS_NULL_POINTER);
    expect_untouched("workspace NULL");
}

TEST_F(ErrorsTest, NullTokenLogits) {
    prob.token_logits = nullptr;
    expect_status(TDT_STATUS_NULL_POINTER, "token_logits");
}

TEST_F(ErrorsTest, NullLabels) {
    prob.labels = nullptr;
    expect_status(TDT_STATUS_NULL_POINTER, "labels");
}

TEST_F(ErrorsTest, NullFrameLengths) {
    prob.frame_lengths = nullptr;
    expect_status(TDT_STATUS_NULL_POINTER, "frame_lengths");
}

TEST_F(ErrorsTest, NullLabelLengths) {
    prob.label_lengths = nullptr;
    expect_status(TDT_STATUS_NULL_POINTER, "label_lengths");
}

TEST_F(ErrorsTest, NullDurationsInTdtMode) {
    opt.durations = nullptr;
    expect_status(TDT_STATUS_NULL_POINTER, "durations");
}

// ---- TDT_STATUS_INVALID_SIZE ---------------------------------------------------------------------

TEST_F(ErrorsTest, NegativeBatch) {
    prob.batch = -1;
    expect_status(TDT_STATUS_INVALID_SIZE, "batch");
    size_t bytes = 0;
    EXPECT_EQ(tdt_get_workspace_size(&prob, &opt, &bytes), TDT_STATUS_INVALID_SIZE);
}

TEST_F(ErrorsTest, NegativeMaxFrames) {
    prob.max_frames = -1;
    expect_status(TDT_STATUS_INVALID_SIZE, "max_frames");
}

TEST_F(ErrorsTest, NegativeMaxLabels) {
    prob.max_labels = -1;
    expect_status(TDT_STATUS_INVALID_SIZE, "max_labels");
}

TEST_F(ErrorsTest, ZeroVocabulary) {
    prob.vocab_size = 0;
    expect_status(TDT_STATUS_INVALID_SIZE, "vocab_size");
}

// ---- TDT_STATUS_INVALID_BLANK --------------------------------------------------------------------

TEST_F(ErrorsTest, BlankNegative) {
    opt.blank = -1;
    expect_status(TDT_STATUS_INVALID_BLANK, "blank");
}

TEST_F(ErrorsTest, BlankEqualsVocabSize) {
    opt.blank = static_cast<int>(V);
    expect_status(TDT_STATUS_INVALID_BLANK, "blank");
}

// ---- durations -----------------------------------------------------------------------------------

TEST_F(ErrorsTest, NegativeDuration) {
    durations[1] = -1;
    expect_status(TDT_STATUS_INVALID_DURATIONS, "durations");
}

TEST_F(ErrorsTest, DuplicatedDuration) {
    durations[2] = 0;  // {0, 1, 0}
    expect_status(TDT_STATUS_INVALID_DURATIONS, "durations");
}

TEST_F(ErrorsTest, NoPositiveDuration) {
    opt.num_durations = 1;  // {0}
    prob.duration_strides[0] = T * R;
    prob.duration_strides[1] = R;
    prob.duration_strides[2] = 1;
    std::memcpy(grads.duration_strides, prob.duration_strides, sizeof grads.duration_strides);
    expect_status(TDT_STATUS_NO_POSITIVE_DURATION, "durations");
}

TEST_F(ErrorsTest, ZeroDurationsWithDurationLogits) {
    opt.num_durations = 0;
    expect_status(TDT_STATUS_TOO_MANY_DURATIONS, "num_durations");
}

TEST_F(ErrorsTest, MoreThanMaxDurations) {
    std::vector<int> many(TDT_MAX_DURATIONS + 1);
    for (size_t k = 0; k < many.size(); ++k) many[k] = static_cast<int>(k);
    std::vector<float> big(B * T * R * many.size(), 0.0f), gbig(big.size(), kGradSentinel);
    opt.durations = many.data();
    opt.num_durations = TDT_MAX_DURATIONS + 1;
    prob.duration_logits = big.data();
    const int64_t Dm = static_cast<int64_t>(many.size());
    prob.duration_strides[0] = T * R * Dm;
    prob.duration_strides[1] = R * Dm;
    prob.duration_strides[2] = Dm;
    std::memcpy(grads.duration_strides, prob.duration_strides, sizeof grads.duration_strides);
    reset_outputs();
    grads.duration_grads = gbig.data();
    EXPECT_EQ(call_compute(), TDT_STATUS_TOO_MANY_DURATIONS) << tdt_last_error();
    EXPECT_NE(std::string(tdt_last_error()).find("num_durations"), std::string::npos) << tdt_last_error();
    EXPECT_EQ(tdt_forward(&prob, &opt, costs.data(), ws.data(), ws_bytes), TDT_STATUS_TOO_MANY_DURATIONS);
    for (float x : gbig) ASSERT_EQ(x, kGradSentinel) << "duration gradient written by a failing call";
    grads.duration_grads = gdur.data();
    expect_untouched("33 durations");
}

// ---- TDT_STATUS_INVALID_STRIDES ------------------------------------------------------------------

TEST_F(ErrorsTest, NegativeTokenStride) {
    prob.token_strides[1] = -prob.token_strides[1];
    expect_status(TDT_STATUS_INVALID_STRIDES, "token_strides");
}

TEST_F(ErrorsTest, NegativeDurationStride) {
    prob.duration_strides[0] = -1;
    expect_status(TDT_STATUS_INVALID_STRIDES, "duration_strides");
}

TEST_F(ErrorsTest, OverflowingStride) {  // (B-1) * stride + ... overflows int64
    prob.token_strides[0] = std::numeric_limits<int64_t>::max() - 10;
    expect_status(TDT_STATUS_INVALID_STRIDES, "token_strides");
}

// The element offset fits in int64 but not its byte offset: 2^62 floats are 2^64 bytes, which
// wraps the address space back onto the first sample.
TEST_F(ErrorsTest, StrideOverflowingInBytes) {
    prob.token_strides[0] = int64_t(1) << 62;
    expect_status(TDT_STATUS_INVALID_STRIDES, "token_strides");
}

TEST_F(ErrorsTest, OverlappingGradientRows) {  // u-stride < V: rows of the gradient overlap
    grads.token_strides[2] = V - 1;
    expect_status(TDT_STATUS_INVALID_STRIDES, "token_strides", true, false);
}

TEST_F(ErrorsTest, OverlappingGradientFrames) {  // t-stride == u-stride: (t+1, u) is (t, u+1)
    grads.duration_strides[1] = grads.duration_strides[2];
    expect_status(TDT_STATUS_INVALID_STRIDES, "duration_strides", true, false);
}

// ---- TDT_STATUS_INVALID_DTYPE --------------------------------------------------------------------

TEST_F(ErrorsTest, UnknownDtype) {
    prob.dtype = static_cast<tdt_dtype_t>(7);
    expect_status(TDT_STATUS_INVALID_DTYPE, "dtype");
    prob.dtype = static_cast<tdt_dtype_t>(-1);
    expect_status(TDT_STATUS_INVALID_DTYPE, "dtype");
}

// ---- TDT_STATUS_WORKSPACE_TOO_SMALL --------------------------------------------------------------

TEST_F(ErrorsTest, WorkspaceOneByteShort) {
    ws_bytes -= 1;
    expect_status(TDT_STATUS_WORKSPACE_TOO_SMALL, "workspace", true, true, false);
    ws_bytes = 0;
    expect_status(TDT_STATUS_WORKSPACE_TOO_SMALL, "workspace", true, true, false);
}

// ---- TDT_STATUS_BACKEND_NOT_BUILT ----------------------------------------------------------------

TEST_F(ErrorsTest, GpuInCpuOnlyBuild) {
    if (tdt_backend_built(TDT_LOCATION_GPU)) GTEST_SKIP() << "this library has the GPU backend";
    opt.location = TDT_LOCATION_GPU;
    expect_status(TDT_STATUS_BACKEND_NOT_BUILT, "GPU", false);
    int count = -1;
    EXPECT_EQ(tdt_gpu_device_count(&count), TDT_STATUS_BACKEND_NOT_BUILT);
}

// ---- TDT_STATUS_INVALID_LENGTH -------------------------------------------------------------------

TEST_F(ErrorsTest, FrameLengthAboveMax) {
    frames[1] = static_cast<int32_t>(T + 1);
    expect_status(TDT_STATUS_INVALID_LENGTH, "frame_lengths[1]");
}

TEST_F(ErrorsTest, FrameLengthNegative) {
    frames[0] = -1;
    expect_status(TDT_STATUS_INVALID_LENGTH, "frame_lengths[0]");
}

TEST_F(ErrorsTest, LabelLengthAboveMax) {
    lens[0] = static_cast<int32_t>(U + 1);
    expect_status(TDT_STATUS_INVALID_LENGTH, "label_lengths[0]");
}

TEST_F(ErrorsTest, LabelLengthNegative) {
    lens[1] = -3;
    expect_status(TDT_STATUS_INVALID_LENGTH, "label_lengths[1]");
}

// ---- TDT_STATUS_INVALID_LABEL --------------------------------------------------------------------

TEST_F(ErrorsTest, LabelAboveVocabulary) {
    labels[3] = static_cast<int32_t>(V);  // labels[1][1]
    expect_status(TDT_STATUS_INVALID_LABEL, "labels[1][1]");
}

TEST_F(ErrorsTest, LabelNegative) {
    labels[0] = -1;
    expect_status(TDT_STATUS_INVALID_LABEL, "labels[0][0]");
}

TEST_F(ErrorsTest, LabelEqualsBlank) {
    labels[1] = static_cast<int32_t>(V - 1);  // labels[0][1] == blank 4
    expect_status(TDT_STATUS_INVALID_LABEL, "labels[0][1]");
}

TEST_F(ErrorsTest, LabelPaddingIsNotChecked) {  // only labels[b][0..U_b-1] are read
    lens = {1, 0};
    labels = {1, 99, -5, static_cast<int32_t>(V - 1)};
    prob.labels = labels.data();
    reset_outputs();
    EXPECT_EQ(call_compute(), TDT_STATUS_SUCCESS) << tdt_last_error();
}

// ---- TDT_STATUS_INVALID_OPTION -------------------------------------------------------------------

TEST_F(ErrorsTest, NegativeThreads) {
    opt.num_threads = -1;
    expect_status(TDT_STATUS_INVALID_OPTION, "num_threads");
}

TEST_F(ErrorsTest, BadSigma) {
    for (double s : {-0.1, kNaN, kInf}) {
        SCOPED_TRACE(::testing::Message() << "sigma " << s);
        opt.sigma = s;
        expect_status(TDT_STATUS_INVALID_OPTION, "sigma");
    }
}

TEST_F(ErrorsTest, BadFastEmitLambda) {
    for (double s : {-1.0, kNaN, kInf}) {
        SCOPED_TRACE(::testing::Message() << "fastemit_lambda " << s);
        opt.fastemit_lambda = s;
        expect_status(TDT_STATUS_INVALID_OPTION, "fastemit_lambda");
    }
}

TEST_F(ErrorsTest, BadClamp) {
    for (double s : {-0.5, kNaN, kInf}) {
        SCOPED_TRACE(::testing::Message() << "clamp " << s);
        opt.clamp = s;
        expect_status(TDT_STATUS_INVALID_OPTION, "clamp");
    }
}

TEST_F(ErrorsTest, BadLocation) {
    opt.location = static_cast<tdt_location_t>(5);
    expect_status(TDT_STATUS_INVALID_OPTION, "location");
}

TEST_F(ErrorsTest, BadInputKind) {
    opt.input_kind = static_cast<tdt_input_kind_t>(3);
    expect_status(TDT_STATUS_INVALID_OPTION, "input_kind");
}

TEST_F(ErrorsTest, BadReduction) {
    std::vector<float> out(1, kCostSentinel);
    opt.reduced_cost = out.data();
    for (int r : {-1, 3}) {
        SCOPED_TRACE(::testing::Message() << "reduction " << r);
        opt.reduction = static_cast<tdt_reduction_t>(r);
        expect_status(TDT_STATUS_INVALID_OPTION, "reduction");
        EXPECT_EQ(out[0], kCostSentinel) << "a failing call wrote the reduction";
    }
}

// A reduction needs somewhere to go, outside costs; only the forward calls write it, so
// tdt_backward and tdt_scale_gradients take such options as they are.
TEST_F(ErrorsTest, ReducedCostNullOrInsideCosts) {
    opt.reduction = TDT_REDUCTION_MEAN;
    opt.reduced_cost = nullptr;
    expect_status(TDT_STATUS_NULL_POINTER, "reduced_cost", false, true, false);
    opt.reduced_cost = costs.data() + 1;  // the second cost
    expect_status(TDT_STATUS_INVALID_OPTION, "reduced_cost", false, true, false);
    opt.reduced_cost = nullptr;
    valid_forward();
    EXPECT_EQ(tdt_backward(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes), TDT_STATUS_SUCCESS)
        << tdt_last_error();
    EXPECT_EQ(call_scale(), TDT_STATUS_SUCCESS) << tdt_last_error();
}

// tdt_check_data: the lengths and labels alone, from host memory, whatever the logits (none
// here) and the location; padding labels beyond U_b are never read. Each data fault's status and
// message are checked against the CPU call's in expect_status.
TEST_F(ErrorsTest, CheckDataAloneOnTheHost) {
    tdt_problem_t p = prob;
    p.token_logits = nullptr;
    p.duration_logits = nullptr;
    p.dtype = static_cast<tdt_dtype_t>(77);  // ignored
    tdt_options_t o = opt;
    o.location = TDT_LOCATION_GPU;
    labels[3] = -5;  // labels[1][1]: read, since U_1 = 2
    EXPECT_EQ(tdt_check_data(&p, &o), TDT_STATUS_INVALID_LABEL) << tdt_last_error();
    lens[1] = 1;  // now labels[1][1] is padding
    EXPECT_EQ(tdt_check_data(&p, &o), TDT_STATUS_SUCCESS) << tdt_last_error();
    EXPECT_STREQ(tdt_last_error(), "");
    p.batch = 0;
    p.frame_lengths = p.label_lengths = nullptr;
    p.labels = nullptr;
    EXPECT_EQ(tdt_check_data(&p, &o), TDT_STATUS_SUCCESS) << "an empty batch reads nothing";
    p = prob;
    p.label_lengths = nullptr;
    EXPECT_EQ(tdt_check_data(&p, &o), TDT_STATUS_NULL_POINTER);
    EXPECT_NE(std::string(tdt_last_error()).find("label_lengths"), std::string::npos) << tdt_last_error();
    p = prob;
    o.blank = static_cast<int>(V);
    EXPECT_EQ(tdt_check_data(&p, &o), TDT_STATUS_INVALID_BLANK) << tdt_last_error();
    o.blank = opt.blank;
    p.vocab_size = 0;
    EXPECT_EQ(tdt_check_data(&p, &o), TDT_STATUS_INVALID_SIZE) << tdt_last_error();
    EXPECT_EQ(tdt_check_data(nullptr, &o), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_check_data(&p, nullptr), TDT_STATUS_NULL_POINTER);
}

// Checked on every location (a CPU call ignores the schedule, but not a value outside the enum).
TEST_F(ErrorsTest, BadGpuSchedule) {
    for (int v : {-1, 6, 1000}) {
        SCOPED_TRACE(::testing::Message() << "gpu_schedule " << v);
        opt.gpu_schedule = static_cast<tdt_gpu_schedule_t>(v);
        expect_status(TDT_STATUS_INVALID_OPTION, "gpu_schedule");
    }
}

// ---- TDT_STATUS_INVALID_WORKSPACE ----------------------------------------------------------------

TEST_F(ErrorsTest, BackwardWithoutForward) {
    for (unsigned char fill : {0x00, 0xa5, 0xff}) {
        SCOPED_TRACE(::testing::Message() << "workspace filled with " << static_cast<int>(fill));
        std::fill(ws.begin(), ws.end(), fill);
        reset_outputs();
        const tdt_status_t st = tdt_backward(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes);
        EXPECT_EQ(st, TDT_STATUS_INVALID_WORKSPACE) << tdt_status_string(st) << " (" << tdt_last_error() << ")";
        EXPECT_NE(std::string(tdt_last_error()).find("workspace"), std::string::npos) << tdt_last_error();
        expect_untouched("backward without forward");
    }
}

TEST_F(ErrorsTest, BackwardOfAnotherProblem) {
    std::vector<float> c(B);
    ASSERT_EQ(tdt_forward(&prob, &opt, c.data(), ws.data(), ws_bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
    prob.batch = 1;  // not the problem the workspace holds
    reset_outputs();
    const tdt_status_t st = tdt_backward(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes);
    EXPECT_EQ(st, TDT_STATUS_INVALID_WORKSPACE) << tdt_status_string(st) << " (" << tdt_last_error() << ")";
    expect_untouched("backward of another problem");
}

TEST_F(ErrorsTest, BackwardAfterForwardSucceeds) {
    std::vector<float> c(B);
    ASSERT_EQ(tdt_forward(&prob, &opt, c.data(), ws.data(), ws_bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
    EXPECT_EQ(tdt_backward(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
    EXPECT_STREQ(tdt_last_error(), "");
    // The workspace holds the forward pass until the caller overwrites it: a second backward works.
    EXPECT_EQ(tdt_backward(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
}

// A costs-only compute_tdt_loss sweeps alpha alone on the CPU: the same costs, to the bit, as
// tdt_forward's, and a workspace that tdt_backward refuses even where a forward pass had filled
// it before (beta is stale).
TEST_F(ErrorsTest, CostsOnlyCallLeavesNoBackwardableWorkspace) {
    std::vector<float> fwd(B), only(B);
    ASSERT_EQ(tdt_forward(&prob, &opt, fwd.data(), ws.data(), ws_bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
    ASSERT_EQ(compute_tdt_loss(&prob, &opt, only.data(), nullptr, ws.data(), ws_bytes), TDT_STATUS_SUCCESS)
        << tdt_last_error();
    for (int64_t b = 0; b < B; ++b)
        EXPECT_EQ(std::memcmp(&fwd[b], &only[b], sizeof(float)), 0)
            << "sample " << b << ": costs-only " << only[b] << " vs tdt_forward " << fwd[b];
    reset_outputs();
    const tdt_status_t st = tdt_backward(&prob, &opt, nullptr, &grads, ws.data(), ws_bytes);
    EXPECT_EQ(st, TDT_STATUS_INVALID_WORKSPACE) << tdt_status_string(st) << " (" << tdt_last_error() << ")";
    expect_untouched("backward after a costs-only call");
}

// ---- the last-error text ------------------------------------------------------------------------

TEST_F(ErrorsTest, LastErrorClearedBySuccess) {
    opt.blank = -3;
    reset_outputs();
    ASSERT_EQ(call_compute(), TDT_STATUS_INVALID_BLANK);
    EXPECT_NE(std::string(tdt_last_error()).find("-3"), std::string::npos)
        << "the message should give the bad value: " << tdt_last_error();
    opt.blank = static_cast<int>(V - 1);
    ASSERT_EQ(call_compute(), TDT_STATUS_SUCCESS) << tdt_last_error();
    EXPECT_STREQ(tdt_last_error(), "");
}

TEST_F(ErrorsTest, LastErrorIsPerThread) {
    opt.blank = -3;
    ASSERT_EQ(call_compute(), TDT_STATUS_INVALID_BLANK);
    std::string other = "unset";
    std::thread th([&] { other = tdt_last_error(); });
    th.join();
    EXPECT_EQ(other, "") << "another thread sees this thread's error";
    EXPECT_NE(std::string(tdt_last_error()), "");
}
