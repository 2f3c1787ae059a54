"""The fused joint + loss: a transducer's joint output layer and its TDT (or RNN-T) loss in one
library call pair, without ever holding the (B, T, U + 1, V + D) logits.

A transducer's joint network ends in

    z(b, t, u) = weight @ dropout(act(enc[b, t] + pred[b, u])) + bias

and the losses of functional.py read those logits, which the caller must first write in full
(4 B T (U + 1) (V + D) bytes in float32, and as much again for their gradient). The functions
here take the joint's inputs instead: tdt_joint_forward() computes the costs tile by tile with
a running log-sum-exp over the vocabulary, keeping a few numbers a lattice node, and
tdt_joint_backward() recomputes each tile's logits and folds their gradient straight into the
gradients of enc, pred, weight and bias (include/tdt.h, "The fused joint + loss").

    loss = warp_tdt.tdt_joint_loss(enc, pred, weight, bias, targets, logit_lengths,
                                   target_lengths, blank_token_id, durations,
                                   activation="relu", dropout=0.1, reduction="mean")

enc is the encoder output already projected to the joint's hidden size H (NeMo's
``joint.enc(f)``, transformers' ``encoder_projector`` output), pred the prediction network's
output projected likewise (U + 1 rows: the start symbol, then one row a label), weight and bias
the output Linear's (V + D, H) and (V + D,) parameters. The result equals the unfused
``tdt_loss(F.linear(dropout(act(enc[:, :, None] + pred[:, None])), weight, bias)...)`` to the
dtype's rounding (unfused_joint_loss() below computes exactly that, for checking and as a
fallback).

Dropout is the library's own: a counter-based hash of a 64-bit seed decides each element, so
the mask is never stored and the backward regenerates it. The seed is drawn from torch's CPU
default generator (or ``generator``) on every call that needs it, so ``torch.manual_seed``
repeats a run; ``dropout_mask()`` gives the mask of a seed, to apply it explicitly.
"""

import ctypes

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _autograd, _core, _lib
from . import functional as _fn

__all__ = ["tdt_joint_loss", "rnnt_joint_loss", "unfused_joint_loss", "joint_logits",
           "dropout_mask", "joint_available", "workspace_bytes", "ACTIVATIONS"]

ACTIVATIONS = {"relu": _lib.ACTIVATION_RELU, "tanh": _lib.ACTIVATION_TANH,
               "sigmoid": _lib.ACTIVATION_SIGMOID, "identity": _lib.ACTIVATION_IDENTITY}
_TORCH_ACT = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
              "identity": lambda x: x}

_TDT_NAMES = {"targets": "targets", "logit_lengths": "logit_lengths",
              "target_lengths": "target_lengths", "blank": "blank_token_id", "logits": "enc",
              "rows": "pred.shape[1]"}  # _core's data checks: T from enc, U + 1 from pred
_RNNT_NAMES = dict(_TDT_NAMES, blank="blank")


def joint_available():
    """Whether the loaded library has the fused joint (tdt_joint_forward(), 0.7.0 and later)."""
    return hasattr(_lib.load(), "tdt_joint_forward")


def _require_library():
    if not joint_available():
        raise _lib.LibraryNotFoundError(
            "warp_tdt: the loaded library %s (version %s) has no fused joint (tdt_joint_forward); "
            "build the library from a tree that has it (release 0.7.0 or later)"
            % (_lib.library_path(), _lib.version_string()))


# ---- argument checks ---------------------------------------------------------------------------


def _check_activation(activation):
    name = activation.lower() if isinstance(activation, str) else activation
    if name is None:
        name = "identity"
    if name not in ACTIVATIONS:
        raise ValueError("activation = %r is not one of %s" % (
            activation, ", ".join(repr(a) for a in ACTIVATIONS)))
    return name


