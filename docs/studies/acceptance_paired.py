"""Lossless acceptance rules compared on the very same drafts: at every step of a sampled run, each rule is applied
``--replicas`` times to the step's target ``p`` and drafted tree (its own coins, a separate generator), so the
expected accepted length of every rule is estimated on identical contexts and drafts. The difference between two
rules then carries only the rules' own coin noise, not the run-to-run noise that separate ``specprim bench`` runs
have (there a different rule changes every later context). The run itself follows the first rule.

    python docs/studies/acceptance_paired.py --dataset gsm --num-prompts 40 --tree chain:4 \\
        --rules speculative,block --json OUT.json
    python docs/studies/acceptance_paired.py --target qwen2.5-coder-1.5b-instruct --method leviathan \\
        --draft qwen2.5-coder-0.5b-instruct --dataset humaneval --num-prompts 10 --tree chain:4 \\
        --rules speculative,block --json OUT.json

Temperature 1, bfloat16, packed. For each rule: the mean accepted draft tokens per step (tau = 1 + that), its
standard error over steps, the paired difference to the first rule with its standard error, the fraction of the best
rule, and the rule's own time per call (one row, the step's real ``p`` and tree). On a chain with iid drafts block
verification is the optimal lossless rule (docs/acceptance.md), so there ``speculative / block`` is the token-level
rule's fraction of the optimum.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from specprim import recipes
from specprim.acceptance import RULES
from specprim.bench import load_dataset
from specprim.hf import chat_input_ids


class PairedRules:
    """An acceptance rule that decides with ``rules[0]`` and, on the side, scores every rule on the same p and tree."""

    lossless = True

    def __init__(self, rules: dict[str, Any], replicas: int, seed: int) -> None:
        self.rules, self.replicas = rules, replicas
        self.coins = torch.Generator().manual_seed(seed + 1)  # the side runs' own randomness
        self.accepted: dict[str, list[float]] = {name: [] for name in rules}  # per step: mean over replicas
        self.seconds: dict[str, list[float]] = {name: [] for name in rules}  # per step: one single-row call
        self.skipped = 0

    def __call__(self, p: torch.Tensor, tree: Any, generator: torch.Generator | None = None) -> Any:
        decide = next(iter(self.rules.values()))
        if tree.q is None:  # a step the drafter did not sample (an empty tree): nothing to compare
            self.skipped += 1
            return decide(p, tree, generator)
        many_p = p.expand(self.replicas, -1, -1).contiguous()  # (R, N + 1, V)
        many = dataclasses.replace(tree, tokens=tree.tokens.expand(self.replicas, -1).contiguous(),  # (R, N)
                                   q=tree.q.expand(self.replicas, -1, -1).contiguous())  # (R, N + 1, V)
        for name, rule in self.rules.items():
            self.accepted[name].append(rule(many_p, many, self.coins).num_accepted.float().mean().item())
            start = time.perf_counter()
            rule(p, tree, self.coins)
            self.seconds[name].append(time.perf_counter() - start)
        return decide(p, tree, generator)


def mean_and_error(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(variance / len(values))


def summary(paired: PairedRules) -> dict[str, Any]:
    names = list(paired.rules)
    first = paired.accepted[names[0]]
    best = max(mean_and_error(paired.accepted[n])[0] for n in names)
    rows = {}
    for name in names:
        mean, error = mean_and_error(paired.accepted[name])
        differences = [a - b for a, b in zip(paired.accepted[name], first, strict=True)]
        difference, difference_error = mean_and_error(differences)
        seconds = sorted(paired.seconds[name])
        rows[name] = {"accepted_per_step": mean, "standard_error": error, "tau": 1 + mean,
                      f"minus_{names[0]}": difference, f"minus_{names[0]}_standard_error": difference_error,
                      "fraction_of_best": mean / best if best else None,
                      "median_ms_per_call": 1e3 * seconds[len(seconds) // 2]}
    return {"steps": len(first), "steps_without_q": paired.skipped, "rules": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--head", default=None)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--dataset", default="gsm")
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--tree", default="chain:4")
    parser.add_argument("--rules", default="speculative,block")
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    recipe = recipes.Recipe(method=args.method, head=args.head, draft=args.draft, dtype="bfloat16", pack=True,
                            tree=args.tree)
    model, tokenizer = recipes.load_target(recipe, args.target)
    built = recipe.build(model, tokenizer, draft=recipes.load_draft(recipe, tokenizer))
    paired = PairedRules({name: RULES[name]() for name in args.rules.split(",")}, args.replicas, args.seed)
    method = dataclasses.replace(built.method, acceptance=paired)
    generator = torch.Generator().manual_seed(args.seed)
    for prompt in load_dataset(args.dataset, args.num_prompts):
        ids = chat_input_ids(tokenizer, prompt.turns[0])  # (1, T)
        method.generate(built.verifier, ids, max_new_tokens=args.max_new_tokens, temperature=1.0,
                        generator=generator)
        print(prompt.id, json.dumps(summary(paired)["rules"]), flush=True)
    result = {"command": vars(args) | {"json": str(args.json)}, **summary(paired)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
