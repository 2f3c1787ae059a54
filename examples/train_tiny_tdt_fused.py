#!/usr/bin/env python3
"""Train a tiny Parakeet-style TDT model with the fused joint + loss (warp_tdt.TDTJointLoss).

The model has Parakeet's shape in miniature: an encoder whose output is projected to the
joint's hidden size (transformers' ``encoder_projector``, NeMo's ``joint.enc``), a prediction
network (embedding, LSTM, projection: ``decoder_projector`` / ``joint.pred``), and a joint
``head(relu(enc + pred))`` of vocab + durations outputs. The joint's output layer lives in
warp_tdt.TDTJointLoss, which computes the TDT loss straight from the two projections: the
(B, T, U + 1, V + D) logits tensor and its gradient are never held. The data is the synthetic
task of train_tiny_tdt.py (each label "spoken" for 1 to 3 noisy frames).

    python3 examples/train_tiny_tdt_fused.py                # CPU (or CUDA when present)
    python3 examples/train_tiny_tdt_fused.py --check        # a quick smoke test (exit 1 on failure)
    python3 examples/train_tiny_tdt_fused.py --unfused      # the same model, unfused joint + tdt_loss
    python3 examples/train_tiny_tdt_fused.py --transformers # swap it into transformers' ParakeetForTDT

--check first compares the fused loss and gradients with the unfused path (the joint's logits in
PyTorch, then warp_tdt.tdt_loss) on one batch, then trains a few dozen steps and fails unless
the loss fell. --transformers builds a tiny randomly initialised ParakeetForTDT (no download),
computes its loss both ways (its own joint + loss, and TDTJointLoss loaded from its joint's
state dict) and takes a training step with the fused one; it says so and does nothing when
transformers (or its ParakeetForTDT) is not importable.
"""

import argparse
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # train_tiny_tdt.py: the synthetic data
try:
    import warp_tdt
except ImportError:  # run from a checkout: use the package in pytorch_binding/
    sys.path.insert(0, os.path.join(HERE, "..", "pytorch_binding"))
    import warp_tdt

from train_tiny_tdt import BLANK, DURATIONS, NUM_TOKENS, VOCAB, fit, greedy_tdt, make_batch  # noqa: E402


