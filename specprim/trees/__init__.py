"""Tree shapes used by model-based drafters."""

from specprim.trees._base import TreeBuilder, TreeDraftModel
from specprim.trees._chain import Chain

__all__ = ["Chain", "TreeBuilder", "TreeDraftModel"]
