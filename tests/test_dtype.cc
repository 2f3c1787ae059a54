// test_dtype.cc - src/common/dtype.h, the float16 / bfloat16 conversions that the library, the
// benchmarks and the tests share, against a second implementation written here in double
// arithmetic (frexp / ldexp / floor, no bit tricks): every 16-bit pattern widened, and floats
// narrowed on a stride through all 2^32 patterns plus, for every finite 16-bit value, the value
// itself, the midpoint to its upper neighbour (a tie) and the floats just either side of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/dtype.h"

namespace {

uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

float float_of(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// A binary format with `man` stored mantissa bits, exponent bias `bias` and `exp_bits` exponent
// bits, read as a value: the textbook definition.
struct Format {
    int man, exp_bits, bias;
    double decode(uint16_t h) const {
        const int e = (h >> man) & ((1 << exp_bits) - 1), m = h & ((1 << man) - 1);
        const double s = (h >> (man + exp_bits)) & 1 ? -1.0 : 1.0;
        if (e == (1 << exp_bits) - 1) return m ? NAN : s * INFINITY;
        if (e == 0) return s * std::ldexp(m, 1 - bias - man);
        return s * std::ldexp((1 << man) + m, e - bias - man);
    }
    double max_finite() const { return std::ldexp((2 << man) - 1, (1 << exp_bits) - 2 - bias - man); }
    // |x| rounded to the format, to nearest with ties to even, overflowing to inf.
    double round(double a) const {
        if (std::isinf(a)) return a;
        int e;
        std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
        const int min_e = 1 - bias - man;           // the exponent of the subnormals' unit
        const int unit_e = std::max(e - 1 - man, min_e);
        const double n = std::ldexp(a, -unit_e);     // exact: a scaled by a power of two
        double k = std::floor(n);
        const double rem = n - k;
        if (rem > 0.5 || (rem == 0.5 && std::fmod(k, 2.0) == 1.0)) k += 1.0;
        const double r = std::ldexp(k, unit_e);
        return r > max_finite() ? INFINITY : r;
    }
};

const Format kHalf{10, 5, 15};
const Format kBf16{7, 8, 127};

// The value a narrowed pattern must have for x, and its sign; NaN patterns are checked apart.
void expect_narrowed(const Format &fmt, float x, uint16_t got, const char *name, int *failures) {
    const double want = fmt.round(std::fabs(static_cast<double>(x)));
    const double have = std::fabs(fmt.decode(got));
    const bool sign_ok = ((got >> 15) & 1) == (std::signbit(x) ? 1 : 0);
    if ((have != want || !sign_ok) && ++*failures <= 10)
        ADD_FAILURE() << name << "(" << std::hexfloat << x << " = 0x" << std::hex << bits_of(x)
                      << ") gave 0x" << got << " = " << std::hexfloat << fmt.decode(got) << ", want "
                      << (std::signbit(x) ? "-" : "+") << want;
}

TEST(Dtype, Float16WideningMatchesTheDefinitionOnEveryPattern) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float got = tdt_fp16_to_float(static_cast<uint16_t>(h));
        const double want = kHalf.decode(static_cast<uint16_t>(h));
        const bool ok = std::isnan(want)
                            // NaN: exponent all ones, the payload kept in the top mantissa bits
                            ? bits_of(got) == (((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13))
                            : (static_cast<double>(got) == want && std::signbit(got) == std::signbit(want));
        if (!ok && ++bad <= 10)
            ADD_FAILURE() << "tdt_fp16_to_float(0x" << std::hex << h << ") = " << std::hexfloat << got
                          << ", want " << want;
    }
    EXPECT_EQ(bad, 0);
}

TEST(Dtype, Bfloat16WideningMatchesTheDefinitionOnEveryPattern) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
        const float got = tdt_bf16_to_float(static_cast<uint16_t>(h));
        const double want = kBf16.decode(static_cast<uint16_t>(h));
        const bool ok = std::isnan(want) ? bits_of(got) == h << 16
                                         : (static_cast<double>(got) == want && std::signbit(got) == std::signbit(want));
        if (!ok && ++bad <= 10)
            ADD_FAILURE() << "tdt_bf16_to_float(0x" << std::hex << h << ") = " << std::hexfloat << got
                          << ", want " << want;
    }
    EXPECT_EQ(bad, 0);
}

