"""Which union of drafters pays at which verification size (greedy, static compiled verification).

On CPU a compiled ``StaticTarget`` multiplies forwards of up to 4 padded tokens through inductor's C++ GEMM template
and larger ones through oneDNN (``specprim.hf.compiled_settings``), so a 4-token verification costs much less than an
8-token one (``benchmarks/verifier_settings.py --setting cpp-gemm``). This run compares, side by side with packed and
stock ``model.generate`` and transformers' prompt lookup in one interleaved ``specprim.bench.run`` (MT-bench first
turns, 10 questions, 128 tokens, bf16, packed):

* ``7 nodes``: the shipped EAGLE-3 head's top-3 + a 4-token prompt-lookup match + the SmolLM2 answers and ShareGPT
  datastores (4 deep), cut to 7 nodes (an 8-token verification);
* ``3 nodes``: the head's top-1 + a 3-token lookup match + the datastores (3 deep), cut to 3 nodes (4 tokens);
* ``head top-3``: the head's top-3 alone (4 tokens).

    python benchmarks/union_sizes.py [--num-prompts 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys

import torch

from specprim import bench, presets
from specprim.models import load, load_datastore, load_head
from specprim.trees import DynamicTree

HEAD = "smollm2-135m-instruct-eagle3"
DATASTORES = ["smollm2-135m-instruct-answers", "sharegpt"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = load("smollm2-135m-instruct", dtype=torch.bfloat16, pack=True)
    head = load_head(HEAD, target)
    store = load_datastore(DATASTORES, tokenizer)

    def union(top_k: int, depth: int, max_nodes: int) -> presets.Method:
        """The head's top-``top_k`` + a ``depth``-token lookup match + the datastores ``depth`` deep."""
        return presets.union(presets.eagle3(head, DynamicTree(depth=1, top_k=top_k, budget=top_k)),
                             presets.prompt_lookup(num_tokens=depth, max_matches=1),
                             presets.datastore(store, num_tokens=depth), max_nodes=max_nodes)

    custom = {"7 nodes: head top-3 + lookup 4 + datastore 4": union(3, 4, 7),
              "3 nodes: head top-1 + lookup 3 + datastore 3": union(1, 3, 3),
              "head top-3": presets.eagle3(head, DynamicTree(depth=1, top_k=3, budget=3))}
    results = bench.run(target=target, tokenizer=tokenizer, methods=["hf-unpacked", "hf-prompt-lookup"],
                        custom=custom, dataset="mt-bench", num_prompts=args.num_prompts, turns=1, max_new_tokens=128,
                        static_verify=True, pack=True, warmup_tokens=128, json_path=args.json, argv=sys.argv)
    print(results.markdown())


if __name__ == "__main__":
    main()
