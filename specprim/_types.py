"""The two records every component exchanges: a `DraftTree` proposed by a drafter, and the `Verdict` of an
acceptance rule.

Notation (see docs/concepts.md): ``p`` is the target distribution, ``q`` the draft distribution, ``B`` the
batch, ``N`` the number of draft nodes, ``V`` the vocabulary, ``D`` the tree depth. The root is the last
committed token; ``parents[i] == -1`` marks a child of the root. Row 0 of ``p`` / ``q`` is the distribution of
the root's children, row ``i + 1`` the distribution of the children of node ``i``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cached_property
from typing import Literal, get_args

import torch

from specprim.sampling import SamplingConfig

Sampling = Literal["iid", "without_replacement", "deterministic"]
SAMPLING_SCHEMES: tuple[str, ...] = get_args(Sampling)


def token_id_list(ids: int | Sequence[int] | None) -> list[int]:
    """A token setting as configs write it (one id, several, or ``None`` for none) as a list of ids: the end
    tokens of a model's config or generation config, say."""
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else [int(i) for i in ids]


def validate_parents(parents: torch.Tensor | list[int]) -> list[int]:
    """Check that ``parents`` describes a tree in topological order and return it as a list.

    Raises ``ValueError`` naming the first offending node when ``parents[i]`` is not in ``[-1, i)``.
    """
    if isinstance(parents, torch.Tensor):
        if parents.dim() != 1:
            raise ValueError(f"parents must be 1-D (N,), got shape {tuple(parents.shape)}")
        if parents.is_floating_point() or parents.is_complex():
            raise ValueError(f"parents must be an integer tensor, got {parents.dtype}")
        parent_list = [int(x) for x in parents.tolist()]
    else:
        parent_list = list(parents)
        for i, parent in enumerate(parent_list):
            if not isinstance(parent, int) or isinstance(parent, bool):
                raise ValueError(f"node {i}: parent must be an int, got {parent!r}")
    for i, parent in enumerate(parent_list):
        if parent < -1 or parent >= i:
            raise ValueError(
                f"node {i}: parent {parent} breaks topological order (need -1 <= parents[i] < i)"
            )
    return parent_list


def depths_of(parents: list[int]) -> list[int]:
    """Depth of every node of a validated tree: children of the root have depth 1."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent == -1 else depths[parent] + 1)
    return depths


def children_of(parents: list[int] | tuple[int, ...]) -> list[list[int]]:
    """``children[c + 1]`` lists the children of node ``c`` of a validated tree (``c = -1``: the root), in node
    order."""
    table: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        table[parent + 1].append(node)
    return table


@dataclasses.dataclass(frozen=True, eq=False)
class DraftTree:
    """A batch of draft trees sharing one shape.

    Attributes:
        tokens: (B, N) long, the drafted token of every node.
        parents: (N,) long, topological (``parents[i] < i``); ``-1`` marks a child of the root.
        q: (B, N + 1, V) float or ``None``. Row 0 is the distribution the root's children were drawn from,
            row ``i + 1`` the one node ``i``'s children were drawn from. Rows of leaves are ignored.
            Required unless ``sampling == "deterministic"``.
        sampling: how siblings were drawn from their ``q`` row: ``"iid"`` (independently, with replacement),
            ``"without_replacement"`` (one after another, each excluding the earlier siblings) or
            ``"deterministic"`` (chosen without randomness, e.g. argmax, top-k or n-gram lookup).

    Guarantees: construction validates shapes, dtypes and topological order and raises ``ValueError`` on
    anything else. Tensors are stored as given (never copied or mutated).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = None
    sampling: Sampling = "deterministic"

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLING_SCHEMES:
            raise ValueError(f"sampling must be one of {SAMPLING_SCHEMES}, got {self.sampling!r}")
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.dim() != 2:
            raise ValueError("tokens must be a (B, N) tensor")
        if self.tokens.dtype != torch.long:
            raise ValueError(f"tokens must be torch.long, got {self.tokens.dtype}")
        if not isinstance(self.parents, torch.Tensor):
            raise ValueError("parents must be a (N,) long tensor")
        if self.parents.dtype != torch.long:
            raise ValueError(f"parents must be torch.long, got {self.parents.dtype}")
        object.__setattr__(self, "_parent_list", validate_parents(self.parents))
        batch, num_nodes = self.tokens.shape
        if self.parents.shape[0] != num_nodes:
            raise ValueError(f"tokens has {num_nodes} nodes but parents has {self.parents.shape[0]}")
        if self.q is None:
            if self.sampling != "deterministic":
                raise ValueError(f"q is required for sampling={self.sampling!r}")
        else:
            if self.q.dim() != 3 or self.q.shape[0] != batch or self.q.shape[1] != num_nodes + 1:
                raise ValueError(
                    f"q must have shape (B, N + 1, V) = ({batch}, {num_nodes + 1}, V), got {tuple(self.q.shape)}"
                )
            if not self.q.is_floating_point():
                raise ValueError(f"q must be a float tensor, got {self.q.dtype}")

    def to(self, device: torch.device | str) -> DraftTree:
        """The same tree with ``tokens`` and ``q`` on ``device`` (``parents`` stays where it is)."""
        device = torch.device(device)
        if self.tokens.device == device and (self.q is None or self.q.device == device):
            return self
        q = None if self.q is None else self.q.to(device)
        return dataclasses.replace(self, tokens=self.tokens.to(device), q=q)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def parent_list(self) -> list[int]:
        """``parents`` as a Python list (validated once at construction)."""
        return self._parent_list  # type: ignore[attr-defined]

    @cached_property
    def depth_list(self) -> list[int]:
        """Depth of every node; children of the root have depth 1."""
        return depths_of(self.parent_list)

    @property
    def depth(self) -> int:
        """Depth ``D`` of the tree (0 for an empty tree)."""
        return max(self.depth_list, default=0)

    @cached_property
    def children(self) -> list[list[int]]:
        """``children[c + 1]`` lists the children of node ``c`` (``c = -1`` is the root), in node order."""
        return children_of(self.parent_list)


