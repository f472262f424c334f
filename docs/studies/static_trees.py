"""Which tree shapes pay when verification is static and compiled (``specprim.hf.StaticTarget``).

A padded size costs the same whatever fills it (2, 4, 8, 16, ... tokens; see ``docs/studies/forward_costs.py
--kernels static``), so trees are compared by what they accept within those sizes: eagle3 with 3 / 7 / 15 nodes
(padded to 4 / 8 / 16 tokens), with 7 siblings of the root (padded to 8), with 3 or 7 siblings (and 3
with one child each) drawn without replacement from the head's distribution ("sampled": top-k under greedy
decoding, SpecInfer-style draws at temperature > 0) and unions with a prompt-lookup match of 4 or 8 tokens, side by
side with packed and stock ``model.generate`` in one interleaved run (MT-bench first turns, 10 questions, 128
tokens, bf16, packed):

    python docs/studies/static_trees.py [--temperature 1] [--methods '3 nodes,3 sampled'] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys

import torch

from specprim import bench, models, presets

HEAD = "smollm2-135m-instruct-eagle3"
TREES = {"3 nodes": "dynamic:depth=1,top_k=3,budget=3", "7 nodes": "dynamic:depth=2,top_k=3,budget=7",
         "15 nodes": "dynamic:depth=3,top_k=4,budget=15", "7 siblings": "dynamic:depth=1,top_k=7,budget=7",
         "3 sampled": "sampled:3", "7 sampled": "sampled:7", "3x1 sampled": "sampled:3,1"}
UNIONS = {"3 nodes + lookup 4": ("3 nodes", 4), "7 nodes + lookup 8": ("7 nodes", 8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--methods", help="comma-separated labels to run (default: every tree and union), e.g. "
                        "'3 nodes,7 siblings,3 nodes + lookup 4'")
    parser.add_argument("--json")
    args = parser.parse_args()
    chosen = set(TREES) | set(UNIONS) if args.methods is None else set(args.methods.split(","))
    if chosen - set(TREES) - set(UNIONS):
        parser.error(f"unknown labels {sorted(chosen - set(TREES) - set(UNIONS))}; known: {[*TREES, *UNIONS]}")
    torch.set_num_threads(2)
    model, tokenizer = models.load("smollm2-135m-instruct", dtype=torch.bfloat16, pack=True)

    def eagle3(tree: str) -> presets.Method:
        return presets.from_name("eagle3", target=model, head=HEAD, tree=tree)

    def lookup(tokens: int) -> presets.Method:
        return presets.prompt_lookup(num_tokens=tokens, max_matches=1)

    custom = {f"eagle3, {label}": eagle3(tree) for label, tree in TREES.items() if label in chosen}
    for label, (tree, tokens) in UNIONS.items():
        if label in chosen:
            custom[f"eagle3, {label}"] = presets.union(eagle3(TREES[tree]), lookup(tokens))
    results = bench.run(target=model, tokenizer=tokenizer, methods=["hf-unpacked"], custom=custom,
                        dataset="mt-bench", num_prompts=args.num_prompts, turns=1, max_new_tokens=128,
                        temperature=args.temperature, static_verify=True, warmup_tokens=128, json_path=args.json,
                        argv=sys.argv)
    print(results.markdown())


if __name__ == "__main__":
    main()