def _check_dropout(dropout):
    if isinstance(dropout, bool):
        raise TypeError("dropout must be a number, got %r" % (dropout,))
    try:
        p = float(dropout)
    except (TypeError, ValueError):
        raise TypeError("dropout must be a number, got %r" % (dropout,)) from None
    if not 0.0 <= p < 1.0:  # (also False for NaN)
        raise ValueError("dropout = %r is invalid: it must be in [0, 1) (the probability that an "
                         "element of act(enc + pred) is zeroed)" % (dropout,))
    return p


def _check_float(x, name, dims, what):
    if not isinstance(x, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (name, type(x).__name__))
    if x.dtype not in _fn._FLOAT_DTYPES:
        raise ValueError("%s must be float32, float64, float16 or bfloat16, got %s"
                         % (name, x.dtype))
    if x.dim() != dims:
        raise ValueError("%s must be %d-D %s, got shape %s" % (name, dims, what, tuple(x.shape)))


def _readable(x):
    """x with a contiguous last dimension (copied where it is not): the library reads rows."""
    return x if _fn._last_dim_ok(x) else x.contiguous()


def _check_inputs(enc, pred, weight, bias, num_durations):
    """Checks the joint's four tensors; returns (enc, pred, weight, bias, V) ready for the
    library (one dtype, last dimensions contiguous)."""
    _check_float(enc, "enc", 3, "(batch, T, H)")
    _check_float(pred, "pred", 3, "(batch, U + 1, H)")
    _check_float(weight, "weight", 2, "(vocab_size + len(durations), H), nn.Linear's layout")
    if bias is not None:
        _check_float(bias, "bias", 1, "(vocab_size + len(durations),)")
    B, T, H = (int(s) for s in enc.shape)
    if H < 1:
        raise ValueError("enc.shape[-1] = %d: the joint's hidden size H must be at least 1" % H)
    if int(pred.shape[0]) != B:
        raise ValueError("pred has shape %s but enc has shape %s: the batch sizes differ"
                         % (tuple(pred.shape), tuple(enc.shape)))
    if int(pred.shape[2]) != H:
        raise ValueError("pred.shape[-1] = %d but enc.shape[-1] = %d: both must be the joint's "
                         "hidden size H" % (pred.shape[2], H))
    if int(pred.shape[1]) < 1:
        raise ValueError("pred.shape[1] = 0: it must be U + 1 >= 1 (the lattice rows: the start "
                         "symbol's row, then one a label)")
    if int(weight.shape[1]) != H:
        raise ValueError("weight has shape %s but enc.shape[-1] = %d: weight must be (outputs, "
                         "H), nn.Linear's (out_features, in_features)" % (tuple(weight.shape), H))
    O = int(weight.shape[0])
    if O <= num_durations:
        raise ValueError("weight.shape[0] = %d must exceed len(durations) = %d (its rows are "
                         "vocab_size token logits, then the duration logits)"
                         % (O, num_durations))
    if bias is not None and int(bias.shape[0]) != O:
        raise ValueError("bias has shape %s but weight has shape %s: bias must have "
                         "weight.shape[0] = %d elements" % (tuple(bias.shape), tuple(weight.shape),
                                                            O))
    for name, x in (("pred", pred), ("weight", weight), ("bias", bias)):
        if x is not None and x.device != enc.device:
            raise ValueError("%s is on %s but enc is on %s; move them to one device"
                             % (name, x.device, enc.device))
    if pred.dtype != enc.dtype:
        raise ValueError("pred is %s but enc is %s: the joint's inputs must share a dtype"
                         % (pred.dtype, enc.dtype))
    # the output layer in the activations' dtype, as autocast runs nn.Linear (float32
    # parameters, bfloat16 activations); autograd carries the gradient back through the cast
    if weight.dtype != enc.dtype:
        weight = weight.to(enc.dtype)
    if bias is not None and bias.dtype != enc.dtype:
        bias = bias.to(enc.dtype)
    enc, pred, weight = _readable(enc), _readable(pred), _readable(weight)
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    if O > 1 and int(weight.stride(0)) < H:
        raise ValueError("weight has strides %s for shape %s: its rows overlap (row stride %d < "
                         "H = %d, an expanded tensor?); pass weight.contiguous()"
                         % (tuple(weight.stride()), tuple(weight.shape), weight.stride(0), H))
    return enc, pred, weight, bias, O - num_durations


