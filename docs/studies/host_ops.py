"""Per-step operations over one vocabulary-wide row, timed against the plainer way to write them.

A step of the greedy union reads a few (1, V) float32 rows: the target's argmax for acceptance, and the head's best
child for the draft tree. On CPU, ``torch.argmax`` and a ``topk`` of one run several times slower than ``max``,
which returns the same first maximal index; this script times each pair side by side (median of ``--rounds``
rounds of ``--calls`` calls each) so that the choice in ``specprim.sampling.argmax`` and ``DynamicTree`` can be
rechecked on other machines.

    python docs/studies/host_ops.py [--vocab 49152] [--rows 1 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from specprim.sampling import argmax


def _median_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    for _ in range(calls):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times) * 1e6


def _pairs(logits: torch.Tensor) -> dict[str, tuple[Callable[[], object], ...]]:
    """Each operation on (P, V) ``logits``, as (plain torch, the way specprim writes it)."""
    return {
        "argmax": (lambda: torch.argmax(logits, -1), lambda: argmax(logits)),
        "best child (log-softmax, top 1)": (  # DynamicTree's best child: log-softmax, then max instead of topk(1)
            lambda: logits.log_softmax(-1).clamp(max=0.0).topk(1, dim=-1),
            lambda: logits.float().log_softmax(-1).max(-1, keepdim=True),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=49152, help="row width (SmolLM2: 49152)")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="finite entries per row, the rest -inf")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocab {args.vocab}")
    print("| operation | rows | plain us | specprim us | ratio |")
    print("|---|---|---|---|---|")
    for rows in args.rows:
        logits = torch.randn(rows, args.vocab)  # (P, V)
        logits[:, args.draft_vocab :] = float("-inf")  # the head's logits outside its draft vocabulary
        for name, (plain, ours) in _pairs(logits).items():
            before = _median_us(plain, args.calls, args.rounds)
            after = _median_us(ours, args.calls, args.rounds)
            print(f"| {name} | {rows} | {before:.1f} | {after:.1f} | {after / before:.2f}x |")


if __name__ == "__main__":
    main()
