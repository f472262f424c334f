"""Self-distillation speed of a campaign's target on the first conversations of one of its shards.

    python benchmarks/results/campaign-2026-12-06/distill_speed.py campaigns/smollm2-eagle3 --shard 2 \
        --conversations 128 --order length --cache reserved

``--order shard`` answers the conversations in the shard's own order, ``length`` in the campaign's order (by number
of user turns, then shortest prompt first); ``--start P`` takes the conversations at positions P, P+1, ... of the
campaign's order of the whole shard instead of the shard's first ones (a block of batches as the campaign runs
them). ``--cache default`` makes ``generate`` use the model's default cache, ``reserved`` the in-place one the
campaign uses. Prints the answer tokens per second over all batches (prompts
re-read at every turn included, as the campaign does). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specprim import models
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--shard", type=int, default=2, help="training shard index (default 2)")
    parser.add_argument("--conversations", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the campaign's")
    parser.add_argument("--order", choices=("shard", "length"), default="length")
    parser.add_argument("--cache", choices=("default", "reserved"), default="reserved")
    parser.add_argument("--start", type=int, default=None,
                        help="take the conversations from this position of the campaign's order of the whole shard")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    campaign = load_campaign(args.run_dir)
    data = campaign.data
    _, shards = plan_shards(_read_json(Path(args.run_dir) / "order.json"), data)
    shard = shards[args.shard]
    source = load_conversations(data.source)
    if args.start is not None:
        whole = [trim_conversation(source[i], data) for i in shard.items]
        todo = [whole[i] for i in distill_order(whole)][args.start: args.start + args.conversations]
    else:
        todo = [trim_conversation(source[i], data) for i in shard.items[: args.conversations]]
        if args.order == "length":
            todo = [todo[i] for i in distill_order(todo)]
    if args.cache == "default":
        _distill.reserved_cache_fits = lambda model: False
    dtype = resolved_dtype(campaign.distill_dtype)  # as the campaign runs here
    model, tokenizer = models.load(campaign.target, dtype=getattr(torch, dtype),
                                   pack=dtype == "bfloat16" and models.packing_supported())
    size = args.batch_size or data.batch_size
    tokens, started = 0, time.perf_counter()
    for start in range(0, len(todo), size):
        torch.manual_seed(shard.seed + start // size)
        answered = _distill._rewrite(model, tokenizer, todo[start:start + size], data.max_new_tokens,
                                     data.max_prompt_tokens, shard.temperature, data.max_turns)
        tokens += sum(len(tokenizer(m["content"], add_special_tokens=False).input_ids)
                      for c in answered for m in c if m["role"] == "assistant")
    seconds = time.perf_counter() - started
    which = f"positions {args.start}+ of the campaign order" if args.start is not None else f"order {args.order}"
    print(f"shard {shard.name} (temperature {shard.temperature:g}), {len(todo)} conversations, {dtype}, batch {size}, "
          f"{which}, cache {args.cache}: {tokens:,} answer tokens in {seconds:.0f} s, {tokens / seconds:.0f} tok/s")


if __name__ == "__main__":
    main()
