"""Hypothesis strategies for property tests of speculative-decoding primitives (needs ``hypothesis``)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from specprim._types import SAMPLING_SCHEMES, DraftTree


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


def _random_probs(shape: tuple[int, ...], generator: torch.Generator, sparse: bool) -> torch.Tensor:
    """Random rows summing to 1 over the last dimension; with ``sparse`` about 40 % of each row is exactly zero
    (never its largest entry)."""
    logits = torch.randn(shape, generator=generator) * 2
    if sparse:
        drop = torch.rand(shape, generator=generator) < 0.4
        logits = logits.masked_fill(drop & (logits < logits.amax(-1, keepdim=True)), float("-inf"))
    return logits.softmax(-1)


@st.composite
def verification_problems(
    draw: st.DrawFn, parents: st.SearchStrategy[list[int]] | None = None
) -> tuple[torch.Tensor, DraftTree]:
    """What an acceptance rule is called with: ``p`` (B, N + 1, V) and a tree (B, N) of ``parents`` (default:
    :func:`trees` of up to 7 nodes) under any sampling scheme, with arbitrary tokens and ``q`` (contract violations
    included: tokens with ``q == 0``, repeated siblings; a deterministic tree may come without ``q``). For the
    structural properties every rule must have (inputs not mutated, path follows parents, ...)."""
    shape = draw(trees(7) if parents is None else parents)
    batch = draw(st.integers(min_value=1, max_value=6))
    vocab = draw(st.integers(min_value=2, max_value=6))
    sampling = draw(st.sampled_from(SAMPLING_SCHEMES))
    generator = torch.Generator().manual_seed(draw(st.integers(min_value=0, max_value=2**31 - 1)))
    rows = (batch, len(shape) + 1, vocab)
    p = _random_probs(rows, generator, sparse=draw(st.booleans()))
    q = _random_probs(rows, generator, sparse=draw(st.booleans()))
    tokens = torch.randint(0, vocab, (batch, len(shape)), generator=generator)
    keep_q = sampling != "deterministic" or draw(st.booleans())
    return p, DraftTree(tokens=tokens, parents=torch.tensor(shape, dtype=torch.long), q=q if keep_q else None,
                        sampling=sampling)
