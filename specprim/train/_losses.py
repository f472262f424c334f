"""Distillation losses against the target's cached top-K next-token distribution."""

from __future__ import annotations

import torch

__all__ = ["greedy_accuracy", "greedy_hits", "masked_fraction", "soft_cross_entropy"]


def _target_probs(topk_ids: torch.Tensor, topk_logprobs: torch.Tensor, t2d: torch.Tensor | None,
                  greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft ids (..., K) (-1 where unavailable) and the target's renormalised probabilities over them (..., K)."""
    if greedy:
        topk_ids, topk_logprobs = topk_ids[..., :1], topk_logprobs[..., :1]
    ids = topk_ids if t2d is None else t2d[topk_ids]  # (..., K) draft ids, -1 outside the draft vocabulary
    logprobs = topk_logprobs.masked_fill(ids < 0, float("-inf"))
    probs = torch.softmax(logprobs, dim=-1).nan_to_num(0.0)  # rows with no usable id -> all zeros
    return ids, probs


def soft_cross_entropy(
    logits: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    t2d: torch.Tensor | None = None,
    greedy: bool = False,
) -> torch.Tensor:
    """Mean cross-entropy of draft ``logits`` against the target's top-K distribution, over ``mask`` positions.

    Args:
        logits: (..., V_d) draft logits (any float dtype; computed in float32).
        topk_ids: (..., K) long target ids of the target's K most likely next tokens.
        topk_logprobs: (..., K) their target log-probabilities (``-inf`` = padding).
        mask: (...) bool, the positions that count.
        t2d: (V,) long target id -> draft id (-1 where none), for a reduced draft vocabulary; ``None`` when
            draft ids are target ids.
        greedy: use only the target's top-1 token as a hard label.

    The target distribution is the top-K probabilities renormalised over the ids the draft can express; positions
    where it can express none count as zero loss. Returns a scalar (0 when ``mask`` is empty).
    """
    ids, probs = _target_probs(topk_ids, topk_logprobs, t2d, greedy)
    logq = torch.log_softmax(logits.float(), dim=-1)  # (..., V_d)
    picked = logq.gather(-1, ids.clamp(min=0))  # (..., K)
    loss = -(probs * picked).sum(-1)  # (...)
    weight = mask.to(loss.dtype)
    return (loss * weight).sum() / weight.sum().clamp(min=1.0)


def greedy_hits(logits: torch.Tensor, topk_ids: torch.Tensor, d2t: torch.Tensor | None = None) -> torch.Tensor:
    """(...) bool: where the draft's argmax (``logits`` (..., V_d), mapped through ``d2t`` to target ids) is the
    target's greedy token ``topk_ids[..., 0]``."""
    guess = logits.max(-1).indices  # (...) draft ids, the first of equal maxima (half the time of argmax on CPU)
    if d2t is not None:
        guess = d2t[guess]
    return guess == topk_ids[..., 0]


def greedy_accuracy(logits: torch.Tensor, topk_ids: torch.Tensor, mask: torch.Tensor,
                    d2t: torch.Tensor | None = None) -> tuple[float, int]:
    """(fraction of ``mask`` positions where the draft's argmax is the target's greedy token, positions counted)."""
    return masked_fraction(greedy_hits(logits, topk_ids, d2t), mask), int(mask.sum())


def masked_fraction(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """The fraction of ``mask`` positions where ``flags`` (bool, same shape) holds; 0 when ``mask`` is empty."""
    return float((flags & mask).sum()) / max(int(mask.sum()), 1)
