"""The chain: the simplest tree shape, one child per node."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chain:
    """A chain of ``k`` draft tokens: ``parents = [-1, 0, 1, ..., k - 2]``."""

    k: int

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"Chain length k must be a positive int, got {self.k!r}")

    def parents(self, length: int | None = None) -> list[int]:
        """Parents list of the chain, cut to ``length`` nodes when given."""
        size = self.k if length is None else min(self.k, length)
        return list(range(-1, size - 1))
