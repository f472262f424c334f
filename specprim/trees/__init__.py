"""Tree shapes used by model-based drafters: a `TreeBuilder` grows a `DraftTree` with a `TreeDraftModel`.

- `Chain(k)`: one child per node; argmax when greedy, sampled (``"iid"``, with ``q``) otherwise.
- `StaticTree(paths=...)`: a fixed sparse tree of sibling ranks (Medusa-style), deterministic top-k.
- `DynamicTree(depth=, top_k=, budget=)`: EAGLE-2's expand-by-value and rerank, deterministic.
- `parse_tree(spec)`: any of them from a command-line string.
"""

from specprim.trees._base import TreeBuilder, TreeDraftModel
from specprim.trees._chain import Chain
from specprim.trees._dynamic import DynamicTree
from specprim.trees._spec import SPEC_HELP, parse_tree
from specprim.trees._static import StaticTree

__all__ = ["SPEC_HELP", "Chain", "DynamicTree", "StaticTree", "TreeBuilder", "TreeDraftModel", "parse_tree"]
