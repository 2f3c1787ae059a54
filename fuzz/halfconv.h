/*
 * halfconv.h - float16 / bfloat16 <-> double conversions for the fuzzer and the robustness
 * tests, written independently of src/common/dtype.h (so a rounding bug there shows up as a
 * disagreement, not as two identical mistakes). Narrowing rounds to nearest, ties to even.
 */
#ifndef TDT_FUZZ_HALFCONV_H
#define TDT_FUZZ_HALFCONV_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* double -> IEEE half, round to nearest even (the current FP mode), directly from double */
static inline uint16_t hc_d2h(double x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    if (x != x) return 0x7e00;
    if (a >= 65520.0) return sign | 0x7c00; /* includes inf */
    if (a < 6.103515625e-05) return sign | (uint16_t)nearbyint(a * 16777216.0); /* 2^-24 units */
    int e;
    double fr = frexp(a, &e); /* a = fr 2^e, fr in [0.5, 1) */
    uint32_t m = (uint32_t)nearbyint(fr * 2048.0);
    int ex = e - 1 + 15;
    if (m == 2048) { m = 1024; ++ex; }
    if (ex >= 31) return sign | 0x7c00;
    return (uint16_t)(sign | (uint32_t)ex << 10 | (m - 1024));
}

static inline double hc_h2d(uint16_t h) {
    int ex = (h >> 10) & 0x1f, m = h & 0x3ff;
    double s = (h & 0x8000) ? -1.0 : 1.0;
    if (ex == 31) return m ? NAN : s * INFINITY;
    if (ex == 0) return s * ldexp(m, -24);
    return s * ldexp(1024 + m, ex - 25);
}

static inline uint16_t hc_d2bf(double x) {
    float f = (float)x;
    uint32_t b;
    memcpy(&b, &f, 4);
    if (f != f) return 0x7fc0;
    uint32_t lsb = (b >> 16) & 1u;
    return (uint16_t)((b + 0x7fffu + lsb) >> 16);
}

static inline double hc_bf2d(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

#endif /* TDT_FUZZ_HALFCONV_H */
