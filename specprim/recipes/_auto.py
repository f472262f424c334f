"""Named recipes and ``auto``: the recipe a target should run on this machine.

Each shipped head carries the recipes tuned with it (``recipes.toml`` beside its weights, one table per decoding
mode: ``greedy`` and ``sampled``); they are named ``<head>:<mode>``, e.g. ``smollm2-135m-instruct-eagle3:greedy``.
:func:`auto` picks the one for a known target and the decoding mode; a target without one gets prompt lookup
(training-free, lossless, and never far from plain decoding on this CPU's eager path).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from specprim import models
from specprim.recipes._recipe import Recipe

MODES = ("greedy", "sampled")


@dataclasses.dataclass(frozen=True)
class Choice:
    """What :func:`auto` chose: the ``recipe``, the speedup over plain ``model.generate`` it reached when it was
    tuned (``expected_speedup``, ``None`` when unknown), and ``reason``, one line saying why."""

    recipe: Recipe
    expected_speedup: float | None
    reason: str


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


def auto(target: str | Any, *, temperature: float = 0.0, dtype: str | None = None) -> Choice:
    """The recipe for ``target`` (a known model name, or a model :func:`specprim.models.load` loaded by one) under
    greedy (``temperature == 0``) or sampled decoding.

    A known target with a tuned head gets that head's recipe for the mode. ``dtype`` (default: the recipe's)
    replaces the recipe's dtype; packing stays only in bfloat16, and the tuned speedup is then not known. Any
    other target gets prompt lookup in ``dtype`` (default ``float32``). Every choice is lossless.
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
        if dtype is not None and dtype != recipe.dtype:
            recipe = dataclasses.replace(recipe, dtype=dtype, pack=recipe.pack and dtype == "bfloat16")
            reason += f", run in {dtype} (tuned in bfloat16)"
            speedup = None
        return Choice(recipe=recipe, expected_speedup=speedup, reason=reason)
    recipe = Recipe(method="prompt-lookup", dtype=dtype or "float32")
    return Choice(recipe=recipe, expected_speedup=None,
                  reason=f"no recipe ships for {name or 'this model'}: prompt lookup, which pays off when the "
                         "answer copies the prompt (train a head with `specprim train` for more)")
