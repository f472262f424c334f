"""The only place that touches Hugging Face internals: tree verification through a causal LM's public forward
(4D mask + depth position ids) and committing the accepted path into its KV cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicSlidingWindowLayer

from specprim._types import DraftTree
from specprim.hf._causal_lm import CausalLM
from specprim.hf._protocol import Target
from specprim.masks import tree_position_ids, tree_verification_mask


class HFTarget:
    """A Hugging Face causal LM as a speculative-decoding target, with its KV cache.

    The cache always holds every committed token except the last one, the *root*. :meth:`verify` runs one
    forward over ``[root] + tree`` with an ancestor-or-self 4D mask and depth position ids, and :meth:`commit`
    keeps the KV entries of the root and the accepted path and drops the rest.

    Works for models whose forward accepts a 4D ``attention_mask`` and ``position_ids`` and uses the standard
    dynamic cache (Llama, Qwen2, GPT-2, Gemma-3, ...). Layers with sliding-window attention are supported while
    the whole sequence fits inside the window; beyond it a ``ValueError`` says so. Inputs are placed on the
    device of the input embeddings, so a model dispatched with ``device_map="auto"`` works unchanged.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.lm = CausalLM.of(model)
        self.model, self.device, self.vocab_size = model, self.lm.device, self.lm.vocab_size
        self.cache: DynamicCache | None = None
        self.past_length = 0

    def check_length(self, total_length: int) -> None:
        """Raise ``ValueError`` if a sequence of ``total_length`` tokens does not fit the model."""
        self.lm.check_length(total_length)

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, feature_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
        """Reset the cache and prefill it with ``input_ids[:, :-1]`` (B, T); the last token becomes the root.

        Returns one (B, T - 1, H) hidden-state tensor per entry of ``feature_layers`` (indices into
        ``output_hidden_states``); an empty tuple when none are asked for.
        """
        self.cache = DynamicCache(config=self.model.config)
        self.past_length = 0
        prefix = input_ids[:, :-1].to(self.device)  # (B, T - 1)
        if prefix.shape[1] > 0:
            _, hidden = self.lm.forward(self.cache, prefix, attention_mask=None, position_ids=None,
                                        feature_layers=feature_layers)
            self.past_length = prefix.shape[1]
        else:
            hidden = self.lm.no_hidden_states(prefix.shape[0], feature_layers)
        self.lm.check_dynamic_cache(self.cache)
        return hidden

    @torch.no_grad()
    def verify(
        self, root: torch.Tensor, tree: DraftTree, feature_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Score ``[root] + tree`` in one forward.

        Args:
            root: (B,) long, the last committed token.
            tree: the draft tree (its tokens are moved to the model's device).
            feature_layers: indices into ``output_hidden_states`` to return.
        Returns:
            logits: (B, N + 1, V) float32 on :attr:`device`; row 0 scores the root's children, row ``i + 1``
                the children of node ``i``.
            hidden: one (B, N + 1, H) tensor per entry of ``feature_layers`` (row 0 is the root's).
        """
        batch, num_nodes = tree.tokens.shape
        self.check_length(self.past_length + 1 + num_nodes)
        ids = torch.cat([root.view(batch, 1).to(self.device), tree.tokens.to(self.device)], dim=1)  # (B, 1+N)
        depths = tree_position_ids(tree.parents.cpu(), offset=self.past_length)  # (N,)
        positions = torch.cat([torch.tensor([self.past_length]), depths]).to(self.device)  # (1+N,)
        mask = tree_verification_mask(
            tree.parents.cpu(), self.past_length, batch_size=batch, dtype=self.lm.dtype, device=self.device
        )  # (B, 1, 1+N, past+1+N)
        logits, hidden = self.lm.forward(
            self.cache, ids, attention_mask=mask, position_ids=positions.expand(batch, -1),
            feature_layers=feature_layers,
        )
        return logits.float().to(self.device), hidden

    def commit(self, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the KV entries of the root and the accepted nodes; drop the other draft nodes.

        Args:
            path: (B, D) long node ids, ``-1`` padded, as in :class:`specprim.Verdict`.
            num_accepted: (B,) long. Every row must accept the same number of tokens (batch > 1 with ragged
                acceptance needs padding and is rejected with ``ValueError``).
        """
        assert self.cache is not None, "call start() first"
        counts = num_accepted.tolist()
        if len(set(counts)) > 1:
            raise ValueError("rows accepted different numbers of tokens; ragged batches are not supported")
        accepted = counts[0]
        tree_start = self.past_length + 1  # cache index of node 0
        kept = path[:, :accepted].cpu()  # (B, a)
        is_prefix = torch.equal(kept, torch.arange(accepted).expand_as(kept))  # nodes 0..a-1: a plain crop
        for layer in self.cache.layers:
            if not layer.is_initialized:
                continue
            if is_prefix:
                end = tree_start + accepted
                layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]
            else:
                index = torch.cat(
                    [torch.arange(tree_start).expand(kept.shape[0], -1), kept + tree_start], dim=1
                ).to(layer.keys.device)  # (B, past + 1 + a)
                gather = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
                layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.cumulative_length = layer.keys.shape[-2]
        self.past_length = tree_start + accepted


TARGET_METHODS = ("check_length", "start", "verify", "commit")


def as_target(target: PreTrainedModel | Target) -> Target:
    """The verifier for ``target``: a Hugging Face model is wrapped in an :class:`HFTarget`; a :class:`Target`
    (anything with ``start``, ``verify``, ``commit`` and ``check_length``: :class:`StaticTarget`, a verifier of your
    own) is used as it is. ``TypeError`` for anything else."""
    if isinstance(target, torch.nn.Module):
        return HFTarget(target)
    missing = [name for name in TARGET_METHODS if not callable(getattr(target, name, None))]
    if missing:
        raise TypeError(f"expected a Hugging Face causal LM or a Target; {type(target).__name__} has no "
                        f"{', '.join(missing)}")
    return target
