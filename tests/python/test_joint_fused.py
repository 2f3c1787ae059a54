"""The fused joint + loss (warp_tdt.tdt_joint_loss, rnnt_joint_loss, TDTJointLoss) against the
unfused path: the joint computed in PyTorch (F.linear of act(enc + pred), with the same dropout
mask applied explicitly), then warp_tdt.tdt_loss / rnnt_loss on those logits. float64 to 1e-9
for the costs and all four gradients (enc, pred, weight, bias); lower precisions within the
unfused path's own error against float64; gradcheck; bitwise determinism over thread counts;
and a clear exception for every bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

import warp_tdt
from warp_tdt import joint as J
from conftest import requires_cuda

if not J.joint_available():
    pytest.skip("the loaded library %s has no fused joint (tdt_joint_forward)"
                % warp_tdt.library_path(), allow_module_level=True)

ACTS = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "identity": lambda x: x}


def make(B=3, T=6, U=3, H=7, V=6, durations=(0, 1, 2, 3), blank=None, seed=0, dtype=torch.float64,
         device="cpu", ragged=True, bias=True, scale=1.0):
    """Random joint inputs (leaf tensors) and labels: a dict."""
    g = torch.Generator().manual_seed(seed)
    D = 0 if durations is None else len(durations)
    blank = V - 1 if blank is None else blank

    def rnd(*shape):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(
            device=device, dtype=dtype).requires_grad_(True)

    enc, pred = rnd(B, T, H), rnd(B, U + 1, H)
    weight = rnd(V + D, H)
    b = rnd(V + D) if bias else None
    if V > 1:
        lab = torch.randint(0, V - 1, (B, U), generator=g)
        lab = lab + (lab >= blank).long()
    else:
        lab = torch.zeros(B, U, dtype=torch.long)
    if ragged:
        fl = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
        ll = torch.randint(0, U + 1, (B,), generator=g)
        if B > 0:
            fl[0], ll[0] = T, U
    else:
        fl = torch.full((B,), T, dtype=torch.long)
        ll = torch.full((B,), U, dtype=torch.long)
    for b_ in range(B):
        lab[b_, int(ll[b_]):] = -7  # padding the loss must never read
    return dict(enc=enc, pred=pred, weight=weight, bias=b, targets=lab.to(device),
                logit_lengths=fl.to(device), target_lengths=ll.to(device), blank=blank,
                durations=None if durations is None else list(durations), V=V)


def unfused(c, activation="relu", dropout=0.0, seed=0, reduction="sum", sigma=0.0,
            dtype=None, **kw):
    """The unfused path: PyTorch's joint with the fused path's mask applied explicitly, then
    warp_tdt.tdt_loss (rnnt_loss without durations)."""
    enc, pred, weight, bias = (c[k] for k in ("enc", "pred", "weight", "bias"))
    if dtype is not None:
        enc, pred, weight = enc.to(dtype), pred.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    h = ACTS[activation](enc[:, :, None, :] + pred[:, None, :, :])
    if dropout > 0:
        keep = J.dropout_mask(dropout, seed, tuple(h.shape)).to(h.device)
        h = h * keep.to(h.dtype) / (1.0 - dropout)
    z = F.linear(h, weight, bias)
    V = c["V"]
    args = (c["targets"], c["logit_lengths"], c["target_lengths"])
    if c["durations"] is None:
        return warp_tdt.rnnt_loss(z, *args, blank=c["blank"], reduction=reduction, **kw)
    return warp_tdt.tdt_loss(z[..., :V], z[..., V:], *args, c["blank"], c["durations"],
                             sigma=sigma, reduction=reduction, **kw)


def fused(c, activation="relu", dropout=0.0, seed=0, reduction="sum", sigma=0.0, dtype=None,
          **kw):
    enc, pred, weight, bias = (c[k] for k in ("enc", "pred", "weight", "bias"))
    if dtype is not None:
        enc, pred, weight = enc.to(dtype), pred.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    args = (c["targets"], c["logit_lengths"], c["target_lengths"])
    if c["durations"] is None:
        return warp_tdt.rnnt_joint_loss(enc, pred, weight, bias, *args, blank=c["blank"],
                                        activation=activation, dropout=dropout,
                                        reduction=reduction, dropout_seed=seed, **kw)
    return warp_tdt.tdt_joint_loss(enc, pred, weight, bias, *args, c["blank"], c["durations"],
                                   activation=activation, dropout=dropout, sigma=sigma,
                                   reduction=reduction, dropout_seed=seed, **kw)


def run(fn, c, upstream_seed=7, **kw):
    """(loss, [grad enc, pred, weight, bias]) of fn, backpropagating random per-sample weights
    for "none" (so each sample's upstream differs)."""
    leaves = [c[k] for k in ("enc", "pred", "weight", "bias") if c[k] is not None]
    for x in leaves:
        x.grad = None
    loss = fn(c, **kw)
    out = loss
    if loss.dim() == 1:
        w = torch.rand(loss.shape[0], generator=torch.Generator().manual_seed(upstream_seed),
                       dtype=torch.float64) + 0.5
        out = (loss * w.to(loss.device, loss.dtype)).sum()
    out.backward()
    grads = [None if c[k] is None else c[k].grad.detach().clone()
             for k in ("enc", "pred", "weight", "bias")]
    return loss.detach(), grads


NAMES = ("enc", "pred", "weight", "bias")


def assert_same(c, atol=1e-9, rtol=1e-9, **kw):
    """Fused and unfused agree, costs and the four gradients."""
    lf, gf = run(fused, c, **kw)
    lu, gu = run(unfused, c, **kw)
    torch.testing.assert_close(lf, lu, atol=atol, rtol=rtol, equal_nan=True,
                               msg=lambda m: "costs (%s): %s" % (kw, m))
    for name, a, b in zip(NAMES, gf, gu):
        if b is None:
            assert a is None, name
            continue
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol,
                                   msg=lambda m, n=name: "grad %s (%s): %s" % (n, kw, m))
    return lf, gf


