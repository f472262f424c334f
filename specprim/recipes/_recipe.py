"""``Recipe``: every choice a speculative-decoding run makes, as one frozen value.

A recipe names how the target is loaded (dtype, quantization, packing), how it verifies (eager, static, compiled),
what drafts (a preset name or several joined by ``+``, their tree shape, node cap, draft model, head, datastores),
the acceptance rule and the warm-up. It is data: strings, numbers and flags, no models. ``str(recipe)`` is a
short ``key=value`` line (:meth:`Recipe.parse` reads it back), :meth:`Recipe.to_toml` / :meth:`Recipe.from_toml`
its file form, ``repr`` the experiment log, and ``dataclasses.replace(recipe, tree=...)`` an ablation.
Invalid combinations are refused when the recipe is made, before anything is loaded.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specprim import models, presets
from specprim._names import DTYPES, QUANTIZE_SCHEMES, VERIFIERS, is_name
from specprim.acceptance import RULES
from specprim.drafters import static_drafting
from specprim.hf import StaticTarget
from specprim.recipes._build import Built, cross_vocab
from specprim.trees import parse_tree

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """How one speculative-decoding run is set up. Every field has a default: ``Recipe()`` is prompt lookup on an
    fp32 target with eager verification.

    Attributes:
        method: the drafter: a preset name of :data:`specprim.presets.NAMES`, or several joined by ``+``.
        dtype: the target's (and draft's) dtype: ``float32``, ``bfloat16`` or ``float16``.
        quantize: weight-only quantization of the target's linears (``int8``, ``int4``, ``-all``: the LM head too).
        pack: pre-pack bfloat16 linears for oneDNN (CPU; same values, faster kernels).
        compile: ``torch.compile`` the models' own forward (not with ``pack``).
        verifier: ``eager`` (the model's forward), ``static`` (a static KV cache, trees padded to a few sizes) or
            ``compiled`` (the static verifier compiled with static shapes: the fast CPU path, compiles first).
        min_padded: the static verifier pads every tree to at least this many tokens (with the root), so smaller
            trees reuse a larger shape's compiled graph instead of compiling their own.
        static_draft: draft through static, compiled copies of draft LMs and EAGLE heads.
        draft: the draft model of ``leviathan`` (a known name, path or hub id).
        draft_quantize: weight-only quantization of the draft model.
        draft_vocab: restrict ``leviathan``'s draft model to this many token ids.
        head: a trained head (shipped name or directory) for ``medusa``, ``eagle``, ``eagle3``, ``mtp``; ``None``
            takes the head shipped for the target, where there is one.
        exit_layer: the early-exit layer.
        num_draft: draft tokens per step (the presets' own default when ``None``).
        tree: a tree spec (:func:`specprim.trees.parse_tree`) replacing the presets' shapes.
        max_nodes: cap a union's merged tree at this many nodes.
        datastores: the corpora of a ``datastore`` part (shipped names or files), searched as one.
        acceptance: ``speculative`` (lossless, the default), ``greedy`` (lossless, greedy decoding only),
            ``block`` (lossless block verification, chain drafters only), ``traversal`` (lossless traversal
            verification of trees) or ``typical`` (lossy).
        warmup_tokens: tokens generated before timing, so every compiled shape is built first.
    """

    method: str = "prompt-lookup"
    dtype: str = "float32"
    quantize: str | None = None
    pack: bool = False
    compile: bool = False
    verifier: str = "eager"
    min_padded: int = 0
    static_draft: bool = False
    draft: str | None = None
    draft_quantize: str | None = None
    draft_vocab: int | None = None
    head: str | None = None
    exit_layer: int | None = None
    num_draft: int | None = None
    tree: str | None = None
    max_nodes: int | None = None
    datastores: tuple[str, ...] = ()
    acceptance: str = "speculative"
    warmup_tokens: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.datastores, (str, os.PathLike)) or not isinstance(self.datastores, (list, tuple)):
            raise ValueError(f"datastores must be a list of names or files, got {self.datastores!r}")
        object.__setattr__(self, "datastores", tuple(os.fspath(d) for d in self.datastores))
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("verifier", self.verifier, VERIFIERS)
        _check_choice("acceptance", self.acceptance, tuple(RULES))
        for name in ("quantize", "draft_quantize"):
            if getattr(self, name) is not None:
                _check_choice(name, getattr(self, name), QUANTIZE_SCHEMES)
        for name in ("pack", "compile", "static_draft"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name, least in (("draft_vocab", 1), ("exit_layer", 1), ("num_draft", 1), ("max_nodes", 1),
                            ("warmup_tokens", 0), ("min_padded", 0)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if not isinstance(self.method, str) or not is_name(self.method):
            raise ValueError(f"unknown method {self.method!r}; choose from {', '.join(presets.NAMES)} or join "
                             "distinct ones with '+'")
        if self.pack and self.compile:
            raise ValueError("pack and compile exclude each other: compiling with freezing packs the weights itself")
        if self.pack and self.dtype != "bfloat16":
            raise ValueError(f"pack pre-packs bfloat16 linears; the recipe's dtype is {self.dtype}")
        if self.min_padded and self.verifier == "eager":
            raise ValueError("min_padded pads the static verifier's trees; the recipe verifies eagerly")
        parts = self.method.split("+")
        if self.max_nodes is not None and len(parts) == 1:
            raise ValueError(f"max_nodes caps a union's merged tree; {self.method!r} is a single method")
        if self.datastores and "datastore" not in parts:
            raise ValueError(f"datastores are the corpus of a 'datastore' part; {self.method!r} has none")
        if "datastore" in parts and not self.datastores:
            raise ValueError("a 'datastore' part needs datastores (e.g. smollm2-135m-instruct-answers or sharegpt)")
        if self.draft_vocab is not None and "leviathan" not in parts:
            raise ValueError(f"draft_vocab restricts leviathan's draft model; {self.method!r} has no leviathan part")
        if "leviathan" in parts and self.draft is None:
            raise ValueError("a 'leviathan' part needs a draft model (draft = a small LM)")
        if self.draft_quantize is not None and self.draft is None:
            raise ValueError("draft_quantize quantizes the draft model; the recipe has no draft")
        if self.tree is not None:
            parse_tree(self.tree)  # ValueError says what is wrong

    @property
    def lossless(self) -> bool:
        """Whether the output is distributed exactly as the target's (its acceptance rule is lossless)."""
        return bool(RULES[self.acceptance].lossless)

    @property
    def numerics(self) -> str | None:
        """What in the recipe changes the target's numbers (so outputs match ``generate`` on the same weights, not
        on the stock fp32 model), or ``None``."""
        changes = [self.dtype] if self.dtype != "float32" else []
        changes += [f"{self.quantize} weights"] if self.quantize else []
        changes += ["compiled forwards"] if self.verifier == "compiled" or self.compile else []
        return ", ".join(changes) or None

    def build(self, model: Any, tokenizer: Any = None, *, draft: Any = None, cache_length: int = 0,
              prefill_chunk: int | None = None) -> Built:
        """The verifier and method this recipe names, for ``model`` already loaded as the recipe says
        (:func:`specprim.recipes.load_target`).

        ``tokenizer``: the target's (needed to load datastores); ``draft``: the loaded draft model of a
        ``leviathan`` part; ``cache_length``: the least static cache length (static verifier and drafting), e.g. the
        longest prompt plus the budget, so that no cache grows (and recompiles) while decoding; ``prefill_chunk``:
        the static verifier's (:class:`specprim.hf.StaticTarget`; ``0``, an eager prefill, compiles one graph less
        for a single prompt). Raises ``ValueError`` when something the recipe needs is missing.
        """
        datastore = None
        if self.datastores:
            if tokenizer is None:
                raise ValueError("a recipe with datastores needs the target's tokenizer")
            datastore = models.load_datastore(list(self.datastores), tokenizer)
        vocab = None  # a draft with another tokenizer drafts the tokens both share
        if draft is not None and tokenizer is not None and self.draft is not None:
            vocab = cross_vocab(tokenizer, models.load_tokenizer(self.draft))
        method = presets.from_name(
            self.method, target=model, draft=draft, head=self.head, num_draft=self.num_draft,
            exit_layer=self.exit_layer, tree=self.tree, draft_vocab_size=self.draft_vocab, datastore=datastore,
            max_nodes=self.max_nodes, cross_vocab=vocab,
        )
        if self.acceptance != "speculative":
            method = dataclasses.replace(method, acceptance=RULES[self.acceptance]())
        if self.static_draft:
            method = dataclasses.replace(method, drafter=static_drafting(method.drafter,
                                                                         min_cache_length=cache_length))
        verifier = model
        if self.verifier != "eager":
            verifier = StaticTarget(model, compile=self.verifier == "compiled", min_cache_length=cache_length,
                                    prefill_chunk=prefill_chunk, min_padded=self.min_padded)
        return Built(verifier=verifier, method=method)

    def changes(self) -> dict[str, Any]:
        """The fields that differ from their defaults, in field order (``method`` always)."""
        default = Recipe()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name == "method" or getattr(self, f.name) != getattr(default, f.name)}

    def __str__(self) -> str:
        return " ".join(_format_item(name, value) for name, value in self.changes().items())

    @classmethod
    def parse(cls, text: str) -> Recipe:
        """The recipe ``str(recipe)`` printed: space-separated ``key=value`` items (a bare ``key`` is ``true``;
        lists are comma-separated). Raises ``ValueError`` for unknown keys and bad values."""
        fields: dict[str, Any] = {}
        for item in text.split():
            key, sep, value = item.partition("=")
            fields[key.replace("-", "_")] = _parse_value(key.replace("-", "_"), value if sep else "true")
        return cls.from_dict(fields)

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any], where: str = "recipe") -> Recipe:
        """A recipe from a mapping of field names (as in a TOML file). Raises ``ValueError`` for unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**{k: tuple(v) if k == "datastores" and isinstance(v, list) else v for k, v in fields.items()})

    def to_toml(self) -> str:
        """The recipe as a TOML document (the fields that differ from the defaults)."""
        return "".join(f"{name} = {_toml_value(value)}\n" for name, value in self.changes().items())

    @classmethod
    def from_toml(cls, text: str, where: str = "recipe") -> Recipe:
        """The recipe of a TOML document written by :meth:`to_toml` (or by hand)."""
        try:
            fields = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{where}: not valid TOML: {error}") from error
        return cls.from_dict(fields, where)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Recipe:
        """The recipe in the TOML file ``path``. Raises ``ValueError`` when it is missing or invalid."""
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"recipe file {file} does not exist")
        return cls.from_toml(file.read_text(), where=str(file))


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _format_item(name: str, value: Any) -> str:
    key = name.replace("_", "-")
    if value is True:
        return key
    if isinstance(value, tuple):
        return f"{key}={','.join(value)}"
    return f"{key}={value}"


def _parse_value(name: str, text: str) -> Any:
    field = {f.name: f for f in dataclasses.fields(Recipe)}.get(name)
    if field is None:
        raise ValueError(f"unknown recipe key {name.replace('_', '-')!r}; known: "
                         f"{sorted(f.name.replace('_', '-') for f in dataclasses.fields(Recipe))}")
    kind = str(field.type)
    if kind == "bool":
        if text not in ("true", "false"):
            raise ValueError(f"{name.replace('_', '-')} must be true or false, got {text!r}")
        return text == "true"
    if kind.startswith("int"):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name.replace('_', '-')} must be an int, got {text!r}") from None
    if kind.startswith("tuple"):
        return tuple(part for part in text.split(",") if part)
    return None if text == "none" and "None" in kind else text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
