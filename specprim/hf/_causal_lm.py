"""Facts about a Hugging Face causal LM that every verifier needs (device, vocabulary, limits) and the one forward
through its public ``forward`` with a KV cache: a value the verifiers hold, not a base class they extend."""

from __future__ import annotations

import dataclasses
import inspect

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer


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


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name under which ``model.forward`` takes its KV cache (``cache`` or ``past_key_values``)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclasses.dataclass(frozen=True)
class CausalLM:
    """A causal LM with what verifying on it needs: ``device`` (where token ids go), ``vocab_size`` (``V``, the
    logits' width), ``context_length`` and ``sliding_window`` (``None`` when unlimited / absent)."""

    model: PreTrainedModel
    device: torch.device
    vocab_size: int
    context_length: int | None
    sliding_window: int | None
    cache_kwarg: str

    @classmethod
    def of(cls, model: PreTrainedModel) -> CausalLM:
        """The facts of ``model``; ``TypeError`` unless it is a decoder-only model with an LM head."""
        check_causal_lm(model)
        return cls(model=model, device=input_device(model), vocab_size=vocab_size(model),
                   context_length=context_length(model), sliding_window=sliding_window(model),
                   cache_kwarg=cache_kwarg(model))

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

    def forward(
        self,
        cache: Cache,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        feature_layers: tuple[int, ...],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """ids (B, Q) through the model with ``cache`` -> logits (B, Q, V) and the ``feature_layers`` hidden
        states (B, Q, H) on :attr:`device`."""
        out = self.model(
            input_ids=ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
            output_hidden_states=bool(feature_layers), **{self.cache_kwarg: cache},
        )
        hidden = tuple(out.hidden_states[i].to(self.device) for i in feature_layers) if feature_layers else ()
        return out.logits, hidden

    def no_hidden_states(self, batch: int, feature_layers: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """What a prefill of zero tokens returns: one empty (B, 0, H) tensor per feature layer."""
        size = self.model.config.get_text_config().hidden_size
        return tuple(torch.zeros(batch, 0, size, dtype=self.dtype, device=self.device) for _ in feature_layers)

    def check_dynamic_cache(self, cache: Cache) -> None:
        """``TypeError`` unless every layer of ``cache`` is a dynamic full-attention or sliding-window layer."""
        for layer in cache.layers:
            if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
                raise TypeError(
                    f"{type(self.model).__name__} uses cache layer {type(layer).__name__}; tree verification "
                    "supports dynamic full-attention and sliding-window layers only"
                )
