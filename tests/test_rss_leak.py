"""No leak: the process's resident set stays flat over 200 consecutive ``speculative_generate`` calls on a tiny
random model (prompt lookup, an EAGLE-3 head), and the same measurement catches a drafter that leaks."""

from __future__ import annotations

import gc
from collections.abc import Callable

import psutil
import pytest
import torch
from _tiny import tiny_causal_lm
from test_eagle import make_head

from specprim import speculative_generate
from specprim._types import DraftRequest, DraftTree, Verdict
from specprim.acceptance import Greedy
from specprim.drafters import PromptLookup, eagle_drafter
from specprim.trees import DynamicTree

PROMPT = torch.tensor([[3, 9, 4, 9, 4, 17, 3, 9, 4, 22, 8, 3, 9]])
NEW_TOKENS = 4
WARMUP_CALLS = 20
CALLS = 200
MAX_GROWTH = 20 * 2**20  # bytes of RSS growth tolerated over CALLS calls after the warm-up (allocator noise)
LEAK_PER_PROPOSE = 64 * 2**10  # bytes the leaking drafter keeps per step (several steps per call)

_LEAKED: list[torch.Tensor] = []


class LeakingDrafter:
    """Wraps a drafter and keeps a filled 64 KiB tensor in a global list at every step (a deliberate leak)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def propose(self, request: DraftRequest) -> DraftTree:
        _LEAKED.append(torch.ones(LEAK_PER_PROPOSE // 4))  # float32, pages touched
        return self.inner.propose(request)

    def observe(self, verdict: Verdict) -> None:
        self.inner.observe(verdict)


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def rss_growth(call: Callable[[], object]) -> int:
    """RSS after ``CALLS`` calls of ``call`` minus RSS after ``WARMUP_CALLS`` calls, in bytes."""
    for _ in range(WARMUP_CALLS):
        call()
    before = _rss()
    for _ in range(CALLS):
        call()
    return _rss() - before


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama")


DRAFTERS = {
    "prompt-lookup": lambda target: PromptLookup(),
    "eagle3": lambda target: eagle_drafter(make_head(target, 3), DynamicTree(depth=2, top_k=2, budget=4)),
}


def _generate(target, drafter) -> Callable[[], object]:
    return lambda: speculative_generate(target, PROMPT, drafter=drafter, acceptance=Greedy(),
                                        max_new_tokens=NEW_TOKENS)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_rss_flat_over_200_generate_calls(target, name):
    growth = rss_growth(_generate(target, DRAFTERS[name](target)))
    print(f"{name}: RSS growth {growth / 2**20:.2f} MiB")
    assert growth < MAX_GROWTH, f"{name}: RSS grew {growth / 2**20:.1f} MiB over {CALLS} calls"


def test_measurement_catches_a_leaking_drafter(target):
    _LEAKED.clear()
    try:
        growth = rss_growth(_generate(target, LeakingDrafter(PromptLookup())))
        leaked = len(_LEAKED) * LEAK_PER_PROPOSE * CALLS // (WARMUP_CALLS + CALLS)  # kept after the warm-up
    finally:
        _LEAKED.clear()
    assert leaked > 2 * MAX_GROWTH  # the leak is large enough for the bound to matter
    print(f"leaking drafter: RSS growth {growth / 2**20:.2f} MiB, leaked {leaked / 2**20:.1f} MiB")
    assert growth >= MAX_GROWTH, f"a {leaked / 2**20:.0f} MiB leak went unnoticed ({growth / 2**20:.1f} MiB)"
