"""Prefill of an int4 target: one eager forward over the prompt against the compiled chunks ``StaticTarget`` uses.

``StaticTarget`` prefills a compiled int4 target in forwards of 64 padded tokens (its default ``prefill_chunk``)
through its compiled forward, since the eager int4 kernel costs about one more one-token forward per few rows. This
script loads SmolLM2-135M-Instruct with int4 weights (bf16, LM head packed) twice, builds a ``StaticTarget`` on each
(one with ``prefill_chunk=0``: the eager prefill), checks that both leave caches that score the next token alike, and
times ``start`` on the first MT-bench questions' chat prompts, alternating between the two (median of 5 rounds).

    python docs/studies/int4_prefill.py [--num-prompts 10]
    python docs/studies/int4_prefill.py --weights bf16  # packed bf16 weights, chunks of 64 tokens as well
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specprim import DraftTree, models
from specprim.bench import load_dataset
from specprim.hf import StaticTarget, chat_input_ids


def start_ms(verifier: StaticTarget, ids: torch.Tensor) -> float:
    begin = time.perf_counter()
    verifier.start(ids)
    return (time.perf_counter() - begin) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--weights", choices=["int4", "bf16"], default="int4",
                        help="int4 (LM head packed bf16) or packed bf16 weights")
    args = parser.parse_args()
    torch.set_num_threads(2)
    weights = {"quantize": "int4"} if args.weights == "int4" else {}
    target, tokenizer = models.load("smollm2-135m-instruct", dtype=torch.bfloat16, pack=True, **weights)
    prompts = [chat_input_ids(tokenizer, p.turns[0]) for p in load_dataset("mt-bench")[: args.num_prompts]]
    cache = max(p.shape[1] for p in prompts) + 64
    eager = StaticTarget(target, min_cache_length=cache, prefill_chunk=0)
    chunked = StaticTarget(models.load("smollm2-135m-instruct", dtype=torch.bfloat16, pack=True, **weights)[0],
                           min_cache_length=cache)  # the default for compiled bf16 / int4: chunks of 64
    empty = DraftTree(tokens=torch.zeros(1, 0, dtype=torch.long), parents=torch.zeros(0, dtype=torch.long))
    for ids in prompts:  # compiles the chunk's graph and the one-token verification
        scores = []
        for verifier in (eager, chunked):
            verifier.start(ids)
            scores.append(verifier.verify(ids[0, -1:], empty)[0][0, -1])
        print(f"{ids.shape[1] - 1} prompt tokens: same next token {bool(scores[0].argmax() == scores[1].argmax())}, "
              f"max |logit difference| {(scores[0] - scores[1]).abs().max().item():.3g}")
    times: dict[str, list[float]] = {"eager": [], "chunked": []}
    for round_ in range(args.rounds):
        order = (("eager", eager), ("chunked", chunked))
        for name, verifier in order if round_ % 2 else order[::-1]:
            times[name].append(sum(start_ms(verifier, ids) for ids in prompts) / len(prompts))
    tokens = statistics.mean(p.shape[1] - 1 for p in prompts)
    eager_ms, chunked_ms = statistics.median(times["eager"]), statistics.median(times["chunked"])
    print(f"smollm2-135m-instruct {args.weights}, 2 threads, {len(prompts)} prompts of {tokens:.0f} tokens on average: "
          "prefill "
          f"{eager_ms:.1f} ms eager, {chunked_ms:.1f} ms in compiled chunks of {chunked.prefill_chunk} "
          f"({chunked_ms / eager_ms:.2f}x)")


if __name__ == "__main__":
    main()
