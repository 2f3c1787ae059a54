"""The eager autograd path: one torch.autograd.Function over tdt_forward() / tdt_backward().

Forward runs tdt_forward() into a workspace allocated through torch's allocator on the logits'
device and keeps it (with the logits) for backward. Backward passes the upstream per-sample
gradient straight to tdt_backward(), which folds it into the one pass that writes each gradient
element: reductions (sum, batch mean, ...) reach the library as per-sample weights, and no
second pass over the gradient happens in Python. The "mean" reduction's division by U_b is the
library's own (options.normalize_costs: the costs it returns are cost_b / U_b, and it divides
the upstream of each by U_b). The value of "sum" and of the batch means is the library's too
(options.reduction: the costs' float64 sum, rounded once); "mean_volume" is torch's.

On CUDA, where the library's plan runs the gradient pass with the forward (the fused schedule:
long rows, or rows of at least 0.4 MB a diagonal that it does not split; the
trail schedule: ragged batches), forward calls tdt_forward_ahead() instead,
with the reduction's weights (the upstream for a loss gradient of 1): the gradients are then
written in the forward, and backward only multiplies them by the loss's upstream gradient
(tdt_scale_gradients(), which reads and writes nothing when that is exactly 1, as after
loss.backward()). Whether a shape's plan writes ahead is learned from its first call and cached
(_ahead_plans), so other shapes pay nothing for it. WARP_TDT_GRADIENTS_AHEAD=0 turns it off.

Where the per-node state would be a large share of the logits (small vocabularies:
_core.state_in_grads_wanted), that forward_ahead() also keeps it in the token gradient's rows
(options.state_in_grads), whatever the plan: the workspace then holds 16 bytes a node instead of
8 (5 + D), and the peak memory of forward and backward stays near the gradient's own. The first
backward consumes that state; a second one (retain_graph=True) runs the forward again first.

Used on every torch version in eager mode (it costs far less per call than a dispatcher custom
op); _ops.py holds the torch.compile custom ops for torch >= 2.4.

No torch.amp.custom_fwd / custom_bwd: neither pass runs an op that autocast would cast (the
library reads the logits in their own dtype, and the costs are float32 under any autocast), so
the decorators would only add an autocast context to every backward (measured on the H200's
host: see docs/performance.md, "The binding's host time").
"""

import torch

from . import _core, _lib


def scale_items(label_lengths, reduction, batch, dtype):
    """reduce()'s scale for costs of this dtype, before the costs exist (see reduce())."""
    if reduction in ("none", "sum"):
        return None
    if reduction == "mean_batch":
        return (batch,)
    if reduction == "mean":
        return (batch, label_lengths)  # int32: see reduce()
    return (label_lengths.sum().to(dtype),)


def reduce(costs, label_lengths, reduction, with_scale=True, items=None):
    """The reduction of the (B,) costs, as tdt_loss defines it, and what its backward needs:
    (value, scale). scale None: the upstream gradient reaches the library as it is (one value
    a sample for "none", one value for all for "sum"); else the upstream value is divided by
    each of its items (a number or a (B,) tensor) in turn. The divisions are the ones autograd
    would run for the same torch expression, in the same order, so the gradient is the same to
    the bit. with_scale=False (the torch.compile path, where autograd differentiates the
    expression itself): the value alone, nothing read off the (possibly symbolic) shape.
    items: scale_items()'s, computed before the costs (then reused here)."""
    if reduction == "none":
        return costs, None
    if reduction == "sum":
        return costs.sum(), None
    if reduction == "mean_batch":  # costs.mean()
        return costs.mean(), ((costs.shape[0],) if with_scale else None)
    if reduction == "mean":  # (costs / U_b).mean(), NeMo / transformers
        # the int32 lengths as they are: a division promotes them to the costs' dtype inside its
        # kernel (exactly, below 2^24), the bits of dividing by their cast, without the cast's op
        per = label_lengths if items is None else items[1]
        return (costs / per).mean(), ((costs.shape[0], per) if with_scale else None)
    # mean_volume: costs.sum() / sum(U_b)
    total = label_lengths.sum().to(costs.dtype) if items is None else items[0]
    return costs.sum() / total, ((total,) if with_scale else None)


