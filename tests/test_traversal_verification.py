"""Traversal verification (Weng et al. 2025): lossless on chains, a root's siblings and two-level trees under every
sampling scheme (Monte-Carlo, 10**5 trials, first and second emitted tokens), two deliberately broken variants that
the same check rejects, block verification's verdicts on chains (hence its closed form and the chain optimum),
recursive rejection sampling's at depth 1 and more accepted tokens on deeper trees, hypothesis properties (verdict
structure, no mutation, greedy limit), and end to end: sampled `speculative_generate` with a ``sampled:`` tree on a
tiny model, greedy parity with `generate`."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _chain_forms import acceptance_by_depth
from _tiny import VOCAB, tiny_causal_lm
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specprim import speculative_generate
from specprim._types import SAMPLING_SCHEMES, DraftTree
from specprim.acceptance import (
    RULES,
    AcceptanceRule,
    BlockVerification,
    Greedy,
    SpeculativeSampling,
    TraversalVerification,
)
from specprim.drafters import ModelDrafter
from specprim.sampling import SamplingConfig
from specprim.testing import (
    ContextTable,
    LosslessReport,
    assert_lossless,
    check_verdict,
    draw_context_tree,
    draw_tree,
    exact_two_token_distribution,
    optimal_chain_acceptance,
    sample_emitted_tokens,
    verification_problems,
)
from specprim.trees import Chain, StaticTree

SHAPES = {
    "chain": [-1, 0, 1, 2],  # 4 drafted tokens in a row
    "root-3": [-1, -1, -1],  # three drafts of the first token
    "two-level": [-1, -1, 0, 0, 1, 1],  # two drafts, each with two children
}
DEEP = [-1, 0, 0, 1, 2, -1]  # mixed depths: a branch of depth 3 and a lone sibling


# --- deliberately broken variants (test-only) -------------------------------------------------------------


class KeepsTheWeight(TraversalVerification):
    """(a) After a rejection the parent keeps its weight ``w`` (its target renormalised to mass ``w``) instead of
    ``s / (1 - w + s)``: forgets that the rejection itself carried information."""

    def _after_rejection(self, base, scale, weight, rows, factor):
        new_base, _, _ = super()._after_rejection(base, scale, weight, rows, factor)
        total = new_base.sum(dim=1)
        return new_base, weight / torch.where(total > 0, total, torch.ones_like(total)), weight


class UnnormalisedProposal(TraversalVerification):
    """(b) Drafts without replacement: the later siblings' proposal is the parent's ``q`` row without the earlier
    tokens, but not renormalised (the bug `assert_lossless` was tuned to catch)."""

    def _proposal(self, sampling, left, total, token):
        rows, factor = super()._proposal(sampling, left, total, token)
        return rows, torch.ones_like(factor)


def check(rule: AcceptanceRule, parents: list[int], sampling: str, **kwargs: object) -> LosslessReport:
    report = assert_lossless(rule, parents=parents, sampling=sampling, trials=100_000, seed=7, **kwargs)
    print(f"{type(rule).__name__} {parents} {sampling}: {report}")
    return report


# --- Monte-Carlo losslessness --------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", SAMPLING_SCHEMES)
@pytest.mark.parametrize("shape", SHAPES)
def test_traversal_verification_is_lossless(shape: str, sampling: str) -> None:
    report = check(TraversalVerification(), SHAPES[shape], sampling)
    assert report.first.p_value > 1e-3 and report.p_value > 1e-3
    assert report.mean_accepted > 0.3  # the check exercised accepted paths, not only corrections


def test_lossless_with_truncated_tables_and_a_far_draft() -> None:
    """Zeros in p and q (top-k / top-p) and a draft independent of the target: small weights, residuals everywhere."""
    generator = torch.Generator().manual_seed(3)
    target = ContextTable.random(vocab_size=5, max_context=4, generator=generator, zero_fraction=0.4)
    draft = ContextTable.random(vocab_size=5, max_context=4, generator=generator, zero_fraction=0.4)
    check(TraversalVerification(), DEEP, "iid", target=target, draft=draft)
    check(TraversalVerification(), DEEP, "iid", draft_noise=1.0)


def test_rejects_keeping_the_weight_after_a_rejection() -> None:
    with pytest.raises(AssertionError, match="not lossless") as info:
        check(KeepsTheWeight(), SHAPES["two-level"], "iid")
    print(info.value)


def test_rejects_an_unnormalised_proposal_for_drafts_without_replacement() -> None:
    with pytest.raises(AssertionError, match="not lossless") as info:
        check(UnnormalisedProposal(), SHAPES["root-3"], "without_replacement", draft_noise=1.0)
    print(info.value)
    check(TraversalVerification(), SHAPES["root-3"], "without_replacement", draft_noise=1.0)  # the rule passes


# --- relation to block verification, recursive rejection sampling and the optimum ------------------------------


def honest(parents: list[int], sampling: str, seed: int, trials: int = 20_000) -> tuple[torch.Tensor, DraftTree]:
    """``p`` and a batch of trees drawn honestly from a draft close to a random target."""
    generator = torch.Generator().manual_seed(seed)
    target = ContextTable.random(vocab_size=4, max_context=4, generator=generator)
    draft = target.mix(ContextTable.random(vocab_size=4, max_context=4, generator=generator), 0.7)
    tree, rows = draw_context_tree(draft, torch.zeros(trials, dtype=torch.long), parents, sampling=sampling,
                                   generator=generator, keep_q=sampling != "deterministic")
    return target.probs[rows], tree


@pytest.mark.parametrize("sampling", SAMPLING_SCHEMES)
def test_on_chains_it_is_block_verification(sampling: str) -> None:
    """The same weights, the same stopping probabilities, the same uniforms: the same verdicts, row for row."""
    p, tree = honest(SHAPES["chain"], sampling, seed=1)
    got = TraversalVerification()(p, tree, generator=torch.Generator().manual_seed(2))
    block = BlockVerification()(p, tree, generator=torch.Generator().manual_seed(2))
    assert torch.equal(got.path, block.path) and torch.equal(got.next_token, block.next_token)


def test_on_chains_it_reaches_the_closed_form_and_the_optimum() -> None:
    """Mean accepted length over 10**5 first steps against block verification's closed form ``sum_j sum_x q(x) w_j``
    (5 standard errors), which is the chain optimum of the LP oracle; never above it."""
    generator = torch.Generator().manual_seed(5)
    target = ContextTable.random(vocab_size=4, max_context=3, generator=generator)
    draft = target.mix(ContextTable.random(vocab_size=4, max_context=3, generator=generator), 0.7)
    _, block_form = acceptance_by_depth(target, draft, 3)
    optimum = optimal_chain_acceptance(target, draft, 3)
    _, accepted = sample_emitted_tokens(TraversalVerification(), target=target, draft=draft, parents=[-1, 0, 1],
                                        sampling="iid", trials=100_000, num_tokens=1, generator=generator)
    mean, error = float(accepted.double().mean()), 5 * float(accepted.double().std()) / 100_000**0.5
    print(f"chain of 3: traversal {mean:.4f} +- {error / 5:.4f}, closed form {sum(block_form):.4f}, "
          f"optimum {optimum:.4f}")
    assert sum(block_form) == pytest.approx(optimum, abs=1e-7)
    assert abs(mean - sum(block_form)) < error and mean < optimum + error


@pytest.mark.parametrize("sampling", ["iid", "without_replacement"])
def test_at_depth_one_it_is_recursive_rejection_sampling(sampling: str) -> None:
    """A root's siblings only: the same acceptance tests on the same uniforms, so the same accepted node."""
    p, tree = honest([-1, -1, -1, -1], sampling, seed=3)
    got = TraversalVerification()(p, tree, generator=torch.Generator().manual_seed(4))
    token_level = SpeculativeSampling()(p, tree, generator=torch.Generator().manual_seed(4))
    assert torch.equal(got.path, token_level.path)


