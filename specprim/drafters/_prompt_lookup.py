"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the current n-gram."""

from __future__ import annotations

import dataclasses

import torch

from specprim._types import DraftRequest, DraftTree, Verdict


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptLookup:
    """Training-free n-gram drafter over the prompt and the generated text (Saxena, 2023).

    Looks for the most recent earlier occurrence of the last ``n`` committed tokens, for ``n`` from
    ``max_ngram`` down to ``min_ngram``, and drafts the (up to) ``num_tokens`` tokens that followed it as a
    chain. No match drafts nothing, so that step costs one plain target forward. Tokens are chosen without
    randomness: ``sampling="deterministic"`` and ``q`` is ``None``.
    """

    max_ngram: int = 3
    min_ngram: int = 1
    num_tokens: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {self.num_tokens}")

    def propose(self, request: DraftRequest) -> DraftTree:
        ids = request.input_ids
        if ids.shape[0] != 1:
            raise ValueError("PromptLookup drafts for batch size 1")
        draft = self._lookup(ids[0], min(self.num_tokens, request.max_depth))  # (k,)
        parents = torch.arange(-1, draft.shape[0] - 1, dtype=torch.long)
        return DraftTree(tokens=draft[None], parents=parents, sampling="deterministic")

    def observe(self, verdict: Verdict) -> None:
        """Stateless: the index is the committed text itself."""

    def _lookup(self, ids: torch.Tensor, length: int) -> torch.Tensor:
        """(T,) committed ids -> (k,) continuation of the latest earlier match, k <= ``length``."""
        total = ids.shape[0]
        for n in range(min(self.max_ngram, total - 1), self.min_ngram - 1, -1):
            windows = ids[: total - 1].unfold(0, n, 1)  # (T - n, n) every n-gram that has a successor
            starts = (windows == ids[total - n :]).all(dim=1).nonzero()[:, 0]  # (M,)
            if starts.numel():
                begin = int(starts[-1]) + n
                return ids[begin : begin + length]
        return ids[:0]
