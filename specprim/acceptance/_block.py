"""Block verification of a draft chain (Sun et al., "Block Verification Accelerates Speculative Decoding", 2024)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from specprim._types import DraftTree, Verdict
from specprim.acceptance._base import TreeTables, validate_inputs, verdict_at
from specprim.sampling import sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockVerification:
    """Lossless verification of a chain ``x_1 .. x_K`` that judges the draft as a block, not token by token.

    Row ``j`` of ``p`` / ``q`` is the distribution of ``x_{j+1}`` given the root and ``x_1 .. x_j``. With
    ``w_0 = 1`` and ``w_j = min(1, w_{j-1} p_{j-1}(x_j) / q_{j-1}(x_j))`` (``w_j`` is 0 for a token with
    ``q(x_j) == 0``, which could not have been drawn), the rule stops at ``j`` with probability

    - ``h_K = w_K`` at the end of the chain,
    - ``h_j = s_j / (s_j + 1 - w_j)`` for ``0 < j < K``, where ``s_j = sum(max(0, w_j p_j - q_j))``,
    - ``h_0 = 1``,

    draws one uniform ``u_j`` per position and accepts ``tau = max{j : u_j < h_j}`` tokens. ``next_token`` is
    drawn from ``max(0, w_tau p_tau - q_tau)`` (renormalised) when ``tau < K``, and from ``p_K`` when the whole
    chain is accepted. Token-level speculative sampling is the case where the test at ``j`` ignores the later
    tokens; looking at the whole block accepts ``x_1 .. x_j`` with probability ``q(x_1..x_j) w_j``, the largest
    any lossless rule can reach (see ``docs/acceptance.md`` for the argument, and
    :func:`specprim.testing.optimal_chain_acceptance` for the linear program it is checked against).

    Supported trees: chains only (``parents = [-1, 0, 1, ..., K - 2]``, including the empty tree); anything else
    raises ``ValueError``. In a chain every node is an only child, so ``"iid"`` and ``"without_replacement"``
    both mean ``x_{j+1} ~ q_j``; ``"deterministic"`` drafts (or ``q is None``) are verified with
    ``q_j = one_hot(x_{j+1})``, the distribution they were drawn from. On one-hot targets (greedy decoding) the
    verdict is :class:`Greedy`'s.

    Guarantee (``lossless = True``): when the drafter honours the q-contract, the emitted tokens (accepted chain
    prefix then ``next_token``) are distributed exactly as autoregressive sampling from ``p``.

    ``_weights``, ``_stop_probabilities`` and ``_correction`` are the steps an ablation may override (the tests
    break two of them on purpose and check that the losslessness check notices). Randomness: ``K`` uniforms
    and the final sample come from ``generator`` only.
    """

    lossless: ClassVar[bool] = True

    def __call__(self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Verdict:
        validate_inputs(p, tree)
        _check_chain(tree)
        tables = TreeTables.of(tree, p.device)
        batch, length = tree.tokens.shape  # B, K
        q = _proposals(p, tree)  # (B, K, V) the row each chain token was drawn from
        weights = self._weights(p, q, tree.tokens)  # (B, K + 1) w_0 .. w_K
        stop = self._stop_probabilities(p, q, weights)  # (B, K + 1) h_0 .. h_K
        uniforms = torch.rand(batch, length, generator=generator, device=p.device, dtype=p.dtype)  # (B, K)
        keep = torch.cat([stop.new_ones(batch, 1, dtype=torch.bool), uniforms < stop[:, 1:]], dim=1)  # (B, K + 1)
        positions = torch.arange(length + 1, device=p.device)  # (K + 1,)
        accepted = torch.where(keep, positions, 0).max(dim=1).values  # (B,) tau
        next_token = sample(self._correction(p, q, weights, accepted), generator)  # (B,)
        return verdict_at(accepted - 1, next_token, tables)  # node tau - 1 ends the path (-1: nothing accepted)

    def _weights(self, p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(B, K + 1, V) p, (B, K, V) q, (B, K) tokens -> (B, K + 1) ``w_0 = 1``, ``w_j = min(1, w_{j-1} p / q)``
        at ``x_j``; 0 from a token with ``q(x_j) == 0`` on."""
        length = tokens.shape[1]
        p_x = p[:, :length].gather(2, tokens.unsqueeze(2)).squeeze(2)  # (B, K) p_{j-1}(x_j)
        q_x = q.gather(2, tokens.unsqueeze(2)).squeeze(2)  # (B, K) q_{j-1}(x_j)
        safe_q = torch.where(q_x > 0, q_x, torch.ones_like(q_x))
        weights = [torch.ones_like(p[:, 0, 0])]  # (B,) each
        for j in range(length):
            ratio = (weights[-1] * p_x[:, j] / safe_q[:, j]).clamp(max=1.0)  # (B,) never NaN: w * p <= 1
            weights.append(torch.where(q_x[:, j] > 0, ratio, torch.zeros_like(ratio)))
        return torch.stack(weights, dim=1)

    def _stop_probabilities(self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """(B, K + 1, V) p, (B, K, V) q, (B, K + 1) weights -> (B, K + 1) ``h_j``, the probability of stopping at
        ``j`` given that no later position was kept.

        ``h_j = s_j / (s_j + 1 - w_j)`` with ``s_j = sum(max(0, w_j p_j - q_j))``; a zero denominator means
        ``w_j = 1`` and ``p_j == q_j``, where nothing is lost by keeping the prefix, so ``h_j = 1`` there.
        """
        length = q.shape[1]
        inner = weights[:, 1:length]  # (B, K - 1) w_1 .. w_{K-1}
        excess = (inner.unsqueeze(2) * p[:, 1:length] - q[:, 1:]).clamp_min(0.0).sum(dim=2)  # (B, K - 1) s_j
        denominator = excess + (1.0 - inner)
        safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
        h_inner = torch.where(denominator > 0, (excess / safe).clamp(0.0, 1.0), torch.ones_like(excess))
        ends = weights[:, length:] if length else weights[:, :0]  # (B, 1) h_K = w_K, or (B, 0) for no chain
        return torch.cat([torch.ones_like(weights[:, :1]), h_inner, ends], dim=1)

    def _correction(
        self, p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor, accepted: torch.Tensor
    ) -> torch.Tensor:
        """(B, K + 1, V) p, (B, K, V) q, (B, K + 1) weights, (B,) tau -> (B, V) what ``next_token`` is drawn from
        (unnormalised): ``max(0, w_tau p_tau - q_tau)``, with ``q_K = 0``; ``p_tau`` where that has no mass."""
        rows = torch.arange(p.shape[0], device=p.device)
        p_row = p[rows, accepted]  # (B, V)
        q_row = torch.cat([q, torch.zeros_like(p[:, :1])], dim=1)[rows, accepted]  # (B, V)
        left = (weights[rows, accepted].unsqueeze(1) * p_row - q_row).clamp_min(0.0)  # (B, V)
        return torch.where(left.sum(dim=1, keepdim=True) > 0, left, p_row)


def _proposals(p: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """(B, K, V) in ``p``'s dtype: row ``j`` is the distribution node ``j``'s token was drawn from (``q``'s row
    ``j``, or ``one_hot(x_{j+1})`` for deterministic drafts)."""
    length, vocab = tree.num_nodes, p.shape[2]
    if tree.sampling == "deterministic" or tree.q is None:
        return torch.nn.functional.one_hot(tree.tokens, vocab).to(p.dtype)
    return tree.q[:, :length].to(p.dtype)


def _check_chain(tree: DraftTree) -> None:
    parents = tree.parent_list
    if parents != list(range(-1, len(parents) - 1)):
        shown = parents if len(parents) <= 12 else [*parents[:12], "..."]
        raise ValueError(
            f"BlockVerification verifies chains only (parents = [-1, 0, 1, ..., K - 2]), got parents {shown}; "
            "use SpeculativeSampling for trees"
        )
