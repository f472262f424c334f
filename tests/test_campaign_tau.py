"""``specprim campaign tau``: tau in decoding of a campaign's heads (start, milestones, latest), measured once per
head and setting into ``tau.jsonl``, the same numbers as decoding with each head by hand, shown by ``campaign curve``;
one-line errors for bad shapes and options."""

import json
import re
import shutil

import pytest
from test_campaign import tiny, whole  # noqa: F401  (fixtures: a tiny campaign run to its end)

from specprim import cli, presets
from specprim._tau_error import PromptCounts, tau_estimate
from specprim.models import load, load_head
from specprim.train._campaign_tau import TauShape, campaign_heads, measure_campaign_tau, parse_shape
from specprim.train._scaling import plot_scaling, scaling_rows, scaling_table
from specprim.trees import Chain

GREEDY = TauShape(0.0, "chain:2")


@pytest.fixture
def run(tiny, whole, tmp_path):  # noqa: F811
    """A copy of the finished tiny campaign and a JSONL file of three prompts in its words."""
    shutil.copytree(tiny / "whole", tmp_path / "run")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{5 + i} w{9 + i} w{30 + i}"}) + "\n" for i in range(3)))
    return tmp_path / "run", prompts


def test_heads_are_the_milestones_and_the_latest_and_the_start_of_a_continued_run(run, whole):  # noqa: F811
    run_dir, _ = run
    heads = campaign_heads(run_dir)
    assert [h.label for h in heads] == ["200", "500", "latest"]
    assert 200 <= heads[0].trained_tokens < heads[1].trained_tokens < heads[2].trained_tokens
    assert heads[2].trained_tokens == whole[1].trained_tokens
    assert heads[0].location == str(run_dir / "milestones" / "200")
    config = json.loads((run_dir / "campaign.json").read_text())
    config["head"]["init_from"] = heads[0].location
    (run_dir / "campaign.json").write_text(json.dumps(config))
    assert campaign_heads(run_dir)[0].label == "start" and campaign_heads(run_dir)[0].trained_tokens == 0
    segment = json.loads((run_dir / "train" / "segment.json").read_text())
    (run_dir / "train" / "segment.json").write_text(json.dumps({**segment, "done": False}))
    assert "latest" not in [h.label for h in campaign_heads(run_dir)]  # it would change under the reader


def test_tau_is_that_of_decoding_with_each_head_and_is_measured_once(run, tiny):  # noqa: F811
    run_dir, prompts = run
    lines = []
    rows = measure_campaign_tau(run_dir, prompts=str(prompts), num_prompts=3, max_new_tokens=6, shapes=[GREEDY],
                                log=lines.append)
    assert [r["head"] for r in rows] == ["200", "500", "latest"] and len(lines) == 3
    target, tokenizer = load(str(tiny / "model"))
    for row, head in zip(rows, campaign_heads(run_dir), strict=True):
        method = presets.eagle3(load_head(head.location, target), Chain(2))
        per_prompt = []
        for line in prompts.read_text().splitlines():
            ids = tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["prompt"]}],
                                                add_generation_prompt=True, return_tensors="pt", return_dict=True)
            out = method.generate(target, ids["input_ids"], max_new_tokens=6, eos_token_id=tokenizer.eos_token_id)
            per_prompt.append((sum(out.stats.accepted), out.stats.steps))
        accepted, steps = (sum(column) for column in zip(*per_prompt, strict=True))
        assert row["tau"] == pytest.approx((accepted + steps) / steps) and 1 <= row["tau"] <= 3
        assert row["trained_tokens"] == head.trained_tokens and row["steps"] == steps
        assert list(zip(row["prompt_accepted"], row["prompt_steps"], strict=True)) == per_prompt
        counts = PromptCounts(row["prompt_accepted"], row["prompt_steps"])
        assert row["stderr"] == tau_estimate(counts).stderr
    saved = (run_dir / "tau.jsonl").read_bytes()
    assert measure_campaign_tau(run_dir, prompts=str(prompts), num_prompts=3, max_new_tokens=6, shapes=[GREEDY],
                                log=lines.append) == rows
    assert lines[-1].startswith("tau: nothing to measure") and (run_dir / "tau.jsonl").read_bytes() == saved
    sampled = TauShape(1.0, "sampled:2,1")
    more = measure_campaign_tau(run_dir, prompts=str(prompts), num_prompts=3, max_new_tokens=6,
                                shapes=[GREEDY, sampled], log=lines.append)
    assert more[:3] == rows and [r["temperature"] for r in more[3:]] == [1.0] * 3  # only the new setting ran
    one = measure_campaign_tau(run_dir, prompts=str(prompts), num_prompts=3, max_new_tokens=6,
                               shapes=[TauShape(0.0, "chain:1")], heads=["500"], log=lines.append)
    assert [r["head"] for r in one[6:]] == ["500"]  # only the head asked for


