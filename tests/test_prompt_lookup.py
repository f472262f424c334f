"""PromptLookup trees: several matches merged into a trie (most recent first, no duplicates, depth cap), the
vectorised search against a naive reference, and greedy parity with model.generate."""

from __future__ import annotations

import inspect

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from hypothesis import given, settings
from hypothesis import strategies as st

from specprim import speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import Drafter, DraftRequest, PromptLookup
from specprim.sampling import SamplingConfig

# Three earlier occurrences of "1 2 3" (at the end too), followed by 4 6 / 5 8 / 4 9, most recent first.
IDS = [7, 1, 2, 3, 4, 9, 7, 1, 2, 3, 5, 8, 7, 1, 2, 3, 4, 6, 0, 1, 2, 3]


def propose(ids, max_depth=8, **fields):
    request = DraftRequest(
        input_ids=torch.tensor([ids]), sampling=SamplingConfig(), vocab_size=100, max_depth=max_depth
    )
    return PromptLookup(**fields).propose(request)


def test_matches_merge_into_a_trie_most_recent_first():
    tree = propose(IDS, num_tokens=2)
    assert tree.tokens.tolist() == [[4, 6, 5, 8, 9]]
    assert tree.parent_list == [-1, 0, -1, 2, 0]  # "4" is shared by the first and the third match
    assert tree.sampling == "deterministic" and tree.q is None
    protocol = list(inspect.signature(Drafter.propose).parameters)[1:]  # without self
    assert list(inspect.signature(PromptLookup().propose).parameters) == protocol


def test_max_matches_and_depth_cap():
    assert propose(IDS, num_tokens=2, max_matches=1).tokens.tolist() == [[4, 6]]  # the classic chain
    assert propose(IDS, num_tokens=2, max_matches=2).tokens.tolist() == [[4, 6, 5, 8]]
    capped = propose(IDS, num_tokens=2, max_depth=1)
    assert capped.tokens.tolist() == [[4, 5]] and capped.parent_list == [-1, -1]
    deep = propose(IDS, num_tokens=5)
    assert deep.depth == 5 and deep.num_nodes == 5 + 5 + 4  # [4 6 0 1 2] + [5 8 7 1 2] + [4] 9 7 1 2
    empty = propose(IDS, max_depth=0)
    assert empty.tokens.shape == (1, 0) and empty.parents.shape == (0,)


def test_longest_match_beats_a_more_recent_shorter_one():
    ids = [1, 2, 3, 4, 5, 9, 3, 8, 2, 3]  # "2 3" matched at 1..2 (-> 4); "3" alone more recently (-> 8)
    assert propose(ids, num_tokens=1).tokens.tolist() == [[4]]
    assert propose(ids, num_tokens=1, max_ngram=1).tokens.tolist() == [[8, 4]]  # both 1-gram matches


def test_no_match_or_too_short_is_empty():
    assert propose([1, 2, 3]).num_nodes == 0
    assert propose([5]).num_nodes == 0
    assert propose([1, 2, 9, 2], min_ngram=2).num_nodes == 0  # only a 1-gram match
    assert propose([1, 2, 9, 2], min_ngram=1).tokens.tolist() == [[9, 2]]


def test_identical_continuations_count_once():
    tree = propose([1, 2, 3] * 5 + [1, 2], num_tokens=4, max_matches=2)
    assert tree.tokens.tolist() == [[3, 1, 2, 3]]  # the next distinct one is a prefix: nothing new


@pytest.mark.parametrize("fields", [
    dict(max_matches=0), dict(num_tokens=0), dict(min_ngram=3, max_ngram=2), dict(min_ngram=0),
    dict(max_matches=1.5), dict(num_tokens=True),
])
def test_invalid_fields_raise(fields):
    with pytest.raises(ValueError):
        PromptLookup(**fields)


def test_batch_size_one_only():
    request = DraftRequest(input_ids=torch.ones(2, 4, dtype=torch.long), sampling=SamplingConfig(),
                           vocab_size=10, max_depth=3)
    with pytest.raises(ValueError, match="batch size 1"):
        PromptLookup().propose(request)


# ---------------------------------------------------------------------------------------------------------
# the vectorised search against a naive one


def reference(ids, *, max_ngram, min_ngram, num_tokens, max_matches, max_depth):
    """Naive PromptLookup: tokens and parents of the trie, written with plain loops."""
    total, length = len(ids), min(num_tokens, max_depth)

    def match_length(start):
        n = 0
        while n < min(max_ngram, start) and ids[start - 1 - n] == ids[total - 1 - n]:
            n += 1
        return n

    lengths = {start: match_length(start) for start in range(1, total)}
    best = max(lengths.values(), default=0)
    if length <= 0 or best < min_ngram:
        return [], []
    continuations = []
    for start in sorted((s for s, n in lengths.items() if n == best), reverse=True):
        if ids[start : start + length] not in continuations:
            continuations.append(ids[start : start + length])
    tokens, parents, node_of = [], [], {}
    for continuation in continuations[:max_matches]:
        parent = -1
        for token in continuation:
            if (parent, token) not in node_of:
                node_of[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
            parent = node_of[(parent, token)]
    return tokens, parents


@settings(max_examples=150, deadline=None)
@given(
    ids=st.integers(2, 5).flatmap(lambda v: st.lists(st.integers(0, v - 1), min_size=1, max_size=40)),
    max_ngram=st.integers(1, 4), min_ngram=st.integers(1, 4), num_tokens=st.integers(1, 6),
    max_matches=st.integers(1, 5), max_depth=st.integers(0, 7),
)
def test_matches_a_naive_reference(ids, max_ngram, min_ngram, num_tokens, max_matches, max_depth):
    min_ngram = min(min_ngram, max_ngram)
    fields = dict(max_ngram=max_ngram, min_ngram=min_ngram, num_tokens=num_tokens, max_matches=max_matches)
    tree = propose(ids, max_depth=max_depth, **fields)
    tokens, parents = reference(ids, max_depth=max_depth, **fields)
    assert tree.tokens.tolist() == [tokens] and tree.parent_list == parents
    pairs = list(zip(parents, tokens, strict=True))
    assert len(set(pairs)) == len(pairs)
    assert tree.depth <= min(num_tokens, max_depth) and tree.num_nodes <= max_matches * num_tokens


# ---------------------------------------------------------------------------------------------------------
# parity with model.generate


def repeated_prompt(seed: int) -> torch.Tensor:
    """A key n-gram followed by three different continuations, filler, and the key again at the end."""
    rng = torch.Generator().manual_seed(seed)
    key, filler = torch.randint(2, VOCAB, (3,), generator=rng), torch.randint(2, VOCAB, (5,), generator=rng)
    parts = []
    for _ in range(3):
        parts += [key, torch.randint(2, VOCAB, (6,), generator=rng), filler]
    return torch.cat([*parts, key])[None]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("rule", [Greedy(), SpeculativeSampling()], ids=["greedy", "spec-sampling"])
def test_prompt_lookup_tree_parity_with_generate(arch, rule):
    target = tiny_causal_lm(arch, seed=0)
    prompt = repeated_prompt(7)
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40,
                               do_sample=False, pad_token_id=0)
    out = speculative_generate(target, prompt, drafter=PromptLookup(num_tokens=6), acceptance=rule,
                               max_new_tokens=40)
    assert torch.equal(out.sequences, expected)
    assert any(n > d for n, d in zip(out.stats.tree_nodes, out.stats.tree_depth, strict=True))  # real trees
