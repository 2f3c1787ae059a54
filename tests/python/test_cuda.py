"""CUDA backend through the binding: CPU vs GPU on every dtype, layout and option, device
indices, the current stream, CUDA-graph capture, and the GPU's answer to bad data."""

import math

import pytest
import torch

import reference as R
import warp_tdt
from warp_tdt import _core
from conftest import requires_cuda
from helpers import REDUCTIONS, lib_tdt, tolerances

pytestmark = requires_cuda


def _close(a, b, dtype, what):
    tol = tolerances(dtype)
    if dtype == torch.float32:
        tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.double(), b.double(), **tol, msg=lambda m: "%s %s: %s" % (what, dtype, m))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["separate", "joint"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_cpu_vs_cuda(dtype, layout, reduction):
    case = R.random_case(B=4, T=20, U=8, V=50, seed=81)
    case["target_lengths"].clamp_(min=1)
    case["targets"][case["targets"] < 0] = 0  # padding that became a label
    opts = dict(sigma=0.05, fastemit_lambda=0.01, clamp=0.5)
    cpu = lib_tdt(case, "cpu", dtype, layout, reduction, **opts)
    gpu = lib_tdt(case, "cuda", dtype, layout, reduction, **opts)
    for a, b, what in zip(gpu, cpu, ("loss", "token grad", "duration grad")):
        _close(a, b, dtype, what)


def test_long_label_sequences():
    # U + 1 well past one thread block of lattice rows
    case = R.random_case(B=2, T=40, U=300, V=6, seed=82, durations=[0, 1, 2, 3, 4])
    case["logit_lengths"][:] = 40
    cpu = lib_tdt(case, "cpu", torch.float64, "joint", "sum")
    gpu = lib_tdt(case, "cuda", torch.float64, "joint", "sum")
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_rnnt_cpu_vs_cuda():
    case = R.random_case(B=3, T=15, U=6, V=20, seed=83)
    x = case["token_logits"]
    out = []
    for dev in ("cpu", "cuda"):
        a = x.to(dev).clone().requires_grad_(True)
        loss = warp_tdt.rnnt_loss(a, case["targets"], case["logit_lengths"], case["target_lengths"],
                                  reduction="sum", clamp=0.3)
        loss.backward()
        out.append((loss.detach().cpu(), a.grad.cpu()))
    torch.testing.assert_close(out[1][0], out[0][0], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out[1][1], out[0][1], atol=1e-5, rtol=1e-5)


def test_bitwise_deterministic_on_gpu():
    case = R.random_case(B=4, T=16, U=6, V=40, seed=84)
    a = lib_tdt(case, "cuda", torch.float32, "joint", "mean")
    b = lib_tdt(case, "cuda", torch.float32, "joint", "mean")
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_side_stream_and_other_devices():
    case = R.random_case(B=3, T=10, U=4, V=12, seed=85)
    ref = lib_tdt(case, "cuda", torch.float32, "joint", "sum")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = lib_tdt(case, "cuda", torch.float32, "joint", "sum")
    torch.cuda.synchronize()
    for x, y in zip(got, ref):
        assert torch.equal(x, y)
    for index in range(1, torch.cuda.device_count()):
        with torch.cuda.device(0):
            other = lib_tdt(case, "cuda:%d" % index, torch.float32, "joint", "sum")
        for x, y in zip(other, ref):
            torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6)


def test_cuda_validation_raises_and_unvalidated_bad_sample_is_nan():
    case = R.random_case(B=3, T=6, U=3, V=5, seed=86, device="cuda")
    case["targets"][case["targets"] < 0] = 0
    kw = dict(case)
    kw["logit_lengths"] = case["logit_lengths"].clone()
    kw["logit_lengths"][1] = 9
    with pytest.raises(ValueError, match=r"logit_lengths\[1\] = 9 is outside \[0, 6\]"):
        warp_tdt.tdt_loss(**kw)
    loss = warp_tdt.tdt_loss(**kw, reduction="none", validate=False)
    assert math.isnan(loss[1].item())
    good = warp_tdt.tdt_loss(**case, reduction="none")
    assert loss[0].item() == good[0].item() and loss[2].item() == good[2].item()


