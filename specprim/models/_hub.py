"""Whether a model name can be loaded as a Hugging Face hub id from here: its files are in the local Hugging Face
cache, or the hub answers. Imports neither torch nor transformers: the command line asks before it loads anything."""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse
from pathlib import Path

from specprim._usage import UsageError
from specprim.models._registry import KNOWN_MODELS


@functools.cache
def hub_reachable(timeout_s: float = 1.5) -> bool:
    """Whether the Hugging Face hub's host accepts a connection within ``timeout_s`` (asked once per process;
    ``False`` under ``HF_HUB_OFFLINE``)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    endpoint = urllib.parse.urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds the ``config.json`` of the hub model ``repo_id`` (which
    ``from_pretrained`` then reads without the network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid hub id
        return False


def check_model(option: str, name_or_path: str | None) -> None:
    """Refuse a model that none of the loaders can find: a known name, an existing directory, a model in the local
    Hugging Face cache and, when the hub can be reached, any other hub id (whether it is there, loading says) pass;
    a path (absolute, or starting with ``.`` or ``~``) must be a directory."""
    if name_or_path is None or name_or_path in KNOWN_MODELS or Path(name_or_path).expanduser().is_dir():
        return
    known = ", ".join(KNOWN_MODELS)
    if os.path.isabs(name_or_path) or name_or_path.startswith((".", "~")):
        raise UsageError(f"{option} {name_or_path}: no such directory (a model is a known name ({known}), a local "
                         "directory or a hub id)")
    if not (in_hub_cache(name_or_path) or hub_reachable()):
        raise UsageError(f"{option} {name_or_path}: not a known model ({known}), a local directory or a model in the "
                         "Hugging Face cache, and the hub cannot be reached to look it up (no network, or "
                         "HF_HUB_OFFLINE=1)")
