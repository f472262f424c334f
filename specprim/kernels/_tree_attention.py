"""``tree_attention``: input checks and dispatch to the Triton kernel, which is imported only when first used."""

from __future__ import annotations

import importlib.util
import math
import os

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 128


def triton_available() -> bool:
    """True when the ``triton`` package is installed (it is optional; nothing else in specprim needs it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken install, or sys.modules["triton"] = None
        return False


def interpreter_requested() -> bool:
    """True when ``TRITON_INTERPRET=1`` is set, which lets the kernel run on CPU tensors (slowly, for tests)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def kernel_supports_device(device: torch.device) -> bool:
    """True when :func:`tree_attention` can run on ``device``: CUDA with triton installed, or any device when
    ``TRITON_INTERPRET=1`` is set."""
    return triton_available() and (device.type == "cuda" or interpreter_requested())


def tree_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tree_mask: torch.Tensor,
    prefix_length: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of the ``[root] + tree`` queries over ``prefix + [root] + tree`` keys, in one Triton kernel.

    Args:
        q: (B, H, Q, D) queries of the ``Q = 1 + N`` tree tokens (root first).
        k: (B, Hkv, P + Q, D) keys: the ``P`` committed prefix tokens, then the ``Q`` tree tokens.
        v: (B, Hkv, P + Q, D) values, laid out like ``k``.
        tree_mask: (Q, Q) bool, shared by every batch row, or (B, Q, Q) bool, one per row. ``tree_mask[..., i, j]``
            is True iff query ``i`` may see tree key ``j`` (ancestor-or-self for a draft tree; row 0, the root,
            sees only itself). Prefix keys need no mask: every query sees all of them.
        prefix_length: ``P >= 0``, the number of committed keys before the tree block.
        scale: softmax scale; ``1 / sqrt(D)`` when None.

    Returns:
        (B, H, Q, D) tensor of ``q.dtype``, equal (up to rounding) to
        :func:`specprim.kernels.tree_attention_reference`. Softmax runs in float32. A query row that may see no
        key at all returns zeros.

    ``Hkv`` must divide ``H`` (grouped-query attention: query head ``h`` reads key/value head
    ``h // (H // Hkv)``). ``D <= 128``; other sizes than powers of two are padded inside the kernel. dtypes:
    float32, bfloat16, float16, the same for ``q``, ``k`` and ``v``. Tensors may be non-contiguous.

    Raises:
        TypeError: non-tensor inputs, unsupported or mixed dtypes, a non-bool mask.
        ValueError: inconsistent shapes, tensors on different devices, or a device the kernel cannot use
            (CPU without ``TRITON_INTERPRET=1``).
        ImportError: triton is not installed.
        RuntimeError: CPU tensors while triton or the kernel was built before ``TRITON_INTERPRET=1`` was set.
    """
    tree_len = _check_inputs(q, k, v, tree_mask, prefix_length)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if not triton_available():
        raise ImportError("tree_attention needs triton: pip install triton (or specprim[triton])")
    from specprim.kernels import _triton_kernel

    if q.device.type != "cuda" and not _triton_kernel.INTERPRETED:
        raise RuntimeError(
            "the Triton kernels were built for the GPU: TRITON_INTERPRET=1 must be set before triton is first "
            "imported (importing transformers imports it) and before the first tree_attention call"
        )
    batch = q.shape[0]
    mask = tree_mask.to(torch.uint8)  # (Q, Q) or (B, Q, Q); triton reads bytes
    mask = mask.expand(batch, tree_len, tree_len) if mask.dim() == 2 else mask  # (B, Q, Q), stride 0 when shared
    return _triton_kernel.launch(q, k, v, mask, int(prefix_length), float(scale))


def _check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor, prefix_length: int
) -> int:
    """Validate shapes, dtypes and devices; return ``Q``."""
    for name, tensor in (("q", q), ("k", k), ("v", v), ("tree_mask", tree_mask)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"{name} must be 4D (batch, heads, length, head_dim), got shape {tuple(tensor.shape)}")
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}; supported: float32, bfloat16, float16")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if tree_mask.dtype != torch.bool:
        raise TypeError(f"tree_mask must be a bool tensor, got {tree_mask.dtype}")
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int) or prefix_length < 0:
        raise ValueError(f"prefix_length must be an int >= 0, got {prefix_length!r}")

    batch, num_heads, tree_len, head_dim = q.shape
    if tree_len < 1 or head_dim < 1:
        raise ValueError(f"q needs at least one query and one head dimension, got shape {tuple(q.shape)}")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} exceeds the kernel's maximum of {MAX_HEAD_DIM}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    kv_batch, num_kv_heads, kv_len, kv_dim = k.shape
    if kv_batch != batch or kv_dim != head_dim:
        raise ValueError(
            f"k/v shape {tuple(k.shape)} does not match q shape {tuple(q.shape)} in batch or head_dim"
        )
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
    if kv_len != prefix_length + tree_len:
        raise ValueError(
            f"k/v hold {kv_len} keys but prefix_length + Q = {prefix_length} + {tree_len} = "
            f"{prefix_length + tree_len}"
        )
    if tree_mask.shape not in ((tree_len, tree_len), (batch, tree_len, tree_len)):
        raise ValueError(
            f"tree_mask must have shape ({tree_len}, {tree_len}) or ({batch}, {tree_len}, {tree_len}), "
            f"got {tuple(tree_mask.shape)}"
        )
    devices = {t.device for t in (q, k, v, tree_mask)}
    if len(devices) > 1:
        raise ValueError(f"q, k, v and tree_mask must be on one device, got {sorted(map(str, devices))}")
    if q.device.type != "cuda" and not interpreter_requested():
        raise ValueError(
            f"tree_attention runs on CUDA tensors; got {q.device}. Set TRITON_INTERPRET=1 to run the kernel "
            "in Triton's CPU interpreter (slow, for tests)"
        )
    return tree_len
