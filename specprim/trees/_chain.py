"""The chain: the simplest tree shape, one child per node."""

from __future__ import annotations

import dataclasses

import torch

from specprim._types import DraftRequest, DraftTree
from specprim.sampling import sample
from specprim.trees._base import TreeDraftModel

__all__ = ["Chain"]


@dataclasses.dataclass(frozen=True)
class Chain:
    """A chain of ``k`` draft tokens: ``parents = [-1, 0, 1, ..., k - 2]``.

    ``build`` drafts ``min(k, request.max_depth)`` tokens with ``1`` ``begin`` and ``depth - 1`` ``extend`` calls
    of one node each (the last token is never extended):

    - greedy (``request.sampling.is_greedy``): the argmax of every row; ``sampling="deterministic"``, ``q=None``.
    - otherwise: each token is drawn with ``specprim.sampling.sample(request.sampling.probs(logits),
      request.generator)`` and ``q`` (B, depth + 1, V) holds exactly those rows (the leaf's row is
      all zeros and never read); ``sampling="iid"``. This is the q-contract.
    """

    k: int

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"Chain length k must be a positive int, got {self.k!r}")

    def build(self, model: TreeDraftModel, request: DraftRequest) -> DraftTree:
        """Draft a chain of ``min(k, request.max_depth)`` tokens rooted at ``request.input_ids[:, -1]``."""
        depth = min(self.k, request.max_depth)
        if depth <= 0:
            return empty_tree(request)
        greedy = request.sampling.is_greedy
        logits = model.begin(request)  # (B, V) for the root's children
        tokens: list[torch.Tensor] = []  # depth x (B,)
        q_rows: list[torch.Tensor] = []  # depth x (B, V)
        for step in range(depth):
            if greedy:
                token = logits.argmax(-1)  # (B,)
            else:
                q = request.sampling.probs(logits)  # (B, V)
                token = sample(q, request.generator)  # (B,)
                q_rows.append(q)
            tokens.append(token)
            if step + 1 < depth:  # scratch node `step` is this token; its parent is scratch node `step - 1`
                logits = model.extend(torch.tensor([step - 1]), token[:, None])[:, 0]  # (B, V)
        tokens_t = torch.stack(tokens, dim=1)  # (B, depth)
        parents = torch.arange(-1, depth - 1, dtype=torch.long)  # (depth,)
        if greedy:
            return DraftTree(tokens=tokens_t, parents=parents, sampling="deterministic")
        q_rows.append(torch.zeros_like(q_rows[0]))  # the leaf's row is never read
        return DraftTree(tokens=tokens_t, parents=parents, q=torch.stack(q_rows, dim=1), sampling="iid")


def empty_tree(request: DraftRequest) -> DraftTree:
    """The tree with no nodes: tokens (B, 0), parents (0,), ``sampling="deterministic"``."""
    ids = request.input_ids
    return DraftTree(
        tokens=ids.new_empty(ids.shape[0], 0, dtype=torch.long),
        parents=torch.empty(0, dtype=torch.long),
        sampling="deterministic",
    )
