#!/usr/bin/env bash
# Lossless acceptance rules on a second dataset and a second drafter, temperature 1, the same drafter and tree for
# every rule, each against plain `generate` (`--method hf`) measured in the same quiet window (every other process
# stopped). Writes one JSON per run next to this script.
#   GSM-symbolic, 40 prompts, seed 1: the shipped EAGLE-3 head of SmolLM2-135M-Instruct, token-level
#     SpeculativeSampling against block verification (chains of 4) and traversal verification (sampled:3,2,1 trees).
#   HumanEval, 20 prompts, seed 1: Qwen2.5-Coder-1.5B-Instruct drafted by Qwen2.5-Coder-0.5B-Instruct, chains of 4,
#     SpeculativeSampling against block verification (the plain baseline in the first run only: it does not change).
set -euo pipefail
out="$(dirname "$0")"
common=(--target smollm2-135m-instruct --dtype bfloat16 --turns 1 --num-prompts 40 --max-new-tokens 48
        --temperature 1 --seed 1 --method hf --method eagle3)
for rule in speculative block; do
  specprim bench "${common[@]}" --dataset gsm --tree chain:4 --acceptance "$rule" --json "$out/gsm-chain4-$rule.json"
done
for rule in speculative traversal; do
  specprim bench "${common[@]}" --dataset gsm --tree sampled:3,2,1 --acceptance "$rule" \
    --json "$out/gsm-sampled321-$rule.json"
done
qwen=(--target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --dtype bfloat16 --turns 1
      --num-prompts 20 --max-new-tokens 48 --temperature 1 --seed 1 --dataset humaneval --tree chain:4)
specprim bench "${qwen[@]}" --method hf --method leviathan --acceptance speculative \
  --json "$out/humaneval-qwen-chain4-speculative.json"
specprim bench "${qwen[@]}" --method leviathan --acceptance block --json "$out/humaneval-qwen-chain4-block.json"
