"""Reduced draft vocabularies: a draft head predicts over ``V_d <= V`` target tokens (EAGLE-3).

A draft vocabulary is described by ``d2t`` (V_d,) long: ``d2t[i]`` is the target id of draft id ``i``, strictly
increasing (so sorted target ids). Its inverse is the mask ``t2d`` (V,) bool, ``True`` where a target id has a
draft id, and the index :func:`target_to_draft` (V,) long (the draft id, ``-1`` where there is none).
Draft logits (..., V_d) become target logits (..., V) with ``-inf`` outside ``d2t`` (:func:`scatter_to_target`),
so a draft distribution over the target vocabulary gives those ids probability zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = [
    "check_d2t",
    "count_tokens",
    "draft_vocab",
    "scatter_to_target",
    "target_mask",
    "target_to_draft",
]


def count_tokens(sequences: Iterable[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """(V,) long occurrence count of every target id over ``sequences`` (tensors of ids, any shape)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids in sequences:
        flat = ids.reshape(-1).long().cpu()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
            raise ValueError(f"token ids must lie in [0, {vocab_size}), got a value outside")
        counts += torch.bincount(flat, minlength=vocab_size)
    return counts


def draft_vocab(
    vocab_size: int,
    draft_vocab_size: int,
    token_counts: torch.Tensor | None = None,
    required_ids: Sequence[int] = (),
) -> torch.Tensor:
    """``d2t`` (V_d,) long, sorted: the ``draft_vocab_size`` target ids a draft head may propose.

    With ``token_counts`` (V,) (non-negative, e.g. from :func:`count_tokens`), the ``required_ids`` (e.g. EOS and
    the chat template's special tokens) plus the most frequent other ids, ties to the smaller id; without it, the
    ``required_ids`` plus the smallest other ids. ``draft_vocab_size == vocab_size`` gives ``arange(V)``.

    Raises ``ValueError`` for sizes outside ``1 <= V_d <= V``, counts of the wrong shape or negative, required ids
    out of range or more numerous than ``V_d``.
    """
    if not 1 <= draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size must be in [1, {vocab_size}], got {draft_vocab_size}")
    required = sorted(set(int(i) for i in required_ids))
    if required and (required[0] < 0 or required[-1] >= vocab_size):
        raise ValueError(f"required_ids must lie in [0, {vocab_size}), got {required}")
    if len(required) > draft_vocab_size:
        raise ValueError(f"{len(required)} required ids do not fit a draft vocabulary of {draft_vocab_size}")
    if token_counts is None:
        score = -torch.arange(vocab_size, dtype=torch.float64)  # smaller id first
    else:
        if token_counts.shape != (vocab_size,):
            raise ValueError(f"token_counts must have shape ({vocab_size},), got {tuple(token_counts.shape)}")
        if bool((token_counts < 0).any()):
            raise ValueError("token_counts must be non-negative")
        score = token_counts.detach().cpu().double()
    score = score.clone()
    score[required] = float("inf")  # always kept
    order = torch.sort(score, descending=True, stable=True).indices  # stable: ties to the smaller id
    return order[:draft_vocab_size].sort().values.long()


def check_d2t(d2t: torch.Tensor, vocab_size: int) -> None:
    """Raise ``ValueError`` unless ``d2t`` is a non-empty strictly increasing (V_d,) long tensor in [0, V)."""
    if not isinstance(d2t, torch.Tensor) or d2t.dim() != 1 or d2t.dtype != torch.long or d2t.numel() == 0:
        raise ValueError("d2t must be a non-empty 1-D long tensor of target ids")
    if int(d2t.min()) < 0 or int(d2t.max()) >= vocab_size:
        raise ValueError(f"d2t holds target ids outside [0, {vocab_size})")
    if d2t.numel() > 1 and not bool((d2t[1:] > d2t[:-1]).all()):
        raise ValueError("d2t must be strictly increasing (sorted target ids, no duplicates)")


def target_mask(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``t2d`` (V,) bool: ``True`` where a target id is in the draft vocabulary."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=d2t.device)
    mask[d2t] = True
    return mask


def target_to_draft(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) long: the draft id of every target id, ``-1`` where it has none (e.g. to map training labels)."""
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=d2t.device)
    index[d2t] = torch.arange(d2t.numel(), device=d2t.device)
    return index


def scatter_to_target(draft_logits: torch.Tensor, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., V_d) draft logits -> (..., V) target logits, ``-inf`` on every id outside ``d2t``.

    Returns ``draft_logits`` itself when the draft vocabulary is the whole target vocabulary.
    """
    if draft_logits.shape[-1] == vocab_size:
        return draft_logits
    out = draft_logits.new_full((*draft_logits.shape[:-1], vocab_size), float("-inf"))
    return out.index_copy(-1, d2t.to(draft_logits.device), draft_logits)
