#!/bin/sh
# Paired tau of the 5.5M head (bf16 weights from git, 4575108~1) and the shipped 7.2M head, with standard errors:
# sh run.sh OLD_HEAD_DIR   (OLD_HEAD_DIR: model.safetensors and config.json of
# specprim/models/heads/smollm2-135m-instruct-eagle3 at 4575108~1)
set -e
here=$(dirname "$0")
tau="python benchmarks/results/campaign-2026-12-06/tau.py $1 smollm2-135m-instruct-eagle3 --threads 2"
$tau --only 0:8,0:32,1:8 --json "$here/mtbench.json" > "$here/mtbench.log" 2>&1
$tau --dataset benchmarks/results/cooldown-2026-12-07/holdout-first-turns.jsonl --num-prompts 30 --only 0:8,1:8 \
    --json "$here/holdout-first-turns.json" > "$here/holdout-first-turns.log" 2>&1
$tau --dataset humaneval --num-prompts 20 --only 0:8,1:8 --json "$here/humaneval.json" > "$here/humaneval.log" 2>&1
$tau --dataset gsm --num-prompts 20 --only 0:8,1:8 --json "$here/gsm.json" > "$here/gsm.log" 2>&1  # pip install reasoning-gym
