"""Block verification (Sun et al. 2024): lossless for chains under every sampling scheme (Monte-Carlo, 10**5 trials,
first and second emitted tokens), two deliberately broken variants that the same check rejects, its per-depth
acceptance against the closed form, hypothesis properties (verdict structure, no mutation, greedy limit), chain-only
errors, and end to end: sampled `speculative_generate` on a tiny model, greedy parity with `generate`."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from _chain_forms import acceptance_by_depth
from _tiny import VOCAB, tiny_causal_lm
from hypothesis import given, settings
from hypothesis import strategies as st

from specprim import speculative_generate
from specprim._types import SAMPLING_SCHEMES, DraftTree
from specprim.acceptance import RULES, AcceptanceRule, BlockVerification, Greedy, SpeculativeSampling
from specprim.drafters import ModelDrafter
from specprim.sampling import SamplingConfig
from specprim.testing import (
    ContextTable,
    LosslessReport,
    assert_lossless,
    chains,
    check_verdict,
    compare,
    exact_two_token_distribution,
    sample_emitted_tokens,
    verification_problems,
)
from specprim.trees import Chain

CHAIN = [-1, 0, 1, 2]  # 4 drafted tokens in a row


# --- deliberately broken variants (test-only) -------------------------------------------------------------


class StopAtWeight(BlockVerification):
    """(a) Keep the prefix ``x_1..x_j`` with probability ``w_j`` itself, forgetting the residual mass ``s_j``."""

    def _stop_probabilities(self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.ones_like(weights[:, :1]), weights[:, 1:]], dim=1)


class UnweightedCorrection(BlockVerification):
    """(b) After stopping at ``j``, sample the token-level residual ``max(0, p_j - q_j)`` instead of
    ``max(0, w_j p_j - q_j)``. Only the token *after* an accepted prefix is wrong, so only the second emitted
    token shows it, and only where ``w_j < 1`` is common (a draft far from the target)."""

    def _correction(
        self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor, accepted: torch.Tensor
    ) -> torch.Tensor:
        return super()._correction(p, q, torch.ones_like(weights), accepted)


def check(rule: AcceptanceRule, sampling: str, **kwargs: object) -> LosslessReport:
    report = assert_lossless(rule, parents=CHAIN, sampling=sampling, trials=100_000, seed=7, **kwargs)
    print(f"{type(rule).__name__} chain {sampling}: {report}")
    return report


def rejects(rule: AcceptanceRule, sampling: str, **kwargs: object) -> str:
    with pytest.raises(AssertionError, match="not lossless") as info:
        check(rule, sampling, **kwargs)
    print(info.value)
    return str(info.value)


# --- Monte-Carlo losslessness --------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", SAMPLING_SCHEMES)
def test_block_verification_is_lossless_on_chains(sampling: str) -> None:
    report = check(BlockVerification(), sampling)
    assert report.first.p_value > 1e-3 and report.p_value > 1e-3
    assert report.mean_accepted > 0.3  # the check exercised accepted prefixes, not only corrections


def test_block_verification_is_lossless_with_truncated_tables_and_a_far_draft() -> None:
    """Zeros in p and q (top-k / top-p), and a draft independent of the target: ``w_j < 1`` and zero-``q`` tokens
    everywhere."""
    generator = torch.Generator().manual_seed(3)
    target = ContextTable.random(vocab_size=5, max_context=5, generator=generator, zero_fraction=0.4)
    draft = ContextTable.random(vocab_size=5, max_context=5, generator=generator, zero_fraction=0.4)
    check(BlockVerification(), "iid", target=target, draft=draft)
    check(BlockVerification(), "iid", draft_noise=1.0)


def test_block_verification_accepts_more_than_token_level_on_the_same_drafts() -> None:
    block, token = check(BlockVerification(), "iid"), check(SpeculativeSampling(), "iid")
    assert block.mean_accepted > token.mean_accepted + 0.1  # 1.44 against 1.16 on this table


def test_rejects_stopping_at_the_weight() -> None:
    rejects(StopAtWeight(), "iid")


def test_rejects_the_unweighted_correction_on_the_second_token() -> None:
    message = rejects(UnweightedCorrection(), "iid", draft_noise=1.0)
    first, joint = (float(x) for x in re.findall(r"chi2 p=([0-9.e+-]+)", message))
    assert first > 1e-2 and joint < 1e-10  # the first token alone is right (2e-22 for the pair)
    exact = check(BlockVerification(), "iid", draft_noise=1.0)  # same tables, same uniforms: the correct rule passes
    assert exact.p_value > 1e-2


# --- acceptance against its closed form ----------------------------------------------------------------------


def test_acceptance_by_depth_matches_the_closed_form() -> None:
    """``P(tau >= j) = sum over x_1..x_j of q(x_1..x_j) w_j``, measured on 10**5 first steps (5 standard errors)."""
    generator = torch.Generator().manual_seed(5)
    target = ContextTable.random(vocab_size=4, max_context=4, generator=generator)
    draft = target.mix(ContextTable.random(vocab_size=4, max_context=4, generator=generator), 0.7)
    trials = 100_000
    token_form, block_form = acceptance_by_depth(target, draft, len(CHAIN))
    for rule, form in ((BlockVerification(), block_form), (SpeculativeSampling(), token_form)):
        _, accepted = sample_emitted_tokens(rule, target=target, draft=draft, parents=CHAIN, sampling="iid",
                                            trials=trials, num_tokens=1, generator=generator)
        for depth, expected in enumerate(form, start=1):
            seen = float((accepted >= depth).double().mean())
            assert abs(seen - expected) < 5 * (expected * (1 - expected) / trials) ** 0.5 + 1e-9, (rule, depth)
    assert all(t <= b + 1e-12 for t, b in zip(token_form, block_form, strict=True))


def test_a_fully_accepted_chain_and_an_exact_draft() -> None:
    """``q == p``: every weight is 1, the whole chain is kept and the bonus is drawn from ``p`` after it."""
    batch, vocab = 20_000, 3
    p = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8]]).expand(batch, 3, vocab)
    tokens = torch.randint(0, vocab, (batch, 2), generator=torch.Generator().manual_seed(0))
    tree = DraftTree(tokens=tokens, parents=torch.tensor([-1, 0]), q=p.clone(), sampling="iid")
    verdict = BlockVerification()(p, tree, generator=torch.Generator().manual_seed(1))
    assert bool((verdict.num_accepted == 2).all())
    seen = torch.bincount(verdict.next_token, minlength=vocab).double() / batch
    assert compare(seen, p[0, 2].double(), batch).passed


# --- structural properties -----------------------------------------------------------------------------------


def snapshot(p: torch.Tensor, tree: DraftTree) -> list[torch.Tensor]:
    return [t.clone() for t in (p, tree.tokens, tree.parents) + (() if tree.q is None else (tree.q,))]


@settings(max_examples=80, deadline=None)
@given(problem=verification_problems(chains(6)), seed=st.integers(min_value=0, max_value=1000))
def test_verdict_structure_determinism_and_no_mutation(problem: tuple[torch.Tensor, DraftTree], seed: int) -> None:
    p, tree = problem
    before = snapshot(p, tree)
    first = BlockVerification()(p, tree, generator=torch.Generator().manual_seed(seed))
    second = BlockVerification()(p, tree, generator=torch.Generator().manual_seed(seed))
    # accepted length <= depth, path follows parents, -1 padding after num_accepted, next_token in [0, V)
    check_verdict(first, tree, p.shape[-1])
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(p, tree), strict=True)), "inputs mutated"
    for name in ("path", "num_accepted", "next_token"):
        assert torch.equal(getattr(first, name), getattr(second, name)), f"{name} differs for one seed"
    p_next = p[torch.arange(p.shape[0]), first.num_accepted].gather(1, first.next_token[:, None])
    assert bool((p_next > 0).all()), "emitted a token the target gives probability zero"


@settings(max_examples=80, deadline=None)
@given(problem=verification_problems(chains(6)), seed=st.integers(min_value=0, max_value=1000))
def test_one_hot_targets_give_greedy_verdicts(problem: tuple[torch.Tensor, DraftTree], seed: int) -> None:
    """At temperature 0 (one-hot ``p``) block verification is `Greedy`, for drafts the draft could have drawn."""
    p, tree = problem
    one_hot = torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).float()
    q = 0.5 * (tree.q if tree.q is not None else one_hot) + 0.5 / p.shape[-1]  # positive: no q(x) == 0 junk
    tree = dataclasses.replace(tree, q=q if tree.sampling != "deterministic" else tree.q)
    for target_tokens in (tree.tokens, one_hot.argmax(-1)[:, : tree.num_nodes]):  # random, then all-correct chains
        chain = dataclasses.replace(tree, tokens=target_tokens.contiguous())
        got = BlockVerification()(one_hot, chain, generator=torch.Generator().manual_seed(seed))
        expected = Greedy()(one_hot, chain)
        assert torch.equal(got.path, expected.path) and torch.equal(got.next_token, expected.next_token)


def test_empty_chain_samples_from_p() -> None:
    p = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]])
    tree = DraftTree(tokens=torch.zeros(2, 0, dtype=torch.long), parents=torch.zeros(0, dtype=torch.long))
    verdict = BlockVerification()(p, tree, generator=torch.Generator().manual_seed(0))
    assert verdict.path.shape == (2, 0) and verdict.num_accepted.tolist() == [0, 0]
    assert verdict.next_token.tolist() == [1, 0]


@pytest.mark.parametrize("parents", [[-1, -1], [-1, 0, 0], [-1, 0, 1, 1]])
def test_trees_are_refused_with_one_line(parents: list[int]) -> None:
    tree = DraftTree(tokens=torch.zeros(1, len(parents), dtype=torch.long), parents=torch.tensor(parents),
                     q=torch.full((1, len(parents) + 1, 3), 1 / 3), sampling="iid")
    with pytest.raises(ValueError, match=r"chains only .*SpeculativeSampling for trees") as info:
        BlockVerification()(torch.full((1, len(parents) + 1, 3), 1 / 3), tree)
    assert "\n" not in str(info.value)


def test_rule_conventions() -> None:
    rule = BlockVerification()
    assert isinstance(rule, AcceptanceRule) and dataclasses.is_dataclass(rule) and BlockVerification.lossless
    assert not getattr(rule, "greedy_only", False)
    assert RULES["block"] is BlockVerification
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.lossless = False  # type: ignore[misc]
    with pytest.raises(ValueError, match="N \\+ 1"):
        rule(torch.full((1, 2, 3), 1 / 3), DraftTree(tokens=torch.zeros(1, 2, dtype=torch.long),
                                                     parents=torch.tensor([-1, 0])))


# --- end to end ----------------------------------------------------------------------------------------------

E2E_VOCAB = 5
PROMPT = torch.tensor([[1, 2, 3]])


def peaked(seed: int) -> torch.nn.Module:
    model = tiny_causal_lm("llama", seed=seed, vocab=E2E_VOCAB)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model


def test_sampled_generation_matches_plain_sampling_on_the_first_two_tokens() -> None:
    """Three new tokens, so the first step verifies a chain of two (with two, the loop drafts only one token and block
    verification is token-level); the first two tokens against the exact ``p(x1) p(x2 | x1)``."""
    from scipy import stats

    target, draft = peaked(0), peaked(1)
    sampling = SamplingConfig(temperature=1.0)
    generator = torch.Generator().manual_seed(1234)
    drafter, trials = ModelDrafter(draft, Chain(2)), 1200
    counts = torch.zeros(E2E_VOCAB * E2E_VOCAB, dtype=torch.float64)
    first_steps = []  # (tree depth, accepted) of every run's first step
    for _ in range(trials):
        out = speculative_generate(target, PROMPT, drafter=drafter, acceptance=BlockVerification(), max_new_tokens=3,
                                   temperature=sampling.temperature, generator=generator)
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
    assert {depth for depth, _ in first_steps} == {2}  # every first step verified a chain of two
    assert {accepted for _, accepted in first_steps} == {0, 1, 2}  # and stopped inside it as well as at its ends


def test_greedy_parity_with_generate() -> None:
    target, draft = tiny_causal_lm("llama", seed=0), tiny_causal_lm("llama", seed=1)
    prompt = torch.randint(2, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    for drafter in (ModelDrafter(draft, Chain(3)), ModelDrafter(target, Chain(5))):
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=BlockVerification(), max_new_tokens=30)
        assert torch.equal(out.sequences, expected)
