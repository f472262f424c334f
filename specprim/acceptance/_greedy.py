"""Greedy verification: accept the longest path that agrees with the target's argmax."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from specprim._types import DraftTree, Verdict
from specprim.acceptance._base import (
    TreeTables,
    all_ancestors_flagged,
    deepest,
    validate_inputs,
    verdict_at,
)
from specprim.sampling import argmax


@dataclasses.dataclass(frozen=True, kw_only=True)
class Greedy:
    """Accept the longest path whose every token is the argmax of its parent's target row.

    The bonus ``next_token`` is the argmax of ``p`` at the end of the accepted path. Among equally long
    matching paths (duplicate siblings) the one ending at the lowest node id wins. ``q`` and ``sampling``
    are ignored and ``generator`` is unused.

    Guarantee (``lossless = True``): the emitted tokens are exactly those of greedy (argmax) decoding of
    the target, for any drafter. It is not lossless with respect to sampling from a non one-hot ``p``.
    Argmax ties are broken as ``torch.argmax`` does (first maximal index). ``greedy_only = True`` tells the
    generation loop to refuse this rule under sampling (temperature > 0).
    """

    lossless: ClassVar[bool] = True
    greedy_only: ClassVar[bool] = True

    def __call__(self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Verdict:
        validate_inputs(p, tree)
        tables = TreeTables.of(tree, p.device)
        best = argmax(p)  # (B, N + 1) the target's choice after the root and after every node
        flags = tree.tokens == best[:, tables.parent_row]  # (B, N): token is its parent's argmax
        end = deepest(all_ancestors_flagged(flags, tables), tables)  # (B,)
        next_token = best.gather(1, (end + 1)[:, None])[:, 0]  # (B,) the choice after the path's last node
        return verdict_at(end, next_token, tables)
