"""Every preset, built by name as the command line does, is lossless under greedy decoding (parity with
model.generate) on a tiny random target, with untrained heads saved and reloaded from disk; bad options get
clear errors. Also the q-contract of every drafter, checked empirically."""

import dataclasses

import pytest
import torch
from _tiny import tiny_causal_lm
from scipy import stats

from specprim import presets, speculative_generate
from specprim._types import DraftRequest
from specprim.drafters import (
    Datastore,
    EagleHead,
    EarlyExit,
    MedusaHeads,
    ModelDrafter,
    MTPHead,
    ParallelHead,
    PromptLookup,
)
from specprim.sampling import SamplingConfig
from specprim.trees import Chain, DynamicTree, StaticTree

VOCAB = 12  # small, so that random drafts are accepted now and then and paths of several tokens get committed


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", seed=0, vocab=VOCAB, layers=4)


@pytest.fixture(scope="module")
def heads(target, tmp_path_factory):
    """Directories of untrained heads saved for ``target``."""
    root = tmp_path_factory.mktemp("heads")
    torch.manual_seed(0)
    made = {
        "medusa": MedusaHeads.from_target(target, num_heads=3),
        "eagle": EagleHead.from_target(target, version=1),
        "eagle3": EagleHead.from_target(target, version=3, draft_vocab_size=8),
        "mtp": MTPHead.from_target(target),
        "parallel": ParallelHead.from_target(target, 3, draft_vocab_size=8),
    }
    for name, head in made.items():
        head.save_pretrained(root / name)
    return {name: str(root / name) for name in made}


@pytest.mark.parametrize("name", presets.NAMES)
def test_every_preset_by_name_is_lossless_under_greedy(name, target, heads):
    draft = tiny_causal_lm("llama", seed=1, vocab=VOCAB, layers=2)
    store = Datastore([[4, 5, 3, 4, 5, 6], [5, 3, 4, 7]])
    method = presets.from_name(name, target=target, draft=draft, head=heads.get(name), num_draft=3, datastore=store)
    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                               do_sample=False, pad_token_id=0, eos_token_id=None)
    out = method.generate(target, prompt, max_new_tokens=24)
    assert torch.equal(out.sequences, expected), name


def test_names_cover_the_families():
    assert set(presets.NAMES) == {"leviathan", "prompt-lookup", "datastore", "early-exit", "medusa", "eagle", "eagle3",
                                  "mtp", "suffix", "parallel"}


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("nope", {}, "unknown method"),
        ("leviathan", {}, "needs a draft model"),
        ("eagle3", {}, "needs a trained head"),
        ("datastore", {}, "needs a datastore"),
        ("early-exit", {"exit_layer": 4}, "exit layer"),
    ],
)
def test_bad_options(name, options, message, target):
    with pytest.raises(ValueError, match=message):
        presets.from_name(name, target=target, **options)


def test_eagle_version_must_match_the_preset(target, heads):
    with pytest.raises(ValueError, match="EAGLE-3 head"):
        presets.eagle3(EagleHead.from_pretrained(heads["eagle"], target))


def test_head_saved_for_another_target_is_rejected(heads):
    other = tiny_causal_lm("llama", seed=0, vocab=VOCAB + 5, layers=4)
    with pytest.raises(ValueError):
        presets.from_name("medusa", target=other, head=heads["medusa"])


# ----------------------------------------------------------------------------------------- the q-contract

TRIALS = 1500


def drafters_under_test(target, heads):
    """One drafter per family, each with a chain so that it samples under temperature > 0."""
    return {
        "model": ModelDrafter(tiny_causal_lm("llama", seed=1, vocab=VOCAB, layers=2), Chain(2)),
        "early-exit": EarlyExit(target, 2, tree=Chain(2)),
        "medusa": presets.medusa(MedusaHeads.from_pretrained(heads["medusa"], target), tree=Chain(2)).drafter,
        "eagle3": presets.eagle3(EagleHead.from_pretrained(heads["eagle3"], target), tree=Chain(2)).drafter,
        "mtp": presets.mtp(MTPHead.from_pretrained(heads["mtp"], target), k=2).drafter,
    }


def target_features(target, ids, layers):
    from specprim.drafters import TargetFeatures

    if not layers:
        return None
    with torch.no_grad():
        hidden = target(ids[:, :-1], output_hidden_states=True).hidden_states
    return TargetFeatures(hidden_states=tuple(hidden[i] for i in layers), token_ids=ids[:, :-1], start=0)


