#!/usr/bin/env bash
# One variant of the alignment trial: bash run.sh NAME SEED [extra specprim train options...]
# From the shipped SmolLM2 EAGLE-3 head, on the campaign's first shard (training) and held-out shard (evaluation),
# read through a view (manifest only) in ~/.cache/specprim/align-trial/view; outputs in ~/.cache/specprim/align-trial/NAME.
set -euo pipefail
name=$1; seed=$2; shift 2
trial=~/.cache/specprim/align-trial
nice -n 10 specprim train eagle3 --target smollm2-135m-instruct --out "$trial/$name" --features "$trial/view" \
    --holdout 64 --init-from smollm2-135m-instruct-eagle3 --loss-on assistant \
    --max-steps 40 --lr 1e-4 --warmup-steps 10 --batch-tokens 4096 --max-length 1024 \
    --checkpoint-every 1000 --log-every 10 --seed "$seed" --threads 1 "$@"
