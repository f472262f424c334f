"""Composition instead of inheritance (issue 32, item 4), as users see it: drafters that hold their model and tree
take a new tree on a copy and switch to static shapes through the registry in ``drafters/_static.py``; the presets
replace only the plain ``SpeculativeSampling`` by ``Greedy`` under greedy decoding, never an ablation composed from
other steps."""

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm

from specprim import presets
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.acceptance._speculative import WalkSteps
from specprim.drafters import EarlyExit, LMDraftModel, ModelDrafter, StaticLMDraftModel, TreeDrafter, static_drafting
from specprim.trees import Chain, DynamicTree


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", seed=0, layers=3)


@pytest.mark.parametrize("name", ["early-exit", "leviathan"])
def test_a_new_tree_goes_to_a_copy_of_a_drafter_that_holds_its_own(target, name):
    method = presets.from_name(name, target=target, draft=tiny_causal_lm("llama", seed=1), exit_layer=1)
    reshaped = presets.with_tree(method, DynamicTree(depth=2, top_k=2, budget=4))
    assert type(reshaped.drafter) is type(method.drafter) and reshaped.drafter.model is method.drafter.model
    assert isinstance(reshaped.drafter.tree, DynamicTree) and isinstance(method.drafter.tree, Chain)


def test_static_drafting_switches_a_model_drafter_and_keeps_early_exit(target):
    draft = tiny_causal_lm("llama", seed=1)
    switched = static_drafting(ModelDrafter(draft, tree=Chain(3)), compile=False, min_cache_length=64)
    assert type(switched) is TreeDrafter and type(switched.model) is StaticLMDraftModel
    assert type(switched.model.lm) is LMDraftModel and switched.model.model is draft  # holds the eager model
    early = EarlyExit(target, 1)
    assert static_drafting(early, compile=False) is early
    eager_lm = TreeDrafter(LMDraftModel(draft), Chain(3))  # only a ModelDrafter's language model switches
    assert static_drafting(eager_lm, compile=False) is eager_lm


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_only_the_plain_rule_becomes_greedy_under_greedy_decoding(target, temperature, monkeypatch):
    used = []
    monkeypatch.setattr(presets, "speculative_generate", lambda *args, acceptance, **kwargs: used.append(acceptance))
    prompt = torch.randint(2, VOCAB, (1, 4), generator=torch.Generator().manual_seed(0))
    ablation = SpeculativeSampling(steps=WalkSteps())
    for rule in (SpeculativeSampling(), ablation):
        presets.Method(EarlyExit(target, 1), rule).generate(target, prompt, temperature=temperature)
    plain, kept = used
    assert (type(plain) is Greedy) == (temperature == 0.0) and kept is ablation
