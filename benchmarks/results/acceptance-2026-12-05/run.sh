#!/usr/bin/env bash
# Lossless acceptance rules on the same drafter and tree, temperature 1: token-level SpeculativeSampling against
# block verification (chains of the shipped EAGLE-3 head) and traversal verification (sampled trees of the head).
# Every run has the same prompts, seed and plain-generate baseline. Writes one JSON per run next to this script.
set -euo pipefail
out="$(dirname "$0")"
common=(--target smollm2-135m-instruct --dtype bfloat16 --turns 1 --num-prompts 10 --max-new-tokens 48
        --temperature 1 --seed 0 --method hf --method eagle3)
for dataset in mt-bench; do
  for rule in speculative block; do
    specprim bench "${common[@]}" --dataset "$dataset" --tree chain:4 --acceptance "$rule" \
      --json "$out/$dataset-chain4-$rule.json"
  done
  for rule in speculative traversal; do
    specprim bench "${common[@]}" --dataset "$dataset" --tree sampled:3,2,1 --acceptance "$rule" \
      --json "$out/$dataset-sampled321-$rule.json"
  done
done
