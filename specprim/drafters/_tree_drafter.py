"""A drafter made of a tree-drafting model and a tree shape policy."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.trees import TreeBuilder, TreeDraftModel


@runtime_checkable
class TreeShaped(Protocol):
    """A drafter that grows its tree with ``tree.build(model, request)``: :class:`TreeDrafter` and the drafters that
    hold their own model and tree the same way (``ModelDrafter``, ``EarlyExit``). Its ``tree`` may be swapped on a
    copy (``specprim.presets.with_tree``)."""

    model: TreeDraftModel
    tree: TreeBuilder


def check_tree_parts(model: object, tree: object) -> None:
    """``TypeError`` unless ``model`` is a :class:`TreeDraftModel` and ``tree`` a :class:`TreeBuilder`."""
    if not isinstance(model, TreeDraftModel):
        raise TypeError(f"{type(model).__name__} does not implement TreeDraftModel (begin / extend)")
    if not isinstance(tree, TreeBuilder):
        raise TypeError(f"{type(tree).__name__} is not a tree builder (no build method)")


class TreeDrafter:
    """Grows a tree with ``tree.build(model, request)``: any `TreeDraftModel` with any `TreeBuilder`.

    ``feature_layers`` is the model's (empty when it needs no target hidden states), so the loop hands the
    model the target features it asked for. The q-contract is the builder's: it declares how the tokens were
    chosen from the model's logits.
    """

    def __init__(self, model: TreeDraftModel, tree: TreeBuilder) -> None:
        check_tree_parts(model, tree)
        self.model = model
        self.tree = tree

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(getattr(self.model, "feature_layers", ()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, tree={self.tree!r})"

    def propose(self, request: DraftRequest) -> DraftTree:
        return self.tree.build(self.model, request)

    def observe(self, verdict: Verdict) -> None:
        """Nothing to do: the model re-synchronises with the committed tokens in its next ``begin``."""
