"""The campaign's scaling curve (``specprim campaign curve``): rows from ``eval.jsonl`` in order of tokens trained,
the markdown table, the PNG, and one-line errors for a directory that is no campaign or has no evaluation yet."""

from __future__ import annotations

import json

import pytest

from specprim import cli
from specprim.train._scaling import plot_scaling, scaling_rows, scaling_table


def evaluation(segment: int, trained: int, data: int, acc: list[float], chain: list[float]) -> dict:
    record = {"segment": segment, "step": segment * 10, "trained_tokens": trained, "shards": 1, "data_tokens": data}
    for k, (a, c) in enumerate(zip(acc, chain, strict=True), start=1):
        record |= {f"acc_{k}": a, f"chain_{k}": c, f"loss_{k}": 1.0}
    return record


@pytest.fixture
def run(tmp_path):
    (tmp_path / "campaign.json").write_text("{}")
    records = [evaluation(2, 600_000, 300_000, [0.6, 0.5], [0.6, 0.3]),  # written out of order on purpose
               evaluation(0, 0, 0, [0.4, 0.3], [0.4, 0.1]),
               evaluation(1, 250_000, 150_000, [0.5, 0.4], [0.5, 0.2])]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_rows_follow_tokens_trained_with_the_chain_estimate(run):
    rows = scaling_rows(run)
    assert [r["trained_tokens"] for r in rows] == [0, 250_000, 600_000]
    assert rows[1]["acc"] == [0.5, 0.4] and rows[1]["data_tokens"] == 150_000
    assert rows[2]["chain_tau"] == pytest.approx(1.9)


def test_table_and_png(run, tmp_path):
    table = scaling_table(scaling_rows(run)).splitlines()
    assert table[0] == ("| tokens trained | distinct data tokens | top-1 depth 1 | top-1 depth 2 | "
                        "greedy chain tau (teacher-forced) |")
    assert table[3] == "| 250,000 | 150,000 | 0.500 | 0.400 | 1.70 |" and len(table) == 5
    png = plot_scaling({"run": scaling_rows(run)}, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_writes_both_files(run, tmp_path, capsys):
    assert cli.main(["campaign", "curve", str(run), "--png", str(tmp_path / "c.png"),
                     "--markdown", str(tmp_path / "c.md")]) == 0
    assert (tmp_path / "c.md").read_text() == scaling_table(scaling_rows(run))
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert "| 600,000 | 300,000 | 0.600 | 0.500 | 1.90 |" in capsys.readouterr().out


def test_several_campaigns_share_one_chart_and_each_has_its_table(run, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "campaign.json").write_text("{}")
    (other / "eval.jsonl").write_text(json.dumps(evaluation(0, 0, 0, [0.45, 0.35], [0.45, 0.15])) + "\n")
    assert cli.main(["campaign", "curve", str(run), str(other), "--png", str(tmp_path / "both.png"),
                     "--markdown", str(tmp_path / "both.md")]) == 0
    text = (tmp_path / "both.md").read_text()
    assert text.startswith(f"{run}:\n\n| tokens trained") and f"\n{other}:\n\n| tokens trained" in text
    assert "| 0 | 0 | 0.450 | 0.350 | 1.60 |" in text and text in capsys.readouterr().out
    assert (tmp_path / "both.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["campaign", "curve", str(run), str(tmp_path / "nowhere")]) == 2  # every directory is checked
    assert "no campaign in" in capsys.readouterr().err


def test_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["campaign", "curve", str(tmp_path / "nowhere")]) == 2
    (tmp_path / "campaign.json").write_text("{}")
    assert cli.main(["campaign", "curve", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("(the campaign writes one per training segment)") and "no held-out evaluation" in err[-1]
    with pytest.raises(ValueError, match="no held-out evaluation"):
        scaling_rows(tmp_path)