@dataclasses.dataclass(frozen=True, eq=False)
class Verdict:
    """What an acceptance rule decided for a batch of trees.

    Attributes:
        path: (B, D) long, the accepted node ids from the root downwards, padded with ``-1``.
        num_accepted: (B,) long, the number of accepted draft tokens (the non-padded length of ``path``).
        next_token: (B,) long, the token emitted after the accepted path (the bonus or the correction).
    """

    path: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor


def truncate_tree(tree: DraftTree, max_depth: int) -> DraftTree:
    """The sub-tree of nodes at depth ``<= max_depth``, renumbered in order, with matching ``q`` rows."""
    keep = [i for i, depth in enumerate(tree.depth_list) if depth <= max_depth]
    if len(keep) == tree.num_nodes:
        return tree
    new_id = {old: new for new, old in enumerate(keep)}
    parents = [-1 if tree.parent_list[i] == -1 else new_id[tree.parent_list[i]] for i in keep]
    index = torch.tensor(keep, dtype=torch.long, device=tree.tokens.device)
    q = None
    if tree.q is not None:
        rows = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(keep, dtype=torch.long) + 1])
        q = tree.q.index_select(1, rows.to(tree.q.device))
    return DraftTree(
        tokens=tree.tokens.index_select(1, index),
        parents=torch.tensor(parents, dtype=torch.long, device=tree.parents.device),
        q=q,
        sampling=tree.sampling,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetFeatures:
    """Target hidden states at positions committed since the previous request.

    Attributes:
        hidden_states: one (B, n, H) tensor per layer the drafter asked for (``Drafter.feature_layers``, in that
            order), for the ``n`` positions ``start .. start + n - 1``.
        token_ids: (B, n) long, the token at each of those positions (the target's input there).
        start: absolute position of the first of them (0 at the start of a generation).
    """

    hidden_states: tuple[torch.Tensor, ...]
    token_ids: torch.Tensor
    start: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftRequest:
    """Everything a drafter may use to propose one tree.

    Attributes:
        input_ids: (B, T) long, every committed token; the last one is the root.
        sampling: the transforms the target uses; a drafter that samples applies the same ones to its logits.
        vocab_size: the target's ``V``; ``q`` must have this last dimension and tokens must be below it.
        max_depth: draft no deeper than this (deeper nodes could never be emitted).
        generator: the only source of randomness a drafter may use.
        step: 0 for the first request of a generation, then 1, 2, ...
        features: for drafters with ``feature_layers``, the target's hidden states at the positions committed
            since the previous request: every position but the root's, so at step 0 the prompt without its
            last token, later the previous root and the accepted tokens. ``None`` for other drafters.
    """

    input_ids: torch.Tensor
    sampling: SamplingConfig
    vocab_size: int
    max_depth: int
    generator: torch.Generator | None = None
    step: int = 0
    features: TargetFeatures | None = None
