"""Joint slices: when token_logits / duration_logits are the two slices of one joint tensor,
autograd runs on the joint tensor and the library writes its gradient once, joint-shaped: no
slice-backward zero fill, no copy, no add. Checked three ways: the joint gradient autograd hands on
is the very buffer the library wrote (data_ptr), the backward graph holds no slice-backward op
(profiler), and the values equal those of the slow path (fuse_joint=False)."""

import pytest
import torch

import reference as R
import warp_tdt
from warp_tdt import _core
from helpers import ref_tdt

DURS = [0, 1, 2, 3]


@pytest.fixture
def modes(monkeypatch):
    seen = []
    real = _core._build

    def spy(spec, *args, **kwargs):
        seen.append(spec.mode)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(_core, "_build", spy)
    return seen


def _batch(device, B=2, T=6, U=3):
    targets = torch.tensor([[1, 2, 0], [3, 1, 1]])[:B, :U]
    return targets, torch.tensor([T, T - 1])[:B], torch.tensor([U, U - 1])[:B]


def _backward_op_names(loss):
    with torch.autograd.profiler.profile() as prof:
        loss.backward()
    return [e.name for e in prof.function_events]


def _big_tensor_ops(loss, numel):
    """Ops of the backward pass that take a tensor of at least numel elements, other than the
    library's own backward (which allocates the joint gradient with empty_like)."""
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        loss.backward()
    out = []
    for e in prof.function_events:
        sizes = [s for s in (e.input_shapes or []) if isinstance(s, list) and s]
        if any(torch.Size(s).numel() >= numel for s in sizes) and e.name not in (
                "aten::empty_like", "aten::empty_strided", "aten::detach", "detach",
                "torch::autograd::AccumulateGrad"):  # it keeps the buffer: see the data_ptr check
            out.append(e.name)
    return out


def _has_slice_backward(names):
    return any("slice_backward" in n.lower() or "slicebackward" in n.lower() for n in names)


def test_leaf_joint_gradient_is_the_library_buffer(device, modes):
    V = 5
    joint = torch.randn(2, 6, 4, V + len(DURS), device=device, requires_grad=True)
    targets, fl, ll = _batch(device)
    loss = warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], targets, fl, ll, V - 1, DURS)
    big = _big_tensor_ops(loss, joint.numel() // 2)
    assert modes[-1] == "joint"
    tok_ptr, dur_ptr = _core.last_grad_ptrs
    assert joint.grad.data_ptr() == tok_ptr
    assert dur_ptr == tok_ptr + V * joint.element_size()
    # nothing but the library touches a joint-sized tensor in the backward pass: no zero fill,
    # no slice_backward copy, no add of two joint-sized gradients
    assert big == [], big


def test_slow_path_has_the_copies_and_the_same_values(device, modes):
    V = 5
    joint = torch.randn(2, 6, 4, V + len(DURS), device=device, dtype=torch.float64,
                        requires_grad=True)
    targets, fl, ll = _batch(device)
    fast = warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], targets, fl, ll, V - 1, DURS)
    fast.backward()
    g_fast = joint.grad.clone()
    joint.grad = None
    slow = warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], targets, fl, ll, V - 1, DURS,
                             fuse_joint=False)
    big = _big_tensor_ops(slow, joint.numel() // 2)
    # one _build per loss: forward builds the C structs, backward reuses them
    assert modes == ["joint", "separate"]
    # the control: slice backward zero-fills and copies joint-sized buffers
    assert any("slice_backward" in n for n in big), big
    assert fast.item() == slow.item()
    assert torch.equal(g_fast, joint.grad)


def test_linear_head_output(device, modes):
    # nn.Linear on a 4-D input returns a view of a 2-D matmul result: the loss runs on that
    # contiguous base viewed joint-shaped, and the base's gradient is our buffer, reshaped.
    V, H = 7, 8
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V + len(DURS)).to(device).double()
    x = torch.randn(2, 6, 4, H, device=device, dtype=torch.float64)
    targets, fl, ll = _batch(device)

    def run(fuse):
        head.zero_grad()
        logits = head(x)
        loss = warp_tdt.tdt_loss(logits[..., :V], logits[..., V:], targets, fl, ll, V - 1, DURS,
                                 fuse_joint=fuse)
        names = _backward_op_names(loss)
        return loss.item(), head.weight.grad.clone(), head.bias.grad.clone(), names

    l1, w1, b1, names = run(True)
    assert modes[-1] == "joint"
    assert not _has_slice_backward(names), names
    l2, w2, b2, _ = run(False)
    assert l1 == l2
    torch.testing.assert_close(w1, w2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b1, b2, rtol=1e-12, atol=1e-12)


