"""A context-dependent tree (EAGLE-2): expand the most likely nodes, then keep the best ones overall."""

from __future__ import annotations

import dataclasses
import math

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
        frontier = pool.add(*_top_children(root_logits, request.sampling, self.top_k), parents=[-1], depth=1)
        scratch_of: dict[int, int] = {-1: -1}  # candidate id -> scratch id, for extended candidates
        for depth in range(2, max_depth + 1):
            best_first = sorted(frontier, key=lambda c: -pool.value[c])[: self.top_k]  # stable: earlier on ties
            grow = sorted(c for c in best_first if math.isfinite(pool.value[c]))  # creation order: predictable ids
            if not grow:
                break
            scratch_parents = torch.tensor([scratch_of[pool.parent[c]] for c in grow], dtype=torch.long)  # (P,)
            for c in grow:
                scratch_of[c] = len(scratch_of) - 1
            tokens = torch.tensor([[pool.token[c] for c in grow]], dtype=torch.long, device=device)  # (1, P)
            logits = model.extend(scratch_parents, tokens)  # (1, P, V)
            frontier = pool.add(*_top_children(logits, request.sampling, self.top_k), parents=grow, depth=depth)
        return pool.best(self.budget, device)


def _top_children(
    logits: torch.Tensor, sampling: SamplingConfig, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, V) (or (1, P, V)) draft logits -> the ``top_k`` most likely children of each of the ``P`` parents: their
    float32 draft log-probabilities (P, k), ``<= 0`` and ``-inf`` for impossible tokens, and their tokens (P, k).

    Log-probabilities are log-softmax of the logits when greedy, the log of ``sampling.probs`` otherwise (taken
    after the top ``k``, as the log is monotone). With ``top_k == 1`` the best child is found with ``max``, which
    runs ~3x faster than a ``topk`` of one over a large vocabulary on CPU. Only the (P, k) results move to the CPU."""
    logits = logits.reshape(-1, logits.shape[-1])  # (P, V), on the draft model's device
    k = min(top_k, logits.shape[-1])
    scores = logits.float().log_softmax(-1) if sampling.is_greedy else sampling.probs(logits)  # (P, V)
    best, tokens = scores.max(-1, keepdim=True) if k == 1 else scores.topk(k, dim=-1)  # (P, k) each
    return (best if sampling.is_greedy else best.log()).clamp(max=0.0).cpu(), tokens.cpu()


class _Candidates:
    """Every candidate node created so far, as growing lists in creation (hence topological) order: few enough
    (``top_k`` per extended node) that plain Python beats a dozen small tensor operations per step."""

    def __init__(self) -> None:
        self.token: list[int] = []
        self.parent: list[int] = []  # candidate id of the parent, -1 for the root
        self.value: list[float] = []  # cumulative log-probability, summed in float32
        self.depth: list[int] = []

    def add(self, child_lp: torch.Tensor, tokens: torch.Tensor, *, parents: list[int], depth: int) -> list[int]:
        """Add ``k`` children of each of ``P`` parents of depth ``depth - 1``; return the new candidate ids.

        ``child_lp`` (P, k) is the children's draft log-probabilities, ``tokens`` (P, k) their tokens, ``parents``
        the parents' candidate ids (``-1`` for the root).
        """
        parent_values = torch.tensor([0.0 if p == -1 else self.value[p] for p in parents])  # (P,) float32
        values = parent_values[:, None] + child_lp  # (P, k)
        start = len(self.token)
        for parent, row_tokens, row_values in zip(parents, tokens.tolist(), values.tolist(), strict=True):
            self.token += row_tokens
            self.value += row_values
            self.parent += [parent] * len(row_tokens)
        self.depth += [depth] * (len(self.token) - start)
        return list(range(start, len(self.token)))

    def best(self, budget: int, device: torch.device) -> DraftTree:
        """The tree of the ``budget`` finite-valued candidates of highest value, ties to the shallower node (then to
        the earlier one)."""
        finite = [c for c, value in enumerate(self.value) if math.isfinite(value)]
        keep = sorted(sorted(finite, key=lambda c: (-self.value[c], self.depth[c]))[:budget])  # topological
        new_id = {-1: -1} | {c: i for i, c in enumerate(keep)}
        if any(self.parent[c] not in new_id for c in keep):  # pragma: no cover - guaranteed by the ordering
            raise AssertionError("DynamicTree kept a node without its parent")
        return DraftTree(tokens=torch.tensor([[self.token[c] for c in keep]], dtype=torch.long, device=device)
                         .reshape(1, len(keep)),
                         parents=torch.tensor([new_id[self.parent[c]] for c in keep], dtype=torch.long)
                         .reshape(len(keep)), sampling="deterministic")
