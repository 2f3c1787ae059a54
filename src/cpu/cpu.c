/*
 * cpu.c - the OpenMP backend: the readable reference of the loss (docs/math.md).
 *
 * Three passes, each parallel over independent work and deterministic (every value is computed
 * by one thread in a fixed order, so any thread count gives the same bits):
 *
 *   1. node pass (forward), over rows (b, t) and nodes u <= U_b of each row: the token row's
 *      log-normaliser lse = log sum_v exp(z_v) (fused log-softmax: log-probs are never stored),
 *      lp_blank, lp_label, and the duration log-softmax, into the workspace;
 *   2. lattice pass (forward), over 2B tasks: alpha of sample b, beta of sample b, each a
 *      sequential float64 sweep, anti-diagonal by anti-diagonal, with the shared recurrences of
 *      src/common/lattice.h (the same functions the CUDA sweep calls); then costs (B tasks,
 *      alpha alone, for a costs-only compute_tdt_loss);
 *   3. gradient pass (backward), over rows (b, t) of the padded extent: node occupancies from
 *      alpha and beta, then one read of the token row and one write of its gradient (scaled by
 *      the upstream gradient there), and the duration gradient; zeros outside each lattice.
 *
 * Memory traffic is the floor of DESIGN.md section 4: logits read in passes 1 and 3, gradient
 * written once. Float32/16/bf16 rows are reduced in float32 with a vectorisable exp; float64
 * rows in float64 with libm's exp. The float64 exps of the nodes (the duration softmax, the arc
 * occupancies, the duration probabilities) are lattice.h's tdt_exp_le0, a run of a row's nodes
 * at a time, vectorised across them.
 */
#include <omp.h>
#include <string.h>
#if (defined(__AVX512BF16__) || defined(__F16C__)) && defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/dtype.h"
#include "cpu.h"
#include "internal.h"

/* ---- a vectorisable float exp --------------------------------------------------------------- */

/* e^r for xc = n ln2 + r (Cody-Waite: ln2 in two parts, |r| <= ln2 / 2), and *n23 = n << 23
 * (as an unsigned 32-bit value: 2^n is the float with bits n23 + (127 << 23)). n is rint(xc
 * log2 e) by the magic-number addition t = xc log2 e + 1.5 * 2^23, whose low mantissa bits are
 * n; since 1.5 * 2^23's own low nine bits are zero, t's bits shifted by 23 are n's. No
 * float-to-int conversion and no floor, so branch-free in plain SSE2 too, and defined for any
 * xc, the infinities and NaN included. e^r = 1 + r + r^2 P(r), P of degree 4 with minimax
 * coefficients for the relative error over |r| <= ln2 / 2 (0.06 x 2^-24 as float32 constants),
 * evaluated as (1 + r) + r^2 ((c0 + c1 r) + r^2 (c2 + c3 r + r^2 c4)): five FMAs and one
 * multiply for Cephes' degree-7 polynomial's seven and two, in the same depth. The row loops
 * are bound by the FMA pipes' share of the exp on the Zen 3 of benchmark/NOTES.md (v21). */
static inline float cpu_exp_poly(float xc, uint32_t *n23) {
    const float magic = 12582912.0f;
    const float t = xc * 1.44269504088896341f + magic;
    const float n = t - magic;
    const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    const float r2 = r * r;
    const float a = 4.9999994e-1f + 1.6666521e-1f * r;
    const float b = 4.166839e-2f + 8.368745e-3f * r;
    *n23 = tdt_float_to_bits(t) << 23;
    return (r + 1.0f) + r2 * (a + r2 * (b + r2 * 1.3814539e-3f));
}

/* exp(x) for x <= 88 (88 beyond), within 2 ulp (2.00 x 2^-24 relative, measured over every
 * float in [-87, 88] against libm's double exp); 0 below -87 (where exp underflows to the
 * subnormal range), NaN for NaN: the gradient rows, where a -inf logit must get exactly 0.
 * e^r times 2^n as a float multiply. No lower clamp: below -87 the polynomial's value (garbage,
 * never undefined behaviour) is replaced by the 0, and GCC if-converts a clamp to a constant
 * into a select of the value at that constant, a compare and a blend a vector (a gradient row
 * 0.51-0.63 -> 0.43-0.50 ns an element from L1, every value's bits unchanged over all floats in
 * [-100, 100], the infinities and NaN; benchmark/NOTES.md, v20). A NaN x passes the upper clamp
 * and the polynomial as NaN. */
static inline float cpu_expf(float x) {
    uint32_t n23;
    const float p = cpu_exp_poly(x > 88.0f ? 88.0f : x, &n23);
    const float y = p * tdt_bits_to_float(n23 + (127u << 23));
    return x < -87.0f ? 0.0f : y;
}

/* exp(x) for a row's log-sum-exp, x = z - max <= 0 (a row holding NaN or +inf, whose sum
 * row_lse discards, gives anything): cpu_expf's values for every such x, without its upper
 * clamp, and with 2^n applied by an integer addition of n23 to e^r's bits instead of a multiply
 * (the same bits for every x in [-87, 0], where the result is normal; a NaN's payload could
 * carry into the sign, which is why cpu_expf keeps the multiply). It keeps the 0 below -87: a
 * row of -inf must sum to 0 also where the compiler's max reduction starts from -FLT_MAX rather
 * than -inf (clang's does), so that its max is finite and x is -inf - (-FLT_MAX)
 * (fuzz/regressions/row_all_neg_inf_max_identity.bin). */
