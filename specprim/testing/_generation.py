"""End-to-end check of a drafter and rule under sampling: the first two tokens `speculative_generate` emits
against the exact distribution of plain sampling from the target."""

from __future__ import annotations

import torch

from specprim import speculative_generate
from specprim.sampling import SamplingConfig


@torch.no_grad()
def exact_two_token_distribution(
    target: torch.nn.Module, prompt: torch.Tensor, sampling: SamplingConfig
) -> torch.Tensor:
    """(V, V) ``p(x1, x2) = p(x1) p(x2 | x1)`` of plain sampling from ``target`` after ``prompt`` (1, T)."""
    p1 = sampling.probs(target(prompt).logits[0, -1])  # (V,)
    vocab = p1.shape[0]
    contexts = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)  # (V, T + 1)
    p2 = sampling.probs(target(contexts).logits[:, -1])  # (V, V)
    return p1[:, None] * p2


def two_token_chi_square(
    target: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    drafter: object,
    acceptance: object,
    sampling: SamplingConfig,
    trials: int,
    seed: int = 1234,
) -> float:
    """Chi-square p-value of the first two tokens of ``trials`` speculative generations against
    :func:`exact_two_token_distribution` (cells of expected count below 5 pooled into one).

    Raises ``AssertionError`` if a pair of probability zero was emitted. Meant for tiny vocabularies: the
    target is run once per vocabulary entry.
    """
    from scipy import stats

    generator = torch.Generator().manual_seed(seed)
    vocab = target.get_output_embeddings().weight.shape[0]
    counts = torch.zeros(vocab, vocab)
    for _ in range(trials):
        out = speculative_generate(
            target, prompt, drafter=drafter, acceptance=acceptance, max_new_tokens=2,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, generator=generator,
        )
        first, second = out.sequences[0, -2:].tolist()
        counts[first, second] += 1
    expected = exact_two_token_distribution(target, prompt, sampling).flatten().double()
    expected = expected / expected.sum() * trials
    observed = counts.flatten().double()
    assert observed[expected == 0].sum() == 0, "emitted a pair the target gives probability zero"
    big = expected >= 5
    observed_cells = torch.cat([observed[big], observed[~big].sum()[None]])
    expected_cells = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected_cells > 0
    return float(stats.chisquare(observed_cells[keep], expected_cells[keep]).pvalue)
