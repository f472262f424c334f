"""Held-out, teacher-forced accuracy by depth of a parallel head and of the shipped EAGLE-3 head on the campaign's
held-out feature shard (64 conversations, 34,398 tokens; SmolLM2-135M-Instruct, float32 head):

    nice -n 10 python benchmarks/results/parallel-drafter-2026-12-06/holdout_eval.py HEAD_DIR [--json OUT]

``acc_k``: the draft's argmax at depth k is the target's greedy token (EAGLE-3: fed its own depth k-1 prediction,
its training-time test; parallel: placeholder k-1). ``chain_k``: the first k argmax tokens all match, so
``1 + sum_k chain_k`` estimates a greedy chain's tau. Weighted by the positions each depth scores.
"""

from __future__ import annotations

import argparse
import json

import torch

from specprim import models
from specprim.train import EagleObjective, FeatureDataset
from specprim.train._parallel import ParallelObjective

HOLDOUT = "campaigns/smollm2-eagle3/shards/holdout/features"


def evaluate(objective, dataset: FeatureDataset, depths: int) -> dict[str, float]:
    sums = {f"{name}_{k}": 0.0 for name in ("acc", "chain") for k in range(1, depths + 1)}
    weights = {k: 0 for k in range(1, depths + 1)}
    with torch.no_grad():
        for items in dataset.batches(0):
            batch = dataset.load(items)
            lengths = batch.attention_mask.sum(1)  # (B,)
            metrics = objective(batch).metrics
            for k in range(1, depths + 1):
                weight = int((lengths - k).clamp(min=0).sum())
                weights[k] += weight
                for name in ("acc", "chain"):
                    sums[f"{name}_{k}"] += metrics[f"{name}_{k}"] * weight
    out = {key: value / weights[int(key.split("_")[1])] for key, value in sums.items()}
    out["estimated_greedy_chain_tau"] = 1 + sum(out[f"chain_{k}"] for k in range(1, depths + 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("head")
    parser.add_argument("--json")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = models.load("smollm2-135m-instruct", dtype=torch.float32)
    dataset = FeatureDataset(HOLDOUT, batch_tokens=4096, max_length=1024, holdout=0)
    parallel = models.load_head(args.head, target)
    results = {"parallel": evaluate(ParallelObjective(parallel), dataset, parallel.num_draft)}
    print("parallel", json.dumps(results["parallel"]), flush=True)
    eagle = models.load_head("smollm2-135m-instruct-eagle3", target)
    results["eagle3"] = evaluate(EagleObjective(eagle, steps=parallel.num_draft), dataset, parallel.num_draft)
    print("eagle3", json.dumps(results["eagle3"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
