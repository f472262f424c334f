"""Named speculative-decoding methods as short compositions of primitives."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from specprim._loop import GenerateOutput, speculative_generate
from specprim.acceptance import AcceptanceRule, SpeculativeSampling
from specprim.drafters import Drafter, ModelDrafter, PromptLookup
from specprim.trees import Chain


@dataclasses.dataclass(frozen=True)
class Method:
    """A drafter and an acceptance rule: everything :func:`specprim.speculative_generate` needs."""

    drafter: Drafter
    acceptance: AcceptanceRule

    def generate(self, target: torch.nn.Module, input_ids: torch.Tensor, **kwargs: Any) -> GenerateOutput:
        """``speculative_generate(target, input_ids, drafter=..., acceptance=..., **kwargs)``."""
        return speculative_generate(
            target, input_ids, drafter=self.drafter, acceptance=self.acceptance, **kwargs
        )


def leviathan(draft_model: torch.nn.Module, k: int = 4) -> Method:
    """Speculative sampling with an independent small LM drafting a chain of ``k`` (Leviathan et al., 2023)."""
    return Method(drafter=ModelDrafter(draft_model, tree=Chain(k)), acceptance=SpeculativeSampling())


def prompt_lookup(max_ngram: int = 3, num_tokens: int = 8) -> Method:
    """Prompt-lookup decoding: n-gram matches over the context as a deterministic chain, verified losslessly."""
    return Method(
        drafter=PromptLookup(max_ngram=max_ngram, num_tokens=num_tokens), acceptance=SpeculativeSampling()
    )


def from_name(
    name: str, *, target: torch.nn.Module, draft: torch.nn.Module | None = None, num_draft: int | None = None
) -> Method:
    """Build the preset called ``name`` (see :data:`NAMES`) for ``target``: what command-line tools use.

    ``draft`` is the draft model for ``"leviathan"``; ``num_draft`` overrides the preset's draft length.
    Raises ``ValueError`` for an unknown name or a missing draft model.
    """
    options = {} if num_draft is None else {"num_draft": num_draft}
    if name not in _BY_NAME:
        raise ValueError(f"unknown method {name!r}; known: {sorted(_BY_NAME)}")
    return _BY_NAME[name](target=target, draft=draft, **options)


def _leviathan_by_name(*, target, draft, num_draft: int = 4) -> Method:
    if draft is None:
        raise ValueError("method 'leviathan' needs a draft model (a small LM with the target's tokenizer)")
    return leviathan(draft, k=num_draft)


def _prompt_lookup_by_name(*, target, draft, num_draft: int = 8) -> Method:
    return prompt_lookup(num_tokens=num_draft)


_BY_NAME = {"leviathan": _leviathan_by_name, "prompt-lookup": _prompt_lookup_by_name}
NAMES: tuple[str, ...] = tuple(sorted(_BY_NAME))

__all__ = ["NAMES", "Method", "from_name", "leviathan", "prompt_lookup"]
