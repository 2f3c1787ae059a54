#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_tdt (fuzz/corpus/) and the bug reproducers (fuzz/regressions/).

The byte format is the one fuzz_tdt.c decodes (its opening comment); encode() below is its exact
inverse for the fields it sets. Every seed is deterministic: rerunning the script rewrites the
same files. Logits not given explicitly are left to the fuzzer's PRNG (inputs may stop early).

    python3 fuzz/make_corpus.py            # rewrites fuzz/corpus and fuzz/regressions
"""
import os
import random
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))

# enum fault of fuzz_tdt.c, in order
FAULTS = [
    "problem_null", "options_null", "loc_gpu", "loc_bad", "threads_neg", "kind_bad",
    "sigma_bad", "fastemit_bad", "clamp_bad", "batch_neg", "frames_neg", "labels_bad",
    "vocab_bad", "dtype_bad", "blank_bad", "ndur_bad", "dur_null", "dur_neg", "dur_dup",
    "dur_nopos", "tok_null", "flen_null", "llen_null", "labels_null", "costs_null", "ws_null",
    "tok_stride_neg", "dur_stride_neg", "grad_stride_neg", "inplace_strides", "ws_small",
    "flen_range", "llen_range", "label_range", "label_blank", "stride_huge", "bwd_no_fwd",
    "batch_huge", "bwd_other_fwd",
]
KINDS = {"oneshot": 0, "twophase": 1, "twophase_gc": 2, "costs": 3}
DTYPES = {"f32": 0, "f64": 1, "f16": 2, "bf16": 3}
IN_LAYOUTS = {"separate": 0, "joint": 1, "bcast": 2, "random": 3}
G_LAYOUTS = {"separate": 0, "joint": 1, "inplace": 2, "random": 3}
SIGMAS = [0.0, 0.05, 0.5, 2.0]
LAMBDAS = [0.0, 0.01, 0.5, 3.0]
CLAMPS = [0.0, 0.1, 1.0, 1e-3]
SCALES = [0.0, 0.5, 2.0, 8.0]
BIG_DURS = [8, 9, 12, 13, 20, 1000, 100000, 2147483647]
GCS = [1.0, 0.5, -2.0, 0.0, 3.25, 1e-3, -0.75, 2.0]
# k_specials of fuzz_tdt.c: index -> value (first index wins)
SPECIALS = [1e4, -1e4, 65504.0, -65504.0, 10000.5, -9999.75, 88.0, -88.0,
            -87.5, 100.0, -100.0, 1e-30, -1e-30, 700.0, -745.0, 0.0,
            20.0, -20.0, 1e3, -1e3, 5e3, 65000.0, 3.0, -3.0,
            "-inf", "-inf", "-inf", "-inf", "nan", "nan", "inf", "-inf"]


def dur_byte(d):
    if 0 <= d < 8:
        return d
    return (BIG_DURS.index(d) << 4) | 8


def value_byte(x, scale, dense):
    """The byte decoding to value x (a float, or 'inf' / '-inf' / 'nan')."""
    def special():
        i = SPECIALS.index(x)
        if not dense and i < 24:
            raise ValueError(f"{x} is a special value only reachable in dense mode")
        return 0xE0 + i
    if isinstance(x, str):
        return special()
    if scale == 0:
        return 0 if x == 0 else special()
    sv = x * 16.0 / scale
    if sv != int(sv) or not -128 <= sv <= 127:
        return special()
    b = int(sv) & 0xFF
    if b >= (0xE0 if dense else 0xF8):
        raise ValueError(f"{x} falls in the special byte range at scale {scale}")
    return b


def encode(kind="oneshot", tdt=True, log_probs=False, neginf=False, nonfinite=False,
           tok_grad=True, dur_grad=True, dtype="f64", B=1, T=3, U=1, V=4, blank=0,
           durations=(0, 1, 2), sigma=0.0, fastemit=0.0, clamp=0.0, null_empty=False,
           nan_gaps=False, threads=0, in_layout="separate", in_perm=0, in_pad=0,
           g_layout="separate", g_perm=0, g_pad=0, scale=2.0, dense=False, misalign=0,
           fault=None, fparam=0, lengths=None, labels=None, gcs=None, in_strides=None,
           tok=None, dur=None, g_strides=None):
    out = bytearray()
    out.append(KINDS[kind] | tdt << 2 | log_probs << 3 | neginf << 4 | nonfinite << 5 |
               (not tok_grad) << 6 | (not dur_grad) << 7)
    out.append(DTYPES[dtype])
    assert 0 <= B < 5 and 0 <= T < 13 and 0 <= U < 9 and (1 <= V <= 12 or (V - 13) % 4 == 0 and 13 <= V <= 73)
    out += bytes([B, T, U, V - 1 if V <= 12 else 240 + (V - 13) // 4])
    out.append(250 if blank == V - 1 and V > 1 else blank)
    assert 1 <= len(durations) <= 6
    out.append(len(durations) - 1)
    out += bytes(dur_byte(d) for d in durations)
    out.append(SIGMAS.index(sigma) | LAMBDAS.index(fastemit) << 2 | CLAMPS.index(clamp) << 4 |
               null_empty << 6 | nan_gaps << 7)
    out.append(threads)
    out.append(IN_LAYOUTS[in_layout] | in_perm << 2 | in_pad << 5)
    out.append(G_LAYOUTS[g_layout] | g_perm << 2 | g_pad << 5)
    out.append(SCALES.index(scale) | dense << 2)
    out.append(misalign)
    out.append(0 if fault is None else 160 + FAULTS.index(fault))
    out.append(fparam)
    if lengths is None:
        return bytes(out)  # the rest from the fuzzer's PRNG
    for (tb, ub) in lengths:
        out += bytes([tb, ub])
    labels = labels if labels is not None else [[1 if blank != 1 else 2] * U for _ in range(B)]
    for row in labels:
        row = list(row) + [0 if blank != 0 else 1] * (U - len(row))
        for y in row:
            out.append(y if y < blank else y - 1)
    out += bytes(GCS.index(g) for g in (gcs or [1.0] * B))
    if in_layout == "random":
        out += bytes(in_strides)
    if tok is None:
        return bytes(out)
    for x in tok:
        out.append(value_byte(x, scale, dense))
    for x in dur or []:
        out.append(value_byte(x, scale, dense))
    if g_layout == "random":
        out += bytes(g_strides)
    return bytes(out)


def seeds():
    rnd = random.Random(20240607)
    s = {}
    # golden cases of docs/math.md, section 6
    s["nemo_fixed_case"] = encode(B=1, T=3, U=1, V=4, blank=3, durations=(0, 1, 2), sigma=0.05,
                                  scale=0.0, lengths=[(3, 1)], labels=[[0]], tok=[0] * 24,
                                  dur=[0] * 18)
    s["warp_rnnt_small"] = encode(tdt=False, B=1, T=2, U=2, V=5, blank=0, lengths=[(2, 2)],
                                  labels=[[1, 2]])
    s["parakeet_joint"] = encode(dtype="f32", B=4, T=12, U=8, V=12, blank=11,
                                 durations=(0, 1, 2, 3, 4), in_layout="joint", g_layout="joint",
                                 lengths=[(12, 8), (9, 5), (3, 2), (12, 0)])
    s["parakeet_joint_inplace_bf16"] = encode(dtype="bf16", B=2, T=8, U=4, V=9, blank=8,
                                              durations=(0, 1, 2, 3, 4), in_layout="joint",
                                              g_layout="inplace", kind="twophase")
    # every dtype x call shape, TDT and RNN-T
    for dt in DTYPES:
        for kind in KINDS:
            for tdt in (True, False):
                name = f"{dt}_{kind}_{'tdt' if tdt else 'rnnt'}"
                s[name] = encode(kind=kind, tdt=tdt, dtype=dt, B=rnd.randint(1, 4),
                                 T=rnd.randint(1, 12), U=rnd.randint(0, 8), V=rnd.randint(2, 12),
                                 durations=tuple(rnd.sample(range(5), rnd.randint(1, 4)) + [5]),
                                 sigma=rnd.choice(SIGMAS), fastemit=rnd.choice(LAMBDAS),
                                 clamp=rnd.choice(CLAMPS), threads=rnd.randint(0, 4),
                                 in_layout=rnd.choice(list(IN_LAYOUTS)), in_perm=rnd.randint(0, 7),
                                 in_pad=rnd.randint(0, 7), g_layout=rnd.choice(list(G_LAYOUTS)),
                                 g_perm=rnd.randint(0, 7), g_pad=rnd.randint(0, 7),
                                 misalign=rnd.randint(0, 255), log_probs=rnd.random() < 0.3)
    # extreme values: +-1e4, fp16 limits, -inf (masked vocab), NaN / inf
    s["extreme_1e4_f64"] = encode(dtype="f64", B=2, T=6, U=3, V=6, dense=True, scale=8.0)
    s["extreme_fp16_limits"] = encode(dtype="f16", B=2, T=6, U=3, V=6, dense=True, scale=8.0)
    s["masked_vocab_neginf"] = encode(dtype="f32", B=3, T=7, U=4, V=8, neginf=True, dense=True)
    s["nan_inf_one_sample"] = encode(dtype="f64", B=3, T=5, U=3, V=5, neginf=True,
                                     nonfinite=True, dense=True)
    s["nan_inf_logprobs"] = encode(dtype="f32", B=3, T=5, U=3, V=5, neginf=True, nonfinite=True,
                                   dense=True, log_probs=True)
    # extreme shapes
    s["shape_B0"] = encode(B=0, T=5, U=3)
    s["shape_T0"] = encode(B=3, T=0, U=3, lengths=[(0, 1), (0, 0), (0, 3)])
    s["shape_all_T0"] = encode(B=2, T=6, U=2, lengths=[(0, 2), (0, 0)])
    s["shape_U0"] = encode(B=2, T=6, U=0, lengths=[(6, 0), (3, 0)])
    s["shape_V1_blank_only"] = encode(B=2, T=5, U=3, V=1, blank=0, lengths=[(5, 0), (2, 0)])
    s["shape_V2"] = encode(B=2, T=5, U=3, V=2, blank=1, lengths=[(5, 3), (4, 1)],
                           labels=[[0, 0, 0], [0]])
    s["shape_D1"] = encode(B=2, T=6, U=3, durations=(1,), lengths=[(6, 3), (2, 3)])
    s["shape_dur_beyond_T"] = encode(B=2, T=6, U=2, durations=(1, 1000), lengths=[(6, 2), (1, 0)])
    s["shape_dur_intmax"] = encode(B=1, T=4, U=2, durations=(2147483647, 2, 0))
    s["shape_empty_nulls"] = encode(B=0, T=0, U=0, null_empty=True)
    s["threads_more_than_work"] = encode(B=1, T=1, U=0, threads=4, lengths=[(1, 0)])
    s["nan_gaps_padded"] = encode(B=3, T=7, U=3, in_pad=7, g_pad=7, nan_gaps=True)
    s["wide_vocab_f32_joint"] = encode(dtype="f32", B=2, T=5, U=3, V=69, blank=68,
                                       durations=(0, 1, 2, 3, 4), in_layout="joint",
                                       g_layout="joint", lengths=[(5, 3), (4, 2)])
    s["wide_vocab_f16_masked"] = encode(dtype="f16", B=2, T=4, U=2, V=33, neginf=True, dense=True,
                                        lengths=[(4, 2), (3, 1)])
    s["wide_vocab_bf16_rnnt"] = encode(dtype="bf16", tdt=False, B=3, T=6, U=4, V=17, blank=0)
    s["random_strides"] = encode(B=2, T=4, U=2, V=3, durations=(1, 2), in_layout="random",
                                 g_layout="random", lengths=[(4, 2), (3, 1)],
                                 in_strides=[40, 9, 3, 20, 5, 2])
    # one seed per fault
    for i, f in enumerate(FAULTS):
        s[f"fault_{f}"] = encode(kind=list(KINDS)[i % 3], dtype=list(DTYPES)[i % 4], B=2, T=5,
                                 U=3, V=6, fault=f, fparam=rnd.randint(0, 255),
                                 lengths=[(5, 3), (4, 2)])
    return s


def regressions():
    r = {}
    # 1. labels == NULL with max_labels == 0 (allowed by tdt.h): `labels + b * max_labels` is
    #    pointer arithmetic on NULL (UBSan: applying zero offset to null pointer) in src/tdt.c
    #    check_data(), and in src/cpu/cpu.c node_pass() / grad_pass().
    r["null_labels_zero_offset"] = encode(tdt=False, B=1, T=2, U=0, V=3, null_empty=True,
                                          lengths=[(2, 0)], tok=[0.5, -1.0, 2.0, 1.0, 0.0, -0.5],
                                          scale=0.5)
    # 2. log-prob input holding +inf on a used arc: cost -inf (tdt.h: NaN cost).
    r["logprob_posinf_cost_neg_inf"] = encode(tdt=False, log_probs=True, nonfinite=True, B=1,
                                              T=2, U=0, V=2, blank=0, lengths=[(2, 0)],
                                              tok=["inf", -1.0, -0.5, -1.0], dtype="f64",
                                              scale=0.5)
    # 3. TDT duration logits holding +inf at a duration whose arc does not exist at that node
    #    (d = 1000 > T): the duration log-softmax turns the other entries into -inf and only
    #    the +inf one into NaN, so the sample gets cost +inf instead of NaN.
    tok = [0.0] * (3 * 1 * 3)
    dur = [0.0, 0.0] * 3
    dur[1] = "inf"  # node (0, 0), duration index 1 (d = 1000)
    r["duration_posinf_not_nan"] = encode(tdt=True, nonfinite=True, B=1, T=3, U=0, V=3,
                                          durations=(1, 1000), lengths=[(3, 0)], tok=tok,
                                          dur=dur, scale=0.5, dtype="f64")
    # 3b. the same with the +inf on a node off the only path's frames: a finite cost
    tok = [0.0] * (3 * 2 * 3)
    dur = [0.0, 0.0] * 6
    dur[2 * (1 * 2 + 0) + 1] = "inf"  # node (1, 0), d = 2 would overshoot T = 3
    r["duration_posinf_finite_cost"] = encode(tdt=True, nonfinite=True, B=1, T=3, U=1, V=3,
                                              durations=(1, 2), lengths=[(3, 1)], labels=[[1]],
                                              tok=tok, dur=dur, scale=0.5, dtype="f64")
    # 3c. a TDT duration of INT_MAX (durations 2147483647, 2, 0; logits from the fuzzer's PRNG):
    #    the int sum dt + du overflowed in lattice.h's tdt_sweep_geo_diag (UBSan; fixed in
    #    176833a by adding in 64 bits)
    r["duration_int_max_span_overflow"] = encode(tdt=True, B=1, T=4, U=2, V=4, blank=0,
                                                 durations=(2147483647, 2, 0), scale=2.0,
                                                 dtype="f64")
    # 4. a row of logits all -inf (here V = 1) under a clang build, whose `omp simd
    #    reduction(max)` starts from -FLT_MAX: the row's max comes out finite, every element's
    #    z - max is -inf, and a row-sum exp that gave e^-87 there (not 0) made the row's lse
    #    finite and the cost +inf instead of NaN (src/cpu/cpu.c, cpu_expf_sum).
    r["row_all_neg_inf_max_identity"] = encode(tdt=False, neginf=True, B=1, T=2, U=0, V=1,
                                               blank=0, lengths=[(2, 0)], tok=[0.0, "-inf"],
                                               scale=0.5, dtype="f32")
    return r


def encode_joint(tdt, T, U, H, D, blank=0, activation=0, pair=0, upstream=0,
                 durations=(0, 1, 2, 3), labels=(), enc=127, pred=127, weight=127, bias=(), gc=()):
    """One fuzz_joint input (the layout in fuzz_joint.c's opening comment): float32, B = 1,
    V = 9, all frames and labels used, no fault, all four gradients, one thread; enc, pred and
    W filled with one byte each (int8 / 16 times a scale); labels, bias and upstream gradient
    as bytes."""
    flags = (1 if tdt else 0) | (pair << 1) | (activation << 2) | (upstream << 7)
    b = bytes([flags, 0, 1, T, U, 8, H - 1, blank, D - 1]) + bytes(durations[:D])
    b += bytes([0, 0, 0, 0, 0, 0, 0, 0])  # options, threads, gradients, fault, seed, offset
    b += bytes([T, U]) + bytes(labels)
    O = 9 + (D if tdt else 0)
    b += bytes([enc]) * (T * H) + bytes([pred]) * ((U + 1) * H) + bytes([weight]) * (O * H)
    return b + bytes(bias) + bytes(gc)


def joint_regressions():
    r = {}
    # 1. (the harness) every row of W equal: d h = W sum(dz) is exactly 0, and the float32
    #    library leaves sum(dz) at the rounding of its lse of logits near 800 (1e-4 in d pred,
    #    5e-5 relative to the logits): the tolerance now has a rounding term for sums that
    #    cancel (fuzz_joint.c, outs_t).
    r["equal_weight_rows_float32_lse"] = encode_joint(
        tdt=False, T=5, U=3, H=1, D=1, blank=5, activation=3, pair=1, durations=(4,),
        labels=(7, 3, 4), bias=(255, 68, 247, 154, 39, 132, 160, 155, 170),
        gc=(100, 156, 127, 128))
    return r


def write(dirname, files):
    path = os.path.join(HERE, dirname)
    if os.path.isdir(path):
        for f in os.listdir(path):
            if f.endswith(".bin"):
                os.remove(os.path.join(path, f))
    os.makedirs(path, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(path, name + ".bin"), "wb") as fh:
            fh.write(data)
    print(f"{dirname}: {len(files)} files, {sum(len(d) for d in files.values())} bytes")


if __name__ == "__main__":
    write("corpus", seeds())
    write("regressions", regressions())
    write(os.path.join("regressions", "joint"), joint_regressions())
