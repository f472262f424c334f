"""The tokens two tokenizers share (token-level intersection, TLI: Timor et al., 2025), as id tables.

A token of one tokenizer matches a token of the other when both stand for the same bytes: byte-level BPE tokens
(GPT-2, Llama 3, Qwen, SmolLM) are read through the byte-to-character table they are written in, SentencePiece
tokens with ``▁`` as a space and ``<0xNN>`` as one byte; added tokens (``<|im_end|>``) match added tokens with the
same text. A string that names several ids in one tokenizer is left out (it would make the map ambiguous).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

__all__ = ["CrossVocab"]

MIN_SHARED_FRACTION = 0.1
"""The least fraction of the draft tokenizer's tokens that must be shared for cross-tokenizer drafting."""

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class CrossVocab:
    """The intersection of a target and a draft tokenizer's vocabularies, with both tokenizers.

    Attributes:
        target_tokenizer, draft_tokenizer: the two tokenizers (their texts are converted through them).
        target_ids, draft_ids: (S,) long, the ``S`` shared tokens: ``target_ids[i]`` and ``draft_ids[i]`` are the
            same string; ``target_ids`` is increasing.
        to_draft: (V_t,) long, the draft id of every target id of the target tokenizer, ``-1`` where it has none.

    Raises ``TypeError`` for arguments that are not Hugging Face tokenizers and ``ValueError`` when fewer than
    ``min_shared`` (default :data:`MIN_SHARED_FRACTION`) of the draft's ordinary (not added) tokens are shared: such
    a draft could propose too little of what it predicts to be of use. Special tokens (EOS) that are not shared are
    no error: the draft then never proposes them, and the target still emits them.
    """

    def __init__(self, target_tokenizer: Any, draft_tokenizer: Any, *, min_shared: float = MIN_SHARED_FRACTION
                 ) -> None:
        for role, tokenizer in (("target", target_tokenizer), ("draft", draft_tokenizer)):
            if not all(hasattr(tokenizer, name) for name in ("get_vocab", "decode", "convert_ids_to_tokens")):
                raise TypeError(f"the {role} tokenizer must be a Hugging Face tokenizer, got "
                                f"{type(tokenizer).__name__}")
        if not 0 < min_shared <= 1:
            raise ValueError(f"min_shared must be a fraction in (0, 1], got {min_shared}")
        self.target_tokenizer = target_tokenizer
        self.draft_tokenizer = draft_tokenizer
        target_keys, draft_keys = token_keys(target_tokenizer), token_keys(draft_tokenizer)
        shared = [key for key in target_keys if key in draft_keys]
        pairs = sorted((target_keys[key], draft_keys[key]) for key in shared)
        ordinary = sum(key[0] == "bytes" for key in shared)  # added tokens alone make no useful draft
        draft_size = len(draft_tokenizer) - len(draft_tokenizer.get_added_vocab())
        if ordinary == 0 or ordinary < min_shared * draft_size:
            raise ValueError(f"the tokenizers share {ordinary} of the draft's {draft_size} ordinary tokens "
                             f"({ordinary / max(draft_size, 1):.1%}); cross-tokenizer drafting needs at least "
                             f"{min_shared:.0%}")
        self.target_ids = torch.tensor([t for t, _ in pairs], dtype=torch.long)  # (S,)
        self.draft_ids = torch.tensor([d for _, d in pairs], dtype=torch.long)  # (S,)
        self.to_draft = torch.full((max(len(target_tokenizer), int(self.target_ids.max()) + 1),), -1,
                                   dtype=torch.long)  # (V_t,)
        self.to_draft[self.target_ids] = self.draft_ids
        self._largest = (int(self.target_ids.max()), int(self.draft_ids.max()))  # checked against the models' sizes
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        """The number of shared tokens."""
        return self.target_ids.numel()

    def __repr__(self) -> str:
        return (f"CrossVocab({len(self)} shared tokens; target {len(self.target_tokenizer)}, "
                f"draft {len(self.draft_tokenizer)})")

    def to_target_logits(self, draft_logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(..., V_d) draft logits -> (..., V) target logits: the shared tokens' logits at their target ids,
        ``-inf`` everywhere else, so a softmax is the draft's distribution restricted to the shared tokens and
        renormalised."""
        if self._largest[0] >= vocab_size or self._largest[1] >= draft_logits.shape[-1]:
            raise ValueError(f"the shared tokens' ids exceed the models' vocabularies (target {vocab_size}, draft "
                             f"{draft_logits.shape[-1]}): the tokenizers are not these models'")
        target_ids, draft_ids, _ = self._tables(draft_logits.device)
        out = draft_logits.new_full((*draft_logits.shape[:-1], vocab_size), float("-inf"))
        return out.index_copy(-1, target_ids, draft_logits.index_select(-1, draft_ids))  # (..., V)

    def draft_tokens(self, target_tokens: torch.Tensor) -> torch.Tensor:
        """Target ids (any shape, all shared tokens) -> the draft's ids. ``ValueError`` for a token not shared."""
        table = self._tables(target_tokens.device)[2]  # (V_t,)
        inside = (target_tokens >= 0) & (target_tokens < table.numel())
        mapped = torch.where(inside, table[target_tokens.clamp(0, table.numel() - 1)], -1)
        if bool((mapped < 0).any()):
            raise ValueError("a drafted token is not one the tokenizers share; cross-tokenizer drafts propose shared "
                             "tokens only")
        return mapped

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``target_ids``, ``draft_ids`` and ``to_draft`` on ``device`` (copied once per device)."""
        if device not in self._on_device:
            self._on_device[device] = tuple(t.to(device) for t in (self.target_ids, self.draft_ids, self.to_draft))
        return self._on_device[device]


def token_keys(tokenizer: Any) -> dict[tuple[str, bytes | str], int]:
    """``{key: id}`` for every token of ``tokenizer`` whose key names one id: ``("added", text)`` for added tokens,
    ``("bytes", b"...")`` for the others."""
    added = {token: i for token, i in tokenizer.get_added_vocab().items()}
    to_bytes = _byte_reader(tokenizer)
    seen: dict[tuple[str, bytes | str], int] = {}
    repeated: set[tuple[str, bytes | str]] = set()
    for token, token_id in tokenizer.get_vocab().items():
        key: tuple[str, bytes | str] = ("added", token) if token in added else ("bytes", to_bytes(token))
        if key in seen and seen[key] != token_id:
            repeated.add(key)
        seen[key] = token_id
    return {key: i for key, i in seen.items() if key not in repeated and key[1]}


def _byte_reader(tokenizer: Any) -> Any:
    """The function from a vocabulary string of ``tokenizer`` to the bytes it stands for."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = repr(getattr(backend, "decoder", None))
    if "ByteLevel" in decoder:
        table = _unicode_to_byte()
        return lambda token: bytes(table[c] for c in token) if all(c in table for c in token) else token.encode()

    def sentencepiece(token: str) -> bytes:
        byte = _BYTE_TOKEN.fullmatch(token)
        return bytes([int(byte.group(1), 16)]) if byte else token.replace("\u2581", " ").encode()

    return sentencepiece


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of byte-level BPE's table that writes every byte as a printable character (GPT-2)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}
