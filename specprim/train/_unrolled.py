"""Training-time test: the loss of a feature-chaining head (EAGLE, MTP) unrolled over several draft depths.

The objectives of such heads hold an :class:`Unrolling` (the settings) and pass themselves, as an
:class:`UnrolledHead` (how one depth is computed), to :func:`unrolled_loss`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from specprim.drafters import target_to_draft
from specprim.masks import additive_mask
from specprim.train._alignment import draft_topk_hits, topk_distillation_loss
from specprim.train._features import FeatureBatch
from specprim.train._losses import greedy_hits, masked_fraction, soft_cross_entropy
from specprim.train._protocol import LossOn, ObjectiveOutput, check_loss_on, loss_mask, shift

__all__ = ["ExtraLoss", "UnrolledHead", "Unrolling", "unroll", "unrolled_loss", "unrolled_mask"]

ExtraLoss = Callable[[torch.Tensor, FeatureBatch, int, torch.Tensor], "torch.Tensor | None"]
"""``(predicted states (B, n, d), batch, label offset, (B, n) valid labels) -> loss term or None``, added to a
step's loss (EAGLE-1's feature regression)."""


class UnrolledHead(Protocol):
    """How one unrolled depth of a feature-chaining head is computed."""

    def initial_state(self, batch: FeatureBatch) -> torch.Tensor:
        """(B, T, d) the step-0 input state of every position, from the cached target features."""
        ...

    def new_cache(self) -> object:
        """An empty KV cache for the head's layers."""
        ...

    def step(self, tokens: torch.Tensor, state: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             cache: object) -> tuple[torch.Tensor, torch.Tensor]:
        """One unrolled step: tokens (B, n), states (B, n, d), positions (n,), additive mask (B, 1, n, past + n),
        the head's cache -> predicted states (B, n, d) and draft logits (B, n, V_d)."""
        ...


@dataclasses.dataclass(frozen=True)
class Unrolling:
    """How a feature-chaining head is trained over ``steps`` unrolled draft depths (training-time test).

    Step ``k`` of chain ``i`` takes the token ``x_{i+k+1}`` and the state predicted by step ``k - 1`` (the real
    input feature at step 0), sits at position ``i + k``, and is scored against the target's next-token
    distribution at position ``i + k + 1``. Step losses are weighted ``step_decay ** k`` (EAGLE-3's 0.8), the
    cross-entropy ``ce_weight``.

    ``align`` (token-alignable training, after GRIFFIN): step ``k`` of a chain counts in the loss only where the
    draft's greedy tokens of steps ``0 .. k - 1`` were all the target's, the only chains whose depth ``k + 1`` greedy
    verification ever reaches; misaligned chains (whose teacher-forced inputs the draft would never have produced)
    no longer pull the head. Every step's metrics count all positions either way, and ``chain_{k+1}`` is the
    fraction of chains whose first ``k + 1`` greedy tokens all match: the probability that a greedy chain of that
    depth is accepted whole, so ``1 + sum_k chain_k`` is a held-out, teacher-forced estimate of a greedy chain's tau.
    ``align_topk`` softens ``align`` as GRIFFIN does: a chain stays in the loss while the target's greedy token is
    among the draft's ``align_topk`` best tokens at every earlier depth (the chains a tree with ``align_topk``
    children per node can still reach; 1: the greedy chain). The ``chain_k`` metrics stay greedy.

    ``hass_topk`` (harmonized objective distillation, after HASS; 0: off) adds ``hass_weight`` x
    :func:`~specprim.train._alignment.topk_distillation_loss` over the target's ``hass_topk`` most likely tokens to
    each depth's loss, on the positions its cross-entropy counts.
    """

    steps: int
    loss_on: LossOn = "all"
    greedy: bool = False
    step_decay: float = 0.8
    ce_weight: float = 1.0
    align: bool = False
    align_topk: int = 1
    hass_topk: int = 0
    hass_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not 0 < self.step_decay <= 1:
            raise ValueError(f"step_decay must be in (0, 1], got {self.step_decay}")
        check_loss_on(self.loss_on)
        if self.align_topk < 1 or (self.align_topk > 1 and not self.align):
            raise ValueError(f"align_topk must be >= 1, and > 1 only with align, got {self.align_topk}")
        if self.hass_topk < 0 or not self.hass_weight > 0:
            raise ValueError(f"hass_topk must be >= 0 and hass_weight > 0, got {self.hass_topk} and {self.hass_weight}")


def unrolled_mask(length: int, step: int) -> torch.Tensor:
    """(T, (step + 1) T) bool attention of unrolled step ``step`` (0-based) of ``T`` parallel chains.

    Chain ``i`` starts from the real pair at position ``i``. At step ``k`` its query sees the real pairs
    ``0 .. i`` (block 0, causal) and its own entries of steps ``1 .. k`` (diagonal blocks): exactly what a draft
    node at depth ``k`` below a root at position ``i + 1`` sees while drafting.
    """
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    diagonal = torch.eye(length, dtype=torch.bool)
    return torch.cat([causal] + [diagonal] * step, dim=1)


