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


__all__ = ["Method", "leviathan", "prompt_lookup"]
