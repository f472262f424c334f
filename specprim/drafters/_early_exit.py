"""Self-speculation by early exit: the target's first layers, final norm and LM head draft for the target."""

from __future__ import annotations

from transformers import PreTrainedModel

from specprim.drafters._draft_lm import LMDraftModel
from specprim.drafters._tree_drafter import TreeDrafter
from specprim.hf import truncated_view
from specprim.trees import Chain, TreeBuilder


class EarlyExit(TreeDrafter):
    """Drafts with the target's first ``exit_layer`` decoder layers followed by its final norm and LM head.

    Training-free and weight-free: the draft model is a view sharing every weight with the target (nothing is
    copied); it keeps its own KV cache for those layers. Raises ``ValueError`` unless
    ``1 <= exit_layer < number of target layers``.
    """

    def __init__(self, target: PreTrainedModel, exit_layer: int, tree: TreeBuilder | None = None) -> None:
        self.exit_layer = exit_layer
        super().__init__(LMDraftModel(truncated_view(target, exit_layer)), Chain(4) if tree is None else tree)

    def __repr__(self) -> str:
        return f"EarlyExit(exit_layer={self.exit_layer}, tree={self.tree!r})"
