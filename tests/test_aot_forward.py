"""Compiled static forwards cached as AOTInductor packages: a compiled :class:`StaticTarget` decodes what
``generate`` decodes through a package, a second target (a second process) loads it instead of compiling, one package
serves every attended window, and a damaged package or changed weights compile afresh."""

import json

import pytest
import torch
from _tiny import tiny_causal_lm
from test_eagle import PROMPT, hf_greedy, trained_eagle3

from specprim import DraftTree, speculative_generate
from specprim.acceptance import Greedy
from specprim.drafters import PromptLookup, StaticEagleDraftModel, TreeDrafter
from specprim.hf import HFTarget, StaticTarget, _aot_forward
from specprim.models import pack_weights, packing_supported
from specprim.trees import Chain

LOOKUP = PromptLookup(num_tokens=3, max_matches=1)  # at most 3 nodes: every forward pads to 4 tokens, one package
TREE = DraftTree(tokens=torch.tensor([[11, 12, 13]]), parents=torch.tensor([-1, 0, 1]))  # 4 padded tokens


@pytest.fixture
def packages(tmp_path_factory, monkeypatch):
    """Packages on, kept in one temporary cache for the module (its tests run in order: the tiny model's package
    compiles once); yields a list of the packages each test compiled."""
    monkeypatch.setenv("SPECPRIM_AOT", "1")
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path_factory.getbasetemp() / "aot-cache"))
    compiled = []
    compile_package = torch._inductor.aoti_compile_and_package

    def counting(program, package_path):
        compiled.append(package_path)
        return compile_package(program, package_path=package_path)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", counting)
    return compiled


def test_a_compiled_target_decodes_what_generate_decodes_through_packages_a_second_target_loads(packages):
    target = tiny_causal_lm("llama")
    verifier = StaticTarget(target, min_padded=4)
    assert verifier._aot_cached
    out = speculative_generate(verifier, PROMPT, drafter=LOOKUP, acceptance=Greedy(), max_new_tokens=24,
                               eos_token_id=None)
    assert torch.equal(out.sequences, hf_greedy(target, PROMPT, 24))
    assert len(packages) == 1 and list(_aot_forward.aot_dir().glob("*.pt2"))
    again = StaticTarget(target, min_padded=4)  # as a new process would: nothing compiled in memory
    second = speculative_generate(again, PROMPT, drafter=LOOKUP, acceptance=Greedy(), max_new_tokens=24,
                                  eos_token_id=None)
    assert torch.equal(second.sequences, out.sequences) and len(packages) == 1  # loaded, not compiled


def test_a_forward_that_writes_a_copy_of_the_cache_is_caught(packages, monkeypatch):
    """The parity check above fails for a package call whose KV entries do not reach the target's cache."""
    call = _aot_forward.CachedForward.__call__

    def on_a_copy(self, cache, *inputs):
        saved = [(layer.keys, layer.values) for layer in cache.layers]
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
        try:
            return call(self, cache, *inputs)
        finally:
            for layer, (keys, values) in zip(cache.layers, saved, strict=True):
                layer.keys, layer.values = keys, values

    monkeypatch.setattr(_aot_forward.CachedForward, "__call__", on_a_copy)
    target = tiny_causal_lm("llama")
    out = speculative_generate(StaticTarget(target, min_padded=4), PROMPT, drafter=LOOKUP, acceptance=Greedy(),
                               max_new_tokens=24, eos_token_id=None)
    assert not torch.equal(out.sequences, hf_greedy(target, PROMPT, 24)) and packages == []


def test_compiled_static_eagle_drafting_through_packages_decodes_what_generate_decodes(packages):
    target, head = trained_eagle3.__wrapped__()
    drafter = TreeDrafter(StaticEagleDraftModel(head), Chain(3))  # one node per extend: 2-row steps
    assert drafter.model._aot_cached
    out = speculative_generate(StaticTarget(target, compile=False), PROMPT, drafter=drafter, acceptance=Greedy(),
                               max_new_tokens=32)
    assert torch.equal(out.sequences, hf_greedy(target, PROMPT, 32))
    assert out.stats.tau > 1.2 and packages  # the head's drafts are accepted: its package computes the head step


