"""Hugging Face integration: tree verification through a model's public forward and KV-cache commit."""

from specprim.hf._target import (
    HFTarget,
    check_causal_lm,
    context_length,
    input_device,
    sliding_window,
    vocab_size,
)
from specprim.hf._tokenizers import check_tokenizers_compatible

__all__ = [
    "HFTarget",
    "check_causal_lm",
    "check_tokenizers_compatible",
    "context_length",
    "input_device",
    "sliding_window",
    "vocab_size",
]
