"""Retrieval drafting (REST, He et al. 2024): what followed the current suffix in a datastore of token sequences."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from specprim._integrity import DamagedFileError, UnsafeFileError, atomic_path
from specprim._types import DraftRequest, DraftTree, Verdict

__all__ = ["Datastore", "DatastoreLookup", "tokenizer_fingerprint"]

_SEPARATOR = -1  # ends every sequence in the joined token array; no n-gram or continuation crosses it
_BASE = np.int64(1_000_003)  # polynomial hash base; products wrap modulo 2**64 (collisions are checked)


class Datastore:
    """An n-gram index over a corpus of token sequences: "where, in the corpus, did these last tokens occur".

    The sequences are joined into one array with a separator after each; for every ``n`` in ``[min_ngram,
    max_ngram]`` the index keeps the sorted 64-bit polynomial hashes of every n-gram inside one sequence and the
    position right after each occurrence. A lookup binary-searches the hash of the context's last ``n`` tokens,
    longest ``n`` first, and checks the candidates token by token (so hash collisions never produce a wrong match).
    The index is built on first use: one sort per ``n``, ~6 s for 10M tokens on 2 cores; memory ~16 bytes
    per token per ``n``.

    Args:
        sequences: token-id sequences (e.g. answers of the target, tokenised without special tokens); ids must be
            non-negative.
        max_ngram: the longest suffix looked up.
        min_ngram: the shortest suffix looked up (a shorter match drafts nothing).
        tokenizer: the :func:`tokenizer_fingerprint` of the tokenizer that made ``sequences``, if known; saved with
            the corpus so that :meth:`check_tokenizer` can refuse a datastore made for another tokenizer.
    """

    def __init__(self, sequences: Iterable[Sequence[int]], *, max_ngram: int = 6, min_ngram: int = 2,
                 tokenizer: str | None = None) -> None:
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        parts = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
        if any(p.size and int(p.min()) < 0 for p in parts):
            raise ValueError("token ids must be non-negative")
        parts = [p for p in parts if p.size]
        if not parts:
            raise ValueError("a datastore needs at least one non-empty sequence")
        self.max_ngram, self.min_ngram, self.tokenizer = max_ngram, min_ngram, tokenizer
        separator = np.array([_SEPARATOR], dtype=np.int64)
        self.tokens = np.concatenate([x for p in parts for x in (p, separator)])  # (N,) with separators
        self.num_sequences = len(parts)
        self.max_token_id = int(self.tokens.max())

    def __len__(self) -> int:
        """Number of corpus tokens (separators not counted)."""
        return int(self.tokens.shape[0]) - self.num_sequences

    def __repr__(self) -> str:
        return (f"Datastore({len(self)} tokens in {self.num_sequences} sequences, "
                f"ngram {self.min_ngram}..{self.max_ngram})")

    @classmethod
    def from_texts(cls, texts: Iterable[str], tokenizer: Any, **kwargs: Any) -> Datastore:
        """Tokenise ``texts`` (no special tokens) and index them, recording the tokenizer's fingerprint; ``kwargs``
        go to the constructor."""
        texts = [t for t in texts if t]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        return cls(ids, tokenizer=tokenizer_fingerprint(tokenizer), **kwargs)

    @classmethod
    def concatenate(cls, stores: Sequence[Datastore], **kwargs: Any) -> Datastore:
        """One datastore over the corpora of ``stores`` (their tokenizers must agree); ``kwargs`` (``max_ngram``,
        ``min_ngram``) default to the first store's."""
        if not stores:
            raise ValueError("concatenate needs at least one datastore")
        known = {s.tokenizer for s in stores} - {None}
        if len(known) > 1:
            raise ValueError("the datastores were built with different tokenizers")
        options = {"min_ngram": stores[0].min_ngram, "max_ngram": stores[0].max_ngram,
                   "tokenizer": next(iter(known), None), **kwargs}
        return cls((seq for store in stores for seq in store.sequences()), **options)

    def sequences(self) -> list[np.ndarray]:
        """The corpus sequences, each a (L,) int64 array."""
        return _split(self.tokens)

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise ``ValueError`` when this datastore records a tokenizer fingerprint other than ``tokenizer``'s."""
        if self.tokenizer is not None and self.tokenizer != tokenizer_fingerprint(tokenizer):
            raise ValueError(f"{self!r} was built with another tokenizer than "
                             f"{getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r}")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the corpus (not the index, rebuilt on load), lookup lengths and tokenizer fingerprint to a
        compressed ``.npz`` file (token ids as uint16 when they fit; ``.npz`` is appended to a path without it).
        The file appears whole or not at all (written under a temporary name, then renamed); the zip format records
        a CRC-32 of each array, checked by :meth:`load`."""
        dtype = np.uint16 if self.max_token_id < np.iinfo(np.uint16).max else np.int32
        stored = np.where(self.tokens == _SEPARATOR, np.iinfo(dtype).max, self.tokens).astype(dtype)
        final = os.fspath(path) if os.fspath(path).endswith(".npz") else f"{os.fspath(path)}.npz"
        with atomic_path(final) as staged, open(staged, "wb") as f:
            np.savez_compressed(f, tokens=stored, ngram=np.array([self.min_ngram, self.max_ngram]),
                                tokenizer=np.array(self.tokenizer or ""))

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> Datastore:
        """Read a file written by :meth:`save`; ``kwargs`` (``max_ngram``, ``min_ngram``) override the saved
        lookup lengths. Raises ``ValueError`` naming the file when it is truncated or corrupted (a CRC-32 of each
        array is checked) or holds pickled objects (never loaded: a pickle can run code)."""
        stored, (min_ngram, max_ngram), fingerprint = _read_npz(path)
        tokens = np.where(stored == np.iinfo(stored.dtype).max, _SEPARATOR, stored.astype(np.int64))
        options = {"min_ngram": int(min_ngram), "max_ngram": int(max_ngram), "tokenizer": fingerprint or None,
                   **kwargs}
        return cls(_split(tokens), **options)

    def matches(self, context: Sequence[int], limit: int | None = None) -> tuple[int, np.ndarray]:
        """The longest suffix of ``context`` (``min_ngram <= n <= max_ngram`` tokens) found in the corpus.

        Returns ``(n, starts)``: ``starts`` (C,) int64, for each occurrence the corpus position right after it (where
        its continuation begins), in corpus order; ``(0, empty)`` when no suffix of ``min_ngram`` tokens occurs.
        With ``limit``, at most ``limit`` occurrences, evenly spaced through the corpus, are checked and returned
        (a frequent bigram occurs hundreds of thousands of times in a large corpus).
        """
        query = np.asarray(list(context)[-self.max_ngram:], dtype=np.int64)
        for n in range(min(self.max_ngram, query.shape[0]), self.min_ngram - 1, -1):
            hashes, starts = self.index[n]
            key = _hash(query[None, -n:])[0]
            lo, hi = np.searchsorted(hashes, key, "left"), np.searchsorted(hashes, key, "right")
            found = starts[lo:hi]  # (C,) ascending: the index sorts stably
            if limit is not None and found.size > limit:
                found = found[np.linspace(0, found.size - 1, limit).round().astype(np.int64)]
            grams = self.tokens[found[:, None] - n + np.arange(n)]  # (C, n): the matched n-grams
            found = found[(grams == query[-n:]).all(1)]  # drop hash collisions
            if found.size:
                return n, found
        return 0, np.zeros(0, dtype=np.int64)

    def continuations(self, starts: np.ndarray, length: int) -> np.ndarray:
        """(C,) corpus positions -> (C, length) the tokens from each, ``-1`` from the end of its sequence on."""
        index = np.minimum(starts[:, None] + np.arange(length), self.tokens.shape[0] - 1)  # (C, length)
        spans = self.tokens[index]
        ended = np.cumsum(spans == _SEPARATOR, axis=1) > 0  # (C, length): at or after a separator
        return np.where(ended, _SEPARATOR, spans)

    @functools.cached_property
    def index(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``{n: (hashes, starts)}``: the sorted hashes (M,) of the n-grams inside one sequence and the position after
        each (M,), for every ``n``. Built on first use (the first lookup, or a drafter's construction); hashes of
        length ``n`` extend those of length ``n - 1`` (one pass over the corpus per ``n``)."""
        tokens = self.tokens
        separators = np.concatenate([[0], np.cumsum(tokens == _SEPARATOR)])  # (N + 1,) separators before each i
        index = {}
        hashes = np.zeros(tokens.shape[0] + 1, dtype=np.int64)  # (N - n + 1,) hash of the n-gram starting at i
        with np.errstate(over="ignore"):
            for n in range(1, self.max_ngram + 1):
                hashes = hashes[:-1] * _BASE + tokens[n - 1:] + 1
                if n < self.min_ngram:
                    continue
                starts = np.arange(tokens.shape[0] - n + 1)
                inside = starts[separators[starts + n] == separators[starts]]  # (M,) not crossing a separator
                ordered, order = torch.sort(torch.from_numpy(hashes[inside]), stable=True)  # torch: parallel
                index[n] = ordered.numpy(), inside[order.numpy()] + n
        return index


