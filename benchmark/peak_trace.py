"""What is live at the peak of one eager forward+backward step through warp_tdt (CUDA).

For each shape and dtype (bench.py's inputs and step: autograd on the joint tensor's two
slices), three warm steps, then one step recorded by torch's allocation history, measured as
bench.py measures it (peak_memory(): from an empty cache). The trace is replayed to find the
moment the live bytes peak; every allocation live then is printed with its size (in multiples
of the logits' bytes) and where in the binding or autograd it was made, beside the peak torch's
allocator counted (its blocks, which round the sizes asked for) and the bytes asked: bench.py's
"peak" and "asked" columns.

    PYTHONPATH=pytorch_binding WARP_TDT_LIBRARY=build/libwarptdt.so \\
        python3 benchmark/peak_trace.py --shapes base,ragged --dtypes float32,bfloat16
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (this folder's; its shapes, inputs and loss call)


def where(entry):
    """The first three frames of an allocation's stack in the binding, bench or autograd."""
    out = []
    for f in entry.get("frames", []):
        fn = f.get("filename", "")
        if "warp_tdt" in fn or "bench.py" in fn or "autograd" in fn:
            out.append("%s:%s %s" % (os.path.basename(fn), f.get("line"), f.get("name")))
    return " < ".join(out[:3]) or "?"


def live_at_peak(snapshot):
    """The allocations live when the trace's live bytes were highest, and that total."""
    live, cur, best, best_live = {}, 0, -1, {}
    for trace in snapshot["device_traces"]:
        for e in trace:
            if e["action"] == "alloc":
                live[e["addr"]] = e
                cur += e["size"]
            elif e["action"] == "free_requested" and e["addr"] in live:
                cur -= live.pop(e["addr"])["size"]
            if cur > best:
                best, best_live = cur, dict(live)
    return best, sorted(best_live.values(), key=lambda e: -e["size"])


def trace(name, dtype, device):
    V = bench.SHAPES[name][3]
    joint, targets, T_b, U_b = bench.make_inputs(bench.SHAPES[name], dtype, device)
    logits_bytes = joint.numel() * joint.element_size()
    x, step = bench.training_step(joint, targets, T_b, U_b, V)
    del joint
    for _ in range(3):
        step()
    x.grad = None
    torch.cuda.memory._record_memory_history(max_entries=100000)
    counted, asked = bench.peak_memory(step, device)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    total, live = live_at_peak(snapshot)
    print("%s %s: logits %.1f MB; allocator's peak %.4fx (asked %s), live at the traced peak "
          "%.4fx" % (name, str(dtype).replace("torch.", ""), logits_bytes / 1e6,
                     counted / logits_bytes, "-" if asked is None else "%.4fx" % (
                         asked / logits_bytes), total / logits_bytes))
    for e in live:
        print("  %12d B  %.4fx  %s" % (e["size"], e["size"] / logits_bytes, where(e)))
    del x
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="base,parakeet,ragged")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("peak_trace.py: needs a CUDA device")
        return 1
    device = torch.device("cuda")
    for name in args.shapes.split(","):
        for dn in args.dtypes.split(","):
            trace(name, bench.DTYPES[dn], device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
