"""Pure tensor functions that turn a tree's ``parents`` into attention masks and position ids."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from specprim._types import depths_of, validate_parents

ParentsLike = torch.Tensor | Sequence[int]


def _parent_list(parents: ParentsLike) -> list[int]:
    return validate_parents(parents if isinstance(parents, torch.Tensor) else list(parents))


def tree_attention_mask(parents: ParentsLike, device: torch.device | str | None = None) -> torch.Tensor:
    """(N, N) bool mask, True iff ``j == i`` or node ``j`` is an ancestor of node ``i``.

    ``parents`` is a list or (N,) tensor in topological order (``-1`` = child of the root).
    Raises ``ValueError`` naming the first node that breaks topological order.
    """
    parent_list = _parent_list(parents)
    num_nodes = len(parent_list)
    mask = torch.eye(num_nodes, dtype=torch.bool)  # (N, N)
    for i, parent in enumerate(parent_list):
        if parent >= 0:
            mask[i] |= mask[parent]  # ancestors of i = parent's ancestors-or-self
    if device is None and isinstance(parents, torch.Tensor):
        device = parents.device
    return mask.to(device) if device is not None else mask


def tree_position_ids(
    parents: ParentsLike, offset: int = 0, device: torch.device | str | None = None
) -> torch.Tensor:
    """(N,) long position of every node: ``offset + depth``, where children of the root have depth 1.

    ``offset`` is the position of the root (the last committed token).
    """
    depths = torch.tensor(depths_of(_parent_list(parents)), dtype=torch.long)  # (N,)
    if device is None and isinstance(parents, torch.Tensor):
        device = parents.device
    positions = depths + offset
    return positions.to(device) if device is not None else positions


def from_edges(edges: Iterable[tuple[int, int]], num_nodes: int | None = None) -> list[int]:
    """Convert an edge list ``[(parent, child), ...]`` in any order into a topological ``parents`` list.

    Node ids are ``0..N-1`` and ``-1`` is the root. The returned list is indexed by the *original* ids when
    they are already topological; otherwise a ``ValueError`` tells which node comes before its parent, since
    renumbering would silently change which token each id means. Use :func:`topological_order` first to
    renumber a tree on purpose.

    Raises ``ValueError`` naming the node for: a node with two parents, a cycle, a self-loop, an id gap
    (some id in ``0..N-1`` missing), a negative child id, or a parent that is not a node.
    """
    parent_of = _edges_to_parent_map(edges)
    size = num_nodes if num_nodes is not None else (max(parent_of) + 1 if parent_of else 0)
    for node in range(size):
        if node not in parent_of:
            raise ValueError(f"node {node}: missing (gap in node ids 0..{size - 1})")
    extra = sorted(set(parent_of) - set(range(size)))
    if extra:
        raise ValueError(f"node {extra[0]}: id outside 0..{size - 1}")
    _check_acyclic(parent_of)
    parents = [parent_of[i] for i in range(size)]
    for i, parent in enumerate(parents):
        if parent >= i:
            raise ValueError(
                f"node {i}: its parent {parent} has a larger id; renumber with topological_order(edges)"
            )
    return parents


def topological_order(edges: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Renumber an edge-list tree into topological order.

    Returns ``(parents, old_ids)``: ``parents`` is the topological parents list and ``old_ids[new] = old``.
    Validates like :func:`from_edges`.
    """
    parent_of = _edges_to_parent_map(edges)
    _check_acyclic(parent_of)
    size = len(parent_of)
    for node in range(size):
        if node not in parent_of:
            raise ValueError(f"node {node}: missing (gap in node ids 0..{size - 1})")
    children: dict[int, list[int]] = {}
    for child in sorted(parent_of):
        children.setdefault(parent_of[child], []).append(child)
    old_ids: list[int] = []
    frontier = list(children.get(-1, []))
    while frontier:  # breadth-first keeps siblings in id order
        old_ids.extend(frontier)
        frontier = [c for node in frontier for c in children.get(node, [])]
    new_id = {old: new for new, old in enumerate(old_ids)}
    parents = [-1 if parent_of[old] == -1 else new_id[parent_of[old]] for old in old_ids]
    return parents, old_ids


def _edges_to_parent_map(edges: Iterable[tuple[int, int]]) -> dict[int, int]:
    parent_of: dict[int, int] = {}
    for edge in edges:
        if len(edge) != 2:
            raise ValueError(f"edge {edge!r}: expected a (parent, child) pair")
        parent, child = int(edge[0]), int(edge[1])
        if child < 0:
            raise ValueError(f"node {child}: child ids must be >= 0 (-1 is the root)")
        if parent == child:
            raise ValueError(f"node {child}: is its own parent (cycle)")
        if parent < -1:
            raise ValueError(f"node {child}: parent {parent} is not a node (use -1 for the root)")
        if child in parent_of:
            raise ValueError(f"node {child}: has two parents ({parent_of[child]} and {parent})")
        parent_of[child] = parent
    for child, parent in parent_of.items():
        if parent != -1 and parent not in parent_of:
            raise ValueError(f"node {child}: parent {parent} is not a node of the tree")
    return parent_of


def _check_acyclic(parent_of: dict[int, int]) -> None:
    for start in parent_of:
        seen = {start}
        node = parent_of[start]
        while node != -1:
            if node in seen:
                raise ValueError(f"node {start}: lies on a cycle through node {node}")
            seen.add(node)
            node = parent_of[node]


def additive_mask(
    allowed: torch.Tensor,
    *,
    batch_size: int = 1,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """(Q, K) bool -> (B, 1, Q, K) additive mask of ``dtype``: ``0`` where allowed, the dtype's most negative
    value elsewhere. An additive float mask works with both the eager and the SDPA attention of Hugging Face
    models, which pass a 4D mask through unchanged."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed.cpu(), torch.finfo(dtype).min)
    mask = mask if device is None else mask.to(device)
    return mask.expand(batch_size, 1, *allowed.shape)


def tree_extension_mask(parents: ParentsLike, num_new: int, context_length: int) -> torch.Tensor:
    """(M, C + S) bool mask for the last ``num_new`` (``M``) nodes of a scratch tree of ``S`` nodes, appended
    after ``C`` context tokens: each new node sees the whole context and its ancestors-or-self in the tree."""
    tree = tree_attention_mask(parents, device="cpu")[tree_size(parents) - num_new :]  # (M, S)
    return torch.cat([torch.ones(num_new, context_length, dtype=torch.bool), tree], dim=1)


def tree_size(parents: ParentsLike) -> int:
    return parents.shape[0] if isinstance(parents, torch.Tensor) else len(parents)


def tree_verification_mask(
    parents: ParentsLike,
    past_length: int,
    *,
    batch_size: int = 1,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Model-ready additive 4D mask for one forward over ``[root] + tree`` after ``past_length`` cached tokens.

    Returns a (B, 1, 1 + N, past_length + 1 + N) tensor of ``dtype`` (see :func:`additive_mask`). Every query
    sees the whole prefix and the root; node ``i`` also sees its ancestors-or-self; the root sees no draft node.
    """
    tree = tree_attention_mask(parents, device="cpu")  # (N, N)
    num_nodes = tree.shape[0]
    allowed = torch.zeros(1 + num_nodes, past_length + 1 + num_nodes, dtype=torch.bool)
    allowed[:, : past_length + 1] = True  # prefix and root
    allowed[1:, past_length + 1 :] = tree
    return additive_mask(allowed, batch_size=batch_size, dtype=dtype, device=device)
