"""What one forward of the target costs, by number of query tokens, for a choice of kernels: stock, packed, compiled
(``torch.compile`` of the model's forward, dynamic shapes) or static (a compiled ``specprim.hf.StaticTarget``: static
cache, padded to 2 / 4 / 16 tokens for 1 / 4 / 16 query tokens).

Prefills a random 100-token context once per setting, then times forwards of 1, 4 and 16 new tokens (a 4D mask for
more than one, as tree verification passes) over three context lengths, cropping the cache back after each. The
ratio of a 16-token forward to a one-token step is what bounds speculation on the machine (see docs/speedup.md).

    python docs/studies/forward_costs.py --kernels packed      # also: stock, compiled, static (minutes of compiling)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache

from specprim import DraftTree, models
from specprim.hf import StaticTarget

QUERIES = (1, 4, 16)


def forward_ms(
    model: torch.nn.Module, context: torch.Tensor, past: int, queries: int, repeats: int, *, best: bool = False
) -> float:
    """Mean (``best``: fastest) milliseconds of a ``queries``-token forward after ``past`` cached tokens of
    ``context`` (1, T)."""
    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, model.config.vocab_size, (1, queries), generator=torch.Generator().manual_seed(past))
    mask = torch.ones(1, 1, queries, past + queries, dtype=torch.bool) if queries > 1 else None
    positions = torch.arange(past, past + queries).view(1, -1)  # (1, Q)
    with torch.no_grad():
        model(input_ids=context[:, :past], past_key_values=cache, use_cache=True)

        def run() -> None:
            model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
            cache.crop(-queries)

        return _timed_ms(run, repeats, best)


def static_forward_ms(
    verifier: StaticTarget, context: torch.Tensor, past: int, queries: int, repeats: int, *, best: bool = False
) -> float:
    """Like :func:`forward_ms`, through ``verifier``: ``queries`` tokens are the root and a chain of ``queries - 1``
    draft nodes; the verifier's length is reset after each forward."""
    tokens = torch.randint(0, verifier.vocab_size, (1, queries - 1), generator=torch.Generator().manual_seed(past))
    tree = DraftTree(tokens=tokens, parents=torch.arange(queries - 1) - 1)
    verifier.start(context[:, : past + 1])  # the cache holds `past` tokens; context[past] is the root

    def run() -> None:
        verifier.verify(context[:, past], tree)
        verifier.past_length = past  # drop the verified tokens

    return _timed_ms(run, repeats, best)


def _timed_ms(run: Callable[[], None], repeats: int, best: bool) -> float:
    """Milliseconds per call of ``run`` over ``repeats`` calls: the mean, or with ``best`` the fastest call."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return (min(times) if best else sum(times) / repeats) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--kernels", choices=["stock", "packed", "compiled", "static"], default="packed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = models.load(args.target, dtype=torch.bfloat16, pack=args.kernels == "packed",
                           compile=args.kernels == "compiled")
    context = torch.randint(0, model.config.vocab_size, (1, 100), generator=torch.Generator().manual_seed(0))
    measure = forward_ms
    if args.kernels == "static":
        verifier = StaticTarget(model)

        def measure(_model, context, past, queries, repeats):  # noqa: ANN001, ANN202 - forward_ms's signature
            return static_forward_ms(verifier, context, past, queries, repeats)
    start = time.perf_counter()
    for past in (60, 80):  # warm-up: compiles every kind of forward, creates the oneDNN primitives
        for queries in QUERIES:
            measure(model, context, past, queries, repeats=1)
    print(f"{args.target}, bfloat16, {args.kernels} kernels, {args.threads} threads; warm-up "
          f"{time.perf_counter() - start:.0f} s")
    print("| context | " + " | ".join(f"{q} token(s) ms" for q in QUERIES) + " | 16 / 1 |")
    print("|---" * (len(QUERIES) + 2) + "|")
    for past in (70, 90, 95):
        ms = [measure(model, context, past, q, args.repeats) for q in QUERIES]
        print(f"| {past} | " + " | ".join(f"{m:.1f}" for m in ms) + f" | {ms[-1] / ms[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
