"""The residual distribution sampled from after a speculative rejection."""

from __future__ import annotations

import torch


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``normalize(max(0, p - q))`` over the last dimension.

    Args:
        p: (..., V) target probabilities.
        q: (..., V) draft probabilities (broadcastable against ``p``).

    Returns:
        (..., V) tensor with ``p``'s dtype; every row sums to 1 (up to rounding) and is exactly zero wherever
        ``q >= p``. Rows whose positive mass ``sum(max(0, p - q))`` is zero (``p <= q`` everywhere, which for
        two distributions means ``p == q``) are returned as ``p`` itself: rejection rate is then zero, so the
        value is never used by a correct rule, but it stays a distribution and never NaN.

    Guarantees: never mutates ``p`` or ``q``; differentiable almost everywhere; works on any device.

    Why it is the right thing to sample after a rejection: if ``x ~ q`` is accepted with probability
    ``min(1, p(x) / q(x))``, the accepted mass on ``x`` is ``min(p(x), q(x))`` and the rejection probability
    is ``1 - sum(min(p, q)) = sum(max(0, p - q))``, so ``min(p, q) + P(reject) * residual(p, q) == p``.
    """
    diff = (p - q.to(p.dtype)).clamp_min(0.0)  # (..., V)
    mass = diff.sum(dim=-1, keepdim=True)  # (..., 1)
    safe_mass = torch.where(mass > 0, mass, torch.ones_like(mass))
    return torch.where(mass > 0, diff / safe_mass, p.expand_as(diff))
