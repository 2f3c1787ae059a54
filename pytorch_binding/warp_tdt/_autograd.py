"""The eager autograd path: one torch.autograd.Function over tdt_forward() / tdt_backward().

Forward runs tdt_forward() into a workspace allocated through torch's allocator on the logits'
device and keeps it (with the logits) for backward. Backward passes the upstream per-sample
gradient straight to tdt_backward(), which folds it into the one pass that writes each gradient
element: reductions (mean over U_b, sum, ...) reach the library as per-sample weights, and no
second pass over the gradient happens in Python.

Used on every torch version in eager mode (it costs far less per call than a dispatcher custom
op); _ops.py holds the torch.compile custom ops for torch >= 2.4.
"""

import torch

from . import _core

try:  # torch >= 2.4
    _custom_fwd = torch.amp.custom_fwd(device_type="cuda")
    _custom_bwd = torch.amp.custom_bwd(device_type="cuda")
except (AttributeError, TypeError):  # older torch
    _custom_fwd = torch.cuda.amp.custom_fwd
    _custom_bwd = torch.cuda.amp.custom_bwd


class LossFunction(torch.autograd.Function):
    """costs = LossFunction.apply(logits, duration, labels, frame_lengths, label_lengths,
    spec, as_rnnt, in_place). ``logits`` is the token tensor, or the joint tensor when
    spec.mode == "joint" (then ``duration`` is None)."""

    @staticmethod
    @_custom_fwd
    def forward(ctx, logits, duration, labels, frame_lengths, label_lengths, spec, as_rnnt, in_place):
        built = []
        costs, workspace = _core.forward(spec, logits, duration, labels, frame_lengths,
                                         label_lengths, as_rnnt, built=built)
        ctx.save_for_backward(logits, duration)
        ctx.labels, ctx.frame_lengths, ctx.label_lengths = labels, frame_lengths, label_lengths
        ctx.workspace = workspace
        ctx.built = built[0] if built else None  # the C structs, reused by backward
        ctx.spec, ctx.as_rnnt, ctx.in_place = spec, as_rnnt, in_place
        ctx.spent = False
        return costs

    @staticmethod
    @_custom_bwd
    def backward(ctx, grad_costs):
        logits, duration = ctx.saved_tensors
        need_logits, need_duration = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        nones = (None,) * 6
        if not (need_logits or need_duration):
            return (None, None) + nones
        if ctx.in_place:
            if ctx.spent:
                raise RuntimeError(
                    "warp_tdt: in_place=True wrote the gradient over the logits in the first "
                    "backward pass, so a second backward through the same loss cannot be "
                    "computed; use in_place=False with retain_graph=True")
            ctx.spent = True
        g_logits, g_duration = _core.backward(
            ctx.spec, grad_costs, logits, duration, ctx.labels, ctx.frame_lengths,
            ctx.label_lengths, ctx.workspace, ctx.as_rnnt, need_logits=need_logits,
            need_duration=need_duration, in_place=ctx.in_place, built=ctx.built)
        if ctx.in_place:
            ctx.workspace = None  # nothing can use it again; free it now
        return (g_logits if need_logits else None, g_duration) + nones
