"""How much a retrieval datastore adds to the shipped EAGLE-3 head on MT-bench, by greedy replay (tau only, no timing).

The target's greedy answers to the first turns are recorded once (fp32, 128 tokens); every drafter is then replayed
against them (``specprim.bench.replay``: accepted lengths equal a live greedy run's), so tau is exact and costs no
target forward. Rows: the head's tuned tree, prompt lookup and the datastores alone, and their unions cut to 7 nodes
(what an 8-token static verification bucket holds). ``--shapes`` replays other union shapes with the last datastore:
2 or 4 head siblings, 3-token lookups, and a cut to 3 nodes (the 4-token bucket). ``--orders`` replays the README's
3-node union (head top-1, 3-token lookup, datastore 3 deep) with its three parts in every order: the cut keeps the
first 3 nodes in merge order, so the order decides whose nodes are verified:

    python docs/studies/datastore_replay.py [--num-prompts 10] [--datastore smollm2-135m-instruct-answers ...]
        [--shapes] [--orders]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import torch

from specprim import presets
from specprim.bench import load_dataset, record_prompts, replay_all
from specprim.drafters import DatastoreLookup, UnionDrafter
from specprim.models import load, load_datastore, load_head
from specprim.trees import DynamicTree

TARGET, HEAD = "smollm2-135m-instruct", "smollm2-135m-instruct-eagle3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--datastore", action="append",
                        help="repeatable (default: the shipped answers, ShareGPT, and both joined)")
    parser.add_argument("--shapes", action="store_true", help="also replay other union shapes (see above)")
    parser.add_argument("--orders", action="store_true", help="also replay the 3-node union's parts in every order")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = load(TARGET)
    head = load_head(HEAD, target)
    eagle = _eagle(head, 3)
    lookup = presets.prompt_lookup(num_tokens=4, max_matches=1).drafter
    prompts = [dataclasses.replace(p, turns=p.turns[:1]) for p in load_dataset("mt-bench", args.num_prompts)]
    recordings = record_prompts(target, tokenizer, prompts, args.max_new_tokens, layers=eagle.feature_layers)
    names = [[name] for name in args.datastore] if args.datastore else [
        ["smollm2-135m-instruct-answers"], ["sharegpt"], ["smollm2-135m-instruct-answers", "sharegpt"]]
    rows = [("eagle3 (dynamic:depth=1,top_k=3,budget=3)", eagle), ("prompt lookup (4 tokens, 1 match)", lookup),
            ("eagle3 + prompt lookup, 7 nodes", UnionDrafter(eagle, lookup, max_nodes=7))]
    for group in names:
        retrieval = DatastoreLookup(datastore=load_datastore(group, tokenizer))
        label = " + ".join(group)
        rows += [(f"datastore {label}", retrieval),
                 (f"eagle3 + prompt lookup + datastore {label}, 7 nodes",
                  UnionDrafter(eagle, lookup, retrieval, max_nodes=7))]
    if args.shapes:
        for top_k, length in ((2, 3), (2, 4), (3, 3), (4, 3), (4, 4)):
            rows.append((f"eagle3 top-{top_k} + prompt lookup {length} + datastore {label} ({length} deep), 7 nodes",
                         UnionDrafter(_eagle(head, top_k), presets.prompt_lookup(num_tokens=length, max_matches=1)
                                      .drafter, DatastoreLookup(datastore=retrieval.datastore, num_tokens=length),
                                      max_nodes=7)))
        rows.append((f"eagle3 top-1 + prompt lookup 2 + datastore {label} (2 deep, 2 nodes), 3 nodes",
                     UnionDrafter(_eagle(head, 1), presets.prompt_lookup(num_tokens=2, max_matches=1).drafter,
                                  DatastoreLookup(datastore=retrieval.datastore, num_tokens=2, num_nodes=2),
                                  max_nodes=3)))
    if args.orders:
        parts = {"eagle3 top-1": lambda: _eagle(head, 1),
                 "prompt lookup 3": lambda: presets.prompt_lookup(num_tokens=3, max_matches=1).drafter,
                 f"datastore {label} (3 deep)": lambda: DatastoreLookup(datastore=retrieval.datastore, num_tokens=3)}
        for order in itertools.permutations(parts):
            union = UnionDrafter(*(parts[name]() for name in order), max_nodes=3)
            rows.append((" + ".join(order) + ", 3 nodes", union))
    print(f"{TARGET}, MT-bench first turns ({len(prompts)}), {args.max_new_tokens} tokens, greedy replay\n")
    print("| drafter | tau | nodes per step | draft ms per step |\n|---|---|---|---|")
    for label, drafter in rows:
        stats = replay_all(recordings, drafter, max_new_tokens=args.max_new_tokens,
                           eos_token_id=tokenizer.eos_token_id).stats
        print(f"| {label} | {stats.tau:.3f} | {sum(stats.tree_nodes) / stats.steps:.2f} | "
              f"{1000 * stats.draft_s / stats.steps:.2f} |", flush=True)


def _eagle(head: object, top_k: int) -> object:
    """The head drafting its ``top_k`` most likely next tokens (one level), a fresh drafter each call."""
    return presets.eagle3(head, DynamicTree(depth=1, top_k=top_k, budget=top_k)).drafter


if __name__ == "__main__":
    main()