def test_the_curve_shows_tau_beside_held_out_top1(run, tmp_path, capsys):
    run_dir, prompts = run
    measure_campaign_tau(run_dir, prompts=str(prompts), num_prompts=2, max_new_tokens=4, shapes=[GREEDY],
                         log=lambda line: None)
    lines = [json.loads(line) for line in (run_dir / "tau.jsonl").read_text().splitlines()]
    measured = {line["trained_tokens"]: line["tau"] for line in lines}
    stderr = {line["trained_tokens"]: line["stderr"] for line in lines}
    rows = scaling_rows(run_dir)
    setting = "prompts.jsonl tau, T=0, chain:2"
    assert {r["trained_tokens"]: r["tau"][setting] for r in rows if r["tau"]} == measured
    assert {r["trained_tokens"]: r["tau_stderr"][setting] for r in rows if r["tau"]} == stderr
    table = scaling_table(rows).splitlines()
    assert table[0].endswith("| greedy chain tau (teacher-forced) | prompts.jsonl tau, T=0, chain:2 |")
    assert table[2].endswith("|  |")  # the first evaluation (no head measured there)
    assert plot_scaling({"run": rows}, tmp_path / "c.png").stat().st_size > 1000
    assert cli.main(["campaign", "curve", str(run_dir)]) == 0
    assert f"| {measured[max(measured)]:.2f} +- {stderr[max(stderr)]:.2f} |" in capsys.readouterr().out
    for line in lines:  # rows measured before standard errors were recorded show tau alone
        del line["stderr"]
    (run_dir / "tau.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert f"| {measured[max(measured)]:.2f} |" in scaling_table(scaling_rows(run_dir))


def test_the_command_measures_and_bad_options_give_a_one_line_error(run, capsys):
    run_dir, prompts = run
    assert cli.main(["campaign", "tau", str(run_dir), "--prompts", str(prompts), "--num-prompts", "1",
                     "--max-new-tokens", "3", "--shape", "0:chain:1", "--dtype", "float32", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"tau: 200 \([\d,]+ tokens trained\), T=0 chain:1: \d\.\d{3} \+- \d\.\d{3} over \d+ target "
                     r"forwards", out)
    assert "3 measurements in" in out
    for options, message in ((["--shape", "1.5"], "a shape is TEMPERATURE:TREE"),
                             (["--shape=-1:chain:2"], "a shape is TEMPERATURE:TREE"),
                             (["--shape", "0:ladder:3"], "tree"),
                             (["--num-prompts", "0"], "--num-prompts must be >= 1"),
                             (["--prompts", "no-such-set"], "unknown dataset"),
                             (["--heads", "latest,9M"], "no head labelled '9M' in")):
        assert cli.main(["campaign", "tau", str(run_dir), *options]) in (1, 2)
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert cli.main(["campaign", "tau", str(run_dir.parent / "nowhere")]) == 2
    assert "no campaign in" in capsys.readouterr().err


def test_parse_shape():
    assert parse_shape("0:dynamic:depth=5,top_k=4,budget=8") == TauShape(0.0, "dynamic:depth=5,top_k=4,budget=8")
    assert parse_shape("1:sampled:2,1").label == "T=1 sampled:2,1"
    for bad in ("chain:2", "-1:chain:2", "nan:chain:2", "inf:chain:2", "0"):
        with pytest.raises(ValueError, match="TEMPERATURE:TREE"):
            parse_shape(bad)
