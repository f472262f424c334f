"""JSON Lines text split into its records' lines: on ``"\\n"`` only.

``str.splitlines`` also breaks at U+2028, U+2029, U+0085 and a few control characters, which JSON allows unescaped
inside strings (``json.dumps(..., ensure_ascii=False)`` writes them so); a model's answer holding one would cut its
record in two.
"""

from __future__ import annotations

__all__ = ["jsonl_lines"]


def jsonl_lines(text: str) -> list[str]:
    """The non-blank lines of JSON Lines ``text``."""
    return [line for line in text.split("\n") if line.strip()]
