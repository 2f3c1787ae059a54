"""The bodies of the torch.compile custom ops (_ops.py), run as plain functions on any torch:
real vs fake output metadata, the registered autograd formula against the eager path, and a
workspace whose bytes do not depend on the allocation's alignment (opcheck compares them)."""

import ctypes

import pytest
import torch

import reference as R
from warp_tdt import _core, _lib, _ops

DURS = [0, 1, 2, 3, 4]


class _Ctx:
    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def _inputs(layout, device, draw=None):
    case = R.random_case(B=3, T=6, U=3, V=5, seed=101, dtype=torch.float64, device=device)
    tok, dur = case["token_logits"], case["duration_logits"]
    labels = case["targets"].clamp(min=0).int().contiguous()
    fl, ll = case["logit_lengths"].int(), case["target_lengths"].int()
    if layout == "separate":
        logits, duration, durs = tok, dur, DURS
    elif layout == "joint":
        logits, duration, durs = torch.cat([tok, dur], -1), None, DURS
    else:
        logits, duration, durs = tok, None, []
    return (logits, duration, labels, fl, ll, draw, 5, durs, 4, 0.05, 0.01, 0.5, False, True)


@pytest.mark.parametrize("layout", ["separate", "joint", "rnnt"])
@pytest.mark.parametrize("draw", [None, True])
def test_bodies_match_the_eager_path(device, layout, draw):
    args = _inputs(layout, device, None if draw is None else torch.tensor(draw))
    costs, ws = _ops.forward_impl(*args)
    f_costs, f_ws = _ops.forward_fake(*args)
    for real, fake in ((costs, f_costs), (ws, f_ws)):
        assert (real.shape, real.dtype, real.stride(), real.device) == \
            (fake.shape, fake.dtype, fake.stride(), fake.device)
    ctx = _Ctx()
    _ops.setup_context(ctx, args, (costs, ws))
    w = torch.rand_like(costs)
    grads = _ops.backward_formula(ctx, w, None)
    assert len(grads) == len(args)
    bargs = (w,) + args[:5] + (ws,) + args[5:13]
    fakes = _ops.backward_fake(*bargs)
    reals = _ops.backward_impl(*bargs)
    for real, fake in zip(reals, fakes):
        assert (real.shape, real.dtype, real.stride()) == (fake.shape, fake.dtype, fake.stride())
    # the eager path gives the same bits
    spec = _ops._spec(*args[:2], *args[6:13])
    as_rnnt = bool(draw)
    e_costs, e_ws = _core.forward(spec, *args[:5], as_rnnt)
    e_grads = _core.backward(spec, w, *args[:5], e_ws, as_rnnt)
    assert torch.equal(e_costs, costs)
    assert torch.equal(e_grads[0], grads[0])
    if args[1] is not None:
        assert torch.equal(e_grads[1], grads[1])
    else:
        assert grads[1] is None


def test_workspace_bytes_do_not_depend_on_alignment():
    args = _inputs("separate", "cpu")
    logits, duration, labels, fl, ll = args[:5]
    spec = _ops._spec(*args[:2], *args[6:13])
    bound = _core.workspace_bound(3, 6, 4, len(DURS))
    need = _core._workspace_size(*_core._build(spec, logits, duration, labels, fl, ll, False)[:2])
    assert need <= bound
    canon, grads = [], []
    for k in (0, 64, 128, 192, 8):
        raw = torch.zeros(bound + 512, dtype=torch.uint8)
        start = (-raw.data_ptr()) % 256 + k
        ws = raw[start: start + bound]
        p, o, keep = _core._build(spec, logits, duration, labels, fl, ll, False)
        costs = torch.empty(3, dtype=torch.float64)
        _core._call("tdt_forward", logits, o, ctypes.byref(p), ctypes.byref(o), costs.data_ptr(),
                    ws.data_ptr(), bound)
        canon.append(_ops._canonicalise(ws).clone())
        # the backward reads it back from a misaligned copy
        raw2 = torch.zeros(bound + 512, dtype=torch.uint8)
        s2 = (-raw2.data_ptr()) % 256 + 32
        mis = raw2[s2: s2 + bound]
        mis.copy_(canon[-1])
        grads.append(_core.backward(spec, torch.ones(3, dtype=torch.float64), logits, duration,
                                    labels, fl, ll, _ops._aligned(mis))[0])
    for c, g in zip(canon[1:], grads[1:]):
        assert torch.equal(c, canon[0]) and torch.equal(g, grads[0])


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 7, 3, 5), (16, 200, 101, 8), (3, 50, 301, 0)])
def test_workspace_bound_covers_the_library(shape):
    B, T, rows, D = shape
    p = _lib.Problem()
    p.batch, p.max_frames, p.max_labels, p.vocab_size = B, T, rows - 1, 4
    o = _lib.Options()
    o.num_durations = D
    arr = (ctypes.c_int * max(D, 1))(*range(max(D, 1)))
    o.durations = ctypes.cast(arr, ctypes.POINTER(ctypes.c_int))
    assert _core._workspace_size(p, o) <= _core.workspace_bound(B, T, rows, D)
