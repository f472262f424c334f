"""Counterfactual replay: record the target's greedy choices along a sequence once, then re-score drafters offline.

Under greedy decoding the emitted sequence does not depend on the drafter, and a step accepts the longest draft
path that matches it. So :func:`replay` runs ``speculative_generate``'s step (``speculative_step``) with the
recording in place of the target's forward: the drafter proposes a tree for the committed ids, the longest path
matching the recorded continuation is accepted, the recorded next token is the bonus. Accepted lengths, tree shapes
and tau equal a live greedy run's (checked in the tests); only draft time is spent, no target forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from specprim import Row, speculative_step, stop_token_ids
from specprim._stats import GenerationStats, merge_stats
from specprim._types import DraftTree, TargetFeatures, Verdict
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
    """``sequences`` (1, T + m) as a live greedy run would return them, the per-step ``stats`` (``verify_s`` is
    the time the recording takes to answer: no target runs), and ``exact``: ``False`` when a tree had to be cut
    shorter than a live run's because the recording ended before the budget (only that step's counts may then
    differ)."""

    sequences: torch.Tensor
    stats: GenerationStats
    exact: bool


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


def replay(
    recording: Recording, drafter: object, *, max_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> ReplayOutput:
    """Run greedy speculative decoding of ``recording``'s prompt with ``drafter``, the recording as the target.

    The steps are :func:`specprim.speculative_generate`'s (:func:`speculative_step`); the recording answers for the
    target and for the greedy rule: a step accepts the longest draft path that follows the recorded tokens (the
    first matching sibling wins, as :class:`Greedy` picks) and emits the recorded token after it, and the features
    are the recorded ones at the positions of ``[root] + tree`` (right for every node on the recorded path, the
    only ones a step commits). No target runs and no vocabulary-wide scores are built.

    ``max_new_tokens`` defaults to the recorded length; a larger budget is allowed when the generation stops at
    ``eos_token_id`` within the recording (trees are then cut at the recording's end: ``exact`` is ``False``), and
    raises ``ValueError`` when it would need unrecorded tokens. Stops like :func:`specprim.speculative_generate`: at
    the budget or right after the first stop token.
    """
    truth = recording.continuation  # (n,)
    budget = truth.numel() if max_new_tokens is None else max_new_tokens
    layers = tuple(getattr(drafter, "feature_layers", ()))
    ids = recording.prompt  # (1, T)
    row = Row(ids=ids, prompt_length=ids.shape[1], budget=min(budget, truth.numel()), drafter=drafter,
              layers=layers, features=_features(recording, layers, ids, 0, ids.shape[1] - 1))
    stop_ids = stop_token_ids(eos_token_id)
    while row.remaining > 0 and not row.finished:
        speculative_step(
            [row], verify=lambda roots, trees: _recorded_features(recording, row, trees[0]),
            commit=lambda verdicts: None, acceptance=_RecordedGreedy(recording, row),
            sampling=SamplingConfig(temperature=0.0), vocab_size=recording.vocab_size, device=ids.device,
            layers=layers, stop_ids=stop_ids,
        )
    stopped = row.stats.steps > 0 and bool(torch.isin(row.ids[0, -1:], stop_ids).any())
    if budget > truth.numel() and not stopped:
        raise ValueError(f"the recording holds {truth.numel()} tokens; the replay needs more (budget {budget})")
    return ReplayOutput(sequences=row.ids, stats=row.stats, exact=budget <= truth.numel() or not row.stats.steps)


def _recorded_features(recording: Recording, row: Row, tree: DraftTree
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The verification of ``[root] + tree`` after ``row.ids``, read from the recording: placeholder scores
    (1, N + 1, 1) (the verdict comes from :class:`_RecordedGreedy`) and the recorded features (1, N + 1, H) at the
    positions of the root and of every node's depth, for the row's layers."""
    depths = torch.tensor([0, *tree.depth_list])  # (N + 1,) the root, then every node
    positions = row.ids.shape[1] - 1 + depths  # (N + 1,)
    hidden = tuple(recording.hidden_states[recording.layers.index(layer)][:, positions] for layer in row.layers)
    return torch.zeros(1, depths.shape[0], 1), hidden


@dataclasses.dataclass(frozen=True)
class _RecordedGreedy:
    """The greedy verdict of the recorded target on ``row``'s tree: the longest path whose tokens follow the
    recording (the first matching sibling wins), then the recorded next token. ``p`` is not read."""

    recording: Recording
    row: Row

    def __call__(self, p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None) -> Verdict:
        generated = self.row.ids.shape[1] - self.row.prompt_length
        truth = self.recording.continuation[generated:].tolist()
        path, node, tokens = [], -1, tree.tokens[0].tolist()
        for token in truth:
            child = next((c for c in tree.children[node + 1] if tokens[c] == token), None)
            if child is None:
                break
            path.append(child)
            node = child
        padded = torch.full((1, tree.depth), -1, dtype=torch.long)
        padded[0, : len(path)] = torch.tensor(path, dtype=torch.long)
        return Verdict(path=padded, num_accepted=torch.tensor([len(path)]),
                       next_token=torch.tensor([truth[len(path)]]))


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


def replay_all(
    recordings: Sequence[Recording], drafter: object, *, max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
) -> ReplayOutput:
    """:func:`replay` every recording with the same drafter; ``sequences`` is the last one's, ``stats`` merged."""
    outputs = [replay(r, drafter, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id) for r in recordings]
    stats = merge_stats([o.stats for o in outputs])
    return ReplayOutput(sequences=outputs[-1].sequences, stats=stats, exact=all(o.exact for o in outputs))
