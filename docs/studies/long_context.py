"""Acceptance and greedy parity at long prompts on the real model: SmolLM2-135M-Instruct (fp32, context 8192) with
the shipped EAGLE-3 head (the ``eagle3`` preset; the eager verifier or a ``StaticTarget``), greedy.

Each prompt is whole ShareGPT V3 conversations rendered with the chat template, one after another, followed by the
first user turn of the next conversation, cut to its last ``length - max_new_tokens - 128`` tokens (room for the
budget and the largest draft tree; the conversations used by one prompt are not used by the next). For every length
it prints, per prompt, the prompt's tokens, whether the speculative output equals ``model.generate``, tau and the
acceptance by depth, then the length's mean tau; ``--json`` writes the same as JSON:

    nice python docs/studies/long_context.py [--lengths 2048 4096 8192] [--prompts 3] [--max-new-tokens 32] \\
        [--verifier eager|static]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specprim import presets
from specprim.hf import StaticTarget
from specprim.models import load
from specprim.train import sharegpt_conversations


def long_prompts(tokenizer, length: int, count: int, conversations: list, start: int) -> tuple[list, int]:
    """``count`` prompts of exactly ``length`` tokens built from ``conversations[start:]``; also the next start.

    Whole conversations are rendered one after another, then the first user turn of the next one with the generation
    prompt; once that is longer than ``length``, its last ``length`` tokens are the prompt (the question and the
    generation prompt at the end, the oldest text cut)."""
    prompts = []
    index = start
    while len(prompts) < count and index < len(conversations) - 1:
        messages: list = []
        while index < len(conversations) - 1:
            messages = messages + conversations[index]
            index += 1
            if conversations[index][0]["role"] != "user":
                continue
            ids = tokenizer.apply_chat_template(messages + conversations[index][:1], add_generation_prompt=True,
                                                return_dict=False)
            if len(ids) >= length:
                prompts.append(torch.tensor([ids[-length:]]))
                index += 1
                break
    return prompts, index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--verifier", choices=["eager", "static"], default="eager",
                        help="the model itself (HFTarget) or a StaticTarget (compile=False)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    target, tokenizer = load("smollm2-135m-instruct")
    method = presets.from_name("eagle3", target=target)
    conversations = sharegpt_conversations(2000)
    results = []
    start = 0
    for length in args.lengths:
        room = args.max_new_tokens + 128  # the budget and the largest draft tree (the target refuses more)
        prompts, start = long_prompts(tokenizer, length - room, args.prompts, conversations, start)
        taus = []
        for ids in prompts:
            began = time.perf_counter()
            with torch.no_grad():
                reference = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                            max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.eos_token_id)
            verifier = target if args.verifier == "eager" else StaticTarget(
                target, compile=False, min_cache_length=length + 64)
            out = method.generate(verifier, ids, max_new_tokens=args.max_new_tokens)
            same = torch.equal(out.sequences, reference)
            row = {"verifier": args.verifier, "length": length, "prompt_tokens": ids.shape[1], "parity": bool(same),
                   "tau": out.stats.tau,
                   "steps": out.stats.steps, "new_tokens": out.stats.new_tokens,
                   "acceptance_by_depth": out.stats.acceptance_by_depth, "seconds": time.perf_counter() - began}
            results.append(row)
            taus.append(row["tau"])
            print(json.dumps(row), flush=True)
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump({"args": vars(args), "rows": results}, f, indent=1)
        if taus:
            print(f"length <= {length}: {len(taus)} prompts, mean tau {sum(taus) / len(taus):.3f}", flush=True)


if __name__ == "__main__":
    main()
