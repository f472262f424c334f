"""specprim.recipes: the Recipe value (validation, string and TOML forms), shipped recipes, auto, building, and the
command lines that take them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import pytest
import torch
from _tiny import tiny_causal_lm, tiny_tokenizer

import specprim
from specprim import bench, cli, models, recipes
from specprim.acceptance import Greedy, TypicalAcceptance
from specprim.hf import StaticTarget
from specprim.recipes import Recipe, _measure

GREEDY = "smollm2-135m-instruct-eagle3:greedy"
SAMPLED = "smollm2-135m-instruct-eagle3:sampled"
ODD = Recipe(method="prompt-lookup+datastore", num_draft=2, max_nodes=5, datastores=("a b.npz", 'q"uote.npz'),
             acceptance="typical", warmup_tokens=0, verifier="static", tree="chain:3")


@pytest.mark.parametrize("recipe", [Recipe(), ODD, *recipes.shipped_recipes().values()], ids=repr)
def test_string_and_toml_forms_read_back_as_the_same_recipe(recipe):
    assert Recipe.from_toml(recipe.to_toml()) == recipe
    if " " not in "".join(recipe.datastores):  # the one-line form splits on spaces
        assert Recipe.parse(str(recipe)) == recipe
    assert str(recipe).startswith(f"method={recipe.method}")


def test_toml_file_and_shipped_names_load(tmp_path):
    path = tmp_path / "fast.toml"
    path.write_text(ODD.to_toml())
    assert recipes.load_recipe(path) == ODD
    assert recipes.load_recipe(GREEDY).method == "eagle3+prompt-lookup+datastore"
    with pytest.raises(ValueError, match=f"neither a shipped recipe .*{GREEDY}"):
        recipes.load_recipe("no-such-recipe")
    path.write_text("method = [")
    with pytest.raises(ValueError, match="not valid TOML"):
        recipes.load_recipe(path)
    path.write_text('method = "prompt-lookup"\nspeed = 3\n')
    with pytest.raises(ValueError, match=r"unknown keys \['speed'\]"):
        recipes.load_recipe(path)


@pytest.mark.parametrize("fields, message", [
    (dict(dtype="float64"), "dtype must be one of"),
    (dict(verifier="fast"), "verifier must be one of"),
    (dict(acceptance="optimal"), "acceptance must be one of"),
    (dict(method="nope"), "unknown method 'nope'"),
    (dict(method="prompt-lookup+prompt-lookup"), "unknown method"),
    (dict(pack=True), "pack pre-packs bfloat16 linears"),
    (dict(dtype="bfloat16", pack=True, compile=True), "pack and compile exclude each other"),
    (dict(max_nodes=3), "max_nodes caps a union"),
    (dict(datastores=("sharegpt",)), "has none"),
    (dict(method="datastore"), "needs datastores"),
    (dict(method="leviathan"), "needs a draft model"),
    (dict(draft_vocab=10), "no leviathan part"),
    (dict(draft_quantize="int8"), "has no draft"),
    (dict(num_draft=0), "num_draft must be an int >= 1"),
    (dict(warmup_tokens=-1), "warmup_tokens must be an int >= 0"),
    (dict(pack="yes"), "pack must be true or false"),
    (dict(tree="dynamic:depth=0"), "depth"),
    (dict(datastores="sharegpt"), "datastores must be a list"),
])
def test_invalid_recipes_are_refused_when_made(fields, message):
    with pytest.raises(ValueError, match=message):
        Recipe(**fields)


def test_parse_refuses_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown recipe key 'speed'"):
        Recipe.parse("method=prompt-lookup speed=3")
    with pytest.raises(ValueError, match="num-draft must be an int"):
        Recipe.parse("num-draft=four")
    with pytest.raises(ValueError, match="pack must be true or false"):
        Recipe.parse("dtype=bfloat16 pack=maybe")


def test_lossless_and_numerics_say_what_the_recipe_changes():
    assert Recipe().lossless and not Recipe(acceptance="typical").lossless
    assert Recipe().numerics is None
    shipped = recipes.load_recipe(GREEDY)
    assert shipped.numerics == "bfloat16, compiled forwards" and shipped.lossless


def test_auto_picks_the_tuned_recipe_by_mode_and_adapts_the_dtype(monkeypatch):
    monkeypatch.setattr(_measure, "default_dtype", lambda: "bfloat16")  # a machine with native bfloat16
    greedy = recipes.auto("smollm2-135m-instruct")
    assert greedy.recipe == recipes.load_recipe(GREEDY) and greedy.expected_speedup > 1
    assert recipes.auto("smollm2-135m-instruct", temperature=0.7).recipe == recipes.load_recipe(SAMPLED)
    fp32 = recipes.auto("smollm2-135m-instruct", dtype="float32")
    assert fp32.recipe.dtype == "float32" and not fp32.recipe.pack and fp32.expected_speedup is None
    assert fp32.recipe.method == greedy.recipe.method
    other = recipes.auto("some/model", measure=False)
    assert other.recipe == Recipe() and "no recipe ships for some/model" in other.reason
    assert other.expected_speedup is None
    assert all(recipes.auto(name, temperature=t, measure=False).recipe.lossless
               for name in ("smollm2-135m-instruct", "x") for t in (0.0, 1.0))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        recipes.auto("x", temperature=-1)


def test_auto_runs_the_tuned_recipe_in_float32_on_a_machine_without_native_bfloat16(monkeypatch):
    monkeypatch.setattr(_measure, "default_dtype", lambda: "float32")  # e.g. an AVX2-only CPU
    choice = recipes.auto("smollm2-135m-instruct")
    tuned = recipes.load_recipe(GREEDY)
    assert choice.recipe == dataclasses.replace(tuned, dtype="float32", pack=False)
    assert choice.expected_speedup is None and "no native bfloat16" in choice.reason
    asked = recipes.auto("smollm2-135m-instruct", dtype="bfloat16")  # an explicit dtype is kept
    assert asked.recipe == tuned and asked.expected_speedup is not None


def _saved_tiny_target(directory):
    tiny_causal_lm("llama").save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return str(directory)


def test_auto_measures_an_unknown_target_once_per_machine_and_caches_the_fastest(tmp_path, monkeypatch):
    monkeypatch.setattr(_measure, "cache_root", lambda: tmp_path / "cache" / "auto")
    slow = Recipe(method="prompt-lookup", num_draft=1)
    fast = Recipe(method="prompt-lookup", num_draft=2)
    monkeypatch.setattr(_measure, "CANDIDATES", (slow, fast))
    target = _saved_tiny_target(tmp_path / "target")
    measured = []

    def fake_measure(model, tokenizer, candidates, *, temperature):
        measured.append((candidates, temperature))
        return [_measure.Measured(recipe=c, tau=1.5, speedup=0.8 + 0.5 * i) for i, c in enumerate(candidates)]

    monkeypatch.setattr(_measure, "measure", fake_measure)
    choice = recipes.auto(target, dtype="float32")
    assert choice.recipe == fast and choice.expected_speedup == pytest.approx(1.3) and len(measured) == 1
    assert "measured 2 training-free drafters here" in choice.reason and "calibration prompts" in choice.basis
    again = recipes.auto(target, dtype="float32")  # read from the cache: no second measurement
    assert again.recipe == fast and again.expected_speedup == pytest.approx(1.3) and len(measured) == 1
    recipes.auto(target, temperature=1.0, dtype="float32")  # another mode, another measurement
    recipes.auto(target, dtype="bfloat16")  # another dtype, too: packed where the CPU computes bf16
    assert [t for _, t in measured] == [0.0, 1.0, 0.0] and len(list((tmp_path / "cache" / "auto").glob("*.json"))) == 3
    packs = models.packing_supported() and not torch.cuda.is_available()
    assert all(c.dtype == "bfloat16" and c.pack == packs for c in measured[-1][0])
    unreadable = recipes.auto(str(tmp_path / "missing"))
    assert unreadable.recipe == Recipe() and "could not be loaded to measure" in unreadable.reason


def test_a_known_target_with_a_draft_partner_measures_leviathan_too():
    big = _measure.candidates_for("qwen2.5-coder-1.5b-instruct", "bfloat16")
    assert big[-1] == Recipe(method="leviathan", draft="qwen2.5-coder-0.5b-instruct", dtype="bfloat16",
                             pack=models.packing_supported() and not torch.cuda.is_available())
    assert all(c.method != "leviathan" for c in _measure.candidates_for("qwen2.5-coder-0.5b-instruct", "float32"))
    assert all(c.dtype == "float32" and not c.pack for c in _measure.candidates_for("some/model", "float32"))


def test_auto_measurement_runs_the_candidates_beside_plain_generate():
    model, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    candidates = [Recipe(method="prompt-lookup", num_draft=n) for n in (1, 4)]
    results = _measure.measure(model, tokenizer, candidates, prompts=("t5 t6 t7 t5 t6 t7 t5", "t9 t8 t9 t8 t9"),
                               max_new_tokens=8)
    assert [m.recipe for m in results] == candidates
    assert all(m.speedup > 0 and m.tau >= 1 for m in results)
    assert results[1].tau > results[0].tau  # the longer lookup accepts more per step on these repeating prompts


def test_every_training_free_candidate_builds_and_decodes(monkeypatch):
    monkeypatch.undo()  # the real candidates, not conftest's quick stand-in (only measure() runs: no cache written)
    model, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    offline = [c for c in _measure.CANDIDATES if not c.datastores]  # a datastore would be built from ShareGPT
    assert "suffix" in [c.method for c in offline]
    results = _measure.measure(model, tokenizer, offline, prompts=("t5 t6 t7 t5 t6 t7 t5",), max_new_tokens=8)
    assert [m.recipe for m in results] == offline and all(m.tau > 1 for m in results)


def test_shipped_heads_are_found_by_target_and_kind():
    assert models.shipped_head("smollm2-135m-instruct", "eagle3") == "smollm2-135m-instruct-eagle3"
    assert models.shipped_head("smollm2-135m-instruct", "medusa") == "smollm2-135m-instruct-medusa"
    assert models.shipped_head("smollm2-135m-instruct", "mtp") is None
    assert models.shipped_head(None, "eagle3") is None


def test_build_gives_the_recipes_verifier_drafter_and_rule():
    model, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    built = Recipe(num_draft=3, verifier="static", acceptance="greedy").build(model, tokenizer)
    assert isinstance(built.verifier, StaticTarget) and isinstance(built.method.acceptance, Greedy)
    assert built.method.drafter.num_tokens == 3
    ids = tokenizer("t5 t6 t7 t8 t5 t6 t7", return_tensors="pt").input_ids
    out = built.generate(ids, max_new_tokens=12)
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert torch.equal(out.sequences, plain)  # fp32 greedy: lossless
    typical = Recipe(acceptance="typical").build(model)
    assert isinstance(typical.method.acceptance, TypicalAcceptance) and typical.verifier is model
    with pytest.raises(ValueError, match="needs the target's tokenizer"):
        ODD.build(model, tokenizer=None)


def test_cli_generate_runs_a_recipe_file_and_auto(tmp_path, capsys, monkeypatch):
    target = tmp_path / "target"
    tiny_causal_lm("llama").save_pretrained(target)
    tiny_tokenizer().save_pretrained(target)
    recipe = tmp_path / "r.toml"
    recipe.write_text(Recipe(num_draft=2).to_toml())
    prompt = "t5 t6 t7 t8 t5 t6 t7"
    assert cli.main(["generate", "--target", str(target), "--recipe", str(recipe), "--prompt", prompt,
                     "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr()
    assert "recipe method=prompt-lookup num-draft=2 |" in out.out and "identical to plain greedy: yes" in out.out
    assert cli.main(["generate", "--target", str(target), "--prompt", prompt, "--max-new-tokens", "6",
                     "--num-draft", "3", "--dtype", "float32"]) == 0  # auto measures, then the typed option on top
    out = capsys.readouterr()
    assert "auto: no recipe ships for" in out.err and "recipe method=prompt-lookup num-draft=3 |" in out.out
    assert "on 4 calibration prompts, this machine)" in out.out
    assert cli.main(["generate", "--target", str(target), "--method", "eagle3", "--prompt", prompt]) == 1
    assert "needs a trained head" in capsys.readouterr().err  # found once the target loads: a runtime failure
    assert cli.main(["generate", "--target", str(target), "--prompt", prompt, "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens must be >= 1" in capsys.readouterr().err
    assert cli.main(["generate", "--target", str(tmp_path / "no-such-dir"), "--prompt", prompt]) == 2
    err = capsys.readouterr().err  # one line, no traceback
    assert re.fullmatch(r"specprim generate: error: --target .*no-such-dir: no such directory .*\n", err)


def test_bench_runs_recipes_and_auto_and_logs_them(tmp_path):
    model, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    path = tmp_path / "out.json"
    results = bench.run(target=model, tokenizer=tokenizer, methods=["hf", "auto"], prompts=["t5 t6 t7 t5 t6"],
                        max_new_tokens=6, recipes={"two": Recipe(num_draft=2, verifier="static")}, json_path=path)
    assert [r.method for r in results.results] == ["hf", "two", "auto"]
    assert all(r.identical for r in results.results)
    meta = json.loads(path.read_text())["meta"]
    assert meta["recipes"]["two"].startswith("Recipe(method='prompt-lookup'") and "auto" in meta["recipes"]
    assert "no recipe ships" in meta["auto"]["reason"] and meta["settings"]["dataset"] == "custom"
    with pytest.raises(ValueError, match="runs in bfloat16; the run loads the target in float32"):
        bench.run(target=model, tokenizer=tokenizer, methods=["hf"], prompts=["t5"], max_new_tokens=2,
                  recipes={"bf16": Recipe(dtype="bfloat16")})


@pytest.mark.skipif(not models.packing_supported(), reason="this CPU cannot pack bfloat16 weights")
def test_bench_keeps_plain_baselines_when_a_recipe_packs_the_target():
    model, tokenizer = tiny_causal_lm("llama").to(torch.bfloat16), tiny_tokenizer()
    results = bench.run(target=model, tokenizer=tokenizer, methods=["hf", "hf-prompt-lookup"], prompts=["t5 t6"],
                        max_new_tokens=4, dtype="bfloat16",
                        recipes={"packed": Recipe(dtype="bfloat16", pack=True)})
    assert models.is_packed(model)
    reprs = results.meta["method_reprs"]
    assert "stock_kernels=True" in reprs["hf"] and "stock_kernels=True" in reprs["hf-prompt-lookup"]


def test_speculative_generate_takes_a_recipe_instead_of_drafter_and_rule():
    model, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    ids = tokenizer("t5 t6 t7 t8 t5 t6 t7", return_tensors="pt").input_ids
    out = specprim.speculative_generate(model, ids, recipe=Recipe(num_draft=2, verifier="static"), max_new_tokens=10)
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    assert torch.equal(out.sequences, plain) and out.stats.tau > 1
    with pytest.raises(ValueError, match="not both"):
        specprim.speculative_generate(model, ids, recipe=Recipe(), acceptance=Greedy(), max_new_tokens=2)
    with pytest.raises(ValueError, match="needs a drafter and an acceptance rule, or a recipe"):
        specprim.speculative_generate(model, ids, max_new_tokens=2)


def test_generate_answers_text_with_a_recipe_and_streams(tmp_path):
    from transformers import TextStreamer

    target = tmp_path / "target"
    model, tokenizer = tiny_causal_lm("llama"), tiny_tokenizer()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    streamed = []

    class Collect(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            streamed.append(text)

    result = specprim.generate("t5 t6 t7 t5 t6", target=str(target), max_new_tokens=8,
                               streamer=Collect(tokenizer, skip_prompt=True))
    assert result.recipe == recipes.auto(str(target)).recipe and len(result.output.sequences[0]) > 5
    assert "".join(streamed).strip() == result.text.strip()
    again = specprim.generate("t5 t6 t7 t5 t6", target=str(target), max_new_tokens=8,
                             recipe=dataclasses.replace(result.recipe, num_draft=2))
    assert again.text == result.text  # greedy, lossless: the same answer with another drafter


def test_typed_options_replace_recipe_fields_and_drop_only_what_they_contradict():
    from specprim.recipes import add_recipe_arguments, recipe_from_args

    parser = argparse.ArgumentParser()
    add_recipe_arguments(parser)
    tuned = recipes.load_recipe(GREEDY)  # compiled, min_padded 4, packed bfloat16, a union with two datastores
    eager = recipe_from_args(parser.parse_args(["--verifier", "eager"]), tuned)
    assert eager == dataclasses.replace(tuned, verifier="eager", min_padded=0)
    fp32 = recipe_from_args(parser.parse_args(["--dtype", "float32"]), tuned)
    assert fp32 == dataclasses.replace(tuned, dtype="float32", pack=False)
    single = recipe_from_args(parser.parse_args([]), tuned, method="eagle3")
    assert single == dataclasses.replace(tuned, method="eagle3", max_nodes=None, datastores=())
    with pytest.raises(ValueError, match="min_padded pads the static verifier"):  # both typed: a real conflict
        recipe_from_args(parser.parse_args(["--verifier", "eager", "--min-padded", "4"]), tuned)
