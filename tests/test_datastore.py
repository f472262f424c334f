"""Datastore (REST-style retrieval) drafting: the n-gram index against a naive search, the frequent-prefix tree,
save / load, tokenizer checks, greedy parity and sampling losslessness."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from _cores import worker_threads
from _tiny import VOCAB, tiny_causal_lm
from hypothesis import given, settings
from hypothesis import strategies as st

from specprim import speculative_generate
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters import Datastore, DatastoreLookup, Drafter, DraftRequest, _datastore, tokenizer_fingerprint
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square

# "1 2" occurs four times, followed by 3 4 / 3 5 / 6 (end) / 3 4
CORPUS = [[1, 2, 3, 4], [1, 2, 3, 5], [7, 1, 2, 6], [9, 1, 2, 3, 4, 8]]


def propose(store, ids, max_depth=8, vocab_size=100, **fields):
    request = DraftRequest(input_ids=torch.tensor([ids]), sampling=SamplingConfig(), vocab_size=vocab_size,
                           max_depth=max_depth)
    return DatastoreLookup(datastore=store, **fields).propose(request)


def test_the_tree_holds_the_most_frequent_continuation_prefixes():
    store = Datastore(CORPUS)
    tree = propose(store, [0, 1, 2], num_tokens=2, num_nodes=3)
    # counts: "3" 3, "3 4" 2, "6" 1, "3 5" 1 -> the top 3, parents first
    assert tree.tokens.tolist() == [[3, 4, 6]] and tree.parent_list == [-1, 0, -1]
    assert tree.sampling == "deterministic" and tree.q is None
    full = propose(store, [0, 1, 2], num_tokens=3, num_nodes=10)
    assert full.tokens.tolist() == [[3, 4, 6, 5, 8]] and full.parent_list == [-1, 0, -1, 0, 1]  # ties: depth first
    assert isinstance(DatastoreLookup(datastore=store), Drafter)


def test_longest_suffix_wins_and_depth_caps():
    store = Datastore(CORPUS)
    assert propose(store, [9, 1, 2], num_nodes=10).tokens.tolist() == [[3, 4, 8]]  # "9 1 2" occurs once
    assert propose(store, [0, 1, 2], max_depth=1, num_nodes=10).tokens.tolist() == [[3, 6]]
    assert propose(store, [0, 1, 2], max_depth=0).num_nodes == 0
    assert propose(store, [5, 5]).num_nodes == 0  # no match
    assert propose(store, [2]).num_nodes == 0  # shorter than min_ngram
    assert propose(Datastore(CORPUS, min_ngram=1), [0, 0, 2], num_nodes=1).tokens.tolist() == [[3]]


def test_continuations_stop_at_the_end_of_their_sequence():
    store = Datastore([[1, 2, 3], [4, 5, 6, 7]])
    spans = store.continuations(np.array([2, 4]), 4)  # after "1 2"; from the start of the second sequence
    assert spans.tolist() == [[3, -1, -1, -1], [4, 5, 6, 7]]
    assert propose(store, [1, 2], num_tokens=4).tokens.tolist() == [[3]]


def test_max_samples_counts_evenly_spaced_occurrences():
    store = Datastore([[1, 2, 3]] * 5 + [[1, 2, 4]] * 5)  # ten matches of "1 2"
    assert propose(store, [1, 2], num_nodes=1).tokens.tolist() in ([[3]], [[4]])
    assert propose(store, [1, 2], num_nodes=1, max_samples=1).tokens.tolist() == [[3]]  # the first occurrence
    assert propose(store, [1, 2], num_nodes=2, max_samples=2).tokens.tolist() == [[3, 4]]  # the first and last


def naive_matches(corpus, context, max_ngram, min_ngram):
    """Plain loops: the longest suffix of ``context`` found and the joined-corpus positions after it."""
    offsets = np.cumsum([0] + [len(s) + 1 for s in corpus])
    for n in range(min(max_ngram, len(context)), min_ngram - 1, -1):
        query = context[-n:]
        found = [int(offsets[k]) + end for k, seq in enumerate(corpus) for end in range(n, len(seq) + 1)
                 if seq[end - n:end] == query]
        if found:
            return n, found
    return 0, []


@settings(max_examples=150, deadline=None)
@given(
    corpus=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=5),
    context=st.lists(st.integers(0, 3), min_size=1, max_size=8),
    max_ngram=st.integers(1, 5), min_ngram=st.integers(1, 5),
)
def test_matches_a_naive_search(corpus, context, max_ngram, min_ngram):
    min_ngram = min(min_ngram, max_ngram)
    store = Datastore(corpus, max_ngram=max_ngram, min_ngram=min_ngram)
    n, starts = store.matches(context)
    want_n, want = naive_matches(corpus, context, max_ngram, min_ngram)
    assert (n, starts.tolist()) == (want_n, want)
    n, some = store.matches(context, limit=2)  # evenly spaced: the first and the last
    assert (n, some.tolist()) == (want_n, want if len(want) <= 2 else [want[0], want[-1]])


def test_hash_collisions_never_match(monkeypatch):
    """With a hash that maps every n-gram to the same value, lookups still find exactly the true matches."""
    monkeypatch.setattr(_datastore, "_BASE", np.int64(0))  # hash = last token + 1: many collisions
    corpus = [[1, 2, 3, 1], [2, 2, 3, 0, 2, 3]]
    store = Datastore(corpus, max_ngram=3)
    for context in ([5, 2, 3], [1, 2, 3], [0, 3], [9, 1]):
        n, starts = store.matches(context)
        assert (n, starts.tolist()) == naive_matches(corpus, context, 3, 2)


def test_save_load_roundtrip(tmp_path):
    store = Datastore(CORPUS, max_ngram=4, tokenizer="abc")
    store.save(tmp_path / "small.npz")
    again = Datastore.load(tmp_path / "small.npz")
    assert [s.tolist() for s in again.sequences()] == CORPUS
    assert (again.min_ngram, again.max_ngram, again.tokenizer, len(again)) == (2, 4, "abc", 18)
    assert Datastore.load(tmp_path / "small.npz", max_ngram=3).max_ngram == 3
    wide = Datastore([[70000, 1, 2], [0]])  # ids beyond uint16
    wide.save(tmp_path / "wide.npz")
    assert [s.tolist() for s in Datastore.load(tmp_path / "wide.npz").sequences()] == [[70000, 1, 2], [0]]


class WordTokenizer:
    """A stand-in tokenizer: one id per known word."""

    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}

    def get_vocab(self):
        return dict(self.vocab)

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[self.vocab[w] for w in text.split()] for text in texts]}


def test_from_texts_concatenate_and_tokenizer_checks():
    words = WordTokenizer(["the", "cat", "sat", "mat"])
    store = Datastore.from_texts(["the cat sat", "", "the mat"], words)
    assert [s.tolist() for s in store.sequences()] == [[0, 1, 2], [0, 3]]
    store.check_tokenizer(words)
    with pytest.raises(ValueError, match="another tokenizer"):
        store.check_tokenizer(WordTokenizer(["the", "cat", "sat", "rug"]))
    joined = Datastore.concatenate([store, Datastore([[1, 1]])])
    assert len(joined) == 7 and joined.tokenizer == tokenizer_fingerprint(words)
    other = Datastore.from_texts(["a b"], WordTokenizer(["a", "b"]))
    with pytest.raises(ValueError, match="different tokenizers"):
        Datastore.concatenate([store, other])


@pytest.mark.parametrize("kwargs", [dict(max_ngram=0), dict(min_ngram=3, max_ngram=2), dict(max_ngram=2.0)])
def test_invalid_datastores_raise(kwargs):
    with pytest.raises(ValueError):
        Datastore(CORPUS, **kwargs)


def test_invalid_corpora_and_fields_raise():
    with pytest.raises(ValueError, match="non-negative"):
        Datastore([[1, -2]])
    with pytest.raises(ValueError, match="at least one"):
        Datastore([[], []])
    for fields in (dict(num_tokens=0), dict(num_nodes=0), dict(max_samples=True)):
        with pytest.raises(ValueError):
            DatastoreLookup(datastore=Datastore(CORPUS), **fields)
    with pytest.raises(TypeError):
        DatastoreLookup(datastore=CORPUS)


def test_batch_and_vocabulary_checks():
    store = Datastore(CORPUS)
    request = DraftRequest(input_ids=torch.ones(2, 4, dtype=torch.long), sampling=SamplingConfig(),
                           vocab_size=10, max_depth=3)
    with pytest.raises(ValueError, match="batch size 1"):
        DatastoreLookup(datastore=store).propose(request)
    with pytest.raises(ValueError, match="another tokenizer"):
        propose(store, [1, 2], vocab_size=9)  # the corpus holds id 9


# ---------------------------------------------------------------------------------------------------------
# end to end: parity with generate and losslessness under sampling


def answer_and_variants(target, prompt, length=40, copies=6):
    """The target's greedy answer to ``prompt`` and copies with a few tokens changed: a datastore whose drafts are
    often right and branch where the copies differ."""
    out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=length, do_sample=False,
                          pad_token_id=0)
    answer = out[0].tolist()
    rng = torch.Generator().manual_seed(1)
    variants = []
    for _ in range(copies):
        variant = list(answer)
        for position in torch.randint(0, len(answer), (4,), generator=rng).tolist():
            variant[position] = int(torch.randint(1, VOCAB, (1,), generator=rng))
        variants.append(variant)
    return [answer, *variants]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("rule", [Greedy(), SpeculativeSampling()], ids=["greedy", "spec-sampling"])
def test_greedy_parity_with_generate(arch, rule):
    target = tiny_causal_lm(arch, seed=0)
    prompt = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(100))
    store = Datastore(answer_and_variants(target, prompt))
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40,
                               do_sample=False, pad_token_id=0)
    out = speculative_generate(target, prompt, drafter=DatastoreLookup(datastore=store, num_nodes=8), acceptance=rule,
                               max_new_tokens=40)
    assert torch.equal(out.sequences, expected)
    assert out.stats.tau > 1.2  # the datastore really drafts accepted tokens
    assert any(n > d for n, d in zip(out.stats.tree_nodes, out.stats.tree_depth, strict=True))  # real trees


def peaked_target():
    model = tiny_causal_lm("llama", seed=0, vocab=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model


def _keeps_rejected(p_row: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    return p_row


KEEPS_REJECTED_TOKENS = SpeculativeSampling(without_rejected=_keeps_rejected)
"""Broken on purpose: after rejecting deterministic siblings, draws from the node's target without removing them."""


