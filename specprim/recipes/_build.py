"""From a :class:`Recipe` to loaded models, a verifier and a :class:`specprim.presets.Method`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from specprim import models, presets
from specprim.acceptance import RULES
from specprim.drafters import static_drafting
from specprim.hf import StaticTarget, check_tokenizers_compatible
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
    """The recipe's draft model (``None`` without one), loaded like the target; its tokenizer must match."""
    if recipe.draft is None:
        return None
    draft, draft_tokenizer = models.load(recipe.draft, dtype=getattr(torch, recipe.dtype),
                                         quantize=recipe.draft_quantize, pack=recipe.pack, compile=recipe.compile)
    check_tokenizers_compatible(tokenizer, draft_tokenizer)
    return draft


def build(recipe: Recipe, model: Model, tokenizer: Any = None, *, draft: Model | None = None,
          cache_length: int = 0, prefill_chunk: int | None = None) -> Built:
    """The verifier and method ``recipe`` names, for ``model`` already loaded as the recipe says.

    ``tokenizer``: the target's (needed to load datastores); ``draft``: the loaded draft model of a ``leviathan``
    part; ``cache_length``: the least static cache length (static verifier and drafting), e.g. the longest prompt
    plus the budget, so that no cache grows (and recompiles) while decoding; ``prefill_chunk``: the static verifier's
    (:class:`specprim.hf.StaticTarget`; ``0``, an eager prefill, compiles one graph less for a single prompt).
    Raises ``ValueError`` when something the recipe needs is missing.
    """
    datastore = None
    if recipe.datastores:
        if tokenizer is None:
            raise ValueError("a recipe with datastores needs the target's tokenizer")
        datastore = models.load_datastore(list(recipe.datastores), tokenizer)
    method = presets.from_name(
        recipe.method, target=model, draft=draft, head=recipe.head, num_draft=recipe.num_draft,
        exit_layer=recipe.exit_layer, tree=recipe.tree, draft_vocab_size=recipe.draft_vocab, datastore=datastore,
        max_nodes=recipe.max_nodes,
    )
    if recipe.acceptance != "speculative":
        method = dataclasses.replace(method, acceptance=RULES[recipe.acceptance]())
    if recipe.static_draft:
        method = dataclasses.replace(method, drafter=static_drafting(method.drafter, min_cache_length=cache_length))
    verifier: Model | StaticTarget = model
    if recipe.verifier != "eager":
        verifier = StaticTarget(model, compile=recipe.verifier == "compiled", min_cache_length=cache_length,
                                prefill_chunk=prefill_chunk, min_padded=recipe.min_padded)
    return Built(verifier=verifier, method=method)
