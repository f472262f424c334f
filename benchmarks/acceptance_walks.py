"""What one ``SpeculativeSampling`` call costs per walk, on one row of SmolLM2's vocabulary (49,152 tokens).

A root with 3 siblings, for deterministic (top-k) and without-replacement (sampled) drafts, with a draft ``q`` far
from the target ``p`` (every sibling rejected: the worst case) and close to it (mostly accepted). Each case is timed
through the general walk (``_walk``, the rule as stated) and through the walk ``SpeculativeSampling`` takes for it
(the same verdicts, tested in tests/test_acceptance.py), one thread, interleaved:

    python benchmarks/acceptance_walks.py [--trials 100]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from specprim import DraftTree
from specprim.acceptance import SpeculativeSampling
from specprim.acceptance._base import TreeTables

VOCAB = 49_152
SIBLINGS = 3


def problem(sampling: str, close: bool, generator: torch.Generator) -> tuple[torch.Tensor, DraftTree]:
    """p (1, 4, V) and a tree of 3 root children drawn from q (q's rows below the root are unused zeros)."""
    logits = torch.randn(1, SIBLINGS + 1, VOCAB, generator=generator) * 3
    noise = torch.randn(1, SIBLINGS + 1, VOCAB, generator=generator)
    p = logits.softmax(-1)
    q = (logits + 0.5 * noise).softmax(-1) if close else (3 * noise).softmax(-1)
    q[:, 1:] = 0
    tokens = torch.multinomial(q[0, 0], SIBLINGS, generator=generator).unsqueeze(0)  # (1, 3) distinct
    sampled_q = None if sampling == "deterministic" else q
    return p, DraftTree(tokens=tokens, parents=torch.full((SIBLINGS,), -1), q=sampled_q, sampling=sampling)


def mean_ms(call: Callable[[], object], repeats: int = 5) -> float:
    call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100, help="random problems per case")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rule = SpeculativeSampling()
    generator = torch.Generator().manual_seed(0)
    print("| drafts | q vs p | general walk ms | taken walk ms |\n|---|---|---|---|")
    for sampling in ("deterministic", "without_replacement"):
        for close in (False, True):
            general, taken = [], []
            for _ in range(args.trials):
                p, tree = problem(sampling, close, generator)
                tables = TreeTables.of(tree, p.device)
                general.append(mean_ms(lambda: rule._walk(p, tree, tables, generator)))  # noqa: B023 - used at once
                taken.append(mean_ms(lambda: rule(p, tree, generator)))  # noqa: B023
            label = "close (mostly accepted)" if close else "far (all rejected)"
            print(f"| {sampling} | {label} | {sum(general) / len(general):.2f} | {sum(taken) / len(taken):.2f} |")


if __name__ == "__main__":
    main()
