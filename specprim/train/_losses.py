"""Distillation losses against the target's cached top-K next-token distribution."""

from __future__ import annotations

import torch

from specprim.train._chunks import row_chunks

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
    ids, probs = _target_probs(topk_ids, topk_logprobs, t2d, greedy)  # (..., K), (..., K)
    weight = mask.to(torch.float32)  # (...)
    weights = probs.float() * (weight / weight.sum().clamp(min=1.0))[..., None]  # (..., K) what each pick counts
    vocab, k = logits.shape[-1], ids.shape[-1]
    return _WeightedCrossEntropy.apply(logits.reshape(-1, vocab), ids.clamp(min=0).reshape(-1, k),
                                       weights.reshape(-1, k))


class _WeightedCrossEntropy(torch.autograd.Function):
    """``-sum(weights * log_softmax(logits).gather(-1, ids))`` for (N, V) ``logits``, (N, K) ``ids`` and (N, K)
    float32 ``weights`` (no gradient), without a (N, V) float32 tensor: the forward pass keeps each row's log-sum-exp,
    the backward pass writes the gradient ``(softmax(logits) * sum(weights) - scatter(weights)) * grad`` in the dtype
    of ``logits``, both a few rows at a time in float32 (:func:`~specprim.train._chunks.row_chunks`). On a CPU the
    log-softmax, its backward and the gather's backward over a whole EAGLE-3 batch (3,616 x 8,192 logits) took 185 ms
    a step; this takes ~65 ms."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)  # (N,)
        for rows in row_chunks(logits):
            lse[rows] = torch.logsumexp(logits[rows].float(), dim=-1)
        picked = logits.gather(-1, ids).float()  # (N, K)
        ctx.save_for_backward(logits, ids, weights, lse)
        return (weights.sum(-1) * lse - (weights * picked).sum(-1)).sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        logits, ids, weights, lse = ctx.saved_tensors
        out = torch.empty_like(logits)  # (N, V)
        for rows in row_chunks(logits):
            part = torch.exp(logits[rows].float() - lse[rows, None])  # (n, V) softmax
            part.mul_(weights[rows].sum(-1, keepdim=True)).scatter_add_(-1, ids[rows], -weights[rows])
            out[rows] = part.mul_(grad)
        return out, None, None


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