# ---- float64 against the unfused path ------------------------------------------------------------


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "identity"])
def test_activations(activation):
    assert_same(make(seed=1), activation=activation)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_matches_the_explicit_mask(p):
    c = make(seed=2)
    assert_same(c, dropout=p, seed=12345)
    assert_same(c, dropout=p, seed=2 ** 64 - 1, activation="tanh")


def test_dropout_mask_is_a_function_of_the_seed():
    a = J.dropout_mask(0.3, 99, (2, 3, 4, 5))
    assert torch.equal(a, J.dropout_mask(0.3, 99, (2, 3, 4, 5)))
    assert not torch.equal(a, J.dropout_mask(0.3, 100, (2, 3, 4, 5)))
    kept = J.dropout_mask(0.3, 7, (1 << 16,)).double().mean().item()
    assert abs(kept - 0.7) < 0.01, "kept share %.4f for p = 0.3" % kept
    assert bool(J.dropout_mask(0.0, 7, (1000,)).all())


def _splitmix_keep(p, seed, counter):
    """include/tdt.h's dropout rule, written out: the (c + 1)-th SplitMix64 output of the seed,
    kept iff its top 32 bits are >= floor(p * 2^32)."""
    m = (1 << 64) - 1
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return (z >> 32) >= math.floor(p * 2 ** 32)


@pytest.mark.parametrize("p,seed,first", [(0.3, 99, 0), (0.5, 2 ** 64 - 1, 2 ** 64 - 100),
                                          (0.9, 12345, 10 ** 12)])
def test_dropout_mask_follows_the_documented_rule(p, seed, first):
    got = J.dropout_mask(p, seed, (200,), offset=first).tolist()
    want = [_splitmix_keep(p, seed, (first + j) % 2 ** 64) for j in range(200)]
    assert got == want, "first mismatch at j = %d" % next(
        j for j in range(200) if got[j] != want[j])


def test_dropout_seed_follows_torch_manual_seed():
    c = make(seed=3)
    args = (c["targets"], c["logit_lengths"], c["target_lengths"], c["blank"], c["durations"])
    x = (c["enc"], c["pred"], c["weight"], c["bias"])
    torch.manual_seed(5)
    a = warp_tdt.tdt_joint_loss(*x, *args, dropout=0.5, reduction="none")
    torch.manual_seed(5)
    b = warp_tdt.tdt_joint_loss(*x, *args, dropout=0.5, reduction="none")
    c2 = warp_tdt.tdt_joint_loss(*x, *args, dropout=0.5, reduction="none")
    assert torch.equal(a, b)
    assert not torch.equal(a, c2), "two calls drew the same dropout seed"


@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "mean_batch", "mean_volume"])
def test_reductions(reduction):
    c = make(seed=4)
    c["target_lengths"].clamp_(min=1)  # "mean" divides by U_b
    lf, _ = assert_same(c, reduction=reduction)
    assert lf.dtype == torch.float64 and lf.dim() == (1 if reduction == "none" else 0)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_rnnt(reduction):
    c = make(seed=5, durations=None)
    assert_same(c, reduction=reduction)
    assert_same(c, reduction=reduction, activation="tanh", dropout=0.2, seed=3)


@pytest.mark.parametrize("blank", [0, 2, 5])
def test_blank_positions(blank):
    assert_same(make(seed=6, blank=blank))
    assert_same(make(seed=6, blank=blank, durations=None))


@pytest.mark.parametrize("durations", [[2, 3, 5], [1], [0, 2], [4, 0, 1, 3]])
def test_durations(durations):
    # without 0 or 1 some samples are infeasible: inf costs, exact zero gradients
    assert_same(make(seed=7, T=9, durations=durations))


def test_sigma_fastemit_clamp():
    c = make(seed=8)
    assert_same(c, sigma=0.05)
    assert_same(c, fastemit_lambda=0.01)
    assert_same(c, clamp=0.05)


