"""A speedup model from measured costs and measured acceptance, and the tree it predicts is fastest.

- :class:`RankAcceptance`: positional acceptance rates ``r[depth][rank]`` counted from the sibling outcomes every
  generation records (``GenerationStats.sibling_outcomes``).
- :class:`CostModel` / :func:`measure_costs`: verification cost against tree size and drafting cost against
  depth, timed on this machine.
- :func:`expected_tau`, :func:`predict`: tokens per step and speedup of any tree shape.
- :func:`best_tree`: the tree size, depth and width that maximise predicted tokens per second (hardware-aware,
  Sequoia-style); ``specprim tune`` runs the whole measurement from the command line.
- :func:`tune_lookup`: the prompt-lookup length of a union (``eagle3+prompt-lookup``), by greedy replay of every
  candidate and the cost model.
"""

from typing import TYPE_CHECKING

from specprim._lazy import lazy_imports

if TYPE_CHECKING:  # imported on first use (specprim/_lazy.py)
    from specprim._stats import SiblingOutcome, sibling_outcomes
    from specprim.speedup._acceptance import RankAcceptance, sibling_ranks
    from specprim.speedup._costs import CostModel, measure_costs, measure_verify_costs, padded_sizes
    from specprim.speedup._model import Prediction, TreeChoice, best_tree, expected_tau, predict
    from specprim.speedup._replay import (
        Recording,
        ReplayOutput,
        greedy_continuation,
        record_greedy,
        replay,
        replay_all,
    )
    from specprim.speedup._tune import PROBE_TREE, TuneResult, tune
    from specprim.speedup._union import LOOKUP_LENGTHS, LookupChoice, LookupRow, predict_replayed, tune_lookup

__all__ = [
    "CostModel",
    "LookupChoice",
    "Prediction",
    "RankAcceptance",
    "TreeChoice",
    "best_tree",
    "expected_tau",
    "measure_costs",
    "measure_verify_costs",
    "predict",
    "predict_replayed",
    "tune",
    "tune_lookup",
    "TuneResult",
]

__getattr__, __dir__ = lazy_imports(__name__)
