"""What drafting through the compiled static-shape head saves: the greedy 3-node union (the shipped EAGLE-3 head's
top-1 + a 3-token prompt-lookup match + the SmolLM2 answers and ShareGPT datastores 3 deep) drafting with the eager
head (``EagleDraftModel``) and with the same head in a compiled ``StaticEagleDraftModel``
(``specprim.drafters.static_drafting``, compiled before timing), side by side with ``model.generate`` in one
``specprim.bench.run`` (bf16, packed target and head, static compiled verification, MT-bench first turns). Both
draft the same tokens up to bf16 rounding, so mainly the drafting time should differ:

    python docs/studies/static_head_drafting.py [--num-prompts 10] [--json OUT]
"""

from __future__ import annotations

import sys

from smollm2_union import arguments, load_parts, union  # docs/studies/smollm2_union.py, beside this script

from specprim import bench, presets
from specprim.drafters import static_drafting

CACHE_LENGTH = 1024  # > the longest MT-bench first turn + 128 new tokens + the largest padded size


def main() -> None:
    args = arguments(__doc__)
    target, tokenizer, head, store = load_parts()
    static = union(head, store, top_k=1, depth=3, max_nodes=3)
    custom = {"3-node union, eager head": union(head, store, top_k=1, depth=3, max_nodes=3),
              "3-node union, static compiled head": presets.Method(
                  static_drafting(static.drafter, min_cache_length=CACHE_LENGTH), static.acceptance)}
    results = bench.run(target=target, tokenizer=tokenizer, methods=["hf-unpacked"], custom=custom,
                        dataset="mt-bench", num_prompts=args.num_prompts, turns=1, max_new_tokens=128,
                        static_verify=True, pack=True, warmup_tokens=128, json_path=args.json, argv=sys.argv)
    print(results.markdown())


if __name__ == "__main__":
    main()
