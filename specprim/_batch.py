"""Speculative generation for a batch of prompts with ragged acceptance: every row drafts and accepts on its own,
only the target's verification forward is batched."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from specprim._stats import GenerateOutput, GenerationStats, merge_stats
from specprim._step import AcceptanceRule, Row, check_budget, check_decodes, speculative_step, stop_token_ids
from specprim._types import TargetFeatures
from specprim.drafters import Drafter
from specprim.hf import BatchedHFTarget
from specprim.sampling import SamplingConfig

__all__ = ["BatchGenerateOutput", "batch_generate", "wants_batch"]

COMPACT_MIN_SLOTS = 16
"""Compact the ragged cache once at least this many slot columns, and a quarter of all, are reclaimable."""


@dataclasses.dataclass(frozen=True)
class BatchGenerateOutput(GenerateOutput):
    """What :func:`specprim.speculative_generate` returns for a batch (``B > 1``, or an ``attention_mask``).

    Attributes:
        sequences: (B, T + n_max) long. Row ``b`` is its prompt exactly as given (left padding kept), its
            ``n_b`` generated tokens, then ``n_max - n_b`` copies of ``pad_token_id``.
        attention_mask: (B, T + n_max) long, 1 on prompt and generated tokens, 0 on left and right padding.
        stats: all rows pooled: one record per (row, step) pair, so ``tau`` is the mean accepted length of a
            row step and ``new_tokens`` the batch's total; ``draft_s`` is all drafting, ``verify_s`` all batched
            target forwards, ``other_s`` the rest of the loop's wall time (``total_s`` is the wall time).
        row_stats: one :class:`GenerationStats` per row, for that row's steps; its ``verify_s`` is the time of
            the batched forwards it took part in (shared with the other rows, so row times do not add up).
        forwards: batched target forwards after the prefill (the pooled ``stats.steps`` counts row steps).
    """

    attention_mask: torch.Tensor
    row_stats: tuple[GenerationStats, ...]
    forwards: int


def wants_batch(input_ids: object, attention_mask: object, drafter: object) -> bool:
    """Whether a call to ``speculative_generate`` takes the batched path: a 2-D prompt with ``B > 1``, an
    ``attention_mask``, or a list / tuple of drafters."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return False
    return input_ids.shape[0] > 1 or attention_mask is not None or isinstance(drafter, (list, tuple))


