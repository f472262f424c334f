"""The summary of a run as a GitHub markdown table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specprim.bench._metrics import MethodSummary

COLUMNS = (
    "method", "tau", "accepted/step", "tok/s", "speedup", "tok/forward", "draft ms/step", "verify ms/step",
    "other ms/step", "identical", "extra params", "peak mem vs hf",
)
PREDICTION_COLUMNS = ("predicted tau", "predicted speedup", "achieved / predicted")


def _num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def _identical(summary: MethodSummary) -> str:
    if summary.identical is None:
        return "—"
    if summary.identical:
        return "yes"
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(summary.divergences.items()))
    return f"no ({summary.identical_rows}/{summary.rows}; {kinds})"


def _megabytes(value: int | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value / 2**20:+.1f} MB" if signed else f"{value / 2**20:.1f} MB"


def _count(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def _params(summary: MethodSummary) -> str:
    if not summary.drafter_params:
        return "0"
    return f"{_count(summary.drafter_params)} ({_megabytes(summary.drafter_param_bytes)})"


def _cells(s: MethodSummary) -> list[str]:
    return [
        s.method, _num(s.tau), _num(s.accepted_per_step), _num(s.tokens_per_s, 1), _num(s.speedup, 2, "x"),
        _num(s.tokens_per_forward), _num(s.draft_ms_per_step, 1), _num(s.verify_ms_per_step, 1),
        _num(s.other_ms_per_step, 1), _identical(s), _params(s), _megabytes(s.peak_extra_bytes, signed=True),
    ]


def _prediction_cells(s: MethodSummary) -> list[str]:
    return [_num(s.predicted_tau), _num(s.predicted_speedup, 2, "x"), _num(s.achieved_over_predicted)]


def heading(meta: Mapping[str, Any]) -> str:
    """One line naming the setting: target, dtype, dataset, prompts x repeats, budget, temperature, machine."""
    s = meta.get("settings", {})
    hw = meta.get("hardware", {})
    gpus = ", ".join(hw.get("gpus") or []) or f"{hw.get('cpu', '?')}, {hw.get('torch_threads', '?')} threads"
    weights = (f", {s['quantize']} weights" if s.get("quantize") else "") + (", packed" if s.get("pack") else "")
    return (f"target {s.get('target')} ({s.get('dtype')}{weights}) | dataset {s.get('dataset')}, "
            f"{s.get('num_prompts')} prompts x {s.get('repeats')} repeats | max new tokens {s.get('max_new_tokens')} | "
            f"temperature {s.get('temperature')} | {gpus}")


def markdown_table(summaries: Sequence[MethodSummary], meta: Mapping[str, Any] | None = None) -> str:
    """A heading line (when ``meta`` is given) and one table row per method; ``—`` marks what does not apply
    (no step record for Hugging Face methods, no ``identical`` under sampling)."""
    lines = []
    if meta:
        lines += [heading(meta), ""]
    predicted = any(s.predicted_speedup is not None for s in summaries)
    columns = COLUMNS + PREDICTION_COLUMNS if predicted else COLUMNS
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(_cells(s) + (_prediction_cells(s) if predicted else [])) + " |" for s in summaries]
    return "\n".join(lines)


def _changes(cell: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    diff = [f"{key}={value}" for key, value in cell.items() if base.get(key) != value]
    return ", ".join(diff) or "(base)"


def grid_table(records: Sequence[Mapping[str, Any]]) -> str:
    """One row per grid cell: what it changes against the first (base) cell, then its main metrics."""
    if not records:
        return "(empty grid)"
    base = records[0]["cell"]
    lines = ["| cell | changes | mode | tau | accepted/step | speedup | draft ms/step | identical |",
             "|---|---|---|---|---|---|---|---|"]
    for record in records:
        result = record["result"]
        measured = result.get("summary") or result.get("replay") or {}
        identical = measured.get("identical")
        lines.append("| " + " | ".join([
            record["key"], _changes(record["cell"], base), record["cell"].get("mode", "?"),
            _num(measured.get("tau")), _num(measured.get("accepted_per_step")),
            _num(measured.get("speedup"), 2, "x"), _num(measured.get("draft_ms_per_step"), 1),
            "—" if identical is None else ("yes" if identical else "no"),
        ]) + " |")
    return "\n".join(lines)
