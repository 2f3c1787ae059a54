"""Tensor plumbing: PyTorch tensors in, one tdt_forward() / tdt_backward() call out.

Everything that touches raw pointers lives here, shared by the eager autograd.Function
(_autograd.py) and the torch.compile custom ops (_ops.py). Callers hand over tensors that
functional.py has already checked for shape, dtype and device: logits with a contiguous last
dimension, int32 contiguous labels (B, U) and lengths (B,) on the logits' device.

Three layouts of the logits (Spec.mode):
  "separate": token logits (B, T, U+1, V) and duration logits (B, T, U+1, D), two tensors.
  "joint":    one tensor (B, T, U+1, V + D); token logits are [..., :V], durations [..., V:].
              Both gradients are written into one joint-shaped buffer, with no copy.
  "rnnt":     token logits only (plain RNN-T lattice).
A TDT call whose omega draw chose RNN-T (``as_rnnt``) runs the RNN-T lattice on the token part,
without sigma, and gives the duration logits a zero gradient.
"""

import ctypes
import threading
import time
from typing import NamedTuple, Tuple

import torch

from . import _hostmem, _lib

try:  # the data checks' fast path; torch works without numpy, and so do they
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

__all__ = ["Spec", "forward", "forward_ahead", "backward", "scale", "grad_buffers",
           "validate_data", "workspace_bound", "acc_dtype", "pack_indices", "pack_request",
           "PackRequest"]

_DTYPES = {
    torch.float32: _lib.DTYPE_FLOAT32,
    torch.float64: _lib.DTYPE_FLOAT64,
    torch.float16: _lib.DTYPE_FLOAT16,
    torch.bfloat16: _lib.DTYPE_BFLOAT16,
}


class Spec(NamedTuple):
    """Everything about a call that is not a tensor (hashable, so it can key caches)."""

    mode: str  # "separate" | "joint" | "rnnt"
    vocab_size: int  # V, blank included
    durations: Tuple[int, ...]  # () for plain RNN-T
    blank: int
    sigma: float
    fastemit_lambda: float
    clamp: float  # > 0 clips token gradients; 0 = off
    log_probs: bool  # inputs are log-probabilities (TDT_INPUT_LOG_PROBS)


def acc_dtype(dtype):
    """Accumulate type of costs and upstream gradients: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def workspace_bound(batch, max_frames, rows, num_durations):
    """A closed-form upper bound of tdt_get_workspace_size(), in bytes.

    Used where the size must be known from (possibly symbolic) shapes alone: the fake
    implementation of the torch.compile custom op. It mirrors the layout drawn in
    src/common/workspace.h (five per-node double arrays, Dw per-node duration doubles, the (B)
    arrays: two doubles, 32 double pairs and an int32 a sample, the GPU's 3 + (T + U) + 3 B int32
    counters, a small header, one alignment pad per sub-buffer plus the pointer slack), and every
    real call checks it against the library's own answer, so a layout change cannot go
    unnoticed.
    """
    nodes = batch * max_frames * rows
    dw = max(int(num_durations), 1)
    counters = 2 + max_frames + rows + 3 * batch  # 3 + (T + U) + 3 B, with rows = U + 1
    return 8 * nodes * (5 + dw) + (16 + 512 + 4) * batch + 4 * counters + 64 + 14 * 256


# Data pointers of the last gradient buffers written (token, duration): lets the tests check
# that the gradient autograd hands on is the very buffer the library wrote.
last_grad_ptrs = (0, 0)


def _empty_grad(x):
    """An uninitialised gradient buffer laid out like x (the library writes every element, so it
    is never zero-filled). On the CPU a contiguous one comes from _hostmem, which reuses the
    previous call's memory once autograd has dropped it instead of faulting in fresh pages."""
    if not x.is_cuda and x.is_contiguous():
        g = _hostmem.empty(tuple(x.shape), x.dtype, "grad")
        if g is not None:
            return g
    return torch.empty_like(x, memory_format=torch.preserve_format)


_strides_cache = {}  # stride tuple -> its first three as a ctypes int64[3]


def _strides3(t):
    """The element strides of dims b, t, u, as the structs' int64[3] fields take them: a ctypes
    array kept per stride tuple (a training loop has a few), which a field copies in ~0.2 us,
    where converting a tuple takes ~0.9 (and the structs take four a step)."""
    s = t.stride()
    a = _strides_cache.get(s)
    if a is None:
        if len(_strides_cache) >= _CACHE_MAX:
            _strides_cache.clear()
        a = _strides_cache[s] = _lib.c_int64_3(int(s[0]), int(s[1]), int(s[2]))
    return a


# Options depend on the Spec alone (plus the device kind and the RNN-T draw): built once and
# copied per call (the copy gets the call's stream or thread count). The durations array each
# points to lives in the cache entry; a caller keeps the entry while its call runs.
_options_cache = {}
_workspace_cache = {}  # (B, T, rows, tdt, D, state_in_grads) -> tdt_get_workspace_size()
_CACHE_MAX = 256
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


_SCHEDULES = {"auto": _lib.GPU_SCHEDULE_AUTO, "serial": _lib.GPU_SCHEDULE_SERIAL,
              "overlap": _lib.GPU_SCHEDULE_OVERLAP, "split": _lib.GPU_SCHEDULE_SPLIT,
              "fused": _lib.GPU_SCHEDULE_FUSED, "trail": _lib.GPU_SCHEDULE_TRAIL}


_SCHEDULE_ENV = _lib.EnvVar("WARP_TDT_GPU_SCHEDULE")


