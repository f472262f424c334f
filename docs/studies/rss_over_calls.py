"""Resident memory over consecutive generations on the real model: SmolLM2-135M-Instruct with the shipped EAGLE-3
head (the ``eagle3`` preset), greedy, ``--calls`` calls of ``Method.generate`` over four rotating chat prompts.
Prints the process's RSS after ``--warmup`` calls and every ``--every`` calls after, the growth from the
warm-up to the end (the leak check of ``tests/test_rss_leak.py``, on the real model). The drafter's memory
overhead is what ``specprim bench --json`` records (``drafter_param_bytes``, ``drafter_state_bytes``):

    python docs/studies/rss_over_calls.py [--calls 200] [--warmup 20] [--max-new-tokens 4] [--threads 1]
"""

from __future__ import annotations

import argparse
import gc
import time

import psutil
import torch

from specprim import presets
from specprim.hf import chat_input_ids
from specprim.models import load

PROMPTS = (
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers and say why each is prime.",
    "Translate 'good morning, how are you?' into French and Spanish.",
)


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, tokenizer = load("smollm2-135m-instruct")
    method = presets.from_name("eagle3", target=target)
    inputs = [chat_input_ids(tokenizer, prompt) for prompt in PROMPTS]
    print(f"after loading: RSS {rss_mib():.1f} MiB")
    start = time.perf_counter()
    for call in range(args.warmup + args.calls):
        method.generate(target, inputs[call % len(inputs)], max_new_tokens=args.max_new_tokens,
                        eos_token_id=None, generator=torch.Generator().manual_seed(call))
        done = call + 1
        if done == args.warmup:
            base = rss_mib()
            print(f"after {done} warm-up calls: RSS {base:.1f} MiB ({time.perf_counter() - start:.0f} s)", flush=True)
        elif done > args.warmup and (done - args.warmup) % args.every == 0:
            print(f"after {done - args.warmup} more calls: RSS {rss_mib():.1f} MiB "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    end = rss_mib()
    print(f"growth over {args.calls} calls after the warm-up: {end - base:+.1f} MiB "
          f"({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    main()
