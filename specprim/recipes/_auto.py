"""Named recipes and ``auto``: the recipe a target should run on this machine.

Each shipped head carries the recipes tuned with it (``recipes.toml`` beside its weights, one table per decoding
mode: ``greedy`` and ``sampled``); they are named ``<head>:<mode>``, e.g. ``smollm2-135m-instruct-eagle3:greedy``.
:func:`auto` picks the one for a known target and the decoding mode; for any other target it measures the
training-free lossless candidates on this machine and keeps the fastest (:mod:`specprim.recipes._measure`, cached
per machine, target, dtype, mode and version).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from specprim import models
from specprim.recipes import _measure
from specprim.recipes._build import load_target
from specprim.recipes._recipe import Recipe

MODES = ("greedy", "sampled")


@dataclasses.dataclass(frozen=True)
class Choice:
    """What :func:`auto` chose: the ``recipe``, the speedup over plain ``model.generate`` it reached when it was
    tuned or measured (``expected_speedup``, ``None`` when unknown), ``basis``, where that number comes from (e.g.
    ``"on MT-bench"``), and ``reason``, one line saying why."""

    recipe: Recipe
    expected_speedup: float | None
    reason: str
    basis: str = ""


def shipped_recipes() -> dict[str, Recipe]:
    """Every recipe shipped with a head, by name (``<head>:<mode>``)."""
    return {name: recipe for name, (recipe, _, _) in _shipped().items()}


def _shipped() -> dict[str, tuple[Recipe, str, dict[str, Any]]]:
    """``name -> (recipe, target, measured)`` of every shipped recipe."""
    found = {}
    for head in models.known_heads():
        info = models.head_info(head)
        for mode, fields in info.get("recipes", {}).items():
            recipe = Recipe.from_dict(fields, where=f"{head}/recipes.toml [{mode}]")
            found[f"{head}:{mode}"] = (recipe, info.get("target", ""), info.get("measured", {}).get(mode, {}))
    return found


def load_recipe(name_or_file: str | os.PathLike[str]) -> Recipe:
    """A shipped recipe by name (:func:`shipped_recipes`), or the recipe in a TOML file. Raises ``ValueError``
    naming the shipped recipes when it is neither."""
    name = os.fspath(name_or_file)
    shipped = shipped_recipes()
    if name in shipped:
        return shipped[name]
    if Path(name).is_file():
        return Recipe.load(name)
    raise ValueError(f"{name!r} is neither a shipped recipe ({', '.join(shipped) or 'none'}) nor a TOML file")


def auto(target: str | Any, *, temperature: float = 0.0, dtype: str | None = None, measure: bool = True) -> Choice:
    """The recipe for ``target`` (a model name, path or hub id, or a model :func:`specprim.models.load` loaded)
    under greedy (``temperature == 0``) or sampled decoding. Every choice is lossless.

    A known target with a tuned head gets that head's recipe for the mode. ``dtype`` (default: the recipe's, or
    ``float32`` on a machine without native bfloat16, e.g. a CPU without AVX512-BF16 or AMX) replaces the recipe's
    dtype; packing stays only in bfloat16, and the tuned speedup is then not known.

    Any other target, with ``measure``: the training-free candidates (:data:`specprim.recipes._measure.CANDIDATES`,
    eager verification, in ``dtype``, default bfloat16 where the machine computes it natively) decode a few
    calibration prompts beside plain ``model.generate``, and the fastest is kept; the choice is cached per machine,
    target, dtype, mode and version, so only the first run measures (tens of seconds for a small model). Without
    ``measure``, or for a model object without a name or path, or one that cannot be loaded: prompt lookup in
    ``dtype`` (default ``float32``), unmeasured.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    name = target if isinstance(target, str) else models.known_name(target)
    mode = "greedy" if temperature == 0 else "sampled"
    for recipe_name, (recipe, tuned_for, measured) in _shipped().items():
        if tuned_for != name or not recipe_name.endswith(f":{mode}"):
            continue
        reason = f"{recipe_name}, tuned for {name}"
        speedup = measured.get("speedup")
        why = "asked for"
        if dtype is None and recipe.dtype == "bfloat16" and _measure.default_dtype() == "float32":
            dtype, why = "float32", "this machine has no native bfloat16"
        if dtype is not None and dtype != recipe.dtype:
            reason += f", run in {dtype} ({why}; tuned in {recipe.dtype})"
            recipe = dataclasses.replace(recipe, dtype=dtype, pack=recipe.pack and dtype == "bfloat16")
            speedup = None
        return Choice(recipe=recipe, expected_speedup=speedup, reason=reason, basis="on MT-bench")
    source = target if isinstance(target, str) else str(getattr(target, "name_or_path", "") or "")
    if measure and source:
        try:
            return _measured(source, mode, temperature, dtype or _measure.default_dtype())
        except OSError as error:
            return _unmeasured(dtype, f"{source} could not be loaded to measure ({error})")
    return _unmeasured(dtype, f"no recipe ships for {name or source or 'this model'}")


def _unmeasured(dtype: str | None, why: str) -> Choice:
    return Choice(recipe=Recipe(method="prompt-lookup", dtype=dtype or "float32"), expected_speedup=None,
                  reason=f"{why}: prompt lookup, unmeasured (train a head with `specprim train` for more)")


def _measured(target: str, mode: str, temperature: float, dtype: str) -> Choice:
    """The fastest candidate measured here for ``target`` in decoding ``mode``: read from the per-machine cache,
    else measured."""
    path = _measure.cache_path(target, models.load_config(target), dtype, mode)
    basis = f"on {len(_measure.CALIBRATION_PROMPTS)} calibration prompts, this machine"
    cached = _measure.read_cached(path)
    if cached is not None:
        recipe, speedup, when = cached
        return Choice(recipe=recipe, expected_speedup=speedup, basis=basis,
                      reason=f"no recipe ships for {target}: the fastest training-free drafter measured here "
                             f"({when}, {path})")
    candidates = _measure.candidates_for(target, dtype)
    model, tokenizer = load_target(candidates[0], target)
    results = _measure.measure(model, tokenizer, candidates, temperature=temperature)
    best = max(results, key=lambda m: m.speedup)
    _measure.write_cached(path, best, results)
    verdict = "" if best.speedup > 1 else " (none beat plain generate here: train a head with `specprim train`)"
    return Choice(recipe=best.recipe, expected_speedup=best.speedup, basis=basis,
                  reason=f"no recipe ships for {target}: measured {len(results)} training-free drafters here, "
                         f"kept the fastest{verdict}; cached in {path}")
