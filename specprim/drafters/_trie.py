"""Merging token trees into one trie: shared by prompt lookup (its continuations) and the union drafter."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def merge_trees(trees: Iterable[tuple[Sequence[int], Sequence[int]]]) -> tuple[list[int], list[int], list[list[int]]]:
    """Merge ``(tokens, parents)`` trees (parents topological, ``-1`` = child of the root) into one trie.

    Trees are added in order, node by node; a node whose (merged parent, token) already exists is shared, so no two
    siblings share a token and merged nodes are numbered in insertion order (parents first).

    Returns the trie's ``tokens`` and ``parents`` lists and, per input tree, the merged id of each of its nodes.
    """
    tokens: list[int] = []
    parents: list[int] = []
    maps: list[list[int]] = []
    node_of: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for tree_tokens, tree_parents in trees:
        to_merged: list[int] = []
        for token, parent in zip(tree_tokens, tree_parents, strict=True):
            key = (-1 if parent == -1 else to_merged[parent], token)
            node = node_of.get(key)
            if node is None:
                node = node_of[key] = len(tokens)
                tokens.append(token)
                parents.append(key[0])
            to_merged.append(node)
        maps.append(to_merged)
    return tokens, parents, maps
