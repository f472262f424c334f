"""Public testing utilities: honest draft-tree samplers, Monte-Carlo losslessness checks for acceptance
rules, a toy draft model for tree builders (``TableDraftModel``), and hypothesis strategies
(``distributions``, ``trees``, ``chains``, ``verification_problems``; importing them needs the ``hypothesis``
package, the rest needs ``scipy`` only when comparing distributions), and an optimality oracle,
``optimal_chain_acceptance``: the most draft tokens any lossless rule can accept from a chain on a toy table (a
linear program, needs ``scipy``).

Typical use on your own rule::

    from specprim.testing import assert_lossless
    report = assert_lossless(MyRule(), parents=[-1, -1, 0, 0, 2], sampling="without_replacement")
"""

from __future__ import annotations

from typing import Any

from specprim.testing._generation import exact_two_token_distribution, two_token_chi_square
from specprim.testing._lossless import (
    Comparison,
    ContextTable,
    LosslessReport,
    assert_lossless,
    check_verdict,
    compare,
    draw_context_tree,
    draw_siblings,
    draw_tree,
    emitted_sequence,
    emitted_token_distribution,
    sample_emitted_tokens,
)
from specprim.testing._optimal import optimal_chain_acceptance
from specprim.testing._tree_models import TableDraftModel

_STRATEGIES = ("chains", "distributions", "trees", "verification_problems")

__all__ = [
    "Comparison",
    "ContextTable",
    "LosslessReport",
    "TableDraftModel",
    "assert_lossless",
    "chains",
    "check_verdict",
    "compare",
    "distributions",
    "draw_context_tree",
    "draw_siblings",
    "draw_tree",
    "emitted_sequence",
    "emitted_token_distribution",
    "exact_two_token_distribution",
    "optimal_chain_acceptance",
    "sample_emitted_tokens",
    "trees",
    "two_token_chi_square",
    "verification_problems",
]


def __getattr__(name: str) -> Any:
    # The hypothesis strategies are imported lazily so that the rest works without hypothesis installed.
    if name in _STRATEGIES:
        from specprim.testing import _strategies

        return getattr(_strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
