/*
 * test_util.h - one helper per call shape, so that each test body is a line or two.
 *
 * A Problem is a padded batch held in float64, contiguous: token logits (B, maxT, maxU + 1, V),
 * duration logits (B, maxT, maxU + 1, D), labels (B, maxU), lengths (B). run_lib() converts it
 * to the requested dtype and layout, calls the library the requested way, and converts costs and
 * gradients back to float64 in the same contiguous layout; run_ref() computes the same with the
 * naive reference (reference.h), sample by sample, zero outside each lattice. The expect_*
 * helpers compare two Outputs and say which element diverged, where, and by how much.
 */
#ifndef TDT_TESTS_TEST_UTIL_H
#define TDT_TESTS_TEST_UTIL_H

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"  // src/
#include "tdt.h"

namespace tdt_test {

// ---- 16-bit float conversions: the library's own (src/common/dtype.h; round to nearest even),
// checked on every pattern against an independent implementation in test_dtype.cc ---------
inline uint16_t float_to_half(float f) { return tdt_float_to_fp16(f); }
inline float half_to_float(uint16_t h) { return tdt_fp16_to_float(h); }
inline uint16_t float_to_bfloat16(float f) { return tdt_float_to_bf16(f); }
inline float bfloat16_to_float(uint16_t h) { return tdt_bf16_to_float(h); }
size_t dtype_size(tdt_dtype_t dtype);
const char *dtype_name(tdt_dtype_t dtype);
// x rounded to the nearest value representable in dtype.
double quantize(double x, tdt_dtype_t dtype);
// Stores x as dtype at p[i] / loads p[i] of dtype as double.
void store(void *p, int64_t i, double x, tdt_dtype_t dtype);
double load(const void *p, int64_t i, tdt_dtype_t dtype);

// ---- problems ------------------------------------------------------------------------------
struct Problem {
    int64_t B = 1, maxT = 1, maxU = 0, V = 2;
    std::vector<int> durations;    // empty: plain RNN-T (no duration logits)
    int blank = 0;
    double sigma = 0.0, fastemit = 0.0, clamp = 0.0;
    bool log_probs = false;
    int num_threads = 0;
    std::vector<double> tok;       // (B, maxT, maxU + 1, V)
    std::vector<double> dur;       // (B, maxT, maxU + 1, D)
    std::vector<int32_t> labels;   // (B, maxU)
    std::vector<int32_t> T, U;     // (B)

