"""Memory accounting: a method's extra parameters and the peak memory of one generation.

Peak memory is measured per generation, outside the timed window:

* CUDA: ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats`` (bytes held by
  tensors on the target's device);
* Linux CPU: the process's resident-set high-water mark ``VmHWM`` from ``/proc/self/status``, reset before
  each generation by writing ``5`` to ``/proc/self/clear_refs``. RSS includes memory the allocator keeps after
  earlier frees, so differences of a few MB are noise;
* elsewhere: not measured (``None``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParameterCount:
    """Parameters a method adds to the target: ``count`` elements taking ``bytes`` bytes."""

    count: int
    bytes: int


def _storage_key(tensor: torch.Tensor) -> int:
    """The data pointer of ``tensor``; its ``id`` for an opaque oneDNN tensor (a packed weight), which has none."""
    return id(tensor) if tensor.is_mkldnn else tensor.data_ptr()


def extra_parameters(modules: Iterable[torch.nn.Module], target: torch.nn.Module) -> ParameterCount:
    """Parameters and buffers of ``modules`` that ``target`` does not share (same storage), counted once. The
    oneDNN-packed copy of a packed layer's weight (:class:`specprim.models.PackedLinear`) is a second layout of a
    parameter, not a parameter: it is not counted (the peak-memory column shows what it costs)."""
    shared = {_storage_key(t) for t in (*target.parameters(), *target.buffers()) if t.device.type != "meta"}
    seen: set[int] = set()
    count = size = 0
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.device.type == "meta" or tensor.is_mkldnn:  # not stored, or a packed copy of a weight
                continue
            pointer = _storage_key(tensor)
            if pointer in shared or pointer in seen:
                continue
            seen.add(pointer)
            count += tensor.numel()
            size += tensor.numel() * tensor.element_size()
    return ParameterCount(count=count, bytes=size)


class PeakMemory:
    """Peak memory of the code run between :meth:`reset` and :meth:`peak_bytes`, on ``device``."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.method = self._pick()

    def _pick(self) -> str | None:
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated"
        if self.device.type == "cpu" and _STATUS.is_file():
            try:
                _CLEAR_REFS.write_text("5")
            except OSError:
                return None
            return "VmHWM after /proc/self/clear_refs"
        return None

    def reset(self) -> None:
        if self.method is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _CLEAR_REFS.write_text("5")

    def peak_bytes(self) -> int | None:
        if self.method is None:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return None
