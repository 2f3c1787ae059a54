"""Input handling: dtypes, integer types, strides (no copy of strided leading dims), devices,
autocast."""

import ctypes

import pytest
import torch

import reference as R
import warp_tdt
from warp_tdt import _core
from helpers import assert_close, lib_tdt, ref_tdt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["separate", "joint"])
def test_dtypes(device, dtype, layout):
    case = R.random_case(B=3, T=6, U=3, V=6, seed=21)
    # the reference sees exactly the values the library reads
    case["token_logits"] = case["token_logits"].to(dtype).double()
    case["duration_logits"] = case["duration_logits"].to(dtype).double()
    loss, gt, gd = lib_tdt(case, device, dtype, layout, "none")
    rloss, rgt, rgd = ref_tdt(case)
    assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert gt.dtype == dtype and gd.dtype == dtype
    # costs accumulate in float32 or better whatever the input dtype
    assert_close(loss, rloss, torch.float32 if dtype != torch.float64 else dtype, "loss")
    assert_close(gt, rgt, dtype, "token gradient")
    assert_close(gd, rgd, dtype, "duration gradient")


def test_mixed_logit_dtypes_are_promoted(device):
    case = R.random_case(B=2, T=5, U=2, V=4, seed=3)
    tok = case["token_logits"].to(device=device, dtype=torch.float32)
    dur = case["duration_logits"].to(device=device, dtype=torch.float64)
    loss = warp_tdt.tdt_loss(tok, dur, case["targets"], case["logit_lengths"],
                             case["target_lengths"], case["blank_token_id"], case["durations"],
                             reduction="none")
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss.cpu(), ref_tdt(case)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("int_dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_integer_dtypes_for_targets_and_lengths(device, int_dtype):
    case = R.random_case(B=2, T=5, U=3, V=6, seed=4)
    case["targets"][case["targets"] < 0] = 0
    ref = lib_tdt(case, device, torch.float64)
    case2 = dict(case, targets=case["targets"].to(int_dtype),
                 logit_lengths=case["logit_lengths"].to(int_dtype),
                 target_lengths=case["target_lengths"].to(int_dtype))
    got = lib_tdt(case2, device, torch.float64)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


def test_python_lists_for_lengths_and_targets():
    case = R.random_case(B=2, T=5, U=2, V=4, seed=6)
    case["targets"][case["targets"] < 0] = 0
    ref = lib_tdt(case, "cpu", torch.float64)
    case2 = dict(case, targets=case["targets"].tolist(), logit_lengths=case["logit_lengths"].tolist(),
                 target_lengths=case["target_lengths"].tolist(),
                 durations=torch.tensor(case["durations"]))
    got = lib_tdt(case2, "cpu", torch.float64)
    torch.testing.assert_close(got[0], ref[0])


def test_wider_and_narrower_targets(device):
    case = R.random_case(B=2, T=5, U=3, V=5, seed=8, full_lengths=True)
    ref = lib_tdt(case, device, torch.float64)
    wide = dict(case, targets=torch.cat([case["targets"], torch.full((2, 4), 99)], 1))
    torch.testing.assert_close(lib_tdt(wide, device, torch.float64)[0], ref[0])
    case["target_lengths"][:] = torch.tensor([2, 1])
    ref = lib_tdt(case, device, torch.float64)
    narrow = dict(case, targets=case["targets"][:, :2])
    torch.testing.assert_close(lib_tdt(narrow, device, torch.float64)[0], ref[0])
    # non-contiguous int32 (column-major targets, every other length): copied, not misread
    cm = case["targets"].int().t().contiguous().t()
    spaced = dict(case, targets=cm,
                  logit_lengths=torch.stack([case["logit_lengths"], torch.zeros(2, dtype=torch.int64)], 1).int()[:, 0],
                  target_lengths=torch.stack([case["target_lengths"], torch.zeros(2, dtype=torch.int64)], 1).int()[:, 0])
    assert not cm.is_contiguous() and not spaced["logit_lengths"].is_contiguous()
    torch.testing.assert_close(lib_tdt(spaced, device, torch.float64)[0], ref[0])


@pytest.fixture
def spy_pointers(monkeypatch):
    """Records the token / duration pointers each library call receives."""
    seen = []
    real = _core._build

    def spy(*args, **kwargs):
        p, o, keep = real(*args, **kwargs)
        seen.append((p.token_logits, p.duration_logits, tuple(p.token_strides)))
        return p, o, keep

    monkeypatch.setattr(_core, "_build", spy)
    return seen


def test_strided_leading_dims_are_read_without_copy(device, spy_pointers):
    case = R.random_case(B=3, T=6, U=3, V=5, seed=12, dtype=torch.float64)
    ref = ref_tdt(case)
    # (T, B, U+1, V) storage seen as (B, T, U+1, V), every other frame of a longer tensor
    big_tok = torch.randn(12, 3, 4, 5, dtype=torch.float64, device=device)
    big_tok[::2] = case["token_logits"].transpose(0, 1).to(device)
    tok = big_tok[::2].transpose(0, 1).requires_grad_(False)
    dur = case["duration_logits"].to(device).permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    assert not tok.is_contiguous() and not dur.is_contiguous()
    tok.requires_grad_(True)
    dur.requires_grad_(True)
    loss = warp_tdt.tdt_loss(tok, dur, case["targets"], case["logit_lengths"],
                             case["target_lengths"], case["blank_token_id"], case["durations"],
                             reduction="none")
    loss.sum().backward()
    assert spy_pointers[0][0] == tok.data_ptr() and spy_pointers[0][1] == dur.data_ptr()
    assert spy_pointers[0][2] == tuple(tok.stride()[:3])
    torch.testing.assert_close(loss.cpu(), ref[0])
    torch.testing.assert_close(tok.grad.cpu(), ref[1])
    torch.testing.assert_close(dur.grad.cpu(), ref[2])


def test_broadcast_batch_is_read_without_copy(device, spy_pointers):
    case = R.random_case(B=1, T=5, U=2, V=4, seed=13, full_lengths=True, dtype=torch.float64)
    tok1 = case["token_logits"].to(device).requires_grad_(True)
    dur1 = case["duration_logits"].to(device).requires_grad_(True)
    tok, dur = tok1.expand(3, -1, -1, -1), dur1.expand(3, -1, -1, -1)
    targets = case["targets"].expand(3, -1)
    loss = warp_tdt.tdt_loss(tok, dur, targets, [5, 5, 5], [2, 2, 2], case["blank_token_id"],
                             case["durations"], reduction="sum")
    loss.backward()
    assert spy_pointers[0][0] == tok1.data_ptr() and spy_pointers[0][2][0] == 0
    r = ref_tdt(case)
    assert loss.item() == pytest.approx(3 * r[0].item(), rel=1e-10)
    torch.testing.assert_close(tok1.grad.cpu(), 3 * r[1])
    torch.testing.assert_close(dur1.grad.cpu(), 3 * r[2])


def test_non_contiguous_last_dim_is_copied(device):
    case = R.random_case(B=2, T=5, U=2, V=6, seed=14, dtype=torch.float64)
    ref = ref_tdt(case)
    tok = case["token_logits"].to(device).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert tok.stride(-1) != 1
    tok.requires_grad_(True)
    loss = warp_tdt.tdt_loss(tok, case["duration_logits"].to(device), case["targets"],
                             case["logit_lengths"], case["target_lengths"], case["blank_token_id"],
                             case["durations"], reduction="none")
    loss.sum().backward()
    torch.testing.assert_close(loss.cpu(), ref[0])
    torch.testing.assert_close(tok.grad.cpu(), ref[1])


def test_autocast_runs_in_the_autocast_dtype(device):
    dev_type = "cuda" if device == "cuda" else "cpu"
    low = torch.float16 if device == "cuda" else torch.bfloat16
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 6 + 3).to(device)
    x = torch.randn(2, 5, 3, 8, device=device)
    targets = torch.tensor([[1, 2], [0, 3]])
    with torch.autocast(device_type=dev_type, dtype=low):
        joint = lin(x)
        assert joint.dtype == low
        loss = warp_tdt.tdt_loss(joint[..., :6], joint[..., 6:], targets, [5, 4], [2, 1], 5, [0, 1, 2])
    assert loss.dtype == torch.float32
    loss.backward()
    assert lin.weight.grad is not None and torch.isfinite(lin.weight.grad).all()
    ref = warp_tdt.tdt_loss(joint.detach().float()[..., :6], joint.detach().float()[..., 6:],
                            targets, [5, 4], [2, 1], 5, [0, 1, 2])
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)


