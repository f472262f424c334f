"""Tree attention masks and position ids (pure tensor functions)."""

from specprim.masks._impl import (
    additive_mask,
    from_edges,
    topological_order,
    tree_attention_mask,
    tree_extension_mask,
    tree_position_ids,
    tree_verification_mask,
)

__all__ = [
    "additive_mask",
    "from_edges",
    "topological_order",
    "tree_attention_mask",
    "tree_extension_mask",
    "tree_position_ids",
    "tree_verification_mask",
]
