#!/usr/bin/env bash
# Can the shipped EAGLE-3 head (1 decoder layer) and the same head grown to 2 layers fit the campaign's first
# self-distilled shard (149,770 tokens) when trained on it for 4 epochs at lr 3e-4? Training top-1 (per batch, in
# train/log.jsonl) against held-out top-1 (docs/studies/head_misses.py on the campaign's held-out shard) tells
# whether the head is short of capacity (it cannot fit even the data it sees) or of data (it fits, and does not
# generalise). Usage: bash overfit.sh OUT_DIR
set -euo pipefail
out=${1:?OUT_DIR}
features=campaigns/smollm2-eagle3/shards/00000/features
common=(--features "$features" --init-from smollm2-135m-instruct-eagle3 --epochs 4 --lr 3e-4 --warmup-steps 20
        --batch-tokens 4096 --max-length 1024 --mixed-precision bf16 --loss-on assistant --holdout 0 --threads 2
        --log-every 10 --checkpoint-every 50)
specprim train eagle3 --out "$out/layers1" "${common[@]}"
specprim train eagle3 --out "$out/layers2" --head-layers 2 "${common[@]}"
python docs/studies/head_misses.py --features campaigns/smollm2-eagle3/shards/holdout/features \
    --head "$out/layers1/run/head" --head "$out/layers2/run/head" --json "$out/misses.json"
