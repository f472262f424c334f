"""The files of a training run: atomic writes, readers that treat a missing file as empty, the cut of a half line."""

import torch

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