def _read_npz(path: str | os.PathLike[str]) -> tuple[np.ndarray, list[int], str]:
    """``(tokens, [min_ngram, max_ngram], tokenizer fingerprint)`` of a datastore file, every array read whole
    (so that each one's CRC-32 is checked)."""
    try:
        with np.load(path) as data:  # allow_pickle=False: an object array raises instead of unpickling
            stored, ngram = data["tokens"], data["ngram"].tolist()
            fingerprint = str(data["tokenizer"]) if "tokenizer" in data else ""
    except ValueError as error:
        if "pickle" in str(error):
            raise UnsafeFileError(f"{os.fspath(path)} holds pickled Python objects, which are never loaded (a pickle "
                                  "can run code): not a file written by Datastore.save") from error
        raise DamagedFileError(f"{os.fspath(path)} is not a whole datastore written by Datastore.save "
                               f"({error})") from error
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        raise DamagedFileError(f"{os.fspath(path)} is not a whole datastore written by Datastore.save "
                               f"({type(error).__name__}: {error})") from error
    if not (isinstance(ngram, list) and len(ngram) == 2 and stored.ndim == 1 and stored.dtype.kind in "iu"):
        raise DamagedFileError(f"{os.fspath(path)} is not a datastore written by Datastore.save (unexpected arrays)")
    return stored, ngram, fingerprint


