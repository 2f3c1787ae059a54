"""torch.compile and torch.library.opcheck (torch >= 2.4): the custom ops warp_tdt::loss_forward
/ loss_backward with fake implementations and a registered autograd formula."""

import pytest
import torch

import reference as R
import warp_tdt
from warp_tdt import functional
from conftest import requires_custom_ops
from helpers import lib_tdt, ref_tdt

pytestmark = requires_custom_ops

DURS = [0, 1, 2, 3]


def _op_args(device, layout, requires_grad=True, draw=None, dtype=torch.float32):
    case = R.random_case(B=3, T=6, U=3, V=5, seed=71, durations=DURS, dtype=dtype, device=device)
    case["target_lengths"].clamp_(min=1)
    case["targets"][case["targets"] < 0] = 0
    tok, dur = case["token_logits"], case["duration_logits"]
    labels = case["targets"].int().contiguous()
    fl, ll = case["logit_lengths"].int(), case["target_lengths"].int()
    V, blank = tok.shape[-1], case["blank_token_id"]
    if layout == "separate":
        logits, duration, durations = tok, dur, DURS
    elif layout == "joint":
        logits, duration, durations = torch.cat([tok, dur], -1), None, DURS
    else:
        logits, duration, durations = tok, None, []
    logits = logits.clone().requires_grad_(requires_grad)
    if duration is not None:
        duration = duration.clone().requires_grad_(requires_grad)
    return (logits, duration, labels, fl, ll, draw, V, durations, blank, 0.05, 0.0, 0.0, False, True)


@pytest.mark.parametrize("layout", ["separate", "joint", "rnnt"])
def test_opcheck_forward(device, layout):
    torch.library.opcheck(torch.ops.warp_tdt.loss_forward.default, _op_args(device, layout))


def test_opcheck_forward_with_rnnt_draw(device):
    torch.library.opcheck(torch.ops.warp_tdt.loss_forward.default,
                          _op_args(device, "separate", draw=torch.tensor(True)))


@pytest.mark.parametrize("layout", ["separate", "joint", "rnnt"])
def test_opcheck_backward(device, layout):
    args = _op_args(device, layout, requires_grad=False)
    costs, ws = torch.ops.warp_tdt.loss_forward(*args)
    grad = torch.rand_like(costs)
    bargs = (grad,) + args[:5] + (ws,) + args[5:13]
    torch.library.opcheck(torch.ops.warp_tdt.loss_backward.default, bargs)


@pytest.mark.parametrize("layout", ["separate", "joint", "joint_fn"])
def test_custom_op_path_matches_reference(device, layout, monkeypatch):
    monkeypatch.setattr(functional, "_FORCE_CUSTOM_OPS", True)
    case = R.random_case(B=3, T=6, U=3, V=5, seed=72, dtype=torch.float64)
    case["target_lengths"].clamp_(min=1)
    case["targets"][case["targets"] < 0] = 0  # padding that became a label
    loss, gt, gd = lib_tdt(case, device, torch.float64, layout, "mean", sigma=0.02)
    rloss, rgt, rgd = ref_tdt(case, "mean", sigma=0.02)
    torch.testing.assert_close(loss, rloss)
    torch.testing.assert_close(gt, rgt)
    torch.testing.assert_close(gd, rgd)


def _compiled_vs_eager(fn, args, backend, dynamic=None):
    compiled = torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic)
    outs = []
    for f in (fn, compiled):
        xs = [a.detach().clone().requires_grad_(True) if torch.is_tensor(a) and a.is_floating_point()
              else a for a in args]
        loss = f(*xs)
        loss.backward()
        outs.append((loss.detach(), [x.grad for x in xs if torch.is_tensor(x) and x.requires_grad]))
    torch.testing.assert_close(outs[1][0], outs[0][0])
    for a, b in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_slices(device, backend):
    case = R.random_case(B=3, T=6, U=3, V=5, seed=73, durations=DURS, device=device)
    case["target_lengths"].clamp_(min=1)
    case["targets"][case["targets"] < 0] = 0  # padding that became a label
    joint = torch.cat([case["token_logits"], case["duration_logits"]], -1)
    rest = (case["targets"], case["logit_lengths"], case["target_lengths"])

    def f(j, targets, fl, ll):
        return warp_tdt.tdt_loss(j[..., :5], j[..., 5:], targets, fl, ll, 4, DURS, sigma=0.05)

    _compiled_vs_eager(f, (joint,) + rest, backend)


def test_compile_fullgraph_joint_dynamic_shapes(device):
    for T, U in ((6, 3), (9, 4), (7, 2)):
        case = R.random_case(B=2, T=T, U=U, V=5, seed=T, durations=DURS, device=device)
        joint = torch.cat([case["token_logits"], case["duration_logits"]], -1)

        def f(j, targets, fl, ll):
            return warp_tdt.tdt_loss_joint(j, targets, fl, ll, 4, DURS, reduction="sum")

        _compiled_vs_eager(f, (joint, case["targets"], case["logit_lengths"],
                               case["target_lengths"]), "aot_eager", dynamic=True)


def test_compile_fullgraph_rnnt_and_omega(device):
    case = R.random_case(B=2, T=6, U=3, V=5, seed=74, durations=DURS, device=device)
    rest = (case["targets"], case["logit_lengths"], case["target_lengths"])

    def f(x, targets, fl, ll):
        return warp_tdt.rnnt_loss(x, targets, fl, ll, reduction="sum")

    _compiled_vs_eager(f, (case["token_logits"],) + rest, "aot_eager")

    def g(tok, dur, targets, fl, ll):
        return warp_tdt.tdt_loss(tok, dur, targets, fl, ll, 4, DURS, omega=1.0, reduction="sum")

    _compiled_vs_eager(g, (case["token_logits"], case["duration_logits"]) + rest, "aot_eager")


def test_compiled_module_in_a_model(device):
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 5 + len(DURS)).to(device)
    loss_fn = warp_tdt.TDTLoss()
    x = torch.randn(2, 6, 4, 8, device=device)
    targets, fl, ll = torch.tensor([[1, 2, 0], [3, 1, 1]], device=device), \
        torch.tensor([6, 5], device=device), torch.tensor([3, 2], device=device)

    def step(x):
        logits = head(x)
        return loss_fn(logits[..., :5], logits[..., 5:], targets, fl, ll, 4, DURS)

    eager = step(x)
    eager.backward()
    g_eager = head.weight.grad.clone()
    head.zero_grad()
    compiled = torch.compile(step, fullgraph=True)(x)
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(head.weight.grad, g_eager)
