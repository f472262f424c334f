"""Speculation under a JSON schema against the same methods unconstrained, on the built-in ``json`` dataset
(docs/structured.md): tau, acceptance of the drafted tokens (before and after the grammar prunes them) and tokens/s,
per method, with and without the constraint; with ``--plain``, plain decoding with and without it too.

    python docs/studies/structured_json.py --num-prompts 10 --max-new-tokens 80 --json OUT.json [--plain]

Greedy, SmolLM2-135M-Instruct in bfloat16, packed; methods: prompt lookup, the shipped EAGLE-3 head, and ``auto``'s
recipe (its own verifier). tau and acceptance do not depend on the machine's load; tokens/s do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from specprim import recipes
from specprim.bench import load_dataset
from specprim.constraints import GrammarConstraint
from specprim.hf import chat_input_ids

TARGET = "smollm2-135m-instruct"
SCHEMA_FILE = Path(__file__).parents[2] / "benchmarks" / "schemas" / "json-extraction.json"  # the json dataset's
SCHEMA = json.loads(SCHEMA_FILE.read_text())
METHODS = {
    "prompt-lookup": recipes.Recipe(method="prompt-lookup", dtype="bfloat16", pack=True),
    "eagle3": recipes.Recipe(method="eagle3", head="smollm2-135m-instruct-eagle3", dtype="bfloat16", pack=True),
}


class CountingDrafter:
    """A drafter's trees' depths as proposed, before any pruning (every other attribute is the drafter's)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.drafted = inner, 0

    def propose(self, request: Any) -> Any:
        tree = self.inner.propose(request)
        self.drafted += min(tree.depth, request.max_depth)
        return tree

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_method(built: Any, inputs: list[torch.Tensor], tokenizer: Any, max_new_tokens: int,
               constraint: Any) -> dict[str, Any]:
    counter = CountingDrafter(built.method.drafter)
    method = dataclasses.replace(built.method, drafter=counter)
    steps = accepted = drafted_after = tokens = valid = 0
    seconds = 0.0
    for ids in inputs:
        start = time.perf_counter()
        out = method.generate(built.verifier, ids, max_new_tokens=max_new_tokens,
                              eos_token_id=tokenizer.eos_token_id, constraint=constraint)
        seconds += time.perf_counter() - start
        stats = out.stats
        steps, tokens = steps + stats.steps, tokens + stats.new_tokens
        accepted += sum(stats.accepted)
        drafted_after += sum(stats.tree_depth)
        valid += _is_valid(tokenizer.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True))
    return {"tau": tokens / steps, "acceptance_drafted": accepted / max(counter.drafted, 1),
            "acceptance_after_pruning": accepted / max(drafted_after, 1), "steps": steps, "new_tokens": tokens,
            "drafted_depth": counter.drafted, "verified_depth": drafted_after, "accepted": accepted,
            "tokens_per_s_busy_machine": tokens / seconds, "valid_json": valid, "prompts": len(inputs)}


def _is_valid(text: str) -> bool:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and set(obj) == set(SCHEMA["required"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--json", required=True)
    parser.add_argument("--method", action="append", choices=[*METHODS, "auto"],
                        help="repeatable; default: all three")
    parser.add_argument("--plain", action="store_true", help="time plain (constrained) decoding too")
    args = parser.parse_args()
    torch.set_num_threads(2)
    auto = recipes.auto(TARGET, temperature=0.0, dtype="bfloat16").recipe
    methods = {name: recipe for name, recipe in dict(METHODS, auto=auto).items()
               if args.method is None or name in args.method}
    model, tokenizer = recipes.load_target(auto, TARGET)
    constraint = GrammarConstraint.json_schema(SCHEMA, tokenizer,
                                               vocab_size=model.get_output_embeddings().weight.shape[0])
    prompts = load_dataset("json", args.num_prompts)
    inputs = [chat_input_ids(tokenizer, p.turns[0]) for p in prompts]
    results: dict[str, Any] = {"settings": {**vars(args), "target": TARGET, "prompt_ids": [p.id for p in prompts],
                                            "constraint": constraint.source,
                                            "recipes": {k: repr(v) for k, v in methods.items()}}}
    for name, recipe in methods.items():
        built = recipe.build(model, tokenizer, draft=recipes.load_draft(recipe, tokenizer), cache_length=1024)
        built.generate(inputs[0], max_new_tokens=recipe.warmup_tokens, eos_token_id=tokenizer.eos_token_id)
        for label, c in (("constrained", constraint), ("unconstrained", None)):
            results[f"{name} {label}"] = row = run_method(built, inputs, tokenizer, args.max_new_tokens, c)
            print(name, label, json.dumps(row), flush=True)
            Path(args.json).write_text(json.dumps(results, indent=1))
    if args.plain:
        for label, c in (("constrained", constraint), ("unconstrained", None)):
            start, tokens, valid = time.perf_counter(), 0, 0
            for ids in inputs:
                processors = None if c is None else [c.logits_processor(ids.shape[1])]
                out = recipes.plain_generate(model, ids, args.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                                             logits_processor=processors)
                tokens += out.shape[1] - ids.shape[1]
                valid += _is_valid(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
            results[f"plain {label}"] = row = {"tokens_per_s_busy_machine": tokens / (time.perf_counter() - start),
                                               "new_tokens": tokens, "valid_json": valid}
            print("plain", label, json.dumps(row), flush=True)
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
