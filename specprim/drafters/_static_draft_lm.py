"""A draft language model drafting through static shapes: its KV cache a preallocated static cache, its steps one
``torch.compile``d forward per padded size (the machinery of :class:`specprim.hf.StaticTarget`)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specprim._types import DraftRequest
from specprim.drafters._draft_lm import LMDraftModel
from specprim.hf import QUERY_BUCKETS, StaticTarget

CATCH_UP_LIMIT = QUERY_BUCKETS[2]
"""Most new committed tokens ``begin`` feeds through the compiled forward; more (a new prompt) are prefilled
eagerly, so that prompts of any length compile nothing new."""


class StaticLMDraftModel:
    """An :class:`LMDraftModel` drafting through a :class:`StaticTarget` of the draft model: a static KV cache, and
    every step (the
    committed tokens a ``begin`` catches up on, each ``extend``'s new nodes) one forward padded to
    :func:`specprim.hf.query_bucket` tokens, ``torch.compile``d with static shapes when ``compile=True``.

    Same interface, state and results as :class:`LMDraftModel` (it holds one, ``lm``, for the committed tokens, the
    scratch nodes and the vocabulary maps, and runs its forwards through ``runner``), for batch size 1, including the
    reduced vocabulary (``d2t``: the compiled forward scores with the restricted head) and unknown tokens.
    Differences:

    * ``begin`` reuses the longest cached prefix of the committed tokens when at most :data:`CATCH_UP_LIMIT` new
      ones follow it (the usual step: the accepted tokens and the bonus token); otherwise it prefills the cache
      again, eagerly (a new prompt);
    * scratch nodes live in the cache slots after the committed tokens and are dropped by resetting the length.

    Llama-style decoders only, as :class:`StaticTarget` (``TypeError`` otherwise). Compiling costs about 50 s per
    padded size for Qwen2.5-0.5B on 2 CPU cores; give ``min_cache_length`` >= the longest prompt plus its budget
    plus 64 so the cache never grows mid-run. Guarantees: with ``compile=False`` the logits equal
    :class:`LMDraftModel`'s up to floating-point rounding (tested to 1e-5 in fp32); compiled, up to the compiler's
    rounding. Either way drafting stays lossless: the ``q`` it reports is the distribution it drew from.
    """

    def __init__(
        self, model: PreTrainedModel, *, compile: bool = True, min_cache_length: int = 0,  # noqa: A002 - option name
        unknown_token_id: int | None = None, d2t: torch.Tensor | None = None,
    ) -> None:
        self.lm = LMDraftModel(model, unknown_token_id, d2t)  # its own (dynamic) cache stays unused
        self.runner = StaticTarget(model, compile=compile, min_cache_length=min_cache_length, head=self.lm._head)

    @property
    def model(self) -> PreTrainedModel:
        return self.lm.model

    @property
    def device(self) -> torch.device:
        return self.lm.device

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    @property
    def unknown_token_id(self) -> int:
        return self.lm.unknown_token_id

    @property
    def d2t(self) -> torch.Tensor | None:
        return self.lm.d2t

    def __repr__(self) -> str:
        return f"StaticLMDraftModel({type(self.model).__name__}, compiled={self.runner.compiled})"

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        lm = self.lm
        ids = lm._start(request)  # (T,)
        shared = lm._shared_prefix(ids) if self.runner.cache is not None else 0
        if shared == 0 or len(ids) - shared > CATCH_UP_LIMIT:
            self.runner.start(lm._known(ids)[None])  # prefills ids[:-1]
            shared = len(ids) - 1
        self.runner.past_length = shared
        allowed = self._catch_up_attention(shared, len(ids))  # (T - shared, T)
        logits, _ = self.runner.forward_nodes(lm._known(ids[shared:]), torch.arange(shared, len(ids)), allowed)
        self.runner.past_length = len(ids)
        lm._committed = ids
        return lm._to_target_vocab(logits[:, -1])  # (1, V)

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        assert self.runner.cache is not None, "call begin() first"
        lm = self.lm
        before = len(lm._scratch_parents)
        allowed, positions = lm._add_scratch(parents)  # (M, context + S), (M,)
        self.runner.past_length = len(lm._committed) + before
        logits, _ = self.runner.forward_nodes(lm._known(tokens[0].to(self.device)), positions, allowed)
        self.runner.past_length = len(lm._committed) + len(lm._scratch_parents)
        return lm._to_target_vocab(logits)  # (1, M, V)

    def compile_sizes(self, sizes: tuple[int, ...] = QUERY_BUCKETS[:3]) -> None:
        """Run one dummy forward of every padded size in ``sizes`` (compiling them now rather than in a timed step);
        the next ``begin`` prefills again."""
        prompt = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        self.runner.start(prompt)
        self.runner.past_length = 1
        for size in sizes:
            allowed = torch.ones(size, 1 + size, dtype=torch.bool).tril(diagonal=1)  # (size, 1 + size)
            self.runner.forward_nodes(torch.zeros(size, dtype=torch.long), torch.arange(1, 1 + size), allowed)
        self.lm._committed = self.lm._committed.new_empty(0)
        self.lm._drop_scratch()  # the scratch records only: the held model's own cache is never filled

    @staticmethod
    def _catch_up_attention(shared: int, total: int) -> torch.Tensor:
        """(total - shared, total) bool: committed token ``shared + i`` attends to slots ``0 .. shared + i``."""
        return torch.ones(total - shared, total, dtype=torch.bool).tril(diagonal=shared)
