"""UnionDrafter: the merged trie, greedy parity with `generate`, the sampled distribution (chi-square) and a broken
merge of sampled trees that the same check rejects, per-drafter features and verdicts, presets joined by '+'."""

import dataclasses

import pytest
import torch
from _tiny import tiny_causal_lm

from specprim import DraftTree, speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import DatastoreLookup, DraftRequest, ModelDrafter, PromptLookup, TargetFeatures, UnionDrafter
from specprim.presets import from_name, is_name, prompt_lookup, union
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree, parse_tree

VOCAB = 5
PROMPT = torch.tensor([[1, 2, 3, 1, 2]])
GREEDY = SamplingConfig(temperature=0.0)


@dataclasses.dataclass
class FixedDrafter:
    """Proposes the same deterministic tree every step; records what it was asked and told."""

    tokens: list[int]
    parents: list[int]
    feature_layers: tuple[int, ...] = ()
    requests: list = dataclasses.field(default_factory=list)
    verdicts: list = dataclasses.field(default_factory=list)

    def propose(self, request):
        self.requests.append(request)
        return DraftTree(tokens=torch.tensor([self.tokens]).reshape(1, -1),
                         parents=torch.tensor(self.parents, dtype=torch.long), sampling="deterministic")

    def observe(self, verdict):
        self.verdicts.append(verdict)


def request(features=None):
    return DraftRequest(input_ids=PROMPT, sampling=GREEDY, vocab_size=VOCAB, max_depth=4, features=features)


def test_the_union_is_the_merged_trie_first_drafter_first():
    a = FixedDrafter([7, 8, 9], [-1, 0, -1])  # 7 -> 8, and 9
    b = FixedDrafter([7, 5, 9, 4], [-1, 0, 1, -1])  # 7 -> 5 -> 9, and 4
    tree = UnionDrafter(a, b).propose(request())
    assert tree.tokens[0].tolist() == [7, 8, 9, 5, 9, 4]
    assert tree.parent_list == [-1, 0, -1, 0, 3, -1]
    assert tree.sampling == "deterministic" and tree.q is None


def test_every_drafter_learns_its_own_accepted_prefix():
    a = FixedDrafter([7, 8, 9], [-1, 0, -1])
    b = FixedDrafter([7, 5, 9, 4], [-1, 0, 1, -1])
    drafter = UnionDrafter(a, b)
    drafter.propose(request())
    # the target accepted 7 -> 5 -> 9 (merged nodes 0, 3, 4) and then emitted 2
    drafter.observe(_verdict([0, 3, 4], 2))
    assert a.verdicts[-1].path.tolist() == [[0]] and a.verdicts[-1].next_token.tolist() == [5]
    assert b.verdicts[-1].path.tolist() == [[0, 1, 2]] and b.verdicts[-1].next_token.tolist() == [2]
    assert int(a.verdicts[-1].num_accepted[0]) == 1 and int(b.verdicts[-1].num_accepted[0]) == 3


def test_max_nodes_keeps_the_first_merged_nodes_and_verdicts_follow():
    a = FixedDrafter([7, 8, 9], [-1, 0, -1])
    b = FixedDrafter([7, 5, 9, 4], [-1, 0, 1, -1])  # merged 0, 3, 4, 5: only 7 (shared) and 5 survive a cap of 4
    drafter = UnionDrafter(a, b, max_nodes=4)
    tree = drafter.propose(request())
    assert tree.tokens[0].tolist() == [7, 8, 9, 5] and tree.parent_list == [-1, 0, -1, 0]
    assert "max_nodes=4" in repr(drafter)
    drafter.observe(_verdict([0, 3], 6))  # 7 -> 5 accepted, then the target emitted 6
    assert a.verdicts[-1].path.tolist() == [[0]] and a.verdicts[-1].next_token.tolist() == [5]
    assert b.verdicts[-1].path.tolist() == [[0, 1]] and b.verdicts[-1].next_token.tolist() == [6]
    assert UnionDrafter(a, b, max_nodes=10).propose(request()).num_nodes == 6  # a cap above the size changes nothing
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_nodes"):
            UnionDrafter(a, b, max_nodes=bad)


@dataclasses.dataclass
class StatelessDrafter(FixedDrafter):
    stateless = True  # a class attribute, as PromptLookup and DatastoreLookup declare it


