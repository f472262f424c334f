"""Several drafters at once: their trees merged into one trie that the target verifies in a single forward."""

from __future__ import annotations

import dataclasses

import torch

from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.drafters._base import Drafter
from specprim.drafters._trie import merge_trees

__all__ = ["UnionDrafter"]


class UnionDrafter:
    """Every step, each drafter proposes its own tree; the union is their merged trie (e.g. an EAGLE tree plus the
    prompt-lookup continuations, so text that repeats the prompt and text the head predicts both get drafted).

    Merging: the drafters' trees are added in the given order, node by node in each tree's topological order; a
    node whose (merged parent, token) is already present is shared, so siblings keep distinct tokens, the first
    drafter's nodes come first and keep their sibling order, and the union has at most the sum of the sizes. A
    step where every drafter drafts nothing costs one plain target forward.

    Losslessness: every drafter must draft deterministically (``sampling="deterministic"``: greedy chains, top-k
    and dynamic trees, prompt lookup), and the union is then deterministic too. A deterministic rule (e.g.
    :class:`specprim.acceptance.SpeculativeSampling` on deterministic trees, :class:`specprim.acceptance.Greedy`)
    is lossless for any set of distinct candidates chosen independently of the target's draws. Sampled trees are
    refused: their rule depends on the ``q`` each node was drawn from, which a node of the union (shared by several
    drafters, or drafted by a deterministic one) no longer has. ``greedy_only`` is ``True`` when a drafter's tree
    builder is known to sample at temperature > 0 (``sampled:`` trees), so the loop refuses that union up front;
    any other sampled tree is refused when it is drafted.

    Features: ``feature_layers`` is the union of the drafters' own (in order of first appearance); each drafter
    gets a request with exactly its own layers, or ``features=None`` if it declares none.

    ``max_nodes``: when given, the merged trie keeps only its first ``max_nodes`` nodes in merge order (the first
    drafter's nodes first; a prefix of a topological order is itself a tree), so the union never outgrows a size
    the verifier handles cheaply (e.g. a :class:`specprim.hf.StaticTarget`'s padded sizes: 7 nodes plus the root
    fill an 8-token bucket). A drafter declaring ``stateless = True`` (its tree depends on the request only, and
    ``observe`` learns nothing: prompt lookup, retrieval) is not asked on a step where the drafters before it already
    fill ``max_nodes``: its nodes would all be cut, so the union is the same, without the cost of drafting them.

    ``observe``: each drafter learns the accepted path restricted to its own tree (the longest accepted prefix of
    its nodes that were kept, in its own node ids) and the token the target emitted after that prefix.

    Batch size 1 only (the merged shape depends on the data): ``ValueError`` otherwise.
    """

    def __init__(self, *drafters: Drafter, max_nodes: int | None = None) -> None:
        if max_nodes is not None and (not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < 1):
            raise ValueError(f"max_nodes must be None or a positive int, got {max_nodes!r}")
        if len(drafters) < 2:
            raise ValueError(f"UnionDrafter needs at least two drafters, got {len(drafters)}")
        for drafter in drafters:
            if not isinstance(drafter, Drafter):
                raise TypeError(f"{type(drafter).__name__} is not a Drafter (propose / observe)")
        if len({id(d) for d in drafters}) != len(drafters):
            raise ValueError("the same drafter object appears twice; pass distinct drafters")
        self.drafters = tuple(drafters)
        self.max_nodes = max_nodes
        layers = [tuple(getattr(d, "feature_layers", ())) for d in drafters]
        self.feature_layers: tuple[int, ...] = tuple(dict.fromkeys(layer for own in layers for layer in own))
        self._layer_index = [[self.feature_layers.index(layer) for layer in own] for own in layers]
        self._maps: list[list[int]] = []  # per drafter: its node i -> merged node
        self._tokens: list[int] = []  # merged node -> token

    @property
    def greedy_only(self) -> bool:
        """Whether a drafter's tree builder draws sampled siblings at temperature > 0 (the union can then only
        decode greedily)."""
        return any(getattr(getattr(d, "tree", None), "sample_without_replacement", False) or
                   getattr(d, "greedy_only", False) for d in self.drafters)

    def __repr__(self) -> str:
        cap = "" if self.max_nodes is None else f", max_nodes={self.max_nodes}"
        return f"UnionDrafter({', '.join(map(repr, self.drafters))}{cap})"

    def propose(self, request: DraftRequest) -> DraftTree:
        if request.input_ids.shape[0] != 1:
            raise ValueError(f"UnionDrafter drafts for batch size 1, got {request.input_ids.shape[0]}")
        shapes: list[tuple[list[int], list[int]]] = []  # each drafter's (tokens, parents)
        for k, drafter in enumerate(self.drafters):
            if getattr(drafter, "stateless", False) and self._full(shapes):
                shapes.append(([], []))  # every node it drafted would be cut
                continue
            tree = drafter.propose(self._request_for(k, request))
            if tree.sampling != "deterministic":
                raise ValueError(f"{drafter!r} drafted a {tree.sampling!r} tree; UnionDrafter merges deterministic "
                                 "trees only (greedy or top-k drafting, prompt lookup)")
            shapes.append((tree.tokens[0].tolist(), tree.parent_list))
        tokens, parents, self._maps = merge_trees(shapes)
        if self.max_nodes is not None:
            tokens, parents = tokens[: self.max_nodes], parents[: self.max_nodes]
        self._tokens = tokens
        device = request.input_ids.device
        return DraftTree(tokens=torch.tensor([tokens], dtype=torch.long, device=device).reshape(1, len(tokens)),
                         parents=torch.tensor(parents, dtype=torch.long).reshape(len(parents)),
                         sampling="deterministic")

    def observe(self, verdict: Verdict) -> None:
        accepted = verdict.path[0, : int(verdict.num_accepted[0])].tolist()  # merged node ids, root downwards
        for drafter, to_merged in zip(self.drafters, self._maps, strict=True):
            own = {merged: node for node, merged in enumerate(to_merged) if merged < len(self._tokens)}
            path: list[int] = []
            for merged in accepted:
                if merged not in own:
                    break
                path.append(own[merged])
            after = verdict.next_token[:1] if len(path) == len(accepted) else verdict.next_token.new_tensor(
                [self._tokens[accepted[len(path)]]])  # (1,) the token committed after this drafter's prefix
            drafter.observe(Verdict(path=torch.tensor([path], dtype=torch.long).reshape(1, len(path)),
                                    num_accepted=torch.tensor([len(path)]), next_token=after))

    def _full(self, shapes: list[tuple[list[int], list[int]]]) -> bool:
        """Whether the trees drafted so far already merge into ``max_nodes`` nodes or more."""
        return self.max_nodes is not None and len(merge_trees(shapes)[0]) >= self.max_nodes

    def _request_for(self, k: int, request: DraftRequest) -> DraftRequest:
        """``request`` with the features of drafter ``k``'s own layers (or none)."""
        features = request.features
        if not self._layer_index[k] or features is None:
            return dataclasses.replace(request, features=None)
        hidden = tuple(features.hidden_states[i] for i in self._layer_index[k])
        return dataclasses.replace(request, features=dataclasses.replace(features, hidden_states=hidden))