def gpu_schedule():
    """tdt_options_t.gpu_schedule from WARP_TDT_GPU_SCHEDULE (auto, serial, overlap, split,
    fused or trail; default auto): the GPU's kernel order, for benchmarking. serial, overlap,
    split and trail give the same results, bit for bit; fused and trail (and auto where it picks
    them) run the gradient pass in the forward (forward_ahead); fused's gradients agree with the
    others' to rounding."""
    name = _SCHEDULE_ENV.get()
    if name is None:
        return _lib.GPU_SCHEDULE_AUTO
    value = _SCHEDULES.get(name.lower())
    if value is None:
        raise ValueError("WARP_TDT_GPU_SCHEDULE = %r is not one of %s"
                         % (name, ", ".join(sorted(_SCHEDULES))))
    return value


def _options(spec, cuda, tdt):
    key = (spec, cuda, tdt)
    entry = _options_cache.get(key)
    if entry is None:
        o = _lib.Options()
        o.location = _lib.LOCATION_GPU if cuda else _lib.LOCATION_CPU
        o.blank = spec.blank
        keep = None
        if tdt:
            keep = (ctypes.c_int * len(spec.durations))(*spec.durations)
            o.durations = ctypes.cast(keep, ctypes.POINTER(ctypes.c_int))
            o.num_durations = len(spec.durations)
            o.sigma = spec.sigma
        o.fastemit_lambda = spec.fastemit_lambda
        o.clamp = spec.clamp if spec.clamp > 0 else 0.0
        o.input_kind = _lib.INPUT_LOG_PROBS if spec.log_probs else _lib.INPUT_LOGITS
        if len(_options_cache) >= _CACHE_MAX:
            _options_cache.clear()
        entry = _options_cache[key] = (o, keep)
    o = _lib.Options.from_buffer_copy(entry[0])
    # CPU: as many OpenMP threads as torch's own CPU ops use (torch.set_num_threads() is the one
    # knob); not the library's default, which is the calling thread's OpenMP setting and need not
    # follow torch (a library built against another OpenMP runtime, or a thread torch never set)
    if not cuda:
        o.num_threads = max(1, torch.get_num_threads())
    else:
        o.gpu_schedule = gpu_schedule()
    return o, entry


def _address(x):
    """The device (or host) address of an int32 index tensor, or x itself where the caller
    passed the address (functional._Indices.lib_args(): parts of one packed tensor it keeps
    alive, which no torch op needs to make)."""
    return x if isinstance(x, int) else x.data_ptr()


def _build(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt):
    """The tdt_problem_t and tdt_options_t of a call, plus the objects they point into. The
    labels and lengths: int32 tensors, or their addresses (_address)."""
    B, T, rows = logits.shape[:3]
    V = spec.vocab_size
    p = _lib.Problem()
    p.batch, p.max_frames, p.max_labels, p.vocab_size = B, T, rows - 1, V
    p.dtype = _DTYPES[logits.dtype]
    p.token_logits = logits.data_ptr()
    p.token_strides = _strides3(logits)
    tdt = spec.mode != "rnnt" and not as_rnnt
    if tdt:
        if spec.mode == "joint":
            p.duration_logits = p.token_logits + V * logits.element_size()
            p.duration_strides = p.token_strides
        else:
            p.duration_logits = duration.data_ptr()
            p.duration_strides = _strides3(duration)
    p.labels = _address(labels) if rows > 1 else None
    p.frame_lengths = _address(frame_lengths)
    p.label_lengths = _address(label_lengths)
    o, keep = _options(spec, logits.is_cuda, tdt)
    return p, o, keep


def _workspace_size(p, o):
    key = (p.batch, p.max_frames, p.max_labels, bool(p.duration_logits), o.num_durations,
           o.state_in_grads)
    n = _workspace_cache.get(key)
    if n is None:
        c = ctypes.c_size_t(0)
        _lib.check("tdt_get_workspace_size",
                   _lib.load().tdt_get_workspace_size(ctypes.byref(p), ctypes.byref(o),
                                                      ctypes.byref(c)))
        if len(_workspace_cache) >= _CACHE_MAX:
            _workspace_cache.clear()
        n = _workspace_cache[key] = int(c.value)
    return n


def _call(fn_name, logits, o, *args):
    """Runs one C entry point on the logits' current stream. No device guard: on the GPU the
    library itself runs on the device that owns the workspace, and restores the current one."""
    if logits.is_cuda:
        index = logits.device.index
        o.stream = (_raw_stream(index) if _raw_stream is not None
                    else torch.cuda.current_stream(logits.device).cuda_stream)
    _lib.check(fn_name, getattr(_lib.load(), fn_name)(*args))


_REDUCTIONS = {"sum": _lib.REDUCTION_SUM, "mean_batch": _lib.REDUCTION_MEAN}


