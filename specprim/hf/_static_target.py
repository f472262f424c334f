"""Tree verification with static shapes: a preallocated KV cache and trees padded to a few fixed sizes, so one
``torch.compile``d forward (``fullgraph``, no dynamic shapes) serves every step of a run."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch
from torch._dynamo import config as dynamo_config
from torch._inductor import config as inductor_config
from transformers import PretrainedConfig, PreTrainedModel, StaticCache
from transformers.cache_utils import StaticLayer
from transformers.utils import output_capturing

from specprim._types import DraftTree
from specprim.hf._aot_forward import CachedForward, aot_applies, package_key, weights_fingerprint
from specprim.hf._causal_lm import CausalLM
from specprim.hf._windowed_attention import attends_windowed, windowed_attention
from specprim.linears import Int4Linear, stock_kernels
from specprim.masks import additive_mask, tree_attention_mask, tree_position_ids

logger = logging.getLogger(__name__)

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"
"""transformers' switch for attending on the key/value heads as they are (``enable_gqa``) even when a mask is passed;
without it, its SDPA attention repeats them to the query heads whenever there is a mask."""

QUERY_BUCKETS = (2, 4, 8, 16, 32, 64)
"""Padded sizes of ``[root] + tree``; larger trees are padded to a multiple of the last one."""

CACHE_ROUNDING = 512
"""The static cache's length is a multiple of this, so prompts of similar length share compiled forwards."""

RECOMPILE_LIMIT = 64
"""Distinct (query bucket, cache length, feature layers) shapes one process may compile before falling back."""

CPP_GEMM_MAX_TOKENS = 4
"""On CPU, forwards of at most this many (padded) query tokens multiply through inductor's C++ GEMM template instead
of oneDNN (see :func:`compiled_settings`); forwards of bfloat16 int4 models use it at every size."""

PREFILL_CHUNK = 64
"""Tokens per forward of a chunked prefill (see :class:`StaticTarget`'s ``prefill_chunk``)."""