static inline float cpu_expf_sum(float x) {
    uint32_t n23;
    const float p = cpu_exp_poly(x, &n23);
    const float y = tdt_bits_to_float(tdt_float_to_bits(p) + n23);
    return x < -87.0f ? 0.0f : y;
}

/* ---- row kernels per dtype ------------------------------------------------------------------ */

/* row_sum_E and row_lse_E stay functions of their own: GCC 12, inlining them into node_pass,
 * left the loop of row_sum_E's zn == NULL branch (a frame's last row) scalar, an omp simd loop
 * it vectorises when the function stands alone; that one row in 21 took a quarter of the node
 * pass at base bfloat16 (the forward 6.8 -> 5.6 ms at one thread; benchmark/NOTES.md, v40). */
#if defined(__GNUC__)
#define TDT_NOINLINE __attribute__((noinline))
#else
#define TDT_NOINLINE
#endif

/* A row's scan: its max, and whether it holds NaN or +inf. */
typedef struct row_scan {
    float m;
    int bad;
} row_scan_t;

/* One element x of a row's scan into its max m and flag bad (the scan of row_scan_E and the
 * one row_lse_E pipelines, spelled once). */
#define TDT_ROW_SCAN_STEP(x, m, bad)                                                    \
    do {                                                                                 \
        (m) = (x) > (m) ? (x) : (m);                                                     \
        (bad) |= ((x) != (x)) | ((x) == INFINITY);                                       \
    } while (0)

/* A row's log-sum-exp from its scan (max m, bad: NaN or +inf in it) and its float32 sum of
 * exp(z - m): NaN for a bad row, -inf for a row of -inf. */
static double row_lse_finish(float m, int bad, float s) {
    if (bad) return NAN;
    if (m == -INFINITY) return -INFINITY;
    return (double)m + log((double)s);
}

/* For each element type E, read in groups of N elements (N > 1 only where one wider load and
 * a shift or a mask give each element: LOADK(z, i, k) is element k of group i, in any order
 * within the group) and one at a time by LOAD(e) -> float past the last whole group:
 *   row_scan_E: a row's scan;
 *   row_sum_E: sum_v exp(z_v - m) in float32 (cpu_expf_sum's garbage for a bad row, defined,
 *   which row_lse_finish discards). With zn (the next row), its scan goes to *scn from the
 *   same loop, so the next row's loads from memory overlap this row's exps: alone, the scan of
 *   a row fresh from memory stalled on them (benchmark/NOTES.md, v20);
 *   row_lse_E: log sum_v exp(z_v) over a row given its scan *sc, whose place the next row's
 *   scan takes (zn given).
 * The sums and maxima are reductions, so the order of a group's elements only changes the sum's
 * rounding (the vectoriser reassociates it anyway), the same for every thread count. */
#define TDT_DEFINE_ROW_LSE(NAME, E, N, LOADK, LOAD)                                     \
    static row_scan_t row_scan_##NAME(const E *z, int64_t V) {                         \
        row_scan_t r;                                                                    \
        float m = -INFINITY;                                                             \
        int bad = 0;                                                                     \
        const int64_t G = V / (N);                                                       \
        _Pragma("omp simd reduction(max : m) reduction(| : bad)")                       \
        for (int64_t i = 0; i < G; ++i) {                                                \
            TDT_UNROLL for (int k = 0; k < (N); ++k) {                                   \
                const float x = LOADK(z, i, k);                                          \
                TDT_ROW_SCAN_STEP(x, m, bad);                                            \
            }                                                                            \
        }                                                                                \
        for (int64_t v = G * (N); v < V; ++v) {                                          \
            const float x = LOAD(z[v]);                                                  \
            TDT_ROW_SCAN_STEP(x, m, bad);                                                \
        }                                                                                \
        r.m = m;                                                                         \
        r.bad = bad;                                                                     \
        return r;                                                                        \
    }                                                                                    \
    static TDT_NOINLINE float row_sum_##NAME(const E *z, const E *zn, int64_t V, float m, \
                                             row_scan_t *scn) {                          \
        const int64_t G = V / (N);                                                       \
        float s = 0.0f;                                                                  \
        if (zn) {                                                                        \
            float mn = -INFINITY;                                                        \
            int badn = 0;                                                                \
            _Pragma("omp simd reduction(+ : s) reduction(max : mn) reduction(| : badn)") \
            for (int64_t i = 0; i < G; ++i) {                                            \
                TDT_UNROLL for (int k = 0; k < (N); ++k) {                               \
                    s += cpu_expf_sum(LOADK(z, i, k) - m);                               \
                    const float x = LOADK(zn, i, k);                                     \
                    TDT_ROW_SCAN_STEP(x, mn, badn);                                      \
                }                                                                        \
            }                                                                            \
            for (int64_t v = G * (N); v < V; ++v) {                                      \
                s += cpu_expf_sum(LOAD(z[v]) - m);                                       \
                const float x = LOAD(zn[v]);                                             \
                TDT_ROW_SCAN_STEP(x, mn, badn);                                          \
            }                                                                            \
            scn->m = mn;                                                                 \
            scn->bad = badn;                                                             \
        } else {                                                                         \
            _Pragma("omp simd reduction(+ : s)")                                        \
            for (int64_t i = 0; i < G; ++i)                                              \
                TDT_UNROLL for (int k = 0; k < (N); ++k) s += cpu_expf_sum(LOADK(z, i, k) - m); \
            for (int64_t v = G * (N); v < V; ++v) s += cpu_expf_sum(LOAD(z[v]) - m);     \
        }                                                                                \
        return s;                                                                        \
    }                                                                                    \
    static TDT_NOINLINE double row_lse_##NAME(const E *z, const E *zn, int64_t V, row_scan_t *sc) { \
        const float m = sc->m;                                                           \
        const int bad = sc->bad;                                                         \
        return row_lse_finish(m, bad, row_sum_##NAME(z, zn, V, m, sc));                  \
    }

