/*
 * kernels.h - the CPU backend's V-wide row kernels: a vectorisable float exp, a row's scan and
 * log-sum-exp, a row's token gradient, float16 / bfloat16 widening and narrowing.
 *
 * Included by the backend's per-path sources (cpu.c; see paths.h), which the build compiles
 * once for each vector path (TDT_CPU_PATH: baseline x86-64, AVX2, AVX-512, ...): the same C gives
 * each path's code. Every function here gives the same bits on every path that has FMA (on
 * x86-64 avx2, avx512 and avx512bf16), for any input, and the same bits on every path without
 * (baseline), for any input:
 *
 *   - the multiply-adds of the exp are FMAs where the path has them (TDT_FMAF), a multiply and
 *     an add where it has not, and no others are fused (the build passes -ffp-contract=off to
 *     every per-path source): an FMA rounds once where a multiply and an add round twice, so the
 *     baseline's exps differ from the others' in the last bit or two (within the 2 ulp bound of
 *     cpu_expf either way, measured over every float in [-87, 88]). Leaving the FMAs out of
 *     every path, for the same bits everywhere, made a forward+backward 7-18 % slower on the
 *     AVX paths (B 8, T 100, U 20, V 1025, float32, bfloat16 and float16, one thread, an AMD
 *     Zen 5);
 *   - a row's sum is a fixed number of partial sums (float32 and float16 rows 16: element v of
 *     a group of 16 into sum v mod 16; bfloat16 rows 32: see cpu_bf16_word), folded in one fixed
 *     tree: a 4-, 8- or 16-lane vector unit computes the same partial sums, in four, two or one
 *     vectors. Maxima and NaN flags are exact in any order;
 *   - the instructions a path has for a conversion (F16C's VCVTPH2PS / VCVTPS2PH, AVX512-BF16's
 *     VCVTNE2PS2BF16) are used only where they give common/dtype.h's bits (NaN and the
 *     subnormals that VCVTNE2PS2BF16 flushes take the portable code).
 * (tests/test_isa.cc compares every path's costs and gradients: bit for bit, and the baseline's
 * with the others' within a few ulp.)
 *
 * Float32, float16 and bfloat16 rows are reduced in float32 (float16 rows widened a chunk at a
 * time into an L1 buffer first); float64 rows stay in cpu.c, in float64 with libm's exp.
 * Shapes: a row is V elements z[0..V) of one (b, t, u) node, contiguous.
 */
#ifndef TDT_CPU_KERNELS_H
#define TDT_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/dtype.h"
#include "common/hd.h"

#if defined(__GNUC__)
#define TDT_NOINLINE __attribute__((noinline, unused)) /* unused: a source may not call it */
#else
#define TDT_NOINLINE
#endif

/* ---- a vectorisable float exp --------------------------------------------------------------- */

/* a * b + c: one FMA where the path has them (an instruction: the compilers expand fmaf there),
 * else a multiply and an add (a software fmaf would be a call an element). */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define TDT_FMAF(a, b, c) __builtin_fmaf(a, b, c)
#else
#define TDT_FMAF(a, b, c) ((a) * (b) + (c))
#endif

/* e^r for xc = n ln2 + r (Cody-Waite: ln2 in two parts, |r| <= ln2 / 2), and *n23 = n << 23
 * (as an unsigned 32-bit value: 2^n is the float with bits n23 + (127 << 23)). n is rint(xc
 * log2 e) by the magic-number addition t = xc log2 e + 1.5 * 2^23, whose low mantissa bits are
 * n; since 1.5 * 2^23's own low nine bits are zero, t's bits shifted by 23 are n's. No
 * float-to-int conversion and no floor, so branch-free in plain SSE2 too, and defined for any
 * xc, the infinities and NaN included. e^r = 1 + r + r^2 P(r), P of degree 4 with minimax
 * coefficients for the relative error over |r| <= ln2 / 2 (0.06 x 2^-24 as float32 constants),
 * evaluated as (1 + r) + r^2 ((c0 + c1 r) + r^2 (c2 + c3 r + r^2 c4)): Estrin's order, whose
 * dependent chain is shorter than Horner's (the row loops are bound by the exp's arithmetic:
 * measured on an AMD Zen 3, where Cephes' degree-7 Horner polynomial was slower). n ln2's high
 * part is exact (|n| <= 127 for |xc| <= 88, 0.693359375 has 9 bits), so r's first step rounds
 * once either way. */
