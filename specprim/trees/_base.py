"""The two interfaces between tree shapes and the models that draft them."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specprim._types import DraftRequest, DraftTree


@runtime_checkable
class TreeDraftModel(Protocol):
    """An autoregressive draft model that can grow a scratch tree of nodes, one batch of nodes per call.

    Scratch node ids are given in creation order starting at 0; ``-1`` is the root (the last committed token).
    Logits are over the **target** vocabulary (``request.vocab_size``); ids the draft cannot propose are
    ``-inf``. Builders apply ``request.sampling`` to them, identically to the target.
    """

    def begin(self, request: DraftRequest) -> torch.Tensor:
        """Bring the model to the committed context of ``request`` and forget earlier scratch nodes.

        Returns (B, V) logits for the root's children.
        """
        ...

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Add ``M`` scratch nodes in one batched call.

        Args:
            parents: (M,) long, each new node's parent: an earlier scratch node id or ``-1`` (the root).
            tokens: (B, M) long, the new nodes' tokens.
        Returns:
            (B, M, V) logits for the children of each new node.
        """
        ...


@runtime_checkable
class TreeBuilder(Protocol):
    """A tree shape policy: grows a `DraftTree` with a `TreeDraftModel`, never deeper than
    ``request.max_depth``, and honours the q-contract for the tree it returns."""

    def build(self, model: TreeDraftModel, request: DraftRequest) -> DraftTree: ...
