"""SuffixDecoding: frequency-scored trees from the longest suffix match in the request and in earlier outputs, sized
by the match length; deterministic drafts, greedy parity with model.generate, the sampled distribution, learning
from a finished generation, the memory bound, and argument checks."""

from __future__ import annotations

import pytest
import torch
from _tiny import tiny_causal_lm
from test_prompt_lookup import repeated_prompt

from specprim import presets, speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import DraftRequest, PromptLookup, UnionDrafter
from specprim.drafters._suffix import SuffixDecoding
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square

# "1 2 3" occurs three times before the end, followed by 4 9 / 5 8 / 4 6 (most recent last)
IDS = [7, 1, 2, 3, 4, 9, 7, 1, 2, 3, 5, 8, 7, 1, 2, 3, 4, 6, 0, 1, 2, 3]


def request(ids, step=1, max_depth=8, vocab_size=100, sampling=None):
    return DraftRequest(input_ids=torch.tensor([ids]), sampling=sampling or SamplingConfig(), vocab_size=vocab_size,
                        max_depth=max_depth, step=step)


def generation(drafter, prompt, output):
    """Feed ``drafter`` one finished generation of ``output`` after ``prompt`` through propose / observe."""
    from specprim._types import Verdict

    drafter.propose(request(prompt, step=0))
    drafter.propose(request(prompt + output[:-1], step=1))
    drafter.observe(Verdict(path=torch.zeros(1, 0, dtype=torch.long), num_accepted=torch.tensor([0]),
                            next_token=torch.tensor([output[-1]])))


def test_the_tree_holds_the_best_scored_continuations_of_the_longest_match():
    tree = SuffixDecoding(min_prob=0.0).propose(request(IDS))
    # match "1 2 3" (p = 3): 3 nodes; "4" starts 2 of 3 continuations, then the depth-0 "5", then "4 6" (most recent)
    assert tree.tokens.tolist() == [[4, 5, 6]] and tree.parent_list == [-1, -1, 0]
    assert tree.sampling == "deterministic" and tree.q is None
    wide = SuffixDecoding(alpha=3.0, min_prob=0.0).propose(request(IDS))  # 9 nodes allowed, 3 + 3 + ... exist
    assert wide.tokens[0, :2].tolist() == [4, 5] and wide.num_nodes == 9
    # min_prob drops nodes that fewer than that share of the occurrences reach (a prefix in score order)
    assert SuffixDecoding(alpha=3.0, min_prob=0.5).propose(request(IDS)).tokens.tolist() == [[4]]


def test_drafts_are_deterministic_as_declared():
    """The q-contract for a deterministic drafter: q is None and the same request gives the same tree, greedy or
    sampled, so the rule treats the nodes as fixed candidates."""
    drafter = SuffixDecoding(alpha=2.0)
    generation(drafter, [5, 6], [1, 2, 3, 4, 11, 12, 13])
    for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0, top_k=5)):
        trees = [drafter.propose(request(IDS, sampling=sampling)) for _ in range(3)]
        for tree in trees:
            assert tree.sampling == "deterministic" and tree.q is None
            assert torch.equal(tree.tokens, trees[0].tokens) and tree.parent_list == trees[0].parent_list
            pairs = list(zip(tree.parent_list, tree.tokens[0].tolist(), strict=True))
            assert len(set(pairs)) == len(pairs)  # distinct siblings
            assert all(p < i for i, p in enumerate(tree.parent_list))


def test_adaptive_size_follows_the_match_length():
    body = list(range(20, 60))  # distinct tokens: one occurrence, every continuation scores 1
    for alpha in (0.5, 1.0, 2.0):
        drafter = SuffixDecoding(alpha=alpha, max_tokens=12)
        sizes = [drafter.propose(request(body + body[:p], max_depth=40)).num_nodes for p in range(1, 10)]
        assert sizes == [min(12, int(alpha * p)) for p in range(1, 10)]
        assert sizes == [drafter.size_for(p) for p in range(1, 10)]
    capped = SuffixDecoding(max_match=4).propose(request(body + body[:8], max_depth=40))
    assert capped.num_nodes == 4  # the match is cut at max_match tokens
    assert SuffixDecoding().propose(request(body + body[:8], max_depth=3)).depth == 3
    assert SuffixDecoding(min_match=3).propose(request(body + body[:2])).num_nodes == 0
    assert SuffixDecoding().propose(request([1, 2, 3])).num_nodes == 0  # no match: nothing drafted


def test_the_global_index_learns_a_finished_generation():
    drafter = SuffixDecoding()
    answer = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    generation(drafter, [1, 2, 3], answer)
    assert drafter.stored_tokens == 0  # learnt when the next generation starts
    tree = drafter.propose(request([9, 8, 40, 41, 42, 43], step=0))  # a new request restating the old answer
    assert drafter.stored_tokens == len(answer)
    assert tree.tokens.tolist() == [[44, 45, 46, 47]]  # p = 4 matched tokens -> 4 nodes, from the stored output
    assert SuffixDecoding(max_stored=0).propose(request([9, 8, 40, 41, 42, 43], step=0)).num_nodes == 0
    drafter.finish()  # also learnt on demand
    assert drafter.stored_tokens == len(answer)  # the current one had no output yet


def test_the_better_scored_index_drafts():
    drafter = SuffixDecoding(min_prob=0.0)
    generation(drafter, [1], [30, 31, 32, 33, 34, 35, 36, 37])
    # the request matches "31" (p = 1) alone; the global index matches "30 31 32" (p = 3): its 3-node tree wins
    tree = drafter.propose(request([31, 99, 30, 31, 32], step=0))
    assert tree.tokens.tolist() == [[33, 34, 35]]