static inline float cpu_exp_poly(float xc, uint32_t *n23) {
    const float magic = 12582912.0f;
    const float t = TDT_FMAF(xc, 1.44269504088896341f, magic);
    const float n = t - magic;
    const float r = TDT_FMAF(n, 2.12194440e-4f, TDT_FMAF(n, -0.693359375f, xc));
    const float r2 = r * r;
    const float a = TDT_FMAF(1.6666521e-1f, r, 4.9999994e-1f);
    const float b = TDT_FMAF(8.368745e-3f, r, 4.166839e-2f);
    *n23 = tdt_float_to_bits(t) << 23;
    return TDT_FMAF(r2, TDT_FMAF(r2, TDT_FMAF(r2, 1.3814539e-3f, b), a), r + 1.0f);
}

/* exp(x) for x <= 88 (88 beyond), within 2 ulp (2.00 x 2^-24 relative, measured over every
 * float in [-87, 88] against libm's double exp); 0 below -87 (where exp underflows to the
 * subnormal range), NaN for NaN: the gradient rows, where a -inf logit must get exactly 0.
 * e^r times 2^n as a float multiply. No lower clamp: below -87 the polynomial's value (garbage,
 * never undefined behaviour) is replaced by the 0, and GCC if-converts a clamp to a constant
 * into a select of the value at that constant, a compare and a blend a vector (a gradient row
 * from L1 0.51-0.63 -> 0.43-0.50 ns an element on an AMD Zen 3 with AVX2, every value's bits
 * unchanged over all floats in [-100, 100], the infinities and NaN). A NaN x passes the upper
 * clamp and the polynomial as NaN. */
static inline float cpu_expf(float x) {
    uint32_t n23;
    const float p = cpu_exp_poly(x > 88.0f ? 88.0f : x, &n23);
    const float y = p * tdt_bits_to_float(n23 + (127u << 23));
    return x < -87.0f ? 0.0f : y;
}

/* exp(x) for a row's log-sum-exp, x = z - max <= 0 (a row holding NaN or +inf, whose sum
 * cpu_row_lse_finish discards, gives anything): cpu_expf's values for every such x, without its
 * upper clamp, and with 2^n applied by an integer addition of n23 to e^r's bits instead of a
 * multiply (the same bits for every x in [-87, 0], where the result is normal; a NaN's payload
 * could carry into the sign, which is why cpu_expf keeps the multiply). It keeps the 0 below
 * -87: a row of -inf must sum to 0 also where the compiler's max reduction starts from -FLT_MAX
 * rather than -inf (clang's does), so that its max is finite and x is -inf - (-FLT_MAX)
 * (fuzz/regressions/row_all_neg_inf_max_identity.bin). */
static inline float cpu_expf_sum(float x) {
    uint32_t n23;
    const float p = cpu_exp_poly(x, &n23);
    const float y = tdt_bits_to_float(tdt_float_to_bits(p) + n23);
    return x < -87.0f ? 0.0f : y;
}

/* ---- a row's scan and log-sum-exp ----------------------------------------------------------- */

/* A row's scan: its max, and whether it holds NaN or +inf. */
typedef struct cpu_row_scan {
    float m;
    int bad;
} cpu_row_scan_t;

/* Partial sums of a row's sum of exps (see the top of this file). */
enum { TDT_ROW_LANES = 32 };

/* float32 rows use the first TDT_F32_LANES lanes (the others stay 0 and -inf, which the fold
 * leaves exact): one 512-bit vector. bfloat16 rows use all TDT_ROW_LANES (cpu_bf16_word). */
enum { TDT_F32_LANES = 16 };

/* A row's running partial sums, and the scan of the row after it, lane by lane. */
typedef struct cpu_row_acc {
    float s[TDT_ROW_LANES];  /* sum of exp(z - m), float32 */
    float mn[TDT_ROW_LANES]; /* the next row's max */
    int bad[TDT_ROW_LANES];  /* the next row's NaN or +inf */
} cpu_row_acc_t;

static inline void cpu_row_acc_init(cpu_row_acc_t *a) {
    for (int k = 0; k < TDT_ROW_LANES; ++k) {
        a->s[k] = 0.0f;
        a->mn[k] = -INFINITY;
        a->bad[k] = 0;
    }
}

/* One element x of a scan into its max m and flag bad. */
#define TDT_ROW_SCAN_STEP(x, m, bad)                                                    \
    do {                                                                                 \
        (m) = (x) > (m) ? (x) : (m);                                                     \
        (bad) |= ((x) != (x)) | ((x) == INFINITY);                                       \
    } while (0)

