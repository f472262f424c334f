"""Prefill speed of ``specprim.train._answers._prefill`` with prompts alone against groups of about one length.

    python benchmarks/results/distill-2026-12-07/prefill.py campaigns/smollm2-eagle3 --shard 2 --start 1216

Takes the 64 conversations the campaign already wrote at positions ``START, ...`` of the shard's file, cuts them
before their first and their second answer, and times the prefill of each turn's prompts (cut to the campaign's
``max_prompt_tokens``) at group budgets of 0 (every prompt alone), 1,024 and 2,048 positions, twice in turn.
Quiet machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specprim import models
from specprim.hf import reserved_cache
from specprim.train import _answers
from specprim.train._campaign import _read_json, load_campaign, plan_shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--shard", type=int, default=2)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    campaign = load_campaign(args.run_dir)
    _, shards = plan_shards(_read_json(Path(args.run_dir) / "order.json"), campaign.data)
    directory = Path(args.run_dir) / "shards" / shards[args.shard].name
    path = directory / "distilled.jsonl"
    path = path if path.is_file() else directory / ".distilled.jsonl.partial"
    conversations = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    conversations = conversations[args.start:args.start + 64]
    model, tokenizer = models.load(campaign.target, dtype=torch.float32)
    for turn in (1, 2):
        prompts = []
        for conversation in conversations:
            answers = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
            if turn <= len(answers):
                text = tokenizer.apply_chat_template(conversation[:answers[turn - 1]], tokenize=False,
                                                     add_generation_prompt=True)
                prompts.append(tokenizer(text, add_special_tokens=False).input_ids[-campaign.data.max_prompt_tokens:])
        width, total = max(map(len, prompts)), sum(map(len, prompts))
        with torch.no_grad():
            model(input_ids=torch.tensor([prompts[0]]), logits_to_keep=1)  # warm-up
            for budget in (0, 1024, 2048, 0, 1024, 2048):  # twice, alternating: one run's time varies
                groups = _answers.prefill_groups([len(p) - 1 for p in prompts], tokens=budget)
                started = time.perf_counter()
                _answers._prefill(model, prompts, width, reserved_cache(width + 1), torch.device("cpu"),
                                  group_tokens=budget)
                seconds = time.perf_counter() - started
                print(f"turn {turn}: {total:,} prompt tokens, width {width}, budget {budget}: {len(groups)} groups, "
                      f"{seconds:.1f} s, {total / seconds:.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
