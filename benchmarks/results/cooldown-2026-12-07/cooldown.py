"""Branch a cool-down from a campaign's constant-rate checkpoint: the same data order, the learning rate decayed
(cosine, to ``--min-lr-ratio``) over the next ``--steps`` optimizer steps; prints the held-out evaluation.

    python benchmarks/results/cooldown-2026-12-07/cooldown.py campaigns/smollm2-eagle3-fresh OUT_DIR --steps 150

The campaign's own next segments (constant rate) over the same steps are the comparison: its ``eval.jsonl`` rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from specprim.models import load
from specprim.train._campaign import load_campaign, resolved_mixed_precision, trainer_state
from specprim.train._features import MANIFEST, FeatureDataset
from specprim.train._pipeline import build_objective
from specprim.train._trainer import TrainConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--min-lr-ratio", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    campaign = load_campaign(args.run_dir)
    head = campaign.head
    if not (args.out / "checkpoint").is_dir():
        shutil.copytree(args.run_dir / "train" / "checkpoint", args.out / "checkpoint")
    start = trainer_state(args.run_dir / "train")
    view = args.run_dir / "train" / "view"
    holdout_manifest = json.loads((args.run_dir / "shards" / "holdout" / "features" / MANIFEST).read_text())
    holdout = sum(len(record["lengths"]) for record in holdout_manifest["shards"])
    dataset = FeatureDataset(view, batch_tokens=head.batch_tokens, max_length=campaign.data.max_length,
                             seed=head.seed, holdout=holdout)
    target_step = start["step"] + args.steps
    lengths = [len(dataset.batches(e)) for e in range(start["epoch"] + 8)]
    epochs = start["epoch"] + 1  # as the campaign plans a segment: the schedule spans target_step, the epochs left
    while (sum(lengths[:epochs]) < target_step  # hold every step
           or lengths[start["epoch"]] - start["batch"] + sum(lengths[start["epoch"] + 1: epochs]) < args.steps):
        epochs += 1
    target, _ = load(campaign.target, dtype=torch.float32)  # as the campaign trains
    objective = build_objective("eagle3", target, dataset, draft_vocab_size=head.draft_vocab_size,
                                steps=head.steps, loss_on=head.loss_on, init_from=head.init_from,
                                head_layers=head.head_layers)
    config = TrainConfig(epochs=epochs, max_steps=target_step, lr=head.lr, warmup_steps=head.warmup_steps,
                         min_lr_ratio=args.min_lr_ratio, decay_steps=args.steps,
                         checkpoint_every=head.checkpoint_every, log_every=head.log_every,
                         mixed_precision=resolved_mixed_precision(head.mixed_precision), seed=head.seed)
    metrics = train(objective, dataset, args.out, config, progress=False)
    end = trainer_state(args.out)
    record = {"from_step": start["step"], "from_tokens": start["tokens"], "step": end["step"],
              "trained_tokens": end["tokens"], "decay_steps": args.steps, "min_lr_ratio": args.min_lr_ratio,
              **metrics}
    print(json.dumps(record))
    (args.out / "result.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
