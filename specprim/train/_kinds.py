"""The registry of trained-draft kinds (``specprim train KIND``): what each kind builds, trains, loads and saves.

A kind is a :class:`TrainKind`: a builder of a fresh draft module, a builder of the objective that trains it, a
check that a saved head (``init_from``, loaded with :func:`specprim.models.load_head`) is of the kind, and the
target features it needs; the objective's ``save_pretrained`` saves the trained module. Adding a kind takes its own
module (head and objective) plus one entry in :data:`REGISTRY`, and its name in
:data:`specprim._names.TRAIN_KINDS` (read by the command line before torch is imported; a test checks both agree).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specprim.drafters import EagleHead, MedusaHeads, MTPHead, ParallelHead, count_tokens, default_feature_layers
from specprim.train._features import FeatureDataset, check_shard
from specprim.train._lm import DistillObjective
from specprim.train._medusa import MedusaObjective
from specprim.train._objective import EagleObjective, MTPObjective
from specprim.train._parallel import ParallelObjective
from specprim.train._protocol import Objective

__all__ = ["REGISTRY", "KindInputs", "TrainKind", "greedy_token_counts", "train_kind"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class KindInputs:
    """What a kind's builders may read: the target, the feature cache and the settings of ``train_drafter``."""

    target: Any
    dataset: FeatureDataset
    draft: Any = None
    draft_vocab_size: int | None = None
    num_heads: int = 4
    steps: int | None = None
    loss_on: str = "all"
    align: bool = False
    head_layers: int | None = None

    @property
    def num_layers(self) -> int:
        """The target's number of decoder layers ``L`` (``output_hidden_states[L]`` is after the final norm)."""
        return int(self.target.config.get_text_config().num_hidden_layers)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainKind:
    """One trained-draft kind.

    Attributes:
        fresh: a randomly initialised draft module (or the draft model given) for the inputs.
        objective: the objective that trains a draft module (fresh or loaded).
        is_saved_kind: whether a loaded head is one of this kind (``None``: the kind cannot continue from a saved
            head, ``init_from`` is refused).
        own_layers: the ``output_hidden_states`` indices the kind reads besides the last one, from ``L``.
        unrolled: the kind trains unrolled draft depths (``align`` applies).
        resize: a saved head (``init_from``) made as large as the inputs ask: decoder layers added up to
            ``head_layers``, its draft vocabulary widened to ``draft_vocab_size``; ``None``: the kind's heads have
            neither to choose (``head_layers`` is refused, ``draft_vocab_size`` is the saved head's).
    """

    fresh: Callable[[KindInputs], nn.Module]
    objective: Callable[[nn.Module, KindInputs], Objective]
    is_saved_kind: Callable[[nn.Module], bool] | None = None
    own_layers: Callable[[int], tuple[int, ...]] = lambda num_layers: ()
    unrolled: bool = False
    resize: Callable[[nn.Module, KindInputs], nn.Module] | None = None


def greedy_token_counts(dataset: FeatureDataset, vocab_size: int) -> torch.Tensor:
    """(V,) how often each id is the target's greedy next token in the training examples of the cache (what a draft
    head must predict; the held-out examples are left out)."""
    from safetensors import safe_open

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for shard, tokens in zip(dataset.manifest["shards"], dataset.train_tokens_per_file(), strict=True):
        if not tokens:
            continue
        check_shard(dataset.directory, shard)  # its size (and hash, when small): a damaged shard raises by name
        with safe_open(str(dataset.directory / shard["file"]), framework="pt") as f:
            counts += count_tokens([f.get_slice("topk_ids")[:tokens, 0]], vocab_size)
    return counts


def _fresh_eagle(version: int) -> Callable[[KindInputs], nn.Module]:
    def build(inputs: KindInputs) -> nn.Module:
        vocab = int(inputs.target.get_output_embeddings().weight.shape[0])
        counts = greedy_token_counts(inputs.dataset, vocab) if inputs.draft_vocab_size else None
        return EagleHead.from_target(inputs.target, version=version, draft_vocab_size=inputs.draft_vocab_size,
                                     token_counts=counts, num_layers=inputs.head_layers or 1,
                                     generator=torch.Generator().manual_seed(0))

    return build


def _resize_eagle(head: nn.Module, inputs: KindInputs) -> nn.Module:
    """``head`` grown to ``head_layers`` decoder layers and (EAGLE-3) widened to ``draft_vocab_size`` ids, the
    added ids the most frequent greedy tokens of the dataset; either left as it is when not asked for."""
    if inputs.head_layers is not None and inputs.head_layers != head.config.num_layers:
        head = head.grown(inputs.target, inputs.head_layers, generator=torch.Generator().manual_seed(0))
    if inputs.draft_vocab_size is not None and inputs.draft_vocab_size != head.config.draft_vocab_size:
        counts = greedy_token_counts(inputs.dataset, head.config.vocab_size)
        head = head.widened(inputs.target, inputs.draft_vocab_size, counts)
    return head


