"""An EAGLE head drafting with static shapes: a preallocated KV cache and node batches padded to a few sizes, so one
``torch.compile``d head step (``fullgraph``, no dynamic shapes) serves every draft of a run."""

from __future__ import annotations

import json

import torch
from transformers import StaticCache

from specprim._types import DraftRequest
from specprim.drafters._eagle_draft import EagleDraftModel
from specprim.drafters._eagle_head import EagleHead
from specprim.hf import (
    QUERY_BUCKETS,
    CachedForward,
    WarmShapes,
    aot_applies,
    attends_windowed,
    compiled_forward_settings,
    grown_cache,
    package_key,
    padded_mask,
    query_bucket,
    weights_fingerprint,
    windowed_attention,
    write_from,
)
from specprim.masks import additive_mask, tree_extension_mask

__all__ = ["StaticEagleDraftModel"]


class StaticEagleDraftModel:
    """An :class:`EagleDraftModel` with a static KV cache, its head step optionally ``torch.compile``d.

    Same interface, state and results as :class:`EagleDraftModel`, for batch size 1: it holds one (``eager``) for the
    committed pairs, the scratch nodes and the request checks, and runs the head's forwards itself. Differences:

    * the head's KV cache is a :class:`transformers.StaticCache` whose length is a multiple of 512, at least
      ``min_cache_length`` (reallocated, larger, when a sequence needs it: give it the longest prompt plus its
      budget so that nothing recompiles mid-run);
    * every head forward after the first request of a generation (the newly committed pairs in ``begin``, a batch
      of nodes in ``extend``) is padded to :func:`specprim.hf.query_bucket` rows; padding rows see only themselves
      and write cache slots no real row reads before they are overwritten;
    * the first request (the prompt's pairs) runs eagerly, unpadded;
    * on SDPA, attention reads the cache only up to the last slot a forward writes
      (:func:`specprim.hf.windowed_attention`).

    With ``compile=True`` the step (head layers, final norm, draft LM head, scatter to the target vocabulary) is
    compiled with ``fullgraph=True`` and static shapes under the settings :class:`specprim.hf.StaticTarget` uses: one
    compilation per (padded size, cache length), the attended width dynamic. Guarantees: with ``compile=False`` the
    logits equal :class:`EagleDraftModel`'s (tested to 1e-5 in fp32); compiled, up to floating-point rounding. Either
    way the drafter stays lossless, as every draft is verified. On a 2-core CPU it drafts slightly faster than
    :class:`EagleDraftModel` for the shipped SmolLM2 head (5.0 against 5.6 ms per step; see docs/generate.md).
    """

    def __init__(self, head: EagleHead, *, compile: bool = True, min_cache_length: int = 0) -> None:  # noqa: A002
        self.eager = EagleDraftModel(head)  # the pair and scratch bookkeeping; its own (dynamic) cache stays unused
        self.head = head
        self.feature_layers: tuple[int, ...] = head.config.feature_layers
        self.compiled = compile
        self._warm = WarmShapes("EAGLE head")  # the compiled step's guards are checked in full once per shape
        self.min_cache_length = min_cache_length
        self.cache: StaticCache | None = None
        self._last_logits = torch.empty(0)  # (1, V) logits of the root's children, from the last context pair
        self._step = torch.compile(self._head_step, dynamic=False, fullgraph=True) if compile else self._head_step
        self._aot_cached = compile and aot_applies(head.layer_config, head)
        self._aot: dict[tuple[int, int], CachedForward] = {}

    def __repr__(self) -> str:
        return f"StaticEagleDraftModel(version={self.head.config.version}, compiled={self.compiled})"

    @torch.no_grad()
    def begin(self, request: DraftRequest) -> torch.Tensor:
        """Commit the new pairs of ``request.features``; return (1, V) logits for the root's children."""
        features = self.eager._check_request(request)
        ids = request.input_ids.to(self._device)  # (1, T + 1), the root last
        if ids.shape[0] != 1:
            raise ValueError(f"StaticEagleDraftModel drafts for one sequence at a time, got a batch of {ids.shape[0]}")
        if request.step == 0 or self.cache is None:
            self.eager._num_pairs = 0
            self._reserve(max(ids.shape[1] + request.max_depth + QUERY_BUCKETS[-1], self.min_cache_length), keep=0)
        self.eager._check_start(features)
        start, count = features.start, features.token_ids.shape[1]
        eager = request.step == 0
        if count:
            tokens = ids[:, start + 1 : start + count + 1]  # (1, n) token after each feature
            hidden = self.head.fuse([h.to(self._device) for h in features.hidden_states])  # (1, n, d)
            allowed = torch.ones(count, start + count, dtype=torch.bool).tril(start)  # (n, start + n) causal
            predicted, logits = self._run(tokens, hidden, torch.arange(start, start + count), allowed, start, eager)
            self.eager._last, self._last_logits = predicted[:, -1:], logits[:, -1]
            self.eager._num_pairs += count
            self.eager._context = self.eager._num_pairs
        elif self.eager._num_pairs == 0:  # one-token prompt: draft from a zero feature at position 0
            zero = torch.zeros(1, 1, self.head.config.hidden_size, device=self._device)
            allowed = torch.ones(1, 1, dtype=torch.bool)
            predicted, logits = self._run(ids[:, -1:], zero, torch.zeros(1, dtype=torch.long), allowed, 0, eager)
            self.eager._last, self._last_logits = predicted, logits[:, -1]
            self.eager._context = 1
        self.eager._scratch_parents, self.eager._scratch_depths = [], []
        self.eager._scratch_hidden = self.eager._last[:, :0]  # (1, 0, d)
        return self._last_logits

    @torch.no_grad()
    def extend(self, parents: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Add ``M`` scratch nodes (parents (M,), tokens (1, M)) in one padded forward; return (1, M, V) logits."""
        assert self.cache is not None, "call begin() first"
        before = len(self.eager._scratch_parents)
        parent_hidden, positions = self.eager._add_scratch(parents, tokens)
        context = self.eager._context
        allowed = tree_extension_mask(self.eager._scratch_parents, len(parents), context)  # (M, context + S)
        predicted, logits = self._run(
            tokens.to(self._device), parent_hidden, positions, allowed, context + before, eager=False
        )
        self.eager._scratch_hidden = torch.cat([self.eager._scratch_hidden, predicted], dim=1)
        return logits

    @torch.no_grad()
    def compile_sizes(self, sizes: tuple[int, ...] = QUERY_BUCKETS[:4]) -> None:
        """Run a dummy padded forward of each size in ``sizes`` (compiling it) over a cache of
        ``min_cache_length`` positions, so that a timed generation does not compile. Call it between generations:
        the cache's contents are lost, and the next request must be a generation's first (``step == 0``)."""
        self._reserve(max(self.min_cache_length, max(sizes)), keep=0)
        width = self.head.config.hidden_size
        for size in sizes:
            ids = torch.zeros(1, size, dtype=torch.long, device=self._device)
            features = torch.zeros(1, size, width, dtype=self.head.fc.weight.dtype, device=self._device)
            self._run(ids, features, torch.arange(size),
                      torch.ones(size, size, dtype=torch.bool).tril(), 0, eager=False)
        self.eager._num_pairs = -1  # no committed pairs survive: only a step-0 request is accepted next

    def _run(
        self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor,
        write_at: int, eager: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward over ``n`` rows written at cache index ``write_at`` on: tokens (1, n), input features
        (1, n, d), positions (n,), ``allowed`` (n, m) bool over cache slots ``0 .. m - 1``. Pads to
        :func:`query_bucket` ``(n)`` rows unless ``eager``; returns predicted features (1, n, d) and float32 logits
        over the target vocabulary (1, n, V)."""
        assert self.cache is not None
        count = tokens.shape[1]
        padded = count if eager else query_bucket(count)
        self._reserve(write_at + padded + int(self._aot_cached), keep=write_at)  # a package's window stays below it
        length = self.cache.layers[0].max_cache_len
        ids = torch.zeros(1, padded, dtype=torch.long, device=self._device)  # (1, Q)
        ids[:, :count] = tokens
        inputs = hidden.new_zeros(1, padded, hidden.shape[-1])  # (1, Q, d)
        inputs[:, :count] = hidden
        rows = torch.full((padded,), int(positions[0]), dtype=torch.long)  # (Q,) padding at the first row's position
        rows[:count] = positions.cpu()
        write_from(self.cache, write_at)
        config = self.head.layer_config
        width = max(write_at + padded, allowed.shape[1]) if attends_windowed(config) else length  # to the last write
        full = padded_mask(allowed, padded, width, write_at)  # (Q, W)
        mask = additive_mask(full, dtype=self.head.fc.weight.dtype, device=self._device)  # (1, 1, Q, W)
        torch._dynamo.maybe_mark_dynamic(mask, 3)  # one compiled graph for every window
        arguments = (ids, inputs, rows.view(1, -1).to(self._device), mask)
        if self._aot_cached and not eager:
            predicted, logits = self._aot_step(padded, arguments)(self.cache, *arguments)
        elif self.compiled and not eager:
            predicted, logits = self._warm.call(
                (padded, length), self._step, *arguments,
                settings=lambda: compiled_forward_settings(config, self._device.type, padded))
        else:
            with windowed_attention(config):
                predicted, logits = (self._head_step if eager else self._step)(*arguments)
        return predicted[:, :count], logits[:, :count]

    def _aot_step(self, padded: int, example: tuple[torch.Tensor, ...]) -> CachedForward:
        """The compiled package of the step for this (padded size, cache length), loaded or compiled once."""
        assert self.cache is not None
        shape = (padded, self.cache.layers[0].max_cache_len)
        if shape not in self._aot:
            config = self.head.layer_config
            key = dict(shape=f"{self._warm.label} step for shape {shape}", weights=weights_fingerprint(self.head),
                       config=json.dumps(self.head.config.to_dict(), sort_keys=True, default=str),
                       **package_key(self.head.fc.weight.dtype))
            self._aot[shape] = CachedForward.load_or_compile(
                self._head_step, self.cache, example, key,
                settings=lambda: compiled_forward_settings(config, self._device.type, padded))
        return self._aot[shape]

    def _head_step(
        self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (1, Q), input features (1, Q, d), positions (1, Q), additive mask (1, 1, Q, W <= L) -> predicted features
        (1, Q, d) and float32 target-vocabulary logits (1, Q, V); writes the Q new KV entries into the cache."""
        predicted = self.head.predict(ids, hidden, position_ids=positions, attention_mask=mask, cache=self.cache)
        return predicted, self.head.logits(predicted)

    @property
    def _device(self) -> torch.device:
        return self.eager._device

    def _reserve(self, length: int, keep: int) -> None:
        if self.cache is None or length > self.cache.layers[0].max_cache_len:
            weight = self.head.fc.weight
            self.cache = grown_cache(self.head.layer_config, self.cache, length, keep, dtype=weight.dtype,
                                     device=weight.device)
