"""What concatenating linears saves in the compiled static verifier: an interleaved A/B in one process.

``specprim.hf.compiled_settings`` switches on inductor's ``cpp.enable_concat_linear``: under freezing, linears that
read the same input (a Llama layer's ``q/k/v`` and ``gate/up`` projections) become one matrix product each, 4
instead of 7 per layer. This script loads the target twice (so that each copy compiles its own graphs), compiles a
``StaticTarget`` for each with the pass on and off, checks that both pick the same tokens, and times verification of
1, 4, 8 and 16 tokens alternating between the two (the median of 6 rounds of 8 forwards each), so that the machine's
drift affects both alike. Compiling takes ~10 minutes on 2 cores.

    python benchmarks/concat_linear.py
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator

import torch
from torch._inductor import config as inductor_config

from specprim import DraftTree, models
from specprim.hf import StaticTarget, _static_target

SIZES = (1, 4, 8, 16)
_settings = _static_target.compiled_settings
_concat = {"on": True}


@contextlib.contextmanager
def _switchable_settings() -> Iterator[None]:
    """specprim's compiled settings with the concat-linear pass as ``_concat["on"]`` says."""
    with _settings(), inductor_config.patch({"cpp.enable_concat_linear": _concat["on"]}):
        yield


def verify_ms(verifier: StaticTarget, concat: bool, context: torch.Tensor, queries: int, repeats: int
              ) -> tuple[float, torch.Tensor]:
    """Mean milliseconds of verifying ``queries`` tokens (root + a chain) after ``context[:, :100]``, and the logits
    (1, queries, V) of the last forward."""
    _concat["on"] = concat
    past = 100
    tree = DraftTree(tokens=context[:, past + 1 : past + queries], parents=torch.arange(queries - 1) - 1)
    verifier.start(context[:, : past + 1])
    start = time.perf_counter()
    for _ in range(repeats):
        logits, _ = verifier.verify(context[:, past], tree)
        verifier.past_length = past
    return (time.perf_counter() - start) / repeats * 1000, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _static_target.compiled_settings = _switchable_settings  # StaticTarget looks it up at every call
    verifiers = {concat: StaticTarget(models.load(args.target, dtype=torch.bfloat16, pack=True)[0])
                 for concat in (False, True)}
    vocab = verifiers[False].vocab_size
    context = torch.randint(0, vocab, (1, 120), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    for queries in SIZES:
        logits = {concat: verify_ms(v, concat, context, queries, 1)[1] for concat, v in verifiers.items()}
        same = torch.equal(logits[False].argmax(-1), logits[True].argmax(-1))
        print(f"{queries} tokens: same argmax {same}, max |logit difference| "
              f"{(logits[False] - logits[True]).abs().max().item():.3g}")
    print(f"{args.target}, bfloat16, {args.threads} threads; compiled in {time.perf_counter() - start:.0f} s")
    times: dict[tuple[int, bool], list[float]] = {(q, c): [] for q in SIZES for c in (False, True)}
    for round_ in range(args.rounds):
        for queries in SIZES:
            for concat in (False, True) if round_ % 2 else (True, False):
                times[(queries, concat)].append(verify_ms(verifiers[concat], concat, context, queries, 8)[0])
    print("| tokens | separate linears ms | concatenated ms | ratio |")
    print("|---|---|---|---|")
    for queries in SIZES:
        separate, joined = statistics.median(times[(queries, False)]), statistics.median(times[(queries, True)])
        print(f"| {queries} | {separate:.1f} | {joined:.1f} | {joined / separate:.3f} |")


if __name__ == "__main__":
    main()
