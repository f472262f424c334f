"""Pure-PyTorch tree attention: the dense equivalent of the Triton kernel, used to check it."""

from __future__ import annotations

import torch

from specprim.masks import tree_attention_mask


def tree_block_mask(parents: list[int]) -> torch.Tensor:
    """(1 + N, 1 + N) bool tree mask of ``[root] + tree`` for a parents list: every token sees the root, node ``i``
    its ancestors-or-self, the root only itself (the tree block of :func:`specprim.masks.tree_verification_mask`)."""
    size = len(parents) + 1
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:, 0] = True
    mask[1:, 1:] = tree_attention_mask(parents)
    return mask


def dense_tree_mask(tree_mask: torch.Tensor, prefix_length: int) -> torch.Tensor:
    """(Q, Q) or (B, Q, Q) bool tree mask -> (B', 1, Q, P + Q) bool mask over ``prefix + tree`` keys.

    Every query sees all ``P = prefix_length`` prefix keys; the tree block is ``tree_mask``. ``B'`` is 1 for a
    shared (Q, Q) mask and ``B`` otherwise (it broadcasts over the batch in SDPA).
    """
    if tree_mask.dim() == 2:
        tree_mask = tree_mask[None]  # (1, Q, Q)
    batch, tree_len, _ = tree_mask.shape
    prefix = torch.ones(batch, tree_len, prefix_length, dtype=torch.bool, device=tree_mask.device)  # (B', Q, P)
    return torch.cat([prefix, tree_mask.bool()], dim=2)[:, None]  # (B', 1, Q, P + Q)


def tree_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree_mask: torch.Tensor,
    prefix_length: int,
    scale: float | None = None,
) -> torch.Tensor:
    """What :func:`specprim.kernels.tree_attention` computes, with ``scaled_dot_product_attention``.

    Same arguments and (B, H, Q, D) result; GQA key/value heads are repeated to the query heads. Computes in
    ``q.dtype``; rows whose mask allows no key give NaN here (the kernel gives 0), which tree masks never have
    since every node sees itself.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, H, P + Q, D)
    v = v.repeat_interleave(group, dim=1)  # (B, H, P + Q, D)
    mask = dense_tree_mask(tree_mask.to(q.device), prefix_length)  # (B', 1, Q, P + Q)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
