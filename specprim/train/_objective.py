"""Training objectives of the feature-chaining heads (EAGLE, MTP): each holds its head and an :class:`Unrolling`,
and computes its loss with :func:`~specprim.train._unrolled.unrolled_loss` (training-time test).

Both are ``nn.Module`` s that satisfy the :class:`~specprim.train._protocol.Objective` protocol; the other objectives
live in ``_medusa.py`` (Medusa) and ``_lm.py`` (a draft LM).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
from torch import nn

from specprim.drafters import EagleHead, MTPHead
from specprim.train._features import FeatureBatch, _normalise_layers
from specprim.train._protocol import LossOn, Objective, ObjectiveOutput, loss_mask, shift
from specprim.train._unrolled import Unrolling, draft_vocab_maps, unroll, unrolled_loss, unrolled_mask
from specprim.train._unrolled_attention import unrolled_attention_in

__all__ = ["EagleObjective", "MTPObjective", "Objective", "ObjectiveOutput", "loss_mask", "unrolled_mask"]


class EagleObjective(nn.Module):
    """Train an :class:`~specprim.drafters.EagleHead` (EAGLE-1 or EAGLE-3) from cached target features.

    Loss per step: soft cross-entropy of the head's draft logits against the target's top-K distribution
    (restricted to the draft vocabulary ``d2t``), weighted ``ce_weight``; EAGLE-1 adds a SmoothL1 regression of
    the predicted feature on the target's real feature at that position (weight ``feature_weight``), with the
    EAGLE-1 paper's weights (1.0 and 0.1) by default. ``steps > 1`` unrolls EAGLE-3's training-time test
    (default: 3 steps for EAGLE-3, 1 for EAGLE-1); ``steps``, ``loss_on``, ``greedy``, ``step_decay``, ``ce_weight``
    and ``align`` make its :class:`~specprim.train._unrolled.Unrolling` (held as ``unrolling``).
    """

    def __init__(self, head: EagleHead, *, steps: int | None = None, loss_on: LossOn = "all", greedy: bool = False,
                 step_decay: float = 0.8, feature_weight: float | None = None, ce_weight: float | None = None,
                 align: bool = False) -> None:
        super().__init__()
        version = head.config.version
        self.unrolling = Unrolling(
            steps if steps is not None else (3 if version == 3 else 1), loss_on, greedy, step_decay,
            ce_weight=(0.1 if version == 1 else 1.0) if ce_weight is None else ce_weight, align=align,
        )
        self.module = head
        self.layers = _normalise_layers(head.config.feature_layers, head.config.target_num_layers)
        self.feature_weight = (1.0 if version == 1 else 0.0) if feature_weight is None else feature_weight
        if self.feature_weight and version != 1:
            raise ValueError("feature regression applies to EAGLE-1 heads (EAGLE-3 predicts fused features)")
        self._last_layer = head.config.target_num_layers  # EAGLE-1's feature: after the final norm

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        """The loss and metrics of one batch (see :func:`~specprim.train._unrolled.unrolled_loss`)."""
        d2t, t2d = draft_vocab_maps(self.module.d2t, self.module.config.vocab_size)
        return unrolled_loss(self, batch, self.unrolling, d2t=d2t, t2d=t2d, extra_loss=self.feature_loss)

    def unroll(self, batch: FeatureBatch) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(state, logits)`` of every unrolled step (see :func:`~specprim.train._unrolled.unroll`)."""
        return unroll(self, batch, self.unrolling.steps)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the head with its own ``save_pretrained``."""
        self.module.save_pretrained(directory)

    def initial_state(self, batch: FeatureBatch) -> torch.Tensor:
        return self.module.fuse([batch.feature(layer) for layer in self.layers])  # (B, T, d)

    def new_cache(self) -> object:
        return self.module.new_cache()

    def step(self, tokens, state, positions, mask, cache):
        with unrolled_attention_in(self.module.layer_config):  # the unrolled mask's attention without the mask
            out = self.module(tokens, state, position_ids=positions, attention_mask=mask, cache=cache)
        return out.hidden, out.draft_logits  # (B, n, d), (B, n, V_d)

    def feature_loss(self, predicted: torch.Tensor, batch: FeatureBatch, offset: int, mask: torch.Tensor
                     ) -> torch.Tensor | None:
        """EAGLE-1's SmoothL1 regression of the predicted states (B, n, d) on the real features ``offset`` positions
        on, averaged over the (B, n) ``mask``; ``None`` when ``feature_weight`` is 0."""
        if not self.feature_weight:
            return None
        real = shift(batch.feature(self._last_layer), offset, predicted.shape[1]).to(predicted.dtype)  # (B, n, d)
        error = nn.functional.smooth_l1_loss(predicted, real, reduction="none").mean(-1)  # (B, n)
        weight = mask.to(error.dtype)
        return self.feature_weight * (error * weight).sum() / weight.sum().clamp(min=1.0)


class MTPObjective(nn.Module):
    """Train an :class:`~specprim.drafters.MTPHead` from cached target features (the last hidden state), chained
    over ``steps`` depths with the same lineage attention the drafter uses (default 3 steps); the settings make its
    :class:`~specprim.train._unrolled.Unrolling` (held as ``unrolling``)."""

    def __init__(self, head: MTPHead, *, steps: int = 3, loss_on: LossOn = "all", greedy: bool = False,
                 step_decay: float = 0.8, num_target_layers: int, align: bool = False) -> None:
        super().__init__()
        self.unrolling = Unrolling(steps, loss_on, greedy, step_decay, align=align)
        self.module = head
        self.layers = (num_target_layers,)

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        """The loss and metrics of one batch (see :func:`~specprim.train._unrolled.unrolled_loss`)."""
        return unrolled_loss(self, batch, self.unrolling)

    def unroll(self, batch: FeatureBatch) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(state, logits)`` of every unrolled step (see :func:`~specprim.train._unrolled.unroll`)."""
        return unroll(self, batch, self.unrolling.steps)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the head with its own ``save_pretrained``."""
        self.module.save_pretrained(directory)

    def initial_state(self, batch: FeatureBatch) -> torch.Tensor:
        return batch.feature(self.layers[0])  # (B, T, d)

    def new_cache(self) -> object:
        return self.module.new_cache()

    def step(self, tokens, state, positions, mask, cache):
        states = self.module(state, tokens, position_ids=positions.expand(tokens.shape[0], -1),
                             attention_mask=mask, cache=cache)  # (B, n, d)
        return states, self.module.logits(states)  # (B, n, d), (B, n, V_d)