def _forward_setup(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt,
                   workspace_bytes, zero_workspace, built, per_label=False, batch_mean=False,
                   reduce=None, state_in_grads=False):
    """A forward call's (problem, options, keep), workspace and costs, allocated. per_label:
    options.normalize_costs (costs / U_b, and the backward's upstream divided likewise);
    batch_mean: options.batch_mean (the backward's upstream is the batch mean's, divided by B).
    reduce: "sum" or "mean_batch" (options.reduction): the costs then go to the workspace's
    tail, and what comes back as costs is the 0-d reduction the library writes."""
    B = int(logits.shape[0])
    acc = acc_dtype(logits.dtype)
    req = labels if isinstance(labels, PackRequest) else None
    if req is not None:  # packed by the call into the workspace's allocation: addresses below
        labels = frame_lengths = label_lengths = 0
    p, o, keep = _build(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt)
    if per_label:
        o.normalize_costs = 1
    if batch_mean:
        o.batch_mean = 1
    if state_in_grads:
        o.state_in_grads = 1
    if built is not None:
        built.append((p, o, keep))
    need = _workspace_size(p, o)
    size = need if workspace_bytes is None else int(workspace_bytes)
    if size < need:
        raise RuntimeError(
            "warp_tdt: internal error: workspace bound %d bytes < tdt_get_workspace_size() = %d "
            "for B=%d T=%d U+1=%d D=%d; the library's workspace layout grew, update "
            "_core.workspace_bound()" % (size, need, B, logits.shape[1], logits.shape[2],
                                        len(spec.durations)))
    # one allocation: the workspace, then (16-byte aligned) the packed labels and lengths of a
    # pack request, then the (B) costs where the library reduces them
    total = size
    if req is not None:
        at_pack = (total + 15) // 16 * 16
        total = at_pack + 4 * req.n
    if reduce is not None:
        at = (total + 15) // 16 * 16
        total = at + B * (8 if acc == torch.float64 else 4)
    workspace = None
    if zero_workspace:
        workspace = torch.zeros(total, dtype=torch.uint8, device=logits.device)
    elif not logits.is_cuda:
        workspace = _hostmem.empty((total,), torch.uint8, "workspace")
    if workspace is None:
        workspace = torch.empty(total, dtype=torch.uint8, device=logits.device)
    if req is not None:
        base = req.placed(workspace, at_pack)
        p.frame_lengths, p.label_lengths = base, base + 4 * B
        p.labels = base + 8 * B if p.max_labels > 0 else None
        o.pack = ctypes.addressof(req.ind)
        o.pack_valid = req.valid
    if reduce is None:
        costs = torch.empty(B, dtype=acc, device=logits.device)
        return p, o, keep, size, workspace, costs, costs.data_ptr()
    out = torch.empty((), dtype=acc, device=logits.device)
    o.reduction = _REDUCTIONS[reduce]
    o.reduced_cost = out.data_ptr()
    return p, o, keep, size, workspace, out, workspace.data_ptr() + at


def reduction_available():
    """Whether the loaded library has options.reduction (0.4.0 and later)."""
    return _has_version(400)


def _nothing_to_read(logits, costs, reduce=None, labels=None):
    """Whether a forward has no library call to make: an empty batch, or T == 0, where every
    sample is infeasible (its cost set to +inf here; with reduce, the reduction written here as
    the library would: a sum or mean of infs, or of no sample, 0 and NaN). labels: a
    PackRequest is packed (and judged) all the same, by tdt_pack_indices()."""
    if logits.numel() != 0:
        return False
    if isinstance(labels, PackRequest):
        labels.pack_now()
    if logits.shape[0] > 0:
        costs.fill_(float("inf"))
    elif reduce is not None:
        costs.fill_(0.0 if reduce == "sum" else float("nan"))
    return True


def forward(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt=False,
            workspace_bytes=None, zero_workspace=False, built=None, costs_only=False,
            per_label=False, batch_mean=False, reduce=None):
    """Costs (B,) in the accumulate type, and the workspace that backward() needs.

    costs_only: no backward() will follow; the call is compute_tdt_loss() without gradients,
    which skips beta (and leaves a workspace backward() cannot use).

    workspace_bytes: the size to allocate (the custom op passes workspace_bound() so that its
    fake and real outputs agree); None allocates exactly what the library asks for.
    zero_workspace: zero-fill it first, so its bytes are a function of the inputs alone.
    built: a list to which the call's (problem, options, keep) are appended, for backward() to
    reuse (the same tensors, so the same pointers).
    per_label: costs divided by the label lengths by the library (options.normalize_costs), and
    a backward() on built takes the upstream of those.
    batch_mean: a backward() on built takes the upstream of the costs' batch mean, and the
    library divides it by B (options.batch_mean).
    reduce: None, "sum" or "mean_batch" (reduction_available()): the 0-d sum or mean of the
    costs, which the library writes (options.reduction), comes back in place of the costs.
    """
    p, o, keep, size, workspace, costs, costs_at = _forward_setup(
        spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt, workspace_bytes,
        zero_workspace, built, per_label, batch_mean, reduce)
    if _nothing_to_read(logits, costs, reduce, labels):
        return costs, workspace
    if costs_only:
        _call("compute_tdt_loss", logits, o, ctypes.byref(p), ctypes.byref(o), costs_at, None,
              workspace.data_ptr(), size)
    else:
        _call("tdt_forward", logits, o, ctypes.byref(p), ctypes.byref(o), costs_at,
              workspace.data_ptr(), size)
    o.pack = o.pack_valid = None  # (a backward on built ignores them)
    return costs, workspace


_version = []  # the loaded library's TDT_VERSION_NUMBER, asked once


def _has_version(number):
    """Whether the loaded library is version `number` (TDT_VERSION_NUMBER) or later. An older
    one reads nothing of the options fields it lacks, past its shorter tdt_options_t."""
    if not _version:
        _version.append(_lib.version())
    return _version[0] >= number


def per_label_available():
    """Whether the loaded library has options.normalize_costs (0.2.0 and later)."""
    return _has_version(200)


def batch_mean_available():
    """Whether the loaded library has options.batch_mean (0.3.0 and later)."""
    return _has_version(300)


def ahead_available():
    """Whether the loaded library has tdt_forward_ahead() and tdt_scale_gradients()."""
    return hasattr(_lib.load(), "tdt_forward_ahead")


_STATE_ENV = _lib.EnvVar("WARP_TDT_STATE_IN_GRADS")
# The share of a logits row (token and duration elements) above which the per-node state, 8 (5
# + D) bytes a node, goes to the gradient's rows (options.state_in_grads): then it would take
# the peak memory past 1.04x the logits (ragged's V = 257: 7.6 % in float32, 15 % in 16-bit
# types; V = 1025 in 16-bit types: 3.9 %, left in the workspace).
_STATE_SHARE = 0.04
# src/gpu/sweep.cuh's kSplitBytesPerDiagonal: logits bytes a diagonal from which AUTO splits
_SPLIT_BYTES_PER_DIAGONAL = 2.5 * 1024 * 1024
_sm_counts = {}  # device index -> multiprocessors


