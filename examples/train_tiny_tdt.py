#!/usr/bin/env python3
"""Train a tiny TDT (Token-and-Duration Transducer) model on synthetic data with warp_tdt.

The task: each utterance is a random label sequence; every label is "spoken" for 1 to 3 frames
(a noisy one-hot feature of the label), with optional silent frames between labels. A
bidirectional LSTM encoder reads the frames, an LSTM prediction network reads the previous labels, and a joint network
emits, for every (frame, label position), token logits and duration logits in one joint tensor
(vocab + durations wide), the Parakeet-TDT layout. warp_tdt.tdt_loss takes the two slices of that
tensor and writes their gradient once, joint-shaped.

    python3 examples/train_tiny_tdt.py                 # CPU (or CUDA when present)
    python3 examples/train_tiny_tdt.py --device cpu --steps 300 --log-every 25

Runs in well under a minute on two CPU cores. It needs the package importable (pip install
./pytorch_binding, or run from the repository, which this script adds to sys.path) and a built
libwarptdt (cmake -B build && cmake --build build), found as warp_tdt documents.
"""

import argparse
import os
import sys
import time

import torch
from torch import nn

try:
    import warp_tdt
except ImportError:  # run from a checkout: use the package in pytorch_binding/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pytorch_binding"))
    import warp_tdt

NUM_TOKENS = 6           # real labels 0..5
BLANK = NUM_TOKENS       # Parakeet convention: blank is the last token
VOCAB = NUM_TOKENS + 1   # V, blank included
DURATIONS = [0, 1, 2, 3, 4]


def make_batch(batch, gen, device, max_labels=6, noise=0.4):
    """Synthetic utterances: (features (B, T, F), targets (B, U), frame_lengths, label_lengths)."""
    seqs, frames = [], []
    for _ in range(batch):
        n = int(torch.randint(2, max_labels + 1, (1,), generator=gen))
        # no label repeats itself, so a label's frames can be told apart from the next one's
        steps = torch.randint(1, NUM_TOKENS, (n,), generator=gen)
        labels = (torch.cumsum(steps, 0) + int(torch.randint(0, NUM_TOKENS, (1,), generator=gen))) % NUM_TOKENS
        feats = []
        for y in labels.tolist():
            if torch.rand(1, generator=gen).item() < 0.3:  # a silent frame before the label
                feats.append(torch.zeros(NUM_TOKENS + 1))
                feats[-1][NUM_TOKENS] = 1.0
            for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
                f = torch.zeros(NUM_TOKENS + 1)
                f[y] = 1.0
                feats.append(f)
        seqs.append(labels)
        frames.append(torch.stack(feats))
    T = max(f.shape[0] for f in frames)
    U = max(s.shape[0] for s in seqs)
    x = torch.zeros(batch, T, NUM_TOKENS + 1)
    targets = torch.zeros(batch, U, dtype=torch.long)
    for b, (f, s) in enumerate(zip(frames, seqs)):
        x[b, : f.shape[0]] = f
        targets[b, : s.shape[0]] = s
    x = x + noise * torch.randn(x.shape, generator=gen)
    fl = torch.tensor([f.shape[0] for f in frames])
    ll = torch.tensor([s.shape[0] for s in seqs])
    return x.to(device), targets.to(device), fl.to(device), ll.to(device)