class TinyParakeetTDT(nn.Module):
    """Encoder + projector, prediction network + projector, and the fused joint + loss."""

    def __init__(self, hidden=64, joint_dropout=0.1):
        super().__init__()
        self.encoder = nn.LSTM(NUM_TOKENS + 1, hidden // 2, batch_first=True, bidirectional=True)
        self.encoder_projector = nn.Linear(hidden, hidden)
        self.embedding = nn.Embedding(VOCAB, hidden)  # the blank doubles as the start symbol
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.decoder_projector = nn.Linear(hidden, hidden)
        # owns the joint's output layer, (VOCAB + len(DURATIONS), hidden), and its bias
        self.joint = warp_tdt.TDTJointLoss(hidden, VOCAB, DURATIONS, blank_token_id=BLANK,
                                           activation="relu", dropout=joint_dropout, sigma=0.05)

    def encode(self, x):
        return self.encoder_projector(self.encoder(x)[0])  # (B, T, H)

    def predict(self, targets):
        start = torch.full_like(targets[:, :1], BLANK)
        dec_in = torch.cat([start, targets.clamp(min=0)], 1)  # (B, U + 1)
        return self.decoder_projector(self.lstm(self.embedding(dec_in))[0])  # (B, U + 1, H)

    def forward(self, x, targets, frame_lengths, label_lengths):
        """The loss (mean over the batch of loss_b / U_b), fused."""
        return self.joint(self.encode(x), self.predict(targets), targets, frame_lengths,
                          label_lengths)

    def unfused_loss(self, x, targets, frame_lengths, label_lengths):
        """The same loss the unfused way: the joint's logits in PyTorch, then warp_tdt.tdt_loss
        (no dropout: compare with the joint in eval mode)."""
        z = self.joint.logits(self.encode(x)[:, :, None], self.predict(targets)[:, None])
        return warp_tdt.tdt_loss(z[..., :VOCAB], z[..., VOCAB:], targets, frame_lengths,
                                 label_lengths, BLANK, DURATIONS, sigma=0.05)

    @torch.no_grad()
    def greedy(self, x, frames, max_symbols=5):
        """Greedy TDT decoding of one utterance: token argmax, then jump by the duration argmax
        (the joint's logits of one frame and one prediction step, through joint.logits)."""
        enc = self.encode(x[None, :frames])[0]

        def step(token, state):
            h, state = self.lstm(self.embedding(torch.tensor([[token]], device=x.device)), state)
            return self.decoder_projector(h[0, -1]), state

        return greedy_tdt(enc, frames, step, self.joint.logits, max_symbols)


def check_against_unfused(model, batch):
    """The fused loss and every parameter's gradient against the unfused path, with the joint's
    dropout off (the joint alone in eval mode: cuDNN's LSTM backward needs training mode, and the
    model has no other dropout); returns the largest relative difference."""
    model.joint.eval()
    worst = 0.0
    losses, grads = [], []
    for fn in (model.forward, model.unfused_loss):
        model.zero_grad(set_to_none=True)
        loss = fn(*batch)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.joint.train()
    worst = abs(losses[0] - losses[1]) / abs(losses[1])
    for n, g in grads[1].items():
        d = float((grads[0][n] - g).abs().max() / (g.abs().max() + 1e-12))
        worst = max(worst, d)
    print("fused vs unfused (joint dropout off, one batch): loss %.6f vs %.6f; largest relative "
          "difference of the loss or a parameter's gradient %.2e" % (losses[0], losses[1], worst))
    return worst


def train(args, device):
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = TinyParakeetTDT().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    if args.check:
        batch = make_batch(args.batch, gen, device)
        if check_against_unfused(model, batch) > 1e-4:
            print("FAIL: the fused path disagrees with the unfused one", file=sys.stderr)
            return 1
    step_loss = model.unfused_loss if args.unfused else model.forward
    first, last = fit(model, step_loss, opt, args, gen, device)
    if args.check and not last < 0.7 * first:
        print("FAIL: the loss did not fall to 70 %% of its first value (%.4f -> %.4f)"
              % (first, last), file=sys.stderr)
        return 1
    return 0


# ---- transformers' ParakeetForTDT -------------------------------------------------------------


def _tiny_transformers_parakeet():
    """A tiny randomly initialised transformers ParakeetForTDT (no download), or (None, why)."""
    try:
        import transformers
    except ImportError:
        return None, "transformers is not installed"
    Config = getattr(transformers, "ParakeetTDTConfig", None)
    Model = getattr(transformers, "ParakeetForTDT", None)
    if Config is None or Model is None:
        return None, "transformers %s has no ParakeetForTDT" % transformers.__version__
    enc = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
               subsampling_conv_channels=8, num_mel_bins=16, conv_kernel_size=3, dropout=0.0,
               dropout_positions=0.0, layerdrop=0.0, activation_dropout=0.0,
               attention_dropout=0.0, max_position_embeddings=512)
    try:
        config = Config(encoder_config=enc, vocab_size=12, blank_token_id=11, pad_token_id=11,
                        decoder_hidden_size=32, num_decoder_layers=1, durations=[0, 1, 2, 3, 4])
        torch.manual_seed(0)
        return (config, Model(config)), None
    except Exception as e:  # noqa: BLE001 - an API this example does not know
        return None, "could not build a tiny ParakeetForTDT with transformers %s: %r" % (
            transformers.__version__, e)


