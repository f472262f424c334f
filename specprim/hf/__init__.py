"""Hugging Face integration: tree verification through a model's public forward and KV-cache commit."""

from specprim.hf._aot_forward import CachedForward, aot_applies, package_key, weights_fingerprint
from specprim.hf._batched_target import BatchedHFTarget
from specprim.hf._causal_lm import (
    CausalLM,
    cache_kwarg,
    check_causal_lm,
    context_length,
    input_device,
    sliding_window,
    vocab_size,
)
from specprim.hf._protocol import Target
from specprim.hf._reserved_cache import reserved_cache, reserved_cache_fits
from specprim.hf._static_target import (
    CACHE_ROUNDING,
    QUERY_BUCKETS,
    StaticTarget,
    WarmShapes,
    compiled_forward_settings,
    grown_cache,
    padded_mask,
    query_bucket,
    write_from,
)
from specprim.hf._target import HFTarget, as_target
from specprim.hf._tokenizers import chat_input_ids, check_tokenizers_compatible
from specprim.hf._truncate import num_layers, truncated_view
from specprim.hf._windowed_attention import attends_windowed, windowed_attention, windowed_sdpa_forward

__all__ = [
    "BatchedHFTarget",
    "HFTarget",
    "StaticTarget",
    "Target",
    "as_target",
    "chat_input_ids",
    "windowed_attention",
]