def _upstream(grad, scale):
    """The upstream gradient of the costs for an upstream gradient `grad` of reduce()'s value:
    0-d for every sample alike, else (B,)."""
    if scale is None:
        return grad
    out = grad
    for s in scale:
        out = out / s
    return out


def _library_reduction(reduction):
    """The reduction the library writes itself (options.reduction: "sum" or "mean_batch"), or
    None where torch reduces the costs ("none", "mean_volume", or a library before 0.4.0). Its
    value is the costs' float64 sum in sample order, rounded once: within an ulp of torch's
    float32 sum or mean of the same costs, and one op and one allocation fewer a call."""
    if reduction in ("sum", "mean_batch") and _core.reduction_available():
        return reduction
    return None


def _folded(reduction):
    """(reduction, per_label): "mean" = (costs / U_b).mean() is the library's per-label costs
    (options.normalize_costs, the same bits in both directions) and a batch mean, one op here
    and one division in backward instead of three ops (docs/performance.md, "The binding's host time")."""
    if reduction == "mean" and _core.per_label_available():
        return "mean_batch", True
    return reduction, False


def costs_only(spec, logits, duration, idx, as_rnnt, reduction):
    """The reduced loss of a call no gradient can be asked of: one costs-only library call
    (alpha alone is swept), and no autograd node."""
    reduction, per_label = _folded(reduction)
    lib_reduce = _library_reduction(reduction)
    costs, _ws = _core.forward(spec, logits, duration, *idx.lib_args(), as_rnnt, costs_only=True,
                               per_label=per_label, reduce=lib_reduce)
    if lib_reduce is not None:
        return costs
    return reduce(costs, idx.label_lengths if reduction in ("mean", "mean_volume") else None,
                  reduction, with_scale=False)[0]


# (spec, shape, dtype, device, RNN-T draw, gradients asked, schedule) -> whether the library
# wrote the gradients ahead for that call: a function of those alone (the plan reads no data)
_ahead_plans = {}
_PLANS_MAX = 256
_AHEAD_ENV = _lib.EnvVar("WARP_TDT_GRADIENTS_AHEAD")


def _ahead_key(ctx, logits, spec, as_rnnt, in_place):
    """The plan cache's key for a forward that might write the gradients ahead, or None where it
    cannot: on the CPU (which never does), in place (the gradient would overwrite the logits
    before a second backward could read them), with no gradient asked, or turned off."""
    if not logits.is_cuda or in_place or not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
        return None
    if _AHEAD_ENV.get() == "0" or not _core.ahead_available():
        return None
    return (spec, tuple(logits.shape), logits.dtype, logits.device.index, as_rnnt,
            ctx.needs_input_grad[:2], _core.gpu_schedule())


