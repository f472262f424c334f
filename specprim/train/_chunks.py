"""Row slices of a wide (N, V) tensor small enough to stay in a CPU's cache while a few passes run over them.

A float32 pass (an upcast, a log-sum-exp, an exponential) over a whole (N, V) batch of logits streams it through
memory once per operation; the same passes over 1 MiB at a time run several times faster on a CPU (3,616 x 8,192
logits: a log-sum-exp in 18 instead of 90 ms on 2 cores).
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_ELEMENTS", "row_chunks"]

CHUNK_ELEMENTS = 1 << 18  # 1 MiB of float32


def row_chunks(rows: torch.Tensor, elements: int = CHUNK_ELEMENTS) -> list[slice]:
    """Slices over the first dimension of (N, V) ``rows``, each about ``elements`` elements (at least one row); on
    an accelerator one slice of all (there a pass is a kernel launch, and many small ones cost more)."""
    if rows.device.type != "cpu":
        return [slice(0, rows.shape[0])]
    step = max(1, elements // rows.shape[-1])
    return [slice(start, start + step) for start in range(0, rows.shape[0], step)]
