/*
 * test_indices.cc - tdt_pack_indices() on the CPU: int32 and int64 labels and lengths packed into
 * the int32 layout the loss reads, the verdict on every rule of tdt_check_data (plus label
 * lengths past the columns given and values past int32), and its argument checks. The GPU suite
 * runs the same cases (test_gpu.cc, GpuIndices).
 */
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tdt.h"
#include "test_util.h"

namespace {

using tdt_test::PackCase;

tdt_indices_t view(const PackCase &c, const std::vector<uint8_t> &labels,
                   const std::vector<uint8_t> &fl, const std::vector<uint8_t> &ll) {
    tdt_indices_t in;
    std::memset(&in, 0, sizeof in);
    in.type = c.type;
    in.labels = labels.empty() ? nullptr : labels.data();
    in.columns = c.cols;
    in.labels_stride = c.stride;
    in.frame_lengths = fl.empty() ? nullptr : fl.data();
    in.label_lengths = ll.empty() ? nullptr : ll.data();
    return in;
}

TEST(PackIndices, EveryCase) {
    for (const PackCase &c : tdt_test::pack_cases()) {
        SCOPED_TRACE(c.name);
        const auto labels = tdt_test::pack_bytes(c.labels, c.type);
        const auto fl = tdt_test::pack_bytes(c.fl, c.type), ll = tdt_test::pack_bytes(c.ll, c.type);
        const tdt_indices_t in = view(c, labels, fl, ll);
        tdt_problem_t p = tdt_test::pack_problem(c);
        tdt_options_t o;
        std::memset(&o, 0, sizeof o);
        o.blank = c.blank;
        const std::vector<int32_t> want = tdt_test::pack_expected(c);
        std::vector<int32_t> got(want.size() + 1, -77);  // one guard element past the end
        int32_t valid = -1;
        ASSERT_EQ(tdt_pack_indices(&p, &o, &in, got.data(), &valid), TDT_STATUS_SUCCESS)
            << tdt_last_error();
        EXPECT_EQ(valid, c.expect_valid);
        for (size_t i = 0; i < want.size(); ++i)
            EXPECT_EQ(got[i], want[i]) << "packed[" << i << "] of " << want.size();
        EXPECT_EQ(got[want.size()], -77) << "wrote past 2 B + B U elements";
        // no flag asked: the same packing
        std::vector<int32_t> again(want.size() + 1, -77);
        ASSERT_EQ(tdt_pack_indices(&p, &o, &in, again.data(), nullptr), TDT_STATUS_SUCCESS);
        EXPECT_EQ(again, got);
        // the verdict agrees with tdt_check_data on the packed arrays wherever both apply
        // (tdt_check_data knows nothing of columns or of values past int32)
        const bool wrapped = c.name.find("past int32") != std::string::npos;
        if (c.cols >= c.U && c.B > 0 && !wrapped) {
            p.frame_lengths = got.data();
            p.label_lengths = got.data() + c.B;
            p.labels = c.U > 0 ? got.data() + 2 * c.B : nullptr;
            EXPECT_EQ(tdt_check_data(&p, &o) == TDT_STATUS_SUCCESS, c.expect_valid == 1)
                << tdt_last_error();
        }
    }
}

TEST(PackIndices, ArgumentChecks) {
    const PackCase c = tdt_test::pack_cases()[0];
    const auto labels = tdt_test::pack_bytes(c.labels, c.type);
    const auto fl = tdt_test::pack_bytes(c.fl, c.type), ll = tdt_test::pack_bytes(c.ll, c.type);
    tdt_indices_t in = view(c, labels, fl, ll);
    tdt_problem_t p = tdt_test::pack_problem(c);
    tdt_options_t o;
    std::memset(&o, 0, sizeof o);
    o.blank = c.blank;
    std::vector<int32_t> out(tdt_test::pack_expected(c).size(), -77);
    int32_t valid = -1;
    auto status = [&](tdt_indices_t i, int32_t *packed) {
        return tdt_pack_indices(&p, &o, &i, packed, &valid);
    };
    EXPECT_EQ(tdt_pack_indices(nullptr, &o, &in, out.data(), &valid), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_pack_indices(&p, nullptr, &in, out.data(), &valid), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(tdt_pack_indices(&p, &o, nullptr, out.data(), &valid), TDT_STATUS_NULL_POINTER);
    EXPECT_EQ(status(in, nullptr), TDT_STATUS_NULL_POINTER);
    tdt_indices_t bad = in;
    bad.type = (tdt_index_type_t)2;
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_INVALID_DTYPE);
    EXPECT_NE(std::string(tdt_last_error()).find("indices->type = 2"), std::string::npos)
        << tdt_last_error();
    bad = in;
    bad.columns = -1;
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_INVALID_SIZE);
    bad = in;
    bad.labels_stride = -4;
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_INVALID_STRIDES);
    bad = in;
    bad.labels_stride = INT64_MAX / 2;
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_INVALID_STRIDES);
    bad = in;
    bad.labels = nullptr;
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_NULL_POINTER);
    bad.columns = 0;  // nothing read: NULL labels are fine
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_SUCCESS) << tdt_last_error();
    bad = in;
    bad.frame_lengths = nullptr;
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_NULL_POINTER);
    bad = in;
    bad.label_lengths = nullptr;
    EXPECT_EQ(status(bad, out.data()), TDT_STATUS_NULL_POINTER);
    o.blank = (int)c.V;
    EXPECT_EQ(status(in, out.data()), TDT_STATUS_INVALID_BLANK);
    o.blank = c.blank;
    o.location = (tdt_location_t)7;
    EXPECT_EQ(status(in, out.data()), TDT_STATUS_INVALID_OPTION);
    o.location = TDT_LOCATION_CPU;
    p.max_labels = -1;
    EXPECT_EQ(status(in, out.data()), TDT_STATUS_INVALID_SIZE);
    p = tdt_test::pack_problem(c);
    valid = -1;
    std::vector<int32_t> untouched(out.size(), -77);
    out = untouched;
    // any failure above wrote nothing; a GPU request without the backend says so
    if (!tdt_backend_built(TDT_LOCATION_GPU)) {
        o.location = TDT_LOCATION_GPU;
        EXPECT_EQ(status(in, out.data()), TDT_STATUS_BACKEND_NOT_BUILT);
        EXPECT_EQ(out, untouched);
        EXPECT_EQ(valid, -1);
    }
}

}  // namespace
