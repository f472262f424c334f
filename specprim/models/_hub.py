"""Whether a model name can be loaded as a Hugging Face hub id from here: its files are in the local Hugging Face
cache, or the hub answers. Imports neither torch nor transformers: the command line asks before it loads anything."""

from __future__ import annotations

import functools
import socket
import urllib.parse


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
