"""The reference speculative decoding loop: draft, verify in one target forward, accept, commit."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from transformers import GenerationConfig

from specprim._batch import batch_generate, wants_batch
from specprim._stats import GenerateOutput
from specprim._step import (
    AcceptanceRule,
    Row,
    check_budget,
    check_decodes,
    speculative_step,
    stop_token_ids,
)
from specprim._types import TargetFeatures
from specprim.constraints import Constraint
from specprim.drafters import Drafter
from specprim.hf import Target, as_target
from specprim.sampling import SamplingConfig


class FromModel(enum.Enum):
    """The default of ``eos_token_id`` and ``pad_token_id``: take the value from the generation config, as
    ``model.generate`` does (``None``, passed explicitly, means no such token)."""

    FROM_MODEL = "from the generation config"


FROM_MODEL = FromModel.FROM_MODEL


class Buildable(Protocol):
    """What ``speculative_generate(recipe=...)`` takes: something that builds a verifier and a method (drafter and
    acceptance rule) for a target, e.g. :class:`specprim.recipes.Recipe`."""

    def build(self, model: torch.nn.Module) -> Any: ...


def speculative_generate(
    target: torch.nn.Module | Target,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    drafter: Drafter | Sequence[Drafter] | None = None,
    acceptance: AcceptanceRule | None = None,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None | FromModel = FROM_MODEL,
    generator: torch.Generator | None = None,
    streamer: object | None = None,
    pad_token_id: int | None | FromModel = FROM_MODEL,
    recipe: Buildable | None = None,
    generation_config: GenerationConfig | None = None,
    constraint: Constraint | None = None,
) -> GenerateOutput:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (1, T) with speculative decoding.

    Each step: ``drafter`` proposes a tree rooted at the last committed token, the target scores
    ``[root] + tree`` in one forward, ``acceptance`` picks the accepted path and the next token, and the target's
    KV cache keeps only that path. Temperature, top-k and top-p are applied identically to target and draft
    logits; ``temperature=0`` is greedy. With a lossless rule the output is distributed exactly as sampling
    from the target with those transforms (greedy: identical to greedy decoding, up to floating-point ties).

    Generation stops after ``max_new_tokens`` tokens or right after the first ``eos_token_id``, even inside an
    accepted block. ``generator`` is the only source of randomness (it must live on the target's input device).
    ``streamer`` receives the prompt, then each step's new tokens, like ``model.generate``'s streamer.

    ``recipe`` (a :class:`specprim.recipes.Recipe`, or anything whose ``build(target)`` gives a ``verifier`` and a
    ``method``) replaces ``drafter`` and ``acceptance``: the run is the recipe's, on ``target`` loaded as it says.

    ``eos_token_id`` and ``pad_token_id`` not passed come, as in ``model.generate``, from ``generation_config``
    (a ``transformers.GenerationConfig``), by default the target model's own ``generation_config``; passing
    ``eos_token_id=None`` stops at no token. A ``generation_config`` passed explicitly also gives the sampling when
    its ``do_sample`` is on and ``temperature`` is not given (the model's own config never switches sampling on:
    ``temperature`` defaults to greedy). A one-row ``attention_mask``
    is a batch of one: its left padding is dropped and the call returns a ``GenerateOutput``, like a call without
    it.

    ``target`` is the Hugging Face causal LM, or a :class:`specprim.hf.Target` verifying on it (e.g. a
    :class:`specprim.hf.StaticTarget`: a static KV cache and padded trees, optionally compiled; see
    ``docs/generate.md``); :func:`specprim.hf.as_target` makes the one the loop uses.

    Batches: with ``B > 1``, an ``attention_mask`` (B, T) (left padding) or a list of drafters (one per row),
    rows are generated with ragged acceptance and one batched target forward per step, and the result is a
    ``BatchGenerateOutput`` right-padded with ``pad_token_id`` (see ``docs/batch.md``).

    ``constraint`` (a :class:`specprim.constraints.Constraint`, e.g. a ``GrammarConstraint`` from a JSON schema)
    restricts the output: the target's logits are masked to the allowed tokens at every position, drafts outside
    them are pruned before verification and the draft ``q`` is masked the same way, so a lossless rule samples
    exactly the constrained target; generation also stops once the constraint is complete (see
    ``docs/structured.md``). One sequence only.

    Raises ``ValueError`` for an empty prompt, a negative budget, an invalid sampling setting,
    prompt + budget over the model's context, a tree whose ``q`` or tokens do not fit the target's vocabulary,
    or a greedy-only rule under sampling; ``FloatingPointError`` for NaN or +inf target logits.
    """
    config = generation_config or _model_generation_config(target)
    if eos_token_id is FROM_MODEL:
        eos_token_id = None if config is None else config.eos_token_id
    if pad_token_id is FROM_MODEL:
        pad_token_id = None if config is None else config.pad_token_id
    if generation_config is not None and generation_config.do_sample and temperature == 0:
        temperature = generation_config.temperature if generation_config.temperature is not None else 1.0
        top_k = top_k if top_k is not None else (generation_config.top_k or None)
        top_p = top_p if top_p is not None else generation_config.top_p
    input_ids, attention_mask = _one_unpadded_row(input_ids, attention_mask, drafter)
    if recipe is not None:
        if drafter is not None or acceptance is not None:
            raise ValueError("pass a recipe, or a drafter and an acceptance rule, not both")
        built = recipe.build(target)
        return built.method.generate(
            built.verifier, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, generator=generator, streamer=streamer,
            pad_token_id=pad_token_id, constraint=constraint,
        )
    if drafter is None or acceptance is None:
        raise ValueError("speculative_generate needs a drafter and an acceptance rule, or a recipe")

    if wants_batch(input_ids, attention_mask, drafter):
        if constraint is not None:
            raise ValueError("a constraint applies to one sequence; generate the rows of a batch one at a time")
        if not isinstance(target, torch.nn.Module):
            raise ValueError(f"a {type(target).__name__} decodes one sequence at a time; pass the model itself "
                             "for batches")
        return batch_generate(
            target, input_ids, attention_mask, drafter=drafter, acceptance=acceptance, max_new_tokens=max_new_tokens,
            temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, generator=generator,
            streamer=streamer, pad_token_id=pad_token_id,
        )
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    verifier = as_target(target)
    ids = _check_prompt(input_ids).to(verifier.device)  # (1, T)
    check_budget(max_new_tokens)
    check_decodes(acceptance, [drafter], sampling)
    verifier.check_length(ids.shape[1] + max_new_tokens)
    layers = tuple(getattr(drafter, "feature_layers", ()))
    row = Row(ids=ids, prompt_length=ids.shape[1], budget=max_new_tokens, drafter=drafter, layers=layers,
              constraint=None if constraint is None else constraint.begin())
    if streamer is not None:
        streamer.put(ids.cpu())
    if max_new_tokens > 0:
        hidden = verifier.start(ids, layers)  # (1, T - 1, H) each
        row.features = TargetFeatures(hidden_states=hidden, token_ids=ids[:, :-1], start=0) if layers else None
    stop_ids = stop_token_ids(eos_token_id)
    while row.remaining > 0 and not row.finished:
        (new,) = speculative_step(
            [row], verify=lambda roots, trees: verifier.verify(roots, trees[0], layers),
            commit=lambda verdicts: verifier.commit(verdicts[0].path, verdicts[0].num_accepted),
            acceptance=acceptance, sampling=sampling, vocab_size=verifier.vocab_size, device=verifier.device,
            layers=layers, generator=generator, stop_ids=stop_ids,
        )
        if streamer is not None:
            streamer.put(new.cpu())
    if streamer is not None:
        streamer.end()
    return GenerateOutput(sequences=row.ids, stats=row.stats)


