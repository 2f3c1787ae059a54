"""The public losses: tdt_loss (transformers' signature), tdt_loss_joint, rnnt_loss (torchaudio's).

Each function checks its arguments (raising ValueError that names the argument and the value),
converts targets and lengths to small int32 tensors on the logits' device, picks the layout
(separate token/duration tensors, or one joint tensor when the two are slices of it), runs the
library through autograd, one node that also applies the reduction to the (B,) costs: its
backward hands the library the per-sample weights (1/(B*U_b) for "mean", ...) as the upstream
gradient, folded into the one pass that writes each gradient element.
"""

import operator
import sys
import warnings

import torch

from . import _autograd, _core, _lib, _ops

__all__ = ["tdt_loss", "tdt_loss_joint", "rnnt_loss"]

TDT_REDUCTIONS = ("mean_volume", "mean_batch", "mean", "sum", "none")
RNNT_REDUCTIONS = ("none", "mean", "sum")

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_MAX_DURATIONS = 32

# Tests set this to route eager calls through the torch.compile custom ops (torch >= 2.4).
_FORCE_CUSTOM_OPS = False

_TDT_NAMES = {"logits": "token_logits", "targets": "targets", "logit_lengths": "logit_lengths",
              "target_lengths": "target_lengths", "blank": "blank_token_id"}
_RNNT_NAMES = {"logits": "logits", "targets": "targets", "logit_lengths": "logit_lengths",
               "target_lengths": "target_lengths", "blank": "blank"}


_ASYNC_ENV = _lib.EnvVar("WARP_TDT_ASYNC_VALIDATION")
# torch.compiler.is_compiling (torch >= 2.3), looked up once
_compiler_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _is_compiling():
    if _compiler_is_compiling is not None:
        return bool(_compiler_is_compiling())
    dynamo = sys.modules.get("torch._dynamo")  # torch 2.0 - 2.2; never imported by us
    fn = getattr(dynamo, "is_compiling", None)
    return bool(fn()) if fn is not None else False


def _capturing(t):
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _call_mode(ref, compiling):
    """(compiling, capturing) for a call on ref, each asked once a call (a capture query is a
    CUDA call): under torch.compile (_is_compiling()), or while a CUDA graph is captured on the
    current stream."""
    return compiling, not compiling and _capturing(ref)


# ---- argument checks ---------------------------------------------------------------------------


def _short_repr(value, limit=80):
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 4] + " ..."


def _check_reduction(reduction, allowed):
    if reduction not in allowed:
        raise ValueError('Invalid reduction mode %s. Expected one of %s.'
                         % ('"%s"' % reduction if isinstance(reduction, str) else
                            "%r (%s)" % (reduction, type(reduction).__name__),
                            ", ".join(repr(r) for r in allowed)))


def _check_logits(x, name):
    if not isinstance(x, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (name, type(x).__name__))
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError("%s must be float32, float64, float16 or bfloat16, got %s"
                         % (name, x.dtype))
    if x.dim() != 4:
        raise ValueError("%s must be 4-D (batch, T, U + 1, %s), got shape %s"
                         % (name, "num_durations" if name == "duration_logits" else "vocab_size",
                            tuple(x.shape)))


def _as_index(value, name):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, got %r" % (name, value)) from None


def _check_number(value, name, minimum=0.0, maximum=None, allow_negative=False):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        v = float(value)
    else:
        try:
            if isinstance(value, (str, bytes)):  # float("0.1") would take it
                raise TypeError
            v = float(value)
        except (TypeError, ValueError):
            raise TypeError("%s must be a number, got %r" % (name, value)) from None
    finite = v - v == 0.0  # False for inf and nan (plain arithmetic: traceable by torch.compile)
    if not finite or (not allow_negative and v < minimum) or (maximum is not None and v > maximum):
        rng = "[%g, %g]" % (minimum, maximum) if maximum is not None else ">= %g" % minimum
        raise ValueError("%s = %r is invalid: it must be finite and %s" % (name, value, rng))
    return v


_checked_durations = {}  # tuple as given -> the checked tuple: a training loop passes one list


