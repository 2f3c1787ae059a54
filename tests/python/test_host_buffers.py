"""CPU buffer reuse (_hostmem).

The gradient of a CPU call comes from a buffer the previous call used once autograd has dropped
that gradient; a gradient still held by anyone must never be overwritten. Large enough shapes
(over _hostmem.MIN_BYTES) so the cache applies.
"""

import pytest
import torch

import helpers as H
import reference as R
import warp_tdt
from warp_tdt import _hostmem


def _case(seed):
    case = R.random_case(B=2, T=10, U=5, V=5000, seed=seed)  # 2.4 MB of token logits
    assert case["token_logits"].numel() * 4 >= _hostmem.MIN_BYTES
    return case


def _ref_joint_grad(case):
    _, gz, gh = H.ref_tdt(case, reduction="sum")
    return torch.cat([gz, gh], -1)


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.delenv("WARP_TDT_CPU_CACHE", raising=False)
    warp_tdt.empty_cache()
    yield
    warp_tdt.empty_cache()


def test_dropped_gradient_buffer_is_reused():
    if not _hostmem.enabled():
        pytest.skip("no anonymous mmap / torch.frombuffer here")
    case = _case(1)
    g = H.joint_grad(case)
    ptr = g.data_ptr()
    del g
    g2 = H.joint_grad(_case(2))
    assert g2.data_ptr() == ptr
    H.assert_close(g2, _ref_joint_grad(_case(2)), torch.float32, "reused gradient buffer")


def test_held_gradient_is_never_overwritten():
    a, b = _case(3), _case(4)
    ga = H.joint_grad(a)
    keep = ga.clone()
    gb = H.joint_grad(b)
    assert gb.data_ptr() != ga.data_ptr()
    assert torch.equal(ga, keep)
    H.assert_close(gb, _ref_joint_grad(b), torch.float32, "second gradient")
    # a view of the gradient keeps the buffer busy as well
    view = gb[1]
    del gb
    gc = H.joint_grad(a)
    assert gc.data_ptr() != view.data_ptr() - view.storage_offset() * 4
    H.assert_close(gc, ga, torch.float32, "third gradient")


def test_two_forwards_before_backward_keep_their_workspaces():
    cases = [_case(5), _case(6)]
    V = cases[0]["token_logits"].shape[-1]
    joints, losses = [], []
    for case in cases:  # e.g. two micro-batches whose graphs are both alive
        j = torch.cat([case["token_logits"], case["duration_logits"]], -1).requires_grad_(True)
        losses.append(warp_tdt.tdt_loss(j[..., :V], j[..., V:], case["targets"],
                                        case["logit_lengths"], case["target_lengths"],
                                        case["blank_token_id"], case["durations"], reduction="sum"))
        joints.append(j)
    (losses[0] + losses[1]).backward()
    for case, j in zip(cases, joints):
        H.assert_close(j.grad, _ref_joint_grad(case), torch.float32, "gradient of its own graph")


def test_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("WARP_TDT_CPU_CACHE", "0")
    case = _case(7)
    g = H.joint_grad(case)
    assert not _hostmem._slots
    H.assert_close(g, _ref_joint_grad(case), torch.float32, "uncached gradient")


def test_small_and_strided_gradients_use_torch():
    small = R.random_case(B=2, T=4, U=2, V=6, seed=8)
    H.joint_grad(small)
    assert "grad" not in _hostmem._slots
    case = _case(9)
    tok = case["token_logits"].transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(True)
    dur = case["duration_logits"].clone().requires_grad_(True)
    warp_tdt.tdt_loss(tok, dur, case["targets"], case["logit_lengths"], case["target_lengths"],
                      case["blank_token_id"], case["durations"], reduction="sum").backward()
    assert tok.grad.stride() == tok.stride()  # laid out like the logits, not from the cache
    _, gz, _ = H.ref_tdt(case, reduction="sum")
    H.assert_close(tok.grad, gz, torch.float32, "strided token gradient")
