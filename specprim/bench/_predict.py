"""The speedup model's prediction for a benchmarked method, to print next to what it achieved."""

from __future__ import annotations

import dataclasses

from specprim._stats import GenerationStats
from specprim.speedup import CostModel, RankAcceptance, expected_tau


@dataclasses.dataclass(frozen=True)
class MethodPrediction:
    """``tau``: the mean over steps of each verified tree's expected tau under the method's own positional
    acceptance rates; ``speedup``: ``tau * step_s / (verify(N) + draft + other)`` per step, with verification from
    the calibrated cost model and drafting and other time as measured in the run; over one plain step through the
    same forward (``step_s``), the prefill excluded."""

    tau: float
    speedup: float


def predict_method(stats: GenerationStats, costs: CostModel) -> MethodPrediction | None:
    """The prediction for one method's merged record, or ``None`` without steps."""
    if not stats.steps:
        return None
    acceptance = RankAcceptance.from_outcomes(stats.sibling_outcomes)
    tau = sum(expected_tau(parents, acceptance) for parents in stats.tree_parents) / stats.steps
    verify_s = sum(costs.verify(len(parents)) for parents in stats.tree_parents) / stats.steps
    step_s = verify_s + (stats.draft_s + stats.other_s) / stats.steps
    return MethodPrediction(tau=tau, speedup=tau * costs.step_s / step_s)
