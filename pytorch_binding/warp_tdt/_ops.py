"""torch.compile support: the loss as two custom ops with fake (meta) implementations.

On torch >= 2.4 this registers

    warp_tdt::loss_forward(logits, duration_logits?, labels, frame_lengths, label_lengths,
                           rnnt_draw?, vocab_size, durations, blank, sigma, fastemit_lambda,
                           clamp, log_probs, validate) -> (costs, workspace)
    warp_tdt::loss_backward(grad_costs, logits, duration_logits?, labels, frame_lengths,
                            label_lengths, workspace, rnnt_draw?, vocab_size, durations, blank,
                            sigma, fastemit_lambda, clamp, log_probs) -> (grad_logits, grad_duration)

with torch.library.register_autograd tying them together, so torch.compile(fullgraph=True)
traces through the loss and torch.library.opcheck passes. Layouts as in _core: duration_logits
given -> separate tensors; absent with durations -> ``logits`` is the joint tensor (V + D wide);
absent without durations -> plain RNN-T. ``rnnt_draw`` is the 0-d bool tensor of the omega draw
(None when omega == 0). ``grad_duration`` is an empty (0,) tensor when duration_logits is absent.

The workspace is an output of the forward op, saved for the backward op. Its size must follow
from shapes alone (symbolic under dynamic shapes), so it is _core.workspace_bound() bytes, and its
bytes must be a function of the inputs alone (opcheck compares outputs): it is zero-filled, and on
a host whose allocation is not 256-byte aligned the library's aligned block is moved to offset 0
after the forward (and back into an aligned scratch for the backward). CUDA allocations are
always aligned, so on the GPU the only cost over the eager path is the zero fill of the small
workspace. Eager calls do not come here: they use the lighter autograd.Function in _autograd.py.
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _core

__all__ = ["AVAILABLE"]

_ALIGN = 256


def _version_at_least(major, minor):
    try:
        parts = torch.__version__.split("+")[0].split(".")
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


AVAILABLE = _version_at_least(2, 4) and hasattr(torch, "library") and hasattr(torch.library, "custom_op")

_OP_NAMES = {"logits": "logits", "targets": "targets", "logit_lengths": "logit_lengths",
             "target_lengths": "target_lengths", "blank": "blank"}


def _spec(logits, duration_logits, vocab_size, durations, blank, sigma, fastemit_lambda, clamp,
          log_probs):
    if duration_logits is not None:
        mode = "separate"
    elif len(durations) > 0:
        mode = "joint"
    else:
        mode = "rnnt"
    return _core.Spec(mode, int(vocab_size), tuple(int(d) for d in durations), int(blank),
                      float(sigma), float(fastemit_lambda), float(clamp), bool(log_probs))


def _capturing(t):
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _canonicalise(ws):
    """Moves the library's aligned block to offset 0 of ws (host tensors off a 256-byte grid)."""
    off = (-ws.data_ptr()) % _ALIGN
    if off:
        n = ws.numel()
        ws[: n - off].copy_(ws[off:].clone())
        ws[n - off:].zero_()
    return ws


def _aligned(ws):
    """ws itself when aligned, else an aligned copy of it (see _canonicalise)."""
    if ws.data_ptr() % _ALIGN == 0:
        return ws
    n = ws.numel()
    scratch = torch.empty(n + _ALIGN, dtype=torch.uint8, device=ws.device)
    off = (-scratch.data_ptr()) % _ALIGN
    view = scratch[off: off + n]
    view.copy_(ws)
    return view


# ---- the op bodies: plain functions on every torch version (the tests call them directly) ----


def forward_impl(
    logits: Tensor,
    duration_logits: Optional[Tensor],
    labels: Tensor,
    frame_lengths: Tensor,
    label_lengths: Tensor,
    rnnt_draw: Optional[Tensor],
    vocab_size: int,
    durations: List[int],
    blank: int,
    sigma: float,
    fastemit_lambda: float,
    clamp: float,
    log_probs: bool,
    validate: bool,
) -> Tuple[Tensor, Tensor]:
    spec = _spec(logits, duration_logits, vocab_size, durations, blank, sigma, fastemit_lambda,
                 clamp, log_probs)
    as_rnnt = rnnt_draw is not None and bool(rnnt_draw)
    if validate and not _capturing(logits):
        _core.validate_data(spec, logits, labels, frame_lengths, label_lengths, _OP_NAMES)
    B, T, rows = (int(x) for x in logits.shape[:3])
    bound = _core.workspace_bound(B, T, rows, len(durations))
    costs, ws = _core.forward(spec, logits, duration_logits, labels, frame_lengths, label_lengths,
                              as_rnnt, workspace_bytes=bound, zero_workspace=True)
    return costs, _canonicalise(ws)


