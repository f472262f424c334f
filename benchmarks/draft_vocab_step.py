"""What one draft step of a small language model costs with its whole LM head and with reduced draft vocabularies
(``ModelDrafter(..., d2t=...)``, see docs/generate.md).

Loads the draft in bfloat16 with packed weights, feeds a random 300-token context once per setting, then times
one-node ``extend`` calls (a chain step), the settings interleaved round by round; prints the median.

    python benchmarks/draft_vocab_step.py --draft qwen2.5-coder-0.5b-instruct --sizes 16384 32768 65536
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specprim import models
from specprim.drafters import DraftRequest, lm_draft_vocab
from specprim.hf import LMDraftModel
from specprim.sampling import SamplingConfig


def step_ms(draft: LMDraftModel, steps: int) -> float:
    """Mean milliseconds of a one-node ``extend`` (the scratch node is dropped by the next ``begin``)."""
    token = torch.tensor([[7]])
    start = time.perf_counter()
    for _ in range(steps):
        draft.extend(torch.tensor([-1]), token)
        draft._drop_scratch()
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 32768, 65536])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = models.load(args.draft, dtype=torch.bfloat16, pack=True)
    settings = {"whole head": LMDraftModel(model)}
    settings.update({f"{size} ids": LMDraftModel(model, d2t=lm_draft_vocab(model, size)) for size in args.sizes})
    context = torch.randint(0, 30000, (1, 300), generator=torch.Generator().manual_seed(0))
    request = DraftRequest(input_ids=context, sampling=SamplingConfig(temperature=0.0),
                           vocab_size=settings["whole head"].vocab_size, max_depth=1)
    for draft in settings.values():
        draft.begin(request)
        step_ms(draft, 2)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in settings}
    for round_ in range(args.rounds):
        for name in list(settings)[:: 1 if round_ % 2 else -1]:
            times[name].append(step_ms(settings[name], 5))
    print(f"{args.draft}, bfloat16, packed, {args.threads} threads, 300-token context; one-node draft step, median "
          f"of {args.rounds} interleaved rounds")
    print("| draft vocabulary | ms per step |")
    print("|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} |")


if __name__ == "__main__":
    main()
