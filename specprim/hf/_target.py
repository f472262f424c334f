"""The only place that touches Hugging Face internals: tree verification through a causal LM's public forward
(4D mask + depth position ids) and committing the accepted path into its KV cache."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from specprim._types import DraftTree
from specprim.masks import tree_position_ids, tree_verification_mask


def check_causal_lm(model: object) -> None:
    """Raise ``TypeError`` unless ``model`` is a decoder-only Hugging Face model with an LM head."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(model).__name__}")
    if getattr(model.config, "is_encoder_decoder", False):
        raise TypeError(f"{type(model).__name__} is an encoder-decoder model; only causal LMs are supported")
    if model.get_output_embeddings() is None or not hasattr(model, "generate"):
        raise TypeError(
            f"{type(model).__name__} has no language-model head; load it with AutoModelForCausalLM"
        )


def input_device(model: PreTrainedModel) -> torch.device:
    """Device of the input embeddings: where token ids must go (also under ``device_map="auto"``).

    For embeddings offloaded by accelerate (weights on the meta device), the device they execute on.
    """
    embeddings = model.get_input_embeddings()
    if embeddings.weight.device.type == "meta":
        hook = getattr(embeddings, "_hf_hook", None)
        execution_device = getattr(hook, "execution_device", None)
        if execution_device is not None:
            return torch.device(execution_device)
    return embeddings.weight.device


def vocab_size(model: PreTrainedModel) -> int:
    """Width of the model's logits (``V``)."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0])


def context_length(model: PreTrainedModel) -> int | None:
    """The model's maximum number of positions, or ``None`` when the config does not say."""
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def sliding_window(model: PreTrainedModel) -> int | None:
    """The smallest sliding attention window of the model's layers, or ``None`` if every layer is global."""
    config = model.config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if window is not None and ("sliding_attention" in layer_types or not layer_types):
        use = getattr(config, "use_sliding_window", True)
        return int(window) if use else None
    return None


def _cache_kwarg(model: PreTrainedModel) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class ModelRunner:
    """What :class:`HFTarget` and :class:`~specprim.hf.BatchedHFTarget` share: a causal LM, its limits, one
    dynamic KV cache, and the forward that scores tokens through the model's public ``forward``."""

    def __init__(self, model: PreTrainedModel) -> None:
        check_causal_lm(model)
        self.model = model
        self.device = input_device(model)
        self.vocab_size = vocab_size(model)
        self.context_length = context_length(model)
        self.sliding_window = sliding_window(model)
        self._cache_kwarg = _cache_kwarg(model)
        self.cache: DynamicCache | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    def check_length(self, total_length: int) -> None:
        """Raise ``ValueError`` if a sequence of ``total_length`` tokens does not fit the model."""
        if self.context_length is not None and total_length > self.context_length:
            raise ValueError(
                f"prompt + max_new_tokens = {total_length} tokens exceeds the model's context window "
                f"of {self.context_length}"
            )
        if self.sliding_window is not None and total_length >= self.sliding_window:
            raise ValueError(
                f"{total_length} tokens reach the model's sliding attention window ({self.sliding_window}); "
                "tree verification supports sliding-window layers only within the window"
            )

    def _forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        feature_layers: tuple[int, ...],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """ids (B, Q) through the model with the cache -> logits (B, Q, V) and the ``feature_layers`` hidden
        states (B, Q, H) on :attr:`device`."""
        kwargs = {self._cache_kwarg: self.cache}
        out = self.model(
            input_ids=ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
            output_hidden_states=bool(feature_layers), **kwargs,
        )
        hidden = tuple(out.hidden_states[i].to(self.device) for i in feature_layers) if feature_layers else ()
        return out.logits, hidden

    def _no_hidden_states(self, batch: int, feature_layers: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """What a prefill of zero tokens returns: one empty (B, 0, H) tensor per feature layer."""
        size = self.model.config.get_text_config().hidden_size
        return tuple(torch.zeros(batch, 0, size, dtype=self.dtype, device=self.device) for _ in feature_layers)

    def _check_cache_layers(self) -> None:
        assert self.cache is not None
        for layer in self.cache.layers:
            if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
                raise TypeError(
                    f"{type(self.model).__name__} uses cache layer {type(layer).__name__}; tree verification "
                    "supports dynamic full-attention and sliding-window layers only"
                )


class HFTarget(ModelRunner):
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
        super().__init__(model)
        self.past_length = 0

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
            _, hidden = self._forward(prefix, attention_mask=None, position_ids=None, feature_layers=feature_layers)
            self.past_length = prefix.shape[1]
        else:
            hidden = self._no_hidden_states(prefix.shape[0], feature_layers)
        self._check_cache_layers()
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
            tree.parents.cpu(), self.past_length, batch_size=batch, dtype=self.dtype, device=self.device
        )  # (B, 1, 1+N, past+1+N)
        logits, hidden = self._forward(
            ids, attention_mask=mask, position_ids=positions.expand(batch, -1), feature_layers=feature_layers
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
