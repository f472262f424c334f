"""End-to-end check of a drafter and rule under sampling: the first two tokens `speculative_generate` emits
against the exact distribution of plain sampling from the target (optionally under a constraint)."""

from __future__ import annotations

from typing import Any

import torch

from specprim import speculative_generate
from specprim._types import DraftTree
from specprim.sampling import SamplingConfig


@torch.no_grad()
def exact_two_token_distribution(
    target: torch.nn.Module, prompt: torch.Tensor, sampling: SamplingConfig, constraint: object | None = None
) -> torch.Tensor:
    """(V, V) ``p(x1, x2) = p(x1) p(x2 | x1)`` of plain sampling from ``target`` after ``prompt`` (1, T); with a
    ``constraint`` (:class:`specprim.constraints.Constraint`, none of whose outputs ends after one token), of
    constrained sampling: the logits outside the allowed tokens are ``-inf`` before ``sampling``."""
    logits1 = target(prompt).logits[0, -1]  # (V,)
    vocab = logits1.shape[0]
    contexts = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)  # (V, T + 1)
    logits2 = target(contexts).logits[:, -1]  # (V, V)
    if constraint is not None:
        logits1 = logits1.masked_fill(~_allowed_after(constraint, []), float("-inf"))
        allowed1 = logits1.isfinite().nonzero().flatten().tolist()
        allowed2 = torch.ones(vocab, vocab, dtype=torch.bool)  # rows of forbidden first tokens weigh p = 0
        allowed2[allowed1] = torch.stack([_allowed_after(constraint, [first]) for first in allowed1])
        logits2 = logits2.masked_fill(~allowed2, float("-inf"))
    p1 = sampling.probs(logits1)  # (V,)
    p2 = sampling.probs(logits2)  # (V, V)
    return p1[:, None] * p2


def _allowed_after(constraint: Any, tokens: list[int]) -> torch.Tensor:
    """(V,) bool, the tokens ``constraint`` allows after ``tokens``."""
    state = constraint.begin()
    state.advance(tokens)
    if state.finished:
        raise ValueError("the constraint ends after one token: the two-token check needs longer outputs")
    empty = DraftTree(tokens=torch.zeros(1, 0, dtype=torch.long), parents=torch.zeros(0, dtype=torch.long))
    return state.allowed(empty)[1][0]


def two_token_chi_square(
    target: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    drafter: object,
    acceptance: object,
    sampling: SamplingConfig,
    trials: int,
    seed: int = 1234,
    constraint: object | None = None,
) -> float:
    """Chi-square p-value of the first two tokens of ``trials`` speculative generations against
    :func:`exact_two_token_distribution` (cells of expected count below 5 pooled into one).

    Raises ``AssertionError`` if a pair of probability zero was emitted. Meant for tiny vocabularies: the
    target is run once per vocabulary entry. ``constraint``: generate under it, and compare with constrained
    sampling from the target.
    """
    from scipy import stats

    generator = torch.Generator().manual_seed(seed)
    vocab = target.get_output_embeddings().weight.shape[0]
    counts = torch.zeros(vocab, vocab)
    for _ in range(trials):
        out = speculative_generate(
            target, prompt, drafter=drafter, acceptance=acceptance, max_new_tokens=2,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, generator=generator,
            constraint=constraint,
        )
        first, second = out.sequences[0, -2:].tolist()
        counts[first, second] += 1
    expected = exact_two_token_distribution(target, prompt, sampling, constraint).flatten().double()
    expected = expected / expected.sum() * trials
    observed = counts.flatten().double()
    assert observed[expected == 0].sum() == 0, "emitted a pair the target gives probability zero"
    big = expected >= 5
    observed_cells = torch.cat([observed[big], observed[~big].sum()[None]])
    expected_cells = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected_cells > 0
    return float(stats.chisquare(observed_cells[keep], expected_cells[keep]).pvalue)