/* row_grad_NAME: g_v = STORE(scale * clip(exp(LOAD(z_v) - lse) * occ)), the token gradient away
 * from the blank and label positions (the caller patches those two), E in, G out. g may alias
 * z (each element is loaded before it is stored). */
#define TDT_DEFINE_ROW_GRAD(NAME, E, G, LOAD, STORE)                                    \
    static void row_grad_##NAME(const E *z, G *g, int64_t V, float lse, float occ,       \
                                float clamp, float scale) {                              \
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
#define TDT_LOAD_ONE(z, i, k) (z)[i]
/* bfloat16 in pairs: one 32-bit load holds two elements, each a float by a shift (the low half)
 * or a mask (the high half), where one at a time each takes a widening load and a shift. Which
 * half is element 2i depends on the byte order; the reductions take them in any order. memcpy:
 * a row may start at any even address. Base bfloat16's row sums 0.286 -> 0.243 ns an element
 * on the Zen 5 of benchmark/NOTES.md (v39). */
static inline float bf16_pair_elem(const uint16_t *z, int64_t i, int k) {
    uint32_t w;
    memcpy(&w, z + 2 * i, sizeof w);
    return tdt_bits_to_float(k ? w & 0xffff0000u : w << 16);
}
TDT_DEFINE_ROW_LSE(f32, float, 1, TDT_LOAD_ONE, TDT_ID)
TDT_DEFINE_ROW_LSE(bf16, uint16_t, 2, bf16_pair_elem, tdt_bf16_to_float)
TDT_DEFINE_ROW_GRAD(f32, float, float, TDT_ID, TDT_ID)

#if defined(__F16C__) && defined(__AVX512F__)
/* float16 rows on a CPU with F16C and AVX-512 (-march=native): a chunk at a time widened into
 * an L1 buffer by VCVTPH2PS (16 elements an instruction, exact, where tdt_fp16_to_float takes
 * about ten vector operations a vector), then the float32 loops; gradient rows
 * narrowed by VCVTPS2PH, round to nearest even, which gives tdt_float_to_fp16's bits for every
 * float but NaN (a block holding a NaN takes tdt_float_to_fp16: 0x7e00 with the sign). The
 * chunk's scans merge by max and or, its sums by addition. Base float16 f+b 24.2-25.2 ->
 * 14.6 ms at one thread, 12.7 -> 8.5 at two, on the Zen 5 of benchmark/NOTES.md (v40). */
enum { F16_CHUNK = 512 };

static void f16_widen(const uint16_t *z, float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(z + i))));
    for (; i < n; ++i) x[i] = tdt_fp16_to_float(z[i]);
}

static void f16_narrow(uint16_t *g, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
            for (int k = 0; k < 16; ++k) g[i + k] = tdt_float_to_fp16(x[i + k]);
        } else {
            _mm256_storeu_si256((__m256i *)(void *)(g + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        }
    }
    for (; i < n; ++i) g[i] = tdt_float_to_fp16(x[i]);
}

static void row_scan_merge(row_scan_t *r, row_scan_t c) {
    r->m = c.m > r->m ? c.m : r->m;
    r->bad |= c.bad;
}

static row_scan_t row_scan_f16(const uint16_t *z, int64_t V) {
    row_scan_t r = {-INFINITY, 0};
    float x[F16_CHUNK];
    for (int64_t v0 = 0; v0 < V; v0 += F16_CHUNK) {
        const int64_t n = V - v0 < F16_CHUNK ? V - v0 : F16_CHUNK;
        f16_widen(z + v0, x, n);
        row_scan_merge(&r, row_scan_f32(x, n));
    }
    return r;
}

static double row_lse_f16(const uint16_t *z, const uint16_t *zn, int64_t V, row_scan_t *sc) {
    const float m = sc->m;
    const int bad = sc->bad;
    row_scan_t next = {-INFINITY, 0};
    float x[F16_CHUNK], xn[F16_CHUNK], s = 0.0f;
    for (int64_t v0 = 0; v0 < V; v0 += F16_CHUNK) {
        const int64_t n = V - v0 < F16_CHUNK ? V - v0 : F16_CHUNK;
        row_scan_t c;
        f16_widen(z + v0, x, n);
        if (zn) f16_widen(zn + v0, xn, n);
        s += row_sum_f32(x, zn ? xn : NULL, n, m, &c);
        if (zn) row_scan_merge(&next, c);
    }
    if (zn) *sc = next;
    return row_lse_finish(m, bad, s);
}