def test_flat_base_gradient_is_the_library_buffer(device, modes):
    V = 6
    B, T, rows, C = 2, 6, 4, V + len(DURS)
    flat = torch.randn(B * T * rows, C, device=device, requires_grad=True)
    hook_ptrs = []
    flat.register_hook(lambda g: hook_ptrs.append(g.data_ptr()))
    joint = flat.view(B, T, rows, C)
    targets, fl, ll = _batch(device)
    warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], targets, fl, ll, V - 1, DURS).backward()
    assert modes[-1] == "joint"
    assert hook_ptrs == [_core.last_grad_ptrs[0]]


def test_parakeet_style_joint_network(device, modes):
    # transformers' ParakeetTDTJointNetwork: head(act(enc[:, :, None] + dec[:, None])).squeeze(2)
    torch.manual_seed(3)
    V, H = 9, 6
    head = torch.nn.Linear(H, V + len(DURS)).to(device)
    enc = torch.randn(2, 6, H, device=device, requires_grad=True)
    dec = torch.randn(2, 4, H, device=device, requires_grad=True)
    targets, fl, ll = _batch(device)
    grads = []
    for fuse in (True, False):
        for p in (enc, dec, head.weight):
            p.grad = None
        logits = head(torch.relu(enc[:, :, None, :] + dec[:, None, :, :])).squeeze(2)
        loss = warp_tdt.tdt_loss(logits[..., :V], logits[..., V:], targets, fl, ll, V - 1, DURS,
                                 fuse_joint=fuse)
        loss.backward()
        grads.append((loss.item(), enc.grad.clone(), dec.grad.clone(), head.weight.grad.clone()))
    # one _build per loss: forward builds the C structs, backward reuses them
    assert modes == ["joint", "separate"]
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-6)
    for a, b in zip(grads[0][1:], grads[1][1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["durations_first", "gap", "two_tensors", "detached_slices"])
def test_non_joint_layouts_take_the_separate_path(device, modes, how):
    V, D = 5, len(DURS)
    case = R.random_case(B=2, T=6, U=3, V=V, durations=DURS, seed=4, dtype=torch.float64)
    tok0, dur0 = case["token_logits"].to(device), case["duration_logits"].to(device)
    if how == "durations_first":
        base = torch.cat([dur0, tok0], -1).requires_grad_(True)
        tok, dur = base[..., D:], base[..., :D]
    elif how == "gap":
        base = torch.cat([tok0, torch.zeros_like(dur0[..., :1]), dur0], -1).requires_grad_(True)
        tok, dur = base[..., :V], base[..., V + 1:]
    elif how == "two_tensors":
        tok, dur = tok0.clone().requires_grad_(True), dur0.clone().requires_grad_(True)
    else:
        base = torch.cat([tok0, dur0], -1).requires_grad_(True)
        tok, dur = base.detach()[..., :V], base.detach()[..., V:]
    loss = warp_tdt.tdt_loss(tok, dur, case["targets"], case["logit_lengths"],
                             case["target_lengths"], case["blank_token_id"], DURS, reduction="none")
    assert modes[-1] == "separate"
    torch.testing.assert_close(loss.cpu(), ref_tdt(case)[0])
    if how != "detached_slices":
        loss.sum().backward()


def test_joint_function_under_no_grad(device):
    V = 5
    joint = torch.randn(2, 6, 4, V + len(DURS), device=device, requires_grad=True)
    targets, fl, ll = _batch(device)
    with torch.no_grad():
        a = warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], targets, fl, ll, 4, DURS)
        b = warp_tdt.tdt_loss_joint(joint, targets, fl, ll, 4, DURS)
    assert a.item() == b.item() and not a.requires_grad
