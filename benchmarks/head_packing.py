"""What packing the draft head's linears saves: the greedy union (EAGLE-3 top-3 + 4-token prompt lookup + the SmolLM2
answers and ShareGPT datastores, cut to 7 nodes) drafting with the shipped head as ``models.load_head`` now returns it
onto a packed target (its linears packed too) and with the same head's stock linears, side by side with
``model.generate`` in one ``specprim.bench.run`` (bf16, packed target, static compiled verification, MT-bench first
turns). Both heads compute the same drafts bit for bit, so only the drafting time should differ:

    python benchmarks/head_packing.py [--json OUT] [--num-prompts 10] [--temperature 1]

At ``--temperature 1`` the methods are the head's ``sampled:3`` tree alone (the best recipe when sampling).
"""

from __future__ import annotations

import argparse

import torch

from specprim import bench, presets
from specprim.drafters import EagleHead
from specprim.models import head_path, is_packed, load, load_datastore, load_head
from specprim.trees import parse_tree

HEAD = "smollm2-135m-instruct-eagle3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = load("smollm2-135m-instruct", dtype=torch.bfloat16, pack=True)
    heads = {"packed head": load_head(HEAD, target), "stock head": EagleHead.from_pretrained(head_path(HEAD), target)}
    assert is_packed(heads["packed head"]) and not is_packed(heads["stock head"])
    if args.temperature == 0:
        store = load_datastore(["smollm2-135m-instruct-answers", "sharegpt"], tokenizer)
        tree = parse_tree("dynamic:depth=1,top_k=3,budget=3")
        custom = {f"eagle3+prompt-lookup+datastore, {name}": presets.union(
            presets.eagle3(head, tree), presets.prompt_lookup(num_tokens=4, max_matches=1), presets.datastore(store),
            max_nodes=7) for name, head in heads.items()}
    else:
        custom = {f"eagle3 sampled:3, {name}": presets.eagle3(head, parse_tree("sampled:3"))
                  for name, head in heads.items()}
    results = bench.run(target=target, tokenizer=tokenizer, methods=["hf-unpacked"], dataset="mt-bench",
                        num_prompts=args.num_prompts, turns=1, max_new_tokens=128, temperature=args.temperature,
                        pack=True, static_verify=True, warmup_tokens=128, json_path=args.json, custom=custom)
    print(results.markdown())


if __name__ == "__main__":
    main()
