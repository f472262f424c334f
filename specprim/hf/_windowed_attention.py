"""SDPA over the used part of a static KV cache: the attention function a :class:`StaticTarget` forward runs under.

A static cache holds many more slots than a sequence uses (MT-bench prompts fill ~130 of 512), and transformers'
SDPA attends over all of them, masked or not: on the 2-core development CPU, 30 such calls cost ~5.4 ms over 512
slots against ~3.0 ms over 256 and ~2.2 ms over 128 (SmolLM2-135M, 8 queries, bf16). The attention function here
reads only as many slots as the mask has columns, so a forward whose mask covers the first ``W`` slots attends over
those ``W``; the verifier builds masks that end at the last written slot, and a compiled verifier marks ``W``
dynamic (one graph for every length).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

WINDOWED_SDPA = "specprim_windowed_sdpa"
"""Name under which :func:`windowed_sdpa_forward` is registered in ``transformers.AttentionInterface``."""


def windowed_sdpa_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention over the first ``attention_mask.shape[-1]`` key/value slots only.

    Args:
        query: (B, heads, Q, D); key, value: (B, kv_heads, L, D), the whole static cache.
        attention_mask: (B or 1, 1, Q, W) additive or bool with ``W <= L``, or ``None`` (then all ``L`` slots).
    Returns:
        what ``sdpa_attention_forward`` returns: (B, Q, heads, D) and ``None``. Equal to SDPA over all ``L`` slots
        with the mask padded by masked columns, up to the rounding of a shorter reduction.
    """
    if attention_mask is not None:  # a window of every slot slices nothing (one traced graph for every W <= L)
        window = attention_mask.shape[-1]
        key, value = key[:, :, :window], value[:, :, :window]
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def attends_windowed(config: PretrainedConfig) -> bool:
    """Whether the model whose attention modules read ``config`` attends windowed inside
    :func:`windowed_attention` ``(config)`` (what that context yields), without entering it."""
    return config._attn_implementation in ("sdpa", WINDOWED_SDPA)


@contextlib.contextmanager
def windowed_attention(config: PretrainedConfig) -> Iterator[bool]:
    """Run the model whose attention modules read ``config`` on :func:`windowed_sdpa_forward` inside the context
    (restored after), when it runs on ``"sdpa"``; any other implementation is left as it is. Yields whether the
    attention is windowed, i.e. whether masks may end before the cache does."""
    if config._attn_implementation == WINDOWED_SDPA:  # already inside such a context
        yield True
        return
    if config._attn_implementation != "sdpa":
        yield False
        return
    _register()
    config._attn_implementation = WINDOWED_SDPA
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"


@functools.cache
def _register() -> None:
    """Register :func:`windowed_sdpa_forward` (and SDPA's mask builder) under :data:`WINDOWED_SDPA`, once."""
    AttentionInterface.register(WINDOWED_SDPA, windowed_sdpa_forward)
    AttentionMaskInterface.register(WINDOWED_SDPA, sdpa_mask)
