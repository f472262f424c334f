"""Optimal multi-draft acceptance for the root's siblings: the coupling of the drafted tuple and the emitted token
that accepts a draft most often (SpecTr, Sun et al. 2023; Hu et al. 2025), by linear programming, for tiny V."""

from __future__ import annotations

import dataclasses
import itertools
from typing import ClassVar

import numpy as np
import torch

from specprim._types import DraftTree, Sampling, Verdict
from specprim.acceptance._base import TreeTables, validate_inputs, verdict_at
from specprim.sampling import sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimalMultiDraft:
    """Verify ``k`` drafts of the first token (every node a child of the root) with the optimal coupling.

    The ordered tuple ``x = (x_1 .. x_k)`` was drawn from ``Q``: ``q^k`` for ``"iid"``, one token after another
    without the earlier ones for ``"without_replacement"``. Among the joint laws of ``(x, y)`` with marginals ``Q``
    and ``p`` (``p = p[:, 0]``, the target of the first token), the rule takes one that maximises
    ``P(y in {x_1 .. x_k})``, found by a linear program (HiGHS through ``scipy``: the largest flow on the pairs with
    ``y`` in ``x`` under both marginals, the rest of each row from the residual ``p`` no tuple took), and draws ``y``
    from its row for the observed tuple. When ``y`` is a drafted token, the first sibling holding it is accepted
    and ``next_token`` is drawn from that sibling's row of ``p``; otherwise nothing is accepted and
    ``next_token = y``. ``y ~ p`` whatever the draft, which is the whole losslessness argument; the accepted
    probability ``max P(y in x)`` equals ``min over token sets T of p(T) + 1 - Q(x inside T)`` (max-flow / min-cut).
    Deterministic drafts (or ``q is None``) have a one-point ``Q``, whose only coupling is ``y ~ p``, and get exactly
    that (the same acceptance as `SpeculativeSampling`).

    Cost: one LP per distinct ``(p, q)`` row pair of the batch, with ``k V**k`` variables and ``V**k + V``
    constraints, after enumerating the ``V**k`` tuples in Python; the rule refuses problems above ``max_variables``
    (default 20,000: V = 12 with 3 drafts is 5,184, V = 20 with 3 is 24,000), so it is a research and testing tool
    for tiny vocabularies, not for real models (V = 49,152). Trees deeper than one level raise ``ValueError`` (the
    rule couples the root's siblings only).

    Guarantee (``lossless = True``): when the drafter honours the q-contract the emitted tokens are distributed as
    sampling from ``p``. Needs ``scipy``.
    """

    max_variables: int = 20_000
    lossless: ClassVar[bool] = True

    def __call__(self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Verdict:
        validate_inputs(p, tree)
        if any(parent != -1 for parent in tree.parent_list):
            raise ValueError(
                f"OptimalMultiDraft verifies drafts of the first token only (all parents -1), got parents "
                f"{tree.parent_list[:12]}; use SpeculativeSampling for deeper trees"
            )
        tables = TreeTables.of(tree, p.device)
        batch, width = tree.tokens.shape  # B, k
        first = self._first_token(p, tree)  # (B, V) unnormalised law of y given the drafts
        y = sample(first, generator)  # (B,)
        hits = tree.tokens == y.unsqueeze(1)  # (B, k)
        accepted = hits.any(dim=1)  # (B,)
        child = torch.where(accepted, hits.to(torch.uint8).argmax(dim=1), -1) if width else y.new_full((batch,), -1)
        bonus = sample(p[torch.arange(batch, device=p.device), child + 1], generator)  # (B,) after the child
        return verdict_at(child, torch.where(accepted, bonus, y), tables)

    def _first_token(self, p: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        """(B, N + 1, V) p and a depth-1 tree -> (B, V): the coupling's row for each observed tuple (``p[:, 0]``
        where the draft is deterministic, empty, or a tuple ``Q`` gives probability zero)."""
        root = p[:, 0]  # (B, V)
        batch, width = tree.tokens.shape
        if width == 0 or tree.sampling == "deterministic" or tree.q is None:
            return root
        vocab = p.shape[2]
        if width * vocab**width > self.max_variables:
            raise ValueError(f"OptimalMultiDraft would solve an LP of {width * vocab**width} variables (k V**k) "
                             f"> max_variables = {self.max_variables}; it is for tiny vocabularies")
        pairs = torch.cat([root, tree.q[:, 0].to(p.dtype)], dim=1).double().cpu()  # (B, 2V)
        unique, inverse = torch.unique(pairs, dim=0, return_inverse=True)  # (U, 2V), (B,)
        tuple_ids = (tree.tokens.cpu() * vocab ** torch.arange(width - 1, -1, -1)).sum(dim=1)  # (B,) base-V index
        rows = torch.empty(batch, vocab, dtype=torch.float64)
        for u in range(unique.shape[0]):
            members = (inverse == u).nonzero().squeeze(1)  # (b,)
            conditional = coupling(unique[u, :vocab].numpy(), unique[u, vocab:].numpy(), width, tree.sampling)
            rows[members] = torch.from_numpy(conditional)[tuple_ids[members]]
        rows = rows.to(device=p.device, dtype=p.dtype)
        return torch.where(rows.sum(dim=1, keepdim=True) > 0, rows, root)


def tuple_law(q: np.ndarray, width: int, sampling: Sampling) -> np.ndarray:
    """(V,) q -> (V**k,) probability of each ordered tuple (base-V index, first token most significant)."""
    vocab = q.shape[0]
    law = np.zeros(vocab**width)
    for index, drafted in enumerate(itertools.product(range(vocab), repeat=width)):
        probability, used = 1.0, 0.0
        for position, token in enumerate(drafted):
            if sampling == "iid":
                probability *= q[token]
            elif token in drafted[:position] or used >= 1.0:
                probability = 0.0
            else:
                probability *= q[token] / (1.0 - used)
                used += q[token]
        law[index] = probability
    return law


def coupling(p: np.ndarray, q: np.ndarray, width: int, sampling: Sampling) -> np.ndarray:
    """(V,) p, (V,) q -> (V**k, V): row ``x`` is ``P(y | tuple x)`` under a coupling of the tuple law ``Q`` and ``p``
    that maximises ``P(y in x)`` (rows of impossible tuples are zero).

    One LP (HiGHS): the largest flow ``f[x, y] >= 0`` on the pairs with ``y`` in ``x``, with ``sum_y f[x, y] <= Q(x)``
    and ``sum_x f[x, y] <= p(y)`` (always feasible, unlike equality marginals, which HiGHS declared infeasible when a
    tuple's probability was below its tolerance). The rest of each row is the residual ``p - sum_x f[x, .]``,
    renormalised: ``P(y) = sum_x f[x, y] + (1 - F) residual(y) = p(y)``.
    """
    from scipy.optimize import linprog

    vocab = p.shape[0]
    p = p / p.sum()
    law = tuple_law(q / q.sum(), width, sampling)
    law = law / law.sum()
    tuples = np.array(list(itertools.product(range(vocab), repeat=width))).reshape(-1, width)  # (T, k)
    member = (tuples[:, :, None] == np.arange(vocab)).any(axis=1)  # (T, V): y is one of the tuple's tokens
    rows, tokens = member.nonzero()  # one flow variable per (tuple, member token)
    a_ub = np.zeros((law.shape[0] + vocab, rows.shape[0]))
    a_ub[rows, np.arange(rows.shape[0])] = 1.0  # sum_y f[x, y] <= Q(x)
    a_ub[law.shape[0] + tokens, np.arange(rows.shape[0])] = 1.0  # sum_x f[x, y] <= p(y)
    result = linprog(-np.ones(rows.shape[0]), A_ub=a_ub, b_ub=np.concatenate([law, p]), bounds=(0, None),
                     method="highs")
    if result.status != 0:
        raise RuntimeError(f"the coupling LP failed: {result.message}")
    flow = np.zeros((law.shape[0], vocab))  # (T, V)
    flow[rows, tokens] = result.x.clip(min=0.0)
    left = (p - flow.sum(axis=0)).clip(min=0.0)  # (V,) the target mass no tuple took
    residual = left / left.sum() if left.sum() > 0 else p
    accepted = np.where(law[:, None] > 0, flow / np.where(law > 0, law, 1.0)[:, None], 0.0)  # (T, V)
    accepted = accepted / np.maximum(accepted.sum(axis=1, keepdims=True), 1.0)  # rounding: rows sum to <= 1
    rest = np.where(law > 0, 1.0 - accepted.sum(axis=1), 0.0)  # (T,)
    return accepted + rest[:, None] * residual
