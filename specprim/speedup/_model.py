"""The speedup model: expected accepted length of a tree from positional acceptance rates, its cost from a
measured :class:`CostModel`, and the tree that maximises tokens per second on this machine (Sequoia-style).

Assumption (Sequoia's positional model): whether the rank-``k`` child of an accepted node at depth ``d`` is
accepted depends only on ``(d, k)``, not on the tokens. Then a node's probability of being on the accepted path
is the product of its ancestors-or-self child probabilities, and the expected number of tokens per step is
``tau = 1 + sum over nodes of that product`` (the bonus token included).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from specprim._types import depths_of, validate_parents
from specprim.speedup._acceptance import RankAcceptance, sibling_ranks
from specprim.speedup._costs import CostModel
from specprim.trees import DynamicTree, StaticTree


def expected_tau(parents: Sequence[int], acceptance: RankAcceptance) -> float:
    """Expected tokens per step (bonus included) of a tree given by its parents list (topological, ranks by
    node order among siblings)."""
    parents = validate_parents(list(parents))
    depths, ranks = depths_of(parents), sibling_ranks(parents)
    reach: list[float] = []
    for node, parent in enumerate(parents):
        above = 1.0 if parent == -1 else reach[parent]
        reach.append(above * acceptance.child_probability(depths[node], ranks[node]))
    return 1.0 + sum(reach)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Predicted ``tau`` (tokens per step), ``step_s`` (seconds per speculative step) and ``speedup`` over plain
    decoding with the same forward (``tau * cost.step_s / step_s``)."""

    tau: float
    step_s: float
    speedup: float


def predict(parents: Sequence[int], acceptance: RankAcceptance, costs: CostModel) -> Prediction:
    """Predict one tree shape's speedup on the machine ``costs`` was measured on."""
    parents = validate_parents(list(parents))
    tau = expected_tau(parents, acceptance)
    step_s = costs.step(len(parents), max(depths_of(parents), default=0))
    return Prediction(tau=tau, step_s=step_s, speedup=tau * costs.step_s / step_s)


@dataclasses.dataclass(frozen=True)
class TreeChoice:
    """The best tree found by :func:`best_tree` and the prediction for every size tried.

    Attributes:
        paths: the chosen tree as sibling-rank paths (for :class:`~specprim.trees.StaticTree`), in the order the
            nodes were added (most probable first).
        prediction: the chosen tree's :class:`Prediction`.
        curve: ``(nodes, tau, step_s, speedup)`` of the best tree of every size ``0 .. max_nodes``.
    """

    paths: tuple[tuple[int, ...], ...]
    prediction: Prediction
    curve: tuple[tuple[int, float, float, float], ...]

    @property
    def nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def top_k(self) -> int:
        """The widest sibling rank used, plus one."""
        return 1 + max((max(p) for p in self.paths), default=0)

    def static_tree(self) -> StaticTree:
        """The chosen shape as a fixed tree of ranks."""
        if not self.paths:
            raise ValueError("the best tree is empty: plain decoding is predicted to be fastest")
        return StaticTree(paths=self.paths)

    def dynamic_tree(self) -> DynamicTree:
        """An EAGLE-2 dynamic tree with the chosen size, depth and width as its budget, depth and top-k."""
        if not self.paths:
            raise ValueError("the best tree is empty: plain decoding is predicted to be fastest")
        return DynamicTree(depth=self.depth, top_k=self.top_k, budget=self.nodes)

    def spec(self) -> str:
        """The dynamic tree as a ``--tree`` string (see :func:`specprim.trees.parse_tree`)."""
        return f"dynamic:depth={self.depth},top_k={self.top_k},budget={self.nodes}" if self.paths else "none"


def best_tree(
    acceptance: RankAcceptance, costs: CostModel, *, max_nodes: int = 64, max_depth: int = 8, max_width: int = 8
) -> TreeChoice:
    """The tree of at most ``max_nodes`` nodes that maximises predicted tokens per second.

    For each size ``n`` the best tree under the positional model is the ``n`` nodes of highest path probability;
    it is grown best-first (a node's first child and next sibling become candidates once it is added, so the
    set stays closed under parents and earlier siblings). The size with the highest ``tau(n) * step_s /
    (draft(depth(n)) + verify(n) + other)`` wins; size 0 is plain decoding (speedup from the overheads only).
    """
    for name, value in (("max_nodes", max_nodes), ("max_depth", max_depth), ("max_width", max_width)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    frontier: list[tuple[float, tuple[int, ...], float]] = []  # (-reach, path, parent reach)
    heapq.heappush(frontier, (-acceptance.child_probability(1, 0), (0,), 1.0))
    paths: list[tuple[int, ...]] = []
    tau, depth = 1.0, 0

    def point(n: int) -> tuple[int, float, float, float]:
        step_s = costs.step(n, depth)
        return (n, tau, step_s, tau * costs.step_s / step_s)

    curve = [point(0)]
    while frontier and len(paths) < max_nodes:
        negative_reach, path, parent_reach = heapq.heappop(frontier)
        reach = -negative_reach
        paths.append(path)
        tau, depth = tau + reach, max(depth, len(path))
        curve.append(point(len(paths)))
        if path[-1] + 1 < max_width:  # next sibling: same parent, next rank
            sibling = (*path[:-1], path[-1] + 1)
            heapq.heappush(frontier, (-parent_reach * acceptance.child_probability(len(path), path[-1] + 1),
                                      sibling, parent_reach))
        if len(path) < max_depth:  # first child
            heapq.heappush(frontier, (-reach * acceptance.child_probability(len(path) + 1, 0), (*path, 0), reach))
    best = max(curve, key=lambda c: c[3])
    chosen = tuple(paths[: best[0]])
    return TreeChoice(
        paths=chosen, prediction=Prediction(tau=best[1], step_s=best[2], speedup=best[3]), curve=tuple(curve)
    )
