"""An independent small language model as the drafter (Leviathan et al., Chen et al.)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.drafters._cross_vocab import CrossVocab
from specprim.drafters._cross_vocab_lm import CrossVocabDraftModel
from specprim.drafters._draft_lm import LMDraftModel
from specprim.drafters._tree_drafter import check_tree_parts
from specprim.drafters._vocab import draft_vocab
from specprim.hf import vocab_size
from specprim.trees import Chain, TreeBuilder


class ModelDrafter:
    """Drafts with a small Hugging Face causal LM that shares the target's tokenizer, in any tree shape.

    The tree builder decides the q-contract: ``Chain`` samples (``"iid"``, with the draft's transformed
    distribution as ``q``) or takes the argmax under greedy (``"deterministic"``); static and dynamic trees
    take top-k tokens (``"deterministic"``). The draft model keeps its own KV cache, reused across steps by
    longest common prefix; frontier nodes are expanded in one batched forward with a tree mask. It holds that model as
    ``model`` (an :class:`LMDraftModel`) and its ``tree``, and drafts as a :class:`TreeDrafter` does. See
    `LMDraftModel` for vocabulary handling; ``d2t`` (e.g. from :func:`lm_draft_vocab`) restricts the draft to a
    reduced vocabulary (only those LM-head rows are computed). A draft with another tokenizer drafts the tokens
    both tokenizers share when given their ``cross_vocab`` (:class:`CrossVocabDraftModel`; ``d2t`` then holds
    draft ids).
    """

    def __init__(
        self, model: PreTrainedModel, tree: TreeBuilder | None = None, unknown_token_id: int | None = None,
        d2t: torch.Tensor | None = None, cross_vocab: CrossVocab | None = None,
    ) -> None:
        lm = LMDraftModel(model, unknown_token_id, d2t)
        self.model = lm if cross_vocab is None else CrossVocabDraftModel(lm, cross_vocab)
        self.tree = Chain(4) if tree is None else tree
        check_tree_parts(self.model, self.tree)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(getattr(self.model, "feature_layers", ()))

    def propose(self, request: DraftRequest) -> DraftTree:
        return self.tree.build(self.model, request)

    def observe(self, verdict: Verdict) -> None:
        """Nothing to do: the model re-synchronises with the committed tokens in its next ``begin``."""

    def __repr__(self) -> str:
        return f"ModelDrafter({type(self.model.model).__name__}, tree={self.tree!r})"


def lm_draft_vocab(
    model: PreTrainedModel, draft_vocab_size: int, token_counts: torch.Tensor | None = None
) -> torch.Tensor:
    """``d2t`` (V_d,) long for :class:`ModelDrafter`: ``model``'s special ids (BOS, EOS, padding, from its config and
    generation config) plus the ``draft_vocab_size`` most frequent other ids by ``token_counts`` (V,) (see
    :func:`count_tokens`), or, without counts, the smallest ids: for byte-pair-encoding tokenizers (Llama 3, Qwen,
    SmolLM, GPT-2) ids follow merge order, so the first ones are the most frequent merges of the tokenizer's own
    corpus, a rough frequency order. ``ValueError`` as :func:`draft_vocab`."""
    special: set[int] = set()
    for config in (model.config.get_text_config(), getattr(model, "generation_config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(config, name, None) if config is not None else None
            special.update([value] if isinstance(value, int) else list(value or []))
    vocab = vocab_size(model)
    return draft_vocab(vocab, draft_vocab_size, token_counts, sorted(i for i in special if 0 <= i < vocab))
