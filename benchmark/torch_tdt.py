"""A vectorised pure-PyTorch TDT loss: the baseline that benchmark/bench.py times warp_tdt against.

Written from docs/math.md alone (no code from other projects), with the signature and semantics of
warp_tdt.tdt_loss: raw token logits (B, T, U+1, V) with the blank among them, duration logits
(B, T, U+1, D), sigma on every token log-prob, durations in any order, reductions "none", "sum",
"mean" (mean of loss_b / U_b), "mean_batch", "mean_volume"; an infeasible sample costs +inf and
gets an exactly zero gradient. The gradient is autograd's.

How it runs (every step a tensor op over the whole batch):
  0. when the two logits are the token / duration slices of one joint tensor (a Parakeet joint
     network's output), split that tensor again so autograd writes its gradient with one cat
     (the same shortcut warp_tdt.tdt_loss takes with fuse_joint=True);
  1. log_softmax over the V tokens (one V-wide pass; its backward is one fused pass too) and over
     the D durations; then ONE gather picks, per node, the two token log-probs the lattice uses
     (blank, and the next label y_{u+1}), so nothing else V-wide is built.
  2. Arc weights of every node, blank and label arc per duration: (B, T, U+1, 2D), rearranged once
     into "incoming" order (the weight of the arc of duration index k that arrives at (t, u) is
     read from its source (t - d_k, u) or (t - d_k, u - 1)) and skewed to anti-diagonal-major
     order (S = T + U diagonals s = t + u), so that the sweep is pure indexing.
  3. alpha by anti-diagonals: every arc goes from diagonal s to s + d (blank) or s + d + 1 (label),
     d >= 0, so diagonal s needs only the last max(d) + 2 diagonals. One step = stack that window,
     pick the 2D source diagonals with one index_select, add the weights, logsumexp: a handful of
     small ops per diagonal, over (B, 2D, U+1) at once; T + U steps in all.
  4. log p(y|x) per sample from its terminal arcs (blank from (T_b - d, U_b) with d > 0) by gather.

Absent arcs and unreachable nodes carry a large finite negative number instead of -inf, so
autograd never forms exp(-inf - (-inf)) = NaN; an infeasible sample's log p stays near that number
and is replaced by +inf with a zero upstream gradient.

Precision: the V-wide log_softmax runs in float32 (float64 for float64 logits); the lattice (the
picked log-probs onwards: O(B T U D) values, cheap) in float64, as warp_tdt's does. A float32
lattice would be no faster here and its autograd gradient drifts by up to ~1% relative on
long lattices (alpha and beta in the hundreds leave float32 ~1e-5 absolute per step). Costs are
returned in float32 (float64 for float64 logits), like warp_tdt.tdt_loss.
"""

import torch

__all__ = ["tdt_loss"]

_REDUCTIONS = ("none", "sum", "mean", "mean_batch", "mean_volume")


# The 'absent' log-weight (float64): finite, far below any real log-probability sum, and small
# enough in magnitude that a few of them added stay finite.
NEG = -1e300


def _shift_t(x, shifts, neg):
    """x (B, T, R, K) -> y, y[:, t, :, k] = x[:, t - shifts[k], :, k] (neg where t < shifts[k])."""
    B, T, R, K = x.shape
    pad = max(shifts)
    xp = torch.cat([x.new_full((B, pad, R, K), neg), x], 1) if pad > 0 else x
    return torch.stack([xp[:, pad - s: pad - s + T, :, k] for k, s in enumerate(shifts)], -1)


def _unslice(token, duration):
    """(token, duration) = J.split([V, D], -1) when the two are the adjacent last-dim slices of one
    tensor J that autograd can reach directly; else the two as given.

    Through split, autograd assembles J's gradient with one cat; through the caller's two slices
    it would zero-fill two J-sized tensors, copy into each and add them.
    """
    base = token._base
    if base is None or duration._base is not base or base.dim() != 4:
        return token, duration
    V, D = token.shape[-1], duration.shape[-1]
    if tuple(base.shape) != tuple(token.shape[:3]) + (V + D,) or base.stride() != token.stride() \
            or duration.stride() != token.stride() \
            or token.storage_offset() != base.storage_offset() \
            or duration.storage_offset() != base.storage_offset() + V \
            or base.requires_grad != (token.requires_grad and duration.requires_grad):
        return token, duration
    return base.split([V, D], -1)


