"""Hugging Face integration: tree verification through a model's public forward and KV-cache commit."""

from specprim.hf._batched_target import BatchedHFTarget
from specprim.hf._draft_lm import LMDraftModel
from specprim.hf._static_draft_lm import StaticLMDraftModel
from specprim.hf._static_target import QUERY_BUCKETS as QUERY_BUCKETS
from specprim.hf._static_target import StaticTarget
from specprim.hf._static_target import WarmShapes as WarmShapes
from specprim.hf._static_target import query_bucket as query_bucket
from specprim.hf._target import (
    HFTarget,
    context_length,
)
from specprim.hf._target import (
    check_causal_lm as check_causal_lm,
)
from specprim.hf._target import (
    input_device as input_device,
)
from specprim.hf._target import (
    sliding_window as sliding_window,
)
from specprim.hf._target import (
    vocab_size as vocab_size,
)
from specprim.hf._tokenizers import chat_input_ids, check_tokenizers_compatible
from specprim.hf._truncate import num_layers as num_layers
from specprim.hf._truncate import truncated_view
from specprim.hf._windowed_attention import windowed_attention
from specprim.hf._windowed_attention import windowed_sdpa_forward as windowed_sdpa_forward

__all__ = [
    "BatchedHFTarget",
    "HFTarget",
    "LMDraftModel",
    "StaticLMDraftModel",
    "StaticTarget",
    "chat_input_ids",
    "check_tokenizers_compatible",
    "context_length",
    "truncated_view",
    "windowed_attention",
]