@pytest.mark.parametrize("sampling", ["iid", "without_replacement"])
@pytest.mark.parametrize("parents", [SHAPES["two-level"], DEEP])
def test_accepts_more_than_speculative_sampling_on_trees(parents: list[int], sampling: str) -> None:
    """Paired: with one seed both rules verify the same first-step trees (10**5), so the difference of their mean
    accepted lengths has a small standard error; traversal accepts at least as much, here strictly more."""
    traversal, token_level = (check(rule, parents, sampling) for rule in (TraversalVerification(),
                                                                             SpeculativeSampling()))
    gain = traversal.mean_accepted - token_level.mean_accepted
    print(f"{parents} {sampling}: traversal {traversal.mean_accepted:.4f}, speculative sampling "
          f"{token_level.mean_accepted:.4f} (+{gain / token_level.mean_accepted:.1%})")
    assert gain > 0.01


# --- structural properties -----------------------------------------------------------------------------------


def snapshot(p: torch.Tensor, tree: DraftTree) -> list[torch.Tensor]:
    return [t.clone() for t in (p, tree.tokens, tree.parents) + (() if tree.q is None else (tree.q,))]


@settings(max_examples=80, deadline=None)
@given(problem=verification_problems(), seed=st.integers(min_value=0, max_value=1000))
def test_verdict_structure_determinism_and_no_mutation(problem: tuple[torch.Tensor, DraftTree], seed: int) -> None:
    p, tree = problem
    before = snapshot(p, tree)
    first = TraversalVerification()(p, tree, generator=torch.Generator().manual_seed(seed))
    second = TraversalVerification()(p, tree, generator=torch.Generator().manual_seed(seed))
    # accepted length <= depth, path follows parents, -1 padding after num_accepted, next_token in [0, V)
    check_verdict(first, tree, p.shape[-1])
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(p, tree), strict=True)), "inputs mutated"
    for name in ("path", "num_accepted", "next_token"):
        assert torch.equal(getattr(first, name), getattr(second, name)), f"{name} differs for one seed"
    last = first.path.gather(1, (first.num_accepted - 1).clamp_min(0)[:, None])[:, 0] if tree.depth else None
    end = torch.where(first.num_accepted > 0, last, -1) if tree.depth else first.num_accepted - 1  # (B,) path's end
    end_rows = p[torch.arange(p.shape[0]), end + 1]  # (B, V) the target after the accepted path
    assert bool((end_rows.gather(1, first.next_token[:, None]) > 0).all()), "emitted a token p gives 0"