def test_infeasible_samples_get_inf_and_zero_gradients():
    c = make(B=4, T=5, U=3, seed=9, durations=[2, 4])  # odd T_b cannot be ended exactly
    with torch.no_grad():
        c["logit_lengths"].copy_(torch.tensor([4, 5, 0, 3]))
        c["target_lengths"].fill_(1)  # one label (2 frames) and a blank (2): T_b = 4 only
    loss, grads = assert_same(c, reduction="none")
    assert torch.isinf(loss[1]) and torch.isinf(loss[2]) and torch.isinf(loss[3])
    assert torch.isfinite(loss[0])
    g_enc, g_pred = grads[0], grads[1]
    for b in (1, 2, 3):
        assert torch.count_nonzero(g_enc[b]) == 0 and torch.count_nonzero(g_pred[b]) == 0, b
    assert torch.count_nonzero(g_enc[0, 4:]) == 0  # frames past T_b get exactly 0
    assert torch.count_nonzero(g_pred[0, int(c["target_lengths"][0]) + 1:]) == 0


def test_ragged_lengths_and_padding_rows():
    c = make(B=5, T=8, U=5, seed=10)
    _, grads = assert_same(c, reduction="none")
    for b in range(5):
        T_b, U_b = int(c["logit_lengths"][b]), int(c["target_lengths"][b])
        assert torch.count_nonzero(grads[0][b, T_b:]) == 0, "enc grad past T_%d = %d" % (b, T_b)
        assert torch.count_nonzero(grads[1][b, U_b + 1:]) == 0, "pred grad past U_%d" % b


@pytest.mark.parametrize("H", [1, 3, 17, 33, 67, 130])
def test_hidden_sizes_off_every_tile(H):
    assert_same(make(seed=11, H=H, B=2, T=5, U=2))


@pytest.mark.parametrize("V,durations", [(1, None), (2, None), (2, [0, 1]), (8, None),
                                         (33, [0, 1, 2, 3, 4]), (257, [1, 2]),
                                         (1025, [0, 1, 2, 3, 4]), (8193, [0, 1, 2, 3, 4])])
def test_output_widths(V, durations):
    # V + D from 1 (RNN-T, blank only: no labels) to 8198
    U = 0 if V == 1 else 2
    c = make(B=2, T=3, U=U, H=5, V=V, durations=durations, seed=12)
    assert_same(c)


def test_targets_narrower_than_the_lattice():
    """targets with fewer columns than U (every U_b fits in them) read as zero-padded."""
    c = make(B=3, T=6, U=4, seed=32)
    with torch.no_grad():
        c["target_lengths"].copy_(torch.tensor([2, 1, 0]))
    want, _ = run(fused, c, reduction="none")
    narrow = dict(c, targets=c["targets"][:, :2].clone())
    got, _ = run(fused, narrow, reduction="none")
    assert torch.equal(got, want)
    over = dict(narrow, target_lengths=torch.tensor([3, 1, 0]))
    with pytest.raises(ValueError, match=r"target_lengths\[0\] = 3 exceeds targets\.shape\[1\] = 2"):
        fused(over)


def test_no_bias():
    c = make(seed=13, bias=False)
    _, grads = assert_same(c)
    assert grads[3] is None


def test_strided_inputs():
    """enc and pred as slices and broadcasts (leading strides of any kind), weight a slice of a
    wider matrix: read in place, same results."""
    c = make(seed=14, B=2, T=4, U=2, H=6)
    big = torch.randn(2, 9, 10, dtype=torch.float64)
    enc = big[:, ::2, 2:8].detach().clone()  # a plain copy for the reference
    wide = torch.randn(c["weight"].shape[0], 11, dtype=torch.float64)
    with torch.no_grad():
        wide[:, 3:9] = c["weight"]
    args = (c["targets"], c["logit_lengths"], c["target_lengths"], c["blank"], c["durations"])
    one = torch.randn(1, 3, 6, dtype=torch.float64).expand(2, 3, 6)  # stride 0 over the batch
    a = warp_tdt.tdt_joint_loss(big[:, ::2, 2:8], one, wide[:, 3:9], c["bias"], *args,
                                reduction="none")
    b = warp_tdt.tdt_joint_loss(enc, one.contiguous(), c["weight"], c["bias"], *args,
                                reduction="none")
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_weight_in_another_dtype_is_cast_like_autocast():
    c = make(seed=15)
    w32 = c["weight"].detach().float().requires_grad_(True)
    args = (c["targets"], c["logit_lengths"], c["target_lengths"], c["blank"], c["durations"])
    loss = warp_tdt.tdt_joint_loss(c["enc"], c["pred"], w32, c["bias"], *args, reduction="sum")
    loss.backward()
    assert w32.grad is not None and w32.grad.dtype == torch.float32
    ref = warp_tdt.tdt_joint_loss(c["enc"], c["pred"], w32.detach().double(), c["bias"], *args,
                                  reduction="sum")
    torch.testing.assert_close(loss.detach(), ref.detach(), atol=0, rtol=0)


