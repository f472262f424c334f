"""What every training objective is and shares: the :class:`Objective` protocol, its :class:`ObjectiveOutput`, the
loss mask and the label shift.

An objective is an ``nn.Module`` whose ``forward(batch)`` returns an :class:`ObjectiveOutput`; the trainer
(``specprim.train.train``) optimises its parameters, which are exactly the draft module's. Target modules a head
uses by reference (embeddings, LM head) are not parameters of the objective and stay frozen. Objectives share code
through the functions here and in :mod:`specprim.train._unrolled`, not through a base class.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Literal, Protocol

import torch
from torch import nn

from specprim.train._features import FeatureBatch

__all__ = ["LossOn", "Objective", "ObjectiveOutput", "check_loss_on", "loss_mask", "shift"]

LossOn = Literal["all", "assistant"]


@dataclasses.dataclass(frozen=True)
class ObjectiveOutput:
    """``loss``: scalar to minimise; ``metrics``: floats for the log (``acc_1`` .. ``acc_K``: teacher-forced
    agreement of the draft's argmax with the target's greedy token at depth ``k``)."""

    loss: torch.Tensor
    metrics: dict[str, float]


class Objective(Protocol):
    """What :func:`specprim.train.train` optimises: an ``nn.Module`` whose ``forward(batch)`` gives the loss and
    metrics of one batch. ``module`` is the draft module trained and saved (``save_pretrained``); ``layers`` the
    cached target features it needs (``output_hidden_states`` indices, non-negative)."""

    module: nn.Module
    layers: tuple[int, ...]

    def __call__(self, batch: FeatureBatch) -> ObjectiveOutput: ...

    def forward(self, batch: FeatureBatch) -> ObjectiveOutput:
        """The loss and metrics of one batch."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the draft module (with its own ``save_pretrained``)."""
        ...


def check_loss_on(loss_on: str) -> None:
    """``ValueError`` unless ``loss_on`` is ``"all"`` or ``"assistant"``."""
    if loss_on not in ("all", "assistant"):
        raise ValueError(f"loss_on must be 'all' or 'assistant', got {loss_on!r}")


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


def shift(x: torch.Tensor, offset: int, length: int, fill: float | bool = 0) -> torch.Tensor:
    """``x[:, offset : offset + length]`` along dim 1, padded with ``fill`` past the end."""
    out = x.new_full((x.shape[0], length, *x.shape[2:]), fill)
    piece = x[:, offset: offset + length]
    out[:, : piece.shape[1]] = piece
    return out