@settings(max_examples=80, deadline=None)
@given(problem=verification_problems(), seed=st.integers(min_value=0, max_value=1000))
def test_one_hot_targets_give_greedy_verdicts(problem: tuple[torch.Tensor, DraftTree], seed: int) -> None:
    """At temperature 0 (one-hot ``p``) traversal verification is `Greedy` on trees with distinct siblings."""
    p, tree = problem
    assume(max(map(len, tree.children)) <= p.shape[-1])
    one_hot = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).float()
    q = 0.5 * (tree.q if tree.q is not None else one_hot) + 0.5 / p.shape[-1]  # positive: no q(x) == 0 skips
    distinct = draw_tree(q, tree.parent_list, sampling="deterministic")  # distinct siblings, top of q
    drafts = [distinct.tokens]  # distinct siblings, mostly wrong
    if max(map(len, tree.children)) <= 1:  # a chain: also the all-correct one
        drafts.append(one_hot.argmax(-1)[:, tree.parents + 1])
    for tokens in drafts:
        candidate = dataclasses.replace(distinct, tokens=tokens.contiguous(), sampling=tree.sampling,
                                        q=q if tree.q is not None else None)
        got = TraversalVerification()(one_hot, candidate, generator=torch.Generator().manual_seed(seed))
        expected = Greedy()(one_hot, candidate)
        assert torch.equal(got.path, expected.path) and torch.equal(got.next_token, expected.next_token)


def test_empty_tree_samples_from_p() -> None:
    p = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]])
    tree = DraftTree(tokens=torch.zeros(2, 0, dtype=torch.long), parents=torch.zeros(0, dtype=torch.long))
    verdict = TraversalVerification()(p, tree, generator=torch.Generator().manual_seed(0))
    assert verdict.path.shape == (2, 0) and verdict.num_accepted.tolist() == [0, 0]
    assert verdict.next_token.tolist() == [1, 0]


