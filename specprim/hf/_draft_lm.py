"""A Hugging Face causal LM as a tree-drafting model: its own KV cache over the committed tokens, plus scratch
nodes drafted with a 4D tree mask."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from specprim._types import DraftRequest
from specprim.hf._target import _cache_kwarg, check_causal_lm, input_device, vocab_size
from specprim.masks import additive_mask, tree_extension_mask


class LMDraftModel:
    """`TreeDraftModel` for a causal LM that shares the target's tokenizer.

    The cache holds the committed tokens (root included) followed by the scratch nodes of the current draft.
    ``begin`` drops the scratch nodes, reuses the longest cached prefix of the committed tokens and runs the
    rest; ``extend`` runs a batch of new nodes in one forward, each attending to the committed tokens and to its
    scratch ancestors, at position ``root position + depth``.

    Vocabularies: a draft vocabulary smaller than the target's (a prefix of it) is padded with ``-inf`` logits,
    and committed tokens the draft does not know are fed as ``unknown_token_id`` (default: the config's pad or
    EOS id); a larger draft vocabulary raises ``ValueError``. Batch size 1.
    """

    def __init__(self, model: PreTrainedModel, unknown_token_id: int | None = None) -> None:
        check_causal_lm(model)
        self.model = model
        self.device = input_device(model)
        self.vocab_size = vocab_size(model)
        config = model.config.get_text_config()
        fallback = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        fallback = fallback[0] if isinstance(fallback, list) else fallback
        self.unknown_token_id = unknown_token_id if unknown_token_id is not None else (fallback or 0)
        self._cache_kwarg = _cache_kwarg(model)
        self._cache: DynamicCache | None = None
        self._committed = torch.empty(0, dtype=torch.long)  # (C,) tokens whose KV precedes the scratch nodes
        self._scratch_parents: list[int] = []
        self._scratch_depths: list[int] = []
        self._target_vocab = self.vocab_size

    def __repr__(self) -> str:
        return f"LMDraftModel({type(self.model).__name__})"

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        ids = request.input_ids
        if ids.shape[0] != 1:
            raise ValueError("draft language models draft for batch size 1")
        if self.vocab_size > request.vocab_size:
            raise ValueError(
                f"draft vocabulary ({self.vocab_size}) is larger than the target's ({request.vocab_size})"
            )
        self._target_vocab = request.vocab_size
        self._drop_scratch()
        ids = ids[0].to(self.device)  # (T,)
        shared = self._shared_prefix(ids)
        if self._cache is None or shared == 0:
            self._cache = DynamicCache(config=self.model.config)
            self._committed = ids.new_empty(0)
        elif shared < len(self._committed):
            self._cache.crop(shared - len(self._committed))
            self._committed = self._committed[:shared]
        logits = self._forward(ids[shared:], attention_mask=None, position_ids=None)  # (1, n, V_draft)
        self._committed = torch.cat([self._committed, ids[shared:]])
        return self._to_target_vocab(logits[:, -1])  # (1, V)

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        assert self._cache is not None, "call begin() first"
        new_parents = [int(x) for x in parents.tolist()]
        before = len(self._scratch_parents)
        for parent in new_parents:
            if not -1 <= parent < len(self._scratch_parents):
                raise ValueError(f"parent {parent} is not an existing scratch node")
            self._scratch_depths.append(1 if parent == -1 else self._scratch_depths[parent] + 1)
            self._scratch_parents.append(parent)
        context = len(self._committed)  # committed tokens, root included
        allowed = tree_extension_mask(self._scratch_parents, len(new_parents), context)  # (M, context + S)
        mask = additive_mask(allowed, dtype=self.model.get_input_embeddings().weight.dtype, device=self.device)
        depths = torch.tensor(self._scratch_depths[before:], dtype=torch.long)
        positions = (context - 1 + depths)[None].to(self.device)  # (1, M) root position + depth
        logits = self._forward(tokens[0].to(self.device), mask, positions)
        return self._to_target_vocab(logits)  # (1, M, V)

    def _drop_scratch(self) -> None:
        if self._cache is not None and self._scratch_parents:
            self._cache.crop(-len(self._scratch_parents))
        self._scratch_parents, self._scratch_depths = [], []

    def _shared_prefix(self, ids: torch.Tensor) -> int:
        """Length of the longest common prefix of the cached committed tokens and ``ids[:-1]``."""
        limit = min(len(self._committed), len(ids) - 1)
        if limit == 0:
            return 0
        same = (self._committed[:limit] == ids[:limit]).long()
        return int(same.cumprod(0).sum())

    def _forward(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """(n,) ids -> (1, n, V_draft) float32 logits; ids the draft does not know become ``unknown_token_id``."""
        known = torch.where(ids < self.vocab_size, ids, self.unknown_token_id)
        out = self.model(
            input_ids=known[None], attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
            **{self._cache_kwarg: self._cache},
        )
        return out.logits.float()

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V_draft) -> (..., V_target), ``-inf`` on ids the draft does not have."""
        missing = self._target_vocab - logits.shape[-1]
        return torch.nn.functional.pad(logits, (0, missing), value=float("-inf")) if missing else logits