def _auto_may_split_or_fuse(logits, vocab, num_durations):
    """Whether the library's AUTO schedule might take the split or the fused schedule for this
    CUDA call (src/gpu/sweep.cuh: overlap_wanted, fused_plan, split_plan), which
    options.state_in_grads rules out: the fused one only where both sweeps overlap the
    normaliser, their 2 B blocks (times a cluster's) on at most a quarter of the SMs; the split
    one only for B on at most a quarter of them and 2.5 MiB of logits a diagonal. Conservative:
    True wherever either could be taken, so the state never costs a faster plan."""
    index = logits.device.index if logits.device.index is not None else torch.cuda.current_device()
    sms = _sm_counts.get(index)
    if sms is None:
        sms = _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    B, T, rows = int(logits.shape[0]), int(logits.shape[1]), int(logits.shape[2])
    if 2 * B <= sms // 4:
        return True
    if B > sms // 4:
        return False
    nbytes = B * T * rows * (vocab + num_durations) * logits.element_size()
    return nbytes >= _SPLIT_BYTES_PER_DIAGONAL * (T + rows - 1)


def state_in_grads_wanted(logits, num_durations, vocab, has_token_grad):
    """Whether a CUDA forward_ahead() keeps the per-node state in the token gradient's rows
    (options.state_in_grads, library 0.6.0): the workspace then holds 16 bytes a node where it
    held 8 (5 + D). Asked where that state is more than _STATE_SHARE of a logits row, the rows
    can hold it, and the schedule (WARP_TDT_GPU_SCHEDULE) is one it keeps: serial, overlap or
    trail, or auto where auto would take one of them (_auto_may_split_or_fuse: the small
    vocabularies' ragged batches of training, say). WARP_TDT_STATE_IN_GRADS=0 never asks; =1
    asks wherever the library takes it (then the split and fused schedules give way to the
    others: include/tdt.h)."""
    if not has_token_grad or not _has_version(600):
        return False
    env = _STATE_ENV.get()
    if env == "0":
        return False
    elem = logits.element_size()
    w = 3 + num_durations  # a block's doubles (src/common/workspace.h)
    if vocab * elem < 8 * w + (8 - elem if elem < 8 else 0):  # tdt_state_row_bytes()
        return False
    if env == "1":
        return True
    schedule = gpu_schedule()
    if schedule in (_lib.GPU_SCHEDULE_SPLIT, _lib.GPU_SCHEDULE_FUSED):
        return False
    if schedule == _lib.GPU_SCHEDULE_AUTO and _auto_may_split_or_fuse(logits, vocab, num_durations):
        return False
    return 8 * (5 + num_durations) > _STATE_SHARE * (vocab + num_durations) * elem


def forward_ahead(spec, logits, duration, labels, frame_lengths, label_lengths, weights,
                  g_logits, g_dur, as_rnnt=False, built=None, per_label=False, batch_mean=False,
                  reduce=None, state_in_grads=False):
    """forward() through tdt_forward_ahead(): (costs, workspace, written).

    Where the library's plan runs the gradient pass with the forward (the GPU's fused schedule:
    long or wide rows; its trail schedule: ragged batches), it also writes into g_logits / g_dur
    (grad_buffers()) the gradients for the upstream ``weights`` (None: ones; a 0-d or (B,)
    tensor of the accumulate type on the logits' device), and written is True: scale() applies
    the factor the backward brings. Else written is False, the buffers are untouched, and
    backward() follows on the workspace as usual.
    per_label, batch_mean: as in forward(); with batch_mean the weights are those of the
    batch mean (None: 1 / B a sample, divided by the library). reduce: as in forward().
    state_in_grads: options.state_in_grads (state_in_grads_wanted()): the per-node state goes to
    g_logits' token rows, so where written is False the backward() that follows must take these
    very buffers, and no backward() can follow the one that consumed them (the workspace alone
    no longer serves it: run the forward again).
    """
    p, o, keep, size, workspace, costs, costs_at = _forward_setup(
        spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt, None, False, built,
        per_label, batch_mean, reduce, state_in_grads)
    if _nothing_to_read(logits, costs, reduce, labels):
        return costs, workspace, False
    w = None
    if weights is not None:
        w, o.grad_costs_scalar = _upstream_arg(weights, logits)
    grads = _gradients(spec, g_logits, g_dur, spec.mode != "rnnt" and not as_rnnt)
    if built is not None:  # scale() takes the same buffers: their struct too
        built[-1] = built[-1] + (grads,)
    written = ctypes.c_int(0)
    _call("tdt_forward_ahead", logits, o, ctypes.byref(p), ctypes.byref(o), costs_at,
          None if w is None else w.data_ptr(), ctypes.byref(grads), workspace.data_ptr(), size,
          ctypes.byref(written))
    o.pack = o.pack_valid = None
    del keep
    if written.value:
        _rnnt_draw_zeros(spec, as_rnnt, g_logits, g_dur)
        _note_written(grads)
    return costs, workspace, bool(written.value)