def _one_unpadded_row(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      drafter: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A (1, T) prompt with a (1, T) mask and one drafter, as the same prompt without the mask's left padding and
    without a mask (the single-sequence path); anything else as it is. Raises ``ValueError`` for a one-row mask
    with holes after its first kept position."""
    if (attention_mask is None or isinstance(drafter, (list, tuple)) or not isinstance(input_ids, torch.Tensor)
            or input_ids.dim() != 2 or input_ids.shape[0] != 1 or attention_mask.shape != input_ids.shape):
        return input_ids, attention_mask
    keep = attention_mask[0].bool()  # (T,)
    first = int(keep.int().argmax()) if bool(keep.any()) else keep.numel()
    if not bool(keep[first:].all()):
        raise ValueError("attention_mask must be left padding (zeros, then ones) for a batch of one")
    return input_ids[:, first:], None


def _check_prompt(input_ids: torch.Tensor) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a (B, T) tensor of token ids")
    if input_ids.dtype != torch.long:
        raise ValueError(f"input_ids must be torch.long, got {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: speculative decoding needs at least one token")
    return input_ids


def _model_generation_config(target: object) -> GenerationConfig | None:
    """The ``generation_config`` of ``target``, or of the model a verifier wraps; ``None`` when it has none."""
    for owner in (target, getattr(target, "model", None)):
        config = getattr(owner, "generation_config", None)
        if isinstance(config, GenerationConfig):
            return config
    return None


