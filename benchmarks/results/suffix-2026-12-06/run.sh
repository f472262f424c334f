#!/usr/bin/env bash
# Suffix decoding against prompt lookup, datastore lookup (REST: the shipped answers + ShareGPT) and plain generate, greedy, SmolLM2-135M-Instruct bf16, on a repetitive
# two-turn workload (code-edit: rewrite a HumanEval reference solution, then again with comments) and on MT-bench's
# two turns. One specprim bench run per dataset, methods interleaved; quiet machine. JSON next to this script.
set -euo pipefail
out="$(dirname "$0")"
common=(--target smollm2-135m-instruct --dtype bfloat16 --num-prompts 10 --max-new-tokens 128
        --method hf --method prompt-lookup --method suffix --method datastore
        --datastore smollm2-135m-instruct-answers --datastore sharegpt)
specprim bench "${common[@]}" --dataset code-edit --json "$out/code-edit.json"
specprim bench "${common[@]}" --dataset mt-bench --json "$out/mt-bench.json"
