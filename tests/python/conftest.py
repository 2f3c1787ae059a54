"""pytest setup for the warp_tdt binding tests.

Imports warp_tdt from the source tree (pytorch_binding/) unless WARP_TDT_USE_INSTALLED=1, so the
tests exercise the checkout. The library itself is found the package's way: $WARP_TDT_LIBRARY,
next to the package, or <repo>/build/libwarptdt.so.
"""

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if os.environ.get("WARP_TDT_USE_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(REPO, "pytorch_binding"))
sys.path.insert(0, HERE)

import warp_tdt  # noqa: E402
from warp_tdt import _ops  # noqa: E402

try:
    HAS_CUDA = warp_tdt.cuda_available()
except warp_tdt.LibraryNotFoundError:
    HAS_CUDA = False  # the tests themselves then fail with the search message

CUSTOM_OPS = _ops.AVAILABLE
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA build of libwarptdt and a GPU")
requires_custom_ops = pytest.mark.skipif(
    not CUSTOM_OPS, reason="torch.library.custom_op needs torch >= 2.4 (have %s)" % torch.__version__)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield


def pytest_report_header(config):
    try:
        lib = warp_tdt.library_path()
        ver = warp_tdt.library_version()
    except Exception as e:  # noqa: BLE001 - report, the tests will fail loudly
        lib, ver = "NOT FOUND (%s)" % str(e).splitlines()[0], "-"
    return ["warp_tdt library: %s (version %s); torch %s; CUDA tests: %s; custom ops: %s"
            % (lib, ver, torch.__version__, "on" if HAS_CUDA else "off",
               "on" if CUSTOM_OPS else "off (torch < 2.4)")]
