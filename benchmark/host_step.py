"""Where an eager training step's host time goes, through the binding on a GPU.

Below `large`, an eager step's time on the H200 is the host's: the kernels take 0.17-0.52 ms,
the host's Python, autograd and CUDA calls as long or longer (docs/performance.md, "The binding's host time"). This
script measures that host time for one shape at a time, with no claim about the kernels:

  1. variants, their rounds interleaved so the host's drift hits each alike:
       default      tdt_loss(..., reduction="mean"), targets and lengths int64 on the device
       sum          reduction="sum"
       no-validate  validate=False (no check of lengths and labels, so no wait for its flag)
       noop         a do-nothing torch.autograd.Function over the same joint tensor, whose
                    backward returns an empty joint-shaped gradient: what torch alone costs
     and for each, per step: "loop" (CUDA events around --steps steps enqueued back to back, as
     bench.py's "back to back"), "host" (the host's wall time for the same steps, before the
     final synchronisation: what the host spends enqueueing them);
  2. the library's own share: the host time inside each ctypes call (tdt_forward,
     tdt_backward, tdt_forward_ahead, tdt_scale_gradients, tdt_pack_indices), per step; and two
     of the binding's functions around them: pack_indices() (the Python that builds the
     tdt_pack_indices call, the call itself included) and validation_finish() (the wait for the
     check's verdict, and reading it);
     --baseline NAME adds the three loss variants of another copy of the binding, imported as
     package NAME (an earlier tree's pytorch_binding/warp_tdt renamed, its custom ops' namespace
     too: `benchmark/baseline_binding.py REV DIR` writes one), interleaved with ours in the same
     process: an A/B that the host's drift between processes (2x on the H200's host) cannot
     blur;
  3. with --profile, torch.profiler's CPU ops of --steps default steps, by self time, and
     cProfile's Python functions of as many more, by their own time.

Every variant's loss is first checked against the default's (same costs, same gradient to the
bit, for the loss variants; the sum against the mean times the batch's label counts).

    PYTHONPATH=pytorch_binding WARP_TDT_LIBRARY=build/libwarptdt.so \\
        python3 benchmark/host_step.py --shapes base,ragged --rounds 5 --profile
"""

import argparse
import cProfile
import pstats
import statistics
import sys
import time

import importlib

import torch

import warp_tdt
from warp_tdt import _core

import bench  # this folder: shapes and inputs

_lib_time = {}  # entry point -> seconds spent inside it


def _timed(fn, name):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            key = name(args)
            _lib_time[key] = _lib_time.get(key, 0.0) + time.perf_counter() - t0
    return wrapper


def _instrument():
    """Times every library entry point the binding calls, in place."""
    _core._call = _timed(_core._call, lambda a: a[0])
    for name in ("pack_indices", "pack_request", "validation_finish"):
        if hasattr(_core, name):
            setattr(_core, name, _timed(getattr(_core, name), lambda a, n=name: n + "()"))


class _Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, joint):
        ctx.save_for_backward(joint)
        return joint.new_zeros(())

    @staticmethod
    def backward(ctx, grad):
        (joint,) = ctx.saved_tensors
        return torch.empty_like(joint)


def _steps(shape, dtype, device, wt=warp_tdt, prefix=""):
    B, T, U, V, ragged = bench.SHAPES[shape]
    joint, targets, T_b, U_b = bench.make_inputs(bench.SHAPES[shape], dtype, device)
    joint.requires_grad_(True)
    D = len(bench.DURATIONS)

    def loss(reduction="mean", validate=True):
        return wt.tdt_loss(joint[..., :V], joint[..., V:], targets, T_b, U_b,
                           blank_token_id=V - 1, durations=bench.DURATIONS,
                           reduction=reduction, validate=validate)

    def step(**kw):
        joint.grad = None
        loss(**kw).backward()

    def noop():
        joint.grad = None
        _Noop.apply(joint).backward()

    variants = {prefix + "default": lambda: step(), prefix + "sum": lambda: step(reduction="sum"),
                prefix + "no-validate": lambda: step(validate=False)}
    if not prefix:
        variants["noop"] = noop

    # first, the answers: every loss variant against the default
    def grad_of(**kw):
        joint.grad = None
        value = loss(**kw)
        value.backward()
        return value.detach().clone(), joint.grad.clone()

    ref_loss, ref_grad = grad_of()
    v, g = grad_of(validate=False)
    if not (torch.equal(v, ref_loss) and torch.equal(g, ref_grad)):
        raise SystemExit("%s %s: validate=False differs from the default" % (shape, dtype))
    v, _ = grad_of(reduction="sum")
    costs = warp_tdt.tdt_loss(joint[..., :V].detach(), joint[..., V:].detach(), targets, T_b, U_b,
                              blank_token_id=V - 1, durations=bench.DURATIONS, reduction="none")
    want = (costs / U_b).mean()
    if not torch.allclose(ref_loss.double(), want.double(), rtol=1e-6):
        raise SystemExit("%s %s: mean %r against %r from the costs" % (shape, dtype, ref_loss, want))
    if not torch.allclose(v.double(), costs.sum().double(), rtol=1e-6):
        raise SystemExit("%s %s: sum %r against %r from the costs" % (shape, dtype, v, costs.sum()))
    joint.grad = None
    return variants


def _measure(fn, steps):
    """(loop ms a step, host ms a step) of `steps` calls enqueued back to back."""
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / steps
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / steps, host


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default="base,ragged,parakeet")
    ap.add_argument("--dtype", default="float32", choices=sorted(bench.DTYPES))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--baseline", default=None, metavar="NAME",
                    help="another copy of the binding, as package NAME, interleaved with ours")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_step.py measures CUDA steps; no GPU here")
    device = torch.device("cuda")
    dtype = bench.DTYPES[args.dtype]
    _instrument()
    print("warp-tdt %s, torch %s, %s; %d steps a round, %d rounds, medians (min)"
          % (warp_tdt.library_version(), torch.__version__, torch.cuda.get_device_name(),
             args.steps, args.rounds))
    other = importlib.import_module(args.baseline) if args.baseline else None
    for shape in args.shapes.split(","):
        variants = _steps(shape, dtype, device)
        if other is not None:
            variants.update(_steps(shape, dtype, device, other, args.baseline + ":"))
        for fn in variants.values():  # warm-up: caches, allocator, plans
            for _ in range(5):
                fn()
        loops = {k: [] for k in variants}
        hosts = {k: [] for k in variants}
        lib = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                _lib_time.clear()
                loop, host = _measure(fn, args.steps)
                loops[name].append(loop)
                hosts[name].append(host)
                lib[name].append(dict((k, v * 1e6 / args.steps) for k, v in _lib_time.items()))
        print("\n%s %s" % (shape, args.dtype))
        print("  %-20s %16s %16s   library calls, us a step (median)" % ("variant", "loop ms", "host ms"))
        for name in variants:
            calls = sorted(set(k for d in lib[name] for k in d))
            inside = ", ".join("%s %.1f" % (k, statistics.median(d.get(k, 0.0) for d in lib[name]))
                               for k in calls)
            print("  %-20s %7.3f (%.3f) %7.3f (%.3f)   %s"
                  % (name, statistics.median(loops[name]), min(loops[name]),
                     statistics.median(hosts[name]), min(hosts[name]), inside or "-"))
        if args.profile:
            fn = variants["default"]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    fn()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
            py = cProfile.Profile()
            py.enable()
            for _ in range(args.steps):
                fn()
            py.disable()
            torch.cuda.synchronize()
            pstats.Stats(py).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
