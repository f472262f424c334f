"""The `AcceptanceRule` protocol and the helpers every rule shares (validation, tree tables, verdicts)."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Protocol, runtime_checkable

import torch

from specprim._types import DraftTree, Verdict, children_of, depths_of


@runtime_checkable
class AcceptanceRule(Protocol):
    """Verify a batch of draft trees against the target distribution ``p``.

    A rule is a callable ``rule(p, tree, generator=None) -> Verdict``:

    - ``p``: (B, N + 1, V) target probabilities, already transformed (temperature / top-k / top-p). Row 0 is
      the distribution of the root's children, row ``i + 1`` that of node ``i``'s children.
    - ``tree``: the `DraftTree` (tokens (B, N), parents (N,), q (B, N + 1, V) or ``None``, sampling scheme).
    - ``generator``: the only source of randomness (``None`` falls back to torch's global generator).

    Returns a `Verdict` on ``p``'s device: ``path`` (B, D) accepted node ids from the root down, ``-1``
    padded; ``num_accepted`` (B,) long; ``next_token`` (B,) long, the token emitted after the path.

    ``lossless`` (class attribute) declares the guarantee: ``True`` means the emitted tokens are distributed
    exactly as autoregressive sampling from ``p`` whenever the drafter honours the q-contract. A rule that is
    exact only for greedy decoding (one-hot ``p``) may also set ``greedy_only = True`` (optional; the
    generation loop then refuses it under sampling). Rules never mutate ``p``, ``q`` or the tree, and raise
    ``ValueError`` on inconsistent shapes.
    """

    lossless: ClassVar[bool]

    def __call__(
        self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None
    ) -> Verdict: ...


def validate_inputs(p: torch.Tensor, tree: DraftTree) -> None:
    """Cheap consistency checks shared by all rules; raises ``ValueError`` with the offending shapes."""
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a DraftTree, got {type(tree).__name__}")
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise ValueError("p must be a floating-point tensor of target probabilities (B, N + 1, V)")
    batch, num_nodes = tree.batch_size, tree.num_nodes
    if p.dim() != 3 or p.shape[0] != batch or p.shape[1] != num_nodes + 1:
        raise ValueError(
            f"p must have shape (B, N + 1, V) = ({batch}, {num_nodes + 1}, V) to match the tree, "
            f"got {tuple(p.shape)}"
        )
    vocab = p.shape[2]
    if vocab == 0:
        raise ValueError("p has an empty vocabulary dimension (V == 0)")
    if tree.q is not None and tree.q.shape[2] != vocab:
        raise ValueError(f"q has vocabulary size {tree.q.shape[2]} but p has {vocab}")
    if tree.tokens.device != p.device:
        raise ValueError(f"tree tokens are on {tree.tokens.device} but p is on {p.device}")
    if num_nodes and batch and (int(tree.tokens.min()) < 0 or int(tree.tokens.max()) >= vocab):
        raise ValueError(f"tree tokens must lie in [0, V) = [0, {vocab})")


@dataclasses.dataclass(frozen=True)
class TreeTables:
    """Index tables of one tree shape, on one device.

    Attributes:
        ancestors: (N, N) bool, ``ancestors[i, j]`` iff node ``j`` is an ancestor-or-self of node ``i``.
        depth: (N + 1,) long, ``depth[c + 1]`` is the depth of node ``c``; ``depth[0] == 0`` is the root.
        paths: (N + 1, D) long, ``paths[c + 1]`` lists node ``c``'s ancestors-or-self from depth 1 down,
            ``-1`` padded; ``paths[0]`` (the root) is all ``-1``.
        children: (N + 1, K) long, ``children[c + 1]`` lists node ``c``'s children in node order, ``-1``
            padded; ``K`` is the largest number of siblings (0 for an empty tree).
        parent_row: (N,) long, ``parents + 1``: the row of ``p`` / ``q`` node ``i`` was drafted from.
    """

    ancestors: torch.Tensor
    depth: torch.Tensor
    paths: torch.Tensor
    children: torch.Tensor
    parent_row: torch.Tensor

    @classmethod
    def of(cls, tree: DraftTree, device: torch.device) -> TreeTables:
        """The tables of ``tree``'s shape on ``device``: built once per (parents, device) and shared (rules read
        them, never write them), since a generation drafts the same few shapes again and again."""
        return _tables(tuple(tree.parent_list), torch.device(device))


@functools.lru_cache(maxsize=1024)
def _tables(parents: tuple[int, ...], device: torch.device) -> TreeTables:
    depths = depths_of(list(parents))
    num_nodes, max_depth = len(parents), max(depths, default=0)
    ancestors = torch.zeros(num_nodes, num_nodes, dtype=torch.bool)
    paths = torch.full((num_nodes + 1, max_depth), -1, dtype=torch.long)
    for node, parent in enumerate(parents):
        if parent >= 0:
            ancestors[node] = ancestors[parent]
            paths[node + 1] = paths[parent + 1]
        ancestors[node, node] = True
        paths[node + 1, depths[node] - 1] = node
    kids = children_of(parents)  # row c + 1: the children of node c
    children = torch.full((num_nodes + 1, max(map(len, kids))), -1, dtype=torch.long)
    for row, nodes in enumerate(kids):
        children[row, : len(nodes)] = torch.tensor(nodes, dtype=torch.long)
    return TreeTables(
        ancestors=ancestors.to(device),
        depth=torch.tensor([0, *depths], dtype=torch.long, device=device),
        paths=paths.to(device),
        children=children.to(device),
        parent_row=(torch.tensor(parents, dtype=torch.long) + 1).to(device),
    )


def rows_at(x: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """(B, N + 1, V), (B,) node ids in ``[-1, N)`` -> (B, V): the row ``nodes + 1`` of every batch element."""
    return x[torch.arange(x.shape[0], device=x.device), nodes + 1]


def all_ancestors_flagged(flags: torch.Tensor, tables: TreeTables) -> torch.Tensor:
    """(B, N) bool per-node flags -> (B, N) bool: every ancestor-or-self of the node is flagged."""
    unflagged = (~flags).to(torch.float32)  # (B, N)
    # Count of unflagged ancestors-or-self: (B, N) @ (N, N)^T.
    return (unflagged @ tables.ancestors.T.to(torch.float32)) == 0


def deepest(accepted: torch.Tensor, tables: TreeTables, score: torch.Tensor | None = None) -> torch.Tensor:
    """Pick one accepted node per row: deepest first, then highest ``score``, then lowest node id.

    Args:
        accepted: (B, N) bool.
        score: (B, N) float tie-breaker among equally deep nodes, or ``None``.

    Returns: (B,) long node id, ``-1`` where nothing is accepted (the path stops at the root).
    """
    batch, num_nodes = accepted.shape
    if num_nodes == 0:
        return torch.full((batch,), -1, dtype=torch.long, device=accepted.device)
    depth = tables.depth[1:].expand(batch, num_nodes)  # (B, N)
    depth = torch.where(accepted, depth, torch.full_like(depth, -1))
    candidates = accepted & (depth == depth.max(dim=1, keepdim=True).values)  # (B, N)
    if score is None:
        score = torch.zeros(batch, num_nodes, device=accepted.device)
    score = torch.where(candidates, score, torch.full_like(score, float("-inf")))
    best = score.max(dim=1, keepdim=True).values  # (B, 1)
    node_ids = torch.arange(num_nodes, device=accepted.device).expand(batch, num_nodes)
    first = torch.where(candidates & (score == best), node_ids, num_nodes).min(dim=1).values  # (B,)
    return torch.where(accepted.any(dim=1), first, -1)


def verdict_at(end: torch.Tensor, next_token: torch.Tensor, tables: TreeTables) -> Verdict:
    """The `Verdict` of rows whose accepted path ends at node ``end`` (B,) (``-1``: nothing accepted)."""
    return Verdict(
        path=tables.paths[end + 1],  # (B, D)
        num_accepted=tables.depth[end + 1],  # (B,)
        next_token=next_token.to(torch.long),  # (B,)
    )