def test_one_package_serves_every_window_and_writes_the_cache_as_the_eager_loop(packages):
    target = tiny_causal_lm("llama")
    verifier, reference = StaticTarget(target, min_padded=4), HFTarget(target)
    for prompt in (PROMPT[:, :4], PROMPT):
        verifier.start(prompt)
        reference.start(prompt)
        logits, _ = verifier.verify(prompt[:, -1], TREE)
        torch.testing.assert_close(logits, reference.verify(prompt[:, -1], TREE)[0], rtol=1e-4, atol=1e-4)
        eager = StaticTarget(target, compile=False)
        eager.start(prompt)
        eager.verify(prompt[:, -1], TREE)
        written = prompt.shape[1] - 1 + 4
        for ours, theirs in zip(verifier.cache.layers, eager.cache.layers, strict=True):
            torch.testing.assert_close(ours.keys[:, :, :written], theirs.keys[:, :, :written], rtol=1e-4, atol=1e-4)
            assert int(ours.cumulative_length) == int(theirs.cumulative_length) == written
    assert packages == []  # the first test's package


def test_a_damaged_package_compiles_afresh_and_other_weights_have_another_key(packages):
    target = tiny_causal_lm("llama")
    (package,) = _verifier_packages()  # the first test's
    package.write_bytes(package.read_bytes()[:1000])  # cut short
    damaged = StaticTarget(target, min_padded=4)
    damaged.start(PROMPT)
    logits, _ = damaged.verify(PROMPT[:, -1], TREE)
    reference = HFTarget(target)
    reference.start(PROMPT)
    torch.testing.assert_close(logits, reference.verify(PROMPT[:, -1], TREE)[0], rtol=1e-4, atol=1e-4)
    assert len(packages) == 1 and package.stat().st_size > 1000  # compiled again, in place
    before = _aot_forward.weights_fingerprint(target)
    with torch.no_grad():
        target.lm_head.weight[0, 0] += 1e-3
    assert _aot_forward.weights_fingerprint(target) != before  # so its packages' keys differ


@pytest.mark.skipif(not packing_supported(), reason="this CPU cannot pack bfloat16 weights")
def test_a_packed_bfloat16_target_verifies_through_a_package_as_the_eager_one(packages):
    """Packed bfloat16 models (the shipped recipes on a CPU with native bfloat16) are packaged too, compiled under
    ``no_grad`` as the warm-up compiles them (where AOTInductor's freezing of bfloat16 programs used to fail)."""
    target = pack_weights(tiny_causal_lm("llama").to(torch.bfloat16))
    verifier, eager = StaticTarget(target, min_padded=4), StaticTarget(target, compile=False)
    assert verifier._aot_cached
    with torch.no_grad():
        verifier.start(PROMPT)
        eager.start(PROMPT)
        logits, _ = verifier.verify(PROMPT[:, -1], TREE)
        expected, _ = eager.verify(PROMPT[:, -1], TREE)
    torch.testing.assert_close(logits.float(), expected.float(), rtol=2e-2, atol=2e-2)
    keys = [json.loads(key.read_text()) for key in _aot_forward.aot_dir().glob("*.json")]
    assert packages and any(key["dtype"] == "torch.bfloat16" for key in keys)  # the prefill's and the tree's


def test_packages_apply_to_windowed_sdpa_on_cpu_unless_switched_off(monkeypatch):
    target = tiny_causal_lm("llama")
    monkeypatch.setenv("SPECPRIM_AOT", "1")
    assert StaticTarget(target)._aot_cached and not StaticTarget(target, compile=False)._aot_cached
    monkeypatch.setenv("SPECPRIM_AOT", "0")
    assert not StaticTarget(target)._aot_cached
    monkeypatch.setenv("SPECPRIM_AOT", "1")
    target.config._attn_implementation = "eager"
    assert not StaticTarget(target)._aot_cached


def _verifier_packages():
    """The verifier's packages in the cache (the EAGLE head's are told apart by the key written beside each)."""
    keys = _aot_forward.aot_dir().glob("*.json")
    return [key.with_suffix(".pt2") for key in keys if json.loads(key.read_text())["shape"].startswith("verifier")]
