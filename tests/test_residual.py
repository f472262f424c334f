"""Properties of `specprim.residual.residual`."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specprim.residual import residual
from specprim.testing import distributions

pairs = st.integers(min_value=1, max_value=8).flatmap(lambda v: st.tuples(distributions(v), distributions(v)))


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_residual_is_a_distribution_zero_where_q_dominates(pq: tuple[torch.Tensor, torch.Tensor]) -> None:
    p, q = pq
    p_before, q_before = p.clone(), q.clone()
    r = residual(p, q)
    assert torch.equal(p, p_before) and torch.equal(q, q_before), "inputs were mutated"
    assert r.shape == p.shape and r.dtype == p.dtype
    assert not bool(r.isnan().any())
    assert bool((r >= 0).all())
    assert torch.allclose(r.sum(), torch.tensor(1.0, dtype=r.dtype))
    assert bool((r[q >= p] == 0).all()) or bool((p <= q).all()), "mass where q >= p"
    if bool((p <= q).all()):  # no positive mass: p itself comes back
        assert torch.equal(r, p)


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_rejection_step_reconstructs_p(pq: tuple[torch.Tensor, torch.Tensor]) -> None:
    """min(p, q) + P(reject) * residual(p, q) == p: the identity that makes speculative sampling exact."""
    p, q = pq
    rejection = (p - q).clamp_min(0).sum()
    assert torch.allclose(torch.minimum(p, q) + rejection * residual(p, q), p, atol=1e-12)


@given(st.integers(min_value=1, max_value=8).flatmap(distributions))
def test_equal_distributions_give_p(p: torch.Tensor) -> None:
    assert torch.equal(residual(p, p), p)


def test_known_values_and_leading_shapes() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0], [0.1, 0.5, 0.4]])
    expected = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    assert torch.allclose(residual(p, q), expected)
    batched = torch.rand(3, 4, 5, 6).softmax(-1)
    other = torch.rand(3, 4, 5, 6).softmax(-1)
    out = residual(batched, other)
    assert out.shape == (3, 4, 5, 6)
    assert torch.allclose(out.sum(-1), torch.ones(3, 4, 5))
    # one-hot proposal: remove that token and renormalise (the deterministic-draft residual)
    one_hot = torch.tensor([0.0, 1.0, 0.0])
    assert torch.allclose(residual(torch.tensor([0.2, 0.6, 0.2]), one_hot), torch.tensor([0.5, 0.0, 0.5]))


def test_zero_mass_rows_return_p_without_nan() -> None:
    p = torch.tensor([[0.0, 1.0], [0.3, 0.7]])
    q = torch.tensor([[0.0, 1.0], [0.4, 0.6]])
    out = residual(p, q)
    assert torch.equal(out[0], p[0])
    assert torch.allclose(out[1], torch.tensor([0.0, 1.0]))
    assert not bool(out.isnan().any())