@pytest.mark.parametrize("rule", [SpeculativeSampling(), KEEPS_REJECTED_TOKENS], ids=["exact", "broken"])
def test_sampling_is_lossless_and_the_check_has_power(rule):
    target, prompt = peaked_target(), torch.tensor([[1, 2, 3]])
    store = Datastore([[2, 3, 0, 1], [2, 3, 4, 4], [3, 1, 1], [2, 3, 0, 2], [2, 3, 1]])  # siblings after "2 3"
    drafter = DatastoreLookup(datastore=store, num_tokens=2, num_nodes=4)
    assert drafter.propose(DraftRequest(input_ids=prompt, sampling=SamplingConfig(temperature=1.0), vocab_size=5,
                                        max_depth=2)).num_nodes == 4
    p = two_token_chi_square(target, prompt, drafter=drafter, acceptance=rule,
                             sampling=SamplingConfig(temperature=1.0), trials=1500)
    if rule is KEEPS_REJECTED_TOKENS:
        assert p < 1e-6
    else:
        assert p > 1e-3


# ---------------------------------------------------------------------------------------------------------
# presets, named datastores, bench and the command line


def test_presets_build_datastore_methods_and_capped_unions(tmp_path):
    from specprim._names import uses_datastore
    from specprim.drafters import UnionDrafter
    from specprim.presets import from_name

    target = tiny_causal_lm("llama")
    store = Datastore(CORPUS)
    method = from_name("datastore", target=target, datastore=store, num_draft=3)
    assert method.drafter == DatastoreLookup(datastore=store, num_tokens=3)
    store.save(tmp_path / "small.npz")
    assert from_name("datastore", target=target, datastore=tmp_path / "small.npz").drafter.datastore.max_ngram == 6
    joined = from_name("prompt-lookup+datastore", target=target, datastore=store, max_nodes=5)
    assert isinstance(joined.drafter, UnionDrafter) and joined.drafter.max_nodes == 5
    assert uses_datastore("prompt-lookup+datastore") and not uses_datastore("prompt-lookup")
    with pytest.raises(ValueError, match="needs a datastore"):
        from_name("datastore", target=target)
    with pytest.raises(ValueError, match="neither a known datastore"):
        from_name("datastore", target=target, datastore=tmp_path / "missing.npz")