def scale(spec, factor, logits, duration, labels, frame_lengths, label_lengths, g_logits, g_dur,
          as_rnnt=False, built=None):
    """tdt_scale_gradients(): the gradients forward_ahead() wrote, times ``factor`` (the upstream
    gradient of the costs, 0-d or (B,)), in place; a factor of exactly 1 costs no pass over them
    (the library skips such samples on the device, so no host synchronisation decides it)."""
    if logits.numel() == 0:  # B == 0 included
        return
    if built is None:
        built = _build(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt)
    p, o, keep = built[:3]
    f, o.grad_costs_scalar = _upstream_arg(factor, logits)
    # forward_ahead()'s struct of these very buffers, or a new one
    grads = built[3] if len(built) > 3 else _gradients(spec, g_logits, g_dur,
                                                       spec.mode != "rnnt" and not as_rnnt)
    _call("tdt_scale_gradients", logits, o, ctypes.byref(p), ctypes.byref(o), f.data_ptr(),
          ctypes.byref(grads))
    del keep


def _upstream_arg(grad_costs, logits):
    """(tensor, scalar): an upstream gradient of the costs as the library reads it, in the
    accumulate type on the logits' device. One value for every sample: 0-d (a reduction folded
    into the autograd node, _autograd.reduce), or a sum or batch-mean reduction's one value
    expanded to (B,) (stride 0): the library reads it as one (options.grad_costs_scalar), with
    no copy."""
    acc = acc_dtype(logits.dtype)
    g = grad_costs
    # (get_device(): an int, where .device makes an object on each side)
    if g.dtype != acc or g.get_device() != logits.get_device():
        g = g.to(device=logits.device, dtype=acc)
    scalar = g.dim() == 0 or (g.dim() == 1 and g.shape[0] > 1 and g.stride(0) == 0)
    if not scalar and not g.is_contiguous():
        g = g.contiguous()
    return g, 1 if scalar else 0


def grad_buffers(spec, logits, duration, need_logits, need_duration, in_place=False):
    """(grad_logits, grad_duration), the buffers backward() (or forward_ahead()) writes:
    joint-shaped in joint mode; grad_duration only in separate mode, when asked; with in_place
    the logits tensors themselves (detached)."""
    joint = spec.mode == "joint"
    if spec.mode != "separate":
        need_duration = False
    if in_place:
        return (logits.detach() if need_logits or joint else None,
                duration.detach() if need_duration else None)
    g_logits = _empty_grad(logits) if need_logits or (joint and need_duration) else None
    g_dur = (torch.empty_like(duration, memory_format=torch.preserve_format)
             if need_duration else None)
    return g_logits, g_dur


def _gradients(spec, g_logits, g_dur, tdt):
    """The tdt_gradients_t of these buffers (joint mode: both gradients in g_logits)."""
    grads = _lib.Gradients()
    if g_logits is not None:
        grads.token_grads = g_logits.data_ptr()
        grads.token_strides = _strides3(g_logits)
        if spec.mode == "joint" and tdt:
            grads.duration_grads = g_logits.data_ptr() + spec.vocab_size * g_logits.element_size()
            grads.duration_strides = _strides3(g_logits)
    if g_dur is not None and tdt:
        grads.duration_grads = g_dur.data_ptr()
        grads.duration_strides = _strides3(g_dur)
    return grads


def _rnnt_draw_zeros(spec, as_rnnt, g_logits, g_dur):
    """The RNN-T draw of omega ran the RNN-T lattice: the duration logits get an exact zero
    gradient."""
    if as_rnnt and spec.mode != "rnnt":
        if spec.mode == "joint" and g_logits is not None:
            g_logits[..., spec.vocab_size:].zero_()
        if g_dur is not None:
            g_dur.zero_()


def _note_written(grads):
    global last_grad_ptrs
    last_grad_ptrs = (grads.token_grads or 0, grads.duration_grads or 0)


def backward(spec, grad_costs, logits, duration, labels, frame_lengths, label_lengths, workspace,
             as_rnnt=False, need_logits=True, need_duration=True, in_place=False, built=None,
             buffers=None):
    """Gradients of sum_b grad_costs[b] * costs[b], written once, in the logits' dtype.

    Returns (grad_logits, grad_duration). grad_logits has the shape of ``logits`` (joint-shaped in
    joint mode, holding both gradients); grad_duration is None unless mode is "separate" and
    need_duration. With in_place the gradients overwrite the logits and the logits tensors
    themselves (detached) are returned. built: forward()'s (problem, options, keep), or None.
    buffers: grad_buffers()'s, allocated earlier (forward_ahead() that wrote nothing), or None.
    """
    g, scalar = _upstream_arg(grad_costs, logits)
    if buffers is not None:
        g_logits, g_dur = buffers
    else:
        g_logits, g_dur = grad_buffers(spec, logits, duration, need_logits, need_duration, in_place)
    if logits.shape[0] == 0 or logits.numel() == 0:
        if g_logits is not None:
            g_logits.zero_()
        if g_dur is not None:
            g_dur.zero_()
        return g_logits, g_dur

    if built is None:
        built = _build(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt)
    p, o, keep = built[:3]
    o.grad_costs_scalar = scalar
    grads = _gradients(spec, g_logits, g_dur, spec.mode != "rnnt" and not as_rnnt)
    _call("tdt_backward", logits, o, ctypes.byref(p), ctypes.byref(o), g.data_ptr(),
          ctypes.byref(grads), workspace.data_ptr(), workspace.numel())
    del keep  # the durations array stays alive until here
    _rnnt_draw_zeros(spec, as_rnnt, g_logits, g_dur)
    _note_written(grads)
    return g_logits, g_dur


# ---- data checks (lengths and labels) ---------------------------------------------------------


def validate_data(spec, logits, labels, frame_lengths, label_lengths, names):
    """Raises ValueError naming the first bad length or label.

    labels (B, U), frame_lengths and label_lengths (B,) are int32 on the logits' device. On CUDA
    they are brought to the host in one small copy (one kernel, one host sync); the checks then
    run on the host.

    names: dict with keys logits, targets, logit_lengths, target_lengths, blank (the user-facing
    argument names of the calling function).
    """
    if int(labels.shape[0]) > 0:
        validation_finish(spec, logits, validation_start(labels, frame_lengths, label_lengths),
                          names)


