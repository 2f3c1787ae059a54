"""Opt-in in-place gradients, and omega (the RNN-T draw of NeMo's TDT loss)."""

import pytest
import torch

import reference as R
import warp_tdt
from helpers import lib_tdt, ref_tdt


@pytest.mark.parametrize("V", [5, 300])  # 300: rows of several batches a lane on the GPU
@pytest.mark.parametrize("layout", ["separate", "joint"])
def test_in_place_gradient_overwrites_the_logits(device, layout, V):
    case = R.random_case(B=3, T=6, U=3, V=V, seed=31, dtype=torch.float64)
    _, rgt, rgd = ref_tdt(case, "mean_batch")
    args = (case["targets"], case["logit_lengths"], case["target_lengths"],
            case["blank_token_id"], case["durations"])
    # the logits come out of an op whose backward does not need its output (an add)
    x = torch.cat([case["token_logits"], case["duration_logits"]], -1).to(device).requires_grad_(True)
    joint = x + 0.0
    ptr = joint.data_ptr()
    if layout == "separate":
        tok = joint[..., :V].contiguous()
        dur = joint[..., V:].contiguous()
        loss = warp_tdt.tdt_loss(tok, dur, *args, reduction="mean_batch", in_place=True)
    else:
        loss = warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], *args, reduction="mean_batch",
                                 in_place=True)
    loss.backward()
    torch.testing.assert_close(x.grad[..., :V].cpu(), rgt)
    torch.testing.assert_close(x.grad[..., V:].cpu(), rgd)
    if layout == "joint":
        # the gradient lives where the logits were
        torch.testing.assert_close(joint.detach().cpu(), x.grad.cpu())
        assert joint.data_ptr() == ptr
    else:
        torch.testing.assert_close(tok.detach()[..., :].cpu(), rgt)


def test_in_place_backward_runs_once(device):
    case = R.random_case(B=2, T=5, U=2, V=4, seed=32)
    tok = case["token_logits"].to(device).requires_grad_(True)
    dur = case["duration_logits"].to(device).requires_grad_(True)
    t2, d2 = tok * 1.0, dur * 1.0
    loss = warp_tdt.tdt_loss(t2, d2, case["targets"], case["logit_lengths"],
                             case["target_lengths"], case["blank_token_id"], case["durations"],
                             reduction="sum", in_place=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="in_place"):
        loss.backward()


def test_in_place_refuses_overlapping_logits(device):
    tok = torch.randn(1, 5, 3, 4, device=device).expand(2, -1, -1, -1)
    dur = torch.randn(2, 5, 3, 3, device=device)
    with pytest.raises(ValueError, match="in_place"):
        warp_tdt.tdt_loss(tok, dur, torch.tensor([[0, 1], [1, 2]]), [5, 5], [2, 2], 3, [0, 1, 2],
                          in_place=True)


def test_rnnt_in_place(device):
    case = R.random_case(B=2, T=5, U=2, V=4, seed=33, dtype=torch.float64)
    x = case["token_logits"].to(device).clone().requires_grad_(True)
    y = x * 1.0
    loss = warp_tdt.rnnt_loss(y, case["targets"], case["logit_lengths"], case["target_lengths"],
                              in_place=True, reduction="sum")
    loss.backward()
    x2 = case["token_logits"].detach().clone().requires_grad_(True)
    R.rnnt_costs(x2, case["targets"], case["logit_lengths"], case["target_lengths"], 3).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x2.grad)


@pytest.mark.parametrize("layout", ["separate", "joint"])
def test_omega_one_is_rnnt_on_the_token_logits(device, layout):
    case = R.random_case(B=3, T=6, U=3, V=5, seed=34, dtype=torch.float64)
    loss, gt, gd = lib_tdt(case, device, torch.float64, layout, "none", omega=1.0, sigma=0.3)
    z = case["token_logits"].clone().requires_grad_(True)
    rc = R.rnnt_costs(z, case["targets"], case["logit_lengths"], case["target_lengths"],
                      case["blank_token_id"])
    rc.sum().backward()
    torch.testing.assert_close(loss, rc.detach())  # no sigma in the RNN-T draw
    torch.testing.assert_close(gt, z.grad)
    assert (gd == 0).all()


def test_omega_zero_draws_nothing(device):
    case = R.random_case(B=2, T=5, U=2, V=4, seed=35)
    state = torch.get_rng_state()
    lib_tdt(case, device, torch.float32, "separate", "mean", omega=0.0)
    assert torch.equal(state, torch.get_rng_state())


def test_omega_draw_follows_torch_seed(device):
    case = R.random_case(B=2, T=5, U=2, V=4, seed=36, dtype=torch.float64)
    tdt = lib_tdt(case, device, torch.float64, "separate", "none")[0]
    rnnt = lib_tdt(case, device, torch.float64, "separate", "none", omega=1.0)[0]

    def draws(seed):
        torch.manual_seed(seed)
        out = []
        for _ in range(12):
            loss = lib_tdt(case, device, torch.float64, "separate", "none", omega=0.5)[0]
            assert torch.equal(loss, tdt) or torch.equal(loss, rnnt)
            out.append(torch.equal(loss, rnnt))
        return out

    a, b = draws(5), draws(5)
    assert a == b and any(a) and not all(a)
