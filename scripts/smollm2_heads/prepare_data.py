"""Training conversations of the shipped SmolLM2-135M-Instruct heads (see specprim/models/heads/*/README.md).

Writes ``combined.jsonl`` in the current directory: ``--distilled`` conversations of a length-sorted list of
ShareGPT first turns, from position ``--start`` on, answered by the target itself (greedy, at most 256 new tokens),
followed by the original ShareGPT conversations ``[200, 200 + --original)``. Conversations ``[0, 200)`` are never used.
Resumable: rerun the same command after an interruption.
"""

import argparse
import json
import os

import torch

from specprim.models import load
from specprim.train import self_distill, sharegpt_conversations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--distilled", type=int, default=64)
    parser.add_argument("--start", type=int, default=0,
                        help="first position in the length-sorted list of first turns (later rounds take new ones)")
    parser.add_argument("--original", type=int, default=1500)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the target's dtype while it answers (bfloat16 runs packed, faster on AMX CPUs)")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(2)
    conversations = sharegpt_conversations()
    if not os.path.exists("distill_order.jsonl"):
        firsts = [c[: (2 if c[0]["role"] != "system" else 3)] for c in conversations[200:]]
        firsts = [c for c in firsts if len(c[-2]["content"]) < 1500][:6000]
        ordered = []  # sorted by prompt length inside blocks of 256: little padding, mixed topics
        for start in range(0, len(firsts), 256):
            ordered += sorted(firsts[start:start + 256], key=lambda c: len(c[-2]["content"]))
        with open("distill_order.jsonl", "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in ordered)
    available = [json.loads(line) for line in open("distill_order.jsonl")]
    if not (args.start >= 0 and args.start + args.distilled <= len(available)):
        parser.error(f"--start {args.start} --distilled {args.distilled} is outside the {len(available)} first turns "
                     "of distill_order.jsonl")
    ordered = available[args.start: args.start + args.distilled]
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load("smollm2-135m-instruct", dtype=dtype, pack=dtype == torch.bfloat16)
    self_distill(target, tokenizer, ordered, "distilled.jsonl", max_new_tokens=256, max_prompt_tokens=384,
                 batch_size=args.batch_size)
    distilled = [json.loads(line) for line in open("distilled.jsonl")][: args.distilled]
    with open("combined.jsonl", "w") as f:
        for conversation in distilled + conversations[200:200 + args.original]:
            f.write(json.dumps(conversation, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
