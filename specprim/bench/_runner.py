"""Timing methods side by side: warm-up, then every prompt and repeat with all methods interleaved (A B A B).

Only the generation call is timed (tokenization, memory probes and divergence checks are outside the window);
on CUDA the window is closed by ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence

import torch

from specprim._stats import GenerationStats, merge_stats
from specprim.bench._divergence import classify_divergence, first_difference
from specprim.bench._memory import PeakMemory, extra_parameters, state_bytes
from specprim.bench._methods import BASELINE, BenchMethod, Decoding
from specprim.bench._metrics import MethodSummary, PromptRow, step_fields, summarize
from specprim.bench._predict import predict_method
from specprim.bench._prompts import Prompt, conversation_ids
from specprim.hf import input_device
from specprim.speedup import CostModel

SEED_STRIDE = 10_007
"""Generation ``(prompt i, repeat r, turn t)`` of every method gets seed ``seed + SEED_STRIDE * i + 101 * r + t``."""


def seed_for(seed: int, prompt: int, repeat: int, turn: int = 0) -> int:
    return seed + SEED_STRIDE * prompt + 101 * repeat + turn


@dataclasses.dataclass(frozen=True, kw_only=True)
class Slot:
    """One timed unit: ``method`` answers every turn of prompt ``prompt`` in repeat ``repeat``."""

    prompt: int
    repeat: int
    method: str


def schedule(num_prompts: int, methods: Sequence[str], repeats: int) -> list[Slot]:
    """The measurement order: for each prompt, for each repeat, every method in the given order.

    Interleaving (A B A B rather than A A B B) spreads slow drifts of the machine (thermal state, other load)
    over all methods alike.
    """
    return [Slot(prompt=p, repeat=r, method=m) for p in range(num_prompts) for r in range(repeats) for m in methods]


class ForwardCounter:
    """Counts calls of ``model.forward`` (through ``__call__``) while installed, with a forward pre-hook.

    Only calls on ``model`` itself count: a shallow copy sharing its hook table (an early-exit view) does not.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        self._model = model
        self._handle = model.register_forward_pre_hook(self._hook)

    @torch._dynamo.disable  # a forward that generate compiles itself (hf-static) calls it eagerly, uncompiled
    def _hook(self, module: torch.nn.Module, args: object) -> None:
        if module is self._model:
            self.count += 1

    def remove(self) -> None:
        self._handle.remove()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """A method's answers to every turn of one prompt: per-turn ``inputs`` (1, T_t) and ``outputs`` (n_t,),
    the timed ``seconds``, merged ``stats``, target ``forwards`` and the largest ``peak`` memory."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    seconds: float
    stats: GenerationStats | None
    forwards: int
    peak: int | None


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def answer(
    method: BenchMethod, tokenizer: object, prompt: Prompt, decoding: Decoding, seed: int,
    counter: ForwardCounter, memory: PeakMemory,
) -> Outcome:
    """Ask every turn of ``prompt``; turn ``t + 1`` follows the method's own decoded answer to turn ``t``."""
    inputs, outputs, stats, answers = [], [], [], []
    seconds, forwards, peak = 0.0, 0, None
    for turn in range(len(prompt.turns)):
        ids = conversation_ids(tokenizer, prompt.turns, answers)  # (1, T)
        memory.reset()
        counter.count = 0
        _synchronize(memory.device)
        start = time.perf_counter()
        generation = method.generate(ids, decoding, seed + turn)
        _synchronize(memory.device)
        seconds += time.perf_counter() - start
        forwards += counter.count if generation.target_forwards is None else generation.target_forwards
        turn_peak = memory.peak_bytes()
        peak = turn_peak if peak is None else max(peak, turn_peak or 0)
        inputs.append(ids)
        outputs.append(generation.new_ids)
        if generation.stats is not None:
            stats.append(generation.stats)
        answers.append(tokenizer.decode(generation.new_ids, skip_special_tokens=True))
    merged = merge_stats(stats) if stats else None
    return Outcome(inputs=tuple(inputs), outputs=tuple(outputs), seconds=seconds, stats=merged,
                   forwards=forwards, peak=peak)