def _draw_seed(generator):
    """A 63-bit dropout seed from torch's CPU default generator (or `generator`): repeated by
    torch.manual_seed, and drawn on the host so no GPU synchronisation is needed."""
    return int(torch.randint(0, 2 ** 63 - 1, (1,), generator=generator, dtype=torch.int64)[0])


def _check_seed(seed, name):
    seed = _fn._as_index(seed, name)
    if not 0 <= seed < 2 ** 64:
        raise ValueError("%s = %d is outside [0, 2**64)" % (name, seed))
    return seed


# ---- the library calls -------------------------------------------------------------------------


class _Call:
    """One call's tdt_joint_problem_t and tdt_options_t (and what they point into), built once by
    the forward and reused by the backward."""

    __slots__ = ("p", "o", "keep", "idx", "size", "skip_below")

    def __init__(self, spec, tdt, enc, pred, weight, bias, idx, activation, dropout, seed, offset,
                 skip_below=0.0):
        B, T, H = (int(s) for s in enc.shape)
        p = _lib.JointProblem()
        p.batch, p.max_frames, p.max_labels = B, T, int(pred.shape[1]) - 1
        p.vocab_size, p.hidden, p.num_outputs = spec.vocab_size, H, int(weight.shape[0])
        p.dtype = _core._DTYPES[enc.dtype]
        p.enc = enc.data_ptr()
        p.enc_strides = _lib.c_int64_2(int(enc.stride(0)), int(enc.stride(1)))
        p.pred = pred.data_ptr()
        p.pred_strides = _lib.c_int64_2(int(pred.stride(0)), int(pred.stride(1)))
        p.weight = weight.data_ptr()
        # a one-row weight's row stride is free in torch; the library asks for >= H
        p.weight_stride = int(weight.stride(0)) if weight.shape[0] > 1 else H
        p.bias = bias.data_ptr() if bias is not None else None
        p.activation = ACTIVATIONS[activation]
        p.dropout = dropout
        p.dropout_seed = seed
        p.dropout_offset = offset
        labels, fl, ll = idx.lib_args()
        p.labels = _core._address(labels) if p.max_labels > 0 else None
        p.frame_lengths = _core._address(fl)
        p.label_lengths = _core._address(ll)
        o, keep = _core._options(spec, enc.is_cuda, tdt)
        c = ctypes.c_size_t(0)
        _lib.check("tdt_joint_get_workspace_size",
                   _lib.load().tdt_joint_get_workspace_size(ctypes.byref(p), ctypes.byref(o),
                                                            ctypes.byref(c)))
        self.p, self.o, self.keep, self.idx, self.size = p, o, keep, idx, int(c.value)
        self.skip_below = skip_below

    def workspace(self, device):
        return torch.empty(max(self.size, 1), dtype=torch.uint8, device=device)

    def run(self, fn_name, ref, *args):
        _core._call(fn_name, ref, self.o, ctypes.byref(self.p), ctypes.byref(self.o), *args)


def _gradients(enc, pred, weight, bias, needs, skip_below=0.0):
    """The gradient buffers asked for (None for the others) and their tdt_joint_gradients_t."""
    g = _lib.JointGradients()
    g.skip_below = skip_below
    out = [None, None, None, None]
    if needs[0]:
        out[0] = torch.empty(enc.shape, dtype=enc.dtype, device=enc.device)
        g.enc_grad = out[0].data_ptr()
        g.enc_strides = _lib.c_int64_2(*out[0].stride()[:2])
    if needs[1]:
        out[1] = torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)
        g.pred_grad = out[1].data_ptr()
        g.pred_strides = _lib.c_int64_2(*out[1].stride()[:2])
    if needs[2]:
        out[2] = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
        g.weight_grad = out[2].data_ptr()
        g.weight_stride = int(weight.shape[1])
    if needs[3] and bias is not None:
        out[3] = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)
        g.bias_grad = out[3].data_ptr()
    return out, g


