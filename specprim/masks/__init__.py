"""Tree attention masks and position ids (pure tensor functions)."""

from specprim.masks._impl import (
    from_edges,
    topological_order,
    tree_attention_mask,
    tree_position_ids,
    tree_verification_mask,
)

__all__ = [
    "from_edges",
    "topological_order",
    "tree_attention_mask",
    "tree_position_ids",
    "tree_verification_mask",
]
