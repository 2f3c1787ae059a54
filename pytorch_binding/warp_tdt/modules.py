"""nn.Module forms of the losses: TDTLoss (the kernels exchange-layer pattern) and RNNTLoss
(torchaudio.transforms.RNNTLoss)."""

from torch import nn

from .functional import rnnt_loss, tdt_loss

__all__ = ["TDTLoss", "RNNTLoss"]


class TDTLoss(nn.Module):
    """Stateless TDT loss layer whose forward has the signature of
    ``transformers.loss.loss_tdt.tdt_loss`` (so it can stand in for the kernels-community
    ``tdt-loss`` layer). The keyword-only extras of :func:`warp_tdt.tdt_loss` are fixed at
    construction::

        loss_fn = TDTLoss(fastemit_lambda=0.001)
        loss = loss_fn(token_logits, duration_logits, targets, logit_lengths, target_lengths,
                       blank_token_id, durations, sigma=0.05)

    reduction="mean" (the default, as in transformers) divides each sample's loss by its target
    length: a sample with no labels (``target_lengths[b] == 0``) makes the loss ``inf`` and the
    gradient non-finite; reduction="sum", "mean_batch" or "mean_volume" take such samples (see
    :func:`warp_tdt.tdt_loss`).
    """

    has_backward = True
    can_torch_compile = True

    def __init__(self, *, fastemit_lambda=0.0, clamp=0.0, omega=0.0, in_place=False,
                 fuse_joint=True, validate=True):
        super().__init__()
        self.fastemit_lambda = fastemit_lambda
        self.clamp = clamp
        self.omega = omega
        self.in_place = in_place
        self.fuse_joint = fuse_joint
        self.validate = validate

    def forward(self, token_logits, duration_logits, targets, logit_lengths, target_lengths,
                blank_token_id, durations, sigma=0.0, reduction="mean"):
        return tdt_loss(token_logits, duration_logits, targets, logit_lengths, target_lengths,
                        blank_token_id, durations, sigma=sigma, reduction=reduction,
                        fastemit_lambda=self.fastemit_lambda, clamp=self.clamp, omega=self.omega,
                        in_place=self.in_place, fuse_joint=self.fuse_joint,
                        validate=self.validate)

    def extra_repr(self):
        return "fastemit_lambda=%g, clamp=%g, omega=%g, in_place=%s" % (
            self.fastemit_lambda, self.clamp, self.omega, self.in_place)


class RNNTLoss(nn.Module):
    """``torchaudio.transforms.RNNTLoss``: RNNTLoss(blank=-1, clamp=-1.0, reduction="mean",
    fused_log_softmax=True), forward(logits, targets, logit_lengths, target_lengths)."""

    def __init__(self, blank=-1, clamp=-1.0, reduction="mean", fused_log_softmax=True, *,
                 fastemit_lambda=0.0, in_place=False, validate=True):
        super().__init__()
        self.blank = blank
        self.clamp = clamp
        self.reduction = reduction
        self.fused_log_softmax = fused_log_softmax
        self.fastemit_lambda = fastemit_lambda
        self.in_place = in_place
        self.validate = validate

    def forward(self, logits, targets, logit_lengths, target_lengths):
        return rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=self.blank,
                         clamp=self.clamp, reduction=self.reduction,
                         fused_log_softmax=self.fused_log_softmax,
                         fastemit_lambda=self.fastemit_lambda, in_place=self.in_place,
                         validate=self.validate)

    def extra_repr(self):
        return "blank=%d, clamp=%g, reduction=%r, fused_log_softmax=%s" % (
            self.blank, self.clamp, self.reduction, self.fused_log_softmax)
