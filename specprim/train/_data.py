"""Training conversations (ShareGPT from its PyPI wheel, read by :mod:`specprim.models`), and rendering with a
target's chat template.

A *conversation* is a list of ``{"role": "system" | "user" | "assistant", "content": str}`` messages. An
:class:`Example` is one conversation rendered to token ids with the target's chat template, with a mask of the
tokens the assistant wrote (the template's own tokens and the user's text are not).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from specprim._names import TRAIN_DATA_SOURCES
from specprim.models import SHAREGPT_REQUIREMENT, Conversation, read_jsonl_conversations, sharegpt_conversations

__all__ = [
    "SHAREGPT_REQUIREMENT",
    "Example",
    "has_code_answer",
    "load_conversations",
    "read_jsonl_conversations",
    "render",
    "sharegpt_conversations",
]


@dataclasses.dataclass(frozen=True)
class Example:
    """One rendered conversation.

    Attributes:
        input_ids: (T,) long token ids of the whole conversation as the chat template writes it.
        assistant_mask: (T,) bool, ``True`` on tokens of assistant turns (their text and end-of-turn token).
    """

    input_ids: torch.Tensor
    assistant_mask: torch.Tensor


_CODE_FENCE = "```"


def has_code_answer(conversation: Conversation) -> bool:
    """Whether an assistant turn of ``conversation`` holds a fenced code block (three backticks)."""
    return any(m["role"] == "assistant" and _CODE_FENCE in m["content"] for m in conversation)


def load_conversations(source: str, num: int | None = None) -> list[Conversation]:
    """The first ``num`` (default: all) conversations of ``source``: ``"sharegpt"`` (the built-in ShareGPT V3),
    ``"sharegpt-code"`` (those of its conversations with a fenced code block in an answer, ~3.2k of 11.1k) or the
    path of a JSONL file of conversations."""
    if num is not None and num < 1:
        raise ValueError(f"num must be >= 1, got {num}")
    if source == "sharegpt":
        return sharegpt_conversations(num)
    if source == "sharegpt-code":
        return [c for c in sharegpt_conversations() if has_code_answer(c)][:num]
    if not os.path.isfile(source):
        raise ValueError(f"training data {source!r} is neither one of {', '.join(TRAIN_DATA_SOURCES)} nor an existing "
                         "JSONL file")
    return read_jsonl_conversations(source, num)


def render(tokenizer: Any, conversation: Sequence[dict[str, str]], *, max_length: int | None = None) -> Example:
    """Render ``conversation`` with ``tokenizer``'s chat template into an :class:`Example`.

    Each message's span is tokenised on its own (the template text up to a message boundary is always a prefix of
    the text with more messages), so the assistant tokens are exactly those a chat generation would produce after
    the template's generation prompt. ``max_length`` truncates the ids (keeping the start). Raises ``ValueError``
    when the tokenizer has no chat template or the template is not prefix-consistent.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; render the conversation yourself")
    messages = list(conversation)
    ids: list[int] = []
    mask: list[bool] = []
    done = ""
    for i, message in enumerate(messages):
        is_assistant = message["role"] == "assistant"
        if is_assistant:  # the generation prompt belongs to the template, not to the assistant
            prompt = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            done = _extend(tokenizer, done, prompt, ids, mask, False)
        text = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        done = _extend(tokenizer, done, text, ids, mask, is_assistant)
        if max_length is not None and len(ids) >= max_length:
            break
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return Example(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))


def _extend(tokenizer: Any, done: str, text: str, ids: list[int], mask: list[bool], flag: bool) -> str:
    if not text.startswith(done):
        raise ValueError("the chat template is not prefix-consistent across turns; render the data yourself")
    new = tokenizer(text[len(done):], add_special_tokens=False).input_ids
    ids.extend(new)
    mask.extend([flag] * len(new))
    return text


def render_all(tokenizer: Any, conversations: Iterable[Sequence[dict[str, str]]], *, max_length: int,
               min_assistant_tokens: int = 1) -> list[Example]:
    """:func:`render` every conversation, dropping those with fewer than ``min_assistant_tokens`` assistant tokens
    after truncation."""
    examples = [render(tokenizer, c, max_length=max_length) for c in conversations]
    return [e for e in examples if int(e.assistant_mask.sum()) >= min_assistant_tokens]
