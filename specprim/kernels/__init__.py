"""Optional Triton kernels. ``tree_attention`` computes tree-verification attention in one fused kernel;
``use_tree_kernel(model)`` makes a transformers model use it for tree-verification forwards.

Importing this package does not import triton; :func:`triton_available` says whether it can be. The kernel runs
on CUDA tensors, or on CPU tensors in Triton's interpreter when ``TRITON_INTERPRET=1`` is set before the first
kernel launch (for tests). See ``docs/kernels.md``.
"""

from specprim.kernels._hf_attention import (
    ATTENTION_NAME,
    register_tree_attention,
    tree_attention_forward,
    use_tree_kernel,
)
from specprim.kernels._reference import dense_tree_mask, tree_attention_reference, tree_block_mask
from specprim.kernels._tree_attention import (
    interpreter_requested,
    kernel_supports_device,
    tree_attention,
    triton_available,
)

__all__ = [
    "tree_attention",
    "tree_attention_reference",
    "triton_available",
    "use_tree_kernel",
]
