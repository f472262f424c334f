"""The training objective of the parallel drafter (:class:`specprim.drafters.ParallelHead`): all ``K`` draft depths
of every position of a cached sequence at once.

Chain ``i`` (``i = 0 .. T - 2``) is a root at position ``i + 1``. Step 0 runs the real pairs (fused target feature
at ``i``, token ``x_{i+1}``) at positions ``i`` with a causal mask; step ``k = 1 .. K - 1`` runs placeholder ``k`` of
every chain at position ``i + k``, seeing the real pairs ``0 .. i`` and its own chain's placeholders ``1 .. k``
(:func:`specprim.train.unrolled_mask`): exactly what the drafter's one causal forward shows placeholder ``k`` below a
root at ``i + 1``. Step ``k`` is scored against the target's next-token distribution at position ``i + k + 1``
(soft cross-entropy on the cached top-K, over the draft vocabulary), weighted ``step_decay ** k``. The loop, the
loss and the metrics are EAGLE's training-time test's (:func:`specprim.train._unrolled.unrolled_loss`, ``align``
included); the one difference is that no step feeds on an earlier step's output: placeholders are learned constants.

Metrics: ``acc_k`` (teacher-forced top-1 agreement at depth ``k``), ``chain_k`` (the fraction of chains whose first
``k`` argmax tokens all match the target's greedy tokens: ``1 + sum_k chain_k`` estimates a greedy chain's tau),
``loss_k`` and ``loss``.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from specprim.drafters import ParallelHead
from specprim.train._features import FeatureBatch, _normalise_layers
from specprim.train._protocol import LossOn, ObjectiveOutput
from specprim.train._unrolled import Unrolling, draft_vocab_maps, unroll, unrolled_loss

__all__ = ["ParallelObjective"]


class ParallelObjective(nn.Module):
    """Train a :class:`~specprim.drafters.ParallelHead` from cached target features (see the module docstring).

    ``module`` is the head (trained and saved); ``layers`` the cached feature layers it reads. ``loss_on``:
    ``"all"`` positions or ``"assistant"`` ones; ``greedy``: the target's top-1 token as a hard label;
    ``step_decay`` in (0, 1]; ``align``: token-alignable training (a depth counts only where the argmax tokens above
    it matched); ``freeze_eagle``: train the placeholders only (the EAGLE-3 part, e.g. a shipped head wrapped with
    ``ParallelHead.from_eagle``, stays as it is, so ``q_1`` keeps its accuracy).
    """

    def __init__(self, head: ParallelHead, *, loss_on: LossOn = "all", greedy: bool = False,
                 step_decay: float = 0.8, align: bool = False, freeze_eagle: bool = False) -> None:
        super().__init__()
        if not isinstance(head, ParallelHead):
            raise TypeError(f"ParallelObjective trains a ParallelHead, got {type(head).__name__}")
        self.unrolling = Unrolling(head.num_draft, loss_on, greedy, step_decay, align=align)
        self.module = head
        config = head.eagle.config
        self.layers = _normalise_layers(config.feature_layers, config.target_num_layers)
        if freeze_eagle:
            head.eagle.requires_grad_(False)

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        """The loss and metrics of one batch (see :func:`~specprim.train._unrolled.unrolled_loss`)."""
        d2t, t2d = draft_vocab_maps(self.module.eagle.d2t, self.module.eagle.config.vocab_size)
        return unrolled_loss(self, batch, self.unrolling, d2t=d2t, t2d=t2d)

    def depth_logits(self, batch: FeatureBatch) -> list[torch.Tensor]:
        """(B, n, V_d) draft logits of depths ``1 .. K`` for the ``n = T - 1`` chains of ``batch``."""
        return [logits for _, logits in unroll(self, batch, self.unrolling.steps)]

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the head with its own ``save_pretrained``."""
        self.module.save_pretrained(directory)

    # the UnrolledHead protocol (specprim.train._unrolled), what unroll() calls
    def initial_state(self, batch: FeatureBatch) -> torch.Tensor:
        return self.module.eagle.fuse([batch.feature(layer) for layer in self.layers])  # (B, T, d)

    def new_cache(self) -> object:
        return self.module.new_cache()

    def step(self, tokens: torch.Tensor, state: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             cache: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``k`` (its chains sit at positions ``i + k``, so ``k = positions[0]``): the real pairs at ``k = 0``
        (tokens (B, n), fused features (B, n, d)), placeholder ``k`` of every chain after that (``tokens`` and
        ``state`` unused). Returns the (B, n, d) outputs and their (B, n, V_d) draft logits."""
        head, k = self.module, int(positions[0])
        if k == 0:
            embeds, hidden = head.embed(tokens), state
        else:
            embeds, hidden = (x.expand(-1, tokens.shape[1], -1) for x in head.placeholders(tokens.shape[0], k, 1))
        out = head.predict(embeds, hidden, position_ids=positions, attention_mask=mask, cache=cache)  # (B, n, d)
        return out, head.draft_logits(out)