static void row_grad_f16(const uint16_t *z, uint16_t *g, int64_t V, float lse, float occ,
                         float clamp, float scale) {
    float x[F16_CHUNK];
    for (int64_t v0 = 0; v0 < V; v0 += F16_CHUNK) {
        const int64_t n = V - v0 < F16_CHUNK ? V - v0 : F16_CHUNK;
        f16_widen(z + v0, x, n); /* reads z[v0..) before g[v0..) is written: g may alias z */
        row_grad_f32(x, x, n, lse, occ, clamp, scale);
        f16_narrow(g + v0, x, n);
    }
}
#else
#define TDT_LOAD_F16(z, i, k) tdt_fp16_to_float((z)[i])
TDT_DEFINE_ROW_LSE(f16, uint16_t, 1, TDT_LOAD_F16, tdt_fp16_to_float)
TDT_DEFINE_ROW_GRAD(f16, uint16_t, uint16_t, tdt_fp16_to_float, tdt_float_to_fp16)
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
/* bfloat16 gradient rows on a CPU with AVX512-BF16 (-march=native): the row's float values in
 * chunks through an L1-resident buffer, then narrowed 32 at a time by VCVTNE2PS2BF16, one
 * instruction for what tdt_float_to_bf16 takes about nine vector operations to do. The two
 * agree on every float but the subnormals, which the instruction flushes to zero (compared over
 * all 2^32 inputs on the development machine); a block holding one takes tdt_float_to_bf16, so
 * the bits are the portable path's (tests: Edge.Bfloat16GradientSubnormalsKept). Base bfloat16
 * forward+backward at one thread: 24.7-24.9 -> 23.9-24.2 ms (benchmark/NOTES.md, v10). */
TDT_DEFINE_ROW_GRAD(bf16_f, uint16_t, float, tdt_bf16_to_float, TDT_ID)

enum { BF16_CHUNK = 512 };

static void store_bf16_row(uint16_t *g, const float *x, int64_t n) {
    const __m512i mag = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
    const __m512i sub = _mm512_set1_epi32(0x007ffffe); /* |bits| - 1 up to this: subnormal */
    int64_t i = 0;
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
    for (; i < n; ++i) g[i] = tdt_float_to_bf16(x[i]);
}

static void row_grad_bf16(const uint16_t *z, uint16_t *g, int64_t V, float lse, float occ,
                          float clamp, float scale) {
    float buf[BF16_CHUNK];
    for (int64_t v0 = 0; v0 < V; v0 += BF16_CHUNK) {
        const int64_t n = V - v0 < BF16_CHUNK ? V - v0 : BF16_CHUNK;
        row_grad_bf16_f(z + v0, buf, n, lse, occ, clamp, scale); /* reads z[v0..) first */
        store_bf16_row(g + v0, buf, n);
    }
}
#else
TDT_DEFINE_ROW_GRAD(bf16, uint16_t, uint16_t, tdt_bf16_to_float, tdt_float_to_bf16)
#endif

/* float64 rows: the same, in float64 with libm's exp. */
static double row_lse_f64(const double *z, int64_t V) {
    double m = -INFINITY;
    int bad = 0;
    for (int64_t v = 0; v < V; ++v) {
        m = z[v] > m ? z[v] : m;
        bad |= (z[v] != z[v]) | (z[v] == INFINITY);
    }
    if (bad) return NAN;
    if (m == -INFINITY) return -INFINITY;
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += exp(z[v] - m);
    return m + log(s);
}

static void row_grad_f64(const double *z, double *g, int64_t V, double lse, double occ,
                         double clamp, double scale) {
    for (int64_t v = 0; v < V; ++v) {
        double x = exp(z[v] - lse) * occ;
        g[v] = scale * (clamp > 0.0 && x > clamp ? clamp : x);
    }
}

/* ---- element access for scalars ------------------------------------------------------------- */

static double load_one(const void *base, int64_t i, tdt_dtype_t dtype) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return ((const double *)base)[i];
    case TDT_DTYPE_FLOAT16: return tdt_fp16_to_float(((const uint16_t *)base)[i]);
    case TDT_DTYPE_BFLOAT16: return tdt_bf16_to_float(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static void store_one(void *base, int64_t i, tdt_dtype_t dtype, double x) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: ((double *)base)[i] = x; break;
    case TDT_DTYPE_FLOAT16: ((uint16_t *)base)[i] = tdt_float_to_fp16((float)x); break;
    case TDT_DTYPE_BFLOAT16: ((uint16_t *)base)[i] = tdt_float_to_bf16((float)x); break;
    default: ((float *)base)[i] = (float)x; break;
    }
}

static const void *elem_ptr(const void *base, int64_t i, tdt_dtype_t dtype) {
    return (const char *)base + i * (int64_t)tdt_dtype_size(dtype);
}

/* The scan of row z (float64 rows scan themselves in row_lse_f64: none here). */
static row_scan_t row_scan(const void *z, int64_t V, tdt_dtype_t dtype) {
    const row_scan_t none = {0.0f, 0};
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return none;
    case TDT_DTYPE_FLOAT16: return row_scan_f16((const uint16_t *)z, V);
    case TDT_DTYPE_BFLOAT16: return row_scan_bf16((const uint16_t *)z, V);
    default: return row_scan_f32((const float *)z, V);
    }
}

