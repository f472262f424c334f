"""``llama-cpp`` and ``llama-cpp-prompt-lookup``: llama.cpp on the same GGUF file, as benchmark baselines.

Optional: they need ``llama-cpp-python`` (``pip install llama-cpp-python``, built from source, 5-20 minutes on two
cores). On a CPU with AMX, a native build's AMX matrix product can crash on multi-token batches (seen here: a
segmentation fault in ``ggml_backend_amx_mul_mat`` during the prefill, even with ``use_extra_bufts=False``); then build
it without AMX, keeping the AVX-512 kernels (see ``docs/bench.md``). llama.cpp runs in a worker process
(``specprim.bench._llama_worker``) that loads the model once and decodes greedily on request; the harness times each
request around the pipe round trip. llama.cpp computes with the GGUF's own quantized weights and its own kernels, while
specprim and ``hf`` run the de-quantized checkpoint (with ``--quantize int4``, its ``Q4_1`` layers re-encoded as 4-bit
groups, but bf16 activations), so outputs are expected to differ (``identical`` compares them all the same).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch

from specprim.bench._methods import Decoding, Generation

LLAMA_PROMPT_LOOKUP_TOKENS = 8  # specprim's PromptLookup default


def llama_cpp_installed() -> bool:
    """Whether ``llama_cpp`` can be imported (checked without importing it into this process)."""
    return importlib.util.find_spec("llama_cpp") is not None


@dataclasses.dataclass(kw_only=True)
class LlamaCppGenerate:
    """Greedy decoding by llama.cpp in a worker process on ``gguf``; ``prompt_lookup`` > 0 adds its prompt-lookup
    drafting with that many tokens. Raises ``ValueError`` without ``llama-cpp-python`` or for sampling."""

    gguf: Path
    threads: int = dataclasses.field(default_factory=torch.get_num_threads)
    prompt_lookup: int = 0
    _worker: subprocess.Popen | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not llama_cpp_installed():
            raise ValueError("the llama-cpp baselines need llama-cpp-python: pip install llama-cpp-python")

    @property
    def draft_modules(self) -> tuple[torch.nn.Module, ...]:
        return ()

    def generate(self, input_ids: torch.Tensor, decoding: Decoding, seed: int) -> Generation:
        if not decoding.greedy:
            raise ValueError("the llama-cpp baselines decode greedily only; use temperature 0")
        eos = decoding.eos_token_id
        stops = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        reply = self._ask({"ids": input_ids[0].tolist(), "max_new_tokens": decoding.max_new_tokens, "eos": stops})
        return Generation(new_ids=torch.tensor(reply["new_ids"], dtype=torch.long), stats=None)

    def _ask(self, request: dict) -> dict:
        worker = self._start()
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(json.dumps(request) + "\n")
        worker.stdin.flush()
        line = worker.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker exited (code {worker.poll()}); run it by hand to see why: "
                               f"{' '.join(self._command())}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama.cpp failed: {reply['error']}")
        return reply

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "specprim.bench._llama_worker", str(self.gguf), "--threads", str(self.threads),
                "--prompt-lookup", str(self.prompt_lookup)]

    def _start(self) -> subprocess.Popen:
        if self._worker is None or self._worker.poll() is not None:
            self._worker = subprocess.Popen(self._command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            atexit.register(self._worker.kill)
            assert self._worker.stdout is not None
            ready = self._worker.stdout.readline()
            if not ready:
                raise RuntimeError(f"the llama.cpp worker could not load {self.gguf}: {' '.join(self._command())}")
        return self._worker
