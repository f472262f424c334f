#!/usr/bin/env bash
# The shipped SmolLM2-135M-Instruct heads, as trained (2 CPU cores): the Medusa head and the first round of the
# EAGLE-3 head (train_v2.sh trains that one further into the shipped EAGLE-3 head). Every step resumes when rerun.
# Usage: bash scripts/smollm2_heads/train.sh RUN_DIR
set -euo pipefail
run=${1:?usage: train.sh RUN_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$run" && cd "$run"
python "$here/prepare_data.py" --distilled 64 --original 1500
common=(--target smollm2-135m-instruct --data combined.jsonl --num-conversations 1564 --max-length 512
        --holdout 32 --feature-dtype bfloat16 --features "$run/features")
specprim train eagle3 "${common[@]}" --out "$run/eagle3" --features-only --threads 2
# EAGLE-3 (2 threads) and Medusa (1 thread) ran side by side.
specprim train eagle3 "${common[@]}" --out "$run/eagle3" --draft-vocab-size 8192 --steps 3 --epochs 3 \
    --lr 5e-4 --warmup-steps 30 --batch-tokens 4096 --mixed-precision bf16 --checkpoint-every 25 \
    --log-every 5 --eval-every 100 --threads 2 &
specprim train medusa "${common[@]}" --out "$run/medusa" --num-heads 4 --epochs 1 --max-steps 80 \
    --lr 1e-3 --warmup-steps 5 --batch-tokens 4096 --mixed-precision bf16 --checkpoint-every 10 \
    --log-every 5 --threads 1 &
wait
