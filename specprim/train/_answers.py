"""A target's answers to a batch of prompts of unequal lengths, computed without padding waste.

A plain batched ``generate`` spends much of a self-distillation batch on positions whose result is thrown away: it
prefills every prompt at the batch's widest (left padding was 37 % of the prefilled positions of the campaign's
three-turn ShareGPT batches) and keeps decoding rows that have finished until the longest answer ends (22 % of the
decoded rows). :func:`answer_prompts` prefills the prompts alone or in small groups of about one length, places
their keys and values right-aligned in one :func:`~specprim.hf.reserved_cache` (zeros where a shorter prompt leaves
room, masked out), decodes the rows together and drops finished rows from the batch (and from the cache) once they
make up an eighth of it. A batch whose prompts differ much in length decodes in groups of about one length
(:func:`decode_groups`): every decoding step reads each row's keys and values at the group's widest, so one wide
batch of short and long prompts pays the long prompts' width for every row.

Each row's tokens are those of decoding it alone up to floating-point rounding: greedy takes the arg-max of the
logits and sampling draws from ``softmax(logits / temperature)`` (no top-k, no top-p), the settings of
``generate(do_sample=True, temperature=t, top_k=0, top_p=1.0)``. Nothing else of the model's generation config
(a repetition penalty, say) applies: the answers come from the target's own distribution, the one speculative
decoding checks drafts against.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from specprim.hf import cache_kwarg, reserved_cache
from specprim.sampling import argmax, sample

__all__ = ["answer_prompts", "decode_groups", "pick_tokens", "prefill_groups"]

EVICT_SHARE = 8  # drop finished rows once they are at least 1/EVICT_SHARE of the batch
PREFILL_TOKENS = 1024  # positions a prefill group holds (one prompt of 500 alone ran faster than 16 together)
PREFILL_WASTE = 0.15  # at most this share of a prefill group's positions is padding
STEP_POSITIONS = 12_000  # a decoding step's fixed cost, in cache positions read (SmolLM2-135M, bf16, 2-core Xeon)


def pick_tokens(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B,) next tokens from (B, V) logits: the arg-max when ``temperature == 0``, else a draw from
    ``softmax(logits / temperature)`` (:func:`specprim.sampling.sample`: one uniform per row; ``torch.multinomial``
    spent 30 % of a 64-row temperature-1 batch's time drawing 49,152 exponentials per row)."""
    if temperature == 0:
        return argmax(logits)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (B, V)
    return sample(probs, None)


