"""Self-distillation: the target rewrites the assistant turns of training conversations (Medusa-2, EAGLE).

A draft head must predict what the *target* writes, not what the dataset's original assistant wrote; regenerating
the answers with the target closes that gap. Output is a JSONL file of conversations, written batch by batch so
an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from specprim._types import token_id_list
from specprim.hf import reserved_cache_fits
from specprim.train._answers import answer_prompts
from specprim.train._data import Conversation
from specprim.train._progress import progress_bar

__all__ = ["self_distill"]


def self_distill(
    target: Any,
    tokenizer: Any,
    conversations: Sequence[Conversation],
    path: str | os.PathLike[str],
    *,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 512,
    batch_size: int = 16,
    temperature: float = 0.0,
    max_turns: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> int:
    """Regenerate the first ``max_turns`` assistant turns of every conversation with ``target``; append to ``path``.

    Line ``i`` of ``path`` is conversation ``i`` with its user turns (and system message) kept and its assistant
    turns replaced by the target's answers (greedy when ``temperature == 0``, else sampled at ``temperature``, from
    the target's own logits; a target with sliding-window or other not-full-attention layers answers through
    ``generate``, which also applies its generation config's settings, a repetition penalty say);
    later turns are dropped. Lines already in ``path`` are kept and their conversations skipped (resume), so the
    same call after an interruption completes the file. Prompts longer than ``max_prompt_tokens`` keep their last
    tokens. Batch ``b`` samples with seed ``seed + b``, so a resumed run equals an uninterrupted one.

    Returns the number of conversations in ``path`` afterwards.
    """
    if batch_size < 1 or max_new_tokens < 1 or max_turns < 1:
        raise ValueError("batch_size, max_new_tokens and max_turns must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    done = _count_lines(path)
    todo = range(done - done % batch_size, len(conversations), batch_size)
    bar = progress_bar(len(conversations), done, progress, "self-distill", unit="conv")
    with open(path, "a", encoding="utf-8") as out:
        for start in todo:
            batch = conversations[start:start + batch_size]
            torch.manual_seed(seed + start // batch_size)
            rewritten = _rewrite(target, tokenizer, batch, max_new_tokens, max_prompt_tokens, temperature, max_turns)
            for conversation in rewritten[done - start if done > start else 0:]:
                out.write(json.dumps(conversation, ensure_ascii=False) + "\n")
            out.flush()
            done = start + len(batch)
            if bar is not None:
                bar.update(done - bar.n)
    if bar is not None:
        bar.close()
    return _count_lines(path)


def _rewrite(target: Any, tokenizer: Any, batch: Sequence[Conversation], max_new_tokens: int,
             max_prompt_tokens: int, temperature: float, max_turns: int) -> list[Conversation]:
    """The conversations of ``batch`` with their first ``max_turns`` assistant turns written by ``target``."""
    rewritten: list[Conversation] = [[] for _ in batch]
    for turn in range(max_turns):
        active = []
        for i, conversation in enumerate(batch):
            users = [m for m in conversation if m["role"] == "user"]
            if turn < len(users):
                if turn == 0 and conversation[0]["role"] == "system":
                    rewritten[i].append(conversation[0])
                rewritten[i].append(users[turn])
                active.append(i)
        if not active:
            break
        answers = _generate(target, tokenizer, [rewritten[i] for i in active], max_new_tokens, max_prompt_tokens,
                            temperature)
        for i, answer in zip(active, answers, strict=True):
            rewritten[i].append({"role": "assistant", "content": answer})
    return rewritten


@torch.no_grad()
def _generate(target: Any, tokenizer: Any, prompts: Sequence[Conversation], max_new_tokens: int,
              max_prompt_tokens: int, temperature: float) -> list[str]:
    """The answer text to each prompt conversation: :func:`~specprim.train._answers.answer_prompts` (no padding
    waste) where the target's cache allows, else one left-padded batched ``generate`` call."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    rows = [tokenizer(t, add_special_tokens=False).input_ids[-max_prompt_tokens:] for t in texts]
    if reserved_cache_fits(target):
        answers = answer_prompts(target, rows, max_new_tokens=max_new_tokens, temperature=temperature,
                                 eos_token_ids=_eos_ids(target, tokenizer))
        return [tokenizer.decode(answer, skip_special_tokens=True).strip() for answer in answers]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (B, T) left-padded
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # (B, T)
    device = target.get_input_embeddings().weight.device
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(
        do_sample=False)
    out = target.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                          max_new_tokens=max_new_tokens, pad_token_id=pad, **sampling)
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in out[:, width:].cpu()]


def _eos_ids(target: Any, tokenizer: Any) -> set[int]:
    """The tokens that end an answer: the generation config's end tokens, else the tokenizer's."""
    configured = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = tokenizer.eos_token_id
    ids = set(token_id_list(configured))
    if not ids:
        raise ValueError("the target and its tokenizer name no end-of-sequence token")
    return ids


def _count_lines(path: str | os.PathLike[str]) -> int:
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())
