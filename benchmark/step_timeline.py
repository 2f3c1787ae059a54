"""Where an eager training step's time goes on the GPU: its kernels, the GPU's idle gaps
between them, and what the host was doing when each gap began.

Below `large` an eager step through the binding takes longer than its kernels (docs/
performance.md, "The binding's host time"): the GPU idles somewhere in each step. host_step.py measures the host's
time; this script finds the idle time on the GPU's own timeline. For each shape and dtype it

  1. checks the step's costs and joint gradient against the CPU backend (bench.check), and
     prints nothing more for a wrong answer;
  2. runs --steps steps back to back (bench.py's "back to back": x.grad = None, the loss with
     reduction="sum", backward; no host wait between steps but the binding's own) under
     torch.profiler twice:
       "gpu"  CUDA activity alone (the kernels and the runtime's calls; the host runs at its
              unprofiled pace): the step's span on the GPU, its kernels' busy time, and the
              idle gaps by the pair of kernels around them;
       "host" the host's ops too, with marks around the step, the loss call, the backward
              call and, inside the binding, each library call, LossFunction's forward and
              backward, and the wait for the check's verdict (each mark costs the host ~1 us,
              so this pass runs slower than "gpu"): for each gap pair, how often the kernel
              after it was launched only after the gap began (the GPU waited for the host),
              and the innermost mark the host was in at the gap's start;
  3. with --trace DIR, writes both passes' chrome traces there (chrome://tracing, Perfetto).

Nothing is asserted: the numbers say where to look.

    PYTHONPATH=pytorch_binding WARP_TDT_LIBRARY=build/libwarptdt.so \\
        python3 benchmark/step_timeline.py --shapes base,ragged --dtypes float32 --trace /tmp/tl
"""

import argparse
import bisect
import collections
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import bench  # this folder: shapes, inputs, the step and its check
from warp_tdt import _autograd, _core

_GPU_CATS = ("kernel", "gpu_memset", "gpu_memcpy")
_MIN_GAP_US = 0.5  # shorter gaps are the hardware's own kernel-to-kernel latency


def _marked(fn, name):
    def wrapper(*args, **kwargs):
        with record_function(name(args) if callable(name) else name):
            return fn(*args, **kwargs)
    return wrapper


def _mark_binding():
    """record_function marks around the binding's parts, in place (the "host" pass's only)."""
    saved = (_core._call, _core.validation_finish, _autograd.LossFunction.forward,
             _autograd.LossFunction.backward)
    _core._call = _marked(_core._call, lambda a: "lib " + a[0])
    _core.validation_finish = _marked(_core.validation_finish, "check wait")
    _autograd.LossFunction.forward = staticmethod(
        _marked(saved[2], "LossFunction.forward"))
    _autograd.LossFunction.backward = staticmethod(
        _marked(saved[3], "LossFunction.backward"))
    return saved


def _unmark_binding(saved):
    _core._call, _core.validation_finish = saved[0], saved[1]
    _autograd.LossFunction.forward = staticmethod(saved[2])
    _autograd.LossFunction.backward = staticmethod(saved[3])


def _short(name, width=34):
    """A kernel's name without its template arguments and parameters."""
    name = name.replace("(anonymous namespace)::", "").replace("void ", "")
    for cut in ("<", "("):
        if cut in name:
            name = name[:name.index(cut)]
    name = name.split("::")[-1]
    return name if len(name) <= width else name[:width - 2] + ".."