def _empty_problem(enc, pred, weight, bias, needs):
    """Gradients of a call with nothing to read (B == 0 or T == 0): every sample is infeasible,
    so every gradient is exactly 0."""
    return [torch.zeros_like(x) if need and x is not None else None
            for x, need in zip((enc, pred, weight, bias), needs)]


class JointLossFunction(torch.autograd.Function):
    """loss = JointLossFunction.apply(enc, pred, weight, bias, call, reduction, label_lengths):
    tdt_joint_forward() into a workspace kept for the backward, which runs tdt_joint_backward()
    with the reduction's per-sample upstream gradient (folded into the library's one pass)."""

    @staticmethod
    def forward(ctx, enc, pred, weight, bias, call, reduction, label_lengths):
        B, T = int(enc.shape[0]), int(enc.shape[1])
        acc = _core.acc_dtype(enc.dtype)
        costs = torch.empty(B, dtype=acc, device=enc.device)
        ctx.call = call
        ctx.workspace = None
        if B > 0 and T > 0:
            ctx.workspace = call.workspace(enc.device)
            call.run("tdt_joint_forward", enc, costs.data_ptr(), ctx.workspace.data_ptr(),
                     call.size)
        else:
            costs.fill_(float("inf"))
        ctx.save_for_backward(enc, pred, weight, bias)
        out, ctx.scale = _autograd.reduce(costs, label_lengths, reduction)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        enc, pred, weight, bias = ctx.saved_tensors
        needs = ctx.needs_input_grad[:4]
        nones = (None, None, None)
        if not any(needs):
            return (None,) * 4 + nones
        if ctx.workspace is None:
            return tuple(_empty_problem(enc, pred, weight, bias, needs)) + nones
        call = ctx.call
        g, call.o.grad_costs_scalar = _core._upstream_arg(
            _autograd._upstream(grad_out, ctx.scale), enc)
        out, grads = _gradients(enc, pred, weight, bias, needs, call.skip_below)
        call.run("tdt_joint_backward", enc, g.data_ptr(), ctypes.byref(grads),
                 ctx.workspace.data_ptr(), call.size)
        return tuple(out) + nones


def _costs_only(call, enc, reduction, label_lengths):
    """The reduced loss of a call no gradient can be asked of: tdt_joint_loss() without
    gradients, and no autograd node."""
    B, T = int(enc.shape[0]), int(enc.shape[1])
    costs = torch.empty(B, dtype=_core.acc_dtype(enc.dtype), device=enc.device)
    if B > 0 and T > 0:
        ws = call.workspace(enc.device)
        call.run("tdt_joint_loss", enc, costs.data_ptr(), None, ws.data_ptr(), call.size)
    else:
        costs.fill_(float("inf"))
    return _autograd.reduce(costs, label_lengths, reduction, with_scale=False)[0]


