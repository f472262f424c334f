"""Weight-only quantization of a loaded causal LM's ``nn.Linear`` layers (activations stay floating point).

Two layouts:

* **int8** (:class:`Int8Linear`): every linear weight ``W`` of shape ``(N, K)`` becomes an int8 matrix ``Q`` and one
  scale per output channel, ``s[n] = max_k |W[n, k]| / 127`` (symmetric, no zero point), with
  ``Q = clamp(round(W / s), -127, 127)``. A forward computes ``y = (x @ Q^T) * s + b``. bfloat16 / float16 use
  PyTorch's fused op ``torch._weight_int8pack_mm`` (vectorized on AVX-512 CPUs); float32 converts ``Q`` to float32
  per call and runs a dense matmul, because that op's float32 CPU path is a scalar loop (10x slower than dense on
  16 rows). CPU and CUDA.
* **int4** (:class:`Int4Linear`): each run of ``GROUP_SIZE`` (32) weights along a row gets its own scale and
  minimum, ``W[n, k] ~ s[n, g] * q[n, k] + m[n, g]`` with ``q`` in ``0..15`` (asymmetric): the layout of GGUF's
  ``Q4_1`` blocks, so a model de-quantized from a ``Q4_1`` file is re-encoded almost exactly (up to the rounding of
  the scales to the model's dtype). The forward is PyTorch's ``torch._weight_int4pack_mm_for_cpu`` (CPU only), which
  reads a quarter of the bytes of bfloat16 weights: on a CPU whose forward is bound by memory bandwidth, it is the
  layout that makes one forward faster.

Why weight-only: every output row depends on its own input row only (up to floating-point summation order, and
for both kernels bit for bit whatever the number of rows, tested), so a token's target distribution ``p`` is the
same whether it is scored alone (plain decoding) or inside a tree of N draft tokens (one verification forward).
Dynamic activation quantization (``torch.ao.quantization.quantize_dynamic``) picks the activation scale from the
whole input batch, so ``p`` for one token would depend on the other tokens in the same forward: the tree
verification would score a different model than plain decoding, and speculation would not be lossless with
respect to the quantized target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SCHEMES = ("int8", "int8-all", "int4", "int4-all")
_QMAX = 127
GROUP_SIZE = 32  # int4: weights per (scale, minimum) pair along a row, as in GGUF Q4_0 / Q4_1 blocks
_INT4_LEVELS = 15  # q in 0..15
_INT4_OFFSET = 8  # the kernel computes (q - 8) * scale + zero


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


class Int4Linear(nn.Module):
    """A drop-in replacement for ``nn.Linear`` on CPU holding 4-bit weights with a scale and a minimum per group of
    :data:`GROUP_SIZE` (32) weights along each row: ``W[n, k] ~ scale[n, g] * q[n, k] + minimum[n, g]``,
    ``g = k // 32``, ``q`` in ``0..15``.

    Buffers: ``weight_int4`` ``(N, K // 2)`` uint8, two 4-bit values per byte (``q[n, 2j]`` in the low nibble of byte
    ``j``, ``q[n, 2j + 1]`` in the high one); ``scales_and_zeros`` ``(K // 32, N, 2)`` in the original weight's
    floating dtype (it follows ``model.to(dtype)``), ``[..., 0]`` the scale and ``[..., 1]`` the zero
    ``minimum + 8 * scale``, so that ``W = (q - 8) * scale + zero``. ``bias`` ``(N,)`` or ``None`` is kept as it was.
    The forward reads a second copy of the 4-bit values in the kernel's own blocked layout, a non-persistent buffer
    made once (``state_dict`` holds the plain layout above). Shapes: ``N`` a multiple of 16 and ``K`` a multiple of
    32 (the kernel's), checked by :func:`quantize_weights`.

    ``forward``: ``(..., K)`` -> ``(..., N)`` in the input's dtype (bfloat16, float16 or float32), by
    ``torch._weight_int4pack_mm_for_cpu``; row-independent.
    """

    def __init__(self, weight_int4: torch.Tensor, scales_and_zeros: torch.Tensor,
                 bias: torch.Tensor | None = None):
        super().__init__()
        if weight_int4.dtype != torch.uint8 or weight_int4.dim() != 2:
            raise ValueError(f"weight_int4 must be a 2-D uint8 tensor (two 4-bit values per byte), got "
                             f"{weight_int4.dtype} {tuple(weight_int4.shape)}")
        self.out_features, self.in_features = weight_int4.shape[0], 2 * weight_int4.shape[1]
        expected = (self.in_features // GROUP_SIZE, self.out_features, 2)
        if tuple(scales_and_zeros.shape) != expected or not scales_and_zeros.is_floating_point():
            raise ValueError(f"scales_and_zeros must be a floating {expected} tensor, got {scales_and_zeros.dtype} "
                             f"{tuple(scales_and_zeros.shape)}")
        self.register_buffer("weight_int4", weight_int4.contiguous())
        self.register_buffer("scales_and_zeros", scales_and_zeros.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        # the tile argument is unused on CPU
        kernel_layout = torch._convert_weight_to_int4pack_for_cpu(self._levels().to(torch.int32), 1)
        self.register_buffer("kernel_weight", kernel_layout, persistent=False)  # (N, K // 2) uint8, blocked

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        """Quantize ``linear``: per group, the scale ``(max - min) / 15`` and the minimum, rounded to the weight's
        dtype; ``q = round((W - zero) / scale) + 8`` against those rounded values, clamped to ``0..15``. A group whose
        weights are all equal is exact (the scale is then chosen so that the zero stays exact)."""
        weight = linear.weight.detach()
        out_features, in_features = weight.shape
        groups = weight.float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)  # (N, G, 32)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # (N, G)
        flat = torch.where(low != 0, low.abs() / _INT4_OFFSET, torch.ones_like(low))  # keeps min + 8 * scale exact
        scale = torch.where(high > low, (high - low) / _INT4_LEVELS, flat).to(weight.dtype)
        zero = (low + _INT4_OFFSET * scale.float()).to(weight.dtype)
        q = torch.round((groups - zero.float()[..., None]) / scale.float()[..., None]) + _INT4_OFFSET
        q = q.clamp_(0, _INT4_LEVELS).to(torch.uint8).reshape(out_features, in_features)  # (N, K)
        packed = q[:, 0::2] | (q[:, 1::2] << 4)  # (N, K // 2)
        scales_and_zeros = torch.stack([scale.t(), zero.t()], dim=-1)  # (G, N, 2)
        return cls(packed, scales_and_zeros, linear.bias)

    def _levels(self) -> torch.Tensor:
        """The 4-bit values ``q`` ``(N, K)`` uint8, unpacked from ``weight_int4``."""
        low, high = self.weight_int4 & 0xF, self.weight_int4 >> 4  # (N, K // 2) each
        return torch.stack([low, high], dim=-1).reshape(self.out_features, self.in_features)

    @property
    def weight(self) -> torch.Tensor:
        """The de-quantized weight ``(q - 8) * scale + zero`` (computed in float32), ``(N, K)`` in the scales' dtype:
        a new full-size tensor per access, for code that reads a layer's weight (e.g. drafters sharing the target's
        LM head)."""
        scale, zero = self.scales_and_zeros.float().unbind(-1)  # (G, N) each
        levels = self._levels().float().reshape(self.out_features, -1, GROUP_SIZE)  # (N, G, 32)
        weight = (levels - _INT4_OFFSET) * scale.t()[..., None] + zero.t()[..., None]
        return weight.reshape(self.out_features, self.in_features).to(self.scales_and_zeros.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()  # (R, K)
        scales_and_zeros = self.scales_and_zeros.to(rows.dtype)
        out = torch._weight_int4pack_mm_for_cpu(rows, self.kernel_weight, GROUP_SIZE, scales_and_zeros)  # (R, N)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        if fn(torch.empty(0)).device.type != "cpu":
            raise RuntimeError("an int4-quantized model stays on the CPU (its kernel is CPU-only); load it again and "
                               "quantize with int8 to run on another device")
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"group_size={GROUP_SIZE}")


QUANTIZED_LINEARS = (Int8Linear, Int4Linear)
_LAYER_OF = {"int8": Int8Linear, "int4": Int4Linear}


def quantize_weights(model: nn.Module, scheme: str = "int8", *, include_lm_head: bool = False) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` by weight-only quantized ones, in place; return ``model``.

    Args:
        model: a loaded model (e.g. from :func:`specprim.models.load`). int8: on CPU or CUDA, in float32, bfloat16
            or float16; int4: on CPU. Embeddings and normalization layers are left as they are.
        scheme: ``"int8"``: symmetric int8 weights with one scale per output channel (see :class:`Int8Linear`),
            every linear layer but the LM head; ``"int4"``: 4-bit weights in groups of 32 with a scale and a
            minimum each (see :class:`Int4Linear`), every linear layer but the LM head; ``"int8-all"`` /
            ``"int4-all"``: the same, the LM head included.
        include_lm_head: also quantize the output projection (``model.get_output_embeddings()``), as the ``-all``
            schemes do. Off by default: the LM head is often tied to the embeddings (the input embeddings then stay
            in the floating dtype, untied), and drafters that share it read a de-quantized copy. On small models it
            is a large share of the weights (SmolLM2-135M: 28M of 135M parameters), so quantizing it pays most there.

    Guarantees: the quantized layers are row-independent, so speculative decoding with a quantized target is
    lossless with respect to that quantized target (it matches the quantized model's own ``generate``).

    Raises:
        ValueError: an unknown ``scheme``; the model is already quantized; it has no ``nn.Linear`` to quantize
            (e.g. GPT-2's ``Conv1D`` layers are not ``nn.Linear``); int4: a layer whose output size is not a
            multiple of 16 or whose input size is not a multiple of 32 (named in the message).
        RuntimeError: a layer's device or dtype has no kernel for the scheme (e.g. ``meta`` or MPS weights, an
            offloaded model, or int4 off the CPU).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}; supported: {', '.join(SCHEMES)}")
    if any(isinstance(module, QUANTIZED_LINEARS) for module in model.modules()):
        raise ValueError("the model is already quantized (it has Int8Linear or Int4Linear layers)")
    kind = scheme.removesuffix("-all")
    layer = _LAYER_OF[kind]
    include_lm_head = include_lm_head or scheme.endswith("-all")
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and (include_lm_head or child is not output)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers to quantize")
    if layer is Int4Linear:
        _check_int4_shapes(model, [child for _, _, child in targets])
    for key in {(child.weight.device, child.weight.dtype) for _, _, child in targets}:
        _check_kernel(kind, *key)
    for parent, name, child in targets:
        setattr(parent, name, layer.from_linear(child))
    return model


def _check_int4_shapes(model: nn.Module, linears: list[nn.Linear]) -> None:
    names = {id(module): name for name, module in model.named_modules()}
    bad = [f"{names[id(linear)]} ({linear.out_features} x {linear.in_features})" for linear in linears
           if linear.out_features % 16 or linear.in_features % GROUP_SIZE]
    if bad:
        raise ValueError(f"int4 quantization needs linear layers with an output size that is a multiple of 16 and an "
                         f"input size that is a multiple of {GROUP_SIZE}; these are not: {', '.join(bad[:5])}"
                         + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


def _check_kernel(kind: str, device: torch.device, dtype: torch.dtype) -> None:
    """Run a tiny quantized layer of ``kind`` once on ``device`` in ``dtype``; raise a clear error if it cannot."""
    if not dtype.is_floating_point:
        raise RuntimeError(f"cannot quantize a linear layer with {dtype} weights; expected a floating dtype")
    if device.type == "meta":
        raise RuntimeError(f"{kind} weight-only quantization is not supported on device meta: the weights are not "
                           "loaded (an offloaded or not yet materialized model)")
    if kind == "int4" and device.type != "cpu":
        raise RuntimeError(f"int4 weight-only quantization runs on CPU only (PyTorch's "
                           f"_weight_int4pack_mm_for_cpu); the weights are on {device!s}. Use int8 there")
    try:
        probe = nn.Linear(GROUP_SIZE, 16, bias=False, device=device, dtype=dtype)
        _LAYER_OF[kind].from_linear(probe)(torch.zeros(1, GROUP_SIZE, device=device, dtype=dtype))
    except (RuntimeError, NotImplementedError) as error:
        raise RuntimeError(f"{kind} weight-only quantization is not supported for {dtype} weights on device "
                           f"{device!s}: {error}") from error
