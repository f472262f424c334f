"""Choose the prompt-lookup length of a union (``eagle3+prompt-lookup``) for this machine by counterfactual replay.

The positional model of :mod:`specprim.speedup._model` has no place for lookup drafts (their acceptance depends on
the text, not on a depth and a sibling rank), so the lookup part is sized empirically: the target's greedy
continuations are recorded once, then greedy decoding with ``union(method, prompt_lookup(n, 1))`` is replayed for
every candidate length ``n`` (``n = 0``: the method alone). A replay gives the exact accepted lengths and tree sizes
of a live greedy run and measures the real drafting time; the cost model adds what verification and the rest of
the step would cost for each step's tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specprim._stats import GenerationStats

if TYPE_CHECKING:
    import torch

    from specprim.speedup._costs import CostModel

LOOKUP_LENGTHS = (0, 2, 3, 4, 6, 8)
"""Prompt-lookup lengths tried by default (0: no lookup part)."""


@dataclasses.dataclass(frozen=True)
class LookupRow:
    """One candidate's replay and prediction.

    Attributes:
        num_tokens: the lookup part's draft length (``0``: the method alone).
        tau: tokens per step, bonus included, exactly as a live greedy run would accept them.
        nodes: mean draft nodes per step (the merged trie).
        draft_s: mean measured drafting time per step.
        step_s: predicted seconds per step: ``draft_s`` + the cost model's verification and other costs.
        speedup: predicted tokens per second over plain decoding through the same forward.
    """

    num_tokens: int
    tau: float
    nodes: float
    draft_s: float
    step_s: float
    speedup: float


@dataclasses.dataclass(frozen=True)
class LookupChoice:
    """Every candidate's :class:`LookupRow`, in the order tried, and the fastest one (``best``)."""

    rows: tuple[LookupRow, ...]

    @property
    def best(self) -> LookupRow:
        return max(self.rows, key=lambda row: row.speedup)

    def to_json(self) -> list[dict[str, float]]:
        return [dataclasses.asdict(row) for row in self.rows]


def predict_replayed(stats: GenerationStats, costs: CostModel) -> tuple[float, float]:
    """``(step_s, speedup)`` of the replayed steps in ``stats``: their measured drafting time plus the cost model's
    verification and other costs for each step's tree size, against ``costs.step_s`` per plain token."""
    if not stats.steps:
        raise ValueError("the replay took no step")
    seconds = stats.draft_s + sum(costs.step(nodes, 0) for nodes in stats.tree_nodes)  # depth 0: no modelled draft
    return seconds / stats.steps, stats.new_tokens * costs.step_s / seconds


def tune_lookup(
    target: torch.nn.Module,
    method: object,
    prompts: Sequence[torch.Tensor],
    costs: CostModel,
    *,
    lengths: Sequence[int] = LOOKUP_LENGTHS,
    max_new_tokens: int = 128,
    eos_token_id: int | None = None,
) -> LookupChoice:
    """Replay greedy decoding of ``prompts`` (each (1, T)) with ``method`` joined by prompt lookup of every length
    in ``lengths`` (one match each; 0 means ``method`` alone) and predict each one's speedup with ``costs``.

    ``method`` is a :class:`specprim.presets.Method` whose drafter drafts deterministically (e.g. a tuned EAGLE-3
    tree). The target's greedy continuations (``max_new_tokens`` each) are recorded once, with the hidden states
    the drafter reads. Raises ``ValueError`` for no prompt, no length, or a negative length.
    """
    from specprim._stats import merge_stats
    from specprim.drafters import UnionDrafter
    from specprim.presets import prompt_lookup
    from specprim.speedup._replay import greedy_continuation, record_greedy, replay

    if not prompts:
        raise ValueError("tune_lookup needs at least one prompt")
    if not lengths or any(not isinstance(n, int) or n < 0 for n in lengths):
        raise ValueError(f"lengths must be non-negative ints, got {list(lengths)!r}")
    layers = tuple(getattr(method.drafter, "feature_layers", ()))
    recordings = [
        record_greedy(target, greedy_continuation(target, ids, max_new_tokens), ids.shape[1], layers)
        for ids in prompts
    ]
    rows = []
    for n in lengths:
        drafter = method.drafter if n == 0 else UnionDrafter(method.drafter,
                                                             prompt_lookup(num_tokens=n, max_matches=1).drafter)
        stats = merge_stats([replay(r, drafter, eos_token_id=eos_token_id).stats for r in recordings])
        step_s, speedup = predict_replayed(stats, costs)
        rows.append(LookupRow(num_tokens=n, tau=stats.tau, nodes=sum(stats.tree_nodes) / stats.steps,
                              draft_s=stats.draft_s / stats.steps, step_s=step_s, speedup=speedup))
    return LookupChoice(rows=tuple(rows))
