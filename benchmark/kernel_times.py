"""Where a program's GPU time goes, kernel by kernel, from Nsight Compute's per-launch durations:
the total, the launch count and the mean of each kernel (by name, its template arguments kept),
largest first, and each one's share of the whole.

For machines without Nsight Systems (the device tool's, for one). Record the durations with

    ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM ARGS > times.csv

then

    python3 benchmark/kernel_times.py times.csv [--runs N] [--width W]

--runs divides every total by N: the number of times the program ran the step that matters
(joint_gpu_bench --iters 1 runs each case twice, a warm-up and the timed run, and times the
forward alone before forward+backward). Lines of the file that are not ncu's CSV rows (the
program's own output, ncu's notes) are skipped. Nothing here needs more than the standard
library.
"""

import argparse
import csv
import signal
import sys

METRIC = "gpu__time_duration.sum"
TO_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}


def kernel_times(lines):
    """{kernel name: [launches, total ms]} in first-seen order, from ncu CSV lines."""
    rows = csv.DictReader(line for line in lines if line.startswith('"'))
    out = {}
    for row in rows:
        if row.get("Metric Name") != METRIC:
            continue
        unit = row.get("Metric Unit", "nsecond")
        if unit not in TO_MS:
            raise ValueError("unknown unit %r for %s" % (unit, METRIC))
        ms = float(row["Metric Value"].replace(",", "")) * TO_MS[unit]
        entry = out.setdefault(row["Kernel Name"], [0, 0.0])
        entry[0] += 1
        entry[1] += ms
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="ncu --csv output with the %s metric ('-': standard input)" % METRIC)
    p.add_argument("--runs", type=int, default=1, help="divide the totals by this many runs")
    p.add_argument("--width", type=int, default=90, help="characters of each kernel's name shown")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1, got %d" % args.runs)
    if args.width < 8:
        p.error("--width must be at least 8, got %d" % args.width)
    with (sys.stdin if args.csv == "-" else open(args.csv)) as f:
        times = kernel_times(f)
    if not times:
        print("no %s rows in %s" % (METRIC, args.csv), file=sys.stderr)
        return 1
    total = sum(t for _, t in times.values()) / args.runs
    print("%10s %8s %10s %6s  kernel (per run of %d)" % ("ms", "launches", "mean ms", "share", args.runs))
    for name, (n, t) in sorted(times.items(), key=lambda kv: -kv[1][1]):
        t /= args.runs
        print("%10.3f %8g %10.4f %5.1f%%  %s" % (t, n / args.runs, t / (n / args.runs), 100 * t / total,
                                                 name[:args.width]))
    print("%10.3f %8s %10s %6s  all kernels" % (total, "", "", ""))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    sys.exit(main())
