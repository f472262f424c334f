"""Token-alignable (align) against the plain unrolled objective: same data, steps, seed and start head.

Usage: python compare.py MAX_STEPS [EPOCHS]  (run with the campaign paused; reads its shard-0 features and its
held-out shard from /root/.cache/specprim/campaigns/smollm2-eagle3, writes /tmp/align/).
"""
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator

from specprim import models
from specprim.train._features import FeatureDataset
from specprim.train._pipeline import build_objective
from specprim.train._trainer import TrainConfig, _evaluate, train

run = Path("/root/.cache/specprim/campaigns/smollm2-eagle3")
view = run / "train" / "view"
manifest = json.loads((run / "shards/holdout/features/manifest.json").read_text())
holdout = sum(len(r["lengths"]) for r in manifest["shards"])
steps = int(sys.argv[1])
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
torch.set_num_threads(2)
target, _ = models.load("smollm2-135m-instruct")
dataset = FeatureDataset(view, batch_tokens=4096, max_length=1024, seed=0, holdout=holdout)
results = {}
for name, align in (("start", False), ("plain", False), ("align", True)):
    objective = build_objective("eagle3", target, dataset, steps=3, init_from="smollm2-135m-instruct-eagle3",
                                align=align)
    out = Path(f"/tmp/align/{name}")
    shutil.rmtree(out, ignore_errors=True)
    started = time.time()
    if name == "start":
        metrics = _evaluate(objective, dataset, Accelerator(cpu=True), out, {"step": 0, "epoch": 0})
    else:
        config = TrainConfig(epochs=epochs, max_steps=steps, lr=1e-4, warmup_steps=10, min_lr_ratio=1.0,
                             checkpoint_every=10**9, log_every=20, seed=0)
        metrics = train(objective, dataset, out, config, progress=False)
    keep = {k: round(v, 4) for k, v in metrics.items() if k.startswith(("acc_", "chain_"))}
    keep["chain_tau"] = round(1 + sum(v for k, v in metrics.items() if k.startswith("chain_")), 4)
    results[name] = keep
    print(name, keep, f"{time.time() - started:.0f} s", flush=True)
Path(f"/tmp/align/results-{steps}-{epochs}.json").write_text(json.dumps(results, indent=1))
