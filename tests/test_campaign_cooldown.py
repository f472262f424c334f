"""``specprim campaign cooldown``: a branch from a campaign's checkpoint that decays the learning rate over more steps
on the same data in the same order; the campaign is left alone, a rerun resumes or reports, the cooled head joins
``campaign tau`` and ``campaign curve``; one-line errors."""

import json
import shutil
import subprocess

import pytest
from safetensors.torch import load_file
from test_campaign import _campaign, _quiet, tiny, whole  # noqa: F401  (fixtures: a tiny campaign run to its end)

from specprim import cli
from specprim.train import _campaign_cooldown
from specprim.train._campaign import run_campaign, trainer_state
from specprim.train._campaign_cooldown import cool_down, cooldown_name
from specprim.train._campaign_tau import campaign_heads
from specprim.train._scaling import cooldown_rows, cooldown_table, plot_scaling, scaling_rows


@pytest.fixture
def run(tiny, whole, tmp_path):  # noqa: F811
    """A copy of the finished tiny campaign."""
    shutil.copytree(tiny / "whole", tmp_path / "run")
    return tmp_path / "run"


def _weights(directory):
    return {k: v.tolist() for k, v in load_file(str(directory / "model.safetensors")).items()}


def test_a_cooldown_decays_the_rate_from_the_campaign_s_checkpoint_and_leaves_the_campaign_alone(run):
    before = {p: p.read_bytes() for p in sorted((run / "train").rglob("*")) if p.is_file()}
    start = trainer_state(run / "train")
    lines = []
    record = cool_down(run, 4, log=lines.append)
    out = run / "cooldowns" / cooldown_name(start["step"], 4)
    assert {p: p.read_bytes() for p in sorted((run / "train").rglob("*")) if p.is_file()} == before
    assert record["from_step"] == start["step"] and record["step"] == start["step"] + 4
    assert record["from_tokens"] == start["tokens"] < record["trained_tokens"]
    assert 0 <= record["acc_1"] <= 1 and json.loads((out / "eval.json").read_text()) == record
    peak = json.loads((run / "campaign.json").read_text())["head"]["lr"]
    rates = [json.loads(line)["lr"] for line in (out / "train" / "log.jsonl").read_text().splitlines()
             if "lr" in json.loads(line)]
    assert rates[-1] < 0.2 * peak and all(a > b for a, b in zip(rates, rates[1:], strict=False))
    assert _weights(out / "train" / "head") != _weights(run / "train" / "head")
    assert lines[0].startswith("cooldown: branched at step") and "finished at" in lines[-1]
    assert cool_down(run, 4, log=lines.append) == record and "is finished" in lines[-1]  # a rerun only reports


def test_without_decay_the_branch_trains_as_the_campaign_would_have_gone_on(tiny, run, tmp_path):  # noqa: F811
    """min_lr_ratio 1: the branch's step is the campaign's own next step (same batch, optimizer state and rate;
    one step: the tiny campaign's data allow one more before it caches its last shard)."""
    shutil.copytree(run, tmp_path / "on")
    start = trainer_state(run / "train")
    record = cool_down(run, 1, min_lr_ratio=1.0, log=_quiet)
    run_campaign(_campaign(tiny, tmp_path / "on", max_train_tokens=record["trained_tokens"]), log=_quiet)
    assert trainer_state(tmp_path / "on" / "train")["step"] == start["step"] + 1
    cooled = _weights(run / "cooldowns" / cooldown_name(start["step"], 1) / "train" / "head")
    assert cooled == _weights(tmp_path / "on" / "train" / "head") != _weights(run / "train" / "head")


def test_a_killed_cooldown_resumes_and_a_half_made_branch_is_made_again(run, tmp_path, monkeypatch):
    shutil.copytree(run, tmp_path / "whole-run")
    uninterrupted = cool_down(tmp_path / "whole-run", 4, log=_quiet)
    out = run / "cooldowns" / cooldown_name(trainer_state(run / "train")["step"], 4)
    (out / "train").mkdir(parents=True)
    (out / "train" / "half-copied").write_text("x")  # killed while copying: no cooldown.json yet

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_campaign_cooldown, "train", killed)
    with pytest.raises(KeyboardInterrupt):
        cool_down(run, 4, log=_quiet)
    assert (out / "cooldown.json").is_file() and not (out / "train" / "half-copied").exists()
    monkeypatch.undo()
    assert cool_down(run, 4, log=_quiet) == uninterrupted


def test_the_cooled_head_joins_tau_and_the_curve(run, tmp_path, capsys):
    record = cool_down(run, 2, log=_quiet)
    name = cooldown_name(record["from_step"], 2)
    heads = campaign_heads(run)
    assert heads[-1].label == f"cooled {name}" and heads[-1].trained_tokens == record["trained_tokens"]
    assert heads[-1].location == str(run / "cooldowns" / name / "train" / "head")
    rows = cooldown_rows(run)
    assert [r["name"] for r in rows] == [name] and rows[0]["acc"][0] == record["acc_1"]
    assert cooldown_table(rows).splitlines()[2].startswith(f"| {name} | {record['from_tokens']:,} | 2 |")
    assert plot_scaling({"run": scaling_rows(run)}, tmp_path / "c.png", cooled={"run": rows}).stat().st_size > 1000
    assert cli.main(["campaign", "curve", str(run)]) == 0
    assert "cool-downs:" in capsys.readouterr().out
    assert cli.main(["campaign", "status", str(run)]) == 0
    assert f"cooled:     {name}: top-1 by depth {record['acc_1']:.3f}" in capsys.readouterr().out


def test_the_command_cools_and_bad_inputs_give_a_one_line_error(run, capsys):
    assert cli.main(["campaign", "cooldown", str(run), "--steps", "1", "--threads", "1"]) == 0
    assert "finished at" in capsys.readouterr().out
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        progress = json.loads((run / "progress.json").read_text())
        (run / "progress.json").write_text(json.dumps({**progress, "stage": "training", "pid": sleeper.pid}))
        assert cli.main(["campaign", "cooldown", str(run)]) == 2
        assert f"the campaign's process {sleeper.pid} is running" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()
    for options, message in ((["--steps", "0"], "--steps must be >= 1"),
                             (["--min-lr-ratio", "1.5"], "--min-lr-ratio must be in [0, 1]"),
                             (["--steps", "1", "--min-lr-ratio", "0.5"], "decays to min_lr_ratio 0.0")):
        assert cli.main(["campaign", "cooldown", str(run), *options]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    shutil.rmtree(run / "train")
    assert cli.main(["campaign", "cooldown", str(run)]) == 2
    assert "nothing trained in" in capsys.readouterr().err
    assert cli.main(["campaign", "cooldown", str(run.parent / "nowhere")]) == 2
    assert "no campaign in" in capsys.readouterr().err
