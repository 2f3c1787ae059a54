"""Writes an earlier revision's binding as a package of another name, for host_step.py --baseline.

    python3 benchmark/baseline_binding.py eea6a9a /tmp/baseline            # -> /tmp/baseline/warp_tdt_old
    PYTHONPATH=pytorch_binding:/tmp/baseline WARP_TDT_LIBRARY=build/libwarptdt.so \\
        python3 benchmark/host_step.py --baseline warp_tdt_old

The package is pytorch_binding/warp_tdt at that revision (git archive of this repository),
renamed, with its torch.compile custom ops moved to a namespace of the same name, so that both
bindings import into one process and their steps interleave there (the H200 host's drift between
processes is larger than the differences these A/Bs look for: docs/performance.md, "How to measure"). Both
load the library WARP_TDT_LIBRARY names. The library reads its whole tdt_options_t from the
caller's memory, which grows at its end from version to version (every field's zero its
default): the older package's ctypes Options is given 256 zero bytes at its end, so a newer
library reads the fields that package does not know as their defaults.
"""

import argparse
import io
import os
import subprocess
import sys
import tarfile


def _zero_tail(text):
    """_lib.py with 256 zero bytes appended to class Options's fields (see the docstring)."""
    at = text.index("class Options(ctypes.Structure):")
    end = text.index("\n    ]\n", at)
    return (text[:end] + "\n        (\"_newer_fields_zero\", ctypes.c_char * 256),"
            + text[end:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("revision", help="a git revision of this repository")
    ap.add_argument("outdir", help="where the package directory goes")
    ap.add_argument("--name", default="warp_tdt_old", help="the package's name (default warp_tdt_old)")
    args = ap.parse_args()
    if not args.name.isidentifier() or args.name == "warp_tdt":
        raise SystemExit("--name must be a Python identifier other than warp_tdt, got %r" % args.name)
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    tar = subprocess.run(["git", "archive", args.revision, "pytorch_binding/warp_tdt"],
                         capture_output=True, cwd=root)
    if tar.returncode != 0:
        raise SystemExit(tar.stderr.decode().strip() or "git archive failed")
    dest = os.path.join(args.outdir, args.name)
    if os.path.exists(dest):
        raise SystemExit("%s exists; remove it first" % dest)
    os.makedirs(dest)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        for m in t.getmembers():
            if not m.isfile() or not m.name.endswith(".py"):
                continue
            text = t.extractfile(m).read().decode()
            # the custom ops' namespace: torch.library.custom_op("warp_tdt::...") and
            # torch.ops.warp_tdt.*, which two bindings in one process may not share
            text = text.replace('"warp_tdt::', '"%s::' % args.name)
            text = text.replace("torch.ops.warp_tdt.", "torch.ops.%s." % args.name)
            if os.path.basename(m.name) == "_lib.py":
                text = _zero_tail(text)
            with open(os.path.join(dest, os.path.basename(m.name)), "w") as f:
                f.write(text)
    print(dest)


if __name__ == "__main__":
    sys.exit(main())