def measure(
    *, target: torch.nn.Module, tokenizer: object, prompts: Sequence[Prompt], methods: Mapping[str, BenchMethod],
    decoding: Decoding, dataset: str, repeats: int = 1, seed: int = 0, warmup_tokens: int = 8,
    progress: bool = False, costs: CostModel | None = None,
) -> tuple[list[PromptRow], list[MethodSummary]]:
    """Warm every method up on the first prompt (``warmup_tokens`` tokens), then time :func:`schedule`.

    ``methods`` must contain the baseline ``"hf"``. Returns the per-row records in schedule order and one
    summary per method, in the order of ``methods``; with ``costs`` each summary of a stepping method carries the
    speedup model's prediction. Raises ``ValueError`` without the baseline or prompts.
    """
    if BASELINE not in methods:
        raise ValueError(f"the methods must include the baseline {BASELINE!r}")
    if not prompts or repeats < 1:
        raise ValueError("need at least one prompt and one repeat")
    memory = PeakMemory(input_device(target))
    counter = ForwardCounter(target)
    try:
        warm = dataclasses.replace(decoding, max_new_tokens=min(warmup_tokens, decoding.max_new_tokens))
        first = conversation_ids(tokenizer, prompts[0].turns, [])
        for method in methods.values():
            method.generate(first, warm, seed)
            verifier = getattr(method, "verifier", None)  # a StaticTarget: compile the padded sizes warm-up skipped
            if verifier is not None:
                verifier.compile_smaller_sizes()
        slots = schedule(len(prompts), list(methods), repeats)
        outcomes, held = {}, dict.fromkeys(methods, 0)
        for slot in _progress(slots, progress):
            method = methods[slot.method]
            outcomes[slot] = answer(method, tokenizer, prompts[slot.prompt], decoding,
                                    seed_for(seed, slot.prompt, slot.repeat), counter, memory)
            held[slot.method] = max(held[slot.method], drafter_state(method, target))
    finally:
        counter.remove()
    rows = [_row(slot, outcomes, prompts, target, decoding, dataset) for slot in slots]
    summaries = []
    baseline_rows = [r for r in rows if r.method == BASELINE]
    for name, method in methods.items():
        extra = extra_parameters(method.draft_modules, target)
        summary = summarize([r for r in rows if r.method == name], baseline_rows,
                            drafter_params=extra.count, drafter_param_bytes=extra.bytes,
                            drafter_state_bytes=held[name])
        records = [o.stats for s, o in outcomes.items() if s.method == name and o.stats is not None]
        prediction = predict_method(merge_stats(records), costs) if costs is not None and records else None
        if prediction is not None:
            summary = dataclasses.replace(summary, predicted_tau=prediction.tau,
                                          predicted_speedup=prediction.speedup)
        summaries.append(summary)
    return rows, summaries


def drafter_state(method: BenchMethod, target: torch.nn.Module) -> int:
    """Bytes of the state ``method`` holds beyond its draft modules' parameters and the target (its drafter's
    caches, datastore arrays; see :func:`specprim.bench._memory.state_bytes`), measured now, after a generation."""
    return state_bytes(method, method.draft_modules, target, skip=(getattr(method, "verifier", None),))


def _progress(slots: list[Slot], enabled: bool) -> Sequence[Slot]:
    if not enabled:
        return slots
    from tqdm.auto import tqdm

    return tqdm(slots, desc="bench", unit="gen", file=sys.stderr)


def _row(
    slot: Slot, outcomes: Mapping[Slot, Outcome], prompts: Sequence[Prompt], target: torch.nn.Module,
    decoding: Decoding, dataset: str,
) -> PromptRow:
    outcome = outcomes[slot]
    reference = outcomes[dataclasses.replace(slot, method=BASELINE)]
    new_tokens = sum(len(o) for o in outcome.outputs)
    rate = new_tokens / outcome.seconds
    base_rate = sum(len(o) for o in reference.outputs) / reference.seconds
    identical, divergence = None, None
    if decoding.greedy:
        where = first_difference(reference.outputs, outcome.outputs)
        identical = where is None
        if where is not None:
            divergence = _divergence(target, reference, outcome, *where).to_json()
    return PromptRow(
        method=slot.method, dataset=dataset, prompt_id=prompts[slot.prompt].id, prompt_index=slot.prompt,
        repeat=slot.repeat, turns=len(outcome.outputs), prompt_tokens=outcome.inputs[0].shape[1],
        new_tokens=new_tokens, seconds=outcome.seconds, tokens_per_s=rate, speedup=rate / base_rate,
        **step_fields(outcome.stats), target_forwards=outcome.forwards, peak_memory_bytes=outcome.peak,
        identical=identical, divergence=divergence,
    )


def _divergence(target: torch.nn.Module, reference: Outcome, outcome: Outcome, turn: int, position: int):
    ref, out = reference.outputs[turn], outcome.outputs[turn]
    context = torch.cat([outcome.inputs[turn][0], ref[:position].to(outcome.inputs[turn].device)])[None]
    return classify_divergence(
        target, context, int(ref[position]) if position < len(ref) else None,
        int(out[position]) if position < len(out) else None, turn=turn, position=position,
    )
