"""Reproducibility record: the exact command, library versions and hardware, for every results file."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

_LIBRARIES = ("specprim", "torch", "transformers", "tokenizers", "accelerate", "numpy")


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that decide the numbers (``None`` when not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    """CPU model, logical cores (all, and usable by this process), torch threads, accelerators."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info: dict[str, Any] = {
        "platform": platform.platform(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
        "cpu_usable": usable, "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda, "gpus": [],
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (other work on the machine skews timings), where available."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _git_commit() -> str | None:
    """The commit of the specprim checkout in use, when it is a git work tree (read-only query)."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(argv: list[str] | None = None) -> dict[str, Any]:
    """``command`` (``argv``, default ``sys.argv``, verbatim), ``command_line`` (one shell line, program name
    without its directory), UTC time, library versions, the git commit of specprim, hardware."""
    argv = list(sys.argv if argv is None else argv)
    shown = [Path(argv[0]).name, *argv[1:]] if argv else []
    return {
        "command": argv, "command_line": shlex.join(shown),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": library_versions(), "git_commit": _git_commit(), "hardware": hardware(),
    }
