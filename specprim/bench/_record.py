"""Recordings of a prompt set for counterfactual replay (:func:`specprim.speedup.replay`): every turn of every
prompt, the target's greedy continuation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specprim import cut_at_stop, stop_token_ids
from specprim.bench._prompts import Prompt, conversation_ids
from specprim.speedup import Recording, greedy_continuation, record_greedy


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
            answer, _ = cut_at_stop(out[0, ids.shape[1]:].cpu(), stop_token_ids(eos))
            answers.append(tokenizer.decode(answer, skip_special_tokens=True))
    return recordings
