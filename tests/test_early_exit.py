"""Early-exit self-speculation: greedy parity, weight sharing without copies, the target left untouched,
and clear errors for exit layers out of range."""

import pytest
import torch
from _tiny import ARCHITECTURES, VOCAB, tiny_causal_lm

from specprim import speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import EarlyExit
from specprim.hf import num_layers, truncated_view
from specprim.trees import Chain


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("exit_layer", [1, 2])
def test_greedy_parity(arch, exit_layer):
    target = tiny_causal_lm(arch, seed=0, layers=3)
    prompt = torch.randint(2, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                               pad_token_id=0, eos_token_id=1)
    for rule in (Greedy(), SpeculativeSampling()):
        out = speculative_generate(target, prompt, drafter=EarlyExit(target, exit_layer, tree=Chain(3)),
                                   acceptance=rule, max_new_tokens=30, eos_token_id=1)
        assert torch.equal(out.sequences, expected)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_view_shares_weights_and_leaves_the_target_untouched(arch):
    target = tiny_causal_lm(arch, seed=0, layers=3)
    before = {name: p.data_ptr() for name, p in target.named_parameters()}
    view = truncated_view(target, 2)
    assert num_layers(view) == 2 and num_layers(target) == 3
    assert target.config.num_hidden_layers == 3
    view_pointers = {p.data_ptr() for p in view.parameters()}
    assert view_pointers <= set(before.values())  # no parameter was copied
    assert {name: p.data_ptr() for name, p in target.named_parameters()} == before
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[2]
        head = target.get_output_embeddings()
        norm = view.model.norm if hasattr(view, "model") else view.transformer.ln_f
        expected = head(norm(hidden))
        torch.testing.assert_close(view(ids).logits, expected, atol=1e-5, rtol=1e-4)


def test_exit_layer_out_of_range():
    target = tiny_causal_lm("llama", seed=0, layers=3)
    for bad in (0, 3, -1, 1.5):
        with pytest.raises(ValueError, match="exit layer"):
            EarlyExit(target, bad)


def test_early_exit_under_sampling_is_reproducible():
    target = tiny_causal_lm("qwen2", seed=0, layers=3)
    prompt = torch.tensor([[5, 6, 7]])

    def run():
        return speculative_generate(target, prompt, drafter=EarlyExit(target, 1), acceptance=SpeculativeSampling(),
                                    max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(3))

    assert torch.equal(run().sequences, run().sequences)