def test_a_deeper_path_is_kept_where_top_down_verification_stops() -> None:
    """The paper's motivating case, exactly: ``x_1`` alone would pass with 1/2, but ``x_1 x_2`` together pass with
    ``min(1, 1/2 * 4/3) = 2/3``; top-down verification keeps the pair with ``1/2``. One iid chain of two, 10**5
    rows: P(keep both) = 2/3 against 1/2."""
    batch = 100_000
    p = torch.tensor([[0.25, 0.75], [0.8, 0.2], [0.5, 0.5]]).expand(batch, 3, 2)
    q = torch.tensor([[0.5, 0.5], [0.6, 0.4], [0.5, 0.5]]).expand(batch, 3, 2)
    tree = DraftTree(tokens=torch.tensor([[0, 0]]).expand(batch, 2), parents=torch.tensor([-1, 0]), q=q,
                     sampling="iid")
    both = {}
    for rule in (TraversalVerification(), SpeculativeSampling()):
        verdict = rule(p, tree, generator=torch.Generator().manual_seed(0))
        both[type(rule).__name__] = float((verdict.num_accepted == 2).double().mean())
    assert both["TraversalVerification"] == pytest.approx(2 / 3, abs=0.01)
    assert both["SpeculativeSampling"] == pytest.approx(1 / 2, abs=0.01)


def test_rule_conventions_and_unsupported_schemes() -> None:
    rule = TraversalVerification()
    assert isinstance(rule, AcceptanceRule) and dataclasses.is_dataclass(rule) and TraversalVerification.lossless
    assert not getattr(rule, "greedy_only", False)
    assert RULES["traversal"] is TraversalVerification
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.lossless = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="N \\+ 1"):
        rule(torch.full((1, 2, 3), 1 / 3), DraftTree(tokens=torch.zeros(1, 2, dtype=torch.long),
                                                     parents=torch.tensor([-1, 0])))

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class IidOnly(TraversalVerification):
        supports = ("iid",)

    tree = DraftTree(tokens=torch.zeros(1, 2, dtype=torch.long), parents=torch.tensor([-1, -1]))
    with pytest.raises(ValueError, match="supports sampling in") as info:
        IidOnly()(torch.full((1, 3, 3), 1 / 3), tree)
    assert "\n" not in str(info.value)


# --- end to end ----------------------------------------------------------------------------------------------

E2E_VOCAB = 5
PROMPT = torch.tensor([[1, 2, 3]])
SAMPLED_TREE = StaticTree(paths=((0,), (1,), (0, 0), (0, 1), (1, 0)), sample_without_replacement=True)


def peaked(seed: int) -> torch.nn.Module:
    model = tiny_causal_lm("llama", seed=seed, vocab=E2E_VOCAB)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model


def test_sampled_generation_matches_plain_sampling_on_the_first_two_tokens() -> None:
    """Three new tokens, so the first step verifies the whole ``sampled:`` tree of depth two (siblings drawn without
    replacement); the first two tokens against the exact ``p(x1) p(x2 | x1)``."""
    from scipy import stats

    target, draft = peaked(0), peaked(1)
    sampling = SamplingConfig(temperature=1.0)
    generator = torch.Generator().manual_seed(1234)
    drafter, trials = ModelDrafter(draft, SAMPLED_TREE), 1200
    counts = torch.zeros(E2E_VOCAB * E2E_VOCAB, dtype=torch.float64)
    first_steps = []  # (tree depth, accepted) of every run's first step
    for _ in range(trials):
        out = speculative_generate(target, PROMPT, drafter=drafter, acceptance=TraversalVerification(),
                                   max_new_tokens=3, temperature=sampling.temperature, generator=generator)
        first, second = out.sequences[0, PROMPT.shape[1]:PROMPT.shape[1] + 2].tolist()
        counts[first * E2E_VOCAB + second] += 1
        first_steps.append((out.stats.tree_depth[0], out.stats.accepted[0]))
    expected = exact_two_token_distribution(target, PROMPT, sampling).flatten().double() * trials
    assert float(counts[expected == 0].sum()) == 0, "emitted a pair of probability zero"
    big = expected >= 5
    seen_cells = torch.cat([counts[big], counts[~big].sum()[None]])
    want_cells = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = want_cells > 0
    want_cells = want_cells[keep] * trials / want_cells[keep].sum()
    assert float(stats.chisquare(seen_cells[keep], want_cells).pvalue) > 1e-3
    assert {depth for depth, _ in first_steps} == {2}  # every first step verified the tree of depth two
    assert {accepted for _, accepted in first_steps} == {0, 1, 2}


def test_greedy_parity_with_generate() -> None:
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompt = torch.randint(2, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    for drafter in (ModelDrafter(draft, SAMPLED_TREE), ModelDrafter(target, Chain(4))):
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=TraversalVerification(),
                                   max_new_tokens=30)
        assert torch.equal(out.sequences, expected)
