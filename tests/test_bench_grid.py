"""Ablation grids: one axis at a time, resumable JSONL keyed by configuration; the replay cell equals live."""

from __future__ import annotations

import json

import pytest
from _tiny import tiny_causal_lm
from test_bench import word_tokenizer

from specprim import bench, cli
from specprim.bench import BenchCellRunner, GridCell

CONFIG = {
    "base": {"target": "tiny", "prompts": "p.jsonl", "method": "prompt-lookup", "num_draft": 4, "max_new_tokens": 8},
    "vary": {"num_draft": [2, 4, 8], "method": ["prompt-lookup", "leviathan"]},
}


def test_grid_swaps_one_field_at_a_time_without_duplicates():
    cells = bench.grid_cells(CONFIG)
    base = cells[0]
    assert [(c.method, c.num_draft) for c in cells] == [
        ("prompt-lookup", 4), ("prompt-lookup", 2), ("prompt-lookup", 8), ("leviathan", 4)]
    assert all(c.max_new_tokens == base.max_new_tokens for c in cells)
    assert len({c.key for c in cells}) == 4 and GridCell(**CONFIG["base"]).key == base.key


def test_grid_from_toml_and_errors(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text('[base]\nmethod = "prompt-lookup"\nmode = "replay"\n[vary]\nnum_draft = [2, 3]\n')
    assert [c.num_draft for c in bench.load_grid(path)] == [None, 2, 3]
    with pytest.raises(ValueError, match="unknown fields"):
        bench.grid_cells({"base": {"method": "x", "tree": 3}})
    with pytest.raises(ValueError, match="must be a list"):
        bench.grid_cells({"base": {"method": "x"}, "vary": {"num_draft": 3}})
    with pytest.raises(ValueError, match="base"):
        bench.grid_cells({"vary": {}})


def test_run_grid_resumes_and_skips_finished_cells(tmp_path):
    cells = bench.grid_cells(CONFIG)
    out = tmp_path / "grid.jsonl"
    calls = []

    def flaky(cell):
        calls.append(cell.key)
        if len(calls) == 3:
            raise RuntimeError("interrupted")
        return {"summary": {"tau": float(cell.num_draft)}}

    with pytest.raises(RuntimeError, match="interrupted"):
        bench.run_grid(cells, out, runner=flaky, progress=False)
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == [c.key for c in cells[:2]]
    calls.clear()
    records = bench.run_grid(cells, out, runner=lambda cell: calls.append(cell.key) or {"summary": {}},
                             progress=False)
    assert calls == [c.key for c in cells[2:]]  # only the unfinished cells ran
    assert [r["key"] for r in records] == [c.key for c in cells]
    assert records[0]["result"]["summary"]["tau"] == 4.0 and "env" in records[0]
    calls.clear()
    bench.run_grid(cells, out, runner=lambda cell: calls.append(cell.key) or {}, progress=False)
    assert calls == []
    assert "| (base) |" in bench.grid_table(records)


def test_replay_cell_matches_the_live_cell(tmp_path):
    target, tokenizer = tiny_causal_lm("llama"), word_tokenizer()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7 w8 w5 w6"}\n{"turns": ["w3 w4 w3", "w9 w10 w9"]}\n')
    runner = BenchCellRunner(preloaded={("tiny", "float32"): (target, tokenizer)})
    base = GridCell(target="tiny", prompts=str(prompts), method="prompt-lookup", num_draft=3, max_new_tokens=12)
    live = runner(base)["summary"]
    replayed = runner(GridCell(**{**base.__dict__, "mode": "replay"}))["replay"]
    assert live["identical"] is True and replayed["exact"] is True
    assert replayed["tau"] == pytest.approx(live["tau"])
    assert replayed["acceptance_by_depth"] == pytest.approx(live["acceptance_by_depth"])
    assert replayed["recordings"] == 3  # one per turn
    with pytest.raises(ValueError, match="greedy"):
        runner(GridCell(**{**base.__dict__, "mode": "replay", "temperature": 0.5}))
    with pytest.raises(ValueError, match="unknown mode"):
        runner(GridCell(**{**base.__dict__, "mode": "nope"}))


def test_cli_grid_runs_then_resumes(tmp_path, capsys):
    model_dir = tmp_path / "tiny"
    tiny_causal_lm("llama").save_pretrained(model_dir)
    word_tokenizer().save_pretrained(model_dir)
    (tmp_path / "p.jsonl").write_text('{"prompt": "w5 w6 w7 w5 w6"}\n')
    grid = tmp_path / "grid.toml"
    grid.write_text(f'[base]\ntarget = "{model_dir}"\nprompts = "{tmp_path / "p.jsonl"}"\nmethod = "prompt-lookup"\n'
                    f'max_new_tokens = 6\nmode = "replay"\n[vary]\nnum_draft = [1, 2]\nmode = ["live"]\n')
    assert cli.main(["bench", "--grid", str(grid)]) == 0
    printed = capsys.readouterr().out
    assert "| (base) |" in printed and "num_draft=2" in printed and "mode=live" in printed
    lines = (tmp_path / "grid.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert cli.main(["bench", "--grid", str(grid)]) == 0
    assert (tmp_path / "grid.jsonl").read_text().splitlines() == lines  # nothing re-ran
