"""A toy `TreeDraftModel` for testing tree builders and drafters without a neural network."""

from __future__ import annotations

import hashlib

import torch

from specprim._types import DraftRequest

__all__ = ["TableDraftModel"]

_CACHE_LIMIT = 200_000  # cached logits rows before the cache is cleared


class TableDraftModel:
    """A deterministic pseudo-random autoregressive draft model implementing `specprim.trees.TreeDraftModel`.

    The logits after a token sequence are ``logit_scale * N(0, 1)`` noise seeded by a hash of ``seed`` and the
    sequence's last ``context`` tokens (all of them when ``context`` is ``None``), so they depend on the
    committed ids and the path of tokens from the root only, and a scratch node sees exactly what the root
    would see once that path is committed. Ids ``>= draft_vocab_size`` get ``-inf`` (a draft vocabulary that is
    a prefix of the target's). Everything runs on CPU in float32.

    Counters for tests (reset by ``begin`` except ``begin_calls``): ``extend_sizes`` lists the number of nodes
    of every ``extend`` call since the last ``begin``; ``scratch_parents`` (list) and ``scratch_paths``
    (per batch row, the token path of every scratch node) describe the scratch tree.

    ``begin`` raises ``ValueError`` when ``request.vocab_size != vocab_size``; ``extend`` raises ``ValueError``
    for a parent that is not an existing scratch node (or ``-1``) or tokens outside the vocabulary, and
    ``RuntimeError`` before the first ``begin``.
    """

    def __init__(
        self,
        vocab_size: int,
        seed: int = 0,
        *,
        logit_scale: float = 2.0,
        context: int | None = None,
        draft_vocab_size: int | None = None,
    ) -> None:
        if not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        if context is not None and context < 0:
            raise ValueError(f"context must be >= 0 or None, got {context!r}")
        if draft_vocab_size is not None and not 1 <= draft_vocab_size <= vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size], got {draft_vocab_size!r}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.logit_scale = float(logit_scale)
        self.context = context
        self.draft_vocab_size = vocab_size if draft_vocab_size is None else draft_vocab_size
        self.begin_calls = 0
        self.extend_sizes: list[int] = []
        self.scratch_parents: list[int] = []
        self.scratch_paths: list[list[tuple[int, ...]]] = []  # [b][node] token path from the root
        self._committed: list[tuple[int, ...]] | None = None  # per batch row
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def __repr__(self) -> str:
        return (
            f"TableDraftModel(vocab_size={self.vocab_size}, seed={self.seed}, logit_scale={self.logit_scale}, "
            f"context={self.context}, draft_vocab_size={self.draft_vocab_size})"
        )

    @property
    def extend_calls(self) -> int:
        """Number of ``extend`` calls since the last ``begin``."""
        return len(self.extend_sizes)

    @property
    def num_scratch(self) -> int:
        """Number of scratch nodes since the last ``begin``."""
        return len(self.scratch_parents)

    def logits_for(self, sequence: tuple[int, ...] | list[int] | torch.Tensor) -> torch.Tensor:
        """(V,) float32 logits after the token ``sequence`` (committed ids followed by a path): a fresh copy."""
        if isinstance(sequence, torch.Tensor):
            sequence = sequence.tolist()
        return self._row(tuple(int(t) for t in sequence)).clone()

    def _row(self, key: tuple[int, ...]) -> torch.Tensor:
        """Cached (V,) logits after ``key``; shared, never to be modified."""
        if self.context is not None:
            key = key[len(key) - self.context :] if self.context else ()
        row = self._cache.get(key)
        if row is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            row = self._compute(key)
            self._cache[key] = row
        return row

    def begin(self, request: DraftRequest) -> torch.Tensor:
        """Forget the scratch tree and return (B, V) logits after each row of ``request.input_ids``."""
        if request.vocab_size != self.vocab_size:
            raise ValueError(f"request.vocab_size {request.vocab_size} != model vocab_size {self.vocab_size}")
        self.begin_calls += 1
        self.extend_sizes = []
        self.scratch_parents = []
        self._committed = [tuple(row) for row in request.input_ids.tolist()]
        self.scratch_paths = [[] for _ in self._committed]
        return torch.stack([self._row(row) for row in self._committed])  # (B, V)

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Add ``M`` scratch nodes (parents (M,), tokens (B, M)); return (B, M, V) logits after each of them."""
        if self._committed is None:
            raise RuntimeError("call begin(request) before extend")
        parent_list = [int(p) for p in torch.as_tensor(parents).reshape(-1).tolist()]
        batch = len(self._committed)
        if tokens.dim() != 2 or tokens.shape[0] != batch or tokens.shape[1] != len(parent_list):
            raise ValueError(f"tokens must be (B, M) = ({batch}, {len(parent_list)}), got {tuple(tokens.shape)}")
        token_rows = tokens.tolist()
        if any(not 0 <= t < self.vocab_size for row in token_rows for t in row):
            raise ValueError(f"tokens must be in [0, {self.vocab_size})")
        first = self.num_scratch
        for j, parent in enumerate(parent_list):
            if not -1 <= parent < first + j:
                raise ValueError(f"new node {first + j}: parent {parent} is not -1 or an earlier scratch node")
        self.extend_sizes.append(len(parent_list))
        out = []
        for b, (committed, paths) in enumerate(zip(self._committed, self.scratch_paths, strict=True)):
            for j, parent in enumerate(parent_list):
                prefix = () if parent == -1 else paths[parent]
                paths.append(prefix + (token_rows[b][j],))
            out.append(torch.stack([self._row(committed + path) for path in paths[first:]]) if parent_list
                       else torch.empty(0, self.vocab_size))
        self.scratch_parents.extend(parent_list)
        return torch.stack(out)  # (B, M, V)

    def _compute(self, key: tuple[int, ...]) -> torch.Tensor:
        digest = hashlib.blake2b(repr((self.seed, key)).encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
        logits = torch.randn(self.vocab_size, generator=generator) * self.logit_scale  # (V,)
        logits[self.draft_vocab_size :] = float("-inf")
        return logits
