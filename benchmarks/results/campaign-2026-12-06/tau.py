"""tau (tokens per target forward, the bonus token included) of EAGLE-3 heads for a target (default
SmolLM2-135M-Instruct) at several tree sizes, greedy and at temperature 1, on the first turns of a benchmark dataset
(eager; the target in bf16 where the machine computes it natively, else fp32, or --dtype). Only acceptance is
measured, so it may run beside other jobs:

    python benchmarks/results/campaign-2026-12-06/tau.py HEAD [HEAD ...] [--target smollm2-135m-instruct]
        [--dataset mt-bench] [--num-prompts 30] [--max-new-tokens 64] [--threads 1] [--dtype D] [--json OUT]

HEAD: a head directory or a shipped head's name. Trees (verified nodes beside the root): greedy chain:1 (1),
dynamic:depth=3,top_k=3,budget=3 (3), dynamic:depth=5,top_k=4,budget=8 (8), dynamic:depth=6,top_k=8,budget=32 (32);
temperature 1: sampled:2,1,1,1 (8), sampled:4,2,1,1 (28). ``--only 0:8,1:8`` keeps the shapes of those
temperature:nodes pairs. Each row has tau's standard error over prompts and, for every head after the first, the
paired difference from the first head's tau on the same prompts with its standard error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specprim import presets
from specprim._tau_error import tau_difference, tau_estimate
from specprim.bench import conversation_ids, load_dataset, read_prompts
from specprim.models import load, load_head, native_dtype
from specprim.train._campaign_tau import prompt_counts
from specprim.trees import parse_tree

SHAPES = [  # (temperature, nodes, tree)
    (0.0, 1, "chain:1"), (0.0, 3, "dynamic:depth=3,top_k=3,budget=3"), (0.0, 8, "dynamic:depth=5,top_k=4,budget=8"),
    (0.0, 32, "dynamic:depth=6,top_k=8,budget=32"), (1.0, 8, "sampled:2,1,1,1"), (1.0, 28, "sampled:4,2,1,1"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("heads", nargs="+")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dataset", default="mt-bench", help="a built-in dataset or a JSONL prompts file")
    parser.add_argument("--num-prompts", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=native_dtype())
    parser.add_argument("--json")
    parser.add_argument("--only", help="temperature:nodes pairs to measure, e.g. 0:8,0:32,1:8 (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load(args.target, dtype=getattr(torch, args.dtype))
    chosen = read_prompts(args.dataset)[: args.num_prompts] if Path(args.dataset).is_file() else \
        load_dataset(args.dataset, args.num_prompts)
    prompts = [conversation_ids(tokenizer, p.turns[:1], []) for p in chosen]
    only = None if args.only is None else {(float(t), int(n)) for t, n in
                                           (pair.split(":") for pair in args.only.split(","))}
    shapes = [shape for shape in SHAPES if only is None or (shape[0], shape[1]) in only]
    options = {"max_new_tokens": args.max_new_tokens, "eos_token_id": tokenizer.eos_token_id}
    rows, counts = [], {}
    for name in args.heads:
        head = load_head(name, target)
        for temperature, nodes, spec in shapes:
            measured = counts[name, spec] = prompt_counts(presets.eagle3(head, parse_tree(spec)), target, prompts,
                                                          temperature, options)
            estimate = tau_estimate(measured)
            row = {"head": name, "temperature": temperature, "nodes": nodes, "tree": spec, "tau": estimate.tau,
                   "stderr": estimate.stderr, "steps": sum(measured.steps)}
            if name != args.heads[0]:  # paired over the same prompts: the prompts' shared difficulty cancels
                difference = tau_difference(counts[args.heads[0], spec], measured)
                row.update(minus_first=difference.tau, minus_first_stderr=difference.stderr)
            rows.append({**row, "prompt_accepted": list(measured.accepted), "prompt_steps": list(measured.steps)})
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "dataset": args.dataset, "num_prompts": args.num_prompts,
                       "max_new_tokens": args.max_new_tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
