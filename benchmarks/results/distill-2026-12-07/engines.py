"""Self-distillation with one batched ``generate`` call a turn against :func:`specprim.train._answers.answer_prompts`,
side by side on the same conversations of a campaign's shard.

    python benchmarks/results/distill-2026-12-07/engines.py campaigns/smollm2-eagle3 --shard 2 --start 1280 \
        --conversations 64

Both answer every user turn of the conversations at positions ``START, START+1, ...`` of the campaign's order of the
shard (as the campaign batches them), in the campaign's dtype and batch size. ``generate`` is the previous engine:
prompts left-padded to the batch's widest, an in-place cache (``specprim.hf.reserved_cache``), every row decoded
until the longest answer ends. Prints each engine's answer tokens per second (prompts re-read at every turn
included), the ratio, and how many answers the two engines wrote alike. Run it on a quiet machine.

``--recorded-turn K`` answers one turn instead: the prompts are the conversations the campaign already wrote at
positions ``START, ...`` of the shard's file (``distilled.jsonl`` or the partial one) cut before their K-th answer
(K from 1), one batch of each engine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specprim import models
from specprim.hf import cache_kwarg, reserved_cache
from specprim.train import _distill
from specprim.train._campaign import (
    _read_json,
    distill_order,
    load_campaign,
    plan_shards,
    resolved_dtype,
    trim_conversation,
)
from specprim.train._data import load_conversations


@torch.no_grad()
def padded_generate(target, tokenizer, prompts, max_new_tokens, max_prompt_tokens, temperature):
    """The previous engine: one left-padded batched ``generate`` call with an in-place cache."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    rows = [tokenizer(t, add_special_tokens=False).input_ids[-max_prompt_tokens:] for t in texts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (B, T)
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # (B, T)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(
        do_sample=False)
    out = target.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                          pad_token_id=pad, **sampling, **{cache_kwarg(target): reserved_cache(width + max_new_tokens)})
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in out[:, width:]]


def run(engine, model, tokenizer, todo, data, shard, size):
    answers, started = [], time.perf_counter()
    for start in range(0, len(todo), size):
        torch.manual_seed(shard.seed + start // size)
        answers += _distill._rewrite(model, tokenizer, todo[start:start + size], data.max_new_tokens,
                                     data.max_prompt_tokens, shard.temperature, data.max_turns)
    seconds = time.perf_counter() - started
    texts = [m["content"] for c in answers for m in c if m["role"] == "assistant"]
    tokens = sum(len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts)
    print(f"{engine}: {tokens:,} answer tokens in {seconds:.0f} s, {tokens / seconds:.1f} tok/s", flush=True)
    return texts, tokens / seconds


def recorded_turn(run_dir, shard, start, count, turn, model, tokenizer, data):
    """Both engines on the prompts of one turn of conversations the campaign already answered."""
    directory = Path(run_dir) / "shards" / shard.name
    path = directory / "distilled.jsonl"
    path = path if path.is_file() else directory / ".distilled.jsonl.partial"
    lines = path.read_text(encoding="utf-8").splitlines()[start:start + count]
    prompts = []
    for conversation in map(json.loads, lines):
        answers = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        if turn <= len(answers):
            prompts.append(conversation[:answers[turn - 1]])
    rates, texts = {}, {}
    for engine, generate in (("answer_prompts", _distill._generate), ("padded generate", padded_generate)):
        started = time.perf_counter()
        texts[engine] = generate(model, tokenizer, prompts, data.max_new_tokens, data.max_prompt_tokens,
                                 shard.temperature)
        seconds = time.perf_counter() - started
        tokens = sum(len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts[engine])
        rates[engine] = tokens / seconds
        print(f"{engine}: turn {turn} of {len(prompts)} conversations, {tokens:,} answer tokens in {seconds:.0f} s, "
              f"{rates[engine]:.1f} tok/s", flush=True)
    alike = sum(a == b for a, b in zip(*texts.values(), strict=True))
    print(f"answer_prompts / padded generate: {rates['answer_prompts'] / rates['padded generate']:.2f}x; answers "
          f"alike: {alike}/{len(prompts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--shard", type=int, default=2, help="training shard index (default 2)")
    parser.add_argument("--start", type=int, default=0, help="first position in the campaign's order of the shard")
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--recorded-turn", type=int, default=None, help="answer this turn (from 1) only")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    campaign = load_campaign(args.run_dir)
    data = campaign.data
    _, shards = plan_shards(_read_json(Path(args.run_dir) / "order.json"), data)
    shard = shards[args.shard]
    source = load_conversations(data.source)
    whole = [trim_conversation(source[i], data) for i in shard.items]
    todo = [whole[i] for i in distill_order(whole)][args.start: args.start + args.conversations]
    dtype = resolved_dtype(campaign.distill_dtype)
    model, tokenizer = models.load(campaign.target, dtype=getattr(torch, dtype),
                                   pack=dtype == "bfloat16" and models.packing_supported())
    if args.recorded_turn is not None:
        recorded_turn(args.run_dir, shard, args.start, args.conversations, args.recorded_turn, model, tokenizer, data)
        return
    print(f"shard {shard.name} (temperature {shard.temperature:g}), positions {args.start}-"
          f"{args.start + len(todo) - 1}, {dtype}, batch {data.batch_size}, {args.threads} threads", flush=True)
    new, new_rate = run("answer_prompts", model, tokenizer, todo, data, shard, data.batch_size)
    real = _distill._generate
    _distill._generate = padded_generate
    try:
        old, old_rate = run("padded generate", model, tokenizer, todo, data, shard, data.batch_size)
    finally:
        _distill._generate = real
    print(f"answer_prompts / padded generate: {new_rate / old_rate:.2f}x; answers alike: "
          f"{sum(a == b for a, b in zip(new, old, strict=True))}/{len(new)}")


if __name__ == "__main__":
    main()
