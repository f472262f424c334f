"""``specprim.bench.run``: load the models and prompts, build the methods, measure, write JSON and plots."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from specprim import check_decodes, models, presets
from specprim._names import AUTO, drafts_with_a_draft_model, uses_datastore
from specprim.bench._datasets import load_dataset
from specprim.bench._env import environment, load_average
from specprim.bench._memory import PeakMemory
from specprim.bench._methods import BASELINE, BenchMethod, Decoding, MethodContext, SpecprimGenerate, build_method
from specprim.bench._plots import write_plots
from specprim.bench._prompts import Prompt, conversation_ids, read_prompts
from specprim.bench._report import heading
from specprim.bench._results import BenchResults
from specprim.bench._runner import SEED_STRIDE, measure
from specprim.drafters import Datastore, static_drafting
from specprim.hf import QUERY_BUCKETS, StaticTarget, check_tokenizers_compatible, input_device
from specprim.models import is_packed
from specprim.recipes import Recipe, auto
from specprim.sampling import SamplingConfig
from specprim.speedup import CostModel, measure_verify_costs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Model = torch.nn.Module


def _load(model: str | os.PathLike[str] | Model, dtype: str, quantize: str | None,
          pack: bool, compile: bool) -> tuple[Model, Any]:  # noqa: A002
    """Load ``model`` in ``dtype`` (weight-quantized if ``quantize``, packed if ``pack``, compiled if ``compile``);
    a loaded model is returned as it is, quantized, packed and compiled in place when asked."""
    if isinstance(model, Model):
        if quantize is not None:
            models.quantize_weights(model, quantize)
        if pack and not models.is_packed(model):
            models.pack_weights(model)
        if compile:
            models.compile_forward(model)
        return model, None
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return models.load(model, dtype=DTYPES[dtype], quantize=quantize, pack=pack, compile=compile)


def resolve_prompts(dataset: str | None, prompts: str | os.PathLike[str] | Sequence[Prompt | str] | None,
             num_prompts: int | None) -> tuple[list[Prompt], str]:
    """The prompts and the dataset label of a run: a built-in dataset, a JSONL file, or a list."""
    if (dataset is None) == (prompts is None):
        raise ValueError("pass exactly one of dataset= (a built-in name) or prompts= (a JSONL path or a list)")
    if dataset is not None:
        return load_dataset(dataset, num_prompts), dataset
    if isinstance(prompts, (str, os.PathLike)):
        return read_prompts(prompts)[:num_prompts], Path(prompts).stem
    items = [p if isinstance(p, Prompt) else Prompt(id=str(i), turns=(p,)) for i, p in enumerate(prompts)]
    if not items:
        raise ValueError("the prompts list is empty")
    return items[:num_prompts], "custom"


def _methods(names: Sequence[str], context: MethodContext,
             custom: Mapping[str, BenchMethod | presets.Method]) -> dict[str, BenchMethod]:
    """``hf`` first, then the named methods and the ``custom`` ones, each once, in the given order."""
    built: dict[str, BenchMethod] = {}
    for name in dict.fromkeys([BASELINE, *names, *custom]):
        method = custom.get(name)
        if method is None:
            built[name] = build_method(name, context)
        elif isinstance(method, presets.Method):
            built[name] = SpecprimGenerate(target=context.target, method=method, verifier=context.verifier)
        else:
            built[name] = method
    return built


def _constraint(json_schema: str | os.PathLike[str] | Mapping[str, Any] | None, tokenizer: Any,
                model: Model) -> Any:
    """The grammar constraint of ``json_schema`` (a dict or a file) on the target's vocabulary, or ``None``."""
    if json_schema is None:
        return None
    from specprim.constraints import GrammarConstraint

    schema = json_schema if isinstance(json_schema, Mapping) else Path(json_schema).read_text(encoding="utf-8")
    return GrammarConstraint.json_schema(dict(schema) if isinstance(schema, Mapping) else schema, tokenizer,
                                         vocab_size=model.get_output_embeddings().weight.shape[0])


def _check_recipe_fits(label: str, recipe: Recipe, dtype: str, quantize: str | None) -> None:
    """Refuse a recipe method whose target loading differs from the run's (one target model serves every method)."""
    if recipe.dtype != dtype:
        raise ValueError(f"method {label!r} runs in {recipe.dtype}; the run loads the target in {dtype} "
                         f"(pass --dtype {recipe.dtype})")
    if recipe.quantize != quantize:
        raise ValueError(f"method {label!r} quantizes the target as {recipe.quantize}; the run as {quantize}")
    if recipe.compile:
        raise ValueError(f"method {label!r} compiles the model's own forward; pass --compile to the run instead")


