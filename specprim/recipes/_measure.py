"""``auto`` for a target no recipe ships for: measure the training-free candidates here, keep the fastest.

Each candidate recipe (eager verification, so nothing compiles) decodes a few calibration prompts with the
decoding mode's sampling; plain ``model.generate`` (stock kernels, the same weights) decodes the same prompts; the
measured tokens-per-second ratio is the candidate's speedup. The choice is cached as JSON under
``cache_dir() / "auto"``, keyed by the target (its path and config), the dtype, the decoding mode, the machine
(CPU or GPU name, thread count) and the torch and specprim versions, so the next run on this machine reads it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from specprim import models
from specprim.hf import chat_input_ids
from specprim.recipes._build import load_draft
from specprim.recipes._recipe import Recipe

logger = logging.getLogger(__name__)

CANDIDATES = (
    Recipe(method="prompt-lookup"),
    Recipe(method="prompt-lookup+datastore", datastores=("sharegpt",)),
    Recipe(method="suffix"),
)
"""The training-free lossless drafters ``auto`` measures for an unknown target (dtype and packing are set per
machine): prompt lookup, alone and joined by the ShareGPT datastore, and suffix decoding."""

CALIBRATION_PROMPTS = (
    "Explain how a refrigerator keeps food cold, in a short paragraph.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarize the plot of a story about a lighthouse keeper who finds a message in a bottle.",
    "A train leaves at 3 pm and travels 180 km at 60 km/h. When does it arrive? Explain step by step.",
)
"""Open prompts of four kinds (explanation, code, story, arithmetic), written for this measurement only: no
benchmark's questions."""

MAX_NEW_TOKENS = 48


@dataclasses.dataclass(frozen=True)
class Measured:
    """One candidate's measurement: its ``recipe``, ``tau`` and measured ``speedup`` over plain ``generate``."""

    recipe: Recipe
    tau: float
    speedup: float


def default_dtype() -> str:
    """``bfloat16`` where this machine computes it natively, as the shipped recipes run; else ``float32``
    (:func:`specprim.models.native_dtype`)."""
    return models.native_dtype()