def _trace(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _profile(step, steps, activities, trace_path, marks):
    torch.cuda.synchronize()
    saved = _mark_binding() if marks else None
    try:
        with profile(activities=activities) as prof:
            for _ in range(steps):
                if marks:
                    with record_function("step"):
                        step(marks)
                else:
                    step(marks)
            torch.cuda.synchronize()
    finally:
        if saved is not None:
            _unmark_binding(saved)
    prof.export_chrome_trace(trace_path)
    return _trace(trace_path)


def _kernels(events):
    ks = [e for e in events if e.get("ph") == "X" and e.get("cat") in _GPU_CATS]
    ks.sort(key=lambda e: float(e["ts"]))
    return ks


def _gpu_summary(events, steps):
    """(span us a step, busy us a step, {kernel: (count, us) a step}, {(before, after): [gaps]})."""
    ks = _kernels(events)
    if not ks:
        return None
    start = float(ks[0]["ts"])
    end = max(float(k["ts"]) + float(k["dur"]) for k in ks)
    busy = 0.0
    reach = start
    per = collections.defaultdict(lambda: [0, 0.0])
    gaps = collections.defaultdict(list)
    prev = None
    for k in ks:
        t0, dur = float(k["ts"]), float(k["dur"])
        name = _short(k["name"])
        per[name][0] += 1
        per[name][1] += dur
        if t0 > reach:
            if prev is not None and t0 - reach >= _MIN_GAP_US:
                gaps[(prev, name)].append((reach, t0, k))
            busy += dur
        else:
            busy += max(0.0, t0 + dur - reach)
        reach = max(reach, t0 + dur)
        prev = name
    kern = {n: (c / steps, us / steps) for n, (c, us) in per.items()}
    return (end - start) / steps, busy / steps, kern, gaps


def _host_index(events):
    """The launches by correlation id (host ts), and the marks as (start, end, name) sorted."""
    launch = {}
    marks = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launch[corr] = float(e["ts"])
        elif cat == "user_annotation":
            t0 = float(e["ts"])
            marks.append((t0, t0 + float(e["dur"]), e["name"]))
    marks.sort()
    return launch, marks


def _innermost(marks, starts, t):
    """The shortest mark covering host time t, or "(no mark)"."""
    best = None
    i = bisect.bisect_right(starts, t)
    for j in range(i - 1, max(-1, i - 400), -1):
        s, e, name = marks[j]
        if s <= t <= e and (best is None or e - s < best[1] - best[0]):
            best = (s, e, name)
    return best[2] if best else "(no mark)"


def _report(title, summary, steps, events=None, top=12):
    span, busy, kern, gaps = summary
    print("  %s pass: %.1f us a step from the first kernel to the last, the GPU busy %.1f us "
          "(%.0f %%), idle %.1f" % (title, span, busy, 100 * busy / span, span - busy))
    if events is None:
        print("    %-36s %8s %10s" % ("kernel", "a step", "us a step"))
        for name, (c, us) in sorted(kern.items(), key=lambda kv: -kv[1][1]):
            print("    %-36s %8.2f %10.1f" % (name, c, us))
    launch = marks = starts = None
    if events is not None:
        launch, marks = _host_index(events)
        starts = [m[0] for m in marks]
    rows = sorted(gaps.items(), key=lambda kv: -sum(g[1] - g[0] for g in kv[1]))[:top]
    print("    %-62s %7s %9s %9s%s" % ("idle gap: kernel before -> kernel after", "a step",
                                      "mean us", "us a step",
                                      "  after-launch  host at the gap's start" if events else ""))
    for (before, after), gs in rows:
        total = sum(g[1] - g[0] for g in gs)
        line = "    %-62s %7.2f %9.1f %9.1f" % ("%s -> %s" % (before, after), len(gs) / steps,
                                                 total / len(gs), total / steps)
        if events is not None:
            late = 0
            where = collections.Counter()
            for g0, _g1, k in gs:
                t = launch.get((k.get("args") or {}).get("correlation"))
                if t is not None and t > g0:
                    late += 1
                where[_innermost(marks, starts, g0)] += 1
            name, n = where.most_common(1)[0]
            line += "  %5.0f %%       %s (%d of %d)" % (100.0 * late / len(gs), name, n, len(gs))
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="base,ragged")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--no-validate", action="store_true", help="tdt_loss(..., validate=False)")
    ap.add_argument("--trace", metavar="DIR", help="write the chrome traces here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("step_timeline.py profiles CUDA steps; no GPU here")
    bench.VALIDATE = not args.no_validate
    device = torch.device("cuda")
    out = args.trace or tempfile.mkdtemp(prefix="step_timeline_")
    os.makedirs(out, exist_ok=True)
    print("torch %s, %s, %d steps a pass, validate=%s"
          % (torch.__version__, torch.cuda.get_device_name(), args.steps, bench.VALIDATE))
    for shape in args.shapes.split(","):
        for dname in args.dtypes.split(","):
            dtype = bench.DTYPES[dname]
            B, T, U, V, _ = bench.SHAPES[shape]
            joint, targets, T_b, U_b = bench.make_inputs(bench.SHAPES[shape], dtype, device)
            ok, verdict, _l, _g = bench.check(joint, targets, T_b, U_b, V, device, dtype)
            print("\n%s %s: %s" % (shape, dname, verdict))
            if not ok:
                continue
            del _l, _g
            x = joint.detach().clone().requires_grad_(True)

            def step(marks):
                x.grad = None
                if marks:
                    with record_function("loss()"):
                        loss = bench.ours(x, targets, T_b, U_b, V)
                    with record_function("backward()"):
                        loss.backward()
                else:
                    bench.ours(x, targets, T_b, U_b, V).backward()

            for _ in range(10):
                step(False)
            base = os.path.join(out, "%s_%s" % (shape, dname))
            gpu = _profile(step, args.steps, [ProfilerActivity.CUDA], base + "_gpu.json", False)
            summary = _gpu_summary(gpu, args.steps)
            if summary is None:
                print("  no kernel in the trace (is CUPTI there?)")
                continue
            _report("gpu", summary, args.steps)
            host = _profile(step, args.steps, [ProfilerActivity.CPU, ProfilerActivity.CUDA],
                            base + "_host.json", True)
            hsum = _gpu_summary(host, args.steps)
            if hsum is not None:
                _report("host", hsum, args.steps, host)
    print("\ntraces in %s" % out)


if __name__ == "__main__":
    main()
