"""rnnt_loss / RNNTLoss: torchaudio's signature and semantics, against the reference (and
against torchaudio itself where it is installed and still has rnnt_loss)."""

import inspect

import pytest
import torch

import reference as R
import warp_tdt


def _case(seed=41, B=3, T=6, U=3, V=6, blank=None):
    c = R.random_case(B=B, T=T, U=U, V=V, seed=seed, dtype=torch.float64, blank=blank)
    return c["token_logits"], c["targets"], c["logit_lengths"], c["target_lengths"], c["blank_token_id"]


def _ref(x, targets, fl, ll, blank, reduction="none", clamp=0.0, fastemit_lambda=0.0, log_probs=False,
         weights=None):
    """(reduced reference loss, gradient of sum_b w_b cost_b with the per-sample clamp)."""
    z = x.detach().cpu().double().requires_grad_(True)
    c = R.rnnt_costs(z, targets.cpu(), fl.cpu(), ll.cpu(), blank, fastemit_lambda, log_probs)
    (g,) = torch.autograd.grad(c.sum(), z)
    if clamp > 0:
        g = g.clamp(-clamp, clamp)
    if weights is not None:
        g = g * weights.view(-1, 1, 1, 1)
    c = c.detach()
    return {"none": c, "sum": c.sum(), "mean": c.mean()}[reduction], g


def test_signature_matches_torchaudio():
    params = list(inspect.signature(warp_tdt.rnnt_loss).parameters.values())
    assert [p.name for p in params[:8]] == ["logits", "targets", "logit_lengths", "target_lengths",
                                            "blank", "clamp", "reduction", "fused_log_softmax"]
    assert [p.default for p in params[4:8]] == [-1, -1, "mean", True]
    assert all(p.kind == p.KEYWORD_ONLY for p in params[8:])


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("blank", [-1, 0, 2])
def test_against_reference(device, reduction, blank):
    x, targets, fl, ll, _ = _case(blank=(blank % 6))
    xd = x.to(device).clone().requires_grad_(True)
    loss = warp_tdt.rnnt_loss(xd, targets, fl, ll, blank=blank, reduction=reduction)
    w = torch.rand(3, dtype=torch.float64) + 0.5 if reduction == "none" else \
        torch.full((3,), 1.0 / 3 if reduction == "mean" else 1.0, dtype=torch.float64)
    (loss * w.to(device) if reduction == "none" else loss).sum().backward()
    rloss, rg = _ref(x, targets, fl, ll, blank % 6, reduction, weights=w)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss.detach().cpu(), rloss)
    torch.testing.assert_close(xd.grad.cpu(), rg)


@pytest.mark.parametrize("opts", [dict(clamp=0.05), dict(fastemit_lambda=0.1)], ids=["clamp", "fastemit"])
def test_options(device, opts):
    x, targets, fl, ll, blank = _case(seed=42)
    xd = x.to(device).clone().requires_grad_(True)
    loss = warp_tdt.rnnt_loss(xd, targets, fl, ll, reduction="sum", **opts)
    loss.backward()
    rloss, rg = _ref(x, targets, fl, ll, blank, "sum", **opts)
    torch.testing.assert_close(loss.detach().cpu(), rloss)
    torch.testing.assert_close(xd.grad.cpu(), rg)


