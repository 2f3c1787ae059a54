"""CUDA backend through the binding: CPU vs GPU on every dtype, layout and option, device
indices, the current stream, CUDA-graph capture, and the GPU's answer to bad data."""

import math

import pytest
import torch

import reference as R
import warp_tdt
from warp_tdt import _core
from conftest import requires_cuda
from helpers import REDUCTIONS, joint_step, lib_tdt, tolerances

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
    assert hosts == []  # on the device: tdt_pack_indices checks them (the next test)
    got = lib_tdt(case, "cuda", torch.float32, "joint", "sum")
    for x, y in zip(got, ref):
        assert torch.equal(x, y)
    assert len(hosts) == 1 and hosts[0] is not None and hosts[0].device.type == "cpu"
    bad = dict(case, token_logits=case["token_logits"].cuda(),
               duration_logits=case["duration_logits"].cuda(),
               target_lengths=case["target_lengths"].clone())
    bad["target_lengths"][1] = 4
    with pytest.raises(ValueError, match=r"target_lengths\[1\] = 4 is outside \[0, 3\]"):
        warp_tdt.tdt_loss(**bad)


@pytest.mark.parametrize("mode", ["1", "0"])
@pytest.mark.parametrize("itype", [torch.int64, torch.int32])
def test_device_indices_packed_and_checked_by_the_library(monkeypatch, mode, itype):
    # Targets and lengths on the GPU: one tdt_pack_indices kernel converts, zero-pads and judges
    # them (no concatenation, cast or copy for the check: validation_start is never called);
    # the same bits as int32 inputs used as they are with no check, for full, narrow, wide and
    # strided targets; and each bad value raises the message the host checks give.
    monkeypatch.setenv("WARP_TDT_ASYNC_VALIDATION", mode)
    packs = []
    for name in ("pack_indices", "pack_request"):  # the library's pack: its own call, or the
        real = getattr(_core, name)                # forward's (options.pack, 0.5.0)

        def spy(*args, real=real):
            packs.append(args[-1])
            return real(*args)

        monkeypatch.setattr(_core, name, spy)
    monkeypatch.setattr(_core, "validation_start", None)  # must not be reached
    case = R.random_case(B=4, T=7, U=3, V=6, seed=91)
    case["target_lengths"].clamp_(max=2)
    dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    plain = dict(dev, targets=dev["targets"].clamp(min=0).to(torch.int32).contiguous(),
                 logit_lengths=dev["logit_lengths"].to(torch.int32),
                 target_lengths=dev["target_lengths"].to(torch.int32))
    ref = lib_tdt(plain, "cuda", torch.float32, "joint", "mean", validate=False)
    assert packs == []  # int32, contiguous, unchecked: used as they are
    typed = dict(dev, targets=dev["targets"].to(itype), logit_lengths=dev["logit_lengths"].to(itype),
                 target_lengths=dev["target_lengths"].to(itype))
    wide = torch.full((4, 5), 99, dtype=itype, device="cuda")
    wide[:, :3] = dev["targets"].to(itype)
    strided = torch.full((4, 8), 99, dtype=itype, device="cuda")
    strided[:, :3] = dev["targets"].to(itype)
    for name, targets in [("full", typed["targets"]), ("narrow", typed["targets"][:, :2]),
                          ("wide", wide), ("strided", strided[:, :3])]:
        got = lib_tdt(dict(typed, targets=targets), "cuda", torch.float32, "joint", "mean")
        for x, y in zip(got, ref):
            assert torch.equal(x, y), name
    assert packs == [True] * 4
    narrow = dict(typed, targets=typed["targets"][:, :2], target_lengths=typed["target_lengths"].clone())
    narrow["target_lengths"][1] = 3
    with pytest.raises(ValueError, match=r"target_lengths\[1\] = 3 exceeds targets.shape\[1\] = 2"):
        warp_tdt.tdt_loss(**narrow)
    bad = dict(typed, logit_lengths=typed["logit_lengths"].clone())
    bad["logit_lengths"][3] = 8
    with pytest.raises(ValueError, match=r"logit_lengths\[3\] = 8 is outside \[0, 7\]"):
        warp_tdt.tdt_loss(**bad)
    bad = dict(typed, targets=typed["targets"].clone())
    bad["targets"][0, 1] = 6
    with pytest.raises(ValueError, match=r"targets\[0\]\[1\] = 6 is outside \[0, 6\)"):
        warp_tdt.tdt_loss(**bad)
    if itype == torch.int64:  # past int32: a cast would wrap it to the valid label 1
        bad["targets"][0, 1] = 2 ** 32 + 1
        with pytest.raises(ValueError, match=r"targets\[0\]\[1\] = 4294967297 is outside"):
            warp_tdt.tdt_loss(**bad)
    # after the errors the thread's flag is free again, and good data passes
    got = lib_tdt(typed, "cuda", torch.float32, "joint", "mean")
    for x, y in zip(got, ref):
        assert torch.equal(x, y)
    torch.cuda.synchronize()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_the_forward_call_packs_the_indices(monkeypatch, reduction):
    # Library 0.5.0: int64 device indices are packed (and judged) by the forward call's first
    # kernel (options.pack), not by a tdt_pack_indices call of their own: a step makes the
    # forward call and its backward half only, and gives the bits of the separate pack. A call
    # with nothing for the library to read (T = 0, an empty batch) still packs and judges them.
    if not _core.fold_pack_available():
        pytest.skip("a library before 0.5.0")
    calls = []
    real = _core._call

    def spy(fn_name, logits, o, *args):
        calls.append((fn_name, bool(o.pack)))
        return real(fn_name, logits, o, *args)

    monkeypatch.setattr(_core, "_call", spy)
    case = R.random_case(B=4, T=12, U=5, V=40, seed=96, device="cuda")
    case["targets"][case["targets"] < 0] = 0
    for layout in ("joint", "separate"):
        calls.clear()
        folded = lib_tdt(case, "cuda", torch.float32, layout, reduction)
        if reduction == "mean_volume":  # its weights read the label lengths before the forward
            assert calls[0] == ("tdt_pack_indices", False) and len(calls) == 3, calls
            assert not calls[1][1] and not calls[2][1], calls
        else:
            names = [n for n, _ in calls]
            assert "tdt_pack_indices" not in names and len(names) == 2, calls
            assert calls[0][1] and not calls[1][1], calls  # the forward packs; its backward not
        monkeypatch.setattr(_core, "fold_pack_available", lambda: False)
        calls.clear()
        separate = lib_tdt(case, "cuda", torch.float32, layout, reduction)
        monkeypatch.undo()
        monkeypatch.setattr(_core, "_call", spy)
        assert [n for n, _ in calls][0] == "tdt_pack_indices", calls
        for x, y, what in zip(folded, separate, ("loss", "token grad", "duration grad")):
            assert torch.equal(x, y), (layout, what)
    bad = dict(case, targets=case["targets"].clone())
    bad["targets"][2, 0] = case["blank_token_id"]
    bad["target_lengths"] = case["target_lengths"].clamp(min=1)
    with pytest.raises(ValueError, match=r"targets\[2\]\[0\] = \d+ equals blank_token_id"):
        warp_tdt.tdt_loss(**bad)
    # no frame: every cost inf, the labels judged all the same
    empty = dict(case, token_logits=case["token_logits"][:, :0], duration_logits=case["duration_logits"][:, :0],
                 logit_lengths=torch.zeros_like(case["logit_lengths"]))
    got = warp_tdt.tdt_loss(**dict(empty, reduction="none"))
    assert torch.isinf(got).all() and (got > 0).all()
    with pytest.raises(ValueError, match=r"equals blank_token_id"):
        warp_tdt.tdt_loss(**dict(empty, targets=bad["targets"], target_lengths=bad["target_lengths"]))
    none = {k: (v[:0] if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    assert warp_tdt.tdt_loss(**dict(none, reduction="sum")).item() == 0.0
    torch.cuda.synchronize()


def test_the_check_polls_its_flag_behind_other_work(monkeypatch):
    # The pack kernel queued behind ~20 ms of other GPU work: the host waits for its verdict by
    # reading the pinned flag as it lands (_wait_for_flag), and gets it right both ways.
    waits = []
    real = _core._wait_for_flag
    monkeypatch.setattr(_core, "_wait_for_flag", lambda *a: (waits.append(1), real(*a))[1])
    case = R.random_case(B=3, T=6, U=3, V=5, seed=92, device="cuda")
    case["targets"][case["targets"] < 0] = 0
    want = warp_tdt.tdt_loss(**case)
    torch.cuda._sleep(40_000_000)  # cycles: ~20 ms
    got = warp_tdt.tdt_loss(**case)
    assert len(waits) == 1, "the host found the verdict without waiting for it (%d)" % len(waits)
    assert torch.equal(got, want)
    bad = dict(case, logit_lengths=case["logit_lengths"].clone())
    bad["logit_lengths"][0] = 7
    torch.cuda._sleep(40_000_000)
    with pytest.raises(ValueError, match=r"logit_lengths\[0\] = 7 is outside \[0, 6\]"):
        warp_tdt.tdt_loss(**bad)
    assert len(waits) == 2
    torch.cuda.synchronize()


@pytest.mark.parametrize("mode", ["1", "0"])
def test_device_indices_of_mixed_types_packed_by_torch(monkeypatch, mode):
    # int64 targets with int32 lengths: not one tdt_pack_indices type, so torch concatenates and
    # casts them and the check copies them to the host, as before the library packed them
    monkeypatch.setenv("WARP_TDT_ASYNC_VALIDATION", mode)
    monkeypatch.setattr(_core, "pack_indices", None)  # must not be reached
    monkeypatch.setattr(_core, "pack_request", None)
    case = R.random_case(B=3, T=6, U=3, V=5, seed=92, device="cuda")
    mixed = dict(case, logit_lengths=case["logit_lengths"].to(torch.int32),
                 target_lengths=case["target_lengths"].to(torch.int32))
    plain = dict(mixed, targets=case["targets"].to(torch.int32))  # used as they are
    ref = lib_tdt(plain, "cuda", torch.float32, "joint", "sum", validate=False)
    got = lib_tdt(mixed, "cuda", torch.float32, "joint", "sum")
    for x, y in zip(got, ref):
        assert torch.equal(x, y)
    mixed["logit_lengths"][2] = 7
    with pytest.raises(ValueError, match=r"logit_lengths\[2\] = 7 is outside \[0, 6\]"):
        warp_tdt.tdt_loss(**mixed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_gpu_schedule_gives_the_same_bits(monkeypatch, dtype):
    # WARP_TDT_GPU_SCHEDULE reorders the kernels, never the arithmetic (tdt_gpu_schedule_t)
    case = R.random_case(B=3, T=24, U=9, V=300, seed=93)
    case["target_lengths"].clamp_(min=1)
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "serial")
    ref = lib_tdt(case, "cuda", dtype, "joint", "mean")
    for name in ("auto", "overlap", "split", "trail"):
        monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", name)
        got = lib_tdt(case, "cuda", dtype, "joint", "mean")
        for x, y, what in zip(got, ref, ("loss", "token gradient", "duration gradient")):
            assert torch.equal(x, y), "%s differs under %s (%s)" % (what, name, dtype)


def _capture_step(step, x):
    """step() (a loss of the leaf x) warmed up twice on a side stream, as capture wants, then
    its forward + backward captured in a CUDA graph: (graph, the static loss, x.grad of the
    last warm-up step)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            x.grad = None
            step().backward()
    torch.cuda.current_stream().wait_stream(s)
    eager = x.grad.clone()
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        static_loss = step()
        static_loss.backward()
    return graph, static_loss, eager


def test_cuda_graph_capture_of_forward_and_backward():
    torch.manual_seed(0)
    B, T, U, V, D = 2, 8, 3, 6, 3
    x = torch.randn(B, T, U + 1, V + D, device="cuda", requires_grad=True)
    targets = torch.tensor([[1, 2, 3], [0, 4, 4]], device="cuda", dtype=torch.int32)
    fl = torch.tensor([8, 6], device="cuda", dtype=torch.int32)
    ll = torch.tensor([3, 2], device="cuda", dtype=torch.int32)

    def step():
        return warp_tdt.tdt_loss(x[..., :V], x[..., V:], targets, fl, ll, V - 1, [0, 1, 2])

    graph, static_loss, _ = _capture_step(step, x)
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


def _within_rounding(a, b, what):
    """Each element the same, within 1e-12, or one step of its dtype apart (the fused
    schedule's gradients against the pair's: tdt.h, TDT_GPU_SCHEDULE_FUSED)."""
    assert a.dtype == b.dtype and a.shape == b.shape, what
    if a.dtype == torch.float64:
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=lambda m: "%s: %s" % (what, m))
        return
    ints = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[a.dtype]
    ia, ib = a.contiguous().view(ints).long(), b.contiguous().view(ints).long()
    sign = 1 << (8 * a.element_size() - 1)
    oa = torch.where(ia < 0, -(ia + sign), ia)  # ordered: neighbours differ by one
    ob = torch.where(ib < 0, -(ib + sign), ib)
    steps = (oa - ob).abs()
    assert int(steps.max()) <= 1, "%s: %d elements more than one step apart, the first %s vs %s" % (
        what, int((steps > 1).sum()), a.flatten()[int((steps > 1).flatten().nonzero()[0])],
        b.flatten()[int((steps > 1).flatten().nonzero()[0])])


def _step(case, dtype, reduction, factor=None, retain=False):
    """helpers.joint_step on CUDA."""
    return joint_step(case, dtype, reduction, "cuda", factor, retain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradients_written_ahead_by_the_fused_schedule(monkeypatch, dtype, reduction):
    # WARP_TDT_GPU_SCHEDULE=fused: the forward writes the gradients (tdt_forward_ahead) for a
    # loss gradient of 1 and the backward scales them; WARP_TDT_GRADIENTS_AHEAD=0 runs the
    # forward/backward pair (fused as overlap). The same loss bits; gradients within rounding
    # (the factor 0.5 is exact); a second backward (retain_graph) is the pair's, bit for bit.
    case = R.random_case(B=3, T=24, U=9, V=300, seed=97)
    case["target_lengths"].clamp_(min=1)
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "fused")
    scaled = []
    real_scale = _core.scale
    monkeypatch.setattr(_core, "scale", lambda *a, **k: (scaled.append(1), real_scale(*a, **k))[1])
    got = _step(case, dtype, reduction)
    got_half = _step(case, dtype, reduction, factor=0.5, retain=True)
    assert len(scaled) == 2, "the backward did not take the gradients written ahead (%d)" % len(scaled)
    monkeypatch.setenv("WARP_TDT_GRADIENTS_AHEAD", "0")
    want = _step(case, dtype, reduction)
    want_half = _step(case, dtype, reduction, factor=0.5)
    assert len(scaled) == 2, "WARP_TDT_GRADIENTS_AHEAD=0 still wrote the gradients ahead"
    assert torch.equal(got[0], want[0]), "loss (%s, %s)" % (dtype, reduction)
    _within_rounding(got[1], want[1], "gradient ahead (%s, %s)" % (dtype, reduction))
    _within_rounding(got_half[1], want_half[1], "gradient ahead x 0.5 (%s, %s)" % (dtype, reduction))
    assert torch.equal(got_half[2], want_half[1]), "a second backward (%s, %s)" % (dtype, reduction)
    # any factor: the CPU's gradient, to the dtype's tolerance
    cpu = lib_tdt(case, "cpu", dtype, "joint", reduction)
    monkeypatch.delenv("WARP_TDT_GRADIENTS_AHEAD")
    _, g3 = _step(case, dtype, reduction, factor=0.3)
    V = case["token_logits"].shape[-1]
    _close(g3[..., :V].cpu() / 0.3, cpu[1], dtype, "token gradient x 0.3 vs CPU (%s)" % reduction)
    _close(g3[..., V:].cpu() / 0.3, cpu[2], dtype, "duration gradient x 0.3 vs CPU (%s)" % reduction)


def test_gradients_written_ahead_on_long_rows_and_in_a_graph():
    # AUTO takes the fused schedule for long rows (sweeps split over clusters): the binding's
    # forward writes the gradients there; the CPU agrees, and a CUDA graph replays the same bits
    case = R.random_case(B=1, T=160, U=300, V=24, seed=98, full_lengths=True)
    cpu = lib_tdt(case, "cpu", torch.float32, "joint", "mean")
    from warp_tdt import _autograd
    _autograd._ahead_plans.clear()
    loss, g = _step(case, torch.float32, "mean")
    assert list(_autograd._ahead_plans.values()) == [True], _autograd._ahead_plans
    V = case["token_logits"].shape[-1]
    _close(loss.cpu(), cpu[0], torch.float32, "loss")
    _close(g[..., :V].cpu(), cpu[1], torch.float32, "token gradient")
    _close(g[..., V:].cpu(), cpu[2], torch.float32, "duration gradient")
    tok = case["token_logits"].cuda()
    x = torch.cat([tok, case["duration_logits"].cuda()], -1).requires_grad_(True)
    args = (case["targets"].cuda(), case["logit_lengths"].cuda(), case["target_lengths"].cuda(),
            case["blank_token_id"], case["durations"])

    def step():
        return warp_tdt.tdt_loss(x[..., :V], x[..., V:], *args)

    graph, _, eager = _capture_step(step, x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.grad, eager), "graph replay of the gradients written ahead"
    assert torch.equal(x.grad, g), "the graph against the first eager step"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("schedule", ["auto", "serial", "overlap", "trail"])
def test_state_in_grads_gives_the_same_bits(monkeypatch, dtype, schedule):
    # A ragged batch of a small vocabulary (V = 40, 16-bit joint rows of 45 elements: every other
    # row 4 bytes off a double's alignment; B = 40, too many samples for AUTO's split and fused
    # schedules): the binding keeps the per-node state in the gradient's rows
    # (options.state_in_grads, library 0.6.0), which must change no bit of the loss or the
    # gradients, written ahead or by the backward, nor of a second backward (retain_graph),
    # which runs the forward again; WARP_TDT_STATE_IN_GRADS=0 keeps it in the workspace.
    if not _core._has_version(600):
        pytest.skip("a library before 0.6.0")
    from warp_tdt import _autograd
    case = R.random_case(B=40, T=30, U=10, V=40, seed=151)
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", schedule)
    asked = []
    real = _core.forward_ahead
    monkeypatch.setattr(_core, "forward_ahead",
                        lambda *a, **k: (asked.append(k.get("state_in_grads")), real(*a, **k))[1])
    _autograd._ahead_plans.clear()
    got = _step(case, dtype, "mean_batch", factor=0.5, retain=True)
    got_one = _step(case, dtype, "sum")
    assert asked == [True, True], asked
    monkeypatch.setenv("WARP_TDT_STATE_IN_GRADS", "0")
    _autograd._ahead_plans.clear()
    want = _step(case, dtype, "mean_batch", factor=0.5, retain=True)
    want_one = _step(case, dtype, "sum")
    assert not any(asked[2:]), asked
    for i, what in enumerate(["loss", "gradient", "second backward's gradient"]):
        assert torch.equal(got[i], want[i]), "%s (%s, %s)" % (what, dtype, schedule)
    assert torch.equal(got_one[0], want_one[0]) and torch.equal(got_one[1], want_one[1]), \
        "loss and gradient, sum (%s, %s)" % (dtype, schedule)


def test_state_in_grads_is_not_asked_where_auto_may_fuse_or_split(monkeypatch):
    # AUTO's fused and split schedules, which options.state_in_grads rules out, are faster
    # where AUTO takes them: the binding does not ask for the state there (a batch whose sweeps
    # fit a quarter of the SMs), nor under WARP_TDT_GPU_SCHEDULE=fused or split.
    if not _core._has_version(600):
        pytest.skip("a library before 0.6.0")
    x = torch.empty(2, 30, 11, 45, device="cuda")
    assert not _core.state_in_grads_wanted(x, 5, 40, True)
    big = torch.empty(40, 30, 11, 45, device="cuda")
    assert _core.state_in_grads_wanted(big, 5, 40, True)
    assert not _core.state_in_grads_wanted(big, 5, 40, False), "no token gradient"
    assert not _core.state_in_grads_wanted(big.to(torch.float16), 5, 34, True), "rows too short"
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "fused")
    assert not _core.state_in_grads_wanted(big, 5, 40, True)
    monkeypatch.setenv("WARP_TDT_STATE_IN_GRADS", "1")
    assert _core.state_in_grads_wanted(big, 5, 40, True)
    monkeypatch.setenv("WARP_TDT_STATE_IN_GRADS", "0")
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "serial")
    assert not _core.state_in_grads_wanted(big, 5, 40, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_trail_schedule_on_a_ragged_batch(monkeypatch, dtype, reduction):
    # A ragged batch too large for the overlaps: AUTO takes the trail schedule (sm_90), whose
    # forward writes the gradients (tdt_forward_ahead) beside the sweeps; its gradients are the
    # serial pair's bits, the loss too, and a CUDA graph replays them; times 0.5 within one step
    # of the pair's (the factor is applied afterwards: a subnormal element loses a bit).
    from warp_tdt import _autograd
    case = R.random_case(B=40, T=50, U=16, V=257, seed=131)
    sm90 = torch.cuda.get_device_capability()[0] >= 9
    _autograd._ahead_plans.clear()
    got = _step(case, dtype, reduction)
    got_half = _step(case, dtype, reduction, factor=0.5)
    assert list(_autograd._ahead_plans.values()) == [sm90], _autograd._ahead_plans
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "trail")
    assert torch.equal(_step(case, dtype, reduction)[1], got[1]), "TRAIL against AUTO"
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "serial")
    want = _step(case, dtype, reduction)
    want_half = _step(case, dtype, reduction, factor=0.5)
    assert torch.equal(got[0], want[0]), "loss (%s, %s)" % (dtype, reduction)
    assert torch.equal(got[1], want[1]), "gradient (%s, %s)" % (dtype, reduction)
    _within_rounding(got_half[1], want_half[1], "gradient x 0.5 (%s, %s)" % (dtype, reduction))
    monkeypatch.delenv("WARP_TDT_GPU_SCHEDULE")
    V = case["token_logits"].shape[-1]
    x = torch.cat([case["token_logits"], case["duration_logits"]], -1).to("cuda", dtype)
    x.requires_grad_(True)
    args = (case["targets"].cuda(), case["logit_lengths"].cuda(), case["target_lengths"].cuda(),
            case["blank_token_id"], case["durations"])

    def step():
        return warp_tdt.tdt_loss(x[..., :V], x[..., V:], *args, reduction=reduction)

    graph, _, eager = _capture_step(step, x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.grad, eager), "graph replay of the trail schedule's gradients"
    assert torch.equal(x.grad, got[1]), "the graph against the eager step"