def _as_durations(durations, compiling):
    # plain loops (no generator expressions): torch.compile traces this with fullgraph=True
    if not compiling and isinstance(durations, (list, tuple)):
        key = tuple(durations)
        try:
            hit = _checked_durations.get(key)
        except TypeError:  # an unhashable element: the checks below name it
            hit = None
        if hit is not None:
            return hit
        ds = _check_durations(durations)
        if len(_checked_durations) < 64:
            _checked_durations[key] = ds
        return ds
    return _check_durations(durations)


_DURATIONS_WANTED = "a sequence of distinct non-negative ints, e.g. [0, 1, 2, 3, 4]"


def _check_durations(durations):
    if isinstance(durations, torch.Tensor):
        if durations.dtype.is_floating_point or durations.dim() != 1:
            raise ValueError("durations must be a 1-D integer tensor or a list of ints, got %s of "
                             "shape %s" % (durations.dtype, tuple(durations.shape)))
        durations = durations.tolist()
    if isinstance(durations, (str, bytes)) or not hasattr(durations, "__iter__"):
        raise TypeError("durations must be %s, got %r (%s)"
                        % (_DURATIONS_WANTED, durations, type(durations).__name__))
    ds = []
    for d in durations:
        if isinstance(d, int):  # the common case, and free of try/except for torch.compile
            ds.append(d)
            continue
        try:
            if isinstance(d, (str, bytes)):
                raise TypeError
            i = int(d)
        except (TypeError, ValueError):
            raise TypeError("durations must be %s, got %r holding %r (%s)"
                            % (_DURATIONS_WANTED, durations, d, type(d).__name__)) from None
        if i != d:
            raise ValueError("durations = %r must hold integers: %s"
                             % (list(durations), _DURATIONS_WANTED))
        ds.append(i)
    if not 1 <= len(ds) <= _MAX_DURATIONS:
        raise ValueError("durations = %r must hold 1 to %d values" % (ds, _MAX_DURATIONS))
    seen = []
    for d in ds:
        if d < 0:
            raise ValueError("durations = %r holds a negative duration %d" % (ds, d))
        if d in seen:
            raise ValueError("durations = %r holds the duration %d twice" % (ds, d))
        seen.append(d)
    if max(ds) <= 0:
        raise ValueError("durations = %r has no positive duration: no blank arc could ever "
                         "advance a frame" % (ds,))
    return tuple(ds)


_INT_SHAPES = {1: "(batch,)", 2: "(batch, U)"}


def _int_tensor(x, name, device, dim):
    if not isinstance(x, torch.Tensor):
        given = x
        if isinstance(x, (str, bytes)) or x is None:
            raise TypeError("%s must be an integer tensor of shape %s, got %r (%s)"
                            % (name, _INT_SHAPES[dim], x, type(x).__name__))
        try:
            x = torch.as_tensor(x)  # the given values' own type: a float is refused below
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError("%s must be an integer tensor of shape %s (or a rectangular nested "
                            "list of ints), got %s %s: %s"
                            % (name, _INT_SHAPES[dim], type(given).__name__,
                               _short_repr(given), e)) from None
        if x.numel() == 0 and x.dtype.is_floating_point:  # [] reads as float32
            x = x.to(torch.int64)
    dtype = x.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError("%s must be an integer tensor, got dtype %s" % (name, dtype))
    if x.dim() != dim:
        raise ValueError("%s must be %d-D, got shape %s%s; expected %s"
                         % (name, dim, tuple(x.shape),
                            " (the value %s)" % x.item() if x.dim() == 0 else "", _INT_SHAPES[dim]))
    if x.device != device:
        if x.device.type != "cpu":
            raise ValueError("%s is on %s but the logits are on %s; move them to one device"
                             % (name, x.device, device))
    return x


