#!/usr/bin/env bash
# The shipped SmolLM2-135M-Instruct EAGLE-3 head, second round (2 CPU cores): the first-round head (train.sh,
# RUN1/eagle3/run/head) trained further on 3,000 ShareGPT first turns answered by the target itself.
# Every step resumes when rerun.
# Usage: bash scripts/smollm2_heads/train_v2.sh RUN_DIR FIRST_HEAD   (FIRST_HEAD: train.sh's RUN1/eagle3/run/head)
set -euo pipefail
run=${1:?usage: train_v2.sh RUN_DIR FIRST_HEAD}
first=$(cd "${2:?usage: train_v2.sh RUN_DIR FIRST_HEAD}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$run" && cd "$run"
# the target answers 3,000 first turns greedily in bf16 (packed), 32 at a time (the shipped head's first 384
# answers were produced in float32, before the bf16 path existed; the run resumed from them)
python "$here/prepare_data.py" --distilled 3000 --original 0 --dtype bfloat16 --batch-size 32
common=(--target smollm2-135m-instruct --data combined.jsonl --num-conversations 3000 --max-length 512
        --holdout 32 --feature-dtype bfloat16 --features "$run/features")
specprim train eagle3 "${common[@]}" --out "$run/eagle3" --features-only --threads 2   # ~20 min, 858k tokens
specprim train eagle3 "${common[@]}" --out "$run/eagle3" --init-from "$first" --steps 3 --epochs 2 --lr 3e-4 \
    --warmup-steps 20 --batch-tokens 4096 --mixed-precision bf16 --loss-on assistant --checkpoint-every 25 \
    --log-every 5 --eval-every 50 --threads 2
