"""``specprim.generate``: text in, text out, with the recipe ``auto`` picks (or any other)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from specprim._loop import GenerateOutput
from specprim.hf import chat_input_ids
from specprim.recipes import Built, Recipe, auto, load_draft, load_recipe, load_target

SESSION_CACHE_LENGTH = 2048  # static caches start this long (they grow, and recompile, past it)


@dataclasses.dataclass(frozen=True)
class TextGeneration:
    """``text``: the decoded continuation; ``output``: the tokens and per-step stats; ``recipe``: what ran."""

    text: str
    output: GenerateOutput
    recipe: Recipe


def resolve_recipe(recipe: Recipe | str, target: str, temperature: float) -> Recipe:
    """``recipe`` itself, ``auto``'s choice for ``"auto"``, or the shipped recipe / TOML file it names."""
    if isinstance(recipe, Recipe):
        return recipe
    if recipe == "auto":
        return auto(target, temperature=temperature).recipe
    return load_recipe(recipe)


@functools.lru_cache(maxsize=2)
def _session(target: str, recipe: Recipe) -> tuple[Any, Built]:
    """The tokenizer and built recipe for ``target``, kept for the next calls (compiled shapes stay warm)."""
    model, tokenizer = load_target(recipe, target)
    built = recipe.build(model, tokenizer, draft=load_draft(recipe, tokenizer), cache_length=SESSION_CACHE_LENGTH)
    return tokenizer, built


def generate(
    prompt: str,
    *,
    target: str = "smollm2-135m-instruct",
    recipe: Recipe | str = "auto",
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    streamer: Any = None,
) -> TextGeneration:
    """Answer ``prompt`` (one user turn, in the target's chat template) with speculative decoding.

    ``target``: a known model name, a local path or a hub id. ``recipe``: ``"auto"`` (the recipe tuned for the
    target and the decoding mode, else prompt lookup), a shipped recipe's name, a TOML file, or a
    :class:`specprim.recipes.Recipe`. The loaded models and compiled shapes are kept for the next call with the same
    target and recipe (the first call of a compiled recipe compiles for about a minute on 2 CPU cores).
    ``streamer`` (e.g. ``transformers.TextStreamer``) receives the tokens as they are accepted.
    Lossless recipes give what the target samples (greedy: what ``model.generate`` gives on the same weights).
    """
    chosen = resolve_recipe(recipe, target, temperature)
    tokenizer, built = _session(target, chosen)
    ids = chat_input_ids(tokenizer, prompt)
    generator = torch.Generator().manual_seed(seed)
    output = built.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            eos_token_id=tokenizer.eos_token_id, generator=generator, streamer=streamer)
    text = tokenizer.decode(output.sequences[0, ids.shape[1]:], skip_special_tokens=True)
    return TextGeneration(text=text, output=output, recipe=chosen)
