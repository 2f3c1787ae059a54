"""torch.autograd.gradcheck (central finite differences) in float64, every layout."""

import pytest
import torch
from torch.autograd import gradcheck

import reference as R
import warp_tdt


def _case(device, seed=51):
    c = R.random_case(B=2, T=4, U=2, V=4, seed=seed, dtype=torch.float64, durations=[0, 1, 2])
    tok = c["token_logits"].to(device).clone().requires_grad_(True)
    dur = c["duration_logits"].to(device).clone().requires_grad_(True)
    rest = (c["targets"], c["logit_lengths"], c["target_lengths"], c["blank_token_id"], c["durations"])
    return tok, dur, rest


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_separate(device, reduction):
    tok, dur, rest = _case(device)
    assert gradcheck(lambda a, b: warp_tdt.tdt_loss(a, b, *rest, sigma=0.05, reduction=reduction),
                     (tok, dur), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_joint_slices(device):
    tok, dur, rest = _case(device, seed=52)
    V = tok.shape[-1]
    joint = torch.cat([tok, dur], -1).detach().requires_grad_(True)
    assert gradcheck(lambda j: warp_tdt.tdt_loss(j[..., :V], j[..., V:], *rest, reduction="sum"),
                     (joint,), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert gradcheck(lambda j: warp_tdt.tdt_loss_joint(j, *rest, reduction="mean_volume"),
                     (joint,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_rnnt(device):
    tok, _, rest = _case(device, seed=53)
    assert gradcheck(lambda a: warp_tdt.rnnt_loss(a, *rest[:3], reduction="none"), (tok,),
                     eps=1e-6, atol=1e-6, rtol=1e-5)
    lp = torch.log_softmax(tok.detach(), -1).requires_grad_(True)
    assert gradcheck(lambda a: warp_tdt.rnnt_loss(a, *rest[:3], reduction="sum",
                                                  fused_log_softmax=False), (lp,),
                     eps=1e-6, atol=1e-6, rtol=1e-5)