/* The sum of a's partial sums in a fixed tree (lane k + w into lane k, w = 16, 8, 4, 2, 1), and
 * the next row's scan (exact in any order) into *scn when scn is given. */
static inline float cpu_row_acc_fold(cpu_row_acc_t *a, cpu_row_scan_t *scn) {
    for (int w = TDT_ROW_LANES / 2; w > 0; w /= 2)
        for (int k = 0; k < w; ++k) a->s[k] += a->s[k + w];
    if (scn) {
        float m = -INFINITY;
        int bad = 0;
        for (int k = 0; k < TDT_ROW_LANES; ++k) {
            m = a->mn[k] > m ? a->mn[k] : m;
            bad |= a->bad[k];
        }
        scn->m = m;
        scn->bad = bad;
    }
    return a->s[0];
}

/* A row's log-sum-exp from its scan (max m, bad: NaN or +inf in it) and its float32 sum of
 * exp(z - m): NaN for a bad row, -inf for a row of -inf. */
static inline double cpu_row_lse_finish(float m, int bad, float s) {
    if (bad) return NAN;
    if (m == -INFINITY) return -INFINITY;
    return (double)m + log((double)s);
}

/* The scan of a float32 row (the order of a max does not change it). */
static TDT_NOINLINE cpu_row_scan_t cpu_row_scan_f32(const float *z, int64_t V) {
    cpu_row_scan_t r;
    float m = -INFINITY;
    int bad = 0;
#pragma omp simd reduction(max : m) reduction(| : bad)
    for (int64_t v = 0; v < V; ++v) TDT_ROW_SCAN_STEP(z[v], m, bad);
    r.m = m;
    r.bad = bad;
    return r;
}

/* sum_v exp(z_v - m) over v < n (z_v into lane v mod TDT_F32_LANES), and with zn (the next
 * row, else NULL) its scan into *scn, from the same loop, so that the next row's loads from
 * memory overlap this row's exps: alone, the scan of a row fresh from memory stalled on them.
 * With carry, a chunk of a row: the partial sums (and scan lanes) start from *carry and go back
 * there, unfolded (0 returned; a row taken in chunks whose lengths are multiples of
 * TDT_F32_LANES sums to the same bits as in one call). cpu_row_sum_bf16: the same for a whole
 * bfloat16 row. Out of line: GCC 12, inlining a loop like it into the node pass, left
 * it scalar (a quarter of that pass at base bfloat16, the forward 6.8 -> 5.6 ms at one thread
 * on an AMD Zen 5 once out of line). */
static TDT_NOINLINE float cpu_row_sum_f32(const float *z, const float *zn, int64_t n, float m,
                                          cpu_row_acc_t *carry, cpu_row_scan_t *scn) {
    const int64_t G = n / TDT_F32_LANES, tail = G * TDT_F32_LANES;
    cpu_row_acc_t l, *a = &l; /* local: GCC keeps its lanes in registers */
    if (carry)
        l = *carry;
    else
        cpu_row_acc_init(a);
    if (zn) {
        for (int64_t i = 0; i < G; ++i) {
            const float *zi = z + i * TDT_F32_LANES, *zni = zn + i * TDT_F32_LANES;
#pragma omp simd
            for (int k = 0; k < TDT_F32_LANES; ++k) {
                a->s[k] += cpu_expf_sum(zi[k] - m);
                TDT_ROW_SCAN_STEP(zni[k], a->mn[k], a->bad[k]);
            }
        }
        for (int64_t v = tail; v < n; ++v) {
            a->s[v - tail] += cpu_expf_sum(z[v] - m);
            TDT_ROW_SCAN_STEP(zn[v], a->mn[v - tail], a->bad[v - tail]);
        }
    } else {
        for (int64_t i = 0; i < G; ++i) {
            const float *zi = z + i * TDT_F32_LANES;
#pragma omp simd
            for (int k = 0; k < TDT_F32_LANES; ++k) a->s[k] += cpu_expf_sum(zi[k] - m);
        }
        for (int64_t v = tail; v < n; ++v) a->s[v - tail] += cpu_expf_sum(z[v] - m);
    }
    if (!carry) return cpu_row_acc_fold(a, zn ? scn : NULL);
    *carry = l;
    return 0.0f;
}

/* log sum_v exp(z_v) over a float32 row given its scan *sc; with zn (the next row, else NULL)
 * the next row's scan takes *sc's place. */
