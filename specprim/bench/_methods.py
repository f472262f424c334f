"""The methods a benchmark compares: Hugging Face ``generate`` modes and every specprim preset, by name.

A name maps to a factory (no flag dispatch): ``hf``, ``hf-unpacked`` (a packed target's stock kernels), ``hf-eager``
(a compiled target's eager forward), ``hf-static`` (transformers' compiled static-cache decoding),
``hf-prompt-lookup`` and ``hf-assisted`` build :class:`HFGenerate` with fixed keyword arguments; every name in
:data:`specprim.presets.NAMES` (or several joined by ``+``, drafting together) builds :class:`SpecprimGenerate`
around ``presets.from_name``. New presets appear without edits here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import torch
from transformers import CompileConfig

from specprim import presets
from specprim._names import is_name
from specprim._stats import GenerationStats
from specprim.acceptance import RULES
from specprim.hf import CACHE_ROUNDING, StaticTarget, input_device
from specprim.models import eager_forward, is_compiled, is_packed, stock_kernels

BASELINE = "hf"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decoding:
    """How every method of a run decodes. ``temperature == 0`` is greedy."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    eos_token_id: int | Sequence[int] | None = None
    constraint: Any = None  # a specprim.constraints.GrammarConstraint: every method decodes under it

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """One generation: ``new_ids`` (n,) long on the CPU, the tokens after the prompt; ``stats`` the per-step
    record, or ``None`` for methods that do not expose one (Hugging Face's); ``target_forwards`` the target
    forwards it ran when the method counts them itself (a :class:`specprim.hf.StaticTarget` bypasses
    ``model.forward``, where the harness counts), else ``None``."""

    new_ids: torch.Tensor
    stats: GenerationStats | None
    target_forwards: int | None = None


class BenchMethod(Protocol):
    """Something the harness can time: one prompt in, its continuation out.

    ``draft_modules`` are the modules the method adds to the target (a draft model, heads); the harness counts
    their parameters that the target does not share.
    """

    @property
    def draft_modules(self) -> tuple[torch.nn.Module, ...]: ...

    def generate(self, input_ids: torch.Tensor, decoding: Decoding, seed: int) -> Generation:
        """``input_ids`` (1, T) long -> the continuation; ``seed`` seeds all randomness of this call."""
        ...


