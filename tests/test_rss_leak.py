"""No leak: the process's resident set stays flat over 200 consecutive ``speculative_generate`` calls on a tiny
random model (prompt lookup, an EAGLE-3 head), and the same measurement catches a drafter that leaks.

Each measurement runs in a fresh Python process: inside the test process, pages that earlier tests freed stay
resident and absorb new allocations, so a real leak could show no RSS growth at all."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

PROMPT = [[3, 9, 4, 9, 4, 17, 3, 9, 4, 22, 8, 3, 9]]
NEW_TOKENS = 4
WARMUP_CALLS = 20
CALLS = 200
MAX_GROWTH = 20 * 2**20  # bytes of RSS growth tolerated over CALLS calls after the warm-up (allocator noise)
LEAK_PER_PROPOSE = 64 * 2**10  # bytes the leaking drafter keeps per step (several steps per call)
TESTS_DIR = Path(__file__).resolve().parent

_LEAKED: list = []


class LeakingDrafter:
    """Wraps a drafter and keeps a filled 64 KiB tensor in a global list at every step (a deliberate leak)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def propose(self, request):
        import torch

        _LEAKED.append(torch.ones(LEAK_PER_PROPOSE // 4))  # float32, pages touched
        return self.inner.propose(request)

    def observe(self, verdict) -> None:
        self.inner.observe(verdict)


def _rss() -> int:
    import psutil

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


def _drafter(name: str, target):
    from test_eagle import make_head

    from specprim.drafters import PromptLookup, eagle_drafter
    from specprim.trees import DynamicTree

    if name == "prompt-lookup":
        return PromptLookup()
    if name == "eagle3":
        return eagle_drafter(make_head(target, 3), DynamicTree(depth=2, top_k=2, budget=4))
    if name == "leaking":
        return LeakingDrafter(PromptLookup())
    raise ValueError(f"unknown drafter {name!r}")


def measure(name: str) -> tuple[int, int]:
    """(RSS growth, bytes deliberately leaked after the warm-up) of ``CALLS`` generate calls with drafter ``name``,
    in this process (run it in a fresh one: see ``_measure_in_fresh_process``)."""
    import torch
    from _tiny import tiny_causal_lm

    from specprim import speculative_generate
    from specprim.acceptance import Greedy

    torch.set_num_threads(1)
    target = tiny_causal_lm("llama")
    drafter = _drafter(name, target)
    prompt = torch.tensor(PROMPT)
    growth = rss_growth(lambda: speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(),
                                                     max_new_tokens=NEW_TOKENS))
    leaked = len(_LEAKED) * LEAK_PER_PROPOSE * CALLS // (WARMUP_CALLS + CALLS)  # kept after the warm-up
    return growth, leaked


def _measure_in_fresh_process(name: str) -> tuple[int, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    growth, leaked = done.stdout.split()[-2:]
    return int(growth), int(leaked)


@pytest.mark.parametrize("name", ["prompt-lookup", "eagle3"])
def test_rss_flat_over_200_generate_calls(name):
    growth, _ = _measure_in_fresh_process(name)
    print(f"{name}: RSS growth {growth / 2**20:.2f} MiB")
    assert growth < MAX_GROWTH, f"{name}: RSS grew {growth / 2**20:.1f} MiB over {CALLS} calls"


def test_measurement_catches_a_leaking_drafter():
    growth, leaked = _measure_in_fresh_process("leaking")
    assert leaked > 2 * MAX_GROWTH  # the leak is large enough for the bound to matter
    print(f"leaking drafter: RSS growth {growth / 2**20:.2f} MiB, leaked {leaked / 2**20:.1f} MiB")
    assert growth >= MAX_GROWTH, f"a {leaked / 2**20:.0f} MiB leak went unnoticed ({growth / 2**20:.1f} MiB)"


if __name__ == "__main__":  # one measurement, printed as "growth leaked" on the last line
    print(*measure(sys.argv[1]))