class _Indices:
    """Labels (B, U) and lengths (B,), int32 and contiguous on the logits' device, for the library.

    When they had to be converted for CUDA logits (or zero-padded), all three live in one int32
    tensor ``packed`` = [frame lengths, label lengths, labels]: written by the library's
    tdt_pack_indices() kernel where the three were on the device in one integer type (``check``
    then holds its pending verdict when validation is on), else made by one concatenation (at
    most one conversion kernel a call, and one copy to the host for validation). With library
    0.5.0 and later, the library's kernel is the forward call's own first one (options.pack):
    ``request`` (a _core.PackRequest) then stands for packed until that call has placed it in
    its workspace's allocation. ``packed`` is None when the inputs were used as they were (or
    cast one by one for CPU logits); ``host`` is packed's CPU twin when it was built on the host
    (inputs on the CPU), which validation then reads with no copy back.

    The library reads packed's three parts by address (lib_args()): their tensor views, ~8 us
    of host time each on an H200's host, are made only if something asks for them
    (``labels``, ``frame_lengths``, ``label_lengths``: the mean_volume reduction, say).
    """

    __slots__ = ("cols", "packed", "host", "check", "_views", "request")

    def __init__(self, labels, frame_lengths, label_lengths, cols, packed, host, check=None):
        self.cols = cols  # targets.shape[1] as given
        self.packed, self.host, self.check = packed, host, check
        self._views = None if labels is None else (labels, frame_lengths, label_lengths)
        self.request = None

    @classmethod
    def of_packed(cls, packed, batch, max_labels, cols, host=None, check=None, request=None):
        idx = cls(None, None, None, cols, packed, host, check)
        idx._views = (batch, max_labels)  # views not made yet
        idx.request = request  # packed is None: the forward call packs them (_core.PackRequest)
        return idx

    def _tensors(self):
        v = self._views
        if len(v) == 2:
            B, U = v
            p = self.packed
            if p is None:
                p = self.packed = self.request.packed()
            v = self._views = (p[2 * B:].view(B, U), p[:B], p[B:2 * B])
        return v

    @property
    def labels(self):
        return self._tensors()[0]

    @property
    def frame_lengths(self):
        return self._tensors()[1]

    @property
    def label_lengths(self):
        return self._tensors()[2]

    def pack_now(self):
        """A pack request not yet packed by a forward call is packed now (tdt_pack_indices)."""
        if self.request is not None and self.request.owner is None:
            self.request.pack_now()

    def lib_args(self):
        """(labels, frame_lengths, label_lengths) as _core takes them: addresses into packed
        while no view of it was made, else the tensors; (request, None, None) while a pack
        request waits for the forward call that packs it."""
        v = self._views
        if len(v) == 3:
            return v
        B = v[0]
        if self.packed is not None:
            base = self.packed.data_ptr()
        elif self.request.owner is None:
            return self.request, None, None
        else:
            base = self.request.address
        return base + 8 * B, base, base + 4 * B


def _ready(t, device):
    return t.dtype == torch.int32 and t.device == device and t.is_contiguous()


def _int32(t):
    return t.to(torch.int32).contiguous()


def _packable(x, fl, ll, device):
    """Whether tdt_pack_indices() can read these three as they are, on the device."""
    return (x.device == device and fl.device == device and ll.device == device
            and x.dtype in (torch.int32, torch.int64) and fl.dtype == x.dtype == ll.dtype
            and (x.shape[1] <= 1 or x.stride(1) == 1)
            and (fl.shape[0] <= 1 or fl.stride(0) == 1) and (ll.shape[0] <= 1 or ll.stride(0) == 1))


