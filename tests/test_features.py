"""Target features handed to drafters that ask for them: every committed position but the root, exactly once,
equal to the hidden states of one full forward over the final sequence."""

import torch
from _tiny import VOCAB, tiny_causal_lm

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.drafters import ModelDrafter


class RecordingDrafter:
    """Wraps a drafter, asks for some target layers and records what it receives."""

    def __init__(self, inner, feature_layers):
        self.inner, self.feature_layers, self.received = inner, feature_layers, []

    def propose(self, request):
        self.received.append(request.features)
        return self.inner.propose(request)

    def observe(self, verdict):
        self.inner.observe(verdict)


def test_features_cover_every_committed_position_once():
    target = tiny_causal_lm("llama", seed=0, layers=3)
    prompt = torch.randint(2, VOCAB, (1, 7), generator=torch.Generator().manual_seed(0))
    drafter = RecordingDrafter(ModelDrafter(tiny_causal_lm("llama", seed=1, layers=3)), feature_layers=(1, -1))
    out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=20)
    ids = out.sequences
    with torch.no_grad():
        reference = target(ids, output_hidden_states=True).hidden_states
    position = 0
    for step, features in enumerate(drafter.received):
        assert features.start == position, step
        n = features.token_ids.shape[1]
        assert torch.equal(features.token_ids, ids[:, position : position + n])
        for layer, hidden in zip((1, -1), features.hidden_states, strict=True):
            torch.testing.assert_close(hidden, reference[layer][:, position : position + n], atol=1e-5, rtol=1e-4)
        position += n
    # every position is delivered once, up to the last request's root (which the target had not processed yet)
    assert position == ids.shape[1] - 1 - out.stats.emitted[-1]


def test_drafters_without_feature_layers_get_none():
    target = tiny_causal_lm("qwen2", seed=0)
    drafter = RecordingDrafter(ModelDrafter(target), feature_layers=())
    speculative_generate(target, torch.tensor([[3, 4, 5]]), drafter=drafter, acceptance=Greedy(), max_new_tokens=6)
    assert all(features is None for features in drafter.received)