def test_named_datastores_shipped_and_built(tmp_path, monkeypatch):
    from specprim.models import _datastores, datastore_path, known_datastores, load_datastore

    words = WordTokenizer(["the", "cat", "sat", "mat"])
    monkeypatch.setattr(_datastores, "DATASTORES_DIR", tmp_path / "shipped")
    (tmp_path / "shipped" / "tiny-answers").mkdir(parents=True)
    Datastore.from_texts(["the cat sat"], words).save(tmp_path / "shipped" / "tiny-answers" / "datastore.npz")
    calls = []
    monkeypatch.setitem(_datastores.BUILT_DATASTORES, "tiny-built", lambda: calls.append(1) or ["the mat", "cat"])
    monkeypatch.setenv("SPECPRIM_CACHE", str(tmp_path / "cache"))
    assert {"tiny-answers", "tiny-built", "sharegpt"} <= set(known_datastores())
    assert datastore_path("tiny-answers").name == "datastore.npz"
    assert [s.tolist() for s in load_datastore("tiny-answers", words).sequences()] == [[0, 1, 2]]
    built = load_datastore("tiny-built", words)
    assert [s.tolist() for s in built.sequences()] == [[0, 3], [1]] and calls == [1]
    load_datastore("tiny-built", words)
    assert calls == [1]  # cached per tokenizer: built once
    both = load_datastore(["tiny-answers", "tiny-built"], words, max_ngram=3)
    assert len(both) == 6 and both.max_ngram == 3
    with pytest.raises(ValueError, match="pass its tokenizer"):
        load_datastore("tiny-built")
    with pytest.raises(ValueError, match="another tokenizer"):
        load_datastore("tiny-answers", WordTokenizer(["a", "b"]))