/* The log-sum-exp of row z given its scan *sc, and the scan of the next row zn (NULL: none)
 * into *sc (row_lse_E). */
static double row_lse(const void *z, const void *zn, int64_t V, tdt_dtype_t dtype, row_scan_t *sc) {
    switch (dtype) {
    case TDT_DTYPE_FLOAT64: return row_lse_f64((const double *)z, V);
    case TDT_DTYPE_FLOAT16: return row_lse_f16((const uint16_t *)z, (const uint16_t *)zn, V, sc);
    case TDT_DTYPE_BFLOAT16: return row_lse_bf16((const uint16_t *)z, (const uint16_t *)zn, V, sc);
    default: return row_lse_f32((const float *)z, (const float *)zn, V, sc);
    }
}

/* The logits of the blank and of the label (none: label < 0, gives 0) of a token row. */
static void load_patched(const void *z, int blank, int32_t label, tdt_dtype_t dt, double *zb,
                         double *zl) {
    *zb = load_one(z, blank, dt);
    *zl = label >= 0 ? load_one(z, label, dt) : 0.0;
}

/* Writes the token-gradient row of a lattice node: the softmax term everywhere (none for
 * log-prob inputs), then the blank and label elements from the full formula. z may equal g:
 * the two patched logits are read before the row is overwritten. */
static void token_grad_row(const tdt_call_t *c, const void *z, void *g, double lse,
                           const tdt_node_grad_t *ng, int32_t label, double scale) {
    const int64_t V = c->p.vocab_size;
    const tdt_dtype_t dt = c->p.dtype;
    const int blank = c->o.blank;
    const int logits = c->o.input_kind == TDT_INPUT_LOGITS;
    /* The two patched logits are read after the row pass, which brings the row into cache (they
       are the row's blank and a label anywhere in it: read first, each is a cache miss the
       hardware prefetcher does not see coming), except in place, where that pass overwrites
       them. */
    const int in_place = (const void *)g == z;
    double zb = 0.0, zl = 0.0;
    if (in_place) load_patched(z, blank, label, dt, &zb, &zl);
    if (!logits) {
        memset(g, 0, (size_t)V * (size_t)tdt_dtype_size(dt));
    } else {
        float occ = (float)ng->tok_occ, cl = (float)c->o.clamp, sc = (float)scale;
        switch (dt) {
        case TDT_DTYPE_FLOAT64:
            row_grad_f64((const double *)z, (double *)g, V, lse, ng->tok_occ, c->o.clamp, scale);
            break;
        case TDT_DTYPE_FLOAT16:
            row_grad_f16((const uint16_t *)z, (uint16_t *)g, V, (float)lse, occ, cl, sc);
            break;
        case TDT_DTYPE_BFLOAT16:
            row_grad_bf16((const uint16_t *)z, (uint16_t *)g, V, (float)lse, occ, cl, sc);
            break;
        default: row_grad_f32((const float *)z, (float *)g, V, (float)lse, occ, cl, sc); break;
        }
    }
    if (!in_place) load_patched(z, blank, label, dt, &zb, &zl);
    double pb = logits ? exp(zb - lse) : 0.0;
    store_one(g, blank, dt, scale * tdt_token_grad(ng, pb, 1, 0, c->o.clamp));
    if (label >= 0) {
        double pl = logits ? exp(zl - lse) : 0.0;
        store_one(g, label, dt, scale * tdt_token_grad(ng, pl, 0, 1, c->o.clamp));
    }
}

/* ---- the rows of the fused joint (cpu.h) ------------------------------------------------------ */

double tdt_cpu_row_lse(const void *z, int64_t V, int acc_double) {
    const tdt_dtype_t dt = acc_double ? TDT_DTYPE_FLOAT64 : TDT_DTYPE_FLOAT32;
    row_scan_t sc = row_scan(z, V, dt);
    return row_lse(z, NULL, V, dt, &sc);
}

void tdt_cpu_token_grad(const void *z, void *g, int64_t V, int acc_double, int blank, double clamp,
                        double lse, const tdt_node_grad_t *ng, int32_t label, double scale) {
    tdt_call_t c;
    memset(&c, 0, sizeof c);
    c.p.vocab_size = V;
    c.p.dtype = acc_double ? TDT_DTYPE_FLOAT64 : TDT_DTYPE_FLOAT32;
    c.o.blank = blank;
    c.o.clamp = clamp;
    c.o.input_kind = TDT_INPUT_LOGITS;
    token_grad_row(&c, z, g, lse, ng, label, scale);
}

/* ---- pass 1: per-node log-probabilities ----------------------------------------------------- */