def swap_into_transformers(device):
    """Replaces ParakeetForTDT's joint + loss by TDTJointLoss: the model's encoder (with its
    encoder_projector) and decoder (with its decoder_projector) make enc and pred, and
    TDTJointLoss, loaded from the model's ``joint.head``, computes the loss from them. Checks
    the fused loss against the model's own and takes one training step with it."""
    built, why = _tiny_transformers_parakeet()
    if built is None:
        print("transformers swap skipped: %s" % why)
        return 0
    config, model = built
    model = model.to(device)
    V, durations = int(config.vocab_size), list(config.durations)
    blank = int(getattr(config, "blank_token_id", V - 1))
    pad = getattr(config, "pad_token_id", None)
    pad = blank if pad is None else int(pad)
    act = str(getattr(config, "hidden_act", "relu")).lower()
    head = getattr(getattr(model, "joint", None), "head", None)
    if not isinstance(head, nn.Linear):
        print("transformers swap skipped: this ParakeetForTDT has no joint.head Linear")
        return 0
    try:
        fused = warp_tdt.TDTJointLoss(head.in_features, V, durations, blank_token_id=blank,
                                      activation=act)
    except ValueError as e:  # an activation the fused joint does not have
        print("transformers swap skipped: %s" % e)
        return 0
    fused.load_transformers_joint_state_dict(model.state_dict())  # joint.head.weight / .bias
    fused = fused.to(device)

    B, frames, U = 2, 64, 4
    mels = int(getattr(config.encoder_config, "num_mel_bins", 16))
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(B, frames, mels, generator=g).to(device)
    mask = torch.ones(B, frames, dtype=torch.long)
    mask[1, 48:] = 0
    allowed = [v for v in range(V) if v not in (blank, pad)]
    labels = torch.tensor(allowed)[torch.randint(0, len(allowed), (B, U), generator=g)]
    labels[1, 3:] = pad
    label_lengths = (labels != pad).sum(-1)
    dec_in = torch.cat([torch.full((B, 1), blank), labels.masked_fill(labels == pad, blank)], 1)
    feats, mask, labels, dec_in = (t.to(device) for t in (feats, mask, labels, dec_in))

    def fused_loss():
        out = model.get_audio_features(input_features=feats, attention_mask=mask)
        enc = out.pooler_output                     # encoder_projector's output, (B, T, H)
        logit_lengths = out.attention_mask.sum(-1)  # frames after subsampling
        pred = model.decoder(dec_in)                # decoder_projector's output, (B, U + 1, H)
        return fused(enc, pred, labels.masked_fill(labels == pad, 0), logit_lengths,
                     label_lengths.to(device))

    model.eval()
    fused.eval()
    try:
        from transformers.loss import loss_tdt
        if hasattr(loss_tdt, "_load_tdt_kernel"):  # its pure-PyTorch loss, never a hub kernel
            loss_tdt._load_tdt_kernel = lambda: None
    except ImportError:
        pass
    with torch.backends.cudnn.flags(enabled=False):
        try:
            theirs = model(input_features=feats, attention_mask=mask, labels=labels,
                           decoder_input_ids=dec_in).loss
            ours = fused_loss()
        except (AttributeError, TypeError) as e:
            print("transformers swap skipped: this ParakeetForTDT's API differs (%r)" % e)
            return 0
        print("ParakeetForTDT: its own joint + loss %.6f, TDTJointLoss %.6f"
              % (float(theirs), float(ours)))
        if not abs(float(theirs) - float(ours)) <= 1e-4 * abs(float(theirs)) + 1e-5:
            print("FAIL: the fused loss differs from the model's own", file=sys.stderr)
            return 1
        # a training step through the fused loss: the model's encoder and decoder, and the
        # joint's output layer now owned by TDTJointLoss, get their gradients
        model.train()
        fused.train()
        params = [p for n, p in model.named_parameters() if not n.startswith("joint.")]
        opt = torch.optim.SGD(params + list(fused.parameters()), lr=1e-2)
        opt.zero_grad()
        loss = fused_loss()
        loss.backward()
        opt.step()
    print("one training step through TDTJointLoss: loss %.6f; the encoder, decoder and the "
          "joint's output layer got gradients" % float(loss))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true",
                   help="compare with the unfused path, train a few dozen steps, exit non-zero "
                        "unless the loss fell (a smoke test)")
    p.add_argument("--unfused", action="store_true",
                   help="train through the unfused path (PyTorch joint + warp_tdt.tdt_loss)")
    p.add_argument("--transformers", action="store_true",
                   help="only the swap into transformers' ParakeetForTDT")
    args = p.parse_args()
    if args.check and args.steps == 300:
        args.steps, args.log_every = 60, 10
    if args.device == "auto":
        args.device = "cuda" if warp_tdt.cuda_available() else "cpu"
    device = torch.device(args.device)
    print("warp_tdt %s (library %s at %s), torch %s, device %s"
          % (warp_tdt.__version__, warp_tdt.library_version(), warp_tdt.library_path(),
             torch.__version__, device))
    if args.transformers:
        return swap_into_transformers(device)
    status = train(args, device)
    if status == 0 and args.check:
        status = swap_into_transformers(device)
    return status


if __name__ == "__main__":
    sys.exit(main())