    int D() const { return static_cast<int>(durations.size()); }
    bool rnnt() const { return durations.empty(); }
    int64_t nodes() const { return B * maxT * (maxU + 1); }
    int64_t node(int64_t b, int64_t t, int64_t u) const { return (b * maxT + t) * (maxU + 1) + u; }
    std::string describe() const;  // one line: shape, durations, options
};

// One sample filling the whole (1, T, U + 1, .) extent, from row-major arrays.
Problem make_problem(int64_t T, int64_t U, int64_t V, std::vector<int32_t> labels,
                     std::vector<double> tok, std::vector<double> dur, std::vector<int> durations,
                     int blank);

// A batch with normal(0, scale) logits, labels uniform over non-blank tokens and lengths drawn
// in [minT, maxT] x [0, maxU] (sample 0 gets the full maxT and maxU) unless given in Ts / Us.
// Deterministic in seed.
Problem random_problem(uint64_t seed, int64_t B, int64_t maxT, int64_t maxU, int64_t V,
                       std::vector<int> durations, int blank = 0, double scale = 1.0,
                       int64_t minT = 1, std::vector<int32_t> Ts = {}, std::vector<int32_t> Us = {});
// All logits of p rounded to what dtype can hold (so the reference sees the same inputs).
void quantize_inputs(Problem &p, tdt_dtype_t dtype);
// Replaces p's logits by their log_softmax (token and duration), and sets log_probs.
void to_log_probs(Problem &p);

// ---- results -------------------------------------------------------------------------------
struct Output {
    tdt_status_t status = TDT_STATUS_SUCCESS;
    std::string error;             // tdt_last_error() after the call
    std::vector<double> costs;     // (B)
    std::vector<double> gtok;      // (B, maxT, maxU + 1, V); empty when not requested
    std::vector<double> gdur;      // (B, maxT, maxU + 1, D); empty when not requested
    double reduced = 0.0;          // options.reduction's value (RunOptions.reduction)
    int pack_valid = -1;           // options.pack_valid after the calls (RunOptions.pack)
    size_t workspace_bytes = 0;    // what tdt_get_workspace_size() said for the call
    bool untouched = true;         // on failure: the costs, the reduced cost and the gradient
                                   // buffers (in place: the logits) still hold what they held
                                   // before the calls (checked only when status != SUCCESS)
};

enum class Layout {
    Contiguous,   // separate contiguous token / duration buffers, gradients likewise
    Joint,        // one (B, T, U+1, V+D) logits tensor sliced by strides, gradients into one
                  // joint-shaped buffer the same way
    InPlace,      // gradients written over the logits (same pointers, same strides)
    Padded,       // logits rows padded to V + 5 / D + 3 elements, one spare frame per sample;
                  // gradient rows padded differently (V + 2 / D + 1); every gap holds NaN,
                  // must not be read, and must be left untouched
};
const char *layout_name(Layout layout);

struct RunOptions {
    tdt_dtype_t dtype = TDT_DTYPE_FLOAT64;
    Layout layout = Layout::Contiguous;
    bool two_phase = false;                           // tdt_forward + tdt_backward
    bool ahead = false;                               // with two_phase: tdt_forward_ahead (the
                                                      // CPU writes nothing ahead: it must say 0)
                                                      // and tdt_backward with the same grads
    const std::vector<double> *scale = nullptr;       // then tdt_scale_gradients by these (B)
    bool scale_scalar = false;                        // scale holds one value for all
    bool costs_only = false;                          // no gradient at all (grads == NULL)
    const std::vector<double> *grad_costs = nullptr;  // two_phase only; NULL = ones
    bool grad_costs_scalar = false;                   // grad_costs holds one value for all
    bool normalize_costs = false;                     // options.normalize_costs
    bool batch_mean = false;                          // options.batch_mean
    tdt_reduction_t reduction = TDT_REDUCTION_NONE;   // options.reduction, into Output.reduced
    bool want_tok = true, want_dur = true;            // which gradients to request
    size_t misalign = 0;                              // bytes added to the workspace pointer
    bool pack = false;                                // options.pack: labels and lengths handed
                                                      // over as int64 (rows strided), packed by
                                                      // the forward call into the problem's
                                                      // int32 array (checked against the
                                                      // Problem's own; Output.pack_valid)
    bool state_in_grads = false;                      // options.state_in_grads (the workspace
                                                      // sized with it). The library refuses it
                                                      // for tdt_forward: two_phase without
                                                      // ahead still calls tdt_forward (so that
                                                      // refusal can be tested); the supported
                                                      // pair is two_phase with ahead
};

Output run_lib(const Problem &p, const RunOptions &ro = RunOptions());
Output run_ref(const Problem &p, const std::vector<double> *grad_costs = nullptr);

// ---- the upstream's divisions, by hand ------------------------------------------------------
// x / n as a caller dividing in the accumulate type gets it (dbl: float64, else float32), and
// x / n as the product with the reciprocal 1 / n, each rounded (options.batch_mean's, and
// torch's CUDA division by a number).
inline double acc_div(double x, int64_t n, bool dbl) {
    return dbl ? x / (double)n : (double)((float)x / (float)n);
}
inline double acc_div_recip(double x, int64_t n, bool dbl) {
    return dbl ? x * (1.0 / (double)n) : (double)((float)x * (1.0f / (float)n));
}

// ---- comparisons ---------------------------------------------------------------------------
struct Tol {
    double cost_rel, cost_abs;     // |got - want| <= cost_abs + cost_rel * |want|
    double grad_abs, grad_rel;     // |got - want| <= grad_abs + grad_rel * |want|
};
Tol tol_for(tdt_dtype_t dtype);

// got vs want: costs (inf must match inf exactly), then both gradients element by element.
// Reports up to a few diverging elements with their (b, t, u, v) and the largest difference.
void expect_near(const Output &got, const Output &want, const Problem &p, const Tol &tol,
                 const std::string &what);
// Same bits (costs and gradients).
void expect_bitwise(const Output &got, const Output &want, const Problem &p,
                    const std::string &what);
// No NaN anywhere, gradients exactly 0 at every node outside sample b's lattice.
void expect_zero_outside_lattices(const Output &got, const Problem &p);

// Sums of the Problem's costs (for finite differences).
double cost_sum(const Output &o);

// ---- tdt_pack_indices() cases, shared by the CPU and GPU suites --------------------------------
struct PackCase {
    std::string name;
    int64_t B, T, U, V;
    int blank;
    tdt_index_type_t type;
    int64_t cols, stride;
    std::vector<int64_t> labels, fl, ll;  // labels: B rows of `stride` (at least cols used)
    int expect_valid;
};
std::vector<PackCase> pack_cases();
// The raw bytes of values in the case's index type.
std::vector<uint8_t> pack_bytes(const std::vector<int64_t> &values, tdt_index_type_t type);
// What tdt_pack_indices() must write, computed here element by element.
std::vector<int32_t> pack_expected(const PackCase &c);
// The case's problem and options (location given; blank, sizes).
tdt_problem_t pack_problem(const PackCase &c);

}  // namespace tdt_test

#endif  // TDT_TESTS_TEST_UTIL_H
