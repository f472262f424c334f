"""Acceptance and greedy parity at long prompts on the real model: SmolLM2-135M-Instruct (fp32, context 8192) with
the shipped EAGLE-3 head (the ``eagle3`` preset, eager verifier), greedy.

Each prompt is whole ShareGPT V3 conversations rendered with the chat template, one after another, followed by the
first user turn of the next conversation, kept as long as possible under ``length - max_new_tokens`` tokens
(the conversations used by one prompt are not used by the next). For every length it prints, per prompt, the
prompt's tokens, whether the speculative output equals ``model.generate``, tau and the acceptance by depth, then
the length's mean tau; ``--json`` writes the same as JSON:

    nice python benchmarks/long_context.py [--lengths 2048 4096 8192] [--prompts 3] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specprim import presets
from specprim.models import load
from specprim.train._data import sharegpt_conversations


def long_prompts(tokenizer, length: int, count: int, conversations: list, start: int) -> tuple[list, int]:
    """``count`` prompts of at most ``length`` tokens built from ``conversations[start:]``; also the next start."""
    prompts = []
    index = start
    while len(prompts) < count and index < len(conversations) - 1:
        messages: list = []
        best = None
        while index < len(conversations) - 1:
            question = conversations[index + 1][:1] if conversations[index + 1][0]["role"] == "user" else None
            candidate = messages + conversations[index]
            ids = tokenizer.apply_chat_template(candidate + (question or []), add_generation_prompt=True,
                                                return_dict=False)
            if len(ids) > length:
                index += 1
                break
            messages = candidate
            if question:
                best = ids
            index += 1
        if best is not None and len(best) > length // 2:
            prompts.append(torch.tensor([best]))
    return prompts, index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    target, tokenizer = load("smollm2-135m-instruct")
    method = presets.from_name("eagle3", target=target)
    conversations = sharegpt_conversations(2000)
    results = []
    start = 0
    for length in args.lengths:
        prompts, start = long_prompts(tokenizer, length - args.max_new_tokens, args.prompts, conversations, start)
        taus = []
        for ids in prompts:
            began = time.perf_counter()
            with torch.no_grad():
                reference = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                            max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.eos_token_id)
            out = method.generate(target, ids, max_new_tokens=args.max_new_tokens)
            same = torch.equal(out.sequences, reference)
            row = {"length": length, "prompt_tokens": ids.shape[1], "parity": bool(same), "tau": out.stats.tau,
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