def _check_decodes(methods: Mapping[str, BenchMethod], decoding: Decoding) -> None:
    """Refuse, before anything is compiled or timed, a specprim method whose acceptance rule or drafter decodes
    greedily only when ``decoding`` samples (``ValueError`` naming the method)."""
    sampling = SamplingConfig(temperature=decoding.temperature, top_k=decoding.top_k, top_p=decoding.top_p)
    for name, method in methods.items():
        if isinstance(method, SpecprimGenerate):
            try:
                check_decodes(method.method.acceptance, [method.method.drafter], sampling)
            except ValueError as error:
                raise ValueError(f"method {name!r}: {error}") from error


def _cache_length(tokenizer: Any, prompts: Sequence[Prompt], max_new_tokens: int) -> int:
    """A static cache length long enough for every conversation (each user turn rendered alone, an upper bound, plus
    ``max_new_tokens`` per answer, plus the largest padded tree), so that no cache grows, and recompiles, during the
    timed runs."""
    longest = max(sum(conversation_ids(tokenizer, [turn], []).shape[1] + max_new_tokens for turn in p.turns)
                  for p in prompts)
    return longest + QUERY_BUCKETS[-1]


def _drafting_statically(methods: dict[str, BenchMethod], cache_length: int) -> dict[str, BenchMethod]:
    """``methods`` with every specprim method's draft models switched to static, compiled ones
    (:func:`specprim.drafters.static_drafting`; compiles here, before anything is timed)."""
    return {name: dataclasses.replace(method, method=dataclasses.replace(
                method.method, drafter=static_drafting(method.method.drafter, min_cache_length=cache_length)))
            if isinstance(method, SpecprimGenerate) else method for name, method in methods.items()}


