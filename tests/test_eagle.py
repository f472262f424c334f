"""EAGLE-1 / EAGLE-3 heads: reduced vocabularies, tree drafting equal to sequential drafting, incremental commits,
greedy parity with `generate` for untrained heads, save / load, mismatch errors, losslessness under sampling."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from specprim import speculative_generate
from specprim._types import DraftRequest, TargetFeatures
from specprim.acceptance import Greedy, SpeculativeSampling
from specprim.drafters._eagle_draft import EagleDraftModel, eagle_drafter
from specprim.drafters._eagle_head import EagleConfig, EagleHead, default_feature_layers
from specprim.drafters._vocab import (
    check_d2t,
    count_tokens,
    draft_vocab,
    scatter_to_target,
    target_mask,
    target_to_draft,
)
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree, StaticTree

PROMPT = torch.tensor([[5, 17, 33, 8, 61, 2, 40, 9]])
# (version, draft_vocab_size): EAGLE-1, EAGLE-3 over the full vocabulary, EAGLE-3 over a reduced one.
HEADS = [(1, None), (3, None), (3, 24)]
HEAD_IDS = ["eagle1", "eagle3", "eagle3-vocab24"]


def make_head(target, version, draft_vocab_size=None, seed=0, **kwargs) -> EagleHead:
    counts = torch.arange(VOCAB).flip(0) if draft_vocab_size else None  # favour small ids, not a prefix
    if counts is not None:
        counts[50:60] = 1000  # some large ids are the most frequent
    return EagleHead.from_target(
        target, version=version, draft_vocab_size=draft_vocab_size, token_counts=counts,
        generator=torch.Generator().manual_seed(seed), **kwargs,
    )


def hf_greedy(target, prompt, max_new_tokens):
    return target.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )


@torch.no_grad()
def features_of(target, head, ids):
    """The head's feature tensors (B, T - 1, d) at every position but the last of ``ids`` (B, T)."""
    hidden = target(ids[:, :-1], output_hidden_states=True).hidden_states
    return head.select_features(hidden)


def request(ids, features, start, step, vocab=VOCAB):
    """A DraftRequest for committed ``ids`` whose features cover positions ``start .. T - 2``."""
    feats = TargetFeatures(
        hidden_states=tuple(f[:, start : ids.shape[1] - 1] for f in features),
        token_ids=ids[:, start:-1], start=start,
    )
    return DraftRequest(
        input_ids=ids, sampling=SamplingConfig(), vocab_size=vocab, max_depth=8, step=step, features=feats
    )


@torch.no_grad()
def sequential_logits(head, ids, features, path_tokens):
    """Logits after the root-to-node path ``path_tokens``, one pair at a time with a plain causal cache."""
    cache = head.new_cache()
    predicted = head.predict(ids[:, 1:], head.fuse([f[:, : ids.shape[1] - 1] for f in features]), cache=cache)
    last = predicted[:, -1:]
    for token in path_tokens:
        last = head.predict(torch.tensor([[token]]), last, cache=cache)
    return head.logits(last)[:, 0]  # (1, V)


def mistral():
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )).eval()


def qwen3():
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
        pad_token_id=0,
    )).eval()


# ------------------------------------------------------------------------------------------------ vocabulary
def test_draft_vocab_keeps_the_most_frequent_ids_sorted():
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 3])
    assert draft_vocab(8, 3, counts).tolist() == [2, 3, 5]
    assert draft_vocab(8, 4, counts).tolist() == [0, 2, 3, 5]
    assert draft_vocab(8, 3, torch.tensor([1, 1, 1, 1, 1, 1, 1, 1])).tolist() == [0, 1, 2]  # ties: smaller id
    assert draft_vocab(8, 3, counts, required_ids=[6]).tolist() == [2, 3, 6]
    assert draft_vocab(8, 3).tolist() == [0, 1, 2]
    assert draft_vocab(8, 8, counts).tolist() == list(range(8))