def _indices(targets, logit_lengths, target_lengths, batch, max_labels, device, pack=None):
    """The loss's int32 labels and lengths (_Indices). pack: (max_frames, vocab_size, blank,
    check) where the library may pack them on a CUDA device itself (tdt_pack_indices: one kernel
    that also checks them when check is true), None where it may not (torch.compile)."""
    x = _int_tensor(targets, "targets", device, 2)
    if x.shape[0] != batch:
        raise ValueError("targets has shape %s but the batch size is %d" % (tuple(x.shape), batch))
    fl = _int_tensor(logit_lengths, "logit_lengths", device, 1)
    if fl.shape[0] != batch:
        raise ValueError("logit_lengths has shape %s but the batch size is %d"
                         % (tuple(fl.shape), batch))
    ll = _int_tensor(target_lengths, "target_lengths", device, 1)
    if ll.shape[0] != batch:
        raise ValueError("target_lengths has shape %s but the batch size is %d"
                         % (tuple(ll.shape), batch))
    cols = x.shape[1]
    if (pack is not None and device.type == "cuda" and (pack[3] or cols < max_labels
                                                        or not _ready(fl, device)
                                                        or not _ready(ll, device)
                                                        or not _ready(x, device))
            and _packable(x, fl, ll, device) and _core.pack_available()):
        # on the device: the library's one kernel converts, pads and (with check) judges them,
        # where torch's concatenation, cast and the check's copy cost ~200 us of host time a
        # call on an H200's host (benchmark/host_step.py); from library 0.5.0 the forward call
        # does it in its first kernel, into its workspace's allocation (options.pack)
        if _core.fold_pack_available():
            req, flag = _core.pack_request(pack[0], max_labels, pack[1], pack[2], x, fl, ll,
                                           pack[3])
            return _Indices.of_packed(None, batch, max_labels, cols, check=flag, request=req)
        packed = torch.empty(batch * (max_labels + 2), dtype=torch.int32, device=device)
        flag = _core.pack_indices(pack[0], max_labels, pack[1], pack[2], x, fl, ll, packed,
                                  pack[3])
        return _Indices.of_packed(packed, batch, max_labels, cols, check=flag)
    if cols > max_labels:
        x = x[:, :max_labels]
    if cols >= max_labels and _ready(x, device) and _ready(fl, device) and _ready(ll, device):
        return _Indices(x, fl, ll, cols, None, None)
    if device.type == "cpu" and cols >= max_labels:
        # on the host each is cast on its own: three casts cost a quarter of the concatenation
        # and its views (~5 against ~20 us), and there is no device copy to save
        return _Indices(_int32(x), _int32(fl), _int32(ll), cols, None, None)
    where = x.device if x.device == fl.device == ll.device else device
    if cols < max_labels:  # zero-padded to U (only the first label_lengths[b] are read)
        lab = torch.zeros(batch, max_labels, dtype=torch.int32, device=where)
        lab[:, :cols] = x
    else:
        lab = x
    parts = [t if t.device == where else t.to(where) for t in (fl, ll, lab)]
    packed = torch.cat([parts[0], parts[1], parts[2].reshape(-1)])
    if packed.dtype != torch.int32:
        packed = packed.to(torch.int32)
    host = None
    if packed.device != device:  # built on the host: validation reads it there
        host = packed
        packed = packed.to(device)
    return _Indices.of_packed(packed, batch, max_labels, cols, host)


def _check_label_columns(idx, rows, mode, validate):
    """Targets narrower than U: every U_b must fit in them (they were zero-padded to U)."""
    cols = idx.cols
    if not validate or cols >= rows - 1 or idx.check is not None or mode[0] or mode[1]:
        return
    B = idx.frame_lengths.shape[0]
    label_lengths = idx.label_lengths if idx.host is None else idx.host[B:2 * B]
    over = label_lengths.to(torch.int64) > cols
    if bool(over.any()):
        b = int(over.nonzero()[0, 0])
        raise ValueError("target_lengths[%d] = %d exceeds targets.shape[1] = %d"
                         % (b, int(label_lengths[b]), cols))


def _last_dim_ok(x):
    """The library reads a contiguous last dimension; the leading dims may have any strides
    (broadcast ones included)."""
    return x.shape[-1] <= 1 or x.stride(-1) == 1


def _non_overlapping(x):
    """No two elements share an address (a gradient may only be written over such logits)."""
    extent = 1
    for size, stride in sorted(((x.shape[i], x.stride(i)) for i in range(x.dim()) if x.shape[i] > 1),
                               key=lambda p: p[1]):
        if stride < extent:
            return False
        extent = stride * size
    return True


def _readable(x):
    return x if _last_dim_ok(x) else x.contiguous()


def _check_in_place(x, name, in_place):
    if in_place and not _non_overlapping(x):
        raise ValueError("in_place=True needs %s without overlapping elements (got strides %s for "
                         "shape %s, e.g. an expanded tensor): its gradient is written over it"
                         % (name, tuple(x.stride()), tuple(x.shape)))