def run(
    *,
    target: str | os.PathLike[str] | Model,
    methods: Sequence[str],
    max_new_tokens: int,
    dataset: str | None = None,
    prompts: str | os.PathLike[str] | Sequence[Prompt | str] | None = None,
    num_prompts: int | None = None,
    turns: int | None = None,
    tokenizer: Any = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    dtype: str = "float32",
    quantize: str | None = None,
    pack: bool = False,
    compile: bool = False,  # noqa: A002 - the option's name on the command line
    static_verify: bool = False,
    static_draft: bool = False,
    draft: str | os.PathLike[str] | Model | None = None,
    draft_quantize: str | None = None,
    num_draft: int | None = None,
    head: str | os.PathLike[str] | None = None,
    exit_layer: int | None = None,
    draft_vocab: int | None = None,
    datastore: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Datastore | None = None,
    max_nodes: int | None = None,
    tree: str | None = None,
    acceptance: str | None = None,
    repeats: int = 1,
    seed: int = 0,
    custom: Mapping[str, BenchMethod | presets.Method] | None = None,
    recipes: Mapping[str, Recipe] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    plot_dir: str | os.PathLike[str] | None = None,
    warmup_tokens: int = 8,
    progress: bool = False,
    predict: bool = False,
    json_schema: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    argv: Sequence[str] | None = None,
) -> BenchResults:
    """Benchmark ``methods`` against plain ``model.generate`` (``hf``, always measured first) on one target.

    Args:
        target: a name for :func:`specprim.models.load`, a path, or a loaded model (then pass ``tokenizer``).
        methods: names from :func:`specprim.bench.method_names` (``hf``, ``hf-prompt-lookup``, ``hf-assisted``,
            every specprim preset).
        dataset: a built-in dataset name (``mt-bench``, ``humaneval``, ``gsm``); or pass ``prompts``.
        prompts: a JSONL file of ``{"prompt": ...}`` / ``{"turns": [...]}`` records, or a list of :class:`Prompt`
            or strings.
        num_prompts: use the first ``num_prompts`` prompts (default: all).
        turns: use only the first ``turns`` turns of every prompt (``1``: MT-bench first turns; default: all).
        quantize: ``None`` or a scheme of :data:`specprim.models.QUANTIZE_SCHEMES` (``"int8"``, ``"int4"``; ``-all``:
            the LM head too): weight-only quantize the target (see
            :func:`specprim.models.quantize_weights`); the ``hf`` baseline and every method run that same model.
            A loaded ``target`` is quantized in place.
        pack: pre-pack the target's (and draft's, and heads') bfloat16 linear layers for oneDNN (:func:`specprim.models.
            pack_weights`); ``hf`` and every method run the packed model, and ``hf-unpacked`` times the stock kernels.
        compile: ``torch.compile`` the target's (and draft's) forward (:func:`specprim.models.compile_forward`);
            ``hf`` and every method run the compiled model. Compilation happens in the untimed warm-up, so raise
            ``warmup_tokens`` until the warm-up meets every kind of forward the timed runs make.
        static_verify: every specprim method verifies through one shared :class:`specprim.hf.StaticTarget` (static
            KV cache, trees padded to a few sizes, ``torch.compile``d with static shapes; compiles in the warm-up,
            about 75 s per tree-size bucket on 2 cores); the Hugging Face modes keep ``model.generate``.
        static_draft: every specprim method drafts through static, compiled draft models where it has them (draft
            language models and EAGLE heads, :func:`specprim.drafters.static_drafting`; compiled before the
            warm-up); ``hf-assisted`` keeps the draft model's own forward.
        draft: the draft model (name, path or model) for ``leviathan`` and ``hf-assisted``; loaded in ``dtype``.
        draft_quantize: like ``quantize``, for the draft model.
        num_draft: the preset's draft length.
        head: a head checkpoint directory, passed to ``presets.from_name`` as ``head=`` (only when given).
        exit_layer: an early-exit layer, passed to ``presets.from_name`` as ``exit_layer=`` (only when given).
        draft_vocab: a reduced vocabulary size for the draft model of ``leviathan`` (``draft_vocab_size=``; only when
            given, and only with ``draft``); ``hf-assisted`` keeps the whole draft model.
        datastore: the corpus of the ``datastore`` method: a ``Datastore``, or names / files for
            :func:`specprim.models.load_datastore` (checked against the target's tokenizer), loaded once and
            shared by every method.
        max_nodes: cap the merged tree of union methods (names joined by ``+``) at this many nodes.
        tree: a tree spec (:func:`specprim.trees.parse_tree`) replacing the presets' shapes (only when given).
        acceptance: an acceptance rule name replacing the preset's (see ``ACCEPTANCE``).
        repeats: times every (prompt, method) pair is measured; ``seed`` seeds everything (see ``SEED_STRIDE``).
        custom: extra methods by label, a :class:`specprim.presets.Method` or any :class:`BenchMethod`.
        recipes: extra methods by label, each a :class:`specprim.recipes.Recipe` (its own verifier, drafter, warm-up;
            its dtype and quantization must be the run's). The method name ``auto`` in ``methods`` is the recipe
            :func:`specprim.recipes.auto` picks for the target, the temperature and ``dtype``. A recipe that packs
            packs the target in place; the Hugging Face modes then still compute with the stock kernels, so that
            ``hf`` stays plain ``model.generate`` (unless ``pack``).
        json_path: where to write the JSON results, if given.
        plot_dir: where to write the PNG plots, if given.
        predict: time the target's verification against tree size first (:func:`specprim.speedup.
            measure_verify_costs`) and add the speedup model's prediction to every specprim method's summary.
        json_schema: a JSON schema (a dict, or a file): every method, ``hf`` included, decodes under it
            (:class:`specprim.constraints.GrammarConstraint`; ``pip install 'specprim[structured]'``).
        argv: the command to record (default ``sys.argv``).

    Returns the :class:`BenchResults`. Raises ``ValueError`` for bad arguments, an unknown method or dataset, or a
    method missing its draft model; :class:`DatasetFetchError` when a built-in dataset cannot be fetched.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for name, scheme in (("quantize", quantize), ("draft_quantize", draft_quantize)):
        if scheme is not None and scheme not in models.QUANTIZE_SCHEMES:
            raise ValueError(f"{name} must be None or one of {list(models.QUANTIZE_SCHEMES)}, got {scheme!r}")
    if draft_vocab is not None and not any(map(drafts_with_a_draft_model, methods)):
        raise ValueError("draft_vocab applies to the leviathan method's draft model only; no method uses it")
    if max_nodes is not None and not any("+" in m for m in methods):
        raise ValueError("max_nodes caps the merged tree of unions (methods joined by '+'); no method is one")
    if datastore is not None and not any(map(uses_datastore, methods)):
        raise ValueError("datastore applies to methods with a datastore part only; no method uses it")
    torch.manual_seed(seed)
    prompt_list, label = resolve_prompts(dataset, prompts, num_prompts)
    if turns is not None:
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        prompt_list = [dataclasses.replace(p, turns=p.turns[:turns]) for p in prompt_list]
    model, loaded_tokenizer = _load(target, dtype, quantize, pack, compile)
    tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    if tokenizer is None:
        raise ValueError("pass tokenizer= with a loaded target model")
    draft_model = None
    if draft is not None:
        draft_model, draft_tokenizer = _load(draft, dtype, draft_quantize, pack, compile)
        if draft_tokenizer is not None:
            check_tokenizers_compatible(tokenizer, draft_tokenizer)
    if datastore is not None and not isinstance(datastore, Datastore):
        datastore = models.load_datastore(datastore, tokenizer)
    options = {key: value for key, value in (("head", None if head is None else str(head)),
                                              ("exit_layer", exit_layer), ("tree", tree),
                                              ("draft_vocab_size", draft_vocab), ("datastore", datastore),
                                              ("max_nodes", max_nodes)) if value is not None}
    cache_length = _cache_length(tokenizer, prompt_list, max_new_tokens)
    context = MethodContext(target=model, draft=draft_model, num_draft=num_draft, acceptance=acceptance,
                            preset_options=options, target_name=target if isinstance(target, str) else None,
                            verifier=StaticTarget(model, min_cache_length=cache_length) if static_verify else None)
    recipe_map = dict(recipes or {})
    names = [m for m in methods if m != AUTO]
    chosen = None
    if AUTO in methods:
        chosen = auto(target if isinstance(target, str) else model, temperature=temperature, dtype=dtype)
        recipe_map[AUTO] = chosen.recipe
    for name, recipe in recipe_map.items():
        _check_recipe_fits(name, recipe, dtype, quantize)
        if recipe.pack and not is_packed(model):
            models.pack_weights(model)
            context = dataclasses.replace(context, stock_baselines=True)
        warmup_tokens = max(warmup_tokens, recipe.warmup_tokens)
    method_map = _methods(names, context, custom or {})
    decoding = Decoding(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        eos_token_id=tokenizer.eos_token_id, constraint=_constraint(json_schema, tokenizer, model))
    _check_decodes(method_map, decoding)
    if static_draft:
        method_map = _drafting_statically(method_map, cache_length)
    for name, recipe in recipe_map.items():
        built = recipe.build(model, tokenizer, draft=draft_model, cache_length=cache_length)
        verifier = built.verifier if isinstance(built.verifier, StaticTarget) else None
        method_map[name] = SpecprimGenerate(target=model, method=built.method, verifier=verifier)
    _check_decodes({name: method_map[name] for name in recipe_map}, decoding)
    costs = None
    if predict:
        first = conversation_ids(tokenizer, prompt_list[0].turns[:1], [])
        timed = context.verifier or model  # what the methods verify with
        costs = CostModel(*measure_verify_costs(timed, first, sizes=(0, 1, 2, 4, 8, 16, 32, 64), repeats=3))
    load_before = load_average()
    rows, summaries = measure(target=model, tokenizer=tokenizer, prompts=prompt_list, methods=method_map,
                              decoding=decoding, dataset=label, repeats=repeats, seed=seed,
                              warmup_tokens=warmup_tokens, progress=progress, costs=costs)
    settings = {
        "target": str(target) if not isinstance(target, Model) else type(target).__name__,
        "dtype": str(model.get_input_embeddings().weight.dtype).removeprefix("torch."), "quantize": quantize,
        "pack": pack, "compile": compile, "static_verify": static_verify,
        "static_draft": static_draft,
        "device": str(input_device(model)), "dataset": label, "num_prompts": len(prompt_list),
        "prompt_ids": [p.id for p in prompt_list], "methods": list(method_map), "max_new_tokens": max_new_tokens,
        "turns": turns, "temperature": temperature, "top_k": top_k, "top_p": top_p, "repeats": repeats,
        "draft": None if draft is None else (str(draft) if not isinstance(draft, Model) else type(draft).__name__),
        "draft_quantize": draft_quantize, "num_draft": num_draft, "head": None if head is None else str(head),
        "exit_layer": exit_layer, "draft_vocab": draft_vocab,
        "datastore": None if datastore is None else repr(datastore), "max_nodes": max_nodes,
        "tree": tree, "acceptance": acceptance, "predict": predict,
        "warmup_tokens": warmup_tokens, "eos_token_id": tokenizer.eos_token_id,
        "constraint": None if decoding.constraint is None else decoding.constraint.source,
    }
    meta = {
        **environment(list(argv) if argv is not None else None), "settings": settings,
        "seeds": {"seed": seed, "rule": f"seed + {SEED_STRIDE} * prompt_index + 101 * repeat + turn"},
        "load_average": {"before": load_before, "after": load_average()},
        "memory_probe": PeakMemory(input_device(model)).method,
        "method_reprs": {name: repr(method) for name, method in method_map.items()},
        "recipes": {name: repr(recipe) for name, recipe in recipe_map.items()},
        "auto": None if chosen is None else {"reason": chosen.reason, "expected_speedup": chosen.expected_speedup},
    }
    results = BenchResults(results=tuple(summaries), prompts=tuple(rows), meta=meta)
    if json_path is not None:
        results.write_json(json_path)
    if plot_dir is not None:
        write_plots(results.results, plot_dir, title=heading(meta))
    return results
