"""What the loop hands a drafter, and what a drafter must do."""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import torch

from specprim._types import DraftTree, Verdict
from specprim.sampling import SamplingConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftRequest:
    """Everything a drafter may use to propose one tree.

    Attributes:
        input_ids: (B, T) long, every committed token; the last one is the root.
        sampling: the transforms the target uses; a drafter that samples applies the same ones to its logits.
        vocab_size: the target's ``V``; ``q`` must have this last dimension and tokens must be below it.
        max_depth: draft no deeper than this (deeper nodes could never be emitted).
        generator: the only source of randomness a drafter may use.
    """

    input_ids: torch.Tensor
    sampling: SamplingConfig
    vocab_size: int
    max_depth: int
    generator: torch.Generator | None = None


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft trees and keeps its own state (its cache, index, budgets).

    The q-contract: ``propose`` returns the ``q`` its tokens were actually drawn from under its declared
    ``sampling`` scheme; a drafter that chooses tokens without randomness declares ``"deterministic"``.
    """

    def propose(self, request: DraftRequest) -> DraftTree:
        """Return a tree rooted at ``request.input_ids[:, -1]`` with depth ``<= request.max_depth``."""
        ...

    def observe(self, verdict: Verdict) -> None:
        """Learn what the target accepted (called once after every ``propose``)."""
        ...