def _joint_of(token, duration):
    """The joint (B, T, U+1, V+D) tensor whose two slices token and duration are, or None.

    Taken when token = J[..., :V] and duration = J[..., V:] for one tensor J that autograd can
    differentiate directly: J is the slices' base itself, or a contiguous base viewed as J. Then
    the loss runs on J, and its gradient is written once, joint-shaped, with no slice-backward
    zero fill and copy.
    """
    base = token._base
    if base is None or duration._base is not base:
        return None
    grad = base.requires_grad
    if token.dtype != duration.dtype or token.requires_grad != grad \
            or duration.requires_grad != grad:
        return None
    # (each shape, stride and offset asked once: each ask is host time in an eager step)
    B, T, rows, V = token.shape
    dshape = duration.shape
    D = dshape[-1]
    ts, ds = token.stride(), duration.stride()
    if tuple(dshape[:3]) != (B, T, rows) or ts[:3] != ds[:3]:
        return None
    if (V > 1 and ts[3] != 1) or (D > 1 and ds[3] != 1):
        return None
    offset = token.storage_offset()
    if duration.storage_offset() != offset + V or base.storage_offset() != offset:
        return None
    shape = (B, T, rows, V + D)
    if tuple(base.shape) == shape and base.stride()[:3] == ts[:3] and _last_dim_ok(base):
        return base
    C = V + D
    if base.is_contiguous() and base.numel() == B * T * rows * C \
            and (B <= 1 or ts[0] == T * rows * C) and (T <= 1 or ts[1] == rows * C) \
            and (rows <= 1 or ts[2] == C):
        return base.view(shape)
    return None


# ---- a sample without labels under reduction="mean" -------------------------------------------

_warned_empty_target = False  # the warning below is given once a process


def _warn_if_empty_target(target_lengths):
    """Warns, once, when reduction="mean" meets a sample with U_b = 0 (its loss_b / U_b is inf,
    so the loss is inf and the gradient non-finite, as in transformers and NeMo). Only where the
    lengths can be read without a device-to-host copy: given on the CPU (a tensor or a list), not
    on CUDA, where that read would wait for the GPU."""
    global _warned_empty_target
    if isinstance(target_lengths, torch.Tensor):
        if target_lengths.device.type != "cpu":
            return
        lengths = target_lengths
    else:
        lengths = torch.as_tensor(target_lengths)  # checked already by _indices()
    zero = (lengths == 0).nonzero()
    if zero.numel() == 0:
        return
    _warned_empty_target = True
    warnings.warn(
        "warp_tdt.tdt_loss: target_lengths[%d] = 0 under reduction='mean', which divides each "
        "sample's loss by its target length: the loss is inf and the gradient non-finite (as in "
        "transformers and NeMo). Use reduction='sum', 'mean_batch' (the mean of the per-sample "
        "losses) or 'mean_volume' (their sum over the sum of the target lengths), or leave "
        "samples without labels out of the batch. (This warning is shown once.)"
        % int(zero[0, 0]), UserWarning, stacklevel=4)


# ---- running ----------------------------------------------------------------------------------


def _pack_args(ref, T, V, blank, in_place, validate, mode):
    """_indices()'s pack argument for a call on ref: None on the CPU, under torch.compile (which
    cannot trace the library call) and where _loss() takes the custom ops (they check on their
    own)."""
    if not ref.is_cuda or mode[0] or (_ops.AVAILABLE and not in_place and _FORCE_CUSTOM_OPS):
        return None
    return (int(T), V, blank, bool(validate) and not mode[1])


def _costs_only(logits, duration):
    """Whether a call can be costs-only: no gradient of it can be asked."""
    if not torch.is_grad_enabled():
        return True
    return not logits.requires_grad and (duration is None or not duration.requires_grad)


def _loss(spec, logits, duration, idx, omega, in_place, validate, names, reduction, mode):
    """The reduced loss (_autograd.reduce: "none", "sum", "mean_batch", "mean", "mean_volume").
    mode: _call_mode(logits)."""
    use_ops = _ops.AVAILABLE and not in_place and (_FORCE_CUSTOM_OPS or mode[0])
    if use_ops:
        labels, frame_lengths, label_lengths = idx.labels, idx.frame_lengths, idx.label_lengths
        costs = _ops.costs(spec, logits, duration, labels, frame_lengths, label_lengths, omega,
                           validate)
        return _autograd.reduce(costs, label_lengths, reduction, with_scale=False)[0]
    validate = validate and not mode[1]
    # On CUDA the checks of lengths and labels run after the loss's kernels are enqueued: the
    # copy to the host (none when they were on the host already) goes ahead of the kernels, into
    # pinned memory, and the host waits for that copy alone, so the GPU is not idle while the host
    # checks (the kernels give bad data a NaN cost without reading out of range, and an error
    # raised here drops their outputs). WARP_TDT_ASYNC_VALIDATION=0: check before the launch.
    later = validate and logits.is_cuda and _ASYNC_ENV.get() != "0"
    pending = None
    if idx.check is not None:  # tdt_pack_indices judged them on the device: its flag, pending
        if later:
            pending = idx.check
        else:  # (a pack request is packed and judged now, by its own call)
            idx.pack_now()
            _core.validation_finish(spec, logits, idx.check, names)
    elif later:
        pending = _core.validation_start(idx.labels, idx.frame_lengths, idx.label_lengths,
                                         asynchronous=True, packed=idx.packed, host=idx.host)
    elif validate:
        _core.validation_finish(spec, logits, _core.validation_start(
            idx.labels, idx.frame_lengths, idx.label_lengths, packed=idx.packed, host=idx.host),
            names)
    as_rnnt = bool(torch.rand(()) < omega) if omega > 0 else False
    if _costs_only(logits, duration):
        # no gradient can be asked of this call (an evaluation under torch.no_grad(), or
        # logits without requires_grad): one costs-only library call, which sweeps alpha
        # alone, and no autograd node
        loss = _autograd.costs_only(spec, logits, duration, idx, as_rnnt, reduction)
    else:
        loss = _autograd.LossFunction.apply(logits, duration, idx, spec, as_rnnt, in_place,
                                            reduction)
    if pending is not None:
        _core.validation_finish(spec, logits, pending, names)
    return loss


