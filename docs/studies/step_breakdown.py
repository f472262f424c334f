"""Where a speculative step's time goes: the target's forwards, the drafter's forwards, and everything else.

Times every call of the target model and of the draft modules with forward hooks (wall clock, so the numbers are
for the CPU; on CUDA they would need synchronisation) while ``speculative_generate`` runs, and prints the share of
the generation spent outside both: tree building, masks, acceptance, cache commits and bookkeeping.

    python docs/studies/step_breakdown.py --method eagle3 --head smollm2-135m-instruct-eagle3 \
        --tree dynamic:depth=1,top_k=4,budget=4 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time

import torch

from specprim import models, presets
from specprim.bench import load_dataset
from specprim.hf import chat_input_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ForwardTimer:
    """Adds up the wall time of every call of the given modules (outermost calls only)."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._start = 0.0
        self._handles = []
        for module in modules:
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._leave))

    def _enter(self, *_: object) -> None:
        if self._depth == 0:
            self._start = time.perf_counter()
        self._depth += 1

    def _leave(self, *_: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._start


def draft_modules(drafter: object, target: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules a tree drafter runs: an EAGLE / Medusa / MTP head's children, or a draft LM."""
    model = getattr(drafter, "model", None)
    for attribute in ("head", "heads", "model"):
        module = getattr(model, attribute, None)
        if isinstance(module, torch.nn.Module) and module is not target:
            return [m for m in module.children() if m is not target] or [module]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--method", default="eagle3")
    parser.add_argument("--head", default="smollm2-135m-instruct-eagle3")
    parser.add_argument("--draft")
    parser.add_argument("--tree")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = models.load(args.target, dtype=DTYPES[args.dtype])
    draft = models.load(args.draft, dtype=DTYPES[args.dtype])[0] if args.draft else None
    method = presets.from_name(args.method, target=target, draft=draft, head=args.head, tree=args.tree)
    prompts = [chat_input_ids(tokenizer, p.turns[0]) for p in load_dataset("mt-bench", args.num_prompts)]
    method.generate(target, prompts[0], max_new_tokens=8)  # warm-up
    target_timer = ForwardTimer([target])
    draft_timer = ForwardTimer(draft_modules(method.drafter, target))
    total = tokens = steps = 0.0
    for ids in prompts:
        start = time.perf_counter()
        out = method.generate(target, ids, max_new_tokens=args.max_new_tokens, eos_token_id=tokenizer.eos_token_id)
        total += time.perf_counter() - start
        tokens, steps = tokens + out.stats.new_tokens, steps + out.stats.steps
    outside = total - target_timer.seconds - draft_timer.seconds
    print(f"{args.method} tree={args.tree or 'default'} {args.dtype} {args.threads} threads: {tokens:.0f} tokens, "
          f"{steps:.0f} steps, tau {tokens / steps:.2f}, {tokens / total:.1f} tok/s")
    print(f"per step: target forwards {1e3 * target_timer.seconds / steps:.1f} ms, draft forwards "
          f"{1e3 * draft_timer.seconds / steps:.1f} ms, outside both {1e3 * outside / steps:.1f} ms "
          f"({100 * outside / total:.1f} % of the time, prefills included in the forwards)")


if __name__ == "__main__":
    main()