def _joint(enc, pred, weight, bias, targets, logit_lengths, target_lengths, blank, durations,
           activation, dropout, sigma, reduction, fastemit_lambda, clamp, dropout_seed, generator,
           validate, names, tdt, skip_below):
    activation = _check_activation(activation)
    skip_below = _fn._check_number(skip_below, "skip_below")
    dropout = _check_dropout(dropout)
    D = len(durations) if tdt else 0
    enc, pred, weight, bias, V = _check_inputs(enc, pred, weight, bias, D)
    if tdt:
        blank = _fn._as_index(blank, names["blank"])
        if not 0 <= blank < V:
            raise ValueError("blank_token_id = %r is outside [0, %d) (weight.shape[0] - "
                             "len(durations) = %d tokens)" % (blank, V, V))
    else:
        blank = _fn._as_index(blank, names["blank"])
        b = blank + V if blank < 0 else blank
        if not 0 <= b < V:
            raise ValueError("blank = %d is outside [-%d, %d) (weight.shape[0] = %d tokens)"
                             % (blank, V, V, V))
        blank = b
    sigma = _fn._check_number(sigma, "sigma")
    fastemit_lambda = _fn._check_number(fastemit_lambda, "fastemit_lambda")
    clamp = _fn._check_number(clamp, "clamp", allow_negative=True)
    # while a CUDA graph is captured: no host-side check (it would synchronise), and no seed
    # drawn here, which the graph would replay unchanged (one mask for every replay)
    capturing = enc.is_cuda and torch.cuda.is_current_stream_capturing()
    seed = 0
    if dropout > 0:
        if dropout_seed is None and capturing:
            raise ValueError("dropout = %g while a CUDA graph is captured: the seed drawn now "
                             "would be replayed unchanged, one mask for every replay; pass "
                             "dropout_seed to accept that, or capture without dropout"
                             % dropout)
        seed = (_draw_seed(generator) if dropout_seed is None
                else _check_seed(dropout_seed, "dropout_seed"))
    B, T = int(enc.shape[0]), int(enc.shape[1])
    U = int(pred.shape[1]) - 1
    idx = _fn._indices(targets, logit_lengths, target_lengths, B, U, enc.device)
    _fn._check_label_columns(idx, U + 1, (False, capturing), validate)
    _require_library()
    # on CUDA the check runs once the loss's kernels are enqueued (they give a bad sample a NaN
    # cost without reading out of range, and the error raised here drops their outputs)
    later = enc.is_cuda and _fn._ASYNC_ENV.get() != "0"
    spec = _core.Spec("joint" if tdt else "rnnt", V, tuple(durations) if tdt else (), blank,
                      sigma, fastemit_lambda, clamp if clamp > 0 else 0.0, False)
    pending = None
    if validate and B > 0 and not capturing:  # the loss's own data checks (_core), on enc's T
        pending = _core.validation_start(idx.labels, idx.frame_lengths, idx.label_lengths, later,
                                         packed=idx.packed, host=idx.host)
        if not later:
            _core.validation_finish(spec, enc, pending, names)
            pending = None
    label_lengths = idx.label_lengths if reduction in ("mean", "mean_volume") else None
    call = _Call(spec, tdt, enc, pred, weight, bias, idx, activation, dropout, seed, 0, skip_below)
    tensors = (enc, pred, weight) + ((bias,) if bias is not None else ())
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        loss = _costs_only(call, enc, reduction, label_lengths)
    else:
        loss = JointLossFunction.apply(enc, pred, weight, bias, call, reduction, label_lengths)
    if pending is not None:
        _core.validation_finish(spec, enc, pending, names)
    return loss