def _eagle_objective(head: nn.Module, inputs: KindInputs) -> Objective:
    return EagleObjective(head, steps=inputs.steps, loss_on=inputs.loss_on, align=inputs.align)


def _is_eagle(version: int) -> Callable[[nn.Module], bool]:
    return lambda head: isinstance(head, EagleHead) and head.config.version == version


def _mtp_objective(head: nn.Module, inputs: KindInputs) -> Objective:
    return MTPObjective(head, steps=inputs.steps or 3, loss_on=inputs.loss_on, num_target_layers=inputs.num_layers,
                        align=inputs.align)


def _fresh_medusa(inputs: KindInputs) -> nn.Module:
    """Medusa heads on the target's LM head, their residual blocks at the identity (as in Medusa-1)."""
    heads = MedusaHeads.from_target(inputs.target, num_heads=inputs.num_heads, share_target_head=True)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block:
                layer.linear.weight.zero_()
                layer.linear.bias.zero_()
    return heads


def _medusa_objective(heads: nn.Module, inputs: KindInputs) -> Objective:
    return MedusaObjective(heads, num_target_layers=inputs.num_layers, loss_on=inputs.loss_on)


def _given_draft(inputs: KindInputs) -> nn.Module:
    if inputs.draft is None:
        raise ValueError("kind 'distill' needs a draft model to train")
    return inputs.draft


def _distill_objective(draft: nn.Module, inputs: KindInputs) -> Objective:
    vocab = int(inputs.target.get_output_embeddings().weight.shape[0])
    return DistillObjective(draft, loss_on=inputs.loss_on, vocab_size=vocab)


PARALLEL_DRAFT = 4
"""Positions a fresh parallel head drafts per forward when ``steps`` is not given."""


def _fresh_parallel(inputs: KindInputs) -> nn.Module:
    """A random :class:`ParallelHead` drafting ``steps`` (default 4) positions, its EAGLE-3 part built as kind
    ``eagle3`` builds one (the most frequent greedy tokens as its draft vocabulary)."""
    eagle = _fresh_eagle(3)(inputs)
    torch.manual_seed(0)  # the placeholders
    return ParallelHead(eagle, inputs.steps or PARALLEL_DRAFT)


def _parallel_objective(head: nn.Module, inputs: KindInputs) -> Objective:
    """A saved EAGLE-3 head (``init_from``) becomes the EAGLE-3 part of a parallel head of ``steps`` positions."""
    if isinstance(head, EagleHead):
        torch.manual_seed(0)  # the placeholders
        head = ParallelHead.from_eagle(head, inputs.steps or PARALLEL_DRAFT)
    elif inputs.steps is not None and inputs.steps != head.num_draft:
        raise ValueError(f"the saved parallel head drafts {head.num_draft} positions; steps={inputs.steps} differs")
    return ParallelObjective(head, loss_on=inputs.loss_on, align=inputs.align)


REGISTRY: dict[str, TrainKind] = {
    "eagle3": TrainKind(fresh=_fresh_eagle(3), objective=_eagle_objective, is_saved_kind=_is_eagle(3),
                        own_layers=lambda num_layers: default_feature_layers(3, num_layers), unrolled=True,
                        resize=_resize_eagle),
    "eagle": TrainKind(fresh=_fresh_eagle(1), objective=_eagle_objective, is_saved_kind=_is_eagle(1), unrolled=True,
                       resize=_resize_eagle),
    "medusa": TrainKind(fresh=_fresh_medusa, objective=_medusa_objective,
                        is_saved_kind=lambda head: isinstance(head, MedusaHeads)),
    "mtp": TrainKind(fresh=lambda inputs: MTPHead.from_target(inputs.target), objective=_mtp_objective,
                     is_saved_kind=lambda head: isinstance(head, MTPHead), unrolled=True),
    "distill": TrainKind(fresh=_given_draft, objective=_distill_objective),
    "parallel": TrainKind(fresh=_fresh_parallel, objective=_parallel_objective,
                          is_saved_kind=lambda head: isinstance(head, ParallelHead) or _is_eagle(3)(head),
                          own_layers=lambda num_layers: default_feature_layers(3, num_layers), unrolled=True),
}
"""Kind name -> :class:`TrainKind`, in the order of :data:`specprim._names.TRAIN_KINDS`."""


def train_kind(name: str) -> TrainKind:
    """The registered kind called ``name``; ``ValueError`` naming the known ones otherwise."""
    if name not in REGISTRY:
        raise ValueError(f"unknown kind {name!r}; one of {tuple(REGISTRY)}")
    return REGISTRY[name]
