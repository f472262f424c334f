"""Attention of an unrolled training step without its dense mask: one causal flash pass plus the chains' own keys.

At unrolled step ``s`` (:func:`~specprim.train._unrolled.unrolled_mask`) the query of chain ``i`` sees the real
keys ``0 .. i`` (block 0, causal) and, of each earlier step ``j = 1 .. s``, only its own key ``i`` (a diagonal).
Scaled-dot-product attention with that (n, (s + 1) n) mask scores every query against every key of every block:
on a CPU its backward pass was a fifth of an EAGLE-3 training step. Here block 0 runs as the causal flash kernel,
which also returns each row's log-sum-exp ``lse_0``; the diagonal scores ``d_j = scale * <q_i, k_j,i>`` are
elementwise; the two merge as one softmax::

    L = logsumexp(lse_0, d_1, .., d_s)      out = exp(lse_0 - L) * out_0 + sum_j exp(d_j - L) * v_j,i

The backward pass reuses the flash kernel's: fed ``exp(lse_0 - L) * grad`` and the *merged* output (whose row sums
against the gradient are the softmax's ``D`` term), it returns block 0's exact gradients; the diagonal's follow
from ``dS_j = exp(d_j - L) * (<grad, v_j,i> - D)``. The result equals the masked attention up to rounding.

:func:`unrolled_attention` is a ``transformers`` attention function: it takes this path for an unrolled mask on a
CPU, and otherwise hands the call to the library's SDPA attention unchanged. :func:`unrolled_attention_in` makes a
head's layers use it for the duration of a training step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["UNROLLED_ATTENTION", "is_unrolled_mask", "unrolled_attention", "unrolled_attention_in"]

UNROLLED_ATTENTION = "specprim_unrolled"


def unrolled_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A ``transformers`` attention function: query (B, H, n, D), key / value (B, H_kv, m, D), additive mask
    (B, 1, n, m) -> ((B, n, H, D) output, None). The merged path of this module where ``m = (s + 1) n`` and the mask
    is the unrolled one, on a CPU without dropout; SDPA otherwise."""
    length = query.shape[2]
    if (query.device.type != "cpu" or dropout or attention_mask is None or key.shape[2] % length
            or not is_unrolled_mask(attention_mask, length)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = query.shape[1] // key.shape[1]
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype  # as SDPA's
    query = query.to(dtype)
    key = key.to(dtype).repeat_interleave(groups, dim=1)  # (B, H, m, D)
    value = value.to(dtype).repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = _MergedAttention.apply(query, key, value, scale)  # (B, H, n, D)
    return out.transpose(1, 2).contiguous(), None


def is_unrolled_mask(mask: torch.Tensor, length: int) -> bool:
    """Whether the additive (B, 1, n, (s + 1) n) ``mask`` is :func:`~specprim.train._unrolled.unrolled_mask` for
    ``n = length`` in every batch row (0 where it attends, negative where not)."""
    steps = mask.shape[-1] // length
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != length or mask.shape[-1] != steps * length:
        return False
    rows = torch.arange(length, device=mask.device)
    columns = torch.arange(steps * length, device=mask.device)
    within = columns % length  # (m,) the key's position in its block
    want = (columns[None] < length) & (within[None] <= rows[:, None]) | (within[None] == rows[:, None])  # (n, m)
    first = mask[0, 0] == 0
    if not bool(torch.equal(first, want)):
        return False
    return mask.stride(0) == 0 or bool((mask == mask[:1]).all())


@contextlib.contextmanager
def unrolled_attention_in(config: Any) -> Iterator[None]:
    """Within the block, the layers built from ``config`` (a ``transformers`` config read at every forward) attend
    through :func:`unrolled_attention` where they use SDPA (eager attention stays eager); restored after."""
    before = config._attn_implementation
    if before != "sdpa":
        yield
        return
    config._attn_implementation = UNROLLED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


class _MergedAttention(torch.autograd.Function):
    """The merged attention of the module docstring for query (B, H, n, D) and key / value (B, H, (s + 1) n, D)."""

    @staticmethod
    def forward(ctx, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
        length = query.shape[2]
        steps = key.shape[2] // length
        first, first_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key[:, :, :length], value[:, :, :length], 0.0, True, scale=scale)  # (B,H,n,D), (B,H,n) float32
        diagonal = _diagonal_scores(query, key, steps, scale)  # (s, B, H, n) float32
        total = torch.logsumexp(torch.cat([first_lse[None], diagonal]), dim=0)  # (B, H, n)
        out = torch.exp(first_lse - total)[..., None] * first.float()  # (B, H, n, D)
        for j in range(1, steps):
            out += torch.exp(diagonal[j - 1] - total)[..., None] * value[:, :, j * length:(j + 1) * length].float()
        out = out.to(query.dtype)
        ctx.save_for_backward(query, key, value, out, first_lse, diagonal, total)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        query, key, value, out, first_lse, diagonal, total = ctx.saved_tensors
        scale, length = ctx.scale, query.shape[2]
        steps = key.shape[2] // length
        grad = grad.contiguous()
        grad32 = grad.float()  # (B, H, n, D), converted once for every term below
        first_share = torch.exp(first_lse - total)[..., None]  # (B, H, n, 1)
        grad_query, grad_key0, grad_value0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            (first_share * grad32).to(grad.dtype), query, key[:, :, :length], value[:, :, :length], out,
            first_lse, 0.0, True, scale=scale)
        grad_query = grad_query.float()
        keys, values = [grad_key0], [grad_value0]
        if steps > 1:
            query32 = query.float()
            row_term = (grad32 * out.float()).sum(-1)  # (B, H, n) the softmax's D
            for j in range(1, steps):
                own = slice(j * length, (j + 1) * length)
                share = torch.exp(diagonal[j - 1] - total)  # (B, H, n)
                d_score = share * ((grad32 * value[:, :, own].float()).sum(-1) - row_term)  # (B, H, n)
                grad_query += scale * d_score[..., None] * key[:, :, own].float()
                keys.append((scale * d_score[..., None] * query32).to(key.dtype))
                values.append((share[..., None] * grad32).to(value.dtype))
        return grad_query.to(query.dtype), torch.cat(keys, dim=2), torch.cat(values, dim=2), None


def _diagonal_scores(query: torch.Tensor, key: torch.Tensor, steps: int, scale: float) -> torch.Tensor:
    """(s, B, H, n) float32 ``scale * <q_i, k_j,i>`` of each query with its own key in blocks ``j = 1 .. s``."""
    length = query.shape[2]
    scores = [scale * (query.float() * key[:, :, j * length:(j + 1) * length].float()).sum(-1)
              for j in range(1, steps)]
    return torch.stack(scores) if scores else query.new_zeros(0, *query.shape[:3], dtype=torch.float32)


AttentionInterface.register(UNROLLED_ATTENTION, unrolled_attention)
