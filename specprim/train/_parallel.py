"""The training objective of the parallel drafter (:class:`specprim.drafters.ParallelHead`): all ``K`` draft depths
of every position of a cached sequence at once.

Chain ``i`` (``i = 0 .. T - 2``) is a root at position ``i + 1``. Step 0 runs the real pairs (fused target feature
at ``i``, token ``x_{i+1}``) at positions ``i`` with a causal mask; step ``k = 1 .. K - 1`` runs placeholder ``k`` of
every chain at position ``i + k``, seeing the real pairs ``0 .. i`` and its own chain's placeholders ``1 .. k``
(:func:`specprim.train.unrolled_mask`): exactly what the drafter's one causal forward shows placeholder ``k`` below a
root at ``i + 1``. Step ``k`` is scored against the target's next-token distribution at position ``i + k + 1``
(soft cross-entropy on the cached top-K, over the draft vocabulary), weighted ``step_decay ** k``. Unlike EAGLE's
training-time test, no step feeds on an earlier step's output: placeholders are learned constants.

Metrics: ``acc_k`` (teacher-forced top-1 agreement at depth ``k``), ``chain_k`` (the fraction of chains whose first
``k`` argmax tokens all match the target's greedy tokens: ``1 + sum_k chain_k`` estimates a greedy chain's tau),
``loss_k`` and ``loss``.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
from torch import nn

from specprim.drafters import ParallelHead, target_to_draft
from specprim.masks import additive_mask
from specprim.train._features import FeatureBatch, _normalise_layers
from specprim.train._losses import greedy_accuracy, greedy_hits, soft_cross_entropy
from specprim.train._objective import ObjectiveOutput, loss_mask, unrolled_mask

__all__ = ["ParallelObjective"]


def _shifted(x: torch.Tensor, offset: int, length: int, fill: float | bool = 0) -> torch.Tensor:
    """``x[:, offset : offset + length]`` along dim 1, padded with ``fill`` past the end."""
    out = x.new_full((x.shape[0], length, *x.shape[2:]), fill)
    piece = x[:, offset : offset + length]
    out[:, : piece.shape[1]] = piece
    return out


class ParallelObjective(nn.Module):
    """Train a :class:`~specprim.drafters.ParallelHead` from cached target features (see the module docstring).

    ``module`` is the head (trained and saved); ``layers`` the cached feature layers it reads. ``loss_on``:
    ``"all"`` positions or ``"assistant"`` ones; ``greedy``: the target's top-1 token as a hard label;
    ``step_decay`` in (0, 1]; ``freeze_eagle``: train the placeholders only (the EAGLE-3 part, e.g. a shipped head
    loaded with ``ParallelHead.from_eagle``, stays as it is, so ``q_1`` keeps its accuracy).
    """

    def __init__(self, head: ParallelHead, *, loss_on: Literal["all", "assistant"] = "all", greedy: bool = False,
                 step_decay: float = 0.8, freeze_eagle: bool = False) -> None:
        super().__init__()
        if not isinstance(head, ParallelHead):
            raise TypeError(f"ParallelObjective trains a ParallelHead, got {type(head).__name__}")
        if not 0 < step_decay <= 1:
            raise ValueError(f"step_decay must be in (0, 1], got {step_decay}")
        if loss_on not in ("all", "assistant"):
            raise ValueError(f"loss_on must be 'all' or 'assistant', got {loss_on!r}")
        self.module = head
        self.loss_on, self.greedy, self.step_decay = loss_on, greedy, step_decay
        config = head.eagle.config
        self.layers = _normalise_layers(config.feature_layers, config.target_num_layers)
        full = config.draft_vocab_size == config.vocab_size
        self.register_buffer("_t2d", None if full else target_to_draft(head.eagle.d2t, config.vocab_size),
                             persistent=False)
        if freeze_eagle:
            head.eagle.requires_grad_(False)

    def depth_logits(self, batch: FeatureBatch) -> list[torch.Tensor]:
        """(B, n, V_d) draft logits of depths ``1 .. K`` for the ``n = T - 1`` chains of ``batch``."""
        head, ids = self.module, batch.input_ids  # (B, T)
        length = ids.shape[1] - 1
        if length < 1:
            raise ValueError("every batch needs sequences of at least 2 tokens")
        hidden = head.eagle.fuse([batch.feature(layer) for layer in self.layers])[:, :length]  # (B, n, d)
        embeds = head.embed(ids[:, 1:])  # (B, n, d) the token x_{i+1} of pair i
        cache = head.new_cache()
        logits = []
        for k in range(head.num_draft):
            if k:
                embeds, hidden = (x.expand(-1, length, -1) for x in head.placeholders(ids.shape[0], k, 1))
            mask = additive_mask(unrolled_mask(length, k), batch_size=ids.shape[0], dtype=hidden.dtype,
                                 device=hidden.device)  # (B, 1, n, (k + 1) n)
            positions = torch.arange(length, device=hidden.device) + k  # (n,)
            out = head.predict(embeds, hidden, position_ids=positions, attention_mask=mask, cache=cache)
            logits.append(head.draft_logits(out))  # (B, n, V_d)
        return logits

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        length = batch.input_ids.shape[1] - 1
        labels_mask = loss_mask(batch, self.loss_on)  # (B, T)
        d2t = None if self._t2d is None else self.module.eagle.d2t
        total = torch.zeros((), dtype=torch.float32, device=batch.input_ids.device)
        metrics: dict[str, float] = {}
        aligned = torch.ones_like(labels_mask[:, :length])  # (B, n) chains whose argmax tokens all matched so far
        for k, logits in enumerate(self.depth_logits(batch)):
            valid = _shifted(labels_mask, k + 1, length, fill=False)  # (B, n) label position i + k + 1 is real
            top_ids = _shifted(batch.topk_ids, k + 1, length)  # (B, n, K)
            top_logprobs = _shifted(batch.topk_logprobs, k + 1, length, fill=float("-inf"))
            loss = soft_cross_entropy(logits, top_ids, top_logprobs, valid, t2d=self._t2d, greedy=self.greedy)
            total = total + self.step_decay ** k * loss
            metrics[f"acc_{k + 1}"] = greedy_accuracy(logits.detach(), top_ids, valid, d2t)[0]
            aligned = aligned & greedy_hits(logits.detach(), top_ids, d2t)
            metrics[f"chain_{k + 1}"] = float((aligned & valid).sum()) / max(int(valid.sum()), 1)
            metrics[f"loss_{k + 1}"] = float(loss.detach())
        metrics["loss"] = float(total.detach())
        return ObjectiveOutput(loss=total, metrics=metrics)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the head with its own ``save_pretrained``."""
        self.module.save_pretrained(directory)
