"""Greedy parity on the embedded default model: speculative_generate equals model.generate token for token
(fp32) with prompt lookup, an independent draft LM (a bf16 copy of the target; chain and dynamic tree), early exit,
and the shipped EAGLE-3 head verified through the static-cache verifier."""

import copy

import pytest
import torch
from _cores import worker_threads

from specprim import presets, speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.cli import chat_input_ids
from specprim.drafters import EarlyExit, ModelDrafter, PromptLookup
from specprim.hf import StaticTarget
from specprim.models import load
from specprim.trees import Chain, DynamicTree

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Rewrite this sentence in the passive voice: The committee approved the new budget on Monday.",
    "List three facts about the Moon.",
]


@pytest.fixture(scope="module")
def smollm2():
    with worker_threads():
        model, tokenizer = load("smollm2-135m-instruct")
        draft = copy.deepcopy(model).to(torch.bfloat16)  # close to the target but not bit-identical
        yield model, tokenizer, draft


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_parity_on_smollm2(smollm2, prompt):
    model, tokenizer, draft = smollm2
    ids = chat_input_ids(tokenizer, prompt)
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    methods = [(PromptLookup(num_tokens=6), Greedy()), (ModelDrafter(draft, Chain(4)), SpeculativeSampling())]
    for drafter, rule in methods:
        out = speculative_generate(model, ids, drafter=drafter, acceptance=rule, max_new_tokens=64,
                                   eos_token_id=tokenizer.eos_token_id)
        assert torch.equal(out.sequences, expected), (drafter, tokenizer.decode(out.sequences[0, ids.shape[1]:]))


def test_early_exit_and_tree_drafting_parity_on_smollm2(smollm2):
    model, tokenizer, draft = smollm2
    ids = chat_input_ids(tokenizer, PROMPTS[0])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    drafters = [EarlyExit(model, 24, tree=Chain(2)), ModelDrafter(draft, DynamicTree(depth=4, top_k=2, budget=8))]
    for drafter in drafters:
        out = speculative_generate(model, ids, drafter=drafter, acceptance=Greedy(), max_new_tokens=32,
                                   eos_token_id=tokenizer.eos_token_id)
        assert torch.equal(out.sequences, expected), drafter


def test_static_target_parity_with_the_shipped_eagle3_head_on_smollm2(smollm2):
    """The static-cache verifier (eager: the reference of the compiled path) with the shipped head's hidden states."""
    model, tokenizer, _ = smollm2
    ids = chat_input_ids(tokenizer, PROMPTS[1])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    method = presets.from_name("eagle3", target=model, head="smollm2-135m-instruct-eagle3",
                               tree="dynamic:depth=3,top_k=3,budget=9")
    out = method.generate(StaticTarget(model, compile=False), ids, max_new_tokens=32,
                          eos_token_id=tokenizer.eos_token_id)
    assert out.stats.tau > 1.2  # the head's drafts are accepted, so accepted nodes move in the static cache
    assert torch.equal(out.sequences, expected), tokenizer.decode(out.sequences[0, ids.shape[1]:])