class LossFunction(torch.autograd.Function):
    """loss = LossFunction.apply(logits, duration, idx, spec, as_rnnt, in_place, reduction).
    ``logits`` is the token tensor, or the joint tensor when spec.mode == "joint" (then
    ``duration`` is None); ``idx`` the call's labels and lengths (functional._Indices: the
    library reads them by address, idx.lib_args(); idx keeps their memory alive). The reduction
    runs inside (the library's own for "sum" and the batch means, else reduce()), so a step's
    autograd graph holds this one node: on a GPU whose kernels take less time than the host's
    autograd work, each node and op saved is time saved (docs/performance.md, "The binding's host time")."""

    @staticmethod
    def forward(ctx, logits, duration, idx, spec, as_rnnt, in_place, reduction="none"):
        built = []
        ctx.ahead = ctx.buffers = items = None
        reduction, per_label = _folded(reduction)
        # on CUDA a batch mean's division of the upstream by B is the library's too
        # (options.batch_mean: a product with 1 / B, as torch's CUDA division by a number, so
        # the same bits; the CPU's torch divides): no torch op in backward
        batch_mean = (reduction == "mean_batch" and logits.is_cuda
                      and _core.batch_mean_available())
        lib_reduce = _library_reduction(reduction)
        # (views first: a pack request they need is packed now, and lib_args() then says where)
        label_lengths = idx.label_lengths if reduction in ("mean", "mean_volume") else None
        args = idx.lib_args()
        key = _ahead_key(ctx, logits, spec, as_rnnt, in_place)
        state = key is not None and _core.state_in_grads_wanted(
            logits, 0 if as_rnnt or spec.mode == "rnnt" else len(spec.durations),
            spec.vocab_size, ctx.needs_input_grad[0] or spec.mode == "joint")
        ctx.state = state
        ctx.forward_args = (per_label, batch_mean)
        if key is not None and (state or _ahead_plans.get(key, True)):
            # the gradients for a loss gradient of 1: the reduction's weights, by the very
            # divisions backward's _upstream() runs (or the library's, with batch_mean: none
            # here), so the same bits when it is 1
            acc = _core.acc_dtype(logits.dtype)
            items = None if batch_mean else scale_items(label_lengths, reduction,
                                                        int(logits.shape[0]), acc)
            weights = None if items is None else _upstream(
                torch.ones((), dtype=acc, device=logits.device), items)
            buffers = _core.grad_buffers(spec, logits, duration, ctx.needs_input_grad[0],
                                         ctx.needs_input_grad[1])
            costs, workspace, written = _core.forward_ahead(
                spec, logits, duration, *args, weights, *buffers, as_rnnt=as_rnnt, built=built,
                per_label=per_label, batch_mean=batch_mean, reduce=lib_reduce,
                state_in_grads=state)
            if len(_ahead_plans) >= _PLANS_MAX:
                _ahead_plans.clear()
            _ahead_plans[key] = written
            if written:
                ctx.ahead = buffers
            else:  # allocated all the same: backward writes into them
                ctx.buffers = buffers
        else:
            costs, workspace = _core.forward(spec, logits, duration, *args, as_rnnt, built=built,
                                             per_label=per_label, batch_mean=batch_mean,
                                             reduce=lib_reduce)
        ctx.save_for_backward(logits, duration)
        ctx.idx = idx
        ctx.workspace = workspace
        ctx.built = built[0] if built else None  # the C structs, reused by backward
        ctx.spec, ctx.as_rnnt, ctx.in_place = spec, as_rnnt, in_place
        ctx.spent = False
        if lib_reduce is not None:  # the value is the library's; the backward's scale as reduce()'s
            out = costs
            ctx.scale = scale_items(None, reduction, int(logits.shape[0]), None)
        else:
            out, ctx.scale = reduce(costs, label_lengths, reduction, items=items)
        if batch_mean:
            ctx.scale = None  # the library divides the upstream by B (ctx.built's options)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        logits, duration = ctx.saved_tensors
        need_logits, need_duration = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        nones = (None,) * 5
        if not (need_logits or need_duration):
            return (None, None) + nones
        if ctx.in_place:
            if ctx.spent:
                raise RuntimeError(
                    "warp_tdt: in_place=True wrote the gradient over the logits in the first "
                    "backward pass, so a second backward through the same loss cannot be "
                    "computed; use in_place=False with retain_graph=True")
            ctx.spent = True
        workspace, built = ctx.workspace, ctx.built
        if ctx.state and ctx.spent:
            # the per-node state was in the gradient's rows, which the first backward handed
            # on: the forward again, into a workspace of its own, for this one
            per_label, batch_mean = ctx.forward_args
            again = []
            _, workspace = _core.forward(ctx.spec, logits, duration, *ctx.idx.lib_args(),
                                         ctx.as_rnnt, built=again, per_label=per_label,
                                         batch_mean=batch_mean)
            built = again[0]
        ctx.spent = True
        if ctx.ahead is not None:
            # written by the forward for a loss gradient of 1: times the one that came (a
            # second backward, after retain_graph=True, runs tdt_backward below instead)
            g_logits, g_duration = ctx.ahead
            ctx.ahead = None
            _core.scale(ctx.spec, grad_out, logits, duration, *ctx.idx.lib_args(), g_logits,
                        g_duration, ctx.as_rnnt, built=ctx.built)
            return (g_logits if need_logits else None, g_duration) + nones
        buffers, ctx.buffers = ctx.buffers, None
        g_logits, g_duration = _core.backward(
            ctx.spec, _upstream(grad_out, ctx.scale), logits, duration, *ctx.idx.lib_args(),
            workspace, ctx.as_rnnt,
            need_logits=need_logits, need_duration=need_duration, in_place=ctx.in_place,
            built=built, buffers=buffers)
        if ctx.in_place:
            ctx.workspace = None  # nothing can use it again; free it now
        return (g_logits if need_logits else None, g_duration) + nones
