"""Optimal multi-draft acceptance of the root's siblings (an LP coupling, tiny V): lossless under every sampling scheme
(Monte-Carlo, 10**5 trials, two tokens), a broken variant the same check rejects, its acceptance against the
max-flow / min-cut closed form and against token-level speculative sampling, structural properties and errors."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specprim._types import SAMPLING_SCHEMES, DraftTree
from specprim.acceptance import AcceptanceRule, OptimalMultiDraft, SpeculativeSampling
from specprim.testing import ContextTable, LosslessReport, assert_lossless, check_verdict, sample_emitted_tokens

ROOT3 = [-1, -1, -1]  # three drafts of the first token


class IidCouplingForDistinctDrafts(OptimalMultiDraft):
    """Couples with the iid tuple law whatever the drafter declared: wrong for drafts without replacement."""

    def _first_token(self, p: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        return super()._first_token(p, dataclasses.replace(tree, sampling="iid"))


def check(rule: AcceptanceRule, sampling: str, parents=ROOT3, **kwargs: object) -> LosslessReport:
    report = assert_lossless(rule, parents=parents, sampling=sampling, trials=100_000, seed=7, **kwargs)
    print(f"{type(rule).__name__} {parents} {sampling}: {report}")
    return report


@pytest.mark.parametrize("sampling", SAMPLING_SCHEMES)
def test_optimal_multidraft_is_lossless(sampling: str) -> None:
    report = check(OptimalMultiDraft(), sampling)
    assert report.first.p_value > 1e-3 and report.p_value > 1e-3


@pytest.mark.parametrize("sampling", ["iid", "without_replacement"])
def test_lossless_with_a_far_draft_and_truncated_tables(sampling: str) -> None:
    check(OptimalMultiDraft(), sampling, parents=[-1, -1], vocab_size=6, draft_noise=1.0)
    generator = torch.Generator().manual_seed(3)
    target = ContextTable.random(vocab_size=5, max_context=2, generator=generator, zero_fraction=0.3)
    draft = ContextTable.random(vocab_size=5, max_context=2, generator=generator)  # full support: 3 distinct exist
    check(OptimalMultiDraft(), sampling, target=target, draft=draft)


@pytest.mark.parametrize("vocab", [4, 6])
def test_rejects_the_iid_coupling_on_drafts_without_replacement(vocab: int) -> None:
    with pytest.raises(AssertionError, match="not lossless"):
        check(IidCouplingForDistinctDrafts(), "without_replacement", parents=[-1, -1], vocab_size=vocab,
              draft_noise=1.0)


def min_cut(p: np.ndarray, law: dict[tuple[int, ...], float]) -> float:
    """``min over token sets T of p(T) + 1 - Q(tuple inside T)``: the most a coupling can accept."""
    vocab = p.shape[0]
    return min(float(p[list(subset)].sum()) + 1.0 - sum(v for x, v in law.items() if set(x) <= set(subset))
               for size in range(vocab + 1) for subset in itertools.combinations(range(vocab), size))


def iid_law(q: np.ndarray, width: int) -> dict[tuple[int, ...], float]:
    return {x: float(np.prod(q[list(x)])) for x in itertools.product(range(q.shape[0]), repeat=width)}


def test_acceptance_is_the_min_cut_optimum_and_beats_token_level() -> None:
    """One context (the empty one), three iid drafts, V = 5, a draft independent of the target: measured
    ``P(accept)`` over 10**5 first steps against the closed form (5 standard errors); token-level speculative
    sampling (SpecInfer's recursive rejection) accepts less."""
    generator = torch.Generator().manual_seed(11)
    target = ContextTable.random(vocab_size=5, max_context=1, generator=generator)
    draft = ContextTable.random(vocab_size=5, max_context=1, generator=generator)
    p, q = target.probs[0].double().numpy(), draft.probs[0].double().numpy()
    optimum = min_cut(p / p.sum(), iid_law(q / q.sum(), 3))
    trials, rates = 100_000, {}
    for rule in (OptimalMultiDraft(), SpeculativeSampling()):
        _, accepted = sample_emitted_tokens(rule, target=target, draft=draft, parents=ROOT3, sampling="iid",
                                            trials=trials, num_tokens=1, generator=generator)
        rates[type(rule).__name__] = float(accepted.double().mean())
    print(f"optimum {optimum:.4f}, measured {rates}")
    error = 5 * (optimum * (1 - optimum) / trials) ** 0.5
    assert abs(rates["OptimalMultiDraft"] - optimum) < error
    assert rates["SpeculativeSampling"] < optimum - error


@st.composite
def root_problems(draw: st.DrawFn) -> tuple[torch.Tensor, DraftTree]:
    width = draw(st.integers(min_value=0, max_value=3))
    batch = draw(st.integers(min_value=1, max_value=5))
    vocab = draw(st.integers(min_value=3, max_value=4))
    sampling = draw(st.sampled_from(SAMPLING_SCHEMES))
    generator = torch.Generator().manual_seed(draw(st.integers(min_value=0, max_value=2**31 - 1)))
    p = (torch.randn(batch, width + 1, vocab, generator=generator) * 2).softmax(-1)
    q = (torch.randn(batch, width + 1, vocab, generator=generator) * 2).softmax(-1)
    tokens = torch.randint(0, vocab, (batch, width), generator=generator)  # repeats included
    tree = DraftTree(tokens=tokens, parents=torch.full((width,), -1, dtype=torch.long), q=q, sampling=sampling)
    return p, tree


@settings(max_examples=40, deadline=None)
@given(problem=root_problems(), seed=st.integers(min_value=0, max_value=1000))
def test_verdict_structure_determinism_and_no_mutation(problem: tuple[torch.Tensor, DraftTree], seed: int) -> None:
    p, tree = problem
    before = [t.clone() for t in (p, tree.tokens, tree.parents, tree.q)]
    first = OptimalMultiDraft()(p, tree, generator=torch.Generator().manual_seed(seed))
    second = OptimalMultiDraft()(p, tree, generator=torch.Generator().manual_seed(seed))
    check_verdict(first, tree, p.shape[-1])
    assert all(torch.equal(a, b) for a, b in zip(before, (p, tree.tokens, tree.parents, tree.q), strict=True))
    for name in ("path", "num_accepted", "next_token"):
        assert torch.equal(getattr(first, name), getattr(second, name))


def test_deeper_trees_and_large_vocabularies_are_refused() -> None:
    q = torch.full((1, 3, 3), 1 / 3)
    chain = DraftTree(tokens=torch.zeros(1, 2, dtype=torch.long), parents=torch.tensor([-1, 0]), q=q, sampling="iid")
    with pytest.raises(ValueError, match="first token only"):
        OptimalMultiDraft()(q.clone(), chain)
    wide = torch.full((1, 4, 50), 1 / 50)
    tree = DraftTree(tokens=torch.zeros(1, 3, dtype=torch.long), parents=torch.tensor([-1, -1, -1]), q=wide,
                     sampling="iid")
    with pytest.raises(ValueError, match="tiny vocabularies"):
        OptimalMultiDraft()(wide.clone(), tree)
    assert OptimalMultiDraft.lossless and dataclasses.replace(OptimalMultiDraft(), max_variables=10).max_variables == 10
