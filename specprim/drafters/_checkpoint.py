"""Saving and loading draft heads that live on top of a target model (Medusa, MTP, EAGLE, ...).

A head checkpoint is a directory with two files:

- ``config.json``: ``{"head": <class name>, "config": {...}}``; the config holds at least ``hidden_size`` and
  ``vocab_size``, the target dimensions the head was built for;
- ``model.safetensors``: the head's own ``state_dict``. Target modules a head uses by reference (embeddings,
  LM head) are not registered as sub-modules, so they are never saved.
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol, TypeVar

import torch
from safetensors.torch import load_file, save_file

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
    with open(os.path.join(directory, CONFIG_NAME), "w") as f:
        json.dump({"head": type(module).__name__, "config": config}, f, indent=2, sort_keys=True)
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in module.state_dict().items()}
    save_file(state, os.path.join(directory, WEIGHTS_NAME))


def load_config(cls: type, directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The config saved in ``directory``; ``ValueError`` if it was saved by another head class."""
    path = os.path.join(directory, CONFIG_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {CONFIG_NAME} in {os.fspath(directory)!r}: not a saved head")
    with open(path) as f:
        saved = json.load(f)
    if saved.get("head") != cls.__name__:
        raise ValueError(f"{os.fspath(directory)!r} holds a {saved.get('head')} checkpoint, not a {cls.__name__}")
    return saved["config"]


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
    state = load_file(os.path.join(directory, WEIGHTS_NAME), device=device)
    head.load_state_dict(state, strict=True)
    return head