def forward_fake(logits, duration_logits, labels, frame_lengths, label_lengths, rnnt_draw,
                 vocab_size, durations, blank, sigma, fastemit_lambda, clamp, log_probs, validate):
    B, T, rows = logits.shape[0], logits.shape[1], logits.shape[2]
    costs = logits.new_empty((B,), dtype=_core.acc_dtype(logits.dtype))
    ws = logits.new_empty((_core.workspace_bound(B, T, rows, len(durations)),), dtype=torch.uint8)
    return costs, ws


def backward_impl(
    grad_costs: Tensor,
    logits: Tensor,
    duration_logits: Optional[Tensor],
    labels: Tensor,
    frame_lengths: Tensor,
    label_lengths: Tensor,
    workspace: Tensor,
    rnnt_draw: Optional[Tensor],
    vocab_size: int,
    durations: List[int],
    blank: int,
    sigma: float,
    fastemit_lambda: float,
    clamp: float,
    log_probs: bool,
) -> Tuple[Tensor, Tensor]:
    spec = _spec(logits, duration_logits, vocab_size, durations, blank, sigma, fastemit_lambda,
                 clamp, log_probs)
    as_rnnt = rnnt_draw is not None and bool(rnnt_draw)
    g_logits, g_duration = _core.backward(
        spec, grad_costs, logits, duration_logits, labels, frame_lengths, label_lengths,
        _aligned(workspace), as_rnnt, need_logits=True, need_duration=duration_logits is not None)
    if g_duration is None:
        g_duration = logits.new_empty((0,))
    return g_logits, g_duration


def backward_fake(grad_costs, logits, duration_logits, labels, frame_lengths, label_lengths,
                  workspace, rnnt_draw, vocab_size, durations, blank, sigma, fastemit_lambda, clamp,
                  log_probs):
    g_logits = torch.empty_like(logits, memory_format=torch.preserve_format)
    if duration_logits is None:
        g_duration = logits.new_empty((0,))
    else:
        g_duration = torch.empty_like(duration_logits, memory_format=torch.preserve_format)
    return g_logits, g_duration


def setup_context(ctx, inputs, output):
    (logits, duration_logits, labels, frame_lengths, label_lengths, rnnt_draw, vocab_size,
     durations, blank, sigma, fastemit_lambda, clamp, log_probs, _validate) = inputs
    _costs, workspace = output
    ctx.save_for_backward(logits, duration_logits, labels, frame_lengths, label_lengths, rnnt_draw,
                          workspace)
    ctx.args = (int(vocab_size), list(durations), int(blank), float(sigma), float(fastemit_lambda),
                float(clamp), bool(log_probs))


def backward_formula(ctx, grad_costs, _grad_workspace):
    (logits, duration_logits, labels, frame_lengths, label_lengths, rnnt_draw,
     workspace) = ctx.saved_tensors
    if grad_costs is None:
        grad_costs = torch.zeros(logits.shape[0], dtype=_core.acc_dtype(logits.dtype),
                                 device=logits.device)
    g_logits, g_duration = _backward_op(grad_costs, logits, duration_logits, labels, frame_lengths,
                                        label_lengths, workspace, rnnt_draw, *ctx.args)
    return (g_logits, g_duration if duration_logits is not None else None) + (None,) * 12


_backward_op = backward_impl  # the registered op where custom ops exist (so compile traces it)

if AVAILABLE:
    loss_forward = torch.library.custom_op("warp_tdt::loss_forward", mutates_args=())(forward_impl)
    loss_forward.register_fake(forward_fake)
    loss_backward = torch.library.custom_op("warp_tdt::loss_backward", mutates_args=())(backward_impl)
    loss_backward.register_fake(backward_fake)
    loss_forward.register_autograd(backward_formula, setup_context=setup_context)
    _backward_op = loss_backward


def costs(spec, logits, duration, labels, frame_lengths, label_lengths, omega, validate):
    """Per-sample costs through the custom ops (the torch.compile path)."""
    draw = (torch.rand(()) < omega) if omega > 0 else None
    c, _ws = torch.ops.warp_tdt.loss_forward(
        logits, duration, labels, frame_lengths, label_lengths, draw, spec.vocab_size,
        list(spec.durations), spec.blank, spec.sigma, spec.fastemit_lambda, spec.clamp,
        spec.log_probs, validate)
    return c
