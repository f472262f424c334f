"""Heads shipped inside the package: lookup by name, class dispatch, size budget, and lossless decoding on SmolLM2."""

import json

import pytest
import torch
from _cores import worker_threads
from _tiny import tiny_causal_lm

from specprim import presets, speculative_generate
from specprim.acceptance import Greedy
from specprim.bench._memory import extra_parameters
from specprim.cli import chat_input_ids
from specprim.drafters import EagleHead, MedusaHeads
from specprim.models import _heads, head_path, is_packed, known_heads, load, load_head, pack_weights, packing_supported

SHIPPED = ("smollm2-135m-instruct-eagle3", "smollm2-135m-instruct-medusa")
# random heads reach tau 1.00 (EAGLE-3) and 1.09 (Medusa) on this prompt; the shipped ones 1.3+ and 1.2
MIN_TAU = {"smollm2-135m-instruct-eagle3": 1.3, "smollm2-135m-instruct-medusa": 1.15}


def test_load_head_dispatches_on_the_saved_class_and_resolves_names(tmp_path, monkeypatch):
    target = tiny_causal_lm("llama")
    monkeypatch.setattr(_heads, "HEADS_DIR", tmp_path)
    EagleHead.from_target(target, version=3).save_pretrained(tmp_path / "tiny-eagle3")
    MedusaHeads.from_target(target).save_pretrained(tmp_path / "tiny-medusa")
    assert known_heads() == ("tiny-eagle3", "tiny-medusa")
    assert isinstance(load_head("tiny-eagle3", target), EagleHead)
    assert isinstance(load_head(tmp_path / "tiny-medusa", target), MedusaHeads)
    method = presets.from_name("eagle3", target=target, head="tiny-eagle3")
    saved = load_head("tiny-eagle3", target).state_dict()
    drafted_with = method.drafter.model.head.state_dict()  # TreeDrafter -> EAGLE draft model -> head
    assert saved.keys() == drafted_with.keys() and all(torch.equal(saved[k], drafted_with[k]) for k in saved)
    with pytest.raises(ValueError, match="neither a shipped head"):
        head_path("no-such-head")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"head": "Mystery", "config": {}}))
    with pytest.raises(ValueError, match="Mystery"):
        load_head("odd", target)


@pytest.mark.skipif(not packing_supported(), reason="this CPU cannot pack bfloat16 weights")
def test_a_head_loaded_onto_a_packed_target_is_packed_and_computes_the_same(tmp_path, monkeypatch):
    """Packed target, packed head: bit for bit the stock head's outputs; an unpacked target's head stays stock."""
    target = tiny_causal_lm("llama").to(torch.bfloat16)
    monkeypatch.setattr(_heads, "HEADS_DIR", tmp_path)
    EagleHead.from_target(target, version=3).save_pretrained(tmp_path / "tiny-eagle3")
    MedusaHeads.from_target(target).save_pretrained(tmp_path / "tiny-medusa")
    stock = {name: load_head(name, target) for name in known_heads()}
    assert not any(is_packed(head) for head in stock.values())
    pack_weights(target)
    packed = {name: load_head(name, target) for name in known_heads()}
    assert all(is_packed(head) for head in packed.values())
    assert is_packed(presets.from_name("eagle3", target=target, head="tiny-eagle3").drafter.model.head)  # as --head
    assert is_packed(presets.from_name("medusa", target=target, head="tiny-medusa").drafter.model.heads)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 5, 3 * 32, generator=generator).to(torch.bfloat16)  # three fused target features
    ids = torch.randint(2, 97, (1, 5), generator=generator)
    logits = [head(ids, head.fuse(list(hidden.split(32, dim=-1)))).draft_logits  # (1, 5, V)
              for head in (stock["tiny-eagle3"], packed["tiny-eagle3"])]
    assert torch.equal(*logits)
    assert torch.equal(stock["tiny-medusa"](hidden[0, :, :32]), packed["tiny-medusa"](hidden[0, :, :32]))
    for name, head in packed.items():  # the bench counts a packed head's parameters once, not its packed copies
        assert extra_parameters([head], target) == extra_parameters([stock[name]], target)
        assert extra_parameters([head], target).count == sum(
            t.numel() for t in (*stock[name].parameters(), *stock[name].buffers())) > 0


def test_the_shipped_heads_are_installed_and_within_the_size_budget():
    assert set(SHIPPED) <= set(known_heads())
    total = sum(f.stat().st_size for name in SHIPPED for f in head_path(name).iterdir())
    assert total <= 30 * 2**20
    for name in SHIPPED:
        assert (head_path(name) / "README.md").read_text().count("tau") >= 1  # a model card with the measurement


@pytest.mark.real_model
@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_head_decodes_smollm2_losslessly_and_accepts_more_than_one_token(name):
    with worker_threads():
        target, tokenizer = load("smollm2-135m-instruct")
        method = presets.from_name(name.rsplit("-", 1)[1], target=target, head=name)
        ids = chat_input_ids(tokenizer, "Explain in two sentences why the sky is blue.")
        expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        out = speculative_generate(target, ids, drafter=method.drafter, acceptance=Greedy(), max_new_tokens=48,
                                   eos_token_id=tokenizer.eos_token_id)
        assert torch.equal(out.sequences, expected)
        assert out.stats.tau > MIN_TAU[name]  # a trained head, not a random one