def test_workspace_bytes_is_small_and_grows_with_the_lattice():
    small = J.workspace_bytes(2, 10, 3, 64, 1025, [0, 1, 2, 3, 4])
    big = J.workspace_bytes(2, 100, 30, 64, 1025, [0, 1, 2, 3, 4])
    logits = 4 * 2 * 100 * 31 * 1030
    assert 0 < small < big < logits / 4, (small, big, logits)
    assert J.workspace_bytes(2, 10, 3, 64, 1025) > 0  # RNN-T


def test_no_grad_call_gives_the_same_costs():
    c = make(seed=16)
    lf, _ = run(fused, c, reduction="none")
    with torch.no_grad():
        ln = fused(c, reduction="none")
    assert torch.equal(ln, lf)


def test_second_backward_with_retain_graph():
    c = make(seed=17)
    loss = fused(c, reduction="sum")
    loss.backward(retain_graph=True)
    first = c["enc"].grad.clone()
    c["enc"].grad = None
    loss.backward()
    assert torch.equal(c["enc"].grad, first)


def test_empty_batch_and_zero_frames():
    c = make(B=2, T=0, seed=18, ragged=False)
    with torch.no_grad():
        c["logit_lengths"].zero_()
    loss, grads = run(fused, c, reduction="none")
    assert torch.isinf(loss).all()
    assert all(g is None or torch.count_nonzero(g) == 0 for g in grads)
    c = make(B=0, seed=18)
    loss, grads = run(fused, c, reduction="sum")
    assert float(loss) == 0.0