def test_draft_vocab_errors():
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocab(8, 9)
    with pytest.raises(ValueError, match="shape"):
        draft_vocab(8, 3, torch.ones(7))
    with pytest.raises(ValueError, match="non-negative"):
        draft_vocab(8, 3, -torch.ones(8))
    with pytest.raises(ValueError, match="do not fit"):
        draft_vocab(8, 1, required_ids=[1, 2])
    with pytest.raises(ValueError, match="strictly increasing"):
        check_d2t(torch.tensor([3, 1]), 8)
    with pytest.raises(ValueError, match="outside"):
        check_d2t(torch.tensor([1, 8]), 8)


def test_vocab_maps_are_inverse_and_scatter_is_minus_inf_outside():
    d2t = torch.tensor([1, 4, 6])
    assert target_mask(d2t, 8).nonzero()[:, 0].tolist() == [1, 4, 6]
    index = target_to_draft(d2t, 8)
    assert index[d2t].tolist() == [0, 1, 2] and (index[~target_mask(d2t, 8)] == -1).all()
    logits = scatter_to_target(torch.tensor([[1.0, 2.0, 3.0]]), d2t, 8)
    assert logits[0, d2t].tolist() == [1.0, 2.0, 3.0]
    assert torch.isneginf(logits[0, [0, 2, 3, 5, 7]]).all()
    assert count_tokens([torch.tensor([[1, 1, 2]]), torch.tensor([7])], 8).tolist() == [0, 2, 1, 0, 0, 0, 0, 1]


# ---------------------------------------------------------------------------------------------------- config
def test_config_validation_and_default_layers():
    assert default_feature_layers(3, 30) == (2, 15, 27)
    assert default_feature_layers(3, 2) == (0, 1, 2)
    assert default_feature_layers(1, 30) == (-1,)
    base = dict(version=3, hidden_size=32, vocab_size=97, draft_vocab_size=24, feature_layers=(0, 1, 2),
                target_num_layers=2)
    EagleConfig(**base)
    for change, message in [
        ({"version": 2}, "version"), ({"draft_vocab_size": 98}, "exceeds"), ({"feature_layers": (0, 3)}, "exist"),
        ({"version": 1}, "one feature layer"), ({"num_layers": 0}, "positive"),
    ]:
        with pytest.raises(ValueError, match=message):
            EagleConfig(**{**base, **change})


# ------------------------------------------------------------------------------- tree drafting = sequential
@pytest.mark.parametrize("version,vocab", HEADS, ids=HEAD_IDS)
def test_extend_equals_sequential_paths(version, vocab):
    target = tiny_causal_lm("llama")
    head = make_head(target, version, vocab, num_layers=2)
    model = EagleDraftModel(head, target)
    features = features_of(target, head, PROMPT)
    root_logits = model.begin(request(PROMPT, features, start=0, step=0))
    torch.testing.assert_close(root_logits, sequential_logits(head, PROMPT, features, []), atol=1e-5, rtol=0)
    # Grow a tree in three batches: 3 children of the root, then 2 + 1 grandchildren, then 1 great-grandchild.
    batches = [([-1, -1, -1], [11, 50, 23]), ([0, 0, 2], [4, 52, 7]), ([4], [90])]
    parents_all, tokens_all = [], []
    for parents, tokens in batches:
        logits = model.extend(torch.tensor(parents), torch.tensor([tokens]))  # (1, M, V)
        for j, token in enumerate(tokens):
            parents_all.append(parents[j])
            tokens_all.append(token)
            path, node = [], len(parents_all) - 1
            while node != -1:
                path.insert(0, tokens_all[node])
                node = parents_all[node]
            expected = sequential_logits(head, PROMPT, features, path)
            torch.testing.assert_close(logits[:, j], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("version,vocab", HEADS, ids=HEAD_IDS)
def test_a_grown_head_drafts_as_the_head_it_grew_from_and_its_new_layers_train(version, vocab):
    target = tiny_causal_lm("llama")
    head = make_head(target, version, vocab)
    with torch.no_grad():  # a head whose layer is not at its initial weights
        for parameter in head.layers.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
    grown = head.grown(target, 3)
    assert grown.config.num_layers == 3 and len(grown.layers) == 3 and head.config.num_layers == 1
    features = features_of(target, head, PROMPT)
    for path in ([], [11, 50]):
        torch.testing.assert_close(sequential_logits(grown, PROMPT, features, path),
                                   sequential_logits(head, PROMPT, features, path), atol=1e-6, rtol=0)
    # the check is not vacuous: a new layer whose output projection is not zero changes the drafts
    broken = head.grown(target, 2)
    with torch.no_grad():
        broken.layers[1].self_attn.o_proj.weight.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(sequential_logits(broken, PROMPT, features, []),
                              sequential_logits(head, PROMPT, features, []), atol=1e-4)
    # the new layers learn: their zero projections get gradients
    grown.logits(grown.predict(PROMPT[:, 1:], grown.fuse(features))).logsumexp(-1).sum().backward()
    assert grown.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert grown.layers[2].mlp.down_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="3 decoder layers cannot be grown to 2"):
        grown.grown(target, 2)


