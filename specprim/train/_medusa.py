"""Medusa-1 training: every head learns the target's distribution at its own depth from the last hidden state."""

from __future__ import annotations

import os

import torch
from torch import nn

from specprim.drafters import MedusaHeads
from specprim.train._features import FeatureBatch
from specprim.train._losses import greedy_accuracy, soft_cross_entropy
from specprim.train._protocol import LossOn, ObjectiveOutput, check_loss_on, loss_mask, shift

__all__ = ["MedusaObjective"]


class MedusaObjective(nn.Module):
    """Train :class:`~specprim.drafters.MedusaHeads` from cached target features (the last hidden state).

    Alignment, as :class:`~specprim.drafters.MedusaDraftModel` drafts: the heads read the target's hidden state at
    the last committed position ``t``; the root is the token at ``t + 1`` and head ``k`` (1-based) drafts the
    token at depth ``k`` below it, position ``t + 1 + k``. Its label is therefore the target's cached next-token
    distribution at position ``t + k`` (``topk_*[:, t + k]``), used where position ``t + k`` is in the loss mask
    (:func:`~specprim.train._protocol.loss_mask`); head ``k`` has no label at the last ``k`` positions of a row.

    Loss: ``sum_k head_decay ** (k - 1) * CE_k``, ``CE_k`` the soft cross-entropy of head ``k`` against the
    target's top-K distribution (its top-1 only when ``greedy``), averaged over head ``k``'s labelled positions
    (Medusa-1's 0.8 decay by default). Metrics: ``loss``, ``loss_k`` and ``acc_k`` (teacher-forced top-1
    agreement of head ``k``) for ``k = 1 .. num_heads``.

    Args:
        heads: the heads to train (its parameters are the objective's; a shared target LM head is used by
            reference and not trained).
        num_target_layers: the target's number of decoder layers ``L``; the feature read is
            ``output_hidden_states[L]``, after the final norm, which the feature cache must hold.
        loss_on: ``"all"`` real positions or only ``"assistant"`` ones (see ``loss_mask``).
        greedy: train on the target's top-1 token as a hard label instead of its top-K distribution.
        head_decay: weight ratio between consecutive heads, in ``(0, 1]``.
    """

    def __init__(self, heads: MedusaHeads, *, num_target_layers: int, loss_on: LossOn = "all", greedy: bool = False,
                 head_decay: float = 0.8) -> None:
        super().__init__()
        if isinstance(num_target_layers, bool) or not isinstance(num_target_layers, int) or num_target_layers < 1:
            raise ValueError(f"num_target_layers must be a positive int, got {num_target_layers!r}")
        if not 0 < head_decay <= 1:
            raise ValueError(f"head_decay must be in (0, 1], got {head_decay}")
        check_loss_on(loss_on)
        self.module = heads
        self.layers = (num_target_layers,)
        self.loss_on, self.greedy, self.head_decay = loss_on, greedy, head_decay

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the draft module with its own ``save_pretrained``."""
        self.module.save_pretrained(directory)

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        """Loss and metrics of one batch; ``ValueError`` when its hidden size is not the heads'."""
        config = self.module.config
        hidden = batch.feature(self.layers[0])  # (B, T, H)
        if hidden.shape[-1] != config.hidden_size:
            raise ValueError(f"the cached features have hidden size {hidden.shape[-1]}; the Medusa heads were built "
                             f"for {config.hidden_size}")
        length = batch.input_ids.shape[1]
        labels_mask = loss_mask(batch, self.loss_on)  # (B, T)
        # head k at position t is labelled by position t + k: (K, B, T) validity on the grid of input positions
        valid = torch.stack([shift(labels_mask, k, length, fill=False) for k in range(1, config.num_heads + 1)])
        used = valid.any(0)  # (B, T) positions some head is trained at
        weight = next(self.module.parameters())
        logits = self.module(hidden[used].to(weight.dtype))  # (N, K, V)
        total = logits.new_zeros((), dtype=torch.float32)
        metrics: dict[str, float] = {}
        for k in range(1, config.num_heads + 1):
            mask = valid[k - 1][used]  # (N,)
            top_ids = shift(batch.topk_ids, k, length)[used]  # (N, K) labels at t + k
            top_logprobs = shift(batch.topk_logprobs, k, length, fill=float("-inf"))[used]
            head_logits = logits[:, k - 1]  # (N, V)
            loss = soft_cross_entropy(head_logits, top_ids, top_logprobs, mask, greedy=self.greedy)
            total = total + self.head_decay ** (k - 1) * loss
            metrics[f"acc_{k}"], _ = greedy_accuracy(head_logits.detach(), top_ids, mask)
            metrics[f"loss_{k}"] = float(loss.detach())
        metrics["loss"] = float(total.detach())
        return ObjectiveOutput(loss=total, metrics=metrics)
