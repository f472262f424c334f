"""Hypothesis strategies for property tests of speculative-decoding primitives (needs ``hypothesis``)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st


def distributions(
    vocab_size: int, *, allow_zeros: bool = True, dtype: torch.dtype = torch.float64
) -> st.SearchStrategy[torch.Tensor]:
    """Probability vectors (V,) summing to 1; with ``allow_zeros`` some entries are exactly zero (at least
    one entry is always positive)."""
    entry = st.floats(min_value=1e-3, max_value=1.0)
    if allow_zeros:
        entry = st.one_of(st.just(0.0), entry)
    weights = st.lists(entry, min_size=vocab_size, max_size=vocab_size).filter(lambda w: sum(w) > 0)
    return weights.map(lambda w: torch.tensor(w, dtype=torch.float64).div(sum(w)).to(dtype))


def trees(max_nodes: int, *, min_nodes: int = 0) -> st.SearchStrategy[list[int]]:
    """Valid parents lists (topological, ``-1`` for children of the root) with ``min_nodes..max_nodes``
    nodes; shrinks towards small, chain-free (all-root-children) trees."""

    def parents_of(num_nodes: int) -> st.SearchStrategy[list[int]]:
        return st.tuples(*(st.integers(min_value=-1, max_value=i - 1) for i in range(num_nodes))).map(list)

    return st.integers(min_value=min_nodes, max_value=max_nodes).flatmap(parents_of)


def chains(max_nodes: int, *, min_nodes: int = 0) -> st.SearchStrategy[list[int]]:
    """Chain parents lists ``[-1, 0, 1, ..., K - 2]`` with ``K`` in ``min_nodes..max_nodes``."""
    return st.integers(min_value=min_nodes, max_value=max_nodes).map(lambda k: list(range(-1, k - 1)))