def validation_start(labels, frame_lengths, label_lengths, asynchronous=False, packed=None,
                     host=None):
    """The first half of validate_data: lengths and labels on their way to the host.

    CPU tensors are used as they are, and so is ``host``: int32 [frame lengths, label lengths,
    labels] already on the host (functional._indices builds it there when the inputs were on the
    CPU). CUDA ones are brought to the host in one copy, of ``packed`` (the same layout on the
    device) when given, else of a concatenation: by default a synchronous copy; with
    asynchronous=True into pinned memory on the current stream, with an event recorded after
    the copy, so the caller can enqueue the loss's kernels before validation_finish waits for
    the copy alone (functional._loss' default on CUDA); the pinned buffer and the event are the
    calling thread's, reused from call to call (_pinned_slot). Returns what validation_finish
    takes.
    """
    B, U = int(labels.shape[0]), int(labels.shape[1])
    done = None
    if host is None:
        if not labels.is_cuda:
            return None, (frame_lengths, label_lengths, labels), B, U, None
        if packed is None:
            packed = torch.cat([frame_lengths, label_lengths, labels.reshape(-1)])
        if asynchronous:
            done = _pinned_slot(labels.device, int(packed.numel()))
            host = done.buf[: packed.numel()]
            host.copy_(packed, non_blocking=True)
            done.event.record(torch.cuda.current_stream(labels.device))
        else:
            host = packed.cpu()
    return host, None, B, U, done


class _PinnedSlot:
    """A pinned int32 host buffer and an event, reused by one thread's calls on one device: the
    copy of a call's lengths and labels lands in it, and the event marks the copy's end. `busy`
    from validation_start until validation_finish has read the buffer: a call that finds it
    busy (an earlier call that raised in between) gets a fresh slot instead."""

    __slots__ = ("buf", "event", "busy", "flag")

    def __init__(self, n):
        self.buf = torch.empty(n, dtype=torch.int32, pin_memory=True)
        self.event = torch.cuda.Event()
        self.busy = False
        self.flag = ctypes.c_int32.from_address(self.buf.data_ptr())  # buf[0], read by the host


_tls = threading.local()


def _pinned_slot(device, n):
    slots = getattr(_tls, "slots", None)
    if slots is None:
        slots = _tls.slots = {}
    slot = slots.get(device.index)
    if slot is None or slot.busy or slot.buf.numel() < n:
        size = n if slot is None else max(n, 2 * slot.buf.numel())
        slot = slots[device.index] = _PinnedSlot(size)
    slot.busy = True
    return slot


_INDEX_TYPES = {torch.int32: _lib.INDEX_INT32, torch.int64: _lib.INDEX_INT64}
_blank_options = {}  # (blank, location) -> tdt_options_t of the data checks (they read only these)


def _blank_opts(blank, location):
    """The tdt_options_t that tdt_check_data (CPU) and tdt_pack_indices (GPU; the caller copies
    it to set the stream) take: only the blank and the location set."""
    key = (blank, location)
    o = _blank_options.get(key)
    if o is None:
        o = _lib.Options()
        o.location = location
        o.blank = blank
        if len(_blank_options) >= _CACHE_MAX:
            _blank_options.clear()
        _blank_options[key] = o
    return o


def pack_available():
    """Whether the loaded library has tdt_pack_indices()."""
    return hasattr(_lib.load(), "tdt_pack_indices")


def fold_pack_available():
    """Whether the loaded library packs the indices in the forward call (options.pack, 0.5.0)."""
    return _has_version(500)


def _indices_struct(labels, frame_lengths, label_lengths):
    ind = _lib.Indices()
    ind.type = _INDEX_TYPES[labels.dtype]
    ind.labels = labels.data_ptr() or None
    ind.columns = int(labels.shape[1])
    ind.labels_stride = int(labels.stride(0))
    ind.frame_lengths = frame_lengths.data_ptr() or None
    ind.label_lengths = label_lengths.data_ptr() or None
    return ind


def _pack_call(ref, shape, ind, packed_address, valid_address):
    """tdt_pack_indices() on ref's current CUDA stream. shape: (batch, max_frames, max_labels,
    vocab_size, blank)."""
    p = _lib.Problem()
    p.batch, p.max_frames, p.max_labels, p.vocab_size = shape[:4]
    o = _lib.Options.from_buffer_copy(_blank_opts(shape[4], _lib.LOCATION_GPU))
    _call("tdt_pack_indices", ref, o, ctypes.byref(p), ctypes.byref(o), ctypes.byref(ind),
          packed_address or None, valid_address)


class PackRequest:
    """Labels and lengths (int32 or int64 on a CUDA device) that the forward call packs itself
    into the int32 layout the loss reads (options.pack, library 0.5.0): in the kernel that
    zeroes the workspace's counters, into the workspace's own allocation, so a step saves the
    separate tdt_pack_indices() call (its ctypes crossing, its pointer query and launch) and
    the packed tensor's allocation. ``valid``: the pinned flag's address (the check), or None.
    Once placed (forward's _forward_setup), ``owner`` (the workspace tensor) holds the packed
    array at byte ``offset``, address ``address``; a request that someone needs before any
    forward call ran is packed by pack_now() into a tensor of its own."""

    __slots__ = ("ind", "keep", "valid", "n", "shape", "owner", "offset", "address")

    def __init__(self, ind, keep, valid, shape):
        self.ind, self.keep, self.valid, self.shape = ind, keep, valid, shape  # keep: the sources
        self.n = shape[0] * (shape[2] + 2)
        self.owner, self.offset, self.address = None, 0, 0

    def placed(self, owner, offset):
        """The packed array's place: byte offset in owner (uint8). Returns its address."""
        self.owner, self.offset = owner, offset
        self.address = owner.data_ptr() + offset
        return self.address

    def pack_now(self):
        """tdt_pack_indices() into the place given, or into a new tensor: for a call that makes
        no library call, or views asked for before the forward."""
        labels = self.keep[0]
        if self.owner is None:
            self.placed(torch.empty(4 * self.n, dtype=torch.uint8, device=labels.device), 0)
        _pack_call(labels, self.shape, self.ind, self.address, self.valid)

    def packed(self):
        """The packed int32 array, as a tensor (packing it now if no call has)."""
        if self.owner is None:
            self.pack_now()
        return self.owner[self.offset:self.offset + 4 * self.n].view(torch.int32)


