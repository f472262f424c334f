"""The results object of a benchmark run and its JSON form."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specprim.bench._metrics import MethodSummary, PromptRow

SCHEMA_VERSION = 1


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None``, recursively (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchResults:
    """What :func:`specprim.bench.run` measured.

    Attributes:
        results: one :class:`MethodSummary` per method, in the order the methods were given (``hf`` first).
        prompts: one :class:`PromptRow` per (prompt, repeat, method), in measurement order.
        meta: settings, seeds, the exact command, library versions and hardware.
    """

    results: tuple[MethodSummary, ...]
    prompts: tuple[PromptRow, ...]
    meta: Mapping[str, Any]

    def summary(self, method: str) -> MethodSummary:
        """The summary of ``method``; ``KeyError`` if it was not measured."""
        for summary in self.results:
            if summary.method == method:
                return summary
        raise KeyError(f"{method!r} was not measured; methods: {[s.method for s in self.results]}")

    def to_dict(self) -> dict[str, Any]:
        """``{"schema_version", "results": [...], "prompts": [...], "tau_by_context": [...], "meta": {...}}``,
        strict-JSON safe."""
        return finite({
            "schema_version": SCHEMA_VERSION,
            "results": [s.to_json() for s in self.results],
            "prompts": [r.to_json() for r in self.prompts],
            "tau_by_context": self.tau_by_context(),
            "meta": dict(self.meta),
        })

    def tau_by_context(self) -> list[dict[str, Any]]:
        """Tau of each method by prompt-length bucket (see :func:`specprim.bench._context.tau_by_context`)."""
        from specprim.bench._context import tau_by_context

        return tau_by_context(self.prompts)

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` to ``path`` (parent directories created); return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
        return path

    def markdown(self) -> str:
        """The summary table as GitHub markdown (see :func:`specprim.bench.markdown_table`)."""
        from specprim.bench._report import markdown_table

        return markdown_table(self.results, self.meta)
