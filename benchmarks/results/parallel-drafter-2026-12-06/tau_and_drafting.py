"""tau, drafting ms per step and tokens/s of the parallel head against the shipped EAGLE-3 head on the first N
MT-bench first turns (SmolLM2-135M-Instruct bf16, eager verification, no warm-up beyond one short generation),
with plain ``generate`` as the baseline (``--plain``); tokens/s compare only on a quiet machine:

    python benchmarks/results/parallel-drafter-2026-12-06/tau_and_drafting.py HEAD_DIR [--temperature 0]
        [--num-prompts 10] [--max-new-tokens 64] [--threads 2] [--plain] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specprim import presets
from specprim.bench import conversation_ids, load_dataset
from specprim.models import load, load_head
from specprim.trees import Chain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("head")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plain", action="store_true", help="also time plain model.generate (the baseline)")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load("smollm2-135m-instruct", dtype=torch.bfloat16)
    eagle, parallel = load_head("smollm2-135m-instruct-eagle3", target), load_head(args.head, target)
    k = parallel.num_draft
    methods = {"eagle3 default tree": presets.eagle3(eagle), f"eagle3 chain:{k}": presets.eagle3(eagle, Chain(k)),
               f"parallel chain:{k}": presets.parallel(parallel)}
    prompts = [conversation_ids(tokenizer, p.turns[:1], []) for p in load_dataset("mt-bench", args.num_prompts)]
    options = {"max_new_tokens": args.max_new_tokens, "eos_token_id": tokenizer.eos_token_id}
    if args.temperature > 0:
        options["temperature"] = args.temperature
    for method in methods.values():  # warm-up
        method.generate(target, prompts[0][:, :16], max_new_tokens=8)
    rows = {}
    if args.plain:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_k": 0} if args.temperature > 0 else {}
        emitted, wall = 0, 0.0
        for i, ids in enumerate(prompts):
            torch.manual_seed(i)
            start = time.perf_counter()
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                  eos_token_id=tokenizer.eos_token_id, **sampling)
            wall += time.perf_counter() - start
            emitted += seq.shape[1] - ids.shape[1]
        rows["plain generate"] = {"tokens_per_s": emitted / wall, "tokens": emitted}
        print("plain generate", json.dumps(rows["plain generate"]), flush=True)
    for name, method in methods.items():
        accepted = steps = emitted = 0
        draft_s = wall = 0.0
        for i, ids in enumerate(prompts):
            generator = torch.Generator().manual_seed(i)
            start = time.perf_counter()
            out = method.generate(target, ids, generator=generator, **options)
            wall += time.perf_counter() - start
            stats = out.stats
            accepted, steps, emitted = accepted + sum(stats.accepted), steps + stats.steps, emitted + sum(stats.emitted)
            draft_s += stats.draft_s
        rows[name] = {"tau": (accepted + steps) / steps, "draft_ms_per_step": 1e3 * draft_s / steps,
                      "tokens_per_s": emitted / wall, "steps": steps, "tokens": emitted}
        print(name, json.dumps(rows[name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"temperature": args.temperature, "num_prompts": args.num_prompts,
                       "max_new_tokens": args.max_new_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