def _tdt(token_logits, duration_logits, targets, logit_lengths, target_lengths, blank_token_id,
         durations, sigma, reduction, fastemit_lambda, clamp, omega, in_place, fuse_joint,
         validate, joint=None):
    _check_reduction(reduction, TDT_REDUCTIONS)
    compiling = _is_compiling()
    durations = _as_durations(durations, compiling)
    D = len(durations)
    if joint is not None:
        _check_logits(joint, "joint_logits")
        if joint.shape[-1] <= D:
            raise ValueError("joint_logits.shape[-1] = %d must exceed len(durations) = %d (it holds "
                             "vocab_size token logits, then the duration logits)"
                             % (joint.shape[-1], D))
        ref, V = joint, joint.shape[-1] - D
        names = dict(_TDT_NAMES, logits="joint_logits")
    else:
        _check_logits(token_logits, "token_logits")
        _check_logits(duration_logits, "duration_logits")
        if token_logits.device != duration_logits.device:
            raise ValueError("token_logits is on %s but duration_logits is on %s"
                             % (token_logits.device, duration_logits.device))
        if tuple(duration_logits.shape[:3]) != tuple(token_logits.shape[:3]):
            raise ValueError("duration_logits has shape %s but token_logits has shape %s: the first "
                             "three dims (batch, T, U + 1) must agree"
                             % (tuple(duration_logits.shape), tuple(token_logits.shape)))
        if duration_logits.shape[-1] != D:
            raise ValueError("duration_logits.shape[-1] = %d but len(durations) = %d (durations = %s)"
                             % (duration_logits.shape[-1], D, list(durations)))
        ref, V = token_logits, token_logits.shape[-1]
        names = _TDT_NAMES
    if V < 1:
        raise ValueError("%s.shape[-1] = 0: the vocabulary must hold at least the blank"
                         % names["logits"])
    V = int(V)  # the vocabulary is static; batch, T and U may be symbolic under torch.compile
    B, T, rows = ref.shape[:3]
    if rows < 1:
        raise ValueError("%s.shape[2] = 0: it must be U + 1 >= 1 (the lattice rows)" % names["logits"])
    blank_token_id = _as_index(blank_token_id, "blank_token_id")
    if not 0 <= blank_token_id < V:
        raise ValueError("blank_token_id = %r is outside [0, %d) (%s.shape[-1] = %d tokens)"
                         % (blank_token_id, V, names["logits"], V))
    sigma = _check_number(sigma, "sigma")
    fastemit_lambda = _check_number(fastemit_lambda, "fastemit_lambda")
    clamp = _check_number(clamp, "clamp", allow_negative=True)
    omega = _check_number(omega, "omega", 0.0, 1.0)
    device = ref.device
    mode = _call_mode(ref, compiling)
    idx = _indices(targets, logit_lengths, target_lengths, B, rows - 1, device,
                   _pack_args(ref, T, V, blank_token_id, in_place, validate, mode))
    _check_label_columns(idx, rows, mode, validate)

    if joint is None and fuse_joint and not mode[0]:
        joint = _joint_of(token_logits, duration_logits)
    if joint is not None:
        if token_logits is not None and token_logits.dtype != duration_logits.dtype:
            joint = None
    if joint is not None:
        spec = _core.Spec("joint", V, durations, blank_token_id, sigma, fastemit_lambda, clamp,
                          False)
        joint = _readable(joint)
        _check_in_place(joint, names["logits"] if token_logits is None else "the joint tensor of "
                        "token_logits and duration_logits", in_place)
        loss = _loss(spec, joint, None, idx, omega, in_place, validate, names, reduction, mode)
    else:
        tok, dur = token_logits, duration_logits
        if tok.dtype != dur.dtype:
            common = torch.promote_types(tok.dtype, dur.dtype)
            tok, dur = tok.to(common), dur.to(common)
        spec = _core.Spec("separate", V, durations, blank_token_id, sigma, fastemit_lambda, clamp,
                          False)
        tok, dur = _readable(tok), _readable(dur)
        _check_in_place(tok, "token_logits", in_place)
        _check_in_place(dur, "duration_logits", in_place)
        loss = _loss(spec, tok, dur, idx, omega, in_place, validate, names, reduction, mode)
    if reduction == "mean" and not _warned_empty_target and not mode[0]:
        _warn_if_empty_target(target_lengths)
    return loss