// Floats to narrow: a stride through every pattern, and around every finite 16-bit value v
// (widened to float bits w with `shift` bits below the narrow format's last place): v, the tie
// to the next value up, and the floats one ulp either side of the tie, in both signs.
std::vector<float> narrowing_inputs(bool half) {
    std::vector<float> xs;
    for (uint64_t b = 0; b < (1ull << 32); b += 65521) xs.push_back(float_of(static_cast<uint32_t>(b)));
    for (uint32_t h = 0; h < 0x8000u; ++h) {
        const double v = half ? kHalf.decode(static_cast<uint16_t>(h)) : kBf16.decode(static_cast<uint16_t>(h));
        if (!std::isfinite(v)) continue;
        const double next = half ? kHalf.decode(static_cast<uint16_t>(h + 1)) : kBf16.decode(static_cast<uint16_t>(h + 1));
        // past the largest finite value the next step is inf: take the tie one unit up
        const double up = std::isfinite(next) ? next : v + (v - (half ? kHalf : kBf16).decode(static_cast<uint16_t>(h - 1)));
        const float tie = static_cast<float>(0.5 * (v + up));  // exact: one bit more than the format
        for (float x : {static_cast<float>(v), tie, std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY)}) {
            xs.push_back(x);
            xs.push_back(-x);
        }
    }
    return xs;
}

TEST(Dtype, Float16NarrowingRoundsToNearestEven) {
    int bad = 0;
    const std::vector<float> xs = narrowing_inputs(true);
    for (float x : xs) {
        const uint16_t got = tdt_float_to_fp16(x);
        if (std::isnan(x)) {
            if (got != ((bits_of(x) >> 16 & 0x8000u) | 0x7e00u) && ++bad <= 10)
                ADD_FAILURE() << "tdt_float_to_fp16(NaN 0x" << std::hex << bits_of(x) << ") = 0x" << got
                              << ", want the quiet NaN 0x7e00 with the input's sign";
            continue;
        }
        expect_narrowed(kHalf, x, got, "tdt_float_to_fp16", &bad);
    }
    EXPECT_EQ(bad, 0) << "of " << xs.size() << " floats";
    // the edges by name: the largest half, the first float that rounds to inf, the smallest
    // subnormal and half of it (a tie, to even: zero), and a tie between two subnormals
    EXPECT_EQ(tdt_float_to_fp16(65504.0f), 0x7bffu);
    EXPECT_EQ(tdt_float_to_fp16(65519.996f), 0x7bffu);
    EXPECT_EQ(tdt_float_to_fp16(65520.0f), 0x7c00u);
    EXPECT_EQ(tdt_float_to_fp16(-INFINITY), 0xfc00u);
    EXPECT_EQ(tdt_float_to_fp16(std::ldexp(1.0f, -24)), 0x0001u);
    EXPECT_EQ(tdt_float_to_fp16(std::ldexp(1.0f, -25)), 0x0000u);
    EXPECT_EQ(tdt_float_to_fp16(-std::ldexp(3.0f, -25)), 0x8002u);
    EXPECT_EQ(tdt_float_to_fp16(std::ldexp(1023.5f, -24)), 0x0400u);  // rounds up to the smallest normal
}

TEST(Dtype, Bfloat16NarrowingRoundsToNearestEven) {
    int bad = 0;
    const std::vector<float> xs = narrowing_inputs(false);
    for (float x : xs) {
        const uint16_t got = tdt_float_to_bf16(x);
        if (std::isnan(x)) {
            if (got != ((bits_of(x) >> 16) | 0x0040u) && ++bad <= 10)
                ADD_FAILURE() << "tdt_float_to_bf16(NaN 0x" << std::hex << bits_of(x) << ") = 0x" << got
                              << ", want the top 16 bits with the quiet bit set";
            continue;
        }
        expect_narrowed(kBf16, x, got, "tdt_float_to_bf16", &bad);
    }
    EXPECT_EQ(bad, 0) << "of " << xs.size() << " floats";
    EXPECT_EQ(tdt_float_to_bf16(float_of(0x7f7f7fffu)), 0x7f7fu);  // just below the tie: the largest
    EXPECT_EQ(tdt_float_to_bf16(float_of(0x7f7f8000u)), 0x7f80u);  // the tie to even: inf
    EXPECT_EQ(tdt_float_to_bf16(float_of(0x00008000u)), 0x0000u);  // a subnormal tie, to even
    EXPECT_EQ(tdt_float_to_bf16(float_of(0x00018000u)), 0x0002u);
    // a NaN whose payload sits only in the dropped bits stays NaN
    EXPECT_EQ(tdt_float_to_bf16(float_of(0x7f800001u)), 0x7fc0u);
    EXPECT_EQ(tdt_float_to_bf16(float_of(0xff800001u)), 0xffc0u);
}

}  // namespace