def batch_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    drafter: Drafter | Sequence[Drafter],
    acceptance: AcceptanceRule,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    streamer: object | None = None,
    pad_token_id: int | None = None,
) -> BatchGenerateOutput:
    """Speculative generation for ``B`` left-padded prompts, each row as if generated alone.

    Args:
        input_ids: (B, T) long; row ``b``'s prompt is its last ``attention_mask[b].sum()`` tokens.
        attention_mask: (B, T) of 0 / 1 (or bool), 0 on left padding only, as Hugging Face tokenizers return with
            ``padding_side="left"``; ``None`` means no padding.
        drafter: a sequence of ``B`` distinct drafters, one per row (drafters keep per-sequence state; they may
            share modules, e.g. one EAGLE head). A single drafter is accepted for ``B == 1`` only.
        pad_token_id: fills the right padding of finished rows (``speculative_generate`` passes the model's
            ``generation_config.pad_token_id``); ``None``: the first ``eos_token_id``, else 0.
        The other arguments are those of :func:`specprim.speculative_generate`.

    Each step, every unfinished row's drafter proposes a tree from that row's own unpadded ids (and, for
    feature drafters, that row's target hidden states); the target verifies all rows' ``[root] + tree`` in one
    forward over a ragged KV cache (:class:`specprim.hf.BatchedHFTarget`); ``acceptance`` runs per row on that
    row's tree; rows may accept different numbers of tokens. A row stops at its first ``eos_token_id`` or after
    ``max_new_tokens`` tokens and leaves the batch.

    Guarantees: row ``b`` follows exactly the batch-1 algorithm on its own prompt with its own drafter, so under
    greedy decoding it equals the batch-1 output token for token (up to floating-point summation order in the
    batched forward), and with a lossless rule each row is distributed as sampling from the target. The
    ``generator`` is shared: rows draw from it in row order, so sampled outputs differ from batch-1 runs with
    the same seed while having the same distribution.

    Raises ``ValueError`` for an ``attention_mask`` of another shape, with values other than 0 / 1, with right
    padding or an empty row; for a single drafter (``B > 1``), a wrong number of drafters or one drafter object
    used for two rows; for a ``streamer``; and everything :func:`specprim.speculative_generate` raises.
    """
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    verifier = BatchedHFTarget(target)
    ids, mask = _check_batch(input_ids, attention_mask)  # (B, T), (B, T) bool
    batch, width = ids.shape
    drafters = _check_drafters(drafter, batch)
    check_budget(max_new_tokens)
    check_decodes(acceptance, drafters, sampling)
    if streamer is not None:
        raise ValueError("a streamer needs one unpadded prompt (B = 1, no attention_mask)")
    stop_ids = stop_token_ids(eos_token_id)
    pad = pad_token_id if pad_token_id is not None else (int(stop_ids[0]) if stop_ids.numel() else 0)
    lengths = mask.sum(1).tolist()  # prompt length of every row
    verifier.check_length(max(lengths) + max_new_tokens)
    rows = [Row(ids=ids[b : b + 1, width - lengths[b] :].to(verifier.device), prompt_length=lengths[b],
                budget=max_new_tokens, drafter=drafters[b], layers=tuple(getattr(drafters[b], "feature_layers", ())))
            for b in range(batch)]  # ids (1, T_b) each
    layers = tuple(dict.fromkeys(layer for row in rows for layer in row.layers))
    active = list(rows) if max_new_tokens > 0 else []  # the rows in the verifier's batch, in its order
    loop_start = time.perf_counter()
    if active:
        hidden = verifier.start(ids, mask, layers)  # (B, T - 1, H) each
        for b, row in enumerate(rows):
            if row.layers:
                prompt = tuple(hidden[layers.index(layer)][b : b + 1, width - lengths[b] :] for layer in row.layers)
                row.features = TargetFeatures(hidden_states=prompt, token_ids=row.ids[:, :-1], start=0)
    forwards, verify_s = 0, 0.0
    while active:
        shared = active[0].stats.verify_s  # every row of a step records the one batched forward's time
        speculative_step(
            active, verify=lambda roots, trees: verifier.verify(roots, trees, layers, pad),
            commit=lambda verdicts: verifier.commit([v.path[0, : int(v.num_accepted[0])] for v in verdicts]),
            acceptance=acceptance, sampling=sampling, vocab_size=verifier.vocab_size, device=verifier.device,
            layers=layers, generator=generator, stop_ids=stop_ids,
        )
        forwards += 1
        verify_s += active[0].stats.verify_s - shared
        keep = [i for i, row in enumerate(active) if not row.finished]
        if len(keep) < len(active):
            verifier.keep_rows(torch.tensor(keep, dtype=torch.long))
            active = [active[i] for i in keep]
        if active and verifier.reclaimable() >= max(COMPACT_MIN_SLOTS, verifier.num_slots // 4):
            verifier.compact()
    pooled = merge_stats([row.stats for row in rows])  # every (row, step) record; times: the loop's wall time
    pooled.verify_s = verify_s
    pooled.other_s = time.perf_counter() - loop_start - pooled.draft_s - verify_s  # the rest, prefill included
    sequences, out_mask = _assemble(input_ids, mask, [row.ids for row in rows], lengths, pad)
    return BatchGenerateOutput(sequences=sequences, stats=pooled, attention_mask=out_mask,
                               row_stats=tuple(row.stats for row in rows), forwards=forwards)


def _assemble(
    input_ids: torch.Tensor, mask: torch.Tensor, rows: list[torch.Tensor], lengths: list[int], pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as given followed by each row's generated tokens, right-padded: (B, T + n_max) twice."""
    generated = [row[0, length:].to(input_ids.device) for row, length in zip(rows, lengths, strict=True)]
    longest = max((g.shape[0] for g in generated), default=0)
    tail = input_ids.new_full((input_ids.shape[0], longest), pad)  # (B, n_max)
    tail_mask = torch.zeros(input_ids.shape[0], longest, dtype=torch.long, device=input_ids.device)
    for b, tokens in enumerate(generated):
        tail[b, : tokens.shape[0]] = tokens
        tail_mask[b, : tokens.shape[0]] = 1
    return torch.cat([input_ids, tail], dim=1), torch.cat([mask.long().to(input_ids.device), tail_mask], dim=1)


def _check_batch(input_ids: object, attention_mask: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a (B, T) prompt and its left-padding mask; return them (the mask as bool, same device)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a (B, T) tensor of token ids")
    if input_ids.dtype != torch.long:
        raise ValueError(f"input_ids must be torch.long, got {input_ids.dtype}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"the prompt batch is empty (shape {tuple(input_ids.shape)})")
    if attention_mask is None:
        return input_ids, torch.ones_like(input_ids, dtype=torch.bool)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {shape}")
    if attention_mask.is_floating_point() or bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError("attention_mask must hold 0 (padding) and 1 (token) as an integer or bool tensor")
    mask = attention_mask.bool().to(input_ids.device)  # (B, T)
    for row in range(mask.shape[0]):
        if not bool(mask[row].any()):
            raise ValueError(f"row {row} of attention_mask is all padding: every prompt needs at least one token")
    right = (mask[:, :-1] & ~mask[:, 1:]).any(1)  # (B,) a token followed by padding
    if bool(right.any()):
        row = int(right.nonzero()[0, 0])
        raise ValueError(
            f"row {row} of attention_mask has padding after a token (right padding); pad prompts on the left "
            "(tokenizer.padding_side = 'left'), as for model.generate"
        )
    return input_ids, mask


def _check_drafters(drafter: object, batch: int) -> list[Drafter]:
    if not isinstance(drafter, (list, tuple)):
        if batch == 1:
            return [drafter]  # type: ignore[list-item]
        raise ValueError(
            f"batch size {batch} needs one drafter per row, because drafters keep per-sequence state: pass "
            f"drafter=[...] with {batch} drafters, e.g. [PromptLookup() for _ in range(B)] or "
            "[presets.eagle3(head).drafter for _ in range(B)]"
        )
    if len(drafter) != batch:
        raise ValueError(f"got {len(drafter)} drafters for batch size {batch}: pass one drafter per row")
    seen: dict[int, int] = {}
    for row, item in enumerate(drafter):
        if id(item) in seen:
            raise ValueError(
                f"rows {seen[id(item)]} and {row} got the same drafter object; drafters keep per-sequence "
                "state, so build one per row (they may share a model or head)"
            )
        seen[id(item)] = row
    return list(drafter)