def test_memory_bound_evicts_the_oldest_outputs():
    drafter = SuffixDecoding(max_stored=100)
    for i in range(40):
        generation(drafter, [1], [2 + i] + list(range(60, 77)) + [90 + i % 5])  # 19 tokens each
        assert drafter.stored_tokens <= 100
    drafter.propose(request([1], step=0))
    assert 100 - 19 < drafter.stored_tokens <= 100
    assert drafter.propose(request([5, 2], step=1)).num_nodes == 0  # the oldest outputs (tokens 2, 3, ...) are gone
    assert drafter.propose(request([5, 41], step=1)).tokens[0, 0].item() == 60  # the newest is kept
    long = SuffixDecoding(max_stored=10)
    generation(long, [1], list(range(20, 50)))
    long.finish()
    assert long.stored_tokens == 10  # an output longer than the cap keeps its last tokens
    assert long.propose(request([5, 45], step=1)).tokens[0].tolist()[:1] == [46]


@pytest.mark.parametrize("fields", [
    dict(max_match=0), dict(min_match=0), dict(min_match=5, max_match=4), dict(max_tokens=0), dict(max_stored=-1),
    dict(alpha=0.0), dict(alpha=float("inf")), dict(alpha="1"), dict(min_prob=1.5), dict(min_prob=-0.1),
    dict(max_tokens=2.0), dict(max_match=True),
])
def test_bad_arguments_give_one_line_value_errors(fields):
    with pytest.raises(ValueError) as error:
        SuffixDecoding(**fields)
    assert "\n" not in str(error.value)


def test_batch_and_vocabulary_errors():
    with pytest.raises(ValueError, match="batch size 1"):
        SuffixDecoding().propose(DraftRequest(input_ids=torch.ones(2, 4, dtype=torch.long),
                                              sampling=SamplingConfig(), vocab_size=10, max_depth=3))
    drafter = SuffixDecoding()
    generation(drafter, [1], [70, 71, 72])
    with pytest.raises(ValueError, match="outside the target's vocabulary") as error:
        drafter.propose(request([1, 2], step=0, vocab_size=50))
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------------------------------------
# end to end on tiny models


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("rule", [Greedy(), SpeculativeSampling()], ids=["greedy", "spec-sampling"])
def test_greedy_parity_with_generate_across_requests(arch, rule):
    target = tiny_causal_lm(arch, seed=0)
    drafter = SuffixDecoding()
    for seed in (7, 8, 7):  # the third request repeats the first: the global index drafts from its output
        prompt = repeated_prompt(seed)
        expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40,
                                   do_sample=False, pad_token_id=0)
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=rule, max_new_tokens=40)
        assert torch.equal(out.sequences, expected)
    assert drafter.stored_tokens > 0


def test_tau_rises_once_the_global_index_has_seen_the_answer():
    target = tiny_causal_lm("llama", seed=0)
    prompt = repeated_prompt(3)
    learning, forgetful = SuffixDecoding(), SuffixDecoding(max_stored=0)
    first = speculative_generate(target, prompt, drafter=learning, acceptance=Greedy(), max_new_tokens=48)
    second = speculative_generate(target, prompt, drafter=learning, acceptance=Greedy(), max_new_tokens=48)
    alone = speculative_generate(target, prompt, drafter=forgetful, acceptance=Greedy(), max_new_tokens=48)
    assert torch.equal(first.sequences, second.sequences) and torch.equal(second.sequences, alone.sequences)
    assert second.stats.tau > first.stats.tau + 0.5 and second.stats.tau > alone.stats.tau + 0.5


def test_composes_in_a_union_with_parity():
    target = tiny_causal_lm("llama", seed=0)
    prompt = repeated_prompt(5)
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                               pad_token_id=0)
    union = UnionDrafter(SuffixDecoding(), PromptLookup(num_tokens=4))
    for _ in range(2):
        out = speculative_generate(target, prompt, drafter=union, acceptance=Greedy(), max_new_tokens=32)
        assert torch.equal(out.sequences, expected)
    assert union.drafters[0].stored_tokens > 0


def test_sampling_keeps_the_target_distribution():
    target = tiny_causal_lm("llama", seed=0, vocab=5)
    with torch.no_grad():
        target.lm_head.weight.mul_(40)  # peaked, so that drafts are often accepted
    prompt = torch.tensor([[2, 3, 0, 1, 4, 2, 3, 0, 2, 3, 1, 1, 2, 3]])  # "2 3" followed by 0 / 0 / 1 / (end)
    drafter = SuffixDecoding(alpha=2.0, min_prob=0.0)
    assert drafter.propose(request(prompt[0].tolist(), step=1, vocab_size=5, max_depth=2)).num_nodes >= 3
    p_value = two_token_chi_square(target, prompt, drafter=drafter, acceptance=SpeculativeSampling(),
                                   sampling=SamplingConfig(temperature=1.0), trials=1500)
    assert p_value > 1e-3


def test_preset_and_command_line_name():
    target = tiny_causal_lm("llama", seed=0)
    method = presets.from_name("suffix", target=target)
    assert isinstance(method.drafter, SuffixDecoding) and isinstance(method.acceptance, SpeculativeSampling)
    assert presets.from_name("suffix", target=target, num_draft=6).drafter.max_tokens == 6
    union = presets.from_name("suffix+prompt-lookup", target=target)
    assert isinstance(union.drafter, UnionDrafter)
