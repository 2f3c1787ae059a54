"""Independent pure-PyTorch references for the TDT and RNN-T losses (float64, autograd).

Written from docs/math.md (sections 1-4 and 7) only, not from the C sources: alpha recursion node
by node (vectorised over the batch), terminal blank arcs that land exactly on T_b, sigma on token
log-probs, FastEmit as a (1 + lambda) scale of the label log-probs' gradient, and the gradient
from autograd. Unreachable / infeasible terms are kept out of the autograd graph (safe
logsumexp), so an infeasible sample gets an exact zero gradient and cost +inf, like the library.
"""

import torch

NEG_INF = float("-inf")


def _safe_lse(terms):
    """logsumexp over a list of (B,) tensors; -inf (with zero gradient) where all are -inf."""
    if not terms:
        return None
    x = torch.stack(terms, 0)
    dead = torch.isneginf(x).all(0)
    x_safe = torch.where(dead.unsqueeze(0), torch.zeros_like(x), x)
    out = torch.logsumexp(x_safe, 0)
    return torch.where(dead, torch.full_like(out, NEG_INF), out)


def _scale_grad(x, factor):
    """x in value, factor * dL/dx in gradient."""
    if factor == 1.0:
        return x
    return x * factor - x.detach() * (factor - 1.0)


def _fastemit_value(c, fastemit_lambda):
    """Reports (1 + lambda) * cost without changing the gradient (inf stays inf)."""
    if fastemit_lambda == 0:
        return c
    extra = fastemit_lambda * c.detach()
    return c + torch.where(torch.isinf(c), torch.zeros_like(extra), extra)


def _label_lp(lp_tok, labels):
    """lp_tok (B, T, U+1, V), labels (B, U) -> (B, T, U): log-prob of y_{u+1} at rows u < U."""
    B, T, rows, V = lp_tok.shape
    U = rows - 1
    if U == 0:
        return lp_tok.new_zeros(B, T, 0)
    idx = labels[:, :U].long().clamp(0, V - 1)  # padding may hold anything: never used
    idx = idx.view(B, 1, U, 1).expand(B, T, U, 1)
    return torch.gather(lp_tok[:, :, :U, :], 3, idx).squeeze(3)


def tdt_costs(token_logits, duration_logits, labels, frame_lengths, label_lengths, blank, durations,
              sigma=0.0, fastemit_lambda=0.0):
    """Per-sample TDT costs (B,) float64; differentiable w.r.t. both logits."""
    z = token_logits.double()
    h = duration_logits.double()
    B, T, rows, V = z.shape
    lp_tok = torch.log_softmax(z, -1) - sigma
    lp_dur = torch.log_softmax(h, -1)
    lp_blank = lp_tok[..., blank]
    lp_label = _scale_grad(_label_lp(lp_tok, labels), 1.0 + fastemit_lambda)
    alpha = [[None] * rows for _ in range(T)]
    for t in range(T):
        for u in range(rows):
            if t == 0 and u == 0:
                alpha[t][u] = z.new_zeros(B)
                continue
            terms = []
            for k, d in enumerate(durations):
                if t - d < 0:
                    continue
                if d > 0:
                    terms.append(alpha[t - d][u] + lp_blank[:, t - d, u] + lp_dur[:, t - d, u, k])
                if u > 0:
                    terms.append(alpha[t - d][u - 1] + lp_label[:, t - d, u - 1]
                                 + lp_dur[:, t - d, u - 1, k])
            alpha[t][u] = _safe_lse(terms) if terms else z.new_full((B,), NEG_INF)
    costs = []
    for b in range(B):
        Tb, Ub = int(frame_lengths[b]), int(label_lengths[b])
        terms = []
        for k, d in enumerate(durations):
            if d > 0 and Tb - d >= 0:
                n = (Tb - d, Ub)
                terms.append((alpha[n[0]][n[1]][b] + lp_blank[b, n[0], n[1]]
                              + lp_dur[b, n[0], n[1], k]).reshape(1))
        ll = _safe_lse(terms)[0] if terms else z.new_tensor(NEG_INF)
        costs.append(-ll)
    return _fastemit_value(torch.stack(costs), fastemit_lambda)


