"""The names a command line or a recipe gives methods, dtypes, quantization schemes, verifiers and the kinds of
trained drafters, and the syntax of a tree spec, in a module that imports nothing: ``specprim`` checks a command line
against them before it imports torch. :mod:`specprim.presets`, :mod:`specprim.trees`, :mod:`specprim.recipes` and
:mod:`specprim.train` take them from here; ``tests/test_cli_errors.py`` checks that :mod:`specprim.bench` and
:mod:`specprim.models` agree.
"""

from __future__ import annotations

AUTO = "auto"
"""The method that runs the recipe tuned for the target (:func:`specprim.recipes.auto`)."""

METHODS: tuple[str, ...] = ("leviathan", "prompt-lookup", "datastore", "suffix", "early-exit", "medusa", "eagle",
                            "eagle3", "mtp", "parallel")
"""The presets' names (:data:`specprim.presets.NAMES`)."""

BENCH_BASELINES: tuple[str, ...] = ("hf", "hf-unpacked", "hf-eager", "hf-static", "hf-prompt-lookup", "hf-assisted",
                                    "llama-cpp", "llama-cpp-prompt-lookup")
"""The methods ``specprim bench`` times besides the presets: Hugging Face's modes and other runtimes
(:func:`specprim.bench.method_names`)."""

# the values of a Recipe's dtype, quantize (and draft_quantize) and verifier fields
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
QUANTIZE_SCHEMES: tuple[str, ...] = ("int8", "int4", "int8-all", "int4-all")
VERIFIERS: tuple[str, ...] = ("eager", "static", "compiled")

TRAIN_KINDS: tuple[str, ...] = ("eagle3", "eagle", "medusa", "mtp", "distill", "parallel")
"""What ``specprim train`` trains (:data:`specprim.train.KINDS`)."""
UNROLLED_TRAIN_KINDS: tuple[str, ...] = ("eagle3", "eagle", "mtp", "parallel")
"""The kinds that train unrolled draft depths (``--align``, ``--hass-topk``): the registry's ``unrolled`` ones."""
LAYERED_TRAIN_KINDS: tuple[str, ...] = ("eagle3", "eagle")
"""The kinds whose heads have a chosen number of decoder layers (``--head-layers``): the registry's with ``resize``."""

TRAIN_DATA_SOURCES: tuple[str, ...] = ("sharegpt", "sharegpt-code")
"""The built-in training data of ``specprim train`` and ``specprim campaign`` (``--data``; anything else names a JSONL
file): ShareGPT V3, and those of its conversations with a fenced code block in an answer."""

TREE_SPEC_HELP = ("chain:K | dynamic:depth=D,top_k=K,budget=N | static:W1,W2,... (branching widths by depth, top-k) | "
                  "sampled:W1,W2,... (the same, siblings drawn without replacement at temperature > 0)")
"""The tree specs :func:`specprim.trees.parse_tree` reads."""


def is_name(name: str) -> bool:
    """Whether :func:`specprim.presets.from_name` knows ``name``: one of :data:`METHODS`, or several distinct ones
    joined by ``+``."""
    parts = name.split("+")
    return all(part in METHODS for part in parts) and len(set(parts)) == len(parts)


def drafts_with_a_draft_model(name: str) -> bool:
    """Whether the method called ``name`` (one preset or several joined by ``+``) has a ``leviathan`` part, the
    one that takes ``draft_vocab_size``."""
    return "leviathan" in name.split("+")


def uses_datastore(name: str) -> bool:
    """Whether the method called ``name`` (one preset or several joined by ``+``) has a ``datastore`` part."""
    return "datastore" in name.split("+")
