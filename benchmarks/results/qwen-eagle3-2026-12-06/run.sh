#!/usr/bin/env bash
# The EAGLE-3 head of campaigns/qwen-coder-1.5b-eagle3 for Qwen2.5-Coder-1.5B-Instruct against the 0.5B draft model
# (ours: `leviathan`; Hugging Face assisted generation: `hf-assisted`) and plain `generate`, on HumanEval first
# turns, greedy, in one run on a quiet machine (every other process stopped); bf16 where the machine computes it
# natively, else fp32 (or DTYPE=...).
# Usage: [DTYPE=bfloat16] bash run.sh [HEAD_DIR] [OUT_JSON]   (default: the campaign's latest head; measured
# 2026-12-06: a copy of it at step 256, 813,996 tokens trained)
set -euo pipefail
out="$(dirname "$0")"
head=${1:-campaigns/qwen-coder-1.5b-eagle3/train/head}
json=${2:-$out/humaneval.json}
dtype=${DTYPE:-$(python -c "from specprim.models import native_dtype; print(native_dtype())")}
specprim bench --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --head "$head" \
  --dtype "$dtype" --dataset humaneval --turns 1 --num-prompts 5 --max-new-tokens 64 \
  --method hf --method hf-assisted --method leviathan --method eagle3 --json "$json"
