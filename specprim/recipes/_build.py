"""From a :class:`Recipe` to loaded models, a verifier and a :class:`specprim.presets.Method`."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import torch

from specprim import models, presets
from specprim.drafters import CrossVocab
from specprim.hf import StaticTarget, check_tokenizers_compatible

if TYPE_CHECKING:
    from specprim.recipes._recipe import Recipe

Model = torch.nn.Module


@dataclasses.dataclass(frozen=True)
class Built:
    """What a recipe becomes for one loaded target: ``verifier`` (the model, or a :class:`specprim.hf.StaticTarget`
    of it) and ``method`` (drafter and acceptance rule). ``method.generate(verifier, ids, ...)`` decodes."""

    verifier: Model | StaticTarget
    method: presets.Method

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        """``method.generate(verifier, input_ids, **kwargs)`` (see :func:`specprim.speculative_generate`)."""
        return self.method.generate(self.verifier, input_ids, **kwargs)


def load_target(recipe: Recipe, target: str | os.PathLike[str]) -> tuple[Model, Any]:
    """The target model and tokenizer, loaded as ``recipe`` says (dtype, quantization, packing, compiling)."""
    return models.load(target, dtype=getattr(torch, recipe.dtype), quantize=recipe.quantize, pack=recipe.pack,
                       compile=recipe.compile)


def load_draft(recipe: Recipe, tokenizer: Any) -> Model | None:
    """The recipe's draft model (``None`` without one), loaded like the target; a draft with another tokenizer
    drafts through the tokens both share (see :func:`cross_vocab`)."""
    if recipe.draft is None:
        return None
    draft, draft_tokenizer = models.load(recipe.draft, dtype=getattr(torch, recipe.dtype),
                                         quantize=recipe.draft_quantize, pack=recipe.pack, compile=recipe.compile)
    cross_vocab(tokenizer, draft_tokenizer)  # ValueError now for tokenizers that share too little
    return draft


# the last pair's map: loading a draft checks the pair and building the recipe uses it, ~2 s each to build
_last_pair: dict[str, Any] = {}


def cross_vocab(tokenizer: Any, draft_tokenizer: Any) -> CrossVocab | None:
    """``None`` when the draft's tokenizer is the target's (or a prefix of it), else their :class:`CrossVocab`
    (``ValueError`` when they share too little). The same target tokenizer object with a draft tokenizer of the same
    name and size reuses the map built last."""
    key = (draft_tokenizer.name_or_path, len(draft_tokenizer))
    if _last_pair.get("tokenizer") is tokenizer and _last_pair.get("key") == key:
        return _last_pair["vocab"]
    try:
        check_tokenizers_compatible(tokenizer, draft_tokenizer)
        vocab = None
    except ValueError:
        vocab = CrossVocab(tokenizer, draft_tokenizer)
    _last_pair.update(tokenizer=tokenizer, key=key, vocab=vocab)
    return vocab
