"""What a step costs on this machine: verification as a function of tree size, drafting as a function of depth.

The cost half of the speedup model. Every number is a wall-clock measurement of the real forward passes
(median of ``repeats`` after a warm-up), so the model is specific to the hardware, dtype and threads at hand.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from specprim._types import DraftTree
from specprim.hf import StaticTarget, as_target, query_bucket


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Measured per-step costs, in seconds.

    Attributes:
        verify_sizes: tree sizes ``N`` (draft nodes, root excluded) that were timed, ascending, starting at 0.
        verify_s: the target forward over ``[root] + tree`` for each size; ``verify_s[0]`` (``N = 0``) is one
            plain decoding step through the same forward.
        draft_s: ``draft_s[d - 1]``: one drafting call that builds a tree of depth ``d``.
        other_s: per-step time outside both forwards (acceptance, cache commit, bookkeeping) for an empty tree.
        other_per_node_s: how much of that grows with each draft node (acceptance walks, masks, gathers).
        padded: verification pads ``[root] + tree`` to :func:`specprim.hf.query_bucket` tokens (a
            :class:`specprim.hf.StaticTarget`): a tree costs what the largest tree of its padded size costs, so
            measure the sizes :func:`padded_sizes` lists.
    """

    verify_sizes: tuple[int, ...]
    verify_s: tuple[float, ...]
    draft_s: tuple[float, ...] = ()
    other_s: float = 0.0
    other_per_node_s: float = 0.0
    padded: bool = False

    def __post_init__(self) -> None:
        if not self.verify_sizes or self.verify_sizes[0] != 0 or list(self.verify_sizes) != sorted(
            set(self.verify_sizes)
        ):
            raise ValueError("verify_sizes must be ascending, distinct and start at 0")
        if len(self.verify_s) != len(self.verify_sizes):
            raise ValueError("verify_s needs one time per entry of verify_sizes")
        if any(t <= 0 for t in (*self.verify_s, *self.draft_s)) or self.other_s < 0 or self.other_per_node_s < 0:
            raise ValueError("costs must be positive")

    @property
    def step_s(self) -> float:
        """One plain decoding step (``N = 0``)."""
        return self.verify_s[0]

    def verify(self, nodes: int) -> float:
        """Verification cost of ``nodes`` draft nodes: piecewise-linear in the measured sizes, extended past the
        largest one along its last segment. ``padded``: the cost of the largest tree of the same padded size."""
        if self.padded:
            nodes = query_bucket(nodes + 1) - 1
        return _piecewise_linear(self.verify_sizes, self.verify_s, nodes)

    def draft(self, depth: int) -> float:
        """Drafting cost of a tree of ``depth`` (0 costs nothing), extended linearly past the deepest measured."""
        if depth <= 0:
            return 0.0
        if not self.draft_s:
            raise ValueError("this cost model has no drafting costs; measure them with a drafter")
        return _piecewise_linear(tuple(range(len(self.draft_s) + 1)), (0.0, *self.draft_s), depth)

    def step(self, nodes: int, depth: int) -> float:
        """One speculative step: draft + verify + everything else."""
        return self.draft(depth) + self.verify(nodes) + self.other_s + self.other_per_node_s * nodes

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def padded_sizes(max_nodes: int) -> tuple[int, ...]:
    """The tree sizes to time for a padded verifier up to ``max_nodes`` nodes: 0 and the largest tree of every
    padded size (1, 3, 7, 15, ... nodes)."""
    sizes = {0}
    nodes = 0
    while nodes < max_nodes:
        nodes = query_bucket(nodes + 2) - 1  # the largest tree of the next padded size
        sizes.add(nodes)
    return tuple(sorted(sizes))


