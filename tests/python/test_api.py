"""Public surface: signature parity with transformers' tdt_loss, the TDTLoss module."""

import inspect

import pytest
import torch

import reference as R
import warp_tdt

TRANSFORMERS_PARAMS = [("token_logits", inspect.Parameter.empty),
                       ("duration_logits", inspect.Parameter.empty),
                       ("targets", inspect.Parameter.empty),
                       ("logit_lengths", inspect.Parameter.empty),
                       ("target_lengths", inspect.Parameter.empty),
                       ("blank_token_id", inspect.Parameter.empty),
                       ("durations", inspect.Parameter.empty),
                       ("sigma", 0.0), ("reduction", "mean")]


def _positional(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if p.kind == p.POSITIONAL_OR_KEYWORD]


def test_tdt_loss_signature_is_transformers():
    assert _positional(warp_tdt.tdt_loss) == TRANSFORMERS_PARAMS
    extras = {p.name: p.default for p in inspect.signature(warp_tdt.tdt_loss).parameters.values()
              if p.kind == p.KEYWORD_ONLY}
    assert extras["fastemit_lambda"] == 0.0 and extras["clamp"] == 0.0 and extras["omega"] == 0.0
    assert extras["in_place"] is False
    assert _positional(warp_tdt.TDTLoss.forward)[1:] == TRANSFORMERS_PARAMS


def test_against_installed_transformers_signature():
    loss_tdt = pytest.importorskip("transformers.loss.loss_tdt")
    assert _positional(warp_tdt.tdt_loss) == _positional(loss_tdt.tdt_loss)


def test_module_forwards_its_extras(device):
    case = R.random_case(B=2, T=5, U=2, V=5, seed=61, dtype=torch.float64)
    args = [case[k].to(device) if torch.is_tensor(case[k]) else case[k] for k in
            ("token_logits", "duration_logits", "targets", "logit_lengths", "target_lengths",
             "blank_token_id", "durations")]
    m = warp_tdt.TDTLoss(fastemit_lambda=0.1)
    assert m.has_backward and m.can_torch_compile
    assert "fastemit_lambda=0.1" in repr(m)
    got = m(*args, sigma=0.05, reduction="sum")
    want = warp_tdt.tdt_loss(*args, sigma=0.05, reduction="sum", fastemit_lambda=0.1)
    assert got.item() == want.item()
    assert isinstance(m, torch.nn.Module)


def test_keyword_call_like_transformers(device):
    # ParakeetForTDTLoss calls tdt_loss with keywords
    case = R.random_case(B=2, T=5, U=2, V=5, seed=62)
    kw = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in case.items()}
    a = warp_tdt.tdt_loss(**kw, sigma=0.0, reduction="mean")
    b = warp_tdt.tdt_loss(kw["token_logits"], kw["duration_logits"], kw["targets"],
                          kw["logit_lengths"], kw["target_lengths"], kw["blank_token_id"],
                          kw["durations"])
    assert a.item() == b.item() and a.dtype == torch.float32 and a.dim() == 0
