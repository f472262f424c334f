"""The default grid cell runner: a cell measured live against ``hf``, or re-scored by counterfactual replay.

Models and recordings are loaded once per runner and shared by the cells that need the same ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from specprim import models, presets
from specprim.bench._grid import GridCell
from specprim.bench._methods import ACCEPTANCE
from specprim.bench._metrics import step_fields
from specprim.bench._record import record_prompts
from specprim.bench._run import DTYPES, resolve_prompts, run
from specprim.speedup import Recording, replay_all


class BenchCellRunner:
    """``runner(cell) -> dict``: the cell's ``mode`` names one of :data:`MODES`.

    ``preloaded`` maps ``(name, dtype)`` to an already loaded ``(model, tokenizer)`` (a notebook's models, or
    tiny test models); other names are loaded with :func:`specprim.models.load` on first use and kept.
    """

    def __init__(self, preloaded: Mapping[tuple[str, str], tuple[torch.nn.Module, Any]] | None = None) -> None:
        self._models: dict[tuple[str, str], tuple[torch.nn.Module, Any]] = dict(preloaded or {})
        self._recordings: dict[tuple[Any, ...], list[Recording]] = {}

    def model(self, name: str, dtype: str) -> tuple[torch.nn.Module, Any]:
        if (name, dtype) not in self._models:
            self._models[name, dtype] = models.load(name, dtype=DTYPES[dtype])
        return self._models[name, dtype]

    def __call__(self, cell: GridCell) -> Mapping[str, Any]:
        if cell.mode not in MODES:
            raise ValueError(f"unknown mode {cell.mode!r}; known: {sorted(MODES)}")
        return MODES[cell.mode](self, cell)

    def recordings(self, cell: GridCell, layers: tuple[int, ...]) -> list[Recording]:
        key = (cell.target, cell.dtype, cell.dataset, cell.prompts, cell.num_prompts, cell.max_new_tokens, layers)
        if key not in self._recordings:
            target, tokenizer = self.model(cell.target, cell.dtype)
            prompts, _ = resolve_prompts(cell.dataset, cell.prompts, cell.num_prompts)
            self._recordings[key] = record_prompts(target, tokenizer, prompts, cell.max_new_tokens, layers)
        return self._recordings[key]


def _live(runner: BenchCellRunner, cell: GridCell) -> dict[str, Any]:
    """``run`` with the methods ``[hf, cell.method]``: the method's and the baseline's summaries."""
    target, tokenizer = runner.model(cell.target, cell.dtype)
    draft = runner.model(cell.draft, cell.dtype)[0] if cell.draft else None
    results = run(
        target=target, tokenizer=tokenizer, methods=[cell.method], dataset=cell.dataset, prompts=cell.prompts,
        num_prompts=cell.num_prompts, max_new_tokens=cell.max_new_tokens, temperature=cell.temperature,
        draft=draft, num_draft=cell.num_draft, head=cell.head, exit_layer=cell.exit_layer,
        acceptance=cell.acceptance, repeats=cell.repeats,
        seed=cell.seed,
    )
    return {"summary": results.summary(cell.method).to_json(), "baseline": results.summary("hf").to_json()}


def _replay(runner: BenchCellRunner, cell: GridCell) -> dict[str, Any]:
    """Tau, acceptance by depth and draft time of the cell's drafter, replayed on recorded greedy outputs."""
    if cell.temperature != 0:
        raise ValueError("replay re-scores greedy decoding only; use mode = 'live' with temperature > 0")
    if cell.acceptance is not None and not ACCEPTANCE[cell.acceptance].lossless:
        raise ValueError(f"replay assumes a lossless rule; {cell.acceptance!r} changes the output: use mode='live'")
    target, _ = runner.model(cell.target, cell.dtype)
    draft = runner.model(cell.draft, cell.dtype)[0] if cell.draft else None
    options = {key: value for key, value in (("head", cell.head), ("exit_layer", cell.exit_layer)) if value is not None}
    method = presets.from_name(cell.method, target=target, draft=draft, num_draft=cell.num_draft, **options)
    layers = tuple(getattr(method.drafter, "feature_layers", ()))
    recordings = runner.recordings(cell, layers)
    eos = runner.model(cell.target, cell.dtype)[1].eos_token_id
    output = replay_all(recordings, method.drafter, max_new_tokens=cell.max_new_tokens, eos_token_id=eos)
    fields = step_fields(output.stats)
    steps = fields["steps"] or 0
    return {
        "replay": {
            **fields, "new_tokens": output.stats.new_tokens, "exact": output.exact, "recordings": len(recordings),
            "draft_ms_per_step": 1e3 * output.stats.draft_s / steps if steps else None,
        },
        "method_repr": repr(method),
    }


MODES: Mapping[str, Callable[[BenchCellRunner, GridCell], dict[str, Any]]] = {"live": _live, "replay": _replay}