static inline double cpu_row_lse_f32(const float *z, const float *zn, int64_t V, cpu_row_scan_t *sc) {
    const float m = sc->m;
    const int bad = sc->bad;
    return cpu_row_lse_finish(m, bad, cpu_row_sum_f32(z, zn, V, m, NULL, sc));
}

/* bfloat16 rows in pairs: one 32-bit load holds two elements, each a float by a shift (the low
 * half) or a mask (the high half), where one at a time each takes a widening load and a shift
 * (the row sums of base bfloat16 0.286 -> 0.243 ns an element on an AMD Zen 5). memcpy: a row
 * may start at any even address. Word j of a group of TDT_ROW_LANES elements goes into lanes j
 * (low half) and j + TDT_ROW_LANES / 2 (high half), on every path. */
static inline float cpu_bf16_lo(uint32_t w) { return tdt_bits_to_float(w << 16); }
static inline float cpu_bf16_hi(uint32_t w) { return tdt_bits_to_float(w & 0xffff0000u); }
static inline uint32_t cpu_bf16_word(const uint16_t *z, int64_t j) {
    uint32_t w;
    memcpy(&w, z + 2 * j, sizeof w);
    return w;
}

static TDT_NOINLINE cpu_row_scan_t cpu_row_scan_bf16(const uint16_t *z, int64_t V) {
    cpu_row_scan_t r;
    float m = -INFINITY;
    int bad = 0;
    const int64_t P = V / 2;
#pragma omp simd reduction(max : m) reduction(| : bad)
    for (int64_t j = 0; j < P; ++j) {
        const uint32_t w = cpu_bf16_word(z, j);
        const float lo = cpu_bf16_lo(w), hi = cpu_bf16_hi(w);
        TDT_ROW_SCAN_STEP(lo, m, bad);
        TDT_ROW_SCAN_STEP(hi, m, bad);
    }
    if (V % 2) {
        const float x = tdt_bf16_to_float(z[V - 1]);
        TDT_ROW_SCAN_STEP(x, m, bad);
    }
    r.m = m;
    r.bad = bad;
    return r;
}

enum { TDT_ROW_HALF = TDT_ROW_LANES / 2 };

static TDT_NOINLINE float cpu_row_sum_bf16(const uint16_t *z, const uint16_t *zn, int64_t V,
                                           float m, cpu_row_scan_t *scn) {
    const int64_t G = V / TDT_ROW_LANES, tail = G * TDT_ROW_LANES;
    cpu_row_acc_t l, *a = &l;
    cpu_row_acc_init(a);
    if (zn) {
        for (int64_t i = 0; i < G; ++i) {
            const uint16_t *zi = z + i * TDT_ROW_LANES, *zni = zn + i * TDT_ROW_LANES;
#pragma omp simd
            for (int k = 0; k < TDT_ROW_HALF; ++k) {
                const uint32_t w = cpu_bf16_word(zi, k), wn = cpu_bf16_word(zni, k);
                const float lo = cpu_bf16_lo(wn), hi = cpu_bf16_hi(wn);
                a->s[k] += cpu_expf_sum(cpu_bf16_lo(w) - m);
                a->s[k + TDT_ROW_HALF] += cpu_expf_sum(cpu_bf16_hi(w) - m);
                TDT_ROW_SCAN_STEP(lo, a->mn[k], a->bad[k]);
                TDT_ROW_SCAN_STEP(hi, a->mn[k + TDT_ROW_HALF], a->bad[k + TDT_ROW_HALF]);
            }
        }
        for (int64_t v = tail; v < V; ++v) {
            const float x = tdt_bf16_to_float(zn[v]);
            a->s[v - tail] += cpu_expf_sum(tdt_bf16_to_float(z[v]) - m);
            TDT_ROW_SCAN_STEP(x, a->mn[v - tail], a->bad[v - tail]);
        }
    } else {
        for (int64_t i = 0; i < G; ++i) {
            const uint16_t *zi = z + i * TDT_ROW_LANES;
#pragma omp simd
            for (int k = 0; k < TDT_ROW_HALF; ++k) {
                const uint32_t w = cpu_bf16_word(zi, k);
                a->s[k] += cpu_expf_sum(cpu_bf16_lo(w) - m);
                a->s[k + TDT_ROW_HALF] += cpu_expf_sum(cpu_bf16_hi(w) - m);
            }
        }
        for (int64_t v = tail; v < V; ++v) a->s[v - tail] += cpu_expf_sum(tdt_bf16_to_float(z[v]) - m);
    }
    return cpu_row_acc_fold(a, zn ? scn : NULL);
}

