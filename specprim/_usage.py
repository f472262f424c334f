"""Usage errors: a command line that asks for something invalid, found before anything loads.

Every ``specprim`` command checks its options first and raises :class:`UsageError` for a value out of range, a
file, directory or model it names that is not there, or options that contradict each other; :func:`specprim.cli.main`
prints the message as one line, ``specprim COMMAND: error: ...``, and returns 2. A failure after the checks (a model
that does not load, a run that breaks) returns 1. The checks here are the ones several commands share; like this
module, they import neither torch nor transformers, so that a command refuses its options before it imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from specprim.models import KNOWN_MODELS, _hub


class UsageError(ValueError):
    """The command line is invalid: ``specprim`` prints the message as one line and exits with status 2."""


@contextlib.contextmanager
def as_usage_error() -> Iterator[None]:
    """Raise a ``ValueError`` from inside the block (a recipe or a config refusing its fields) as a
    :class:`UsageError` with the same message. Only for blocks that load nothing."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(str(error)) from error


def at_least(option: str, value: float | None, least: float) -> None:
    """Refuse ``value`` below ``least`` (or NaN); ``None`` (not given) passes."""
    if value is not None and not value >= least:
        raise UsageError(f"{option} must be >= {least}, got {value}")


def check_decoding(args: argparse.Namespace) -> None:
    """``--temperature`` >= 0, ``--max-new-tokens`` >= 1, ``--top-k`` >= 1, ``--top-p`` in (0, 1]."""
    at_least("--temperature", args.temperature, 0)
    at_least("--max-new-tokens", args.max_new_tokens, 1)
    at_least("--top-k", args.top_k, 1)
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")


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
    if not (_hub.in_hub_cache(name_or_path) or _hub.hub_reachable()):
        raise UsageError(f"{option} {name_or_path}: not a known model ({known}), a local directory or a model in the "
                         "Hugging Face cache, and the hub cannot be reached to look it up (no network, or "
                         "HF_HUB_OFFLINE=1)")


def check_file(option: str, path: str | os.PathLike[str] | None) -> None:
    """Refuse a ``path`` that is not an existing file; ``None`` (not given) passes."""
    if path is not None and not Path(path).is_file():
        raise UsageError(f"{option} {os.fspath(path)}: no such file")
