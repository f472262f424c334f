"""Tokenizer helpers: a prompt as chat-template ids, and whether a draft tokenizer fits a target's."""

from __future__ import annotations

from typing import Any

import torch
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


def chat_input_ids(tokenizer: Any, prompt: str) -> torch.Tensor:
    """(1, T) ids of ``prompt`` as one user turn, rendered with the tokenizer's chat template if it has one."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
    else:
        text = prompt
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
