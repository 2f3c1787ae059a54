"""warp_tdt under PyTorch DistributedDataParallel: a tiny TDT joint network trained for a few
steps on synthetic data, each rank on its own GPU and its own shard of one global batch.

At every step each rank checks, on its own GPU:
  * its per-sample losses are bit for bit those of a single-GPU run of its shard with the same
    parameters, and match a single-process run over the global batch (its own model copy, which
    takes the same SGD steps) within the tolerance below;
  * the DDP gradient after NCCL's all-reduce (the average over ranks of the shard-sum gradients)
    times the world size equals the single-process gradient of the global-batch sum:
    float64 to 1e-10 relative, float32 to 1e-5;
then both models take the same SGD step. Run (keep NCCL's NVLink multicast off):

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 tests/multigpu/ddp_tdt.py --steps 5

Exit status 0 when every rank passed every check.
"""

import argparse
import copy
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import warp_tdt

DURATIONS = [0, 1, 2, 3, 4]


class TinyTDT(torch.nn.Module):
    """Encoder frames and predictor states joined into (B, T, U+1, V+D) logits, Parakeet-style."""

    def __init__(self, feat, hidden, vocab, num_durations):
        super().__init__()
        self.vocab = vocab
        self.enc = torch.nn.Linear(feat, hidden)
        self.pred = torch.nn.Embedding(vocab, hidden)
        self.joint = torch.nn.Linear(hidden, vocab + num_durations)

    def forward(self, feats, targets):
        B = targets.shape[0]
        blank = torch.full((B, 1), self.vocab - 1, dtype=targets.dtype, device=targets.device)
        pred = self.pred(torch.cat([blank, targets], dim=1))               # (B, U+1, H)
        enc = self.enc(feats)                                              # (B, T, H)
        return self.joint(torch.tanh(enc[:, :, None, :] + pred[:, None, :, :]))


def make_batch(B, T, U, F, V, seed, device, dtype):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, F, generator=g).to(device, dtype)
    targets = torch.randint(0, V - 1, (B, U), generator=g).to(device)
    logit_lengths = torch.randint(T // 2, T + 1, (B,), generator=g).to(device)
    target_lengths = torch.randint(1, U + 1, (B,), generator=g).to(device)
    return feats, targets, logit_lengths, target_lengths


def losses(model, batch, V):
    feats, targets, T_b, U_b = batch
    joint = model(feats, targets)
    return warp_tdt.tdt_loss(joint[..., :V], joint[..., V:], targets, T_b, U_b,
                             blank_token_id=V - 1, durations=DURATIONS, reduction="none")


def run(dtype, args, rank, world, device):
    V, F, H = 32, 16, 24
    torch.manual_seed(1234)
    model = TinyTDT(F, H, V, len(DURATIONS)).to(device, dtype)
    ref = copy.deepcopy(model)                       # the single-process run, on this rank's GPU
    ddp = DDP(model, device_ids=[device.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    # the reference's gradient is the global-batch sum, DDP's the average over ranks of the shard
    # sums: a learning rate world times smaller makes the two updates the same
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05 / world)
    B = args.per_rank * world
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    ok = True
    for step in range(args.steps):
        batch = make_batch(B, args.frames, args.labels, F, V, seed=100 + step, device=device, dtype=dtype)
        shard = tuple(x[rank * args.per_rank:(rank + 1) * args.per_rank] for x in batch)

        ref_opt.zero_grad()
        ref_losses = losses(ref, batch, V)
        ref_losses.sum().backward()

        opt.zero_grad()
        shard_losses = losses(ddp, shard, V)
        shard_losses.sum().backward()                # DDP all-reduces (averages) the gradients

        with torch.no_grad():  # the single-GPU loss of this shard, same parameters, no DDP
            single = losses(ddp.module, shard, V)
        same_loss = torch.equal(shard_losses.detach(), single)
        mine = ref_losses[rank * args.per_rank:(rank + 1) * args.per_rank].detach()
        loss_diff = ((shard_losses.detach() - mine).abs() / mine.abs()).max().item()
        worst = 0.0
        for p, q in zip(ddp.module.parameters(), ref.parameters()):
            diff = (p.grad * world - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)
            worst = max(worst, diff.item())
        step_ok = same_loss and loss_diff <= tol and worst <= tol
        ok &= step_ok
        total = shard_losses.detach().sum()
        dist.all_reduce(total)
        print("rank %d %-7s step %d: global loss %.6f; shard losses %s the single-GPU loss of the "
              "shard, within %.1e of the single-process run; max relative gradient difference "
              "%.2e (tol %.0e) %s"
              % (rank, str(dtype).replace("torch.", ""), step, total.item(),
                 "bitwise equal to" if same_loss else "DIFFER from", loss_diff, worst, tol,
                 "ok" if step_ok else "FAILED"), flush=True)
        opt.step()
        ref_opt.step()
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--per-rank", type=int, default=3)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--labels", type=int, default=10)
    args = p.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    ok = all([run(dtype, args, rank, world, device) for dtype in (torch.float64, torch.float32)])
    flags = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(flags)
    if rank == 0:
        print("DDP check: %s" % ("all ranks passed" if flags.item() == 0 else "%d rank(s) FAILED" % flags.item()))
    dist.destroy_process_group()
    return 0 if flags.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
