"""A campaign's scaling curve: held-out top-1 by draft depth against tokens trained, from its ``eval.jsonl``, and the
heads' tau in decoding where ``specprim campaign tau`` measured it (``tau.jsonl``), as a markdown table and a PNG
(``specprim campaign curve RUN_DIR [RUN_DIR ...]``; several runs share one chart)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specprim._pyplot import pyplot
from specprim.train._run_files import COOLED, EVAL_NAME, TAU_NAME, finished_cooldowns, read_jsonl


def scaling_rows(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One row per evaluation in ``RUN_DIR/eval.jsonl`` (the initial head first), in order of tokens trained:
    ``trained_tokens``, ``data_tokens``, ``acc`` (top-1 by depth), ``chain_tau`` (``1 + sum of chain_k``: the mean
    accepted length of a greedy chain as deep as the head was evaluated, teacher-forced), ``tau`` (decoding
    setting -> tau of the head at those tokens, from ``RUN_DIR/tau.jsonl``; empty where none was measured) and
    ``tau_stderr`` (setting -> tau's standard error over prompts, where the row recorded one). Raises
    ``ValueError`` when the run has no evaluation yet."""
    path = Path(run_dir) / EVAL_NAME
    records = read_jsonl(path)
    if not records:
        raise ValueError(f"no held-out evaluation in {path} yet (the campaign writes one per training segment)")
    taus = _measured_taus(run_dir)
    return [{"segment": record["segment"], "trained_tokens": record["trained_tokens"],
             "data_tokens": record["data_tokens"], **_accuracies(record),
             **_tau_fields(taus.get(("", record["trained_tokens"]), {}))}
            for record in sorted(records, key=lambda r: (r["trained_tokens"], r["segment"]))]


