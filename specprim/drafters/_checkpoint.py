"""Saving and loading draft heads that live on top of a target model (Medusa, MTP, EAGLE, ...).

A head checkpoint is a directory with two files:

- ``config.json``: ``{"head": <class name>, "config": {...}}``; the config holds at least ``hidden_size`` and
  ``vocab_size``, the target dimensions the head was built for;
- ``model.safetensors``: the head's own ``state_dict``. Target modules a head uses by reference (embeddings,
  LM head) are not registered as sub-modules, so they are never saved;
- ``specprim_checksums.json``: the size and SHA-256 of both, written last (see :mod:`specprim._integrity`).

Each file is written atomically and checked on load: a truncated, corrupted or half-rewritten head raises a
``ValueError`` naming the file; only safetensors weights are read (never a pickle).
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from specprim._integrity import DamagedFileError, UnsafeFileError, check_directory, write_atomically, write_checksums

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

Head = TypeVar("Head", bound="LoadableHead")


class LoadableHead(Protocol):
    """What ``load_head`` needs from a head class: a way to build a randomly initialised head from a saved
    config for a given target (its weights are then loaded over it)."""

    @classmethod
    def from_config(cls: type[Head], config: dict[str, Any], target: torch.nn.Module) -> Head: ...

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True) -> Any: ...

    def parameters(self) -> Any: ...


_HEAD_CLASSES: dict[str, type] = {}


def register_head(cls: type[Head]) -> type[Head]:
    """Class decorator: make ``cls`` loadable by :func:`specprim.models.load_head` under its class name (the
    ``"head"`` its ``save_head`` records); one line in each head's own module."""
    _HEAD_CLASSES[cls.__name__] = cls
    return cls


def head_classes() -> dict[str, type]:
    """The registered head classes by saved name (see :func:`register_head`)."""
    return dict(_HEAD_CLASSES)


def target_dimensions(target: torch.nn.Module) -> tuple[int, int]:
    """``(hidden_size, vocab_size)`` of a causal LM, read from its output head's (V, H) weight."""
    head = target.get_output_embeddings()
    if head is None:
        raise TypeError(f"{type(target).__name__} has no output embeddings (LM head)")
    vocab, hidden = head.weight.shape
    return int(hidden), int(vocab)


def check_target(config: dict[str, Any], target: torch.nn.Module, what: str) -> None:
    """Raise ``ValueError`` if ``target``'s hidden size or vocabulary differ from ``config``'s."""
    hidden, vocab = target_dimensions(target)
    for name, have in (("hidden_size", hidden), ("vocab_size", vocab)):
        if config[name] != have:
            raise ValueError(
                f"{what} was built for a target with {name}={config[name]}, but {type(target).__name__} has "
                f"{name}={have}; a head only works on the target (or a same-sized sibling) it was trained for"
            )


def save_head(module: torch.nn.Module, config: dict[str, Any], directory: str | os.PathLike[str]) -> None:
    """Write ``config`` and ``module``'s own weights to ``directory`` (created if needed).

    ``config`` must be JSON-serialisable and contain ``hidden_size`` and ``vocab_size``.
    """
    for name in ("hidden_size", "vocab_size"):
        if name not in config:
            raise ValueError(f"a head config must record the target's {name}")
    os.makedirs(directory, exist_ok=True)
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in module.state_dict().items()}
    text = json.dumps({"head": type(module).__name__, "config": config}, indent=2, sort_keys=True)
    written = {WEIGHTS_NAME: write_atomically(os.path.join(directory, WEIGHTS_NAME), save(state)),
               CONFIG_NAME: write_atomically(os.path.join(directory, CONFIG_NAME), text.encode())}
    write_checksums(directory, written)  # last: a save cut short leaves files that do not match the record


def load_config(cls: type, directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The config saved in ``directory``; ``ValueError`` if it was saved by another head class."""
    saved = read_head_config(directory)
    if saved.get("head") != cls.__name__:
        raise ValueError(f"{os.fspath(directory)!r} holds a {saved.get('head')} checkpoint, not a {cls.__name__}")
    return saved["config"]


def read_head_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The saved ``config.json`` of the head in ``directory`` (``{"head": class name, "config": {...}}``), after
    checking the directory's files against their recorded checksums. Raises ``FileNotFoundError`` for a directory
    without one, ``ValueError`` naming the file for a damaged head."""
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {CONFIG_NAME} in {os.fspath(directory)!r}: not a saved head")
    check_directory(directory)
    try:
        with open(path) as f:
            saved = json.load(f)
    except ValueError as error:
        raise DamagedFileError(f"{path} is not a whole JSON file ({error})") from error
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        raise DamagedFileError(f"{path} is not a head config: expected {{\"head\": ..., \"config\": {{...}}}}")
    return saved


def load_head(cls: type[Head], directory: str | os.PathLike[str], target: torch.nn.Module) -> Head:
    """Rebuild a head saved with :func:`save_head` for ``target``.

    Checks the target's hidden size and vocabulary against the saved config (``ValueError`` naming both on a
    mismatch), builds the head with ``cls.from_config(config, target)`` and loads the saved weights into it
    (strictly: a missing or unexpected tensor raises). The weights keep the dtype / device of the built head.
    """
    config = load_config(cls, directory)
    check_target(config, target, f"the {cls.__name__} in {os.fspath(directory)!r}")
    head = cls.from_config(config, target)
    reference = next(iter(head.parameters()), None)
    device = "cpu" if reference is None else str(reference.device)
    weights = os.path.join(directory, WEIGHTS_NAME)
    if not os.path.isfile(weights):
        pickles = sorted(name for name in os.listdir(directory) if name.endswith((".bin", ".pt", ".pth", ".pkl")))
        if pickles:
            raise UnsafeFileError(f"{os.fspath(directory)!r} holds {pickles[0]} and no {WEIGHTS_NAME}: heads are read "
                                  "from safetensors only (a pickle can run code)")
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {os.fspath(directory)!r}: not a saved head")
    try:
        state = load_file(weights, device=device)
    except SafetensorError as error:
        raise DamagedFileError(f"{weights} is not a whole safetensors file ({error})") from error
    head.load_state_dict(state, strict=True)
    return head