static inline double cpu_row_lse_bf16(const uint16_t *z, const uint16_t *zn, int64_t V,
                                      cpu_row_scan_t *sc) {
    const float m = sc->m;
    const int bad = sc->bad;
    return cpu_row_lse_finish(m, bad, cpu_row_sum_bf16(z, zn, V, m, sc));
}

/* ---- float16 and bfloat16 to and from float32, n elements ----------------------------------- */

/* Exact: F16C's VCVTPH2PS (16 or 8 elements an instruction, where tdt_fp16_to_float takes about
 * ten vector operations a vector) gives tdt_fp16_to_float's value for every input (a signalling
 * NaN stays a NaN). */
static inline void cpu_widen_f16(const uint16_t *z, float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(z + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(z + i))));
#endif
#pragma omp simd
    for (int64_t k = i; k < n; ++k) x[k] = tdt_fp16_to_float(z[k]);
}

/* F16C's VCVTPS2PH with round to nearest even gives tdt_float_to_fp16's bits for every float
 * but NaN: a vector holding a NaN takes tdt_float_to_fp16 (0x7e00 with the sign). */
static inline void cpu_narrow_f16(uint16_t *g, const float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
            for (int k = 0; k < 16; ++k) g[i + k] = tdt_float_to_fp16(x[i + k]);
        } else {
            _mm256_storeu_si256((__m256i *)(void *)(g + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        }
    }
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            for (int k = 0; k < 8; ++k) g[i + k] = tdt_float_to_fp16(x[i + k]);
        } else {
            _mm_storeu_si128((__m128i *)(void *)(g + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        }
    }
#endif
#pragma omp simd
    for (int64_t k = i; k < n; ++k) g[k] = tdt_float_to_fp16(x[k]);
}

/* AVX512-BF16's VCVTNE2PS2BF16 (32 elements an instruction, where tdt_float_to_bf16 takes about
 * nine vector operations a vector) agrees with tdt_float_to_bf16 on every float but the
 * subnormals, which it flushes to zero (compared over all 2^32 inputs on an AMD Zen 5): a block
 * holding one takes tdt_float_to_bf16 (tests: Edge.Bfloat16GradientSubnormalsKept). */
static inline void cpu_narrow_bf16(uint16_t *g, const float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512BF16__)
    const __m512i mag = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
    const __m512i sub = _mm512_set1_epi32(0x007ffffe); /* |bits| - 1 up to this: subnormal */
    for (; i + 32 <= n; i += 32) {
        const __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
        const __m512i alo = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(lo), mag), one);
        const __m512i ahi = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(hi), mag), one);
        if (_mm512_cmple_epu32_mask(alo, sub) | _mm512_cmple_epu32_mask(ahi, sub)) {
            for (int k = 0; k < 32; ++k) g[i + k] = tdt_float_to_bf16(x[i + k]);
        } else {
            _mm512_storeu_si512((void *)(g + i), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
#endif
#pragma omp simd
    for (int64_t k = i; k < n; ++k) g[k] = tdt_float_to_bf16(x[k]);
}

/* Exact (bfloat16 is the upper half of a float32). */
static inline void cpu_widen_bf16(const uint16_t *z, float *x, int64_t n) {
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) x[k] = tdt_bf16_to_float(z[k]);
}

/* ---- float16 rows: a chunk at a time through float32 ---------------------------------------- */

/* Elements of a float16 row widened at a time into an L1 buffer (a multiple of TDT_ROW_LANES,
 * so the chunks' sums are the whole row's): base float16 forward+backward 24.2-25.2 -> 14.6 ms
 * at one thread on an AMD Zen 5, against widening each element in the loop. */
enum { TDT_ROW_CHUNK = 512 };

static inline cpu_row_scan_t cpu_row_scan_f16(const uint16_t *z, int64_t V) {
    cpu_row_scan_t r = {-INFINITY, 0};
    float x[TDT_ROW_CHUNK];
    for (int64_t v0 = 0; v0 < V; v0 += TDT_ROW_CHUNK) {
        const int64_t n = V - v0 < TDT_ROW_CHUNK ? V - v0 : TDT_ROW_CHUNK;
        cpu_widen_f16(z + v0, x, n);
        const cpu_row_scan_t c = cpu_row_scan_f32(x, n);
        r.m = c.m > r.m ? c.m : r.m;
        r.bad |= c.bad;
    }
    return r;
}