def tdt_joint_loss(enc, pred, weight, bias, targets, logit_lengths, target_lengths,
                   blank_token_id, durations, activation="relu", dropout=0.0, sigma=0.0,
                   reduction="mean", *, fastemit_lambda=0.0, clamp=0.0, dropout_seed=None,
                   generator=None, validate=True, skip_below=0.0):
    """The TDT loss of the joint ``weight @ dropout(act(enc[:, t] + pred[:, u])) + bias``, fused:
    the (B, T, U + 1, V + D) logits are never held. Autograd reaches enc, pred, weight and bias.

    Args:
        enc: ``(batch, T, H)`` encoder output projected to the joint's hidden size; float32,
            float64, float16 or bfloat16. Only the last dim must be contiguous.
        pred: ``(batch, U + 1, H)`` prediction-network output projected likewise (row 0: the
            start symbol's), same dtype and device.
        weight: ``(vocab_size + len(durations), H)``, the output Linear's weight (token rows
            first, blank included, then one row a duration). Cast to enc's dtype if it differs
            (float32 parameters with bfloat16 activations, as autocast runs nn.Linear).
        bias: ``(vocab_size + len(durations),)`` or None.
        targets, logit_lengths, target_lengths, blank_token_id, durations, sigma, reduction,
        fastemit_lambda, clamp: as in :func:`warp_tdt.tdt_loss`.
        activation: ``"relu"`` (NeMo's and Parakeet's default), ``"tanh"``, ``"sigmoid"`` or
            ``"identity"``, applied to ``enc + pred``.
        dropout: probability in ``[0, 1)`` of zeroing an element of ``act(enc + pred)`` (the
            others scaled by ``1 / (1 - dropout)``), as ``nn.Dropout`` in training. Pass 0 in
            evaluation (the module form does).
        validate: as in tdt_loss; skipped while a CUDA graph is captured (on the GPU a bad
            sample then gets a NaN loss).
        dropout_seed: the dropout mask's 64-bit seed; None draws one from ``generator`` (a CPU
            ``torch.Generator``; torch's default one when None), so ``torch.manual_seed`` repeats
            a run. :func:`dropout_mask` gives the mask of a seed. While a CUDA graph is
            captured a seed must be given (the graph replays it).
        skip_below: 0 (the default) for the exact gradients; eps > 0 leaves out of the backward
            every lattice node whose logits' gradient is certainly below eps in every element
            (|upstream| x its occupancy: the nodes off the likely alignments), their logits not
            recomputed; each gradient element then moves by at most eps times the sum of |W|,
            |h| or 1 over the left-out nodes it collects from. The loss itself is exact.
            include/tdt.h (tdt_joint_gradients_t) has the rule. On a GPU the backward then
            runs its products on the kept nodes alone, after reading their number back (one
            synchronisation; while a CUDA graph is captured it takes every node instead).

    Returns:
        float32 loss (float64 for float64 inputs): a scalar, or ``(batch,)`` for ``"none"``.
    """
    _fn._check_reduction(reduction, _fn.TDT_REDUCTIONS)
    durations = _fn._as_durations(durations, False)
    return _joint(enc, pred, weight, bias, targets, logit_lengths, target_lengths,
                  blank_token_id, durations, activation, dropout, sigma, reduction,
                  fastemit_lambda, clamp, dropout_seed, generator, validate, _TDT_NAMES, True,
                  skip_below)


def rnnt_joint_loss(enc, pred, weight, bias, targets, logit_lengths, target_lengths, blank=-1,
                    activation="relu", dropout=0.0, clamp=-1, reduction="mean", *,
                    fastemit_lambda=0.0, dropout_seed=None, generator=None, validate=True,
                    skip_below=0.0):
    """The plain RNN-T loss of the fused joint (tdt_joint_loss() without durations): weight is
    ``(vocab_size, H)``, bias ``(vocab_size,)`` or None; blank, clamp and reduction as in
    :func:`warp_tdt.rnnt_loss` (``"mean"`` is the batch mean, torchaudio's). Returns the loss in
    enc's dtype, as rnnt_loss does. skip_below as in tdt_joint_loss()."""
    if reduction not in _fn.RNNT_REDUCTIONS:
        raise ValueError("reduction should be one of 'none', 'mean', or 'sum', got %r"
                         % (reduction,))
    loss = _joint(enc, pred, weight, bias, targets, logit_lengths, target_lengths, blank, (),
                  activation, dropout, 0.0, "mean_batch" if reduction == "mean" else reduction,
                  fastemit_lambda, clamp, dropout_seed, generator, validate, _RNNT_NAMES, False,
                  skip_below)
    return loss.to(enc.dtype)


def workspace_bytes(batch, max_frames, max_labels, hidden, vocab_size, durations=None,
                    dtype=torch.float32, device="cpu"):
    """Bytes of workspace the fused joint asks for at these shapes (tdt_joint_get_workspace_size:
    per-node lattice state plus the tiles' scratch; on the CPU it grows with
    torch.get_num_threads()). ``durations=None``: RNN-T. Nothing is allocated."""
    _require_library()
    device = torch.device(device)
    tdt = durations is not None
    D = len(durations) if tdt else 0
    p = _lib.JointProblem()
    p.batch, p.max_frames, p.max_labels = int(batch), int(max_frames), int(max_labels)
    p.vocab_size, p.hidden, p.num_outputs = int(vocab_size), int(hidden), int(vocab_size) + D
    p.dtype = _core._DTYPES[dtype]
    p.weight_stride = int(hidden)
    spec = _core.Spec("joint" if tdt else "rnnt", int(vocab_size),
                      tuple(durations) if tdt else (), 0, 0.0, 0.0, 0.0, False)
    o, keep = _core._options(spec, device.type == "cuda", tdt)
    c = ctypes.c_size_t(0)
    _lib.check("tdt_joint_get_workspace_size",
               _lib.load().tdt_joint_get_workspace_size(ctypes.byref(p), ctypes.byref(o),
                                                        ctypes.byref(c)))
    del keep
    return int(c.value)


