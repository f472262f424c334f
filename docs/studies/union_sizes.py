"""Which union of drafters pays at which verification size (greedy, static compiled verification).

On CPU a compiled ``StaticTarget`` multiplies forwards of up to 4 padded tokens through inductor's C++ GEMM template
and larger ones through oneDNN (``specprim.hf.compiled_settings``), so a 4-token verification costs much less than an
8-token one (``docs/studies/verifier_settings.py --setting cpp-gemm``). This run compares, side by side with packed and
stock ``model.generate`` and transformers' prompt lookup in one interleaved ``specprim.bench.run`` (MT-bench first
turns, 10 questions, 128 tokens, bf16, packed):

* ``7 nodes``: the shipped EAGLE-3 head's top-3 + a 4-token prompt-lookup match + the SmolLM2 answers and ShareGPT
  datastores (4 deep), cut to 7 nodes (an 8-token verification);
* ``3 nodes``: the head's top-1 + a 3-token lookup match + the datastores (3 deep), cut to 3 nodes (4 tokens);
* ``head top-3``: the head's top-3 alone (4 tokens).

    python docs/studies/union_sizes.py [--num-prompts 10] [--json OUT]
"""

from __future__ import annotations

import sys

from smollm2_union import arguments, load_parts, union  # docs/studies/smollm2_union.py, beside this script

from specprim import bench, presets
from specprim.trees import DynamicTree


def main() -> None:
    args = arguments(__doc__)
    target, tokenizer, head, store = load_parts()
    custom = {"7 nodes: head top-3 + lookup 4 + datastore 4": union(head, store, top_k=3, depth=4, max_nodes=7),
              "3 nodes: head top-1 + lookup 3 + datastore 3": union(head, store, top_k=1, depth=3, max_nodes=3),
              "head top-3": presets.eagle3(head, DynamicTree(depth=1, top_k=3, budget=3))}
    results = bench.run(target=target, tokenizer=tokenizer, methods=["hf-unpacked", "hf-prompt-lookup"],
                        custom=custom, dataset="mt-bench", num_prompts=args.num_prompts, turns=1, max_new_tokens=128,
                        static_verify=True, pack=True, warmup_tokens=128, json_path=args.json, argv=sys.argv)
    print(results.markdown())


if __name__ == "__main__":
    main()
