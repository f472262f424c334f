"""Counterfactual replay: record the target's greedy choices along a sequence once, then re-score drafters offline.

Under greedy decoding the emitted sequence does not depend on the drafter, and a step accepts the longest draft
path that matches it. So :func:`replay` runs ``speculative_generate``'s step loop with the recorded tokens in
place of the target's forward: the drafter proposes a tree for the committed ids, the longest path matching
the recorded continuation is accepted, the recorded next token is the bonus. Accepted lengths, tree shapes and
tau equal a live greedy run's (checked in the tests); only draft time is spent, no target forward.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from specprim._stats import GenerationStats, merge_stats
from specprim._types import DraftRequest, DraftTree, TargetFeatures, Verdict, truncate_tree
from specprim.bench._prompts import Prompt, conversation_ids
from specprim.hf import cache_kwarg, input_device, vocab_size
from specprim.sampling import SamplingConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recording:
    """The target's greedy continuation of one prompt, recorded by one forward.

    Attributes:
        prompt: (1, T) long, the prompt ids.
        continuation: (n,) long, the target's greedy tokens after the prompt: the recorded output as far as it
            equals the argmax of the recording forward at every position.
        vocab_size: the target's ``V``.
        layers: the hidden-state layers recorded (indices into Hugging Face's ``output_hidden_states``).
        hidden_states: one (1, T + n - 1, H) tensor per entry of ``layers``: the target's features at every
            position but the last (what ``DraftRequest.features`` carries for drafters with ``feature_layers``).
        truncated: ``True`` when the recorded output left the recomputed argmax before its end (a near-tie in
            low precision) and ``continuation`` was cut there.
    """

    prompt: torch.Tensor
    continuation: torch.Tensor
    vocab_size: int
    layers: tuple[int, ...] = ()
    hidden_states: tuple[torch.Tensor, ...] = ()
    truncated: bool = False


@torch.no_grad()
def record_greedy(
    target: torch.nn.Module, sequence: torch.Tensor, prompt_length: int, layers: Sequence[int] = ()
) -> Recording:
    """Record the greedy continuation ``sequence[:, prompt_length:]`` (``sequence`` (1, T + n)) of ``target``.

    One forward over ``sequence[:, :-1]`` gives the target's argmax after every position; the continuation is
    kept up to the first token that disagrees with it. ``layers`` selects hidden states to keep for feature
    drafters. Raises ``ValueError`` for an empty prompt or a batch size other than 1.
    """
    if sequence.dim() != 2 or sequence.shape[0] != 1 or not 1 <= prompt_length <= sequence.shape[1]:
        raise ValueError("sequence must be (1, T + n) with 1 <= prompt_length <= T + n")
    sequence = sequence.to(input_device(target))
    generated = sequence[0, prompt_length:]  # (n,)
    hidden: tuple[torch.Tensor, ...] = ()
    if generated.numel() == 0:
        return Recording(prompt=sequence[:, :prompt_length].cpu(), continuation=generated.cpu(),
                         vocab_size=vocab_size(target), layers=tuple(layers))
    out = target(input_ids=sequence[:, :-1], output_hidden_states=bool(layers))
    choices = out.logits[0, prompt_length - 1:].argmax(-1)  # (n,)
    agree = int((choices == generated).long().cumprod(0).sum())
    if layers:
        hidden = tuple(out.hidden_states[layer].cpu() for layer in layers)
    return Recording(
        prompt=sequence[:, :prompt_length].cpu(), continuation=generated[:agree].cpu(),
        vocab_size=vocab_size(target), layers=tuple(layers), hidden_states=hidden,
        truncated=agree < generated.numel(),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayOutput:
    """``sequences`` (1, T + m) as a live greedy run would return them, the per-step ``stats`` (``verify_s``
    is 0: no target runs), and ``exact``: ``False`` when a tree had to be cut shorter than a live run's because
    the recording ended before the budget (only that step's counts may then differ)."""

    sequences: torch.Tensor
    stats: GenerationStats
    exact: bool


def _greedy_path(tree: DraftTree, truth: list[int]) -> list[int]:
    """Node ids of the longest root path whose tokens equal ``truth``; the first matching sibling wins."""
    path, node, tokens = [], -1, tree.tokens[0].tolist()
    for token in truth:
        child = next((c for c in tree.children[node + 1] if tokens[c] == token), None)
        if child is None:
            break
        path.append(child)
        node = child
    return path


def _features(recording: Recording, layers: tuple[int, ...], ids: torch.Tensor, start: int,
              end: int) -> TargetFeatures | None:
    """Recorded features at positions ``start .. end - 1`` for a drafter asking for ``layers``."""
    if not layers:
        return None
    missing = [layer for layer in layers if layer not in recording.layers]
    if missing:
        raise ValueError(f"the drafter needs hidden states of layers {missing}; record them with layers=")
    rows = [recording.hidden_states[recording.layers.index(layer)][:, start:end] for layer in layers]
    return TargetFeatures(hidden_states=tuple(rows), token_ids=ids[:, start:end], start=start)


def _stop_after(new: torch.Tensor, stop_ids: set[int]) -> tuple[torch.Tensor, bool]:
    for i, token in enumerate(new.tolist()):
        if token in stop_ids:
            return new[: i + 1], True
    return new, False


def replay(
    recording: Recording, drafter: object, *, max_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> ReplayOutput:
    """Run greedy speculative decoding of ``recording``'s prompt with ``drafter``, the recording as the target.

    ``max_new_tokens`` defaults to the recorded length; a larger budget is allowed when the generation stops at
    ``eos_token_id`` within the recording, and raises ``ValueError`` when it would need unrecorded tokens.
    Stops like :func:`specprim.speculative_generate`: at the budget or right after the first stop token.
    """
    truth = recording.continuation.tolist()
    budget = len(truth) if max_new_tokens is None else max_new_tokens
    stop_ids = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(
        eos_token_id)
    layers = tuple(getattr(drafter, "feature_layers", ()))
    ids = recording.prompt
    features = _features(recording, layers, ids, 0, ids.shape[1] - 1)
    stats, generated, exact = GenerationStats(), 0, True
    sampling = SamplingConfig(temperature=0.0)
    while generated < budget:
        if generated >= len(truth):
            raise ValueError(f"the recording holds {len(truth)} tokens; the replay needs more (budget {budget})")
        start = time.perf_counter()
        remaining = budget - generated
        request = DraftRequest(input_ids=ids, sampling=sampling, vocab_size=recording.vocab_size,
                               max_depth=remaining - 1, step=stats.steps, features=features)
        depth = min(remaining, len(truth) - generated) - 1
        exact &= depth == remaining - 1
        tree = truncate_tree(drafter.propose(request), depth)
        drafted = time.perf_counter()
        path = _greedy_path(tree, truth[generated:])
        accepted, next_token = len(path), truth[generated + len(path)]
        padded = torch.full((1, tree.depth), -1, dtype=torch.long)
        padded[0, :accepted] = torch.tensor(path, dtype=torch.long)
        drafter.observe(Verdict(path=padded, num_accepted=torch.tensor([accepted]),
                                next_token=torch.tensor([next_token])))
        root = ids.shape[1] - 1
        new, finished = _stop_after(torch.tensor(truth[generated: generated + accepted + 1]), stop_ids)
        ids = torch.cat([ids, new[None]], dim=1)
        features = _features(recording, layers, ids, root, root + accepted + 1)
        generated += new.shape[0]
        stats.record(accepted=accepted, tree_depth=tree.depth, tree_nodes=tree.num_nodes, emitted=new.shape[0],
                     draft_s=drafted - start, verify_s=0.0, total_s=time.perf_counter() - start)
        if finished:
            break
    return ReplayOutput(sequences=ids, stats=stats, exact=exact)


@torch.no_grad()
def greedy_continuation(target: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """(1, T) -> (1, T + max_new_tokens): plain greedy decoding with a KV cache that never stops early.

    Unlike ``generate``, which takes EOS from the model's generation config whatever is passed, this runs the full
    budget, so the recording knows the target's choices past an EOS.
    """
    ids = input_ids.to(input_device(target))
    cache = DynamicCache(config=target.config)
    kwarg = cache_kwarg(target)
    logits = target(input_ids=ids, use_cache=True, **{kwarg: cache}).logits[:, -1]  # (1, V)
    tokens = []
    for step in range(max_new_tokens):
        tokens.append(logits.argmax(-1, keepdim=True))  # (1, 1)
        if step + 1 < max_new_tokens:
            logits = target(input_ids=tokens[-1], use_cache=True, **{kwarg: cache}).logits[:, -1]
    return torch.cat([ids, *tokens], dim=1)


@torch.no_grad()
def record_prompts(
    target: torch.nn.Module, tokenizer: object, prompts: Sequence[Prompt], max_new_tokens: int,
    layers: Sequence[int] = (),
) -> list[Recording]:
    """One :class:`Recording` per turn of every prompt, from :func:`greedy_continuation` of ``max_new_tokens``.

    Generation does not stop at EOS, so a replay that stops at EOS still knows the target's choices past it (a
    live run's last step may accept drafted tokens beyond the EOS it then cuts). Turn ``t + 1`` follows the
    answer to turn ``t`` cut after its first EOS and decoded, as :func:`specprim.bench.run` does.
    """
    eos = getattr(tokenizer, "eos_token_id", None)
    recordings = []
    for prompt in prompts:
        answers: list[str] = []
        for _ in prompt.turns:
            ids = conversation_ids(tokenizer, prompt.turns, answers)  # (1, T)
            out = greedy_continuation(target, ids, max_new_tokens)
            recordings.append(record_greedy(target, out, ids.shape[1], layers))
            answer, _ = _stop_after(out[0, ids.shape[1]:].cpu(), set() if eos is None else {eos})
            answers.append(tokenizer.decode(answer, skip_special_tokens=True))
    return recordings


def replay_all(
    recordings: Sequence[Recording], drafter: object, *, max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
) -> ReplayOutput:
    """:func:`replay` every recording with the same drafter; ``sequences`` is the last one's, ``stats`` merged."""
    outputs = [replay(r, drafter, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id) for r in recordings]
    stats = merge_stats([o.stats for o in outputs])
    return ReplayOutput(sequences=outputs[-1].sequences, stats=stats, exact=all(o.exact for o in outputs))
