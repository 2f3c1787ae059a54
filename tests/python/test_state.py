"""The binding's per-node state in the gradient's rows (options.state_in_grads, library 0.6.0),
driven through the CPU backend: on CUDA the autograd forward asks for it at small vocabularies
(_core.state_in_grads_wanted); here the forward is made to take that path, so its plumbing (the
forward_ahead() call with the option, the backward into the same buffers, the second backward
that runs the forward again) is tested wherever the suite runs."""

import types

import pytest
import torch

import reference as R
from helpers import joint_step
from warp_tdt import _autograd, _core


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_state_path_gives_the_pairs_bits(monkeypatch, dtype, reduction):
    if not _core._has_version(600):
        pytest.skip("a library before 0.6.0")
    case = R.random_case(B=6, T=12, U=5, V=40, seed=171)
    want = joint_step(case, dtype, reduction, "cpu", factor=0.5, retain=True)
    asked, calls = [], []
    real_ahead, real_forward = _core.forward_ahead, _core.forward
    monkeypatch.setattr(_autograd, "_ahead_key", lambda ctx, logits, *a: ("state", logits.shape))
    monkeypatch.setattr(_core, "state_in_grads_wanted", lambda *a: True)
    monkeypatch.setattr(_core, "forward_ahead",
                        lambda *a, **k: (asked.append(k.get("state_in_grads")), real_ahead(*a, **k))[1])
    monkeypatch.setattr(_core, "forward",
                        lambda *a, **k: (calls.append("forward"), real_forward(*a, **k))[1])
    _autograd._ahead_plans.clear()
    got = joint_step(case, dtype, reduction, "cpu", factor=0.5, retain=True)
    assert asked == [True], asked
    assert calls == ["forward"], "the second backward runs the forward again: %s" % calls
    for i, what in enumerate(["loss", "gradient", "second backward's gradient"]):
        assert torch.equal(got[i], want[i]), "%s (%s, %s)" % (what, dtype, reduction)


def _fake_logits(B, T, rows, V, D, dtype=torch.float32, index=0):
    """What state_in_grads_wanted reads of the logits: shape, element size, device index."""
    return types.SimpleNamespace(shape=(B, T, rows, V + D), device=types.SimpleNamespace(index=index),
                                 element_size=lambda: torch.empty(0, dtype=dtype).element_size())


def test_state_is_asked_where_auto_neither_fuses_nor_splits(monkeypatch):
    # The rule, with a device of 132 SMs (the H200's): AUTO may fuse where both sweeps' 2 B
    # blocks fit a quarter of them, and split where B does and the logits hold 2.5 MiB a
    # diagonal; the state rules both out, so it is asked for only elsewhere, over 4 % of a row.
    if not _core._has_version(600):
        pytest.skip("a library before 0.6.0")
    monkeypatch.setitem(_core._sm_counts, 0, 132)
    monkeypatch.delenv("WARP_TDT_STATE_IN_GRADS", raising=False)
    monkeypatch.delenv("WARP_TDT_GPU_SCHEDULE", raising=False)
    wanted = _core.state_in_grads_wanted
    ragged = _fake_logits(32, 150, 61, 257, 5)
    assert wanted(ragged, 5, 257, True), "ragged float32"
    assert wanted(_fake_logits(32, 150, 61, 257, 5, torch.bfloat16), 5, 257, True)
    assert not wanted(ragged, 5, 257, False), "no token gradient"
    assert not wanted(_fake_logits(16, 150, 61, 257, 5), 5, 257, True), "2 B = 32 <= 33: fused"
    assert not wanted(_fake_logits(32, 400, 101, 257, 5), 5, 257, True), "3.2 MiB a diagonal: split"
    assert wanted(_fake_logits(34, 400, 101, 257, 5), 5, 257, True), "B = 34 > 33: no split"
    assert not wanted(_fake_logits(32, 100, 21, 1025, 5), 5, 1025, True), "1.9 % of a row"
    assert wanted(_fake_logits(34, 100, 21, 500, 5, torch.bfloat16), 5, 500, True), "7.9 %"
    assert not wanted(_fake_logits(34, 100, 21, 34, 5, torch.float16), 5, 34, True), "68 < 70 bytes"
    assert wanted(_fake_logits(34, 100, 21, 35, 5, torch.float16), 5, 35, True), "70 bytes"
    assert wanted(_fake_logits(34, 100, 21, 7, 0), 0, 7, True), "RNN-T float32: 28 bytes"
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "fused")
    assert not wanted(ragged, 5, 257, True)
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "trail")
    assert wanted(_fake_logits(2, 150, 61, 257, 5), 5, 257, True), "trail asked: no fused"
    monkeypatch.setenv("WARP_TDT_STATE_IN_GRADS", "1")
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "fused")
    assert wanted(ragged, 5, 257, True)
    monkeypatch.setenv("WARP_TDT_STATE_IN_GRADS", "0")
    monkeypatch.setenv("WARP_TDT_GPU_SCHEDULE", "serial")
    assert not wanted(ragged, 5, 257, True)
