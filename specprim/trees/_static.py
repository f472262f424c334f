"""A fixed sparse tree given as data (Medusa-style): every node is a path of sibling ranks."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import torch

from specprim._types import DraftRequest, DraftTree
from specprim.trees._base import TreeDraftModel
from specprim.trees._chain import empty_tree

__all__ = ["StaticTree"]

Path = tuple[int, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StaticTree:
    """A fixed tree shape: ``paths`` lists every node as the ranks of its tokens from the root down.

    Rank ``r`` at a node is the ``r``-th most likely token of that node's draft distribution: ranked by
    ``request.sampling.probs(logits)`` when sampling, by the logits when greedy. For example
    ``((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))`` drafts the two best first tokens, the two best
    continuations of the best one, the best continuation of the second one, and one more token below ``(0, 0)``.

    ``paths`` must be non-empty tuples of non-negative ints, without duplicates, and prefix-closed (every
    prefix of a path is a path); otherwise construction raises ``ValueError``. They are stored sorted by
    ``(length, path)``, which is the node order of the built tree (topological).

    ``build`` grows the tree depth by depth: the top-k of every node of depth ``d - 1`` gives the nodes of depth
    ``d``, then **one** batched ``extend`` adds all depth-``d`` nodes that have children. Paths longer than
    ``request.max_depth`` are dropped. By default the choice is deterministic for greedy and sampling alike:
    ``sampling="deterministic"``, ``q=None`` (lossless under ``SpeculativeSampling``'s deterministic rule).
    Siblings have distinct ranks, hence distinct tokens.

    With ``sample_without_replacement=True`` and a sampling (non-greedy) request, rank ``r`` is instead the
    ``r``-th token *drawn without replacement* from the node's transformed distribution (Gumbel-top-k with
    ``request.generator``, which orders tokens exactly as sequential draws without replacement do), and the tree
    declares ``sampling="without_replacement"`` with those distributions as ``q`` (rows of leaves are zero).
    Ranks beyond a row's support get zero-probability tokens, which verification skips.
    """

    paths: tuple[Path, ...]
    sample_without_replacement: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", _validated_paths(self.paths))

    @classmethod
    def from_branching(cls, widths: Sequence[int]) -> StaticTree:
        """The full tree with the top ``widths[d]`` tokens below every node of depth ``d`` (root: depth 0).

        ``from_branching((3, 2, 1))`` has 3 + 3*2 + 3*2*1 = 15 nodes.
        """
        widths = tuple(widths)
        if not widths or any(not _is_int(w) or w < 1 for w in widths):
            raise ValueError(f"widths must be a non-empty sequence of positive ints, got {widths!r}")
        paths = [
            path
            for depth in range(1, len(widths) + 1)
            for path in itertools.product(*(range(w) for w in widths[:depth]))
        ]
        return cls(paths=tuple(paths))

    @classmethod
    def chain(cls, k: int) -> StaticTree:
        """The chain of ``k`` argmax tokens: paths ``(0,), (0, 0), ...``."""
        if not _is_int(k) or k < 1:
            raise ValueError(f"chain length k must be a positive int, got {k!r}")
        return cls(paths=tuple((0,) * depth for depth in range(1, k + 1)))

    @property
    def depth(self) -> int:
        """Length of the longest path."""
        return len(self.paths[-1])

    @property
    def parent_list(self) -> list[int]:
        """The parents list of the full tree (node ``i`` is ``paths[i]``)."""
        index = {path: i for i, path in enumerate(self.paths)}
        return [index.get(path[:-1], -1) for path in self.paths]

    def build(self, model: TreeDraftModel, request: DraftRequest) -> DraftTree:
        """Draft the tree of ``paths`` no longer than ``request.max_depth``, nodes in the order of ``paths``."""
        paths = [path for path in self.paths if len(path) <= request.max_depth]
        if not paths:
            return empty_tree(request)
        widest = 1 + max(max(path) for path in paths)
        if widest > request.vocab_size:
            raise ValueError(f"rank {widest - 1} needs more than the vocabulary's {request.vocab_size} tokens")
        index = {path: i for i, path in enumerate(paths)}
        internal = {path[:-1] for path in paths if len(path) > 1}  # nodes that have children
        scratch: dict[Path, int] = {(): -1}  # path -> scratch id of the extended nodes (the root is -1)
        row_logits = model.begin(request)[:, None]  # (B, P, V): children's logits of P parents, here the root
        row_of: dict[Path, int] = {(): 0}  # parent path -> its row in row_logits
        tokens: list[torch.Tensor] = []  # per depth: (B, n_d)
        sampled = self.sample_without_replacement and not request.sampling.is_greedy
        q_of: dict[Path, torch.Tensor] = {}  # parent path -> (B, V) the distribution its children were drawn from
        depth = max(len(path) for path in paths)
        for d in range(1, depth + 1):
            level = [path for path in paths if len(path) == d]  # already sorted
            if sampled:
                probs = request.sampling.probs(row_logits)  # (B, P, V)
                q_of.update({parent: probs[:, row] for parent, row in row_of.items()})
                tokens_d = self._drawn_children(probs, row_of, level, request.generator)  # (B, n_d)
            else:
                tokens_d = self._children(row_logits, row_of, level, request)  # (B, n_d)
            tokens.append(tokens_d)
            grow = [i for i, path in enumerate(level) if path in internal]
            if not grow:
                continue
            parents = torch.tensor([scratch[level[i][:-1]] for i in grow], dtype=torch.long)  # (M,)
            first = len(scratch) - 1
            for offset, i in enumerate(grow):
                scratch[level[i]] = first + offset
            row_logits = model.extend(parents, tokens_d[:, grow])  # (B, M, V)
            row_of = {level[i]: row for row, i in enumerate(grow)}
        parent_ids = torch.tensor([index.get(path[:-1], -1) for path in paths], dtype=torch.long)  # (N,)
        all_tokens = torch.cat(tokens, dim=1)  # (B, N)
        if not sampled:
            return DraftTree(tokens=all_tokens, parents=parent_ids, sampling="deterministic")
        zeros = torch.zeros_like(q_of[()])
        q = torch.stack([q_of[()]] + [q_of.get(path, zeros) for path in paths], dim=1)  # (B, N + 1, V)
        return DraftTree(tokens=all_tokens, parents=parent_ids, q=q, sampling="without_replacement")

    @staticmethod
    def _drawn_children(
        probs: torch.Tensor, row_of: dict[Path, int], level: list[Path], generator: torch.Generator | None
    ) -> torch.Tensor:
        """Tokens (B, n) of the nodes of ``level``: draw ``path[-1]`` of its parent's distribution, drawn without
        replacement. Gumbel-top-k: sorting ``log q + Gumbel noise`` gives the order of sequential draws."""
        uniform = torch.rand(probs.shape, generator=generator, device=probs.device).clamp_min(1e-20)
        keys = probs.log() - (-uniform.log()).log()  # (B, P, V), -inf where q == 0
        return _pick(keys, row_of, level)

    @staticmethod
    def _children(
        row_logits: torch.Tensor, row_of: dict[Path, int], level: list[Path], request: DraftRequest
    ) -> torch.Tensor:
        """Tokens (B, n) of the ``n`` nodes of ``level``: rank ``path[-1]`` of their parent's row."""
        scores = row_logits.float() if request.sampling.is_greedy else request.sampling.probs(row_logits)
        return _pick(scores, row_of, level)