static void node_pass(const tdt_call_t *c, const tdt_ws_t *ws, int nthreads) {
    const tdt_problem_t *p = &c->p;
    const int64_t D = c->num_durations;
    const int logits = c->o.input_kind == TDT_INPUT_LOGITS;
    const tdt_wblocks_t wb = tdt_call_blocks(c, ws->w);
#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(nthreads)
    for (int64_t b = 0; b < p->batch; ++b) {
        for (int64_t t = 0; t < p->max_frames; ++t) {
            const int64_t T = p->frame_lengths[b], U = p->label_lengths[b];
            if (t >= T) continue;
            const int32_t *y = p->max_labels > 0 ? p->labels + b * p->max_labels : NULL; /* NULL labels allowed when max_labels == 0 */
            row_scan_t sc = {0.0f, 0}; /* row u's, from row u - 1's pass */
            for (int64_t u = 0; u <= U; ++u) {
                const void *z = elem_ptr(p->token_logits, tdt_row_offset(p->token_strides, b, t, u), p->dtype);
                double lse = 0.0;
                if (logits) {
                    if (u == 0) sc = row_scan(z, p->vocab_size, p->dtype);
                    const void *zn = u < U ? elem_ptr(p->token_logits, tdt_row_offset(p->token_strides, b, t, u + 1), p->dtype)
                                           : NULL;
                    lse = row_lse(z, zn, p->vocab_size, p->dtype, &sc);
                }
                double *w = tdt_wblock(&wb, b, t, u); /* the node's block (workspace.h) */
                w[tdt_w_lse(D)] = lse;
                w[TDT_W_BLANK] = load_one(z, c->o.blank, p->dtype) - lse - c->o.sigma;
                w[TDT_W_LABEL] = u < U ? load_one(z, y[u], p->dtype) - lse - c->o.sigma : -INFINITY;
            }
            /* the row's duration log-softmax a run of nodes at a time, vectorised across them */
            for (int64_t u0 = 0; D > 0 && u0 <= U; u0 += TDT_SOFTMAX_NODES) {
                const int nn = (int)(U + 1 - u0 < TDT_SOFTMAX_NODES ? U + 1 - u0 : TDT_SOFTMAX_NODES);
                double h[TDT_MAX_DURATIONS * TDT_SOFTMAX_NODES];
                for (int i = 0; i < nn; ++i) {
                    const void *hr = elem_ptr(p->duration_logits,
                                              tdt_row_offset(p->duration_strides, b, t, u0 + i), p->dtype);
                    for (int64_t k = 0; k < D; ++k) h[k * TDT_SOFTMAX_NODES + i] = load_one(hr, k, p->dtype);
                }
                if (logits) tdt_log_softmax_small(h, (int)D, nn, TDT_SOFTMAX_NODES);
                for (int i = 0; i < nn; ++i) {
                    double *lp = tdt_wblock(&wb, b, t, u0 + i) + TDT_W_DUR;
                    for (int64_t k = 0; k < D; ++k) lp[k] = h[k * TDT_SOFTMAX_NODES + i];
                }
            }
        }
    }
}

/* ---- pass 2: alpha, beta, costs ------------------------------------------------------------- */

static tdt_lattice_t sample_lattice(const tdt_call_t *c, const tdt_ws_t *ws, int64_t b) {
    tdt_lattice_t L;
    L.wn = c->layout.block;
    L.wb = tdt_call_blocks(c, ws->w);
    L.wb.base += b * L.wb.s[0];
    L.row = c->p.max_labels + 1;
    L.frames = c->p.max_frames;
    L.T = c->p.frame_lengths[b];
    L.U = c->p.label_lengths[b];
    return L;
}

static void lattice_pass(const tdt_call_t *c, const tdt_ws_t *ws, int nthreads) {
    const int64_t B = c->p.batch, row = c->p.max_labels + 1;
    /* alpha gives the cost; beta is for a backward, which a costs-only call never has */
    const int64_t tasks = c->costs_only ? B : 2 * B;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task % B;
        tdt_lattice_t L = sample_lattice(c, ws, b);
        const int64_t off = tdt_sample_offset(b, c->p.max_frames, row);
        /* anti-diagonal by anti-diagonal, as the GPU does: each diagonal is contiguous in the
           per-node arrays (lattice.h), and every arc crosses to another diagonal */
        const int64_t S = tdt_num_diagonals(&L);
        const int is_beta = task >= B;
        double *v = (is_beta ? ws->beta : ws->alpha) + off;
        tdt_sweep_geo_t G; /* slot geometry once per sample, other ends' rows once a diagonal */
        tdt_sweep_geo_init(&G, &c->arcs, v, is_beta);
        for (int64_t i = 0; i < S; ++i) {
            const int64_t s = is_beta ? S - 1 - i : i;
            int64_t lo, hi;
            tdt_diagonal_range(&L, s, &lo, &hi);
            tdt_sweep_geo_diag(&G, &L, s);
            for (int64_t u = lo; u <= hi; u += TDT_SWEEP_CHUNK) {
                const int64_t last = hi - u < TDT_SWEEP_CHUNK ? hi : u + TDT_SWEEP_CHUNK - 1;
                tdt_sweep_chunk(&G, &L, &c->arcs, s, u, last, v + G.node + u);
            }
        }
        if (!is_beta) ws->ll[b] = tdt_log_likelihood(&L, &c->arcs, v);
    }
    for (int64_t b = 0; b < B; ++b) {
        double ll = ws->ll[b];
        const double cost = tdt_cost(ll, c->o.fastemit_lambda, c->o.normalize_costs != 0,
                                     tdt_acc_is_double(c->p.dtype), c->p.label_lengths[b]);
        if (tdt_acc_is_double(c->p.dtype))
            ((double *)c->costs)[b] = cost;
        else
            ((float *)c->costs)[b] = (float)cost;
    }
}

