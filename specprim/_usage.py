"""Usage errors: a command line that asks for something invalid, found before anything loads.

Every ``specprim`` command checks its options first and raises :class:`UsageError` for a value out of range, a
file, directory or model it names that is not there, or options that contradict each other; :func:`specprim.cli.main`
prints the message as one line, ``specprim COMMAND: error: ...``, and returns 2. A failure after the checks (a model
that does not load, a run that breaks) returns 1. The checks here are the ones several commands share (a model name:
:func:`specprim.models.check_model`); like this module, they import neither torch nor transformers, so that a command
refuses its options before it imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path


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


def check_file(option: str, path: str | os.PathLike[str] | None) -> None:
    """Refuse a ``path`` that is not an existing file; ``None`` (not given) passes."""
    if path is not None and not Path(path).is_file():
        raise UsageError(f"{option} {os.fspath(path)}: no such file")


def check_json_schema(path: str | os.PathLike[str] | None, option: str = "--json-schema") -> None:
    """Refuse a ``path`` that is not a file holding a JSON object; ``None`` (not given) passes. (Whether the object
    is a valid schema, the grammar compiler says once the tokenizer is loaded.)"""
    if path is None:
        return
    check_file(option, path)
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{option} {os.fspath(path)}: not valid JSON ({error})") from None
    if not isinstance(schema, dict):
        raise UsageError(f"{option} {os.fspath(path)}: a JSON schema must be an object, got {type(schema).__name__}")