def machine_key() -> dict[str, Any]:
    """What makes a measurement specific to this machine and software."""
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = _cpu_name() or platform.processor() or platform.machine()
    return {"device": device, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "specprim": importlib.metadata.version("specprim")}


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def cache_path(target: str | os.PathLike[str], config: Any, dtype: str, mode: str) -> Path:
    """Where the measured choice for ``target`` (its ``config``: a ``PretrainedConfig``) is cached."""
    key = {"target": os.fspath(target), "config": config.to_json_string(use_diff=False), "dtype": dtype,
           "mode": mode, **machine_key()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = Path(os.fspath(target)).name or "model"
    return cache_root() / f"{name}-{mode}-{digest}.json"


def cache_root() -> Path:
    """The directory of measured choices: ``cache_dir() / "auto"``."""
    return models.cache_dir() / "auto"


def candidates_for(target: str, dtype: str) -> list[Recipe]:
    """:data:`CANDIDATES` in ``dtype``, packed where that is bfloat16 on a CPU that packs it
    (:func:`specprim.models.packing_supported`: the same numbers, faster kernels);
    for a known model with a draft partner (:attr:`specprim.models.EmbeddedModel.draft`) also ``leviathan`` with
    it (a chain of 4 from the draft model)."""
    pack = dtype == "bfloat16" and not torch.cuda.is_available() and models.packing_supported()
    candidates = list(CANDIDATES)
    known = models.KNOWN_MODELS.get(target)
    if known is not None and known.draft is not None:
        candidates.append(Recipe(method="leviathan", draft=known.draft))
    return [dataclasses.replace(c, dtype=dtype, pack=pack) for c in candidates]


def measure(
    model: torch.nn.Module, tokenizer: Any, candidates: list[Recipe], *, temperature: float = 0.0,
    prompts: tuple[str, ...] = CALIBRATION_PROMPTS, max_new_tokens: int = MAX_NEW_TOKENS,
) -> list[Measured]:
    """Decode ``prompts`` with plain ``model.generate`` and with every candidate (all built on ``model``, loaded
    in the candidates' dtype and packing; a candidate's draft model is loaded the same way), and measure each
    candidate's tokens-per-second ratio to plain."""
    inputs = [chat_input_ids(tokenizer, prompt) for prompt in prompts]
    eos = tokenizer.eos_token_id

    def plain(ids: torch.Tensor, tokens: int) -> int:
        out = plain_generate(model, ids, tokens, temperature=temperature, eos_token_id=eos)
        return out.shape[1] - ids.shape[1]

    plain(inputs[0], 4)  # warm-up
    plain_rate = _rate([lambda ids=ids: plain(ids, max_new_tokens) for ids in inputs])
    results = []
    for recipe in candidates:
        built = recipe.build(model, tokenizer, draft=load_draft(recipe, tokenizer))
        rate, tau = _speculative_rate(built, inputs, max_new_tokens, temperature, eos)
        results.append(Measured(recipe=recipe, tau=tau, speedup=rate / plain_rate))
        logger.info("auto: %s ran %.2fx plain generate (tau %.2f)", recipe, rate / plain_rate, tau)
    return results


def plain_generate(model: torch.nn.Module, ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                   top_k: int | None = None, top_p: float | None = None, eos_token_id: int | None = None,
                   logits_processor: list[Any] | None = None) -> torch.Tensor:
    """The baseline every speedup is measured against: ``model.generate`` on ``ids`` (1, T) with the stock kernels
    (the weights as transformers computes them), greedy at ``temperature == 0``, padded with the EOS id, with
    ``logits_processor`` (e.g. a constraint's) if given. Returns (1, T + n) ids."""
    sampling = dict(do_sample=True, temperature=temperature, top_k=top_k or 0, top_p=top_p or 1.0) if (
        temperature > 0) else dict(do_sample=False)
    with models.stock_kernels():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              eos_token_id=eos_token_id, pad_token_id=eos_token_id, **sampling,
                              **({"logits_processor": logits_processor} if logits_processor else {}))


def _speculative_rate(built: Any, inputs: list[torch.Tensor], max_new_tokens: int, temperature: float,
                      eos: int | None) -> tuple[float, float]:
    """``(tokens per second, tau)`` of ``built`` decoding every (1, T) prompt of ``inputs``, after a warm-up."""
    stats = []

    def speculative(ids: torch.Tensor, tokens: int) -> int:
        out = built.generate(ids, max_new_tokens=tokens, temperature=temperature, eos_token_id=eos,
                             generator=torch.Generator().manual_seed(0))
        stats.append(out.stats)
        return out.sequences.shape[1] - ids.shape[1]

    speculative(inputs[0], 4)  # warm-up
    stats.clear()
    rate = _rate([lambda ids=ids: speculative(ids, max_new_tokens) for ids in inputs])
    steps = sum(s.steps for s in stats)
    return rate, (sum(sum(s.accepted) for s in stats) + steps) / max(steps, 1)


def _rate(runs: list[Any]) -> float:
    """Tokens per second over ``runs``, each a call returning how many tokens it generated."""
    start = time.perf_counter()
    tokens = sum(run() for run in runs)
    return tokens / (time.perf_counter() - start)


def read_cached(path: Path) -> tuple[Recipe, float, str] | None:
    """``(recipe, speedup, when)`` of a cached choice, or ``None`` when there is none (or it is unreadable)."""
    try:
        data = json.loads(path.read_text())
        return Recipe.from_dict(data["recipe"]), float(data["speedup"]), str(data["measured_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cached(path: Path, best: Measured, results: list[Measured]) -> None:
    """Store the choice and every candidate's measurement (written whole, then renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"recipe": best.recipe.changes(), "recipe_line": str(best.recipe), "speedup": best.speedup, "tau": best.tau,
            "measured_at": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_key(),
            "candidates": [{"recipe": str(m.recipe), "speedup": m.speedup, "tau": m.tau} for m in results]}
    staged = path.with_suffix(".partial")
    staged.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(staged, path)
