"""Self-distillation answers of one batch of real campaign prompts, decoded in one group or in length groups.

    python benchmarks/results/decode-groups-2026-12-07/speed.py campaigns/smollm2-eagle3-fresh --shard 3 --turn 2 \\
        --runs 256:inf 64:inf 256:12000 256:3000 --rounds 2

Each run ``BATCH:STEP_POSITIONS`` answers the same prompts (the conversations at positions ``--start .. --start +
--prompts`` of the shard's self-distilled file, cut before their ``--turn``-th answer, the last 512 tokens as the
campaign keeps them) in batches of BATCH through :func:`specprim.train._answers.answer_prompts` with that
``step_positions`` (``inf``: one group per batch, as before length groups), at the shard's temperature, seeded per
batch. Runs alternate for ``--rounds`` rounds, so a slow spell of the machine falls on all of them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specprim import models
from specprim.train import _answers
from specprim.train._campaign import load_campaign


def _prompts(run_dir: str, shard: int, start: int, count: int, turn: int, tokenizer) -> tuple[list[list[int]], float]:
    directory = Path(run_dir) / "shards" / f"{shard:05d}"
    path = directory / "distilled.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
    temperature = json.loads((directory / "distilled.json").read_text())["temperature"]
    prompts = []
    for conversation in lines[start:start + count]:
        answers = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        if len(answers) >= turn:
            text = tokenizer.apply_chat_template(conversation[:answers[turn - 1]], tokenize=False,
                                                 add_generation_prompt=True)
            prompts.append(tokenizer(text, add_special_tokens=False).input_ids[-512:])
    return prompts, temperature


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--shard", type=int, default=3)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--turn", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", nargs="+", default=["64:inf", "256:12000"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    campaign = load_campaign(args.run_dir)
    model, tokenizer = models.load(campaign.target, dtype=torch.bfloat16, pack=models.packing_supported())
    prompts, temperature = _prompts(args.run_dir, args.shard, args.start, args.prompts, args.turn, tokenizer)
    lengths = sorted(map(len, prompts))
    print(f"{len(prompts)} prompts at turn {args.turn}: {sum(lengths) / len(lengths):.0f} tokens on average, "
          f"{lengths[0]} to {lengths[-1]}; {args.new_tokens} new tokens at most, temperature {temperature:g}",
          flush=True)
    ends = {tokenizer.eos_token_id}
    rates: dict[str, list[float]] = {run: [] for run in args.runs}
    for _ in range(args.rounds):
        for run in args.runs:
            batch_size, positions = run.split(":")
            step_positions = 10**12 if positions == "inf" else int(positions)
            started, tokens = time.perf_counter(), 0
            for start in range(0, len(prompts), int(batch_size)):
                torch.manual_seed(start)
                batch = prompts[start:start + int(batch_size)]
                groups = _answers.decode_groups(list(map(len, batch)), step_positions=step_positions)
                answers = _answers.answer_prompts(model, batch, max_new_tokens=args.new_tokens,
                                                  temperature=temperature, eos_token_ids=ends,
                                                  step_positions=step_positions)
                tokens += sum(len(a) for a in answers)
            seconds = time.perf_counter() - started
            rates[run].append(tokens / seconds)
            print(f"batch {batch_size} step_positions {positions}: {tokens} tokens in {seconds:.1f} s = "
                  f"{tokens / seconds:.0f} tok/s (last batch's groups: {[len(g) for g in groups]})", flush=True)
    for run, values in rates.items():
        print(f"{run}: " + " ".join(f"{v:.0f}" for v in values) + " tok/s")


if __name__ == "__main__":
    main()
