"""Pre-packed bfloat16 linear layers for CPUs: the same weights, stored once in oneDNN's blocked layout.

``F.linear`` on a bfloat16 CPU tensor hands oneDNN a plain row-major weight, which it re-arranges on every call.
:func:`pack_weights` does that re-arrangement once per layer (``torch.ops.mkldnn._reorder_linear_weight``, the
op behind inductor's weight pre-packing) and computes every forward with ``torch.ops.mkldnn._linear_pointwise``.
Nothing is approximated: the weights are the model's own bfloat16 values and products are accumulated in fp32.

Measured on a 2-core AVX512-BF16/AMX CPU (SmolLM2-135M, bfloat16, 200-token context, see ``docs/models.md``): a
one-token step 38.9 -> 33.4 ms, a 16-token verification 59.9 -> 45.3 ms.

Exactness: a packed layer's output equals ``F.linear``'s bit for bit, whatever the number of rows (tested), so a
packed target computes what the stock model computes. Row independence is oneDNN's: up to 32 rows every output row
equals that row computed alone (tested); from 33 rows on, oneDNN may switch kernels and round a row an ulp apart on
some CPUs, packed or not (seen on an AVX512-BF16/AMX machine). Speculation with a packed target is lossless with
respect to that packed target, as with the stock model, up to that rounding (prefills of more than 32 tokens).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from specprim.linears._quantize import QUANTIZED_LINEARS

# Batch-size hint for oneDNN's weight layout; any number of rows works with every layout.
_ROWS_HINT = 16
_switched_off = False  # set by stock_kernels()


@contextlib.contextmanager
def stock_kernels() -> Iterator[None]:
    """Inside this context every :class:`PackedLinear` computes ``F.linear`` with its own weight, i.e. exactly the
    unpacked model: the baseline that shows what packing itself gains (``specprim bench --method hf-unpacked``)."""
    global _switched_off
    before, _switched_off = _switched_off, True
    try:
        yield
    finally:
        _switched_off = before


class PackedLinear(nn.Module):
    """A drop-in replacement for a bfloat16 ``nn.Linear`` on CPU that keeps a pre-packed copy of its weight.

    ``weight`` ``(N, K)`` and ``bias`` ``(N,)`` / ``None`` are the original parameters, shared (a tied LM head stays
    tied for code that reads it); the packed copy is a non-persistent buffer, so ``state_dict`` and
    ``save_pretrained`` are unchanged. It is made once: changing ``weight`` afterwards does not change the outputs.
    ``forward``: ``(..., K)`` -> ``(..., N)`` bfloat16; when autograd needs a gradient it computes ``F.linear``
    instead (the packed op has no backward), and so it does inside :func:`stock_kernels`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        _check_packable(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _ROWS_HINT)
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise ValueError(f"PackedLinear computes in bfloat16; got a {x.dtype} input")
        if _switched_off or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)  # stock path (the packed op has no backward)
        rows = x.reshape(-1, self.in_features)  # (R, K)
        bias = None if self.bias is None else self.bias.detach()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, bias, "none", [], "")  # (R, N)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        probe = fn(torch.empty(0, dtype=torch.bfloat16))
        if probe.dtype != torch.bfloat16 or probe.device.type != "cpu":
            raise RuntimeError("a model with packed weights stays bfloat16 on CPU; load it again to change its "
                               "dtype or device (or call .to() before pack_weights)")
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def is_packed(model: nn.Module) -> bool:
    """Whether ``model`` has :class:`PackedLinear` layers."""
    return any(isinstance(module, PackedLinear) for module in model.modules())


def pack_weights(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of a bfloat16 CPU ``model`` (the LM head included) by a :class:`PackedLinear`,
    in place; return ``model``.

    The quantized layers of a quantized model (:class:`Int8Linear`, :class:`Int4Linear`) are left as they are; its
    remaining linears are packed.
    Memory: each packed layer holds a second copy of its weight (about twice the linear weights in all).

    Raises:
        ValueError: the model is already packed, or it has no ``nn.Linear`` to pack.
        RuntimeError: a linear's weight is not bfloat16 on CPU, or this CPU / PyTorch build has no oneDNN
            bfloat16 support.
    """
    if is_packed(model):
        raise ValueError("the model's weights are already packed (it has PackedLinear layers)")
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and not isinstance(child, QUANTIZED_LINEARS)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers to pack")
    for _, _, child in targets:
        _check_packable(child.weight)
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return model


def pack_like(module: nn.Module, target: nn.Module) -> nn.Module:
    """``module`` (a draft head loaded onto ``target``) with its linears packed, in place, when ``target``'s are
    (:func:`pack_weights`); else ``module`` as it is. A packed head computes the same outputs, bit for bit per layer,
    and drafts faster on CPU; it is for inference (its packed copies do not follow training updates)."""
    return pack_weights(module) if is_packed(target) and not is_packed(module) else module


def packing_supported() -> bool:
    """Whether this CPU and PyTorch build can pack bfloat16 weights (oneDNN with native bfloat16: AVX512-BF16 or
    AMX). Elsewhere, bfloat16 on CPU is emulated and float32 is the faster dtype."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def native_dtype() -> str:
    """``"bfloat16"`` where this machine computes it natively (a CUDA GPU, or a CPU with AVX512-BF16 or AMX), else
    ``"float32"``: on a CPU without them (AVX2 only, say) bfloat16 matmuls run an emulated kernel (one of
    Qwen2.5-Coder-1.5B's MLP linears on 256 tokens: 7x slower than in float32 on a 2-core AVX2 AMD EPYC)."""
    bf16_cpu = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
    return "bfloat16" if torch.cuda.is_available() or bf16_cpu else "float32"


def _check_packable(weight: torch.Tensor) -> None:
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        raise RuntimeError(f"weight packing is for bfloat16 weights on CPU; got {weight.dtype} on {weight.device}. "
                           "Load the model with dtype=torch.bfloat16 (on CUDA, or in float32, use it unpacked)")
    if not packing_supported():
        raise RuntimeError("weight packing needs oneDNN with bfloat16 support, which this CPU or PyTorch build "
                           "lacks; use the model unpacked")