def _sampling_kwargs(decoding: Decoding) -> dict[str, Any]:
    if decoding.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": decoding.temperature, "top_k": decoding.top_k or 0,
            "top_p": decoding.top_p or 1.0}


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFGenerate:
    """``model.generate`` with the fixed extra keyword arguments ``options`` (none: plain decoding).

    Sampling uses the global torch RNG, seeded with ``seed`` before the call; ``pad_token_id`` is the EOS id.
    ``stock_kernels``: run inside :func:`specprim.models.stock_kernels` (a packed model computes unpacked).
    ``eager``: run inside :func:`specprim.models.eager_forward` (a compiled model runs its eager forward).
    ``static_cache_length``: the least length of the static cache ``generate`` makes (through
    ``_previous_max_cache_length``, which ``generate`` keeps itself so that later calls do not recompile), so
    prompts of different lengths share one compiled step, as they do with :class:`specprim.hf.StaticTarget`.
    """

    model: torch.nn.Module
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    draft_modules: tuple[torch.nn.Module, ...] = ()
    stock_kernels: bool = False
    eager: bool = False
    static_cache_length: int = 0

    def __repr__(self) -> str:
        shown = {k: type(v).__name__ if isinstance(v, torch.nn.Module) else v for k, v in self.options.items()}
        stock = (", stock_kernels=True" if self.stock_kernels else "") + (", eager=True" if self.eager else "")
        return f"HFGenerate({type(self.model).__name__}.generate, options={shown}{stock})"

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, decoding: Decoding, seed: int) -> Generation:
        ids = input_ids.to(input_device(self.model))
        eos = decoding.eos_token_id
        pad = eos if eos is None or isinstance(eos, int) else list(eos)[0]
        if not decoding.greedy:
            torch.manual_seed(seed)
        options = dict(self.options)
        if decoding.constraint is not None:  # plain constrained decoding
            options["logits_processor"] = [decoding.constraint.logits_processor(ids.shape[1])]
        if self.static_cache_length:
            previous = getattr(self.model, "_previous_max_cache_length", -1)
            self.model._previous_max_cache_length = max(previous, self.static_cache_length)
        with contextlib.ExitStack() as stack:
            if self.stock_kernels:
                stack.enter_context(stock_kernels())
            if self.eager:
                stack.enter_context(eager_forward(self.model))
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=decoding.max_new_tokens,
                eos_token_id=eos, pad_token_id=pad, **_sampling_kwargs(decoding), **options,
            )
        return Generation(new_ids=out[0, ids.shape[1]:].cpu(), stats=None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecprimGenerate:
    """:func:`specprim.speculative_generate` with a preset's drafter and acceptance rule.

    The same ``method`` (and so the same drafter object) serves every prompt of a run: drafters keep no
    state that a new prompt must reset (``ModelDrafter`` reuses its cache by longest common prefix).
    ``verifier``: a :class:`specprim.hf.StaticTarget` of ``target`` to verify with instead of the model's forward.
    """

    target: torch.nn.Module = dataclasses.field(repr=False)
    method: presets.Method
    verifier: StaticTarget | None = dataclasses.field(default=None, repr=False)

    @property
    def draft_modules(self) -> tuple[torch.nn.Module, ...]:
        return modules_of(self.method.drafter)

    def generate(self, input_ids: torch.Tensor, decoding: Decoding, seed: int) -> Generation:
        generator = torch.Generator(device=input_device(self.target)).manual_seed(seed)
        out = self.method.generate(
            self.verifier or self.target, input_ids, max_new_tokens=decoding.max_new_tokens,
            temperature=decoding.temperature, top_k=decoding.top_k, top_p=decoding.top_p,
            eos_token_id=decoding.eos_token_id, generator=generator, constraint=decoding.constraint,
        )
        forwards = None if self.verifier is None else out.stats.steps + int(input_ids.shape[1] > 1)  # + prefill
        return Generation(new_ids=out.sequences[0, input_ids.shape[1]:].cpu(), stats=out.stats,
                          target_forwards=forwards)


def modules_of(obj: object, depth: int = 6) -> tuple[torch.nn.Module, ...]:
    """The ``torch.nn.Module`` objects held by ``obj``'s attributes, searched ``depth`` levels deep
    (a drafter's draft model, heads, or a draft model inside a tree builder; a union's parts' heads sit four levels
    down: union -> parts list -> tree drafter -> draft model -> head), each once."""
    found: dict[int, torch.nn.Module] = {}

    def visit(value: object, level: int) -> None:
        if isinstance(value, torch.nn.Module):
            found.setdefault(id(value), value)
        elif level > 0 and isinstance(value, (list, tuple)):
            for item in value:
                visit(item, level - 1)
        elif level > 0 and hasattr(value, "__dict__") and not isinstance(value, type):
            for item in vars(value).values():
                visit(item, level - 1)

    visit(obj, depth)
    return tuple(found.values())


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodContext:
    """What a method factory may use.

    Attributes:
        target: the target model.
        draft: the draft model (``--draft``), or ``None``.
        num_draft: draft tokens per step (``--num-draft``), or ``None`` for each method's default.
        acceptance: a name from :data:`ACCEPTANCE` replacing the preset's rule, or ``None``.
        preset_options: extra keyword arguments for ``presets.from_name`` (e.g. ``{"head": path}``); passed only
            when non-empty, so presets that take none keep working.
        target_name: the target's known model name, when it was loaded by name (the llama.cpp baselines read its
            GGUF file).
        verifier: the :class:`specprim.hf.StaticTarget` every specprim method verifies with (``--static-verify``),
            or ``None`` for the target model's own forward; the Hugging Face modes always call ``model.generate``.
        stock_baselines: the Hugging Face modes compute with the stock kernels (the target was packed for a
            recipe, not by the user: the baselines stay plain ``model.generate``).
    """

    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    num_draft: int | None = None
    acceptance: str | None = None
    preset_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    target_name: str | None = None
    verifier: StaticTarget | None = None
    stock_baselines: bool = False


ACCEPTANCE: Mapping[str, Callable[[], Any]] = MappingProxyType(dict(RULES))
"""Acceptance rules an ablation can swap in by name."""

HF_PROMPT_LOOKUP_TOKENS = 8  # specprim's PromptLookup default, so both prompt-lookup rows draft alike


def _hf(context: MethodContext) -> BenchMethod:
    return HFGenerate(model=context.target, stock_kernels=context.stock_baselines)


def _hf_unpacked(context: MethodContext) -> BenchMethod:
    if not is_packed(context.target):
        raise ValueError("method 'hf-unpacked' times a packed target's stock kernels; pack the target (--pack)")
    return HFGenerate(model=context.target, stock_kernels=True)


def _hf_eager(context: MethodContext) -> BenchMethod:
    if not is_compiled(context.target):
        raise ValueError("method 'hf-eager' times a compiled target's eager forward; compile the target (--compile)")
    return HFGenerate(model=context.target, eager=True)


def _hf_static(context: MethodContext) -> BenchMethod:
    """Transformers' own compiled decoding: a static cache, and ``generate`` compiling the one-token step with static
    shapes (on CPU too). A packed model is traced through its stock kernels. Not ``fullgraph``: the harness's
    forward counter is a hook that runs outside the graph. Without inductor freezing: with it, ``generate``'s
    static cache is treated as a constant (wrong tokens, then out-of-bounds cache writes; seen with torch 2.13)."""
    compile_config = CompileConfig(dynamic=False, mode="default")
    compile_config._compile_all_devices = True  # generate compiles on CUDA-like devices only unless told
    options = {"cache_implementation": "static", "compile_config": compile_config}
    return HFGenerate(model=context.target, options=options, stock_kernels=is_packed(context.target),
                      static_cache_length=CACHE_ROUNDING)


def _hf_prompt_lookup(context: MethodContext) -> BenchMethod:
    tokens = context.num_draft or HF_PROMPT_LOOKUP_TOKENS
    return HFGenerate(model=context.target, options={"prompt_lookup_num_tokens": tokens},
                      stock_kernels=context.stock_baselines)


def _hf_assisted(context: MethodContext) -> BenchMethod:
    if context.draft is None:
        raise ValueError("method 'hf-assisted' needs a draft model (--draft)")
    options: dict[str, Any] = {"assistant_model": context.draft}
    if context.num_draft is not None:
        options.update(num_assistant_tokens=context.num_draft, num_assistant_tokens_schedule="constant")
    return HFGenerate(model=context.target, options=options, draft_modules=(context.draft,),
                      stock_kernels=context.stock_baselines)


HF_METHODS: Mapping[str, Callable[[MethodContext], BenchMethod]] = MappingProxyType({
    BASELINE: _hf, "hf-unpacked": _hf_unpacked, "hf-eager": _hf_eager, "hf-static": _hf_static,
    "hf-prompt-lookup": _hf_prompt_lookup, "hf-assisted": _hf_assisted,
})


def _llama_cpp(context: MethodContext, prompt_lookup: int = 0) -> BenchMethod:
    from specprim.bench._llama_cpp import LlamaCppGenerate
    from specprim.models import KNOWN_MODELS, gguf_path

    if context.target_name not in KNOWN_MODELS:
        raise ValueError(f"the llama-cpp baselines run a known model's GGUF file; load the target by one of the names "
                         f"{list(KNOWN_MODELS)}")
    return LlamaCppGenerate(gguf=gguf_path(context.target_name), prompt_lookup=prompt_lookup)


EXTERNAL_METHODS: Mapping[str, Callable[[MethodContext], BenchMethod]] = MappingProxyType({
    "llama-cpp": _llama_cpp,
    "llama-cpp-prompt-lookup": lambda context: _llama_cpp(context, context.num_draft or HF_PROMPT_LOOKUP_TOKENS),
})
"""Other runtimes on the same model, optional: ``llama-cpp`` needs ``llama-cpp-python`` (see ``_llama_cpp``)."""


def method_names() -> tuple[str, ...]:
    """Every method name: the Hugging Face modes, the other runtimes, then ``specprim.presets.NAMES`` as it is
    now."""
    return (*HF_METHODS, *EXTERNAL_METHODS, *presets.NAMES)


def build_method(name: str, context: MethodContext) -> BenchMethod:
    """The method called ``name`` for ``context``. Raises ``ValueError`` for an unknown name, a missing draft
    model or head, and an unknown acceptance rule."""
    if name in HF_METHODS:
        return HF_METHODS[name](context)
    if name in EXTERNAL_METHODS:
        return EXTERNAL_METHODS[name](context)
    if not is_name(name):
        raise ValueError(f"unknown method {name!r}; known: {list(method_names())}")
    options = dict(context.preset_options)
    if "+" not in name:
        options.pop("max_nodes", None)  # caps unions only
    try:
        method = presets.from_name(
            name, target=context.target, draft=context.draft, num_draft=context.num_draft, **options
        )
    except TypeError as error:  # a preset that takes none of preset_options
        raise ValueError(f"preset {name!r} does not take {sorted(context.preset_options)}: {error}") from error
    if context.acceptance is not None:
        if context.acceptance not in ACCEPTANCE:
            raise ValueError(f"unknown acceptance rule {context.acceptance!r}; known: {sorted(ACCEPTANCE)}")
        method = dataclasses.replace(method, acceptance=ACCEPTANCE[context.acceptance]())
    return SpecprimGenerate(target=context.target, method=method, verifier=context.verifier)
