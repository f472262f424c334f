"""A draft language model restricted to a reduced vocabulary (``ModelDrafter(..., d2t=...)``): same logits on its ids,
``-inf`` elsewhere, lossless generation (greedy parity, chi-square under sampling) and a broken variant caught."""

from __future__ import annotations

import pytest
import torch
from _tiny import ARCHITECTURES, VOCAB, tiny_causal_lm

from specprim import speculative_generate
from specprim.acceptance import SpeculativeSampling
from specprim.drafters import DraftRequest, LMDraftModel, ModelDrafter, draft_vocab, lm_draft_vocab
from specprim.models import pack_weights, packing_supported
from specprim.presets import leviathan
from specprim.sampling import SamplingConfig
from specprim.testing import two_token_chi_square
from specprim.trees import Chain, DynamicTree

GREEDY = SamplingConfig(temperature=0.0)
PROMPT = torch.tensor([[5, 9, 3, 17, 5, 9]])


def request(ids, vocab=VOCAB):
    return DraftRequest(input_ids=ids, sampling=GREEDY, vocab_size=vocab, max_depth=3)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_restricted_logits_equal_the_full_models_on_the_draft_ids(arch):
    model = tiny_causal_lm(arch, seed=3)
    d2t = draft_vocab(VOCAB, 40, required_ids=[1])
    full, reduced = LMDraftModel(model), LMDraftModel(model, d2t=d2t)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[d2t] = False
    for step in (PROMPT, torch.cat([PROMPT, torch.tensor([[11, 4]])], dim=1)):  # begin, then a longer prefix
        want, got = full.begin(request(step)), reduced.begin(request(step))  # (1, V)
        torch.testing.assert_close(got[:, d2t], want[:, d2t], rtol=1e-5, atol=1e-5)
        assert bool(torch.isinf(got[:, outside]).all()) and bool((got[:, outside] < 0).all())
        parents, tokens = torch.tensor([-1, 0, -1]), torch.tensor([[7, 8, 2]])
        want, got = full.extend(parents, tokens), reduced.extend(parents, tokens)  # (1, 3, V)
        torch.testing.assert_close(got[..., d2t], want[..., d2t], rtol=1e-5, atol=1e-5)
        assert bool(torch.isinf(got[..., outside]).all())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_greedy_generation_with_a_reduced_draft_vocabulary_equals_generate(arch):
    target = tiny_causal_lm(arch, seed=0, layers=3)
    draft = tiny_causal_lm(arch, seed=1)
    want = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=16, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    for tree in (Chain(3), DynamicTree(depth=3, top_k=2, budget=5)):
        drafter = ModelDrafter(draft, tree, d2t=lm_draft_vocab(draft, 30))  # most target tokens are outside it
        out = speculative_generate(target, PROMPT, drafter=drafter, acceptance=SpeculativeSampling(),
                                   max_new_tokens=16)
        assert torch.equal(out.sequences, want)
        assert set(out.sequences[0, PROMPT.shape[1]:].tolist()) - set(range(30)), "test needs tokens outside d2t"


def test_lm_draft_vocab_keeps_the_special_ids_and_the_smallest_others():
    draft = tiny_causal_lm("llama", seed=1)
    draft.generation_config.eos_token_id = [1, 90]
    d2t = lm_draft_vocab(draft, 10)
    assert d2t.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 90]
    counts = torch.zeros(VOCAB, dtype=torch.long)
    counts[50:60] = 5
    assert set(lm_draft_vocab(draft, 13, counts).tolist()) == {0, 1, 90, *range(50, 60)}


@pytest.mark.skipif(not packing_supported(), reason="this CPU cannot pack bfloat16 weights")
def test_packed_model_restricted_head_is_packed_and_agrees():
    model = tiny_causal_lm("llama", seed=3).to(torch.bfloat16)
    pack_weights(model)
    d2t = draft_vocab(VOCAB, 40)
    full, reduced = LMDraftModel(model), LMDraftModel(model, d2t=d2t)
    assert type(reduced._head).__name__ == "PackedLinear"
    torch.testing.assert_close(reduced.begin(request(PROMPT))[:, d2t], full.begin(request(PROMPT))[:, d2t])


TINY_VOCAB = 6


def soft(seed: int) -> torch.nn.Module:
    model = tiny_causal_lm("llama", seed=seed, vocab=TINY_VOCAB)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # spread enough that the ids outside d2t carry real mass
    return model


TARGET, DRAFT = soft(0), soft(1)
TINY_PROMPT = torch.tensor([[1, 2, 3, 1, 2]])
D2T = torch.tensor([0, 2, 3])


def chi_square_p_value(drafter) -> float:
    return two_token_chi_square(TARGET, TINY_PROMPT, drafter=drafter, acceptance=SpeculativeSampling(),
                                sampling=SamplingConfig(temperature=1.0), trials=1500)


def test_sampling_with_a_reduced_draft_vocabulary_matches_plain_sampling():
    assert chi_square_p_value(ModelDrafter(DRAFT, Chain(2), d2t=D2T)) > 1e-3


class ReportsTheWholeVocabularysQ:
    """Broken on purpose: drafts from the reduced vocabulary but reports ``q`` as the whole vocabulary's softmax
    (not renormalised over ``d2t``), so the acceptance rule under-accepts the drafted tokens."""

    def __init__(self) -> None:
        self.reduced = ModelDrafter(DRAFT, Chain(2), d2t=D2T)
        self.full = LMDraftModel(DRAFT)

    def propose(self, request):
        tree = self.reduced.propose(request)
        if tree.q is None:
            return tree
        root = self.full.begin(request)[:, None]  # (1, 1, V)
        rest = self.full.extend(tree.parents, tree.tokens)  # (1, N, V)
        q = request.sampling.probs(torch.cat([root, rest], dim=1))[:, : tree.q.shape[1]]
        return type(tree)(tokens=tree.tokens, parents=tree.parents, q=q, sampling=tree.sampling)

    def observe(self, verdict):
        self.reduced.observe(verdict)


def test_the_check_rejects_a_drafter_reporting_the_whole_vocabularys_q():
    assert chi_square_p_value(ReportsTheWholeVocabularysQ()) < 1e-6


def test_bad_inputs_raise_clear_errors():
    model = tiny_causal_lm("llama", seed=3)
    with pytest.raises(ValueError, match="strictly increasing"):
        LMDraftModel(model, d2t=torch.tensor([3, 2]))
    with pytest.raises(ValueError, match="outside"):
        LMDraftModel(model, d2t=torch.tensor([3, VOCAB]))
    capped = tiny_causal_lm("gemma3", seed=3)
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        LMDraftModel(capped, d2t=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        leviathan(model, draft_vocab_size=0)