def test_bench_and_cli_run_datastore_methods(tmp_path, capsys):
    from _tiny import tiny_tokenizer

    from specprim import bench, cli

    target, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    prompt = "t5 t6 t7 t8 t9"
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    answer = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                             pad_token_id=0)[0].tolist()
    store = Datastore([answer], tokenizer=tokenizer_fingerprint(tokenizer))
    store.save(tmp_path / "answers.npz")
    results = bench.run(target=target, tokenizer=tokenizer, methods=["datastore", "prompt-lookup+datastore"],
                        prompts=[prompt], max_new_tokens=10, datastore=tmp_path / "answers.npz", max_nodes=3, argv=[])
    assert all(s.identical for s in results.results)
    assert results.summary("datastore").tau > 1.5  # the answer is in the datastore
    assert results.meta["settings"]["max_nodes"] == 3 and "Datastore(" in results.meta["settings"]["datastore"]
    with pytest.raises(ValueError, match="no method uses it"):
        bench.run(target=target, tokenizer=tokenizer, methods=["prompt-lookup"], prompts=[prompt], max_new_tokens=2,
                  datastore=tmp_path / "answers.npz")
    with pytest.raises(ValueError, match="no method is one"):
        bench.run(target=target, tokenizer=tokenizer, methods=["datastore"], prompts=[prompt], max_new_tokens=2,
                  datastore=tmp_path / "answers.npz", max_nodes=3)
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    assert cli.main(["generate", "--target", str(tmp_path / "target"), "--method", "datastore", "--datastore",
                     str(tmp_path / "answers.npz"), "--prompt", prompt, "--max-new-tokens", "8"]) == 0
    assert "identical to plain greedy: yes" in capsys.readouterr().out
    assert cli.main(["generate", "--target", str(tmp_path / "target"), "--method", "prompt-lookup", "--datastore",
                     str(tmp_path / "answers.npz"), "--prompt", prompt]) == 2
    assert re.search("datastores are the corpus of a .datastore. part", capsys.readouterr().err)
    assert cli.main(["bench", "--target", str(tmp_path / "target"), "--method", "prompt-lookup+datastore",
                     "--datastore", str(tmp_path / "answers.npz"), "--max-nodes", "2", "--prompts",
                     str(_prompts_file(tmp_path, prompt)), "--max-new-tokens", "6"]) == 0
    assert "| prompt-lookup+datastore |" in capsys.readouterr().out


