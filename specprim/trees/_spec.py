"""Tree shapes from short strings, for command lines: ``chain:4``, ``dynamic:depth=4,top_k=4,budget=16``,
``static:3,2,1`` (branching widths) and ``sampled:3,2,1`` (the same shape, siblings drawn without replacement when
sampling)."""

from __future__ import annotations

from specprim._names import TREE_SPEC_HELP
from specprim.trees._base import TreeBuilder
from specprim.trees._chain import Chain
from specprim.trees._dynamic import DynamicTree
from specprim.trees._static import StaticTree

SPEC_HELP = TREE_SPEC_HELP  # kept with the other names the command line reads before importing torch


def parse_tree(spec: str) -> TreeBuilder:
    """Build the tree shape a spec string names (see :data:`SPEC_HELP`); ``ValueError`` says what is wrong.

    ``sampled:W1,...`` is a :class:`StaticTree` with ``sample_without_replacement=True``: top-k under greedy
    decoding, SpecInfer-style sampled siblings (``"without_replacement"``, with ``q``) otherwise. At temperature
    > 0 such a tree cannot join a union (``UnionDrafter`` raises ``ValueError`` when it drafts one)."""
    kind, _, args = spec.strip().partition(":")
    try:
        if kind == "chain":
            return Chain(int(args.removeprefix("k=")))
        if kind in ("static", "sampled"):
            shape = StaticTree.from_branching([int(w) for w in args.split(",")])
            return StaticTree(paths=shape.paths, sample_without_replacement=kind == "sampled")
        if kind == "dynamic":
            fields = dict(item.split("=", 1) for item in args.split(","))
            if set(fields) != {"depth", "top_k", "budget"}:
                raise ValueError("needs depth=, top_k= and budget=")
            return DynamicTree(**{name: int(value) for name, value in fields.items()})
    except ValueError as error:
        raise ValueError(f"invalid tree spec {spec!r} ({error}); expected {SPEC_HELP}") from error
    raise ValueError(f"unknown tree kind {kind!r} in {spec!r}; expected {SPEC_HELP}")