def rnnt_costs(logits, labels, frame_lengths, label_lengths, blank, fastemit_lambda=0.0,
               log_probs=False):
    """Per-sample plain RNN-T costs (B,) float64: label arcs (t, u) -> (t, u+1), blank arcs
    (t, u) -> (t+1, u), terminal blank from (T_b - 1, U_b)."""
    z = logits.double()
    B, T, rows, V = z.shape
    lp = z if log_probs else torch.log_softmax(z, -1)
    lp_blank = lp[..., blank]
    lp_label = _scale_grad(_label_lp(lp, labels), 1.0 + fastemit_lambda)
    alpha = [[None] * rows for _ in range(T)]
    for t in range(T):
        for u in range(rows):
            if t == 0 and u == 0:
                alpha[t][u] = z.new_zeros(B)
                continue
            terms = []
            if t > 0:
                terms.append(alpha[t - 1][u] + lp_blank[:, t - 1, u])
            if u > 0:
                terms.append(alpha[t][u - 1] + lp_label[:, t, u - 1])
            alpha[t][u] = _safe_lse(terms)
    costs = []
    for b in range(B):
        Tb, Ub = int(frame_lengths[b]), int(label_lengths[b])
        if Tb == 0:
            costs.append(-z.new_tensor(NEG_INF))
            continue
        costs.append(-(alpha[Tb - 1][Ub][b] + lp_blank[b, Tb - 1, Ub]))
    return _fastemit_value(torch.stack(costs), fastemit_lambda)


def reduce(costs, label_lengths, reduction):
    """The reductions of docs/math.md section 7 (NeMo's and transformers') on (B,) costs."""
    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    if reduction == "mean":
        return (costs / label_lengths.to(costs.dtype)).mean()
    if reduction == "mean_batch":
        return costs.mean()
    if reduction == "mean_volume":
        return costs.sum() / label_lengths.sum().to(costs.dtype)
    raise ValueError(reduction)


def tdt_grads(token_logits, duration_logits, labels, frame_lengths, label_lengths, blank, durations,
              sigma=0.0, fastemit_lambda=0.0, clamp=0.0, weights=None):
    """(costs, token_grad, duration_grad) of sum_b weights[b] * cost_b, float64, with the
    library's clamp rule (token gradient of each sample clipped before its weight)."""
    z = token_logits.detach().double().requires_grad_(True)
    h = duration_logits.detach().double().requires_grad_(True)
    c = tdt_costs(z, h, labels, frame_lengths, label_lengths, blank, durations, sigma,
                  fastemit_lambda)
    B = z.shape[0]
    w = torch.ones(B, dtype=torch.float64) if weights is None else weights.double().cpu()
    gz, gh = torch.autograd.grad(c.sum(), (z, h), allow_unused=True)
    if clamp > 0:
        gz = gz.clamp(-clamp, clamp)
    shape = (B, 1, 1, 1)
    return c.detach(), gz * w.view(shape), gh * w.view(shape)


def random_case(B=3, T=6, U=3, V=5, D=None, blank=None, seed=0, dtype=torch.float32, durations=None,
                full_lengths=False, device="cpu"):
    """A random padded batch: dict of token, duration logits, targets, lengths, blank, durations."""
    g = torch.Generator().manual_seed(seed)
    durations = list(durations) if durations is not None else [0, 1, 2, 3, 4][: (D or 5)]
    D = len(durations)
    blank = V - 1 if blank is None else blank
    tok = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64).to(dtype)
    dur = torch.randn(B, T, U + 1, D, generator=g, dtype=torch.float64).to(dtype)
    # labels in [0, V) without the blank
    lab = torch.randint(0, V - 1, (B, U), generator=g)
    lab = lab + (lab >= blank).long()
    if full_lengths:
        fl = torch.full((B,), T, dtype=torch.int64)
        ll = torch.full((B,), U, dtype=torch.int64)
    else:
        fl = torch.randint(max(1, T // 2), T + 1, (B,), generator=g)
        ll = torch.randint(0, U + 1, (B,), generator=g)
        fl[0], ll[0] = T, U  # one sample fills the padded lattice
    # padding beyond the length holds junk that must never be read
    for b in range(B):
        lab[b, int(ll[b]):] = -7
    return dict(token_logits=tok.to(device), duration_logits=dur.to(device), targets=lab.to(device),
                logit_lengths=fl.to(device), target_lengths=ll.to(device), blank_token_id=blank,
                durations=durations)
