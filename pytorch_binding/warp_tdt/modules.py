"""nn.Module forms of the losses: TDTLoss (the kernels exchange-layer pattern), RNNTLoss
(torchaudio.transforms.RNNTLoss), and TDTJointLoss (the joint's output layer fused with the
loss)."""

import math

import torch
from torch import nn

from . import joint as _joint
from .functional import rnnt_loss, tdt_loss

__all__ = ["TDTLoss", "RNNTLoss", "TDTJointLoss"]


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


class TDTJointLoss(nn.Module):
    """The joint network's output layer and the transducer loss, fused
    (:func:`warp_tdt.tdt_joint_loss`): owns the output Linear's ``weight`` (V + D, H) and
    ``bias`` (V + D,), and its forward takes the joint's two inputs, never holding the
    (B, T, U + 1, V + D) logits::

        joint_loss = TDTJointLoss(hidden_size=640, vocab_size=8193, durations=[0, 1, 2, 3, 4],
                                  activation="relu", dropout=0.2)
        joint_loss.load_nemo_joint_state_dict(nemo_model.state_dict())   # or
        joint_loss.load_transformers_joint_state_dict(hf_model.state_dict())
        loss = joint_loss(enc, pred, targets, logit_lengths, target_lengths)

    enc (B, T, H) and pred (B, U + 1, H) are the encoder's and the prediction network's outputs
    already projected to H (NeMo's ``joint.enc`` / ``joint.pred``; transformers'
    ``encoder_projector`` / the decoder's ``decoder_projector``). ``durations=None`` gives the
    plain RNN-T loss (``rnnt_joint_loss``; weight (V, H)). Dropout applies in training mode
    only (p = 0 in eval mode, as nn.Dropout). The blank is ``blank_token_id`` (default V - 1, the
    NeMo / Parakeet convention). ``skip_below`` (0: exact) is tdt_joint_loss()'s approximate
    backward. :meth:`logits` computes the unfused joint, for decoding.
    """

    def __init__(self, hidden_size, vocab_size, durations=(0, 1, 2, 3, 4), *, blank_token_id=None,
                 activation="relu", dropout=0.0, sigma=0.0, reduction="mean", bias=True,
                 fastemit_lambda=0.0, clamp=0.0, validate=True, skip_below=0.0, device=None,
                 dtype=None):
        super().__init__()
        self.activation = _joint._check_activation(activation)
        self.dropout = _joint._check_dropout(dropout)
        self.durations = None if durations is None else list(durations)
        D = 0 if durations is None else len(self.durations)
        if int(hidden_size) < 1 or int(vocab_size) < 1:
            raise ValueError("hidden_size = %r and vocab_size = %r must both be at least 1"
                             % (hidden_size, vocab_size))
        self.hidden_size, self.vocab_size = int(hidden_size), int(vocab_size)
        self.blank_token_id = self.vocab_size - 1 if blank_token_id is None else int(blank_token_id)
        self.sigma, self.reduction = sigma, reduction
        self.fastemit_lambda, self.clamp, self.validate = fastemit_lambda, clamp, validate
        self.skip_below = skip_below
        kw = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty(self.vocab_size + D, self.hidden_size, **kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.vocab_size + D, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """nn.Linear's initialisation."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.hidden_size)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, enc, pred, targets, logit_lengths, target_lengths, reduction=None):
        p = self.dropout if self.training else 0.0
        reduction = self.reduction if reduction is None else reduction
        if self.durations is None:
            return _joint.rnnt_joint_loss(
                enc, pred, self.weight, self.bias, targets, logit_lengths, target_lengths,
                blank=self.blank_token_id, activation=self.activation, dropout=p,
                clamp=self.clamp if self.clamp > 0 else -1, reduction=reduction,
                fastemit_lambda=self.fastemit_lambda, validate=self.validate,
                skip_below=self.skip_below)
        return _joint.tdt_joint_loss(
            enc, pred, self.weight, self.bias, targets, logit_lengths, target_lengths,
            self.blank_token_id, self.durations, activation=self.activation, dropout=p,
            sigma=self.sigma, reduction=reduction, fastemit_lambda=self.fastemit_lambda,
            clamp=self.clamp, validate=self.validate, skip_below=self.skip_below)

    def logits(self, enc, pred):
        """The joint's logits, unfused: ``F.linear(act(enc + pred), weight, bias)`` for enc and
        pred that broadcast (e.g. (B, T, 1, H) and (B, 1, U + 1, H), or one frame and one
        prediction step when decoding). No dropout."""
        h = _joint._TORCH_ACT[self.activation](enc + pred)
        return nn.functional.linear(h, self.weight.to(h.dtype),
                                    None if self.bias is None else self.bias.to(h.dtype))

    # ---- loading the output layer of other implementations --------------------------------

    @classmethod
    def from_linear(cls, linear, vocab_size, durations=(0, 1, 2, 3, 4), **kwargs):
        """A TDTJointLoss holding a copy of an existing output layer ``linear`` (an nn.Linear of
        vocab_size + len(durations) outputs, e.g. NeMo's ``joint.joint_net[-1]`` or
        transformers' ``model.joint.head``), on its device and in its dtype; kwargs as the
        constructor's (activation, dropout, blank_token_id, ...)."""
        w = linear.weight
        m = cls(w.shape[1], vocab_size, durations, bias=linear.bias is not None,
                device=w.device, dtype=w.dtype, **kwargs)
        return m._load_linear(w.detach(), None if linear.bias is None else linear.bias.detach(),
                              "the given Linear", "linear.weight")

    def _load_linear(self, weight, bias, source, where):
        want = tuple(self.weight.shape)
        if tuple(weight.shape) != want:
            raise ValueError("%s has shape %s but this TDTJointLoss's weight is %s (vocab_size "
                             "%d + %d durations, hidden_size %d)"
                             % (where, tuple(weight.shape), want, self.vocab_size,
                                want[0] - self.vocab_size, self.hidden_size))
        if (bias is None) != (self.bias is None):
            raise ValueError("%s %s but this TDTJointLoss was built with bias=%s"
                             % (source, "has no bias" if bias is None else "has a bias",
                                self.bias is not None))
        with torch.no_grad():
            self.weight.copy_(weight)
            if bias is not None:
                if tuple(bias.shape) != (want[0],):
                    raise ValueError("%s's bias has shape %s, expected (%d,)"
                                     % (source, tuple(bias.shape), want[0]))
                self.bias.copy_(bias)
        return self

    @staticmethod
    def _find(state_dict, suffixes, what):
        """The one key (and its prefix) ending in one of `suffixes`, or a clear error."""
        hits = [(k, s) for k in state_dict for s in suffixes if k == s or k.endswith("." + s)]
        if not hits:
            raise KeyError("no %s in the state dict: looked for a key ending in %s; its keys "
                           "include %s" % (what, " or ".join(repr(s) for s in suffixes),
                                           sorted(state_dict)[:12]))
        prefixes = sorted({k[: len(k) - len(s)] for k, s in hits})
        if len(prefixes) > 1:
            raise KeyError("more than one %s in the state dict (prefixes %s): pass the joint's "
                           "own state dict, or prefix=" % (what, prefixes))
        return prefixes[0]

    def load_nemo_joint_state_dict(self, state_dict, prefix=None):
        """Loads the output Linear of a NeMo RNNT/TDT joint (``RNNTJoint.joint_net``, which is
        ``Sequential(activation, [Dropout,] Linear)``: keys ``joint.joint_net.2.weight`` /
        ``.bias`` in a model's state dict with joint dropout, ``joint_net.1`` without). Takes a
        whole model's state dict or the joint's own; ``prefix`` (e.g. ``"joint.joint_net.2."``)
        names the Linear when there is more than one. NeMo's TDT output rows are the V - 1
        tokens, the blank (V - 1), then the durations: this module's layout with
        blank_token_id = V - 1. The joint's ``enc`` and ``pred`` Linear layers stay with the
        caller (they make this module's inputs)."""
        if prefix is None:
            keys = [k for k in state_dict if ".joint_net." in "." + k and k.endswith(".weight")]
            if not keys:
                raise KeyError("no NeMo joint output layer in the state dict: looked for "
                               "'joint_net.<i>.weight'; its keys include %s" % sorted(state_dict)[:12])
            # the last layer of joint_net is the Linear (index 2 with dropout, 1 without)
            heads = {}
            for k in keys:
                head, _, rest = k.rpartition(".joint_net.")
                if not head and k.startswith("joint_net."):
                    head, rest = "", k[len("joint_net."):]
                index = rest.split(".")[0]
                if index.isdigit():
                    heads.setdefault(head, []).append(int(index))
            if len(heads) != 1:
                raise KeyError("more than one NeMo joint_net in the state dict (%s): pass "
                               "prefix=" % sorted(heads))
            head, indices = next(iter(heads.items()))
            prefix = "%sjoint_net.%d." % (head + "." if head else "", max(indices))
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            raise KeyError("%r is not in the state dict" % (prefix + "weight"))
        return self._load_linear(weight, state_dict.get(prefix + "bias"), "the NeMo joint",
                                 prefix + "weight")

    def load_transformers_joint_state_dict(self, state_dict, prefix=None):
        """Loads the output layer of transformers' Parakeet TDT joint (``ParakeetForTDT.joint``,
        whose ``head`` is ``nn.Linear(decoder_hidden_size, vocab_size + len(durations))``: keys
        ``joint.head.weight`` / ``.bias``), from a whole model's state dict or the joint's own.
        A joint with two heads (``token_head`` (V, H) and ``duration_head`` (D, H)) is loaded as
        their concatenation. ``prefix`` (e.g. ``"joint.head."``) names the Linear."""
        if prefix is not None:
            weight = state_dict.get(prefix + "weight")
            if weight is None:
                raise KeyError("%r is not in the state dict" % (prefix + "weight"))
            return self._load_linear(weight, state_dict.get(prefix + "bias"),
                                     "the transformers joint", prefix + "weight")
        try:
            pre = self._find(state_dict, ["head.weight"], "transformers joint head")
            head = pre + "head."
            return self._load_linear(state_dict[head + "weight"], state_dict.get(head + "bias"),
                                     "the transformers joint", head + "weight")
        except KeyError:
            pre = self._find(state_dict, ["token_head.weight"],
                             "transformers joint head (head.weight or token_head.weight)")
        tok_w = state_dict[pre + "token_head.weight"]
        dur_w = state_dict.get(pre + "duration_head.weight")
        if dur_w is None:
            raise KeyError("%r is not in the state dict (a token_head needs its duration_head)"
                           % (pre + "duration_head.weight"))
        tok_b, dur_b = state_dict.get(pre + "token_head.bias"), state_dict.get(pre + "duration_head.bias")
        bias = None if tok_b is None or dur_b is None else torch.cat([tok_b, dur_b])
        return self._load_linear(torch.cat([tok_w, dur_w]), bias, "the transformers joint",
                                 pre + "token_head.weight + duration_head.weight")

    def extra_repr(self):
        return ("hidden_size=%d, vocab_size=%d, durations=%s, blank_token_id=%d, activation=%r, "
                "dropout=%g, sigma=%g, reduction=%r, bias=%s%s"
                % (self.hidden_size, self.vocab_size, self.durations, self.blank_token_id,
                   self.activation, self.dropout, self.sigma, self.reduction,
                   self.bias is not None,
                   ", skip_below=%g" % self.skip_below if self.skip_below else ""))