def unroll(head: UnrolledHead, batch: FeatureBatch, steps: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(state, logits)`` of steps ``0 .. steps - 1``: (B, n, d) predicted states and (B, n, V_d) draft
    logits of the ``n = T - 1`` chains; chain ``i`` at step ``k`` predicts the token after position
    ``i + k + 1`` (the draft's depth ``k + 1`` below a root at position ``i + 1``)."""
    ids = batch.input_ids  # (B, T)
    length = ids.shape[1] - 1  # chains i = 0 .. T - 2 (the last position has no following token)
    if length < 1:
        raise ValueError("every batch needs sequences of at least 2 tokens")
    state = head.initial_state(batch)[:, :length]  # (B, n, d)
    cache = head.new_cache()
    for k in range(steps):
        tokens = shift(ids, k + 1, length)  # (B, n) x_{i+k+1}
        positions = torch.arange(length, device=state.device) + k  # (n,)
        mask = additive_mask(unrolled_mask(length, k), batch_size=ids.shape[0], dtype=state.dtype,
                             device=state.device)  # (B, 1, n, (k+1) n)
        state, logits = head.step(tokens, state, positions, mask, cache)  # (B, n, d), (B, n, V_d)
        yield state, logits


def draft_vocab_maps(d2t: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(d2t, t2d)`` for :func:`unrolled_loss` from a head's draft vocabulary ``d2t`` (V_d,) as it is at this call
    (a restored checkpoint brings its own, so the maps are never kept across calls); ``(None, None)`` when it is the
    whole target vocabulary."""
    if d2t.numel() == vocab_size:
        return None, None
    return d2t, target_to_draft(d2t, vocab_size)  # (V_d,), (V,)


def unrolled_loss(head: UnrolledHead, batch: FeatureBatch, unrolling: Unrolling, *,
                  d2t: torch.Tensor | None = None, t2d: torch.Tensor | None = None,
                  extra_loss: ExtraLoss | None = None) -> ObjectiveOutput:
    """The loss and metrics of ``head`` unrolled over one batch as ``unrolling`` says.

    ``d2t`` (V_d,) / ``t2d`` (V,): the draft vocabulary's maps when it is a subset of the target's; ``extra_loss``
    is added to each step's loss. Metrics: ``acc_k``, ``chain_k``, ``loss_k`` for each depth and ``loss``.
    """
    length = batch.input_ids.shape[1] - 1
    labels_mask = loss_mask(batch, unrolling.loss_on)  # (B, T)
    total = torch.zeros((), dtype=torch.float32, device=batch.input_ids.device)
    metrics: dict[str, float] = {}
    chained = torch.ones_like(labels_mask[:, :length])  # (B, n) chains whose greedy tokens all matched so far
    aligned = chained  # (B, n) chains still in the loss (align: the target's tokens in the draft's align_topk best)
    for k, (state, logits) in enumerate(unroll(head, batch, unrolling.steps)):
        valid = shift(labels_mask, k + 1, length, fill=False)  # (B, n) label position i + k + 1 is real
        top_ids = shift(batch.topk_ids, k + 1, length)  # (B, n, K)
        top_logprobs = shift(batch.topk_logprobs, k + 1, length, fill=float("-inf"))
        trained = valid & aligned if unrolling.align else valid
        loss = unrolling.ce_weight * soft_cross_entropy(logits, top_ids, top_logprobs, trained, t2d=t2d,
                                                        greedy=unrolling.greedy)
        if unrolling.hass_topk:
            loss = loss + unrolling.hass_weight * topk_distillation_loss(logits, top_ids, top_logprobs, trained,
                                                                         unrolling.hass_topk, t2d=t2d)
        extra = None if extra_loss is None else extra_loss(state, batch, k + 1, valid)
        if extra is not None:
            loss = loss + extra
        total = total + unrolling.step_decay ** k * loss
        hits = greedy_hits(logits.detach(), top_ids, d2t)  # (B, n)
        metrics[f"acc_{k + 1}"] = masked_fraction(hits, valid)
        chained = chained & hits
        if unrolling.align_topk > 1:
            hits = draft_topk_hits(logits.detach(), top_ids[..., 0], unrolling.align_topk, d2t)
        aligned = aligned & hits
        metrics[f"chain_{k + 1}"] = masked_fraction(chained, valid)
        metrics[f"loss_{k + 1}"] = float(loss.detach())
    metrics["loss"] = float(total.detach())
    return ObjectiveOutput(loss=total, metrics=metrics)
