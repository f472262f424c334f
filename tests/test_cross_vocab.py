"""Cross-tokenizer drafting (token-level intersection): the shared-token map of two tiny byte-level tokenizers, the
draft's context re-encoded with its own tokenizer, the q it declares (restricted to the shared tokens and
renormalised) checked empirically and end to end under sampling, a broken q rejected by the same checks, greedy parity
with model.generate, the recipe picking it for a draft with another tokenizer, and tokenizers sharing too little."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _tiny import tiny_causal_lm
from scipy import stats
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specprim import presets, speculative_generate
from specprim._types import DraftRequest
from specprim.acceptance import SpeculativeSampling
from specprim.drafters import CrossVocab, CrossVocabDraftModel, LMDraftModel, ModelDrafter
from specprim.drafters._cross_vocab_lm import Retokenizer
from specprim.recipes import Recipe
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree

# byte-level BPE vocabularies ("Ġ" is the space); they share <eos>, a, b, c, Ġ and ab, at other draft ids
TARGET_VOCAB = {"<eos>": 0, "a": 1, "b": 2, "c": 3, "Ġ": 4, "ab": 5, "Ġa": 6, "bc": 7, "abc": 8, "cc": 9}
TARGET_MERGES = [("a", "b"), ("Ġ", "a"), ("b", "c"), ("ab", "c"), ("c", "c")]
DRAFT_VOCAB = {"<eos>": 0, "c": 1, "b": 2, "a": 3, "Ġ": 4, "ca": 5, "Ġb": 6, "ab": 7, "Ġc": 8}
DRAFT_MERGES = [("c", "a"), ("Ġ", "b"), ("a", "b"), ("Ġ", "c")]
SHARED_TARGET, SHARED_DRAFT = [0, 1, 2, 3, 4, 5], [0, 3, 2, 1, 4, 7]
TRIALS = 400  # the broken variants are far off (the draft gives about half its mass to tokens not shared)


def byte_level_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


@pytest.fixture(scope="module")
def vocab() -> CrossVocab:
    return CrossVocab(byte_level_tokenizer(TARGET_VOCAB, TARGET_MERGES),
                      byte_level_tokenizer(DRAFT_VOCAB, DRAFT_MERGES))


@pytest.fixture(scope="module")
def target():
    return tiny_causal_lm("llama", seed=0, vocab=len(TARGET_VOCAB))


def peaked_draft(seed: int = 1, scale: float = 1.0):
    draft = tiny_causal_lm("llama", seed=seed, vocab=len(DRAFT_VOCAB))
    with torch.no_grad():
        draft.lm_head.weight.mul_(scale)
    return draft


def test_shared_tokens_are_the_same_strings(vocab):
    assert vocab.target_ids.tolist() == SHARED_TARGET and vocab.draft_ids.tolist() == SHARED_DRAFT
    assert vocab.to_draft.tolist() == SHARED_DRAFT + [-1] * 4
    assert vocab.draft_tokens(torch.tensor([[5, 1, 0]])).tolist() == [[7, 3, 0]]
    with pytest.raises(ValueError, match="not one the tokenizers share"):
        vocab.draft_tokens(torch.tensor([[8]]))


def test_sentencepiece_spellings_match_byte_level_ones():
    """``▁ab`` (SentencePiece) and ``Ġab`` (byte-level) are the same bytes; ``<0x61>`` is ``a``."""
    backend = Tokenizer(models.BPE({"<eos>": 0, "▁ab": 1, "<0x61>": 2, "b": 3, "▁": 4, "ab": 5}, []))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback()])
    sentencepiece = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    byte_level = byte_level_tokenizer({"<eos>": 0, "a": 1, "b": 2, "Ġ": 3, "Ġab": 4}, [])
    shared = CrossVocab(byte_level, sentencepiece)
    assert dict(zip(shared.target_ids.tolist(), shared.draft_ids.tolist(), strict=True)) == {
        0: 0, 1: 2, 2: 3, 3: 4, 4: 1}


def test_tokenizers_sharing_too_little_are_rejected(vocab):
    other = byte_level_tokenizer({"x": 0, "y": 1, "z": 2, "xy": 3}, [("x", "y")])
    with pytest.raises(ValueError, match=r"share 0 of the draft's 4 ordinary tokens \(0.0%\); .* at least 10%"):
        CrossVocab(vocab.target_tokenizer, other)
    with pytest.raises(ValueError, match="share 5 of the draft's 8 ordinary tokens"):
        CrossVocab(vocab.target_tokenizer, vocab.draft_tokenizer, min_shared=0.9)
    with pytest.raises(TypeError, match="draft tokenizer must be a Hugging Face tokenizer, got dict"):
        CrossVocab(vocab.target_tokenizer, DRAFT_VOCAB)
    with pytest.raises(TypeError, match="CrossVocab"):
        CrossVocabDraftModel(LMDraftModel(peaked_draft()), vocab=DRAFT_VOCAB)


def test_draft_context_is_the_draft_tokenisation_of_the_text(vocab):
    """Growing contexts (and a new prompt) re-encoded incrementally give the draft tokenizer's ids of the whole
    text, every time."""
    retokenizer = Retokenizer(vocab)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):  # three prompts, each grown token by token
        ids = torch.randint(0, len(TARGET_VOCAB), (40,), generator=generator).tolist()
        for end in range(1, len(ids) + 1):
            text = vocab.target_tokenizer.decode(ids[:end])
            expected = vocab.draft_tokenizer(text, add_special_tokens=False).input_ids
            assert retokenizer.draft_ids(ids[:end]) == expected, (ids[:end], text)


def request(ids, sampling=None, max_depth=2) -> DraftRequest:
    return DraftRequest(input_ids=torch.tensor([ids]), sampling=sampling or SamplingConfig(temperature=1.0),
                        vocab_size=len(TARGET_VOCAB), max_depth=max_depth, generator=torch.Generator().manual_seed(0))


def test_logits_are_the_draft_distribution_on_shared_tokens_renormalised(vocab):
    draft = peaked_draft(scale=5.0)
    model = CrossVocabDraftModel(LMDraftModel(draft), vocab)
    ids = [1, 2, 4, 6, 3, 0, 8]  # "abĠĠacc<eos>abc" in target tokens
    q = torch.softmax(model.begin(request(ids)), -1)[0]  # (V,)
    text = vocab.target_tokenizer.decode(ids)
    draft_ids = vocab.draft_tokenizer(text, add_special_tokens=False).input_ids
    with torch.no_grad():
        full = torch.softmax(draft(torch.tensor([draft_ids])).logits[0, -1], -1)  # (V_d,)
    restricted = full[SHARED_DRAFT] / full[SHARED_DRAFT].sum()
    torch.testing.assert_close(q[SHARED_TARGET], restricted)
    assert q[6:].abs().sum() == 0 and full[SHARED_DRAFT].sum() < 0.99  # some mass was outside, and left out
    # a drafted node is fed to the draft as its own id: "ab" is draft id 7
    with torch.no_grad():
        after = torch.softmax(draft(torch.tensor([draft_ids + [7]])).logits[0, -1], -1)
    extended = torch.softmax(model.extend(torch.tensor([-1]), torch.tensor([[5]])), -1)[0, 0]
    torch.testing.assert_close(extended[SHARED_TARGET], after[SHARED_DRAFT] / after[SHARED_DRAFT].sum())


class UnrestrictedQ:
    """Broken: samples like the cross-tokenizer drafter but declares the draft's full distribution mapped to the
    target ids, not renormalised over the shared tokens (as if the tokens outside could have been drawn)."""

    def __init__(self, drafter: ModelDrafter) -> None:
        self.drafter = drafter

    def propose(self, req: DraftRequest):
        tree = self.drafter.propose(req)
        if tree.q is None:  # nothing drafted
            return tree
        cross = self.drafter.model
        lm = cross.draft
        ids = cross._retokenizer.draft_ids(req.input_ids[0].tolist())
        with torch.no_grad():
            rows = [torch.softmax(lm.model(torch.tensor([ids + path])).logits[0, -1], -1)
                    for path in ([], cross.vocab.draft_tokens(tree.tokens[0, :-1]).tolist())]
        q = torch.zeros_like(tree.q)
        for row, full in enumerate(rows):
            q[0, row, SHARED_TARGET] = full[SHARED_DRAFT]
        return dataclasses.replace(tree, q=q)

    def observe(self, verdict) -> None:
        self.drafter.observe(verdict)


def first_token_p_value(drafter) -> float:
    """Repeated proposals from one context: chi-square p-value of the first drafted token's frequencies against
    the declared q row 0 as it is (mass it does not give to any token is a cell that must stay empty)."""
    req = request([1, 2, 4, 6, 3])
    counts, q0 = torch.zeros(len(TARGET_VOCAB) + 1), None
    for _ in range(TRIALS):
        tree = drafter.propose(req)
        assert tree.sampling == "iid"
        q0 = tree.q[0, 0].double() if q0 is None else q0
        counts[int(tree.tokens[0, 0])] += 1
    expected = torch.cat([q0, (1 - q0.sum()).clamp_min(0)[None]]) * TRIALS
    expected = expected / expected.sum() * TRIALS  # only float rounding: every declared mass is a cell
    keep = expected > 0
    assert counts[~keep].sum() == 0
    return float(stats.chisquare(counts[keep].double(), expected[keep]).pvalue)


def test_q_contract_holds_and_an_unrestricted_q_is_rejected(vocab):
    honest = ModelDrafter(peaked_draft(scale=5.0), Chain(2), cross_vocab=vocab)
    assert first_token_p_value(honest) > 1e-4
    assert first_token_p_value(UnrestrictedQ(ModelDrafter(peaked_draft(scale=5.0), Chain(2), cross_vocab=vocab))) < 1e-6


def test_sampling_keeps_the_target_distribution_and_the_broken_q_does_not(vocab, target):
    prompt = torch.tensor([[1, 2, 4, 6, 3]])
    sampling = SamplingConfig(temperature=1.0)
    honest = ModelDrafter(peaked_draft(seed=4, scale=10.0), Chain(2), cross_vocab=vocab)
    assert two_token_chi_square(target, prompt, drafter=honest, acceptance=SpeculativeSampling(), sampling=sampling,
                                trials=2 * TRIALS) > 1e-3
    broken = UnrestrictedQ(ModelDrafter(peaked_draft(seed=4, scale=10.0), Chain(2), cross_vocab=vocab))
    assert two_token_chi_square(target, prompt, drafter=broken, acceptance=SpeculativeSampling(), sampling=sampling,
                                trials=2 * TRIALS) < 1e-5


@pytest.mark.parametrize("tree", [Chain(3), DynamicTree(depth=3, top_k=2, budget=5)])
def test_greedy_parity_with_generate(vocab, target, tree):
    drafter = ModelDrafter(peaked_draft(), tree, cross_vocab=vocab)
    accepted = 0
    for seed in range(3):
        prompt = torch.randint(0, len(TARGET_VOCAB), (1, 6), generator=torch.Generator().manual_seed(seed))
        expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                                   do_sample=False, pad_token_id=0, eos_token_id=None)
        out = speculative_generate(target, prompt, drafter=drafter, acceptance=SpeculativeSampling(),
                                   max_new_tokens=20)
        assert torch.equal(out.sequences, expected)
        accepted += sum(out.stats.accepted)
    assert accepted > 0


def test_recipe_drafts_across_tokenizers_when_they_differ(vocab, target, tmp_path):
    vocab.draft_tokenizer.save_pretrained(tmp_path / "draft")
    vocab.target_tokenizer.save_pretrained(tmp_path / "same")
    draft = peaked_draft()
    recipe = Recipe(method="leviathan", draft=str(tmp_path / "draft"))
    built = recipe.build(target, vocab.target_tokenizer, draft=draft)
    assert isinstance(built.method.drafter.model, CrossVocabDraftModel)
    assert len(built.method.drafter.model.vocab) == len(SHARED_TARGET)
    same = Recipe(method="leviathan", draft=str(tmp_path / "same")).build(target, vocab.target_tokenizer,
                                                                           draft=tiny_causal_lm("llama", seed=1))
    assert isinstance(same.method.drafter.model, LMDraftModel)
    method = presets.from_name("leviathan", target=target, draft=draft, cross_vocab=vocab)
    assert isinstance(method.drafter.model, CrossVocabDraftModel)


def test_loading_a_draft_whose_tokenizer_shares_too_little_fails_in_one_line(vocab, tmp_path):
    from specprim.recipes import load_draft

    peaked_draft().save_pretrained(tmp_path / "draft")
    vocab.draft_tokenizer.save_pretrained(tmp_path / "draft")
    recipe = Recipe(method="leviathan", draft=str(tmp_path / "draft"))
    assert load_draft(recipe, vocab.target_tokenizer).config.vocab_size == len(DRAFT_VOCAB)
    unrelated = byte_level_tokenizer({"x": 0, "y": 1, "z": 2, "xy": 3}, [("x", "y")])
    with pytest.raises(ValueError, match="share 0 of the draft's 8 ordinary tokens") as error:
        load_draft(recipe, unrelated)
    assert "\n" not in str(error.value)


def test_loading_a_draft_then_building_its_recipe_builds_the_map_once(vocab, target, tmp_path, monkeypatch):
    from specprim.recipes import _build, load_draft

    peaked_draft().save_pretrained(tmp_path / "draft")
    vocab.draft_tokenizer.save_pretrained(tmp_path / "draft")
    maps = []
    monkeypatch.setattr(_build, "CrossVocab", lambda *tokenizers: maps.append(CrossVocab(*tokenizers)) or maps[-1])
    recipe = Recipe(method="leviathan", draft=str(tmp_path / "draft"))
    built = recipe.build(target, vocab.target_tokenizer, draft=load_draft(recipe, vocab.target_tokenizer))
    assert len(maps) == 1 and built.method.drafter.model.vocab is maps[0]
    other = byte_level_tokenizer(TARGET_VOCAB, TARGET_MERGES)  # another target tokenizer object: built anew
    Recipe(method="leviathan", draft=str(tmp_path / "draft")).build(target, other, draft=load_draft(recipe, other))
    assert len(maps) == 2