def test_a_widened_head_keeps_its_logits_on_its_own_ids_and_adds_the_most_frequent():
    target = tiny_causal_lm("llama")
    head = make_head(target, 3, 24)
    with torch.no_grad():  # a trained-looking LM head, no longer the target's rows
        noise = torch.randn(head.lm_head.weight.shape, generator=torch.Generator().manual_seed(3))
        head.lm_head.weight.add_(0.1 * noise)
    counts = torch.zeros(VOCAB, dtype=torch.long)
    counts[[70, 71, 5]] = torch.tensor([9, 8, 7])  # 5 is already a draft id
    wide = head.widened(target, 26, counts)
    assert wide.config.draft_vocab_size == 26 and head.config.draft_vocab_size == 24
    assert set(wide.d2t.tolist()) == set(head.d2t.tolist()) | {70, 71}
    features = features_of(target, head, PROMPT)
    old, new = sequential_logits(head, PROMPT, features, [11]), sequential_logits(wide, PROMPT, features, [11])
    torch.testing.assert_close(new[:, head.d2t], old[:, head.d2t], atol=1e-6, rtol=0)  # (1, 24) unchanged
    assert (new[:, [70, 71]] == 0).all() and torch.isinf(old[:, [70, 71]]).all()  # added ids start at logit 0
    with pytest.raises(ValueError, match="24 ids cannot be widened to 20"):
        head.widened(target, 20, counts)
    with pytest.raises(ValueError, match="only EAGLE-3 heads"):
        make_head(target, 1).widened(target, VOCAB, counts)


@pytest.mark.parametrize("version,vocab", HEADS, ids=HEAD_IDS)
def test_incremental_commits_equal_recomputation(version, vocab):
    """begin() after several steps (with scratch nodes in between) equals running every pair from scratch."""
    target = tiny_causal_lm("qwen2")
    head = make_head(target, version, vocab)
    model = EagleDraftModel(head)
    ids = torch.randint(2, VOCAB, (1, 24), generator=torch.Generator().manual_seed(3))
    features = features_of(target, head, ids)
    start = 0
    for step, end in enumerate([6, 7, 11, 12, 20, 24]):  # committed ids[:, :end]; the root is ids[:, end - 1]
        logits = model.begin(request(ids[:, :end], features, start, step))
        torch.testing.assert_close(logits, sequential_logits(head, ids[:, :end], features, []), atol=1e-5, rtol=0)
        model.extend(torch.tensor([-1, -1]), torch.tensor([[3, 4]]))  # scratch nodes the next begin drops
        model.extend(torch.tensor([0]), torch.tensor([[5]]))
        start = end - 1
    # A new generation (step 0) starts over.
    logits = model.begin(request(ids[:, :5], features, 0, 0))
    torch.testing.assert_close(logits, sequential_logits(head, ids[:, :5], features, []), atol=1e-5, rtol=0)


def test_reduced_vocabulary_logits_are_minus_inf_outside_d2t():
    target = tiny_causal_lm("llama")
    for version in (1, 3):
        head = make_head(target, version, 24)
        model = EagleDraftModel(head)
        outside = ~target_mask(head.d2t, VOCAB)
        assert head.d2t.tolist() == sorted(head.d2t.tolist()) and len(head.d2t) == 24
        assert set(range(50, 60)) <= set(head.d2t.tolist()) and 1 in head.d2t.tolist()  # frequent ids and EOS
        root = model.begin(request(PROMPT, features_of(target, head, PROMPT), 0, 0))
        children = model.extend(torch.tensor([-1]), torch.tensor([[int(head.d2t[0])]]))
        for logits in (root, children[:, 0]):
            assert torch.isneginf(logits[:, outside]).all() and torch.isfinite(logits[:, ~outside]).all()