static inline double cpu_row_lse_f16(const uint16_t *z, const uint16_t *zn, int64_t V,
                                     cpu_row_scan_t *sc) {
    const float m = sc->m;
    const int bad = sc->bad;
    cpu_row_acc_t a;
    cpu_row_acc_init(&a);
    float x[TDT_ROW_CHUNK], xn[TDT_ROW_CHUNK];
    for (int64_t v0 = 0; v0 < V; v0 += TDT_ROW_CHUNK) {
        const int64_t n = V - v0 < TDT_ROW_CHUNK ? V - v0 : TDT_ROW_CHUNK;
        cpu_widen_f16(z + v0, x, n);
        if (zn) cpu_widen_f16(zn + v0, xn, n);
        cpu_row_sum_f32(x, zn ? xn : NULL, n, m, &a, NULL);
    }
    return cpu_row_lse_finish(m, bad, cpu_row_acc_fold(&a, zn ? sc : NULL));
}

/* ---- gradient rows -------------------------------------------------------------------------- */

/* cpu_row_grad_NAME: g_v = STORE(scale * clip(exp(LOAD(z_v) - lse) * occ)), the token gradient
 * away from the blank and label positions (the caller patches those two), E in, G out. g may
 * alias z (each element is loaded before it is stored). Element by element: the same bits at
 * any vector width. */
#define TDT_DEFINE_ROW_GRAD(NAME, E, G, LOAD, STORE)                                    \
    static inline void cpu_row_grad_##NAME(const E *z, G *g, int64_t V, float lse, float occ, \
                                           float clamp, float scale) {                   \
        if (clamp > 0.0f) {                                                              \
            _Pragma("omp simd")                                                          \
            for (int64_t v = 0; v < V; ++v) {                                            \
                float x = cpu_expf(LOAD(z[v]) - lse) * occ;                              \
                x = x > clamp ? clamp : x;                                               \
                g[v] = STORE(scale * x);                                                 \
            }                                                                            \
        } else {                                                                         \
            _Pragma("omp simd")                                                          \
            for (int64_t v = 0; v < V; ++v) g[v] = STORE(scale * occ * cpu_expf(LOAD(z[v]) - lse)); \
        }                                                                                \
    }

#define TDT_ID(x) (x)
TDT_DEFINE_ROW_GRAD(f32, float, float, TDT_ID, TDT_ID)
#if defined(__AVX512BF16__)
TDT_DEFINE_ROW_GRAD(bf16_f32, uint16_t, float, tdt_bf16_to_float, TDT_ID)
#else
TDT_DEFINE_ROW_GRAD(bf16_direct, uint16_t, uint16_t, tdt_bf16_to_float, tdt_float_to_bf16)
#endif

/* float16 rows through float32 chunks (cpu_widen_f16, cpu_narrow_f16); bfloat16 rows the same
 * where the path narrows with VCVTNE2PS2BF16 (base bfloat16 forward+backward at one thread
 * 24.7-24.9 -> 23.9-24.2 ms on a 2-core AMD EPYC VM with AVX512-BF16), else element by element. */
static inline void cpu_row_grad_f16(const uint16_t *z, uint16_t *g, int64_t V, float lse,
                                    float occ, float clamp, float scale) {
    float x[TDT_ROW_CHUNK];
    for (int64_t v0 = 0; v0 < V; v0 += TDT_ROW_CHUNK) {
        const int64_t n = V - v0 < TDT_ROW_CHUNK ? V - v0 : TDT_ROW_CHUNK;
        cpu_widen_f16(z + v0, x, n); /* reads z[v0..) before g[v0..) is written: g may alias z */
        cpu_row_grad_f32(x, x, n, lse, occ, clamp, scale);
        cpu_narrow_f16(g + v0, x, n);
    }
}

static inline void cpu_row_grad_bf16(const uint16_t *z, uint16_t *g, int64_t V, float lse,
                                     float occ, float clamp, float scale) {
#if defined(__AVX512BF16__)
    float x[TDT_ROW_CHUNK];
    for (int64_t v0 = 0; v0 < V; v0 += TDT_ROW_CHUNK) {
        const int64_t n = V - v0 < TDT_ROW_CHUNK ? V - v0 : TDT_ROW_CHUNK;
        cpu_row_grad_bf16_f32(z + v0, x, n, lse, occ, clamp, scale); /* reads z[v0..) first */
        cpu_narrow_bf16(g + v0, x, n);
    }
#else
    cpu_row_grad_bf16_direct(z, g, V, lse, occ, clamp, scale);
#endif
}

#endif /* TDT_CPU_KERNELS_H */
