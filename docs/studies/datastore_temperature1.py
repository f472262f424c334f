"""At temperature 1: the shipped EAGLE-3 head's sampled tree (``sampled:3``, the best recipe) against the greedy
union's drafters (top-3 tree + 4-token prompt lookup + the SmolLM2 answers and ShareGPT datastores, cut to 7 nodes),
side by side with ``model.generate`` in one ``specprim.bench.run`` (bf16, packed, static compiled verification):

    python docs/studies/datastore_temperature1.py [--json OUT] [--num-prompts 10]
"""

from __future__ import annotations

import argparse

import torch

from specprim import bench, presets
from specprim.models import load, load_datastore, load_head
from specprim.trees import parse_tree

HEAD = "smollm2-135m-instruct-eagle3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--num-prompts", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = load("smollm2-135m-instruct", dtype=torch.bfloat16, pack=True)
    store = load_datastore(["smollm2-135m-instruct-answers", "sharegpt"], tokenizer)
    sampled = presets.eagle3(load_head(HEAD, target), parse_tree("sampled:3"))
    top3 = presets.eagle3(load_head(HEAD, target), parse_tree("dynamic:depth=1,top_k=3,budget=3"))
    union = presets.union(top3, presets.prompt_lookup(num_tokens=4, max_matches=1), presets.datastore(store),
                          max_nodes=7)
    results = bench.run(target=target, tokenizer=tokenizer, methods=["hf-unpacked"], dataset="mt-bench",
                        num_prompts=args.num_prompts, turns=1, max_new_tokens=128, temperature=1.0, pack=True,
                        static_verify=True, warmup_tokens=128, json_path=args.json,
                        custom={"eagle3 sampled:3": sampled, "eagle3 top-3 + prompt lookup + datastore": union})
    print(results.markdown())


if __name__ == "__main__":
    main()
