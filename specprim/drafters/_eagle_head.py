"""EAGLE feature heads (Li et al., 2024 / 2025): a one-layer transformer that drafts in the target's feature space.

Notation: ``d`` the target's hidden size, ``V`` its vocabulary, ``V_d`` the draft vocabulary, ``k`` the number of
feature layers, ``B`` batch, ``T`` sequence length. A *pair* ``t`` is (input feature at position ``t``, token at
position ``t + 1``); the head maps it to the *predicted feature* at position ``t + 1`` and, through its LM head,
to logits for the token at position ``t + 2``.

- EAGLE-1 (``version=1``): the input feature is the target's last hidden state ``f_t`` (``feature_layers=(-1,)``,
  after the final norm). ``fc(cat(embed(x_{t+1}), f_t))`` (2d -> d) feeds ``num_layers`` decoder layers of the
  target's architecture; the output is the predicted ``f_{t+1}``, scored by the target's LM head **without** a
  norm (it predicts a post-norm feature, as the original EAGLE code does).
- EAGLE-3 (``version=3``): the input feature is ``fc(cat(h_low, h_mid, h_high))`` (k*d -> d) of the target's
  hidden states at ``feature_layers``, or the head's own previous prediction while drafting. The first decoder
  layer's attention reads ``cat(input_norm(embed(x_{t+1})), hidden_norm(feature))`` (its q/k/v projections take
  2d inputs) and its residual stream is the feature, as in the EAGLE-3 paper and reference code. The output goes
  through the head's own final norm and LM head over a reduced vocabulary ``d2t``.

The token embeddings (and, for EAGLE-1, the LM head) are the target's own modules, used by reference: not copied,
not registered as sub-modules, never saved, never moved by ``head.to``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from specprim._types import token_id_list
from specprim.drafters._checkpoint import load_head, register_head, save_head
from specprim.drafters._vocab import check_d2t, draft_vocab, scatter_to_target
from specprim.masks import additive_mask
from specprim.trees import DynamicTree

__all__ = ["EagleConfig", "EagleHead", "EagleOutput", "default_feature_layers"]

# The children of a pre-norm Llama-style decoder layer, the only layout the head knows how to rebuild.
_LAYER_PARTS = frozenset({"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"})


def default_feature_layers(version: int, target_num_layers: int) -> tuple[int, ...]:
    """Indices into ``output_hidden_states`` the head reads by default.

    EAGLE-1: ``(-1,)``, the last entry (after the final norm). EAGLE-3: low / mid / high layers
    ``(2, L // 2, L - 3)`` as in the reference code, clamped to ``[0, L]`` and sorted for shallow targets.
    """
    if version == 1:
        return (-1,)
    num = target_num_layers
    return tuple(sorted((min(2, num), num // 2, max(num - 3, 0))))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EagleConfig:
    """Hyper-parameters of an :class:`EagleHead`; the target dimensions it was built for are part of it.

    Attributes:
        version: 1 (EAGLE-1: last hidden state, target LM head) or 3 (EAGLE-3: fused features, own norm and LM
            head over the draft vocabulary).
        hidden_size: the target's ``d``.
        vocab_size: the target's ``V`` (width of its LM head).
        draft_vocab_size: ``V_d <= V``, the number of target ids the head can propose (``d2t``).
        feature_layers: indices into the target's ``output_hidden_states`` (0 = embeddings, ``i`` = after layer
            ``i``, -1 = last entry). EAGLE-1 takes exactly one.
        target_num_layers: the target's number of decoder layers ``L`` (the feature indices refer to it).
        num_layers: decoder layers in the head.
    """

    version: Literal[1, 3]
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    feature_layers: tuple[int, ...]
    target_num_layers: int
    num_layers: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if self.version not in (1, 3):
            raise ValueError(f"version must be 1 or 3, got {self.version!r}")
        for name in ("hidden_size", "vocab_size", "draft_vocab_size", "target_num_layers", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.vocab_size}")
        if not self.feature_layers:
            raise ValueError("feature_layers must name at least one layer")
        if self.version == 1 and len(self.feature_layers) != 1:
            raise ValueError(f"EAGLE-1 reads one feature layer, got {self.feature_layers}")
        limit = self.target_num_layers
        bad = [i for i in self.feature_layers if not -(limit + 1) <= i <= limit]
        if bad:
            raise ValueError(
                f"feature layers {bad} do not exist in a {limit}-layer target (output_hidden_states has "
                f"{limit + 1} entries)"
            )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "feature_layers": list(self.feature_layers)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EagleConfig:
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class EagleOutput:
    """``hidden``: (B, T, d) predicted features; ``draft_logits``: (B, T, V_d) over the draft vocabulary."""

    hidden: torch.Tensor
    draft_logits: torch.Tensor


@dataclasses.dataclass(frozen=True)
class _TargetParts:
    """The target modules a head uses by reference (a plain record, so ``nn.Module`` does not register them)."""

    embeddings: nn.Module
    lm_head: nn.Module

    def __deepcopy__(self, memo: dict[int, Any]) -> _TargetParts:
        return self  # a copied head still reads the same target, it does not copy it


@register_head
class EagleHead(nn.Module):
    """An EAGLE-1 or EAGLE-3 draft head bound to one target model (see the module docstring for the math).

    Build one with :meth:`from_target` (random init) or :meth:`from_pretrained`; draft with
    ``EagleDraftModel(head)``. The decoder layers are instances of the target's own decoder-layer class built
    from a copy of its config, so they need a pre-norm Llama-style layer (``input_layernorm``, ``self_attn`` with
    ``q_proj`` / ``k_proj`` / ``v_proj``, ``post_attention_layernorm``, ``mlp``) and a ``rotary_emb``: Llama,
    Qwen2, Qwen3, Mistral and architectures built the same way. Others raise ``ValueError``.

    Buffers: ``d2t`` (V_d,) long, the target id of every draft id (sorted; saved with the weights).
    """

    def __init__(self, config: EagleConfig, target: PreTrainedModel) -> None:
        super().__init__()
        _check_target(config, target)
        layer_class, rotary_class = _decoder_parts(target)
        self.config = config
        self.layer_config = _layer_config(target, config.num_layers)
        size = config.hidden_size
        self.rotary_emb = rotary_class(config=self.layer_config)
        self.layers = nn.ModuleList(layer_class(self.layer_config, i) for i in range(config.num_layers))
        if config.version == 1:
            self.fc = nn.Linear(2 * size, size, bias=True)  # cat(embed, f) -> d
        else:
            self.fc = nn.Linear(len(config.feature_layers) * size, size, bias=False)  # fuse k features -> d
            self.hidden_norm = copy.deepcopy(self.layers[0].input_layernorm)
            self.norm = copy.deepcopy(self.layers[0].input_layernorm)
            self.lm_head = nn.Linear(size, config.draft_vocab_size, bias=False)
            _widen_attention_inputs(self.layers[0].self_attn, 2 * size)
        self.register_buffer("d2t", torch.arange(config.draft_vocab_size))
        self._target = _TargetParts(target.get_input_embeddings(), target.get_output_embeddings())
        self._cache_name = _cache_argument(self.layers[0].self_attn)
        embeddings = self._target.embeddings.weight
        self.to(device=embeddings.device, dtype=embeddings.dtype)

    # ----------------------------------------------------------------------------------------- construction
    @classmethod
    def from_target(
        cls,
        target: PreTrainedModel,
        *,
        version: Literal[1, 3] = 3,
        draft_vocab_size: int | None = None,
        token_counts: torch.Tensor | None = None,
        required_ids: Sequence[int] | None = None,
        feature_layers: Sequence[int] | None = None,
        num_layers: int = 1,
        generator: torch.Generator | None = None,
    ) -> EagleHead:
        """A randomly initialised head sized for ``target``.

        Args:
            version: 1 or 3.
            draft_vocab_size: ``V_d`` (default: the whole target vocabulary).
            token_counts: (V,) target-token frequencies; ``d2t`` keeps the ``V_d`` most frequent ids (default: the
                smallest ids). See :func:`specprim.drafters._vocab.draft_vocab`.
            required_ids: ids always in the draft vocabulary (default: the target config's EOS ids).
            feature_layers: indices into ``output_hidden_states`` (default: :func:`default_feature_layers`).
            num_layers: decoder layers in the head.
            generator: source of the initial weights (linear weights ~ N(0, initializer_range), biases 0, norms 1).

        EAGLE-3's LM head starts as the target LM head's rows at ``d2t`` (a copy, then trained separately).
        """
        hidden, vocab = _target_dims(target)
        num_target_layers = _num_target_layers(target)
        config = EagleConfig(
            version=version, hidden_size=hidden, vocab_size=vocab,
            draft_vocab_size=vocab if draft_vocab_size is None else draft_vocab_size,
            feature_layers=tuple(feature_layers or default_feature_layers(version, num_target_layers)),
            target_num_layers=num_target_layers, num_layers=num_layers,
        )
        eos = target.config.get_text_config().eos_token_id
        required = token_id_list(eos) if required_ids is None else required_ids
        head = cls(config, target)
        d2t = draft_vocab(vocab, config.draft_vocab_size, token_counts, required)
        with torch.no_grad():
            head.d2t.copy_(d2t)
            head._init_weights(generator)
        return head

    def grown(self, target: PreTrainedModel, num_layers: int,
              generator: torch.Generator | None = None) -> EagleHead:
        """A copy of this head with decoder layers added after its own, up to ``num_layers`` in all.

        The added layers start as the identity: their linear weights are drawn as in :meth:`from_target` except
        the attention output and MLP down projections, which are zero, so each layer adds nothing to its residual
        stream and the grown head drafts exactly as this one until it is trained. ``ValueError`` when
        ``num_layers`` is fewer than the head has.
        """
        have = self.config.num_layers
        if num_layers < have:
            raise ValueError(f"a head with {have} decoder layers cannot be grown to {num_layers}")
        head = type(self)(dataclasses.replace(self.config, num_layers=num_layers), target)
        with torch.no_grad():
            head._init_weights(generator)
            for layer in head.layers[have:]:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            missing, unexpected = head.load_state_dict(self.state_dict(), strict=False)
        if unexpected or any(not name.startswith("layers.") for name in missing):
            raise ValueError(f"cannot grow this head: its weights do not fit ({unexpected or missing})")
        return head

    def widened(self, target: PreTrainedModel, draft_vocab_size: int,
                token_counts: torch.Tensor | None = None) -> EagleHead:
        """A copy of this EAGLE-3 head drafting over ``draft_vocab_size`` target ids: its own ids plus the most
        frequent others by ``token_counts`` (V,) (see :func:`~specprim.drafters._vocab.draft_vocab`).

        Every kept id keeps its trained row of the head's LM head, so the logits over the old ids are this head's;
        an added id's row starts at zero (logit 0), so the greedy draft stays this head's wherever its best logit is
        positive. (Rows copied from the target's LM head, as a fresh head starts, lowered a trained SmolLM2 head's
        held-out top-1 from 0.472 to 0.383 before any step: added ids won drafts the old ones had right.)
        ``ValueError`` for EAGLE-1 heads (they draft with the target's LM head) and for a size below the head's own.
        """
        have = self.config.draft_vocab_size
        if self.config.version != 3:
            raise ValueError("only EAGLE-3 heads have a draft vocabulary of their own to widen")
        if draft_vocab_size < have:
            raise ValueError(f"a draft vocabulary of {have} ids cannot be widened to {draft_vocab_size}")
        d2t = draft_vocab(self.config.vocab_size, draft_vocab_size, token_counts, self.d2t.tolist())  # (V_d',)
        head = type(self)(dataclasses.replace(self.config, draft_vocab_size=draft_vocab_size), target)
        state = {k: v for k, v in self.state_dict().items() if k not in ("d2t", "lm_head.weight")}
        head.load_state_dict(state, strict=False)
        with torch.no_grad():
            head.d2t.copy_(d2t)
            kept = torch.searchsorted(d2t, self.d2t)  # (V_d,) where each old id sits in the new vocabulary
            head.lm_head.weight.zero_()  # (V_d', d)
            head.lm_head.weight[kept] = self.lm_head.weight.to(head.lm_head.weight.dtype)
        return head

    @classmethod
    def from_config(cls, config: dict[str, Any], target: PreTrainedModel) -> EagleHead:
        """A head with placeholder weights for a saved ``config`` (used by :meth:`from_pretrained`)."""
        return cls(EagleConfig.from_dict(config), target)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write ``config.json`` and ``model.safetensors`` (the head's own weights and ``d2t``) to ``directory``."""
        save_head(self, self.config.to_dict(), directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], target: PreTrainedModel) -> EagleHead:
        """Load a head saved with :meth:`save_pretrained` onto ``target``.

        Raises ``ValueError`` when ``target``'s hidden size, vocabulary or number of layers (which the feature
        indices refer to) differ from the saved ones, or when the directory holds another kind of head.
        """
        head = load_head(cls, directory, target)
        check_d2t(head.d2t, head.config.vocab_size)
        return head

    # ---------------------------------------------------------------------------------------------- forward
    def select_features(self, hidden_states: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Pick the ``feature_layers`` entries out of a target's ``output_hidden_states`` tuple."""
        return tuple(hidden_states[i] for i in self.config.feature_layers)

    def fuse(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """k target feature tensors (B, T, d), in ``feature_layers`` order -> (B, T, d) input features.

        EAGLE-1: the single feature itself. EAGLE-3: ``fc(cat(features))``.
        """
        if len(features) != len(self.config.feature_layers):
            raise ValueError(f"expected {len(self.config.feature_layers)} feature tensors, got {len(features)}")
        dtype = self.fc.weight.dtype
        if self.config.version == 1:
            return features[0].to(dtype)
        return self.fc(torch.cat([f.to(dtype) for f in features], dim=-1))

    def predict(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """Run ``T`` pairs through the head; return the (B, T, d) predicted features.

        Args:
            input_ids: (B, T) long, the token ``x_{t+1}`` of every pair.
            hidden: (B, T, d) the input feature of every pair: :meth:`fuse` of target features, or the head's own
                earlier predictions (training-time test, drafting).
            position_ids: (B, T) or (T,) long; default ``past + arange(T)`` (``past`` = cached length).
            attention_mask: (B, 1, T, past + T) additive float mask (0 = attend, very negative = not); default
                causal over the cached entries and the ``T`` new ones.
            cache: a ``transformers.DynamicCache`` the new keys / values are appended to, or ``None``.
        """
        dtype, device = self.fc.weight.dtype, self.fc.weight.device
        embeds = self._target.embeddings(input_ids.to(self._target.embeddings.weight.device))
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + input_ids.shape[1], device=device)
        return self.predict_embedded(embeds.to(device=device, dtype=dtype), hidden, position_ids=position_ids,
                                     attention_mask=attention_mask, cache=cache)

    def predict_embedded(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """:meth:`predict` from (B, T, d) input embeddings ``embeds`` instead of token ids (a parallel drafter's
        placeholder slots have no token); ``position_ids`` (T,) or (B, T) long. Returns (B, T, d)."""
        dtype, device = self.fc.weight.dtype, self.fc.weight.device
        batch, length = embeds.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        embeds = embeds.to(device=device, dtype=dtype)  # (B, T, d)
        hidden = hidden.to(device=device, dtype=dtype)  # (B, T, d)
        position_ids = position_ids.to(device).expand(batch, length)  # (B, T)
        if attention_mask is None:
            attention_mask = causal_mask(length, past, dtype=dtype, device=device).expand(batch, 1, -1, -1)
        layer_kwargs = {
            "attention_mask": attention_mask.to(device=device, dtype=dtype),
            "position_ids": position_ids,
            "position_embeddings": self.rotary_emb(hidden, position_ids),
            self._cache_name: cache,
            "use_cache": cache is not None,
        }
        if self.config.version == 1:
            x = self.layers[0](self.fc(torch.cat([embeds, hidden], dim=-1)), **layer_kwargs)
        else:
            x = self._eagle3_first_layer(embeds, hidden, layer_kwargs)
        for layer in self.layers[1:]:
            x = layer(x, **layer_kwargs)
        return x  # (B, T, d)

    def draft_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """(..., d) predicted features -> (..., V_d) logits over the draft vocabulary (``d2t`` order)."""
        if self.config.version == 3:
            return self.lm_head(self.norm(predicted))
        head = self._target.lm_head
        weight = head.weight  # read once: a quantized head de-quantizes a new copy per access
        x = predicted.to(device=weight.device, dtype=weight.dtype)
        if self.config.draft_vocab_size == self.config.vocab_size:
            return head(x)
        index = self.d2t.to(weight.device)
        bias = None if head.bias is None else head.bias[index]
        return F.linear(x, weight[index], bias)

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """(..., d) predicted features -> (..., V) float32 logits over the target vocabulary, ``-inf`` outside
        ``d2t``."""
        draft = self.draft_logits(predicted).float()
        return scatter_to_target(draft, self.d2t, self.config.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: DynamicCache | None = None,
    ) -> EagleOutput:
        """:meth:`predict` then :meth:`draft_logits`: predicted features (B, T, d) and draft logits (B, T, V_d).

        For training over whole sequences: ``hidden = head.fuse(head.select_features(target_hidden_states))[:, :-1]``
        with ``input_ids = ids[:, 1:]``; pair ``t``'s outputs predict the feature at ``t + 1`` and the token at
        ``t + 2``. Training-time test unrolls further steps by feeding ``output.hidden`` back as ``hidden``
        (shifted by one position), with a ``cache`` and an ``attention_mask`` that say what each step may see.
        """
        predicted = self.predict(
            input_ids, hidden, position_ids=position_ids, attention_mask=attention_mask, cache=cache
        )
        return EagleOutput(hidden=predicted, draft_logits=self.draft_logits(predicted))

    def default_tree(self) -> DynamicTree:
        """EAGLE-2's dynamic tree, the default for both versions: ``DynamicTree(depth=5, top_k=8, budget=40)``."""
        return DynamicTree(depth=5, top_k=8, budget=40)

    # ------------------------------------------------------------------------------------------- internals
    @property
    def target_embeddings(self) -> nn.Module:
        """The target's input embeddings this head reads (by reference)."""
        return self._target.embeddings

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for this head's layers."""
        return DynamicCache(config=self.layer_config)

    def _eagle3_first_layer(
        self, embeds: torch.Tensor, hidden: torch.Tensor, layer_kwargs: dict[str, Any]
    ) -> torch.Tensor:
        """EAGLE-3's first layer: attention over cat(norm(embeds), norm(hidden)) (2d), residual stream ``hidden``."""
        layer = self.layers[0]
        attention_input = torch.cat([layer.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # (B,T,2d)
        attended, _ = layer.self_attn(hidden_states=attention_input, **layer_kwargs)
        x = hidden + attended
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _init_weights(self, generator: torch.Generator | None) -> None:
        """Linear weights ~ N(0, initializer_range), biases 0; EAGLE-3's LM head from the target's rows."""
        std = float(getattr(self.layer_config, "initializer_range", 0.02))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                weight = torch.empty(module.weight.shape, dtype=torch.float32)
                module.weight.copy_(weight.normal_(0.0, std, generator=generator))
                if module.bias is not None:
                    module.bias.zero_()
        if self.config.version == 3:
            rows = self._target.lm_head.weight[self.d2t.to(self._target.lm_head.weight.device)]
            self.lm_head.weight.copy_(rows)


def causal_mask(
    length: int, past: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """(1, 1, T, past + T) additive mask: query ``i`` sees every cached entry and new entries ``<= i``."""
    allowed = torch.ones(length, past + length, dtype=torch.bool).tril(diagonal=past)
    return additive_mask(allowed, dtype=dtype, device=device)


def _target_dims(target: nn.Module) -> tuple[int, int]:
    head = target.get_output_embeddings()
    if head is None:
        raise TypeError(f"{type(target).__name__} has no LM head; load it with AutoModelForCausalLM")
    vocab, hidden = head.weight.shape
    return int(hidden), int(vocab)


def _num_target_layers(target: PreTrainedModel) -> int:
    return int(target.config.get_text_config().num_hidden_layers)


def _check_target(config: EagleConfig, target: PreTrainedModel) -> None:
    hidden, vocab = _target_dims(target)
    found = {"hidden_size": hidden, "vocab_size": vocab, "target_num_layers": _num_target_layers(target)}
    for name, have in found.items():
        want = getattr(config, name)
        if want != have:
            raise ValueError(
                f"the EAGLE head was built for a target with {name}={want}, but {type(target).__name__} has "
                f"{name}={have} (feature layers {config.feature_layers}); a head only works on the target it "
                "was made for"
            )


def _decoder_parts(target: PreTrainedModel) -> tuple[type[nn.Module], type[nn.Module]]:
    """The target's decoder-layer and rotary-embedding classes; ``ValueError`` for unsupported layouts."""
    body = getattr(target, "base_model", None)
    layers = getattr(body, "layers", None)
    rotary = getattr(body, "rotary_emb", None)
    layer = layers[0] if isinstance(layers, nn.ModuleList) and len(layers) else None
    children = {name for name, _ in layer.named_children()} if layer is not None else set()
    attention = getattr(layer, "self_attn", None)
    if (
        rotary is None
        or children != _LAYER_PARTS
        or not all(isinstance(getattr(attention, p, None), nn.Module) for p in ("q_proj", "k_proj", "v_proj"))
    ):
        model_type = getattr(target.config, "model_type", "?")
        raise ValueError(
            f"EagleHead cannot build a decoder layer for {type(target).__name__} (model_type {model_type!r}): it "
            "needs a pre-norm Llama-style layer (input_layernorm, self_attn with q_proj/k_proj/v_proj, "
            "post_attention_layernorm, mlp) and rotary embeddings, as in Llama, Qwen2, Qwen3 or Mistral"
        )
    return type(layer), type(rotary)


def _layer_config(target: PreTrainedModel, num_layers: int) -> Any:
    """A copy of the target's text config for ``num_layers`` full-attention layers, eager or SDPA attention."""
    config = copy.deepcopy(target.config.get_text_config())
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = ["full_attention"] * num_layers
    if hasattr(config, "sliding_window"):
        config.sliding_window = None
    if getattr(config, "_attn_implementation", None) not in ("eager", "sdpa"):
        config._attn_implementation = "sdpa"  # the head passes 4D tree masks
    return config


def _widen_attention_inputs(attention: nn.Module, width: int) -> None:
    """Give the attention's q / k / v projections ``width`` input features (EAGLE-3's 2d attention input)."""
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attention, name)
        setattr(attention, name, nn.Linear(width, old.out_features, bias=old.bias is not None))


def _cache_argument(attention: nn.Module) -> str:
    """Name of the KV-cache argument of this transformers version's attention / layer forward."""
    params = inspect.signature(attention.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