def tdt_loss(token_logits, duration_logits, targets, logit_lengths, target_lengths, blank_token_id,
             durations, sigma=0.0, reduction="mean", *, fastemit_lambda=0.0, clamp=0.0, omega=0.0,
             in_place=False, fuse_joint=True, validate=True):
    """TDT (Token-and-Duration Transducer) loss, https://arxiv.org/abs/2304.06795.

    The signature and semantics of ``transformers.loss.loss_tdt.tdt_loss`` (and of the
    kernels-community ``tdt-loss`` layer), computed by the warp-tdt C library on the CPU or GPU.

    Args:
        token_logits: ``(batch, T, U + 1, vocab_size)`` raw logits, blank included; float32,
            float64, float16 or bfloat16. Only the last dim must be contiguous (slices of a joint
            tensor are read in place).
        duration_logits: ``(batch, T, U + 1, num_durations)``, same device (and dtype).
        targets: ``(batch, U)`` labels, any integer dtype; only ``targets[b, :target_lengths[b]]``
            is read, so padding may hold anything.
        logit_lengths: ``(batch,)`` frames per sample, ``0 <= T_b <= T``.
        target_lengths: ``(batch,)`` labels per sample, ``0 <= U_b <= U``.
        blank_token_id: index of the blank in ``[0, vocab_size)``.
        durations: distinct non-negative ints (list or 1-D tensor), e.g. ``[0, 1, 2, 3, 4]``,
            one per duration logit, at least one positive.
        sigma: logit under-normalisation, subtracted from every token log-prob.
        reduction: ``"mean"`` (mean over the batch of ``loss_b / U_b``, the NeMo / transformers
            meaning), ``"sum"``, ``"none"``, ``"mean_batch"`` (mean of ``loss_b``) or
            ``"mean_volume"`` (``sum(loss_b) / sum(U_b)``). Under ``"mean"`` one sample with
            ``U_b == 0`` (no labels) makes the loss ``inf`` and the gradient non-finite, as in
            transformers and NeMo (a warning says so, once, where ``target_lengths`` is on the
            CPU); ``"sum"``, ``"mean_batch"`` and ``"mean_volume"`` take such samples.
        fastemit_lambda: FastEmit regularisation (label-arc occupancies scaled by ``1 + lambda``
            in the token gradient; reported loss ``(1 + lambda) * -log p``).
        clamp: ``> 0`` clips each token-gradient element to ``[-clamp, clamp]`` (before the
            reduction's scale); ``<= 0`` is off.
        omega: probability, per call, of computing the plain RNN-T loss on the token logits
            instead (no sigma, zero duration gradient); drawn from torch's default generator.
        in_place: write the gradient over the logits (saves the gradient's memory; the logits are
            destroyed by the backward pass, which can then run only once).
        fuse_joint: when the two logits are the token / duration slices of one joint tensor, run
            autograd on that tensor, so its gradient is written once with no slice-backward copies
            (hooks on the slice views then see no gradient; pass False to keep them).
        validate: check lengths and labels on the data (on CUDA: judged on the device by the
            library's kernel that packs them, its verdict read from pinned memory once the
            loss's kernels are enqueued, or, where they cannot be packed there, one small copy
            to the host; skipped while a CUDA graph is being captured). Without it the GPU gives
            a bad sample a NaN loss.

    Returns:
        float32 loss (float64 for float64 logits): a scalar, or ``(batch,)`` for ``"none"``.
        An infeasible sample (``T_b == 0``, or no alignment ending exactly at ``T_b``) has loss
        ``inf`` and an exact zero gradient.
    """
    return _tdt(token_logits, duration_logits, targets, logit_lengths, target_lengths,
                blank_token_id, durations, sigma, reduction, fastemit_lambda, clamp, omega,
                in_place, fuse_joint, validate)


