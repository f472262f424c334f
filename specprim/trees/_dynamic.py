"""A context-dependent tree (EAGLE-2): expand the most likely nodes, then keep the best ones overall."""

from __future__ import annotations

import dataclasses

import torch

from specprim._types import DraftRequest, DraftTree
from specprim.sampling import SamplingConfig
from specprim.trees._base import TreeDraftModel
from specprim.trees._chain import empty_tree

__all__ = ["DynamicTree"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DynamicTree:
    """EAGLE-2's dynamic draft tree (Li et al., 2024): expand by cumulative draft log-probability, then rerank.

    The value of a node is the sum of the draft log-probabilities of the tokens on its path (log of
    ``request.sampling.probs`` when sampling, so tokens the transforms remove are ``-inf``; log-softmax of
    the logits when greedy). Building:

    1. the ``top_k`` most likely children of the root are the depth-1 candidates;
    2. for each next depth up to ``min(depth, request.max_depth)``: the ``top_k`` candidates of the previous
       depth with the highest value are extended in **one** batched ``extend`` call, and each gets its ``top_k``
       most likely children as candidates of this depth;
    3. the ``budget`` candidates with the highest value are kept, in topological (creation) order.

    Guarantees: at most ``budget`` nodes, depth ``<= min(depth, request.max_depth)``, at most ``depth - 1``
    ``extend`` calls, siblings have distinct tokens, only extended nodes have children, and the kept set is
    ancestor-closed (a child's value never exceeds its parent's and ties are broken towards the shallower
    node). Candidates of value ``-inf`` (zero draft probability) are never extended or kept, so the tree can be
    smaller than ``budget``. Deterministic: ``sampling="deterministic"``, ``q=None``. Needs batch size 1
    (the shape depends on the data); other batch sizes raise ``ValueError``.
    """

    depth: int
    top_k: int
    budget: int

    def __post_init__(self) -> None:
        for name in ("depth", "top_k", "budget"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DynamicTree.{name} must be a positive int, got {value!r}")

    def build(self, model: TreeDraftModel, request: DraftRequest) -> DraftTree:
        """Draft the tree for ``request`` (batch size 1)."""
        if request.input_ids.shape[0] != 1:
            raise ValueError(f"DynamicTree drafts for batch size 1, got {request.input_ids.shape[0]}")
        max_depth = min(self.depth, request.max_depth)
        if max_depth <= 0:
            return empty_tree(request)
        pool = _Candidates()
        root_logits = model.begin(request)  # (1, V)
        device = root_logits.device
        frontier = pool.add(  # (C_1,) candidate ids of depth 1
            _log_probs(root_logits, request.sampling), parents=torch.tensor([-1]), parent_values=torch.zeros(1),
            depth=1, top_k=self.top_k,
        )
        scratch_of: dict[int, int] = {-1: -1}  # candidate id -> scratch id, for extended candidates
        for depth in range(2, max_depth + 1):
            grow = frontier[pool.value[frontier].topk(min(self.top_k, len(frontier))).indices]  # (P,) candidates
            grow = grow[torch.isfinite(pool.value[grow])]
            if grow.numel() == 0:
                break
            grow = grow.sort().values  # creation order, so scratch ids are predictable
            scratch_parents = torch.tensor([scratch_of[int(c)] for c in pool.parent[grow]], dtype=torch.long)
            for c in grow.tolist():
                scratch_of[c] = len(scratch_of) - 1
            logits = model.extend(scratch_parents, pool.token[grow][None].to(device))  # (1, P, V)
            frontier = pool.add(  # (C_d,) candidate ids of this depth
                _log_probs(logits, request.sampling), parents=grow, parent_values=pool.value[grow],
                depth=depth, top_k=self.top_k,
            )
        return pool.best(self.budget, device)


def _log_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 draft log-probabilities, ``<= 0``, ``-inf`` for impossible tokens."""
    if sampling.is_greedy:
        return logits.float().log_softmax(-1).clamp(max=0.0)
    return sampling.probs(logits).log().clamp(max=0.0)


class _Candidates:
    """Every candidate node created so far, as growing (C,) tensors in creation (hence topological) order."""

    def __init__(self) -> None:
        self.token = torch.empty(0, dtype=torch.long)  # (C,)
        self.parent = torch.empty(0, dtype=torch.long)  # (C,) candidate id of the parent, -1 for the root
        self.value = torch.empty(0)  # (C,) cumulative log-probability
        self.depth = torch.empty(0, dtype=torch.long)  # (C,)

    def add(
        self, log_probs: torch.Tensor, *, parents: torch.Tensor, parent_values: torch.Tensor, depth: int, top_k: int
    ) -> torch.Tensor:
        """Add the ``top_k`` children of each of ``P`` parents of depth ``depth - 1``; return the new candidate
        ids (P * top_k,).

        ``log_probs`` (P, V) is each parent's children's log-probabilities, ``parents`` (P,) their candidate ids
        (``-1`` for the root) and ``parent_values`` (P,) their values.
        """
        log_probs = log_probs.reshape(parents.shape[0], -1).cpu()  # (P, V)
        child_lp, tokens = log_probs.topk(min(top_k, log_probs.shape[-1]), dim=-1)  # (P, k) each
        start = len(self.token)
        self.token = torch.cat([self.token, tokens.reshape(-1)])
        self.parent = torch.cat([self.parent, parents.repeat_interleave(tokens.shape[1])])
        self.value = torch.cat([self.value, (parent_values[:, None] + child_lp).reshape(-1)])
        self.depth = torch.cat([self.depth, torch.full((tokens.numel(),), depth, dtype=torch.long)])
        return torch.arange(start, len(self.token))

    def best(self, budget: int, device: torch.device) -> DraftTree:
        """The tree of the ``budget`` finite-valued candidates of highest value, ties to the shallower node."""
        finite = torch.isfinite(self.value).nonzero()[:, 0]  # (F,) candidate ids, ascending
        by_depth = finite[self.depth[finite].sort(stable=True).indices]  # shallower first among equal values
        ranked = by_depth[self.value[by_depth].sort(descending=True, stable=True).indices]
        keep = ranked[:budget].sort().values  # (N,) topological: creation order
        new_id = torch.full((len(self.token) + 1,), -1, dtype=torch.long)  # index c + 1; the root stays -1
        new_id[keep + 1] = torch.arange(len(keep))
        parents = new_id[self.parent[keep] + 1]  # (N,)
        if bool((parents[self.parent[keep] >= 0] < 0).any()):  # pragma: no cover - guaranteed by the ordering
            raise AssertionError("DynamicTree kept a node without its parent")
        return DraftTree(tokens=self.token[keep][None].to(device), parents=parents, sampling="deterministic")
