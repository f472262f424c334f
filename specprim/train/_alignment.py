"""Training-inference alignment terms of the unrolled objectives, as plain tensor functions.

- :func:`draft_topk_hits`: token-alignable training (after GRIFFIN). A chain's later depths count in the loss only
  while the target's token stayed among the draft's ``k`` most likely tokens at every earlier depth: with ``k = 1``
  exactly the chains a greedy chain's verification reaches, with ``k > 1`` the chains a tree with ``k`` children per
  node can still reach (GRIFFIN's softened mask).
- :func:`topk_distillation_loss`: harmonized objective distillation (after HASS). Cross-entropy restricted to the
  target's ``k`` most likely tokens with their raw (not renormalised) probabilities, added to the plain loss: it
  weighs the tokens that verification accepts above the tail of the distribution.
"""

from __future__ import annotations

import torch

__all__ = ["draft_topk_hits", "topk_distillation_loss"]


def draft_topk_hits(logits: torch.Tensor, tokens: torch.Tensor, k: int, d2t: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """(...) bool: where ``tokens`` is among the draft's ``k`` most likely tokens.

    Args:
        logits: (..., V_d) draft logits.
        tokens: (...) long target ids (e.g. the target's greedy tokens ``topk_ids[..., 0]``).
        k: how many of the draft's best tokens count (1: its argmax).
        d2t: (V_d,) long draft id -> target id, for a reduced draft vocabulary; ``None`` when draft ids are target ids.
    """
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k must be in [1, {logits.shape[-1]}] (the draft vocabulary), got {k}")
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens {tuple(tokens.shape)} must have the shape of logits {tuple(logits.shape)} "
                         "without its last dimension")
    best = logits.topk(k, dim=-1).indices  # (..., k) draft ids
    if d2t is not None:
        best = d2t[best]  # (..., k) target ids
    return (best == tokens.unsqueeze(-1)).any(-1)  # (...)


def topk_distillation_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor,
                           mask: torch.Tensor, k: int, *, t2d: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over ``mask`` positions of ``-sum_{x in target top-k} p(x) log q(x)``.

    Args:
        logits: (..., V_d) draft logits (computed in float32).
        topk_ids: (..., K) long target ids of the target's ``K >= k`` most likely tokens, most likely first.
        topk_logprobs: (..., K) their target log-probabilities (``-inf`` = padding, weight 0).
        mask: (...) bool, the positions that count.
        k: the target's tokens that count, ``1 <= k <= K``.
        t2d: (V,) long target id -> draft id (-1 where none); tokens outside the draft vocabulary weigh 0.

    ``p`` are the target's own probabilities, not renormalised over the ``k`` tokens (a confident target weighs
    its position more). Returns a scalar (0 when ``mask`` is empty).
    """
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= topk_ids.shape[-1]:
        raise ValueError(f"k must be in [1, {topk_ids.shape[-1]}] (the target probabilities kept per position), "
                         f"got {k}")
    ids = topk_ids[..., :k]  # (..., k) target ids
    probs = topk_logprobs[..., :k].float().exp()  # (..., k); padding -inf -> 0
    if t2d is not None:
        ids = t2d[ids]  # (..., k) draft ids, -1 outside the draft vocabulary
        probs = probs.masked_fill(ids < 0, 0.0)
    logq = torch.log_softmax(logits.float(), dim=-1)  # (..., V_d)
    picked = logq.gather(-1, ids.clamp(min=0))  # (..., k)
    loss = -(probs * picked).sum(-1)  # (...)
    weight = mask.to(loss.dtype)
    return (loss * weight).sum() / weight.sum().clamp(min=1.0)
