"""Benchmark of warp_tdt through PyTorch: forward+backward through autograd with the logits as
the two slices of one joint (B, T, U+1, V+D) tensor, as a Parakeet training step does.

For each named shape of shared/TARGETS.md (or --shape B,T,U,V) and dtype it
  1. checks the result first: CUDA results against the same library's CPU backend (costs and the
     joint gradient), CPU results against a float64 run; a wrong answer prints FAILED, no time;
  2. times forward+backward with CUDA events (median over --iters, after warm-up), and the peak
     extra memory from torch's allocator in multiples of the logits' bytes;
  3. times the PyTorch TDT loss of transformers (when installed) on the same inputs, for scale;
  4. prints ms, effective GB/s, the floor (3 x logits bytes over a device copy measured in the same
     run) and the ratio to it; --plot writes a PNG (time per shape: ours, the floor, the baseline).

    PYTHONPATH=pytorch_binding WARP_TDT_LIBRARY=build/libwarptdt.so \\
        python3 benchmark/bench.py --device cuda --shapes parakeet,base --dtypes float32,bfloat16
"""

import argparse
import statistics
import sys
import time

import torch

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
        from transformers.loss.loss_tdt import tdt_loss
    except Exception:  # not installed, or an older transformers
        return None
    return tdt_loss


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


def copy_bandwidth(device):
    """Bytes read + written per second of a large device copy (the floor's denominator)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 28)
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_step(lambda: dst.copy_(src), device, 10)
    return 2 * n / (ms * 1e-3)


def check(joint, targets, T_b, U_b, V, device, dtype):
    """Our costs and joint gradient against the CPU backend (CUDA runs) or float64 (CPU runs)."""
    x = joint.detach().clone().requires_grad_(True)
    loss = ours(x, targets, T_b, U_b, V, reduction="none")
    loss.sum().backward()
    ref_dtype = dtype if device.type == "cuda" else torch.float64
    r = joint.detach().to("cpu", ref_dtype).requires_grad_(True)
    ref = ours(r, targets.cpu(), T_b.cpu(), U_b.cpu(), V, reduction="none")
    ref.sum().backward()
    cost_err = ((loss.detach().cpu().double() - ref.detach().double()).abs()
                / ref.detach().double().abs()).max().item()
    rel = {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 1.6e-2)
    g, rg = x.grad.cpu().double(), r.grad.double()
    grad_err = ((g - rg).abs() / (rel * rg.abs() + 1e-6)).max().item()
    ok = cost_err < (1e-10 if dtype == torch.float64 else 2e-5) and grad_err <= 1.0
    return ok, "%s (cost rel %.1e, grad err/tol %.2f)" % ("ok" if ok else "FAILED", cost_err, grad_err)


def bench(name, shape, dtype, device, args, baseline, floor_bw):
    B, T, U, V, _ = shape
    joint, targets, T_b, U_b = make_inputs(shape, dtype, device)
    logits_bytes = joint.numel() * joint.element_size()
    ok, verdict = check(joint, targets, T_b, U_b, V, device, dtype)
    row = {"shape": name, "dtype": str(dtype).replace("torch.", ""), "ok": ok, "verdict": verdict,
           "floor_ms": 3 * logits_bytes / floor_bw * 1e3}
    if not ok:
        return row
    x = joint.detach().clone().requires_grad_(True)

    def step():
        x.grad = None
        ours(x, targets, T_b, U_b, V).backward()

    row["ms"] = time_step(step, device, args.iters)
    if device.type == "cuda":
        x.grad = None
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        row["peak_x"] = (torch.cuda.max_memory_allocated(device) - before) / logits_bytes
    row["gbs"] = 3 * logits_bytes / (row["ms"] * 1e-3) * 1e-9
    if baseline is not None and name in args.baseline_shapes and dtype != torch.float64:
        y = joint.detach().clone().requires_grad_(True)

        def base_step():
            y.grad = None
            baseline(y[..., :V], y[..., V:], targets, T_b, U_b, blank_token_id=V - 1,
                     durations=DURATIONS, reduction="sum").backward()

        row["baseline_ms"] = time_step(base_step, device, args.baseline_iters, warmup=1)
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
                   help="shapes on which to time transformers' PyTorch loss (it takes ~1 s a call)")
    p.add_argument("--plot", help="write a PNG plot here")
    p.add_argument("--no-validate", action="store_true",
                   help="time tdt_loss(..., validate=False): no host synchronisation at all")
    args = p.parse_args()
    global VALIDATE
    VALIDATE = not args.no_validate
    args.baseline_shapes = set(args.baseline_shapes.split(","))
    device = torch.device(args.device)
    shapes = [(n, SHAPES[n]) for n in args.shapes.split(",") if n]
    if args.shape:
        B, T, U, V = (int(v) for v in args.shape.split(","))
        shapes.append(("custom", (B, T, U, V, False)))
    baseline = transformers_loss()
    floor_bw = copy_bandwidth(device)
    print("warp_tdt %s (library %s), torch %s, device %s%s" % (
        warp_tdt.__version__, warp_tdt.library_version(), torch.__version__, device,
        (" (" + torch.cuda.get_device_name(device) + ")") if device.type == "cuda" else ""))
    print("copy bandwidth %.0f GB/s (read + write); validate=%s; baseline: %s" % (
        floor_bw * 1e-9, VALIDATE, "transformers.loss.loss_tdt.tdt_loss" if baseline else "none (transformers missing)"))
    print("%-9s %-9s %9s %8s %9s %7s %7s %12s  %s" % ("shape", "dtype", "ms", "GB/s", "floor ms",
                                                     "x floor", "peak", "baseline ms", "check"))
    rows = []
    for name, shape in shapes:
        for dn in args.dtypes.split(","):
            dtype = DTYPES[dn]
            if name == "huge" and dtype != torch.bfloat16:
                continue
            if name in ("huge", "large") and device.type == "cpu":
                continue
            row = bench(name, shape, dtype, device, args, baseline, floor_bw)
            rows.append(row)
            if row["ok"]:
                print("%-9s %-9s %9.3f %8.0f %9.3f %7.2f %7s %12s  %s" % (
                    name, row["dtype"], row["ms"], row["gbs"], row["floor_ms"],
                    row["ms"] / row["floor_ms"], "%.2fx" % row["peak_x"] if "peak_x" in row else "-",
                    "%.1f" % row["baseline_ms"] if "baseline_ms" in row else "-", row["verdict"]))
            else:
                print("%-9s %-9s %9s %8s %9.3f %7s %7s %12s  %s" % (name, row["dtype"], "-", "-",
                                                                    row["floor_ms"], "-", "-", "-",
                                                                    row["verdict"]))
            sys.stdout.flush()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.plot:
        plot(rows, args.plot, str(device))
    return 0 if all(r["ok"] for r in rows) else 1


def plot(rows, path, device):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot written")
        return
    rows = [r for r in rows if r["ok"]]
    labels = ["%s\n%s" % (r["shape"], r["dtype"]) for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
    w = 0.27
    ax.bar([x - w for x in xs], [r["ms"] for r in rows], w, label="warp_tdt")
    ax.bar(list(xs), [r["floor_ms"] for r in rows], w, label="floor (3 x logits / copy BW)")
    ax.bar([x + w for x in xs], [r.get("baseline_ms", 0) for r in rows], w,
           label="transformers PyTorch loss")
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
