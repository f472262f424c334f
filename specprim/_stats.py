"""Per-step record of a speculative generation and the metrics derived from it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the command line imports this module before torch
    import torch

SiblingOutcome = tuple[int, int, int]
"""``(depth, children, accepted_rank)``: children of depth ``depth``, ``accepted_rank`` in ``[-1, children)``."""


def sibling_outcomes(parents: Sequence[int], path: Sequence[int]) -> list[SiblingOutcome]:
    """The sibling outcomes of one verified tree.

    Args:
        parents: the tree's parent list (``-1`` for children of the root, topological).
        path: the accepted node ids, root's child first (without ``-1`` padding).
    Returns:
        one ``(depth, children, accepted_rank)`` per node of ``[root] + path`` that has children.
    """
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    outcomes = []
    for depth, parent in enumerate([-1, *path], start=1):
        kids = children.get(parent)
        if not kids:
            break
        chosen = path[depth - 1] if depth - 1 < len(path) else None
        outcomes.append((depth, len(kids), kids.index(chosen) if chosen is not None else -1))
    return outcomes


@dataclasses.dataclass
class GenerationStats:
    """What happened at every step of :func:`specprim.speculative_generate`.

    Per-step lists: ``accepted`` draft tokens accepted (bonus excluded), ``tree_depth`` and ``tree_nodes`` of
    the verified tree, ``emitted`` tokens appended (accepted + bonus, after cutting at EOS or the budget).
    Times in seconds: ``draft_s`` (propose), ``verify_s`` (the target forward), ``other_s`` (acceptance,
    cache commit and bookkeeping). ``sibling_outcomes``: one ``(depth, children, accepted_rank)`` per node of every
    accepted path that had children (the root included; ``accepted_rank`` is ``-1`` when no child was accepted),
    the record :class:`specprim.speedup.RankAcceptance` estimates positional acceptance rates from;
    ``tree_parents``: every verified tree's parents list (for predicting each step's tau).
    """

    accepted: list[int] = dataclasses.field(default_factory=list)
    tree_depth: list[int] = dataclasses.field(default_factory=list)
    tree_nodes: list[int] = dataclasses.field(default_factory=list)
    emitted: list[int] = dataclasses.field(default_factory=list)
    sibling_outcomes: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    tree_parents: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0

    def record(
        self, *, accepted: int, tree_depth: int, tree_nodes: int, emitted: int,
        draft_s: float, verify_s: float, total_s: float, tree_parents: Sequence[int] = (), path: Sequence[int] = (),
    ) -> None:
        """Append one step; ``tree_parents`` and the accepted ``path`` (node ids) give its sibling outcomes."""
        self.accepted.append(accepted)
        self.tree_depth.append(tree_depth)
        self.tree_nodes.append(tree_nodes)
        self.emitted.append(emitted)
        self.tree_parents.append(tuple(tree_parents))
        self.sibling_outcomes.extend(sibling_outcomes(tree_parents, path))
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.other_s += total_s - draft_s - verify_s

    @property
    def steps(self) -> int:
        """Number of target forwards after the prefill."""
        return len(self.accepted)

    @property
    def new_tokens(self) -> int:
        return sum(self.emitted)

    @property
    def tau(self) -> float:
        """Mean accepted length per step, bonus token included (plain decoding has tau = 1.0)."""
        return (sum(self.accepted) + self.steps) / self.steps if self.steps else 0.0

    @property
    def acceptance_by_depth(self) -> list[float]:
        """Entry ``d - 1``: among steps whose tree reached depth ``d`` and that accepted ``d - 1`` tokens, the
        fraction that accepted the depth-``d`` token too (EAGLE's per-depth acceptance rate)."""
        rates = []
        for depth in range(1, max(self.tree_depth, default=0) + 1):
            reached = [a for a, t in zip(self.accepted, self.tree_depth, strict=True) if t >= depth and a >= depth - 1]
            rates.append(sum(a >= depth for a in reached) / len(reached) if reached else float("nan"))
        return rates

    @property
    def total_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    def summary(self) -> dict[str, float | int | list[float]]:
        return {
            "steps": self.steps, "new_tokens": self.new_tokens, "tau": self.tau,
            "acceptance_by_depth": self.acceptance_by_depth,
            "draft_s": self.draft_s, "verify_s": self.verify_s, "other_s": self.other_s,
        }


def merge_stats(parts: Sequence[GenerationStats]) -> GenerationStats:
    """One record for several generations (the turns of a conversation): lists concatenated, times added."""
    merged = GenerationStats()
    for part in parts:
        merged.accepted += part.accepted
        merged.tree_depth += part.tree_depth
        merged.tree_nodes += part.tree_nodes
        merged.emitted += part.emitted
        merged.sibling_outcomes += part.sibling_outcomes
        merged.tree_parents += part.tree_parents
        merged.draft_s += part.draft_s
        merged.verify_s += part.verify_s
        merged.other_s += part.other_s
    return merged


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
    """``sequences``: (B, T + n) long, the prompt followed by the generated tokens; ``stats``: per-step record."""

    sequences: torch.Tensor
    stats: GenerationStats
