"""The optimality oracle `optimal_chain_acceptance` (a linear program over couplings) against the rules: it equals
block verification's closed form (Sun et al. prove block verification optimal for chains), bounds token-level
speculative sampling, and no lossless rule's measured acceptance exceeds it (the lossy typical acceptance does)."""

from __future__ import annotations

import pytest
import torch
from _chain_forms import acceptance_by_depth

from specprim.acceptance import BlockVerification, SpeculativeSampling, TypicalAcceptance
from specprim.testing import ContextTable, optimal_chain_acceptance, sample_emitted_tokens


def tables(vocab: int, depth: int, seed: int, noise: float, zero_fraction: float = 0.0) -> tuple[ContextTable, ...]:
    """A random target and the draft ``(1 - noise) target + noise other``, deep enough for a chain of ``depth``."""
    generator = torch.Generator().manual_seed(seed)
    target = ContextTable.random(vocab_size=vocab, max_context=depth, generator=generator, zero_fraction=zero_fraction)
    other = ContextTable.random(vocab_size=vocab, max_context=depth, generator=generator, zero_fraction=zero_fraction)
    return target, target.mix(other, noise)


CASES = [  # (V, K, seed, noise, zero_fraction)
    (2, 1, 0, 0.7, 0.0),
    (3, 2, 1, 0.7, 0.0),
    (4, 3, 2, 0.7, 0.0),
    (3, 4, 3, 0.5, 0.0),
    (4, 3, 4, 1.0, 0.0),
    (4, 3, 5, 1.0, 0.4),  # truncated target and draft: different supports
    (5, 2, 6, 0.9, 0.3),
    (2, 5, 7, 0.8, 0.0),
]


@pytest.mark.parametrize(("vocab", "depth", "seed", "noise", "zero_fraction"), CASES)
def test_the_optimum_is_block_verification_and_bounds_token_level(vocab, depth, seed, noise, zero_fraction) -> None:
    target, draft = tables(vocab, depth, seed, noise, zero_fraction)
    optimum = optimal_chain_acceptance(target, draft, depth)
    token_form, block_form = acceptance_by_depth(target, draft, depth)
    print(f"V={vocab} K={depth}: optimum {optimum:.5f}, block {sum(block_form):.5f}, token-level "
          f"{sum(token_form):.5f} ({sum(token_form) / optimum:.1%} of the optimum)")
    assert optimum == pytest.approx(sum(block_form), abs=1e-7)
    assert sum(token_form) <= optimum + 1e-7


def test_known_optima() -> None:
    """``q == p`` accepts the whole chain; one token accepts ``sum(min(p, q)) = 1 - TV(p, q)``; disjoint supports
    accept nothing; an empty chain accepts nothing."""
    target, draft = tables(3, 3, seed=0, noise=0.6)
    assert optimal_chain_acceptance(target, target, 3) == pytest.approx(3.0, abs=1e-7)
    one = float(torch.minimum(target.probs[0], draft.probs[0]).double().sum())
    assert optimal_chain_acceptance(target, draft, 1) == pytest.approx(one, abs=1e-7)
    rows = target.probs.shape[0]
    left = ContextTable(probs=torch.tensor([[1.0, 0.0, 0.0]]).expand(rows, 3).contiguous())
    right = ContextTable(probs=torch.tensor([[0.0, 0.5, 0.5]]).expand(rows, 3).contiguous())
    assert optimal_chain_acceptance(left, right, 2) == pytest.approx(0.0, abs=1e-9)
    assert optimal_chain_acceptance(target, draft, 0) == 0.0


def test_no_lossless_rule_exceeds_the_optimum() -> None:
    """Measured on 10**5 first steps (5 standard errors): block verification reaches the optimum, token-level
    speculative sampling stays below block verification, and only the lossy typical acceptance goes above."""
    target, draft = tables(4, 3, seed=5, noise=0.7)
    optimum = optimal_chain_acceptance(target, draft, 3)
    generator = torch.Generator().manual_seed(0)
    measured = {}
    for rule in (BlockVerification(), SpeculativeSampling(), TypicalAcceptance()):
        _, accepted = sample_emitted_tokens(rule, target=target, draft=draft, parents=[-1, 0, 1], sampling="iid",
                                            trials=100_000, num_tokens=1, generator=generator)
        accepted = accepted.double()
        measured[type(rule).__name__] = (float(accepted.mean()), float(accepted.std()) / 100_000**0.5)
        print(f"{type(rule).__name__}: {measured[type(rule).__name__][0]:.4f} "
              f"({measured[type(rule).__name__][0] / optimum:.1%} of the optimum {optimum:.4f})")
    block, token, typical = (measured[name] for name in ("BlockVerification", "SpeculativeSampling",
                                                          "TypicalAcceptance"))
    assert abs(block[0] - optimum) < 5 * block[1]
    assert token[0] < block[0] - 5 * (block[1] + token[1])
    assert typical[0] > optimum + 5 * typical[1]  # the oracle bounds lossless rules only


def test_invalid_problems_raise() -> None:
    target, draft = tables(3, 2, seed=0, noise=0.5)
    with pytest.raises(ValueError, match="max_context"):
        optimal_chain_acceptance(target, draft, 4)
    with pytest.raises(ValueError, match="depth"):
        optimal_chain_acceptance(target, draft, -1)
    other, _ = tables(2, 2, seed=0, noise=0.5)
    with pytest.raises(ValueError, match="vocabulary"):
        optimal_chain_acceptance(target, other, 2)
    big, big_draft = tables(6, 6, seed=0, noise=0.5)
    with pytest.raises(ValueError, match="LP variables"):
        optimal_chain_acceptance(big, big_draft, 6)