def query_bucket(size: int) -> int:
    """The padded query length for a forward over ``size`` tokens: the smallest of :data:`QUERY_BUCKETS` that
    holds it, else the next multiple of the largest."""
    for bucket in QUERY_BUCKETS:
        if size <= bucket:
            return bucket
    step = QUERY_BUCKETS[-1]
    return -(-size // step) * step


class WarmShapes:
    """Calls of a compiled static forward, with dynamo's guard check cut short for shapes that already ran.

    Each call of a compiled function first evaluates its guards (0.4-0.6 ms per SmolLM2-135M verification on 2 CPU
    cores, 3-4 % of it: ``docs/studies/verifier_settings.md``, guard-skip). A static forward is called again
    and again with the same few shapes, so :meth:`call` checks the guards in full the first time a shape key runs, and
    afterwards runs it under ``torch.compiler.set_stance(..., skip_guard_eval_unsafe=True)``: dynamo then evaluates
    only the guards that told its compiled graphs apart so far (those that failed once and caused a recompilation),
    enough to pick among the graphs it has built. Should a warm call still need a new graph (dynamo raises then,
    before running anything), it runs again with the guards in full. The key names what a graph is specialized on
    besides the guarded inputs: the padded size, the feature layers, the cache's length."""

    def __init__(self, label: str = "static forward") -> None:
        self.label = label
        self._warm: set[Hashable] = set()
        self._seen: set[Hashable] = set()

    def call(
        self, key: Hashable, function: Callable[..., Any], *args: Any,
        settings: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> Any:
        """``function(*args)``, the compiled forward of shape ``key``. ``settings()`` is the context it is compiled
        under (e.g. :func:`compiled_settings`); it is entered only for calls that check the guards in full, which
        may compile. A warm call runs a graph already built, as it was built, and skips it (about 0.2 ms per call
        here)."""
        if key in self._warm:
            try:
                with torch.compiler.set_stance(_current_stance(), skip_guard_eval_unsafe=True):
                    return function(*args)
            except RuntimeError as error:
                if "skip_guard_eval_unsafe" not in str(error):  # not dynamo asking for a recompilation
                    raise
        first = key not in self._seen
        if first:
            logger.info("compiling the %s for shape %s (once per shape and process; about a minute on 2 CPU cores)",
                        self.label, key)
        start = time.perf_counter()
        with settings():
            result = function(*args)
        if first:
            logger.info("compiled the %s for shape %s in %.1f s", self.label, key, time.perf_counter() - start)
        self._seen.add(key)
        self._warm.add(key)
        return result


def _current_stance() -> str:
    """The dynamo stance in force (``"default"`` unless a caller set another)."""
    stance = getattr(torch._dynamo.eval_frame, "_stance", None)
    return getattr(stance, "stance", "default")


class StaticTarget:
    """A Hugging Face causal LM as a speculative-decoding target with static shapes, optionally compiled.

    Same interface as :class:`~specprim.hf.HFTarget` (``start``, ``verify``, ``commit``, ``past_length``); pass it
    to :func:`specprim.speculative_generate` in place of the model. Differences:

    * the KV cache is a :class:`transformers.StaticCache` whose length is a multiple of :data:`CACHE_ROUNDING`
      (reallocated, larger, when a sequence needs it); committing moves the accepted path's entries in place;
    * each verification pads ``[root] + tree`` to :func:`query_bucket` tokens (padding rows see only
      themselves and write cache slots that no real token reads before they are overwritten);
    * the layers run in a loop of this class's own, so the hidden states EAGLE drafters need come out of the
      same graph without hooks;
    * on SDPA (the default), attention reads the cache only up to the last slot a forward writes, not all of it
      (:func:`specprim.hf.windowed_attention`; 9-13 % cheaper SmolLM2 forwards after a 100-token context here);
      other attention implementations attend over the whole cache, masked.

    With ``compile=True`` that loop is ``torch.compile``d with ``fullgraph=True`` and static shapes (inductor freezing
    on, which pre-packs the weights for oneDNN on CPU; only the attended width is dynamic): one compilation per (query
    bucket, cache length, feature layers), about 75 s each for SmolLM2-135M on 2 CPU cores, reused across calls and
    prompts. The prefill runs eagerly, in one forward over the prompt (``prefill_chunk=0``), or, with
    ``prefill_chunk=n``, through the same (compiled) forward in chunks of ``n`` tokens, the last one padded, so one
    more graph serves every prompt length. By default (``None``) a compiled target with int4 weights
    (:class:`specprim.models.Int4Linear`) or in bfloat16 prefills in chunks of :data:`PREFILL_CHUNK` (the eager int4
    kernel is slow for many rows; packed bf16 SmolLM2 prefills 0.73x as long: ``docs/studies/int4_prefill.py
    [--weights bf16]``), and every other target prefills eagerly. A model with packed
    weights (:func:`specprim.models.pack_weights`) keeps them for the eager prefill, and the compiled forward lets
    freezing pack the weights its own way. Keep one ``StaticTarget`` per model for a whole run, and give it
    ``min_padded``: forwards pad to at least :func:`query_bucket` ``(min_padded)`` tokens, so smaller trees reuse a
    larger shape's graph instead of compiling their own (SmolLM2-135M: a 4-token forward costs ~1 ms more than a
    2-token one, a compilation ~60 s).
    ``min_cache_length`` >= the longest prompt plus its budget (plus ``prefill_chunk``): a cache that grows mid-run
    changes the shapes, and every padded size compiles again.

    :meth:`forward_nodes` is the general step under :meth:`verify` (any tokens, positions and attention over the
    cache), and ``head`` replaces the LM head that scores the last hidden states (default: the model's own; a
    drafter passes a reduced-vocabulary head): :class:`StaticLMDraftModel` drafts through both.

    Guarantees: with ``compile=False`` it computes what :class:`HFTarget` computes (greedy outputs equal
    ``model.generate``'s in fp32, tested); compiled, it computes the same function up to floating-point rounding,
    and speculative decoding stays lossless with respect to the compiled verifier.

    Supports Llama-style decoders (``model.model`` with ``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``;
    Llama, Qwen2, Mistral, ...) with full attention in every layer and batch size 1; anything else raises
    ``TypeError`` (use :class:`HFTarget`).
    """

    def __init__(
        self, model: PreTrainedModel, *, compile: bool = True, min_cache_length: int = 0,  # noqa: A002 - option name
        head: torch.nn.Module | None = None, prefill_chunk: int | None = None, min_padded: int = 0,
    ) -> None:
        self.lm = CausalLM.of(model)
        self.model, self.device, self.vocab_size = model, self.lm.device, self.lm.vocab_size
        if not isinstance(min_padded, int) or isinstance(min_padded, bool) or min_padded < 0:
            raise ValueError(f"min_padded must be an int >= 0, got {min_padded!r}")
        self.min_padded = min_padded
        if prefill_chunk is not None and (not isinstance(prefill_chunk, int) or isinstance(prefill_chunk, bool)
                                          or prefill_chunk < 0):
            raise ValueError(f"prefill_chunk must be None or an int >= 0, got {prefill_chunk!r}")
        self.min_cache_length = min_cache_length
        int4 = any(isinstance(module, Int4Linear) for module in model.modules())
        # int4: the template at every size in bfloat16 (its int4 kernel's only dtype here), never in others
        self._gemm_template = (self.lm.dtype == torch.bfloat16) if int4 else None
        if prefill_chunk is None:
            prefill_chunk = PREFILL_CHUNK if compile and (int4 or self.lm.dtype == torch.bfloat16) else 0
        self.prefill_chunk = prefill_chunk  # 0: one eager forward
        self.head = model.get_output_embeddings() if head is None else head  # (..., H) -> (..., V) logits
        self._shapes: set[tuple[int, tuple[int, ...]]] = set()  # (padded size, feature layers) verified so far
        self.decoder = _llama_style_decoder(model)
        self.compiled = compile
        self._warm = WarmShapes("verifier" if head is None else "draft model")
        self.past_length = 0
        self.cache: StaticCache | None = None
        self._layer_cache_kwarg = _layer_cache_kwarg(self.decoder.layers[0])
        self._forward_layers: Callable[..., tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = self._layers
        if compile:
            self._forward_layers = torch.compile(self._layers, dynamic=False, fullgraph=True)
        self._aot_cached = compile and aot_applies(model.config, model, self.head)
        self._aot: dict[tuple[int, tuple[int, ...], int], CachedForward] = {}
        self._fingerprint: str | None = None

    def check_length(self, total_length: int) -> None:
        """Raise ``ValueError`` if a sequence of ``total_length`` tokens does not fit the model."""
        self.lm.check_length(total_length)

    @torch.no_grad()
    def start(self, input_ids: torch.Tensor, feature_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
        """Prefill the cache with ``input_ids[:, :-1]`` (1, T); the last token becomes the root. The prefill is one
        eager forward, or forwards of ``prefill_chunk`` tokens each (the last one padded).

        Returns one (1, T - 1, H) hidden-state tensor per entry of ``feature_layers`` (indices into
        ``output_hidden_states``: 0 the embeddings, ``i`` the output of layer ``i - 1``, the last the final norm's).
        """
        if input_ids.shape[0] != 1:
            raise ValueError(f"StaticTarget decodes one sequence at a time, got a batch of {input_ids.shape[0]}")
        self._check_feature_layers(feature_layers)
        prefix = input_ids[:, :-1].to(self.device)  # (1, T - 1)
        length = prefix.shape[1]
        room = max(self.prefill_chunk, QUERY_BUCKETS[0])
        self._reserve(max(length + room, self.min_cache_length), keep=0)
        self.past_length = 0
        self._write_from(0)
        if length == 0:  # a one-token prompt: nothing to prefill
            return self.lm.no_hidden_states(1, feature_layers)
        if self.prefill_chunk:
            return self._prefill_in_chunks(prefix[0], feature_layers)
        with self._attention() as windowed:
            window = length if windowed else self.cache_length
            allowed = padded_mask(torch.ones(length, length, dtype=torch.bool).tril(), length, window, 0)
            _, hidden = self._layers(
                prefix, torch.arange(length, device=self.device).view(1, -1), self._mask(allowed), feature_layers
            )
        self.past_length = length
        return hidden

    def _prefill_in_chunks(self, prefix: torch.Tensor, feature_layers: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """Prefill ``prefix`` (n,) in forwards of ``prefill_chunk`` padded tokens, each attending causally to the
        chunks before it; return the ``feature_layers`` hidden states, (1, n, H) each."""
        chunk = self.prefill_chunk
        pieces: list[tuple[torch.Tensor, ...]] = []
        for begin in range(0, prefix.shape[0], chunk):
            tokens = prefix[begin : begin + chunk]  # (c,)
            count = tokens.shape[0]
            allowed = torch.ones(count, begin + count, dtype=torch.bool).tril(begin)  # (c, begin + c) causal
            _, hidden = self._forward_padded(tokens, torch.arange(begin, begin + count), allowed, feature_layers,
                                             padded=chunk)
            pieces.append(hidden)
            self.past_length = begin + count
        return tuple(torch.cat(states, dim=1) for states in zip(*pieces, strict=True)) if feature_layers else ()

    @torch.no_grad()
    def verify(
        self, root: torch.Tensor, tree: DraftTree, feature_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Score ``[root] + tree`` in one forward of :func:`query_bucket` ``(N + 1)`` padded tokens.

        Args:
            root: (1,) long, the last committed token.
            tree: the draft tree, batch size 1.
            feature_layers: indices into ``output_hidden_states`` to return.
        Returns:
            logits: (1, N + 1, V) float32; row 0 scores the root's children, row ``i + 1`` the children of node ``i``.
            hidden: one (1, N + 1, H) tensor per entry of ``feature_layers`` (row 0 is the root's).
        """
        if tree.batch_size != 1:
            raise ValueError(f"StaticTarget verifies one tree at a time, got a batch of {tree.batch_size}")
        past = self.past_length
        real = 1 + tree.num_nodes
        tokens = torch.cat([root.reshape(-1)[:1].to(self.device), tree.tokens[0].to(self.device)])  # (N + 1,)
        positions = torch.full((real,), past, dtype=torch.long)  # (N + 1,)
        positions[1:] = tree_position_ids(tree.parents.cpu(), offset=past)
        allowed = torch.zeros(real, past + real, dtype=torch.bool)  # (N + 1, past + N + 1)
        allowed[:, : past + 1] = True  # prefix and root
        allowed[1:, past + 1 :] = tree_attention_mask(tree.parents.cpu(), device="cpu")
        return self.forward_nodes(tokens, positions, allowed, feature_layers)

    @torch.no_grad()
    def forward_nodes(
        self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, feature_layers: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Run ``n`` tokens in one forward of :func:`query_bucket` ``(n)`` padded tokens, writing their KV entries at
        cache slots ``past_length .. past_length + n - 1`` (``past_length`` itself is not moved: see :meth:`commit`).

        Args:
            tokens: (n,) long.
            positions: (n,) long position ids.
            allowed: (n, past_length + n) bool, the cache slots each token attends to (its own included).
            feature_layers: indices into ``output_hidden_states`` to return.
        Returns:
            logits: (1, n, V) float32 (``V`` the ``head``'s outputs); hidden: one (1, n, H) tensor per feature layer.
        """
        self._check_feature_layers(feature_layers)
        real = tokens.shape[0]
        if allowed.shape != (real, self.past_length + real):
            raise ValueError(f"allowed must have shape ({real}, {self.past_length + real}), got {tuple(allowed.shape)}")
        padded = query_bucket(max(real, self.min_padded))
        self._shapes.add((padded, tuple(feature_layers)))
        logits, hidden = self._forward_padded(tokens, positions, allowed, feature_layers, padded)
        return logits.float(), hidden

    def _forward_padded(
        self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, feature_layers: tuple[int, ...],
        padded: int,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """:meth:`forward_nodes` padded to ``padded`` (>= n) tokens, the logits in the model's dtype."""
        real, past = tokens.shape[0], self.past_length
        self.lm.check_length(past + real)
        self._reserve(past + padded + int(self._aot_cached), keep=past)  # a package's window stays below the cache
        ids = torch.zeros(1, padded, dtype=torch.long, device=self.device)  # (1, Q)
        ids[0, :real] = tokens
        padded_positions = torch.full((padded,), int(positions[0]), dtype=torch.long)  # (Q,), padding rows anywhere
        padded_positions[:real] = positions.cpu()
        self._write_from(past)
        # attended slots: up to the last one written
        window = past + padded if attends_windowed(self.decoder.config) else self.cache_length
        mask = self._mask(padded_mask(allowed.cpu(), padded, window, past))  # (1, 1, Q, W)
        torch._dynamo.maybe_mark_dynamic(mask, 3)  # one compiled graph for every window
        position_ids = padded_positions.view(1, -1).to(self.device)  # (1, Q)
        arguments = (ids, position_ids, mask, feature_layers)
        if self.compiled and self._aot_cached:
            logits, hidden = self._aot_forward(padded, feature_layers, arguments[:3])(self.cache, *arguments[:3])
        elif self.compiled:
            logits, hidden = self._warm.call(
                (padded, feature_layers, self.cache_length), self._forward_layers, *arguments,
                settings=lambda: compiled_forward_settings(self.decoder.config, self.device.type, padded,
                                                           gemm_template=self._gemm_template))
        else:
            with self._attention():
                logits, hidden = self._forward_layers(*arguments)
        return logits[:, :real], tuple(h[:, :real] for h in hidden)

    def _aot_forward(self, padded: int, feature_layers: tuple[int, ...],
                     example: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> CachedForward:
        """The compiled package of this (padded size, feature layers, cache length), loaded or compiled once."""
        shape = (padded, feature_layers, self.cache_length)
        if shape not in self._aot:
            if self._fingerprint is None:
                self._fingerprint = weights_fingerprint(self.model) + weights_fingerprint(self.head)
            key = dict(shape=f"{self._warm.label} for shape {shape}", weights=self._fingerprint,
                       config=self.model.config.to_json_string(use_diff=False),
                       gemm_template=_uses_gemm_template(padded, self._gemm_template), **package_key(self.lm.dtype))
            self._aot[shape] = CachedForward.load_or_compile(
                functools.partial(self._layers, feature_layers=feature_layers), self.cache, example, key,
                settings=lambda: compiled_forward_settings(self.decoder.config, self.device.type, padded,
                                                           gemm_template=self._gemm_template))
        return self._aot[shape]

    def commit(self, path: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the KV entries of the root and the accepted nodes: copy them in place to follow the root.

        Args:
            path: (1, D) long node ids, ``-1`` padded, as in :class:`specprim.Verdict`.
            num_accepted: (1,) long.
        """
        assert self.cache is not None, "call start() first"
        accepted = int(num_accepted.reshape(-1)[0])
        tree_start = self.past_length + 1  # cache index of node 0
        kept = path[0, :accepted].cpu()  # (a,)
        if not torch.equal(kept, torch.arange(accepted)):  # nodes 0..a-1 are already in place
            source = (kept + tree_start).to(self.device)
            for layer in self.cache.layers:
                layer.keys[:, :, tree_start : tree_start + accepted] = layer.keys[:, :, source]
                layer.values[:, :, tree_start : tree_start + accepted] = layer.values[:, :, source]
        self.past_length = tree_start + accepted

    @torch.no_grad()
    def compile_smaller_sizes(self) -> None:
        """Verify a dummy tree of every padded size below the largest one verified so far (for each set of feature
        layers seen), so that a run that later meets a smaller tree (a tree truncated near the end of the budget)
        does not compile then. Call it after a warm-up generation; the cache's contents and length are kept."""
        assert self.cache is not None, "call start() first"
        past = self.past_length
        root = torch.zeros(1, dtype=torch.long, device=self.device)
        for largest, layers in sorted(self._shapes):
            for size in (s for s in QUERY_BUCKETS if s < largest and (s, layers) not in self._shapes):
                chain = DraftTree(tokens=torch.zeros(1, size - 1, dtype=torch.long), parents=torch.arange(size - 1) - 1)
                self.verify(root, chain, layers)
                self.past_length = past  # nothing was committed
        self._write_from(past)

    @property
    def cache_length(self) -> int:
        """Positions the static cache holds now (0 before :meth:`start`)."""
        return 0 if self.cache is None else self.cache.layers[0].max_cache_len

    def _layers(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, feature_layers: tuple[int, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """ids (1, Q), positions (1, Q), additive mask (1, 1, Q, W) over the cache's first ``W`` slots -> logits
        (1, Q, V) and the ``feature_layers`` hidden states (1, Q, H) each; writes the Q new KV entries into the static
        cache."""
        decoder = self.decoder
        hidden = decoder.embed_tokens(ids)  # (1, Q, H)
        states = [hidden]  # output_hidden_states order: embeddings, then each layer's output, the last normed
        rotary = decoder.rotary_emb(hidden, position_ids=positions)
        last = len(decoder.layers) - 1
        for index, layer in enumerate(decoder.layers):
            hidden = layer(
                hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary, use_cache=True,
                **{self._layer_cache_kwarg: self.cache},
            )
            states.append(decoder.norm(hidden) if index == last else hidden)
        logits = self.head(states[-1])  # (1, Q, V)
        return logits, tuple(states[i] for i in feature_layers)

    def _attention(self) -> contextlib.AbstractContextManager[bool]:
        return windowed_attention(self.decoder.config)

    def _write_from(self, position: int) -> None:
        assert self.cache is not None
        write_from(self.cache, position)

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        return additive_mask(allowed, dtype=self.lm.dtype, device=self.device)  # (1, 1, Q, L)

    def _reserve(self, length: int, keep: int) -> None:
        """Make the cache hold ``length`` positions, keeping the first ``keep`` entries when it must grow."""
        if length > self.cache_length:
            self.cache = grown_cache(self.model.config, self.cache, length, keep, dtype=self.lm.dtype,
                                     device=self.device)

    def _check_feature_layers(self, feature_layers: tuple[int, ...]) -> None:
        count = len(self.decoder.layers) + 1
        for index in feature_layers:
            if not -count <= index < count:  # negative: from the end, as in output_hidden_states (-1: the last)
                raise ValueError(f"feature layer {index} is outside output_hidden_states' range [-{count}, {count})")


@contextlib.contextmanager
def compiled_settings(device_type: str = "cpu", tokens: int | None = None, *, gemm_template: bool | None = None
                      ) -> Iterator[None]:
    """The settings static-shape forwards on ``device_type`` are compiled and run under: inductor freezing
    (pre-packs the weights for oneDNN on CPU), a C++ wrapper around the generated kernels (no Python between them:
    ~1-2 ms less per SmolLM2 forward here, twice the compile time), linears that read the same input concatenated
    into one (``q/k/v`` and ``gate/up``: 4 instead of 7 matrix products per Llama layer), on CPU attention on the
    key/value heads as they are (:data:`FORCE_GQA`; transformers would repeat them to the query heads, since a mask
    is passed; on CUDA a masked grouped-query attention could fall back to the math kernel, so there it repeats
    them; these two are measured by ``docs/studies/verifier_settings.md``), room for one compiled graph per shape,
    packed layers (:func:`specprim.models.pack_weights`) traced as plain ``F.linear``, which freezing then pre-packs
    itself, and transformers' output-capturing hooks out of the way.

    ``tokens``: the forward's padded query length. On CPU, forwards of at most :data:`CPP_GEMM_MAX_TOKENS` tokens
    compile their matrix products with inductor's C++ GEMM template (``max_autotune`` with the ``CPP`` backend,
    falling back to ATen where the template does not apply): with a few rows a product streams its weights once,
    and the template's vectorised micro-kernel does it faster than a oneDNN call (SmolLM2-135M bf16 on 2 cores: 13.2
    against 22.7 ms for one token, 16.1 against 19.2 ms for four); with more rows it turns compute-bound and oneDNN
    wins (51.4 against 24.3 ms for eight), so larger forwards keep oneDNN. Measured by
    ``docs/studies/verifier_settings.md``, ``--setting cpp-gemm --cpp-gemm-max-tokens 16``.

    ``gemm_template``: ``None`` chooses by size as above; ``True`` uses the template at every size, ``False`` never
    (on CPU). :class:`StaticTarget` passes ``True`` for a bfloat16 model with :class:`specprim.models.Int4Linear`
    layers: ATen's int4 kernel, the only other choice, costs about one more one-token forward per 4-6 rows, while the
    template's int4 micro-kernel stays nearly flat (``docs/studies/verifier_settings.md``, ``--setting int4-gemm``); and
    ``False`` for int4 layers in another dtype, which the template does not take (inductor would then have no kernel
    left to choose). The settings in force when a shape first runs are the ones it is compiled with."""
    with (inductor_config.patch({"freezing": True, "cpp_wrapper": True, "cpp.enable_concat_linear": True}),
          _small_gemm_kernels() if device_type == "cpu" and _uses_gemm_template(tokens, gemm_template)
          else contextlib.nullcontext(),
          _environment(FORCE_GQA, "1") if device_type == "cpu" else contextlib.nullcontext(),
          dynamo_config.patch(recompile_limit=RECOMPILE_LIMIT), stock_kernels(), _output_capturing_off()):
        yield


@contextlib.contextmanager
def compiled_forward_settings(config: PretrainedConfig, device_type: str = "cpu", tokens: int | None = None, *,
                              gemm_template: bool | None = None) -> Iterator[None]:
    """What a static forward of a model reading ``config`` is compiled under: :func:`windowed_attention` and
    :func:`compiled_settings` (same arguments)."""
    with windowed_attention(config), compiled_settings(device_type, tokens, gemm_template=gemm_template):
        yield


def _uses_gemm_template(tokens: int | None, gemm_template: bool | None) -> bool:
    """Whether a CPU forward of ``tokens`` padded tokens multiplies through the C++ GEMM template."""
    if gemm_template is not None:
        return gemm_template
    return tokens is not None and tokens <= CPP_GEMM_MAX_TOKENS


def _small_gemm_kernels() -> contextlib.AbstractContextManager[None]:
    """Inductor settings that compile matrix products with its C++ GEMM template (ATen where it does not apply)."""
    return inductor_config.patch({"max_autotune": True, "max_autotune_gemm_backends": "CPP",
                                  "autotune_fallback_to_aten": True})


def padded_mask(allowed: torch.Tensor, padded: int, cache_length: int, write_at: int) -> torch.Tensor:
    """The (padded, cache_length) bool mask of a forward whose ``n`` real rows, written at cache index ``write_at``
    on, see ``allowed`` (n, m) over slots ``0 .. m - 1``; padding row ``j`` (``n <= j < padded``) sees only its own
    slot ``write_at + j``, so no row is fully masked and no real row reads a padding entry."""
    count = allowed.shape[0]
    full = torch.zeros(padded, cache_length, dtype=torch.bool)
    full[:count, : allowed.shape[1]] = allowed
    pad = torch.arange(count, padded)
    full[pad, write_at + pad] = True
    return full


def write_from(cache: StaticCache, position: int) -> None:
    """Make the next forward write its KV entries from cache index ``position`` on (``StaticLayer.update`` writes at
    each layer's ``cumulative_length``)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(position)


def grown_cache(
    config: PretrainedConfig, old: StaticCache | None, length: int, keep: int, *, dtype: torch.dtype,
    device: torch.device,
) -> StaticCache:
    """A new :class:`transformers.StaticCache` for ``config`` holding ``length`` positions rounded up to
    :data:`CACHE_ROUNDING`, with the first ``keep`` entries of ``old`` copied in. ``TypeError`` unless every layer
    is full attention."""
    cache = StaticCache(config=config, max_cache_len=-(-length // CACHE_ROUNDING) * CACHE_ROUNDING)
    for layer in cache.layers:
        if type(layer) is not StaticLayer:
            raise TypeError(f"{config.model_type} uses cache layer {type(layer).__name__}; static shapes support full "
                            "attention in every layer only (use HFTarget)")
    text = config.get_text_config()
    num_kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    cache.early_initialization(batch_size=1, num_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, device=device)
    if old is not None and keep:
        for new_layer, old_layer in zip(cache.layers, old.layers, strict=True):
            new_layer.keys[:, :, :keep] = old_layer.keys[:, :, :keep]
            new_layer.values[:, :, :keep] = old_layer.values[:, :, :keep]
    return cache


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """Set the environment variable ``name`` to ``value`` inside the context (unless it is already set), restore it
    after."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        del os.environ[name]


@contextlib.contextmanager
def _output_capturing_off() -> Iterator[None]:
    """Let dynamo trace through transformers' output-capturing hooks (installed on the layers once anything asked the
    model for hidden states): while on, their collector reads as a plain ``None`` global instead of a ``ContextVar``,
    which dynamo cannot trace, so the hooks do nothing and leave the graph whole."""
    collector = getattr(output_capturing, "_active_collector", None)
    if collector is None or not hasattr(collector, "compiling") or collector.compiling:
        yield
        return
    collector.compiling, collector.global_var = True, None
    try:
        yield
    finally:
        collector.compiling, collector.global_var = False, None


def _llama_style_decoder(model: PreTrainedModel) -> torch.nn.Module:
    decoder = getattr(model, "model", None)
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise TypeError(f"StaticTarget supports Llama-style decoders (model.model with embed_tokens, layers, norm, "
                        f"rotary_emb); {type(model).__name__} is not one: use HFTarget")
    return decoder


def _layer_cache_kwarg(layer: torch.nn.Module) -> str:
    params = inspect.signature(layer.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
