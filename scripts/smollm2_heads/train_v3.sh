#!/usr/bin/env bash
# Third round of the shipped SmolLM2-135M-Instruct EAGLE-3 head (2 CPU cores): the second-round head (the shipped
# one, or train_v2.sh's RUN2/eagle3/run/head) trained further on 2,000 *new* ShareGPT first turns
# (positions 3,000-4,999 of the length-sorted list; rounds 1-2 used 0-2,999) answered by the target itself.
# Every step resumes when rerun.
# Status: NOT shipped. One run (2026-12-01) answered the 2,000 turns (44 min) and built their features (580k tokens,
# 15 min), then stopped at step 150 of 425: held-out teacher-forced top-1 on its 32 held-out conversations fell from
# 0.448 (the shipped head, before training) to 0.416 at step 50 (fresh optimizer state) and had climbed back only to
# 0.429 by step 150. A lower lr, or mixing in round 2's data, is what to try next.
# Usage: bash scripts/smollm2_heads/train_v3.sh RUN_DIR SECOND_HEAD   (a directory or a shipped head name)
set -euo pipefail
run=${1:?usage: train_v3.sh RUN_DIR SECOND_HEAD}
second=${2:?usage: train_v3.sh RUN_DIR SECOND_HEAD}
[ -d "$second" ] && second=$(cd "$second" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$run" && cd "$run"
python "$here/prepare_data.py" --start 3000 --distilled 2000 --original 0 --dtype bfloat16 --batch-size 32
common=(--target smollm2-135m-instruct --data combined.jsonl --num-conversations 2000 --max-length 512
        --holdout 32 --feature-dtype bfloat16 --features "$run/features")
specprim train eagle3 "${common[@]}" --out "$run/eagle3" --features-only --threads 2
specprim train eagle3 "${common[@]}" --out "$run/eagle3" --init-from "$second" --steps 3 --epochs 2 --lr 2e-4 \
    --warmup-steps 10 --batch-tokens 4096 --mixed-precision bf16 --loss-on assistant --checkpoint-every 25 \
    --log-every 5 --eval-every 50 --threads 2
