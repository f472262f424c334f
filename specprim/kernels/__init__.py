"""Optional Triton kernels. ``tree_attention`` computes tree-verification attention in one fused kernel;
``use_tree_kernel(model)`` makes a transformers model use it for tree-verification forwards.

Importing this package does not import triton; :func:`triton_available` says whether it can be. The kernel runs
on CUDA tensors, or on CPU tensors in Triton's interpreter when ``TRITON_INTERPRET=1`` is set before the first
kernel launch (for tests). See ``docs/kernels.md``.
"""

from specprim.kernels._hf_attention import (
    ATTENTION_NAME as ATTENTION_NAME,
)
from specprim.kernels._hf_attention import (
    register_tree_attention as register_tree_attention,
)
from specprim.kernels._hf_attention import (
    tree_attention_forward as tree_attention_forward,
)
from specprim.kernels._hf_attention import (
    use_tree_kernel,
)
from specprim.kernels._reference import dense_tree_mask as dense_tree_mask
from specprim.kernels._reference import tree_attention_reference
from specprim.kernels._reference import tree_block_mask as tree_block_mask
from specprim.kernels._tree_attention import (
    interpreter_requested as interpreter_requested,
)
from specprim.kernels._tree_attention import (
    kernel_supports_device as kernel_supports_device,
)
from specprim.kernels._tree_attention import (
    tree_attention,
    triton_available,
)

__all__ = [
    "tree_attention",
    "tree_attention_reference",
    "triton_available",
    "use_tree_kernel",
]
