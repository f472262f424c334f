"""Choose a method's tree for this machine: measure acceptance on prompts, measure costs, pick the best tree."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from specprim.acceptance import Greedy
from specprim.hf import StaticTarget
from specprim.presets import Method, with_tree
from specprim.speedup._acceptance import RankAcceptance
from specprim.speedup._costs import CostModel, measure_costs, padded_sizes
from specprim.speedup._model import TreeChoice, best_tree
from specprim.trees import DynamicTree

PROBE_TREE = DynamicTree(depth=6, top_k=8, budget=64)
"""The wide tree acceptance is measured with: deep and wide enough that every (depth, rank) the chosen tree may
use is tried often."""


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The measured acceptance and costs, the chosen tree, and the probe generations' mean tau."""

    acceptance: RankAcceptance
    costs: CostModel
    choice: TreeChoice
    probe_tau: float

    def to_json(self) -> dict[str, object]:
        return {
            "acceptance": self.acceptance.to_json(), "costs": self.costs.to_json(), "probe_tau": self.probe_tau,
            "choice": {"spec": self.choice.spec(), "nodes": self.choice.nodes, "depth": self.choice.depth,
                       "top_k": self.choice.top_k, "paths": [list(p) for p in self.choice.paths],
                       "predicted": dataclasses.asdict(self.choice.prediction)},
            "curve": [dict(zip(("nodes", "tau", "step_s", "speedup"), c, strict=True)) for c in self.choice.curve],
        }


def tune(
    target: torch.nn.Module | StaticTarget,
    method: Method,
    prompts: Sequence[torch.Tensor],
    *,
    max_new_tokens: int = 128,
    probe_tree: DynamicTree = PROBE_TREE,
    max_nodes: int = 64,
    repeats: int = 5,
    eos_token_id: int | None = None,
) -> TuneResult:
    """Measure what ``method``'s drafter accepts and what its steps cost here, and choose its best tree.

    Acceptance: greedy generations of ``max_new_tokens`` after each prompt (each (1, T)) with ``probe_tree``.
    Costs: :func:`measure_costs` on the first prompt, drafting with dynamic trees of the probe's width and every
    depth up to the probe's. The choice is :func:`best_tree` up to ``max_nodes`` nodes, that depth and that width.
    ``target`` may be a :class:`specprim.hf.StaticTarget`: then every step runs through it and the cost model is
    ``padded`` (a tree costs what its padded size costs), so the choice fits the padded sizes.
    Raises ``ValueError`` when the method's drafter takes no tree shape (e.g. prompt lookup) or no prompt is given.
    """
    if not prompts:
        raise ValueError("tune needs at least one prompt")
    probe = with_tree(method, probe_tree)
    outcomes: list[tuple[int, int, int]] = []
    accepted = steps = 0
    for ids in prompts:
        stats = Method(probe.drafter, Greedy()).generate(
            target, ids, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id
        ).stats
        outcomes += stats.sibling_outcomes
        accepted, steps = accepted + sum(stats.accepted), steps + stats.steps
    acceptance = RankAcceptance.from_outcomes(outcomes)

    def drafter_for_depth(depth: int) -> object:
        tree = DynamicTree(depth=depth, top_k=probe_tree.top_k, budget=probe_tree.budget)
        return with_tree(method, tree).drafter

    if isinstance(target, StaticTarget):
        sizes = list(padded_sizes(max_nodes))
    else:
        sizes = [s for s in (0, 1, 2, 4, 8, 16, 32, 64, 128) if s < max_nodes] + [max_nodes]
    costs = measure_costs(
        target, prompts[0], drafter_for_depth=drafter_for_depth, depths=range(1, probe_tree.depth + 1),
        sizes=sizes, repeats=repeats,
    )
    choice = best_tree(acceptance, costs, max_nodes=max_nodes, max_depth=probe_tree.depth,
                       max_width=probe_tree.top_k)
    return TuneResult(acceptance, costs, choice, probe_tau=(accepted + steps) / steps if steps else 0.0)
