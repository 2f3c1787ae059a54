/*
 * dtype.h - float16 / bfloat16 <-> float32 conversions on bit patterns, host and device.
 *
 * The one copy of these conversions: the library's backends, the benchmarks (benchmark/common.h)
 * and the tests (tests/test_util.h) all include it; it compiles as C and as C++. Only the
 * fuzzer keeps an independent implementation (fuzz/halfconv.h), so that a rounding bug here
 * shows up there as a disagreement. tests/test_dtype.cc checks every 16-bit pattern widening
 * and every rounding boundary narrowing against a third implementation written in the test.
 *
 * Plain integer code so the C backend needs no compiler extension (_Float16, __bf16) and both
 * backends convert identically. Narrowing rounds to nearest, ties to even, like PyTorch's
 * .half() and .bfloat16(), with gradual underflow to float16's subnormals; overflow gives inf.
 * NaN stays NaN: float16 gives the quiet NaN 0x7e00 with the input's sign (payload dropped),
 * bfloat16 keeps the sign and the payload's top bits and sets the quiet bit. Widening is exact
 * and keeps a NaN's payload.
 */
#ifndef TDT_COMMON_DTYPE_H
#define TDT_COMMON_DTYPE_H

#include <string.h>

#include "hd.h"

TDT_HD float tdt_bits_to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

TDT_HD uint32_t tdt_float_to_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* bfloat16 is the upper half of a float32. */
TDT_HD float tdt_bf16_to_float(uint16_t h) { return tdt_bits_to_float((uint32_t)h << 16); }

TDT_HD uint16_t tdt_float_to_bf16(float f) {
    uint32_t bits = tdt_float_to_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

TDT_HD float tdt_fp16_to_float(uint16_t h) {
    /* branch-free, like the narrowing below */
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    float sub = (float)man * 5.9604644775390625e-8f; /* zero or subnormal: man * 2^-24, exact */
    uint32_t bits = exp == 0x1fu ? (sign | 0x7f800000u | (man << 13))     /* inf, NaN */
                    : exp == 0 ? (sign | tdt_float_to_bits(sub))
                               : (sign | ((exp + 112u) << 23) | (man << 13));
    return tdt_bits_to_float(bits);
}

TDT_HD uint16_t tdt_float_to_fp16(float f) {
    /* Every case is computed and one is selected, with no branch, so row loops vectorise. */
    uint32_t bits = tdt_float_to_bits(f);
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t absb = bits & 0x7fffffffu;
    /* normal half: rebias the exponent, round the 13 dropped bits to nearest even */
    uint32_t r = absb - (112u << 23);
    uint32_t normal = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    /* subnormal half (below 2^-14): adding 0.5 makes the float unit of the last place 2^-24,
       so the hardware's round-to-nearest-even does the rounding; the low bits are the count */
    uint32_t sub = tdt_float_to_bits(tdt_bits_to_float(absb) + 0.5f) - 0x3f000000u;
    uint32_t h = absb > 0x7f800000u ? 0x7e00u                  /* NaN */
                 : absb >= 0x477ff000u ? 0x7c00u               /* rounds to >= 65520: inf */
                 : absb < 0x38800000u ? sub : normal;
    return (uint16_t)(sign | h);
}

#endif /* TDT_COMMON_DTYPE_H */
