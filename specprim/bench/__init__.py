"""``specprim.bench``: a Spec-Bench-style benchmark and ablation harness, side by side with Hugging Face.

``run(...)`` times methods (``hf`` plain ``model.generate``, ``hf-prompt-lookup``, ``hf-assisted`` and every
specprim preset) interleaved on the same prompts and returns :class:`BenchResults`; ``run_grid`` runs a
one-axis-at-a-time ablation grid resumably; ``record_greedy`` / ``replay`` re-score drafters offline on recorded
greedy target choices. The metrics are defined in ``docs/bench.md``.
"""

from specprim.bench._cells import MODES as MODES
from specprim.bench._cells import BenchCellRunner as BenchCellRunner
from specprim.bench._cli import add_bench_parser as add_bench_parser
from specprim.bench._datasets import DATASETS, DatasetFetchError, load_dataset
from specprim.bench._divergence import Divergence
from specprim.bench._divergence import classify_divergence as classify_divergence
from specprim.bench._divergence import first_difference as first_difference
from specprim.bench._divergence import relative_tolerance as relative_tolerance
from specprim.bench._grid import GridCell as GridCell
from specprim.bench._grid import grid_cells as grid_cells
from specprim.bench._grid import load_grid, run_grid
from specprim.bench._methods import (
    ACCEPTANCE,
    BenchMethod,
    method_names,
)
from specprim.bench._methods import (
    Decoding as Decoding,
)
from specprim.bench._methods import (
    Generation as Generation,
)
from specprim.bench._methods import (
    HFGenerate as HFGenerate,
)
from specprim.bench._methods import (
    MethodContext as MethodContext,
)
from specprim.bench._methods import (
    SpecprimGenerate as SpecprimGenerate,
)
from specprim.bench._methods import (
    build_method as build_method,
)
from specprim.bench._metrics import MethodSummary, PromptRow
from specprim.bench._plots import write_plots as write_plots
from specprim.bench._prompts import Prompt, read_prompts
from specprim.bench._prompts import conversation_ids as conversation_ids
from specprim.bench._prompts import parse_prompt as parse_prompt
from specprim.bench._replay import (
    Recording,
    ReplayOutput,
    record_prompts,
    replay,
    replay_all,
)
from specprim.bench._replay import (
    greedy_continuation as greedy_continuation,
)
from specprim.bench._replay import (
    record_greedy as record_greedy,
)
from specprim.bench._report import grid_table as grid_table
from specprim.bench._report import markdown_table as markdown_table
from specprim.bench._results import BenchResults
from specprim.bench._run import run
from specprim.bench._runner import measure as measure
from specprim.bench._runner import schedule as schedule

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
    "method_names",
    "read_prompts",
    "record_prompts",
    "replay",
    "replay_all",
    "run",
    "run_grid",
]
