"""Self-speculation by early exit: the target's first layers, final norm and LM head draft for the target."""

from __future__ import annotations

from transformers import PreTrainedModel

from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.drafters._draft_lm import LMDraftModel
from specprim.drafters._tree_drafter import check_tree_parts
from specprim.hf import truncated_view
from specprim.trees import Chain, TreeBuilder


class EarlyExit:
    """Drafts with the target's first ``exit_layer`` decoder layers followed by its final norm and LM head.

    Training-free and weight-free: the draft model (``model``, an :class:`LMDraftModel`) is a view sharing every
    weight with the target (nothing is copied); it keeps its own KV cache for those layers. ``tree`` grows each draft
    from it, as in a :class:`TreeDrafter`. Raises ``ValueError`` unless ``1 <= exit_layer < number of target
    layers``.
    """

    feature_layers: tuple[int, ...] = ()

    def __init__(self, target: PreTrainedModel, exit_layer: int, tree: TreeBuilder | None = None) -> None:
        self.exit_layer = exit_layer
        self.model = LMDraftModel(truncated_view(target, exit_layer))
        self.tree = Chain(4) if tree is None else tree
        check_tree_parts(self.model, self.tree)

    def propose(self, request: DraftRequest) -> DraftTree:
        return self.tree.build(self.model, request)

    def observe(self, verdict: Verdict) -> None:
        """Nothing to do: the model re-synchronises with the committed tokens in its next ``begin``."""

    def __repr__(self) -> str:
        return f"EarlyExit(exit_layer={self.exit_layer}, tree={self.tree!r})"
