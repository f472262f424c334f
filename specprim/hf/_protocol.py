"""The role of a verifier: what the generation loop asks of the target, whatever holds its KV cache."""

from __future__ import annotations

from typing import Protocol

import torch

from specprim._types import DraftTree


class Target(Protocol):
    """The target model of one sequence with its KV cache, as the generation loop uses it.

    The cache holds every committed token except the last one, the *root*. A step is ``verify`` (score
    ``[root] + tree`` in one forward) then ``commit`` (keep the KV entries of the root and the accepted path).
    :class:`HFTarget` (dynamic cache, any Hugging Face causal LM) and :class:`StaticTarget` (static cache, padded
    shapes, optionally compiled) implement it; :func:`as_target` wraps a model.

    Attributes:
        device: where token ids go (the input embeddings' device).
        vocab_size: ``V``, the width of the logits.
        past_length: how many tokens the cache holds (every committed token but the root).
    """

    device: torch.device
    vocab_size: int
    past_length: int

    def check_length(self, total_length: int) -> None:
        """Raise ``ValueError`` if a sequence of ``total_length`` tokens does not fit the model."""
        ...

    def start(self, input_ids: torch.Tensor, feature_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
        """Reset the cache and prefill it with ``input_ids[:, :-1]`` (1, T); the last token becomes the root.
        Returns one (1, T - 1, H) hidden-state tensor per entry of ``feature_layers`` (indices into Hugging Face's
        ``output_hidden_states``)."""
        ...

    def verify(self, root: torch.Tensor, tree: DraftTree, feature_layers: tuple[int, ...] = ()
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Score ``root`` (1,) followed by ``tree`` in one forward: logits (1, N + 1, V) float32 (row 0 scores the
        root's children, row ``i + 1`` those of node ``i``) and one (1, N + 1, H) tensor per feature layer."""
        ...

    def commit(self, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the KV entries of the root and the accepted nodes ``path`` (1, D) (``-1`` padded, as in
        :class:`specprim.Verdict`), ``num_accepted`` (1,) of them; drop the other nodes'."""
        ...