def _split(tokens: np.ndarray) -> list[np.ndarray]:
    """(N,) joined tokens, a separator after each sequence -> the sequences (without separators)."""
    ends = np.flatnonzero(tokens == _SEPARATOR)  # (S,) separator positions
    return [s[:-1] for s in np.split(tokens, ends + 1)[:-1]]  # each split ends with its separator


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of ``tokenizer``'s vocabulary (token -> id): equal for tokenizers that map text to the same ids."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def _hash(grams: np.ndarray) -> np.ndarray:
    """(M, n) int64 -> (M,) int64 polynomial hashes (wrapping arithmetic; equal n-grams hash equally; the same
    values :attr:`Datastore.index` holds, computed incrementally)."""
    hashes = np.zeros(grams.shape[0], dtype=np.int64)
    with np.errstate(over="ignore"):
        for column in grams.T:
            hashes = hashes * _BASE + column + 1
    return hashes


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatastoreLookup:
    """Training-free retrieval drafter (REST): the most frequent continuations, in a datastore, of the longest
    suffix of the committed text found there, drafted as a tree.

    The tree holds the ``num_nodes`` most frequent continuation *prefixes* of the matched occurrences (at most
    ``num_tokens`` deep, never past the end of a corpus sequence): a prefix is counted once per occurrence it
    starts, so a node's count never exceeds its parent's, and ordering by count (then by depth, then by the first
    occurrence holding it) puts every parent before its children. When more than ``max_samples`` occurrences
    match, ``max_samples`` of them, evenly spaced through the corpus, are counted. No match drafts nothing (a
    plain target forward).

    Tokens are chosen without randomness: ``sampling="deterministic"``, ``q=None``, so any rule that is lossless
    for deterministic drafts (:class:`specprim.acceptance.Greedy`, :class:`specprim.acceptance.SpeculativeSampling`)
    keeps the target's distribution; it joins a :class:`specprim.drafters.UnionDrafter` like prompt lookup.
    The datastore must use the target's tokenizer: an id outside the target's vocabulary raises ``ValueError``.
    Batch size 1 only.
    """

    stateless: ClassVar[bool] = True  # proposals depend on the request only (see UnionDrafter)
    datastore: Datastore
    num_tokens: int = 4
    num_nodes: int = 4
    max_samples: int = 1024

    def __post_init__(self) -> None:
        if not isinstance(self.datastore, Datastore):
            raise TypeError(f"datastore must be a Datastore, got {type(self.datastore).__name__}")
        for name in ("num_tokens", "num_nodes", "max_samples"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.datastore.index  # noqa: B018 - build the index now, not inside the first (timed) step

    def __repr__(self) -> str:
        return (f"DatastoreLookup({self.datastore!r}, num_tokens={self.num_tokens}, num_nodes={self.num_nodes}, "
                f"max_samples={self.max_samples})")

    def propose(self, request: DraftRequest) -> DraftTree:
        """A tree of the most frequent continuation prefixes of the longest matched suffix."""
        ids = request.input_ids
        if ids.shape[0] != 1:
            raise ValueError("DatastoreLookup drafts for batch size 1")
        if self.datastore.max_token_id >= request.vocab_size:
            raise ValueError(f"the datastore holds token id {self.datastore.max_token_id}, outside the target's "
                             f"vocabulary ({request.vocab_size}): was it built with another tokenizer?")
        length = min(self.num_tokens, request.max_depth)
        tokens: list[int] = []
        parents: list[int] = []
        if length > 0:
            _, starts = self.datastore.matches(ids[0, -self.datastore.max_ngram:].tolist(), self.max_samples)
            if starts.size:
                tokens, parents, _ = frequent_prefix_tree(self.datastore.continuations(starts, length),
                                                          self.num_nodes)
        return DraftTree(
            tokens=torch.tensor(tokens, dtype=torch.long, device=ids.device).reshape(1, len(tokens)),
            parents=torch.tensor(parents, dtype=torch.long).reshape(len(parents)),
            sampling="deterministic",
        )

    def observe(self, verdict: Verdict) -> None:
        """Stateless: the datastore does not change while decoding."""


def frequent_prefix_tree(spans: np.ndarray, budget: int) -> tuple[list[int], list[int], list[int]]:
    """(C, L) continuations (``-1`` past a sequence's end) -> the trie of the ``budget`` most frequent prefixes:
    its tokens, parents and counts (how many of the ``C`` rows start with each node's prefix; never above the
    parent's).

    Order: count descending, then depth, then the first row holding the prefix; parents therefore come first.
    Prefixes are grouped exactly, depth by depth: a prefix is (its parent prefix's id, its last token).
    """
    rows, length = spans.shape
    group = np.full(rows, -1, dtype=np.int64)  # (C,) global id of each row's prefix so far (-1: the root)
    alive = np.ones(rows, dtype=bool)  # (C,) rows whose sequence has not ended yet
    parent, token, count, depth, first = [], [], [], [], []  # per candidate prefix
    for d in range(length):
        alive &= spans[:, d] != _SEPARATOR
        if not alive.any():
            break
        live = np.flatnonzero(alive)  # (A,)
        keys = (group[live] + 1) * 2**32 + spans[live, d]  # exact: (parent id + 1, token) in one int64
        unique, first_live, inverse, counts = np.unique(keys, return_index=True, return_inverse=True,
                                                        return_counts=True)
        offset = sum(map(len, count))
        parent.append(unique // 2**32 - 1)
        token.append(unique % 2**32)
        count.append(counts)
        depth.append(np.full(unique.shape, d))
        first.append(live[first_live])
        group[live] = offset + inverse.reshape(-1)
    if not count:
        return [], [], []
    parent_all, token_all = np.concatenate(parent), np.concatenate(token)
    order = np.lexsort((np.concatenate(first), np.concatenate(depth), -np.concatenate(count)))[:budget]
    node_of = {int(c): i for i, c in enumerate(order.tolist())}
    parents = [-1 if parent_all[c] < 0 else node_of[int(parent_all[c])] for c in order.tolist()]
    return token_all[order].tolist(), parents, np.concatenate(count)[order].tolist()