def q_contract_p_value(drafter, target) -> float:
    """Repeated proposals from one context: chi-square p-value of the first drafted token's frequencies against
    the returned q row 0, which must be the same every time."""
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    sampling = SamplingConfig(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    features = target_features(target, ids, getattr(drafter, "feature_layers", ()))
    counts, q0 = torch.zeros(VOCAB), None
    for _ in range(TRIALS):
        request = DraftRequest(input_ids=ids, sampling=sampling, vocab_size=VOCAB, max_depth=2,
                               generator=generator, step=0, features=features)
        tree = drafter.propose(request)
        assert tree.sampling == "iid"
        q0 = tree.q[0, 0] if q0 is None else q0
        torch.testing.assert_close(tree.q[0, 0], q0)
        counts[tree.tokens[0, 0]] += 1
    expected = q0.double() / q0.double().sum() * TRIALS  # renormalised in float64 for the test's arithmetic
    keep = expected > 0
    assert counts[~keep].sum() == 0
    return float(stats.chisquare(counts[keep].double(), expected[keep]).pvalue)


@pytest.mark.parametrize("family", ["model", "early-exit", "medusa", "eagle3", "mtp"])
def test_sampling_drafters_return_the_q_they_sampled_from(family, target, heads):
    assert q_contract_p_value(drafters_under_test(target, heads)[family], target) > 1e-4


def test_q_contract_check_rejects_a_drafter_that_reports_another_q(target):
    class Flattened(ModelDrafter):
        """Samples from its distribution but reports a flatter one (as if at a higher temperature)."""

        def propose(self, request):
            tree = super().propose(request)
            flat = tree.q.sqrt()
            return dataclasses.replace(tree, q=flat / flat.sum(-1, keepdim=True).clamp_min(1e-30))

    draft = tiny_causal_lm("llama", seed=1, vocab=VOCAB, layers=2)
    with torch.no_grad():
        draft.lm_head.weight.mul_(30)  # far from uniform, so that flattening shows
    drafter = Flattened(draft, Chain(2))
    assert q_contract_p_value(drafter, target) < 1e-6


@pytest.mark.parametrize("tree", [StaticTree.from_branching((3, 2)), DynamicTree(depth=3, top_k=2, budget=6)])
def test_top_k_trees_and_prompt_lookup_declare_deterministic(tree, target):
    ids = torch.tensor([[3, 4, 5, 3, 4, 5, 3]])
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0)):
        request = DraftRequest(input_ids=ids, sampling=sampling, vocab_size=VOCAB, max_depth=3)
        for drafter in (ModelDrafter(target, tree), PromptLookup()):
            first, second = drafter.propose(request), drafter.propose(request)
            assert first.sampling == "deterministic" and torch.equal(first.tokens, second.tokens)
    greedy = DraftRequest(input_ids=ids, sampling=SamplingConfig(), vocab_size=VOCAB, max_depth=3)
    assert ModelDrafter(target, Chain(3)).propose(greedy).sampling == "deterministic"


def test_sampled_generation_with_every_family_is_reproducible(target, heads):
    prompt = torch.tensor([[3, 4, 5]])
    for family, drafter in drafters_under_test(target, heads).items():
        runs = [
            speculative_generate(target, prompt, drafter=drafter, acceptance=presets.SpeculativeSampling(),
                                 max_new_tokens=10, temperature=1.0, generator=torch.Generator().manual_seed(5))
            for _ in range(2)
        ]
        assert torch.equal(runs[0].sequences, runs[1].sequences), family


def test_method_verifies_greedy_decoding_with_the_equivalent_greedy_rule(target, monkeypatch):
    """Under greedy decoding a preset's SpeculativeSampling is swapped for Greedy: same tokens, same accepted
    paths at every step; under sampling, and for any other rule, the given rule runs."""
    from specprim.acceptance import SpeculativeSampling

    draft = tiny_causal_lm("llama", seed=3, vocab=VOCAB)
    prompt = torch.randint(2, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    method = presets.leviathan(draft, tree=DynamicTree(depth=3, top_k=3, budget=8))
    fast = method.generate(target, prompt, max_new_tokens=24)
    slow = speculative_generate(target, prompt, drafter=method.drafter, acceptance=SpeculativeSampling(),
                                max_new_tokens=24)
    assert torch.equal(fast.sequences, slow.sequences) and fast.stats.accepted == slow.stats.accepted
    assert sum(fast.stats.accepted) > 0
    used = []
    original = SpeculativeSampling.__call__
    monkeypatch.setattr(SpeculativeSampling, "__call__",
                        lambda self, *a, **k: used.append(1) or original(self, *a, **k))
    method.generate(target, prompt, max_new_tokens=4)
    assert not used  # greedy: the Greedy rule ran
    method.generate(target, prompt, max_new_tokens=4, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert used  # sampling: the preset's own rule