@torch.no_grad()
def answer_prompts(target: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
                   eos_token_ids: Collection[int], step_positions: int = STEP_POSITIONS) -> list[list[int]]:
    """The tokens ``target`` writes after each prompt (token ids, unpadded), up to and including an end token or
    ``max_new_tokens`` of them. The target's default cache must be one :func:`~specprim.hf.reserved_cache_fits`.
    The prompts decode in :func:`decode_groups` of ``step_positions``; a group's draws come after the previous
    group's, so a seed fixes the answers for given prompts and settings."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1 or temperature < 0:
        raise ValueError(f"max_new_tokens must be >= 1 and temperature >= 0, got {max_new_tokens} and {temperature}")
    answers: list[list[int]] = [[] for _ in prompts]
    stop = sorted(eos_token_ids)
    for group in decode_groups([len(p) for p in prompts], step_positions=step_positions):
        own = _answer_group(target, [prompts[b] for b in group], max_new_tokens, temperature, stop)
        for b, answer in zip(group, own, strict=True):
            answers[b] = answer
    return answers


def _answer_group(target: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float,
                  eos_token_ids: Sequence[int]) -> list[list[int]]:
    """:func:`answer_prompts` for prompts decoded together in one reserved cache."""
    device = target.get_input_embeddings().weight.device
    width = max(len(p) for p in prompts)
    cache = reserved_cache(width + max_new_tokens)
    _prefill(target, prompts, width, cache, device)
    lengths = torch.tensor([len(p) for p in prompts], device=device)  # (B,)
    mask = (torch.arange(width, device=device) >= width - lengths[:, None]).long()  # (B, width) left-padded
    positions = lengths - 1  # (B,) of each row's last prompt token
    last = torch.tensor([p[-1] for p in prompts], device=device)  # (B,)
    rows = torch.arange(len(prompts), device=device)  # (b,) the prompt index of each live row
    ended = torch.zeros(len(prompts), dtype=torch.bool, device=device)  # (b,)
    stop = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
    answers: list[list[int]] = [[] for _ in prompts]
    for step in range(max_new_tokens):
        logits = target(input_ids=last[:, None], attention_mask=mask, position_ids=positions[:, None],
                        use_cache=True, logits_to_keep=1, **{cache_kwarg(target): cache}).logits[:, -1]  # (b, V)
        last = pick_tokens(logits, temperature)  # (b,)
        for row, token, done in zip(rows.tolist(), last.tolist(), ended.tolist(), strict=True):
            if not done:
                answers[row].append(token)
        ended |= torch.isin(last, stop)
        if bool(ended.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)  # (b, width + step + 1)
        positions = positions + 1
        if int(ended.sum()) * EVICT_SHARE >= len(rows):
            keep = (~ended).nonzero().squeeze(-1)  # (b',)
            cache.batch_select_indices(keep)
            rows, mask, positions, last, ended = rows[keep], mask[keep], positions[keep], last[keep], ended[keep]
    return answers


def decode_groups(lengths: Sequence[int], *, step_positions: int = STEP_POSITIONS) -> list[list[int]]:
    """Indices of ``lengths`` (prompt lengths) in groups to decode together, shortest group first: the split of the
    lengths, in ascending order, into runs that minimises ``sum(step_positions + len(run) * max(run))``, a decoding
    step's cost summed over the groups when a step costs ``step_positions`` cache positions' reading plus one
    position per row and cached position at the group's widest (the rows' own work is the same in any split)."""
    if step_positions < 0:
        raise ValueError(f"step_positions must be >= 0, got {step_positions}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    # best[j]: the least cost of the first j lengths in order; cut[j]: where the last run of that split starts
    best, cut = [0] * (len(order) + 1), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        widest = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + step_positions + (j - i) * widest, i) for i in range(j))
    groups: list[list[int]] = []
    j = len(order)
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def _prefill(target: Any, prompts: Sequence[Sequence[int]], width: int, cache: Any, device: torch.device, *,
             group_tokens: int = PREFILL_TOKENS) -> None:
    """Fill ``cache`` (a :func:`~specprim.hf.reserved_cache`, written through its layers' views) with every prompt's
    keys and values but its last token's, right-aligned: prompt ``b``'s (H, n, D) states in positions
    ``[width - 1 - n, width - 1)`` of row ``b``, zeros before them. Prompts run in groups of about one length
    (:func:`prefill_groups`, at most ``group_tokens`` positions), left-padded within a group."""
    if width == 1:
        return  # nothing precedes the last tokens: the first decoding step fills the cache
    for group in prefill_groups([len(p) - 1 for p in prompts], tokens=group_tokens):
        lengths = [len(prompts[b]) - 1 for b in group]
        longest = max(lengths)
        ids = torch.tensor([[0] * (longest - n) + list(prompts[b][:-1]) for b, n in zip(group, lengths, strict=True)],
                           device=device)  # (g, longest) left-padded
        mask = (torch.arange(longest, device=device) >= longest - torch.tensor(lengths, device=device)[:, None]).long()
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # (g, longest)
        states = DynamicCache(config=target.config)
        target(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
               **{cache_kwarg(target): states})
        for layer, own in enumerate(states.layers):  # own.keys: (g, H, longest, D)
            if len(cache.layers) <= layer or cache.layers[layer].get_seq_length() == 0:  # room for all rows, zeroed
                heads = own.keys.shape[1]
                cache.update(own.keys.new_zeros(len(prompts), heads, width - 1, own.keys.shape[-1]),
                             own.values.new_zeros(len(prompts), heads, width - 1, own.values.shape[-1]), layer)
            keys, values = cache.layers[layer].keys, cache.layers[layer].values  # (B, H, width - 1, D) views
            for row, (b, n) in enumerate(zip(group, lengths, strict=True)):
                keys[b, :, width - 1 - n:] = own.keys[row, :, longest - n:]
                values[b, :, width - 1 - n:] = own.values[row, :, longest - n:]


def prefill_groups(lengths: Sequence[int], *, tokens: int = PREFILL_TOKENS, waste: float = PREFILL_WASTE
                   ) -> list[list[int]]:
    """Indices of the positive ``lengths`` in groups to prefill together: by length, each group at most ``tokens``
    positions once padded to its longest (a longer one alone) and at most a ``waste`` share of them padding."""
    groups: list[list[int]] = []
    used = 0  # real positions in the last group
    for i in sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: lengths[i]):
        padded = (len(groups[-1]) + 1) * lengths[i] if groups else 0  # ascending: lengths[i] is the longest
        if groups and padded <= tokens and padded - used - lengths[i] <= waste * padded:
            groups[-1].append(i)
            used += lengths[i]
        else:
            groups.append([i])
            used = lengths[i]
    return groups