# ---- the unfused path: the same loss through PyTorch's joint ------------------------------------


def dropout_mask(dropout, seed, shape, offset=0):
    """The fused joint's dropout mask for `seed`: a bool tensor of ``shape`` = (B, T, U + 1, H),
    True where act(enc + pred)'s element is kept (tdt_joint_dropout_mask(); element (b, t, u, i)
    has counter offset + ((b T + t)(U + 1) + u) H + i, kept iff the top 32 bits of the
    (counter + 1)-th SplitMix64 output of the seed are >= floor(dropout 2^32): include/tdt.h)."""
    dropout = _check_dropout(dropout)
    seed = _check_seed(seed, "seed")
    offset = _check_seed(offset, "offset")
    n = 1
    for s in shape:
        n *= int(s)
    keep = torch.empty(n, dtype=torch.uint8)
    if n > 0:
        _require_library()
        _lib.check("tdt_joint_dropout_mask",
                   _lib.load().tdt_joint_dropout_mask(dropout, seed, offset, n,
                                                      keep.data_ptr()))
    return keep.view(*shape).bool()


def joint_logits(enc, pred, weight, bias, activation="relu", dropout=0.0, dropout_seed=None,
                 keep=None):
    """The joint's logits in PyTorch, (B, T, U + 1, outputs): F.linear(dropout(act(enc[:, :, None]
    + pred[:, None])), weight, bias), with the fused path's dropout mask (of ``dropout_seed``, or
    ``keep`` given) where dropout > 0. What the fused path never holds; for checking, decoding
    and the unfused fallback."""
    name = _check_activation(activation)
    h = _TORCH_ACT[name](enc[:, :, None, :] + pred[:, None, :, :])
    p = _check_dropout(dropout)
    if p > 0:
        if keep is None:
            if dropout_seed is None:
                raise ValueError("joint_logits with dropout > 0 needs dropout_seed (or keep)")
            keep = dropout_mask(p, dropout_seed, tuple(h.shape))
        h = h * keep.to(device=h.device, dtype=h.dtype) / (1.0 - p)
    if weight.dtype != h.dtype:
        weight = weight.to(h.dtype)
        bias = bias.to(h.dtype) if bias is not None else None
    return F.linear(h, weight, bias)


def unfused_joint_loss(enc, pred, weight, bias, targets, logit_lengths, target_lengths,
                       blank_token_id, durations, activation="relu", dropout=0.0, sigma=0.0,
                       reduction="mean", *, dropout_seed=None, generator=None, **kw):
    """tdt_joint_loss() computed the unfused way: the joint's logits in PyTorch (joint_logits(),
    with the same dropout mask for the same seed), then :func:`warp_tdt.tdt_loss_joint`; with
    ``durations=None`` the RNN-T form (rnnt_joint_loss(): blank_token_id is then its blank).
    Holds the (B, T, U + 1, V + D) logits and their gradient: the reference the fused path is
    tested and benchmarked against."""
    p = _check_dropout(dropout)
    if p > 0 and dropout_seed is None:
        dropout_seed = _draw_seed(generator)
    z = joint_logits(enc, pred, weight, bias, activation, p, dropout_seed)
    if durations is None:
        return _fn.rnnt_loss(z, targets, logit_lengths, target_lengths, blank=blank_token_id,
                             reduction=reduction, **kw)
    return _fn.tdt_loss_joint(z, targets, logit_lengths, target_lengths, blank_token_id,
                              durations, sigma=sigma, reduction=reduction, **kw)