# ------------------------------------------------------------------------------------------ parity end to end
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("version,vocab", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize(
    "tree", [Chain(3), DynamicTree(depth=4, top_k=4, budget=12)], ids=["chain3", "dynamic"]
)
def test_greedy_parity_untrained_heads(arch, version, vocab, tree):
    target = tiny_causal_lm(arch)
    drafter = eagle_drafter(make_head(target, version, vocab), tree)
    out = speculative_generate(target, PROMPT, drafter=drafter, acceptance=Greedy(), max_new_tokens=24)
    assert torch.equal(out.sequences, hf_greedy(target, PROMPT, 24))


@pytest.mark.parametrize("make_target", [mistral, qwen3], ids=["mistral", "qwen3"])
def test_greedy_parity_other_architectures(make_target):
    target = make_target()
    for version in (1, 3):
        drafter = eagle_drafter(make_head(target, version, 30))  # default tree: DynamicTree(5, 8, 40)
        out = speculative_generate(target, PROMPT, drafter=drafter, acceptance=SpeculativeSampling(),
                                   max_new_tokens=16)
        assert torch.equal(out.sequences, hf_greedy(target, PROMPT, 16))


def test_greedy_parity_static_tree_and_one_token_prompt():
    target = tiny_causal_lm("llama")
    tree = StaticTree(paths=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    drafter = eagle_drafter(make_head(target, 3, 24), tree)
    for prompt in (PROMPT, PROMPT[:, :1]):
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=Greedy(), max_new_tokens=20)
        assert torch.equal(out.sequences, hf_greedy(target, prompt, 20))


@pytest.fixture(scope="module")
def trained_eagle3():
    """A tiny EAGLE-3 head over a 64-token draft vocabulary, trained ~1 s on the target's own greedy text, so that
    drafts get accepted and the loop commits several tokens per step."""
    target = tiny_causal_lm("llama").requires_grad_(False)
    prompts = torch.randint(2, VOCAB, (16, 4), generator=torch.Generator().manual_seed(0))
    data = hf_greedy(target, prompts, 40)  # (16, 44)
    head = EagleHead.from_target(target, version=3, draft_vocab_size=64, token_counts=count_tokens([data], VOCAB),
                                 generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = target(data, output_hidden_states=True)
    hidden = head.fuse(head.select_features(out.hidden_states)).detach()[:, :-1]  # (16, 43, d)
    labels = target_to_draft(head.d2t, VOCAB)[out.logits.argmax(-1)[:, 1:]]  # (16, 43) draft ids, -1 if none
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(120):
        logits = head(data[:, 1:], hidden).draft_logits  # pair t predicts the target's token at t + 2
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return target, head.requires_grad_(False)


@pytest.mark.parametrize("tree", [Chain(4), DynamicTree(depth=4, top_k=4, budget=16)], ids=["chain4", "dynamic"])
def test_greedy_parity_trained_head_accepts_drafts(trained_eagle3, tree):
    target, head = trained_eagle3
    prompt = PROMPT[:, :4]
    out = speculative_generate(target, prompt, drafter=eagle_drafter(head, tree), acceptance=Greedy(),
                               max_new_tokens=40)
    assert torch.equal(out.sequences, hf_greedy(target, prompt, 40))
    assert out.stats.tau > 1.3  # several tokens committed per step: begin() consumed multi-position features


# ------------------------------------------------------------------------------------------------ save / load
@pytest.mark.parametrize("version,vocab", HEADS, ids=HEAD_IDS)
def test_save_load_round_trip(tmp_path, version, vocab):
    target = tiny_causal_lm("llama")
    head = make_head(target, version, vocab)
    head.save_pretrained(tmp_path)
    loaded = EagleHead.from_pretrained(tmp_path, target)
    assert loaded.config == head.config and torch.equal(loaded.d2t, head.d2t)
    features = features_of(target, head, PROMPT)
    hidden = head.fuse(features)
    with torch.no_grad():
        a, b = head(PROMPT[:, 1:], hidden), loaded(PROMPT[:, 1:], loaded.fuse(features))
    assert torch.equal(a.hidden, b.hidden) and torch.equal(a.draft_logits, b.draft_logits)
    names = set(dict(head.named_parameters()))
    assert not any("embed" in n for n in names), "the target's embeddings must not be part of the head"


def test_loading_on_another_target_raises(tmp_path):
    make_head(tiny_causal_lm("llama"), 3, 24).save_pretrained(tmp_path)
    common = dict(vocab_size=VOCAB, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    for other, message in [
        (tiny_causal_lm("llama", vocab=101), "vocab_size"),
        (LlamaForCausalLM(LlamaConfig(hidden_size=48, num_hidden_layers=2, **common)), "hidden_size"),
        (LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=3, **common)), "target_num_layers"),
    ]:
        with pytest.raises(ValueError, match=message):
            EagleHead.from_pretrained(tmp_path, other)
    (tmp_path / "specprim_checksums.json").unlink()  # a config edited by hand, on purpose
    with pytest.raises(ValueError, match="not a EagleHead"):
        (tmp_path / "config.json").write_text('{"head": "MedusaHeads", "config": {}}')
        EagleHead.from_pretrained(tmp_path, tiny_causal_lm("llama"))


def test_bad_input_errors():
    target = tiny_causal_lm("llama")
    for arch in ("gpt2", "gemma3"):
        with pytest.raises(ValueError, match="Llama-style"):
            EagleHead.from_target(tiny_causal_lm(arch))
    head = make_head(target, 3)
    with pytest.raises(ValueError, match="another model"):
        EagleDraftModel(head, tiny_causal_lm("llama", seed=1))
    model = EagleDraftModel(head)
    no_features = DraftRequest(input_ids=PROMPT, sampling=SamplingConfig(), vocab_size=VOCAB, max_depth=4)
    with pytest.raises(ValueError, match="request.features"):
        model.begin(no_features)
    features = features_of(target, head, PROMPT)
    model.begin(request(PROMPT[:, :4], features, 0, 0))
    with pytest.raises(ValueError, match="starts at position"):  # positions 3..4 were skipped
        model.begin(request(PROMPT, features, 5, 1))
    with pytest.raises(ValueError, match="earlier call"):
        model.extend(torch.tensor([0]), torch.tensor([[3]]))


def test_forward_trains_the_head_only():
    """One training step: gradients reach the head's weights; the target's LM head is used, not owned."""
    target = tiny_causal_lm("llama").requires_grad_(False)
    head = make_head(target, 3, 24)
    features = features_of(target, head, PROMPT)
    out = head(PROMPT[:, 1:], head.fuse(features))  # (1, T - 1, d), (1, T - 1, 24)
    assert out.hidden.shape == (1, PROMPT.shape[1] - 1, 32) and out.draft_logits.shape[-1] == 24
    step2 = head(PROMPT[:, 2:], out.hidden[:, :-1])  # training-time test: feed the predictions back
    (out.draft_logits.logsumexp(-1).sum() + step2.draft_logits.logsumexp(-1).sum()).backward()
    assert all(p.grad is not None for p in head.parameters())


# ------------------------------------------------------------------------------------- sampling losslessness
SMALL_VOCAB = 5
TRIALS = 1000


@torch.no_grad()
def test_first_two_tokens_match_plain_sampling():
    """EAGLE-3 with a 3-token draft vocabulary (so q is zero on 2 target ids), chain drafts sampled iid."""
    target = tiny_causal_lm("llama", vocab=SMALL_VOCAB)
    target.lm_head.weight.mul_(40)  # peaked next-token distributions
    prompt = torch.tensor([[1, 2, 3]])
    head = EagleHead.from_target(target, version=3, draft_vocab_size=3, generator=torch.Generator().manual_seed(0))
    drafter = eagle_drafter(head, Chain(2))
    p_value = two_token_chi_square(target, prompt, drafter=drafter, acceptance=SpeculativeSampling(),
                                   sampling=SamplingConfig(temperature=1.0), trials=TRIALS)
    assert p_value > 1e-3


def test_eagle_config_is_an_ablation_record():
    config = make_head(tiny_causal_lm("llama"), 3, 24).config
    assert dataclasses.replace(config, num_layers=2).num_layers == 2
    assert "draft_vocab_size=24" in repr(config)
