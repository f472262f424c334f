"""``torch.compile``d forwards: speculation stays lossless with respect to the compiled model, the compiled function is
really what runs (and ``eager_forward`` really switches it off), the bench compiles every method, clear errors.

Compiling takes a while even for the tiny model, so one compiled model serves the module's tests."""

import json

import pytest
import torch
from _tiny import tiny_causal_lm, tiny_tokenizer

from specprim import speculative_generate
from specprim.acceptance import Greedy
from specprim.bench import run
from specprim.drafters import PromptLookup
from specprim.models import compile_forward, eager_forward, is_compiled, load, pack_weights, packing_supported

PROMPT = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])  # (1, 10), repetitive so prompt lookup drafts


@pytest.fixture(scope="module")
def compiled():
    """The tiny Llama (fp32) and its eager twin with the same weights."""
    eager = tiny_causal_lm("llama")
    model = compile_forward(tiny_causal_lm("llama"))
    return model, eager


def _generate(model, max_new_tokens=24):
    return model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=max_new_tokens,
                          do_sample=False, eos_token_id=1, pad_token_id=0)


def test_compiled_forward_computes_the_eager_function(compiled):
    model, eager = compiled
    assert is_compiled(model) and not is_compiled(eager)
    with torch.no_grad():
        torch.testing.assert_close(model(PROMPT).logits, eager(PROMPT).logits, rtol=1e-4, atol=1e-4)


def test_greedy_speculation_equals_the_compiled_models_generate(compiled):
    model, _ = compiled
    want = _generate(model)
    got = speculative_generate(model, PROMPT, drafter=PromptLookup(), acceptance=Greedy(), max_new_tokens=24,
                               eos_token_id=1)
    assert got.stats.tau > 1  # drafts were accepted, so multi-token verification ran compiled
    assert torch.equal(got.sequences, want)


def test_calls_run_compiled_graphs_and_eager_forward_switches_them_off(compiled):
    model, eager = compiled
    compiled_forward = model.forward
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # the tests above compiled graphs
    with eager_forward(model):
        assert model.forward.__func__ is type(model).forward  # the eager method, bound to this model
        with torch.no_grad():
            torch.testing.assert_close(model(PROMPT).logits, eager(PROMPT).logits, rtol=0, atol=0)
    assert model.forward is compiled_forward
    assert compile_forward(model) is model and model.forward is compiled_forward  # idempotent


def test_bench_compiles_every_method_and_times_the_eager_forward(compiled):
    model, _ = compiled
    results = run(target=model, tokenizer=tiny_tokenizer(), methods=["hf-eager", "prompt-lookup"],
                  prompts=["t5 t6 t7 t8 t5 t6 t7"], max_new_tokens=8, compile=True, argv=[])
    assert results.meta["settings"]["compile"] is True
    assert [s.method for s in results.results] == ["hf", "hf-eager", "prompt-lookup"]
    assert all(s.identical for s in results.results)  # fp32: compiled and eager agree on this prompt


def test_bad_inputs_raise_clear_errors(tmp_path):
    if packing_supported():  # elsewhere packing itself refuses (tests/test_pack.py)
        with pytest.raises(ValueError, match="packed weights"):
            compile_forward(pack_weights(tiny_causal_lm("llama").to(torch.bfloat16)))
    with pytest.raises(ValueError, match="exclude each other"):
        load(tmp_path, dtype=torch.bfloat16, pack=True, compile=True)  # checked before loading anything
    with pytest.raises(ValueError, match="needs a model compiled"):
        with eager_forward(tiny_causal_lm("llama")):
            pass
    with pytest.raises(ValueError, match="compile the target"):
        run(target=tiny_causal_lm("llama"), tokenizer=tiny_tokenizer(), methods=["hf-eager"], prompts=["t5"],
            max_new_tokens=2, argv=[])


def test_cli_bench_compiles_a_saved_model_and_rejects_pack_with_compile(tmp_path, capsys):
    from specprim import cli

    model_dir = tmp_path / "tiny"
    tiny_causal_lm("llama").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "t5 t6 t7 t5 t6"}\n')
    out = tmp_path / "r.json"
    assert cli.main(["bench", "--target", str(model_dir), "--compile", "--warmup-tokens", "4", "--method", "hf-eager",
                     "--prompts", str(prompts), "--max-new-tokens", "4", "--json", str(out)]) == 0
    assert "| hf-eager |" in capsys.readouterr().out
    settings = json.loads(out.read_text())["meta"]["settings"]
    assert settings["compile"] is True and settings["warmup_tokens"] == 4
    capsys.readouterr()
    for command in (["generate", "--method", "prompt-lookup", "--prompt", "t5"], ["tune", "--method", "eagle3"],
                    ["bench", "--dtype", "bfloat16", "--method", "prompt-lookup", "--prompts", str(prompts),
                     "--max-new-tokens", "2"]):
        assert cli.main([*command, "--target", str(model_dir), "--pack", "--compile"]) == 2
        assert "exclude each other" in capsys.readouterr().err
