"""An :class:`EagleHead` as a `TreeDraftModel`: its own KV cache over the committed (feature, token) pairs, plus
scratch nodes that feed the predicted feature of their parent."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from specprim._types import DraftRequest, TargetFeatures
from specprim.drafters._eagle_head import EagleHead
from specprim.drafters._tree_drafter import TreeDrafter
from specprim.masks import additive_mask, tree_extension_mask
from specprim.trees import TreeBuilder

__all__ = ["EagleDraftModel", "eagle_drafter"]


class EagleDraftModel:
    """`TreeDraftModel` for an EAGLE head (``feature_layers`` = the head's, so the loop sends target features).

    State: a KV cache over the committed pairs (target feature at position ``t``, committed token at ``t + 1``)
    for ``t = 0 .. T - 1`` where ``T`` is the root's position, at position ids ``t``, followed by the scratch
    nodes of the current draft. ``begin`` drops the scratch nodes, appends the pairs of the newly committed
    positions (``request.features``) in one forward and returns the logits of the root's children from the
    last pair ``(f_{T-1}, root)``. ``extend`` runs a batch of nodes in one forward: each node's input is the
    predicted feature of its parent (for a child of the root, that of the last pair) and its own token; it sees
    every committed pair and its scratch ancestors-or-self, at position ``T - 1 + depth``.

    Guarantees: logits (float32) are over the target vocabulary with ``-inf`` outside the head's ``d2t``; a
    node's logits equal those of running its root-to-node path one pair at a time (tested to 1e-5 in fp32).
    ``request.step == 0`` resets the cache. A one-token prompt has no target feature: the root's children are
    then drafted from a zero feature (still lossless, as every draft is verified). Raises ``ValueError`` when a
    request carries no features, skips committed positions, or has another vocabulary size.
    """

    def __init__(self, head: EagleHead, target: PreTrainedModel | None = None) -> None:
        if target is not None and head.target_embeddings is not target.get_input_embeddings():
            raise ValueError(
                "this EagleHead is bound to another model's embeddings; build it with "
                "EagleHead.from_target(target) or EagleHead.from_pretrained(directory, target)"
            )
        self.head = head
        self.feature_layers: tuple[int, ...] = head.config.feature_layers
        self._cache: DynamicCache | None = None
        self._num_pairs = 0  # committed pairs in the cache
        self._context = 0  # cache entries every scratch node sees (committed pairs, or one zero-feature pair)
        self._last = torch.empty(0)  # (B, 1, d) predicted feature of the last context pair
        self._scratch_parents: list[int] = []
        self._scratch_depths: list[int] = []
        self._scratch_hidden = torch.empty(0)  # (B, S, d) predicted feature of every scratch node

    def __repr__(self) -> str:
        return f"EagleDraftModel(version={self.head.config.version}, feature_layers={self.feature_layers})"

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        """Commit the new pairs of ``request.features``; return (B, V) logits for the root's children."""
        features = self._check_request(request)
        if request.step == 0 or self._cache is None:
            self._cache, self._num_pairs = self.head.new_cache(), 0
        self._check_start(features)
        self._cache.crop(self._num_pairs - self._cache.get_seq_length())  # drop scratch nodes (<= 0)
        ids = request.input_ids.to(self._device)  # (B, T + 1), the root last
        count = features.token_ids.shape[1]
        if count:
            tokens = ids[:, features.start + 1 : features.start + count + 1]  # (B, n) token after each feature
            hidden = self.head.fuse([h.to(self._device) for h in features.hidden_states])  # (B, n, d)
            self._last = self.head.predict(tokens, hidden, cache=self._cache)[:, -1:]  # (B, 1, d)
            self._num_pairs += count
        elif self._num_pairs == 0:  # one-token prompt: draft from a zero feature at position 0
            zero = torch.zeros(ids.shape[0], 1, self.head.config.hidden_size, device=self._device)
            self._last = self.head.predict(ids[:, -1:], zero, cache=self._cache)  # (B, 1, d)
        self._context = self._cache.get_seq_length()
        self._scratch_parents, self._scratch_depths = [], []
        self._scratch_hidden = self._last[:, :0]  # (B, 0, d)
        return self.head.logits(self._last)[:, 0]  # (B, V)

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Add ``M`` scratch nodes (parents (M,), tokens (B, M)) in one forward; return (B, M, V) logits."""
        assert self._cache is not None, "call begin() first"
        before = len(self._scratch_parents)
        parent_hidden, positions = self._add_scratch(parents, tokens)
        predicted = self.head.predict(
            tokens.to(self._device), parent_hidden, position_ids=positions,
            attention_mask=self._scratch_mask(before), cache=self._cache,
        )  # (B, M, d)
        self._scratch_hidden = torch.cat([self._scratch_hidden, predicted], dim=1)
        return self.head.logits(predicted)  # (B, M, V)

    def _check_start(self, features: TargetFeatures) -> None:
        if features.start != self._num_pairs:
            raise ValueError(
                f"request.features starts at position {features.start} but the head holds {self._num_pairs} "
                "committed positions: every request must carry the features committed since the previous one"
            )

    def _add_scratch(self, parents: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record ``M`` new scratch nodes (parents (M,), tokens (B, M)); return their inputs: the (B, M, d)
        predicted feature of each parent and the (M,) position ids ``root pair position + depth``."""
        new_parents = [int(p) for p in parents.tolist()]
        before = len(self._scratch_parents)
        if tokens.dim() != 2 or tokens.shape != (self._last.shape[0], len(new_parents)):
            raise ValueError(f"tokens must have shape (B, M) = ({self._last.shape[0]}, {len(new_parents)})")
        for parent in new_parents:
            if not -1 <= parent < before:
                raise ValueError(
                    f"parent {parent} is not a scratch node of an earlier call (there are {before}); EAGLE feeds "
                    "a node the predicted feature of its parent, so parents must be extended first"
                )
            self._scratch_depths.append(1 if parent == -1 else self._scratch_depths[parent] + 1)
            self._scratch_parents.append(parent)
        index = torch.tensor(new_parents, device=self._device) + 1  # (M,) into [last pair, scratch nodes]
        parent_hidden = torch.cat([self._last, self._scratch_hidden], dim=1)[:, index]  # (B, M, d)
        depths = torch.tensor(self._scratch_depths[before:], device=self._device)
        return parent_hidden, self._context - 1 + depths

    @property
    def _device(self) -> torch.device:
        return self.head.d2t.device

    def _check_request(self, request: DraftRequest) -> TargetFeatures:
        features = request.features
        if features is None:
            raise ValueError(
                "EagleDraftModel needs request.features (the target's hidden states); draft through a drafter "
                "that declares feature_layers, e.g. TreeDrafter(EagleDraftModel(head), tree)"
            )
        if request.vocab_size != self.head.config.vocab_size:
            raise ValueError(
                f"the head drafts over {self.head.config.vocab_size} target ids, the target has {request.vocab_size}"
            )
        if len(features.hidden_states) != len(self.feature_layers):
            raise ValueError(
                f"expected {len(self.feature_layers)} feature tensors (layers {self.feature_layers}), "
                f"got {len(features.hidden_states)}"
            )
        end = features.start + features.token_ids.shape[1]
        if end + 1 != request.input_ids.shape[1]:
            raise ValueError(
                f"request.features covers positions up to {end - 1}, but the root is at position "
                f"{request.input_ids.shape[1] - 1}: features must cover every committed position but the root"
            )
        return features

    def _scratch_mask(self, before: int) -> torch.Tensor:
        """(B, 1, M, context + S) additive mask of the new nodes: every context pair, scratch ancestors-or-self."""
        new = len(self._scratch_parents) - before
        allowed = tree_extension_mask(self._scratch_parents, new, self._context)  # (M, context + S)
        return additive_mask(allowed, batch_size=self._last.shape[0], dtype=self.head.fc.weight.dtype,
                             device=self._device)


def eagle_drafter(head: EagleHead, tree: TreeBuilder | None = None) -> TreeDrafter:
    """``TreeDrafter(EagleDraftModel(head), tree)``; the default tree is ``head.default_tree()`` (EAGLE-2's
    ``DynamicTree(depth=5, top_k=8, budget=40)``)."""
    return TreeDrafter(EagleDraftModel(head), head.default_tree() if tree is None else tree)
