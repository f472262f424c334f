"""Prompt lookup: draft the tokens that followed earlier occurrences of the current n-gram, as a trie."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.drafters._trie import merge_trees

__all__ = ["PromptLookup"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptLookup:
    """Training-free n-gram drafter over the prompt and the generated text (Saxena, 2023), drafting a tree.

    Matching: the match length of an earlier position is the number of tokens (at most ``max_ngram``) before it
    that equal the last committed tokens. Only positions with the **longest** match length found are used, and
    only when it is at least ``min_ngram`` (so an n-gram match always beats any shorter one, as in the chain
    version). Their continuations (up to ``num_tokens`` tokens each, fewer near the end of the text) are taken
    most recent first; identical continuations count once, and the first ``max_matches`` distinct ones are
    merged into a trie.

    The tree: shared prefixes share nodes, siblings have distinct tokens, nodes are in insertion order (the
    most recent continuation first, then the new suffixes of the next ones; topological), depth
    ``<= min(num_tokens, request.max_depth)``, at most ``max_matches * num_tokens`` nodes. With
    ``max_matches=1`` it is the classic chain of the latest match. No match drafts nothing, so that step costs
    one plain target forward. Tokens are chosen without randomness: ``sampling="deterministic"``, ``q=None``.

    The search is vectorised (one ``unfold`` and comparison over the whole context), cheap for contexts of
    thousands of tokens.
    """

    stateless: ClassVar[bool] = True  # proposals depend on the request only (see UnionDrafter)
    max_ngram: int = 3
    min_ngram: int = 1
    num_tokens: int = 8
    max_matches: int = 4

    def __post_init__(self) -> None:
        for name in ("max_ngram", "min_ngram", "num_tokens", "max_matches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {self.num_tokens}")
        if self.max_matches < 1:
            raise ValueError(f"max_matches must be >= 1, got {self.max_matches}")

    def propose(self, request: DraftRequest) -> DraftTree:
        """A trie of the continuations of the best earlier matches of the last committed tokens."""
        ids = request.input_ids
        if ids.shape[0] != 1:
            raise ValueError("PromptLookup drafts for batch size 1")
        length = min(self.num_tokens, request.max_depth)
        continuations = self._continuations(ids[0], length) if length > 0 else []
        tokens, parents = _trie(continuations)
        return DraftTree(
            tokens=torch.tensor([tokens], dtype=torch.long, device=ids.device).reshape(1, len(tokens)),
            parents=torch.tensor(parents, dtype=torch.long).reshape(len(parents)),
            sampling="deterministic",
        )

    def observe(self, verdict: Verdict) -> None:
        """Stateless: the index is the committed text itself."""

    def _continuations(self, ids: torch.Tensor, length: int) -> list[list[int]]:
        """(T,) committed ids -> up to ``max_matches`` distinct continuations (each ``<= length`` tokens) of
        the most recent positions with the longest match, most recent first."""
        total = ids.shape[0]
        lengths = match_lengths(ids, self.max_ngram)  # (T,)
        best = int(lengths.max()) if total else 0
        if best < self.min_ngram:
            return []
        starts = (lengths == best).nonzero()[:, 0].flip(0)  # (C,) continuation starts, most recent first
        index = starts[:, None] + torch.arange(length, device=ids.device)  # (C, length)
        spans = torch.where(index < total, ids[index.clamp(max=total - 1)], -1)  # (C, length), -1 past the end
        return _first_distinct_rows(spans, self.max_matches).tolist()


def match_lengths(ids: torch.Tensor, max_ngram: int) -> torch.Tensor:
    """(T,) ids -> (T,) long: for each start ``e``, how many tokens before ``e`` (at most ``max_ngram``) equal the
    last committed tokens, i.e. the longest ``n`` with ``ids[e - n : e] == ids[T - n :]`` (0 for ``e = 0``)."""
    n, total = max_ngram, ids.shape[0]
    padded = torch.cat([ids.new_full((n,), -1), ids[: total - 1]])  # (n + T - 1,)
    windows = padded.unfold(0, n, 1)  # (T, n): windows[e] = ids[e - n : e], -1 before the start
    query = torch.cat([ids.new_full((max(0, n - total),), -2), ids[max(0, total - n) :]])  # (n,)
    same = (windows == query).flip(1).long()  # (T, n): column j compares the j-th token back
    return same.cumprod(1).sum(1)  # (T,)


def _first_distinct_rows(rows: torch.Tensor, limit: int) -> torch.Tensor:
    """(C, L) -> (<= limit, L): the first occurrence of each distinct row, in their original order."""
    if rows.shape[0] <= 1:
        return rows[:limit]
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)  # (C,)
    order = torch.arange(rows.shape[0], device=rows.device)  # (C,)
    first = torch.full((int(inverse.max()) + 1,), rows.shape[0], device=rows.device)  # (U,)
    first = first.scatter_reduce(0, inverse, order, reduce="amin")
    return rows[first.sort().values[:limit]]


def _trie(sequences: list[list[int]]) -> tuple[list[int], list[int]]:
    """Merge token sequences (``-1`` ends one early) into a trie; return its tokens and parents lists.

    Nodes are numbered in insertion order, so parents come first; no two siblings share a token.
    """
    chains = []
    for sequence in sequences:
        length = sequence.index(-1) if -1 in sequence else len(sequence)
        chains.append((sequence[:length], list(range(-1, length - 1))))
    tokens, parents, _ = merge_trees(chains)
    return tokens, parents
