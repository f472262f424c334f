"""Drafters switched to static shapes: each draft model a static-cache, ``torch.compile``d counterpart."""

from __future__ import annotations

from specprim.drafters._base import Drafter
from specprim.drafters._draft_lm import LMDraftModel
from specprim.drafters._eagle_draft import EagleDraftModel
from specprim.drafters._eagle_static import StaticEagleDraftModel
from specprim.drafters._model import ModelDrafter
from specprim.drafters._static_draft_lm import StaticLMDraftModel
from specprim.drafters._tree_drafter import TreeDrafter
from specprim.drafters._union import UnionDrafter

__all__ = ["static_drafting"]


def static_drafting(drafter: Drafter, *, compile: bool = True, min_cache_length: int = 0) -> Drafter:  # noqa: A002
    """``drafter`` with every EAGLE part drafting through a :class:`StaticEagleDraftModel` (a ``TreeDrafter`` over an
    :class:`EagleDraftModel`) and every draft language model (a ``TreeDrafter`` over a
    :class:`LMDraftModel`, e.g. :class:`ModelDrafter`) through a :class:`StaticLMDraftModel`,
    alone or inside a :class:`UnionDrafter`; other drafters are returned as they are.

    With ``compile=True`` the new models compile their padded sizes here (``compile_sizes``), so give
    ``min_cache_length`` >= the longest prompt plus its budget plus 64. The heads and draft models are shared, not
    copied (use the new drafter instead of the old one, not beside it).
    """
    if isinstance(drafter, UnionDrafter):
        return UnionDrafter(*(static_drafting(part, compile=compile, min_cache_length=min_cache_length)
                              for part in drafter.drafters), max_nodes=drafter.max_nodes)
    if not isinstance(drafter, TreeDrafter):
        return drafter
    model: StaticEagleDraftModel | StaticLMDraftModel
    if type(drafter.model) is EagleDraftModel:
        model = StaticEagleDraftModel(drafter.model.head, compile=compile, min_cache_length=min_cache_length)
    elif isinstance(drafter, ModelDrafter) and isinstance(drafter.model, LMDraftModel):  # not cross-tokenizer
        lm = drafter.model
        model = StaticLMDraftModel(lm.model, compile=compile, min_cache_length=min_cache_length,
                                   unknown_token_id=lm.unknown_token_id, d2t=lm.d2t)
    else:
        return drafter
    if compile:
        model.compile_sizes()
    return TreeDrafter(model, drafter.tree)