def _piecewise_linear(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    if x < xs[0]:
        raise ValueError(f"{x} is below the measured range starting at {xs[0]}")
    if len(xs) == 1:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i] or i == len(xs) - 1:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)
    raise AssertionError("unreachable")


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def measure_verify_costs(
    target: torch.nn.Module | StaticTarget, input_ids: torch.Tensor, sizes: Sequence[int] = (0, 1, 2, 4, 8, 16, 32, 64),
    repeats: int = 5,
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Time the target's verification forward after prefilling ``input_ids`` (1, T), for each tree size.

    Trees are chains of random tokens (the forward's cost depends on the size, not the shape). The cache is
    rolled back after every forward, so every size sees the same prefix. Returns ``(sizes, seconds)``.
    ``target`` may be a :class:`specprim.hf.StaticTarget`: its padded, compiled forward is timed (each padded size
    compiles in the warm-up of its first repeat).
    """
    sizes = tuple(sorted(set(int(s) for s in sizes) | {0}))
    if sizes[0] < 0:
        raise ValueError("tree sizes must be >= 0")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    verifier = as_target(target)
    verifier.start(input_ids)
    root = input_ids[:, -1].to(verifier.device)  # (1,)
    generator = torch.Generator().manual_seed(0)
    seconds = []
    for size in sizes:
        tree = DraftTree(
            tokens=torch.randint(verifier.vocab_size, (1, size), generator=generator),
            parents=torch.arange(size) - 1,
        )

        def verify_once(tree: DraftTree = tree) -> None:
            verifier.verify(root, tree)
            verifier.commit(torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, dtype=torch.long))

        seconds.append(_median_seconds(verify_once, repeats))
    return sizes, tuple(seconds)


def measure_costs(
    target: torch.nn.Module | StaticTarget,
    input_ids: torch.Tensor,
    *,
    drafter_for_depth: Callable[[int], object] | None = None,
    depths: Sequence[int] = (1, 2, 3, 4, 5, 6),
    sizes: Sequence[int] = (0, 1, 2, 4, 8, 16, 32, 64),
    repeats: int = 5,
    tokens_per_depth: int = 32,
) -> CostModel:
    """Measure a :class:`CostModel` on this machine.

    Verification is timed directly (:func:`measure_verify_costs`). Drafting is timed inside real greedy
    generations: for each depth ``d`` in ``depths`` (consecutive from 1), ``drafter_for_depth(d)`` must return
    a fresh drafter whose trees have depth ``d`` (e.g. ``lambda d: eagle_drafter(head, DynamicTree(depth=d,
    top_k=8, budget=64))``); ``tokens_per_depth`` tokens are generated after ``input_ids`` and the mean drafting
    time per step is kept. The time per step outside both forwards is fitted as ``other_s + other_per_node_s * N``
    (least squares over the depths' mean tree sizes, both clamped at 0). Without a drafter only the verification
    costs are measured. For a :class:`specprim.hf.StaticTarget` the model is ``padded``: pass ``sizes`` from
    :func:`padded_sizes`.
    """
    from specprim import speculative_generate
    from specprim.acceptance import Greedy

    padded = isinstance(target, StaticTarget)
    verify_sizes, verify_s = measure_verify_costs(target, input_ids, sizes, repeats)
    if drafter_for_depth is None:
        return CostModel(verify_sizes, verify_s, padded=padded)
    depths = tuple(depths)
    if depths != tuple(range(1, len(depths) + 1)):
        raise ValueError(f"depths must be 1, 2, ..., D; got {depths}")
    draft_s, other_s, nodes = [], [], []
    for depth in depths:
        speculative_generate(target, input_ids, drafter=drafter_for_depth(depth), acceptance=Greedy(),
                             max_new_tokens=4)  # warm-up
        stats = speculative_generate(
            target, input_ids, drafter=drafter_for_depth(depth), acceptance=Greedy(),
            max_new_tokens=tokens_per_depth,
        ).stats
        draft_s.append(stats.draft_s / stats.steps)
        other_s.append(stats.other_s / stats.steps)
        nodes.append(sum(stats.tree_nodes) / stats.steps)
    base, per_node = _line_fit(nodes, other_s)
    return CostModel(verify_sizes, verify_s, tuple(draft_s), base, per_node, padded=padded)


def _line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with ``a, b >= 0`` (``b = 0`` and the median when the xs do not vary)."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return statistics.median(ys), 0.0
    slope = max(sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread, 0.0)
    return max(mean_y - slope * mean_x, 0.0), slope
