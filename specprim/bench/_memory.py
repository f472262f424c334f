"""Memory accounting: a method's extra parameters, the state its drafter holds, and the peak memory of one
generation.

A drafter's state is every tensor and NumPy array reachable from the method object (its drafter's attributes,
through lists, tuples, dicts and objects' attributes) that is neither a parameter or buffer of its draft modules
nor storage of the target: the draft KV cache, predicted features, datastore arrays, index tensors. It is what the
method keeps between generations, measured after each one.

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
import types
from collections.abc import Iterable
from pathlib import Path

import numpy as np
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


_NOT_SEARCHED = (type, str, bytes, types.ModuleType, types.FunctionType, types.MethodType)
STATE_DEPTH = 10  # attribute levels searched: method -> preset -> union -> parts -> drafter -> model -> cache ...


def _tensor_storage(tensor: torch.Tensor) -> tuple[object, int] | None:
    """(key, bytes) of ``tensor``'s whole storage; ``None`` for a tensor with none (meta, oneDNN-packed)."""
    if tensor.device.type == "meta" or tensor.is_mkldnn:
        return None
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # a tensor subclass without a plain storage
        return id(tensor), tensor.numel() * tensor.element_size()


def _array_storage(array: np.ndarray) -> tuple[object, int]:
    """(key, bytes) of the array that owns ``array``'s memory (a view counts its base once)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return ("numpy", id(array)), array.nbytes


def state_bytes(
    root: object, modules: Iterable[torch.nn.Module], target: torch.nn.Module, skip: Iterable[object] = ()
) -> int:
    """Bytes of the tensors and arrays reachable from ``root`` (``STATE_DEPTH`` levels of lists, tuples, dicts and
    attributes) that are not parameters or buffers of ``modules`` nor share storage with ``target``'s parameters
    and buffers, each storage counted once and whole. ``target`` and the objects in ``skip`` (a verifier holding the
    target's cache) are not entered."""
    excluded = set()
    for module in (target, *modules):
        for tensor in (*module.parameters(), *module.buffers()):
            storage = _tensor_storage(tensor)
            if storage is not None:
                excluded.add(storage[0])
    not_entered = {id(target), *(id(obj) for obj in skip)}
    visited: set[int] = set()
    found: dict[object, int] = {}

    def visit(value: object, level: int) -> None:
        if id(value) in not_entered or id(value) in visited:
            return
        visited.add(id(value))
        if isinstance(value, torch.Tensor):
            storage = _tensor_storage(value)
            if storage is not None and storage[0] not in excluded:
                found[storage[0]] = storage[1]
            return
        if isinstance(value, np.ndarray):
            key, size = _array_storage(value)
            found[key] = size
            return
        if level == 0 or isinstance(value, _NOT_SEARCHED):
            return
        if isinstance(value, dict):
            items = value.values()
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = value
        else:
            try:
                items = list(vars(value).values())
            except TypeError:  # no instance dictionary: nothing held that is searched
                return
        for item in items:
            visit(item, level - 1)

    visit(root, STATE_DEPTH)
    return sum(found.values())


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