def test_gradients_only_where_asked():
    c = make(seed=19)
    c["weight"].requires_grad_(False)
    c["pred"].requires_grad_(False)
    loss = fused(c, reduction="sum")
    loss.backward()
    assert c["weight"].grad is None and c["pred"].grad is None
    _, want = run(unfused, make(seed=19), reduction="sum")
    torch.testing.assert_close(c["enc"].grad, want[0], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(c["bias"].grad, want[3], atol=1e-9, rtol=1e-9)


# ---- gradcheck -------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation,dropout", [("relu", 0.0), ("tanh", 0.3), ("sigmoid", 0.0)])
@pytest.mark.parametrize("durations", [[0, 1, 2], None])
def test_gradcheck(activation, dropout, durations):
    c = make(B=2, T=3, U=2, H=3, V=4, durations=durations, seed=20)
    args = (c["targets"], c["logit_lengths"], c["target_lengths"])

    def f(enc, pred, weight, bias):
        if durations is None:
            return warp_tdt.rnnt_joint_loss(enc, pred, weight, bias, *args, blank=c["blank"],
                                            activation=activation, dropout=dropout,
                                            reduction="none", dropout_seed=4)
        return warp_tdt.tdt_joint_loss(enc, pred, weight, bias, *args, c["blank"], durations,
                                       activation=activation, dropout=dropout, reduction="none",
                                       dropout_seed=4)

    # relu's kink: keep enc + pred away from 0 so finite differences do not straddle it
    with torch.no_grad():
        for k in ("enc", "pred"):
            c[k].add_(0.05 * torch.sign(c[k]))
    assert torch.autograd.gradcheck(f, (c["enc"], c["pred"], c["weight"], c["bias"]),
                                     eps=1e-6, atol=1e-7, rtol=1e-5)


# ---- lower precisions ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("durations", [[0, 1, 2, 3, 4], None])
def test_low_precision_within_the_unfused_error(dtype, durations):
    """Against float64, the fused path's error is at most a small multiple of the unfused
    path's own (the same inputs rounded to the dtype), element by element in norm."""
    c = make(B=3, T=7, U=4, H=40, V=129, durations=durations, seed=21, scale=0.5)
    ref_l, ref_g = run(unfused, c, reduction="none")
    fl, fg = run(fused, c, reduction="none", dtype=dtype)
    ul, ug = run(unfused, c, reduction="none", dtype=dtype)
    floor = {torch.float32: 1e-6, torch.bfloat16: 1e-3}[dtype]

    def err(a, b):
        return float((a.double() - b.double()).norm() / (b.double().norm() + 1e-30))

    for name, f, u, r in [("costs", fl, ul, ref_l)] + list(zip(NAMES, fg, ug, ref_g)):
        ef, eu = err(f, r), err(u, r)
        assert ef <= 4 * eu + floor, "%s %s: fused error %.3g vs unfused %.3g" % (
            dtype, name, ef, eu)


def test_float16_close_to_float64():
    """float16 (torch's CPU has no float16 relu for the unfused path to compare with): the
    fused path against float64, normwise, within float16's rounding of its inputs."""
    c = make(B=3, T=7, U=4, H=40, V=129, seed=35, scale=0.5)
    ref_l, ref_g = run(unfused, c, reduction="none")
    fl, fg = run(fused, c, reduction="none", dtype=torch.float16)
    assert fl.dtype == torch.float32
    for name, f, r in [("costs", fl, ref_l)] + list(zip(NAMES, fg, ref_g)):
        e = float((f.double() - r).norm() / r.norm())
        assert e < 2e-3, "float16 %s: normwise error %.3g against float64" % (name, e)


# ---- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bitwise_over_thread_counts(dtype):
    c = make(B=4, T=12, U=5, H=37, V=70, seed=22, dtype=dtype)
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            results.append(run(fused, c, reduction="none", dropout=0.2, seed=9))
    finally:
        torch.set_num_threads(before)
    l0, g0 = results[0]
    for n, (l, g) in zip((2, 3, 4), results[1:]):
        assert torch.equal(l, l0), "costs differ at %d threads" % n
        for name, a, b in zip(NAMES, g, g0):
            assert torch.equal(a, b), "grad %s differs at %d threads" % (name, n)


# ---- the module ----------------------------------------------------------------------------------


def test_module_matches_the_function_and_owns_the_layer():
    c = make(seed=23, H=8, V=6, durations=[0, 1, 2])
    m = warp_tdt.TDTJointLoss(8, 6, [0, 1, 2], dropout=0.3, dtype=torch.float64)
    assert tuple(m.weight.shape) == (9, 8) and tuple(m.bias.shape) == (9,)
    with torch.no_grad():
        m.weight.copy_(c["weight"])
        m.bias.copy_(c["bias"])
    args = (c["enc"], c["pred"], c["targets"], c["logit_lengths"], c["target_lengths"])
    m.eval()  # no dropout in eval mode
    got = m(*args, reduction="none")
    want = fused(c, reduction="none")
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    m.train()
    torch.manual_seed(3)
    a = m(*args)
    torch.manual_seed(3)
    b = m(*args)
    assert torch.equal(a, b) and not torch.equal(a.detach(), m.eval()(*args).detach())
    a.backward()
    assert m.weight.grad is not None and m.bias.grad is not None
    z = m.logits(c["enc"][:, :, None], c["pred"][:, None])
    assert tuple(z.shape) == (3, 6, 4, 9)


def test_module_without_bias():
    c = make(seed=33, H=5, V=6, durations=[0, 1, 2], bias=False)
    m = warp_tdt.TDTJointLoss(5, 6, [0, 1, 2], bias=False, dtype=torch.float64)
    assert m.bias is None and [n for n, _ in m.named_parameters()] == ["weight"]
    with torch.no_grad():
        m.weight.copy_(c["weight"])
    got = m(c["enc"], c["pred"], c["targets"], c["logit_lengths"], c["target_lengths"])
    torch.testing.assert_close(got, fused(c, reduction="mean"), atol=0, rtol=0)
    sd = {"joint.head.weight": c["weight"].detach(), "joint.head.bias": torch.zeros(9)}
    with pytest.raises(ValueError, match="has a bias but this TDTJointLoss was built with bias=False"):
        m.load_transformers_joint_state_dict(sd)


def test_module_rnnt_form():
    c = make(seed=24, H=5, V=7, durations=None)
    m = warp_tdt.TDTJointLoss(5, 7, None, blank_token_id=c["blank"], dtype=torch.float64)
    with torch.no_grad():
        m.weight.copy_(c["weight"])
        m.bias.copy_(c["bias"])
    got = m(c["enc"], c["pred"], c["targets"], c["logit_lengths"], c["target_lengths"])
    want = fused(c, reduction="mean")
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("layer", ["joint.joint_net.2", "joint.joint_net.1", "joint_net.2"])
def test_load_nemo_joint_state_dict(layer):
    m = warp_tdt.TDTJointLoss(4, 5, [0, 1, 2])
    w, b = torch.randn(8, 4), torch.randn(8)
    sd = {"joint.enc.weight": torch.randn(4, 6), "joint.pred.weight": torch.randn(4, 3),
          "decoder.prediction.embed.weight": torch.randn(5, 3),
          layer + ".weight": w, layer + ".bias": b}
    m.load_nemo_joint_state_dict(sd)
    assert torch.equal(m.weight.detach(), w) and torch.equal(m.bias.detach(), b)


def test_load_transformers_joint_state_dict():
    m = warp_tdt.TDTJointLoss(4, 5, [0, 1, 2])
    w, b = torch.randn(8, 4), torch.randn(8)
    sd = {"encoder_projector.weight": torch.randn(4, 6), "decoder.embedding.weight": torch.randn(5, 4),
          "joint.head.weight": w, "joint.head.bias": b}
    m.load_transformers_joint_state_dict(sd)
    assert torch.equal(m.weight.detach(), w) and torch.equal(m.bias.detach(), b)
    sd2 = {"joint.token_head.weight": w[:5], "joint.token_head.bias": b[:5],
           "joint.duration_head.weight": w[5:], "joint.duration_head.bias": b[5:]}
    m2 = warp_tdt.TDTJointLoss(4, 5, [0, 1, 2]).load_transformers_joint_state_dict(sd2)
    assert torch.equal(m2.weight.detach(), w) and torch.equal(m2.bias.detach(), b)


def test_from_linear():
    lin = torch.nn.Linear(4, 8, dtype=torch.float64)
    m = warp_tdt.TDTJointLoss.from_linear(lin, 5, [0, 1, 2], activation="tanh")
    assert m.weight.dtype == torch.float64 and m.activation == "tanh"
    assert torch.equal(m.weight.detach(), lin.weight.detach())
    assert torch.equal(m.bias.detach(), lin.bias.detach())
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(m.logits(x, x), lin(torch.tanh(x + x)), atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"linear\.weight has shape \(8, 4\)"):
        warp_tdt.TDTJointLoss.from_linear(lin, 6, [0, 1, 2])


def test_load_state_dict_errors_name_the_key_and_shapes():
    m = warp_tdt.TDTJointLoss(4, 5, [0, 1, 2])
    with pytest.raises(ValueError, match=r"joint\.head\.weight has shape \(9, 4\).*\(8, 4\)"):
        m.load_transformers_joint_state_dict({"joint.head.weight": torch.zeros(9, 4),
                                              "joint.head.bias": torch.zeros(9)})
    with pytest.raises(KeyError, match="joint_net"):
        m.load_nemo_joint_state_dict({"encoder.weight": torch.zeros(1)})
    with pytest.raises(KeyError, match="head"):
        m.load_transformers_joint_state_dict({"encoder.weight": torch.zeros(1)})


# ---- bad inputs ----------------------------------------------------------------------------------


def _call(c, **over):
    a = dict(enc=c["enc"], pred=c["pred"], weight=c["weight"], bias=c["bias"],
             targets=c["targets"], logit_lengths=c["logit_lengths"],
             target_lengths=c["target_lengths"], blank_token_id=c["blank"],
             durations=c["durations"])
    a.update(over)
    return warp_tdt.tdt_joint_loss(**a)


BAD = [
    (dict(pred=torch.zeros(2, 4, 7, dtype=torch.float64)), ValueError, r"pred has shape \(2, 4, 7\).*batch"),
    (dict(pred=torch.zeros(3, 4, 5, dtype=torch.float64)), ValueError, r"pred\.shape\[-1\] = 5 but enc\.shape\[-1\] = 7"),
    (dict(pred=torch.zeros(3, 0, 7, dtype=torch.float64)), ValueError, r"pred\.shape\[1\] = 0"),
    (dict(weight=torch.zeros(10, 6, dtype=torch.float64)), ValueError, r"weight has shape \(10, 6\)"),
    (dict(weight=torch.zeros(4, 7, dtype=torch.float64)), ValueError, r"weight\.shape\[0\] = 4 must exceed len\(durations\) = 4"),
    (dict(bias=torch.zeros(9, dtype=torch.float64)), ValueError, r"bias has shape \(9,\)"),
    (dict(enc=torch.zeros(3, 6, 0, dtype=torch.float64)), ValueError, r"enc\.shape\[-1\] = 0"),
    (dict(enc=torch.zeros(3, 6, dtype=torch.float64)), ValueError, r"enc must be 3-D"),
    (dict(enc=torch.zeros(3, 6, 7, dtype=torch.int64)), ValueError, r"enc must be float32"),
    (dict(pred=torch.zeros(3, 4, 7, dtype=torch.float32)), ValueError, r"pred is torch\.float32 but enc is torch\.float64"),
    (dict(weight=torch.zeros(1, 7, dtype=torch.float64).expand(10, 7)), ValueError, r"weight has strides \(0, 1\).*rows overlap"),
    (dict(activation="gelu"), ValueError, r"activation = 'gelu' is not one of"),
    (dict(dropout=1.0), ValueError, r"dropout = 1\.0 is invalid: it must be in \[0, 1\)"),
    (dict(dropout=-0.1), ValueError, r"dropout = -0\.1 is invalid"),
    (dict(dropout=float("nan")), ValueError, r"dropout = nan is invalid"),
    (dict(blank_token_id=6), ValueError, r"blank_token_id = 6 is outside \[0, 6\)"),
    (dict(durations=[0, 0, 1, 2]), ValueError, r"durations = \[0, 0, 1, 2\] holds the duration 0 twice"),
    (dict(reduction="avg"), ValueError, r'Invalid reduction mode "avg"'),
    (dict(sigma=-1.0), ValueError, r"sigma = -1\.0 is invalid"),
    (dict(dropout_seed=-1, dropout=0.1), ValueError, r"dropout_seed = -1 is outside"),
    (dict(logit_lengths=torch.tensor([6, 7, 1])), ValueError, r"logit_lengths\[1\] = 7 is outside \[0, 6\]"),
    (dict(target_lengths=torch.tensor([3, 4, 0])), ValueError, r"target_lengths\[1\] = 4 is outside \[0, 3\]"),
    (dict(targets=torch.tensor([[0, 1, 9], [0, 0, 0], [0, 0, 0]])), ValueError, r"targets\[0\]\[2\] = 9 is outside \[0, 6\)"),
    (dict(targets=torch.tensor([[0, 5, 1], [0, 0, 0], [0, 0, 0]])), ValueError, r"targets\[0\]\[1\] = 5 equals blank_token_id = 5"),
    (dict(targets=torch.zeros(2, 3, dtype=torch.long)), ValueError, r"targets has shape \(2, 3\)"),
]


@pytest.mark.parametrize("over,exc,pattern", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_inputs_raise_naming_the_argument_and_value(over, exc, pattern):
    c = make(B=3, T=6, U=3, H=7, V=6, durations=[0, 1, 2, 3], seed=25, ragged=False)
    with pytest.raises(exc, match=pattern):
        _call(c, **over)


def test_bad_rnnt_inputs():
    c = make(B=2, T=4, U=2, H=3, V=5, durations=None, seed=26)
    args = (c["enc"], c["pred"], c["weight"], c["bias"], c["targets"], c["logit_lengths"],
            c["target_lengths"])
    with pytest.raises(ValueError, match=r"blank = 5 is outside \[-5, 5\)"):
        warp_tdt.rnnt_joint_loss(*args, blank=5)
    with pytest.raises(ValueError, match="reduction should be one of"):
        warp_tdt.rnnt_joint_loss(*args, reduction="mean_volume")
    with pytest.raises(ValueError, match=r"dropout = 2 is invalid"):
        warp_tdt.rnnt_joint_loss(*args, dropout=2)


def test_bad_module_arguments():
    with pytest.raises(ValueError, match="activation = 'swish'"):
        warp_tdt.TDTJointLoss(4, 5, activation="swish")
    with pytest.raises(ValueError, match=r"dropout = 1 is invalid"):
        warp_tdt.TDTJointLoss(4, 5, dropout=1)
    with pytest.raises(ValueError, match="hidden_size = 0"):
        warp_tdt.TDTJointLoss(0, 5)


# ---- CUDA (run where a GPU and a CUDA build are present) --------------------------------------------


@requires_cuda
@pytest.mark.parametrize("durations", [[0, 1, 2, 3, 4], None])
@pytest.mark.parametrize("dropout", [0.0, 0.25])
def test_cuda_float64_matches_the_unfused_path(durations, dropout):
    c = make(B=3, T=9, U=4, H=37, V=70, durations=durations, seed=27, device="cuda")
    assert_same(c, dropout=dropout, seed=77, reduction="none")


@requires_cuda
def test_cuda_matches_cpu_and_the_mask_is_the_same():
    cc = make(B=2, T=6, U=3, H=33, V=40, seed=28, device="cuda")
    cpu = make(B=2, T=6, U=3, H=33, V=40, seed=28, device="cpu")
    a = run(fused, cc, reduction="none", dropout=0.3, seed=5)
    b = run(fused, cpu, reduction="none", dropout=0.3, seed=5)
    torch.testing.assert_close(a[0].cpu(), b[0], atol=1e-9, rtol=1e-9)
    for name, x, y in zip(NAMES, a[1], b[1]):
        torch.testing.assert_close(x.cpu(), y, atol=1e-9, rtol=1e-9,
                                   msg=lambda m, n=name: "grad %s: %s" % (n, m))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_low_precision_within_the_unfused_error(dtype):
    c = make(B=2, T=20, U=6, H=64, V=513, seed=29, scale=0.5, device="cuda")
    ref_l, ref_g = run(unfused, c, reduction="none")
    fl, fg = run(fused, c, reduction="none", dtype=dtype)
    ul, ug = run(unfused, c, reduction="none", dtype=dtype)
    floor = {torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 1e-3}[dtype]
    for name, f, u, r in [("costs", fl, ul, ref_l)] + list(zip(NAMES, fg, ug, ref_g)):
        ef = float((f.double() - r).norm() / r.norm())
        eu = float((u.double() - r).norm() / r.norm())
        assert ef <= 4 * eu + floor, "%s %s: fused %.3g vs unfused %.3g" % (dtype, name, ef, eu)


@requires_cuda
@pytest.mark.parametrize("asynchronous", ["1", "0"])
def test_cuda_bad_lengths_and_labels_raise(monkeypatch, asynchronous):
    monkeypatch.setenv("WARP_TDT_ASYNC_VALIDATION", asynchronous)
    c = make(B=3, T=6, U=3, H=7, V=6, durations=[0, 1, 2, 3], seed=34, ragged=False,
             device="cuda")
    with pytest.raises(ValueError, match=r"logit_lengths\[1\] = 7 is outside \[0, 6\]"):
        _call(c, logit_lengths=torch.tensor([6, 7, 1], device="cuda"))
    with pytest.raises(ValueError, match=r"targets\[0\]\[1\] = 5 equals blank_token_id = 5"):
        _call(c, targets=torch.tensor([[0, 5, 1], [0, 0, 0], [0, 0, 0]]))
    loss = _call(c, reduction="none")  # the next call after a raise is fine
    assert torch.isfinite(loss).all()


@requires_cuda
@pytest.mark.parametrize("products", ["split", "sgemm"])
@pytest.mark.parametrize("chunk_kb", ["", "1"])
def test_cuda_float32_products_within_the_unfused_error(monkeypatch, products, chunk_kb):
    """float32's products on bfloat16 parts (the default) or as float32 kernels
    (TDT_GPU_JOINT_FLOAT32), with the default chunks and one (b, t) row a chunk: as close to
    float64 as the unfused float32 path (4x its error or 1e-6, normwise)."""
    monkeypatch.setenv("TDT_GPU_JOINT_FLOAT32", products)
    monkeypatch.setenv("TDT_GPU_JOINT_CHUNK_KB", chunk_kb)
    c = make(B=3, T=16, U=5, H=96, V=700, seed=35, scale=0.5, device="cuda")
    ref_l, ref_g = run(unfused, c, reduction="none")
    fl, fg = run(fused, c, reduction="none", dtype=torch.float32, dropout=0.1, seed=4)
    ul, ug = run(unfused, c, reduction="none", dtype=torch.float32)
    rl, rg = run(fused, c, reduction="none", dropout=0.1, seed=4)  # float64, the same mask
    for name, f, u, r, rr in [("costs", fl, ul, rl, ref_l)] + list(zip(NAMES, fg, ug, rg, ref_g)):
        ef = float((f.double() - r).norm() / r.norm())
        eu = float((u.double() - rr).norm() / rr.norm())
        assert ef <= 4 * eu + 1e-6, "%s %s: fused %.3g vs unfused %.3g" % (products, name, ef, eu)


@requires_cuda
def test_cuda_deterministic():
    c = make(B=3, T=30, U=8, H=64, V=257, seed=30, dtype=torch.float32, device="cuda")
    a = run(fused, c, reduction="none", dropout=0.1, seed=3)
    b = run(fused, c, reduction="none", dropout=0.1, seed=3)
    assert torch.equal(a[0], b[0])
    for name, x, y in zip(NAMES, a[1], b[1]):
        assert torch.equal(x, y), "grad %s differs between two identical calls" % name


def test_math_of_the_reference_itself():
    """The unfused reference is the joint it claims: one node by hand."""
    c = make(B=1, T=1, U=0, H=3, V=4, durations=[1], seed=31, ragged=False)
    z = F.linear(torch.relu(c["enc"][0, 0] + c["pred"][0, 0]), c["weight"], c["bias"])
    # T = 1, U = 0: the only path is a blank of duration 1 from (0, 0)
    want = -(torch.log_softmax(z[:4], 0)[c["blank"]] + torch.log_softmax(z[4:], 0)[0])
    got = fused(c, reduction="sum")
    assert math.isclose(float(got), float(want), rel_tol=1e-12), (float(got), float(want))


def test_fused_example_trains():
    """examples/train_tiny_tdt_fused.py --check: fused against unfused on one batch, then a few
    dozen steps whose loss must fall (its own exit status says so)."""
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(repo, "pytorch_binding") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("WARP_TDT_LIBRARY", warp_tdt.library_path())
    r = subprocess.run([sys.executable, os.path.join(repo, "examples", "train_tiny_tdt_fused.py"),
                        "--device", "cpu", "--check"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], r.stdout


# ---- skip_below: the approximate backward ---------------------------------------------------


@pytest.mark.parametrize("durations", [[0, 1, 2, 3], None])
def test_skip_below_moves_each_gradient_within_its_bound(durations):
    """Each left-out node's logits' gradient is below eps in every element: d enc moves by at
    most eps (U + 1) sum_o |W[o, k]| (relu), d pred by eps T sum_o |W[o, k]|, d W by eps times the
    nodes times max |h|, d bias by eps times the nodes; the loss is exact. A peaked joint (W
    scaled up: one alignment dominates, as in a trained model) leaves most nodes out."""
    c = make(B=3, T=12, U=5, H=16, V=20, durations=durations, ragged=False, seed=3)
    with torch.no_grad():
        c["weight"].mul_(6.0)
    loss0, g0 = run(fused, c)
    eps = 1e-3
    loss1, g1 = run(fused, c, skip_below=eps)
    assert torch.equal(loss0, loss1)
    B, T, H = c["enc"].shape
    R = c["pred"].shape[1]
    wcol = c["weight"].detach().abs().sum(0)  # (H,)
    hmax = (c["enc"][:, :, None] + c["pred"][:, None]).detach().abs().max()
    nodes = B * T * R
    bounds = [eps * R * wcol, eps * T * wcol, eps * nodes * hmax, eps * nodes]
    for name, a, b, bound in zip(NAMES, g0, g1, bounds):
        assert ((a - b).abs() <= bound * (1 + 1e-9)).all(), name
    assert not torch.equal(g0[0], g1[0]), "no node was left out at eps = %g" % eps


def test_skip_below_huge_zeroes_every_gradient_and_bad_values_raise():
    c = make(seed=5)
    loss0, _ = run(fused, c)
    loss1, g1 = run(fused, c, skip_below=1e300)
    assert torch.equal(loss0, loss1)
    for name, g in zip(NAMES, g1):
        assert torch.count_nonzero(g) == 0, name
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="skip_below"):
            fused(c, skip_below=bad)
    with pytest.raises(TypeError, match="skip_below"):
        fused(c, skip_below="small")
    m = warp_tdt.TDTJointLoss(7, 6, [0, 1, 2, 3], skip_below=1e300).double()
    out = m(c["enc"], c["pred"], c["targets"], c["logit_lengths"], c["target_lengths"])
    out.backward()
    assert torch.count_nonzero(m.weight.grad) == 0
