"""What a drafter's trees accept, by depth and sibling rank: the acceptance half of the speedup model.

A tree's nodes are ranked among their siblings in node order (rank 0 first): for :class:`~specprim.trees.
DynamicTree`, :class:`~specprim.trees.StaticTree` and :class:`~specprim.trees.Chain` that is the draft's own
order (most likely first). At every node of the accepted path that has children (the root included), one
*sibling outcome* is recorded: the depth of the children, how many there were, and the rank of the accepted
child (``-1`` when none was). From those, :class:`RankAcceptance` estimates Sequoia's positional acceptance
rates ``r[d][k]``: the probability that the rank-``k`` child at depth ``d`` is accepted given that its parent was
and that the children ranked before it were not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from specprim._stats import SiblingOutcome


def sibling_ranks(parents: Sequence[int]) -> list[int]:
    """Rank of every node among its siblings, in node order (``parents`` topological)."""
    seen: dict[int, int] = {}
    ranks = []
    for parent in parents:
        ranks.append(seen.get(parent, 0))
        seen[parent] = ranks[-1] + 1
    return ranks


@dataclasses.dataclass(frozen=True)
class RankAcceptance:
    """Positional acceptance rates estimated from sibling outcomes.

    Attributes:
        trials: ``trials[d - 1][k]``: times a rank-``k`` child of depth ``d`` was tried (its parent accepted, every
            earlier sibling rejected).
        accepted: ``accepted[d - 1][k]``: times it was then accepted.
        min_trials: below this many trials a ``(depth, rank)`` rate falls back to the rate of that rank pooled
            over all depths (and to 0 for a rank never tried).
    """

    trials: tuple[tuple[int, ...], ...]
    accepted: tuple[tuple[int, ...], ...]
    min_trials: int = 20

    @classmethod
    def from_outcomes(cls, outcomes: Iterable[SiblingOutcome], min_trials: int = 20) -> RankAcceptance:
        """Count trials and acceptances per (depth, rank); raises ``ValueError`` on an impossible outcome."""
        trials: list[list[int]] = []
        accepted: list[list[int]] = []
        for depth, children, rank in outcomes:
            if depth < 1 or children < 1 or not -1 <= rank < children:
                raise ValueError(f"invalid sibling outcome {(depth, children, rank)}")
            while len(trials) < depth:
                trials.append([])
                accepted.append([])
            tried = children if rank == -1 else rank + 1
            row_t, row_a = trials[depth - 1], accepted[depth - 1]
            row_t.extend([0] * (children - len(row_t)))
            row_a.extend([0] * (children - len(row_a)))
            for k in range(tried):
                row_t[k] += 1
            if rank >= 0:
                row_a[rank] += 1
        return cls(tuple(map(tuple, trials)), tuple(map(tuple, accepted)), min_trials)

    @property
    def max_depth(self) -> int:
        return len(self.trials)

    def rate(self, depth: int, rank: int) -> float:
        """``r[depth][rank]``: probability of acceptance given the parent accepted and earlier siblings rejected."""
        if depth <= self.max_depth and rank < len(self.trials[depth - 1]):
            tried = self.trials[depth - 1][rank]
            if tried >= self.min_trials:
                return self.accepted[depth - 1][rank] / tried
        pooled_t = sum(row[rank] for row in self.trials if rank < len(row))
        pooled_a = sum(row[rank] for row in self.accepted if rank < len(row))
        return pooled_a / pooled_t if pooled_t else 0.0

    def child_probability(self, depth: int, rank: int) -> float:
        """Probability that the rank-``rank`` child at ``depth`` is the accepted one, given its parent is:
        ``r[d][k] * prod_{j < k} (1 - r[d][j])`` (siblings are mutually exclusive)."""
        probability = self.rate(depth, rank)
        for earlier in range(rank):
            probability *= 1.0 - self.rate(depth, earlier)
        return probability

    def to_json(self) -> dict[str, object]:
        return {"trials": [list(r) for r in self.trials], "accepted": [list(r) for r in self.accepted],
                "min_trials": self.min_trials}