def pack_request(max_frames, max_labels, vocab_size, blank, labels, frame_lengths, label_lengths,
                 check):
    """A PackRequest for these (as pack_indices() takes them), and the _FlagCheck of its verdict
    when check (else None): the forward call packs and judges them."""
    B = int(frame_lengths.shape[0])
    done = _armed_flag(labels.device, check)  # the forward's first kernel writes over it
    req = PackRequest(_indices_struct(labels, frame_lengths, label_lengths),
                      (labels, frame_lengths, label_lengths),
                      done.buf.data_ptr() if done is not None else None,
                      (B, max_frames, max_labels, vocab_size, blank))
    return req, _flag_check(done, labels, frame_lengths, label_lengths, max_labels)


def _armed_flag(device, check):
    """With check, the calling thread's pinned slot, its flag set pending (a packing kernel
    writes 1 or 0 over it); else None."""
    if not check:
        return None
    done = _pinned_slot(device, 1)
    done.flag.value = _FLAG_PENDING
    return done


def _flag_check(done, labels, frame_lengths, label_lengths, max_labels):
    """The _FlagCheck of an armed flag, or None."""
    if done is None:
        return None
    return _FlagCheck(done, labels, frame_lengths, label_lengths, max_labels)


def pack_indices(max_frames, max_labels, vocab_size, blank, labels, frame_lengths, label_lengths,
                 packed, check):
    """tdt_pack_indices() on the current CUDA stream: labels (B, cols) with a contiguous last
    dimension and lengths (B,), int32 or int64, on packed's device, into the int32 tensor
    packed = [frame lengths, label lengths, labels (B, max_labels)] (zero-padded from cols).
    One kernel, where torch's concatenation and cast took two ops and their views three more.

    check: also have the kernel judge the values (tdt_check_data's rules, a label length past
    cols included) into the calling thread's pinned flag, which the host reads as it lands
    (_wait_for_flag). Returns the _FlagCheck that validation_finish() takes, or None without
    check.
    """
    B = int(frame_lengths.shape[0])
    done = _armed_flag(packed.device, check)
    _pack_call(packed, (B, max_frames, max_labels, vocab_size, blank),
               _indices_struct(labels, frame_lengths, label_lengths), packed.data_ptr(),
               done.buf.data_ptr() if done is not None else None)
    return _flag_check(done, labels, frame_lengths, label_lengths, max_labels)


_FLAG_PENDING = -1
_SPIN_SECONDS = 0.001  # how long _wait_for_flag polls before it also asks the stream


def _wait_for_flag(flag, device):
    """Until tdt_pack_indices' kernel has written its verdict over _FLAG_PENDING (pinned memory:
    the host reads it as it lands; by the time a call has enqueued its loss it usually has). No
    event: its record and wait took ~20 us of host time a call on an H200's host. First plain
    reads for up to _SPIN_SECONDS (the clock read every 64): a stream query or a sleep(0) among
    them cost an eager parakeet bfloat16 step on the H200 ~13 us of GPU time (benchmark/
    host_step.py times such steps), and where a step waits on its kernels, up to parakeet, the
    wait is shorter. The reads hold the GIL, so other Python threads wait at most that long.
    Then a stream that ran dry without the write (it failed, or the kernel never ran) ends the
    wait: its error is raised by the synchronisation, or a RuntimeError if it has none."""
    polls = 0
    start = None
    while flag.value == _FLAG_PENDING:
        polls += 1
        if polls % 64 == 0:
            now = time.perf_counter()
            if start is None:
                start = now
            elif now - start > _SPIN_SECONDS:
                break
    stream = None
    polls = 0
    while flag.value == _FLAG_PENDING:
        polls += 1
        if polls % 32 == 0:
            if stream is None:
                stream = torch.cuda.current_stream(device)
            if stream.query() and flag.value == _FLAG_PENDING:
                stream.synchronize()
                raise RuntimeError("warp_tdt: the check of lengths and labels (tdt_pack_indices) "
                                   "did not run on the stream")
            time.sleep(0)  # let other Python threads run while the GPU gets there


class _FlagCheck(NamedTuple):
    """A pending check by tdt_pack_indices(): its verdict (1 or 0) lands over _FLAG_PENDING in
    done.buf[0] (pinned), read as done.flag; the sources name the first bad value when it is
    0."""

    done: "_PinnedSlot"
    labels: torch.Tensor
    frame_lengths: torch.Tensor
    label_lengths: torch.Tensor
    max_labels: int

    def finish(self, spec, logits, names):
        done = self.done
        try:
            if done.flag.value == _FLAG_PENDING:
                _wait_for_flag(done.flag, self.frame_lengths.device)
            ok = done.flag.value == 1
        finally:
            done.busy = False  # the flag read: the thread's next call may reuse the slot
        if ok:
            return
        # bad data: the sources to the host (one synchronisation; only on this path) and the
        # first bad value named in the caller's argument names
        fl, ll, lab = (x.cpu() for x in (self.frame_lengths, self.label_lengths, self.labels))
        B, U, cols = int(fl.shape[0]), self.max_labels, int(lab.shape[1])
        if cols < U:
            over = (ll.to(torch.int64) > cols) & (ll.to(torch.int64) <= U)
            if bool(over.any()):
                b = int(over.nonzero()[0, 0])
                raise ValueError("%s[%d] = %d exceeds %s.shape[1] = %d"
                                 % (names["target_lengths"], b, int(ll[b]), names["targets"], cols))
            lab = torch.cat([lab, torch.zeros(B, U - cols, dtype=lab.dtype)], 1)
        _finish_checks(spec, logits, None, (fl, ll, lab[:, :U].contiguous()), B, U, names,
                       library=False)
        raise ValueError("%s, %s or %s holds a value the loss cannot take (outside int32?)"
                         % (names["targets"], names["logit_lengths"], names["target_lengths"]))


