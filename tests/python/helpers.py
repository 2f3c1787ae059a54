"""One helper per call shape, so each test body is a line or two."""

import torch

import reference as R
import warp_tdt

REDUCTIONS = ("none", "sum", "mean", "mean_batch", "mean_volume")


def reduction_weights(reduction, label_lengths, B, seed=0):
    """The per-sample upstream gradient each reduction implies (random ones for "none")."""
    ll = label_lengths.double().cpu()
    if reduction == "none":
        return torch.rand(B, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.5
    if reduction == "sum":
        return torch.ones(B, dtype=torch.float64)
    if reduction == "mean":
        return 1.0 / (B * ll)
    if reduction == "mean_batch":
        return torch.full((B,), 1.0 / B, dtype=torch.float64)
    return torch.full((B,), 1.0 / float(ll.sum()), dtype=torch.float64)


def lib_tdt(case, device="cpu", dtype=torch.float32, layout="separate", reduction="none",
            weights=None, **kw):
    """Runs warp_tdt.tdt_loss on a reference.random_case() and backpropagates.

    layout: "separate" (two tensors), "joint" (two slices of one leaf joint tensor),
    "joint_fn" (tdt_loss_joint). Returns (loss, token_grad, duration_grad) on the CPU.
    """
    tok0 = case["token_logits"].to(device=device, dtype=dtype)
    dur0 = case["duration_logits"].to(device=device, dtype=dtype)
    V = tok0.shape[-1]
    args = (case["targets"], case["logit_lengths"], case["target_lengths"],
            case["blank_token_id"], case["durations"])
    if layout == "separate":
        tok = tok0.clone().requires_grad_(True)
        dur = dur0.clone().requires_grad_(True)
        loss = warp_tdt.tdt_loss(tok, dur, *args, reduction=reduction, **kw)
    else:
        joint = torch.cat([tok0, dur0], -1).requires_grad_(True)
        if layout == "joint":
            loss = warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], *args, reduction=reduction, **kw)
        else:
            loss = warp_tdt.tdt_loss_joint(joint, *args, reduction=reduction, **kw)
    if reduction == "none":
        w = weights if weights is not None else torch.ones(loss.shape[0], dtype=torch.float64)
        (loss * w.to(device=loss.device, dtype=loss.dtype)).sum().backward()
    else:
        loss.backward()
    if layout == "separate":
        gt, gd = tok.grad, dur.grad
    else:
        gt, gd = joint.grad[..., :V], joint.grad[..., V:]
    return loss.detach().cpu(), gt.cpu(), gd.cpu()


def joint_grad(case):
    """The gradient of tdt_loss(reduction="sum") on a reference.random_case() given as the two
    slices of one leaf joint tensor: the joint tensor's .grad itself (the buffer the binding
    handed to autograd), on the case's device."""
    V = case["token_logits"].shape[-1]
    joint = torch.cat([case["token_logits"], case["duration_logits"]], -1).requires_grad_(True)
    warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], case["targets"], case["logit_lengths"],
                      case["target_lengths"], case["blank_token_id"], case["durations"],
                      reduction="sum").backward()
    return joint.grad


def ref_tdt(case, reduction="none", weights=None, sigma=0.0, fastemit_lambda=0.0, clamp=0.0):
    """The reference (loss reduced as the library should, token grad, duration grad), float64."""
    B = case["token_logits"].shape[0]
    ll = case["target_lengths"].cpu()
    w = weights if reduction == "none" and weights is not None else reduction_weights(reduction, ll, B)
    if reduction == "none" and weights is None:
        w = torch.ones(B, dtype=torch.float64)
    costs, gz, gh = R.tdt_grads(case["token_logits"].cpu(), case["duration_logits"].cpu(),
                                case["targets"].cpu(), case["logit_lengths"].cpu(), ll,
                                case["blank_token_id"], case["durations"], sigma, fastemit_lambda,
                                clamp, w)
    return R.reduce(costs, ll, reduction), gz, gh


def tolerances(dtype):
    return {torch.float64: dict(atol=1e-9, rtol=1e-9),
            torch.float32: dict(atol=2e-5, rtol=2e-5),
            torch.float16: dict(atol=2e-2, rtol=2e-2),
            torch.bfloat16: dict(atol=8e-2, rtol=5e-2)}[dtype]


def assert_close(actual, expected, dtype, what):
    tol = tolerances(dtype)
    torch.testing.assert_close(actual.double(), expected.double(), **tol,
                               msg=lambda m: "%s (%s): %s" % (what, dtype, m))


def joint_step(case, dtype, reduction, device, factor=None, retain=False):
    """loss.backward() (times `factor` when given) through tdt_loss on a joint tensor on
    `device`; returns (loss, joint gradient[, second joint gradient after retain_graph])."""
    tok = case["token_logits"].to(device=device, dtype=dtype)
    dur = case["duration_logits"].to(device=device, dtype=dtype)
    V = tok.shape[-1]
    joint = torch.cat([tok, dur], -1).requires_grad_(True)
    loss = warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], case["targets"], case["logit_lengths"],
                             case["target_lengths"], case["blank_token_id"], case["durations"],
                             reduction=reduction)
    out = loss if reduction != "none" else loss.sum()
    if factor is not None:
        out = out * factor
    out.backward(retain_graph=retain)
    first = joint.grad.clone()
    if not retain:
        return loss.detach(), first
    joint.grad = None
    out.backward()
    return loss.detach(), first, joint.grad.clone()
