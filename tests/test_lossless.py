"""Monte-Carlo losslessness: speculative sampling passes for chains and trees under every sampling scheme,
and the same check rejects deliberately broken variants and the lossy typical acceptance.

All checks use 10**5 trials, V = 4 and fixed seeds, so they are deterministic. The correct rule's TV stays
well below the default tolerance sqrt(K / trials) (0.0063 for the first token, 0.0126 for the 16 first-two-
token cells) with chi-square p-values far from the 1e-4 floor; the broken ones miss by orders of magnitude.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from specprim._types import DraftTree, validate_parents
from specprim.acceptance import Greedy, SpeculativeSampling, TypicalAcceptance
from specprim.acceptance._speculative import WalkSteps, sibling_proposal
from specprim.residual import residual
from specprim.testing import (
    ContextTable,
    LosslessReport,
    assert_lossless,
    check_verdict,
    compare,
    draw_context_tree,
    draw_siblings,
    draw_tree,
    emitted_token_distribution,
    trees,
)
from specprim.testing._lossless import Rule

CHAIN = [-1, 0, 1, 2]  # 4 drafted tokens in a row
TREE = [-1, -1, -1, 0, 0, 1, 3]  # 3 root children, 2 under the first, depth 3
SHAPES = {"chain": CHAIN, "tree": TREE}
SCHEMES = ["iid", "without_replacement", "deterministic"]


# --- deliberately broken variants (test-only) -------------------------------------------------------------


def _no_residual(target: torch.Tensor, proposal: torch.Tensor, p_row: torch.Tensor) -> torch.Tensor:
    return p_row


NO_RESIDUAL = SpeculativeSampling(steps=WalkSteps(after_rejection=_no_residual))
"""(a) After a rejection, sample from the node's target p instead of the residual."""