def _as_array(x):
    """x as a numpy array (no copy) where numpy and torch's bridge to it are there, else x."""
    if _np is not None:
        try:
            return x.numpy()
        except (RuntimeError, TypeError):  # a torch built without numpy support
            pass
    return x


def _first(mask):
    """Index (a tuple) of the first True of a boolean numpy array or CPU tensor."""
    if _np is not None and isinstance(mask, _np.ndarray):
        return tuple(int(i) for i in _np.argwhere(mask)[0])
    return tuple(int(i) for i in mask.nonzero()[0])




def _library_says_ok(spec, T, U, B, lengths_labels):
    """tdt_check_data() over int32 host memory: (frame lengths, label lengths, labels) addresses.
    True when every length and used label is in range; False, or None for a library without
    it, sends the caller to the numpy checks (which name the first bad element)."""
    fn = getattr(_lib.load(), "tdt_check_data", None)
    if fn is None:
        return None
    p = _lib.Problem()
    p.batch, p.max_frames, p.max_labels, p.vocab_size = B, T, U, spec.vocab_size
    p.frame_lengths, p.label_lengths, p.labels = lengths_labels
    o = _blank_opts(spec.blank, _lib.LOCATION_CPU)
    return fn(ctypes.byref(p), ctypes.byref(o)) == 0


def validation_finish(spec, logits, pending, names):
    """The second half of validate_data: waits for validation_start's copy, then the checks.

    One C call (tdt_check_data, the CPU backend's own checks) decides that all is well, in a few
    microseconds where the numpy reductions took ~40; only bad data takes the search for the
    first bad element to name, in the caller's argument names.
    """
    if isinstance(pending, _FlagCheck):
        pending.finish(spec, logits, names)
        return
    host, parts, B, U, done = pending
    if done is None:
        _finish_checks(spec, logits, host, parts, B, U, names)
        return
    done.event.synchronize()
    try:
        _finish_checks(spec, logits, host, parts, B, U, names)
    finally:
        done.busy = False  # the buffer read: the thread's next call may reuse it


def _finish_checks(spec, logits, host, parts, B, U, names, library=True):
    """Raises ValueError naming the first bad length or label of host (packed int32) or parts
    (frame lengths, label lengths, labels); library=False skips tdt_check_data (parts of
    another integer type). T is logits.shape[1]; names["rows"], where given, names the lattice's
    U + 1 rows (else names["logits"].shape[2])."""
    if B == 0:
        return
    T = int(logits.shape[1])
    if parts is None:
        base = host.data_ptr()
        addresses = (base, base + 4 * B, base + 8 * B)
    else:
        addresses = tuple(x.data_ptr() for x in parts)
    if library and _library_says_ok(spec, T, U, B, addresses):
        return
    if parts is None:
        h = _as_array(host)
        fl, ll, labels = h[:B], h[B:2 * B], h[2 * B:].reshape(B, U)
    else:
        fl, ll, labels = (_as_array(x) for x in parts)
    V = spec.vocab_size
    numpy = _np is not None and isinstance(fl, _np.ndarray)
    arange = _np.arange if numpy else torch.arange
    ok = fl.min() >= 0 and fl.max() <= T and ll.min() >= 0 and ll.max() <= U
    inside = None
    if ok and U > 0:
        inside = arange(U)[None, :] < ll[:, None]
        used = labels[inside]
        ok = used.shape[0] == 0 or (used.min() >= 0 and used.max() < V
                                    and not (used == spec.blank).any())
    if ok:
        return
    bad_f = (fl < 0) | (fl > T)
    if bool(bad_f.any()):
        b = _first(bad_f)[0]
        raise ValueError(
            "%s[%d] = %d is outside [0, %d]: a frame length must not exceed the padded frame "
            "count %s.shape[1] = %d" % (names["logit_lengths"], b, int(fl[b]), T, names["logits"], T))
    bad_l = (ll < 0) | (ll > U)
    if bool(bad_l.any()):
        b = _first(bad_l)[0]
        rows = names.get("rows") or "%s.shape[2]" % names["logits"]
        raise ValueError(
            "%s[%d] = %d is outside [0, %d]: a label length must not exceed %s - 1 = %d "
            "(the lattice has U + 1 rows)" % (names["target_lengths"], b, int(ll[b]), U, rows, U))
    bad_range = inside & ((labels < 0) | (labels >= V))
    if bool(bad_range.any()):
        b, i = _first(bad_range)
        raise ValueError(
            "%s[%d][%d] = %d is outside [0, %d) (the vocabulary size, blank included)"
            % (names["targets"], b, i, int(labels[b, i]), V))
    bad_blank = inside & (labels == spec.blank)
    b, i = _first(bad_blank)
    raise ValueError("%s[%d][%d] = %d equals %s = %d; the blank cannot be a target label"
                     % (names["targets"], b, i, int(labels[b, i]), names["blank"], spec.blank))
