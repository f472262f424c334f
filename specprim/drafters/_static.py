"""Drafters switched to static shapes: each draft model a static-cache, ``torch.compile``d counterpart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specprim.drafters._base import Drafter
from specprim.drafters._draft_lm import LMDraftModel
from specprim.drafters._eagle_draft import EagleDraftModel
from specprim.drafters._eagle_static import StaticEagleDraftModel
from specprim.drafters._model import ModelDrafter
from specprim.drafters._static_draft_lm import StaticLMDraftModel
from specprim.drafters._tree_drafter import TreeDrafter
from specprim.drafters._union import UnionDrafter

__all__ = ["static_drafting"]


def _static_eagle(model: EagleDraftModel, compile: bool, min_cache_length: int) -> StaticEagleDraftModel:  # noqa: A002
    return StaticEagleDraftModel(model.head, compile=compile, min_cache_length=min_cache_length)


def _static_lm(lm: LMDraftModel, compile: bool, min_cache_length: int) -> StaticLMDraftModel:  # noqa: A002
    return StaticLMDraftModel(lm.model, compile=compile, min_cache_length=min_cache_length,
                              unknown_token_id=lm.unknown_token_id, d2t=lm.d2t)


def _switch_model(model_class: type, build: Callable[[Any, bool, int], Any]) -> Callable[[Any, bool, int], Drafter]:
    """How a drafter holding ``model`` and ``tree`` switches: a ``model`` of exactly ``model_class`` is replaced by
    ``build(model, compile, min_cache_length)`` in a new ``TreeDrafter``; any other model stays as it is."""

    def switch(drafter: Any, compile: bool, min_cache_length: int) -> Drafter:  # noqa: A002
        if type(drafter.model) is not model_class:
            return drafter
        model = build(drafter.model, compile, min_cache_length)
        if compile:
            model.compile_sizes()
        return TreeDrafter(model, drafter.tree)

    return switch


def _static_union(drafter: UnionDrafter, compile: bool, min_cache_length: int) -> Drafter:  # noqa: A002
    return UnionDrafter(*(static_drafting(part, compile=compile, min_cache_length=min_cache_length)
                          for part in drafter.drafters), max_nodes=drafter.max_nodes)


STATIC_DRAFTERS: dict[type, Callable[[Any, bool, int], Drafter]] = {
    TreeDrafter: _switch_model(EagleDraftModel, _static_eagle),
    ModelDrafter: _switch_model(LMDraftModel, _static_lm),
    UnionDrafter: _static_union,
}
"""Drafter class (or a base of it) -> how it switches to static shapes; drafters of other classes stay as they are.
A new static counterpart is one entry (or one ``_switch_model``)."""


def static_drafting(drafter: Drafter, *, compile: bool = True, min_cache_length: int = 0) -> Drafter:  # noqa: A002
    """``drafter`` with every EAGLE part drafting through a :class:`StaticEagleDraftModel` (a ``TreeDrafter`` over an
    :class:`EagleDraftModel`) and every draft language model of a :class:`ModelDrafter` (an :class:`LMDraftModel`)
    through a :class:`StaticLMDraftModel`, alone or inside a :class:`UnionDrafter`; other
    drafters (``EarlyExit``, a draft model with another tokenizer, ...) are returned as they are. The switch is looked
    up by class in :data:`STATIC_DRAFTERS`.

    With ``compile=True`` the new models compile their padded sizes here (``compile_sizes``), so give
    ``min_cache_length`` >= the longest prompt plus its budget plus 64. The heads and draft models are shared, not
    copied (use the new drafter instead of the old one, not beside it).
    """
    switch = next((STATIC_DRAFTERS[cls] for cls in type(drafter).__mro__ if cls in STATIC_DRAFTERS), None)
    return drafter if switch is None else switch(drafter, compile, min_cache_length)