def _q_one(r_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    return torch.where(q_x > 0, r_x, torch.zeros_like(r_x))


Q_ONE_SHORTCUT = SpeculativeSampling(steps=WalkSteps(acceptance_probability=_q_one))
"""(b) Accept an iid draft with probability p(x), as if q(x) were 1, but keep the residual against q."""


def _as_deterministic(sampling, q_row, excluded, token, p_row):  # type: ignore[no-untyped-def]
    return sibling_proposal("deterministic", None, excluded, token, p_row)


IID_AS_DETERMINISTIC = SpeculativeSampling(steps=WalkSteps(sibling_proposal=_as_deterministic))
"""Verify every draft as if it were deterministic (accept with p(x), remove x on rejection).

Not broken: conditional on any tokens drawn independently of the verifier's uniforms, the deterministic
procedure is exact, so this is lossless — just with a lower acceptance rate. The check must accept it.
"""


def _unnormalised(sampling, q_row, excluded, token, p_row):  # type: ignore[no-untyped-def]
    if sampling == "without_replacement":
        return q_row.masked_fill(excluded, 0.0)
    return sibling_proposal(sampling, q_row, excluded, token, p_row)


NO_RENORMALISATION = SpeculativeSampling(steps=WalkSteps(sibling_proposal=_unnormalised))
"""(c) Without replacement: zero the earlier siblings' tokens in q but forget to renormalise."""


def _keeps_rejected(p_row: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    return p_row


KEEPS_REJECTED_TOKENS = SpeculativeSampling(without_rejected=_keeps_rejected)
"""(d) Deterministic drafts (the scalar walk): draw the next token from the end node's target without removing
the siblings rejected there."""


def check(rule: Rule, shape: str, sampling: str, **kwargs: object) -> LosslessReport:
    report = assert_lossless(rule, parents=SHAPES[shape], sampling=sampling, trials=100_000, seed=7, **kwargs)
    print(f"{type(rule).__name__} {shape} {sampling}: {report}")
    return report


def rejects(rule: Rule, shape: str, sampling: str, **kwargs: object) -> str:
    with pytest.raises(AssertionError, match="not lossless") as info:
        check(rule, shape, sampling, **kwargs)
    print(info.value)
    return str(info.value)


# --- the correct rule passes -------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", SCHEMES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_speculative_sampling_is_lossless(shape: str, sampling: str) -> None:
    report = check(SpeculativeSampling(), shape, sampling)
    assert report.first.p_value > 1e-3 and report.p_value > 1e-3
    assert report.mean_accepted > 0.2  # the check exercised accepted paths, not only corrections


@pytest.mark.parametrize("sampling", ["iid", "deterministic"])
def test_lossless_with_truncated_target_and_draft(sampling: str) -> None:
    """Zeros in p and q (as after top-k / top-p): supports differ, residuals must handle it."""
    generator = torch.Generator().manual_seed(3)
    target = ContextTable.random(vocab_size=5, max_context=4, generator=generator, zero_fraction=0.4)
    noise = ContextTable.random(vocab_size=5, max_context=4, generator=generator, zero_fraction=0.4)
    check(SpeculativeSampling(), "tree", sampling, target=target, draft=noise)


def test_lossless_without_replacement_with_truncated_target() -> None:
    generator = torch.Generator().manual_seed(4)
    target = ContextTable.random(vocab_size=4, max_context=4, generator=generator, zero_fraction=0.5)
    draft = target.mix(ContextTable.random(vocab_size=4, max_context=4, generator=generator), 0.5)
    check(SpeculativeSampling(), "tree", "without_replacement", target=target, draft=draft)


def test_greedy_is_lossless_for_greedy_decoding_only() -> None:
    generator = torch.Generator().manual_seed(5)
    target = ContextTable.random(vocab_size=4, max_context=4, generator=generator)
    check(Greedy(), "tree", "iid", target=target.greedy())
    check(SpeculativeSampling(), "tree", "iid", target=target.greedy())
    rejects(Greedy(), "tree", "iid", target=target)


def test_deterministic_verification_of_iid_drafts_is_lossless_but_slower() -> None:
    exact = check(SpeculativeSampling(), "tree", "iid")
    wasteful = check(IID_AS_DETERMINISTIC, "tree", "iid")
    assert wasteful.mean_accepted < exact.mean_accepted - 0.2


# --- the same check rejects broken variants ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "sampling"), [("chain", "iid"), ("tree", "without_replacement"), ("tree", "deterministic")]
)
def test_rejects_missing_residual(shape: str, sampling: str) -> None:
    rejects(NO_RESIDUAL, shape, sampling)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rejects_deterministic_walk_that_keeps_rejected_tokens(shape: str) -> None:
    rejects(KEEPS_REJECTED_TOKENS, shape, "deterministic")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rejects_q_equals_one_shortcut_on_iid_drafts(shape: str) -> None:
    rejects(Q_ONE_SHORTCUT, shape, "iid")


def test_rejects_unnormalised_without_replacement_proposal() -> None:
    rejects(NO_RENORMALISATION, "tree", "without_replacement")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_typical_acceptance_is_detected_as_lossy(shape: str) -> None:
    message = rejects(TypicalAcceptance(), shape, "iid")
    assert "TypicalAcceptance" in message


# --- the harness itself ------------------------------------------------------------------------------------


def test_draw_siblings_follows_each_scheme() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.tensor([0.5, 0.3, 0.15, 0.05])
    rows = q.expand(200_000, 4)
    iid = draw_siblings(rows, 2, sampling="iid", generator=generator)
    for k in range(2):
        assert compare(torch.bincount(iid[:, k], minlength=4) / 2e5, q, 200_000).passed
    distinct = draw_siblings(rows, 3, sampling="without_replacement", generator=generator)
    assert bool((distinct[:, 0] != distinct[:, 1]).all() & (distinct[:, 1] != distinct[:, 2]).all())
    second = (q.unsqueeze(1) * q.unsqueeze(0) / (1 - q.unsqueeze(1))).fill_diagonal_(0).sum(0)  # P(x2 = y)
    assert compare(torch.bincount(distinct[:, 0], minlength=4) / 2e5, q, 200_000).passed
    assert compare(torch.bincount(distinct[:, 1], minlength=4) / 2e5, second, 200_000).passed
    top = draw_siblings(rows[:2], 3, sampling="deterministic")
    assert top.tolist() == [[0, 1, 2], [0, 1, 2]]
    with pytest.raises(ValueError):
        draw_siblings(torch.tensor([[0.5, 0.5, 0.0]]), 3, sampling="without_replacement")
    with pytest.raises(ValueError):
        draw_siblings(torch.tensor([[0.5, 0.5]]), 3, sampling="deterministic")


def test_context_trees_are_honest_and_consistent() -> None:
    generator = torch.Generator().manual_seed(1)
    draft = ContextTable.random(vocab_size=3, max_context=3, generator=generator)
    tree, rows = draw_context_tree(
        draft, torch.zeros(1000, dtype=torch.long), TREE, sampling="iid", generator=generator
    )
    assert isinstance(tree, DraftTree) and tree.q is not None and rows.shape == (1000, len(TREE) + 1)
    assert torch.equal(tree.q, draft.probs[rows])
    for node, parent in enumerate(TREE):  # row of a node = its parent's row extended by its token
        assert torch.equal(rows[:, node + 1], draft.child_rows(rows[:, parent + 1], tree.tokens[:, node]))
    fixed = draw_tree(tree.q, TREE, sampling="deterministic", keep_q=False)
    assert fixed.q is None and fixed.tokens[:, 0].tolist() == tree.q[:, 0].argmax(-1).tolist()
    with pytest.raises(ValueError):
        draw_context_tree(draft, torch.zeros(3, dtype=torch.long), CHAIN, sampling="iid")  # too deep


def test_context_table_joint_and_validation() -> None:
    table = ContextTable.random(vocab_size=3, max_context=2, generator=torch.Generator().manual_seed(0))
    assert table.vocab_size == 3 and table.max_context == 2 and table.probs.shape == (13, 3)
    joint = table.joint(3)
    assert joint.shape == (3, 3, 3) and torch.allclose(joint.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(joint.sum((1, 2)), table.probs[0].double())
    assert torch.allclose(joint[2].sum(1) / joint[2].sum(), table.probs[3].double())  # p(x2 | x1 = 2)
    with pytest.raises(ValueError):
        ContextTable(probs=torch.full((5, 3), 1 / 3))  # 5 is not 1 + 3 + 9 + ...
    with pytest.raises(ValueError):
        ContextTable(probs=torch.ones(4, 3))  # rows not normalised


def test_compare_statistics() -> None:
    expected = torch.tensor([0.5, 0.25, 0.25, 0.0])
    exact = compare(expected, expected, 10_000)
    assert exact.tv == 0 and exact.p_value == 1.0 and exact.passed
    impossible = compare(torch.tensor([0.5, 0.25, 0.2, 0.05]), expected, 10_000)
    assert impossible.p_value == 0.0 and not impossible.passed
    biased = compare(torch.tensor([0.55, 0.2, 0.25, 0.0]), expected, 10_000)
    assert biased.tv == pytest.approx(0.05) and biased.p_value < 1e-10


def test_emitted_distribution_of_plain_sampling_matches_the_joint() -> None:
    """A 'rule' that ignores the draft and samples from p is trivially lossless: sanity of the harness."""

    def plain(p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None):  # type: ignore[no-untyped-def]
        batch = p.shape[0]
        empty = torch.full((batch, tree.depth), -1, dtype=torch.long)
        from specprim._types import Verdict

        return Verdict(
            path=empty,
            num_accepted=torch.zeros(batch, dtype=torch.long),
            next_token=torch.multinomial(p[:, 0], 1, generator=generator).squeeze(1),
        )

    generator = torch.Generator().manual_seed(2)
    target = ContextTable.random(vocab_size=3, max_context=4, generator=generator)
    seen = emitted_token_distribution(
        plain,
        target=target,
        draft=target,
        parents=CHAIN[:2],
        sampling="iid",
        trials=50_000,
        num_tokens=3,
        generator=generator,
    )
    assert compare(seen, target.joint(3), 50_000).passed


def test_check_verdict_catches_bad_paths() -> None:
    from specprim._types import Verdict

    tree = DraftTree(tokens=torch.zeros(1, 3, dtype=torch.long), parents=torch.tensor([-1, -1, 0]))
    check_verdict(
        Verdict(path=torch.tensor([[0, 2]]), num_accepted=torch.tensor([2]), next_token=torch.tensor([0])),
        tree,
        2,
    )
    bad = [
        (torch.tensor([[1, 2]]), 2, 0),  # 2 is not a child of 1
        (torch.tensor([[0, -1]]), 2, 0),  # padding before num_accepted
        (torch.tensor([[0, 2]]), 1, 0),  # ids after num_accepted
        (torch.tensor([[0, 2]]), 2, 5),  # next token out of range
    ]
    for path, count, nxt in bad:
        with pytest.raises(AssertionError):
            check_verdict(
                Verdict(path=path, num_accepted=torch.tensor([count]), next_token=torch.tensor([nxt])),
                tree,
                2,
            )


@settings(max_examples=50, deadline=None)
@given(trees(10))
def test_tree_strategy_yields_valid_parents(parents: list[int]) -> None:
    assert validate_parents(parents) == parents


def test_residual_is_what_the_rule_uses() -> None:
    # Guard against the rule silently diverging from the public residual (the docs promise they agree).
    p, q = torch.tensor([[0.2, 0.8]]), torch.tensor([[0.6, 0.4]])
    assert torch.equal(WalkSteps().after_rejection(p, q, p), residual(p, q))
