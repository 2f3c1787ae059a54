/*
 * test_api.cc - versions, status strings, the workspace query, backends.
 */
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tdt.h"

namespace {

const std::vector<std::pair<tdt_status_t, const char *>> kStatuses = {
    {TDT_STATUS_SUCCESS, "TDT_STATUS_SUCCESS"},
    {TDT_STATUS_NULL_POINTER, "TDT_STATUS_NULL_POINTER"},
    {TDT_STATUS_INVALID_SIZE, "TDT_STATUS_INVALID_SIZE"},
    {TDT_STATUS_INVALID_BLANK, "TDT_STATUS_INVALID_BLANK"},
    {TDT_STATUS_INVALID_DURATIONS, "TDT_STATUS_INVALID_DURATIONS"},
    {TDT_STATUS_NO_POSITIVE_DURATION, "TDT_STATUS_NO_POSITIVE_DURATION"},
    {TDT_STATUS_TOO_MANY_DURATIONS, "TDT_STATUS_TOO_MANY_DURATIONS"},
    {TDT_STATUS_INVALID_STRIDES, "TDT_STATUS_INVALID_STRIDES"},
    {TDT_STATUS_INVALID_DTYPE, "TDT_STATUS_INVALID_DTYPE"},
    {TDT_STATUS_WORKSPACE_TOO_SMALL, "TDT_STATUS_WORKSPACE_TOO_SMALL"},
    {TDT_STATUS_BACKEND_NOT_BUILT, "TDT_STATUS_BACKEND_NOT_BUILT"},
    {TDT_STATUS_INVALID_LENGTH, "TDT_STATUS_INVALID_LENGTH"},
    {TDT_STATUS_INVALID_LABEL, "TDT_STATUS_INVALID_LABEL"},
    {TDT_STATUS_INVALID_OPTION, "TDT_STATUS_INVALID_OPTION"},
    {TDT_STATUS_INVALID_WORKSPACE, "TDT_STATUS_INVALID_WORKSPACE"},
    {TDT_STATUS_CUDA_ERROR, "TDT_STATUS_CUDA_ERROR"},
    {TDT_STATUS_UNKNOWN_ERROR, "TDT_STATUS_UNKNOWN_ERROR"},
};

tdt_problem_t shape(int64_t B, int64_t T, int64_t U) {
    tdt_problem_t p;
    std::memset(&p, 0, sizeof p);  // no pointer set: the query must not dereference any
    p.batch = B;
    p.max_frames = T;
    p.max_labels = U;
    p.vocab_size = 1025;
    p.dtype = static_cast<tdt_dtype_t>(99);  // not read by the query
    return p;
}

size_t workspace(int64_t B, int64_t T, int64_t U, int D) {
    const tdt_problem_t p = shape(B, T, U);
    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.num_durations = D;
    size_t bytes = 0;
    EXPECT_EQ(tdt_get_workspace_size(&p, &o, &bytes), TDT_STATUS_SUCCESS)
        << "B=" << B << " T=" << T << " U=" << U << " D=" << D << ": " << tdt_last_error();
    return bytes;
}

}  // namespace

TEST(Api, VersionMatchesHeader) {
    EXPECT_EQ(TDT_VERSION_NUMBER, TDT_VERSION_MAJOR * 10000 + TDT_VERSION_MINOR * 100 + TDT_VERSION_PATCH);
    EXPECT_EQ(tdt_version(), TDT_VERSION_NUMBER) << "the loaded library is not the one this header describes";
    char expect[32];
    std::snprintf(expect, sizeof expect, "%d.%d.%d", TDT_VERSION_MAJOR, TDT_VERSION_MINOR, TDT_VERSION_PATCH);
    ASSERT_NE(tdt_version_string(), nullptr);
    EXPECT_STREQ(tdt_version_string(), expect);
}

// Pinned numbers: never renumbered.
TEST(Api, StatusCodesArePinned) {
    const int pinned[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 99};
    ASSERT_EQ(kStatuses.size(), sizeof pinned / sizeof pinned[0]);
    for (size_t i = 0; i < kStatuses.size(); ++i) EXPECT_EQ(static_cast<int>(kStatuses[i].first), pinned[i]) << kStatuses[i].second;
}

TEST(Api, StatusStringsNameEveryCode) {
    std::set<std::string> seen;
    for (const auto &s : kStatuses) {
        const char *str = tdt_status_string(s.first);
        ASSERT_NE(str, nullptr) << s.second;
        EXPECT_EQ(std::string(str).rfind(s.second, 0), 0u) << "tdt_status_string(" << s.second << ") = \"" << str << "\"";
        EXPECT_GT(std::strlen(str), std::strlen(s.second)) << "no explanation after the name: " << str;
        EXPECT_TRUE(seen.insert(str).second) << "duplicate string " << str;
    }
    for (int unknown : {-1, 16, 42, 98, 100, 1 << 30}) {
        const char *str = tdt_status_string(static_cast<tdt_status_t>(unknown));
        ASSERT_NE(str, nullptr) << unknown;
        EXPECT_GT(std::strlen(str), 0u) << unknown;
    }
}

