"""Suffix decoding (Oliaro et al., 2024, arXiv 2411.04975): frequency-scored draft trees from the longest match of
the context's suffix in the current request and in the outputs of earlier requests, sized by the match length."""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
import torch

from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.drafters._datastore import Datastore, frequent_prefix_tree
from specprim.drafters._prompt_lookup import match_lengths

__all__ = ["SuffixDecoding"]

_MAX_OCCURRENCES = 1024  # occurrences of a match counted in the global store (evenly spaced when there are more)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SuffixDecoding:
    """Training-free drafter over two suffix indexes: the current request (prompt and tokens generated so far) and
    a global one holding the outputs of this drafter's earlier generations (bounded to ``max_stored`` tokens).

    Each step, for each index, the longest suffix of the committed text found there (``min_match <= p <=
    max_match`` tokens) is matched; every occurrence's continuation counts, as a suffix tree's node counts do. A
    node's score is the share of occurrences whose continuation starts with its path (the product of the
    conditional frequencies along it: an estimate of the chance the target emits that path). The tree holds the
    ``min(max_tokens, floor(alpha * p))`` best-scored nodes with score ``>= min_prob`` (adaptive size: a longer
    match earns a bigger tree; a parent never scores below its child, so that set is a tree); the index whose tree
    has the larger total score (its expected number of accepted tokens) drafts. No match drafts nothing.

    The global index learns a generation's output (its tokens after the prompt) when the next generation starts
    (its first request has ``step == 0``); the oldest outputs are evicted once more than ``max_stored`` tokens are
    stored (an output longer than that keeps its last ``max_stored``), so memory stays under about ``(8 + 16 *
    (max_match - min_match + 1)) * max_stored`` bytes (tokens and an n-gram index of
    :class:`specprim.drafters.Datastore`, rebuilt when an output is added). ``max_stored=0`` keeps no global index.
    Sequential generations only: a batch's rows need one drafter each, and then learn from their own row.

    Tokens are chosen without randomness: ``sampling="deterministic"``, ``q=None`` (lossless under
    :class:`specprim.acceptance.Greedy` and :class:`specprim.acceptance.SpeculativeSampling`); it joins a
    :class:`specprim.drafters.UnionDrafter`. Batch size 1 only.
    """

    max_match: int = 16
    min_match: int = 1
    alpha: float = 1.0
    max_tokens: int = 16
    min_prob: float = 0.1
    max_stored: int = 65536
    _memory: _Memory = dataclasses.field(init=False, repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for name in ("max_match", "min_match", "max_tokens", "max_stored"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {self.min_match}, {self.max_match}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.max_stored < 0:
            raise ValueError(f"max_stored must be >= 0, got {self.max_stored}")
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not 0 < self.alpha < math.inf:
            raise ValueError(f"alpha must be a positive finite number, got {self.alpha!r}")
        if not isinstance(self.min_prob, (int, float)) or isinstance(self.min_prob, bool) or \
                not 0 <= self.min_prob <= 1:
            raise ValueError(f"min_prob must be a number in [0, 1], got {self.min_prob!r}")
        object.__setattr__(self, "_memory", _Memory(self.max_stored, self.max_match, self.min_match))

    @property
    def stored_tokens(self) -> int:
        """How many output tokens the global index holds (``<= max_stored``)."""
        return self._memory.stored

    def size_for(self, match: int) -> int:
        """The most nodes a tree drafted from a ``match``-token match may have: ``min(max_tokens, floor(alpha *
        match))``."""
        return min(self.max_tokens, math.floor(self.alpha * match))

    def propose(self, request: DraftRequest) -> DraftTree:
        """The better-scored of the two indexes' frequency trees for the longest matched suffix."""
        ids = request.input_ids
        if ids.shape[0] != 1:
            raise ValueError(f"SuffixDecoding drafts for batch size 1, got {ids.shape[0]}")
        memory = self._memory
        if request.step == 0:
            memory.finish()  # the previous generation is over: learn its output
            memory.prompt_length = ids.shape[1]
        memory.context, memory.committed = ids[0], []
        if memory.max_token >= request.vocab_size:
            raise ValueError(f"the global index holds token id {memory.max_token}, outside the target's vocabulary "
                             f"({request.vocab_size}): use a new SuffixDecoding for another tokenizer")
        candidates = [self._tree(*self._request_matches(ids[0]), request.max_depth)]
        if memory.index is not None:
            found = memory.matches(ids[0, -self.max_match :].tolist(), self.max_tokens)
            candidates.append(self._tree(*found, request.max_depth))
        tokens, parents, _ = max(candidates, key=lambda c: c[2])  # the first (this request's) on a tie
        memory.drafted = tokens
        return DraftTree(
            tokens=torch.tensor(tokens, dtype=torch.long, device=ids.device).reshape(1, len(tokens)),
            parents=torch.tensor(parents, dtype=torch.long).reshape(len(parents)),
            sampling="deterministic",
        )

    def observe(self, verdict: Verdict) -> None:
        """Remember the tokens this step committed (the accepted path and the next token), so that the output is
        known whole when the generation ends."""
        path = verdict.path[0, : int(verdict.num_accepted[0])].tolist()
        self._memory.committed = [self._memory.drafted[i] for i in path] + [int(verdict.next_token[0])]

    def finish(self) -> None:
        """Add the current generation's output to the global index now (otherwise done when the next one starts)."""
        self._memory.finish()

    def _request_matches(self, ids: torch.Tensor) -> tuple[int, np.ndarray]:
        """(T,) committed ids -> (p, (C, L) continuations, ``-1`` past the end, most recent first) of the longest
        suffix match inside the request, ``L = max_tokens``; ``(0, (0, L))`` when shorter than ``min_match``."""
        lengths = match_lengths(ids, self.max_match)  # (T,)
        best = int(lengths.max()) if ids.shape[0] else 0
        if best < self.min_match:
            return 0, np.zeros((0, self.max_tokens), dtype=np.int64)
        starts = (lengths == best).nonzero()[:, 0].flip(0)  # (C,) continuation starts, most recent first
        index = starts[:, None] + torch.arange(self.max_tokens, device=ids.device)  # (C, L)
        total = ids.shape[0]
        spans = torch.where(index < total, ids[index.clamp(max=total - 1)], -1)  # (C, L)
        return best, spans.cpu().numpy()

    def _tree(self, match: int, spans: np.ndarray, max_depth: int) -> tuple[list[int], list[int], float]:
        """(p, (C, L) continuations) -> (tokens, parents, total score) of the adaptive-size frequency tree."""
        size = self.size_for(match)
        length = min(size, max_depth, spans.shape[1])
        if size < 1 or length < 1 or spans.shape[0] == 0:
            return [], [], 0.0
        tokens, parents, counts = frequent_prefix_tree(spans[:, :length], size)
        scores = [c / spans.shape[0] for c in counts]  # descending: the kept nodes are a prefix, so a tree
        keep = sum(s >= self.min_prob for s in scores)
        return tokens[:keep], parents[:keep], float(sum(scores[:keep]))


class _Memory:
    """The mutable part of a :class:`SuffixDecoding`: the global index over earlier outputs and what the current
    generation has committed."""

    def __init__(self, max_stored: int, max_match: int, min_match: int) -> None:
        self.max_stored, self.max_match, self.min_match = max_stored, max_match, min_match
        self.outputs: collections.deque[np.ndarray] = collections.deque()  # oldest first, each (L,) int64
        self.stored = 0  # tokens in ``outputs``
        self.index: Datastore | None = None  # over ``outputs``; None when empty
        self.max_token = -1  # the largest id in ``outputs``
        self.prompt_length: int | None = None  # of the current generation (None: none started)
        self.context: torch.Tensor | None = None  # (T,) the committed ids of the last request
        self.drafted: list[int] = []  # the last tree's tokens
        self.committed: list[int] = []  # what the last observed step committed

    def finish(self) -> None:
        """Store the current generation's output (if any) and end it."""
        if self.prompt_length is not None and self.context is not None:
            output = self.context[self.prompt_length :].tolist() + self.committed
            self.add(np.asarray(output, dtype=np.int64))
        self.prompt_length, self.context, self.drafted, self.committed = None, None, [], []

    def add(self, output: np.ndarray) -> None:
        """(L,) ids -> stored, evicting the oldest outputs beyond ``max_stored`` tokens; the index is rebuilt."""
        output = output[max(0, output.shape[0] - self.max_stored) :]
        if output.shape[0] == 0:
            return
        self.outputs.append(output)
        self.stored += output.shape[0]
        while self.stored > self.max_stored:
            self.stored -= self.outputs.popleft().shape[0]
        self.max_token = max(int(o.max()) for o in self.outputs)
        self.index = Datastore(self.outputs, max_ngram=self.max_match, min_ngram=self.min_match)

    def matches(self, context: list[int], length: int) -> tuple[int, np.ndarray]:
        """The longest suffix of ``context`` in the stored outputs -> (p, (C, length) continuations, ``-1`` past an
        output's end, the most recent output first)."""
        assert self.index is not None
        match, starts = self.index.matches(context, _MAX_OCCURRENCES)
        return match, self.index.continuations(starts[::-1], length)