def tdt_loss(token_logits, duration_logits, targets, logit_lengths, target_lengths, blank_token_id,
             durations, sigma=0.0, reduction="mean"):
    """TDT loss of (B, T, U+1, V) token logits and (B, T, U+1, D) duration logits; see the module
    docstring. Returns a scalar, or (B,) costs for reduction="none"."""
    if reduction not in _REDUCTIONS:
        raise ValueError("reduction must be one of %s, got %r" % (_REDUCTIONS, reduction))
    token_logits, duration_logits = _unslice(token_logits, duration_logits)
    dev = token_logits.device
    acc = torch.float64 if token_logits.dtype == torch.float64 else torch.float32  # V-wide, costs
    lat = torch.float64  # the lattice
    neg = NEG
    B, T, R, V = token_logits.shape  # R = U + 1 rows
    U = R - 1
    ds = [int(d) for d in durations]
    K = len(ds)
    dmax = max(ds)
    blank = int(blank_token_id)
    fl = torch.as_tensor(logit_lengths, device=dev).long()
    ll = torch.as_tensor(target_lengths, device=dev).long()

    # 1. the two token log-probs per node, and the duration log-probs
    lp = torch.log_softmax(token_logits.to(acc), -1)  # (B, T, R, V)
    lab = torch.full((B, R), blank, dtype=torch.long, device=dev)
    if U > 0:
        tg = torch.as_tensor(targets, device=dev).long()[:, :U]
        inside = torch.arange(U, device=dev).unsqueeze(0) < ll.unsqueeze(1)
        lab[:, :U] = torch.where(inside, tg, torch.full_like(tg, blank))  # padding never read
    idx = torch.stack([torch.full_like(lab, blank), lab], -1)  # (B, R, 2): blank, y_{u+1}
    pick = lp.gather(3, idx.unsqueeze(1).expand(B, T, R, 2)).to(lat) - sigma  # (B, T, R, 2)
    lpd = torch.log_softmax(duration_logits.to(lat), -1)  # (B, T, R, K)

    # 2. arc weights leaving each node: blank (k) and label (k); absent arcs -> neg
    d_t = torch.tensor(ds, device=dev)
    w_blank = (pick[..., 0:1] + lpd).masked_fill((d_t == 0).view(1, 1, 1, K), neg)
    w_label = pick[..., 1:2] + lpd
    if R > 1:
        row_u = torch.arange(R, device=dev).view(1, 1, R, 1)
        w_label = w_label.masked_fill(row_u == U, neg)  # no label arc leaves row U
    # incoming order: the arc of index k into (t, u) leaves (t - d_k, u) / (t - d_k, u - 1)
    in_blank = _shift_t(w_blank, ds, neg)
    in_label = _shift_t(w_label, ds, neg)
    in_label = torch.cat([in_label.new_full((B, T, 1, K), neg), in_label[:, :, :U]], 2)
    w_in = torch.cat([in_blank, in_label], -1)  # (B, T, R, 2K)
    # anti-diagonal-major: wd[s, b, j, u] = w_in[b, s - u, u, j] (neg off the lattice)
    S = T + U
    s_i = torch.arange(S, device=dev).view(S, 1)
    u_i = torch.arange(R, device=dev).view(1, R)
    t_i = s_i - u_i
    on = (t_i >= 0) & (t_i < T)
    w_in = torch.cat([w_in, w_in.new_full((B, 1, R, 2 * K), neg)], 1)  # row T: all absent
    wd = w_in[:, torch.where(on, t_i, torch.full_like(t_i, T)), u_i.expand(S, R)]  # (B, S, R, 2K)
    wd = wd.permute(1, 0, 3, 2).unbind(0)  # S tensors (B, 2K, R); one backward node for all

    # 3. alpha, one anti-diagonal at a time. The window holds diagonals s-W .. s-1 (W = dmax + 2),
    # each as [alpha, alpha shifted one row down] so label sources (u - 1) are plain indexing.
    W = dmax + 2
    sel = [W - d if d > 0 else 0 for d in ds] + [W + W - d - 1 for d in ds]  # into (B, 2W, R)
    sel = torch.tensor(sel, device=dev)
    row0 = torch.full((B, R), neg, dtype=lat, device=dev)
    row0[:, 0] = 0.0  # alpha(0, 0) = 0, on diagonal 0
    blank_row = torch.full((B, R), neg, dtype=lat, device=dev)
    negcol = torch.full((B, 1), neg, dtype=lat, device=dev)

    def down(a):
        return torch.cat([negcol, a[:, :-1]], 1)

    alphas = [blank_row] * (W - 1) + [row0]
    shifted = [blank_row] * (W - 1) + [down(row0)]
    for s in range(1, S):
        src = torch.stack(alphas[-W:] + shifted[-W:], 1)  # (B, 2W, R)
        a = torch.logsumexp(src.index_select(1, sel) + wd[s], 1)  # (B, R)
        alphas.append(a)
        shifted.append(down(a))

    # 4. terminal arcs: blank of duration d > 0 from (T_b - d, U_b), landing exactly on T_b
    A = torch.stack(alphas[W - 1:], 1)  # (B, S, R): alpha on diagonal s, row u
    t_src = fl.view(B, 1) - d_t.view(1, K)  # (B, K)
    ok = (t_src >= 0) & (d_t.view(1, K) > 0)
    t_c = t_src.clamp(0, max(T - 1, 0))
    u_c = ll.clamp(0, U).view(B, 1).expand(B, K)
    b_i = torch.arange(B, device=dev).view(B, 1).expand(B, K)
    k_i = torch.arange(K, device=dev).view(1, K).expand(B, K)
    if T > 0:
        term = A[b_i, t_c + u_c, u_c] + w_blank[b_i, t_c, u_c, k_i]
    else:
        term = torch.full((B, K), neg, dtype=lat, device=dev)
    term = term.masked_fill(~ok, neg)
    log_p = torch.logsumexp(term, 1)
    feasible = log_p > 0.5 * neg
    costs = torch.where(feasible, -log_p, torch.full_like(log_p, float("inf"))).to(acc)

    if reduction == "none":
        return costs
    if reduction == "sum":
        return costs.sum()
    if reduction == "mean":
        return (costs / ll.to(acc)).mean()
    if reduction == "mean_batch":
        return costs.mean()
    return costs.sum() / ll.sum().to(acc)