def _pick(scores: torch.Tensor, row_of: dict[Path, int], level: list[Path]) -> torch.Tensor:
    """(B, P, V) scores of P parents -> (B, n) tokens: node ``path`` gets rank ``path[-1]`` of its parent's row."""
    width = 1 + max(path[-1] for path in level)
    ranked = scores.topk(width, dim=-1).indices  # (B, P, width), best first
    rows = torch.tensor([row_of[path[:-1]] for path in level], device=ranked.device)  # (n,)
    ranks = torch.tensor([path[-1] for path in level], device=ranked.device)  # (n,)
    return ranked[:, rows, ranks]  # (B, n)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validated_paths(paths: object) -> tuple[Path, ...]:
    """``paths`` as a tuple of int tuples sorted by (length, path); ``ValueError`` on anything invalid."""
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence) or not paths:
        raise ValueError(f"paths must be a non-empty sequence of rank tuples, got {paths!r}")
    normal: list[Path] = []
    for path in paths:
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or not path:
            raise ValueError(f"every path must be a non-empty sequence of ranks, got {path!r}")
        if any(not _is_int(rank) or rank < 0 for rank in path):
            raise ValueError(f"ranks must be non-negative ints, got path {path!r}")
        normal.append(tuple(path))
    if len(set(normal)) != len(normal):
        duplicate = next(path for path in normal if normal.count(path) > 1)
        raise ValueError(f"duplicate path {duplicate!r}")
    known = set(normal)
    for path in normal:
        if len(path) > 1 and path[:-1] not in known:
            raise ValueError(f"paths are not prefix-closed: {path!r} has no parent path {path[:-1]!r}")
    return tuple(sorted(normal, key=lambda path: (len(path), path)))
