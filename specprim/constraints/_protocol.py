"""The two roles of constrained decoding: a constraint, and its state during one generation."""

from __future__ import annotations

from typing import Protocol

import torch

from specprim._types import DraftTree


class ConstraintState(Protocol):
    """Where one generation stands in its constraint (e.g. a grammar matcher after the committed tokens)."""

    def allowed(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
        """For a one-row ``tree`` rooted at the committed tokens: ``(valid, masks)``.

        ``valid`` (N,) bool: node ``i`` and all its ancestors are allowed where they stand. ``masks`` (N + 1, V)
        bool: row 0 the tokens allowed after the root, row ``i + 1`` those allowed after node ``i`` (rows of
        invalid nodes are ignored). The state is left as it was."""
        ...

    def advance(self, tokens: list[int]) -> int:
        """Commit ``tokens`` (each allowed where it stands); return how many of them count: all of them, or up to
        and including the one that completes the constraint (the rest are dropped)."""
        ...

    @property
    def finished(self) -> bool:
        """Whether the constraint is complete: nothing more may be generated."""
        ...


class Constraint(Protocol):
    """Something that restricts which tokens the target may emit; ``begin()`` starts one generation."""

    def begin(self) -> ConstraintState: ...