def test_expanded_upstream_gradient_is_read_as_one_value(device, monkeypatch):
    """A sum reduction hands the backward one value expanded to (B,) (stride 0): the library
    reads it as one (options.grad_costs_scalar), with no copy, and the gradient is bit for bit
    the one of the same value repeated in a contiguous (B,) tensor."""
    flags = []
    real = _core._call

    def spy(fn_name, logits, o, *args):
        if fn_name == "tdt_backward":
            flags.append(o.grad_costs_scalar)
        return real(fn_name, logits, o, *args)

    monkeypatch.setattr(_core, "_call", spy)
    case = R.random_case(B=4, T=6, U=3, V=7, seed=31)
    V = 7
    joint = torch.cat([case["token_logits"], case["duration_logits"]], -1).float().to(device)
    grads = []
    for weights in (None, torch.full((4,), -0.75, device=device)):
        x = joint.clone().requires_grad_(True)
        loss = warp_tdt.tdt_loss(x[..., :V], x[..., V:], case["targets"], case["logit_lengths"],
                                 case["target_lengths"], case["blank_token_id"],
                                 case["durations"], reduction="none")
        (loss.sum() * -0.75 if weights is None else (loss * weights).sum()).backward()
        grads.append(x.grad)
    assert flags == [1, 0], "grad_costs_scalar per backward call: %s" % flags
    assert torch.equal(grads[0], grads[1]), \
        "max |difference| %g" % (grads[0] - grads[1]).abs().max().item()


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("int_dtype", [torch.int32, torch.int64])
def test_labels_and_lengths_reach_the_library_in_one_pack(device, int_dtype, validate, monkeypatch):
    """int32 contiguous labels and lengths on the logits' device are passed as they are where
    nothing is to be done with them (CPU logits, or CUDA without the check); otherwise they are
    packed: for CUDA logits together, into one int32 tensor [frame lengths, label lengths,
    labels], by the library's tdt_pack_indices kernel (which also judges them for the check);
    for CPU logits each cast on its own (three casts cost less than a concatenation there)."""
    seen = []
    real = _core._build

    def spy(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt):
        seen.append((labels, frame_lengths, label_lengths))
        return real(spec, logits, duration, labels, frame_lengths, label_lengths, as_rnnt)

    monkeypatch.setattr(_core, "_build", spy)
    packs = []
    real_pack = _core.pack_indices

    def pack_spy(*args):
        packs.append(args[7])  # the packed int32 tensor the kernel writes
        return real_pack(*args)

    monkeypatch.setattr(_core, "pack_indices", pack_spy)
    requests = []  # the forward call packs them itself (options.pack, library 0.5.0)
    real_request = _core.pack_request

    def request_spy(*args):
        requests.append(real_request(*args))
        return requests[-1]

    monkeypatch.setattr(_core, "pack_request", request_spy)
    calls = []
    real_call = _core._call

    def call_spy(fn_name, logits, o, *args):
        p = args[0]._obj  # the tdt_problem_t
        calls.append((fn_name, p.frame_lengths, p.label_lengths, p.labels, o.pack))
        return real_call(fn_name, logits, o, *args)

    monkeypatch.setattr(_core, "_call", call_spy)
    case = R.random_case(B=3, T=6, U=4, V=6, seed=32)
    targets = case["targets"].to(device=device, dtype=int_dtype)
    fl = case["logit_lengths"].to(device=device, dtype=int_dtype)
    ll = case["target_lengths"].to(device=device, dtype=int_dtype)
    loss = warp_tdt.tdt_loss(case["token_logits"].to(device), case["duration_logits"].to(device),
                             targets, fl, ll, case["blank_token_id"], case["durations"],
                             reduction="none", validate=validate)
    labels, f, l = seen[0]
    if int_dtype == torch.int32 and (device == "cpu" or not validate):
        assert labels.dtype == f.dtype == l.dtype == torch.int32
        assert (labels.data_ptr(), f.data_ptr(), l.data_ptr()) == \
            (targets.data_ptr(), fl.data_ptr(), ll.data_ptr())
    elif device == "cuda":
        want = torch.cat([case["logit_lengths"], case["target_lengths"],
                          case["targets"].reshape(-1)]).int()
        if requests:
            # packed by the forward call (options.pack) into its workspace's allocation: no
            # call of its own, and the problem's three arrays that one packed array
            req, _flag = requests[0]
            assert packs == [] and len(requests) == 1
            assert len(calls) == 1 and calls[0][0] in ("compute_tdt_loss", "tdt_forward"), calls
            _, f, l, labels, pack = calls[0]
            assert pack == ctypes.addressof(req.ind) and f == req.address
            assert l == f + 4 * 3 and labels == f + 4 * 6
            assert req.owner.data_ptr() + req.offset == f and req.offset % 16 == 0
            assert torch.equal(req.packed().cpu(), want), (req.packed().cpu(), want)
        else:
            # the packed tensor's three parts, by address (no views made)
            assert all(isinstance(x, int) for x in (labels, f, l)), (labels, f, l)
            assert len(packs) == 1 and packs[0].data_ptr() == f and packs[0].dtype == torch.int32
            assert l == f + 4 * 3 and labels == f + 4 * 6
            assert torch.equal(packs[0].cpu(), want), (packs[0].cpu(), want)
    else:
        assert labels.dtype == f.dtype == l.dtype == torch.int32
        for got, want in ((labels, case["targets"]), (f, case["logit_lengths"]),
                          (l, case["target_lengths"])):
            assert got.is_contiguous() and torch.equal(got, want.int()), (got, want)
    torch.testing.assert_close(loss.cpu(), ref_tdt(case)[0].float(), rtol=1e-5, atol=1e-5)