/* ---- pass 3: gradients ---------------------------------------------------------------------- */

/* Nodes of a row whose gradient coefficients grad_pass computes before their V-wide rows. */
#define GRAD_CHUNK TDT_CPU_COEFF_NODES

void tdt_cpu_node_coeffs(const tdt_call_t *c, const tdt_ws_t *ws, int64_t b, int64_t t,
                         int64_t u0, int nn, tdt_node_grad_t *ng, double *q) {
    const tdt_problem_t *p = &c->p;
    const int64_t T = p->frame_lengths[b], U = p->label_lengths[b], D = c->num_durations;
    const double ll = ws->ll[b];
    const int feasible = ll != -INFINITY;
    const int logits = c->o.input_kind == TDT_INPUT_LOGITS;
    const tdt_lattice_t L = sample_lattice(c, ws, b);
    const int64_t off = tdt_sample_offset(b, p->max_frames, p->max_labels + 1);
    const int slots = tdt_num_slots(&c->arcs);
    /* the run's occupancies (and duration probabilities) as logs first, then their exps
       together, vectorised across the nodes (tdt_node_grad's values but for tdt_exp_le0 in
       place of the C library's exp); -inf (exp 0) off the lattice */
    double occ[GRAD_CHUNK * 2 * TDT_MAX_DURATIONS];
    const int64_t Dq = q ? D : 0;
    for (int i = 0; i < nn; ++i) {
        const int64_t u = u0 + i;
        const int live = feasible && t < T && u <= U;
        if (live)
            tdt_node_occupancy_args(&L, &c->arcs, ws->alpha + off, ws->beta + off, t, u, ll,
                                    occ + i * slots);
        else
            for (int j = 0; j < slots; ++j) occ[i * slots + j] = -INFINITY;
        const double *lpd = live && logits ? tdt_node_block(&L, t, u) + TDT_W_DUR : NULL;
        for (int64_t k = 0; k < Dq; ++k) q[i * D + k] = lpd ? lpd[k] : -INFINITY;
    }
    for (int e = 0; e < nn * slots; ++e) occ[e] = tdt_exp_le0(occ[e]);
    for (int e = 0; e < nn * (int)Dq; ++e) q[e] = tdt_exp_le0(q[e]);
    for (int i = 0; i < nn; ++i) tdt_node_grad_of(occ + i * slots, c->arcs.count, c->o.fastemit_lambda, &ng[i]);
}

static void grad_pass(const tdt_call_t *c, const tdt_ws_t *ws, int nthreads) {
    const tdt_problem_t *p = &c->p;
    const int64_t row = p->max_labels + 1, D = c->num_durations;
    const size_t esz = (size_t)tdt_dtype_size(p->dtype);
#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(nthreads)
    for (int64_t b = 0; b < p->batch; ++b) {
        for (int64_t t = 0; t < p->max_frames; ++t) {
            const int64_t T = p->frame_lengths[b], U = p->label_lengths[b];
            const double ll = ws->ll[b];
            const double scale = tdt_upstream(c->grad_costs, tdt_acc_is_double(p->dtype),
                                              c->o.grad_costs_scalar, b,
                                              c->o.batch_mean ? p->batch : 0,
                                              c->o.normalize_costs != 0, U);
            const int feasible = ll != -INFINITY;
            tdt_lattice_t L = sample_lattice(c, ws, b);
            const int32_t *y = p->max_labels > 0 ? p->labels + b * p->max_labels : NULL; /* NULL labels allowed when max_labels == 0 */
            /* A run of nodes' coefficients first, then their rows: the lattice arrays of the
               nodes of row t are one diagonal apart (lattice.h), so each node's reads miss the
               cache; back to back, those misses overlap instead of each stalling between two
               rows of V-wide streaming. (With options.state_in_grads a node's block is the
               head of its own token-gradient row: every read of it, its lse included, comes
               before token_grad_row writes that row.) */
            for (int64_t u0 = 0; u0 < row; u0 += GRAD_CHUNK) {
                const int64_t u1 = row - u0 < GRAD_CHUNK ? row : u0 + GRAD_CHUNK;
                tdt_node_grad_t ng[GRAD_CHUNK];
                double q[GRAD_CHUNK * TDT_MAX_DURATIONS];
                tdt_cpu_node_coeffs(c, ws, b, t, u0, (int)(u1 - u0), ng,
                                    c->g.duration_grads ? q : NULL); /* q only feeds those */
                for (int64_t u = u0; u < u1; ++u) {
                    void *gz = c->g.token_grads
                                   ? (char *)c->g.token_grads + tdt_row_offset(c->g.token_strides, b, t, u) * (int64_t)esz
                                   : NULL;
                    void *gh = c->g.duration_grads
                                   ? (char *)c->g.duration_grads + tdt_row_offset(c->g.duration_strides, b, t, u) * (int64_t)esz
                                   : NULL;
                    if (!feasible || t >= T || u > U) {
                        if (gz) memset(gz, 0, (size_t)p->vocab_size * esz);
                        if (gh) memset(gh, 0, (size_t)D * esz);
                        continue;
                    }
                    const tdt_node_grad_t *g = &ng[u - u0];
                    if (gz) {
                        const void *z = elem_ptr(p->token_logits, tdt_row_offset(p->token_strides, b, t, u), p->dtype);
                        const double lse = tdt_node_block(&L, t, u)[tdt_w_lse(D)];
                        token_grad_row(c, z, gz, lse, g, u < U ? y[u] : -1, scale);
                    }
                    if (gh)
                        for (int64_t k = 0; k < D; ++k)
                            store_one(gh, k, p->dtype, scale * tdt_duration_grad(g, q[(u - u0) * D + k], (int)k));
                }
            }
        }
    }
}

