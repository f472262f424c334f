"""DeepSeek-V3's multi-token prediction (MTP) module as a draft head, chained in feature space for several depths.

One MTP step at sequence position ``j`` combines the hidden state ``h_j`` with the embedding of the next token
``x_{j+1}`` and predicts ``x_{j+2}``:

    h'_j = Block(Proj([RMSNorm(h_j); RMSNorm(Emb(x_{j+1}))]))      logits_j = LMHead(h'_j)

``Emb`` and ``LMHead`` are the target's (shared, by reference); ``Block`` is one decoder layer of the target's
own architecture followed by its final norm. ``h'_j`` stands in for the target's state at position ``j + 1``,
so the same module applied to ``(h'_j, x_{j+2})`` drafts one token further (autoregression in feature space).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from specprim._types import DraftRequest
from specprim.drafters._checkpoint import check_target, load_head, register_head, save_head, target_dimensions
from specprim.hf import cache_kwarg
from specprim.masks import additive_mask

__all__ = ["MTPConfig", "MTPDraftModel", "MTPHead"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MTPConfig:
    """Hyper-parameters of `MTPHead`.

    Attributes:
        hidden_size: the target's hidden size ``H``.
        vocab_size: the target's vocabulary ``V``.
        norm_eps: epsilon of the two input RMSNorms.
        block: the Hugging Face config (``to_dict()``) of the one-layer block, of the target's ``model_type``.
    """

    hidden_size: int
    vocab_size: int
    norm_eps: float = 1e-6
    block: dict[str, Any] = dataclasses.field(repr=False)


def block_config(target: nn.Module) -> dict[str, Any]:
    """The target's config cut to one full-attention decoder layer and a one-token vocabulary (the block takes
    ``inputs_embeds``; a real vocabulary would only allocate an unused embedding table)."""
    config = json.loads(target.config.to_json_string(use_diff=False))  # JSON types, as saved and reloaded
    config.update(
        num_hidden_layers=1, vocab_size=1, pad_token_id=None, bos_token_id=None, eos_token_id=None,
        tie_word_embeddings=False,
    )
    if config.get("layer_types") is not None:
        config["layer_types"] = ["full_attention"]
    return config


def build_block(target: nn.Module, block: dict[str, Any]) -> nn.Module:
    """A one-layer base model of the target's architecture (its decoder layer, rotary embedding and final
    norm), randomly initialised. ``TypeError`` naming the architecture when it cannot be built or driven
    through ``inputs_embeds`` / a 4D ``attention_mask`` / ``position_ids`` / a cache."""
    base = getattr(target, "base_model", None)
    architecture = type(target).__name__
    if base is None or base is target:
        raise TypeError(f"MTPHead needs a causal LM with a base model; {architecture} has none")
    params = inspect.signature(base.forward).parameters
    missing = [name for name in ("inputs_embeds", "attention_mask", "position_ids") if name not in params]
    if missing or not {"cache", "past_key_values"} & set(params):
        raise TypeError(
            f"MTPHead cannot drive a {type(base).__name__} block ({architecture}): its forward lacks "
            f"{missing or ['a cache argument']}"
        )
    if block.get("model_type") != target.config.model_type:
        raise ValueError(
            f"the MTP block is a {block.get('model_type')!r} layer but the target is {target.config.model_type!r}"
        )
    try:
        return type(base)(type(target.config).from_dict(block))
    except Exception as error:  # the architecture's config or constructor rejected a one-layer copy
        message = f"MTPHead cannot build a one-layer {type(base).__name__} for {architecture}: {error}"
        raise TypeError(message) from error


def _norm_eps(target: nn.Module) -> float:
    config = target.config.get_text_config()
    for name in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"):
        value = getattr(config, name, None)
        if isinstance(value, float):
            return value
    return 1e-6


@register_head
class MTPHead(nn.Module):
    """DeepSeek-V3's MTP module for one target.

    Own weights: two RMSNorms (state and token), ``proj`` (``Linear(2H, H)``) and ``block``, a one-layer base
    model of the target's architecture (decoder layer + final norm, built from a copy of the target config).
    The target's input embeddings and LM head are used by reference: never copied, never registered as
    sub-modules, never saved; the target is never modified.

    Unlike DeepSeek-V3, which chains the pre-norm block output, the state carried to the next depth is the
    post-norm output ``h'`` (the same space as the target feature ``feature_layers=(-1,)``); the logits are the
    same, ``LMHead(norm(block(...)))``.

    Architectures: any causal LM whose base model takes ``inputs_embeds``, a 4D additive ``attention_mask``,
    ``position_ids`` and a dynamic cache (Llama, Qwen2, GPT-2, Gemma-3, ...); others raise ``TypeError``.
    """

    def __init__(self, config: MTPConfig, target: nn.Module) -> None:
        super().__init__()
        check_target(dataclasses.asdict(config), target, "this MTPConfig")
        self.config = config
        hidden = config.hidden_size
        self.hidden_norm = nn.RMSNorm(hidden, eps=config.norm_eps)
        self.token_norm = nn.RMSNorm(hidden, eps=config.norm_eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = build_block(target, config.block)
        self._cache_kwarg = cache_kwarg(self.block)
        # A tuple is not registered by nn.Module: the target's modules stay out of state_dict() and parameters().
        self._target_modules = (target.get_input_embeddings(), target.get_output_embeddings())
        weight = self._target_modules[1].weight
        self.to(device=weight.device, dtype=weight.dtype)

    @classmethod
    def from_target(cls, target: nn.Module, *, norm_eps: float | None = None) -> MTPHead:
        """A randomly initialised head sized for ``target`` (PyTorch / Hugging Face default init, from the
        global RNG), on the device and in the dtype of its LM head. ``norm_eps`` defaults to the target's."""
        hidden, vocab = target_dimensions(target)
        eps = _norm_eps(target) if norm_eps is None else norm_eps
        config = MTPConfig(hidden_size=hidden, vocab_size=vocab, norm_eps=eps, block=block_config(target))
        return cls(config, target)

    @classmethod
    def from_config(cls, config: dict[str, Any], target: nn.Module) -> MTPHead:
        """A randomly initialised head from a saved config dict (used by :meth:`from_pretrained`)."""
        return cls(MTPConfig(**config), target)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], target: nn.Module) -> MTPHead:
        """Load a head saved with :meth:`save_pretrained`; ``ValueError`` if ``target``'s hidden size,
        vocabulary or architecture differ from the ones it was built for."""
        return load_head(cls, directory, target)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write ``config.json`` and ``model.safetensors`` (the head's own weights only) to ``directory``."""
        save_head(self, dataclasses.asdict(self.config), directory)

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for :attr:`block`."""
        return DynamicCache(config=self.block.config)

    def forward(
        self,
        hidden: torch.Tensor,
        next_tokens: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: DynamicCache,
    ) -> torch.Tensor:
        """One MTP step for ``M`` new positions, appended to ``cache``.

        Args:
            hidden: (B, M, H) the state at each position (target feature or an earlier step's output).
            next_tokens: (B, M) long, the token following each position.
            position_ids: (B, M) long.
            attention_mask: (B, 1, M, past + M) additive mask over the cached and the new positions.
            cache: the block's KV cache (``past`` entries before the call, ``past + M`` after).
        Returns:
            (B, M, H) the new states ``h'`` (post-norm); :meth:`logits` turns them into the next tokens' logits.
        """
        embeddings, _ = self._target_modules
        dtype = self.proj.weight.dtype
        tokens = embeddings(next_tokens).to(dtype)  # (B, M, H)
        fused = self.proj(torch.cat([self.hidden_norm(hidden.to(dtype)), self.token_norm(tokens)], dim=-1))
        out = self.block(
            inputs_embeds=fused, attention_mask=attention_mask.to(dtype), position_ids=position_ids,
            use_cache=True, **{self._cache_kwarg: cache},
        )
        return out.last_hidden_state  # (B, M, H)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) states -> (..., V) float32 logits through the target's LM head."""
        _, head = self._target_modules
        return head(hidden).float()


class MTPDraftModel:
    """`MTPHead` as a `TreeDraftModel` with its own KV cache (pair it with ``Chain(3)`` or a `DynamicTree`).

    The head's sequence has one slot per committed position ``j`` except the root's, holding
    ``(h_j, x_{j+1})``; the newest slot's output predicts the root's children. :meth:`begin` drops the scratch
    slots of the previous tree and appends the slots of the newly committed positions (``request.features``,
    ``feature_layers = (-1,)``; a new generation, ``request.step == 0``, starts a new cache). :meth:`extend`
    adds one slot per new node, ``(h'_parent, token)`` at position ``root - 1 + depth``, attending to the
    committed slots and the node's ancestors-or-self only (tree attention with a 4D mask). With a one-token
    prompt there is no committed slot yet: the root's state is zeros. Logits are float32 over the target
    vocabulary. New nodes' parents must be earlier scratch nodes (from an earlier call) or the root.
    """

    feature_layers: tuple[int, ...] = (-1,)

    def __init__(self, head: MTPHead) -> None:
        self.head = head
        self._cache: DynamicCache | None = None
        self._committed = 0  # L: committed slots in the cache (positions 0 .. L - 1)
        self._root_hidden: torch.Tensor | None = None  # (B, H) output of slot L - 1: the root's state
        self._scratch_hidden: torch.Tensor | None = None  # (B, S, H) outputs of the scratch slots
        self._ancestors = torch.zeros(0, 0, dtype=torch.bool)  # (S, S) ancestor-or-self among scratch slots
        self._depths: list[int] = []  # (S,) depth of every scratch node

    def __repr__(self) -> str:
        return f"MTPDraftModel({self.head.config!r})"

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        """Append the committed positions of ``request.features``; return (B, V) logits of the root's children."""
        features, vocab = request.features, self.head.config.vocab_size
        if request.vocab_size != vocab:
            raise ValueError(f"the MTP head drafts {vocab} tokens; the target has {request.vocab_size}")
        if features is None:
            raise ValueError("MTPDraftModel needs the target's hidden states (request.features is None)")
        if request.step == 0 or self._cache is None:
            self._cache, self._committed, self._root_hidden = self.head.new_cache(), 0, None
        self._drop_scratch()
        hidden = features.hidden_states[0]  # (B, n, H)
        if features.start != self._committed:
            raise ValueError(f"features start at position {features.start}; the head has {self._committed} positions")
        if features.start + hidden.shape[1] != request.input_ids.shape[1] - 1:
            raise ValueError("request.features must end right before the root (the last token of input_ids)")
        if hidden.shape[1] > 0:
            self._append_committed(hidden, request.input_ids)
        if self._root_hidden is None:
            weight = self.head.proj.weight
            self._root_hidden = weight.new_zeros(hidden.shape[0], self.head.config.hidden_size)
        self._scratch_hidden = self._root_hidden[:, None][:, :0]  # (B, 0, H)
        return self.head.logits(self._root_hidden)  # (B, V)

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Add ``M`` scratch slots ``(h'_parent, token)``; return (B, M, V) logits of their children."""
        assert self._scratch_hidden is not None, "call begin() first"
        scratch, count = len(self._depths), parents.shape[0]
        parent_list = parents.tolist()
        if any(not -1 <= parent < scratch for parent in parent_list):
            raise ValueError(f"parents {parent_list} must be -1 or earlier scratch nodes (0 .. {scratch - 1})")
        states = torch.cat([self._root_hidden[:, None], self._scratch_hidden], dim=1)  # (B, 1 + S, H)
        parent_hidden = states[:, parents.to(states.device) + 1]  # (B, M, H)
        depths = [1 if parent == -1 else self._depths[parent] + 1 for parent in parent_list]
        ancestors = self._grow_ancestors(parent_list)  # (S + M, S + M)
        allowed = torch.cat([torch.ones(count, self._committed, dtype=torch.bool), ancestors[scratch:]], dim=1)
        positions = torch.tensor(depths) + self._committed - 1  # (M,)
        out = self._run(parent_hidden, tokens, positions, allowed)  # (B, M, H)
        self._scratch_hidden = torch.cat([self._scratch_hidden, out], dim=1)
        self._ancestors = ancestors
        self._depths += depths
        return self.head.logits(out)  # (B, M, V)

    def _append_committed(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> None:
        """Append slots ``(h_j, x_{j+1})`` for the ``n`` new committed positions ``j`` (causal among themselves);
        ``hidden`` (B, n, H), ``input_ids`` (B, T) with ``T = L + n + 1``."""
        start, count = self._committed, hidden.shape[1]
        next_tokens = input_ids[:, start + 1 :]  # (B, n), the last one is the root
        causal = torch.ones(count, count, dtype=torch.bool).tril()
        allowed = torch.cat([torch.ones(count, start, dtype=torch.bool), causal], dim=1)  # (n, L + n)
        out = self._run(hidden, next_tokens, torch.arange(start, start + count), allowed)  # (B, n, H)
        self._root_hidden = out[:, -1]
        self._committed += count

    def _run(
        self, hidden: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """Append ``M`` slots to the cache: ``allowed`` (M, past + M) bool says which slots each one sees."""
        device, dtype = self.head.proj.weight.device, self.head.proj.weight.dtype
        batch = hidden.shape[0]
        mask = additive_mask(allowed, batch_size=batch, dtype=dtype, device=device)  # (B, 1, M, past + M)
        return self.head(
            hidden.to(device), next_tokens.to(device), position_ids=positions.to(device).expand(batch, -1),
            attention_mask=mask, cache=self._cache,
        )

    def _grow_ancestors(self, parents: list[int]) -> torch.Tensor:
        """The (S + M, S + M) ancestor-or-self matrix with ``M`` new nodes below ``parents``."""
        scratch = self._ancestors.shape[0]
        size = scratch + len(parents)
        grown = torch.zeros(size, size, dtype=torch.bool)
        grown[:scratch, :scratch] = self._ancestors
        for offset, parent in enumerate(parents):
            node = scratch + offset
            if parent >= 0:
                grown[node] = grown[parent]
            grown[node, node] = True
        return grown

    def _drop_scratch(self) -> None:
        """Crop the cache back to the committed slots and forget the scratch nodes."""
        assert self._cache is not None
        extra = self._cache.get_seq_length() - self._committed
        if extra > 0:
            self._cache.crop(-extra)
        self._scratch_hidden = None
        self._ancestors = torch.zeros(0, 0, dtype=torch.bool)
        self._depths = []
