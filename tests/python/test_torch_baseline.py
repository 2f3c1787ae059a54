"""benchmark/torch_tdt.py, the vectorised pure-PyTorch TDT loss that benchmark/bench.py times
warp_tdt against: it must compute the same loss and gradients as the float64 reference, or the
speed-up bench.py prints means nothing."""

import os
import sys

import pytest
import torch

import helpers as H
import reference as R

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "benchmark"))
import torch_tdt  # noqa: E402

CASES = [dict(seed=0), dict(seed=1, durations=[2, 0, 1]), dict(seed=2, blank=0),
         dict(seed=3, durations=[2, 4]),  # durations without 0 and 1: infeasible samples
         dict(seed=4, T=1, U=2), dict(seed=5, U=0), dict(seed=6, durations=[1, 3, 0, 5, 2, 4])]


def _run(case, dtype, layout, reduction, sigma, weights, device="cpu"):
    tok0 = case["token_logits"].to(device, dtype)
    dur0 = case["duration_logits"].to(device, dtype)
    V = tok0.shape[-1]
    args = (case["targets"].to(device), case["logit_lengths"].to(device),
            case["target_lengths"].to(device), case["blank_token_id"], case["durations"], sigma,
            reduction)
    if layout == "joint":
        joint = torch.cat([tok0, dur0], -1).requires_grad_(True)
        loss = torch_tdt.tdt_loss(joint[..., :V], joint[..., V:], *args)
    else:
        tok, dur = tok0.clone().requires_grad_(True), dur0.clone().requires_grad_(True)
        loss = torch_tdt.tdt_loss(tok, dur, *args)
    if reduction == "none":
        finite = torch.where(torch.isinf(loss), torch.zeros_like(loss), loss)
        (finite * weights.to(loss.device, loss.dtype)).sum().backward()
    elif bool(torch.isfinite(loss)):
        loss.backward()
    if layout == "joint":
        return loss.detach().cpu(), joint.grad[..., :V].cpu(), joint.grad[..., V:].cpu()
    return loss.detach().cpu(), tok.grad.cpu(), dur.grad.cpu()


@pytest.mark.parametrize("case_kw", CASES, ids=lambda kw: "seed%d" % kw["seed"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", ["separate", "joint"])
def test_matches_reference(device, case_kw, dtype, layout):
    kw = dict(case_kw)
    case = R.random_case(B=4, T=kw.pop("T", 9), U=kw.pop("U", 4), V=7, dtype=torch.float64, **kw)
    w = torch.rand(4, generator=torch.Generator().manual_seed(9), dtype=torch.float64) + 0.5
    for sigma in (0.0, 0.05):
        loss, gz, gh = _run(case, dtype, layout, "none", sigma, w, device)
        rloss, rgz, rgh = H.ref_tdt(case, reduction="none", weights=w, sigma=sigma)
        assert torch.equal(torch.isinf(loss), torch.isinf(rloss))
        fin = torch.isfinite(rloss)
        H.assert_close(loss[fin], rloss[fin], dtype, "costs, sigma %g" % sigma)
        H.assert_close(gz, rgz, dtype, "token gradient, sigma %g" % sigma)
        H.assert_close(gh, rgh, dtype, "duration gradient, sigma %g" % sigma)
        assert not torch.isnan(gz).any() and not torch.isnan(gh).any()


@pytest.mark.parametrize("reduction", H.REDUCTIONS)
def test_reductions(reduction):
    case = R.random_case(B=3, T=8, U=3, V=6, seed=11, dtype=torch.float64)
    case["target_lengths"].clamp_(min=1)  # "mean" divides by U_b
    case["targets"][case["targets"] < 0] = 0  # now inside U_b: a real label
    w = torch.ones(3, dtype=torch.float64)
    loss, gz, gh = _run(case, torch.float64, "joint", reduction, 0.0, w)
    rloss, rgz, rgh = H.ref_tdt(case, reduction=reduction, weights=w)
    H.assert_close(loss, rloss, torch.float64, "loss")
    H.assert_close(gz, rgz, torch.float64, "token gradient")
    H.assert_close(gh, rgh, torch.float64, "duration gradient")


def test_bfloat16_logits_run_in_float32():
    case = R.random_case(B=2, T=6, U=3, V=9, seed=12, dtype=torch.float64)
    loss, gz, _ = _run(case, torch.bfloat16, "joint", "sum", 0.0, torch.ones(2))
    assert loss.dtype == torch.float32 and gz.dtype == torch.bfloat16
    rounded = dict(case, token_logits=case["token_logits"].bfloat16().double(),
                   duration_logits=case["duration_logits"].bfloat16().double())
    rloss, rgz, _ = H.ref_tdt(rounded, reduction="sum")
    H.assert_close(loss, rloss, torch.float32, "loss of the rounded logits")
    H.assert_close(gz, rgz, torch.bfloat16, "token gradient")
