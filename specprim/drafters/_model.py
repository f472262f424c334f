"""An independent small language model as the drafter (Leviathan et al., Chen et al.)."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.hf import check_causal_lm, input_device, vocab_size
from specprim.hf._target import _cache_kwarg
from specprim.trees import Chain


class ModelDrafter:
    """Drafts a chain with a small Hugging Face causal LM that shares the target's tokenizer.

    Under greedy sampling it drafts argmax tokens and declares ``"deterministic"``; otherwise it samples each
    token from the transformed draft distribution and returns that distribution as ``q`` (``"iid"``).
    A draft vocabulary smaller than the target's (a prefix of it) is padded with zero probability, and
    committed target tokens the draft does not know are fed to it as ``unknown_token_id`` (default: the draft
    config's pad or EOS id); a larger draft vocabulary raises ``ValueError``. The drafter keeps its own KV
    cache and reuses the longest prefix it shares with the committed tokens, so it needs no reset between calls.
    """

    def __init__(
        self, model: PreTrainedModel, tree: Chain | None = None, unknown_token_id: int | None = None
    ) -> None:
        check_causal_lm(model)
        tree = Chain(4) if tree is None else tree
        if not isinstance(tree, Chain):
            raise TypeError(f"ModelDrafter drafts chains; got tree shape {type(tree).__name__}")
        self.model = model
        self.tree = tree
        self.device = input_device(model)
        self.vocab_size = vocab_size(model)
        self._cache_kwarg = _cache_kwarg(model)
        config = model.config.get_text_config()
        fallback = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        fallback = fallback[0] if isinstance(fallback, list) else fallback
        self.unknown_token_id = unknown_token_id if unknown_token_id is not None else (fallback or 0)
        self._cache: DynamicCache | None = None
        self._cached_ids = torch.empty(0, dtype=torch.long)  # (L,) tokens whose KV is in the cache

    def __repr__(self) -> str:
        return f"ModelDrafter({type(self.model).__name__}, tree={self.tree!r})"

    @torch.no_grad()
    def propose(self, request: DraftRequest) -> DraftTree:
        ids = request.input_ids
        if ids.shape[0] != 1:
            raise ValueError("ModelDrafter drafts for batch size 1")
        if self.vocab_size > request.vocab_size:
            raise ValueError(
                f"draft vocabulary ({self.vocab_size}) is larger than the target's ({request.vocab_size})"
            )
        num_tokens = min(self.tree.k, request.max_depth)
        parents = torch.tensor(self.tree.parents(num_tokens), dtype=torch.long)
        if num_tokens == 0:
            return DraftTree(tokens=ids.new_empty(1, 0), parents=parents)
        logits = self._advance(ids[0].to(self.device))  # (1, V_draft) at the root
        tokens, q_rows = [], []
        for step in range(num_tokens):
            if request.sampling.is_greedy:
                token = logits.argmax(-1)  # (1,)
            else:
                q = self._pad(request.sampling.probs(logits), request.vocab_size)  # (1, V)
                token = torch.multinomial(q, 1, generator=request.generator)[:, 0]
                q_rows.append(q)
            tokens.append(token)
            if step + 1 < num_tokens:
                logits = self._step(token)
        tokens_t = torch.stack(tokens, dim=1)  # (1, k)
        if request.sampling.is_greedy:
            return DraftTree(tokens=tokens_t, parents=parents, sampling="deterministic")
        q_rows.append(torch.zeros_like(q_rows[0]))  # the leaf's row is never read
        return DraftTree(tokens=tokens_t, parents=parents, q=torch.stack(q_rows, dim=1), sampling="iid")

    def observe(self, verdict: Verdict) -> None:
        """Nothing to do: the next ``propose`` reuses the cached prefix it shares with the committed tokens."""

    def _advance(self, ids: torch.Tensor) -> torch.Tensor:
        """Bring the cache to ``ids[:-1]`` and run the rest; return (1, V_draft) logits after ``ids[-1]``."""
        cached = self._cached_ids
        limit = min(len(cached), len(ids) - 1)
        same = (cached[:limit] == ids[:limit].to(cached.device)).long()
        shared = int(same.cumprod(0).sum()) if limit else 0
        if self._cache is None or shared == 0:
            self._cache = DynamicCache(config=self.model.config)
            self._cached_ids = ids.new_empty(0)
            shared = 0
        elif shared < len(cached):
            self._cache.crop(shared - len(cached))
            self._cached_ids = cached[:shared]
        return self._run(ids[shared:])

    def _step(self, token: torch.Tensor) -> torch.Tensor:
        return self._run(token.view(1).to(self.device))

    def _run(self, new_ids: torch.Tensor) -> torch.Tensor:
        known = torch.where(new_ids < self.vocab_size, new_ids, self.unknown_token_id)  # (n,)
        out = self.model(input_ids=known[None], use_cache=True, **{self._cache_kwarg: self._cache})
        self._cached_ids = torch.cat([self._cached_ids.to(new_ids.device), new_ids])
        return out.logits[:, -1].float()  # (1, V_draft)

    @staticmethod
    def _pad(probs: torch.Tensor, width: int) -> torch.Tensor:
        """(1, V_draft) -> (1, width) with zero probability on ids the draft does not have."""
        if probs.shape[-1] == width:
            return probs
        return torch.nn.functional.pad(probs, (0, width - probs.shape[-1]))
