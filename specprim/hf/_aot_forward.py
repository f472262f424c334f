"""Compiled static forwards that outlive the process: :class:`StaticTarget`'s layer loop as AOTInductor packages.

``torch.compile`` keeps nothing a second process can reuse for the compiled verifier on CPU: freezing pre-packs the
weights into oneDNN tensors, which its on-disk caches cannot pickle, so every run compiled again (260-330 s for
SmolLM2-135M on 2 AVX2 cores). Here the same forward is exported (``torch.export``) and compiled ahead of time with
the same inductor settings into a package under ``cache_dir() / "aoti"``; a later process loads it in about a second.

One package serves one (padded query length, feature layers, cache length) shape of one model: its key hashes the
weights (a cheap fingerprint: each tensor's name, shape, dtype and sum), the config, the compile settings and the
torch and specprim versions, so changed weights or a new torch build compile afresh. The KV cache is not inside the
package: its tensors are inputs the package writes in place, so the eager prefill, :meth:`StaticTarget.commit` and
the compiled forward share them. The attended window ``W`` (the mask's width) is a dynamic dimension of the package.
A package holds the frozen weights (about the model's size on disk); delete ``cache_dir() / "aoti"`` to free it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import StaticCache

from specprim._integrity import atomic_path

logger = logging.getLogger(__name__)

AOT_ENV = "SPECPRIM_AOT"
"""Set to ``0`` to compile static forwards with ``torch.compile`` in every process instead of caching packages."""

Layers = Callable[..., tuple[torch.Tensor, tuple[torch.Tensor, ...]]]


def aot_enabled() -> bool:
    """Whether compiled static forwards are cached as AOTInductor packages (on unless ``SPECPRIM_AOT=0``)."""
    return os.environ.get(AOT_ENV, "1") != "0"


def aot_dir() -> Path:
    """Where the packages live: ``cache_dir() / "aoti"`` (``$SPECPRIM_CACHE`` or ``~/.cache/specprim``)."""
    from specprim._paths import cache_dir

    return cache_dir() / "aoti"


class CachedForward:
    """One static-shape forward that reads and writes a :class:`transformers.StaticCache`, loaded from (or first
    compiled into) an AOTInductor package.

    ``function(*inputs)`` is the eager forward: tensors in (the last one the additive mask (1, 1, Q, W) whose width
    ``W`` is the attended window), tensors out, KV entries written through the cache's layers. Calling the instance
    with ``cache`` and the same inputs runs the package on the same cache tensors, with the same effect: the Q new KV
    entries are written from each layer's write position on, which then moves past them.
    """

    def __init__(self, runner: Callable[..., Any], path: Path) -> None:
        self.runner = runner
        self.path = path

    @classmethod
    def load_or_compile(
        cls, function: Callable[..., Any], cache: StaticCache, example: tuple[torch.Tensor, ...], key: dict[str, Any],
        settings: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> CachedForward:
        """The package for ``key`` (a JSON-able description of the weights and the shape: its ``shape`` entry is
        printed), compiled from ``function`` on ``example`` under ``settings()`` when there is none yet."""
        path = aot_dir() / f"{_digest(key)}.pt2"
        if path.is_file():
            start = time.perf_counter()
            try:
                runner = torch._inductor.aoti_load_package(str(path))
            except Exception as error:  # noqa: BLE001 - a damaged package is rebuilt, whatever the loader raises
                logger.info("compiled forward %s could not be loaded (%s); compiling it again", path.name,
                            str(error).splitlines()[0] if str(error) else type(error).__name__)
            else:
                logger.info("loaded the compiled %s in %.1f s", key["shape"], time.perf_counter() - start)
                return cls(runner, path)
        start = time.perf_counter()
        logger.info("compiling the %s into %s (once per machine; minutes on 2 CPU cores)", key["shape"], path.parent)
        with settings():
            program = _export(function, cache, example)
            # Compiled with autograd on: under no_grad, freezing a bfloat16 program fails in AOTInductor (torch
            # 2.13: "Node _tensor_constant1 ... references nonexistent attribute"); the package is the same.
            with atomic_path(path, suffix=".pt2") as partial, torch.enable_grad():  # the packager takes only .pt2
                torch._inductor.aoti_compile_and_package(program, package_path=str(partial))
        path.with_suffix(".json").write_text(json.dumps(key, indent=1, sort_keys=True))
        logger.info("compiled the %s in %.1f s", key["shape"], time.perf_counter() - start)
        return cls(torch._inductor.aoti_load_package(str(path)), path)

    def __call__(self, cache: StaticCache, *inputs: torch.Tensor) -> Any:
        """What ``function(*inputs)`` returns, its KV entries written into ``cache`` as the eager forward would."""
        write_at = cache.layers[0].cumulative_length  # (1,) long, the same for every layer
        outputs = self.runner(*inputs, write_at, *_cache_tensors(cache))
        for layer in cache.layers:
            layer.cumulative_length.add_(inputs[0].shape[1])
        return outputs


class _WithCacheInputs(torch.nn.Module):
    """``function`` with the static cache's tensors and write position as explicit inputs, for ``torch.export``:
    while it runs, the cache's layers point at the given tensors (each layer at its own copy of ``write_at``, which
    its update advances), and afterwards back at their own."""

    def __init__(self, function: Callable[..., Any], cache: StaticCache, count: int) -> None:
        super().__init__()
        self.function = function
        self.cache = cache
        self.count = count  # how many of forward's arguments are the function's inputs

    def forward(self, *arguments: torch.Tensor) -> Any:
        inputs, write_at, keys_values = arguments[: self.count], arguments[self.count], arguments[self.count + 1 :]
        own = [(layer.keys, layer.values, layer.cumulative_length) for layer in self.cache.layers]
        try:
            for index, layer in enumerate(self.cache.layers):
                layer.keys, layer.values = keys_values[2 * index], keys_values[2 * index + 1]
                layer.cumulative_length = write_at.clone()
            return self.function(*inputs)
        finally:
            for layer, (keys, values, written) in zip(self.cache.layers, own, strict=True):
                layer.keys, layer.values, layer.cumulative_length = keys, values, written


def _export(function: Callable[..., Any], cache: StaticCache, example: tuple[torch.Tensor, ...]
            ) -> torch.export.ExportedProgram:
    """The exported program of ``function`` on ``example`` (the mask last), the mask's width dynamic from the
    forward's row count up to the cache's length - 1."""
    rows, cache_length = example[0].shape[1], cache.layers[0].max_cache_len
    window = torch.export.Dim("window", min=rows, max=cache_length - 1)
    tensors = _cache_tensors(cache)
    module = _WithCacheInputs(function, cache, len(example))
    write_at = cache.layers[0].cumulative_length.clone()
    shapes = (*([None] * (len(example) - 1)), {3: window}, None, *([None] * len(tensors)))
    with torch.no_grad():
        return torch.export.export(module, (*example, write_at, *tensors), strict=False, dynamic_shapes=(shapes,))


def _cache_tensors(cache: StaticCache) -> list[torch.Tensor]:
    """keys and values of every layer, in layer order: (1, kv_heads, L, D) each."""
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap fingerprint of ``model``'s state dict (names, shapes, dtypes and float64 sums): equal for
    the same weights; different weights change it, unless crafted to keep every tensor's sum."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            total = float(tensor.detach().double().sum()) if tensor.is_floating_point() else int(tensor.sum())
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{total!r};".encode())
    return digest.hexdigest()[:24]


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def aot_applies(config: Any, *modules: torch.nn.Module) -> bool:
    """Whether the compiled static forward of ``modules`` (whose attention reads ``config``) is cached as packages: on
    CPU, on windowed SDPA (:func:`specprim.hf.windowed_attention`), with plain or pre-packed bfloat16 linears (traced
    as plain ones; the package packs them itself), not int4 ones (which no package has been checked with yet: they
    keep ``torch.compile``), unless ``SPECPRIM_AOT=0``."""
    from specprim.hf._windowed_attention import attends_windowed
    from specprim.linears import Int4Linear

    parts = [part for module in modules for part in module.modules()]
    on_cpu = all(parameter.device.type == "cpu" for module in modules for parameter in module.parameters())
    special = any(isinstance(part, Int4Linear) for part in parts)
    return aot_enabled() and on_cpu and attends_windowed(config) and not special


def package_key(dtype: torch.dtype) -> dict[str, str]:
    """What every package's key holds besides its weights and shape: the dtype, the CPU's vector capability and the
    torch and specprim versions (a package compiled for one of them is not loaded under another)."""
    from specprim import __version__

    return dict(dtype=str(dtype), cpu=torch.backends.cpu.get_cpu_capability(), torch=torch.__version__,
                specprim=__version__)
