"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) and its multi-draft tree form."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import torch

from specprim._types import DraftTree, Sampling, Verdict
from specprim.acceptance._base import TreeTables, rows_at, validate_inputs, verdict_at
from specprim.residual import residual
from specprim.sampling import sample


def sibling_proposal(
    sampling: Sampling, q_row: torch.Tensor | None, excluded: torch.Tensor, token: torch.Tensor, p_row: torch.Tensor
) -> torch.Tensor:
    """The distribution sibling ``token`` was drawn from, given the earlier siblings.

    Args: q_row (B, V) or ``None``; excluded (B, V) bool, the earlier siblings' tokens; token (B,);
    p_row (B, V) the target at the current node (unused here, available to ablations).
    Returns: (B, V).
    """
    if sampling == "deterministic" or q_row is None:
        return torch.zeros_like(p_row).scatter_(1, token.unsqueeze(1), 1.0)
    if sampling == "iid":
        return q_row
    remaining = q_row.masked_fill(excluded, 0.0)  # (B, V)
    mass = remaining.sum(dim=-1, keepdim=True)  # (B, 1)
    return remaining / torch.where(mass > 0, mass, torch.ones_like(mass))


def acceptance_probability(r_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """(B,) ``r(x)``, (B,) ``q_k(x)`` -> (B,) ``min(1, r(x) / q_k(x))``, 0 where ``q_k(x) == 0``."""
    safe_q = torch.where(q_x > 0, q_x, torch.ones_like(q_x))
    return torch.where(q_x > 0, (r_x / safe_q).clamp(max=1.0), torch.zeros_like(r_x))


def after_rejection(target: torch.Tensor, proposal: torch.Tensor, p_row: torch.Tensor) -> torch.Tensor:
    """(B, V) target, (B, V) rejected proposal, (B, V) node's target -> (B, V) the new target: the residual."""
    return residual(target, proposal)


def without_rejected(p_row: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """(B, V) the end node's target, (B, K) tokens rejected there (-1: none) -> (B, V) what the next token is
    drawn from: ``p_row`` with the rejected tokens zeroed (unnormalised; ``p_row`` itself if nothing is left)."""
    hits = torch.zeros(p_row.shape, dtype=torch.int32, device=p_row.device)  # (B, V)
    hits.scatter_add_(1, rejected.clamp_min(0), (rejected >= 0).to(torch.int32))
    target = p_row.masked_fill(hits > 0, 0.0)
    return torch.where(target.sum(dim=1, keepdim=True) > 0, target, p_row)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WalkSteps:
    """The steps of speculative sampling as stated, each a function (the exact ones by default): what
    ``SpeculativeSampling(steps=...)`` walks with. An ablation replaces one (the tests break each on purpose and
    check that the losslessness check notices)."""

    sibling_proposal: Callable[[Sampling, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor],
                               torch.Tensor] = sibling_proposal
    acceptance_probability: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = acceptance_probability
    after_rejection: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = after_rejection


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeSampling:
    """Lossless verification by recursive rejection sampling over siblings.

    Walk from the root. At the current node ``c`` keep a target ``r`` (initially ``p[:, c + 1]``) and try the
    children of ``c`` in node order. Sibling ``k`` with token ``x_k`` has the effective proposal ``q_k``, the
    distribution ``x_k`` was really drawn from given the earlier siblings (``tree.sampling``):

    - ``"iid"``: ``q_k = q[:, c + 1]`` (SpecInfer's multi-step sampling);
    - ``"without_replacement"``: ``q[:, c + 1]`` with the earlier siblings' tokens zeroed, renormalised;
    - ``"deterministic"``: ``one_hot(x_k)`` (``q`` may be ``None``), i.e. accept with probability ``r(x_k)``
      and on rejection remove ``x_k`` from ``r``.

    Accept ``x_k`` with probability ``min(1, r(x_k) / q_k(x_k))``: on acceptance move to that child with
    ``r = p[:, child + 1]``; on rejection set ``r = residual(r, q_k)`` and try the next sibling. When all
    children are rejected (or there are none) emit ``next_token ~ r``. A chain is the special case of one
    child per node (Leviathan / Chen).

    Guarantee (``lossless = True``): when the drafter honours the q-contract, the emitted tokens (accepted
    path then ``next_token``) are distributed exactly as autoregressive sampling from ``p``.

    Contract violations: a sibling whose token has ``q_k(x_k) == 0`` could not have been drawn (``"iid"``:
    ``q(x) == 0``; ``"without_replacement"``: a repeated token or ``q(x) == 0``). It is skipped — rejected
    *without* updating ``r`` — which is exactly what the rule would do had the sibling not been drafted, so
    such junk never biases the output (``min(1, r/0)`` would otherwise accept it unconditionally).

    Code paths: by default deterministic drafts take a walk over all siblings of a level at once and sampled ones
    a walk over unnormalised targets (the same verdicts, fewer vocabulary-wide passes). ``steps`` (a
    :class:`WalkSteps`, for ablations) makes every tree take the rule as stated over those steps instead;
    ``without_rejected`` is what the deterministic walk draws the next token from (an ablation may replace it too).
    Randomness: uniforms and the final sample come from ``generator`` only.
    """

    lossless: ClassVar[bool] = True
    steps: WalkSteps | None = dataclasses.field(default=None, repr=False)
    without_rejected: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = dataclasses.field(
        default=without_rejected, repr=False)

    def __call__(self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Verdict:
        validate_inputs(p, tree)
        tables = TreeTables.of(tree, p.device)
        if self.steps is not None:
            return self._walk(p, tree, tables, self.steps, generator)
        if tree.sampling == "deterministic" or tree.q is None:
            return self._deterministic_walk(p, tree, tables, generator)
        return self._sampled_walk(p, tree, tables, generator)

    def _walk(
        self, p: torch.Tensor, tree: DraftTree, tables: TreeTables, steps: WalkSteps,
        generator: torch.Generator | None
    ) -> Verdict:
        """The rule as stated, over whole (B, V) rows, with ``steps``: every sampling scheme."""
        batch, _, vocab = p.shape
        q = None if tree.sampling == "deterministic" or tree.q is None else tree.q.to(p.dtype)
        node = torch.full((batch,), -1, dtype=torch.long, device=p.device)  # (B,) current node
        target = p[:, 0]  # (B, V) r: what the next emitted token must be distributed as
        walking = torch.ones(batch, dtype=torch.bool, device=p.device)  # (B,) rows still descending
        for _level in range(tree.depth + 1):
            if not bool(walking.any()):
                break
            p_row = target  # (B, V) the undisturbed target of the current node
            q_row = None if q is None else rows_at(q, node)  # (B, V)
            excluded = torch.zeros(batch, vocab, dtype=torch.bool, device=p.device)  # earlier siblings
            kids, moved, uniforms = _level_start(tables, node, walking, p, generator)
            for rank in range(kids.shape[1]):
                child = kids[:, rank]  # (B,) -1 where the node has fewer children
                trying = walking & ~moved & (child >= 0)
                token = tree.tokens.gather(1, child.clamp_min(0).unsqueeze(1)).squeeze(1)  # (B,)
                proposal = steps.sibling_proposal(tree.sampling, q_row, excluded, token, p_row)  # (B, V)
                q_x = proposal.gather(1, token.unsqueeze(1)).squeeze(1)  # (B,)
                r_x = target.gather(1, token.unsqueeze(1)).squeeze(1)  # (B,)
                accept = trying & (uniforms[:, rank] < steps.acceptance_probability(r_x, q_x))
                reject = trying & ~accept & (q_x > 0)  # zero-q siblings are skipped, r unchanged
                after = steps.after_rejection(target, proposal, p_row)  # (B, V)
                target = torch.where(reject.unsqueeze(1), after, target)
                target = torch.where(accept.unsqueeze(1), rows_at(p, child), target)
                node = torch.where(accept, child, node)
                moved = moved | accept
                excluded = excluded | torch.zeros_like(excluded).scatter_(1, token.unsqueeze(1), trying.unsqueeze(1))
            walking = moved
        next_token = sample(target, generator)  # (B,)
        return verdict_at(node, next_token, tables)

    def _deterministic_walk(
        self, p: torch.Tensor, tree: DraftTree, tables: TreeTables, generator: torch.Generator | None
    ) -> Verdict:
        """:meth:`_walk` for deterministic drafts, all siblings of a level at once; same uniforms, same verdicts.

        With ``q_k = one_hot(x_k)`` the target after rejecting siblings ``x_1 .. x_{k-1}`` of node ``c`` is
        ``p_c`` with those tokens zeroed and renormalised, so ``r(x_k) = p_c(x_k) / (1 - removed_k)`` where
        ``removed_k`` is the ``p_c`` mass of the distinct earlier siblings (a repeated token has ``r = 0``). The
        first sibling with ``uniform_k < r(x_k)`` is accepted, as in the sequential walk, so a level costs a few
        (B, K) operations instead of K rounds over (B, V) rows. Only the final sample reads a whole row: ``p`` at
        the path's end without the tokens rejected there.
        """
        batch = p.shape[0]
        width = tables.children.shape[1]  # K
        node = torch.full((batch,), -1, dtype=torch.long, device=p.device)  # (B,) current node
        p_row = p[:, 0]  # (B, V) the current node's target
        rejected = tree.tokens.new_full((batch, width), -1)  # (B, K) tokens rejected at the current node, -1 = none
        earlier = torch.ones(width, width, dtype=torch.bool, device=p.device).tril(-1)  # (K, K) [k, j]: j < k
        walking = torch.full((batch,), width > 0, device=p.device)  # (B,) rows still descending (none: no nodes)
        for _level in range(tree.depth + 1):
            if not bool(walking.any()):
                break
            kids = tables.children[node + 1]  # (B, K) -1 padded
            uniforms = _uniforms(p, width, generator)  # (B, K)
            tried = walking.unsqueeze(1) & (kids >= 0)  # (B, K)
            token = tree.tokens.gather(1, kids.clamp_min(0))  # (B, K)
            same = token.unsqueeze(2) == token.unsqueeze(1)  # (B, K, K) [k, j]: x_k == x_j
            distinct = tried & ~(same & earlier & tried.unsqueeze(1)).any(dim=2)  # (B, K) first of its token
            p_x = p_row.gather(1, token) * distinct  # (B, K) 0 for repeats
            removed = p_x.cumsum(dim=1) - p_x  # (B, K) mass of the distinct earlier siblings
            r_x = p_x / (1.0 - removed).clamp_min(torch.finfo(p.dtype).tiny)
            hits = distinct & (uniforms < r_x.clamp(max=1.0))  # (B, K)
            moved = hits.any(dim=1)  # (B,)
            child = kids.gather(1, hits.to(torch.uint8).argmax(dim=1, keepdim=True)).squeeze(1)  # (B,) first hit
            rejected = torch.where(walking.unsqueeze(1), torch.where(distinct, token, -1), rejected)
            rejected = torch.where(moved.unsqueeze(1), -1, rejected)
            p_row = torch.where(moved.unsqueeze(1), rows_at(p, torch.where(moved, child, -1)), p_row)
            node = torch.where(moved, child, node)
            walking = moved
        next_token = sample(self.without_rejected(p_row, rejected), generator)  # (B,)
        return verdict_at(node, next_token, tables)

    def _sampled_walk(
        self, p: torch.Tensor, tree: DraftTree, tables: TreeTables, generator: torch.Generator | None
    ) -> Verdict:
        """:meth:`_walk` for sampled drafts (``"iid"``, ``"without_replacement"``) in fewer (B, V) passes; the same
        uniforms, so the same verdicts up to float rounding.

        The target is kept unnormalised, ``r = u / z``. Sibling ``x_k`` was drawn from ``q_k = q_left / m``:
        ``q_left`` is the node's ``q`` row (for ``"without_replacement"`` with the earlier siblings' tokens zeroed)
        and ``m`` its mass. Rejecting it sets ``r = residual(r, q_k)``, i.e. ``u = max(u - (z / m) q_left, 0)`` and
        ``z = sum(u)``: one fused multiply-add, a clamp and a sum, and only when some row rejects. On the CPU the
        rest of a level is skipped once no row is still trying a sibling, and a sibling's acceptance updates nothing
        when no row accepted it (host checks, free there).
        """
        batch = p.shape[0]
        q = tree.q.to(p.dtype)
        without_replacement = tree.sampling == "without_replacement"
        node = torch.full((batch,), -1, dtype=torch.long, device=p.device)  # (B,) current node
        u = p[:, 0]  # (B, V) unnormalised target
        z = torch.ones(batch, dtype=p.dtype, device=p.device)  # (B,) its mass
        walking = torch.ones(batch, dtype=torch.bool, device=p.device)  # (B,) rows still descending
        for _level in range(tree.depth + 1):
            if not bool(walking.any()):
                break
            q_left = rows_at(q, node)  # (B, V) a fresh tensor (advanced indexing)
            kids, moved, uniforms = _level_start(tables, node, walking, p, generator)
            for rank in range(kids.shape[1]):
                child = kids[:, rank]  # (B,) -1 where the node has fewer children
                trying = walking & ~moved & (child >= 0)
                if not _maybe_any(trying):
                    break
                token = tree.tokens.gather(1, child.clamp_min(0).unsqueeze(1))  # (B, 1)
                q_token = q_left.gather(1, token).squeeze(1)  # (B,)
                mass = q_left.sum(dim=1) if without_replacement else torch.ones_like(z)  # (B,) m
                safe_mass = torch.where(mass > 0, mass, torch.ones_like(mass))
                q_x = q_token / safe_mass  # (B,)
                r_x = u.gather(1, token).squeeze(1) / z  # (B,)
                accept = trying & (uniforms[:, rank] < acceptance_probability(r_x, q_x))
                reject = trying & ~accept & (q_x > 0)  # zero-q siblings are skipped, r unchanged
                if _maybe_any(reject):
                    diff = torch.addcmul(u, q_left, (-z / safe_mass).unsqueeze(1)).clamp_min_(0.0)  # (B, V)
                    left = diff.sum(dim=1)  # (B,) residual mass; 0 means r == q_k: keep r (as `residual`)
                    update = reject & (left > 0)
                    u = torch.where(update.unsqueeze(1), diff, u)
                    z = torch.where(update, left, z)
                if _maybe_any(accept):
                    u = torch.where(accept.unsqueeze(1), rows_at(p, child), u)
                    z = torch.where(accept, torch.ones_like(z), z)
                    node = torch.where(accept, child, node)
                    moved = moved | accept
                if without_replacement:  # later siblings were drawn without this token (q_left is this walk's own)
                    q_left.scatter_(1, token, torch.where(trying, 0.0, q_token).unsqueeze(1))
            walking = moved
        next_token = sample(u, generator)  # (B,)
        return verdict_at(node, next_token, tables)


def _maybe_any(mask: torch.Tensor) -> bool:
    """``mask.any()`` on the CPU, where reading it is free; ``True`` elsewhere (no host sync on accelerators)."""
    return mask.device.type != "cpu" or bool(mask.any())


def _uniforms(p: torch.Tensor, width: int, generator: torch.Generator | None) -> torch.Tensor:
    """The (B, K) uniforms every walk draws at each level it visits, one per sibling rank, from ``generator``:
    the same draws in every walk, hence the same verdicts."""
    return torch.rand(p.shape[0], width, generator=generator, device=p.device, dtype=p.dtype)


def _level_start(
    tables: TreeTables, node: torch.Tensor, walking: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """At the current nodes (B,): their children (B, K) (-1 padded), the (B,) "accepted a child at this level"
    flags (all False) and the level's (B, K) uniforms."""
    kids = tables.children[node + 1]  # (B, K)
    return kids, torch.zeros_like(walking), _uniforms(p, kids.shape[1], generator)
