"""An independent small language model as the drafter (Leviathan et al., Chen et al.)."""

from __future__ import annotations

from transformers import PreTrainedModel

from specprim.drafters._tree_drafter import TreeDrafter
from specprim.hf import LMDraftModel
from specprim.trees import Chain, TreeBuilder


class ModelDrafter(TreeDrafter):
    """Drafts with a small Hugging Face causal LM that shares the target's tokenizer, in any tree shape.

    The tree builder decides the q-contract: ``Chain`` samples (``"iid"``, with the draft's transformed
    distribution as ``q``) or takes the argmax under greedy (``"deterministic"``); static and dynamic trees
    take top-k tokens (``"deterministic"``). The draft model keeps its own KV cache, reused across steps by
    longest common prefix; frontier nodes are expanded in one batched forward with a tree mask. See
    `LMDraftModel` for vocabulary handling.
    """

    def __init__(
        self, model: PreTrainedModel, tree: TreeBuilder | None = None, unknown_token_id: int | None = None
    ) -> None:
        super().__init__(LMDraftModel(model, unknown_token_id), Chain(4) if tree is None else tree)

    def __repr__(self) -> str:
        return f"ModelDrafter({type(self.model.model).__name__}, tree={self.tree!r})"
