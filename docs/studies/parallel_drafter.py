"""The parallel drafter (one head forward drafts K tokens) against the shipped EAGLE-3 head on SmolLM2-135M-Instruct
(bf16): drafting ms per step, tau and tokens/s on MT-bench first turns, in one ``specprim.bench.run`` beside
``model.generate``:

    python docs/studies/parallel_drafter.py --head DIR [--temperature 0] [--num-prompts 10] [--json OUT]

``--head``: a saved ParallelHead (``specprim train parallel ...``). Methods: the EAGLE-3 head with its default
dynamic tree, the EAGLE-3 head drafting a chain of K (K sequential head steps), and the parallel head drafting the
same chain in one forward.
"""

from __future__ import annotations

import argparse

import torch

from specprim import bench, presets
from specprim.models import load, load_head
from specprim.trees import Chain

EAGLE3 = "smollm2-135m-instruct-eagle3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head", required=True, help="a saved ParallelHead directory")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load("smollm2-135m-instruct", dtype=torch.bfloat16)
    eagle, parallel = load_head(EAGLE3, target), load_head(args.head, target)
    k = parallel.num_draft
    custom = {
        "eagle3 default tree": presets.eagle3(eagle),
        f"eagle3 chain:{k}": presets.eagle3(eagle, Chain(k)),
        f"parallel chain:{k}": presets.parallel(parallel),
    }
    results = bench.run(target=target, tokenizer=tokenizer, methods=[], dataset="mt-bench",
                        num_prompts=args.num_prompts, turns=1, max_new_tokens=128, temperature=args.temperature,
                        warmup_tokens=32, json_path=args.json, custom=custom)
    print(results.markdown())


if __name__ == "__main__":
    main()
