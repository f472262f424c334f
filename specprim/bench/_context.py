"""Tau by context length: a run's per-prompt rows grouped by how long the prompt was.

Acceptance can fall as the context grows (a draft head trained on short conversations sees positions and
attention spans it never saw); grouping the rows of one run by prompt length shows it without another run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specprim.bench._metrics import PromptRow

CONTEXT_BUCKETS = (512, 2048, 4096, 8192)
"""Upper bounds (exclusive) of the prompt-length buckets; longer prompts fall in one last open bucket."""


def bucket_label(tokens: int, bounds: Sequence[int] = CONTEXT_BUCKETS) -> str:
    """The bucket of a ``tokens``-token prompt: ``"<512"``, ``"512-2048"``, ..., ``">=8192"``."""
    lower = 0
    for upper in bounds:
        if tokens < upper:
            return f"<{upper}" if lower == 0 else f"{lower}-{upper}"
        lower = upper
    return f">={lower}"


def tau_by_context(rows: Sequence[PromptRow], bounds: Sequence[int] = CONTEXT_BUCKETS) -> list[dict[str, Any]]:
    """One entry per (method, bucket) that has rows with a step record, methods in first-seen order and buckets
    from short to long: ``{"method", "context", "rows", "prompt_tokens_mean", "steps", "tau"}``, where ``tau`` =
    (accepted + steps) / steps over the bucket's rows (as the run's summary computes it) and ``context`` is the
    bucket of each row's ``prompt_tokens`` (the first turn's input length)."""
    labels = [bucket_label(b - 1, bounds) for b in bounds] + [bucket_label(bounds[-1], bounds)]
    groups: dict[str, dict[str, list[PromptRow]]] = {}
    for row in rows:
        if row.steps:
            groups.setdefault(row.method, {}).setdefault(bucket_label(row.prompt_tokens, bounds), []).append(row)
    entries = []
    for method, buckets in groups.items():
        for label in labels:
            members = buckets.get(label)
            if not members:
                continue
            steps = sum(r.steps for r in members)
            accepted = sum(r.accepted for r in members)
            entries.append({
                "method": method, "context": label, "rows": len(members),
                "prompt_tokens_mean": sum(r.prompt_tokens for r in members) / len(members),
                "steps": steps, "tau": (accepted + steps) / steps,
            })
    return entries


def context_table(entries: Sequence[dict[str, Any]]) -> str:
    """:func:`tau_by_context` as GitHub markdown: one row per method and bucket."""
    lines = ["| method | prompt tokens | rows | mean prompt tokens | steps | tau |", "|---|---|---|---|---|---|"]
    lines += [f"| {e['method']} | {e['context']} | {e['rows']} | {e['prompt_tokens_mean']:.0f} | {e['steps']} | "
              f"{e['tau']:.2f} |" for e in entries]
    return "\n".join(lines)
