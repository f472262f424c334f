"""Benchmark prompts: the record, the JSONL reader, and rendering a conversation with the chat template."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_ID_KEYS = ("id", "question_id", "task_id")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prompt:
    """One benchmark question.

    Attributes:
        id: a stable identifier (the dataset's own id when it has one, else the 0-based line number).
        turns: the user messages, asked one after another. Turn ``i + 1`` is sent after the model's own answer
            to turn ``i``, as MT-bench does; a single-turn prompt has one entry.
        category: the dataset's category label, if any (MT-bench: ``"writing"``, ``"coding"``, ...).
    """

    id: str
    turns: tuple[str, ...]
    category: str | None = None

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"prompt {self.id!r} has no turns")
        for turn in self.turns:
            if not isinstance(turn, str) or not turn:
                raise ValueError(f"prompt {self.id!r}: every turn must be a non-empty string, got {turn!r}")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "turns": list(self.turns), "category": self.category}


def parse_prompt(record: Mapping[str, Any], default_id: str) -> Prompt:
    """Build a :class:`Prompt` from ``{"prompt": "..."}`` or ``{"turns": ["...", ...]}``.

    Optional keys: ``id`` / ``question_id`` / ``task_id`` (else ``default_id``) and ``category``.
    Raises ``ValueError`` when neither or both of ``prompt`` and ``turns`` are present, or they are not text.
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    has_prompt, has_turns = "prompt" in record, "turns" in record
    if has_prompt == has_turns:
        raise ValueError('each record needs exactly one of "prompt" (a string) or "turns" (a list of strings)')
    turns = [record["prompt"]] if has_prompt else record["turns"]
    if not isinstance(turns, list):
        raise ValueError(f'"turns" must be a list of strings, got {type(turns).__name__}')
    prompt_id = next((str(record[key]) for key in _ID_KEYS if key in record), default_id)
    category = record.get("category")
    return Prompt(id=prompt_id, turns=tuple(turns), category=None if category is None else str(category))


def read_prompts(path: str | os.PathLike[str]) -> list[Prompt]:
    """Read a JSONL prompts file: one :func:`parse_prompt` record per non-blank line.

    Raises ``ValueError`` naming ``file:line`` for invalid JSON or an invalid record, and for an empty file.
    """
    path = Path(path)
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):  # JSON Lines: "\n" only
        if not line.strip():
            continue
        try:
            prompts.append(parse_prompt(json.loads(line), default_id=str(number - 1)))
        except (ValueError, TypeError) as error:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{number}: {error}") from error
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def conversation_ids(tokenizer: Any, turns: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
    """(1, T) ids of a conversation ending with a user turn, ready for generation.

    ``turns[:len(answers) + 1]`` user messages interleaved with the assistant ``answers`` are rendered with the
    tokenizer's chat template and its generation prompt. Without a chat template the messages are joined with
    newlines (what :func:`specprim.cli.chat_input_ids` does for one turn). Raises ``ValueError`` unless
    ``len(answers) < len(turns)``.
    """
    if len(answers) >= len(turns):
        raise ValueError(f"{len(answers)} answers for {len(turns)} turns: the conversation must end with a user turn")
    messages = []
    for turn, answer in zip(turns, [*answers, None], strict=False):
        messages.append({"role": "user", "content": turn})
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "\n".join(message["content"] for message in messages)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
