// test_joint_plan.cc - the GPU fused joint's scratch plan (src/gpu/joint_plan.h, plain C, host
// and device): its two layouts (the tiles' and the GEMM schedule's) hold their buffers without
// overlap inside the size it reports, stay bounded as the problem grows, and refuse sizes that
// overflow. Runs on the CPU: the plan is the one arithmetic of the GPU backend that needs no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/joint_plan.h"

namespace {

struct Shape {
    const char *name;
    int64_t B, T, U, O, H, acc, elem;
    int split;  // float32's products on bfloat16 parts
};

const Shape kShapes[] = {
    {"huge-joint bf16", 8, 375, 100, 8198, 640, 4, 2, 0},
    {"huge-joint f32", 8, 375, 100, 8198, 640, 4, 4, 0},
    {"huge-joint f32 split", 8, 375, 100, 8198, 640, 4, 4, 1},
    {"odd hidden f32 split", 3, 7, 5, 13, 37, 4, 4, 1},
    {"one node f32 split", 1, 1, 0, 1, 1, 4, 4, 1},
    {"parakeet-joint f64", 4, 200, 40, 8198, 640, 8, 8, 0},
    {"long-joint bf16", 1, 1500, 400, 1030, 640, 4, 2, 0},
    {"xl-joint bf16", 32, 750, 200, 8198, 640, 4, 2, 0},
    {"two outputs, a million rows", 1000, 1000, 0, 2, 640, 4, 2, 0},
    {"one node", 1, 1, 0, 1, 1, 4, 4, 0},
    {"odd hidden", 3, 7, 5, 13, 37, 4, 2, 0},
    {"empty batch", 0, 5, 3, 9, 16, 4, 4, 0},
};

const size_t MB = size_t(1) << 20;

// [offset, offset + bytes) of each buffer: inside plan.bytes less the alignment slack, 256-byte
// aligned, and disjoint.
void expect_disjoint(std::vector<std::pair<size_t, size_t>> parts, const tdt_gpu_joint_plan_t &p,
                     const std::string &what) {
    std::sort(parts.begin(), parts.end());
    for (size_t i = 0; i < parts.size(); ++i) {
        EXPECT_EQ(parts[i].first % TDT_WS_ALIGN, 0u) << what << ": buffer " << i << " unaligned";
        EXPECT_LE(parts[i].first + parts[i].second, p.bytes - TDT_WS_ALIGN) << what << ": buffer " << i;
        if (i > 0) {
            EXPECT_LE(parts[i - 1].first + parts[i - 1].second, parts[i].first)
                << what << ": buffers " << i - 1 << " and " << i << " overlap";
        }
    }
}

TEST(JointPlan, BothLayoutsFitAndDoNotOverlap) {
    for (const Shape &s : kShapes) {
        SCOPED_TRACE(s.name);
        tdt_gpu_joint_plan_t p;
        ASSERT_TRUE(tdt_gpu_joint_plan(s.B, s.T, s.U, s.O, s.H, s.acc, s.elem, s.split, 0, 0, 0, &p));
        const size_t row = (size_t)(s.U + 1), H = (size_t)s.H, O = (size_t)s.O, acc = (size_t)s.acc;
        ASSERT_GE(p.rows, 1);
        ASSERT_GE(p.parts, 1);
        expect_disjoint({{p.dx, (size_t)p.rows * row * H * acc},
                         {p.pred_acc, (size_t)s.B * row * H * acc},
                         {p.w_part, (size_t)p.parts * O * H * acc},
                         {p.b_part, (size_t)p.parts * O * acc}},
                        p, "tiles");
        ASSERT_GE(p.g_rows, 1);
        EXPECT_GE(p.g_ldz, s.O);
        EXPECT_EQ(p.g_ldz % 8, 0);
        EXPECT_GE(p.g_ldh, s.H + 1) << "h has a column of ones past H";
        EXPECT_EQ((p.g_ldh * s.elem) % 16, 0);
        EXPECT_EQ(p.g_ldh % 8, 0) << "the d W product's rows";
        EXPECT_GE(p.g_ldw, p.g_ldh) << "d W has d bias as its column H, and ldh rows";
        EXPECT_EQ((p.g_ldw * s.acc) % 16, 0);
        EXPECT_EQ(p.g_split, s.split);
        const int64_t blocks = s.split ? TDT_JOINT_SPLIT_BLOCKS : 1;
        const size_t ob = s.split ? 2 : (size_t)s.elem;  // the products' operand
        EXPECT_EQ(p.g_ldhp, blocks * p.g_ldh);
        EXPECT_EQ(p.g_ldwp, blocks * p.g_ldh) << "W's padded rows";
        // the forward's z is in the dtype (float16 and bfloat16 less a shift); the backward's
        // chunk: the forward's rows, but for split products (z and dz's three bfloat16 parts: 10
        // bytes a value to the forward's 4), at least one row
        const size_t elem = (size_t)s.elem, zbb = (size_t)p.g_ldz * (elem + (s.split ? 6 : 0));
        if (!s.split) EXPECT_EQ(p.g_rows_b, p.g_rows);
        else EXPECT_EQ(p.g_rows_b, std::max<int64_t>(1, p.g_rows * 2 / 5));
        const size_t nodes = (size_t)p.g_rows * row, nodes_b = (size_t)p.g_rows_b * row;
        if (p.g_rows_b > 1) {
            EXPECT_LE(nodes_b * zbb, nodes * (size_t)p.g_ldz * elem) << "the backward's z fits the forward's buffer";
        }
        // h: the backward's split parts take N_b rows of six blocks and three N_b x ldh matrices
        const size_t hbytes = std::max(nodes * (size_t)p.g_ldhp * ob, s.split ? nodes_b * 9 * (size_t)p.g_ldh * 2 : 0);
        // skip_below's lists: a row start a (b, t) row and one more, a node number a node
        const size_t rows_all = (size_t)(s.B * s.T);
        EXPECT_TRUE(p.g_compact);
        expect_disjoint({{p.g_z, std::max(nodes * (size_t)p.g_ldz * elem, nodes_b * zbb)},
                         {p.g_h, hbytes},
                         {p.g_krow, (rows_all + 1) * 4},
                         {p.g_kidx, rows_all * row * 4},
                         {p.g_desc, 4 * 8},
                         {p.g_dx, nodes_b * H * acc},
                         {p.g_pred, (size_t)s.B * row * H * acc},
                         {p.g_w, (size_t)p.g_ldz * (size_t)p.g_ldw * acc},
                         {p.g_wp, (size_t)p.g_ldz * (size_t)p.g_ldwp * ob},
                         {p.g_lt, TDT_JOINT_LT_BYTES},
                         {p.g_nf, s.split ? (nodes_b + 1) * 4 : 0},
                         {p.g_coef, nodes_b * TDT_JOINT_COEF_BYTES}},
                        p, "gemm");
        // a chunk is whole (b, t) rows, never more than the problem has (but at least one)
        EXPECT_LE(p.g_rows, std::max<int64_t>(1, s.B * s.T));
    }
}

TEST(JointPlan, ScratchStaysBoundedAsTheProblemGrows) {
    // The GEMM schedule's chunk: z, h and d h near the budget together, whatever B, T and U; the whole
    // scratch then grows only with d pred's sums (B (U + 1) H), with d W's (O H) and with
    // skip_below's list of kept nodes (4 bytes a node: within the slack below at these shapes).
    for (const Shape &s : kShapes) {
        SCOPED_TRACE(s.name);
        tdt_gpu_joint_plan_t p;
        ASSERT_TRUE(tdt_gpu_joint_plan(s.B, s.T, s.U, s.O, s.H, s.acc, s.elem, s.split, 0, 0, 0, &p));
        const size_t row = (size_t)(s.U + 1), acc = (size_t)s.acc;
        const size_t chunk = (size_t)p.g_rows * row *
                             ((size_t)p.g_ldz * (size_t)s.elem + (size_t)p.g_ldhp * (s.split ? 2 : (size_t)s.elem) +
                              (size_t)s.H * acc);
        if (p.g_rows > 1) {
            EXPECT_LE(chunk, TDT_JOINT_Z_BYTES);
        }
        const size_t fixed = (size_t)s.B * row * (size_t)s.H * acc + 2 * (size_t)s.O * (size_t)s.H * acc +
                             (s.split ? 12 * (size_t)p.g_ldz * (size_t)p.g_ldh : 0);
        EXPECT_LE(p.bytes, fixed + TDT_JOINT_Z_BYTES + 2 * TDT_JOINT_DX_BYTES + TDT_JOINT_WPART_BYTES +
                               TDT_JOINT_LT_BYTES + 16 * MB)
            << "scratch " << p.bytes / MB << " MB";
    }
    // huge-joint in bfloat16: the GEMM schedule's chunk holds hundreds of nodes, and the scratch
    // is the chunk budget plus what does not grow with the nodes: d W's float32 accumulator and
    // W padded (8200 x 648 each: 21.3 + 10.6 MB), d pred's (2.1 MB), cuBLASLt's 4 MB
    tdt_gpu_joint_plan_t p;
    ASSERT_TRUE(tdt_gpu_joint_plan(8, 375, 100, 8198, 640, 4, 2, 0, 0, 0, 0, &p));
    EXPECT_GE(p.g_rows * 101, 500);
    EXPECT_LE(p.bytes, TDT_JOINT_Z_BYTES + 38 * MB) << p.bytes / MB << " MB";
    // float32 with split products: W's parts (8200 x 3888 bfloat16, 64 MB) in W padded's place
    ASSERT_TRUE(tdt_gpu_joint_plan(8, 375, 100, 8198, 640, 4, 4, 1, 0, 0, 0, &p));
    EXPECT_GE(p.g_rows_b * 101, 500);
    EXPECT_LE(p.bytes, TDT_JOINT_Z_BYTES + 96 * MB) << p.bytes / MB << " MB";
}

// A chunk budget (TDT_GPU_JOINT_CHUNK_KB) scales the GEMM schedule's chunk and nothing else.
TEST(JointPlan, ChunkBudgetScalesTheChunk) {
    tdt_gpu_joint_plan_t def, big, tiny;
    ASSERT_TRUE(tdt_gpu_joint_plan(8, 375, 100, 8198, 640, 4, 2, 0, 0, 0, 0, &def));
    ASSERT_TRUE(tdt_gpu_joint_plan(8, 375, 100, 8198, 640, 4, 2, 0, 8 * TDT_JOINT_Z_BYTES, 0, 0, &big));
    ASSERT_TRUE(tdt_gpu_joint_plan(8, 375, 100, 8198, 640, 4, 2, 0, 1, 0, 0, &tiny));
    EXPECT_GE(big.g_rows, 8 * def.g_rows - 1) << "8x the budget, " << big.g_rows << " rows";
    EXPECT_LE(big.g_rows, 8 * def.g_rows + 8);
    EXPECT_EQ(tiny.g_rows, 1) << "a chunk holds at least one row";
    EXPECT_GT(big.bytes, 7 * TDT_JOINT_Z_BYTES);
    EXPECT_EQ(big.rows, def.rows);
    EXPECT_EQ(big.parts, def.parts);
    EXPECT_EQ(big.g_w - big.g_pred, def.g_w - def.g_pred);
}

// The chip layout (TDT_GPU_JOINT_BWD=chip, 16-bit dtypes, H <= 640): W packed, d pred and the
// area disjoint inside the size; each of the area's uses (the forward's W padded, h and
// log-normalisers; the d W sweep's sums and packed chunk; the d h sweep's chunk) inside the area
// with its parts disjoint, at the most rows that fit; the fused and GEMM schedules' layouts in
// the same bytes, one row a chunk at least.
void expect_chip_use(const tdt_gpu_joint_plan_t &p, int use, int64_t rows, int64_t row, int64_t all, int64_t H,
                     int64_t D, const std::string &what) {
    SCOPED_TRACE(what);
    ASSERT_GE(rows, 1);
    ASSERT_LE(rows, std::max<int64_t>(1, all));
    tdt_gpu_joint_plan_t q = p;
    size_t bytes = 0, more = 0;
    ASSERT_TRUE(tdt_gpu_chip_use(&q, use, rows * row, H, D, &bytes));
    if (rows > 1) {
        EXPECT_LE(bytes, p.c_area_bytes);
    }
    if (rows < all) {  // the most rows that fit
        ASSERT_TRUE(tdt_gpu_chip_use(&q, use, (rows + 1) * row, H, D, &more));
        EXPECT_GT(more, p.c_area_bytes);
    }
    const size_t n = (size_t)(rows * row), wpad = (size_t)p.g_ldz * (size_t)p.g_ldwp * 2,
                 wsum = (size_t)p.g_ldz * (size_t)p.g_ldw * 4;
    std::vector<std::pair<size_t, size_t>> parts;
    if (use == 0) {
        parts = {{p.c_area, wpad}, {p.c_area + p.c_fwd_h, n * (size_t)p.g_ldh * 2}, {p.c_area + p.c_fwd_lse, n * 4}};
    } else {
        tdt_gpu_chip_chunk_t c;
        const size_t at = p.c_area + (use == 1 ? (wsum + TDT_WS_ALIGN - 1) / TDT_WS_ALIGN * TDT_WS_ALIGN : 0);
        ASSERT_TRUE(tdt_gpu_chip_chunk(at, (int64_t)n, H, D, p.g_ldh, p.g_ldz, use == 1, use == 2, &c));
        parts = {{c.h, use == 1 ? 0 : n * (size_t)p.g_ldh * 2},  // the d W sweep: h packed alone
                 {c.rows, n * TDT_JOINT_CHIP_ROW},
                 {c.kn, n * (size_t)(2 + D) * 4},
                 {c.rare, 4},
                 {c.zr, (size_t)p.g_ldz * 2}};
        if (use == 1) {
            parts.push_back({p.c_area, wsum});
            parts.push_back({c.hp, (n + 127) / 128 * (size_t)((H + 63) / 64) * 16384});
        } else {
            parts.push_back({c.dx, n * (size_t)H * 4});
        }
        EXPECT_LE(c.end, p.c_area + std::max(p.c_area_bytes, bytes));
    }
    for (const auto &q2 : parts) {
        EXPECT_GE(q2.first, p.c_area);
        EXPECT_LE(q2.first + q2.second, p.c_area + std::max(p.c_area_bytes, bytes));
    }
    expect_disjoint(parts, p, "the area's parts");
}

TEST(JointPlan, ChipLayoutFitsAndBoundsTheOthers) {
    for (const Shape &s : kShapes) {
        SCOPED_TRACE(s.name);
        for (size_t budget : {(size_t)0, (size_t)1, (size_t)4 * MB}) {
            SCOPED_TRACE("budget " + std::to_string(budget));
            const int64_t D = s.O > 6 ? 5 : 0;
            tdt_gpu_joint_plan_t p;
            ASSERT_TRUE(tdt_gpu_joint_plan(s.B, s.T, s.U, s.O, s.H, s.acc, s.elem, s.split, budget, D, 1, &p));
            const bool chip = s.elem == 2 && s.H <= TDT_JOINT_CHIP_MAX_H;
            EXPECT_EQ(p.c_chip, chip);
            if (!chip) continue;
            const int64_t row = s.U + 1, all = s.B * s.T;
            const size_t H = (size_t)s.H, kc = (H + 63) / 64, otiles = ((size_t)s.O + 127) / 128;
            EXPECT_GE(p.c_area_bytes, budget ? budget : TDT_JOINT_CHIP_BYTES);
            expect_disjoint({{p.c_wpk, otiles * kc * 16384},
                             {p.c_pred, (size_t)s.B * (size_t)row * H * 4},
                             {p.c_area, p.c_area_bytes}},
                            p, "chip");
            expect_chip_use(p, 0, p.c_rows_f, row, all, s.H, D, "forward");
            expect_chip_use(p, 1, p.c_rows_w, row, all, s.H, D, "d W sweep");
            expect_chip_use(p, 2, p.c_rows_h, row, all, s.H, D, "d h sweep");
            // the other schedules: their buffers inside the same bytes
            EXPECT_GE(p.rows, 1);
            EXPECT_GE(p.g_rows, 1);
            EXPECT_LE(p.dx + (size_t)p.rows * (size_t)row * H * 4, p.bytes - TDT_WS_ALIGN);
            EXPECT_LE(p.g_desc + 32, p.bytes - TDT_WS_ALIGN);
        }
    }
    // huge-joint in bfloat16, the default area: the lattice's workspace and the scratch within
    // 64 MB (the fused joint's memory target), with chunks of tens of rows in each sweep
    tdt_gpu_joint_plan_t p;
    ASSERT_TRUE(tdt_gpu_joint_plan(8, 375, 100, 8198, 640, 4, 2, 0, 0, 5, 1, &p));
    tdt_ws_layout_t lay;
    ASSERT_TRUE(tdt_workspace_layout(8, 375, 100, 5, 0, &lay));
    EXPECT_LE(lay.total + p.bytes + TDT_WS_ALIGN, 64 * MB) << (lay.total + p.bytes) / MB << " MB";
    EXPECT_GE(p.c_rows_w, 20);
    EXPECT_GE(p.c_rows_h, 60);
    EXPECT_GE(p.c_rows_f, 100);
}

TEST(JointPlan, OverflowingSizesAreRefused) {
    tdt_gpu_joint_plan_t p;
    EXPECT_FALSE(tdt_gpu_joint_plan(8, 100, 20, 1030, INT64_C(1) << 60, 4, 2, 0, 0, 0, 0, &p));
    EXPECT_FALSE(tdt_gpu_joint_plan(8, 100, 20, INT64_C(1) << 61, 640, 4, 2, 0, 0, 0, 0, &p));
    // B (U + 1) H values of d pred's sums past SIZE_MAX bytes (B T itself fits: the lattice's
    // layout checks it before the plan is asked)
    EXPECT_FALSE(tdt_gpu_joint_plan(INT64_C(1) << 50, 1, 1000, 8198, 640, 8, 8, 0, 0, 0, 0, &p));
}

double bf16(uint16_t b) { return (double)tdt_bf16_to_float(b); }

// tdt_split3: three parts that sum to x exactly, each at most 2^-8 of x's size after the one
// before (2^-7 where the first is truncated, past bfloat16's largest value), so that the
// six products of parts with indices adding up to 2 or less are a float32 product to 2^-23, two
// units of float32's rounding of it.
TEST(JointSplit, ThreePartsSumExactlyAndTheSixProductsHoldAFloat32Product) {
    std::mt19937 rng(11);
    std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 3.0f, 1.0f / 3.0f, FLT_MAX, -FLT_MAX, FLT_MIN,
                             tdt_bits_to_float(0x7f7f8000u), tdt_bits_to_float(0x7f7fffffu), 1e-30f, 123456.789f};
    for (int i = 0; i < 200000; ++i) {
        // exponents over the normal range (2^-100 .. 2^100) and the top of it, both signs
        const uint32_t e = (i % 50 == 0) ? 254u - (rng() % 4) : 27u + rng() % 200u;
        xs.push_back(tdt_bits_to_float((rng() & 0x807fffffu) | e << 23));
    }
    for (size_t i = 0; i < xs.size(); ++i) {
        const float x = xs[i];
        uint16_t p[3];
        tdt_split3(x, p);
        const double a = bf16(p[0]), b = bf16(p[1]), c = bf16(p[2]);
        ASSERT_TRUE(std::isfinite(a) && std::isfinite(b) && std::isfinite(c)) << "x = " << x;
        ASSERT_EQ(a + b + c, (double)x) << "x = " << x << ": " << a << " + " << b << " + " << c;
        // 2^-8, or 2^-7 past bfloat16's largest value, where the first part is truncated
        const int shift = std::fabs(x) >= tdt_bits_to_float(0x7f7f8000u) ? -7 : -8;
        ASSERT_LE(std::fabs(b), std::ldexp(std::fabs((double)x), shift)) << "x = " << x;
        ASSERT_LE(std::fabs(c), std::ldexp(std::fabs((double)x), -16)) << "x = " << x;
        const float y = xs[(i * 7919 + 13) % xs.size()];
        if (std::fabs((double)x * (double)y) > 1e30 || std::fabs((double)x * (double)y) < 1e-30) continue;
        uint16_t q[3];
        tdt_split3(y, q);
        double six = 0.0;
        for (int u = 0; u < 3; ++u)
            for (int v = 0; u + v < 3; ++v) six += bf16(p[u]) * bf16(q[v]);
        ASSERT_LE(std::fabs(six - (double)x * (double)y), std::ldexp(std::fabs((double)x * (double)y), -23))
            << x << " x " << y;
    }
    uint16_t p[3];
    tdt_split3(INFINITY, p);
    EXPECT_EQ(p[0], 0x7f80);
    EXPECT_EQ(p[1], 0);
    EXPECT_EQ(p[2], 0);
    tdt_split3(NAN, p);
    EXPECT_TRUE(std::isnan(bf16(p[0])));
    EXPECT_EQ(p[1] | p[2], 0);
}

}  // namespace
