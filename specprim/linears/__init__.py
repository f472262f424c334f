"""Linear layers both the model loaders and the verifiers use: weight-only int8 / int4 (:func:`quantize_weights`)
and bfloat16 weights pre-packed for oneDNN on CPU (:func:`pack_weights`). ``specprim.models`` re-exports them."""

from specprim.linears._pack import (
    PackedLinear,
    is_packed,
    native_dtype,
    pack_like,
    pack_weights,
    packing_supported,
    stock_kernels,
)
from specprim.linears._quantize import QUANTIZED_LINEARS, SCHEMES, Int4Linear, Int8Linear, quantize_weights

__all__: list[str] = []  # documented through specprim.models, which re-exports every name here
