#!/usr/bin/env bash
# Lossless acceptance rules on a second dataset (GSM-symbolic, 40 prompts, seed 1), temperature 1, the same drafter
# and tree for every rule: token-level SpeculativeSampling against block verification (chains of 4 of the shipped
# EAGLE-3 head) and against traversal verification (sampled:3,2,1 trees). tau only: run beside other work, so the
# JSON's timings are not comparable (no plain-generate baseline here). Writes one JSON per run next to this script.
set -euo pipefail
out="$(dirname "$0")"
common=(--target smollm2-135m-instruct --dtype bfloat16 --turns 1 --num-prompts 40 --max-new-tokens 48
        --temperature 1 --seed 1 --method eagle3)
for dataset in gsm; do
  for rule in speculative block; do
    specprim bench "${common[@]}" --dataset "$dataset" --tree chain:4 --acceptance "$rule" \
      --json "$out/$dataset-chain4-$rule.json"
  done
  for rule in speculative traversal; do
    specprim bench "${common[@]}" --dataset "$dataset" --tree sampled:3,2,1 --acceptance "$rule" \
      --json "$out/$dataset-sampled321-$rule.json"
  done
done