@pytest.mark.parametrize("mode", ["1", "0"])
def test_async_validation_raises_the_same_errors_and_gives_the_same_results(monkeypatch, mode):
    # By default (and with WARP_TDT_ASYNC_VALIDATION=1) the lengths and labels travel to the host
    # while the loss's kernels run; =0 checks them before the launch. The same ValueErrors, and
    # the same bits on good data as without any check.
    case = R.random_case(B=3, T=6, U=3, V=5, seed=87, device="cuda")
    case["targets"][case["targets"] < 0] = 0
    case["target_lengths"].clamp_(min=1)
    ref = lib_tdt(case, "cuda", torch.float32, "joint", "sum", validate=False)
    monkeypatch.setenv("WARP_TDT_ASYNC_VALIDATION", mode)
    got = lib_tdt(case, "cuda", torch.float32, "joint", "sum")
    for x, y in zip(got, ref):
        assert torch.equal(x, y)
    bad_frames = dict(case, logit_lengths=case["logit_lengths"].clone())
    bad_frames["logit_lengths"][2] = 7
    with pytest.raises(ValueError, match=r"logit_lengths\[2\] = 7 is outside \[0, 6\]"):
        warp_tdt.tdt_loss(**bad_frames)
    bad_label = dict(case, targets=case["targets"].clone())
    bad_label["targets"][1, 0] = 5
    with pytest.raises(ValueError, match=r"targets\[1\]\[0\] = 5 is outside \[0, 5\)"):
        warp_tdt.tdt_loss(**bad_label)
    blank_label = dict(case, targets=case["targets"].clone())
    blank_label["targets"][0, 0] = case["blank_token_id"]
    with pytest.raises(ValueError, match=r"equals blank_token_id"):
        warp_tdt.tdt_loss(**blank_label)
    torch.cuda.synchronize()  # the failed calls' kernels ran on the bad data without a fault


def test_host_lengths_are_checked_on_the_host_without_a_copy_back(monkeypatch):
    # Labels and lengths on the CPU with CUDA logits: they are packed and checked where they are,
    # then copied to the GPU once; nothing comes back from the device for the checks.
    hosts = []
    real = _core.validation_start

    def spy(*args, **kwargs):
        hosts.append(kwargs.get("host"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_core, "validation_start", spy)
    case = R.random_case(B=3, T=6, U=3, V=5, seed=88)
    case["targets"][case["targets"] < 0] = 0
    case["target_lengths"].clamp_(min=1)
    on_gpu = dict(case, targets=case["targets"].cuda(), logit_lengths=case["logit_lengths"].cuda(),
                  target_lengths=case["target_lengths"].cuda())
    ref = lib_tdt(on_gpu, "cuda", torch.float32, "joint", "sum")
    got = lib_tdt(case, "cuda", torch.float32, "joint", "sum")
    for x, y in zip(got, ref):
        assert torch.equal(x, y)
    assert hosts[0] is None and hosts[-1] is not None and hosts[-1].device.type == "cpu"
    bad = dict(case, token_logits=case["token_logits"].cuda(),
               duration_logits=case["duration_logits"].cuda(),
               target_lengths=case["target_lengths"].clone())
    bad["target_lengths"][1] = 4
    with pytest.raises(ValueError, match=r"target_lengths\[1\] = 4 is outside \[0, 3\]"):
        warp_tdt.tdt_loss(**bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_gpu_schedule_gives_the_same_bits(monkeypatch, dtype):
    # WARP_TDT_GPU_SCHEDULE reorders the kernels, never the arithmetic (tdt_gpu_schedule_t)
    case = R.random_case(B=3, T=24, U=9, V=300, seed=93)
    case["target_lengths"].clamp_(min=1)
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "serial")
    ref = lib_tdt(case, "cuda", dtype, "joint", "mean")
    for name in ("auto", "overlap", "split"):
        monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", name)
        got = lib_tdt(case, "cuda", dtype, "joint", "mean")
        for x, y, what in zip(got, ref, ("loss", "token gradient", "duration gradient")):
            assert torch.equal(x, y), "%s differs under %s (%s)" % (what, name, dtype)


def test_cuda_graph_capture_of_forward_and_backward():
    torch.manual_seed(0)
    B, T, U, V, D = 2, 8, 3, 6, 3
    x = torch.randn(B, T, U + 1, V + D, device="cuda", requires_grad=True)
    targets = torch.tensor([[1, 2, 3], [0, 4, 4]], device="cuda", dtype=torch.int32)
    fl = torch.tensor([8, 6], device="cuda", dtype=torch.int32)
    ll = torch.tensor([3, 2], device="cuda", dtype=torch.int32)

    def step():
        return warp_tdt.tdt_loss(x[..., :V], x[..., V:], targets, fl, ll, V - 1, [0, 1, 2])

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            x.grad = None
            step().backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        static_loss = step()
        static_loss.backward()
    new = torch.randn_like(x)
    with torch.no_grad():
        x.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    y = new.clone().requires_grad_(True)
    want = warp_tdt.tdt_loss(y[..., :V], y[..., V:], targets, fl, ll, V - 1, [0, 1, 2])
    want.backward()
    torch.testing.assert_close(static_loss, want)
    torch.testing.assert_close(x.grad, y.grad)
