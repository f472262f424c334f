"""Tau by context length in ``specprim bench``: rows grouped by prompt length, in the JSON and the printout."""

from __future__ import annotations

import json

import pytest
from _tiny import tiny_causal_lm, tiny_tokenizer

from specprim import bench, cli
from specprim.bench import Prompt
from specprim.bench._context import bucket_label, context_table, tau_by_context


def test_bucket_labels():
    assert [bucket_label(n) for n in (0, 511, 512, 2047, 2048, 4095, 4096, 8191, 8192, 20000)] == [
        "<512", "<512", "512-2048", "512-2048", "2048-4096", "2048-4096", "4096-8192", "4096-8192",
        ">=8192", ">=8192"]
    assert bucket_label(10, bounds=(8,)) == ">=8"


def _prompt(name: str, words: int) -> Prompt:
    # a repeating pattern so that prompt lookup drafts and accepts
    return Prompt(id=name, turns=(" ".join(f"t{2 + i % 7}" for i in range(words)),))


def test_bench_reports_tau_by_prompt_length(tmp_path):
    target = tiny_causal_lm("llama", positions=1024)
    tokenizer = tiny_tokenizer()
    prompts = [_prompt("short-a", 40), _prompt("long", 600), _prompt("short-b", 80)]
    results = bench.run(target=target, tokenizer=tokenizer, methods=["prompt-lookup"], prompts=prompts,
                        max_new_tokens=8, json_path=tmp_path / "out.json", argv=["specprim", "bench"])
    entries = json.loads((tmp_path / "out.json").read_text())["tau_by_context"]
    assert [(e["method"], e["context"], e["rows"]) for e in entries] == [
        ("prompt-lookup", "<512", 2), ("prompt-lookup", "512-2048", 1)]  # hf has no step record
    rows = [r for r in results.prompts if r.method == "prompt-lookup"]
    for entry, members in zip(entries, ([r for r in rows if r.prompt_tokens < 512],
                                        [r for r in rows if r.prompt_tokens >= 512]), strict=True):
        steps = sum(r.steps for r in members)
        assert entry["steps"] == steps
        assert entry["tau"] == pytest.approx((sum(r.accepted for r in members) + steps) / steps)
        assert entry["prompt_tokens_mean"] == pytest.approx(sum(r.prompt_tokens for r in members) / len(members))
    # all rows in one bucket give the run's own tau
    (whole,) = tau_by_context(results.prompts, bounds=(10**6,))
    assert whole["tau"] == pytest.approx(results.summary("prompt-lookup").tau)
    assert "| prompt-lookup | 512-2048 | 1 |" in context_table(entries)


def test_cli_bench_prints_tau_by_prompt_length(tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    tiny_causal_lm("llama").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "t3 t4 t3 t4 t3 t4"}\n')
    assert cli.main(["bench", "--target", str(model_dir), "--method", "prompt-lookup", "--prompts", str(prompts),
                     "--max-new-tokens", "4"]) == 0
    printed = capsys.readouterr().out
    assert "tau by prompt length:" in printed and "| prompt-lookup | <512 | 1 |" in printed
