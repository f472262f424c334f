"""The files of a training run, read and written without torch: the names of its records, atomic writes (a kill
leaves the old file or the new one, never half of one) and JSON / JSON-lines readers that treat a missing file as
empty. Shared by the campaign, its tau measurements and its scaling curve (``campaign curve`` stays torch-free)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from specprim._jsonl import jsonl_lines

__all__ = ["COOLDOWNS_NAME", "COOLED", "EVAL_NAME", "TAU_NAME", "complete_lines", "finished_cooldowns", "read_json",
           "read_jsonl", "write_json", "write_jsonl", "write_text"]

EVAL_NAME = "eval.jsonl"  # one held-out evaluation per training segment
TAU_NAME = "tau.jsonl"  # one decoding tau per head and setting (`specprim campaign tau`)
COOLDOWNS_NAME = "cooldowns"  # one directory per cool-down (`specprim campaign cooldown`)
COOLED = "cooled "  # the label of a cool-down's head in tau.jsonl: "cooled step1049-decay150"


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (staged beside it, then renamed), making its folder if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def write_json(path: Path, record: Any) -> None:
    write_text(path, json.dumps(record, indent=1) + "\n")


def write_jsonl(path: Path, records: list[Any]) -> None:
    write_text(path, "".join(json.dumps(record) + "\n" for record in records))


def read_json(path: Path) -> Any:
    """The record in ``path``, or None when there is no such file."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_jsonl(path: Path) -> list[Any]:
    """The records of a JSON-lines file (blank lines skipped), or ``[]`` when there is no such file."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in jsonl_lines(path.read_text(encoding="utf-8"))]


def complete_lines(path: Path) -> int:
    """Cut ``path`` after its last complete line (a kill can leave half a line) and count its lines."""
    if not path.is_file():
        return 0
    data = path.read_bytes()
    keep = data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        with open(path, "r+b") as f:
            f.truncate(len(keep))
    return keep.count(b"\n")


def finished_cooldowns(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ``eval.json`` record of each finished cool-down of a campaign, with its ``name`` and its head's
    ``location``, in order of the step it branched at."""
    records = []
    for path in sorted(Path(run_dir, COOLDOWNS_NAME).glob("*/eval.json")):
        record = read_json(path)
        records.append({**record, "name": path.parent.name, "location": os.fspath(path.parent / "train" / "head")})
    return sorted(records, key=lambda r: (r["from_step"], r["decay_steps"]))