def _prompts_file(tmp_path, prompt):
    path = tmp_path / "prompts.jsonl"
    path.write_text(f'{{"prompt": "{prompt}"}}\n')
    return path


def test_the_shipped_datastore_is_installed_small_and_documented():
    from specprim.models import datastore_path, known_datastores

    assert "smollm2-135m-instruct-answers" in known_datastores()
    path = datastore_path("smollm2-135m-instruct-answers")
    assert path.stat().st_size <= 2**20
    store = Datastore.load(path)
    assert len(store) > 400_000 and store.tokenizer is not None
    assert "tau" in (path.parent / "README.md").read_text()


@pytest.mark.real_model
def test_the_shipped_datastore_drafts_for_smollm2_losslessly():
    from specprim.cli import chat_input_ids
    from specprim.models import load, load_datastore

    with worker_threads():
        target, tokenizer = load("smollm2-135m-instruct")
        store = load_datastore("smollm2-135m-instruct-answers", tokenizer)  # the fingerprint matches
        ids = chat_input_ids(tokenizer, "Write a short paragraph about the benefits of regular exercise.")
        expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        out = speculative_generate(target, ids, drafter=DatastoreLookup(datastore=store), acceptance=Greedy(),
                                   max_new_tokens=48, eos_token_id=tokenizer.eos_token_id)
        assert torch.equal(out.sequences, expected)
        assert out.stats.tau > 1.05  # 1.07 measured: on open-ended answers the datastore drafts a few tokens


def test_the_datastore_command_builds_from_text_files(tmp_path, capsys):
    from _tiny import tiny_tokenizer

    from specprim import cli
    from specprim.models import read_texts

    target, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    records = tmp_path / "corpus.jsonl"
    records.write_text('"t5 t6 t7"\n{"text": "t8 t9"}\n\n[{"role": "user", "content": "t2"}, '
                       '{"role": "assistant", "content": "t3 t4"}]\n'
                       '{"messages": [{"from": "gpt", "value": "t6 t6"}]}\n')
    plain = tmp_path / "notes.txt"
    plain.write_text("t7 t8\nt9")
    assert read_texts(records) == ["t5 t6 t7", "t8 t9", "t3 t4", "t6 t6"] and read_texts(plain) == ["t7 t8\nt9"]
    out = tmp_path / "store.npz"
    assert cli.main(["datastore", "--target", str(tmp_path / "target"), "--out", str(out), "--max-ngram", "3",
                     str(records), str(plain)]) == 0
    assert "5 sequences" in capsys.readouterr().out
    store = Datastore.load(out)
    assert [s.tolist() for s in store.sequences()] == [[5, 6, 7], [8, 9], [3, 4], [6, 6], [7, 8, 9]]
    assert store.max_ngram == 3 and store.tokenizer == tokenizer_fingerprint(tokenizer)
    (tmp_path / "bad.jsonl").write_text('{"id": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_texts(tmp_path / "bad.jsonl")
    assert cli.main(["datastore", "--target", str(tmp_path / "target"), "--out", str(out),
                     str(tmp_path / "bad.jsonl")]) == 1  # the file is there, its content is not text
    assert "error: " in (err := capsys.readouterr().err) and "bad.jsonl:1" in err
