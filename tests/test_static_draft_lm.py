"""StaticLMDraftModel: a draft LM on a static cache computes LMDraftModel's logits (eager, fp32), and drafting
through it, compiled, keeps greedy generation equal to ``generate``."""

from __future__ import annotations

import pytest
import torch
from _tiny import VOCAB, tiny_causal_lm, tiny_tokenizer

from specprim import speculative_generate
from specprim.acceptance import SpeculativeSampling
from specprim.drafters import (
    DraftRequest,
    LMDraftModel,
    ModelDrafter,
    StaticLMDraftModel,
    TreeDrafter,
    draft_vocab,
    static_drafting,
)
from specprim.drafters._static_draft_lm import CATCH_UP_LIMIT
from specprim.sampling import SamplingConfig
from specprim.trees import Chain, DynamicTree

PROMPT = torch.tensor([[5, 9, 3, 17, 5, 9, 30, 2]])


def request(ids):
    return DraftRequest(input_ids=ids, sampling=SamplingConfig(temperature=0.0), vocab_size=VOCAB, max_depth=3)


def steps(model):
    """Logits of a sequence of begin / extend calls covering the cache's cases."""
    out = []
    longer = torch.cat([PROMPT, torch.tensor([[11, 4, 6]])], dim=1)  # the prompt plus accepted tokens
    far = torch.cat([PROMPT, torch.arange(40, 40 + CATCH_UP_LIMIT + 2)[None]], dim=1)  # too many new tokens
    for ids in (PROMPT, longer, PROMPT[:, :5], torch.tensor([[8]]), far, torch.tensor([[7, 7, 7, 7]])):
        out.append(model.begin(request(ids)))
        out.append(model.extend(torch.tensor([-1, -1]), torch.tensor([[7, 8]])))  # two children of the root
        out.append(model.extend(torch.tensor([0, 1, 2]), torch.tensor([[2, 3, 4]])))  # a child of each, then deeper
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("reduced", [False, True])
def test_eager_static_draft_model_computes_the_dynamic_caches_logits(arch, reduced):
    model = tiny_causal_lm(arch, seed=3)
    d2t = draft_vocab(VOCAB, 50, required_ids=[1]) if reduced else None
    want = steps(LMDraftModel(model, d2t=d2t))
    got = steps(StaticLMDraftModel(model, compile=False, d2t=d2t))
    for expected, actual in zip(want, got, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


class SeesEveryCatchUpToken(StaticLMDraftModel):
    """Broken on purpose: the tokens a ``begin`` catches up on attend to each other without the causal mask."""

    @staticmethod
    def _catch_up_attention(shared, total):
        return torch.ones(total - shared, total, dtype=torch.bool)


def test_the_parity_check_rejects_a_non_causal_catch_up():
    model = tiny_causal_lm("llama", seed=3)
    broken = SeesEveryCatchUpToken(model, compile=False)
    full = LMDraftModel(model)
    full.begin(request(PROMPT))
    broken.begin(request(PROMPT))
    longer = torch.cat([PROMPT, torch.tensor([[11, 4, 6]])], dim=1)
    assert not torch.allclose(broken.begin(request(longer)), full.begin(request(longer)), atol=1e-4)


def test_compiled_static_drafting_keeps_greedy_generation_equal_to_generate():
    target = tiny_causal_lm("llama", seed=0, layers=3)
    draft = tiny_causal_lm("llama", seed=1)
    want = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=24, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    for tree in (Chain(3), DynamicTree(depth=2, top_k=2, budget=3)):
        drafter = static_drafting(ModelDrafter(draft, tree), min_cache_length=128)
        assert isinstance(drafter, TreeDrafter) and isinstance(drafter.model, StaticLMDraftModel)
        for _ in range(2):  # a second prompt reuses the compiled forwards and the cache
            out = speculative_generate(target, PROMPT, drafter=drafter, acceptance=SpeculativeSampling(),
                                       max_new_tokens=24)
            assert torch.equal(out.sequences, want)


def test_models_other_than_llama_style_decoders_are_refused():
    with pytest.raises(TypeError):
        StaticLMDraftModel(tiny_causal_lm("gpt2"), compile=False)


def test_bench_and_cli_draft_statically_with_a_reduced_vocabulary(tmp_path, capsys):
    from specprim import bench, cli

    target, draft = tiny_causal_lm("llama", seed=0, layers=3), tiny_causal_lm("llama", seed=1)
    results = bench.run(target=target, tokenizer=tiny_tokenizer(), draft=draft, methods=["leviathan"],
                        prompts=["t5 t6 t7 t8 t5 t6 t7"], max_new_tokens=8, static_draft=True, draft_vocab=60,
                        argv=[])
    settings = results.meta["settings"]
    assert settings["static_draft"] is True and settings["draft_vocab"] == 60
    assert "StaticLMDraftModel" in results.meta["method_reprs"]["leviathan"]
    assert all(s.identical for s in results.results)  # fp32 greedy: equal to hf
    with pytest.raises(ValueError, match="draft_vocab applies to the leviathan"):
        bench.run(target=target, tokenizer=tiny_tokenizer(), methods=["prompt-lookup"], prompts=["t5"],
                  max_new_tokens=2, draft_vocab=60)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer().save_pretrained(tmp_path / name)
    assert cli.main(["generate", "--target", str(tmp_path / "target"), "--method", "leviathan", "--draft",
                     str(tmp_path / "draft"), "--draft-vocab", "60", "--static-draft", "--prompt", "t5 t6 t7 t5 t6",
                     "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "static-draft" in out and "identical to plain greedy: yes" in out
    assert cli.main(["generate", "--target", str(tmp_path / "target"), "--method", "prompt-lookup", "--draft-vocab",
                     "60", "--prompt", "t5"]) == 2  # a usage error
    assert "specprim generate: error: draft_vocab restricts leviathan" in capsys.readouterr().err
