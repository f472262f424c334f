"""A Hugging Face causal LM as a tree-drafting model: its own KV cache over the committed tokens, plus scratch
nodes drafted with a 4D tree mask."""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from specprim._types import DraftRequest
from specprim.drafters._vocab import check_d2t, scatter_to_target
from specprim.hf import cache_kwarg, check_causal_lm, input_device, vocab_size
from specprim.linears import PackedLinear
from specprim.masks import additive_mask, tree_extension_mask

SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config attributes of models whose logits are not the plain LM head's output (no reduced draft vocabulary)."""


class LMDraftModel:
    """`TreeDraftModel` for a causal LM that shares the target's tokenizer.

    The cache holds the committed tokens (root included) followed by the scratch nodes of the current draft.
    ``begin`` drops the scratch nodes, reuses the longest cached prefix of the committed tokens and runs the
    rest; ``extend`` runs a batch of new nodes in one forward, each attending to the committed tokens and to its
    scratch ancestors, at position ``root position + depth``.

    Vocabularies: a draft vocabulary smaller than the target's (a prefix of it) is padded with ``-inf`` logits,
    and committed tokens the draft does not know are fed as ``unknown_token_id`` (default: the config's pad or
    EOS id); a larger draft vocabulary raises ``ValueError``. Batch size 1.

    Reduced draft vocabulary: with ``d2t`` (V_d,) (sorted target ids, see :func:`specprim.drafters.draft_vocab`),
    only those rows of the LM head are computed (a copy of them, packed like the model's own head), and every
    other id gets ``-inf``: the draft can never propose it, and its distribution is the softmax over ``d2t``
    (renormalised), which is what it reports as ``q``. It saves reading the LM head's other rows every draft step
    (Qwen2.5-0.5B, bf16, 2 CPU cores: 66.6 -> 56.7 ms with 32,768 of 151,936 ids) at the cost of the target tokens
    it can no longer propose (see docs/generate.md for both, measured end to end). Models
    whose logits are scaled after the head (:data:`SCALED_LOGITS`) raise ``ValueError``. Only the last
    position's logits are computed when ``begin`` feeds several tokens.
    """

    def __init__(
        self, model: PreTrainedModel, unknown_token_id: int | None = None, d2t: torch.Tensor | None = None
    ) -> None:
        check_causal_lm(model)
        self.model = model
        self.device = input_device(model)
        self.vocab_size = vocab_size(model)
        config = model.config.get_text_config()
        fallback = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        fallback = fallback[0] if isinstance(fallback, list) else fallback
        self.unknown_token_id = unknown_token_id if unknown_token_id is not None else (fallback or 0)
        self._cache_kwarg = cache_kwarg(model)
        self._cache: DynamicCache | None = None
        self._committed = torch.empty(0, dtype=torch.long)  # (C,) tokens whose KV precedes the scratch nodes
        self._scratch_parents: list[int] = []
        self._scratch_depths: list[int] = []
        self._target_vocab = self.vocab_size
        self.d2t: torch.Tensor | None = None
        self._head: nn.Module | None = None  # (..., H) -> (..., V_d) with d2t
        if d2t is not None:

            check_d2t(d2t, self.vocab_size)
            self.d2t = d2t.to(self.device)
            self._head = restricted_head(model, self.d2t)

    def __repr__(self) -> str:
        return f"LMDraftModel({type(self.model).__name__})"

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        ids = self._start(request)  # (T,)
        shared = self._shared_prefix(ids)
        if self._cache is None or shared == 0:
            self._cache = DynamicCache(config=self.model.config)
            self._committed = ids.new_empty(0)
        elif shared < len(self._committed):
            _keep_first(self._cache, shared)
            self._committed = self._committed[:shared]
        logits = self._forward(ids[shared:], attention_mask=None, position_ids=None, last_only=True)  # (1, 1, V_d)
        self._committed = torch.cat([self._committed, ids[shared:]])
        return self._to_target_vocab(logits[:, -1])  # (1, V)

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        assert self._cache is not None, "call begin() first"
        allowed, positions = self._add_scratch(parents)  # (M, context + S), (M,)
        mask = additive_mask(allowed, dtype=self.model.get_input_embeddings().weight.dtype, device=self.device)
        logits = self._forward(tokens[0].to(self.device), mask, positions[None].to(self.device))
        return self._to_target_vocab(logits)  # (1, M, V)

    def _start(self, request: DraftRequest) -> torch.Tensor:
        """Check ``request``, drop the scratch nodes; the committed tokens (T,) on the draft's device."""
        ids = request.input_ids
        if ids.shape[0] != 1:
            raise ValueError("draft language models draft for batch size 1")
        if self.vocab_size > request.vocab_size:
            raise ValueError(
                f"draft vocabulary ({self.vocab_size}) is larger than the target's ({request.vocab_size})"
            )
        self._target_vocab = request.vocab_size
        self._drop_scratch()
        return ids[0].to(self.device)

    def _add_scratch(self, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Record ``parents`` (M,) of new scratch nodes; their attention (M, context + S) bool over the committed
        tokens and every scratch node (``S`` counting the new ones), and their positions (M,) long."""
        new_parents = [int(x) for x in parents.tolist()]
        before = len(self._scratch_parents)
        for parent in new_parents:
            if not -1 <= parent < len(self._scratch_parents):
                raise ValueError(f"parent {parent} is not an existing scratch node")
            self._scratch_depths.append(1 if parent == -1 else self._scratch_depths[parent] + 1)
            self._scratch_parents.append(parent)
        context = len(self._committed)  # committed tokens, root included
        allowed = tree_extension_mask(self._scratch_parents, len(new_parents), context)  # (M, context + S)
        depths = torch.tensor(self._scratch_depths[before:], dtype=torch.long)
        return allowed, context - 1 + depths  # root position + depth

    def _known(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` with the ids the draft does not know replaced by ``unknown_token_id``."""
        return torch.where(ids < self.vocab_size, ids, self.unknown_token_id)

    def _drop_scratch(self) -> None:
        """Forget the scratch nodes: the cache keeps the committed tokens only (also after a forward that raised
        part-way, which left more entries in its first layers than in the others)."""
        if self._cache is not None:
            _keep_first(self._cache, len(self._committed))
        self._scratch_parents, self._scratch_depths = [], []

    def _shared_prefix(self, ids: torch.Tensor) -> int:
        """Length of the longest common prefix of the cached committed tokens and ``ids[:-1]``."""
        limit = min(len(self._committed), len(ids) - 1)
        if limit == 0:
            return 0
        same = (self._committed[:limit] == ids[:limit]).long()
        return int(same.cumprod(0).sum())

    def _forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        *, last_only: bool = False,
    ) -> torch.Tensor:
        """(n,) ids -> (1, n, V_d) float32 logits (``last_only``: (1, 1, V_d), the last position's); ids the draft
        does not know become ``unknown_token_id``. ``V_d`` is the draft model's vocabulary, or ``len(d2t)``."""
        inputs = {"input_ids": self._known(ids)[None], "attention_mask": attention_mask, "position_ids": position_ids,
                  "use_cache": True, self._cache_kwarg: self._cache}
        if self._head is None:
            return self.model(**inputs, logits_to_keep=1 if last_only else 0).logits.float()
        hidden = self.model.base_model(**inputs).last_hidden_state  # (1, n, H)
        return self._head(hidden[:, -1:] if last_only else hidden).float()

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V_d) -> (..., V_target), ``-inf`` on ids the draft does not have."""
        if self.d2t is not None:

            return scatter_to_target(logits, self.d2t, self._target_vocab)
        missing = self._target_vocab - logits.shape[-1]
        return torch.nn.functional.pad(logits, (0, missing), value=float("-inf")) if missing else logits


def _keep_first(cache: DynamicCache, length: int) -> None:
    """Cut every layer of ``cache`` to its first ``length`` positions (layers may hold different lengths)."""
    for layer in cache.layers:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)


def restricted_head(model: PreTrainedModel, d2t: torch.Tensor) -> nn.Module:
    """An (..., H) -> (..., V_d) linear layer holding the rows ``d2t`` (V_d,) of ``model``'s LM head (copied, so a
    tied embedding is untouched), a :class:`specprim.models.PackedLinear` when the model's head is one.

    ``ValueError`` for models that scale their logits after the head (:data:`SCALED_LOGITS`), ``TypeError`` for a
    head that is not a linear layer."""
    config = model.config.get_text_config()
    scaled = [name for name in SCALED_LOGITS if getattr(config, name, None) not in (None, 1, 1.0)]
    if scaled:
        raise ValueError(f"{type(model).__name__} scales its logits after the LM head ({scaled[0]}); a reduced "
                         "draft vocabulary supports plain linear heads only")
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear | PackedLinear):
        raise TypeError(f"a reduced draft vocabulary needs a linear LM head, got {type(head).__name__}")
    weight = head.weight.detach()  # (V, H)
    rows = nn.Linear(weight.shape[1], d2t.numel(), bias=head.bias is not None, device=weight.device,
                     dtype=weight.dtype)
    with torch.no_grad():
        rows.weight.copy_(weight[d2t.to(weight.device)])
        if head.bias is not None:
            rows.bias.copy_(head.bias.detach()[d2t.to(weight.device)])
    rows.requires_grad_(False)
    return PackedLinear(rows) if isinstance(head, PackedLinear) else rows
