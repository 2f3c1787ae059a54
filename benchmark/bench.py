"""Benchmark of warp_tdt through PyTorch: forward+backward through autograd with the logits as
the two slices of one joint (B, T, U+1, V+D) tensor, as a Parakeet training step does.

For each named shape of docs/performance.md, "Shapes" (or --shape B,T,U,V) and dtype it
  1. checks the result first: CUDA results against the same library's CPU backend (costs and the
     joint gradient), CPU results against a float64 run; a wrong answer prints FAILED, no time;
  2. times forward+backward (CUDA events on a GPU, wall clock on the CPU; median over --iters,
     after warm-up), and on a GPU the peak extra memory of one step in multiples of the logits'
     bytes, twice: "peak", torch's allocated blocks (from an empty cache), and "asked", the
     bytes requested before the allocator rounds them to blocks. On a GPU two times: "ms", each
     step between its own two events and waited for (so the host's latency to the step's first
     kernel counts), and "loop ms", --iters steps enqueued back to back between two events
     (median of 3 such loops), as a training loop whose host runs ahead of the GPU sees them;
  3. times the baselines on the same inputs, each first checked against warp_tdt (costs and joint
     gradient; FAILED in its column instead of a time otherwise, which does not change the exit
     status): the vectorised pure-PyTorch TDT loss of torch_tdt.py (this folder; always there)
     and transformers' PyTorch TDT loss (when installed);
  4. prints ms, effective GB/s, the floor (3 x logits bytes over a device copy measured in the same
     run), the ratio to it, and the speed-up over the pure-PyTorch loss; --plot writes a PNG (time
     per shape: ours, the floor, the baselines);
  5. with --graph (CUDA), also the same step captured once in a CUDA graph and replayed: forward
     and backward through the binding and autograd with no host work a step, so the GPU's own
     time; the replayed gradient must equal the eager one to the bit, or no time is printed.
     Two times again: "graph ms", each replay between its own two events and waited for (the
     host's launch of the graph then counts: the GPU idles while it is submitted), and "graph
     loop", --iters replays enqueued back to back (median of 3 such loops).

With --joint NAMES (base-joint, parakeet-joint, huge-joint, long-joint, xl-joint; or
--joint-shape B,T,U,H,V) the fused joint + loss is timed instead (bench_joint() and the functions
after it): warp_tdt.tdt_joint_loss against the unfused path (the joint's logits in PyTorch, then
warp_tdt.tdt_loss_joint), forward+backward through autograd on the same inputs in one run, each
result checked first (fused against unfused costs and the four gradients). It prints ms, the
peak extra memory of a step (CUDA: torch.cuda.max_memory_allocated() over the step, from an empty
cache; CPU: the growth of the peak resident set (VmHWM, reset first) over one step run in a
fresh subprocess), the fused workspace and the unfused logits' bytes, and the GEMM work's achieved
GFLOP/s (4 passes of 2 x nodes x H x (V + D): forward, recompute, d h, d W), beside a plain GEMM
of the same work's shape (V + D rounded up to 8) measured in the same run ("x gemm"; bfloat16 on
CUDA, the run's dtype on the CPU); --plot writes a PNG of time and peak memory, fused against unfused.

With --joint-skip EPS,... (and --joint NAMES) the approximate backward (tdt_joint_loss's
skip_below) is timed against the exact fused path on the same inputs, random (the --joint inputs)
and peaked (the output weight scaled by --joint-peak: one alignment takes most of the
probability, as in a trained model): ms and the ratio to the exact step and to the unfused path
on the same inputs ("x unfused"; NaN where it does not fit), the normwise relative
error of each gradient against the exact one, and the fraction of lattice nodes the rule leaves
out (|upstream| x occupancy < eps; the occupancy read off the unfused path's logits gradient,
dz / p at a token that is neither blank nor the node's label).

On the CPU, --threads sets torch.set_num_threads() (default: every core this process may use);
the binding runs the library with torch.get_num_threads() threads.

    PYTHONPATH=pytorch_binding WARP_TDT_LIBRARY=build/libwarptdt.so \\
        python3 benchmark/bench.py --device cuda --shapes parakeet,base --dtypes float32,bfloat16
    PYTHONPATH=pytorch_binding /usr/bin/python3 benchmark/bench.py --device cpu --shapes base \\
        --threads 2
    PYTHONPATH=pytorch_binding /usr/bin/python3 benchmark/bench.py --device cpu \\
        --joint base-joint --dtypes float32 --joint-threads 1,2
    PYTHONPATH=pytorch_binding WARP_TDT_LIBRARY=build/libwarptdt.so python3 benchmark/bench.py \\
        --device cuda --joint parakeet-joint,huge-joint,long-joint,xl-joint --dtypes float32,bfloat16
    PYTHONPATH=pytorch_binding /usr/bin/python3 benchmark/bench.py --device cpu \\
        --joint base-joint --dtypes float32 --joint-skip 1e-4,1e-3,1e-2
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import torch_tdt  # this folder: the pure-PyTorch baseline
import warp_tdt

SHAPES = {  # name: (B, T, U, V, ragged)
    "base": (8, 100, 20, 1025, False),
    "parakeet": (4, 200, 40, 8193, False),
    "large": (16, 400, 100, 1025, False),
    "long": (1, 1500, 400, 1025, False),
    "ragged": (32, 150, 60, 257, True),
    "huge": (8, 375, 100, 8193, False),
}
DURATIONS = [0, 1, 2, 3, 4]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def make_inputs(shape, dtype, device, seed=0):
    B, T, U, V, ragged = shape
    g = torch.Generator().manual_seed(seed)
    D = len(DURATIONS)
    joint = torch.randn(B, T, U + 1, V + D, generator=g).to(dtype=dtype, device=device)
    targets = torch.randint(0, V - 1, (B, U), generator=g, dtype=torch.int64).to(device)
    if ragged:
        logit_lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
        target_lengths = torch.randint(U // 2, U + 1, (B,), generator=g)
    else:
        logit_lengths = torch.full((B,), T, dtype=torch.int64)
        target_lengths = torch.full((B,), U, dtype=torch.int64)
    return joint, targets, logit_lengths.to(device), target_lengths.to(device)


VALIDATE = True  # --no-validate: skip the binding's length/label check (its one small D2H copy)


def ours(joint, targets, logit_lengths, target_lengths, V, reduction="sum"):
    return warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], targets, logit_lengths,
                             target_lengths, blank_token_id=V - 1, durations=DURATIONS,
                             reduction=reduction, validate=VALIDATE)


def transformers_loss():
    try:
        from transformers.loss import loss_tdt
    except Exception:  # not installed, or an older transformers
        return None
    if hasattr(loss_tdt, "_load_tdt_kernel"):  # its pure-PyTorch loss, never a hub kernel
        loss_tdt._load_tdt_kernel = lambda: None
    return loss_tdt.tdt_loss


FAST_BASELINES = ("kc", "nemo")  # timed on every shape, with --iters


def kernels_community_loss(module_names):
    """The kernels-community `tdt-loss` layer's functional loss (its CUDA kernels), from the first
    importable module of `module_names` (comma-separated): the package the `kernels` hub installs
    is `tdt_loss`; a local build may go by another name. None where none imports."""
    import importlib
    for name in [m for m in module_names.split(",") if m]:
        try:
            mod = importlib.import_module(name)
        except Exception:  # not installed, or its extension did not build here
            continue
        if hasattr(mod, "tdt_loss"):
            return mod.tdt_loss
    return None


def nemo_loss():
    """NeMo's numba TDT loss (TDTLossNumba) wrapped to tdt_loss's signature, or None where NeMo
    does not import. NeMo takes the whole joint tensor (B, T, U+1, V+D): the two slices passed
    here are views of one tensor, whose base is handed over (no copy). It computes in float32:
    a bfloat16 joint is upcast inside the call, as NeMo's RNNTLoss does."""
    try:
        import numpy as np
        # numba-cuda still calls numpy names that numpy 2 removed; alias them to their successors
        for old, new in (("row_stack", "vstack"), ("trapz", "trapezoid"), ("in1d", "isin")):
            if not hasattr(np, old) and hasattr(np, new):
                setattr(np, old, getattr(np, new))
        from nemo.collections.asr.parts.numba.rnnt_loss.rnnt_pytorch import TDTLossNumba
    except Exception:
        return None
    losses = {}

    def loss(token_logits, duration_logits, targets, logit_lengths, target_lengths,
             blank_token_id, durations, sigma=0.0, reduction="mean"):
        joint = token_logits._base
        if (joint is None or duration_logits._base is not joint
                or joint.shape[-1] != token_logits.shape[-1] + duration_logits.shape[-1]):
            joint = torch.cat([token_logits, duration_logits], dim=-1)
        if joint.dtype not in (torch.float32, torch.float64):
            joint = joint.float()
        key = (blank_token_id, tuple(durations), sigma, reduction)
        if key not in losses:
            losses[key] = TDTLossNumba(blank=blank_token_id, durations=list(durations),
                                       reduction=reduction, sigma=sigma)
        return losses[key](joint, targets, logit_lengths, target_lengths)

    return loss


