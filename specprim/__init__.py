"""specprim: composable speculative-decoding primitives.

Notation: ``p`` is the target distribution, ``q`` the draft distribution. See ``docs/concepts.md``.
"""

from typing import TYPE_CHECKING

from specprim._lazy import lazy_imports

if TYPE_CHECKING:  # imported on first use (specprim/_lazy.py): `import specprim` does not import torch
    from specprim import (
        acceptance,
        constraints,
        drafters,
        hf,
        masks,
        models,
        presets,
        recipes,
        residual,
        sampling,
        speedup,
        trees,
    )
    from specprim._batch import BatchGenerateOutput
    from specprim._generate import TextGeneration, generate
    from specprim._loop import GenerateOutput, speculative_generate
    from specprim._stats import GenerationStats
    from specprim._step import Row, check_decodes, cut_at_stop, speculative_step, stop_token_ids
    from specprim._types import DraftTree, Verdict, truncate_tree

__version__ = "0.1.0"

__all__ = [
    "BatchGenerateOutput",
    "DraftTree",
    "GenerateOutput",
    "GenerationStats",
    "TextGeneration",
    "Verdict",
    "acceptance",
    "constraints",
    "drafters",
    "generate",
    "hf",
    "masks",
    "models",
    "presets",
    "recipes",
    "residual",
    "sampling",
    "speculative_generate",
    "speedup",
    "trees",
    "truncate_tree",
]

__getattr__, __dir__ = lazy_imports(__name__)
