"""Files written whole and read back only when whole: atomic writes, checksums recorded at write time and checked on
load, and the two errors a file that cannot be trusted raises.

A file is written under a temporary name in its own directory and renamed into place (``os.replace``), so a killed
process leaves either the old file or the new one under the final name, never half of one. A directory's
checksums (``specprim_checksums.json``: the size and SHA-256 of each file, taken when it was written) are checked on
load: every size always; the SHA-256 of files up to :data:`HASHED_ON_LOAD` bytes always and of larger ones when asked
(``full=True``, e.g. after a load failed), so a check costs milliseconds, not a read of a multi-gigabyte model. A
safetensors file without a recorded checksum (written before checksums were kept) is checked against its own header:
a truncated one is caught.

Standard library only: every layer of the package may use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

CHECKSUMS_NAME = "specprim_checksums.json"
HASHED_ON_LOAD = 64 << 20  # bytes: files up to this size are hashed on every check, larger ones by size only
_BLOCK = 1 << 22

Record = dict[str, Any]  # {"bytes": int, "sha256": str}


class DamagedFileError(ValueError):
    """A file is not what was written: truncated, corrupted, or not a whole file of its kind."""


class UnsafeFileError(ValueError):
    """A file would run code if it were loaded (a pickle, a model asking for ``trust_remote_code``): refused."""


def data_checksum(data: bytes | memoryview) -> Record:
    """The size and SHA-256 of ``data``."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def file_checksum(path: str | os.PathLike[str]) -> Record:
    """The size and SHA-256 of the file at ``path``, read in blocks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; once the block has written it, rename it to ``path``. If the block
    raises (or the process dies), ``path`` is untouched and the temporary file is removed (or left under a dot-name
    ending in ``.partial`` and ``suffix``, for writers that insist on an extension, never read)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = final.with_name(f".{final.name}.{os.getpid()}-{secrets.token_hex(4)}.partial{suffix}")  # not yet created
    try:
        yield staged
        os.replace(staged, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise


def write_atomically(path: str | os.PathLike[str], data: bytes | memoryview) -> Record:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`); return its checksum."""
    with atomic_path(path) as staged:
        staged.write_bytes(data)
    return data_checksum(data)


def write_checksums(directory: str | os.PathLike[str], records: Mapping[str, Record] | None = None, *,
                    exclude: tuple[str, ...] = ()) -> None:
    """Record, atomically, the checksum of files in ``directory``: ``records`` (name -> :func:`data_checksum` of
    what was written) or, when ``None``, every file under it (hashed now) but those named in ``exclude``."""
    root = Path(directory)
    if records is None:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in (CHECKSUMS_NAME, *exclude))
        records = {p.relative_to(root).as_posix(): file_checksum(p) for p in files}
    write_atomically(root / CHECKSUMS_NAME, (json.dumps({"files": dict(records)}, indent=1) + "\n").encode())


def check_file(path: str | os.PathLike[str], record: Mapping[str, Any], *, full: bool = False, where: str = "") -> None:
    """Raise :class:`DamagedFileError` naming ``path`` when it is missing or differs from ``record`` (size always;
    SHA-256 when ``full`` or the file is at most :data:`HASHED_ON_LOAD` bytes). ``where`` names the file holding the
    record, in the message."""
    path = Path(path)
    recorded = f" (recorded in {where})" if where else ""
    if not path.is_file():
        raise DamagedFileError(f"{path} is missing: it was written with a checksum{recorded}")
    size = path.stat().st_size
    if size != record["bytes"]:
        raise DamagedFileError(f"{path} is damaged: it has {size} bytes, {record['bytes']} were written{recorded}")
    if (full or size <= HASHED_ON_LOAD) and file_checksum(path)["sha256"] != record["sha256"]:
        raise DamagedFileError(f"{path} is damaged: its SHA-256 differs from the one recorded when it was "
                               f"written{recorded}")


def check_directory(directory: str | os.PathLike[str], *, full: bool = False) -> None:
    """Raise :class:`DamagedFileError` naming the first file of ``directory`` that differs from its recorded
    checksum (:func:`check_file`). Without recorded checksums, each safetensors file is checked against its header
    (:func:`check_safetensors`)."""
    root = Path(directory)
    recorded = root / CHECKSUMS_NAME
    if not recorded.is_file():
        for path in sorted(root.glob("*.safetensors")):
            check_safetensors(path)
        return
    try:
        files = json.loads(recorded.read_text())["files"]
        entries = [(name, {"bytes": int(r["bytes"]), "sha256": str(r["sha256"])}) for name, r in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DamagedFileError(f"{recorded} is damaged: {error}") from error
    for name, record in entries:
        check_file(root / name, record, full=full, where=CHECKSUMS_NAME)


def check_safetensors(path: str | os.PathLike[str]) -> None:
    """Raise :class:`DamagedFileError` naming ``path`` when it is not a whole safetensors file: an unreadable header,
    or a size other than the header's tensors need (reads the header only)."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 or length > size - 8:
                raise ValueError(f"a header of {length} bytes does not fit in {size} bytes")
            header = json.loads(f.read(length))
        end = max((int(t["data_offsets"][1]) for name, t in header.items() if name != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        raise DamagedFileError(f"{path} is not a whole safetensors file ({error})") from error
    if 8 + length + end != size:
        raise DamagedFileError(f"{path} is damaged: it has {size} bytes, its header describes {8 + length + end}")
