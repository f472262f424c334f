"""How far a tau measured over a few prompts can be trusted: its standard error with prompts as the sampled unit.

tau over prompts is a ratio, ``(sum a_i + sum s_i) / sum s_i`` for ``a_i`` tokens accepted in ``s_i`` target
forwards on prompt ``i``. Its standard error is the ratio estimator's (delta method): with ``r = sum a / sum s``,
``sqrt(n / (n - 1) * sum (a_i - r s_i)^2) / sum s``. Two drafters measured on the same prompts are compared by the
paired difference, whose error is that of the per-prompt differences of the two linearised terms: the prompts'
shared difficulty cancels, so it is smaller than the two errors combined.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PromptCounts", "TauEstimate", "tau_difference", "tau_estimate"]


@dataclass(frozen=True)
class PromptCounts:
    """Per-prompt counts of one decoding run: ``accepted[i]`` drafted tokens accepted over ``steps[i]`` target
    forwards on prompt ``i``."""

    accepted: Sequence[int]
    steps: Sequence[int]

    def __post_init__(self) -> None:
        if len(self.accepted) != len(self.steps):
            raise ValueError(f"accepted and steps must have one count per prompt, got {len(self.accepted)} and "
                             f"{len(self.steps)}")
        if not self.steps or sum(self.steps) <= 0:
            raise ValueError("tau needs at least one prompt with at least one target forward")
        if min(self.steps) < 0 or min(self.accepted) < 0:
            raise ValueError("accepted and steps must be counts (>= 0)")


@dataclass(frozen=True)
class TauEstimate:
    """A tau (the bonus token included) and its standard error over prompts (``0.0`` for a single prompt)."""

    tau: float
    stderr: float


def _linearised(counts: PromptCounts) -> tuple[float, list[float]]:
    """``r = sum a / sum s`` and each prompt's term ``(a_i - r s_i) / sum s`` of the ratio's first-order expansion."""
    total = sum(counts.steps)
    ratio = sum(counts.accepted) / total
    return ratio, [(a - ratio * s) / total for a, s in zip(counts.accepted, counts.steps, strict=True)]


def _stderr(terms: Sequence[float]) -> float:
    n = len(terms)
    return math.sqrt(n / (n - 1) * sum(t * t for t in terms)) if n > 1 else 0.0


def tau_estimate(counts: PromptCounts) -> TauEstimate:
    """tau over the prompts of ``counts`` and its standard error."""
    ratio, terms = _linearised(counts)
    return TauEstimate(1.0 + ratio, _stderr(terms))


def tau_difference(first: PromptCounts, second: PromptCounts) -> TauEstimate:
    """tau of ``second`` minus tau of ``first``, measured on the same prompts in the same order, and the paired
    standard error of that difference."""
    if len(first.steps) != len(second.steps):
        raise ValueError(f"a paired difference needs the same prompts, got {len(first.steps)} and "
                         f"{len(second.steps)}")
    ratio_first, terms_first = _linearised(first)
    ratio_second, terms_second = _linearised(second)
    return TauEstimate(ratio_second - ratio_first,
                       _stderr([b - a for a, b in zip(terms_first, terms_second, strict=True)]))
