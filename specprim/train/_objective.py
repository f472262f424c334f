"""Training objectives: a draft module plus the loss that trains it from a :class:`FeatureBatch`.

An objective is an ``nn.Module`` whose ``forward(batch)`` returns an :class:`ObjectiveOutput`; the trainer
(``specprim.train.train``) optimises its parameters, which are exactly the draft module's. Target modules a head
uses by reference (embeddings, LM head) are not parameters of the objective and stay frozen.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

from specprim.drafters import EagleHead, MTPHead, target_to_draft
from specprim.masks import additive_mask
from specprim.train._features import FeatureBatch, _normalise_layers
from specprim.train._losses import greedy_accuracy, greedy_hits, soft_cross_entropy

__all__ = ["EagleObjective", "MTPObjective", "Objective", "ObjectiveOutput", "unrolled_mask"]

LossOn = Literal["all", "assistant"]


@dataclasses.dataclass(frozen=True)
class ObjectiveOutput:
    """``loss``: scalar to minimise; ``metrics``: floats for the log (``acc_1`` .. ``acc_K``: teacher-forced
    agreement of the draft's argmax with the target's greedy token at depth ``k``)."""

    loss: torch.Tensor
    metrics: dict[str, float]


class Objective(nn.Module, abc.ABC):
    """Base class: ``module`` is the draft module trained and saved; ``layers`` the cached target features it needs
    (``output_hidden_states`` indices, non-negative)."""

    module: nn.Module
    layers: tuple[int, ...]

    @abc.abstractmethod
    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        """The loss and metrics of one batch."""

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the draft module with its own ``save_pretrained``."""
        self.module.save_pretrained(directory)


def loss_mask(batch: FeatureBatch, loss_on: LossOn) -> torch.Tensor:
    """(B, T) bool: positions whose next-token distribution is a training label.

    ``"all"``: every real position (the cached labels are the target's own predictions, so prompt positions teach
    the draft what the target would write there too). ``"assistant"``: positions whose next token is an assistant
    token.
    """
    if loss_on == "all":
        return batch.attention_mask
    if loss_on == "assistant":
        following = torch.zeros_like(batch.assistant_mask)
        following[:, :-1] = batch.assistant_mask[:, 1:]
        return following & batch.attention_mask
    raise ValueError(f"loss_on must be 'all' or 'assistant', got {loss_on!r}")


def unrolled_mask(length: int, step: int) -> torch.Tensor:
    """(T, (step + 1) T) bool attention of unrolled step ``step`` (0-based) of ``T`` parallel chains.

    Chain ``i`` starts from the real pair at position ``i``. At step ``k`` its query sees the real pairs
    ``0 .. i`` (block 0, causal) and its own entries of steps ``1 .. k`` (diagonal blocks): exactly what a draft
    node at depth ``k`` below a root at position ``i + 1`` sees while drafting.
    """
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    diagonal = torch.eye(length, dtype=torch.bool)
    return torch.cat([causal] + [diagonal] * step, dim=1)


def _shift(x: torch.Tensor, offset: int, length: int, fill: float | bool = 0) -> torch.Tensor:
    """``x[:, offset : offset + length]`` along dim 1, padded with ``fill`` past the end."""
    out = x.new_full((x.shape[0], length, *x.shape[2:]), fill)
    piece = x[:, offset: offset + length]
    out[:, : piece.shape[1]] = piece
    return out


