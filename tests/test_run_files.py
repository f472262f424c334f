"""The files of a training run: atomic writes, readers that treat a missing file as empty, the cut of a half line."""

import json

import torch

from specprim.bench import read_prompts
from specprim.train._losses import masked_fraction
from specprim.train._run_files import complete_lines, read_json, read_jsonl, write_json, write_jsonl


def test_missing_files_read_as_empty(tmp_path):
    assert read_json(tmp_path / "none.json") is None
    assert read_jsonl(tmp_path / "none.jsonl") == []
    assert complete_lines(tmp_path / "none.jsonl") == 0


def test_writes_round_trip_and_leave_no_staging_file(tmp_path):
    write_json(tmp_path / "sub" / "a.json", {"x": [1, 2]})
    write_jsonl(tmp_path / "b.jsonl", [{"y": 1}, {"y": 2}])
    assert read_json(tmp_path / "sub" / "a.json") == {"x": [1, 2]}
    assert read_jsonl(tmp_path / "b.jsonl") == [{"y": 1}, {"y": 2}]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.json", "b.jsonl"]


def test_a_record_holding_a_unicode_line_separator_stays_one_record(tmp_path):
    """JSON allows U+2028 / U+0085 unescaped in strings (``ensure_ascii=False`` writes them); only "\\n" ends a line."""
    records = [{"answer": "one\u2028two\x85three"}, {"answer": "four"}]
    write_jsonl(tmp_path / "a.jsonl", [records[0]])
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    assert read_jsonl(tmp_path / "a.jsonl") == records[:1] and read_jsonl(tmp_path / "b.jsonl") == records
    assert complete_lines(tmp_path / "b.jsonl") == 2
    prompt = tmp_path / "prompts.jsonl"
    prompt.write_text(json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\n")
    assert read_prompts(prompt)[0].turns == ("a\u2028b",)


def test_complete_lines_cuts_a_half_written_line(tmp_path):
    path = tmp_path / "partial.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3')
    assert complete_lines(path) == 2
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert complete_lines(path) == 2


def test_masked_fraction_counts_only_masked_positions():
    flags = torch.tensor([[True, False, True], [True, True, False]])
    mask = torch.tensor([[True, True, False], [False, True, True]])
    assert masked_fraction(flags, mask) == 2 / 4
    assert masked_fraction(flags, torch.zeros_like(mask)) == 0.0
