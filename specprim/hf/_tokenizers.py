"""Compatibility of a draft tokenizer with a target tokenizer."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def check_tokenizers_compatible(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    """Raise ``ValueError`` unless every draft token id means the same string for the target.

    A draft vocabulary that is a prefix of the target's (as in the Qwen2.5 family, whose sizes differ only by
    padding ids) is compatible: the draft simply never proposes the target's extra ids.
    """
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    for token, draft_id in draft_vocab.items():
        if target_vocab.get(token) != draft_id:
            raise ValueError(
                f"draft and target tokenizers disagree: draft token {token!r} has id {draft_id}, "
                f"target id {target_vocab.get(token)}; speculative decoding needs a shared vocabulary"
            )