def tdt_loss_joint(joint_logits, targets, logit_lengths, target_lengths, blank_token_id, durations,
                   sigma=0.0, reduction="mean", *, fastemit_lambda=0.0, clamp=0.0, omega=0.0,
                   in_place=False, validate=True):
    """tdt_loss() on one joint tensor ``(batch, T, U + 1, vocab_size + len(durations))``: token
    logits first, then the duration logits. The gradient is written once, joint-shaped; unlike the
    slice detection of tdt_loss() this also holds under torch.compile."""
    return _tdt(None, None, targets, logit_lengths, target_lengths, blank_token_id, durations,
                sigma, reduction, fastemit_lambda, clamp, omega, in_place, False, validate,
                joint=joint_logits)


def rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=-1, clamp=-1, reduction="mean",
              fused_log_softmax=True, *, fastemit_lambda=0.0, in_place=False, validate=True):
    """Plain RNN-T loss with the signature and semantics of ``torchaudio.functional.rnnt_loss``.

    Args:
        logits: ``(batch, T, U + 1, vocab_size)``; raw logits, or log-probabilities when
            ``fused_log_softmax=False`` (then the gradient is the derivative with respect to those
            log-probabilities, which torchaudio does not give but which equals its result once
            passed back through a log_softmax).
        targets: ``(batch, U)`` labels, any integer dtype.
        logit_lengths, target_lengths: ``(batch,)``.
        blank: blank index; negative counts from the end (``-1``: the last token).
        clamp: ``> 0`` clips each gradient element to ``[-clamp, clamp]``; ``<= 0`` is off.
        reduction: ``"mean"`` (mean over the batch of ``loss_b``, torchaudio's meaning: not divided
            by the target lengths, so a sample with no labels is fine here, unlike tdt_loss()'s
            ``"mean"``), ``"sum"`` or ``"none"``.
        fastemit_lambda, in_place, validate: as in tdt_loss().

    Returns:
        The loss in the dtype of ``logits``: a scalar, or ``(batch,)`` for ``"none"``.
    """
    if reduction not in RNNT_REDUCTIONS:
        raise ValueError("reduction should be one of 'none', 'mean', or 'sum', got %r" % (reduction,))
    _check_logits(logits, "logits")
    B, T, rows, V = logits.shape
    V = int(V)  # static; the other dims may be symbolic under torch.compile
    if V < 1 or rows < 1:
        raise ValueError("logits has shape %s: it must be (batch, T, U + 1 >= 1, vocab_size >= 1)"
                         % (tuple(logits.shape),))
    blank = _as_index(blank, "blank")
    b = blank + V if blank < 0 else blank
    if not 0 <= b < V:
        raise ValueError("blank = %d is outside [-%d, %d) (logits.shape[-1] = %d tokens)"
                         % (blank, V, V, V))
    clamp = _check_number(clamp, "clamp", allow_negative=True)
    fastemit_lambda = _check_number(fastemit_lambda, "fastemit_lambda")
    device = logits.device
    mode = _call_mode(logits, _is_compiling())
    idx = _indices(targets, logit_lengths, target_lengths, B, rows - 1, device,
                   _pack_args(logits, T, V, b, in_place, validate, mode))
    _check_label_columns(idx, rows, mode, validate)
    spec = _core.Spec("rnnt", V, (), b, 0.0, fastemit_lambda, clamp, not fused_log_softmax)
    x = _readable(logits)
    _check_in_place(x, "logits", in_place)
    loss = _loss(spec, x, None, idx, 0.0, in_place, validate, _RNNT_NAMES,
                 "mean_batch" if reduction == "mean" else reduction, mode)
    return loss.to(logits.dtype)
