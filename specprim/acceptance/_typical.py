"""Medusa's typical acceptance (lossy): accept tokens the target finds plausible enough."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from specprim._types import DraftTree, Verdict
from specprim.acceptance._base import (
    TreeTables,
    all_ancestors_flagged,
    deepest,
    rows_at,
    validate_inputs,
    verdict_at,
)
from specprim.sampling import sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class TypicalAcceptance:
    """Medusa's typical acceptance (Cai et al., 2024).

    A node with token ``x`` is *typical* when ``p_parent(x) > min(epsilon, delta * exp(-H(p_parent)))``, with
    ``H`` the entropy (nats) of the parent's target row. The accepted path ends at the deepest node whose
    ancestors-or-self are all typical (ties: highest cumulative ``log p`` along the path, then lowest node
    id). ``next_token`` is sampled (through ``generator``) from ``p`` at the end of the path restricted to
    its typical set (tokens above that row's threshold, the argmax always kept), renormalised.

    Guarantee (``lossless = False``): the output is *not* distributed as ``p``; it trades exactness for longer
    accepted paths. ``q`` and ``sampling`` are ignored. Medusa's reference code uses ``epsilon = 0.09``
    (``posterior_threshold``) and ``delta = 0.3`` (``posterior_alpha``, about ``sqrt(epsilon)``).

    Raises ``ValueError`` at construction unless ``0 < epsilon <= 1`` and ``delta > 0`` (finite).
    """

    epsilon: float = 0.09
    delta: float = 0.3
    lossless: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not _is_number(self.epsilon) or not 0.0 < self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be a number in (0, 1], got {self.epsilon!r}")
        if not _is_number(self.delta) or not 0.0 < self.delta < math.inf:
            raise ValueError(f"delta must be a finite number > 0, got {self.delta!r}")

    def thresholds(self, p: torch.Tensor) -> torch.Tensor:
        """(..., V) probabilities -> (...,) typicality threshold ``min(epsilon, delta * exp(-H))``."""
        entropy = -torch.special.xlogy(p, p).sum(dim=-1)  # (...,)
        return torch.clamp(self.delta * torch.exp(-entropy), max=self.epsilon)

    def __call__(self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Verdict:
        validate_inputs(p, tree)
        tables = TreeTables.of(tree, p.device)
        threshold = self.thresholds(p)  # (B, N + 1)
        token_prob = p[:, tables.parent_row].gather(-1, tree.tokens.unsqueeze(-1)).squeeze(-1)  # (B, N)
        flags = token_prob > threshold[:, tables.parent_row]  # (B, N)
        accepted = all_ancestors_flagged(flags, tables)  # (B, N)
        log_prob = torch.where(flags, token_prob, torch.ones_like(token_prob)).log()  # (B, N), 0 if unflagged
        path_log_prob = log_prob @ tables.ancestors.T.to(log_prob.dtype)  # (B, N) cumulative log p
        end = deepest(accepted, tables, score=path_log_prob)  # (B,)
        next_token = sample(self._typical_set(rows_at(p, end)), generator)
        return verdict_at(end, next_token, tables)

    def _typical_set(self, row: torch.Tensor) -> torch.Tensor:
        """(B, V) probabilities -> (B, V) the same restricted to its typical set (unnormalised)."""
        keep = row > self.thresholds(row).unsqueeze(-1)  # (B, V)
        keep = keep | torch.nn.functional.one_hot(row.argmax(dim=-1), row.shape[-1]).bool()
        return torch.where(keep, row, torch.zeros_like(row))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
