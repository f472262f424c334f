#!/usr/bin/env bash
# The README speed table's first row, re-measured after the architecture changes (same command as the table).
set -euo pipefail
out="$(dirname "$0")"
specprim bench --target smollm2-135m-instruct --dataset mt-bench --turns 1 --max-new-tokens 128 \
               --dtype bfloat16 --method hf --method hf-prompt-lookup --method auto --json "$out/mt-bench80-greedy.json"
