"""The HASS variant of the alignment trial, run before ``--hass-topk`` was wired into the objective: the same
settings as run.sh, with each depth's soft cross-entropy replaced by soft CE + WEIGHT * topk_distillation_loss(K)
(what ``--hass-topk K --hass-weight WEIGHT`` computes).

Usage: nice -n 10 python hass_trial.py NAME SEED K WEIGHT
"""
import sys
from pathlib import Path

import torch

from specprim import models
from specprim.train import _unrolled
from specprim.train._alignment import topk_distillation_loss
from specprim.train._pipeline import DataConfig, train_drafter
from specprim.train._trainer import TrainConfig

name, seed, k, weight = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
plain = _unrolled.soft_cross_entropy


def with_topk(logits, topk_ids, topk_logprobs, mask, *, t2d=None, greedy=False):
    return plain(logits, topk_ids, topk_logprobs, mask, t2d=t2d, greedy=greedy) + weight * topk_distillation_loss(
        logits, topk_ids, topk_logprobs, mask, k, t2d=t2d)


_unrolled.soft_cross_entropy = with_topk
torch.set_num_threads(1)
trial = Path.home() / ".cache/specprim/align-trial"
target, tokenizer = models.load("smollm2-135m-instruct", dtype=torch.float32)
train_drafter("eagle3", target, tokenizer, trial / name, features_dir=trial / "view",
              init_from="smollm2-135m-instruct-eagle3", loss_on="assistant", batch_tokens=4096,
              data=DataConfig(holdout=64, max_length=1024),
              config=TrainConfig(max_steps=40, lr=1e-4, warmup_steps=10, checkpoint_every=1000, log_every=10,
                                 seed=seed))
