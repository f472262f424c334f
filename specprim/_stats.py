"""Per-step record of a speculative generation and the metrics derived from it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass
class GenerationStats:
    """What happened at every step of :func:`specprim.speculative_generate`.

    Per-step lists: ``accepted`` draft tokens accepted (bonus excluded), ``tree_depth`` and ``tree_nodes`` of
    the verified tree, ``emitted`` tokens appended (accepted + bonus, after cutting at EOS or the budget).
    Times in seconds: ``draft_s`` (propose), ``verify_s`` (the target forward), ``other_s`` (acceptance,
    cache commit and bookkeeping). ``sibling_outcomes``: one ``(depth, children, accepted_rank)`` per node of every
    accepted path that had children (the root included; ``accepted_rank`` is ``-1`` when no child was accepted),
    the record :class:`specprim.speedup.RankAcceptance` estimates positional acceptance rates from.
    """

    accepted: list[int] = dataclasses.field(default_factory=list)
    tree_depth: list[int] = dataclasses.field(default_factory=list)
    tree_nodes: list[int] = dataclasses.field(default_factory=list)
    emitted: list[int] = dataclasses.field(default_factory=list)
    sibling_outcomes: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0

    def record(
        self, *, accepted: int, tree_depth: int, tree_nodes: int, emitted: int,
        draft_s: float, verify_s: float, total_s: float, sibling_outcomes: Sequence[tuple[int, int, int]] = (),
    ) -> None:
        self.accepted.append(accepted)
        self.tree_depth.append(tree_depth)
        self.tree_nodes.append(tree_nodes)
        self.emitted.append(emitted)
        self.sibling_outcomes.extend(sibling_outcomes)
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