class _UnrolledObjective(Objective):
    """Feature-chaining heads (EAGLE, MTP) trained over ``steps`` unrolled draft depths (training-time test).

    Step ``k`` of chain ``i`` takes the token ``x_{i+k+1}`` and the state predicted by step ``k - 1`` (the real
    input feature at step 0), sits at position ``i + k``, and is scored against the target's next-token
    distribution at position ``i + k + 1``. Step losses are weighted ``step_decay ** k`` (EAGLE-3's 0.8).

    ``align`` (token-alignable training, after GRIFFIN): step ``k`` of a chain counts in the loss only where the
    draft's greedy tokens of steps ``0 .. k - 1`` were all the target's, the only chains whose depth ``k + 1`` greedy
    verification ever reaches; misaligned chains (whose teacher-forced inputs the draft would never have produced)
    no longer pull the head. Every step's metrics count all positions either way, and ``chain_{k+1}`` is the
    fraction of chains whose first ``k + 1`` greedy tokens all match: the probability that a greedy chain of that
    depth is accepted whole, so ``1 + sum_k chain_k`` is a held-out, teacher-forced estimate of a greedy chain's tau.
    """

    def __init__(self, steps: int, loss_on: LossOn, greedy: bool, step_decay: float, ce_weight: float = 1.0,
                 align: bool = False) -> None:
        super().__init__()
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if not 0 < step_decay <= 1:
            raise ValueError(f"step_decay must be in (0, 1], got {step_decay}")
        if loss_on not in ("all", "assistant"):
            raise ValueError(f"loss_on must be 'all' or 'assistant', got {loss_on!r}")
        self.steps, self.loss_on, self.greedy, self.step_decay = steps, loss_on, greedy, step_decay
        self.ce_weight, self.align = ce_weight, align

    @abc.abstractmethod
    def initial_state(self, batch: FeatureBatch) -> torch.Tensor:
        """(B, T, d) the step-0 input state of every position, from the cached target features."""

    @abc.abstractmethod
    def step(self, tokens: torch.Tensor, state: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
             cache: object) -> tuple[torch.Tensor, torch.Tensor]:
        """One unrolled step: tokens (B, n), states (B, n, d), positions (n,), additive mask (B, 1, n, past + n),
        the head's cache -> predicted states (B, n, d) and draft logits (B, n, V_d)."""

    @abc.abstractmethod
    def new_cache(self) -> object:
        """An empty KV cache for the head's layers."""

    def vocab_maps(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return None, None

    def extra_loss(self, predicted: torch.Tensor, batch: FeatureBatch, offset: int, mask: torch.Tensor
                   ) -> torch.Tensor | None:
        return None

    def unroll(self, batch: FeatureBatch) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(state, logits)`` of steps ``0 .. steps - 1``: (B, n, d) predicted states and (B, n, V_d) draft
        logits of the ``n = T - 1`` chains; chain ``i`` at step ``k`` predicts the token after position
        ``i + k + 1`` (the draft's depth ``k + 1`` below a root at position ``i + 1``)."""
        ids = batch.input_ids  # (B, T)
        length = ids.shape[1] - 1  # chains i = 0 .. T - 2 (the last position has no following token)
        if length < 1:
            raise ValueError("every batch needs sequences of at least 2 tokens")
        state = self.initial_state(batch)[:, :length]  # (B, n, d)
        cache = self.new_cache()
        for k in range(self.steps):
            tokens = _shift(ids, k + 1, length)  # (B, n) x_{i+k+1}
            positions = torch.arange(length, device=state.device) + k  # (n,)
            mask = additive_mask(unrolled_mask(length, k), batch_size=ids.shape[0], dtype=state.dtype,
                                 device=state.device)  # (B, 1, n, (k+1) n)
            state, logits = self.step(tokens, state, positions, mask, cache)  # (B, n, d), (B, n, V_d)
            yield state, logits

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        length = batch.input_ids.shape[1] - 1
        labels_mask = loss_mask(batch, self.loss_on)  # (B, T)
        d2t, t2d = self.vocab_maps()
        total = torch.zeros((), dtype=torch.float32, device=batch.input_ids.device)
        metrics: dict[str, float] = {}
        aligned = torch.ones_like(labels_mask[:, :length])  # (B, n) chains whose greedy tokens all matched so far
        for k, (state, logits) in enumerate(self.unroll(batch)):
            valid = _shift(labels_mask, k + 1, length, fill=False)  # (B, n) label position i + k + 1 is real
            top_ids = _shift(batch.topk_ids, k + 1, length)  # (B, n, K)
            top_logprobs = _shift(batch.topk_logprobs, k + 1, length, fill=float("-inf"))
            trained = valid & aligned if self.align else valid
            loss = self.ce_weight * soft_cross_entropy(logits, top_ids, top_logprobs, trained, t2d=t2d,
                                                       greedy=self.greedy)
            extra = self.extra_loss(state, batch, k + 1, valid)
            if extra is not None:
                loss = loss + extra
            total = total + self.step_decay ** k * loss
            metrics[f"acc_{k + 1}"] = greedy_accuracy(logits.detach(), top_ids, valid, d2t)[0]
            aligned = aligned & greedy_hits(logits.detach(), top_ids, d2t)
            metrics[f"chain_{k + 1}"] = float((aligned & valid).sum()) / max(int(valid.sum()), 1)
            metrics[f"loss_{k + 1}"] = float(loss.detach())
        metrics["loss"] = float(total.detach())
        return ObjectiveOutput(loss=total, metrics=metrics)


class EagleObjective(_UnrolledObjective):
    """Train an :class:`~specprim.drafters.EagleHead` (EAGLE-1 or EAGLE-3) from cached target features.

    Loss per step: soft cross-entropy of the head's draft logits against the target's top-K distribution
    (restricted to the draft vocabulary ``d2t``), weighted ``ce_weight``; EAGLE-1 adds a SmoothL1 regression of
    the predicted feature on the target's real feature at that position (weight ``feature_weight``), with the
    EAGLE-1 paper's weights (1.0 and 0.1) by default. ``steps > 1`` unrolls EAGLE-3's training-time test
    (default: 3 steps for EAGLE-3, 1 for EAGLE-1).
    """

    def __init__(self, head: EagleHead, *, steps: int | None = None, loss_on: LossOn = "all", greedy: bool = False,
                 step_decay: float = 0.8, feature_weight: float | None = None, ce_weight: float | None = None,
                 align: bool = False) -> None:
        version = head.config.version
        super().__init__(
            steps if steps is not None else (3 if version == 3 else 1), loss_on, greedy, step_decay,
            ce_weight=(0.1 if version == 1 else 1.0) if ce_weight is None else ce_weight, align=align,
        )
        self.module = head
        self.layers = _normalise_layers(head.config.feature_layers, head.config.target_num_layers)
        self.feature_weight = (1.0 if version == 1 else 0.0) if feature_weight is None else feature_weight
        if self.feature_weight and version != 1:
            raise ValueError("feature regression applies to EAGLE-1 heads (EAGLE-3 predicts fused features)")
        self._last_layer = head.config.target_num_layers  # EAGLE-1's feature: after the final norm
        full = head.config.draft_vocab_size == head.config.vocab_size
        self.register_buffer("_t2d", None if full else target_to_draft(head.d2t, head.config.vocab_size),
                             persistent=False)

    def initial_state(self, batch: FeatureBatch) -> torch.Tensor:
        return self.module.fuse([batch.feature(layer) for layer in self.layers])

    def new_cache(self) -> object:
        return self.module.new_cache()

    def step(self, tokens, state, positions, mask, cache):
        out = self.module(tokens, state, position_ids=positions, attention_mask=mask, cache=cache)
        return out.hidden, out.draft_logits

    def vocab_maps(self):
        return (None, None) if self._t2d is None else (self.module.d2t, self._t2d)

    def extra_loss(self, predicted, batch, offset, mask):
        if not self.feature_weight:
            return None
        real = _shift(batch.feature(self._last_layer), offset, predicted.shape[1]).to(predicted.dtype)  # (B, n, d)
        error = nn.functional.smooth_l1_loss(predicted, real, reduction="none").mean(-1)  # (B, n)
        weight = mask.to(error.dtype)
        return self.feature_weight * (error * weight).sum() / weight.sum().clamp(min=1.0)


class MTPObjective(_UnrolledObjective):
    """Train an :class:`~specprim.drafters.MTPHead` from cached target features (the last hidden state), chained
    over ``steps`` depths with the same lineage attention the drafter uses (default 3 steps)."""

    def __init__(self, head: MTPHead, *, steps: int = 3, loss_on: LossOn = "all", greedy: bool = False,
                 step_decay: float = 0.8, num_target_layers: int, align: bool = False) -> None:
        super().__init__(steps, loss_on, greedy, step_decay, align=align)
        self.module = head
        self.layers = (num_target_layers,)

    def initial_state(self, batch: FeatureBatch) -> torch.Tensor:
        return batch.feature(self.layers[0])

    def new_cache(self) -> object:
        return self.module.new_cache()

    def step(self, tokens, state, positions, mask, cache):
        states = self.module(state, tokens, position_ids=positions.expand(tokens.shape[0], -1),
                             attention_mask=mask, cache=cache)
        return states, self.module.logits(states)
