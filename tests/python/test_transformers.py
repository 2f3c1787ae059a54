"""Drop-in parity with transformers (skipped where transformers is not installed):
warp_tdt.tdt_loss against transformers.loss.loss_tdt.tdt_loss on random inputs, and swapped
into a small randomly initialised Parakeet TDT model (no downloads) it gives the same loss and
gradients."""

import inspect

import pytest
import torch

import reference as R
import warp_tdt

loss_tdt = pytest.importorskip("transformers.loss.loss_tdt")


@pytest.fixture
def hf_pure(monkeypatch):
    """transformers' own pure-PyTorch tdt_loss (never the hub kernel: no downloads here)."""
    if hasattr(loss_tdt, "_load_tdt_kernel"):
        monkeypatch.setattr(loss_tdt, "_load_tdt_kernel", lambda: None)
    return loss_tdt.tdt_loss


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_matches_transformers_tdt_loss(device, hf_pure, reduction, sigma):
    case = R.random_case(B=4, T=12, U=5, V=10, seed=91, device=device)
    case["target_lengths"].clamp_(min=1)
    case["targets"][case["targets"] < 0] = 0  # transformers gathers the padding too
    V = case["token_logits"].shape[-1]
    joint = torch.cat([case["token_logits"], case["duration_logits"]], -1)
    rest = (case["targets"].int(), case["logit_lengths"].int(), case["target_lengths"].int(),
            case["blank_token_id"], case["durations"])
    out = []
    for fn in (hf_pure, warp_tdt.tdt_loss):
        j = joint.clone().requires_grad_(True)
        loss = fn(j[..., :V], j[..., V:], *rest, sigma=sigma, reduction=reduction)
        loss.sum().backward()
        out.append((loss.detach(), j.grad))
    assert out[1][0].dtype == out[0][0].dtype == torch.float32
    assert out[1][0].shape == out[0][0].shape
    torch.testing.assert_close(out[1][0], out[0][0], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out[1][1], out[0][1], atol=1e-5, rtol=1e-4)


def _fields(cls):
    try:
        inst = cls()
    except Exception:  # noqa: BLE001 - a config that needs arguments: pass none of ours
        return set()
    return set(vars(inst)) | {k for k in dir(cls) if not k.startswith("_")}


def _tiny_parakeet_tdt():
    transformers = pytest.importorskip("transformers")
    Config = getattr(transformers, "ParakeetTDTConfig", None)
    Model = getattr(transformers, "ParakeetForTDT", None)
    EncConfig = getattr(transformers, "ParakeetEncoderConfig", None)
    if Config is None or Model is None or EncConfig is None:
        pytest.skip("this transformers has no ParakeetForTDT")
    enc_want = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    subsampling_conv_channels=4, num_mel_bins=8,
                    conv_kernel_size=3, dropout=0.0, dropout_positions=0.0, layerdrop=0.0,
                    activation_dropout=0.0, attention_dropout=0.0, max_position_embeddings=256)
    enc_fields = _fields(EncConfig)
    enc = {k: v for k, v in enc_want.items() if k in enc_fields}
    want = dict(encoder_config=enc, vocab_size=12, blank_token_id=11, blank_id=11, pad_token_id=11,
                decoder_hidden_size=16, num_decoder_layers=1, durations=[0, 1, 2, 3],
                prediction_network_config=dict(pred_hidden=16, pred_rnn_layers=1),
                joint_network_config=dict(joint_hidden=16))
    fields = _fields(Config)
    cfg_kwargs = {k: v for k, v in want.items() if k in fields}
    try:
        config = Config(**cfg_kwargs)
        torch.manual_seed(0)
        model = Model(config).eval()
    except Exception as e:  # noqa: BLE001 - an API this test does not know
        pytest.skip("could not build a small ParakeetForTDT with this transformers: %r" % e)
    return config, model


def test_swapped_into_a_parakeet_tdt_model(device, hf_pure, monkeypatch):
    config, model = _tiny_parakeet_tdt()
    model = model.to(device)
    V = int(config.vocab_size)
    blank = int(getattr(config, "blank_token_id", getattr(config, "blank_id", V - 1)))
    pad = getattr(config, "pad_token_id", None)
    pad = blank if pad is None else int(pad)
    B, frames, U = 2, 64, 4  # the default 8x subsampling leaves 8 encoder frames
    mels = int(getattr(config.encoder_config, "num_mel_bins", 8))
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(B, frames, mels, generator=g).to(device)
    mask = torch.ones(B, frames, dtype=torch.long)
    mask[1, 48:] = 0
    allowed = [v for v in range(V) if v not in (blank, pad)]
    labels = torch.tensor(allowed)[torch.randint(0, len(allowed), (B, U), generator=g)]
    labels[1, 3:] = pad
    dec_in = torch.cat([torch.full((B, 1), blank), labels.masked_fill(labels == pad, blank)], 1)
    kwargs = dict(input_features=feats, attention_mask=mask.to(device), labels=labels.to(device))
    if "decoder_input_ids" in inspect.signature(model.forward).parameters:
        kwargs["decoder_input_ids"] = dec_in.to(device)

    calls = []

    def run(loss_fn):
        def wrapped(*a, **k):
            calls.append(loss_fn)
            return loss_fn(*a, **k)

        monkeypatch.setattr(loss_tdt, "tdt_loss", wrapped)
        model.zero_grad()
        # eval mode (no dropout) for a deterministic comparison; cuDNN's RNN has no backward in
        # eval mode, so the predictor's LSTM runs on PyTorch's own kernels here
        with torch.backends.cudnn.flags(enabled=False):
            out = model(**kwargs)
            if out.loss is None:
                pytest.skip("this ParakeetForTDT returned no loss for labels")
            out.loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.loss.detach(), grads

    hf_loss, hf_grads = run(hf_pure)
    if not calls:
        pytest.skip("this ParakeetForTDT does not compute its loss through loss_tdt.tdt_loss")
    our_loss, our_grads = run(warp_tdt.tdt_loss)
    assert calls[-1] is warp_tdt.tdt_loss
    torch.testing.assert_close(our_loss, hf_loss, atol=1e-4, rtol=1e-5)
    assert our_grads.keys() == hf_grads.keys() and our_grads
    for name in hf_grads:
        torch.testing.assert_close(our_grads[name], hf_grads[name], atol=1e-5, rtol=1e-4,
                                   msg=lambda m, n=name: "%s: %s" % (n, m))