def baselines(device, kc_modules):
    """(column name, loss function, relative gradient tolerance for float32) of every baseline
    available here. transformers' loss runs its lattice in float32: on an H200 its float32
    gradient missed ours by 1.10 x (1e-3 |g| + 1e-6) at ragged (0.94 x that at parakeet), about
    0.2% of the small elements, so it gets 1e-2, as do the kernels-community and NeMo losses,
    which also keep float32 lattices; a difference of semantics (sigma, an arc) moves the costs,
    which are held to 2e-5 for every baseline."""
    out = [("torch", torch_tdt.tdt_loss, 1e-4)]
    hf = transformers_loss()
    if hf is not None:
        out.append(("transformers", hf, 1e-2))
    if device.type == "cuda":
        kc = kernels_community_loss(kc_modules)
        if kc is not None:
            out.append(("kc", kc, 1e-2))
        nemo = nemo_loss()
        if nemo is not None:
            out.append(("nemo", nemo, 1e-2))
    return out


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step, device, iters, warmup=2):
    """Median milliseconds of step() (forward+backward)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            step()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def loop_time(step, device, iters, reps=3):
    """Median over reps of the milliseconds a step takes when iters steps are enqueued back to
    back between two CUDA events, the host never waiting on the GPU in between (except where
    the step itself waits): what a training loop whose host runs ahead sees. time_step instead
    waits for each step, so its time includes the host's latency to the step's first kernel."""
    step()
    sync(device)
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            step()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / iters)
    return statistics.median(times)


def graph_time(x, targets, T_b, U_b, V, device, iters):
    """(ms, loop ms, verdict) of one step captured in a CUDA graph, as a training loop under
    torch.cuda.graph runs it (the binding skips its host-side check while capturing): the median
    of a replay between its own two events and waited for (the GPU idles while the host launches
    the graph, as in "ms"), and of --iters replays enqueued back to back (loop_time, as in "loop
    ms": the GPU kept busy between timed calls). Both None when the
    replay's gradient differs from the eager step's."""
    x.grad = None
    ours(x, targets, T_b, U_b, V).backward()
    want = x.grad
    side = torch.cuda.Stream(device)  # warm-up off the default stream, as torch's docs ask
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            x.grad = None
            ours(x, targets, T_b, U_b, V).backward()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        ours(x, targets, T_b, U_b, V).backward()
    graph.replay()
    torch.cuda.synchronize(device)
    same = torch.equal(x.grad, want)
    del want
    if not same:
        return None, None, "graph FAILED (its gradient differs from the eager step's)"
    ms = time_step(graph.replay, device, iters)
    loop_ms = loop_time(graph.replay, device, iters)
    x.grad = None
    del graph
    return ms, loop_ms, "graph bitwise"


def copy_bandwidth(device):
    """Bytes read + written per second of a large device copy (the floor's denominator)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 28)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_step(lambda: dst.copy_(src), device, 10)
    return 2 * n / (ms * 1e-3)


def compare(loss, grad, ref_loss, ref_grad, dtype, f32_rel=1e-4):
    """(ok, verdict) of costs and joint gradient against reference ones."""
    ref = ref_loss.detach().cpu().double()
    cost_err = ((loss.detach().cpu().double() - ref).abs() / ref.abs()).max().item()
    rel = {torch.float64: 1e-9, torch.float32: f32_rel}.get(dtype, 1.6e-2)
    g, rg = grad.cpu().double(), ref_grad.cpu().double()
    grad_err = ((g - rg).abs() / (rel * rg.abs() + 1e-6)).max().item()
    ok = cost_err < (1e-10 if dtype == torch.float64 else 2e-5) and grad_err <= 1.0
    return ok, "%s (cost rel %.1e, grad err/tol %.2f)" % ("ok" if ok else "FAILED", cost_err,
                                                           grad_err)


def check(joint, targets, T_b, U_b, V, device, dtype):
    """Our costs and joint gradient against the CPU backend (CUDA runs) or float64 (CPU runs).
    Returns (ok, verdict, our costs, our joint gradient)."""
    x = joint.detach().clone().requires_grad_(True)
    loss = ours(x, targets, T_b, U_b, V, reduction="none")
    loss.sum().backward()
    ref_dtype = dtype if device.type == "cuda" else torch.float64
    r = joint.detach().to("cpu", ref_dtype).requires_grad_(True)
    ref = ours(r, targets.cpu(), T_b.cpu(), U_b.cpu(), V, reduction="none")
    ref.sum().backward()
    ok, verdict = compare(loss, x.grad, ref, r.grad, dtype)
    return ok, verdict, loss.detach(), x.grad


def check_baseline(fn, f32_rel, joint, targets, T_b, U_b, V, dtype, our_loss, our_grad):
    """A baseline's costs and joint gradient against warp_tdt's (already checked) ones."""
    y = joint.detach().clone().requires_grad_(True)
    loss = fn(y[..., :V], y[..., V:], targets, T_b, U_b, blank_token_id=V - 1, durations=DURATIONS,
              reduction="none")
    loss.sum().backward()
    return compare(loss, y.grad, our_loss, our_grad, dtype, f32_rel)


def training_step(joint, targets, logit_lengths, target_lengths, V):
    """(x, step): a leaf copy of the joint tensor and one training step on it, forward and
    backward through autograd (the gradient replaced, not accumulated)."""
    x = joint.detach().clone().requires_grad_(True)

    def step():
        x.grad = None
        ours(x, targets, logit_lengths, target_lengths, V).backward()

    return x, step


def peak_memory(step, device):
    """The extra bytes one step holds at its peak (CUDA), as (counted, asked): torch's allocated
    blocks, and the bytes requested before the allocator rounds them to blocks (None where torch
    < 2.1 keeps no such count). From an empty cache: the allocator hands out a cached block whole
    when what is left of it would be under 1 MB, and counts all of it, so the peak would depend
    on the steps run before (up to 1 MB an allocation: 3 % of base's bfloat16 logits)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    before_asked = torch.cuda.memory_stats(device).get("requested_bytes.all.current")
    step()
    torch.cuda.synchronize(device)
    counted = torch.cuda.max_memory_allocated(device) - before
    peak_asked = torch.cuda.memory_stats(device).get("requested_bytes.all.peak")
    if before_asked is None or peak_asked is None:
        return counted, None
    return counted, peak_asked - before_asked


def bench(name, shape, dtype, device, args, bases, floor_bw):
    B, T, U, V, _ = shape
    joint, targets, T_b, U_b = make_inputs(shape, dtype, device)
    logits_bytes = joint.numel() * joint.element_size()
    ok, verdict, our_loss, our_grad = check(joint, targets, T_b, U_b, V, device, dtype)
    row = {"shape": name, "dtype": str(dtype).replace("torch.", ""), "ok": ok, "verdict": verdict,
           "floor_ms": 3 * logits_bytes / floor_bw * 1e3, "base": {}}
    if not ok:
        return row
    # the PyTorch losses (0.1-3 s a call) on --baseline-shapes only; the CUDA ones everywhere
    bases = [b for b in bases if dtype != torch.float64
             and (b[0] in FAST_BASELINES or name in args.baseline_shapes)]
    with_baselines = bool(bases)
    if not with_baselines:
        our_loss = our_grad = None  # the baselines' reference; free it before timing
    x, step = training_step(joint, targets, T_b, U_b, V)
    row["ms"] = time_step(step, device, args.iters)
    if device.type == "cuda":
        row["loop_ms"] = loop_time(step, device, args.iters)
        x.grad = None
        counted, asked = peak_memory(step, device)
        row["peak_x"] = counted / logits_bytes
        if asked is not None:
            row["req_x"] = asked / logits_bytes
    row["gbs"] = 3 * logits_bytes / (row["ms"] * 1e-3) * 1e-9
    if args.graph and device.type == "cuda":
        try:
            row["graph_ms"], row["graph_loop_ms"], gverdict = graph_time(
                x, targets, T_b, U_b, V, device, args.iters)
        except RuntimeError as e:  # a capture torch or the driver refused: say so, time the rest
            row["graph_ms"] = row["graph_loop_ms"] = None
            gverdict = "graph FAILED (%s)" % str(e).splitlines()[0][:80]
            x.grad = None
        row["verdict"] += "; " + gverdict
    if not with_baselines:
        return row
    for bname, fn, f32_rel in bases:
        try:
            bok, bverdict = check_baseline(fn, f32_rel, joint, targets, T_b, U_b, V, dtype,
                                           our_loss, our_grad)
        except Exception as e:  # a baseline that refuses the inputs (NeMo: padded frames)
            row["verdict"] += "; %s refused: %s" % (bname, str(e).splitlines()[0][:100])
            row["base"][bname] = "refused"
            continue
        row["verdict"] += "; %s %s" % (bname, bverdict)
        if not bok:
            row["base"][bname] = "FAILED"
            continue
        y = joint.detach().clone().requires_grad_(True)

        def base_step(fn=fn):
            y.grad = None
            fn(y[..., :V], y[..., V:], targets, T_b, U_b, blank_token_id=V - 1,
               durations=DURATIONS, reduction="sum").backward()

        iters = args.iters if bname in FAST_BASELINES else args.baseline_iters
        row["base"][bname] = time_step(base_step, device, iters, warmup=1)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shapes", default="base,parakeet,large,long,ragged,huge")
    p.add_argument("--shape", help="B,T,U,V of one more shape")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--baseline-iters", type=int, default=2)
    p.add_argument("--baseline-shapes", default="base,parakeet,ragged",
                   help="shapes on which to time the PyTorch baselines (~0.1-3 s a call)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU: torch.set_num_threads(N), which the binding passes on to the "
                        "library (default 0: every core this process may use)")
    p.add_argument("--plot", help="write a PNG plot here (with --joint: time and peak memory, "
                                   "fused against unfused)")
    p.add_argument("--graph", action="store_true",
                   help="CUDA: also time the step captured in a CUDA graph (no host work a step)")
    p.add_argument("--no-validate", action="store_true",
                   help="time tdt_loss(..., validate=False): no host synchronisation at all")
    p.add_argument("--sync-validation", action="store_true",
                   help="set WARP_TDT_ASYNC_VALIDATION=0: on CUDA, check lengths and labels "
                        "before the loss's kernels are enqueued (a host sync), not while they run")
    p.add_argument("--kc-module", default="tdt_loss,tdt_loss_kc",
                   help="CUDA: modules to try for the kernels-community tdt-loss baseline, in "
                        "order (its functional tdt_loss); NeMo's numba loss is timed where the "
                        "nemo package imports")
    p.add_argument("--joint", default="",
                   help="time the fused joint + loss against the unfused path on these shapes "
                        "(%s) instead of the loss alone" % ", ".join(JOINT_SHAPES))
    p.add_argument("--joint-shape", help="B,T,U,H,V of one more --joint shape")
    p.add_argument("--joint-threads", default="",
                   help="CPU, --joint: thread counts to run in turn, e.g. 1,2 (default --threads)")
    p.add_argument("--joint-skip", default="",
                   help="--joint: time skip_below at these thresholds against the exact fused "
                        "step, on random and peaked inputs, with the gradients' error")
    p.add_argument("--joint-peak", type=float, default=8.0,
                   help="--joint-skip: the factor on the output weight of the peaked inputs")
    p.add_argument("--_joint-rss", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._joint_rss:
        spec, dn, path, threads = args._joint_rss
        return _joint_rss_child(spec, dn, path, int(threads))
    global VALIDATE
    VALIDATE = not args.no_validate
    if args.joint_skip:
        return joint_skip_main(args, torch.device(args.device))
    if args.joint or args.joint_shape:
        return joint_main(args, torch.device(args.device))
    if args.sync_validation:
        os.environ["WARP_TDT_ASYNC_VALIDATION"] = "0"
    args.baseline_shapes = set(args.baseline_shapes.split(","))
    device = torch.device(args.device)
    shapes = [(n, SHAPES[n]) for n in args.shapes.split(",") if n]
    if args.shape:
        B, T, U, V = (int(v) for v in args.shape.split(","))
        shapes.append(("custom", (B, T, U, V, False)))
    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        torch.set_num_threads(args.threads if args.threads > 0 else cores)
    bases = baselines(device, args.kc_module)
    floor_bw = copy_bandwidth(device)
    print("warp_tdt %s (library %s), torch %s, device %s%s" % (
        warp_tdt.__version__, warp_tdt.library_version(), torch.__version__, device,
        (" (" + torch.cuda.get_device_name(device) + ")") if device.type == "cuda"
        else " (%d threads)" % torch.get_num_threads()))
    described = {"torch": "torch = torch_tdt.tdt_loss (vectorised pure PyTorch)",
                 "transformers": "transformers = transformers.loss.loss_tdt.tdt_loss",
                 "kc": "kc = kernels-community tdt-loss",
                 "nemo": "nemo = NeMo TDTLossNumba"}
    print("copy bandwidth %.0f GB/s (read + write); validate=%s%s; baselines: %s" % (
        floor_bw * 1e-9, VALIDATE, " (before the launch)" if args.sync_validation else "",
        ", ".join(described[b[0]] for b in bases)))
    names = [b[0] for b in bases]
    graphs = args.graph and device.type == "cuda"
    loops = device.type == "cuda"
    head = "%-9s %-9s %9s %8s %9s %7s %7s %7s" % ("shape", "dtype", "ms", "GB/s", "floor ms",
                                                 "x floor", "peak", "asked")
    head += " %9s" % "loop ms" if loops else ""
    head += " %9s %10s" % ("graph ms", "graph loop") if graphs else ""
    head += "".join(" %12s" % (n[:9] + " ms") for n in names) + " %8s" % "x torch"
    print(head + "  check")
    rows = []
    for name, shape in shapes:
        for dn in args.dtypes.split(","):
            dtype = DTYPES[dn]
            if name == "huge" and dtype != torch.bfloat16:
                continue
            if name in ("huge", "large") and device.type == "cpu":
                continue
            row = bench(name, shape, dtype, device, args, bases, floor_bw)
            rows.append(row)
            if row["ok"]:
                line = "%-9s %-9s %9.3f %8.0f %9.3f %7.2f %7s %7s" % (
                    name, row["dtype"], row["ms"], row["gbs"], row["floor_ms"],
                    row["ms"] / row["floor_ms"], "%.2fx" % row["peak_x"] if "peak_x" in row else "-",
                    "%.3fx" % row["req_x"] if "req_x" in row else "-")
                if loops:
                    line += " %9.3f" % row["loop_ms"]
                if graphs:
                    g, gl = row.get("graph_ms"), row.get("graph_loop_ms")
                    line += " %9s %10s" % ("%.3f" % g if g is not None else "FAILED",
                                           "%.3f" % gl if gl is not None else "FAILED")
                for n in names:
                    v = row["base"].get(n, "-")
                    line += " %12s" % ("%.1f" % v if isinstance(v, float) else v)
                t = row["base"].get("torch")
                line += " %8s" % ("%.1f" % (t / row["ms"]) if isinstance(t, float) else "-")
            else:
                line = "%-9s %-9s %9s %8s %9.3f %7s %7s %7s" % (name, row["dtype"], "-", "-",
                                                               row["floor_ms"], "-", "-", "-")
                line += " %9s" % "-" if loops else ""
                line += " %9s %10s" % ("-", "-") if graphs else ""
                line += "".join(" %12s" % "-" for _ in names) + " %8s" % "-"
            print(line + "  " + row["verdict"])
            sys.stdout.flush()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.plot:
        plot(rows, args.plot, str(device))
    # the exit status is about warp_tdt; a baseline that fails its check prints FAILED, no time
    return 0 if all(r["ok"] for r in rows) else 1


# ---- the fused joint + loss (--joint) -----------------------------------------------------------

JOINT_SHAPES = {  # name: (B, T, U, H, V, fused only: the unfused logits would not fit)
    "base-joint": (8, 100, 20, 256, 1025, False),
    "parakeet-joint": (4, 200, 40, 640, 8193, False),
    "huge-joint": (8, 375, 100, 640, 8193, False),
    "long-joint": (1, 1500, 400, 640, 1025, False),
    "xl-joint": (32, 750, 200, 640, 8193, True),
}
JOINT_DTYPES_ONLY = {"xl-joint": (torch.bfloat16,)}


def make_joint_inputs(shape, dtype, device, seed=0):
    """enc (B, T, H), pred (B, U + 1, H), weight (V + D, H), bias (V + D), full-length labels."""
    B, T, U, H, V = shape[:5]
    D = len(DURATIONS)
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(B, T, H, generator=g).mul_(0.5).to(device=device, dtype=dtype)
    pred = torch.randn(B, U + 1, H, generator=g).mul_(0.5).to(device=device, dtype=dtype)
    weight = torch.randn(V + D, H, generator=g).mul_(H ** -0.5).to(device=device, dtype=dtype)
    bias = torch.randn(V + D, generator=g).mul_(0.1).to(device=device, dtype=dtype)
    targets = torch.randint(0, V - 1, (B, U), generator=g, dtype=torch.int64).to(device)
    fl = torch.full((B,), T, dtype=torch.int64, device=device)
    ll = torch.full((B,), U, dtype=torch.int64, device=device)
    return (enc, pred, weight, bias), (targets, fl, ll)


def joint_flops(shape):
    """The GEMM work of a fused forward+backward: 4 passes (forward, recompute, d h, d W) of
    2 x nodes x H x (V + D) floating-point operations."""
    B, T, U, H, V = shape[:5]
    return 4 * 2 * B * T * (U + 1) * H * (V + len(DURATIONS))


def joint_step(path, params, idx, V):
    """One forward+backward of the fused ("fused") or unfused path through autograd, gradients
    replaced (reduction "sum")."""
    from warp_tdt import joint as J

    for x in params:
        x.grad = None
    fn = warp_tdt.tdt_joint_loss if path == "fused" else J.unfused_joint_loss
    loss = fn(*params, *idx, V - 1, DURATIONS, activation="relu", reduction="sum",
              validate=VALIDATE)
    loss.backward()
    return loss


def joint_check(shape, dtype, device, params, idx):
    """(ok, verdict): fused against unfused costs and gradients (normwise relative error), or,
    for a fused-only shape, the dtype's fused result against float32's fused one."""
    V = shape[4]
    ref_dtype = torch.float32 if shape[5] else None

    def grads(path, dt):
        ps = [p.detach().to(dt).requires_grad_(True) for p in params]
        for x in ps:
            x.grad = None
        from warp_tdt import joint as J
        fn = warp_tdt.tdt_joint_loss if path == "fused" else J.unfused_joint_loss
        loss = fn(*ps, *idx, V - 1, DURATIONS, reduction="none")
        loss.sum().backward()
        return [loss.detach()] + [p.grad for p in ps]

    got = grads("fused", dtype)
    want = grads("fused", ref_dtype) if ref_dtype is not None else grads("unfused", dtype)
    tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 3e-2)
    worst, names = 0.0, ("costs", "enc", "pred", "weight", "bias")
    parts = []
    for name, a, b in zip(names, got, want):
        a, b = a.double(), b.double()
        err = float((a - b).norm() / (b.norm() + 1e-30))
        worst = max(worst, err)
        parts.append("%s %.1e" % (name, err))
    ok = worst <= tol
    what = "vs fused float32" if ref_dtype is not None else "vs unfused"
    return ok, "%s %s (normwise rel: %s)" % ("ok" if ok else "FAILED", what, ", ".join(parts))


def gemm_gflops(shape, dtype, device, iters):
    """GFLOP/s of one plain GEMM of the joint's shape, (rows x H) @ (H x O), rows = the
    lattice nodes (at most 65536, so it fits beside the rest) and O = V + D rounded up to a
    multiple of 8 (the shape cuBLAS has its vectorised kernels for, as the fused path pads its
    weight; at V + D = 8198 itself it takes slower ones): in bfloat16 on CUDA (the tensor cores'
    rate, whatever the run's dtype), in the run's dtype on the CPU."""
    if device.type == "cuda":
        dtype = torch.bfloat16
    B, T, U, H, V = shape[:5]
    rows = min(B * T * (U + 1), 65536)
    O = (V + len(DURATIONS) + 7) // 8 * 8
    g = torch.Generator().manual_seed(1)
    a = torch.randn(rows, H, generator=g).to(device=device, dtype=dtype)
    w = torch.randn(H, O, generator=g).to(device=device, dtype=dtype)
    ms = time_step(lambda: torch.mm(a, w), device, max(3, iters))
    return 2 * rows * H * O / (ms * 1e-3) * 1e-9


def joint_peak_cuda(step, device):
    """Extra bytes torch's allocator counts at the peak of one step (from an empty cache)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def joint_peak_cpu(name, shape, dtype, path, threads):
    """The growth of the peak resident set (bytes) over one step of `path`, in a fresh
    subprocess whose inputs are built (and the library loaded) before the first reading: the
    peak extra resident memory the step needed (_joint_rss_child). None when the subprocess
    fails."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_joint-rss",
           ",".join(str(int(v)) for v in shape[:5]), str(dtype).replace("torch.", ""), path,
           str(threads)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None


def _status_kib(key):
    """A /proc/self/status field in KiB (VmRSS, VmHWM), or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _joint_rss_child(spec, dtype_name, path, threads):
    """--_joint-rss: prints the growth (bytes) of the peak resident set over one step
    (joint_peak_cpu): VmHWM after the step less VmRSS before it, the high-water mark reset
    first (writing 5 to /proc/self/clear_refs); where that cannot be done, ru_maxrss's growth
    (which misses a step whose peak stays below an earlier one)."""
    import resource

    torch.set_num_threads(threads)
    B, T, U, H, V = (int(v) for v in spec.split(","))
    shape = (B, T, U, H, V, False)
    params, idx = make_joint_inputs(shape, DTYPES[dtype_name], torch.device("cpu"))
    params = [p.requires_grad_(True) for p in params]
    warp_tdt.library_path()  # the library loaded before the first reading
    # a tiny step first: every lazy import and one-time allocation outside the measurement
    small = make_joint_inputs((1, 2, 1, H, V, False), DTYPES[dtype_name], torch.device("cpu"))
    joint_step(path, [p.requires_grad_(True) for p in small[0]], small[1], V)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kib("VmRSS")
    except OSError:
        before = None
    if before is not None:
        joint_step(path, params, idx, V)
        print((_status_kib("VmHWM") - before) * 1024)
        return 0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    joint_step(path, params, idx, V)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) * 1024)  # KiB on Linux
    return 0


def bench_joint(name, shape, dtype, device, args, threads):
    """One row of the --joint table: fused and unfused on the same inputs."""
    from warp_tdt import joint as J

    B, T, U, H, V, fused_only = shape
    D = len(DURATIONS)
    params, idx = make_joint_inputs(shape, dtype, device)
    row = {"shape": name, "dtype": str(dtype).replace("torch.", ""), "threads": threads}
    ok, verdict = joint_check(shape, dtype, device, params, idx)
    row["ok"], row["verdict"] = ok, verdict
    if not ok:
        return row
    esize = params[0].element_size()
    nodes = B * T * (U + 1)
    row["logits_mb"] = nodes * (V + D) * esize / 2 ** 20
    # the four gradients, which any path writes: the fused path's peak beyond them is its own
    row["grads_mb"] = sum(p.numel() for p in params) * esize / 2 ** 20
    leaves = [p.detach().clone().requires_grad_(True) for p in params]
    row["ws_mb"] = J.workspace_bytes(B, T, U, H, V, DURATIONS, dtype, device) / 2 ** 20
    flops = joint_flops(shape)
    for path in ("fused",) if fused_only else ("fused", "unfused"):
        step = lambda path=path: joint_step(path, leaves, idx, V)  # noqa: E731
        ms = time_step(step, device, args.iters, warmup=1)
        row[path + "_ms"] = ms
        row[path + "_gflops"] = flops / (ms * 1e-3) * 1e-9
        if device.type == "cuda":
            for x in leaves:
                x.grad = None
            row[path + "_peak_mb"] = joint_peak_cuda(step, device) / 2 ** 20
        else:
            peak = joint_peak_cpu(name, shape, dtype, path, threads)
            row[path + "_peak_mb"] = None if peak is None else peak / 2 ** 20
    row["gemm_gflops"] = gemm_gflops(shape, dtype, device, args.iters)
    return row


def joint_skipped(params, idx, V, eps):
    """(fraction of the lattice's nodes, fraction of whole tiles of 32 consecutive nodes) that
    skip_below = eps leaves out: the first is the CPU's saving (it compacts the kept nodes), the
    second the GPU tiles' (a tile's work goes only with all its nodes). A node goes when
    tok_occ < eps (reduction "sum": upstream 1; FastEmit 0: tok_occ >= dur_occ), with
    tok_occ = dz / p at a token that is neither blank (V - 1) nor the node's label, from the
    unfused path in float64 (float32 on a GPU, where float64's logits may not fit)."""
    from warp_tdt import joint as J

    wide = torch.float64 if params[0].device.type == "cpu" else torch.float32
    enc, pred, weight, bias = (p.detach().to(wide) for p in params)
    targets, fl, ll = idx
    z = J.joint_logits(enc, pred, weight, bias).requires_grad_(True)
    loss = warp_tdt.tdt_loss_joint(z, targets, fl, ll, V - 1, DURATIONS, reduction="sum")
    loss.backward()
    p = torch.softmax(z.detach()[..., :V], -1)
    B, T, R = z.shape[:3]
    lab = torch.full((B, R), -1, dtype=torch.int64, device=z.device)
    lab[:, :R - 1] = targets
    o = torch.where(lab == 0, 1, 0)[:, None, :].expand(B, T, R)  # token 0, or 1 where 0 is the label
    dz = z.grad[..., :V].gather(-1, o[..., None])[..., 0]
    occ = (dz / p.gather(-1, o[..., None])[..., 0]).abs()
    left = (occ < eps).flatten()
    n = left.numel() - left.numel() % 32
    tiles = float(left[:n].view(-1, 32).all(-1).double().mean()) if n else 0.0
    return float(left.double().mean()), tiles


def joint_skip_main(args, device):
    """The --joint-skip table: skip_below against the exact fused step."""
    eps_list = [float(e) for e in args.joint_skip.split(",") if e]
    names = [n for n in (args.joint or "base-joint").split(",") if n]
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    print("warp_tdt %s (library %s), torch %s, device %s, %d threads" % (
        warp_tdt.__version__, warp_tdt.library_version(), torch.__version__, device,
        torch.get_num_threads()))
    print("skip_below against the exact fused step (forward+backward, reduction sum, relu); "
          "err = normwise relative error of each gradient (enc, pred, weight, bias) against the "
          "exact one; nodes = the fraction the rule leaves out, tiles32 = of whole tiles of 32 "
          "consecutive nodes (the GPU tiles' unit of saved work); peaked: weight x %g"
          % args.joint_peak)
    print("%-14s %-8s %-7s %9s %9s %7s %9s %7s %7s  %s" % (
        "shape", "dtype", "inputs", "eps", "ms", "x exact", "x unfused", "nodes", "tiles32",
        "err enc/pred/W/bias"))
    for name in names:
        shape = JOINT_SHAPES[name]
        V = shape[4]
        for dn in args.dtypes.split(","):
            dtype = DTYPES[dn]
            for kind, scale in (("random", 1.0), ("peaked", args.joint_peak)):
                params, idx = make_joint_inputs(shape, dtype, device)
                with torch.no_grad():
                    params[2].mul_(scale)
                leaves = [x.detach().clone().requires_grad_(True) for x in params]

                def step(eps):
                    for x in leaves:
                        x.grad = None
                    loss = warp_tdt.tdt_joint_loss(*leaves, *idx, V - 1, DURATIONS,
                                                   activation="relu", reduction="sum",
                                                   skip_below=eps, validate=VALIDATE)
                    loss.backward()
                    return [x.grad.detach().double().clone() for x in leaves]

                exact = step(0.0)
                ms0 = time_step(lambda: step(0.0), device, args.iters, warmup=1)
                try:  # the unfused path on the same inputs, where it fits
                    msu = time_step(lambda: joint_step("unfused", leaves, idx, V), device,
                                    args.iters, warmup=1)
                except RuntimeError:  # out of memory
                    msu = float("nan")
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                print("%-14s %-8s %-7s %9s %9.2f %7s %9.2f %7s %7s   unfused %.2f ms" % (
                    name, dn, kind, "0 (exact)", ms0, "1.00", ms0 / msu, "0", "0", msu))
                for eps in eps_list:
                    got = step(eps)
                    ms = time_step(lambda: step(eps), device, args.iters, warmup=1)
                    errs = ["%.1e" % float((a - b).norm() / (b.norm() + 1e-30))
                            for a, b in zip(got, exact)]
                    fn, ft = joint_skipped(params, idx, V, eps)
                    print("%-14s %-8s %-7s %9.0e %9.2f %7.2f %9.2f %7.3f %7.3f  %s" % (
                        name, dn, kind, eps, ms, ms / ms0, ms / msu, fn, ft, "/".join(errs)))
                    sys.stdout.flush()
    return 0


def joint_main(args, device):
    """The --joint table."""
    shapes = [(n, JOINT_SHAPES[n]) for n in args.joint.split(",") if n]
    if args.joint_shape:
        B, T, U, H, V = (int(v) for v in args.joint_shape.split(","))
        shapes.append(("custom", (B, T, U, H, V, False)))
    thread_list = [0]
    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        thread_list = ([int(t) for t in args.joint_threads.split(",")] if args.joint_threads
                       else [args.threads if args.threads > 0 else cores])
    print("warp_tdt %s (library %s), torch %s, device %s" % (
        warp_tdt.__version__, warp_tdt.library_version(), torch.__version__,
        device if device.type == "cpu" else "%s (%s)" % (device, torch.cuda.get_device_name(device))))
    print("fused = warp_tdt.tdt_joint_loss%s; unfused = the joint's logits in PyTorch, then "
          "warp_tdt.tdt_loss_joint; forward+backward through autograd, reduction sum, relu, no "
          "dropout; durations %s"
          % ("" if device.type == "cpu" else
             " (GPU schedule %s: TDT_GPU_JOINT)"
             % (os.environ.get("TDT_GPU_JOINT") or "default, gemm where cuBLASLt loads"),
             DURATIONS))
    print("peak = extra memory of one step (%s); pk-grads = the fused peak less the four "
          "gradients' bytes; ws = the fused workspace; logits = the unfused "
          "logits tensor (its gradient is as large again); GFLOP/s of 4 x 2 x nodes x H x (V+D); "
          "x gemm = against one plain GEMM of the same shape (bfloat16 on CUDA, the run's dtype on the "
          "CPU), this run"
          % ("torch.cuda.max_memory_allocated over the step" if device.type == "cuda"
             else "growth of the peak resident set (VmHWM) over one step, in a fresh subprocess"))
    head = "%-14s %-8s %3s %10s %10s %7s %10s %10s %9s %8s %8s %9s %9s %9s %7s" % (
        "shape", "dtype", "thr", "fused ms", "unfused ms", "speedup", "fused pk", "unfused pk",
        "pk-grads", "ws MB", "logitMB", "fused GF", "unfus GF", "gemm GF", "x gemm")
    print(head + "  check")
    rows = []
    for threads in thread_list:
        if device.type == "cpu":
            torch.set_num_threads(threads)
        for name, shape in shapes:
            for dn in args.dtypes.split(","):
                dtype = DTYPES[dn]
                if dtype not in JOINT_DTYPES_ONLY.get(name, (dtype,)):
                    continue
                row = bench_joint(name, shape, dtype, device, args, threads)
                rows.append(row)

                def f(key, fmt):
                    v = row.get(key)
                    return fmt % v if isinstance(v, float) else "-"

                beyond = (row["fused_peak_mb"] - row["grads_mb"]
                          if isinstance(row.get("fused_peak_mb"), float) else None)
                line = "%-14s %-8s %3s %10s %10s %7s %10s %10s %9s %8s %8s %9s %9s %9s %7s" % (
                    name, row["dtype"], threads or "-", f("fused_ms", "%.2f"),
                    f("unfused_ms", "%.2f"),
                    "%.2fx" % (row["unfused_ms"] / row["fused_ms"]) if "unfused_ms" in row else "-",
                    f("fused_peak_mb", "%.1f MB"), f("unfused_peak_mb", "%.1f MB"),
                    "%.1f MB" % beyond if beyond is not None else "-", f("ws_mb", "%.1f"), f("logits_mb", "%.1f"), f("fused_gflops", "%.1f"),
                    f("unfused_gflops", "%.1f"), f("gemm_gflops", "%.1f"),
                    "%.2f" % (row["fused_gflops"] / row["gemm_gflops"])
                    if "gemm_gflops" in row else "-")
                print(line + "  " + row["verdict"])
                sys.stdout.flush()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if args.plot:
        joint_plot(rows, args.plot, device if device.type == "cpu"
                   else torch.cuda.get_device_name(device))
    return 0 if all(r["ok"] for r in rows) else 1


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (and a line saying so) where it is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot written")
        return None
    return plt


def joint_plot(rows, path, device):
    """The --joint table as a PNG: forward+backward time (left) and peak extra memory (right),
    log scales, of the fused and the unfused path per shape and dtype; a shape the unfused path
    cannot run shows the fused bars alone."""
    plt = pyplot()
    if plt is None:
        return
    rows = [r for r in rows if r["ok"]]
    labels = ["%s\n%s%s" % (r["shape"], r["dtype"], "\n%d thr" % r["threads"] if r["threads"] else "")
              for r in rows]
    xs = list(range(len(rows)))
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(rows)), 4.5))
    for ax, key, unit in ((axes[0], "ms", "forward+backward, ms (log)"),
                          (axes[1], "peak_mb", "peak extra memory, MB (log)")):
        for i, (path_name, label) in enumerate((("fused", "fused (tdt_joint_loss)"),
                                                ("unfused", "unfused (PyTorch joint + tdt_loss_joint)"))):
            vals = [r.get("%s_%s" % (path_name, key)) or 0 for r in rows]
            bars = ax.bar([x + (i - 0.5) * 0.4 for x in xs], vals, 0.4, label=label)
            for b, v in zip(bars, vals):
                if v:
                    ax.annotate("%.0f" % v if v >= 10 else "%.1f" % v, (b.get_x() + b.get_width() / 2, v),
                                ha="center", va="bottom", fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel(unit)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=7)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("warp_tdt fused joint + TDT loss against the unfused path, %s" % device, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print("plot written to %s" % path)


def plot(rows, path, device):
    plt = pyplot()
    if plt is None:
        return
    rows = [r for r in rows if r["ok"]]
    labels = ["%s\n%s" % (r["shape"], r["dtype"]) for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
    series = [("warp_tdt, a step waited for", [r["ms"] for r in rows])]
    if any(r.get("loop_ms") for r in rows):
        series.append(("warp_tdt, steps back to back", [r.get("loop_ms") or 0 for r in rows]))
    if any(r.get("graph_ms") for r in rows):
        series.append(("warp_tdt in a CUDA graph", [r.get("graph_ms") or 0 for r in rows]))
    if any(r.get("graph_loop_ms") for r in rows):
        series.append(("warp_tdt in a CUDA graph, replays back to back",
                       [r.get("graph_loop_ms") or 0 for r in rows]))
    series.append(("floor (3 x logits / copy BW)", [r["floor_ms"] for r in rows]))
    for n, label in (("torch", "pure-PyTorch vectorised loss"),
                     ("transformers", "transformers PyTorch loss")):
        vals = [r["base"].get(n) for r in rows]
        if any(isinstance(v, float) for v in vals):
            series.append((label, [v if isinstance(v, float) else 0 for v in vals]))
    w = 0.8 / len(series)
    for i, (label, vals) in enumerate(series):
        ax.bar([x + (i - (len(series) - 1) / 2) * w for x in xs], vals, w, label=label)
    ax.set_yscale("log")
    ax.set_ylabel("forward+backward, ms (log)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_title("warp_tdt TDT loss on %s, logits as joint slices" % device)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print("plot written to %s" % path)


if __name__ == "__main__":
    sys.exit(main())
