"""The benchmark's metrics schema: one row per (method, prompt, repeat) and one summary per method.

Definitions (see ``docs/bench.md``): ``tokens_per_s`` is new tokens / wall seconds of the whole generation
(prefill included); ``speedup`` is a ratio of tokens/s against the ``hf`` baseline, per row against the
baseline's row of the same prompt and repeat, per method as total tokens / total seconds of each;
``tau`` counts the bonus token, ``accepted_per_step`` does not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from specprim._stats import GenerationStats


def depth_counts(stats: GenerationStats) -> list[list[int]]:
    """Entry ``d - 1`` is ``[reached, accepted]``: steps whose tree reached depth ``d`` having accepted ``d - 1``
    tokens, and how many of those accepted the depth-``d`` token too (the counts behind EAGLE's alpha_d)."""
    counts = []
    for depth in range(1, max(stats.tree_depth, default=0) + 1):
        reached = [a for a, t in zip(stats.accepted, stats.tree_depth, strict=True) if t >= depth and a >= depth - 1]
        counts.append([len(reached), sum(a >= depth for a in reached)])
    return counts


def rates(counts: Sequence[Sequence[int]]) -> list[float | None]:
    """``accepted / reached`` per depth; ``None`` where no step reached that depth."""
    return [accepted / reached if reached else None for reached, accepted in counts]


def add_counts(all_counts: Sequence[Sequence[Sequence[int]]]) -> list[list[int]]:
    """Element-wise sum of per-depth ``[reached, accepted]`` lists of different lengths."""
    total: list[list[int]] = []
    for counts in all_counts:
        for depth, (reached, accepted) in enumerate(counts):
            if depth == len(total):
                total.append([0, 0])
            total[depth][0] += reached
            total[depth][1] += accepted
    return total


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptRow:
    """One method on one prompt (all its turns) in one repeat.

    Times are seconds. Step fields (``steps`` .. ``other_s``) are ``None`` for methods that do not report steps
    (the Hugging Face ones). ``target_forwards`` counts calls of the target's ``forward`` (prefill included).
    ``identical`` is ``None`` unless decoding is greedy; ``divergence`` is set when it is ``False``.
    """

    method: str
    dataset: str
    prompt_id: str
    prompt_index: int
    repeat: int
    turns: int
    prompt_tokens: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float | None
    steps: int | None
    accepted: int | None
    tau: float | None
    accepted_per_step: float | None
    acceptance_by_depth: list[float | None]
    depth_counts: list[list[int]]
    draft_s: float | None
    verify_s: float | None
    other_s: float | None
    target_forwards: int
    peak_memory_bytes: int | None
    identical: bool | None
    divergence: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def step_fields(stats: GenerationStats | None) -> dict[str, Any]:
    """The step fields of a :class:`PromptRow` from a (merged) record, or all ``None`` / empty without one."""
    if stats is None:
        return dict(steps=None, accepted=None, tau=None, accepted_per_step=None, acceptance_by_depth=[],
                    depth_counts=[], draft_s=None, verify_s=None, other_s=None)
    counts = depth_counts(stats)
    steps, accepted = stats.steps, sum(stats.accepted)
    return dict(
        steps=steps, accepted=accepted, tau=stats.tau if steps else None,
        accepted_per_step=accepted / steps if steps else None, acceptance_by_depth=rates(counts),
        depth_counts=counts, draft_s=stats.draft_s, verify_s=stats.verify_s, other_s=stats.other_s,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodSummary:
    """One method over every prompt and repeat of a run.

    ``tokens_per_s`` = total new tokens / total seconds; ``speedup`` = that over the ``hf`` baseline's;
    ``speedup_prompt_mean`` = arithmetic mean of the per-row speedups. ``tau`` = (accepted + steps) / steps
    over all steps; ``acceptance_by_depth`` from the summed per-depth counts; ``*_ms_per_step`` = total time /
    total steps. ``drafter_params`` / ``drafter_param_bytes``: parameters the method adds to the target (not
    shared with it). ``drafter_state_bytes``: the most bytes of state (draft KV cache, predicted features,
    datastore arrays) the method held after any of its generations, beyond those parameters and the target's
    storage; ``drafter_memory_bytes`` = ``drafter_param_bytes + drafter_state_bytes``, the drafter's memory
    overhead. ``peak_extra_bytes``: the largest peak memory of the method's generations minus the
    baseline's. ``identical``: every row equal to the baseline's output (greedy only), with counts of rows
    and of divergence kinds. ``predicted_tau`` / ``predicted_speedup``: the speedup model's prediction for the
    run's own trees (``bench --predict``, see :func:`specprim.bench._predict.predict_method`), else ``None``.
    """

    method: str
    dataset: str
    prompts: int
    repeats: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    speedup: float | None
    speedup_prompt_mean: float | None
    steps: int | None
    tau: float | None
    accepted_per_step: float | None
    acceptance_by_depth: list[float | None]
    draft_ms_per_step: float | None
    verify_ms_per_step: float | None
    other_ms_per_step: float | None
    target_forwards: int
    tokens_per_forward: float
    drafter_params: int
    drafter_param_bytes: int
    drafter_state_bytes: int
    drafter_memory_bytes: int
    peak_memory_bytes: int | None
    peak_extra_bytes: int | None
    identical: bool | None
    identical_rows: int | None
    rows: int
    divergences: dict[str, int]
    predicted_tau: float | None = None
    predicted_speedup: float | None = None

    @property
    def achieved_over_predicted(self) -> float | None:
        """Achieved speedup (over ``hf``) / the speedup model's prediction (over one plain forward step)."""
        if self.speedup is None or not self.predicted_speedup:
            return None
        return self.speedup / self.predicted_speedup

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(
    rows: Sequence[PromptRow], baseline_rows: Sequence[PromptRow], *, drafter_params: int, drafter_param_bytes: int,
    drafter_state_bytes: int = 0,
) -> MethodSummary:
    """Aggregate one method's ``rows`` (non-empty) against the baseline's rows of the same run."""
    first = rows[0]
    new_tokens, seconds = sum(r.new_tokens for r in rows), sum(r.seconds for r in rows)
    tokens_per_s = new_tokens / seconds if seconds > 0 else math.inf
    base_tokens, base_seconds = sum(r.new_tokens for r in baseline_rows), sum(r.seconds for r in baseline_rows)
    base_rate = base_tokens / base_seconds if base_seconds > 0 else math.nan
    speedups = [r.speedup for r in rows if r.speedup is not None]
    stepped = [r for r in rows if r.steps is not None]
    steps = sum(r.steps for r in stepped) if stepped else None
    accepted = sum(r.accepted for r in stepped) if stepped else None

    def per_step_ms(field: str) -> float | None:
        return 1e3 * sum(getattr(r, field) for r in stepped) / steps if steps else None

    greedy = [r.identical for r in rows if r.identical is not None]
    kinds: dict[str, int] = {}
    for row in rows:
        if row.divergence is not None:
            kinds[row.divergence["kind"]] = kinds.get(row.divergence["kind"], 0) + 1
    peaks = [r.peak_memory_bytes for r in rows if r.peak_memory_bytes is not None]
    base_peaks = [r.peak_memory_bytes for r in baseline_rows if r.peak_memory_bytes is not None]
    forwards = sum(r.target_forwards for r in rows)
    return MethodSummary(
        method=first.method, dataset=first.dataset, prompts=len({r.prompt_index for r in rows}),
        repeats=len({r.repeat for r in rows}), new_tokens=new_tokens, seconds=seconds, tokens_per_s=tokens_per_s,
        speedup=tokens_per_s / base_rate if baseline_rows else None,
        speedup_prompt_mean=sum(speedups) / len(speedups) if speedups else None,
        steps=steps, tau=(accepted + steps) / steps if steps else None,
        accepted_per_step=accepted / steps if steps else None,
        acceptance_by_depth=rates(add_counts([r.depth_counts for r in rows])),
        draft_ms_per_step=per_step_ms("draft_s"), verify_ms_per_step=per_step_ms("verify_s"),
        other_ms_per_step=per_step_ms("other_s"), target_forwards=forwards,
        tokens_per_forward=new_tokens / forwards if forwards else math.nan,
        drafter_params=drafter_params, drafter_param_bytes=drafter_param_bytes,
        drafter_state_bytes=drafter_state_bytes, drafter_memory_bytes=drafter_param_bytes + drafter_state_bytes,
        peak_memory_bytes=max(peaks) if peaks else None,
        peak_extra_bytes=max(peaks) - max(base_peaks) if peaks and base_peaks else None,
        identical=all(greedy) if greedy else None, identical_rows=sum(greedy) if greedy else None,
        rows=len(rows), divergences=kinds,
    )
