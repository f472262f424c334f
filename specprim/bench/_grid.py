"""Ablation grids: a base configuration and axes varied one at a time, run resumably with a progress bar.

A grid is a TOML file (or a Python list of :class:`GridCell`)::

    [base]                       # every GridCell field; method is required
    target = "smollm2-135m-instruct"
    dataset = "mt-bench"
    num_prompts = 10
    max_new_tokens = 128
    method = "prompt-lookup"
    mode = "replay"              # "live": timed against hf; "replay": counterfactual replay, no target forwards

    [vary]                       # each axis swaps one field of the base, the others stay
    num_draft = [2, 4, 8, 16]
    method = ["prompt-lookup", "leviathan"]

Results are appended to a JSONL file, one line per finished cell keyed by the hash of its configuration, so a
rerun skips finished cells and an interrupted run loses at most the cell in progress.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specprim.bench._env import environment
from specprim.bench._results import finite


@dataclasses.dataclass(frozen=True, kw_only=True)
class GridCell:
    """One configuration of a grid: the arguments of :func:`specprim.bench.run` for one method, plus ``mode``.

    ``mode`` is ``"live"`` (timed against ``hf``) or ``"replay"`` (greedy only: tau and acceptance from a
    counterfactual replay of recorded target choices, draft time only). :attr:`key` identifies the cell.
    """

    method: str
    target: str = "smollm2-135m-instruct"
    dataset: str | None = None
    prompts: str | None = None
    num_prompts: int | None = None
    max_new_tokens: int = 128
    dtype: str = "float32"
    temperature: float = 0.0
    draft: str | None = None
    num_draft: int | None = None
    acceptance: str | None = None
    head: str | None = None
    exit_layer: int | None = None
    repeats: int = 1
    seed: int = 0
    mode: str = "live"

    @property
    def key(self) -> str:
        """First 16 hex digits of the SHA-256 of the cell's fields as canonical JSON."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cell(fields: Mapping[str, Any], where: str) -> GridCell:
    known = {f.name for f in dataclasses.fields(GridCell)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}; known: {sorted(known)}")
    return GridCell(**fields)


def grid_cells(config: Mapping[str, Any]) -> list[GridCell]:
    """The base cell, then for every ``vary`` axis each value swapped into the base (one field at a time),
    without duplicates. Raises ``ValueError`` for unknown sections or fields and non-list axes."""
    unknown = sorted(set(config) - {"base", "vary"})
    if unknown or "base" not in config:
        raise ValueError(f"a grid needs a [base] table and optionally [vary]; unexpected: {unknown}")
    base = _cell(config["base"], "[base]")
    cells = {base.key: base}
    for axis, values in config.get("vary", {}).items():
        if not isinstance(values, list):
            raise ValueError(f"[vary] {axis} must be a list of values, got {values!r}")
        for value in values:
            cell = _cell({**dataclasses.asdict(base), axis: value}, f"[vary] {axis}")
            cells.setdefault(cell.key, cell)
    return list(cells.values())


def load_grid(path: str | os.PathLike[str]) -> list[GridCell]:
    """:func:`grid_cells` of a TOML file (``tomllib``; on Python 3.10 the ``tomli`` package)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError as error:
            raise ImportError("TOML grids on Python 3.10 need tomli: pip install tomli") from error
    with open(path, "rb") as file:
        return grid_cells(tomllib.load(file))


def read_done(path: Path) -> dict[str, dict[str, Any]]:
    """Records of finished cells by key; unreadable lines (a write cut short) are ignored."""
    done: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").split("\n"):  # JSON Lines: "\n" only
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "key" in record:
                done[record["key"]] = record
    return done


def _append(path: Path, record: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps(finite(record), allow_nan=False) + "\n")
        file.flush()
        os.fsync(file.fileno())


CellRunner = Callable[[GridCell], Mapping[str, Any]]


def run_grid(
    cells: Sequence[GridCell] | str | os.PathLike[str], out: str | os.PathLike[str], *,
    runner: CellRunner | None = None, progress: bool = True,
) -> list[dict[str, Any]]:
    """Run every cell not yet in ``out`` (JSONL) and append its record; return the records of all cells in order.

    ``cells`` is a list or a TOML path (:func:`load_grid`). ``runner(cell)`` returns the cell's JSON-able result;
    the default :class:`specprim.bench.CellRunner` measures it live or by replay. A record is
    ``{"key", "cell", "result", "time_utc", "env"}``. A runner's exception stops the grid; finished cells stay.
    """
    cell_list = load_grid(cells) if isinstance(cells, (str, os.PathLike)) else list(cells)
    if runner is None:
        from specprim.bench._cells import BenchCellRunner

        runner = BenchCellRunner()
    out = Path(out)
    done = read_done(out)
    todo = [cell for cell in cell_list if cell.key not in done]
    bar = _bar(len(cell_list), len(cell_list) - len(todo), progress)
    env = environment()
    try:
        for cell in todo:
            bar.set_postfix_str(f"{cell.method} {cell.key}")
            record = {
                "key": cell.key, "cell": dataclasses.asdict(cell), "result": dict(runner(cell)),
                "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "env": env,
            }
            _append(out, record)
            done[cell.key] = json.loads(json.dumps(finite(record)))
            bar.update(1)
    finally:
        bar.close()
    return [done[cell.key] for cell in cell_list]


def _bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="grid", unit="cell", disable=not enabled, file=sys.stderr)