def test_log_probs_input(device):
    # fused_log_softmax=False: inputs are log-probs; the gradient is d loss / d log-probs, and
    # through an outer log_softmax it equals the fused gradient
    x, targets, fl, ll, blank = _case(seed=43)
    a = x.to(device).clone().requires_grad_(True)
    fused = warp_tdt.rnnt_loss(a, targets, fl, ll, reduction="sum")
    fused.backward()
    b = x.to(device).clone().requires_grad_(True)
    lp = torch.log_softmax(b, -1)
    lp.retain_grad()
    unfused = warp_tdt.rnnt_loss(lp, targets, fl, ll, reduction="sum", fused_log_softmax=False)
    unfused.backward()
    torch.testing.assert_close(unfused, fused)
    torch.testing.assert_close(b.grad, a.grad)
    _, rg = _ref(lp, targets, fl, ll, blank, "sum", log_probs=True)
    torch.testing.assert_close(lp.grad.cpu(), rg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_result_in_the_logits_dtype(device, dtype):
    x, targets, fl, ll, blank = _case(seed=44)
    loss = warp_tdt.rnnt_loss(x.to(device, dtype), targets, fl, ll)
    assert loss.dtype == dtype
    rloss, _ = _ref(x.to(dtype).double(), targets, fl, ll, blank, "mean")
    assert loss.item() == pytest.approx(rloss.item(), rel=2e-2 if dtype != torch.float32 else 1e-5)


def test_module(device):
    x, targets, fl, ll, blank = _case(seed=45)
    m = warp_tdt.RNNTLoss(blank=-1, reduction="sum")
    assert "reduction='sum'" in repr(m)
    assert m(x.to(device), targets, fl, ll).item() == pytest.approx(
        warp_tdt.rnnt_loss(x, targets, fl, ll, reduction="sum").item(), rel=1e-12)


def _torchaudio_rnnt():
    """torchaudio.functional.rnnt_loss, or a skip that says why it is missing (Debian's
    python3-torchaudio 0.13 has it; torchaudio 2.9 removed it)."""
    torchaudio = pytest.importorskip("torchaudio")
    F = getattr(torchaudio, "functional", None)
    if F is None or not hasattr(F, "rnnt_loss"):
        pytest.skip("torchaudio %s has no rnnt_loss" % getattr(torchaudio, "__version__", "?"))
    return torchaudio


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("blank,clamp", [(-1, -1), (0, -1), (2, -1), (-1, 0.05)],
                         ids=["blank-1", "blank0", "blank2", "clamp"])
def test_matches_torchaudio_where_available(device, reduction, blank, clamp):
    """The drop-in claim itself: the same call on torchaudio's rnnt_loss and on ours gives the
    same loss and the same gradient (ragged lengths, padding that must not be read)."""
    F = _torchaudio_rnnt().functional
    x, targets, fl, ll, _ = _case(seed=46, B=4, T=7, U=4, V=7, blank=blank % 7)
    targets = targets.clamp(min=0)  # torchaudio reads no padding either, but wants it in range
    x = x.float().to(device)
    a = x.clone().requires_grad_(True)
    b = x.clone()
    args = (targets.int().to(device), fl.int().to(device), ll.int().to(device))
    # torchaudio's CPU kernel is the reference on every device: its CUDA kernel (torchaudio
    # 2.11 on an H100) gives the sample of this batch without labels (U_b = 0, T_b = 3) a cost of
    # 0.0 where its CPU kernel and ours, on either device, give 6.145
    b_cpu = b.detach().cpu().requires_grad_(True)
    try:
        theirs = F.rnnt_loss(b_cpu, *(t.cpu() for t in args), blank=blank, reduction=reduction,
                             clamp=clamp)
    except (RuntimeError, NotImplementedError) as e:  # e.g. a build without the extension
        pytest.skip("torchaudio.functional.rnnt_loss unusable here: %s" % e)
    ours = warp_tdt.rnnt_loss(a, *args, blank=blank, reduction=reduction, clamp=clamp).cpu()
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
    w = torch.linspace(0.5, 1.5, 4) if reduction == "none" else 1.0
    (ours * w).sum().backward()
    (theirs * w).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), b_cpu.grad, atol=1e-5, rtol=1e-4)


def test_module_matches_torchaudio_where_available(device):
    torchaudio = _torchaudio_rnnt()
    T = getattr(torchaudio, "transforms", None)
    if T is None or not hasattr(T, "RNNTLoss"):
        pytest.skip("this torchaudio has no transforms.RNNTLoss")
    x, targets, fl, ll, _ = _case(seed=47, B=3, T=6, U=3, V=6)
    targets = targets.clamp(min=0)
    x = x.float().to(device)
    args = (targets.int().to(device), fl.int().to(device), ll.int().to(device))
    grads = []
    for Loss in (T.RNNTLoss, warp_tdt.RNNTLoss):
        z = x.clone().requires_grad_(True)
        loss = Loss(reduction="sum")(z, *args)  # blank -1: the last token, as _case draws it
        loss.backward()
        grads.append((loss.detach(), z.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(grads[1][1], grads[0][1], atol=1e-5, rtol=1e-4)


def test_log_prob_inputs_match_torchaudio_where_available(device):
    """fused_log_softmax=False on log-probabilities: the loss of torchaudio's fused call on the
    logits (log_softmax leaves log-probabilities as they are), and, passed back through the
    log_softmax, its gradient; where this torchaudio takes fused_log_softmax (0.10 to 0.12, and
    2.x) its own unfused loss as well. Its unfused gradient is not compared: it is not the
    derivative with respect to the log-probabilities (see rnnt_loss's docstring)."""
    F = _torchaudio_rnnt().functional
    x, targets, fl, ll, _ = _case(seed=48, B=3, T=6, U=3, V=6)
    targets = targets.clamp(min=0)
    x = x.float().to(device)
    args = (targets.int().to(device), fl.int().to(device), ll.int().to(device))
    b = x.clone().requires_grad_(True)
    try:
        theirs = F.rnnt_loss(b, *args, reduction="none")
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip("torchaudio.functional.rnnt_loss unusable here: %s" % e)
    a = x.clone().requires_grad_(True)
    ours = warp_tdt.rnnt_loss(a.log_softmax(-1), *args, reduction="none", fused_log_softmax=False)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)
    if "fused_log_softmax" in inspect.signature(F.rnnt_loss).parameters:
        unfused = F.rnnt_loss(x.log_softmax(-1), *args, reduction="none", fused_log_softmax=False)
        torch.testing.assert_close(ours.detach(), unfused, atol=1e-4, rtol=1e-5)