TEST(Api, WorkspaceSizeFromShapesOnly) {
    const size_t base = workspace(2, 10, 4, 5);
    EXPECT_GT(base, 0u);
    EXPECT_GE(workspace(3, 10, 4, 5), base) << "grows with B";
    EXPECT_GE(workspace(2, 20, 4, 5), base) << "grows with T";
    EXPECT_GE(workspace(2, 10, 8, 5), base) << "grows with U";
    EXPECT_GE(workspace(2, 10, 4, TDT_MAX_DURATIONS), base) << "grows with D";
    workspace(0, 0, 0, 0);  // an empty problem is a valid question
    workspace(2, 10, 4, 0); // RNN-T
    // An empty batch has no lattice: its size must not grow with max_frames (the GPU forward's
    // per-layer counters, ceil((T + U) / 2) of them, are only there when B > 0).
    EXPECT_EQ(workspace(0, int64_t(1) << 62, 4, 5), workspace(0, 10, 4, 5));
}

// The workspace's per-node state is what the peak memory at small V is made of (docs/performance.md,
// "Peak memory"): a block of 3 + D doubles (the node pass's log-probabilities and log-normaliser), alpha
// and beta, so 8 (5 + D) bytes a node for TDT and 40 for RNN-T. More is a decision that moves
// ragged's peak (80 bytes there against 52 a node at 1.05x), not something to slip in.
TEST(Api, WorkspaceBytesANode) {
    static const char placeholder = 0; // a non-NULL duration_logits asks for the TDT size
    auto size = [](int64_t T, int D, bool tdt) {
        tdt_problem_t p = shape(4, T, 9); // rows of 10 nodes
        if (tdt) p.duration_logits = &placeholder;
        tdt_options_t o;
        std::memset(&o, 0, sizeof o);
        o.num_durations = D;
        size_t bytes = 0;
        EXPECT_EQ(tdt_get_workspace_size(&p, &o, &bytes), TDT_STATUS_SUCCESS) << tdt_last_error();
        return bytes;
    };
    // 1000 more frames: 40,000 more nodes; besides them 4 bytes of counters a frame (0.1 a
    // node) and at most 256 bytes of alignment a sub-buffer
    const double nodes = 4.0 * 1000 * 10;
    for (int D : {1, 5, TDT_MAX_DURATIONS}) {
        const double per = (double)(size(2000, D, true) - size(1000, D, true)) / nodes;
        EXPECT_GE(per, 8.0 * (5 + D)) << "D = " << D;
        EXPECT_LT(per, 8.0 * (5 + D) + 0.5) << "D = " << D << ": " << per << " bytes a node";
    }
    const double rnnt = (double)(size(2000, 5, false) - size(1000, 5, false)) / nodes;
    EXPECT_GE(rnnt, 40.0);
    EXPECT_LT(rnnt, 40.5) << "RNN-T: " << rnnt << " bytes a node";
}

// Sizes whose workspace cannot be represented must be refused, not wrapped around.
TEST(Api, WorkspaceSizeOverflow) {
    const tdt_problem_t p = shape(int64_t(1) << 30, int64_t(1) << 30, int64_t(1) << 30);
    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.num_durations = 5;
    size_t bytes = 0;
    const tdt_status_t st = tdt_get_workspace_size(&p, &o, &bytes);
    if (st == TDT_STATUS_SUCCESS) {
        ADD_FAILURE() << "2^90 nodes gave SUCCESS and " << bytes << " bytes";
    } else {
        EXPECT_EQ(st, TDT_STATUS_INVALID_SIZE) << tdt_status_string(st) << ": " << tdt_last_error();
    }
}

TEST(Api, Backends) {
    EXPECT_EQ(tdt_backend_built(TDT_LOCATION_CPU), 1);
    const int gpu = tdt_backend_built(TDT_LOCATION_GPU);
    EXPECT_TRUE(gpu == 0 || gpu == 1) << gpu;
    int count = -1;
    const tdt_status_t st = tdt_gpu_device_count(&count);
    if (gpu) {
        EXPECT_EQ(st, TDT_STATUS_SUCCESS) << tdt_last_error();
        EXPECT_GE(count, 0);
    } else {
        EXPECT_EQ(st, TDT_STATUS_BACKEND_NOT_BUILT);
    }
    EXPECT_EQ(tdt_gpu_device_count(nullptr), TDT_STATUS_NULL_POINTER);
}
