"""Trained draft heads shipped inside the package, loaded by name.

Each shipped head is a directory under ``specprim/models/heads/<name>/`` with the ``config.json`` and
``model.safetensors`` written by the head's ``save_pretrained`` (weights stored in bfloat16; they load into the
target's dtype) and a ``README.md`` model card (data, steps, wall time, command, measured tau).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["HEADS_DIR", "head_info", "head_path", "known_heads", "load_head", "shipped_head"]

HEADS_DIR = Path(__file__).parent / "heads"


def known_heads() -> tuple[str, ...]:
    """Names of the heads shipped with this installation (sorted)."""
    if not HEADS_DIR.is_dir():
        return ()
    return tuple(sorted(p.name for p in HEADS_DIR.iterdir() if (p / "config.json").is_file()))


def head_info(name: str) -> dict[str, Any]:
    """The ``recipes.toml`` of the shipped head ``name``: ``target`` (the model it drafts for), ``kind`` (its preset),
    and, where it was tuned, ``recipes`` (tables of :class:`specprim.recipes.Recipe` fields by decoding mode) and
    ``measured`` (what the tuning run gave). Empty for a head without one."""
    file = HEADS_DIR / name / "recipes.toml"
    return tomllib.loads(file.read_text()) if file.is_file() else {}


def shipped_head(target: str | None, kind: str) -> str | None:
    """The shipped head of preset ``kind`` (``eagle3``, ``medusa``, ...) for the known model ``target``, or
    ``None``."""
    for name in known_heads():
        info = head_info(name)
        if target is not None and info.get("target") == target and info.get("kind") == kind:
            return name
    return None


def head_path(name_or_path: str | os.PathLike[str]) -> Path:
    """The directory of a shipped head called ``name_or_path``, or ``name_or_path`` itself when it is a directory.

    Raises ``ValueError`` naming the shipped heads when it is neither.
    """
    name = os.fspath(name_or_path)
    if name in known_heads():
        return HEADS_DIR / name
    if os.path.isdir(name):
        return Path(name)
    raise ValueError(f"{name!r} is neither a shipped head ({', '.join(known_heads()) or 'none'}) nor a directory")


def load_head(name_or_path: str | os.PathLike[str], target: Any) -> Any:
    """Load a shipped head by name (see :func:`known_heads`) or any saved head directory onto ``target``.

    The class (``EagleHead``, ``MedusaHeads``, ``MTPHead``: the head classes that register themselves with
    ``register_head`` in their modules) is read from the saved ``config.json``; the head's own ``from_pretrained``
    checks that ``target`` is the model it was trained for. Onto a target with packed
    weights (:func:`specprim.models.pack_weights`, ``load(..., pack=True)``) the head's own linear layers are packed
    too: the same outputs (bit for bit per layer), drafted faster on CPU; such a head is for inference (packing
    copies the weights once, so training it would not change its outputs).
    """
    from specprim.drafters import head_classes, read_head_config
    from specprim.linears import pack_like

    directory = head_path(name_or_path)
    kind = read_head_config(directory).get("head")
    classes = head_classes()  # every head class registers itself in its module (``register_head``)
    if kind not in classes:
        raise ValueError(f"{directory} holds a {kind!r} checkpoint; known head classes: {sorted(classes)}")
    return pack_like(classes[kind].from_pretrained(directory, target), target)
