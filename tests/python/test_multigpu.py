"""Two GPUs in one process: the tensors' own device and stream decide, not the current device."""

import pytest
import torch

import reference as R
from helpers import lib_tdt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs two CUDA devices")


def test_inputs_on_cuda1_while_cuda0_is_current():
    case = R.random_case(B=3, T=12, U=5, V=20, seed=91)
    with torch.cuda.device(0):
        ref = lib_tdt(case, "cuda:0", torch.float64, "joint", "mean")
        got = lib_tdt(case, "cuda:1", torch.float64, "joint", "mean")
        assert torch.cuda.current_device() == 0
    for x, y in zip(got, ref):
        assert torch.equal(x, y)


def test_inputs_on_cuda1_on_a_side_stream():
    case = R.random_case(B=3, T=12, U=5, V=20, seed=92)
    ref = lib_tdt(case, "cuda:0", torch.float32, "joint", "sum")
    side = torch.cuda.Stream(device=1)
    with torch.cuda.device(0):
        side.wait_stream(torch.cuda.current_stream(1))
        with torch.cuda.stream(side):
            got = lib_tdt(case, "cuda:1", torch.float32, "joint", "sum")
        side.synchronize()
    for x, y in zip(got, ref):
        assert torch.equal(x, y)