def cooldown_rows(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """One row per finished cool-down of the run (``specprim campaign cooldown``): ``name``, ``from_tokens`` (where
    it branched), ``decay_steps``, ``trained_tokens``, ``acc``, ``chain_tau``, ``tau`` and ``tau_stderr`` as in
    :func:`scaling_rows`."""
    taus = _measured_taus(run_dir)
    return [{"name": record["name"], "from_tokens": record["from_tokens"], "decay_steps": record["decay_steps"],
             "trained_tokens": record["trained_tokens"], **_accuracies(record),
             **_tau_fields(taus.get((record["name"], record["trained_tokens"]), {}))}
            for record in finished_cooldowns(run_dir)]


def _accuracies(record: Mapping[str, Any]) -> dict[str, Any]:
    """``acc`` (held-out top-1 by depth) and ``chain_tau`` of an evaluation record."""
    depths = sorted(int(key.split("_")[1]) for key in record if key.startswith("acc_"))
    return {"acc": [record[f"acc_{k}"] for k in depths], "chain_tau": 1 + sum(record[f"chain_{k}"] for k in depths)}


def _measured_taus(run_dir: str | os.PathLike[str]) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    """(cool-down name, or ``""`` for the campaign's own heads; tokens trained) -> decoding setting -> its
    ``tau.jsonl`` row."""
    taus: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for measured in read_jsonl(Path(run_dir) / TAU_NAME):
        cooled = measured["head"].removeprefix(COOLED) if measured["head"].startswith(COOLED) else ""
        taus.setdefault((cooled, measured["trained_tokens"]), {})[tau_label(measured)] = measured
    return taus


def _tau_fields(measured: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """``tau`` and ``tau_stderr`` (rows measured before standard errors were recorded have none) by setting."""
    return {"tau": {setting: row["tau"] for setting, row in measured.items()},
            "tau_stderr": {setting: row["stderr"] for setting, row in measured.items() if "stderr" in row}}


def tau_label(measured: Mapping[str, Any]) -> str:
    """The decoding setting of a ``tau.jsonl`` row, as a column heading: ``"mt-bench tau, T=0, chain:4"``."""
    return f"{Path(measured['prompts']).name} tau, T={measured['temperature']:g}, {measured['tree']}"


def scaling_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    return _table(rows, ["tokens trained", "distinct data tokens"],
                  lambda row: [f"{row['trained_tokens']:,}", f"{row['data_tokens']:,}"])


def cooldown_table(rows: list[dict[str, Any]]) -> str:
    """Cool-down rows as a markdown table."""
    return _table(rows, ["cool-down", "branched at (tokens)", "decay steps", "tokens trained"],
                  lambda row: [row["name"], f"{row['from_tokens']:,}", str(row["decay_steps"]),
                               f"{row['trained_tokens']:,}"])


def _table(rows: list[dict[str, Any]], lead: list[str], lead_cells: Any) -> str:
    """A markdown table: the ``lead`` columns (``lead_cells(row)``), then top-1 by depth, the teacher-forced chain
    tau and a column per decoding setting measured for any row."""
    depths = max(len(row["acc"]) for row in rows)
    settings = _tau_settings(rows)
    header = [*lead, *[f"top-1 depth {k}" for k in range(1, depths + 1)], "greedy chain tau (teacher-forced)",
              *settings]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [*lead_cells(row), *[f"{a:.3f}" for a in row["acc"]], f"{row['chain_tau']:.2f}",
                 *[_tau_cell(row, s) for s in settings]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _tau_cell(row: Mapping[str, Any], setting: str) -> str:
    """``1.90 +- 0.05`` (tau and its standard error), ``1.90`` without one, empty where not measured."""
    if setting not in row.get("tau", {}):
        return ""
    stderr = row.get("tau_stderr", {}).get(setting)
    return f"{row['tau'][setting]:.2f}" + ("" if stderr is None else f" +- {stderr:.2f}")


def plot_scaling(runs: Mapping[str, list[dict[str, Any]]], path: str | os.PathLike[str], title: str = "",
                 cooled: Mapping[str, list[dict[str, Any]]] | None = None) -> Path:
    """A PNG of held-out top-1 by depth against tokens trained: one colour per run (``runs``: label -> its rows),
    one line style per depth, so several campaigns (other data, a larger head) compare on one chart; each run's
    cool-downs (``cooled``: label -> :func:`cooldown_rows`) as stars in its colour; beside it, where any was
    measured, the heads' tau in decoding (one line style per setting)."""
    plt = pyplot()
    several = len(runs) > 1
    cooled = cooled or {}
    settings = list(dict.fromkeys(s for rows in [*runs.values(), *cooled.values()] for s in _tau_settings(rows)))
    width = 9.0 if several else 5.5
    fig, axes = plt.subplots(1, 2 if settings else 1, figsize=(width + (5.0 if settings else 0.0), 4.2),
                             squeeze=False)
    ax = axes[0][0]
    styles = ("-", "--", ":", "-.")
    for r, (label, rows) in enumerate(runs.items()):
        colour = f"C{r % 10}"
        tokens = [row["trained_tokens"] for row in rows]
        for k in range(max(len(row["acc"]) for row in rows)):
            points = [(t, row["acc"][k]) for t, row in zip(tokens, rows, strict=True) if k < len(row["acc"])]
            ax.plot([t for t, _ in points], [a for _, a in points], marker="o", markersize=3, color=colour,
                    linestyle=styles[k % len(styles)], label=f"{label}, depth {k + 1}" if several
                    else f"depth {k + 1}")
        _plot_cooled(ax, cooled.get(label, []), colour, lambda row: row["acc"],
                     f"{label}, cooled (each depth)" if several else "cooled (each depth)")
    ax.set_xscale("symlog", linthresh=1e5)
    ax.set_xlabel("tokens trained")
    ax.set_ylabel("held-out top-1 agreement with the target")
    if several:  # runs that differ by a point or two: the axis spans their values, not [0, 1]
        values = [a for rows in [*runs.values(), *cooled.values()] for row in rows for a in row["acc"]]
        ax.set_ylim(max(0.0, min(values) - 0.02), min(1.0, max(values) + 0.02))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=8)
    if settings:
        _plot_tau(axes[0][1], runs, settings, cooled)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _tau_settings(rows: list[dict[str, Any]]) -> list[str]:
    """The decoding settings measured for any of ``rows``, in order of first appearance."""
    return list(dict.fromkeys(setting for row in rows for setting in row.get("tau", {})))


def _plot_cooled(ax: Any, rows: list[dict[str, Any]], colour: str, values: Any, label: str) -> None:
    """Stars at each cool-down's tokens trained, one per value ``values(row)`` gives."""
    points = [(row["trained_tokens"], value) for row in rows for value in values(row)]
    if points:
        ax.scatter([t for t, _ in points], [v for _, v in points], marker="*", s=60, color=colour, zorder=3,
                   label=label)


def _plot_tau(ax: Any, runs: Mapping[str, list[dict[str, Any]]], settings: list[str],
              cooled: Mapping[str, list[dict[str, Any]]]) -> None:
    """tau against tokens trained: one colour per run, one line style per decoding setting; cool-downs as stars."""
    styles = ("-", "--", ":", "-.")
    for r, (label, rows) in enumerate(runs.items()):
        _plot_cooled(ax, cooled.get(label, []), f"C{r % 10}", lambda row: list(row["tau"].values()),
                     f"{label}, cooled (each setting)" if len(runs) > 1 else "cooled (each setting)")
        for k, setting in enumerate(settings):
            points = [(row["trained_tokens"], row["tau"][setting]) for row in rows if setting in row.get("tau", {})]
            if points:
                ax.plot([t for t, _ in points], [tau for _, tau in points], marker="s", markersize=3,
                        color=f"C{r % 10}", linestyle=styles[k % len(styles)],
                        label=f"{label}, {setting}" if len(runs) > 1 else setting)
    ax.set_xscale("symlog", linthresh=1e5)
    ax.set_xlabel("tokens trained")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
