#!/bin/sh
# The shipped greedy and temperature-1 recipes' tuning commands (docs/speed.md) with the head now at
# specprim/models/heads/smollm2-135m-instruct-eagle3, against plain model.generate: sh speed.sh LABEL [OUT_DIR]
# (OUT_DIR: where the JSON goes; this directory by default)
set -e
out=${2:-$(dirname "$0")}
common="--target smollm2-135m-instruct --dataset mt-bench --num-prompts 10 --turns 1 --max-new-tokens 128
        --dtype bfloat16 --pack --static-verify --static-draft --warmup-tokens 128 --head smollm2-135m-instruct-eagle3"
specprim bench $common --tree dynamic:depth=1,top_k=1,budget=1 --num-draft 3 --max-nodes 3 \
    --datastore smollm2-135m-instruct-answers --datastore sharegpt \
    --method hf-unpacked --method eagle3+prompt-lookup+datastore --json "$out/speed-greedy-$1.json"
specprim bench $common --tree sampled:3 --method hf-unpacked --method eagle3 --temperature 1 \
    --json "$out/speed-sampled-$1.json"