/* ---- tdt_scale_gradients -------------------------------------------------------------------- */

/* Row of n gradient elements times s, rounded once to the dtype; zeros left as they are. */
static void scale_row(void *g, int64_t n, tdt_dtype_t dtype, double s) {
    for (int64_t i = 0; i < n; ++i) {
        const double x = load_one(g, i, dtype);
        if (x != 0.0) store_one(g, i, dtype, x * s); /* exact in double for the 32-bit types */
    }
}

tdt_status_t tdt_cpu_scale(const tdt_call_t *c) {
    const tdt_problem_t *p = &c->p;
    const int64_t row = p->max_labels + 1;
    const size_t esz = (size_t)tdt_dtype_size(p->dtype);
    const int nthreads = c->o.num_threads > 0 ? c->o.num_threads : omp_get_max_threads();
#pragma omp parallel for collapse(2) schedule(dynamic, 4) num_threads(nthreads)
    for (int64_t b = 0; b < p->batch; ++b) {
        for (int64_t t = 0; t < p->max_frames; ++t) {
            const double s = tdt_upstream(c->grad_costs, tdt_acc_is_double(p->dtype),
                                          c->o.grad_costs_scalar, b, 0, 0, 0);
            if (s == 1.0 || t >= p->frame_lengths[b]) continue;
            for (int64_t u = 0; u <= p->label_lengths[b] && u < row; ++u) {
                if (c->g.token_grads)
                    scale_row((char *)c->g.token_grads + tdt_row_offset(c->g.token_strides, b, t, u) * (int64_t)esz,
                              p->vocab_size, p->dtype, s);
                if (c->g.duration_grads)
                    scale_row((char *)c->g.duration_grads + tdt_row_offset(c->g.duration_strides, b, t, u) * (int64_t)esz,
                              c->num_durations, p->dtype, s);
            }
        }
    }
    return TDT_STATUS_SUCCESS;
}

/* ---- entry ---------------------------------------------------------------------------------- */

void tdt_cpu_forward_lattice(const tdt_call_t *c, const tdt_ws_t *ws, int nthreads, uint64_t magic) {
    lattice_pass(c, ws, nthreads);
    ws->header->magic = c->costs_only ? 0u : magic; /* no beta: no backward */
    ws->header->batch = c->p.batch;
    ws->header->max_frames = c->p.max_frames;
    ws->header->max_labels = c->p.max_labels;
    ws->header->num_durations = c->num_durations;
    ws->header->state_in_grads = c->o.state_in_grads != 0;
    if (c->o.reduction != TDT_REDUCTION_NONE) {
        const int acc_double = tdt_acc_is_double(c->p.dtype);
        const double r = tdt_reduce_costs(c->costs, acc_double, c->p.batch,
                                          c->o.reduction == TDT_REDUCTION_MEAN);
        if (acc_double)
            *(double *)c->o.reduced_cost = r;
        else
            *(float *)c->o.reduced_cost = (float)r;
    }
}

tdt_status_t tdt_cpu_check_forward(const tdt_call_t *c, const tdt_ws_t *ws, uint64_t magic) {
    const tdt_ws_header_t *h = ws->header;
    if (h->magic != magic || h->batch != c->p.batch || h->max_frames != c->p.max_frames ||
        h->max_labels != c->p.max_labels || h->num_durations != c->num_durations ||
        h->state_in_grads != (c->o.state_in_grads != 0)) {
        tdt_set_error("workspace does not hold %s() of this problem (batch %lld, "
                      "max_frames %lld, max_labels %lld, num_durations %d, state_in_grads %d)",
                      magic == TDT_WS_MAGIC ? "tdt_forward" : "tdt_joint_forward",
                      (long long)c->p.batch, (long long)c->p.max_frames,
                      (long long)c->p.max_labels, c->num_durations, c->o.state_in_grads != 0);
        return TDT_STATUS_INVALID_WORKSPACE;
    }
    return TDT_STATUS_SUCCESS;
}

tdt_status_t tdt_cpu_run(const tdt_call_t *c) {
    tdt_ws_t ws;
    tdt_workspace_carve(&c->layout, c->workspace, &ws);
    const int nthreads = c->o.num_threads > 0 ? c->o.num_threads : omp_get_max_threads();
    if (c->do_forward) {
        node_pass(c, &ws, nthreads);
        tdt_cpu_forward_lattice(c, &ws, nthreads, TDT_WS_MAGIC);
    } else {
        const tdt_status_t s = tdt_cpu_check_forward(c, &ws, TDT_WS_MAGIC);
        if (s != TDT_STATUS_SUCCESS) return s;
    }
    /* tdt_forward_ahead(): the CPU never writes the gradients ahead (the pair costs the same) */
    if (c->do_backward && !c->ahead) grad_pass(c, &ws, nthreads);
    return TDT_STATUS_SUCCESS;
}