@pytest.mark.parametrize("declared", [True, False])
def test_a_stateless_drafter_is_skipped_once_the_cap_is_full(declared):
    kind = StatelessDrafter if declared else FixedDrafter
    first = FixedDrafter([7, 8, 9], [-1, 0, -1])
    late = kind([4, 5], [-1, 0])
    for cap, expected_calls in ((2, 0 if declared else 1), (3, 0 if declared else 1), (4, 1), (None, 1)):
        late.requests.clear()
        drafter = UnionDrafter(first, late, max_nodes=cap)
        tree = drafter.propose(request())
        want = [7, 8, 9, 4, 5][: cap or 5]
        assert tree.tokens[0].tolist() == want  # the same union whether or not it was asked
        assert len(late.requests) == expected_calls, cap
        drafter.observe(_verdict([0, 1], 3))
        assert late.verdicts[-1].path.numel() == 0 and late.verdicts[-1].next_token.tolist() == [7]
    assert PromptLookup.stateless and DatastoreLookup.stateless
    model_drafter = ModelDrafter(tiny_causal_lm("llama"), Chain(2))
    assert not getattr(model_drafter, "stateless", False)  # it keeps a cache, so a union always asks it


def _verdict(path, next_token):
    from specprim._types import Verdict

    return Verdict(path=torch.tensor([path]), num_accepted=torch.tensor([len(path)]),
                   next_token=torch.tensor([next_token]))


def test_each_drafter_gets_exactly_its_own_feature_layers():
    a = FixedDrafter([7], [-1], feature_layers=(2, 5))
    b = FixedDrafter([8], [-1])
    c = FixedDrafter([9], [-1], feature_layers=(5, 1))
    drafter = UnionDrafter(a, b, c)
    assert drafter.feature_layers == (2, 5, 1)
    hidden = tuple(torch.full((1, 4, 3), float(layer)) for layer in drafter.feature_layers)
    drafter.propose(request(TargetFeatures(hidden_states=hidden, token_ids=PROMPT[:, :-1], start=0)))
    assert [h[0, 0, 0].item() for h in a.requests[-1].features.hidden_states] == [2.0, 5.0]
    assert b.requests[-1].features is None
    assert [h[0, 0, 0].item() for h in c.requests[-1].features.hidden_states] == [5.0, 1.0]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_union_equals_generate(arch):
    target = tiny_causal_lm(arch)
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 9, 10, 5, 6]])
    want = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                           eos_token_id=1, pad_token_id=0)
    drafter = UnionDrafter(ModelDrafter(tiny_causal_lm(arch, seed=1), DynamicTree(depth=3, top_k=2, budget=5)),
                           PromptLookup(num_tokens=4))
    out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=30,
                               eos_token_id=1)
    assert torch.equal(out.sequences, want)
    assert out.stats.steps < 30  # something was accepted
    capped = UnionDrafter(ModelDrafter(tiny_causal_lm(arch, seed=1), DynamicTree(depth=3, top_k=2, budget=5)),
                          PromptLookup(num_tokens=4), max_nodes=6)
    out = speculative_generate(target, prompt, drafter=capped, acceptance=Greedy(), max_new_tokens=30,
                               eos_token_id=1)
    assert torch.equal(out.sequences, want) and max(out.stats.tree_nodes) == 6


def peaked(seed: int) -> torch.nn.Module:
    model = tiny_causal_lm("llama", seed=seed, vocab=VOCAB)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model


TARGET = peaked(0)


def chi_square_p_value(drafter) -> float:
    return two_token_chi_square(TARGET, PROMPT, drafter=drafter, acceptance=SpeculativeSampling(),
                                sampling=SamplingConfig(temperature=1.0), trials=1500)


def test_sampled_union_of_deterministic_trees_matches_plain_sampling():
    drafter = UnionDrafter(ModelDrafter(peaked(1), DynamicTree(depth=2, top_k=2, budget=3)),
                           ModelDrafter(peaked(2), DynamicTree(depth=2, top_k=1, budget=2)),
                           PromptLookup(num_tokens=2))
    assert chi_square_p_value(drafter) > 1e-3


class MergesSampledTrees(UnionDrafter):
    """Broken on purpose: merges a sampled tree with deterministic ones and declares the union sampled like the first
    (iid from its ``q``). The acceptance rule then treats prompt-lookup tokens as draws from ``q`` and accepts
    them with probability ``min(1, p / q)`` instead of ``p``: the emitted tokens over-represent them."""

    def propose(self, request):
        trees = [d.propose(request) for d in self.drafters]
        if trees[0].q is None:  # max_depth 0: nothing drafted
            return trees[0]
        tokens, parents, node_of = [], [], {}
        for tree in trees:
            to_merged = []
            for token, parent in zip(tree.tokens[0].tolist(), tree.parent_list, strict=True):
                key = (-1 if parent == -1 else to_merged[parent], token)
                if key not in node_of:
                    node_of[key] = len(tokens)
                    tokens.append(token)
                    parents.append(key[0])
                to_merged.append(node_of[key])
        q = torch.cat([trees[0].q[:, :1], torch.zeros(1, len(tokens), VOCAB)], dim=1)  # root row; leaves ignored
        return DraftTree(tokens=torch.tensor([tokens]).reshape(1, -1), parents=torch.tensor(parents).long(), q=q,
                         sampling="iid")

    def observe(self, verdict):
        """The drafters keep no state."""


