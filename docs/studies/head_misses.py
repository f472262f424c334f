"""Where an EAGLE head misses: its teacher-forced agreement with the target on a feature cache, by how confident the
target is at each position.

For every held-out position the head's depth-1 draft (the token after the next one, given the target's features
and the true next token) is compared with the target's greedy token; positions are grouped by the target's own
top-1 probability there. A head that misses mostly where the target is unsure is limited by the target's flat
distributions (a small error flips a near-tie); one that misses where the target is sure is short of data or
capacity. Also printed per group: the expected acceptance at temperature 1 of one drafted token,
``sum_x min(p(x), q(x))`` over the target's cached top-K (a lower bound of the full sum).

    python docs/studies/head_misses.py --features RUN_DIR/shards/holdout/features --head HEAD [--head HEAD ...]
        [--target smollm2-135m-instruct] [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import torch

from specprim.models import load, load_head
from specprim.train import EagleObjective, FeatureDataset

BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)  # the target's top-1 probability: [a, b)


@torch.no_grad()
def misses(objective: EagleObjective, dataset: FeatureDataset) -> list[dict[str, float]]:
    """Per confidence bucket: share of positions, greedy agreement at depth 1, expected T=1 acceptance."""
    head = objective.module
    count = torch.zeros(len(BUCKETS) - 1)
    hits = torch.zeros(len(BUCKETS) - 1)
    overlap = torch.zeros(len(BUCKETS) - 1)
    covered = torch.zeros(len(BUCKETS) - 1)
    for items in dataset.batches(0):
        batch = dataset.load(items)
        _, logits = next(iter(objective.unroll(batch)))  # (B, n, V_d) depth 1 of chain i: the token after i + 1
        n = logits.shape[1]
        valid = (batch.assistant_mask & batch.attention_mask)[:, 1:n + 1]  # (B, n)
        top_ids = batch.topk_ids[:, 1:n + 1]  # (B, n, K) the target's top-K after position i + 1
        p_top = batch.topk_logprobs[:, 1:n + 1].exp()  # (B, n, K)
        q = torch.full((*logits.shape[:2], head.config.vocab_size), 0.0)  # (B, n, V) the draft's, in target ids
        q[..., head.d2t] = logits.float().softmax(-1)
        drafted = head.d2t[logits.argmax(-1)]  # (B, n) target id of the draft's greedy token
        agree = drafted == top_ids[..., 0]
        sure = p_top[..., 0].contiguous()  # (B, n)
        in_vocab = torch.isin(top_ids[..., 0], head.d2t)  # (B, n) the target's token is one the head can draft
        shared = torch.minimum(p_top, q.gather(-1, top_ids)).sum(-1)  # (B, n)
        bucket = torch.bucketize(sure, torch.tensor(BUCKETS[1:-1]), right=True)  # (B, n) in 0 .. len - 2
        for b in range(len(BUCKETS) - 1):
            where = valid & (bucket == b)
            count[b] += where.sum()
            hits[b] += (agree & where).sum()
            overlap[b] += shared[where].sum()
            covered[b] += (in_vocab & where).sum()
    total = count.sum()
    return [{"p_top1": f"[{BUCKETS[b]:.1f}, {min(BUCKETS[b + 1], 1.0):.1f})", "share": float(count[b] / total),
             "top1_agreement": float(hits[b] / count[b].clamp(min=1)),
             "t1_acceptance": float(overlap[b] / count[b].clamp(min=1)),
             "in_draft_vocab": float(covered[b] / count[b].clamp(min=1)),
             "share_of_misses": float((count[b] - hits[b]) / (total - hits.sum()))}
            for b in range(len(BUCKETS) - 1)] + [{"p_top1": "all", "share": 1.0,
                                                  "top1_agreement": float(hits.sum() / total),
                                                  "t1_acceptance": float(overlap.sum() / total),
                                                  "in_draft_vocab": float(covered.sum() / total),
                                                  "share_of_misses": 1.0}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", required=True, help="a feature cache (e.g. a campaign's held-out shard)")
    parser.add_argument("--head", action="append", required=True)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--json")
    args = parser.parse_args()
    target, _ = load(args.target, dtype=torch.float32)
    dataset = FeatureDataset(args.features, batch_tokens=4096)
    out = {}
    for name in args.head:
        rows = misses(EagleObjective(load_head(name, target), steps=1), dataset)
        out[name] = rows
        print(name)
        print("| target top-1 p | share of positions | target's token in the draft vocabulary | top-1 agreement | "
              "T=1 acceptance (top-K) | share of misses |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print(f"| {row['p_top1']} | {row['share']:.3f} | {row['in_draft_vocab']:.3f} | {row['top1_agreement']:.3f} "
                  f"| {row['t1_acceptance']:.3f} "
                  f"| {row['share_of_misses']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
