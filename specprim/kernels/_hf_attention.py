"""A transformers attention function that sends tree-verification calls to the Triton kernel and everything
else to SDPA, and the switch that puts a loaded model on it."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from specprim.kernels._tree_attention import (
    MAX_HEAD_DIM,
    SUPPORTED_DTYPES,
    kernel_supports_device,
    tree_attention,
)

ATTENTION_NAME = "specprim_tree"
"""Name under which :func:`tree_attention_forward` is registered in ``transformers.AttentionInterface``."""

_UNSUPPORTED_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


def register_tree_attention() -> str:
    """Register :func:`tree_attention_forward` (and SDPA's mask builder) under :data:`ATTENTION_NAME`.

    Idempotent. Afterwards ``from_pretrained(..., attn_implementation="specprim_tree")`` works too.
    Returns the name.
    """
    AttentionInterface.register(ATTENTION_NAME, tree_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # 2D masks become the same 4D masks as for SDPA
    return ATTENTION_NAME


def use_tree_kernel(model: PreTrainedModel) -> str:
    """Switch ``model`` (and its sub-models) to :data:`ATTENTION_NAME` attention, in place.

    Tree-verification forwards (see :func:`tree_attention_forward`) then run the Triton kernel; every other
    forward (prefill, one-token decoding, padded batches, ``model.generate``) runs SDPA as before. The kernel
    is used on CUDA, and on other devices only when ``TRITON_INTERPRET=1`` is set (tests); elsewhere the model
    keeps working on SDPA and a warning says so.

    Returns the previous implementation name: ``model.set_attn_implementation(previous)`` switches back.
    Raises ``TypeError`` for a model that is not a transformers ``PreTrainedModel`` and ``ValueError`` when the
    model cannot switch its attention implementation (it does not use ``AttentionInterface``).
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    previous = model.config._attn_implementation
    register_tree_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    if model.config._attn_implementation != ATTENTION_NAME:
        raise ValueError(
            f"{type(model).__name__} cannot switch its attention implementation (it does not dispatch through "
            "transformers.AttentionInterface)"
        )
    device = model.get_input_embeddings().weight.device
    if not kernel_supports_device(device):
        warnings.warn(
            f"the tree kernel needs triton and CUDA (or TRITON_INTERPRET=1); the model is on {device}, so every "
            "forward uses SDPA", stacklevel=2,
        )
    return previous


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: the tree kernel for tree-verification calls, SDPA otherwise.

    Args:
        module: the attention layer (read by the SDPA fallback only).
        query: (B, H, Q, D) queries.
        key: (B, Hkv, K, D) keys, the cache included.
        value: (B, Hkv, K, D) values.
        attention_mask: (B or 1, 1, Q, K) bool (True = visible) or additive float (0 = visible), or None.
        dropout: attention dropout; any non-zero value goes to SDPA.
        scaling: softmax scale (``1 / sqrt(D)`` when None).
        is_causal: passed to SDPA.
        **kwargs: passed to SDPA; ``softcap``, ``position_bias``, ``s_aux`` or ``sinks`` send the call there.

    Returns:
        ((B, Q, H, D) attention output, None), like every transformers attention function.

    A call is a tree verification when ``Q > 1``, the mask is 4D with one head, every query sees every one of the
    first ``P = K - Q`` keys, the last ``Q`` columns hold only visible/blocked entries and every query sees itself
    (true of :func:`specprim.masks.tree_verification_mask`), and the kernel supports the device, dtype and head
    size. The mask analysis runs once per mask tensor (all layers of a forward share it).
    """
    tree = _as_tree_call(query, key, value, attention_mask, dropout, kwargs)
    if tree is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
            **kwargs,
        )
    tree_mask, prefix_length = tree  # (Q, Q) or (B, Q, Q) bool, P
    out = tree_attention(query, key, value, tree_mask, prefix_length, scale=scaling)  # (B, H, Q, D)
    return out.transpose(1, 2).contiguous(), None  # (B, Q, H, D)


@torch.compiler.disable
def _as_tree_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    kwargs: dict,
) -> tuple[torch.Tensor, int] | None:
    """``(tree_mask, prefix_length)`` when this call can run on the kernel, else None."""
    tree_len, kv_len = query.shape[2], key.shape[2]
    if (
        tree_len < 2
        or kv_len < tree_len
        or dropout
        or any(kwargs.get(name) is not None for name in _UNSUPPORTED_KWARGS)
        or not isinstance(attention_mask, torch.Tensor)
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or attention_mask.shape[0] not in (1, query.shape[0])
        or tuple(attention_mask.shape[2:]) != (tree_len, kv_len)
        or query.dtype not in SUPPORTED_DTYPES
        or not query.dtype == key.dtype == value.dtype
        or not query.shape[-1] == key.shape[-1] == value.shape[-1] <= MAX_HEAD_DIM
        or query.shape[1] % key.shape[1]
        or not kernel_supports_device(query.device)
    ):
        return None
    return _tree_mask_of(attention_mask, tree_len)


_last_analysis: tuple[weakref.ref, int, tuple[torch.Tensor, int] | None] | None = None


def _tree_mask_of(attention_mask: torch.Tensor, tree_len: int) -> tuple[torch.Tensor, int] | None:
    """Analyse a (B or 1, 1, Q, P + Q) mask once per tensor (cached by identity and version counter)."""
    global _last_analysis
    if _last_analysis is not None:
        ref, version, result = _last_analysis
        if ref() is attention_mask and version == attention_mask._version:
            return result
    result = _analyse_mask(attention_mask, tree_len)
    _last_analysis = (weakref.ref(attention_mask), attention_mask._version, result)
    return result


def _analyse_mask(attention_mask: torch.Tensor, tree_len: int) -> tuple[torch.Tensor, int] | None:
    prefix_length = attention_mask.shape[-1] - tree_len
    rows = attention_mask[:, 0]  # (B or 1, Q, P + Q)
    if rows.dtype == torch.bool:
        visible, blocked = rows, ~rows
    else:
        visible = rows == 0
        blocked = torch.isneginf(rows) | (rows == torch.finfo(rows.dtype).min)
    block = visible[..., prefix_length:]  # (B or 1, Q, Q)
    is_tree = (
        visible[..., :prefix_length].all()
        & (visible | blocked).all()
        & block.diagonal(dim1=-2, dim2=-1).all()
    )
    if not bool(is_tree):
        return None
    if block.shape[0] == 1 or rows.stride(0) == 0:
        return block[0].contiguous(), prefix_length  # (Q, Q): one mask for every row
    return block.contiguous(), prefix_length  # (B, Q, Q)

