"""The ``Target`` protocol: the loop verifies through whatever implements it, a model is wrapped by ``as_target``,
and a verifier of one's own (composition, no base class) decodes what ``generate`` decodes."""

import pytest
import torch
from _tiny import tiny_causal_lm
from test_eagle import PROMPT, hf_greedy

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.drafters import PromptLookup
from specprim.hf import HFTarget, StaticTarget, as_target


class CountingTarget:
    """A verifier of one's own: an :class:`HFTarget` inside, counting the forwards it verifies."""

    def __init__(self, model) -> None:
        self.inner = HFTarget(model)
        self.device, self.vocab_size = self.inner.device, self.inner.vocab_size
        self.verifications = 0

    @property
    def past_length(self) -> int:
        return self.inner.past_length

    def check_length(self, total_length):
        self.inner.check_length(total_length)

    def start(self, input_ids, feature_layers=()):
        return self.inner.start(input_ids, feature_layers)

    def verify(self, root, tree, feature_layers=()):
        self.verifications += 1
        return self.inner.verify(root, tree, feature_layers)

    def commit(self, path, num_accepted):
        self.inner.commit(path, num_accepted)


def test_a_target_of_ones_own_decodes_what_generate_decodes():
    model = tiny_causal_lm("llama")
    target = CountingTarget(model)
    out = speculative_generate(target, PROMPT, drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=20,
                               eos_token_id=None)
    assert torch.equal(out.sequences, hf_greedy(model, PROMPT, 20))
    assert target.verifications == out.stats.steps > 0


def test_as_target_wraps_models_and_keeps_targets():
    model = tiny_causal_lm("llama")
    assert isinstance(as_target(model), HFTarget)
    static = StaticTarget(model, compile=False)
    assert as_target(static) is static
    with pytest.raises(TypeError, match="has no check_length, start, verify, commit"):
        as_target("smollm2")


def test_a_target_refuses_batches_with_one_line():
    model = tiny_causal_lm("llama")
    with pytest.raises(ValueError, match="decodes one sequence at a time; pass the model itself for batches"):
        speculative_generate(StaticTarget(model, compile=False), PROMPT.repeat(2, 1), drafter=[PromptLookup()] * 2,
                             acceptance=Greedy(), max_new_tokens=4)
