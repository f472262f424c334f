"""``specprim.bench``: a Spec-Bench-style benchmark and ablation harness, side by side with Hugging Face.

``run(...)`` times methods (``hf`` plain ``model.generate``, ``hf-prompt-lookup``, ``hf-assisted`` and every
specprim preset) interleaved on the same prompts and returns :class:`BenchResults`; ``run_grid`` runs a
one-axis-at-a-time ablation grid resumably; ``record_greedy`` / ``replay`` re-score drafters offline on recorded
greedy target choices. The metrics are defined in ``docs/bench.md``.
"""

from typing import TYPE_CHECKING

from specprim._lazy import lazy_imports

if TYPE_CHECKING:  # imported on first use (specprim/_lazy.py)
    from specprim.bench._cells import MODES, BenchCellRunner
    from specprim.bench._cli import add_bench_parser
    from specprim.bench._datasets import DATASETS, DatasetFetchError, load_dataset
    from specprim.bench._divergence import Divergence, classify_divergence, first_difference, relative_tolerance
    from specprim.bench._grid import GridCell, grid_cells, load_grid, run_grid
    from specprim.bench._methods import (
        ACCEPTANCE,
        BenchMethod,
        Decoding,
        Generation,
        HFGenerate,
        MethodContext,
        SpecprimGenerate,
        build_method,
        method_names,
    )
    from specprim.bench._metrics import MethodSummary, PromptRow
    from specprim.bench._plots import write_plots
    from specprim.bench._prompts import Prompt, conversation_ids, parse_prompt, read_prompts
    from specprim.bench._record import record_prompts
    from specprim.bench._report import grid_table, markdown_table
    from specprim.bench._results import BenchResults
    from specprim.bench._run import run
    from specprim.bench._runner import measure, schedule
    from specprim.speedup import Recording, ReplayOutput, greedy_continuation, record_greedy, replay, replay_all

__all__ = [
    "ACCEPTANCE",
    "DATASETS",
    "BenchMethod",
    "BenchResults",
    "DatasetFetchError",
    "Divergence",
    "MethodSummary",
    "Prompt",
    "PromptRow",
    "Recording",
    "ReplayOutput",
    "load_dataset",
    "load_grid",
    "read_prompts",
    "record_prompts",
    "replay",
    "replay_all",
    "run",
    "run_grid",
]

__getattr__, __dir__ = lazy_imports(__name__)
