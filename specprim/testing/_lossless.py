"""Monte-Carlo losslessness checks for acceptance rules, and the honest draft-tree samplers they need.

The check simulates speculative decoding against a toy autoregressive target: a `ContextTable` holds one
next-token distribution per context (every token sequence up to some length), so the target probability of
a token sequence is well defined no matter which tree produced it. A draft `ContextTable` proposes trees
that honour the q-contract (`draw_context_tree`), the rule under test verifies them, and the distribution
of the first emitted tokens over many independent trials is compared with the target's exact joint
distribution (total variation and a chi-square test). Everything is vectorised over trials: a check with
``10**5`` trials costs a few rule calls on ``B = 10**5`` rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from specprim._types import SAMPLING_SCHEMES, DraftTree, Sampling, Verdict, depths_of, validate_parents

Rule = Callable[..., Verdict]

# ---------------------------------------------------------------------------------------------------------
# A toy autoregressive distribution


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContextTable:
    """A toy autoregressive model: one next-token distribution per context of up to ``max_context`` tokens.

    ``probs`` (R, V) stores the contexts as a complete ``V``-ary tree in heap order: row 0 is the empty
    context and the context ``c + [x]`` has row ``child_rows(c, x) = c * V + x + 1``, so
    ``R = 1 + V + ... + V**max_context``. Two nodes of a draft tree with the same context therefore always
    see the same target distribution, which makes "the probability of a token sequence" well defined.
    """

    probs: torch.Tensor

    def __post_init__(self) -> None:
        probs = self.probs
        if not isinstance(probs, torch.Tensor) or probs.dim() != 2 or not probs.is_floating_point():
            raise ValueError("probs must be a float tensor (R, V)")
        vocab = probs.shape[1]
        if vocab < 2:
            raise ValueError(f"vocabulary size must be >= 2, got {vocab}")
        rows, level = 1, 1
        while rows < probs.shape[0]:
            level *= vocab
            rows += level
        if rows != probs.shape[0]:
            raise ValueError(f"R = {probs.shape[0]} rows is not 1 + V + ... + V**L for V = {vocab}")
        if bool((probs < 0).any()) or not torch.allclose(
            probs.sum(-1), torch.ones((), dtype=probs.dtype), atol=1e-4
        ):
            raise ValueError("every row of probs must be a probability distribution")

    @property
    def vocab_size(self) -> int:
        return self.probs.shape[1]

    @property
    def max_context(self) -> int:
        """The longest context with a row."""
        return _levels(self.probs.shape[0], self.vocab_size) - 1

    @classmethod
    def random(
        cls,
        *,
        vocab_size: int,
        max_context: int,
        generator: torch.Generator,
        logit_scale: float = 1.5,
        zero_fraction: float = 0.0,
        dtype: torch.dtype = torch.float32,
    ) -> ContextTable:
        """Rows ``softmax(logit_scale * N(0, 1))``; with ``zero_fraction > 0`` each entry is also zeroed with
        that probability (like top-k / top-p truncation), the row's argmax always kept."""
        if not 0.0 <= zero_fraction < 1.0:
            raise ValueError(f"zero_fraction must be in [0, 1), got {zero_fraction}")
        num_rows = sum(vocab_size**level for level in range(max_context + 1))
        if num_rows * vocab_size > 50_000_000:
            raise ValueError(f"table too large ({num_rows} x {vocab_size}); use a smaller V or depth")
        logits = torch.randn(num_rows, vocab_size, generator=generator, dtype=torch.float64) * logit_scale
        drop = torch.rand(num_rows, vocab_size, generator=generator, dtype=torch.float64) < zero_fraction
        drop &= logits < logits.max(dim=-1, keepdim=True).values
        probs = logits.masked_fill(drop, -math.inf).softmax(-1)
        return cls(probs=probs.to(dtype))

    def mix(self, other: ContextTable, weight: float) -> ContextTable:
        """``(1 - weight) * self + weight * other`` row by row (e.g. a draft close to the target)."""
        if other.probs.shape != self.probs.shape:
            raise ValueError(f"shape mismatch: {tuple(self.probs.shape)} vs {tuple(other.probs.shape)}")
        return ContextTable(probs=(1 - weight) * self.probs + weight * other.probs.to(self.probs.dtype))

    def greedy(self) -> ContextTable:
        """The one-hot argmax of every row (the target of greedy decoding)."""
        one_hot = torch.nn.functional.one_hot(self.probs.argmax(-1), self.vocab_size)
        return ContextTable(probs=one_hot.to(self.probs.dtype))

    def child_rows(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(B,) context rows, (B,) tokens -> (B,) rows of the contexts extended by those tokens."""
        return rows * self.vocab_size + tokens + 1

    def joint(self, num_tokens: int) -> torch.Tensor:
        """Exact probability (float64, shape (V,) * num_tokens) of the first ``num_tokens`` sampled tokens
        from the empty context."""
        if not 1 <= num_tokens <= self.max_context + 1:
            raise ValueError(f"num_tokens must be in [1, {self.max_context + 1}], got {num_tokens}")
        vocab = self.vocab_size
        probs = self.probs.to(torch.float64)
        joint = probs[0]  # (V,)
        rows = torch.arange(vocab) + 1  # (V**k,) rows of the length-k contexts, in joint's flat order
        for _ in range(num_tokens - 1):
            joint = (joint.reshape(-1, 1) * probs[rows]).reshape(-1)  # (V**(k+1),)
            rows = (rows.reshape(-1, 1) * vocab + torch.arange(vocab) + 1).reshape(-1)
        return joint.reshape((vocab,) * num_tokens)


def _levels(num_rows: int, vocab: int) -> int:
    levels, total, level = 1, 1, 1
    while total < num_rows:
        level *= vocab
        total += level
        levels += 1
    return levels


# ---------------------------------------------------------------------------------------------------------
# Honest draft trees


def draw_siblings(
    q_row: torch.Tensor, num: int, *, sampling: Sampling, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw ``num`` sibling tokens from ``q_row`` (B, V) exactly as ``sampling`` declares -> (B, num) long.

    - ``"iid"``: independently, with replacement.
    - ``"without_replacement"``: one after another, each from ``q`` with the earlier ones removed and
      renormalised (an exponential race, i.e. Gumbel-top-k). Needs ``num`` tokens of positive mass per row.
    - ``"deterministic"``: the ``num`` most likely tokens of ``q_row``, most likely first (ties: lowest id).
    """
    batch, vocab = q_row.shape
    if num == 0:
        return torch.zeros(batch, 0, dtype=torch.long, device=q_row.device)
    if sampling == "iid":
        return torch.multinomial(q_row, num, replacement=True, generator=generator)
    if sampling == "without_replacement":
        if bool(((q_row > 0).sum(-1) < num).any()):
            raise ValueError(f"cannot draw {num} distinct siblings from a row with fewer positive tokens")
        uniform = torch.rand(batch, vocab, generator=generator, device=q_row.device, dtype=torch.float64)
        arrival = -torch.log1p(-uniform) / q_row.to(torch.float64)  # (B, V) Exp(q) times; inf where q == 0
        return arrival.topk(num, dim=-1, largest=False).indices
    if sampling == "deterministic":
        if num > vocab:
            raise ValueError(f"cannot choose {num} distinct deterministic siblings from V = {vocab}")
        return torch.argsort(q_row, dim=-1, descending=True, stable=True)[:, :num]
    raise ValueError(f"sampling must be one of {SAMPLING_SCHEMES}, got {sampling!r}")


def draw_tree(
    q: torch.Tensor,
    parents: Sequence[int] | torch.Tensor,
    *,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    keep_q: bool = True,
) -> DraftTree:
    """Draw a batch of draft trees from fixed per-row draft distributions.

    Args:
        q: (B, N + 1, V); the children of node ``c`` are drawn from row ``c + 1`` with `draw_siblings`.
            The rows do not depend on the drawn tokens (use `draw_context_tree` for that).
        parents: (N,) topological parents list.
        keep_q: store ``q`` in the tree (set ``False`` to hand a deterministic tree over with ``q = None``).
    """
    parent_list = validate_parents(parents)
    if q.dim() != 3 or q.shape[1] != len(parent_list) + 1:
        raise ValueError(f"q must be (B, N + 1, V) with N = {len(parent_list)}, got {tuple(q.shape)}")
    tokens = torch.zeros(q.shape[0], len(parent_list), dtype=torch.long, device=q.device)
    for node, kids in enumerate(_children(parent_list), start=-1):
        if kids:
            tokens[:, kids] = draw_siblings(q[:, node + 1], len(kids), sampling=sampling, generator=generator)
    parents_t = torch.tensor(parent_list, dtype=torch.long, device=q.device)
    return DraftTree(tokens=tokens, parents=parents_t, q=q if keep_q else None, sampling=sampling)


def draw_context_tree(
    draft: ContextTable,
    rows: torch.Tensor,
    parents: Sequence[int] | torch.Tensor,
    *,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    keep_q: bool = True,
) -> tuple[DraftTree, torch.Tensor]:
    """Draw a batch of draft trees from a draft `ContextTable`, rooted at the contexts ``rows`` (B,).

    The children of every node are drawn (with `draw_siblings`) from the draft's row of that node's full
    context, so the tree honours the q-contract for ``sampling``.

    Returns:
        tree: `DraftTree` with tokens (B, N) and q (B, N + 1, V) (``None`` if ``keep_q`` is false).
        context_rows: (B, N + 1) long, the table row of the root (column 0) and of every node's context
            (column ``i + 1``); index a target table with it to get ``p = target.probs[context_rows]``.
    """
    parent_list = validate_parents(parents)
    num_nodes, batch = len(parent_list), rows.shape[0]
    if rows.numel() and max(depths_of(parent_list), default=0) > 0:
        deepest_row = int(rows.max())
        for _ in range(max(depths_of(parent_list))):
            deepest_row = deepest_row * draft.vocab_size + draft.vocab_size
        if deepest_row >= draft.probs.shape[0]:
            raise ValueError("the draft table is too shallow for these contexts and this tree depth")
    tokens = torch.zeros(batch, num_nodes, dtype=torch.long, device=rows.device)
    context_rows = torch.zeros(batch, num_nodes + 1, dtype=torch.long, device=rows.device)
    context_rows[:, 0] = rows
    for node, kids in enumerate(_children(parent_list), start=-1):
        if node >= 0:  # the node's own token was drawn together with its siblings
            parent_rows = context_rows[:, parent_list[node] + 1]
            context_rows[:, node + 1] = draft.child_rows(parent_rows, tokens[:, node])
        if kids:
            q_row = draft.probs[context_rows[:, node + 1]]  # (B, V)
            tokens[:, kids] = draw_siblings(q_row, len(kids), sampling=sampling, generator=generator)
    parents_t = torch.tensor(parent_list, dtype=torch.long, device=rows.device)
    q = draft.probs[context_rows] if keep_q else None  # (B, N + 1, V)
    return DraftTree(tokens=tokens, parents=parents_t, q=q, sampling=sampling), context_rows


def _children(parent_list: list[int]) -> list[list[int]]:
    table: list[list[int]] = [[] for _ in range(len(parent_list) + 1)]
    for node, parent in enumerate(parent_list):
        table[parent + 1].append(node)
    return table


# ---------------------------------------------------------------------------------------------------------
# Verdict sanity and emitted tokens


def check_verdict(verdict: Verdict, tree: DraftTree, vocab_size: int) -> None:
    """Assert the structural contract of a `Verdict` for ``tree``; raises ``AssertionError`` naming the issue.

    Checks: shapes and dtypes, ``0 <= num_accepted <= D``, ``-1`` padding exactly after ``num_accepted``,
    ``path[:, 0]`` a child of the root and ``path[:, d]`` a child of ``path[:, d - 1]``, ``next_token`` in
    ``[0, V)``.
    """
    batch, depth = tree.batch_size, tree.depth
    path, count, nxt = verdict.path, verdict.num_accepted, verdict.next_token
    assert tuple(path.shape) == (batch, depth), f"path shape {tuple(path.shape)} != (B, D) = {(batch, depth)}"
    assert tuple(count.shape) == (batch,) and tuple(nxt.shape) == (batch,), "num_accepted/next_token not (B,)"
    for name, value in (("path", path), ("num_accepted", count), ("next_token", nxt)):
        assert value.dtype == torch.long, f"{name} must be torch.long, got {value.dtype}"
    assert bool(((count >= 0) & (count <= depth)).all()), "num_accepted outside [0, D]"
    assert bool(((nxt >= 0) & (nxt < vocab_size)).all()), f"next_token outside [0, {vocab_size})"
    levels = torch.arange(depth, device=path.device)
    filled = levels.unsqueeze(0) < count.unsqueeze(1)  # (B, D)
    assert bool(((path >= 0) == filled).all()), "path must hold num_accepted node ids then -1 padding"
    assert bool((path < tree.num_nodes).all()), "path holds node ids >= N"
    parents = torch.cat([tree.parents.to(path.device), torch.tensor([-2], device=path.device)])
    expected_parent = torch.cat([torch.full_like(path[:, :1], -1), path[:, :-1]], dim=1)  # (B, D)
    actual_parent = parents[torch.where(filled, path, -1)]  # (B, D), -2 where padded
    assert bool((~filled | (actual_parent == expected_parent)).all()), "path does not follow parents"


def emitted_sequence(verdict: Verdict, tree: DraftTree) -> torch.Tensor:
    """(B, D + 1) long: the accepted tokens then ``next_token``, ``-1`` padded."""
    batch, depth = verdict.path.shape
    path_tokens = tree.tokens.gather(1, verdict.path.clamp_min(0)) if depth else tree.tokens[:, :0]
    sequence = torch.cat(
        [torch.where(verdict.path >= 0, path_tokens, -1), path_tokens.new_full((batch, 1), -1)], 1
    )
    return sequence.scatter(1, verdict.num_accepted.unsqueeze(1), verdict.next_token.unsqueeze(1))


def sample_emitted_tokens(
    rule: Rule,
    *,
    target: ContextTable,
    draft: ContextTable,
    parents: Sequence[int],
    sampling: Sampling,
    trials: int,
    num_tokens: int = 2,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run speculative decoding from the empty context until every trial has ``num_tokens`` tokens.

    Each step draws honest trees from ``draft`` for the trials that still need tokens (rooted at their
    current context), builds ``p = target.probs[context_rows]``, calls ``rule(p, tree, generator=generator)``
    once on all of them, checks the verdict with `check_verdict` and appends the emitted tokens. Deterministic
    trees are handed over with ``q = None``.

    Returns:
        tokens: (trials, num_tokens) long, the first emitted tokens of every trial.
        first_accepted: (trials,) long, ``num_accepted`` of every trial's first step.
    """
    parent_list = validate_parents(list(parents))
    depth = max(depths_of(parent_list), default=0)
    for name, table in (("target", target), ("draft", draft)):
        if table.max_context < num_tokens - 1 + depth:
            raise ValueError(
                f"{name} table needs max_context >= num_tokens - 1 + depth = {num_tokens - 1 + depth}"
            )
    if target.vocab_size != draft.vocab_size:
        raise ValueError("target and draft tables must share the vocabulary")
    device = target.probs.device
    tokens = torch.full((trials, num_tokens), -1, dtype=torch.long, device=device)
    count = torch.zeros(trials, dtype=torch.long, device=device)
    context = torch.zeros(trials, dtype=torch.long, device=device)  # (trials,) row of the current context
    first_accepted = torch.zeros(trials, dtype=torch.long, device=device)
    for step in range(num_tokens):
        todo = (count < num_tokens).nonzero().squeeze(1)  # (b,)
        if todo.numel() == 0:
            break
        tree, rows = draw_context_tree(
            draft,
            context[todo],
            parent_list,
            sampling=sampling,
            generator=generator,
            keep_q=sampling != "deterministic",
        )
        verdict = rule(target.probs[rows], tree, generator=generator)
        check_verdict(verdict, tree, target.vocab_size)
        if step == 0:
            first_accepted = verdict.num_accepted.clone()
        emitted, length = emitted_sequence(verdict, tree), verdict.num_accepted + 1  # (b, D + 1), (b,)
        for position in range(emitted.shape[1]):
            take = (position < length) & (count[todo] < num_tokens)  # (b,)
            rows_taking, token = todo[take], emitted[take, position]
            tokens[rows_taking, count[rows_taking]] = token
            context[rows_taking] = target.child_rows(context[rows_taking], token)
            count[rows_taking] += 1
    return tokens, first_accepted


def emitted_token_distribution(
    rule: Rule,
    *,
    target: ContextTable,
    draft: ContextTable,
    parents: Sequence[int],
    sampling: Sampling,
    trials: int,
    num_tokens: int = 2,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Empirical joint distribution (float64, shape (V,) * num_tokens) of the first ``num_tokens`` emitted
    tokens, from `sample_emitted_tokens`; compare it with ``target.joint(num_tokens)``."""
    tokens, _ = sample_emitted_tokens(
        rule,
        target=target,
        draft=draft,
        parents=parents,
        sampling=sampling,
        trials=trials,
        num_tokens=num_tokens,
        generator=generator,
    )
    return _frequencies(tokens, target.vocab_size)


def _frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """(T, k) long tokens -> (V,) * k float64 empirical joint distribution."""
    trials, num_tokens = tokens.shape
    flat = (tokens * vocab ** torch.arange(num_tokens - 1, -1, -1, device=tokens.device)).sum(1)  # (T,)
    counts = torch.bincount(flat, minlength=vocab**num_tokens).to(torch.float64)
    return (counts / trials).reshape((vocab,) * num_tokens)


# ---------------------------------------------------------------------------------------------------------
# Statistics and the assertion


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
    """An empirical distribution against the exact one: total variation and a chi-square p-value."""

    tv: float
    p_value: float
    tv_tol: float
    min_p_value: float

    @property
    def passed(self) -> bool:
        return self.tv <= self.tv_tol and self.p_value >= self.min_p_value


def compare(
    observed: torch.Tensor,
    expected: torch.Tensor,
    trials: int,
    *,
    tv_tol: float | None = None,
    min_p_value: float = 1e-4,
) -> Comparison:
    """Compare observed frequencies with exact probabilities (same shape, any) over ``trials`` samples.

    ``tv`` is the total variation distance. ``p_value`` is Pearson's chi-square test with cells of expected
    count below 5 pooled (0 if a probability-zero cell was observed, 1 if fewer than two cells remain). The
    default ``tv_tol`` is ``sqrt(K / trials)`` with ``K`` the number of possible cells: about 2.5 times the
    expected total variation of an exact sampler, whose spread is far smaller.
    """
    from scipy.stats import chi2

    observed = observed.reshape(-1).to(torch.float64).cpu()
    expected = expected.reshape(-1).to(torch.float64).cpu()
    tv = 0.5 * float((observed - expected).abs().sum())
    support = expected > 0
    if tv_tol is None:
        tv_tol = math.sqrt(int(support.sum()) / trials)
    if bool((observed[~support] > 0).any()):
        return Comparison(tv=tv, p_value=0.0, tv_tol=tv_tol, min_p_value=min_p_value)
    seen, want = observed[support] * trials, expected[support] * trials
    small = want < 5
    cells_seen, cells_want = list(seen[~small].tolist()), list(want[~small].tolist())
    if bool(small.any()):
        if float(want[small].sum()) >= 5 or not cells_want:
            cells_seen.append(float(seen[small].sum()))
            cells_want.append(float(want[small].sum()))
        else:
            smallest = min(range(len(cells_want)), key=cells_want.__getitem__)
            cells_seen[smallest] += float(seen[small].sum())
            cells_want[smallest] += float(want[small].sum())
    if len(cells_want) < 2:
        return Comparison(tv=tv, p_value=1.0, tv_tol=tv_tol, min_p_value=min_p_value)
    statistic = sum((o - e) ** 2 / e for o, e in zip(cells_seen, cells_want, strict=True))
    p_value = float(chi2.sf(statistic, df=len(cells_want) - 1))
    return Comparison(tv=tv, p_value=p_value, tv_tol=tv_tol, min_p_value=min_p_value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LosslessReport:
    """Outcome of `assert_lossless`.

    ``tv`` / ``p_value`` are for the joint distribution of the first ``num_tokens`` emitted tokens;
    ``first`` is the same comparison for the first token alone. ``mean_accepted`` is the mean number of
    accepted draft tokens in the first step (tau - 1).
    """

    trials: int
    num_tokens: int
    joint: Comparison
    first: Comparison
    mean_accepted: float

    @property
    def tv(self) -> float:
        return self.joint.tv

    @property
    def p_value(self) -> float:
        return self.joint.p_value

    @property
    def passed(self) -> bool:
        return self.joint.passed and self.first.passed

    def __str__(self) -> str:
        return (
            f"trials={self.trials}: first token TV={self.first.tv:.4f} (tol {self.first.tv_tol:.4f}) "
            f"chi2 p={self.first.p_value:.3g}; first {self.num_tokens} tokens TV={self.joint.tv:.4f} "
            f"(tol {self.joint.tv_tol:.4f}) chi2 p={self.joint.p_value:.3g} "
            f"(min {self.joint.min_p_value:g}); mean accepted={self.mean_accepted:.3f}"
        )


def assert_lossless(
    rule: Rule,
    *,
    parents: Sequence[int] = (-1, 0, 1),
    sampling: Sampling = "iid",
    vocab_size: int = 4,
    trials: int = 100_000,
    num_tokens: int = 2,
    seed: int = 0,
    target: ContextTable | None = None,
    draft: ContextTable | None = None,
    draft_noise: float = 0.7,
    tv_tol: float | None = None,
    min_p_value: float = 1e-4,
) -> LosslessReport:
    """Check by simulation that ``rule`` emits tokens distributed exactly as the target; return the report.

    Draft trees of shape ``parents`` are drawn honestly under ``sampling`` (see `sample_emitted_tokens`) and
    the empirical joint distribution of the first ``num_tokens`` emitted tokens (second and later tokens
    come from the next speculative step when the first step accepted nothing), and of the first token
    alone, are compared with the exact target distribution (`compare`). Without explicit tables, a random
    target (``vocab_size``) and a draft ``(1 - draft_noise) * target + draft_noise * other_random_table``
    are built from ``seed``; everything is deterministic given ``seed``. The default ``draft_noise = 0.7``
    keeps accepted paths long (mean accepted length about 1.5-2 on a depth-3 tree) while leaving ``p`` and
    ``q`` far enough apart for subtle bugs (for example an unnormalised without-replacement proposal) to
    show.

    Raises ``AssertionError`` with the measured numbers when total variation exceeds ``tv_tol`` (default
    ``sqrt(K / trials)``) or a chi-square p-value is below ``min_p_value``.
    """
    parent_list = validate_parents(list(parents))
    generator = torch.Generator().manual_seed(seed)
    needed = num_tokens - 1 + max(depths_of(parent_list), default=0)
    if target is None:
        target = ContextTable.random(vocab_size=vocab_size, max_context=needed, generator=generator)
    if draft is None:
        noise = ContextTable.random(
            vocab_size=target.vocab_size, max_context=target.max_context, generator=generator
        )
        draft = target.mix(noise, draft_noise)
    generator = generator.manual_seed(seed + 1)
    tokens, first_accepted = sample_emitted_tokens(
        rule,
        target=target,
        draft=draft,
        parents=parent_list,
        sampling=sampling,
        trials=trials,
        num_tokens=num_tokens,
        generator=generator,
    )
    joint_seen = _frequencies(tokens, target.vocab_size)  # (V,) * num_tokens
    first_seen = _frequencies(tokens[:, :1], target.vocab_size)  # (V,)
    report = LosslessReport(
        trials=trials,
        num_tokens=num_tokens,
        joint=compare(joint_seen, target.joint(num_tokens), trials, tv_tol=tv_tol, min_p_value=min_p_value),
        first=compare(first_seen, target.joint(1), trials, tv_tol=tv_tol, min_p_value=min_p_value),
        mean_accepted=float(first_accepted.to(torch.float64).mean()),
    )
    if not report.passed:
        raise AssertionError(
            f"{rule!r} is not lossless for sampling={sampling!r}, parents={parent_list}: {report}"
        )
    return report
