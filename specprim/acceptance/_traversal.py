"""Traversal verification of a draft tree (Weng et al., "Traversal Verification for Speculative Tree Decoding", 2025):
leaf-to-root, judging whole paths."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import torch

from specprim._types import DraftTree, Sampling, Verdict, children_of, depths_of
from specprim.acceptance._base import TreeTables, validate_inputs, verdict_at
from specprim.sampling import sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class TraversalVerification:
    """Lossless verification of a tree that visits the nodes leaf to root (post-order) and accepts whole paths.

    Every node ``c`` on the current branch holds an unnormalised target ``m_c`` (V,) whose mass ``w_c`` is the
    probability still left for "the emitted continuation passes through ``c``". The root starts with
    ``m = p[:, 0]`` (``w = 1``). Depth first, children in node order:

    - entering node ``c`` (token ``x``, parent ``a``): ``w_c = min(1, m_a(x) / q_c(x))`` and ``m_c = w_c p[:, c + 1]``,
      where ``q_c`` is the distribution ``x`` was really drawn from given its earlier siblings (``tree.sampling``:
      ``"iid"``: ``a``'s ``q`` row; ``"without_replacement"``: that row without the earlier siblings' tokens,
      renormalised; ``"deterministic"`` or ``q is None``: ``one_hot(x)``);
    - leaving ``c`` (all its children judged and rejected): accept the path root .. ``c`` with probability ``w_c``
      (one uniform per node) and draw ``next_token`` from ``m_c``; on rejection delete ``c`` and update its parent
      to ``m_a <- max(0, m_a - q_c) / (1 - w_a + s)`` with ``s = sum(max(0, m_a - q_c))``, i.e. ``w_a <- s / (1 -
      w_a + s)``, then enter ``c``'s next sibling (whose weight now reads the updated ``m_a``);
    - when every child of the root is rejected, ``next_token ~ m_root`` (the root's ``w`` stays 1).

    Why it is lossless (the paper's argument for iid trees, which needs only that each sibling's token was drawn
    from ``q_c`` given the earlier siblings, and that the subtree below it was drafted from its path alone): by
    induction on the subtree, a node entered with ``(w_c, m_c)`` ends accepted with an emitted continuation ``y``
    with probability exactly ``m_c(y_1) p(y_2.. | c, y_1)`` and is rejected with probability ``1 - w_c``. Given that,
    the first child ``x ~ q_c`` is accepted-through with ``min(q_c(x), m_a(x))``, leaving ``max(0, m_a - q_c)`` of
    the parent's target to the later siblings and the parent itself, and it is rejected with probability
    ``1 - w_a + s``: dividing the leftover by that is the update above, the same problem with one sibling fewer. The
    same induction holds for any sibling proposal, so drafts without replacement and deterministic drafts are
    lossless too when each rejection uses the proposal the sibling was drawn from (checked by Monte Carlo in
    ``tests/test_traversal_verification.py``). On a chain the rule is block verification (Sun et al.): the weights
    are ``w_j = min(1, w_{j-1} p / q)`` and leaving node ``j`` accepts with block verification's ``h_j``; with the
    same generator the two give the same verdicts. On a tree of depth 1 it is recursive rejection sampling
    (`SpeculativeSampling`). A sibling with ``q_c(x) == 0`` could not have been drawn: it and its subtree are
    skipped (no update), as `SpeculativeSampling` does.

    Supported: every sampling scheme in ``supports`` (any other raises ``ValueError``), on every tree whose shape
    does not depend on the tokens drafted outside a node's subtree (``Chain``, ``StaticTree`` and ``sampled:`` trees;
    deterministic trees of any shape). On one-hot targets (greedy decoding) the verdict is `Greedy`'s for trees with
    distinct siblings. Deterministic drafts gain nothing over `SpeculativeSampling` (``w_c = m_a(x)`` never
    saturates); sampled trees gain (``docs/acceptance.md``).

    Cost: ``2 N`` sequential steps (enter and leave every node; the walk stops once every row has accepted),
    vectorised over the batch. Entering costs a few (B,) operations (a node's ``m`` stays ``scale * p[:, c + 1]``, a
    view, until a child of it is rejected); a rejection costs about five (B, V) passes (multiply-add, clamp, sum, and
    for drafts without replacement a copy of the parent's remaining ``q`` row). Leaves are judged first, so most of
    the tree is visited on most steps, where top-down verification stops early: at V = 49,152, B = 1, 3.2 ms for a
    15-node tree and 13 ms for 64 nodes, against 1.0 and 1.4 ms for `SpeculativeSampling`. Randomness: ``N``
    uniforms and the final sample come from ``generator`` only.

    Guarantee (``lossless = True``): when the drafter honours the q-contract, the emitted tokens (accepted path then
    ``next_token``) are distributed exactly as autoregressive sampling from ``p``. ``_proposal``, ``_child_weight``
    and ``_after_rejection`` are the steps an ablation may override (the tests break two of them on purpose).
    """

    supports: ClassVar[tuple[Sampling, ...]] = ("iid", "without_replacement", "deterministic")
    lossless: ClassVar[bool] = True

    def __call__(self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Verdict:
        validate_inputs(p, tree)
        if tree.sampling not in self.supports:
            raise ValueError(f"TraversalVerification supports sampling in {self.supports}, got {tree.sampling!r}")
        tables = TreeTables.of(tree, p.device)
        batch, num_nodes = tree.tokens.shape  # B, N
        sampling = "deterministic" if tree.q is None else tree.sampling
        q = p if tree.q is None else tree.q.to(p.dtype)  # (B, N + 1, V); unread for deterministic drafts
        totals = q.sum(dim=2) if sampling == "without_replacement" else torch.ones_like(q[:, :, 0])  # (B, N + 1)
        uniforms = torch.rand(batch, num_nodes, generator=generator, device=p.device, dtype=p.dtype)  # (B, N)
        # Per depth on the current branch (0: the root): m = scale * base, (B,) scale, (B, V) base; its mass w (B,);
        # the q row its children were drawn from (B, V), without the drawn ones for drafts without replacement, and
        # that row's mass (B,). A node's base is a view of its p row until a child of it is rejected.
        base, scale, weight = [p[:, 0]], [torch.ones_like(p[:, 0, 0])], [torch.ones_like(p[:, 0, 0])]
        left, total = [q[:, 0]], [totals[:, 0]]
        end = torch.full((batch,), -1, dtype=torch.long, device=p.device)  # (B,) accepted node, -1: the root
        final = p[:, 0]  # (B, V) what next_token is drawn from (unnormalised)
        done = torch.zeros(batch, dtype=torch.bool, device=p.device)  # (B,) rows that accepted a node
        for node, depth, entering in _post_order(tuple(tree.parent_list)):
            token = tree.tokens[:, node : node + 1]  # (B, 1)
            up = depth - 1  # the parent's slot
            if entering:
                rows, inverse = self._proposal(sampling, left[up], total[up], token)  # q_c = rows * inverse
                q_x = rows.gather(1, token).squeeze(1) * inverse  # (B,)
                w = self._child_weight(scale[up] * base[up].gather(1, token).squeeze(1), q_x)  # (B,)
                for state in (base, scale, weight, left, total):
                    del state[depth:]
                base.append(p[:, node + 1])
                scale.append(w)
                weight.append(w)
                left.append(q[:, node + 1])
                total.append(totals[:, node + 1])
                continue
            accept = ~done & (uniforms[:, node] < weight[depth])  # (B,)
            if _maybe_any(accept):
                end = torch.where(accept, node, end)
                final = torch.where(accept.unsqueeze(1), base[depth], final)  # scale > 0 where accepted
                done = done | accept
                if _all(done):
                    break
            rows, inverse = self._proposal(sampling, left[up], total[up], token)
            reject = ~done & (rows.gather(1, token).squeeze(1) > 0)  # zero-q siblings are skipped
            if _maybe_any(reject):
                after = self._after_rejection(base[up], scale[up], weight[up], rows, inverse)
                before = (base[up], scale[up], weight[up])
                if not _all(reject):
                    after = tuple(_where(reject, new, old) for new, old in zip(after, before, strict=True))
                base[up], scale[up], weight[up] = after
            if sampling == "without_replacement":  # later siblings were drawn without this token
                total[up] = total[up] - left[up].gather(1, token).squeeze(1)
                left[up] = left[up].scatter(1, token, 0.0)
        final = torch.where(done.unsqueeze(1), final, base[0])  # (B, V) rows that accepted nothing: the root's m
        final = torch.where(final.sum(dim=1, keepdim=True) > 0, final, p[torch.arange(batch, device=p.device), end + 1])
        return verdict_at(end, sample(final, generator), tables)

    def _proposal(
        self, sampling: Sampling, left: torch.Tensor, total: torch.Tensor, token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The distribution ``q_c`` a sibling's token (B, 1) was drawn from given the earlier siblings, as (B, V)
        rows and (B,) factors (``q_c = rows * factor``, so the (B, V) division is never done).

        ``left`` (B, V) is the parent's ``q`` row (for ``"without_replacement"`` without the earlier siblings' tokens)
        and ``total`` (B,) its mass: ``"iid"``: ``(left, 1)``; ``"without_replacement"``: ``(left, 1 / total)``;
        ``"deterministic"``: ``(one_hot(token), 1)``."""
        ones = torch.ones_like(total)
        if sampling == "deterministic":
            return torch.zeros_like(left).scatter_(1, token, 1.0), ones
        if sampling == "iid":
            return left, ones
        return left, 1.0 / torch.where(total > 0, total, ones)

    def _child_weight(self, m_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
        """(B,) ``m_a(x)``, (B,) ``q_c(x)`` -> (B,) ``w_c = min(1, m_a(x) / q_c(x))``, 0 where ``q_c(x) == 0``."""
        safe = torch.where(q_x > 0, q_x, torch.ones_like(q_x))
        return torch.where(q_x > 0, (m_x / safe).clamp(max=1.0), torch.zeros_like(m_x))

    def _after_rejection(
        self, base: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, factor: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The parent's ``m_a = scale * base`` (B,) (B, V) of mass ``w_a`` (B,) after rejecting a child drawn from
        ``q_c = rows * factor`` (B, V) (B,) -> its new ``(base, scale, w_a)``: ``m_a <- max(0, m_a - q_c) / (s + 1 -
        w_a)`` and ``w_a <- s / (s + 1 - w_a)``, with ``s = sum(max(0, m_a - q_c))``. A zero denominator (``w_a = 1``
        and ``m_a == q_c``: the rejection had probability 0) leaves the parent as it was."""
        diff = torch.addcmul(base * scale.unsqueeze(1), rows, -factor.unsqueeze(1)).clamp_min_(0.0)  # (B, V)
        excess = diff.sum(dim=1)  # (B,) s
        denominator = excess + (1.0 - weight)
        positive = denominator > 0
        safe = torch.where(positive, denominator, torch.ones_like(denominator))
        new_base = diff if _all(positive) else torch.where(positive.unsqueeze(1), diff, base)
        new_scale = torch.where(positive, 1.0 / safe, scale)
        new_weight = torch.where(positive, (excess / safe).clamp(0.0, 1.0), weight)
        return new_base, new_scale, new_weight


def _where(condition: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Per row (B,): ``new`` where ``condition``, else ``old`` (both (B,) or (B, V))."""
    return torch.where(condition.view(-1, *([1] * (new.dim() - 1))), new, old)


def _maybe_any(mask: torch.Tensor) -> bool:
    """``mask.any()`` on the CPU, where reading it is free; ``True`` elsewhere (no host sync on accelerators)."""
    return mask.device.type != "cpu" or bool(mask.any())


def _all(mask: torch.Tensor) -> bool:
    """``mask.all()`` on the CPU, where reading it is free; ``False`` elsewhere (no host sync on accelerators)."""
    return mask.device.type == "cpu" and bool(mask.all())


@functools.lru_cache(maxsize=256)
def _post_order(parents: tuple[int, ...]) -> tuple[tuple[int, int, bool], ...]:
    """The depth-first walk of a tree shape: ``(node, depth, entering)`` when it enters and when it leaves each node,
    children in node order, so every node is left after all of its subtree (the root is neither entered nor left)."""
    kids, depths = children_of(parents), depths_of(list(parents))
    events: list[tuple[int, int, bool]] = []
    stack = [(node, False) for node in reversed(kids[0])]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            events.append((node, depths[node], False))
            continue
        events.append((node, depths[node], True))
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(kids[node + 1]))
    return tuple(events)
