"""warp_tdt against the independent float64 reference (reference.py): every reduction, option,
layout and duration set, on the CPU and (where built) CUDA."""

import math

import pytest
import torch

import reference as R
import warp_tdt
from warp_tdt import _core
from helpers import REDUCTIONS, assert_close, lib_tdt, ref_tdt, reduction_weights


def _check(case, device, dtype=torch.float64, layout="separate", reduction="none", **opts):
    B = case["token_logits"].shape[0]
    w = reduction_weights(reduction, case["target_lengths"], B, seed=7)
    loss, gt, gd = lib_tdt(case, device, dtype, layout, reduction, weights=w, **opts)
    rloss, rgt, rgd = ref_tdt(case, reduction, weights=w, **opts)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert gt.dtype == dtype and gd.dtype == dtype
    assert_close(loss, rloss, dtype, "loss")
    assert_close(gt, rgt, dtype, "token gradient")
    assert_close(gd, rgd, dtype, "duration gradient")


@pytest.mark.parametrize("layout", ["separate", "joint", "joint_fn"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reductions_and_layouts(device, layout, reduction):
    case = R.random_case(B=3, T=6, U=3, V=5, seed=11)
    case["target_lengths"][1] = 2 if reduction == "mean" else case["target_lengths"][1]
    case["target_lengths"].clamp_(min=1)  # "mean" divides by U_b
    case["targets"][case["targets"] < 0] = 0
    _check(case, device, torch.float64, layout, reduction)


@pytest.mark.parametrize("opts", [dict(sigma=0.05), dict(fastemit_lambda=0.01), dict(clamp=0.05),
                                  dict(sigma=0.03, fastemit_lambda=0.2, clamp=0.1)],
                         ids=["sigma", "fastemit", "clamp", "all"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_options(device, opts, reduction):
    case = R.random_case(B=3, T=7, U=3, V=6, seed=5)
    case["target_lengths"].clamp_(min=1)
    _check(case, device, torch.float64, "joint", reduction, **opts)


@pytest.mark.parametrize("durations", [[0, 1, 2, 3, 4], [1, 2], [2, 0, 1], [0, 3], [1],
                                       [0, 1, 2, 3, 4, 5, 6, 7, 8]],
                         ids=lambda d: "d" + "_".join(map(str, d)))
def test_duration_sets(device, durations):
    case = R.random_case(B=3, T=7, U=3, V=5, seed=len(durations), durations=durations)
    _check(case, device, torch.float64, "separate", "none")


@pytest.mark.parametrize("blank", [0, 2, 5])
def test_blank_positions(device, blank):
    case = R.random_case(B=2, T=5, U=3, V=6, blank=blank, seed=blank)
    _check(case, device, torch.float32, "separate", "none")


def test_float32_larger_batch(device):
    case = R.random_case(B=5, T=9, U=5, V=12, seed=3)
    _check(case, device, torch.float32, "joint", "none")


def test_no_labels_anywhere(device):
    # U = 0: the lattice has one row; targets are (B, 0)
    case = R.random_case(B=2, T=5, U=0, V=4, seed=2)
    _check(case, device, torch.float64, "separate", "sum")


def test_empty_target_and_mean_matches_transformers_division(device):
    # U_b = 0 is a valid sample (blanks only); "mean" divides by U_b like transformers -> inf
    case = R.random_case(B=2, T=5, U=2, V=4, seed=9)
    case["target_lengths"][1] = 0
    _check(case, device, torch.float64, "separate", "none")
    loss = warp_tdt.tdt_loss(*[case[k].to(device) if torch.is_tensor(case[k]) else case[k] for k in
                               ("token_logits", "duration_logits", "targets", "logit_lengths",
                                "target_lengths", "blank_token_id", "durations")])
    assert math.isinf(loss.item())


def test_infeasible_samples_inf_cost_zero_gradient(device):
    # durations [2] only: a sample with T_b = 3 cannot land exactly on T_b; T_b = 0 has no frames.
    case = R.random_case(B=3, T=4, U=1, V=4, seed=1, durations=[2], full_lengths=True)
    case["logit_lengths"][:] = torch.tensor([4, 3, 0])
    case["target_lengths"][:] = torch.tensor([0, 1, 1])
    loss, gt, gd = lib_tdt(case, device, torch.float64, "separate", "none")
    assert math.isfinite(loss[0].item())
    assert math.isinf(loss[1].item()) and loss[1] > 0 and math.isinf(loss[2].item())
    assert torch.isfinite(gt).all() and torch.isfinite(gd).all()
    assert (gt[1:] == 0).all() and (gd[1:] == 0).all()
    rloss, rgt, rgd = ref_tdt(case)
    torch.testing.assert_close(gt, rgt)
    torch.testing.assert_close(gd, rgd)
    # summed, the loss is inf; the feasible sample's gradient is still exact
    loss_sum, gt_sum, _ = lib_tdt(case, device, torch.float64, "separate", "sum")
    assert math.isinf(loss_sum.item())
    torch.testing.assert_close(gt_sum, rgt)


def test_padding_beyond_lengths_is_never_read(device):
    case = R.random_case(B=3, T=6, U=4, V=5, seed=4)
    base = lib_tdt(case, device, torch.float64)
    # junk in the padded labels and in the logits outside each sample's lattice changes nothing
    case2 = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in case.items()}
    for b in range(3):
        Tb, Ub = int(case["logit_lengths"][b]), int(case["target_lengths"][b])
        case2["targets"][b, Ub:] = 10 ** 6
        case2["token_logits"][b, Tb:] = 1e4
        case2["token_logits"][b, :, Ub + 1:] = -1e4
        case2["duration_logits"][b, Tb:] = 3e3
    other = lib_tdt(case2, device, torch.float64)
    torch.testing.assert_close(other[0], base[0])
    for b in range(3):
        Tb, Ub = int(case["logit_lengths"][b]), int(case["target_lengths"][b])
        torch.testing.assert_close(other[1][b, :Tb, :Ub + 1], base[1][b, :Tb, :Ub + 1])
        assert (other[1][b, Tb:] == 0).all() and (other[1][b, :, Ub + 1:] == 0).all()


def test_deterministic_bits(device):
    case = R.random_case(B=4, T=8, U=4, V=7, seed=8)
    a = lib_tdt(case, device, torch.float32, "joint", "mean")
    b = lib_tdt(case, device, torch.float32, "joint", "mean")
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_empty_batch_and_no_frames(device):
    for B, T in ((0, 5), (2, 0)):
        tok = torch.randn(B, T, 3, 4, device=device, requires_grad=True)
        dur = torch.randn(B, T, 3, 3, device=device, requires_grad=True)
        loss = warp_tdt.tdt_loss(tok, dur, torch.zeros(B, 2, dtype=torch.long), [T] * B, [2] * B, 3,
                                 [0, 1, 2], reduction="none")
        assert loss.shape == (B,) and bool(torch.isinf(loss).all())
        loss.sum().backward()
        assert tok.grad.shape == tok.shape and (tok.grad == 0).all() and (dur.grad == 0).all()


@pytest.mark.parametrize("reduction", ["sum", "mean", "mean_batch"])
def test_reductions_of_an_empty_batch_and_of_no_frames(device, reduction):
    """No library call there: the binding writes what the library would (a sum of 0 and a mean
    of NaN for no sample, as torch's; inf when every sample is infeasible), and the gradient of
    the infeasible samples is exactly 0."""
    for B, T in ((0, 5), (2, 0)):
        tok = torch.randn(B, T, 3, 4, device=device, requires_grad=True)
        dur = torch.randn(B, T, 3, 3, device=device, requires_grad=True)
        loss = warp_tdt.tdt_loss(tok, dur, torch.zeros(B, 2, dtype=torch.long), [T] * B, [2] * B, 3,
                                 [0, 1, 2], reduction=reduction)
        want = float("inf") if B else (0.0 if reduction == "sum" else float("nan"))
        assert loss.shape == () and loss.dtype == torch.float32
        assert (math.isnan(loss.item()) if math.isnan(want) else loss.item() == want), \
            "B=%d T=%d %s: %r, not %r" % (B, T, reduction, loss.item(), want)
        loss.backward()
        assert (tok.grad == 0).all() and (dur.grad == 0).all()


_TORCH_REDUCTIONS = {
    "sum": lambda c, ll: c.sum(),
    "mean": lambda c, ll: (c / ll.to(c.dtype)).mean(),
    "mean_batch": lambda c, ll: c.mean(),
    "mean_volume": lambda c, ll: c.sum() / ll.sum().to(c.dtype),
}


def _library_reduction(costs, reduction, ll):
    """What options.reduction writes for "sum", "mean" and "mean_batch" (tdt.h): the (per-label,
    for "mean": the library's bits of costs / U_b in the accumulate type) costs summed in float64
    in sample order, divided by B for a mean, rounded once to the costs' dtype."""
    per = costs / ll.to(costs.dtype) if reduction == "mean" else costs
    total = 0.0
    for c in per.tolist():  # Python floats: float64 additions, b ascending
        total += c
    if reduction != "sum":
        total /= per.shape[0]
    return torch.tensor(total, dtype=torch.float64).to(costs.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", sorted(_TORCH_REDUCTIONS))
def test_reduction_inside_the_node_is_the_torch_expression(device, reduction, dtype):
    """The reduction runs inside the loss's one autograd node: the gradient it sends back is
    that of the documented torch expression applied to reduction="none", to the bit (a U_b = 0
    sample included: its mean term is inf). The value: for "sum" and the means the library's
    own (options.reduction: a float64 sum rounded once, to the bit), within an ulp or two of
    the torch expression's float32 sum; for "mean_volume" the torch expression's bits."""
    case = R.random_case(B=3, T=7, U=3, V=6, seed=23)  # B = 3: 1.7 / 3 is not 1.7 * (1 / 3)
    case["target_lengths"][2] = 0 if reduction != "mean" else case["target_lengths"][2]
    args = (case["targets"], case["logit_lengths"], case["target_lengths"],
            case["blank_token_id"], case["durations"])
    ll = case["target_lengths"].to(device)
    grads = []
    for folded in (True, False):
        tok = case["token_logits"].to(device, dtype).requires_grad_(True)
        dur = case["duration_logits"].to(device, dtype).requires_grad_(True)
        if folded:
            loss = warp_tdt.tdt_loss(tok, dur, *args, reduction=reduction)
        else:
            costs = warp_tdt.tdt_loss(tok, dur, *args, reduction="none")
            loss = _TORCH_REDUCTIONS[reduction](costs, ll)
            by_rule = _library_reduction(costs.detach(), reduction, ll)
        (loss * 1.7).backward()  # an upstream gradient other than 1
        grads.append((loss.detach().cpu(), tok.grad.cpu(), dur.grad.cpu()))
    for what, a, b in zip(("token gradient", "duration gradient"), grads[0][1:], grads[1][1:]):
        assert torch.equal(a, b), "%s with reduction=%r differs from the torch expression: %s vs %s" \
            % (what, reduction, a.flatten()[:4].tolist(), b.flatten()[:4].tolist())
    got, torch_value = grads[0][0], grads[1][0]
    want = torch_value if reduction == "mean_volume" else by_rule.cpu()
    assert torch.equal(got, want), "loss with reduction=%r: %r, not %r (torch's expression: %r)" \
        % (reduction, got.item(), want.item(), torch_value.item())
    assert torch.allclose(got, torch_value, rtol=4 * torch.finfo(dtype).eps, atol=0), \
        "loss with reduction=%r: %r, far from torch's %r" % (reduction, got.item(), torch_value.item())


@pytest.mark.parametrize("reduction", ["mean", "mean_batch", "sum"])
def test_mean_reduction_divides_by_the_label_lengths_in_the_library(device, reduction, monkeypatch):
    """reduction="mean" asks the library for per-label costs (options.normalize_costs) in the
    forward and the backward alike, and on CUDA both batch means have the library divide the
    upstream by B (options.batch_mean, the product with 1 / B that torch's CUDA division is), so
    torch's part is the forward's batch mean (the test above holds the bits to the torch
    expression's); every other reduction gets plain costs and upstreams."""
    from warp_tdt import _core
    seen = []
    real = _core._call

    def spy(fn_name, logits, o, *args):
        seen.append((fn_name, (o.normalize_costs, o.batch_mean), o.reduction))
        return real(fn_name, logits, o, *args)

    monkeypatch.setattr(_core, "_call", spy)
    case = R.random_case(B=3, T=6, U=3, V=5, seed=31)
    tok = case["token_logits"].to(device).requires_grad_(True)
    dur = case["duration_logits"].to(device).requires_grad_(True)
    warp_tdt.tdt_loss(tok, dur, case["targets"], case["logit_lengths"], case["target_lengths"],
                      case["blank_token_id"], case["durations"], reduction=reduction).backward()
    loss_calls = [n for f, n, _ in seen if f != "tdt_pack_indices"]
    want = (int(reduction == "mean"), int(reduction != "sum" and device == "cuda"))
    assert len(loss_calls) >= 2 and set(loss_calls) == {want}, seen
    # the value: the library's reduction (options.reduction), asked of the forward call
    forward = [r for f, _, r in seen if f in ("tdt_forward", "tdt_forward_ahead")]
    lib = _core._lib
    assert forward == [lib.REDUCTION_SUM if reduction == "sum" else lib.REDUCTION_MEAN], seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ahead_weights_are_the_reductions_gradient_bitwise(reduction, dtype):
    """The weights the forward hands tdt_forward_ahead() where the plan writes the gradients
    ahead (_autograd.scale_items, then _upstream of a 1) are, to the bit, the gradient autograd
    sends the costs through the reduction for loss.backward(): the upstream the pair's backward
    would pass for it. (B = 5 and these lengths: dividing by U_b before B gives other bits in
    both dtypes, so the order of the divisions is checked too.)"""
    from warp_tdt import _autograd
    ll = torch.tensor([7, 11, 13, 2, 9])
    costs = torch.tensor([1.5, 2.25, 0.1, 3.0, 0.7], dtype=dtype, requires_grad=True)
    out, _ = _autograd.reduce(costs, ll, reduction)
    (out if out.dim() == 0 else out.sum()).backward()
    items = _autograd.scale_items(ll, reduction, 5, dtype)
    w = torch.ones((), dtype=dtype) if items is None else _autograd._upstream(
        torch.ones((), dtype=dtype), items)
    assert torch.equal(w.expand(5), costs.grad), "%s: weights %s, autograd %s" % (
        reduction, w.expand(5).tolist(), costs.grad.tolist())


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_rnnt_reduction_inside_the_node_is_torchaudios(device, reduction):
    """rnnt_loss's reductions: the gradient of torchaudio's expression to the bit, the value the
    library's float64 sum rounded once (options.reduction), as tdt_loss's."""
    case = R.random_case(B=3, T=5, U=2, V=5, seed=29)
    z = case["token_logits"]
    args = (case["targets"], case["logit_lengths"], case["target_lengths"])
    out = []
    for folded in (True, False):
        x = z.to(device).clone().requires_grad_(True)
        if folded:
            loss = warp_tdt.rnnt_loss(x, *args, blank=-1, reduction=reduction)
        else:
            c = warp_tdt.rnnt_loss(x, *args, blank=-1, reduction="none")
            loss = c.mean() if reduction == "mean" else c.sum()
            want = _library_reduction(c.detach(), "mean_batch" if reduction == "mean" else "sum",
                                      None).cpu()
        (loss * 0.3).backward()
        out.append((loss.detach().cpu(), x.grad.cpu()))
    assert torch.equal(out[0][0], want), "rnnt loss (%s): %s vs %s" % (reduction, out[0][0], want)
    assert torch.allclose(out[0][0], out[1][0], rtol=4e-7, atol=0), \
        "rnnt loss (%s): %s vs torch's %s" % (reduction, out[0][0], out[1][0])
    assert torch.equal(out[0][1], out[1][1]), "rnnt gradient (%s) differs" % reduction


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_costs_only_call_without_gradients(device, reduction, monkeypatch):
    """Under torch.no_grad() (or with logits that need no gradient) a call is the library's
    costs-only one (alpha alone), and its loss is the autograd call's to the bit."""
    calls = []
    real = _core._call

    def spy(fn_name, *args):
        calls.append(fn_name)
        return real(fn_name, *args)

    monkeypatch.setattr(_core, "_call", spy)
    case = R.random_case(B=3, T=6, U=3, V=5, seed=41)
    case["target_lengths"].clamp_(min=1)  # "mean" divides by U_b
    case["targets"][case["targets"] < 0] = 0
    args = (case["targets"], case["logit_lengths"], case["target_lengths"],
            case["blank_token_id"], case["durations"])
    tok = case["token_logits"].to(device).requires_grad_(True)
    dur = case["duration_logits"].to(device).requires_grad_(True)
    want = warp_tdt.tdt_loss(tok, dur, *args, reduction=reduction)
    assert calls == ["tdt_forward"]
    expected = "compute_tdt_loss"
    for how in ("no_grad", "detached"):
        calls.clear()
        if how == "no_grad":
            with torch.no_grad():
                got = warp_tdt.tdt_loss(tok, dur, *args, reduction=reduction)
        else:
            got = warp_tdt.tdt_loss(tok.detach(), dur.detach(), *args, reduction=reduction)
        assert calls == [expected], "%s: %s" % (how, calls)
        assert not got.requires_grad
        assert torch.equal(got, want.detach()), "%s (%s): %s vs %s" % (how, reduction, got, want)
