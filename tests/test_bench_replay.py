"""Counterfactual replay equals a live greedy run, step for step, for stateless and stateful drafters."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from _tiny import tiny_causal_lm

from specprim import DraftTree, speculative_generate
from specprim.acceptance import SpeculativeSampling
from specprim.bench import Prompt, record_greedy, record_prompts, replay
from specprim.drafters import ModelDrafter, PromptLookup
from specprim.trees import Chain

PROMPT = torch.tensor([[5, 6, 7, 8, 5, 6, 9, 10, 5, 6]])
BUDGET = 40


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama")


@pytest.fixture(scope="module")
def draft(target):
    """The target with a perturbed head: agrees often, not always."""
    model = copy.deepcopy(target)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        model.lm_head.weight.add_(0.005 * torch.randn(model.lm_head.weight.shape, generator=generator))
    return model


@dataclasses.dataclass
class TopTwoTree:
    """Drafts a 4-node tree with a small LM: its top-2 tokens at the root, then its argmax after each of them."""

    model: torch.nn.Module

    @torch.no_grad()
    def propose(self, request):
        ids = request.input_ids
        top2 = self.model(input_ids=ids).logits[0, -1].topk(2).indices  # (2,)
        after = [self.model(input_ids=torch.cat([ids, t.view(1, 1)], 1)).logits[0, -1].argmax() for t in top2]
        return DraftTree(tokens=torch.stack([*top2, *after])[None], parents=torch.tensor([-1, -1, 0, 1]))

    def observe(self, verdict):
        pass


def _drafters(draft):
    return {
        "prompt-lookup": lambda: PromptLookup(num_tokens=4),
        "model-chain-3": lambda: ModelDrafter(draft, tree=Chain(3)),
        "model-tree": lambda: TopTwoTree(draft),
    }


def _same_steps(live, replayed):
    assert replayed.sequences.tolist() == live.sequences.tolist()
    for field in ("accepted", "tree_depth", "tree_nodes", "emitted"):
        assert getattr(replayed.stats, field) == getattr(live.stats, field), field
    assert replayed.stats.tau == live.stats.tau
    assert replayed.stats.acceptance_by_depth == pytest.approx(live.stats.acceptance_by_depth, nan_ok=True)


@pytest.mark.parametrize("name", ["prompt-lookup", "model-chain-3", "model-tree"])
def test_replay_equals_live_greedy(target, draft, name):
    make = _drafters(draft)[name]
    live = speculative_generate(target, PROMPT, drafter=make(), acceptance=SpeculativeSampling(),
                                max_new_tokens=BUDGET)
    recording = record_greedy(target, live.sequences, PROMPT.shape[1])
    assert not recording.truncated and recording.continuation.shape == (BUDGET,)
    replayed = replay(recording, make())
    assert replayed.exact
    _same_steps(live, replayed)
    assert 0 < sum(live.stats.accepted) < sum(live.stats.tree_depth)  # the check is not trivial


def test_replay_stops_at_eos_like_live_when_recorded_past_it(target, draft):
    full = speculative_generate(target, PROMPT, drafter=PromptLookup(), acceptance=SpeculativeSampling(),
                                max_new_tokens=BUDGET)
    eos = int(full.sequences[0, PROMPT.shape[1] + BUDGET // 2])
    recording = record_greedy(target, full.sequences, PROMPT.shape[1])
    for make in _drafters(draft).values():
        live = speculative_generate(target, PROMPT, drafter=make(), acceptance=SpeculativeSampling(),
                                    max_new_tokens=BUDGET, eos_token_id=eos)
        assert live.sequences.shape[1] < full.sequences.shape[1]
        _same_steps(live, replay(recording, make(), max_new_tokens=BUDGET, eos_token_id=eos))


def test_replay_refuses_to_invent_unrecorded_tokens(target):
    live = speculative_generate(target, PROMPT, drafter=PromptLookup(), acceptance=SpeculativeSampling(),
                                max_new_tokens=8)
    recording = record_greedy(target, live.sequences, PROMPT.shape[1])
    with pytest.raises(ValueError, match="holds 8 tokens"):
        replay(recording, PromptLookup(), max_new_tokens=9)


def test_record_greedy_cuts_an_output_that_is_not_the_targets_argmax(target):
    live = speculative_generate(target, PROMPT, drafter=PromptLookup(), acceptance=SpeculativeSampling(),
                                max_new_tokens=10)
    forged = live.sequences.clone()
    forged[0, PROMPT.shape[1] + 6] = (forged[0, PROMPT.shape[1] + 6] + 1) % 97
    recording = record_greedy(target, forged, PROMPT.shape[1])
    assert recording.truncated and recording.continuation.tolist() == forged[0, PROMPT.shape[1]:][:6].tolist()


@dataclasses.dataclass
class FeatureSpy:
    """A prompt-lookup drafter that asks for the last hidden layer and keeps every ``features`` it gets."""

    feature_layers: tuple[int, ...] = (-1,)
    seen: list = dataclasses.field(default_factory=list)

    def propose(self, request):
        features = request.features
        self.seen.append(None if features is None else (features.start, features.token_ids.tolist(),
                                                        features.hidden_states[0].clone()))
        return PromptLookup(num_tokens=3).propose(request)

    def observe(self, verdict):
        pass


def test_replay_gives_feature_drafters_the_live_features(target):
    live_spy, replay_spy = FeatureSpy(), FeatureSpy()
    live = speculative_generate(target, PROMPT, drafter=live_spy, acceptance=SpeculativeSampling(),
                                max_new_tokens=20)
    recording = record_greedy(target, live.sequences, PROMPT.shape[1], layers=(-1,))
    replay(recording, replay_spy)
    assert len(live_spy.seen) == len(replay_spy.seen)
    for (start, tokens, hidden), (r_start, r_tokens, r_hidden) in zip(live_spy.seen, replay_spy.seen, strict=True):
        assert (start, tokens) == (r_start, r_tokens)
        torch.testing.assert_close(r_hidden, hidden, atol=1e-4, rtol=1e-4)


def test_record_prompts_keeps_the_targets_choices_past_eos(target):
    from test_bench import EOS, word_tokenizer

    text = " ".join(f"w{i}" for i in PROMPT[0].tolist())
    (recording,) = record_prompts(target, word_tokenizer(), [Prompt(id="x", turns=(text,))], 20)
    plain = speculative_generate(target, PROMPT, drafter=PromptLookup(), acceptance=SpeculativeSampling(),
                                 max_new_tokens=20)
    assert recording.prompt.tolist() == PROMPT.tolist() and not recording.truncated
    assert recording.continuation.tolist() == plain.sequences[0, PROMPT.shape[1]:].tolist()
    assert EOS in recording.continuation[:-1].tolist()  # the EOS did not stop the recording
