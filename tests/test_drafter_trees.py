"""Greedy parity for every tree builder with the language-model drafters (independent LM and early exit), on
several architectures: trees of every shape are verified and committed losslessly."""

import pytest
import torch
from _tiny import ARCHITECTURES, tiny_causal_lm

from specprim import speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import EarlyExit, ModelDrafter
from specprim.trees import Chain, DynamicTree, StaticTree

VOCAB = 10  # small, so that tree branches other than the first are accepted now and then

TREES = {
    "chain": Chain(3),
    "static": StaticTree.from_branching((3, 2, 1)),
    "static-sampled": StaticTree(paths=((0,), (1,), (0, 0), (1, 0)), sample_without_replacement=True),
    "dynamic": DynamicTree(depth=3, top_k=3, budget=8),
}


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_language_model_drafters_with_every_tree(arch, tree):
    target = tiny_causal_lm(arch, seed=0, vocab=VOCAB, layers=3)
    prompt = torch.randint(2, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                               pad_token_id=0, eos_token_id=None)
    drafters = [ModelDrafter(tiny_causal_lm(arch, seed=1, vocab=VOCAB, layers=2), TREES[tree]),
                EarlyExit(target, 2, tree=TREES[tree])]
    for drafter in drafters:
        for rule in (Greedy(), SpeculativeSampling()):
            out = speculative_generate(target, prompt, drafter=drafter, acceptance=rule, max_new_tokens=24)
            assert torch.equal(out.sequences, expected), (drafter, rule)
