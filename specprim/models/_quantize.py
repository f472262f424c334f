"""Weight-only int8 quantization of a loaded causal LM's ``nn.Linear`` layers (activations stay floating point).

Every linear weight ``W`` of shape ``(N, K)`` becomes an int8 matrix ``Q`` and one scale per output channel,
``s[n] = max_k |W[n, k]| / 127`` (symmetric, no zero point), with ``Q = clamp(round(W / s), -127, 127)``.
A forward computes ``y = (x @ Q^T) * s + b`` with ``x`` in the model's floating dtype. The kernel depends on the
activation dtype only (never on the number of rows): bfloat16 / float16 use PyTorch's fused op
``torch._weight_int8pack_mm`` (vectorized on AVX-512 CPUs); float32 converts ``Q`` to float32 per call and
runs a dense matmul, because that op's float32 CPU path is a scalar loop (10x slower than dense on 16 rows).

Why weight-only: every output row depends on its own input row only (up to floating-point summation order), so a
token's target distribution ``p`` is the same whether it is scored alone (plain decoding) or inside a tree of N
draft tokens (one verification forward). Dynamic activation quantization (``torch.ao.quantization.quantize_dynamic``)
picks the activation scale from the whole input batch, so ``p`` for one token would depend on the other tokens in
the same forward: the tree verification would score a different model than plain decoding, and speculation would
not be lossless with respect to the quantized target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SCHEMES = ("int8", "int8-all")
_QMAX = 127


class Int8Linear(nn.Module):
    """A drop-in replacement for ``nn.Linear`` holding an int8 weight and per-output-channel scales.

    Buffers: ``weight_int8`` ``(N, K)`` int8; ``scale`` ``(N,)`` in the original weight's floating dtype (it follows
    ``model.to(dtype)``, the int8 buffer does not). ``bias`` ``(N,)`` or ``None`` is kept as it was.

    ``forward``: ``(..., K)`` -> ``(..., N)`` in the input's dtype; row-independent (see the module docstring).
    """

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if weight_int8.dtype != torch.int8 or weight_int8.dim() != 2:
            raise ValueError(f"weight_int8 must be a 2-D int8 tensor, got {weight_int8.dtype} "
                             f"{tuple(weight_int8.shape)}")
        if scale.shape != weight_int8.shape[:1] or not scale.is_floating_point():
            raise ValueError(f"scale must be a floating ({weight_int8.shape[0]},) tensor, got {scale.dtype} "
                             f"{tuple(scale.shape)}")
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantize ``linear`` (its weight read in fp32; the scales are stored in the weight's dtype)."""
        weight = linear.weight.detach()
        amax = weight.float().abs().amax(dim=1)
        scale = torch.where(amax > 0, amax / _QMAX, torch.ones_like(amax)).to(weight.dtype)
        quantized = torch.round(weight.float() / scale.float()[:, None]).clamp_(-_QMAX, _QMAX).to(torch.int8)
        return cls(quantized, scale, linear.bias)

    @property
    def weight(self) -> torch.Tensor:
        """The de-quantized weight ``Q * s[:, None]``, ``(N, K)`` in the scales' dtype: a new full-size tensor per
        access, for code that reads a layer's weight (e.g. drafters sharing the target's LM head)."""
        return self.weight_int8.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        scale = self.scale if self.scale.dtype == x.dtype else self.scale.to(x.dtype)
        if x.dtype == torch.float32:
            out = F.linear(rows, self.weight_int8.to(torch.float32)) * scale
        else:
            out = torch._weight_int8pack_mm(rows.contiguous(), self.weight_int8, scale)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_weights(model: nn.Module, scheme: str = "int8", *, include_lm_head: bool = False) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` by weight-only quantized ones, in place; return ``model``.

    Args:
        model: a loaded model (e.g. from :func:`specprim.models.load`), on CPU or CUDA, in float32, bfloat16 or
            float16. Embeddings and normalization layers are left as they are.
        scheme: ``"int8"``: symmetric int8 weights with one scale per output channel (see :class:`Int8Linear`),
            every linear layer but the LM head; ``"int8-all"``: the same, the LM head included.
        include_lm_head: also quantize the output projection (``model.get_output_embeddings()``), as ``"int8-all"``
            does. Off by default: the LM head is often tied to the embeddings (the input embeddings then stay in the
            floating dtype, untied), and drafters that share it read a de-quantized copy. On small models it is a
            large share of the weights (SmolLM2-135M: 28M of 135M parameters), so quantizing it pays most there.

    Guarantees: the quantized layers are row-independent, so speculative decoding with a quantized target is
    lossless with respect to that quantized target (it matches the quantized model's own ``generate``).

    Raises:
        ValueError: an unknown ``scheme``; the model is already quantized; it has no ``nn.Linear`` to quantize
            (e.g. GPT-2's ``Conv1D`` layers are not ``nn.Linear``).
        RuntimeError: a layer's device or dtype has no int8 weight-only kernel (e.g. ``meta`` or MPS weights, or
            an offloaded model).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}; supported: {', '.join(SCHEMES)}")
    if any(isinstance(module, Int8Linear) for module in model.modules()):
        raise ValueError("the model is already quantized (it has Int8Linear layers)")
    include_lm_head = include_lm_head or scheme == "int8-all"
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and (include_lm_head or child is not output)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers to quantize")
    for key in {(child.weight.device, child.weight.dtype) for _, _, child in targets}:
        _check_kernel(*key)
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear.from_linear(child))
    return model


def _check_kernel(device: torch.device, dtype: torch.dtype) -> None:
    """Run a tiny :class:`Int8Linear` once on ``device`` in ``dtype``; raise a clear error if it cannot run."""
    if not dtype.is_floating_point:
        raise RuntimeError(f"cannot quantize a linear layer with {dtype} weights; expected a floating dtype")
    if device.type == "meta":
        raise RuntimeError("int8 weight-only quantization is not supported on device meta: the weights are not "
                           "loaded (an offloaded or not yet materialized model)")
    try:
        weight = torch.zeros(8, 32, device=device, dtype=torch.int8)
        Int8Linear(weight, torch.ones(8, device=device, dtype=dtype))(torch.zeros(1, 32, device=device, dtype=dtype))
    except (RuntimeError, NotImplementedError) as error:
        raise RuntimeError(f"int8 weight-only quantization is not supported for {dtype} weights on device "
                           f"{device!s}: {error}") from error
