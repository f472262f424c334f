"""Structural properties of the acceptance rules (losslessness lives in test_lossless.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specprim._types import DraftTree, Verdict
from specprim.acceptance import AcceptanceRule, Greedy, SpeculativeSampling, TypicalAcceptance
from specprim.acceptance._base import TreeTables
from specprim.acceptance._speculative import WalkSteps
from specprim.testing import check_verdict, draw_tree, trees, verification_problems

RULES = [Greedy(), SpeculativeSampling(), TypicalAcceptance()]


def snapshot(p: torch.Tensor, tree: DraftTree) -> list[torch.Tensor]:
    return [t.clone() for t in (p, tree.tokens, tree.parents) + (() if tree.q is None else (tree.q,))]


def run_twice(rule: AcceptanceRule, p: torch.Tensor, tree: DraftTree, seed: int) -> tuple[Verdict, Verdict]:
    first = rule(p, tree, generator=torch.Generator().manual_seed(seed))
    second = rule(p, tree, generator=torch.Generator().manual_seed(seed))
    return first, second


@pytest.mark.parametrize("rule", RULES, ids=lambda r: type(r).__name__)
@settings(max_examples=60, deadline=None)
@given(problem=verification_problems(), seed=st.integers(min_value=0, max_value=1000))
def test_verdict_structure_determinism_and_no_mutation(
    rule: AcceptanceRule, problem: tuple[torch.Tensor, DraftTree], seed: int
) -> None:
    p, tree = problem
    before = snapshot(p, tree)
    first, second = run_twice(rule, p, tree, seed)
    # accepted length <= depth, path follows parents, -1 padding after num_accepted, next_token in [0, V)
    check_verdict(first, tree, p.shape[-1])
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(p, tree), strict=True)), "inputs mutated"
    for name in ("path", "num_accepted", "next_token"):
        assert torch.equal(getattr(first, name), getattr(second, name)), f"{name} differs for one seed"


def greedy_reference(p: torch.Tensor, tree: DraftTree) -> tuple[list[int], list[int]]:
    """Per row: the end node of the longest argmax-matching path (first on ties) and its bonus, by loops."""
    ends, bonuses = [], []
    for b in range(tree.batch_size):
        matched: list[bool] = []
        best, best_depth = -1, 0
        for node, parent in enumerate(tree.parent_list):
            ok = (parent == -1 or matched[parent]) and int(tree.tokens[b, node]) == int(
                p[b, parent + 1].argmax()
            )
            matched.append(ok)
            if ok and tree.depth_list[node] > best_depth:
                best, best_depth = node, tree.depth_list[node]
        ends.append(best)
        bonuses.append(int(p[b, best + 1].argmax()))
    return ends, bonuses


@settings(max_examples=80, deadline=None)
@given(verification_problems())
def test_greedy_matches_the_loop_reference(problem: tuple[torch.Tensor, DraftTree]) -> None:
    p, tree = problem
    verdict = Greedy()(p, tree)
    ends, bonuses = greedy_reference(p, tree)
    for b in range(tree.batch_size):
        count = int(verdict.num_accepted[b])
        end = int(verdict.path[b, count - 1]) if count else -1
        assert end == ends[b]
        assert int(verdict.next_token[b]) == bonuses[b]
        for node in verdict.path[b, :count].tolist():  # accepted tokens are the argmax of their parent row
            assert int(tree.tokens[b, node]) == int(p[b, tree.parent_list[node] + 1].argmax())


def test_greedy_duplicate_siblings_take_the_first() -> None:
    p = torch.tensor(
        [[[0.1, 0.7, 0.2], [0.2, 0.2, 0.6], [0.2, 0.2, 0.6], [0.9, 0.05, 0.05], [0.9, 0.05, 0.05]]]
    )
    tree = DraftTree(tokens=torch.tensor([[1, 1, 2, 2]]), parents=torch.tensor([-1, -1, 0, 1]))
    verdict = Greedy()(p, tree)
    assert verdict.path.tolist() == [[0, 2]] and verdict.num_accepted.tolist() == [2]
    assert verdict.next_token.tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(problem=verification_problems(), seed=st.integers(min_value=0, max_value=1000))
def test_sampling_rules_reduce_to_greedy_on_one_hot_targets(
    problem: tuple[torch.Tensor, DraftTree], seed: int
) -> None:
    """At temperature 0 both speculative sampling (distinct siblings) and typical acceptance are greedy."""
    p, tree = problem
    assume(max(map(len, tree.children)) <= p.shape[-1])
    one_hot = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).float()
    q = 0.5 * (tree.q if tree.q is not None else one_hot) + 0.5 / p.shape[-1]  # positive: no q(x) == 0 skips
    distinct = draw_tree(q, tree.parent_list, sampling="deterministic")  # distinct siblings, top of q
    distinct = dataclasses.replace(distinct, sampling=tree.sampling)
    expected = Greedy()(one_hot, distinct)
    for rule in (SpeculativeSampling(), TypicalAcceptance()):
        got = rule(one_hot, distinct, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got.path, expected.path), type(rule).__name__
        assert torch.equal(got.next_token, expected.next_token), type(rule).__name__


def assert_walk_equals_the_general_walk(walk: str, p: torch.Tensor, tree: DraftTree, seed: int) -> None:
    """``SpeculativeSampling``'s walk named ``walk`` and its general walk (the rule as stated, taken when it is given
    its ``WalkSteps``) give the same verdicts for one seed, and calling the rule gives that path too."""
    rule = SpeculativeSampling()
    tables = TreeTables.of(tree, p.device)
    fast = getattr(rule, walk)(p, tree, tables, torch.Generator().manual_seed(seed))
    general = SpeculativeSampling(steps=WalkSteps())(p, tree, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(fast.path, general.path) and torch.equal(fast.num_accepted, general.num_accepted)
    assert torch.equal(fast.next_token, general.next_token)
    assert torch.equal(rule(p, tree, generator=torch.Generator().manual_seed(seed)).path, fast.path)


@settings(max_examples=80, deadline=None)
@given(problem=verification_problems(), seed=st.integers(min_value=0, max_value=1000), greedy=st.booleans())
def test_speculative_deterministic_walk_equals_the_general_walk(
    problem: tuple[torch.Tensor, DraftTree], seed: int, greedy: bool
) -> None:
    """Deterministic drafts take a scalar walk; it returns the general walk's verdicts from the same uniforms
    (repeated and sparse tokens included, one-hot and spread targets)."""
    p, tree = problem
    if greedy:
        p = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).float()
    tree = dataclasses.replace(tree, q=None, sampling="deterministic")
    assert_walk_equals_the_general_walk("_deterministic_walk", p, tree, seed)


@settings(max_examples=80, deadline=None)
@given(problem=verification_problems(), seed=st.integers(min_value=0, max_value=1000),
       sampling=st.sampled_from(["iid", "without_replacement"]))
def test_speculative_sampled_walk_equals_the_general_walk(
    problem: tuple[torch.Tensor, DraftTree], seed: int, sampling: str
) -> None:
    """Sampled drafts take a walk with an unnormalised target; it returns the general walk's verdicts from the same
    uniforms (repeated, zero-q and sparse tokens included)."""
    p, tree = problem
    q = tree.q if tree.q is not None else p.flip(-1)
    tree = dataclasses.replace(tree, q=q, sampling=sampling)
    assert_walk_equals_the_general_walk("_sampled_walk", p, tree, seed)


def test_speculative_skips_zero_probability_iid_drafts() -> None:
    """A token the draft could not have drawn (q(x) == 0) is never accepted and leaves p untouched."""
    batch = 50_000
    p = torch.tensor([[0.1, 0.6, 0.3], [1 / 3, 1 / 3, 1 / 3]]).expand(batch, 2, 3)
    q = torch.tensor([[0.5, 0.0, 0.5], [1 / 3, 1 / 3, 1 / 3]]).expand(batch, 2, 3)
    tree = DraftTree(
        tokens=torch.ones(batch, 1, dtype=torch.long), parents=torch.tensor([-1]), q=q, sampling="iid"
    )
    verdict = SpeculativeSampling()(p, tree, generator=torch.Generator().manual_seed(0))
    assert int(verdict.num_accepted.sum()) == 0
    freq = torch.bincount(verdict.next_token, minlength=3).float() / batch
    assert 0.5 * float((freq - p[0, 0]).abs().sum()) < 0.01


def test_typical_next_token_stays_in_the_typical_set() -> None:
    rule = TypicalAcceptance(epsilon=0.2, delta=0.5)
    p = torch.tensor([[[0.55, 0.3, 0.1, 0.05]]]).expand(20_000, 1, 4)
    tree = DraftTree(
        tokens=torch.zeros(20_000, 0, dtype=torch.long), parents=torch.zeros(0, dtype=torch.long)
    )
    verdict = rule(p, tree, generator=torch.Generator().manual_seed(0))
    threshold = float(rule.thresholds(p[0, 0]))
    allowed = {i for i, x in enumerate(p[0, 0].tolist()) if x > threshold} | {0}
    assert set(verdict.next_token.tolist()) == allowed


def test_typical_prefers_the_likelier_of_equally_deep_paths() -> None:
    p = torch.tensor([[[0.5, 0.4, 0.1], [0.6, 0.3, 0.1], [0.6, 0.3, 0.1]]])
    tree = DraftTree(tokens=torch.tensor([[1, 0]]), parents=torch.tensor([-1, -1]))
    assert TypicalAcceptance(epsilon=0.2, delta=0.2)(p, tree).path.tolist() == [[1]]


def test_empty_tree() -> None:
    p = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]])
    tree = DraftTree(tokens=torch.zeros(2, 0, dtype=torch.long), parents=torch.zeros(0, dtype=torch.long))
    for rule in RULES:
        verdict = rule(p, tree, generator=torch.Generator().manual_seed(0))
        assert verdict.path.shape == (2, 0) and verdict.num_accepted.tolist() == [0, 0]
        assert verdict.next_token.tolist() == [1, 0]


def test_rules_are_frozen_keyword_only_dataclasses_with_a_guarantee() -> None:
    for rule in RULES:
        assert isinstance(rule, AcceptanceRule)
        assert dataclasses.is_dataclass(rule)
        with pytest.raises(dataclasses.FrozenInstanceError):
            rule.lossless = False  # type: ignore[misc]
    assert Greedy.lossless and SpeculativeSampling.lossless and not TypicalAcceptance.lossless
    assert Greedy.greedy_only and not getattr(SpeculativeSampling(), "greedy_only", False)
    assert dataclasses.replace(TypicalAcceptance(), epsilon=0.2).epsilon == 0.2
    with pytest.raises(TypeError):
        TypicalAcceptance(0.2, 0.3)  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0},
        {"epsilon": 1.5},
        {"epsilon": float("nan")},
        {"delta": 0.0},
        {"delta": -1.0},
        {"delta": float("inf")},
        {"epsilon": True},
    ],
)
def test_typical_rejects_bad_hyper_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TypicalAcceptance(**kwargs)


def _tree(batch: int = 2, vocab: int = 4) -> DraftTree:
    q = torch.full((batch, 3, vocab), 1.0 / vocab)
    return DraftTree(
        tokens=torch.zeros(batch, 2, dtype=torch.long), parents=torch.tensor([-1, 0]), q=q, sampling="iid"
    )


@pytest.mark.parametrize("rule", RULES, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize(
    ("p", "tree", "message"),
    [
        (torch.full((2, 2, 4), 0.25), _tree(), "N \\+ 1"),  # too few rows
        (torch.full((3, 3, 4), 0.25), _tree(), "N \\+ 1"),  # wrong batch
        (torch.full((3, 4), 0.25), _tree(), "N \\+ 1"),  # not 3-D
        (torch.full((2, 3, 5), 0.2), _tree(), "vocabulary"),  # q has V = 4
        (torch.ones(2, 3, 4, dtype=torch.long), _tree(), "floating"),
        (
            torch.full((2, 3, 4), 0.25),
            dataclasses.replace(_tree(), tokens=torch.full((2, 2), 4)),
            r"\[0, V\)",
        ),
        (torch.full((2, 3, 4), 0.25), "not a tree", "DraftTree"),
    ],
)
def test_invalid_inputs_raise(rule: AcceptanceRule, p: torch.Tensor, tree: DraftTree, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rule(p, tree)


@settings(max_examples=60, deadline=None)
@given(parents=trees(max_nodes=8))
def test_tree_tables_are_built_once_per_shape_and_hold_each_node_s_path(parents):
    """Rules share the tables of a shape: a second tree of the same shape (other tokens) gets the same object, a tree
    of another shape its own; the tables agree with each node's path walked up its parents."""
    tree = DraftTree(tokens=torch.zeros(1, len(parents), dtype=torch.long), parents=torch.tensor(parents).long())
    tables = TreeTables.of(tree, torch.device("cpu"))
    assert TreeTables.of(DraftTree(tokens=tree.tokens + 1, parents=tree.parents.clone()), "cpu") is tables
    for node in range(len(parents)):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()  # from depth 1 down to the node
        assert tables.ancestors[node].nonzero().flatten().tolist() == sorted(path)
        assert tables.paths[node + 1].tolist() == path + [-1] * (tables.paths.shape[1] - len(path))
        assert int(tables.depth[node + 1]) == len(path) and int(tables.parent_row[node]) == parents[node] + 1
    for row in range(len(parents) + 1):
        kids = [node for node, parent in enumerate(parents) if parent == row - 1]
        assert tables.children[row].tolist() == kids + [-1] * (tables.children.shape[1] - len(kids))
    if parents:
        shorter = DraftTree(tokens=tree.tokens[:, :-1], parents=tree.parents[:-1])
        assert TreeTables.of(shorter, "cpu") is not tables