def test_the_check_rejects_a_merge_of_a_sampled_tree():
    broken = MergesSampledTrees(ModelDrafter(peaked(1), Chain(1)), PromptLookup(num_tokens=1))
    assert chi_square_p_value(broken) < 1e-6


def test_a_union_with_a_sampled_tree_is_refused_before_the_first_step_when_sampling():
    calls = []

    class CountingLookup(PromptLookup):
        def propose(self, request):
            calls.append(request)
            return super().propose(request)

    sampled_tree = UnionDrafter(ModelDrafter(peaked(1), parse_tree("sampled:2")),
                                CountingLookup(num_tokens=2))
    deterministic = UnionDrafter(ModelDrafter(peaked(1), parse_tree("static:2")), PromptLookup(num_tokens=2))
    assert sampled_tree.greedy_only and not deterministic.greedy_only
    with pytest.raises(ValueError, match="greedy decoding only"):
        speculative_generate(TARGET, PROMPT, drafter=sampled_tree, acceptance=SpeculativeSampling(), max_new_tokens=4,
                             temperature=1.0)
    assert calls == []  # refused up front, not when the sampled tree is first drafted
    greedy = speculative_generate(TARGET, PROMPT, drafter=sampled_tree, acceptance=SpeculativeSampling(),
                                  max_new_tokens=4)
    assert torch.equal(greedy.sequences, speculative_generate(TARGET, PROMPT, drafter=deterministic,
                                                              acceptance=Greedy(), max_new_tokens=4).sequences)
    assert calls  # under greedy decoding the sampled tree drafts top-k, and the union runs


def test_presets_join_with_plus(tmp_path):
    target = tiny_causal_lm("llama")
    draft = tiny_causal_lm("llama", seed=1)
    assert is_name("leviathan+prompt-lookup") and not is_name("leviathan+leviathan") and not is_name("a+b")
    method = from_name("leviathan+prompt-lookup", target=target, draft=draft, num_draft=3,
                       tree="dynamic:depth=2,top_k=2,budget=3")
    assert isinstance(method.drafter, UnionDrafter)
    lev, lookup = method.drafter.drafters
    assert lev.tree == DynamicTree(depth=2, top_k=2, budget=3) and lookup.num_tokens == 3
    prompt = torch.tensor([[5, 6, 7, 5, 6]])
    want = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                           eos_token_id=1, pad_token_id=0)
    assert torch.equal(method.generate(target, prompt, max_new_tokens=12, eos_token_id=1).sequences, want)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="at least two"):
        UnionDrafter(PromptLookup())
    lookup = PromptLookup()
    with pytest.raises(ValueError, match="appears twice"):
        UnionDrafter(lookup, lookup)
    with pytest.raises(TypeError, match="not a Drafter"):
        UnionDrafter(PromptLookup(), object())
    sampled = UnionDrafter(ModelDrafter(peaked(1), Chain(2)), PromptLookup())
    with pytest.raises(ValueError, match="deterministic trees only"):
        sampled.propose(DraftRequest(input_ids=PROMPT, sampling=SamplingConfig(temperature=1.0), vocab_size=VOCAB,
                                     max_depth=2, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="batch size 1"):
        UnionDrafter(PromptLookup(), FixedDrafter([7], [-1])).propose(
            DraftRequest(input_ids=PROMPT.expand(2, -1), sampling=GREEDY, vocab_size=VOCAB, max_depth=2))
    with pytest.raises(ValueError, match="unknown method"):
        from_name("prompt-lookup+prompt-lookup", target=tiny_causal_lm("llama"))
    with pytest.raises(ValueError, match="takes no tree"):
        from_name("prompt-lookup", target=tiny_causal_lm("llama"), tree="chain:2")
    with pytest.raises(ValueError, match="different rules"):
        union(prompt_lookup(), dataclasses.replace(prompt_lookup(), acceptance=Greedy()))
    with pytest.raises(ValueError, match="single method"):
        from_name("prompt-lookup", target=tiny_causal_lm("llama"), max_nodes=4)