class TinyTDT(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        # a bidirectional encoder sees how long the current label lasts: the duration to predict
        self.encoder_rnn = nn.LSTM(NUM_TOKENS + 1, hidden // 2, batch_first=True, bidirectional=True)
        self.encoder_out = nn.Linear(hidden, hidden)
        self.embed = nn.Embedding(VOCAB, hidden)  # the blank doubles as start symbol
        self.predictor = nn.LSTM(hidden, hidden, batch_first=True)
        self.joint = nn.Sequential(nn.Tanh(), nn.Linear(hidden, VOCAB + len(DURATIONS)))

    def decoder_input(self, targets):
        start = torch.full_like(targets[:, :1], BLANK)
        return torch.cat([start, targets], 1)  # (B, U + 1)

    def encoder(self, x):
        return self.encoder_out(self.encoder_rnn(x)[0])             # (B, T, H)

    def forward(self, x, targets):
        enc = self.encoder(x)                                        # (B, T, H)
        dec, _ = self.predictor(self.embed(self.decoder_input(targets)))  # (B, U + 1, H)
        return self.joint(enc[:, :, None, :] + dec[:, None, :, :])   # (B, T, U + 1, V + D)

    @torch.no_grad()
    def greedy(self, x, frames, max_symbols=5):
        """Greedy TDT decoding of one utterance (greedy_tdt)."""
        enc = self.encoder(x[None, :frames])[0]

        def step(token, state):
            h, state = self.predictor(self.embed(torch.tensor([[token]], device=x.device)), state)
            return h[0, -1], state

        return greedy_tdt(enc, frames, step, lambda e, g: self.joint(e + g), max_symbols)


def greedy_tdt(enc, frames, step, joint, max_symbols=5):
    """Greedy TDT decoding: at frame t the token argmax of joint(enc[t], g) is emitted unless it
    is the blank (or max_symbols were emitted at t), and t jumps by the duration argmax (at least
    1 after a blank). step(token, state) -> (g, state) runs the prediction network on one token
    (the blank first)."""
    out = []
    g, state = step(BLANK, None)
    t, emitted = 0, 0
    while t < frames:
        logits = joint(enc[t], g)
        token = int(logits[:VOCAB].argmax())
        dur = DURATIONS[int(logits[VOCAB:].argmax())]
        if token == BLANK or emitted >= max_symbols:
            t += max(dur, 1)
            emitted = 0
            continue
        out.append(token)
        emitted += 1
        g, state = step(token, state)
        t += dur
    return out


def fit(model, step_loss, opt, args, gen, device):
    """args.steps steps of opt on step_loss(x, targets, frame_lengths, label_lengths) over
    synthetic batches, the mean loss printed every args.log_every steps; then greedy decoding of
    four fresh utterances, printed. Returns the first and last printed mean losses."""
    first = last = None
    window, start = [], time.time()
    for step in range(1, args.steps + 1):
        x, targets, fl, ll = make_batch(args.batch, gen, device)
        loss = step_loss(x, targets, fl, ll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        window.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            avg = sum(window) / len(window)
            first = avg if first is None else first
            last = avg
            print("step %4d  loss/label %.4f  (%.1f s)" % (step, avg, time.time() - start), flush=True)
            window = []
    x, targets, fl, ll = make_batch(4, gen, device)
    model.eval()
    hits = 0
    for b in range(4):
        want = targets[b, : ll[b]].tolist()
        got = model.greedy(x[b], int(fl[b]))
        hits += got == want
        print("  target %-22s decoded %s" % (want, got))
    print("loss/label %.4f -> %.4f; %d/4 decoded exactly; %.1f s"
          % (first, last, hits, time.time() - start))
    return first, last


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true",
                   help="exit non-zero unless the loss at least halved (a smoke test)")
    args = p.parse_args()

    if args.device == "auto":
        args.device = "cuda" if warp_tdt.cuda_available() else "cpu"
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = TinyTDT().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    print("warp_tdt %s (library %s at %s), torch %s, device %s"
          % (warp_tdt.__version__, warp_tdt.library_version(), warp_tdt.library_path(),
             torch.__version__, device))

    def step_loss(x, targets, fl, ll):
        joint = model(x, targets)
        return warp_tdt.tdt_loss(joint[..., :VOCAB], joint[..., VOCAB:], targets, fl, ll, BLANK,
                                 DURATIONS, sigma=0.05)  # mean over the batch of loss_b / U_b

    first, last = fit(model, step_loss, opt, args, gen, device)
    if args.check and not last < 0.5 * first:
        print("FAIL: the loss did not halve", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
